"""Predictions against CleanRL's PPO (fixtures/generate/thirdparty/loop_ppo.py: CartPole in 4
numpy vector envs stepped between the GPU's policy passes, Categorical's argument checks, a
blocking `.cpu()` and three pageable uploads a rollout step), held out: recorded on an NVIDIA
H100 80GB HBM3, first in one 197 s call at session 54's end, before any analysis of it (partial:
the truth's ``not_recorded``), then completely in session 55. Session 55's sequential processes
drifted more than the fixes' effects (the truth's ``sequential_session55``), so the bands are
the interleaved processes' (``interleaved``: every configuration for 8 iterations in turn, four
rounds, in two processes). benchmarks/RESULTS.md (sessions 54 and 55) has the table."""

from __future__ import annotations

from functools import cache

import pytest

import traceinsight

from .conftest import FIXTURES, recorded_truth, within_band

HERE = FIXTURES / "h100" / "thirdparty"
TOLERANCE = 0.25  # a prediction within 25% of the measured band


@cache
def analysis():
    return traceinsight.analyze(HERE / "ppo.before.pt.trace.json.xz")


def truth() -> dict:
    return recorded_truth(HERE / "ppo.truth.json")


def test_the_batch_lever_holds_where_the_envs_step_one_by_one() -> None:
    """16 envs instead of 4 measured 3.88x per sample (A: 310.56 -> 320.02 ms an iteration of 4x
    the samples); small_batch, the first finding, predicts 3.97x at 4x (3.86x from the un-profiled
    step's low end). SyncVectorEnv steps each env in Python, host work the batch what-if holds
    per step: here the envs' share of the step is small beside the launches and syncs, so the
    prediction holds; its assumption says where it would not."""
    band = truth()["speedup_band"]["envs_16"]
    assert band["per_sample"] and band["per_process"] == {"A": 3.8818}
    first = analysis().findings[0]
    assert first.id == "small_batch" and first.severity == "high"
    assert first.evidence["multiplier"] == 4
    w = first.what_if
    assert w is not None and within_band(w.speedup, band["low"], band["high"], TOLERANCE)
    assert "environments stepped one by one" in first.evidence["assumes"]


def test_the_gpu_env_measured_slower_and_nothing_advises_it() -> None:
    """The CartPole batch stepped in torch on the GPU ran 0.88x (351.44 ms an iteration against
    310.56): four envs' physics as many tiny kernels a rollout step, the Categorical checks'
    syncs kept.
    No finding names moving the envs, and none above low prices a fix of the rollout's copies."""
    assert truth()["speedup_band"]["gpu_env"]["high"] < 1.0
    by_id = {f.id: f for f in analysis().findings}
    assert by_id["pageable_memcpy"].severity in ("info", "low")
    assert by_id["host_sync"].severity in ("info", "low")


def _raw_checks() -> tuple[int, int]:
    """Categorical's checks counted over the raw events, independently of the analyzer: the
    top-level ops of each thread in order; a check ends at an ``is_nonzero`` right after an
    ``_is_all_true`` and starts at the first comparison after the last op that is neither a
    comparison, a mask op, a reduction nor a view. Returns (checks, their host time in ns)."""
    import json
    import lzma

    with lzma.open(HERE / "ppo.before.pt.trace.json.xz") as f:
        doc = json.load(f)
    ops = sorted(
        (e for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "cpu_op"),
        key=lambda e: (e["tid"], e["ts"], -e["dur"]),
    )
    top, ends = [], {}
    for e in ops:
        if e["ts"] + e["dur"] <= ends.get(e["tid"], float("-inf")):
            continue  # inside another op of its thread
        ends[e["tid"]] = e["ts"] + e["dur"]
        top.append(e)
    compare = {"eq", "ne", "lt", "le", "gt", "ge", "remainder"}
    mask = compare | {"__and__", "__or__", "all", "any", "reshape", "view", "_is_all_true"}
    checks, total_us, start, end, prev, tid = 0, 0.0, None, None, "", None
    for e in [*top, {"name": "", "tid": None, "ts": 0, "dur": 0}]:
        name = e["name"].removeprefix("aten::")
        if e["tid"] != tid or name not in mask | {"is_nonzero"}:
            if end is not None:
                total_us += end - start
            start = end = None
            tid = e["tid"]
        if name in compare and start is None:
            start = e["ts"]
        if name == "is_nonzero" and prev == "_is_all_true":
            checks += 1
            end = e["ts"] + e["dur"]
        prev = name
    return checks, round(total_us * 1000)


def test_categoricals_checks_are_named_with_their_host_time() -> None:
    """Categorical checks its logits when built and each action passed to log_prob (torch's
    default validate_args): 36 checks a profiled step (2 for each of 16 rollout steps, 2 for
    each of 2 minibatches), each a comparison, a reduction and a read-back (a sync).
    distribution_checks counts them and their host time as the raw events do (within 1 us a
    check: the trace's microsecond timestamps)."""
    checks, ns = _raw_checks()
    assert checks == 108
    f = next(f for f in analysis().findings if f.id == "distribution_checks")
    assert f.evidence["checks"] == checks and f.evidence["check_syncs"] == checks
    assert abs(f.evidence["host_time_ns"] - ns) <= checks * 1_000
    assert "36 checks a step" in f.title
    sync = next(f for f in analysis().findings if f.id == "host_sync")
    assert sync.evidence["distribution_check_syncs"] == checks  # its syncs, priced there


def interleaved(fix: str) -> dict:
    return truth()["interleaved"]["speedup_band"][fix]


def test_the_checks_prediction_holds_and_their_cause_is_gone_after() -> None:
    """validate_args=False measured 1.17-1.23x (interleaved Q1, Q2; every round's pair
    1.03-1.36x); distribution_checks predicts 1.11x, within 25% of the band. Its absolute
    saving (4.93 ms of the 49.17 ms estimate) is near the measured one; the estimate it divides
    is the model's un-profiled step (31.69 ms measured: issue 37 item 2). The profiled after
    (session 55's process P) has no check left."""
    band = interleaved("no_validate")
    f = next(f for f in analysis().findings if f.id == "distribution_checks")
    assert f.severity == "medium" and f.what_if is not None
    assert within_band(f.what_if.speedup, band["low"], band["high"])
    after = traceinsight.analyze(HERE / "ppo.no_validate.after.pt.trace.json.xz")
    assert after.results.host_ops.distribution_checks == 0
    assert "distribution_checks" not in {f.id for f in after.findings}


def test_no_finding_above_low_for_the_fixes_that_measured_nothing() -> None:
    """fused Adam (0.98-0.99x), the clipfracs read once an iteration (0.99-1.02x) and the envs
    on the GPU (0.77-0.86x) measured below 1.10x: their findings (unfused_optimizer, host_sync,
    pageable_memcpy) stay at info or low."""
    for fix, rule in (
        ("fused_adam", "unfused_optimizer"),
        ("no_stats", "host_sync"),
        ("gpu_env", "pageable_memcpy"),
    ):
        assert interleaved(fix)["high"] < 1.10, fix
        f = next((f for f in analysis().findings if f.id == rule), None)
        assert f is None or f.severity in ("info", "low"), (rule, f.severity)


def test_the_applied_set_holds_against_all_fixes() -> None:
    """`--what-if` of the findings the applied fixes answer (small_batch for the 16 envs,
    distribution_checks, host_sync, unfused_optimizer) predicts 4.60x per sample; all fixes
    (with the GPU envs, 0.77-0.86x alone) measured 3.92x per sample in both processes: within
    25%."""
    band = interleaved("all")
    assert band["per_sample"]
    a = traceinsight.analyze(
        HERE / "ppo.before.pt.trace.json.xz",
        what_if=["small_batch", "distribution_checks", "host_sync", "unfused_optimizer"],
    )
    assert a.selected is not None and a.selected.what_if is not None
    assert within_band(a.selected.what_if.speedup, band["low"], band["high"])


def test_launch_bound_is_a_lever_and_says_what_it_captures() -> None:
    """The policy pass compiled with reduce-overhead (launch_bound's advice, `compile_ro`)
    measured 1.55-1.71x, default mode 1.16-1.24x (interleaved Q3, Q4): launch_bound's HIGH is a
    lever above 1.10x, second to the batch (3.80-3.87x). Without nn.Module frames its priced
    capture holds every torch op of the step, and its evidence says so."""
    assert interleaved("compile_ro")["low"] > 1.10
    by_id = {f.id: f for f in analysis().findings}
    assert [f.id for f in analysis().findings][:2] == ["small_batch", "launch_bound"]
    assert "every torch op of the step" in by_id["launch_bound"].evidence["captured"]


@pytest.mark.xfail(
    strict=True,
    reason="launch_bound prices every torch op of the step captured (2.63x; 2.26x from the "
    "low end) where compiling the policy pass with reduce-overhead measured 1.55-1.71x: GAE's "
    "loop of small ops, the rollout's storage writes and uploads, the loss outside the policy, "
    "clip_grad_norm_ and the optimizer stay eager (the profiled after still reads launch_bound "
    "1.75x on them: 1.55-1.71 x 1.75 = 2.7-3.0). The trace has no stacks to tell the policy's "
    "ops from the loop's (with stacks it does: the next tests, 1.95x against 2.01x)",
)
def test_launch_bound_within_the_compiled_band() -> None:
    band = interleaved("compile_ro")
    w = next(f for f in analysis().findings if f.id == "launch_bound").what_if
    assert w is not None and within_band(w.speedup, band["low"], band["high"])


STACK = FIXTURES / "h200" / "thirdparty" / "stack"


@cache
def stack_analysis():
    return traceinsight.analyze(STACK / "ppo.before.pt.trace.json.xz")


def test_with_stacks_launch_bound_captures_the_policy_function() -> None:
    """The same loop profiled with Python stacks on an H200 (session 56,
    fixtures/h200/thirdparty/stack): the actor's and critic's nn.Module frames are called from
    ``Agent.get_action_and_value``, which also builds the Categorical, samples, scores and takes
    the entropy. The priced capture is that function's every call in the window (it holds no
    backward, optimizer step or step boundary), checked against the raw events: each of its
    frames lies inside a captured range."""
    import bisect
    import json
    import lzma

    import polars as pl

    from traceinsight.analyzers.context import build_context
    from traceinsight.analyzers.replay import model_ranges
    from traceinsight.parsers import load_trace

    trace = load_trace(STACK / "ppo.before.pt.trace.json.xz")
    ctx = build_context(trace)
    ranges = model_ranges(ctx)
    with lzma.open(STACK / "ppo.before.pt.trace.json.xz") as fh:
        raw = json.load(fh)["traceEvents"]
    steps = [e for e in raw if e.get("name", "").startswith("ProfilerStep#")]
    calls = [
        e
        for e in raw
        if e.get("cat") == "python_function"
        and e["name"].endswith(": get_action_and_value")
        and any(s["ts"] <= e["ts"] and e["ts"] + e["dur"] <= s["ts"] + s["dur"] for s in steps)
    ]
    assert len(calls) >= 3 * 16  # 16 rollout steps an iteration (1/8 scale), 3 iterations
    # the parser's clock from the trace's: one step's start in both
    first = trace.events.filter(pl.col("name") == steps[0]["name"]).item(0, "start_ns")
    offset_us = first / 1000 - steps[0]["ts"]
    starts = sorted(ranges.get_column("start_ns") / 1000 - offset_us)
    for e in calls:  # each frame is a captured range's start, to a microsecond
        i = bisect.bisect_left(starts, e["ts"] - 1)
        assert i < len(starts) and abs(starts[i] - e["ts"]) < 1


def test_with_stacks_launch_bound_holds_against_compiling_that_function() -> None:
    """Compiling get_action_and_value with reduce-overhead measured 2.01x in one H200 process
    (interleaved with the baseline, full iterations; the truth's ``interleaved``). From the
    module frames alone launch_bound had read 1.05x (low): the Categorical's work, most of the
    function's host time, stayed eager in its replay. Now it reads HIGH, within 25% of the
    band, second to the batch; the evidence says the function is captured."""
    t = recorded_truth(STACK / "ppo.truth.json")
    band = t["interleaved"]["speedup_band"]["compile_ro"]
    findings = stack_analysis().findings
    by_id = {f.id: f for f in findings}
    lb = by_id["launch_bound"]
    assert lb.severity == "high" and [f.id for f in findings][:2] == ["small_batch", "launch_bound"]
    assert within_band(lb.what_if.speedup, band["low"], band["high"], TOLERANCE)
    assert "the user's function that calls them" in lb.evidence["captured"]
