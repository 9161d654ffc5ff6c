"""Predictions against run_glue.py's MNLI fine-tuning through transformers.Trainer with its
defaults (fixtures/generate/thirdparty/loop_deberta.py: DeBERTa-v3-base from its config, 184 M
parameters, batch 32 padded to 128 tokens, fp32, fused AdamW, no loader workers), held out:
written by a helper in session 62 who did not read the model, recorded on an NVIDIA H100 80GB
HBM3 in session 63 before anyone analyzed it: processes A and P, then B again (the first B ran
with TF32 left on by its compile configuration; the truth's not_recorded says why). Bands over
A, B and C (P's un-profiled reference steps, 8 a configuration before its profiler started):
bf16 1.31-1.51x, TF32 1.23-1.30x (A, C), the 2x batch 1.11-1.17x per sample, dynamic padding
1.03-1.20x, 4 workers 0.89-1.03x, the Trainer's torch_compile (default mode; it turns TF32 on
too) 1.73-2.38x (A, C); all five but compile 2.34-2.95x per sample (A, B)."""

from __future__ import annotations

from .conftest import RecordedLoop, _analyzed_once, raw_events, within_band

LOOP = RecordedLoop.named("deberta")
TOLERANCE = 0.25
DEVICE_TOLERANCE = 0.40  # bf16: a change of device speed
analysis, band, finding = LOOP.analysis, LOOP.band, LOOP.finding


def test_fp32_matmuls_priced_within_the_bf16_band() -> None:
    """Every GEMM runs in fp32 on CUDA cores (sm80_xmma_gemm_f32f32_..._ffma and cutlass simt
    sgemm by name in the raw events: no tensor-core kernel): fp32_compute MEDIUM at 1.16x
    against bf16's 1.31-1.51x (TF32's 1.23-1.30x), within the device-speed tolerance."""
    names = {e["name"] for e in raw_events(LOOP.before) if e.get("cat") == "kernel"}
    gemms = {n for n in names if "gemm" in n.lower()}
    assert gemms and all("f32f32" in n or "sgemm" in n for n in gemms)
    f = finding("fp32_compute")
    assert f.severity == "medium" and f.evidence["fp32_gemm_time_ratio"] > 0.999
    b = band("bf16")
    assert within_band(f.what_if.speedup, b["low"], b["high"], DEVICE_TOLERANCE)


def test_the_workers_measured_nothing_and_their_finding_stays_low() -> None:
    """The single-process loader's pre-padded rows cost 3.77 ms a batch by the model; 4
    workers measured 0.89-1.03x: dataloader_stall at 1.03x, low, inside the tolerance."""
    f = finding("dataloader_stall")
    b = band("workers")
    assert b["high"] < 1.10 and f.severity == "low"
    assert within_band(f.what_if.speedup, b["low"], b["high"], TOLERANCE)


def test_the_2x_batch_priced_within_its_band() -> None:
    """The GPU 62.8% busy in the profiled window (memory_headroom asks under 60%: not raised);
    the 2x batch priced on request at 1.39x per sample against 1.11-1.17x measured (the upper
    end of the tolerance: the un-profiled step the model starts from is 1.31x the measured,
    so the host's share the larger batch spreads is overstated)."""
    assert "memory_headroom" not in {f.id for f in analysis().findings}
    b = band("batch_2x")
    assert within_band(LOOP.what_if(["memory_headroom@2"]).speedup, b["low"], b["high"], TOLERANCE)


def test_the_applied_set_is_priced_within_its_band() -> None:
    """bf16 (with TF32), the 2x batch and 4 workers as one replay: 2.29x against all five's
    2.34-2.95x per sample, 0.87 of the middle and under the low end: dynamic padding
    (1.03-1.20x alone) has no finding to select, the trace holding the padded [32, 128]
    inputs and not their padding."""
    w = LOOP.what_if(["fp32_compute", "memory_headroom@2", "dataloader_stall"])
    b = band("all")
    assert within_band(w.speedup, b["low"], b["high"], TOLERANCE)
    assert w.speedup < b["low"]


def test_launch_bound_bounded_by_the_measured_step_and_the_compiled_after_drops_it() -> None:
    """launch_bound MEDIUM at 1.15x for CUDA graphs: the model's step (122.4 ms) would give
    1.31x, but traceinsight.capture measured the process at 90.93 ms a step, 78.77 ms of it GPU
    work, and a change that keeps the GPU's work saves at most the rest (session 64). fp32_compute
    (1.16x) leads. The recorded fix is the Trainer's default-mode compile, which fuses kernels
    and turns TF32 on (1.73-2.38x): not its fix's price. The profiled compiled after reads it LOW."""
    rp = analysis().results.replay
    bound = rp.measured_step_ns / rp.gpu_busy_per_step_ns
    assert round(rp.measured_step_ns / 1e6, 2) == 90.93 and round(bound, 3) == 1.154
    f = finding("launch_bound")
    assert f.severity == "medium" and abs(f.what_if.speedup - bound) < 0.005
    assert analysis().findings[0].id == "fp32_compute"
    assert f.what_if.speedup < band("compile")["low"]
    after = LOOP.before.with_name("deberta.compile.after.pt.trace.json.xz")
    lb = next(x for x in _analyzed_once(after).findings if x.id == "launch_bound")
    assert lb.severity == "low"


def test_the_unprofiled_estimate_misses_high() -> None:
    """The un-profiled estimate 122.4 ms against 93.1 (A) and 91.5 ms (P's reference just
    before it profiled; the trace carries it, 90.9 ms over the capture's own steps): 1.31x.
    The model removes 2.06 us (the no-work op) for each of the 13,962 events a step recorded,
    24 ms of the two host threads' time, and the step shortens 9.7 ms; the profiler cost
    this process about 40 ms a step (2.9 us an event). At the stated low end (2.5x the
    no-work op) 95.0 ms, 1.02x of A: the range the report gives holds A within 2%."""
    rp = analysis().results.replay
    a = LOOP.truth["configs"]["baseline"]["A"]["step_ms_window_mean"]
    est, low = rp.unprofiled_step_ns / 1e6, rp.unprofiled_step_low_ns / 1e6
    assert est / a > 1.25 and abs(low / a - 1) < 0.03
    assert rp.measured_step_ns is not None and abs(rp.measured_step_ns / 1e6 / a - 1) < 0.05
