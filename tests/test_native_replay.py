"""The replay loop in C (traceinsight/_native/kreplay.c) against the polars loop it replaces:
the same host and GPU times, rounds and convergence on every model, bit for bit. Run on the
step models of real traces (each with every what-if transform and engine change applied), on
generated models (chains interleaved, ties, cycles, rounds cut short) and on bad input.
The hand-computed replays of tests/test_replay.py run through it too."""

from __future__ import annotations

import os
from pathlib import Path

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from traceinsight.analyzers.context import build_context
from traceinsight.analyzers.replay import model_inputs
from traceinsight.causal import graph as R
from traceinsight.causal import transforms as whatif
from traceinsight.causal.build import build_model
from traceinsight.options import Options
from traceinsight.parsers import load_trace

from .conftest import H200, SHARED, require_native

require_native(R._kreplay, "traceinsight._kreplay (the native replay loop)")


def _polars(model: R.StepModel, max_rounds: int = R.MAX_ROUNDS) -> R.Replayed:
    native = R._kreplay
    R._kreplay = None
    try:
        return R.replay(model, max_rounds)
    finally:
        R._kreplay = native


def _native(
    model: R.StepModel,
    max_rounds: int = R.MAX_ROUNDS,
    *,
    warm: bool = False,
    converged_ns: int = R.CONVERGED_NS,
) -> R.Replayed:
    """The C loop's result; fails where it declined (it may only for nulls). Cold (``warm``
    off) its rounds start from the trace's times, as the polars loop's do."""
    seen: list[object] = []
    real, saved = R._replay_native, (R.WARM_START, R.CONVERGED_NS)

    def spy(*args: object) -> object:
        out = real(*args)
        seen.append(out)
        return out

    R._replay_native = spy
    R.WARM_START, R.CONVERGED_NS = warm, converged_ns
    try:
        r = R.replay(model, max_rounds)
    finally:
        R._replay_native = real
        R.WARM_START, R.CONVERGED_NS = saved
    assert seen and seen[0] is not None, "the C loop declined"
    return r


# rounds enough for the generated models' and the fixtures' chains of blocking calls to settle
# from the trace's times without any tolerance (the torchdiffeq loop's 457 syncs: 433 rounds)
EXACT_ROUNDS = 5_000


def exact(model: R.StepModel) -> R.Replayed:
    """The rounds from the trace's times until no time moves at all."""
    return _native(model, EXACT_ROUNDS, converged_ns=0)


def in_trace_order(model: R.StepModel) -> bool:
    """Every edge points back in trace time: each thread's calls and each stream's ops (by
    launch) in time order, each op launched no earlier than its launch call began. (A
    generated model may break that; a real one's clocks rarely do.)"""
    h, g = model.host, model.gpu
    thread_ordered = h.select((pl.col("start_ns").diff().over("tid") >= 0).all()).item()
    if not g.height or not h.height:
        return bool(thread_ordered)
    launch = g.get_column("launch")
    launch_start = h.get_column("start_ns").gather(launch.clip(0, h.height - 1))
    return bool(
        thread_ordered
        and g.select((pl.col("launch_key_ns").diff().over("chain") >= 0).all()).item()
        and ((launch < 0) | (g.get_column("launch_key_ns") >= launch_start)).all()
    )


def warm_is_the_fixed_point(model: R.StepModel) -> None:
    """The warm start's replay (what analyses run) is the rounds' own fixed point, reached in
    two rounds: the cold rounds run to no movement at all end on the same times. Where an edge
    points forward in time the equations may hold at more than one point (the rounds may also
    cycle): there the warm start's replay need only settle."""
    w, e = _native(model, warm=True), exact(model)
    if not in_trace_order(model):
        return
    if e.converged:
        assert w.converged and w.rounds <= 2, (w.rounds, e.rounds)
        for name in ("host_start_ns", "host_end_ns", "gpu_start_ns", "gpu_end_ns"):
            assert getattr(w, name).to_list() == getattr(e, name).to_list(), name


def same(a: R.Replayed, b: R.Replayed) -> None:
    assert (a.rounds, a.converged) == (b.rounds, b.converged)
    for name in ("host_start_ns", "host_end_ns", "gpu_start_ns", "gpu_end_ns"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype == pl.Int64, name
        assert x.to_list() == y.to_list(), name


def same_steps(model: R.StepModel, r: R.Replayed) -> None:
    """The steps' durations on replayed times ``r``: the C rule's equal the polars rule's."""
    native = R._kreplay
    try:
        got = R.step_times_ns(model, r)
        R._kreplay = None
        want = R.step_times_ns(model, r)
    finally:
        R._kreplay = native
    assert got.dtype == want.dtype == pl.Int64
    assert got.to_list() == want.to_list(), "step times"


def check(model: R.StepModel, max_rounds: int = R.MAX_ROUNDS) -> None:
    r = _native(model, max_rounds)
    same(r, _polars(model, max_rounds))
    same_steps(model, r)
    warm_is_the_fixed_point(model)


def models_of(path: Path) -> dict[str, R.StepModel]:
    """The trace's step model and every transform and engine change of it that changes it."""
    trace = load_trace(path)
    model = build_model(model_inputs(build_context(trace, Options().step_pattern, 1)))
    assert model is not None
    out = {"as recorded": model}
    for name, transform in whatif.TRANSFORMS.items():
        if (changed := transform(model)) is not None:
            out[name] = changed
    for engine in whatif.ENGINES:
        if (changed := whatif.engine_faster(engine)(model)) is not None:
            out[f"{engine} faster"] = changed
    return out


H200_TRACES = sorted(H200.glob("*.pt.trace.json.xz"))


@pytest.mark.parametrize("path", H200_TRACES, ids=[p.name.split(".")[0] for p in H200_TRACES])
def test_same_times_on_the_h200_fixtures(path: Path) -> None:
    for name, model in models_of(path).items():
        try:
            check(model)
        except AssertionError as exc:
            raise AssertionError(f"{name}: {exc}") from None


def test_the_fixtures_exercise_every_branch() -> None:
    """What the equality above covers: a device sync, a copy waiting for its own copy, a burst
    joined to the step thread's chain (rows reordered), several rounds. (Calls following the
    step thread's clock: the corpus trace below, the generated models, and by hand.)"""
    seen = {"sync": 0, "own": 0, "reordered": 0, "rounds>2": 0}
    for path in H200_TRACES:
        m = models_of(path)["as recorded"]
        wait = m.host.get_column("wait")
        seen["sync"] += int((wait == R.WAIT_DEVICE).any())
        seen["own"] += int((wait == R.WAIT_OWN_OP).any())
        chain = m.host.get_column("chain_tid")
        seen["reordered"] += int(not chain.equals(m.host.get_column("tid")))
        seen["rounds>2"] += int(_native(m).rounds > 2)  # cold: from the trace's times
    assert all(seen.values()), seen


CORPUS_TRACES = [
    "hta/df_index_resolver/df_index_resolver.json.gz",
    "hta/mtia_trace_single_rank/mtia_rank_0.json.gz",
    # 6 calls on a helper thread follow the step thread's clock
    "hta/ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz",
]


@pytest.mark.parametrize("rel", CORPUS_TRACES)
def test_same_times_on_corpus_traces(rel: str) -> None:
    path = SHARED / rel
    if not path.exists():
        pytest.skip(f"corpus trace {rel} not present (../shared/traces)")
    for name, model in models_of(path).items():
        try:
            check(model)
        except AssertionError as exc:
            raise AssertionError(f"{name}: {exc}") from None


# ---- generated models -------------------------------------------------------------------


@st.composite
def step_models(draw: st.DrawFn) -> R.StepModel:
    """Models the transforms could make: interleaved threads and streams, chains joined across
    threads, ties in ends and launch times, waits of every kind, work queued before the window."""
    times = st.integers(0, 400)
    n_threads = draw(st.integers(1, 3))
    n_gpu = draw(st.integers(0, 14))
    n_host = draw(st.integers(0, 16))
    host_rows = []
    for _ in range(n_host):
        start = draw(times)
        dur = draw(st.integers(0, 40))
        host_rows.append(
            {
                "tid": draw(st.integers(1, n_threads)),
                "start_ns": start,
                "end_ns": start + dur + draw(st.sampled_from([0, 0, 3])),  # ties, blocked calls
                "gap_ns": draw(st.integers(0, 30)),
                "dur_ns": dur,
                "wait": draw(st.integers(0, 3)),
                "own_op": draw(st.integers(-1, max(-1, n_gpu - 1))),
                "queue_op": draw(st.integers(-1, max(-1, n_gpu - 1))),
                "follows_main": draw(st.booleans()),
            }
        )
    host = pl.DataFrame(
        host_rows,
        schema={
            "tid": pl.Int64,
            "start_ns": pl.Int64,
            "end_ns": pl.Int64,
            "gap_ns": pl.Int64,
            "dur_ns": pl.Int64,
            "wait": pl.Int8,
            "own_op": pl.Int64,
            "queue_op": pl.Int64,
            "follows_main": pl.Boolean,
        },
    )
    if draw(st.booleans()):  # sorted as build_model sorts, or left as drawn
        host = host.sort("tid", "start_ns")
    if draw(st.booleans()):  # the first call of a thread anchored where its gap began
        host = host.with_columns((pl.col("start_ns") - pl.col("gap_ns")).alias("gap_from_ns"))
    if draw(st.booleans()) and n_host:  # bursts joined to another thread's chain
        joined = draw(st.lists(st.integers(1, n_threads), min_size=n_host, max_size=n_host))
        host = host.with_columns(pl.Series("chain_tid", joined, dtype=pl.Int64))
    gpu_rows = []
    for _ in range(n_gpu):
        start = draw(times)
        dur = draw(st.integers(0, 50))
        gpu_rows.append(
            {
                "chain": draw(st.integers(0, 2)),
                "start_ns": start,
                "end_ns": start + dur,
                "gap_ns": draw(st.integers(0, 20)),
                "dur_ns": dur,
                "launch": draw(st.integers(-1, n_host - 1)),
                "launched": draw(st.booleans()),
                "launch_offset_ns": draw(st.integers(0, 10)),
                "latency_ns": draw(st.integers(0, 10)),
                "launch_key_ns": draw(st.integers(0, 40)) * 10,  # ties
            }
        )
    gpu = pl.DataFrame(
        gpu_rows,
        schema={
            "chain": pl.Int64,
            "start_ns": pl.Int64,
            "end_ns": pl.Int64,
            "gap_ns": pl.Int64,
            "dur_ns": pl.Int64,
            "launch": pl.Int64,
            "launched": pl.Boolean,
            "launch_offset_ns": pl.Int64,
            "latency_ns": pl.Int64,
            "launch_key_ns": pl.Int64,
        },
    )
    if draw(st.booleans()):
        gpu = gpu.sort("chain", "start_ns")
    step_tid = draw(st.one_of(st.none(), st.integers(1, n_threads)))
    # steps in order (they are a loop's), of any length, some launching nothing
    bounds = sorted(draw(st.lists(st.integers(0, 420), min_size=0, max_size=8, unique=True)))
    pairs = list(zip(bounds[::2], bounds[1::2], strict=False))
    steps = pl.DataFrame(
        {
            "tid": [step_tid] * len(pairs),
            "host_start_ns": [a for a, _ in pairs],
            "host_end_ns": [b for _, b in pairs],
        },
        schema={"tid": pl.Int64, "host_start_ns": pl.Int64, "host_end_ns": pl.Int64},
    )
    return R.StepModel(host=host, gpu=gpu, steps=steps)


@settings(
    # 150 in the suite (its 4-minute budget); TRACEINSIGHT_FUZZ_EXAMPLES for a deeper run
    max_examples=int(os.environ.get("TRACEINSIGHT_FUZZ_EXAMPLES", "150")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(model=step_models(), max_rounds=st.sampled_from([1, 2, 3, R.MAX_ROUNDS]))
def test_same_times_on_generated_models(model: R.StepModel, max_rounds: int) -> None:
    check(model, max_rounds)


# ---- by hand and bad input -----------------------------------------------------------------


def _tiny() -> R.StepModel:
    """One thread: a launch (0-5) of a 10 ns kernel that starts 3 ns after the launch began,
    then a device sync (after 5 ns of host work, 2 ns to return) that waits for the kernel.
    The trace has the kernel at 8-18 and the sync at 10-20; the edges put the kernel at 3-13
    and the sync's end at 13 + 2."""
    host = pl.DataFrame(
        {
            "tid": [1, 1],
            "start_ns": [0, 10],
            "end_ns": [5, 20],
            "gap_ns": [0, 5],
            "dur_ns": [5, 2],
            "wait": pl.Series([R.WAIT_NONE, R.WAIT_DEVICE], dtype=pl.Int8),
            "own_op": [-1, -1],
            "follows_main": [False, False],
        }
    )
    gpu = pl.DataFrame(
        {
            "chain": [7],
            "start_ns": [8],
            "end_ns": [18],
            "gap_ns": [0],
            "dur_ns": [10],
            "launch": [0],
            "launched": [True],
            "launch_offset_ns": [3],
            "latency_ns": [0],
            "launch_key_ns": [0],
        }
    )
    steps = pl.DataFrame({"tid": [1], "host_start_ns": [0], "host_end_ns": [20]})
    return R.StepModel(host=host, gpu=gpu, steps=steps)


def test_a_sync_waits_for_its_kernel_by_hand() -> None:
    r = _native(_tiny())
    assert r.host_start_ns.to_list() == [0, 10]
    assert r.host_end_ns.to_list() == [5, 15]
    assert (r.gpu_start_ns.to_list(), r.gpu_end_ns.to_list()) == ([3], [13])
    assert (r.rounds, r.converged) == (2, True)  # round 1 waits for the trace's end (18 + 2)
    # the step (0-20 in the trace) ends with the sync: 15 ns; its kernel ends before that
    assert R.step_times_ns(_tiny(), r).to_list() == [15]
    # the kernel twice as long: 3-23, so the sync returns at 25
    slow = _tiny()
    slow = slow.with_gpu(slow.gpu.with_columns(pl.col("dur_ns") * 2))
    assert _native(slow).host_end_ns.to_list() == [5, 25]
    same(_native(slow), _polars(slow))


def _syncing_loop(n: int, us: int = 1_000) -> R.StepModel:
    """``_tiny``'s launch and sync ``n`` times, in microseconds (a round that moves no time
    by over CONVERGED_NS ends the rounds): launch i at 100 i (5 us), its kernel at 100 i + 8
    (10 us), the sync at 100 i + 10 (its return 2 us)."""
    t = [100 * i for i in range(n)]
    host = pl.DataFrame(
        {
            "tid": [1] * (2 * n),
            "start_ns": [(x + d) * us for x in t for d in (0, 10)],
            "end_ns": [(x + d) * us for x in t for d in (5, 20)],
            "gap_ns": [g * us for i in range(n) for g in (0 if i == 0 else 80, 5)],
            "dur_ns": [d * us for _ in t for d in (5, 2)],
            "wait": pl.Series([w for _ in t for w in (R.WAIT_NONE, R.WAIT_DEVICE)], dtype=pl.Int8),
            "own_op": [-1] * (2 * n),
            "follows_main": [False] * (2 * n),
        }
    )
    gpu = pl.DataFrame(
        {
            "chain": [7] * n,
            "start_ns": [(x + 8) * us for x in t],
            "end_ns": [(x + 18) * us for x in t],
            "gap_ns": [0] * n,
            "dur_ns": [10 * us] * n,
            "launch": [2 * i for i in range(n)],
            "launched": [True] * n,
            "launch_offset_ns": [3 * us] * n,
            "latency_ns": [0] * n,
            "launch_key_ns": [x * us for x in t],
        }
    )
    steps = pl.DataFrame({"tid": [1], "host_start_ns": [0], "host_end_ns": [(t[-1] + 20) * us]})
    return R.StepModel(host=host, gpu=gpu, steps=steps)


def test_a_chain_of_syncs_settles_in_two_rounds_from_the_warm_start() -> None:
    """50 syncs, each waiting for the kernel launched just before it, the kernels twice as
    long: launch i starts when sync i - 1 returns plus 80 us of host work, its kernel runs from
    3 us after the launch for 20 us, the sync returns 2 us after it. So launch i starts at
    105 i us and sync i returns at 105 i + 25 (by hand). From the trace's times each round
    settles one more sync: 51 rounds, and cut at 10 the later syncs are still where the trace
    had them. The warm start's sweep settles them all at once."""
    n = 50
    m = _syncing_loop(n)
    m = m.with_gpu(m.gpu.with_columns(pl.col("dur_ns") * 2))
    launch = [105_000 * i for i in range(n)]
    want_host_end = [x + d for x in launch for d in (5_000, 25_000)]
    cold, warm = _native(m, EXACT_ROUNDS), _native(m, warm=True)
    assert warm.host_end_ns.to_list() == cold.host_end_ns.to_list() == want_host_end
    assert warm.gpu_end_ns.to_list() == [x + 23_000 for x in launch]
    assert (warm.rounds, warm.converged) == (2, True)
    assert cold.rounds > n and cold.converged
    cut, cut_warm = _native(m, 10), _native(m, 10, warm=True)
    assert not cut.converged and cut.host_end_ns.to_list()[-1] < want_host_end[-1]
    assert cut_warm.converged and cut_warm.host_end_ns.to_list() == want_host_end
    same(cold, _polars(m, EXACT_ROUNDS))


def test_a_follower_moves_with_the_step_thread_by_hand() -> None:
    """The step thread (1) makes one 10 ns call; after idling, a helper thread's call (100-105)
    follows its clock. With that call 30 ns long the step thread is 20 ns later when the helper
    wakes: its call ends at 100 + 20 + 5 and starts 5 before."""
    host = pl.DataFrame(
        {
            "tid": [1, 2],
            "start_ns": [0, 100],
            "end_ns": [10, 105],
            "gap_ns": [0, 90],
            "dur_ns": [10, 5],
            "wait": pl.Series([R.WAIT_NONE, R.WAIT_NONE], dtype=pl.Int8),
            "own_op": [-1, -1],
            "follows_main": [False, True],
        }
    )
    empty = _tiny().gpu.head(0)
    steps = pl.DataFrame({"tid": [1], "host_start_ns": [0], "host_end_ns": [105]})
    m = R.StepModel(host=host, gpu=empty, steps=steps)
    r = _native(m)
    assert (r.host_start_ns.to_list(), r.host_end_ns.to_list()) == ([0, 100], [10, 105])
    slower = m.with_host(host.with_columns(pl.Series("dur_ns", [30, 5])))
    r = _native(slower)
    assert (r.host_start_ns.to_list(), r.host_end_ns.to_list()) == ([0, 120], [30, 125])
    same(r, _polars(slower))


def test_a_null_declines_to_the_polars_loop() -> None:
    m = _tiny()
    m = m.with_host(m.host.with_columns(pl.Series("gap_ns", [0, None], dtype=pl.Int64)))
    assert R._replay_native(*_native_args(m)) is None
    R.replay(m)  # the polars loop decides, as without the extension


def _native_args(m: R.StepModel) -> tuple[object, ...]:
    """replay()'s arguments to the C loop, captured."""
    got: list[tuple[object, ...]] = []
    real = R._replay_native

    def capture(*args: object) -> None:
        got.append(args)

    R._replay_native = capture  # type: ignore[assignment]
    try:
        R.replay(m)
    finally:
        R._replay_native = real
    return got[0]


def test_columns_in_several_chunks_read_as_one() -> None:
    m = _tiny()
    args = _native_args(m)
    host, gpu = args[0], args[1]
    split = [pl.concat([s.head(1), s.tail(s.len() - 1)], rechunk=False) for s in host]
    assert split[0].n_chunks() == 2
    chunked = pl.DataFrame(split)
    whole = R._replay_native(host, *args[1:])
    parts = R._replay_native(chunked, gpu, *args[2:])
    assert whole is not None and parts is not None
    same(whole, parts)


def test_an_index_out_of_range_is_an_error_not_a_crash() -> None:
    m = _tiny()
    m = m.with_gpu(m.gpu.with_columns(pl.lit(5, pl.Int64).alias("launch")))  # no host row 5
    with pytest.raises(IndexError, match="out of range"):
        R.replay(m)
