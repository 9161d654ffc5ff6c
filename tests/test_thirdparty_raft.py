"""Predictions against torchvision's optical-flow reference training RAFT-small on FlyingChairs
(fixtures/generate/thirdparty/loop_raft.py: 12 loader workers, batch 2, fp32, AdamW foreach,
the reference's per-step metrics), held out: recorded on an NVIDIA H100 80GB HBM3 (the H200s
were not lent) before any analysis of it (fixtures/h100/thirdparty/README.md). Every fix was
measured un-profiled in two processes (A, B): the band is their spread, per sample where the
batch changes. torch.compile's default mode has no band (its processes ran their baselines
slowed: the truth's ``not_recorded``); launch_bound's own advice, reduce-overhead
(``compile_ro``), was measured in session 42 on another H100 host (processes E, F). What holds is asserted; the misses are strict expected failures
that name their mechanism, so fixing one turns its test red until the expectation is updated."""

from __future__ import annotations

import importlib.util
import statistics
from functools import cache

import pytest

import traceinsight
from traceinsight.options import Options
from traceinsight.pipeline import graded, selected_fixes

from .conftest import FIXTURES, ROOT, recorded_truth, within_band
from .conftest import raw_events as raw_events_at

HERE = FIXTURES / "h100" / "thirdparty"
BEFORE = "raft.before.pt.trace.json.xz"
TOLERANCE = 0.25  # a prediction within 25% of the measured band
BF16_TOLERANCE = 0.40  # a device-speed change (tests/test_thirdparty.py MEASURED)
LEVER_WITHIN = 0.10  # issue 37: the first finding is the largest measured lever, within 10%


@cache
def analysis(name: str):
    return traceinsight.analyze(HERE / name)


def truth() -> dict:
    return recorded_truth(HERE / "raft.truth.json")


def raw_events(name: str) -> list[dict]:
    return raw_events_at(HERE / name)


def chosen(name: str, ids: list[str]):
    """``analyze(HERE / name, what_if=ids).selected`` from the one cached analysis (as
    tests/test_thirdparty.py does: the chosen set is a function of the analysis)."""
    graded(Options(what_if=tuple(ids)))
    a = analysis(name)
    return selected_fixes(a.results, a.findings, tuple(ids))


def band(fix: str) -> tuple[float, float]:
    b = truth()["speedup_band"][fix]
    return b["low"], b["high"]


def finding(fid: str, which: str = "before"):
    name = BEFORE if which == "before" else f"raft.{which}.after.pt.trace.json.xz"
    return next(f for f in analysis(name).findings if f.id == fid)


def within(predicted: float, lo: float, hi: float, tolerance: float = TOLERANCE) -> bool:
    return within_band(predicted, lo, hi, tolerance)


def _fix_names() -> dict[str, str]:
    """The recorded fix each finding's advice makes: benchmarks/thirdparty_predictions.py's
    FIX_NAMES["raft"] (the table and the tests read one mapping)."""
    spec = importlib.util.spec_from_file_location(
        "thirdparty_predictions", ROOT / "benchmarks" / "thirdparty_predictions.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.FIX_NAMES["raft"]


MEASURED = _fix_names()

HOLDS = [
    # 2.86 against 2.75-2.90 (E, F: reduce-overhead against their own baselines)
    ("launch_bound", "compile_ro"),
    ("small_batch", "batch_2x"),  # 1.99 against 2.11-2.14 per sample (the 2x it recommends)
    ("unfused_optimizer", "fused_adamw"),  # 1.03 against 1.01-1.20
    # 1.00 against 1.12-1.14: within, low (test_the_syncs_saving_is_the_hosts_speed)
    ("host_sync", "remove_syncs"),
    ("pageable_memcpy", "workers"),  # 1.00 against 0.97-1.00
    ("h2d_not_overlapped", "workers"),  # 1.00 against 0.97-1.00
    ("fp32_compute", "bf16"),  # 0.96 against 0.81-0.97 (within 40%)
]


@pytest.mark.parametrize(("fid", "fix"), HOLDS, ids=[f for f, _ in HOLDS])
def test_prediction_within_the_measured_band(fid: str, fix: str) -> None:
    lo, hi = band(fix)
    w = finding(fid).what_if
    tol = BF16_TOLERANCE if fix == "bf16" else TOLERANCE
    assert w is not None and within(w.speedup, lo, hi, tol), (w.speedup if w else None, lo, hi)


def test_every_finding_with_a_recorded_band_is_checked() -> None:
    """The findings whose fix has a band are those HOLDS checks."""
    bands = truth()["speedup_band"]
    ids = {f.id for f in analysis(BEFORE).findings if MEASURED.get(f.id) in bands}
    assert ids == {fid for fid, _ in HOLDS}


def test_no_finding_above_low_for_a_fix_measured_below_1_10() -> None:
    """bf16 measured 0.81-0.97x (slower: autocast's casts on a host-bound step) and the
    workers 0.97-1.00x (the 12 keep up): their findings, if any, are low or info."""
    assert band("bf16")[1] < 1.10 and band("workers")[1] < 1.10
    seen = 0
    for f in analysis(BEFORE).findings:
        fix = MEASURED.get(f.id)
        if fix in truth()["speedup_band"] and band(fix)[1] < 1.10:
            assert f.severity in ("low", "info"), (f.id, f.severity, band(fix))
            seen += 1
    assert seen == 3  # fp32_compute, pageable_memcpy, h2d_not_overlapped


def test_compile_has_no_band() -> None:
    """Call 3's processes C and D ran their baselines at 115.5 and 130.5 ms a step against
    77.1-87.6 ms in every other process (A, B, P's first reference, the killed C of call 2), on
    the machine where call 2's killed process had been compiling; compile's own steps
    (84.3-91.0 ms in Q, C, D) are 0.85-1.04x the clean baselines. So compile's band (1.27-1.52x
    against those slowed baselines) is kept out of speedup_band and asserted against nothing;
    launch_bound prices another fix anyway (CUDA graphs: test_the_compiled_after)."""
    t = truth()
    assert "compile" not in t["speedup_band"] and "compile" in t["not_recorded"]
    later = t["later_processes"]
    clean = later["clean_baseline_step_ms"].values()
    slowed = [later["processes"][p]["configs"]["baseline"]["step_ms_window_mean"] for p in "CD"]
    assert min(slowed) > 1.3 * max(clean), (slowed, clean)
    rng = later["compile_against_clean_baselines"]
    assert 0.8 < rng["low"] < 1.0 < rng["high"] < 1.1
    assert finding("launch_bound").evidence["transform"] == "cuda_graphs"
    assert MEASURED["launch_bound"] == "compile_ro"  # its advice, not the default mode


def test_the_first_finding_is_the_largest_measured_lever() -> None:
    """launch_bound (2.86x, CUDA graphs) ranks first and reduce-overhead measured 2.75-2.90x
    (E 100.76 -> 36.70 ms a step, F 104.74 -> 36.14), the largest band; the 2x batch measured
    2.11-2.14x per sample (4 pairs a step ran 0.93-0.95x the step of 2 in A and B:
    host-bound, as small_batch says) and small_batch (1.99x at 2) ranks second. The two bands
    are from two hosts (E and F's baselines ran 100.8-104.7 ms, A and B's 77.9-86.6), each
    against its own process's baseline."""
    bands = truth()["speedup_band"]
    best = max((k for k in bands if k not in ("all", "baseline")), key=lambda k: bands[k]["high"])
    assert best == "compile_ro"
    first = analysis(BEFORE).findings[0]
    assert first.id == "launch_bound" and MEASURED[first.id] == best
    assert first.what_if.speedup >= (1 - LEVER_WITHIN) * bands[best]["low"]
    f = finding("small_batch")
    assert f.what_if.multiplier == 2
    assert f.what_if.speedup >= (1 - LEVER_WITHIN) * bands["batch_2x"]["low"]
    assert [f.id for f in analysis(BEFORE).findings[:2]] == ["launch_bound", "small_batch"]


def test_the_cuda_graph_after() -> None:
    """R's profiled reduce-overhead: the model's forward and backward replay as CUDA graphs
    (cudaGraphLaunch in the trace), the launch idle 245 ms over the before's 3 profiled steps
    -> 11 ms over the after's, and launch_bound falls to low (1.10x left: the eager optimizer
    and the loop's own host work stay)."""
    name = "raft.compile_ro.after.pt.trace.json.xz"
    graph_launches = sum(1 for e in raw_events(name) if e.get("name") == "cudaGraphLaunch")
    assert graph_launches >= 3  # at least one a profiled step
    before, after = finding("launch_bound"), finding("launch_bound", "compile_ro")
    assert after.severity == "low" and after.what_if.speedup < 1.11
    assert after.evidence["idle_ns"] < 0.1 * before.evidence["idle_ns"]


def test_the_compiled_after() -> None:
    """Q's profiled compile (default mode): inductor's Triton kernels replace the eager
    elementwise ones (3,428 kernels a step -> 2,023; 3,764 launch calls -> 2,251) but the
    convolutions stay cuDNN calls made through ATen: aten::convolution and
    aten::convolution_backward took 143.1 ms over the before's 3 profiled steps and 143.3 over
    the compiled after's, about 48 ms a step (the steps 125-187 ms). The launch idle stays (245 ->
    240 ms over 3 steps) and launch_bound HIGH; measured, compile's step was 84.3-91.0 ms
    against clean baselines of 77.1-87.6 (0.85-1.04x)."""
    before, after = finding("launch_bound"), finding("launch_bound", "compile")
    assert after.severity == "high"
    assert after.evidence["kernels_per_step"] < 0.65 * before.evidence["kernels_per_step"]
    assert after.evidence["idle_ns"] > 0.95 * before.evidence["idle_ns"]
    assert analysis("raft.compile.after.pt.trace.json.xz").results.replay.compiled_launches_per_step

    def conv_ms(name: str) -> float:
        ops = ("aten::convolution", "aten::convolution_backward")
        return sum(e["dur"] for e in raw_events(name) if e.get("name") in ops) / 1e3

    eager, compiled = conv_ms(BEFORE), conv_ms("raft.compile.after.pt.trace.json.xz")
    assert compiled == pytest.approx(eager, rel=0.05), (eager, compiled)
    assert eager / 3 > 40  # ms a profiled step


def test_the_fixed_cause_is_smaller_in_the_remove_syncs_after() -> None:
    """remove_syncs took the metrics' syncs out (the .item() reads, the boolean index's
    nonzero): 27 syncs a step -> 19.3, all left aten::to's (the pinned batch's 4 blocking copies
    and 15 small pageable ones a step)."""
    before, after = finding("host_sync"), finding("host_sync", "remove_syncs")
    assert after.evidence["syncs_per_step"] < before.evidence["syncs_per_step"] - 7
    ops = {row["op"] for row in after.evidence["by_op"]}
    assert ops == {"aten::to"}
    assert after.severity in ("low", "info")


def test_the_syncs_saving_is_the_hosts_speed() -> None:
    """remove_syncs measured 1.12-1.14x (8.5-11 ms a step in A and B); host_sync prices 1.00x:
    the syncs blocked the host 0.45 ms a profiled step (the GPU 17% busy, drained at each),
    and the loss with the metrics took 3.4-3.5 ms a profiled step before, 2.2 after (48 ops
    and 11 kernels fewer). The profiled after is 20% shorter anyway (102 ms against 128)
    because every host op ran faster in it, CPU-only ones included (medians: aten::view 1.1 ->
    0.8 us, aten::conv2d 116.5 -> 84.7 us, cudaLaunchKernel 6.6 -> 5.2 us; 105-153 us for
    conv2d in the same process's other profiled afters, not kept): the host thread's speed
    changed with the mid-step syncs gone, which no event in either trace explains (the 12
    loader processes share its 16 cores) and no transform prices. In the profiled process the
    un-profiled remove_syncs steps (87.56 ms, after two captures: CUPTI attached) ran as fast
    as its baseline before any capture (87.55) where the other fixes ran 110-136. Within 25%
    of the band (0.88 of its middle), as HOLDS asserts."""
    w = finding("host_sync").what_if
    assert w.speedup < 1.01
    assert finding("host_sync").evidence["host_sync_blocked_ns"] / 3 < 0.5e6

    def median_us(name: str, op: str) -> float:
        evs = raw_events(name)
        steps = sorted(
            (e for e in evs if e.get("name", "").startswith("ProfilerStep#")),
            key=lambda e: e["ts"],
        )
        t0 = steps[1]["ts"]  # the first active step carries the profiler's start
        return statistics.median(e["dur"] for e in evs if e.get("name") == op and e["ts"] >= t0)

    after = "raft.remove_syncs.after.pt.trace.json.xz"
    for op in ("aten::view", "aten::conv2d", "cudaLaunchKernel"):
        assert median_us(after, op) < 0.85 * median_us(BEFORE, op), op
    r_before = analysis(BEFORE).results.replay
    r_after = analysis(after).results.replay
    assert r_after.trace_step_median_ns < 0.85 * r_before.trace_step_median_ns


# the recorded "all": workers (14, non_blocking: the pinned copies' fix, no loader finding),
# remove_syncs, bf16, the 2x batch, fused AdamW
APPLIED = ["small_batch@2", "host_sync", "fp32_compute", "unfused_optimizer", "pageable_memcpy"]


def test_what_if_of_the_applied_set_within_the_measured_all() -> None:
    """1.96x against 1.80-2.12x per sample (A 1.80, B 2.12): the 2x batch carries it."""
    lo, hi = band("all")
    sel = chosen(BEFORE, APPLIED)
    w = sel.what_if
    assert sel.not_raised == () and sel.priced_not_raised == ()
    assert w is not None and within(w.speedup, lo, hi), (w.speedup, lo, hi)
    assert w.multiplier == 2


def test_the_unprofiled_step_estimates() -> None:
    """The un-profiled step each kept trace starts from, against its own process's: the before
    95.34 ms against P's first reference 87.55 (1.09; A and B ran 77.94 and 86.58, inside
    the range 68.48-95.34); the compiled after 83.78 ms against Q's 84.28 (0.99)."""
    own = {
        c: v["unprofiled_same_process_step_ms_window_mean"] for c, v in truth()["profiled"].items()
    }
    r = analysis(BEFORE).results.replay
    est = r.unprofiled_step_ns / 1e6
    assert est == pytest.approx(own["baseline"], rel=0.10)
    # the fresh processes of the before's host (session 43's E2 and F2 ran on another)
    base = truth()["configs"]["baseline"]
    fresh = [base[lab]["step_ms_window_mean"] for lab in ("A", "B")]
    for ms in (own["baseline"], *fresh):
        assert r.unprofiled_step_low_ns / 1e6 <= ms <= est, ms
    c = analysis("raft.compile.after.pt.trace.json.xz").results.replay
    assert c.unprofiled_step_ns / 1e6 == pytest.approx(own["compile"], rel=0.10)


@pytest.mark.xfail(
    strict=True,
    reason="the compiled range (COMPILED_UNPROFILED_RATIO, 0.69-0.97x the estimate) holds that "
    "record_shapes costs compiled code more than its events show (measured on ViT, Lightning, "
    "LoRA and nanoGPT: 68-366 Triton launches a step); on RAFT's compiled step (542 launches, "
    "37% of its profiled step in the 152 cuDNN convolutions a step, forward and backward: "
    "recorded ATen ops the per-event rate prices) the estimate at the trace's own per-event cost lands "
    "on Q's un-profiled step (1.006x), above the range. Q's reference may itself run slow (Q "
    "ran right after call 2's killed compile; call 3's baselines ran 1.3-1.5x slow): the "
    "recording cannot tell the two apart",
)
def test_the_compiled_range_holds_the_measured_step() -> None:
    own = truth()["profiled"]["compile"]["unprofiled_same_process_step_ms_window_mean"]
    r = analysis("raft.compile.after.pt.trace.json.xz").results.replay
    lo, hi = r.compiled_unprofiled_ratio
    assert lo <= own / (r.unprofiled_step_ns / 1e6) <= hi


def test_graph_launches_are_priced_at_their_unprofiled_cost() -> None:
    """R's profiled reduce-overhead step: its 6 cudaGraphLaunch calls (a forward and a backward
    graph a step) took 1.9-8.1 ms each under the profiler, where un-profiled a replay() call
    takes 3-29 us (benchmarks/graph_replay_cost.py, 50-3,000 nodes). The estimate takes them
    at most 30 us: 37.41 ms against R's own un-profiled 32.86 (1.14x; 39.83 ms, 1.21x, with
    the calls as recorded). What remains over is the eager optimizer's and the loop's host
    work at a per-event cost this capture paid more of than its no-work ops show."""
    name = "raft.compile_ro.after.pt.trace.json.xz"
    calls = [e["dur"] for e in raw_events(name) if e.get("name") == "cudaGraphLaunch"]
    assert len(calls) == 6 and min(calls) > 1_500  # us
    own = truth()["profiled"]["compile_ro"]["unprofiled_same_process_step_ms_window_mean"]
    est = analysis(name).results.replay.unprofiled_step_ns / 1e6
    assert 1.0 < est / own < 1.15, (est, own)


def test_small_batch_at_the_4x_batch_within_the_band() -> None:
    """Session 43 measured the 4x batch (small_batch's multiplier on session 42's profiled
    baseline) on one host with the 2x again: 2.70-2.83x per sample (2x: 1.61-1.91x there,
    2.11-2.14x on session 41's host). The kept before prices the 4x batch at 3.10x."""
    w = chosen(BEFORE, ["small_batch@4"]).what_if
    assert w is not None and w.multiplier == 4
    assert within(w.speedup, *band("batch_4x"))
    # the 4x batch's saving per sample over the 2x's: measured 1.32-1.76x (E2, F2 each
    # against its own 2x), predicted from the one before
    two = chosen(BEFORE, ["small_batch@2"]).what_if
    assert two is not None
    assert 1.2 < w.speedup / two.speedup < 1.8
