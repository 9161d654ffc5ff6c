"""Efficiency: FLOPs per op against hand-computed values, the device spec table on the
names the corpus carries, and MFU/FLOPs on the H200 GPT fixtures against their analytic truth."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from traceinsight.analyzers.gemm_shapes import (
    GEMM_ROOFLINE_EFFICIENCY,
    UnalignedGemms,
    unaligned_gemms,
)
from traceinsight.api import analyze_trace
from traceinsight.model.devices import (
    fp32_to_bf16_time_ratio,
    lookup,
    occupancy_estimate,
)
from traceinsight.model.flops import op_cost
from traceinsight.model.schema import OP_ARGS_SCHEMA, DeviceInfo, Trace, conform_side
from traceinsight.options import Options

from .builder import Events
from .conftest import ROOT, SHARED, analyzed

FLOPS = ROOT / "fixtures" / "h200" / "flops"
BF16 = '"c10::BFloat16"'


def _cost(name: str, dims: list, types: list[str], concrete: list[str] | None = None):
    return op_cost(name, json.dumps(dims), json.dumps(types), json.dumps(concrete or []))


# --- FLOPs per op, by hand ------------------------------------------------------------------------


def test_gemm_flops_by_hand() -> None:
    mm = _cost("aten::mm", [[64, 32], [32, 16]], ["c10::BFloat16"] * 2)
    assert mm.flops == 2 * 64 * 32 * 16 and (mm.m, mm.n, mm.k) == (64, 16, 32)
    assert mm.bytes == (64 * 32 + 32 * 16 + 64 * 16) * 2 and mm.dtype == "bf16"
    addmm = _cost("aten::addmm", [[16], [64, 32], [32, 16], [], []], ["float"] * 3 + ["Scalar"] * 2)
    assert addmm.flops == 2 * 64 * 32 * 16 and addmm.dtype == "fp32"  # the bias add not counted
    bmm = _cost("aten::bmm", [[4, 8, 3], [4, 3, 5]], ["c10::Half"] * 2)
    assert bmm.flops == 2 * 4 * 8 * 3 * 5 and bmm.dtype == "fp16"
    lin = _cost("aten::linear", [[2, 10, 32], [48, 32], [48]], ["float"] * 3)
    assert lin.flops == 2 * 20 * 32 * 48 and (lin.m, lin.n, lin.k) == (20, 48, 32)
    ein = _cost(
        "aten::einsum",
        [[], [[2, 3, 4], [2, 4, 5]], []],
        ["", "TensorList", ""],
        ["bij,bjk->bik", "", ""],
    )
    assert ein.flops == 2 * 2 * 3 * 4 * 5


def test_conv_flops_by_hand() -> None:
    # 3x3 conv, stride 2, padding 1: 32x32 -> 16x16; N=2, C_in=3, C_out=8
    c = _cost(
        "aten::convolution",
        [[2, 3, 32, 32], [8, 3, 3, 3], [], [], [], [], [], [], []],
        [
            "c10::BFloat16",
            "c10::BFloat16",
            "",
            "ScalarList",
            "ScalarList",
            "ScalarList",
            "Scalar",
            "ScalarList",
            "Scalar",
        ],
        ["", "", "", "[2, 2]", "[1, 1]", "[1, 1]", "False", "[0, 0]", "1"],
    )
    assert c.flops == 2 * 2 * 8 * 16 * 16 * 3 * 9
    cudnn = _cost(
        "aten::cudnn_convolution",
        [[2, 3, 32, 32], [8, 3, 3, 3], [], [], [], [], [], [], []],
        ["c10::BFloat16"] * 2 + ["ScalarList"] * 3 + ["Scalar"] * 4,
        ["", "", "[1, 1]", "[2, 2]", "[1, 1]", "1", "False", "False", "True"],
    )
    assert cudnn.flops == c.flops
    # backward of the same conv, both gradients: twice the forward
    bw = _cost(
        "aten::convolution_backward",
        [[2, 8, 16, 16], [2, 3, 32, 32], [8, 3, 3, 3]] + [[]] * 8,
        ["c10::BFloat16"] * 3 + ["ScalarList"] * 8,
        [
            "",
            "",
            "",
            "[0]",
            "[2, 2]",
            "[1, 1]",
            "[1, 1]",
            "False",
            "[0, 0]",
            "1",
            "[True, True, False]",
        ],
    )
    assert bw.flops == 2 * c.flops
    bw_w = _cost(
        "aten::convolution_backward",
        [[2, 8, 16, 16], [2, 3, 32, 32], [8, 3, 3, 3]] + [[]] * 8,
        ["c10::BFloat16"] * 3 + ["ScalarList"] * 8,
        [
            "",
            "",
            "",
            "[0]",
            "[2, 2]",
            "[1, 1]",
            "[1, 1]",
            "False",
            "[0, 0]",
            "1",
            "[False, True, False]",
        ],
    )
    assert bw_w.flops == c.flops


def test_attention_flops_causal_halves() -> None:
    q = [2, 4, 128, 64]  # b, h, s, d
    full = 4 * 2 * 4 * 128 * 128 * 64
    sdpa = _cost(
        "aten::scaled_dot_product_attention",
        [q, q, q, [], [], [], [], []],
        ["c10::BFloat16"] * 3,
        ["", "", "", "", "0.", "False", "", "False"],
    )
    assert sdpa.flops == full
    causal = _cost(
        "aten::scaled_dot_product_attention",
        [q, q, q, [], [], [], [], []],
        ["c10::BFloat16"] * 3,
        ["", "", "", "", "0.", "True", "", "False"],
    )
    assert causal.flops == full / 2
    # flash forward takes (batch, seq, heads, dim)
    qf = [2, 128, 4, 64]
    flash = _cost(
        "aten::_flash_attention_forward",
        [qf, qf, qf] + [[]] * 12,
        ["c10::BFloat16"] * 3,
        ["", "", "", "", "", "128", "128", "0.", "True"],
    )
    assert flash.flops == full / 2
    # cuDNN backward: 2.5x the forward (FlopCounterMode's convention), causal halves
    bw = _cost(
        "aten::_scaled_dot_product_cudnn_attention_backward",
        [q, q, q, q, q, [2, 4, 128, 1]] + [[]] * 10,
        ["c10::BFloat16"] * 5 + ["float"],
        [""] * 11 + ["128", "128", "0.", "True", ""],
    )
    assert bw.flops == full * 2.5 / 2


# --- the spec table -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "memory", "sms", "cc", "spec", "bf16"),
    [  # device properties as they occur in the corpus and fixtures
        ("NVIDIA H200", 150109880320, 132, "9.0", "H200-SXM", 989.5),
        ("NVIDIA H100 80GB HBM3", 84942979072, 132, "9.0", "H100-SXM", 989.5),
        ("NVIDIA H100", 102085492736, 132, "9.0", "H100-SXM", 989.5),
        ("NVIDIA A100-SXM4-80GB", 84990623744, 108, "8.0", "A100-SXM4-80GB", 312.0),
        ("NVIDIA A100-SXM4-40GB", 42297524224, 108, "8.0", "A100-SXM4-40GB", 312.0),
        ("NVIDIA A100-PG509-200", 42505273344, 108, "8.0", "A100-SXM4-40GB", 312.0),
        ("Tesla V100-SXM2-32GB", 34079637504, 80, "7.0", "V100-SXM2", None),
        ("Tesla V100-DGXS-32GB", 34084028416, None, None, "V100-SXM2", None),
        ("NVIDIA B200", 191503138816, 148, "10.0", "B200", 2250.0),
        ("AMD Instinct MI300X", 206141652992, 304, "9.4", "MI300X", 1307.4),
        ("", 206141652992, 304, "9.4", "MI300X", 1307.4),  # ROCm build without a name
        ("AMD Instinct MI210", 68702699520, 104, "9.0", "MI210", 181.0),
        ("AMD Radeon Graphics", 68702699520, 104, "9.0", "MI210", 181.0),
        ("NVIDIA H100 PCIe", 85e9, 114, "9.0", "H100-PCIE", 756.5),
        ("NVIDIA H100 NVL", 100e9, 132, "9.0", "H100-NVL", 835.5),
        ("NVIDIA GH200 480GB", 102e9, 132, "9.0", "GH200-96GB", 989.5),
        ("NVIDIA A100 80GB PCIe", 85e9, 108, "8.0", "A100-PCIE-80GB", 312.0),
        # DeepSeek's public H800 profile (audit 5): no spec, so no MFU and no roofline
        ("NVIDIA H800", 84943110144, 132, "9.0", "H800-SXM", 989.5),
        ("NVIDIA H800 PCIe", 85e9, 114, "9.0", "H800-PCIE", 756.5),
        ("NVIDIA A800-SXM4-80GB", 85e9, 108, "8.0", "A800-SXM4-80GB", 312.0),
        ("NVIDIA A800 80GB PCIe", 85e9, 108, "8.0", "A800-PCIE-80GB", 312.0),
        ("NVIDIA GeForce RTX 3080", 10736893952, 68, "8.6", "RTX-3080", 59.5),
        ("NVIDIA GeForce RTX 3080 Ti", 12e9, 80, "8.6", None, None),
    ],
)
def test_spec_table_matches_corpus_names(name, memory, sms, cc, spec, bf16) -> None:
    s = lookup(name, int(memory), sms, cc)
    assert (s.id if s else None) == spec
    if s is not None:
        assert s.peak_tflops.get("bf16") == bf16


def test_v100_has_no_bf16_and_fp32_ratio() -> None:
    v100 = lookup("Tesla V100-SXM2-32GB", 34079637504, 80, "7.0")
    assert not v100.has("bf16") and not v100.has("tf32") and v100.tensor_peak_tflops == 125.0
    h200 = lookup("NVIDIA H200", 150109880320, 132, "9.0")
    assert fp32_to_bf16_time_ratio(h200) == pytest.approx(67.0 / 989.5)
    assert h200.memory_bandwidth_bytes_per_s == 4.8e12 and h200.sm_count == 132


def test_occupancy_estimate_limits() -> None:
    sm90 = lookup("NVIDIA H200").limits
    assert occupancy_estimate(sm90, 256, 32, 0) == (1.0, "warps")
    # 255 registers x 256 threads: 65280 registers per block, one block per SM = 8 of 64 warps
    assert occupancy_estimate(sm90, 256, 255, 0) == (8 / 64, "registers")
    assert occupancy_estimate(sm90, 128, 32, 200_000) == (4 / 64, "shared_memory")
    assert occupancy_estimate(sm90, 32, 16, 0) == (32 / 64, "block_size")


# --- a tiny trace, by hand ------------------------------------------------------------------------


def _tiny(add_us: float = 10) -> Trace:
    e = Events()
    e.step(1, 0, 1000)
    e.op("aten::linear", 10, 100)
    e.op("aten::addmm", 20, 80)
    e.runtime("cudaLaunchKernel", 30, 5, correlation=1)
    e._add(
        "kernel",
        "sm90_xmma_gemm_bf16bf16_bf16f32",
        100,
        100,
        device=0,
        stream=7,
        correlation=1,
        external_id=2,
    )
    e.op("aten::add", 200, 20)
    e.runtime("cudaLaunchKernel", 205, 5, correlation=2)
    e._add(
        "kernel",
        "vectorized_elementwise_kernel",
        300,
        add_us,
        device=0,
        stream=7,
        correlation=2,
        external_id=3,
    )
    t = e.trace()
    ops = conform_side(
        pl.DataFrame(
            {
                "rank": [0, 0, 0],
                "pid": [1, 1, 1],
                "tid": [1, 1, 1],
                "start_ns": [10_000, 20_000, 200_000],
                "name": ["aten::linear", "aten::addmm", "aten::add"],
                "external_id": [1, 2, 3],
                "input_dims": [
                    "[[1024, 1024], [1024, 1024], [1024]]",
                    "[[1024], [1024, 1024], [1024, 1024], [], []]",
                    "[[1024, 1024], [1024, 1024], []]",
                ],
                "input_types": [
                    f"[{BF16}, {BF16}, {BF16}]",
                    f'[{BF16}, {BF16}, {BF16}, "Scalar", "Scalar"]',
                    f'[{BF16}, {BF16}, "Scalar"]',
                ],
                "concrete_inputs": ['["", "", ""]', '["", "", "", "1", "1"]', '["", "", "1"]'],
            }
        ),
        OP_ARGS_SCHEMA,
    )
    t.op_args = ops
    t.meta.devices = [DeviceInfo(0, "NVIDIA H200", 132, 150109880320, "9.0")]
    return t


def test_tiny_trace_flops_mfu_and_bandwidth() -> None:
    a = analyze_trace(_tiny())
    m = a.metrics
    gemm = 2 * 1024**3  # the addmm once, not the linear too
    assert m["flops_per_step"] == gemm
    step_s = m["step_time_median_ns"] * 1e-9
    assert m["mfu"] == pytest.approx(gemm / step_s / 989.5e12)
    assert m["hfu"] == m["mfu"]
    assert m["achieved_tflops"]["gemm"] == pytest.approx(gemm / 100e-6 / 1e12)
    # aten::add: reads two 1024x1024 bf16 tensors, writes one, in 10 us, against 4.8 TB/s
    assert m["memory_bound_bandwidth_ratio"] == pytest.approx(3 * 2 * 1024**2 / 10e-6 / 4.8e12)
    dev = a.source["devices"][0]
    assert dev["peak_tflops"]["bf16"] == 989.5 and dev["memory_bandwidth_bytes_per_s"] == 4.8e12


def test_bytes_faster_than_hbm_are_no_hbm_traffic() -> None:
    # the add's 6 MiB in 1 us would be 6.3 TB/s, past the H200's 4.8: cache-resident (or the
    # wrong tensors), so no memory-bound kernel is left to measure (it read "100%", capped)
    a = analyze_trace(_tiny(add_us=1))
    assert a.metrics["memory_bound_bandwidth_ratio"] is None


def test_profiler_flops_win_over_the_formula() -> None:
    """with_flops=True: Kineto's own estimate on the op is used as it is."""
    t = _tiny()
    t.op_args = t.op_args.with_columns(
        pl.when(pl.col("name") == "aten::addmm").then(123_000).otherwise(None).alias("flops")
    )
    a = analyze_trace(t)
    assert a.metrics["flops_per_step"] == 123_000
    assert a.results.efficiency.flops.source == "with_flops"


def test_unknown_device_gives_null_and_one_warning() -> None:
    t = _tiny()
    t.meta.devices = [DeviceInfo(0, "Tiny GPU", 2, 1000, "9.0")]
    a = analyze_trace(t)
    assert a.metrics["mfu"] is None and a.metrics["flops_per_step"] == 2 * 1024**3
    assert sum("not in the spec table" in w for w in a.warnings) == 1
    assert a.source["devices"][0]["peak_tflops"] is None


def test_an_unnamed_device_is_said_unnamed() -> None:
    """audit 17: "device unnamed is not in the spec table" where the trace names no device."""
    t = _tiny()
    t.meta.devices = [DeviceInfo(0, None, 2, 1000, "9.0")]
    got = [w for w in analyze_trace(t).warnings if "spec table" in w]
    assert got == [
        "the trace does not name its device (no deviceProperties), so the spec table, which is "
        "keyed by device name, has no entry for it (traceinsight/data/devices.toml): MFU, HFU "
        "and the roofline's roofs are not computed"
    ]


# --- the H200 GPT fixtures ------------------------------------------------------------------------


def _fixture(name: str, **opts):

    truth = json.loads((FLOPS / f"{name}.truth.json").read_text())
    return analyzed(FLOPS / f"{name}.pt.trace.json.xz", **opts), truth


PEAK_BF16 = 989.5e12  # H200 SXM, the spec table's row (the fixtures ran on one)


@pytest.mark.parametrize("name", ["gpt_v8192", "gpt_v8191", "gpt_v8192_ckpt"])
def test_flops_and_mfu_against_analytic(name: str) -> None:
    a, truth = _fixture(name)
    e = a.results.efficiency
    executed = truth["analytic_flops_per_step_with_recompute"] or truth["analytic_flops_per_step"]
    model = truth["analytic_flops_per_step"]
    assert e.flops.per_step == pytest.approx(executed, rel=0.15)
    assert e.flops.model_per_step == pytest.approx(model, rel=0.15)
    # like with like: MFU on the trace's own (profiled) step time ...
    step_s = a.metrics["step_time_median_ns"] * 1e-9
    assert a.metrics["mfu"] == pytest.approx(model / step_s / PEAK_BF16, rel=0.15)
    # ... and, scaled to the un-profiled step time, the truth's MFU
    unprofiled_mfu = model / (truth["unprofiled_median_ms"] * 1e-3) / PEAK_BF16
    scaled = a.metrics["mfu"] * step_s / (truth["unprofiled_median_ms"] * 1e-3)
    assert scaled == pytest.approx(unprofiled_mfu, rel=0.15)


@pytest.mark.parametrize("name", ["gpt_v8192", "gpt_v8191", "gpt_v8192_ckpt"])
def test_gemm_flops_match_flop_counter(name: str) -> None:
    """FlopCounterMode counted one forward+backward with torch on the device: its mm+addmm are
    ours exactly; its attention is ours x 2 (it ignores the causal mask)."""
    a, truth = _fixture(name)
    e = a.results.efficiency
    by = truth["flop_counter_by_op"]
    assert e.flops.gemm_per_step == pytest.approx(by["aten.mm"] + by["aten.addmm"], rel=1e-6)
    attn = sum(v for k, v in by.items() if "attention" in k)
    assert e.flops.attention_per_step == pytest.approx(attn / 2, rel=1e-6)


def test_recompute_flops_found_in_checkpointed_fixture() -> None:
    a, truth = _fixture("gpt_v8192_ckpt")
    e = a.results.efficiency
    plain, _ = _fixture("gpt_v8192")
    # checkpointing re-runs the blocks' forward; the model FLOPs are those of the plain run
    assert e.flops.recompute_per_step > 0
    assert e.flops.model_per_step == pytest.approx(
        plain.results.efficiency.flops.per_step, rel=1e-6
    )
    assert a.metrics["hfu"] > a.metrics["mfu"]


def test_gemm_shape_inefficient_on_odd_vocab_only() -> None:
    odd, _ = _fixture("gpt_v8191", replay=True)
    even, _ = _fixture("gpt_v8192")
    f = next(f for f in odd.findings if f.id == "gemm_shape_inefficient")
    assert all(8191 in (g.m, g.n, g.k) for g in f.evidence["gemms"])
    assert 0 < f.evidence["saving_ns"] < f.evidence["unaligned_gemm_ns"]
    # replayed: this profiled step is host-bound, so faster GEMMs hardly move it
    assert f.evidence["what_if"].speedup >= 1.0
    assert not any(f.id == "gemm_shape_inefficient" for f in even.findings)
    assert not even.results.efficiency.unaligned_gemms.gemms


def test_fp32_advice_depends_on_device() -> None:
    from traceinsight.analyzers.host_ops import HostOpsResult, NewShapeOp
    from traceinsight.findings.rules import FP16_ADVICE, _fp32_advice

    none = HostOpsResult()
    assert _fp32_advice(False, False, none, 0.05) == FP16_ADVICE
    assert _fp32_advice(True, True, none, 0.05) == (None, None)
    assert "no TF32" in _fp32_advice(True, False, none, 0.05)[0]  # MI250
    assert _fp32_advice(None, None, none, 0.05) == (None, None)
    # per-shape setup in several steps, 10% of the window: fixed shapes first, then the
    # device's own advice (here a V100's fp16 with its snippet)
    op = NewShapeOp("aten::cudnn_convolution", 4, 8_000_000, 7_000_000, 100_000, 4)
    varying = HostOpsResult(
        window_ns=100_000_000, new_shape=(op,), new_shape_excess_ns=10_000_000, new_shape_steps=3
    )
    rec, snippet = _fp32_advice(False, False, varying, 0.05)
    assert rec.startswith("The inputs change shape") and "aten::cudnn_convolution" in rec
    assert rec.endswith(FP16_ADVICE[0]) and snippet == FP16_ADVICE[1]
    assert _fp32_advice(False, False, varying, 0.2) == FP16_ADVICE  # under the threshold
    one_step = HostOpsResult(
        window_ns=100_000_000, new_shape=(op,), new_shape_excess_ns=10_000_000, new_shape_steps=1
    )
    assert _fp32_advice(True, True, one_step, 0.05) == (None, None)  # a first step's shapes


def test_fp32_fixture_keeps_bf16_advice_on_h200() -> None:

    a = analyzed(ROOT / "fixtures" / "h200" / "fp32.pt.trace.json.xz")
    f = next(f for f in a.findings if f.id == "fp32_compute")
    assert (
        "bfloat16" in f.snippet
        and "torch.float16" not in f.snippet
        and "no GradScaler" in f.recommendation
    )
    assert a.results.efficiency.occupancy.median is not None


def test_json_has_efficiency_details(tmp_path: Path) -> None:
    a, _ = _fixture("gpt_v8192", replay=False)
    doc = a.to_json()
    eff = doc["details"]["efficiency"]
    assert eff["roofline"]["classes"] and eff["roofline"]["top_kernels"]
    assert doc["source"]["devices"][0]["spec"] == "H200-SXM"
    json.dumps(doc)  # plain JSON values only
    assert Options  # the options type the analysis is given


def _gemms(rows: list[tuple[int, int, int, int]]) -> pl.DataFrame:
    """Kernel rows of 16-bit GEMMs: (m, n, k, duration ns)."""
    return pl.DataFrame(
        {
            "formula": ["gemm"] * len(rows),
            "dtype": ["bf16"] * len(rows),
            "gemm_m": [r[0] for r in rows],
            "gemm_n": [r[1] for r in rows],
            "gemm_k": [r[2] for r in rows],
            "flops": [2.0 * r[0] * r[1] * r[2] for r in rows],
            "bytes": [2.0 * (r[0] * r[2] + r[2] * r[1] + r[0] * r[1]) for r in rows],
            "dur_ns": [r[3] for r in rows],
            "op": ["aten::mm"] * len(rows),
            "device": [0] * len(rows),
            "start_ns": list(range(len(rows))),
        }
    )


def test_unaligned_gemms_by_hand() -> None:
    fast = 2 * 1024**3 / 4_000  # FLOP/ns of the aligned reference: 1024^3 GEMM in 4 us
    # 1000 is a multiple of 8, not of 64: reported only where >= 1.5x slower than the reference
    slow64 = _gemms([(1024, 1024, 1024, 4_000), (1000, 1024, 1024, 8_000)])
    u = unaligned_gemms(slow64, None, kernel_ns=16_000)
    assert [(g.m, g.alignment) for g in u.gemms] == [(1000, "64")]
    assert u.saving_ns == int(8_000 - 2 * 1000 * 1024 * 1024 / fast) and u.time_ns == 8_000
    assert u.time_ratio == 0.5
    assert u.what_if is None  # no replay
    fine = _gemms([(1024, 1024, 1024, 4_000), (1000, 1024, 1024, 4_500)])
    assert unaligned_gemms(fine, None) == UnalignedGemms()
    # an odd size is reported whenever it is slower than the aligned GEMMs of similar size
    odd = _gemms([(1024, 1024, 1024, 4_000), (1023, 1024, 1024, 5_000)])
    assert [g.alignment for g in unaligned_gemms(odd, None).gemms] == ["8"]
    # no aligned GEMM within 4x of its FLOPs: nothing to compare with, not reported
    far = _gemms([(64, 64, 64, 1_000), (1023, 1024, 1024, 5_000)])
    assert unaligned_gemms(far, None).gemms == ()


def test_small_gemms_are_not_misaligned() -> None:
    """Padding is the fix only where it adds little work (PAD_WORK_MAX_RATIO 1.25). Audit 5:
    TimeSformer's temporal attention, 8x8x64 batched GEMMs at a fraction of the roofline,
    read "64-unaligned: padding saves 16.40 ms", where padding to 64 multiplies the work
    64-fold; a GEMV's M of 1 padded to 8, 8-fold. A 4000-row GEMM padded to 4032: 1.008,
    judged against a 64-aligned GEMM of its size measured faster (4096 rows in 300 us). Without
    one, a shape aligned to 8 is not judged against the roofline: that cannot tell alignment from
    a small grid (audit 17: a B200's 888x640x2880, 35 output tiles on 148 SMs, read "off the
    tensor-core alignment")."""
    from traceinsight.model.devices import lookup

    h200 = lookup("NVIDIA H200", 150_000_000_000)
    shapes = [(8, 8, 64, 50_000), (1, 4096, 4096, 500_000), (4000, 4096, 4096, 900_000)]
    slow = _gemms([*shapes, (4096, 4096, 4096, 300_000)])
    assert [(g.m, g.alignment) for g in unaligned_gemms(slow, None, h200).gemms] == [(4000, "64")]
    assert unaligned_gemms(_gemms(shapes), None, h200).gemms == ()


def test_unaligned_gemms_against_the_roofline_without_aligned_ones() -> None:
    """Every GEMM unaligned: judged against the device's roofline (H200 bf16 989.5 TFLOP/s,
    4.8 TB/s) at half the attainable rate. 3137x3137x64 (K = 64): 1.26 GFLOP over 20.5 MB,
    intensity 61.5 FLOP/B x 4.8e12 B/s = 295 TFLOP/s attainable, 147.6 expected (8.5 us); at
    25 us it ran 50.4 TFLOP/s (reported, saving 25 - 8.5 us); at 8 us it beat the expectation."""
    from traceinsight.model.devices import lookup

    h200 = lookup("NVIDIA H200", 150_000_000_000)
    assert h200 is not None and h200.id == "H200-SXM"
    m, n, k = 3137, 3137, 64
    flops, nbytes = 2.0 * m * n * k, 2.0 * (m * k + k * n + m * n)
    rate = min(989.5e3, flops / nbytes * h200.memory_bandwidth_bytes_per_s / 1e9)
    expected = flops / (rate * GEMM_ROOFLINE_EFFICIENCY)
    (u,) = unaligned_gemms(_gemms([(m, n, k, 25_000)]), None, h200).gemms
    assert u.reference == "roofline" and u.reference_shapes == ()
    assert u.reference_tflops == pytest.approx(rate * GEMM_ROOFLINE_EFFICIENCY / 1e3)
    assert u.saving_ns == int(25_000 - expected)
    assert expected == pytest.approx(8_534, abs=5)
    assert unaligned_gemms(_gemms([(m, n, k, 8_000)]), None, h200).gemms == ()
    # no device: no roofline
    assert unaligned_gemms(_gemms([(m, n, k, 25_000)]), None, None).gemms == ()


def test_occupancy_estimate_agrees_with_kineto() -> None:
    """Our estimate from grid, block, registers and shared memory with the spec table's sm90
    limits, against Kineto's est. achieved occupancy on every kernel where Kineto has one.
    Private helpers on purpose: no public result holds a kernel's occupancy (only the
    time-weighted median and per-name means), and the comparison is per kernel."""
    from dataclasses import replace

    from traceinsight.analyzers import efficiency as eff
    from traceinsight.analyzers.context import build_context
    from traceinsight.parsers import load_trace

    ctx = build_context(load_trace(ROOT / "fixtures" / "h200" / "healthy_bf16.pt.trace.json.xz"))
    k = eff._kernels(ctx).with_columns(pl.lit(False).alias("recomputed"))
    kineto = ctx.kernel_args.select("rank", "device", "correlation", "occupancy_ratio")
    blind = replace(ctx, kernel_args=ctx.kernel_args.with_columns(occupancy_ratio=None))
    est = eff._occupancy(blind, k, eff._occupancy_basis(ctx)).join(
        kineto, on=["rank", "device", "correlation"]
    )
    known = est.filter(pl.col("occupancy_ratio") > 0)  # 0: Kineto's query failed (clusters)
    assert known.height > 1000
    assert (known["occupancy"] - known["occupancy_ratio"]).abs().max() < 0.02


@pytest.mark.parametrize(
    ("rel", "has_bf16"),
    [
        # an RTX 2080 Ti (compute capability 7.5, not in the spec table): no bf16/TF32
        ("param/linear_kineto.json.gz", False),
        # no deviceProperties at all, cuDNN's volta_* kernels: a V100
        (
            "kineto-samples/tbplugin_2021-01_resnet50_profiler_api_nw4_worker0.pt.trace.json.gz",
            False,
        ),
    ],
)
def test_tensor_dtypes_without_a_spec(rel: str, has_bf16: bool) -> None:
    from traceinsight.findings.rules import FP16_ADVICE

    path = SHARED / rel
    if not path.exists():
        pytest.skip(f"corpus trace not here: {path}")
    a = analyzed(path)
    assert a.results.efficiency.device.spec is None
    assert a.results.efficiency.device.has_bf16 is has_bf16
    f = next(f for f in a.findings if f.id == "fp32_compute")
    assert f.recommendation == FP16_ADVICE[0]


def test_occupancy_unknown_without_registers_or_kinetos_estimate() -> None:
    """Audit 5: ROCm's Kineto records no registers or shared memory, so a launch configuration
    bounds occupancy only from above (a register-limited GEMM read 100%: "occupancy 100.0%"
    on three MI300 traces); and Kineto's 0 is a failed query (an H800 step's
    cudaLaunchKernelExC kernels: "occupancy 0.0%"). Both are unknown, not a value, except
    where the grid alone keeps the kernel low; and no median from so few known kernels."""
    from dataclasses import replace

    from traceinsight.analyzers import efficiency as eff
    from traceinsight.analyzers.context import build_context
    from traceinsight.parsers import load_trace

    amd = ROOT / "fixtures" / "foreign" / "tl_mi300_ddp_resnet18.json.xz"
    ctx = build_context(load_trace(amd))
    assert ctx.kernel_args.height and ctx.kernel_args["registers_per_thread"].null_count() == (
        ctx.kernel_args.height
    )
    assert analyzed(amd).results.efficiency.occupancy.median is None
    # a CUDA trace whose kernels lost their registers and whose Kineto estimates all read 0
    ctx = build_context(load_trace(ROOT / "fixtures" / "h200" / "healthy_bf16.pt.trace.json.xz"))
    k = eff._kernels(ctx).with_columns(pl.lit(False).alias("recomputed"))
    zero = replace(
        ctx,
        kernel_args=ctx.kernel_args.with_columns(
            occupancy_ratio=pl.lit(0.0), registers_per_thread=pl.lit(None, pl.Int64)
        ),
    )
    got = eff._occupancy(zero, k, eff._occupancy_basis(ctx)).filter(
        pl.col("occupancy").is_not_null()
    )
    # known only where the grid is too small to fill the device (low whatever the registers)
    assert got.height < k.height / 2 and set(got["limiter"]) <= {"grid"}
    assert got["occupancy"].max() < eff.LOW_OCCUPANCY
    # with the registers, our estimate stands where Kineto's query failed
    some = replace(ctx, kernel_args=ctx.kernel_args.with_columns(occupancy_ratio=pl.lit(0.0)))
    assert eff._occupancy(some, k, eff._occupancy_basis(ctx))["occupancy"].drop_nulls().len() > 1000


def test_mfu_is_a_lower_bound_where_few_flops_are_known() -> None:
    """Audit 9: "MFU 0.0%" on a vLLM trace 99.8% busy in MoE matmuls replayed from graphs (no
    shapes: FLOPs for 0.2% of the math kernels' time); "0.1%" on a B200 serving trace (11%).
    Below 5% known (session 52: "MFU at least 0.0%" there) it is unknown, not a bound."""
    from traceinsight.report.terminal import render_summary

    doc = analyzed(ROOT / "fixtures" / "foreign" / "tl_vllm_piecewise_exec.json.xz").to_json()
    cover = doc["metrics"]["math_flops_coverage_ratio"]
    assert cover is not None and cover < 0.01
    assert f"MFU unknown (FLOPs known for {cover * 100:.1f}% of the math" in render_summary(doc)  # fmt: skip
    from traceinsight.report.format import mfu_words

    bound = {"mfu": 0.001, "hfu": 0.002, "math_flops_coverage_ratio": 0.11}
    assert mfu_words(bound) == "MFU at least 0.1% (HFU 0.2%; FLOPs known for 11.0% of the math kernels' time)"  # fmt: skip
    healthy = analyzed(ROOT / "fixtures" / "h200" / "healthy_bf16.pt.trace.json.xz").to_json()
    assert healthy["metrics"]["math_flops_coverage_ratio"] > 0.5
    assert "MFU at least" not in render_summary(healthy)


def test_flops_follow_the_op_around_the_launch_where_external_ids_are_shifted():
    """A public A100 Switch Transformer trace whose kernels' External ids name no op around
    their launch (kernel 1084 launched inside op 14): FLOPs were linked by the id alone, to an
    aten::view or nothing (2.3% of the math time with FLOPs on its twin; "GEMM/attention 28
    TFLOP/s" above the fp32 peak). Summed by hand: the 111 GEMM kernels' innermost enclosing
    ops on the launching thread (91 aten::addmm, 20 aten::bmm) do 2*M*N*K = 25,989,734,400."""
    import bisect
    import lzma

    path = ROOT / "fixtures" / "foreign" / "switchtransformers_trace.json.xz"
    with lzma.open(path) as f:
        ev = [e for e in json.loads(f.read())["traceEvents"] if e.get("ph") == "X"]
    calls = {e["args"].get("correlation"): e for e in ev if e.get("cat") == "cuda_runtime"}
    ops = sorted((e for e in ev if e.get("cat") == "cpu_op"), key=lambda e: e["ts"])
    starts = [o["ts"] for o in ops]
    flops = 0
    for k in (e for e in ev if e.get("cat") == "kernel" and "gemm" in e["name"]):
        call = calls[k["args"]["correlation"]]
        i = bisect.bisect_right(starts, call["ts"]) - 1
        while not (ops[i]["tid"] == call["tid"] and ops[i]["ts"] + ops[i]["dur"] >= call["ts"]):
            i -= 1
        assert ops[i]["args"]["External id"] != k["args"]["External id"]  # shifted ids
        dims = ops[i]["args"]["Input Dims"]
        if ops[i]["name"] == "aten::addmm":
            (m, kk), n = dims[1], dims[2][1]
            flops += 2 * m * n * kk
        else:
            assert ops[i]["name"] == "aten::bmm"
            (b, m, kk), n = dims[0], dims[1][2]
            flops += 2 * b * m * n * kk
    assert flops == 25_989_734_400
    m = analyzed(path).results.metrics()
    assert m["flops_per_step"] == pytest.approx(flops, rel=1e-9)
    assert m["math_flops_coverage_ratio"] == 1.0


def test_a_kernel_links_to_the_innermost_op_enclosing_its_launch():
    """Audit 14: a kernel whose External id names no op around its launch went to the latest op
    started before the call, and was dropped where that op (an aten::addmm's child
    aten::empty) had already ended: an H100 tutorial's three addmm GEMMs (72% of its FLOPs)
    were unlinked, MFU 0.5% instead of 1.7%. By hand: addmm [0, 50] us with a child empty at
    [12, 18] us; one launch at 39 us (after the child: the addmm), one at 15 us (inside it)."""
    from traceinsight.analyzers.efficiency import _linked

    us = 1000
    oa = pl.DataFrame(
        {
            "rank": [0, 0],
            "external_id": [49, 50],
            "tid": [1, 1],
            "start_ns": [0, 12 * us],
            "dur_ns": [50 * us, 6 * us],
        }
    )
    k = pl.DataFrame(
        {
            "rank": [0, 0, 0],
            "external_id": [999, 999, 999],
            "launch_start_ns": [39 * us, 15 * us, 60 * us],
            "launch_tid": [1, 1, 1],
        }
    )
    assert _linked(k, oa)["external_id"].to_list() == [49, 50, None]
