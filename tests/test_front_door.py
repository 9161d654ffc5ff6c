"""The front door's numbers agree with each other: a window without GPU activity, the devices
listed against those --device selects from, the region line without GPU time, and one vocabulary
for the profiled step, the un-profiled step and savings per step in every reporter. Hand-made
traces with hand-computed values, and real traces whose facts are read from the raw events."""

from __future__ import annotations

import json

import pytest

import traceinsight
from traceinsight.api import analyze_trace
from traceinsight.cli import main
from traceinsight.errors import InputError
from traceinsight.model.schema import DeviceInfo
from traceinsight.options import Options
from traceinsight.report import markdown, terminal
from traceinsight.report.html import render_html

from .builder import US, Events
from .conftest import FIXTURES, H200, analyzed, raw_json

GEMM = "ampere_sgemm_128x64_nn"
NEXT = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"
STARVED = H200 / "dataloader_starved.pt.trace.json.xz"
NO_ACTIVITY = FIXTURES / "foreign" / "zoology_a100_inference.json.gz"  # metadata names 8 GPUs


def _stall(devices: tuple[int, ...] = (0,)) -> Events:
    """A kernel on each device at [0, 100) us and [950, 1000) us; between them the main thread
    waits 800 us in DataLoader.__next__ from 100 us."""
    e = Events()
    for d in devices:
        e.kernel(GEMM, 0, 100, launch_us=0, device=d)
        e.kernel(GEMM, 950, 50, launch_us=920, device=d)
    return e.annotation(NEXT, 100, 800)


# --- a window without GPU activity: idle all of it, the cause attributed --------------------------


@pytest.mark.parametrize("devices", [(0,), (0, 1)])
def test_window_without_gpu_activity_is_idle_on_every_gpu(devices):
    # [300, 600) us from the capture start lies inside the __next__ wait: each GPU idles all
    # 300 us of it, for the loader
    a = analyze_trace(_stall(devices).trace(), Options(window="300us:600us"))
    m = a.metrics
    assert m["window_ns"] == 300 * US
    assert m["gpu_busy_ratio"] == 0.0 and m["gpu_idle_ratio"] == 1.0
    assert m["idle_by_cause_ns"]["dataloader"] == 300 * US * len(devices)
    assert sum(m["idle_by_cause_ns"].values()) == 300 * US * len(devices)
    assert [(d["device"], d["busy_ns"], d["idle_ns"]) for d in a.results.idle.devices] == [
        (d, 0, 300 * US) for d in devices
    ]
    assert [d["id"] for d in a.source["devices"]] == list(devices)
    assert "no GPU activity in the window: its GPUs were idle all of it" in a.warnings


def _raw_starved() -> tuple[float, list[tuple[float, float]], list[tuple[float, float]]]:
    """The raw events of dataloader_starved: the capture start (µs), the GPU activity and the
    DataLoader.__next__ ranges (start, end in µs from it)."""
    ev = [e for e in json.loads(raw_json(STARVED))["traceEvents"] if e.get("ph") == "X"]
    cap = min(e["ts"] for e in ev)

    def spans(keep: object) -> list[tuple[float, float]]:
        return [(e["ts"] - cap, e["ts"] + e["dur"] - cap) for e in ev if keep(e)]

    gpu = spans(lambda e: e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"))
    return cap, gpu, spans(lambda e: e["name"] == NEXT)


def test_real_window_inside_a_loader_stall(capsys):
    """dataloader_starved, 60-70 ms into the capture: the raw events put no GPU activity in it
    (the GPU idles from 50.35 to 84.01 ms) and the main thread in DataLoader.__next__ all of it
    (50.63-83.73 ms). It said "GPU busy n/a (no GPU activity)" and 0.00 ms of loader idle."""
    _cap, gpu, loader = _raw_starved()
    lo_us, hi_us = 60_000, 70_000
    assert not [s for s in gpu if s[0] < hi_us and s[1] > lo_us]
    assert [s for s in loader if s[0] <= lo_us and s[1] >= hi_us]
    assert main(["analyze", str(STARVED), "--no-html", "--window", "60ms:70ms"]) == 0
    text = capsys.readouterr().out
    assert "GPU busy  0.0%; idle 100.0%: dataloader 10.00 ms" in text
    assert "dataloader_stall: GPU waits for the input pipeline: 10.00 ms idle" in text
    assert "n/a (no GPU activity)" not in text


# --- the devices listed are the devices --device selects from --------------------------------------


def test_devices_listed_are_those_device_selects():
    # the metadata names GPUs 0 and 1 (every GPU the process saw); only 0 ran anything
    t = _stall().trace()
    t.meta.devices = [DeviceInfo(0, "GPU0"), DeviceInfo(1, "GPU1")]
    for opts in (Options(), Options(window="300us:600us")):  # the window holds no activity
        a = analyze_trace(t, opts)
        assert [(d["id"], d["active"]) for d in a.source["devices"]] == [(0, True)]
        lines = terminal.render(a.to_json()).splitlines()
        assert next(x for x in lines if x.startswith("  devices")) == "  devices   0: GPU0"
    assert analyze_trace(t, Options(device=0)).source["devices"][0]["id"] == 0
    with pytest.raises(InputError, match=r"GPU activity on devices \[0\] \(its metadata also"):
        analyze_trace(t, Options(device=1))


def test_real_devices_agree_with_device_selection(capsys):
    """dataloader_starved's metadata names two H200s, its events one (device 0): the windowed
    summary listed "0, 1" while --device 1 said only [0] exists. A capture with no GPU activity
    (zoology: metadata names 0-7) lists none as active, as --device finds none."""
    assert main(["analyze", str(STARVED), "--no-html", "--window", "60ms:70ms"]) == 0
    assert "  devices   0: NVIDIA H200 (132 SMs)\n" in capsys.readouterr().out
    assert main(["analyze", str(STARVED), "--no-html", "--device", "1"]) == 2
    assert "GPU activity on devices [0] (its metadata also names [1]" in capsys.readouterr().err
    assert main(["analyze", str(NO_ACTIVITY), "--no-html"]) == 0
    listed = "none with GPU activity (the metadata names 0, 1, 2, 3, 4, 5, 6, 7)"
    assert f"  devices   {listed}\n" in capsys.readouterr().out
    assert main(["analyze", str(NO_ACTIVITY), "--no-html", "--device", "1"]) == 2
    assert "GPU activity on devices [] (its metadata" in capsys.readouterr().err


# --- no "most GPU time" line without GPU time ------------------------------------------------------


def test_no_region_line_without_gpu_time():
    # the window [300, 600) us holds only the __next__ range: no region has GPU time, the idle
    # inside it (300 us) is still named, under the regions label
    doc = analyze_trace(_stall().trace(), Options(window="300us:600us")).to_json()
    text = terminal.render(doc)
    assert "most GPU time" not in text
    assert f"  regions   the idle is in {NEXT}: 300.0 us in the window (mostly dataloader)" in text


# --- one vocabulary: profiled step, un-profiled step, savings per step -----------------------------


def test_the_basis_names_one_time_work_it_took_out():
    """audit 17: HTA's MI250 toy, a 9.29 ms profiled step, 2.35 ms un-profiled, of which 6.53 ms
    is its cold first hipLaunchKernel (details.replay.warmed_ns), no profiler cost: the
    sentence says so where that is at least 1% of the profiled step, not below."""
    from traceinsight.report.format import prediction_basis

    def doc(warmed_ns: int) -> dict:
        replay = {"unprofiled_step_ns": 2_347_455, "warmed_ns": warmed_ns, "warmed_calls": 1}
        return {"details": {"replay": replay}, "metrics": {"step_time_median_ns": 9_290_000}}

    assert (
        "(the profiled step to the end of its GPU work, median 9.29 ms, less the profiler's own cost and the "
        "one-time work the steps held, 6.53 ms in 1 first launch or load)."
    ) in prediction_basis(doc(6_534_918))
    # 92.9 us is 1% of the step: said; 92.8 us is not
    assert "the one-time work the steps held, 92.9 us in" in prediction_basis(doc(92_900))
    assert "one-time" not in prediction_basis(doc(92_800))


def test_reporters_say_what_a_prediction_applies_to(tiny_analysis):
    """fixtures/tiny by hand (tests/test_analyzers_tiny.py): the profiled step 1000 us, the
    un-profiled step 994 us; dataloader_stall's fix 994 -> 747.871 us, a saving of 246.129 us
    per step (24.8%), 247.6 us over the 1000 us window (the share times the window)."""
    doc = tiny_analysis.to_json()
    basis = (
        "Predicted savings and speedups are per step and apply to the un-profiled step, "
        "994.0 us (the profiled step to the end of its GPU work, median 1.00 ms, less the profiler's own cost)."
    )
    text = terminal.render(doc)
    assert "(1 step; profiled step (to the end of its GPU work): median 1.00 ms, CV" in text
    assert f"  {basis}" in text
    assert (
        "fix: saves 0.25 ms per step (un-profiled step 0.99 ms -> 0.75 ms, 1.33x predicted)" in text
    )

    md = markdown.render(doc)
    assert f"- {basis}" in md
    assert "profiled step (to the end of its GPU work): median 1.00 ms" in md
    assert "Predicted: saves 0.25 ms per step (un-profiled step 0.99 ms → 0.75 ms, 1.33x)." in md

    html = render_html(doc)
    assert basis.replace("'", "&#39;") in html
    assert (
        "Fix: saves 246.1 us per step (un-profiled step 994.0 us -&gt; 747.9 us, 1.33x predicted)"
        ", by the causal model" in html
    )
    assert "24.8% of the un-profiled step, 247.6 us in all over the window." in html
    assert "its fix saves 246.1 us per step (un-profiled step 994.0 us -&gt; 747.9 us" in html
    assert "profiled step to the end of its GPU work, median (1 step)" in html
    for mixed in ("of the step)", "without the profiler,", "over the window ("):
        assert mixed not in html


def test_a_step_without_gpu_activity_is_its_step_range():
    """Audit 68: a trace with two ProfilerSteps and launch calls but no device activity read
    "profiled step (to the end of its GPU work)": no step end was moved to GPU work there."""
    ev = Events()
    for n, start in ((1, 0), (2, 400)):
        ev.step(n, start, 300).runtime("cudaLaunchKernel", start + 10, 5)
    doc = analyze_trace(ev.trace(), Options()).to_json()
    words = "profiled step (its step range: no GPU activity): median 300.0 us"
    assert words in terminal.render(doc)
    assert words in markdown.render(doc)
    assert "profiled step (its step range: no GPU activity), median (2 steps)" in render_html(doc)
    assert "end of its GPU work" not in terminal.render(doc)


def test_real_finding_saving_is_per_step_and_the_window_total_labelled():
    """The issue's dataloader_starved: "saves 152.47 ms over the window (75.2% of the step)"
    mixed the window's total with the un-profiled step's share. The saving per step is the
    what-if's step before less after; the window total is labelled as one."""
    doc = analyzed(STARVED).to_json()
    f = next(x for x in doc["findings"] if x["id"] == "dataloader_stall")
    w = f["what_if"]
    per_step_ms = (w["step_time_ns"] - w["step_time_after_ns"]) / 1e6
    html = render_html(doc)
    assert f"Fix: saves {per_step_ms:.2f} ms per step (un-profiled step" in html
    assert (
        f"{100 * f['cost_ratio']:.1f}% of the un-profiled step, {f['cost_ns'] / 1e6:.2f} ms in all "
        "over the window." in html
    )
    assert f"fix: saves {per_step_ms:.2f} ms per step (un-profiled step" in terminal.render(doc)


def test_the_terminal_names_a_findings_other_priced_fix() -> None:
    """launch_bound prices the whole step in one CUDA graph beside its headline (the model-only
    capture): the summary gives it on its own line, with the id --what-if replays it by."""
    doc = analyzed(STARVED).to_json()
    f = next(x for x in doc["findings"] if x["id"] == "launch_bound")
    w = f["evidence"]["what_if_whole_step"]
    saved_ms = (w["step_time_ns"] - w["step_time_after_ns"]) / 1e6
    line = (
        "or, the whole step in one CUDA graph, with its optimizer step where it has one "
        "(launch_bound@whole_step): "
        f"saves {saved_ms:.2f} ms per step"
    )
    text = terminal.render(doc)
    assert line in text and f"{w['speedup']:.2f}x predicted" in text
    assert text.index("fix: saves", text.index("[MED ] launch_bound")) < text.index(line)


def test_both_summaries_list_the_same_idle_causes_adding_up(tiny_analysis):
    """audit 17: the Markdown listed four causes where the terminal showed five, so its list
    did not add up to the idle it stated; both now show five and sum the rest."""
    doc = tiny_analysis.to_json()
    doc["metrics"]["idle_by_cause_ns"] = {
        "launch_overhead": 5_000_000,
        "cpu_work": 4_000_000,
        "dataloader": 3_000_000,
        "host_sync": 2_000_000,
        "profiler": 611_000,
        "gpu_wait": 5_100,
        "pageable_copy": 2_000,
        "memcpy": 0,
    }
    words = (
        "launch_overhead 5.00 ms, cpu_work 4.00 ms, dataloader 3.00 ms, host_sync 2.00 ms, "
        "profiler 611.0 us, 2 more 7.1 us"
    )
    assert f": {words}\n" in terminal.render(doc)
    assert f" ({words})\n" in markdown.render(doc)


def test_a_window_inside_two_steps_is_said_so():
    """Session 54: a --window that holds no whole step was told "no ProfilerStep/step ranges
    ... call prof.step() each iteration to mark them": the recording marks its steps (here 4,
    of 50.3-50.8 ms: 80-100 ms into the capture lies inside the second), the selection left
    them out."""
    whole = traceinsight.analyze(STARVED)
    assert whole.metrics["steps"] == 4
    a = traceinsight.analyze(STARVED, window="80ms:100ms")
    assert a.metrics["steps"] == 0
    assert (
        "no whole step lies inside --window: the GPU's span in it is analyzed as one window"
        in a.warnings
    )
    assert not [w for w in a.warnings if "prof.step()" in w]
