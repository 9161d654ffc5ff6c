"""The sixteenth search of public traces (session 62: 20 traces of 6 repositories; LoRA
fine-tunes on an A100 and an RTX 5090, T4 CNN training, HTA's author's small programs), each
defect reproduced on a hand-written trace whose numbers are worked out by hand."""

from __future__ import annotations

import pytest

from traceinsight.parsers import load_trace
from traceinsight.pipeline import analyze_trace

from .builder import Events
from .conftest import FIXTURES

ELEMENTWISE = "void at::native::vectorized_elementwise_kernel<4, at::native::AUnaryFunctor<float>>"


def _optimizer_before_the_first_kernel() -> Events:
    """No steps: the window starts at the GPU's first activity. The optimizer's range starts
    500 us before it (its first op's launch), holds 100 per-parameter ops each launching one
    10 us kernel (launch 20 us apart) and ends at 2,500 us."""
    ev = Events().annotation("Optimizer.step#Adam.step", 0, 2500)
    for i in range(100):
        t = 10 + 20 * i
        ev.op("aten::mul_", t, 15)
        ev.kernel(ELEMENTWISE, 500 + 20 * i, 10, launch_us=t + 2)
    return ev


def test_an_optimizer_starting_before_the_window_is_seen() -> None:
    """Audit s62 D1: the range was kept only where it started inside the window, which a host
    range never does when the window begins with its own kernels; 224 per-parameter AdamW
    kernels read as launch-bound. Ranges overlapping the window count: one step, 100 kernels,
    1,000 us of GPU time and 2,500 us on the host."""
    a = analyze_trace(_optimizer_before_the_first_kernel().trace())
    o = a.results.optimizer
    assert (o.optimizer_steps, o.optimizer, o.mode) == (1, "Adam", "per_parameter")
    assert o.kernels_per_step == 100 and o.gpu_ns_per_step == 1_000_000
    assert o.host_ns_per_step == 2_500_000
    assert "unfused_optimizer" in {f.id for f in a.findings}


def test_a_program_of_repeated_read_backs_is_no_one_shot() -> None:
    """Audit s62 D3: 4,096 `.cpu()` read-backs, no kernel, 94% of the window idle in their
    syncs, were capped LOW as "one pass of a small program: nothing in it repeats" (kernels
    alone were counted). Here 120 read-backs 1 ms apart, each a 10 us copy and a 900 us sync:
    119 syncs in the window, a loop (100 or more), not one pass; host_sync is graded by its
    cost, uncapped. Copies alone do not make a loop: one kernel's unified-memory migrations
    are thousands (the T4 softmax fixture's 2,370 stay one pass)."""
    from traceinsight.findings.rules import one_shot

    ev = Events()
    for i in range(120):
        t = 1000 * i
        corr = ev.next_correlation()
        ev.runtime("cudaMemcpyAsync", t, 20, correlation=corr)
        ev._add(
            "memcpy", "Memcpy DtoH (Device -> Pageable)", t + 5, 10, device=0, stream=7,
            correlation=corr, copy_kind="DtoH", bytes=4, src_kind="device", dst_kind="pageable",
        )  # fmt: skip
        ev.runtime("cudaStreamSynchronize", t + 25, 900)
    a = analyze_trace(ev.trace())
    # the window is the GPU's span, first copy to last: the last copy's sync lies after it
    assert a.results.kernels.kernel_count == 0 and a.results.syncs.host_sync_count == 119
    assert not one_shot(a.results)
    f = next(f for f in a.findings if f.id == "host_sync")
    assert "one pass" not in str(f.evidence.get("severity_cap_reason", ""))
    assert f.severity in ("medium", "high")
    um = analyze_trace(load_trace(FIXTURES / "foreign" / "awsgpu_report2.sqlite.xz"))
    assert um.results.kernels.kernel_count == 1 and one_shot(um.results)


def test_peer_copies_get_the_peer_advice_not_the_host_links() -> None:
    """Audit s62 D4: 30 peer copies of 40 MB GPU0 -> GPU1 at ~88 GB/s, no host-to-device byte,
    were told "move fewer bytes between host and device ... 25 GB/s on PCIe". Here 10 peer
    copies of 40 MB, 500 us each back to back, and one 10 us kernel: copy_bound names 400 MB
    between or within GPUs at 80.0 GB/s (400e6 B / 5e-3 s) and the peer advice."""
    for pytorch in (False, True):
        ev = Events().kernel("void k", 0, 10)
        if pytorch:  # an op of PyTorch's: its advice and snippet, else a CUDA program's
            ev.op("aten::copy_", 5, 5000)
        for i in range(10):
            ev._add(
                "memcpy", "Memcpy PtoP (Device -> Device)", 10 + 500 * i, 500, device=0, stream=9,
                correlation=ev.next_correlation(), copy_kind="PtoP", bytes=40_000_000,
                src_kind="device", dst_kind="device",
            )  # fmt: skip
        f = next(f for f in analyze_trace(ev.trace()).findings if f.id == "copy_bound")
        assert "400.0 MB between or within GPUs at 80.0 GB/s" in f.title
        assert "peer access" in f.recommendation and "host and device" not in f.recommendation
        want = "can_device_access_peer" if pytorch else "cudaDeviceEnablePeerAccess"
        assert want in f.snippet


def test_a_pageable_copy_saving_never_shortens_the_run_below_its_kernels() -> None:
    """Audit s62 D5: with no steps the saving was the host's blocked time less the copies at
    the pinned rate, 271.79 ms of a 509.33 ms window whose kernels alone ran 257.8 ms: the run
    after it shorter than its kernels. Here stream 7 runs ten 10 ms kernels back to back
    (0-100 ms) while the host blocks 9 ms in each of ten pageable uploads on stream 9: the
    window is 100 ms, the kernels' union 100 ms, so nothing is left to save."""
    ev = Events()
    for i in range(10):
        ev.kernel("void k", 10_000 * i, 10_000)
        corr = ev.next_correlation()
        ev.runtime("cudaMemcpy", 10_000 * i + 100, 9_000, correlation=corr)
        ev._add(
            "memcpy", "Memcpy HtoD (Pageable -> Device)", 10_000 * i + 8_000, 1_000, device=0,
            stream=9, correlation=corr, copy_kind="HtoD", bytes=4_000_000, src_kind="pageable",
            dst_kind="device",
        )  # fmt: skip
    a = analyze_trace(ev.trace())
    assert a.results.idle.kernel_busy_ratio == 1.0
    assert a.results.copies.host_blocking_copy_ns >= 80_000_000  # the blocked time is there
    f = next((f for f in a.findings if f.id == "pageable_memcpy"), None)
    assert f is None or f.cost_ns == 0


def test_one_time_calls_inside_the_optimizer_are_no_step_cost() -> None:
    """Audit s62 D2: a cold LoRA loop's 42.43 ms AdamW step held three first calls of 37.0 ms
    (lazy module loads); the finding priced them as every step's and ranked first. Here, no
    steps, three optimizer ranges of 50 per-parameter ops (20 us apart, one 10 us kernel each);
    the first also holds aten::sqrt's first call, 15,000 us (its later calls 30 us): one-time,
    left out. By hand: the ranges run 16,130, 1,160 and 1,160 us (the first call, 10 us, 50
    ops 20 us apart, 120 us after); less the 15,000 us call, 3,450 us over 3 steps."""
    ev = Events()
    for r, t0 in enumerate((0, 30_000, 40_000)):
        first = 15_000 if r == 0 else 30
        ev.annotation("Optimizer.step#Adam.step", t0, first + 10 + 20 * 50 + 120)
        ev.op("aten::sqrt", t0 + 5, first)
        for i in range(50):
            t = t0 + first + 10 + 20 * i
            ev.op("aten::mul_", t, 15)
            ev.kernel(ELEMENTWISE, t + 30, 10, launch_us=t + 2)
    a = analyze_trace(ev.trace())
    o = a.results.optimizer
    assert (o.optimizer_steps, o.mode, o.kernels_per_step) == (3, "per_parameter", 50)
    assert o.one_time_host_ns == 15_000_000
    spans = [first + 10 + 20 * 50 + 120 for first in (15_000, 30, 30)]  # 16,130 / 1,160 / 1,160
    assert o.host_ns_per_step == pytest.approx((sum(spans) - 15_000) * 1000 / 3)


TRITON = "triton_per_fused_layer_norm_tanh_0"


def _partly_compiled(compiled_gaps: bool) -> Events:
    """40 eager ops, each launching a 5 us kernel 20 us after the last (a 15 us launch gap
    each), then a compiled region launching Triton kernels: 20 queued back to back (no gap)
    or, with ``compiled_gaps``, 60 launched 20 us apart as well (each launch call 12 us of the
    15 us gap). A third or 60% of the kernels are Triton (over COMPILED_KERNEL_MIN_RATIO 0.2)."""
    ev = Events()
    for i in range(40):
        t = 20 * i
        ev.op("aten::tanh", t, 18)
        ev.kernel(ELEMENTWISE, t + 17, 5, launch_us=t + 12)
    t0 = 20 * 40
    n = 60 if compiled_gaps else 20
    ev.annotation("Torch-Compiled Region: 0/0", t0, 20 * n + 20)
    for i in range(n):
        if compiled_gaps:
            # the launcher's Python and the launch: 12 us of each 15 us gap
            ev.kernel(TRITON, t0 + 20 * i + 17, 5, launch_us=t0 + 20 * i + 5, launch_dur_us=12)
        else:
            ev.kernel(TRITON, t0 + 17 + 5 * i, 5, launch_us=t0 + 2 + i * 0.5, launch_dur_us=0.4)
    return ev


def test_launch_advice_follows_the_code_the_launch_gaps_precede() -> None:
    """Audit s62 D6: a program 30% Triton kernels was told "the step is already compiled ...
    the launches left are the compiled code's own" though its launch-bound idle all came
    before eager kernels (tanh, LayerNorm). Here the eager part's 39 gaps of 15 us (585 us)
    precede eager kernels: the compiled share of the launch idle is the gap before the
    region's first Triton kernel alone, and the advice names the eager part. Where the
    compiled code's launches leave the gaps (15 us each inside the region), most of the
    launch idle is compiled (60 gaps of 15 us, 900 us, the one before the region's first
    kernel among them, against the eager 585 us) and the advice is the compiled step's."""
    a = analyze_trace(_partly_compiled(False).trace())
    assert round(a.results.kernels.compiled_kernel_ratio, 3) == round(20 / 60, 3)
    cost = a.results.idle.idle_by_cause_ns["launch_overhead"]
    assert a.results.idle.launch_overhead_compiled_ns <= 0.1 * cost
    f = next(f for f in a.findings if f.id == "launch_bound")
    assert f.recommendation.startswith("Part of the program is compiled")
    assert "already compiled" not in f.recommendation
    b = analyze_trace(_partly_compiled(True).trace())
    cost = b.results.idle.idle_by_cause_ns["launch_overhead"]
    assert (cost, b.results.idle.launch_overhead_compiled_ns) == (1_485_000, 900_000)
    g = next(f for f in b.findings if f.id == "launch_bound")
    assert g.recommendation.startswith("The step is already compiled")


@pytest.mark.parametrize(
    ("name", "memory_bytes", "sms", "cc", "spec_id", "bf16", "fp32"),
    [
        # NVIDIA PG509-210: an A100 SXM4 80GB board as some hosts name it (8 in a public trace)
        ("NVIDIA PG509-210", 85_198_045_184, 108, "8.0", "A100-SXM4-80GB", 312.0, 19.5),
        ("NVIDIA A10G", 23_609_475_072, 80, "8.6", "A10G", 70.0, 35.0),
        ("NVIDIA A10", 23_609_475_072, 72, "8.6", "A10", 125.0, 31.2),
        ("NVIDIA GeForce RTX 5090", 33_667_874_816, 170, "12.0", "RTX-5090", 209.5, 104.8),
    ],
)
def test_the_audits_devices_have_their_datasheets(
    name: str, memory_bytes: int, sms: int, cc: str, spec_id: str, bf16: float, fp32: float
) -> None:
    """Audit s62 D7: A10G (AWS G5), RTX 5090 and PG509-210 had no row, so MFU and the roofline
    were not computed for three of the six devices the audit's traces named."""
    from traceinsight.model.devices import lookup

    spec = lookup(name, memory_bytes, sms, cc)
    assert spec is not None and spec.id == spec_id
    assert (spec.peak_tflops["bf16"], spec.peak_tflops["fp32"]) == (bf16, fp32)
