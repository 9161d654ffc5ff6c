"""A CIFAR-style torchvision ResNet-18 with its metrics from torchmetrics, fed by 4 workers
with pin_memory (fixtures/generate/thirdparty/loop_metrics.py), held out: recorded on an NVIDIA
H100 80GB HBM3 in session 44 before any analysis of it (the H200 was not lent for the call).
Each fix measured un-profiled in two processes (A, B): more workers 1.90-2.26x, the largest
lever by far; torchmetrics' validation syncs and the per-step reads 0.97-1.02x, bf16
1.01-1.05x, the 4x batch 1.07-1.11x per sample. The profiled steps (31.5 ms) kept the workers
busy enough that the step thread never waited for them; without the profiler the step thread
needs about 10 ms, and the workers bound it at 32.8-35.5 ms."""

from __future__ import annotations

import json
from functools import cache

import pytest

import traceinsight
from traceinsight.analyzers.replay import loader_paced_steps
from traceinsight.report.format import prediction_basis

from .conftest import FIXTURES, raw_events, recorded_truth

HERE = FIXTURES / "h100" / "thirdparty"
BEFORE = "metrics.before.pt.trace.json.xz"


@cache
def analysis(name: str):
    return traceinsight.analyze(HERE / name)


def truth() -> dict:
    return recorded_truth(HERE / "metrics.truth.json")


def band(fix: str) -> tuple[float, float]:
    b = truth()["speedup_band"][fix]
    return b["low"], b["high"]


def own_ms(config: str) -> float:
    return truth()["profiled"][config]["unprofiled_same_process_step_ms_window_mean"]


def loader_calls_ms(name: str) -> list[float]:
    """The step thread's DataLoader ``__next__`` ranges in the raw events, in ms."""
    ev = raw_events(HERE / name)
    return [
        e["dur"] / 1000
        for e in sorted(ev, key=lambda e: e.get("ts", 0))
        if e.get("cat") == "user_annotation" and "DataLoader" in e.get("name", "")
    ]


def test_the_workers_are_checked_first() -> None:
    """The workers kept up with the profiled step only: the trace cannot show their rate, so
    the check that every other prediction rests on comes first, and nothing is above low.
    More workers measured the largest lever; every fix measured below 1.10x is at most low."""
    a = analysis(BEFORE)
    first = a.findings[0]
    assert first.id == "dataloader_stall" and first.severity == "low"
    assert first.evidence["loader_unverified_speedup"] > 2.5  # 31.54 / 10.25 = 3.08
    assert all(f.severity in ("low", "info") for f in a.findings)
    levers = {fix: band(fix)[1] for fix in ("remove_syncs", "bf16", "batch_4x", "workers_8")}
    assert max(levers, key=levers.get) == "workers_8" and band("workers_8")[0] > 1.9
    assert all(hi < 1.12 for fix, hi in levers.items() if fix != "workers_8"), levers
    # the measured step lies in the range the trace leaves: the estimate (the workers keeping
    # up) to the interval they were shown to keep up with, within 10% above it
    r = a.results.replay
    est, shown = r.unprofiled_step_ns / 1e6, r.trace_step_median_ns / 1e6
    assert est < 0.4 * own_ms("baseline") and own_ms("baseline") < 1.1 * shown
    assert "kept up with the profiled step only" in prediction_basis(a.to_json())
    # the raw events: no __next__ of the window waited (0.27-0.35 ms each: receiving)
    assert all(ms < 0.5 for ms in loader_calls_ms(BEFORE)), loader_calls_ms(BEFORE)


@pytest.mark.parametrize("config", ["remove_syncs", "workers_8"])
def test_one_wait_among_the_steps_is_not_the_workers_interval(config: str) -> None:
    """The afters' windows hold one long wait for the workers in three steps (a burst of
    workers in phase, its period longer than the window): their mean is not the workers'
    interval (49.4 and 32.8 ms against 37.4 and 17.7 measured in the process), so the estimate
    keeps the replay's: 36.3 and 16.2 ms, within 10% of the process's own un-profiled steps."""
    name = f"metrics.{config}.after.pt.trace.json.xz"
    calls = loader_calls_ms(name)
    assert sum(ms > 10 for ms in calls) == 1 and sum(ms < 0.5 for ms in calls) == 2, calls
    a = analysis(name)
    r = a.results.replay
    src_steps = r.model.steps
    assert r.loader_interval_ns is None and src_steps.height == 3
    assert r.unprofiled_step_ns / 1e6 == pytest.approx(own_ms(config), rel=0.10)
    # the loader's finding first, its variance right after it
    ids = [f.id for f in a.findings]
    assert ids[0] == "dataloader_stall" and ids[1] == "step_time_variance", ids
    assert a.findings[0].severity == "high"


def test_paced_steps_count_the_waits() -> None:
    """loader_paced_steps against the raw ranges: a step waited where its loader calls took a
    millisecond more than the window's shortest."""
    import polars as pl

    ms = 1_000_000
    steps = pl.DataFrame({"host_start_ns": [0, 200 * ms, 400 * ms]})
    starts = [ms, 201 * ms, 401 * ms]

    def loader(durations_ns: list[int]) -> pl.DataFrame:
        ends = [s + d for s, d in zip(starts, durations_ns, strict=True)]
        return pl.DataFrame({"tid": [1, 1, 1], "start_ns": starts, "end_ns": ends})

    # the torchmetrics after: 0.21, 85.11, 0.25 ms
    assert loader_paced_steps(loader([210_000, 85_110_000, 250_000]), steps) == 1
    # timm with 3 workers: 0.26, 2.34, 79.49 ms
    assert loader_paced_steps(loader([260_000, 2_340_000, 79_490_000]), steps) == 2


FAST = "metrics.fast_data.after.pt.trace.json.xz"


@cache
def fast_runs() -> dict:
    """The same loop with its images drawn once as tensors (the workers only index and collate),
    each other fix on top of it, in four processes on two H100 hosts
    (fixtures/h100/thirdparty/metrics_fast_data.json)."""
    return json.loads((HERE / "metrics_fast_data.json").read_text())["processes"]


def fast_band(fix: str) -> tuple[float, float]:
    """Per-sample speedup of ``fast_data+fix`` over ``fast_data`` in each process that ran both."""
    out = []
    for runs in fast_runs().values():
        base, cfg = runs.get("fast_data"), runs.get(f"fast_data+{fix}")
        if base and cfg and "samples_per_step" in cfg:
            per = lambda r: r["step_ms_window_mean"] / r["samples_per_step"]  # noqa: E731
            out.append(per(base) / per(cfg))
    return min(out), max(out)


def pin_arrivals_raw(name: str) -> tuple[list[float], list[float]]:
    """From the raw events: the step thread's DataLoader calls' ends, and the pin-memory
    thread's batch arrivals (the first runtime call of each burst, bursts 1 ms apart, on the
    one thread that checks pointers and launches nothing), in us."""
    ev = [e for e in raw_events(HERE / name) if e.get("ph") == "X"]
    calls = [e for e in ev if "DataLoader" in e["name"] and e.get("cat") == "user_annotation"]
    step_tid = calls[0]["tid"]
    ends = sorted(e["ts"] + e["dur"] for e in calls)
    by_tid: dict = {}
    for e in ev:
        if e.get("cat") == "cuda_runtime" and e["tid"] != step_tid:
            by_tid.setdefault(e["tid"], []).append(e)
    pin = [
        sorted(es, key=lambda e: e["ts"])
        for es in by_tid.values()
        if any(e["name"] == "cudaPointerGetAttributes" for e in es)
        and not any("Launch" in e["name"] for e in es)
    ]
    assert len(pin) == 1
    arrivals, last_end = [], None
    for e in pin[0]:
        if last_end is None or e["ts"] - last_end >= 1000:
            arrivals.append(e["ts"])
        last_end = e["ts"] + e["dur"]
    return ends, arrivals


def test_a_pin_memory_thread_shows_the_workers_rate() -> None:
    """With pin_memory the pin-memory thread's runtime calls are recorded: each batch's arrival
    from the workers. Fed tensors, each of the 3 steps' requests was followed by one arrival
    4.3-4.7 ms later (the raw events), less than the 9.3 ms un-profiled step: the workers keep
    up, so the loader is not the check to make first (8 workers measured 0.89-1.02x) and the
    other findings are graded on their savings. Decoding images, the pin-memory thread's bursts
    came 2.2-29.1 ms after a request, more of them than steps: no rate shown."""
    ends, arrivals = pin_arrivals_raw(FAST)
    lags = [min(a for a in arrivals if a > end) - end for end in ends]
    assert len(ends) == 3 and all(4000 < lag < 5000 for lag in lags), lags
    a = analysis(FAST)
    assert a.results.steps.loader_arrival_lag_ns == pytest.approx(1000 * max(lags), abs=1000)
    assert a.results.steps.loader_arrival_lag_ns < a.results.replay.unprofiled_step_ns
    assert all("loader_unverified_speedup" not in f.evidence for f in a.findings)
    assert a.findings[0].id != "dataloader_stall"
    lo, hi = fast_band("workers_8")
    assert lo < hi < 1.05
    ends, arrivals = pin_arrivals_raw(BEFORE)
    assert (
        len(arrivals) > len(ends) and analysis(BEFORE).results.steps.loader_arrival_lag_ns is None
    )


def test_the_fast_loops_batch_within_the_band() -> None:
    """memory_headroom's 2x batch: 1.93x predicted against 2.08-2.48x per sample."""
    f = next(f for f in analysis(FAST).findings if f.id == "memory_headroom")
    lo, hi = fast_band("batch_2x")
    assert f.what_if.multiplier == 2 and 0.75 * lo <= f.what_if.speedup <= 1.25 * hi, (
        f.what_if.speedup,
        lo,
        hi,
    )


def test_the_fast_loops_graph_within_the_band() -> None:
    """launch_bound's reduce-overhead: 2.03x predicted against 1.85-1.90x measured (on another
    host). The graph captures the model's forward and backward (its ``nn.Module`` frames and
    the backward ops); torchmetrics' update and compute, the loss, the optimizer and the syncs
    stay eager. Taking every op of the step outside the loader, the optimizer and the waits as
    captured had priced 2.47x (3.76 ms after against 7.30 measured)."""
    r = analysis(FAST).results.replay
    assert r.model.host.get_column("in_model").any()
    f = next(f for f in analysis(FAST).findings if f.id == "launch_bound")
    lo, hi = fast_band("compile_ro")
    assert 0.75 * lo <= f.what_if.speedup <= 1.25 * hi, (f.what_if.speedup, lo, hi)


def _pin_trace(arrivals_us: list[float], next_dur_us: float = 300) -> object:
    """Three 10 ms steps, each starting with a multi-process DataLoader call on the step thread
    (tid 1), a kernel a step, and a pin-memory thread (tid 3) pinning a batch (two calls each)
    at ``arrivals_us``."""
    from traceinsight.analyzers.context import build_context

    from .builder import Events

    ev = Events()
    for k in range(3):
        t = 10_000 * k
        ev.step(k, t, 10_000)
        ev.annotation(
            "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__", t + 10, next_dur_us
        )
        ev.kernel("k", t + 2_000, 500, launch_us=t + 1_000)
    for a in arrivals_us:
        ev.runtime("cudaPointerGetAttributes", a, 5, tid=3)
        ev.runtime("cudaEventQuery", a + 50, 2, tid=3)
    return build_context(ev.trace())


def test_the_arrival_lag_by_hand() -> None:
    """Requests end at 0.31, 10.31 and 20.31 ms; one batch pinned 4.0, 4.5 and 3.0 ms after
    each: the longest lag, 4.5 ms. Two batches after one request, or requests of no length: no
    rate shown."""
    from traceinsight.analyzers.steps import loader_arrival_lag_ns, pin_thread_view

    def lag(arrivals: list[float], **kw: float) -> int | None:
        return loader_arrival_lag_ns(pin_thread_view(_pin_trace(arrivals, **kw)))

    assert lag([4_310, 14_810, 23_310]) == 4_500_000
    assert lag([4_310, 6_310, 14_810, 23_310]) is None
    assert lag([4_310, 14_810, 23_310], next_dur_us=0) is None


NOSTACK = "metrics.before_nostack.pt.trace.json.xz"


@pytest.mark.xfail(
    strict=True,
    reason="recorded without Python stacks (process P4 on another H100 host: 37.04 ms a step "
    "un-profiled, 22.8-26.8 ms profiled), the window drew on batches the workers had queued "
    "while the profiler started: no step waited and the step ran faster than the workers "
    "deliver. The estimate (17.5 ms) is under twice faster than the profiled step, so the "
    "loader is not flagged, and memory_headroom (3.95x at 4x) and launch_bound (2.15x) read HIGH "
    "where the 4x batch measured 1.07-1.11x. The pin-memory thread shows one batch arriving "
    "while the step took two, but so does RAFT's reduce-overhead after, whose process ran faster "
    "un-profiled (32.9 ms) than profiled (43.2): a window of 3 steps counts arrivals only to "
    "within a batch where workers deliver in bursts",
)
def test_workers_falling_behind_the_profiled_step() -> None:
    a = analysis(NOSTACK)
    f = next(f for f in a.findings if f.id == "memory_headroom")
    gains = {g.multiplier: g.throughput_gain for g in f.evidence["gain_by_multiplier"]}
    lo, hi = band("batch_4x")
    assert 0.75 * lo <= gains[4] <= 1.25 * hi, (gains, lo, hi)


def test_a_batch_gain_the_workers_bound_says_so() -> None:
    """The 8-worker after (session 57's invariant audit): memory_headroom's title said "would
    raise throughput 1.88x" where its what_if, the workers bounding the step, is 1.00x (info):
    the gain is the loader's keeping up, and the title says so."""
    a = analysis("metrics.workers_8.after.pt.trace.json.xz")
    (f,) = [f for f in a.findings if f.id == "memory_headroom"]
    assert f.severity == "info" and f.what_if.speedup == 1.0
    assert "loader_bound_ns" in f.evidence
    gain = next(g for g in f.evidence["gain_by_multiplier"] if g.multiplier == 4)
    assert (
        f"would raise throughput {gain.throughput_gain:.2f}x if the DataLoader kept up" in f.title
    )
