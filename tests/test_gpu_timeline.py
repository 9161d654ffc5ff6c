"""Without steps there is no step model: a finding whose fix shortens kernels only is graded by
what the window's GPU timeline keeps of the saving (analyzers/launch.py
gpu_timeline_saving_ratio; audit 68: fp32_compute MEDIUM on a launch-bound T4 window where
halving the fp32 math ends the window 0.0% sooner). Times hand-computed below, in us."""

from __future__ import annotations

import pytest

from traceinsight.analyzers.context import build_context
from traceinsight.analyzers.launch import gpu_timeline_saving_ratio
from traceinsight.pipeline import analyze_trace

from .builder import Events

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
