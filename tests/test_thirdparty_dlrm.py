"""Predictions against a DLRM recommender in the style of Meta's reference implementation
(fixtures/generate/thirdparty/loop_dlrm.py: 26 sparse EmbeddingBag tables, the Criteo Kaggle
MLPs, SGD on sparse gradients, the reference's random data made in the training process, its
per-iteration accuracy read back), held out: written by a helper who did not read the model and
recorded on an NVIDIA H100 80GB HBM3 in session 58 before any analysis of it (one call:
processes A, P and B; then C and D on a slower host with 2 and 3 workers too:
fixtures/h100/thirdparty/README.md). Measured: 4 pinned workers 2.39-3.79x (A, B: 3.46-3.71x),
2 workers 1.68-1.82x, 3 workers 2.35-2.90x, the 4x batch 1.17x per sample, the accuracy every 100 steps 1.01-1.06x, dense
embeddings with fused SGD 1.02x, torch.compile 0.98-1.05x, all of them 4.09-4.85x per sample."""

from __future__ import annotations

import json
import lzma
from functools import cache

import traceinsight
from traceinsight.causal.whatif import receive_ns

from .conftest import FIXTURES, recorded_truth, within_band

HERE = FIXTURES / "h100" / "thirdparty"
BEFORE = HERE / "dlrm.before.pt.trace.json.xz"
TOLERANCE = 0.25  # a prediction within 25% of the measured band
COLLATED = ("aten::lift_fresh", "aten::stack", "aten::cat")


@cache
def analysis():
    return traceinsight.analyze(BEFORE)


def band(fix: str) -> dict:
    return recorded_truth(HERE / "dlrm.truth.json")["speedup_band"][fix]


def test_the_loader_comes_first_and_is_the_largest_lever() -> None:
    """dataloader_stall, HIGH and first; of the single fixes the workers measured most."""
    f = analysis().findings[0]
    assert (f.id, f.severity) == ("dataloader_stall", "high")
    singles = {
        k: v["high"]
        for k, v in recorded_truth(HERE / "dlrm.truth.json")["speedup_band"].items()
        if k not in ("baseline", "all")
    }
    assert max(singles, key=singles.get) == "workers"


def test_the_pin_memory_thread_bounds_the_advised_loader() -> None:
    """The mechanism of the first look's miss: the loading hidden, the step read 6.7 ms (7.2x);
    4 pinned workers measured 13.7-14.3 ms a step. The advised loader's one pin-memory thread
    receives every batch, 55 tensors here (from the raw events: the outermost collating ops
    in each DataLoader call), 15.35 ms a batch at the measured receiving cost: the loading
    hidden is no faster than that, 3.17x, within 25% of 3.46-3.71x."""
    doc = json.loads(lzma.decompress(BEFORE.read_bytes()))
    ev = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    calls = [e for e in ev if e.get("cat") == "user_annotation" and "DataLoader" in e["name"]]
    ops = [e for e in ev if e.get("cat") == "cpu_op" and e["name"] in COLLATED]

    def inside(x: dict, y: dict) -> bool:
        return x is not y and y["ts"] <= x["ts"] and x["ts"] + x["dur"] <= y["ts"] + y["dur"]

    per_call = {
        sum(1 for o in ops if inside(o, c) and not any(inside(o, p) for p in ops)) for c in calls
    }
    assert per_call == {55}
    f = analysis().findings[0]
    plan = f.evidence["loader_plan"]
    assert plan.batch_tensors == 55 and plan.receive_ns == receive_ns(55) == 15_350_000
    assert plan.compute_step_ns == plan.receive_ns  # the thread, not the step, is the bound
    b = band("workers")
    assert within_band(plan.upper_bound_speedup, b["low"], b["high"], TOLERANCE)
    # and the workers it names are the ones that keep up with that thread
    assert "num_workers=4 would hide" in f.title


def test_the_workers_each_send_what_the_thread_receives() -> None:
    """Processes C and D (a slower H100 host, session 58) ran 2 and 3 pinned workers beside 4:
    1.68-1.82x and 2.35-2.90x. A worker makes the batch (41.88 ms here) and puts its 55 tensors
    in shared memory, taken as what receiving them costs (15.35 ms): n workers deliver a
    batch every (41.88 + 15.35) / n ms, no faster than the thread receives them. The finding's
    headline, at its stated assumption (the loader twice as fast: 2 workers), 1.70x; at 3
    workers 2.55x; at 4 the thread's 3.17x (without the sending: 2.32 / 3.17 / 3.17x)."""
    f = analysis().findings[0]
    plan = f.evidence["loader_plan"]
    per_worker = plan.loading_per_batch_ns + plan.receive_ns

    def at(n: int) -> float:
        return plan.batch_interval_ns / max(plan.compute_step_ns, per_worker / n)

    assert abs(at(2) - f.what_if.speedup) < 0.01
    for n, fix in ((2, "workers_2"), (3, "workers_3"), (4, "workers")):
        b = band(fix)
        assert within_band(at(n), b["low"], b["high"], TOLERANCE), (fix, at(n), b)


def test_no_finding_above_low_for_a_fix_that_measured_below_1_10() -> None:
    """The accuracy read-back (1.01-1.06x), dense embeddings with fused SGD (1.02x), the
    default compile (0.98-1.05x): host_sync, unfused_optimizer and launch_bound stay low or
    below."""
    for fix, fid in (
        ("remove_syncs", "host_sync"),
        ("dense_fused", "unfused_optimizer"),
        ("compile", "launch_bound"),
    ):
        assert band(fix)["high"] < 1.10
        found = {f.id: f.severity for f in analysis().findings}
        assert found.get(fid, "info") in ("low", "info"), (fid, found.get(fid))


def test_all_fixes_are_bounded_by_the_pin_memory_thread() -> None:
    """All fixes together hide the loading: no faster than the pin-memory thread (3.17x, not
    23x), and at the loader's stated assumption 1.70x; the recorded all (with the 4x batch)
    measured 4.09-4.85x per sample."""
    w = analysis().what_if
    assert "dataloader_floor" in w.transforms
    assert w.step_time_after_ns == 15_350_000
    assert w.speedup_loader_assumed < w.speedup < band("all")["low"]


def test_the_fixed_cause_is_gone_in_the_workers_after() -> None:
    a = traceinsight.analyze(HERE / "dlrm.workers.after.pt.trace.json.xz")
    assert "dataloader_stall" not in {f.id for f in a.findings}


def test_workers_that_kept_up_under_the_profiler_only_grade_nothing_above_low() -> None:
    """The workers' after: its 3 recorded steps found every batch waiting (14.45 ms a step),
    the model's un-profiled step is 10.50 ms, and the capture timed the same process at 18.16
    ms a step without the profiler just before recording (the trace's own "traceinsight"
    record): 1.73x the model's, past the profiler's spread between processes, with 4 workers
    whose rate the trace does not show. The 4x batch read HIGH 3.93x and launch_bound HIGH
    1.88x; batches on top of the workers measured 1.2-1.3x (all 4.09-4.85x over workers
    3.46-3.71x). Every saving needs the workers faster than the process ran: low at most, and
    the reason said."""
    path = HERE / "dlrm.workers.after.pt.trace.json.xz"
    meta = json.loads(lzma.decompress(path.read_bytes()))["traceinsight"]
    a = traceinsight.analyze(path)
    rp = a.results.replay
    assert rp.measured_step_ns == meta["unprofiled_step_ns"] == 18_163_661
    assert rp.measured_step_ns >= 1.5 * rp.unprofiled_step_ns
    assert all(f.severity in ("low", "info") for f in a.findings)
    f = next(f for f in a.findings if f.id == "small_batch")
    assert f.what_if.speedup > 3  # the replay's prediction stands, its grade does not
    assert f.evidence["loader_measured_step_ns"] == 18_163_661
    assert (
        "the process ran 18.16 ms a step without the profiler"
        in (f.evidence["severity_cap_reason"])
    )
    # the before (no workers: the step thread loads) keeps its grades
    assert analysis().findings[0].severity == "high"


def test_a_periodic_loader_wait_is_not_a_recompile() -> None:
    """make_truth drops a compiled configuration's slow leading steps as (re)compiles; DLRM's
    all fixes wait 90-240 ms every 4th step for their 4 workers, through the whole window:
    the loop's pace, kept (the truth's all: 48.28 ms a step in A, the window's mean)."""
    import importlib.util

    path = FIXTURES / "generate" / "thirdparty" / "make_truth.py"
    spec = importlib.util.spec_from_file_location("make_truth", path)
    mt = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mt)
    a = recorded_truth(HERE / "dlrm.truth.json")["configs"]["all"]["A"]
    c = {
        "step_ms_cuda_events": list(a["step_ms_cuda_events"]),
        "fixes": ["compile"],
        "samples_per_step": 512,
    }
    mt.drop_recompile(c)
    assert "dropped_steps" not in c and "dropped_leading_steps" not in c
    assert not a.get("dropped_steps") and not a.get("dropped_leading_steps")
    assert abs(a["step_ms_window_mean"] - 48.28) < 0.01
    # a leading compile alone is still dropped
    one = {
        "step_ms_cuda_events": [900.0] + [10.0] * 39,
        "fixes": ["compile"],
        "samples_per_step": 1,
    }
    mt.drop_recompile(one)
    assert one["dropped_leading_steps"]["steps"] == 1


def test_the_applied_set_gives_its_range() -> None:
    """The recorded all (the accuracy every 100 steps, 4 pinned workers, the 4x batch, dense
    fused SGD, compile) as its findings' fixes: the replay hides the loading (workers enough
    for the 4x batch: 12.67x per sample), the loader's stated assumption (twice as fast:
    1.70x) is the other end; 4 workers measured 4.09-4.85x, inside that range. The JSON says
    both (details.what_if.selected.speedup_loader_assumed)."""
    chosen = ["host_sync", "dataloader_stall", "small_batch@4", "unfused_optimizer", "launch_bound"]
    sel = traceinsight.analyze(BEFORE, what_if=chosen).to_json()["details"]["what_if"]["selected"]
    b = band("all")
    assert sel["multiplier"] == 4 and sel["priced_not_raised"] == ["small_batch@4"]
    assert sel["speedup_loader_assumed"] < b["low"] <= b["high"] < sel["speedup"]
