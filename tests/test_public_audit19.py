"""Audit 19: `diff` and its gate (`--fail-if-slower`). Hand-built traces with hand-computed
values, and fixture traces whose facts are read from their raw events."""

from __future__ import annotations

import json
import random
import re
import sqlite3
from pathlib import Path

import pytest

from tests.builder import Events
from traceinsight.api import analyze_trace
from traceinsight.cli import main
from traceinsight.commands.shared import gate_exit
from traceinsight.diff import compare
from traceinsight.report.terminal import render_diff_summary

from .conftest import FIXTURES, SHARED, analyzed, raw_json

H100 = FIXTURES / "h100" / "thirdparty"
H200 = FIXTURES / "h200" / "thirdparty"
NAMES = ("gemm_kernel_a", "elementwise_kernel_b", "reduce_kernel_c", "softmax_kernel_d")


def _no_period(durations_us: list[tuple[str, float]], gap_us: float, *, launched: bool = True):
    """Kernels one after another with ``gap_us`` between them, each launched 5 us before it
    starts; no steps, and (the names shuffled) no repeating sequence."""
    e, t = Events(), 0.0
    for name, dur in durations_us:
        e.kernel(name, t + 10, dur, launch_us=t + 5 if launched else None, launch_dur_us=2)
        t += 10 + dur + gap_us
    return analyze_trace(e.trace())


def _shuffled(n: int, seed: int = 7) -> list[str]:
    names = [NAMES[i % len(NAMES)] for i in range(n)]
    random.Random(seed).shuffle(names)
    return names


# --- D1: the gate without steps reads matched kernels' GPU time, not calls per second ---------


def test_split_kernels_are_not_the_same_work_and_the_gate_cannot_measure():
    # BEFORE: 120 kernels of 100 us; AFTER: each cut into two 65 us halves (the same name) with
    # the gaps stretched 1.3x: 30% more GPU time, and twice the calls a second of window
    names = _shuffled(120)
    before = _no_period([(n, 100.0) for n in names], 50)
    after = _no_period([(n, 65.0) for n in names for _ in (0, 1)], 0.5 * 50 * 1.3)
    doc = compare(before, after)
    assert doc["iterations"] is None and doc["step_time_change"] is None
    km = doc["kernel_match"]
    # per name, min(calls) summed: all 120 before's calls; over the larger side's 240
    assert (km["calls_before"], km["calls_after"], km["matched_calls"]) == (120, 240, 120)
    assert km["matched_ratio"] == pytest.approx(0.5)
    gate = doc["gate"]
    assert gate["basis"] is None and gate["slowdown_ratio"] is None
    assert "50% of the larger side's (120 vs 240 calls; 95% needed)" in gate["reason"]
    assert gate_exit(gate, 5) == 3  # read as 35% faster (exit 0) before


def test_the_same_kernels_slower_per_call_trip_the_gate():
    # the same 120 calls in windows of one length (the AFTER's gaps shorter): calls a second
    # unchanged, each call 30% longer, so the matched calls' GPU time is 1.3x
    names = _shuffled(120, seed=3)
    before = _no_period([(n, 100.0) for n in names], 60)
    after = _no_period([(n, 130.0) for n in names], 30)
    # windows within 0.2% (the last kernel 30 us longer): about as many calls a second
    assert after.metrics["window_ns"] / before.metrics["window_ns"] == pytest.approx(1, abs=2e-3)
    doc = compare(before, after)
    km = doc["kernel_match"]
    assert km["matched_ratio"] == 1.0
    assert km["matched_ns_before"] == 120 * 100_000 and km["matched_ns_after"] == 120 * 130_000
    assert doc["gate"]["basis"] == "kernel_time"
    assert doc["gate"]["slowdown_ratio"] == pytest.approx(0.3)
    assert gate_exit(doc["gate"], 5) == 3  # 0% "throughput" change passed before
    assert "GPU time of the matched calls 12.00 ms -> 15.60 ms (+30.0%)" in render_diff_summary(doc)


# --- D2: launch calls whose GPU record is missing -----------------------------------------------


def _launched(n: int, recorded: int, *, gpu_busy_to_end: bool = False):
    """``n`` kernel launches 20 us apart on one step; the first ``recorded`` have their kernel.
    ``gpu_busy_to_end``: the last recorded kernel runs past every later launch (a backlog)."""
    e = Events()
    e.step(0, 0, n * 20 + 100)
    for i in range(n):
        t = 10 + 20 * i
        corr = e.next_correlation()
        e.runtime("cudaLaunchKernel", t, 3, correlation=corr)
        if i < recorded:
            dur = (n - i) * 20 + 50 if gpu_busy_to_end and i == recorded - 1 else 8
            e._add("kernel", "k", t + 5, dur, device=0, stream=7, correlation=corr)
    return analyze_trace(e.trace())


def _partial(a) -> list[dict]:
    return [q for q in a.to_json()["data_quality"] if q["check"] == "device_activity_partial"]


def test_lost_gpu_records_are_a_data_quality_error():
    # 100 launches, kernels for the first 40: the 60 later ones start after the GPU's last
    # recorded kernel ended (at 40 * 20 - 10 + 5 + 8 = 793 us; the 41st launch is at 810 us)
    (check,) = _partial(_launched(100, 40))
    assert check["severity"] == "error" and check["count"] == 60
    assert "60 of 100 kernel launch or copy calls (60.0%) have no GPU record" in check["message"]
    assert "60 of them launched after the GPU's last recorded work had ended" in check["message"]
    # the same 60 unrecorded launches, but the 40th kernel runs past all of them: they were
    # queued behind it when the recording stopped (nsys-ai's h100_2gpu_1s: 51% of its launches)
    assert _partial(_launched(100, 40, gpu_busy_to_end=True)) == []
    # and a handful past the end: the last launches before the profiler stops
    assert _partial(_launched(100, 96)) == []


def test_a_hole_in_the_record_is_lost_even_before_the_last_recorded_launch():
    e = Events()
    e.step(0, 0, 3000)
    for i in range(100):
        corr = e.next_correlation()
        e.runtime("cudaLaunchKernel", 10 + 20 * i, 3, correlation=corr)
        if not 30 <= i < 50:  # 20 records gone in the middle
            e._add("kernel", "k", 15 + 20 * i, 8, device=0, stream=7, correlation=corr)
    (check,) = _partial(analyze_trace(e.trace()))
    assert check["count"] == 20 and "launched after" not in check["message"]


def test_launches_captured_into_a_graph_are_not_lost():
    """A CUDA/HIP graph capture records its launches on the host and runs none of them until
    the graph replays: TraceLens' xDiT Flux capture on MI300 had 994 of its 2,550 launches
    inside one hipStreamBeginCapture ... hipStreamEndCapture, read as 39% lost (session 64).
    Here 20 launches without records in the middle: inside a capture, no error; without it,
    the hole of the test above."""
    for capture in (True, False):
        e = Events()
        e.step(0, 0, 3000)
        if capture:
            e.runtime("hipStreamBeginCapture", 10 + 20 * 30 - 5, 2)
            e.runtime("hipStreamEndCapture", 10 + 20 * 50 - 5, 2)
        for i in range(100):
            corr = e.next_correlation()
            e.runtime("cudaLaunchKernel", 10 + 20 * i, 3, correlation=corr)
            if not 30 <= i < 50:
                e._add("kernel", "k", 15 + 20 * i, 8, device=0, stream=7, correlation=corr)
        checks = _partial(analyze_trace(e.trace()))
        assert (checks == []) if capture else (checks[0]["count"] == 20)


def _stop_check(launching: list[bool], ops: list[int] | None = None) -> dict | None:
    """1 ms steps of ``ops`` torch ops each (40 by default); the steps marked True launch a
    kernel after each op (its launch call and its kernel recorded). The device_records_stop
    check of the analysis, or None."""
    e = Events()
    for i, launches in enumerate(launching):
        t0 = i * 1000.0
        e.step(i + 1, t0, 999)
        for k in range((ops or [40] * len(launching))[i]):
            t = t0 + 5 + 20 * k
            e.op("aten::add", t, 10)
            if launches:
                e.kernel("k", t + 12, 5, launch_us=t + 2, launch_dur_us=3)
    checks = analyze_trace(e.trace()).results.health.checks
    return next((c for c in checks if c["check"] == "device_records_stop"), None)


def test_device_records_that_stop_while_the_host_goes_on_are_an_error():
    """Audit 19's file cut in file order (host events first) and closed: its steps 3 and 4 kept
    1,129 torch ops each and no launch call or GPU record, and its gate passed. Here two steps
    that launched after each of their 40 ops, then two that ran the same ops and recorded none."""
    c = _stop_check([True, True, False, False])
    assert c is not None and c["severity"] == "error" and c["count"] == 2
    assert (
        "the last 2 steps ran their torch ops (40 a step at most, against 40 usually)"
        in (c["message"])
    )
    # a last step of a few host ops (5 of the usual 40: bookkeeping, no GPU work): not the
    # usual step's work, nothing lost
    assert _stop_check([True, True, True, False], [40, 40, 40, 5]) is None
    # every step launching, and no step launching (a CPU-only recording): nothing
    assert _stop_check([True] * 4) is None
    assert _stop_check([False] * 4) is None


def _lose_second_half(src: Path, dst: Path) -> tuple[int, int]:
    """The audit's hostile input: every kernel, copy and memset in the second half of the span
    removed, host events kept. Returns the kernel launch and copy calls, and those of them left
    without a GPU record, counted on the raw events."""
    doc = json.loads(raw_json(src))
    ev = doc["traceEvents"]
    gpu = [e for e in ev if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    lo = min(e["ts"] for e in ev if "ts" in e and e.get("ph") == "X")
    hi = max(e["ts"] + e.get("dur", 0) for e in ev if "ts" in e and e.get("ph") == "X")
    mid = (lo + hi) / 2
    gone = {id(e) for e in gpu if e["ts"] >= mid}
    doc["traceEvents"] = [e for e in ev if id(e) not in gone]
    dst.write_text(json.dumps(doc))
    kept = {e["args"]["correlation"] for e in gpu if id(e) not in gone}
    launch = re.compile(r"^cu(da)?(LaunchKernel\w*|Memcpy\w*Async)$")
    calls = [
        e["args"]["correlation"]
        for e in ev
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and launch.match(e["name"])
    ]
    return len(calls), sum(c not in kept for c in calls)


def test_a_trace_that_lost_half_its_gpu_work_fails_the_gate(tmp_path, capsys):
    before = H100 / "metrics.remove_syncs.after.pt.trace.json.xz"
    after = tmp_path / "gpu_lost_half.json"
    calls, lost = _lose_second_half(before, after)
    assert lost / calls > 0.5
    rc = main(["diff", str(before), str(after), "--fail-if-slower", "5", "--no-html", "-q"])
    err = capsys.readouterr().err
    assert rc == 3, err  # passed as "within the noise" before
    assert (
        f"AFTER has 1 data-quality error, first: device_activity_partial: {lost} of "
        f"{calls:,} kernel launch or copy calls" in err
    )
    _capture_ending_behind_a_queue_is_healthy()


def _capture_ending_behind_a_queue_is_healthy() -> None:
    """nsys-ai's h100_2gpu_1s (the shared corpus, where present): over half its launches have
    no record, queued behind 25 GB of copies when its 1 s capture ended; no data-quality error."""
    path = SHARED / "nsys" / "nsys-ai__h100_2gpu_1s.sqlite"
    if not path.exists():
        return
    with sqlite3.connect(path) as db:
        names = dict(db.execute("SELECT id, value FROM StringIds"))
        launch = re.compile(r"^cuda(LaunchKernel|Memcpy\w*Async)")
        calls = {
            (pid, c)
            for pid, c, n in db.execute(
                "SELECT globalTid >> 24, correlationId, nameId FROM CUPTI_ACTIVITY_KIND_RUNTIME"
            )
            if launch.match(names[n])
        }
        done = {
            (pid, c)
            for table in ("KERNEL", "MEMCPY", "MEMSET")
            for pid, c in db.execute(
                f"SELECT globalPid >> 24, correlationId FROM CUPTI_ACTIVITY_KIND_{table}"
            )
        }
    # over half the launches have no record: queued behind 25 GB of copies at the capture's end
    assert len(calls - done) / len(calls) > 0.5
    job = analyzed(path)
    checks = [q["check"] for r in job.to_json()["ranks"] for q in r["data_quality"]]
    assert "device_activity_partial" not in checks


# --- D3: the interval is the within-capture step spread -----------------------------------------


def test_two_processes_of_one_loop_are_not_said_beyond_noise():
    before, after = (
        analyzed(H100 / f"peft_lora.process_{p}.pt.trace.json.xz") for p in ("P4", "P2")
    )
    doc = compare(before, after)
    assert doc["noise"]["scope"] == "within_capture"
    lo, _ = doc["noise"]["interval"]
    assert lo > 0
    text = render_diff_summary(doc)
    assert "beyond the within-capture step spread (run-to-run variance not included)" in text
    assert "noise" not in text


# --- D4: different programs -------------------------------------------------------------------


def _raw_ops(path: Path) -> set[str]:
    ev = json.loads(raw_json(path))["traceEvents"]
    return {
        re.sub(r"#\d+$", "", re.sub(r"^autograd::engine::evaluate_function: ", "", e["name"]))
        for e in ev
        if e.get("cat") == "cpu_op"
    }


def test_different_programs_warn_and_the_gate_refuses(tmp_path, capsys):
    b, a = H200 / "launch_bound.before.pt.trace.json.xz", H200 / "word_lm.before.pt.trace.json.xz"
    ob, oa = _raw_ops(b), _raw_ops(a)
    jaccard = len(ob & oa) / len(ob | oa)
    assert jaccard < 0.65
    doc = compare(analyzed(b), analyzed(a))
    assert doc["program"]["basis"] == "ops"
    assert doc["program"]["similarity"] == pytest.approx(jaccard)
    assert doc["program_differs"] is True
    assert any("look like different programs" in w for w in doc["warnings"])
    args = ["diff", str(b), str(a), "--no-html", "-q", "--fail-if-slower", "5"]
    assert main(args) == 2  # 4.89x "faster", exit 0, no warning before
    assert "--allow-different-programs" in capsys.readouterr().err
    assert main([*args, "--allow-different-programs"]) == 0


def test_a_compiled_after_is_the_same_program():
    b, a = H200 / "nanogpt.before.pt.trace.json.xz", H200 / "nanogpt.compile.after.pt.trace.json.xz"
    ob, oa = _raw_ops(b), _raw_ops(a)
    machinery = re.compile(r"^(Torch-Compiled Region|CompiledFunction|triton_|TorchDynamo|AOTDispatcher|Pregraph)")  # fmt: skip
    compiled = {o for o in oa if not machinery.match(o)}
    assert len(ob & oa) / len(ob | oa) < 0.65  # the plain Jaccard would call it another program
    doc = compare(analyzed(b), analyzed(a))
    assert doc["program"]["basis"] == "ops_of_replaced"
    assert doc["program"]["similarity"] == pytest.approx(len(compiled & ob) / len(compiled))
    assert doc["program_differs"] is False


# --- D5: window totals are said to be so ---------------------------------------------------------


def test_kernel_changes_without_steps_are_window_totals():
    before = _no_period([(n, 100.0) for n in _shuffled(40)], 20)
    after = _no_period([(n, 100.0) for n in _shuffled(40)] + [("new_kernel_e", 250.0)] * 3, 20)
    k = compare(before, after)["kernels_per_step"]
    assert k["per"] == "window"
    assert k["appeared_count"] == 1 and k["appeared_ns"] == 3 * 250_000
    text = render_diff_summary(compare(before, after))
    assert "1 appeared (750.0 us in the window)" in text and "per step" not in text


# --- D6, D7: like statistics, "unchanged", the batch on the gate's line -----------------------


def test_a_stall_step_is_not_blamed_on_the_profiler():
    b = analyzed(H100 / "metrics.before.pt.trace.json.xz")
    a = analyzed(H100 / "metrics.remove_syncs.after.pt.trace.json.xz")
    doc = compare(b, a)
    assert doc["unprofiled"]["statistics"] == ["median", "mean"]
    steps = [s.dur_ns for s in a.results.steps.per_step]
    assert max(steps) > 4 * sorted(steps)[len(steps) // 2]  # one 108 ms DataLoader wait
    assert not any("profiler's cost differs" in w for w in doc["warnings"])
    (w,) = [w for w in doc["warnings"] if "stall step" in w]
    assert f"longest {max(steps) / 1e6:.2f} ms" in w and "the gate reads the median" in w


def test_an_identical_pair_reads_unchanged():
    p = H100 / "metrics.before.pt.trace.json.xz"
    text = render_diff_summary(compare(analyzed(p), analyzed(p)))
    assert "(unchanged)" in text and "faster" not in text


def test_the_gate_line_names_the_batch_change(capsys):
    b, a = H100 / "e3nn.before.pt.trace.json.xz", H100 / "e3nn.all.after.pt.trace.json.xz"
    doc = compare(analyzed(b), analyzed(a))
    c = doc["input_copies"]
    ratio = c["h2d_bytes_per_step_after"] / c["h2d_bytes_per_step_before"]
    assert ratio > 3
    assert gate_exit(doc["gate"], 5) == 3
    err = capsys.readouterr().err
    assert f"host-to-device bytes a step changed {ratio:.2f}x" in err
    assert f"the time a sample changes by {100 * c['step_time_per_byte_change']:+.1f}%" in err
