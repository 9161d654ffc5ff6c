"""Predictions against a second held-out GPU-bound loop (session 66, an NVIDIA H100 80GB HBM3,
written and its fixes decided in session 65 before any recording;
fixtures/generate/thirdparty/loop_llama_eager.py): transformers' ``LlamaForCausalLM`` built from a
config (1024 wide, 8 layers, 16 heads, vocabulary 32,000) trained in a plain loop at 4 x 2048
tokens under bf16 autocast with ``attn_implementation="eager"``. Fixes, each alone and all
together, un-profiled in two processes (A, B): sdpa 2.43-2.44x, the default torch.compile
2.56-2.57x, fused AdamW 1.03x, all three 4.25-4.26x; profiled: the baseline and each of sdpa,
compile, all.

It holds session 65's two changes (the attention priced in Q's dtype, each softmax call once;
fusion over elementwise and reduction runs) on another architecture (RMSNorm, rotary
embeddings, SiLU-gated MLP). The first analysis read the default compile at 1.92x (0.75 of the
band): a fused run was priced at its longest kernel, the fp32 mask add and casts the eager
softmax writes, where the fused kernel reads the run's bf16 input and writes its bf16 output
once; and the fused attention at 1.67x (0.69)."""

from __future__ import annotations

from collections import Counter

import pytest

import traceinsight

from .conftest import RecordedLoop, _analyzed_once, raw_events, within_band

LOOP = RecordedLoop.named("llama_eager")


def _after(config: str):
    return _analyzed_once(LOOP.before.with_name(f"llama_eager.{config}.after.pt.trace.json.xz"))


def test_eager_attention_first_and_high() -> None:
    """attention_unfused comes first, HIGH: its fix (sdpa, 2.43-2.44x) is within 10% of the
    largest measured lever (compile, 2.56-2.57x)."""
    a = LOOP.analysis()
    f = a.findings[0]
    assert f.id == "attention_unfused" and f.severity == "high"
    assert LOOP.band("sdpa")["high"] >= 0.9 * LOOP.band("compile")["low"]


def test_eager_attention_shape_calls_and_dtype_from_the_raw_events() -> None:
    """8 layers x 3 steps = 24 softmax calls forward (aten::_softmax once per call, the
    aten::softmax above it twice under autocast) and 24 backward, on [4, 16, 2048, 2048], between
    bf16 bmms of [64, 2048, 64] x [64, 64, 2048] (24 forward Q @ K^T, 24 backward dO @ V^T)."""
    ops = [e for e in raw_events(LOOP.before) if e.get("cat") == "cpu_op"]
    names = Counter(e["name"] for e in ops)
    assert (names["aten::_softmax"], names["aten::softmax"]) == (24, 48)
    assert names["aten::_softmax_backward_data"] == 24
    qk = [
        e
        for e in ops
        if e["name"] == "aten::bmm"
        and e["args"].get("Input Dims") == [[64, 2048, 64], [64, 64, 2048]]
    ]
    assert len(qk) == 48 and {tuple(e["args"]["Input type"]) for e in qk} == {
        ("c10::BFloat16",) * 2
    }
    ev = LOOP.finding("attention_unfused").evidence
    assert (ev["seq_len"], ev["batch_heads"], ev["head_dim"]) == (2048, 64, 64)
    assert (ev["forward_calls"], ev["backward_calls"], ev["dtype"]) == (24, 24, "bf16")


def test_fused_attention_priced_at_the_bf16_peak() -> None:
    """4 B·H T² d per forward call, 2.5x that backward: 24 x 4 x 64 x 2048² x 64 x 3.5 =
    5.7724 TFLOP over the window, at half the H100 SXM's 989.5 bf16 TFLOP/s: 11.67 ms (the
    SDPA after's cuDNN attention kernels: 9.67 ms in its 3 steps)."""
    flops = 24 * 4 * 64 * 2048**2 * 64 * 3.5
    ev = LOOP.finding("attention_unfused").evidence
    assert ev["fused_estimate_ns"] == pytest.approx(flops / (989.5e12 * 0.5) * 1e9, rel=1e-3)


def test_eager_attention_within_the_sdpa_band() -> None:
    """The fused kernels at the measured cost (67.0 ms of eager attention kernels a step at
    3.9 ms; the SDPA after's took 3.2), the eager ops' launches and dispatch gone, and the
    mask's device constant with them: transformers' eager masking makes torch.tensor(0.0,
    device=...) each forward, a pageable copy that syncs once a step, which SDPA's causal path
    never builds. 2.03x against 2.43-2.44x (0.83; 1.73x without the mask's sync, 1.67x at the
    session's start). The rest: the profiled GPU-bound step's host ops ran 1.2-1.4x slower than
    the same ops in the SDPA trace (forward no-work ops 4.0-5.0 us against 3.2-3.4 us), which
    the profiler's per-event cost does not take out."""
    f = LOOP.finding("attention_unfused")
    assert f.evidence["mask_syncs"] == 3
    assert "its mask's device constants sync the stream 3 times" in f.title
    b = LOOP.band("sdpa")
    assert within_band(f.what_if.speedup, b["low"], b["high"])
    assert f.what_if.speedup < b["low"]  # still below: the host's slowdown above


def test_elementwise_fusion_within_the_compile_band() -> None:
    """Runs of elementwise and reduction kernels fused, each read and written once, their ops'
    dispatch gone: 2.36x against the default compile's 2.56-2.57x (0.92). Graded low (the
    rule's cap)."""
    f = LOOP.finding("elementwise_heavy")
    assert f.severity == "low"
    b = LOOP.band("compile")
    assert within_band(f.what_if.speedup, b["low"], b["high"])


def test_the_applied_set_within_the_all_band() -> None:
    """--what-if attention_unfused,elementwise_heavy,unfused_optimizer: 3.35x against all's
    4.25-4.26x (0.79; the attention's shortfall above carries into it)."""
    w = LOOP.what_if(["attention_unfused", "elementwise_heavy", "unfused_optimizer"])
    b = LOOP.band("all")
    assert within_band(w.speedup, b["low"], b["high"])


def test_fused_adamw_within_its_band_and_low() -> None:
    """Fused AdamW measured 1.03x: unfused_optimizer 1.03x, not above low."""
    f = LOOP.finding("unfused_optimizer")
    b = LOOP.band("fused_adamw")
    assert f.severity in ("info", "low") and within_band(f.what_if.speedup, b["low"], b["high"])


def test_the_fixed_causes_are_gone_in_the_profiled_afters() -> None:
    assert "attention_unfused" not in {f.id for f in _after("sdpa").findings}
    assert "elementwise_heavy" not in {f.id for f in _after("compile").findings}
    # all three applied: nothing above info
    assert all(f.severity == "info" for f in _after("all").findings)


def test_unprofiled_estimates_within_ten_percent_of_their_process() -> None:
    """The same process's un-profiled window mean before each capture: 112.90 (baseline),
    46.45 (sdpa), 44.21 (compile), 26.70 ms (all); the estimates 114.96, 47.84, 44.27 and 26.53."""
    truth = LOOP.truth["profiled"]
    for config in ("baseline", "sdpa", "compile", "all"):
        a = LOOP.analysis() if config == "baseline" else _after(config)
        own = truth[config]["unprofiled_same_process_step_ms_window_mean"]
        assert a.results.replay.unprofiled_step_ns / 1e6 == pytest.approx(own, rel=0.10)


def test_compiled_eager_attention_is_found_and_priced() -> None:
    """The default compile leaves the attention eager: inductor fuses the scale, mask, casts and
    softmax into one Triton kernel (8 a step forward, ``triton_red_fused__softmax_...`` on
    [64, 2048, 2048]) that still reads and writes the scores between the two bmms. The compiled
    after reads attention_unfused, and the fixes left on it (SDPA, fused AdamW) 1.96x against
    all over compile, 4.25-4.26 / 2.56-2.57 = 1.65-1.67x (1.18)."""
    ev = raw_events(LOOP.before.with_name("llama_eager.compile.after.pt.trace.json.xz"))
    steps = [e for e in ev if e.get("cat") == "user_annotation" and "ProfilerStep#" in e["name"]]
    fwd = [
        e
        for e in ev
        if e.get("cat") == "cpu_op"
        and e["name"].startswith("triton_red_fused__softmax__")
        and e["args"].get("Input Dims", [[]])[0] == [64, 2048, 2048]
    ]
    assert len(steps) == 3 and len(fwd) == 8 * 3
    a = _after("compile")
    f = next(f for f in a.findings if f.id == "attention_unfused")
    assert f.evidence["compiled"] and "compiled, it still runs eager" in f.title
    assert (f.evidence["seq_len"], f.evidence["head_dim"], f.evidence["dtype"]) == (
        2048,
        64,
        "bf16",
    )
    left = traceinsight.analyze(
        LOOP.before.with_name("llama_eager.compile.after.pt.trace.json.xz"),
        what_if=["attention_unfused", "unfused_optimizer"],
    ).selected.what_if
    lo = LOOP.band("all")["low"] / LOOP.band("compile")["high"]
    hi = LOOP.band("all")["high"] / LOOP.band("compile")["low"]
    assert within_band(left.speedup, lo, hi)


def test_the_masks_device_constant_is_named_not_an_input_copy() -> None:
    """The step's one sync: transformers' eager masking makes ``torch.tensor(0.0,
    device=...)`` each forward, a pageable copy that syncs (raw: a cudaStreamSynchronize inside
    aten::to, then aten::lift_fresh on the same thread, once a step). Named as a tensor built
    from Python data, advised where the constant is made, not as an input's .to()."""
    ev = sorted((e for e in raw_events(LOOP.before) if e.get("ph") == "X"), key=lambda e: e["ts"])
    syncs = [e for e in ev if e["name"] == "cudaStreamSynchronize"]
    after = [
        next(o["name"] for o in ev if o["tid"] == s["tid"] and o["ts"] >= s["ts"] + s["dur"])
        for s in syncs
    ]
    assert len(syncs) == 3 and after == ["aten::lift_fresh"] * 3
    # the constant's first consumer with a shaped input: the mask's aten::where on [4, 1, T, T]
    mask_ops = [
        next(
            o
            for o in ev
            if o["tid"] == s["tid"]
            and o["ts"] >= s["ts"] + s["dur"]
            and any(d for d in o.get("args", {}).get("Input Dims", []) if d)
        )
        for s in syncs
    ]
    assert [(o["name"], o["args"]["Input Dims"][0]) for o in mask_ops] == [
        ("aten::where", [4, 1, 2048, 2048])
    ] * 3
    f = LOOP.finding("sync_input_copy")
    assert f.evidence["constructed_copy_sync_count"] == f.evidence["input_copy_sync_count"] == 3
    assert f.title.startswith("3 tensors built from Python data on the device wait for the GPU")
    # the same syncs the fused attention's what-if removes: not an extra saving
    assert f.title.endswith("attention_unfused's fix removes them too")
    assert f.evidence["saving_shared_with"] == "attention_unfused"
    assert "torch.tensor(x, device=...)" in f.recommendation
    assert 'attn_implementation="sdpa"' in f.recommendation
    assert "pin_memory" not in f.recommendation
