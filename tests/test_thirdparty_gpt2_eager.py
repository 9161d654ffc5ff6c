"""Predictions against a held-out GPU-bound loop (session 65, an NVIDIA H100 80GB HBM3, written and
its fixes decided before any recording; fixtures/generate/thirdparty/loop_gpt2_eager.py): the
Hugging Face course's accelerate loop training GPT-2 small (12 x 768, vocabulary 50,257) at 8 x
1024 tokens under bf16 autocast, with ``attn_implementation="eager"`` and GPT-2's ``gelu_new``.
Fixes, each alone and all together, un-profiled in two processes (A, B): sdpa 1.54-1.55x, the
default torch.compile 2.43x, fused AdamW 1.02-1.03x, a 2x batch 1.07x per sample, all (sdpa,
compile, fused AdamW) 3.24-3.27x; profiled: the baseline and each of sdpa, compile, all.

The first analysis had the eager attention at info, 1.00x: the fused kernel was priced at the
softmax's fp32 (autocast runs softmax in fp32, the matmuls in bf16) for 5x the calls (the
nested aten::softmax / aten::_softmax of one call counted apart)."""

from __future__ import annotations

from collections import Counter

import pytest

import traceinsight

from .conftest import RecordedLoop, _analyzed_once, raw_events, within_band

LOOP = RecordedLoop.named("gpt2_eager")
STEPS = 3


def _after(config: str):
    return _analyzed_once(LOOP.before.with_name(f"gpt2_eager.{config}.after.pt.trace.json.xz"))


def test_eager_attention_first_and_within_the_sdpa_band() -> None:
    """attention_unfused comes first, HIGH, 1.54x against sdpa's 1.54-1.55x."""
    a = LOOP.analysis()
    f = a.findings[0]
    assert f.id == "attention_unfused" and f.severity == "high"
    b = LOOP.band("sdpa")
    assert within_band(f.what_if.speedup, b["low"], b["high"])
    assert abs(f.what_if.speedup / ((b["low"] + b["high"]) / 2) - 1) < 0.02


def test_eager_attention_shape_calls_and_dtype_from_the_raw_events() -> None:
    """12 layers x 3 steps = 36 softmax calls forward (aten::_softmax, once per call; the
    aten::softmax above it twice under autocast) and 36 backward, on [8, 12, 1024, 1024] in
    fp32, between bf16 Q @ K^T bmms of [96, 1024, 64] x [96, 64, 1024]."""
    ops = [e for e in raw_events(LOOP.before) if e.get("cat") == "cpu_op"]
    names = Counter(e["name"] for e in ops)
    assert names["aten::_softmax"] == 36 and names["aten::_softmax_backward_data"] == 36
    qk = [
        e
        for e in ops
        if e["name"] == "aten::bmm"
        and e["args"].get("Input Dims") == [[96, 1024, 64], [96, 64, 1024]]
    ]
    assert qk and {tuple(e["args"]["Input type"]) for e in qk} == {("c10::BFloat16",) * 2}
    ev = LOOP.finding("attention_unfused").evidence
    assert (ev["seq_len"], ev["batch_heads"], ev["head_dim"]) == (1024, 96, 64)
    assert (ev["forward_calls"], ev["backward_calls"], ev["dtype"]) == (36, 36, "bf16")


def test_fused_attention_priced_at_the_bf16_peak() -> None:
    """4 B·H T² d per forward call, 2.5x that backward: 36 x 4 x 96 x 1024² x 64 x 3.5 =
    3.2469 TFLOP over the window, at half the H100 SXM's 989.5 bf16 TFLOP/s: 6.56 ms, against
    the eager kernels' 124.08 ms (3 steps)."""
    flops = 36 * 4 * 96 * 1024**2 * 64 * 3.5
    ev = LOOP.finding("attention_unfused").evidence
    assert ev["fused_estimate_ns"] == pytest.approx(flops / (989.5e12 * 0.5) * 1e9, rel=1e-3)
    assert ev["eager_kernel_ns"] / 1e6 == pytest.approx(124.08, abs=0.01)


def test_elementwise_fusion_within_the_compile_band() -> None:
    """Runs of elementwise and reduction kernels fused, each read and written once, their ops'
    dispatch gone: 2.63x against the default compile's 2.43x (1.08; 2.04x while a run was
    priced at its longest kernel). Graded low (the rule's cap: on eager transformers that run
    well, fusion is an optimization, not a starved GPU)."""
    f = LOOP.finding("elementwise_heavy")
    assert f.severity == "low"
    b = LOOP.band("compile")
    assert within_band(f.what_if.speedup, b["low"], b["high"])


def test_the_applied_set_within_the_all_band() -> None:
    """--what-if attention_unfused,elementwise_heavy,unfused_optimizer: 3.35x against all's
    3.24-3.27x (1.03)."""
    w = LOOP.what_if(["attention_unfused", "elementwise_heavy", "unfused_optimizer"])
    b = LOOP.band("all")
    assert within_band(w.speedup, b["low"], b["high"])


def test_small_levers_stay_low() -> None:
    """Fused AdamW measured 1.02-1.03x (unfused_optimizer info, 1.03x), the 2x batch 1.07x per
    sample (no batch finding above low)."""
    a = LOOP.analysis()
    f = LOOP.finding("unfused_optimizer")
    b = LOOP.band("fused_adamw")
    assert f.severity in ("info", "low") and within_band(f.what_if.speedup, b["low"], b["high"])
    batch = [g for g in a.findings if g.id in ("memory_headroom", "small_batch")]
    assert all(g.severity in ("info", "low") for g in batch)


def test_the_fixed_causes_are_gone_in_the_profiled_afters() -> None:
    assert "attention_unfused" not in {f.id for f in _after("sdpa").findings}
    assert "elementwise_heavy" not in {f.id for f in _after("compile").findings}


def test_unprofiled_estimates_within_ten_percent_of_their_process() -> None:
    """The same process's un-profiled window mean before each capture: 111.92 (baseline),
    72.39 (sdpa), 47.84 ms (compile); the estimates 111.69, 72.38, 47.91 ms."""
    truth = LOOP.truth["profiled"]
    for config, trace in (("baseline", None), ("sdpa", "sdpa"), ("compile", "compile")):
        a = LOOP.analysis() if trace is None else _after(trace)
        own = truth[config]["unprofiled_same_process_step_ms_window_mean"]
        assert a.results.replay.unprofiled_step_ns / 1e6 == pytest.approx(own, rel=0.10)


@pytest.mark.xfail(
    strict=True,
    reason="the largest measured lever is the default compile (2.43x), whose finding "
    "(elementwise_heavy, 2.63x) the rule caps at low; attention_unfused (1.54x, sdpa "
    "1.54-1.55x) comes first. Uncapped, fusion read medium or high on 91 of 299 corpus and "
    "fixture inputs (31 of 330 before session 66 priced a fused run by what it reads and "
    "writes), among them the healthy bf16 encoder (1.44x) and the ViT (1.41x) whose default "
    "compile measured 0.94-1.22x",
)
def test_first_finding_is_the_largest_measured_lever() -> None:
    assert LOOP.analysis().findings[0].id == "elementwise_heavy"


def test_compiled_eager_attention_is_found_and_priced() -> None:
    """The compiled after's attention stays eager (inductor's Triton softmax on [96, 1024, 1024]
    between the bmms): attention_unfused, and the fixes left (SDPA, fused AdamW) 1.29x against
    all over compile, 3.24-3.27 / 2.43 = 1.33-1.35x (0.97)."""
    after = LOOP.before.with_name("gpt2_eager.compile.after.pt.trace.json.xz")
    f = next(f for f in _after("compile").findings if f.id == "attention_unfused")
    assert f.evidence["compiled"] and (f.evidence["seq_len"], f.evidence["batch_heads"]) == (
        1024,
        96,
    )
    left = traceinsight.analyze(
        after, what_if=["attention_unfused", "unfused_optimizer"]
    ).selected.what_if
    lo = LOOP.band("all")["low"] / LOOP.band("compile")["high"]
    hi = LOOP.band("all")["high"] / LOOP.band("compile")["low"]
    assert within_band(left.speedup, lo, hi)


def test_input_copies_and_the_masks_device_constant_are_told_apart() -> None:
    """Six syncing host-to-device copies in three steps: each step's input batch (.to() without
    non_blocking) and the eager mask's torch.tensor(0.0, device=...) (followed by its
    aten::lift_fresh). The title counts both, the advice stays the inputs'."""
    f = next(f for f in LOOP.analysis().findings if f.id == "sync_input_copy")
    assert (f.evidence["input_copy_sync_count"], f.evidence["constructed_copy_sync_count"]) == (
        6,
        3,
    )
    assert "(3 of them tensors built from Python data" in f.title
    assert "pin_memory=True" in f.recommendation
