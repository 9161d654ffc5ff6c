"""The causal step model: host calls per thread and GPU ops per stream, linked by their edges,
and a replay that recomputes every time from durations and edges.

Nodes: runtime/driver calls per host thread in order (launches, blocking calls) and GPU ops
(kernels, copies, memsets) per stream in order. Edges: host order (with the host work between
two calls kept as a gap), launch -> GPU op (correlation), stream order, and a blocking call that
ends when the GPU work it waits for ends (a device sync drains everything launched before it; a
blocking copy waits for its own copy).

Every chain is ``end_i = max(end_{i-1} + gap_i + dur_i, floor_i)``, with ``floor_i`` the earliest
end its other edges allow. Its closed form ``end_i = S_i + cummax_{j<=i}(floor_j - S_j)`` (``S``
the cumulative gap + dur) makes one chain one cumulative max; host and GPU chains are iterated
only through the blocking floors, a few rounds until nothing moves. Each round settles one more
blocking call of a dependent sequence, so the C loop starts its rounds from one sweep over the
calls and ops in trace order (WARM_START): where every edge points back in time that sweep is
the fixed point, and two rounds confirm it.

Delays the edges do not explain (a GPU op starting later than both its stream and its launch
allow: a cross-stream wait, a throttled clock) are kept as the op's ``gap_ns``, so the replay of
the unchanged model reproduces the trace wherever the edges are right; where they are wrong
(a sync modelled as a device drain that only waited for one stream) the replay disagrees and
``replay_error_ratio`` says by how much. Transforms change durations, gaps and waits, not edges.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property

import polars as pl

from traceinsight.native import ArrowTable, int64_streams
from traceinsight.native import kreplay as _kreplay  # None: the polars loop alone

NEG_NS = -(1 << 62)  # "no floor": an end no edge constrains
CONVERGED_NS = 2_000  # a round that moves no time by more than this ends the iteration (a
# 1 us drift between rounds remains on one H200 trace with 400 stream syncs: below resolution)
MAX_ROUNDS = 64  # each round settles at least one more blocking call in a dependent sequence
# So a model with N blocking calls settles within N + 1 rounds: a replay may take that many,
# up to this many node-rounds (host and GPU rows times rounds; about 0.1 s in the C loop), and
# never fewer than MAX_ROUNDS. A torchdiffeq loop with 457 blocking calls in its three recorded
# steps settled in 432 rounds: cut at 64, its un-profiled step stayed at 100 ms (65 settled).
REPLAY_WORK_MAX = 40_000_000
# The polars loop (an install without a C compiler) takes about 100x as long a node-round (3.8 s
# for that loop's 432 rounds against 0.03 s): its replays stop sooner, and say so (unconverged).
REPLAY_WORK_MAX_POLARS = 2_000_000
# The C loop's rounds start from one sweep over the calls and ops in trace order (kreplay.c,
# warm_start), which settles the blocking calls whose edges point back in time at once: that
# torchdiffeq loop's replays take 2 rounds, not 432. Off, they start from the trace's times as
# the polars loop's do (tests compare the two that way).
WARM_START = True

# What a host call waits for before it may return: nothing, the device's queue to drain (a
# sync), its own copy (a blocking copy), a slot in the full launch queue (queue_op ending).
WAIT_NONE, WAIT_DEVICE, WAIT_OWN_OP, WAIT_QUEUE = 0, 1, 2, 3


@dataclass(frozen=True)
class StepModel:
    """One rank's nodes. ``host``: outer runtime/driver calls sorted by (tid, start), row i is
    node i: tid, name, start_ns, end_ns, gap_ns (host work since the previous call on the
    thread), dur_ns (for a blocking call: its return latency), wait, own_op (GPU row of its
    copy, -1). ``gpu``: GPU ops sorted by (chain = device and stream, start), row i is op i:
    launch (host row, -1 for work queued before the window), launched (its launch call is in
    the trace), launch_offset_ns, latency_ns
    (launch start -> earliest op start), launch_key_ns (the launch's trace time), gap_ns, dur_ns
    and the columns the transforms read. ``steps``: host step ranges (tid, host_start_ns,
    host_end_ns)."""

    host: pl.DataFrame
    gpu: pl.DataFrame
    steps: pl.DataFrame

    def with_host(self, host: pl.DataFrame) -> StepModel:
        return replace(self, host=host)

    def with_gpu(self, gpu: pl.DataFrame) -> StepModel:
        return replace(self, gpu=gpu)

    # What the step times read the same way on each replay of one model (the device-aligned,
    # host and steady times of a replay each read them), made once per model: each query
    # costs its overhead again.
    @cached_property
    def steps_in_order(self) -> pl.DataFrame:
        return self.steps.sort("host_start_ns")

    @cached_property
    def step_thread_calls(self) -> tuple[pl.Series, pl.Series]:
        """The step thread's calls in end order (of equal ends, in host order) as row indices
        into ``host``, and their ends: what moves a timestamp on that thread's clock."""
        calls = (
            self.host.select("tid", "end_ns")
            .with_row_index("_row")
            .filter(
                (pl.col("tid") == step_thread(self.steps_in_order)) & pl.col("end_ns").is_not_null()
            )
            .sort("end_ns", maintain_order=True)
        )
        return calls.get_column("_row"), calls.get_column("end_ns")


@dataclass(frozen=True)
class Replayed:
    host_start_ns: pl.Series
    host_end_ns: pl.Series
    gpu_start_ns: pl.Series
    gpu_end_ns: pl.Series
    rounds: int
    converged: bool


SLICED_CHAINS_MAX = 32  # up to this many chains, one plain scan each beats a window per column


def chain_ends(chains: pl.DataFrame, by: str) -> pl.DataFrame:
    """``start``/``end`` of chains (rows in chain order, grouped by ``by``) with
    ``start_i = end_{i-1} + gap_i`` (the first at ``anchor``) and
    ``end_i = max(start_i + dur_i, floor_i)``: per chain one cumulative sum and one cumulative
    max. Columns read: gap, dur, floor, anchor."""
    keys = chains.get_column(by)
    heads = keys.ne_missing(keys.shift(1)).arg_true().to_list() if keys.len() else []
    if not heads or len(heads) > SLICED_CHAINS_MAX or len(heads) != keys.n_unique():
        return _chain_ends_over(chains, by)
    # a few contiguous chains (the usual threads and streams): each slice scanned on its own
    # is 3x faster than the windows, which hash the key for every column (12 replays a trace)
    bounds = [*heads, chains.height]
    return pl.concat(
        [_one_chain(chains.slice(lo, hi - lo)) for lo, hi in zip(bounds, bounds[1:], strict=False)]
    )


def _one_chain(c: pl.DataFrame) -> pl.DataFrame:
    gap, dur, floor = c.get_column("gap"), c.get_column("dur"), c.get_column("floor")
    # the first starts at anchor + gap (host work before a thread's first call in the window)
    first_floor, first_start = (
        c.head(1)
        .select(
            pl.max_horizontal("floor", pl.col("anchor") + pl.col("gap") + pl.col("dur")),
            pl.col("anchor") + pl.col("gap"),
        )
        .row(0)
    )
    floor = floor.scatter(0, first_floor)
    s = (gap + dur).cum_sum()
    end = s + (floor - s).cum_max()
    start = (end.shift(1) + gap).scatter(0, first_start)
    return pl.DataFrame([start.alias("start"), end.alias("end")])


def _chain_ends_over(chains: pl.DataFrame, by: str) -> pl.DataFrame:
    """:func:`chain_ends` for many or interleaved chains: windows over ``by``."""
    # the first starts at anchor + gap (host work before a thread's first call in the window)
    first = pl.int_range(pl.len()).over(by) == 0
    gap = pl.col("gap")
    floor = (
        pl.when(first)
        .then(pl.max_horizontal("floor", pl.col("anchor") + pl.col("gap") + pl.col("dur")))
        .otherwise(pl.col("floor"))
    )
    return (
        chains.lazy()
        .with_columns(gap.alias("gap"), floor.alias("floor"), first.alias("_first"))
        .with_columns((pl.col("gap") + pl.col("dur")).cum_sum().over(by).alias("_s"))
        .with_columns(
            (pl.col("_s") + (pl.col("floor") - pl.col("_s")).cum_max().over(by)).alias("end")
        )
        .with_columns(
            pl.when(pl.col("_first"))
            .then(pl.col("anchor") + pl.col("gap"))
            .otherwise(pl.col("end").shift(1).over(by) + pl.col("gap"))
            .alias("start")
        )
        .select("start", "end")
        .collect()
    )


NO_THREAD = -(2**62)  # a thread id no trace has


def step_thread(steps: pl.DataFrame) -> int:
    """The thread that runs the steps (the first step's), NO_THREAD where the trace lost it."""
    tids = steps.get_column("tid").drop_nulls()
    return int(tids[0]) if tids.len() else NO_THREAD


def _host_chains(host: pl.DataFrame, main_tid: int | None) -> pl.DataFrame:
    """The host chains: the step's own thread first; a call on another thread after an idle
    gap (``follows``: the backward engine's thread waiting for ``backward()``) starts no
    earlier than the step thread's replayed clock at its trace start, its idle gap dropped."""
    if main_tid is None or not host.get_column("follows").any():
        return chain_ends(host, "tid")
    is_main = pl.col("tid") == main_tid
    main = host.filter(is_main)
    main_t = chain_ends(main, "tid")
    shifts = main.select(
        "orig_end", (main_t.get_column("end") - pl.col("orig_end")).alias("shift")
    ).sort("orig_end", maintain_order=True)  # of equal ends the as-of join takes the last
    rest = host.filter(~is_main)
    lead = (
        rest.select("_row", "anchor")
        .sort("anchor")
        .join_asof(shifts, left_on="anchor", right_on="orig_end")
        .sort("_row")
        .get_column("shift")
        .fill_null(0)
    )
    follow = pl.col("follows")
    rest = rest.with_columns(
        pl.when(follow)
        .then(pl.max_horizontal("floor", pl.col("anchor") + lead + pl.col("dur")))
        .otherwise(pl.col("floor"))
        .alias("floor"),
        pl.when(follow).then(0).otherwise(pl.col("gap")).alias("gap"),
    )
    rest_t = chain_ends(rest, "tid")
    # the lead is a floor on the start (the call begins when the step thread got there), not
    # a wait inside the call as for a sync: a bound call starts dur before its end
    starts_late = (rest.get_column("follows") & (rest.get_column("wait") == WAIT_NONE)).alias("_l")
    rest_t = rest_t.with_columns(starts_late).select(
        pl.when(pl.col("_l"))
        .then(pl.max_horizontal("start", pl.col("end") - rest.get_column("dur")))
        .otherwise(pl.col("start"))
        .alias("start"),
        "end",
    )
    both = pl.concat(
        [
            main.select("_row").hstack(main_t),
            rest.select("_row").hstack(rest_t),
        ]
    )
    return both.sort("_row").select("start", "end")


def rounds_for(model: StepModel) -> int:
    """The rounds a replay of ``model`` may take (see :data:`REPLAY_WORK_MAX`)."""
    h, rows = model.host, model.host.height + model.gpu.height
    blocking = int((h.get_column("wait") != WAIT_NONE).sum()) if h.height else 0
    work = REPLAY_WORK_MAX if _kreplay is not None else REPLAY_WORK_MAX_POLARS
    return max(MAX_ROUNDS, min(blocking + 2, work // max(rows, 1)))


def replay(model: StepModel, max_rounds: int | None = None) -> Replayed:
    """Every start and end recomputed from durations and edges (see the module docstring);
    ``max_rounds``: :func:`rounds_for` the model unless given."""
    h, g = model.host, model.gpu
    if max_rounds is None:
        max_rounds = rounds_for(model)
    host = h.select(
        pl.col("chain_tid").alias("tid") if "chain_tid" in h.columns else "tid",
        pl.col("gap_ns").alias("gap"),
        pl.col("dur_ns").alias("dur"),
        # a thread's first call is anchored where its gap began: transforms may shorten it
        pl.when((pl.int_range(pl.len()).over("tid") == 0) & ~pl.col("follows_main"))
        .then(pl.col("gap_from_ns") if "gap_from_ns" in h.columns else pl.col("start_ns"))
        .otherwise(pl.col("start_ns"))
        .alias("anchor"),
        pl.col("wait"),
        pl.col("own_op").clip(0).alias("own"),
        (pl.col("queue_op") if "queue_op" in h.columns else pl.lit(-1)).clip(0).alias("queue"),
        pl.col("follows_main").alias("follows"),
        pl.col("end_ns").alias("orig_end"),
    )
    # Chains are rows in order per tid: where a burst of another thread joined the step
    # thread's chain (chain_tid), the rows are put in chain order for the passes and the
    # times put back in node order after them.
    chain_order: pl.Series | None = None
    node_order: pl.Series | None = None  # its inverse: chain rows back in node order
    if "chain_tid" in h.columns and not h.get_column("chain_tid").equals(h.get_column("tid")):
        chain_order = host.select(pl.arg_sort_by("tid", "anchor", maintain_order=True)).to_series()
        node_order = chain_order.arg_sort()
        host = host[chain_order]
        starts = h.get_column("start_ns").gather(chain_order)
    else:
        starts = h.get_column("start_ns")
    host = host.with_row_index("_row")
    main_tid = step_thread(model.steps) if model.steps.height else None
    # Which GPU ops a device sync waits for: those launched before it (in trace order).
    order = g.select(pl.arg_sort_by("launch_key_ns", maintain_order=True)).to_series()
    host = host.with_columns(starts.alias("start"))
    gpu = g.select(
        "chain",
        pl.col("gap_ns").alias("gap"),
        pl.col("dur_ns").alias("dur"),
        pl.col("start_ns").alias("anchor"),
        pl.col("launch"),
        (pl.col("launch_offset_ns") + pl.col("latency_ns")).alias("offset"),
    )
    blocking = bool(h.height) and bool((h.get_column("wait") != WAIT_NONE).any())
    if _kreplay is not None and max_rounds >= 1:
        native = _replay_native(host, gpu, g, order, node_order, main_tid, blocking, max_rounds)
        if native is not None:
            return native
    return _replay_polars(h, g, host, gpu, order, node_order, main_tid, blocking, max_rounds)


def _streams(df: pl.DataFrame) -> tuple[object, ...]:
    """Each column as an int64 Arrow stream (the C loop reads a single chunk without a copy)."""
    return int64_streams(*df.iter_columns())


def _replay_native(
    host: pl.DataFrame,
    gpu: pl.DataFrame,
    g: pl.DataFrame,
    order: pl.Series,
    node_order: pl.Series | None,
    main_tid: int | None,
    blocking: bool,
    max_rounds: int,
) -> Replayed | None:
    """:func:`replay`'s loop in C (the same arithmetic); None where a column holds a null."""
    out = _kreplay.replay(
        _streams(
            host.select(
                "tid",
                "gap",
                "dur",
                "anchor",
                "wait",
                "own",
                "queue",
                "follows",
                "orig_end",
                "start",
            )
        ),
        _streams(
            gpu.select("chain", "gap", "dur", "anchor", "launch", "offset").with_columns(
                g.get_column("end_ns").alias("end"), g.get_column("launch_key_ns").alias("key")
            )
        ),
        _streams(order.to_frame())[0],
        None if node_order is None else _streams(node_order.to_frame())[0],
        main_tid,
        blocking,
        max_rounds,
        NEG_NS,
        CONVERGED_NS,
        WARM_START,
    )
    if out is None:
        return None
    h_times, g_times = (pl.DataFrame(ArrowTable(t)) for t in out[:2])
    return Replayed(
        h_times.get_column("start"),
        h_times.get_column("end"),
        g_times.get_column("start"),
        g_times.get_column("end"),
        out[2],
        bool(out[3]),
    )


def _replay_polars(
    h: pl.DataFrame,
    g: pl.DataFrame,
    host: pl.DataFrame,
    gpu: pl.DataFrame,
    order: pl.Series,
    node_order: pl.Series | None,
    main_tid: int | None,
    blocking: bool,
    max_rounds: int,
) -> Replayed:
    """The reference loop (and the one a pure-Python install runs)."""
    keys = g.get_column("launch_key_ns").gather(order)
    host = host.with_columns(
        keys.search_sorted(host.get_column("start"), side="left").alias("drain_pos")
    )
    launch_idx = gpu.get_column("launch").clip(0)
    g_end = g.get_column("end_ns")
    h_times = pl.DataFrame({"start": h.get_column("start_ns"), "end": h.get_column("end_ns")})
    g_times = pl.DataFrame({"start": g.get_column("start_ns"), "end": g_end})
    rounds, converged = 0, False
    before_last: pl.Series | None = None
    for rounds in range(1, max_rounds + 1):  # a few rounds, each one vectorized pass
        drained = pl.concat([pl.Series([NEG_NS], dtype=pl.Int64), g_end.gather(order).cum_max()])
        floor = (
            host.select(
                pl.when(pl.col("wait") == WAIT_DEVICE)
                .then(drained.gather(host.get_column("drain_pos")) + pl.col("dur"))
                .when(pl.col("wait") == WAIT_OWN_OP)
                .then(g_end.gather(host.get_column("own")) + pl.col("dur"))
                .when(pl.col("wait") == WAIT_QUEUE)
                .then(g_end.gather(host.get_column("queue")) + pl.col("dur"))
                .otherwise(NEG_NS)
                .alias("floor")
            ).to_series()
            if g.height
            else pl.repeat(NEG_NS, h.height, eager=True).alias("floor")
        )
        h_times = _host_chains(host.with_columns(floor), main_tid)
        if node_order is not None:  # back in node order: launches and blocking calls use it
            h_times = h_times[node_order]
        h_start = h_times.get_column("start")
        ready = (
            gpu.select(
                pl.when(pl.col("launch") >= 0)
                .then(h_start.gather(launch_idx) + pl.col("offset"))
                .otherwise(pl.col("anchor"))
            ).to_series()
            if h.height
            else gpu.get_column("anchor")
        )
        floor_g = ready + gpu.get_column("gap") + gpu.get_column("dur")
        # a chain's first op starts when it is ready (launched ops move with their launch)
        g_times = chain_ends(
            gpu.with_columns(floor_g.alias("floor"), ready.alias("anchor")), "chain"
        )
        new_end = g_times.get_column("end")
        moved = int((new_end - g_end).abs().max() or 0) if g.height else 0
        if not blocking or (moved <= CONVERGED_NS and rounds > 1):
            g_end, converged = new_end, True
            break
        if before_last is not None and new_end.equals(before_last):
            g_end = new_end  # a two-round cycle (edges that contradict each other): stop
            break
        before_last, g_end = g_end, new_end
    return Replayed(
        h_times.get_column("start"),
        h_times.get_column("end"),
        g_times.get_column("start"),
        g_end,
        rounds,
        converged,
    )


def step_times_ns(model: StepModel, r: Replayed) -> pl.Series:
    """Each step's duration on the replayed times, by the rule the analysis uses for the trace
    (``context._device_aligned_steps``): a step ends when the host leaves it and the GPU work
    launched in it is done; it starts when the previous one ended."""
    st = model.steps_in_order
    if st.height == 0:
        return pl.Series("dur_ns", [], dtype=pl.Int64)
    h, g = model.host, model.gpu
    tid = step_thread(st)
    if _kreplay is not None:  # the same rule in C (kreplay.c); None: a null, decided below
        out = _kreplay.step_times(
            int64_streams(st.get_column("host_start_ns"), st.get_column("host_end_ns")),
            int64_streams(h.get_column("tid"), h.get_column("end_ns"), r.host_end_ns),
            int64_streams(g.get_column("launched"), g.get_column("launch_key_ns"), r.gpu_end_ns),
            tid,
        )
        if out is not None:
            return pl.DataFrame(ArrowTable(out)).to_series()
    hs = on_step_thread_clock(model, r, st.get_column("host_start_ns"))
    he = on_step_thread_clock(model, r, st.get_column("host_end_ns"))
    spans = pl.DataFrame({"_i": range(st.height), "s": st["host_start_ns"], "e": st["host_end_ns"]})
    ops = (
        g.select("launched", "launch_key_ns", r.gpu_end_ns.alias("g_end"))
        .with_row_index("_op")
        .sort("launch_key_ns")
        .join_asof(spans, left_on="launch_key_ns", right_on="s")
    )
    gpu_end = (
        ops.filter(pl.col("launched") & (pl.col("launch_key_ns") < pl.col("e")))
        .group_by("_i")
        .agg(pl.col("g_end").max())
    )
    out = (
        spans.with_columns(hs.alias("hs"), he.alias("he"))
        .join(gpu_end, on="_i", how="left")
        .sort("_i")
        .with_columns(pl.max_horizontal("he", "g_end").cum_max().alias("end"))
        .with_columns(pl.max_horizontal("hs", pl.col("end").shift(1)).alias("start"))
    )
    # Work queued before the first step runs first (the same rule as the trace's steps).
    first_host = int(st["host_start_ns"][0])
    first_start, first_end = int(out["start"][0]), int(out["end"][0])
    backlog = ops.filter(
        (~pl.col("launched") | (pl.col("launch_key_ns") < first_host))
        & (pl.col("g_end") > first_start)
    )
    if backlog.height:
        drained = min(int(backlog["g_end"].max()), first_end)
        out = out.with_columns(
            pl.when(pl.col("_i") == 0).then(drained).otherwise(pl.col("start")).alias("start")
        )
    return out.select((pl.col("end") - pl.col("start")).alias("dur_ns")).to_series()


def host_step_times_ns(model: StepModel, r: Replayed) -> pl.Series:
    """Each step but the last on the step thread's replayed clock: from its start to the next
    step's start (whole steps only: the last one's end is where the host stopped, not where
    the next step would begin)."""
    starts = on_step_thread_clock(model, r, model.steps_in_order.get_column("host_start_ns"))
    return starts.diff().slice(1).alias("dur_ns")


def on_step_thread_clock(model: StepModel, r: Replayed, t: pl.Series) -> pl.Series:
    """Trace times ``t`` on the step thread moved to the replayed clock: each moves with the
    last call there that ended at or before it (of equal ends, the last), none before it: not
    at all. Series operations over the model's calls in end order (this runs once per replay)."""
    rows, ends = model.step_thread_calls
    if ends.len() == 0:
        return t
    last = ends.search_sorted(t, side="right").cast(pl.Int64) - 1
    shift = (r.host_end_ns.gather(rows) - ends).fill_null(0).gather(last.clip(0))
    return t + shift * (last >= 0).cast(pl.Int64)


def steady_step_times_ns(model: StepModel, r: Replayed) -> pl.Series:
    """Each step's share of a long run: the longer of its device-aligned time
    (:func:`step_times_ns`) and its time on the step thread's clock (the last step: its
    device-aligned time). A window starts with the host some way ahead of the GPU, as
    recorded; where a change makes the GPU faster than the host, the GPU drains that lead
    within the window and its steps read short, yet a run cannot go faster than the host's
    own time per step (nor than the GPU's where the host runs ahead: the device-aligned
    steps)."""
    device = step_times_ns(model, r)
    if device.len() < 2:
        return device
    host = host_step_times_ns(model, r).append(device.tail(1))
    return pl.select(pl.max_horizontal(device, host)).to_series().alias("dur_ns")


def median_step_ns(model: StepModel, r: Replayed) -> float | None:
    d = step_times_ns(model, r)
    return float(d.median()) if d.len() else None


def step_ns(model: StepModel, r: Replayed, statistic: str = "median") -> float | None:
    """The modelled steps' ``statistic`` ("median" or "mean") on the replayed times, as a
    share of a long run (:func:`steady_step_times_ns`)."""
    return statistic_of(steady_step_times_ns(model, r), statistic)


def statistic_of(d: pl.Series, statistic: str) -> float | None:
    """``statistic`` ("median" or "mean") of step durations (None without steps)."""
    if d.len() == 0:
        return None
    return float(d.mean() if statistic == "mean" else d.median())
