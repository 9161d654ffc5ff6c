"""Without steps there is no step model: a finding whose fix shortens kernels only is graded by
what the window's GPU timeline keeps of the saving (analyzers/launch.py
gpu_timeline_saving_ratio; audit 68: fp32_compute MEDIUM on a launch-bound T4 window where
halving the fp32 math ends the window 0.0% sooner). Times hand-computed below, in us."""

from __future__ import annotations

import pytest

from traceinsight.analyzers.context import build_context
from traceinsight.analyzers.launch import gpu_timeline_saving_ratio
from traceinsight.parsers import load_trace
from traceinsight.pipeline import analyze_trace

from .builder import Events
from .conftest import analyzed, raw_events, shared_or_skip

SGEMM = "volta_sgemm_128x64_nn"  # fp32 math on CUDA cores


def _ratio(ev: Events) -> float | None:
    return gpu_timeline_saving_ratio(build_context(ev.trace()))


def test_a_queue_that_never_drains_keeps_the_whole_saving():
    # launched at 0, 1, 2 (each call 1 us), run back to back 5-15, 15-25, 25-35: at half time
    # the first (not queued: nothing before it) keeps its start, 5-10, the others follow,
    # 10-15, 15-20: the window ends 15 us sooner for 15 us of GPU time saved
    ev = Events()
    for i in range(3):
        ev.kernel(SGEMM, 5 + 10 * i, 10, launch_us=i, launch_dur_us=1)
    assert _ratio(ev) == pytest.approx(1.0)


def test_kernels_paced_by_their_launches_keep_only_the_last_ones_saving():
    # each launched after its predecessor ended (8, 18, 28), so each starts where it did
    # (10, 20, 30): at half time only the last one ends sooner, by 1 us of the 3 us saved
    ev = Events()
    for i in range(3):
        ev.kernel(SGEMM, 10 + 10 * i, 2, launch_us=8 + 10 * i, launch_dur_us=1)
    assert _ratio(ev) == pytest.approx(1 / 3)


def test_without_launches_back_to_back_is_queued_and_a_gap_is_a_wait():
    # no launch calls recorded: 0-10 then 11-21 (1 us apart: queued), then 40-50 (a wait):
    # at half time 0-5, 5-10, 40-45: 5 us sooner for 15 us saved
    ev = Events()
    for start in (0, 11, 40):
        ev.kernel(SGEMM, start, 10)
    assert _ratio(ev) == pytest.approx(5 / 15)


def _fp32(ev: Events) -> dict:
    a = analyze_trace(ev.trace())
    return {f.id: f for f in a.findings}["fp32_compute"]


def test_fp32_math_in_a_launch_bound_window_without_steps_is_not_a_medium():
    # 20 fp32 GEMMs of 50 us, each launched 100 us after the last (the host paces the GPU):
    # half the fp32 math (500 us) is 25% of the 1,950 us window, yet at half time the window
    # ends only the last kernel's 25 us sooner: 25 / 500 = 0.05 of the saving, 1.3% of it
    ev = Events()
    for i in range(20):
        ev.kernel(SGEMM, 10 + 100 * i, 50, launch_us=5 + 100 * i, launch_dur_us=5)
    f = _fp32(ev)
    assert f.evidence["gpu_timeline_saving_ratio"] == pytest.approx(0.05)
    assert f.evidence["graded_on_gpu_timeline"] is True
    assert f.severity in ("info", "low")
    assert "launches pace the GPU" in f.evidence["severity_cap_reason"]


def test_fp32_math_the_gpu_is_bound_by_keeps_its_grade():
    # the same 20 GEMMs launched 5 us apart up front and run back to back: the queue never
    # drains, the timeline keeps all of the saving, and the grade is the attributed time's
    ev = Events()
    for i in range(20):
        ev.kernel(SGEMM, 200 + 50 * i, 50, launch_us=5 * i, launch_dur_us=4)
    f = _fp32(ev)
    assert f.evidence["gpu_timeline_saving_ratio"] == pytest.approx(1.0)
    assert "graded_on_gpu_timeline" not in f.evidence
    assert f.severity in ("medium", "high")


def test_a_host_that_waited_for_the_gpu_keeps_that_wait_as_saving():
    # the launch-paced window above with one 400 us cudaStreamSynchronize on the launching
    # thread: a shorter GPU would end that wait sooner by at most 400 us, so the graded share
    # is 25.6% x 0.05 + 400 / 1,950 = 21.8% (medium), below the attributed 25.6% (high)
    ev = Events()
    for i in range(20):
        ev.kernel(SGEMM, 10 + 100 * i, 50, launch_us=5 + 100 * i, launch_dur_us=5)
    ev.runtime("cudaStreamSynchronize", 1016, 400)
    f = _fp32(ev)
    assert f.evidence["gpu_timeline_saving_ratio"] == pytest.approx(0.05)
    assert f.severity == "medium"


def _replayed_ratio(path) -> float:
    """Independently of the analyzer, a loop over the raw events (one device): each GPU op at
    half its time, per stream in start order, starts at the later of its predecessor's new end
    and when it was ready (its launch call's end where that call began before the predecessor
    ended, else its recorded start); how much sooner the last op ends, over the time saved."""
    events = raw_events(path)
    launch = {
        e["args"]["correlation"]: (e["ts"], e["ts"] + e["dur"])
        for e in events
        if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})
    }
    ops = sorted(
        (e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")),
        key=lambda e: (e["args"].get("stream"), e["ts"]),
    )
    end, new_end, saved, last = 0.0, 0.0, 0.0, 0.0
    prev: dict | None = None
    for op in ops:
        start, dur = op["ts"], op["dur"]
        call = launch.get(op["args"].get("correlation"))
        same = prev is not None and prev["args"].get("stream") == op["args"].get("stream")
        prev_end = prev["ts"] + prev["dur"] if same else None
        queued = same and call is not None and call[0] < prev_end
        ready = min(call[1], start) if queued else start
        at = max(ready, last) if same else ready
        last = at + dur / 2
        end, new_end, saved = max(end, start + dur), max(new_end, last), saved + dur / 2
        prev = op
    return (end - new_end) / saved


def test_real_step_less_windows_host_paced_and_gpu_bound():
    """param's fp32 Linear benchmark (no steps, 36.8% busy): where its kernels queue, the GPU
    drains before the host's next launch, so half the GPU time ends the window 0.1% of that
    sooner, and its fp32 math (medium on attributed time before) is graded on the timeline;
    vLLM's decode replayed as one CUDA graph keeps the whole saving."""
    shared = shared_or_skip()
    linear = shared / "param" / "linear_kineto.json.gz"
    independent = _replayed_ratio(linear)
    assert independent < 0.01
    f = {f.id: f for f in analyzed(linear).findings}["fp32_compute"]
    assert f.evidence["gpu_timeline_saving_ratio"] == pytest.approx(independent, abs=1e-3)
    assert f.evidence["graded_on_gpu_timeline"] is True
    assert f.severity == "info"
    vllm = shared / "tracelens" / "inference_vllm_decode_full_graph_execution.json.gz"
    assert gpu_timeline_saving_ratio(build_context(load_trace(vllm))) == pytest.approx(1.0)
