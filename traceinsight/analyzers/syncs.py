"""Host syncs: where the host blocks on the GPU, and which op asked for it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import polars as pl

from traceinsight.analyzers.context import (
    Context,
    autotune_syncs,
    closing_profiler_sync,
    launched,
)
from traceinsight.model import intervals as iv
from traceinsight.model.classify import API_KINDS


@dataclass(frozen=True)
class SyncResult:
    host_sync_count: int
    host_sync_blocked_ns: int
    syncs_per_step: float | None
    profiler_syncs: int  # the profiler's own closing sync, not the user's
    by_op: tuple[dict[str, Any], ...]  # op that caused the syncs: count, blocked_ns
    # the syncs an input copy makes (right after the thread's host-to-device copy: a
    # .to(device) without non_blocking=True), counted in host_sync_count too
    input_copy_sync_count: int = 0
    input_copy_blocked_ns: int = 0
    # the part of that blocked time the GPU sat idle (the rest it ran queued work)
    input_copy_idle_ns: int = 0
    # of those, tensors built from Python data on the device (torch.tensor(x, device=...)):
    # the copy is followed by the new tensor's aten::lift_fresh, no input's .to()
    constructed_copy_sync_count: int = 0
    # cudnn.benchmark's timing syncs inside convolution ops (context.py autotune_syncs): one-time
    # tuning, left out of the counts above
    autotune_syncs: int = 0


def analyze_syncs(ctx: Context) -> SyncResult:
    calls, profiler, tuned = _counted_syncs(ctx)
    by_op = (
        calls.with_columns(pl.coalesce(pl.col("op"), pl.lit("(no enclosing op)")).alias("op"))
        .group_by("op", "name")
        .agg(pl.len().alias("count"), pl.col("dur_ns").sum().alias("blocked_ns"))
        .rename({"name": "api"})
        .sort(["blocked_ns", "op", "api"], descending=[True, False, False])
        .head(10)
    )
    steps = ctx.steps.height
    inputs = input_copy_syncs(ctx)
    return SyncResult(
        host_sync_count=calls.height,
        host_sync_blocked_ns=int(calls["dur_ns"].sum()) if calls.height else 0,
        syncs_per_step=calls.height / steps if steps else None,
        profiler_syncs=profiler,
        by_op=tuple(by_op.iter_rows(named=True)),
        input_copy_sync_count=inputs.height,
        input_copy_blocked_ns=int(inputs["dur_ns"].sum()) if inputs.height else 0,
        input_copy_idle_ns=_idle_during(ctx, inputs),
        constructed_copy_sync_count=int(inputs.get_column("constructed").sum()),
        autotune_syncs=tuned,
    )


def _counted_syncs(ctx: Context) -> tuple[pl.DataFrame, int, int]:
    """The window's sync calls the counts take (each with its enclosing ``op``), less the
    profiler's closing sync and cudnn.benchmark's timing syncs, and how many of each left out.
    Computed once a trace (the attention's mask reads the input copies too)."""

    def make() -> tuple[pl.DataFrame, int, int]:
        lo, hi = ctx.window_start_ns, ctx.window_end_ns
        calls = ctx.sync_calls.filter(iv.overlapping(lo, hi)).with_row_index("call_id")
        calls = calls.join(enclosing_op(ctx.ops, calls), on="call_id", how="left")
        profiler = 0
        closing = closing_profiler_sync(ctx)
        if closing is not None:
            # called by the profiler itself, so no op of the user's encloses it
            is_prof = closing & pl.col("op").is_null()
            profiler = calls.filter(is_prof).height
            calls = calls.filter(~is_prof)
        tuning = autotune_syncs(ctx).select("tid", "start_ns")
        before = calls.height
        if tuning.height:
            calls = calls.join(tuning, on=["tid", "start_ns"], how="anti")
        return calls, profiler, before - calls.height

    return ctx.host.derived("counted_syncs", make)


def input_copy_syncs(ctx: Context) -> pl.DataFrame:
    """The counted syncs (:func:`_counted_syncs`) right after their thread's host-to-device
    copy, each with ``constructed``: the copy built a tensor from Python data on the device
    (:func:`_before_lift_fresh`)."""

    def make() -> pl.DataFrame:
        calls = _counted_syncs(ctx)[0]
        inputs = calls.filter(_after_host_to_device(ctx, calls))
        return inputs.with_columns(
            _before_lift_fresh(ctx, inputs).alias("constructed")
            if inputs.height
            else pl.lit(False).alias("constructed")
        )

    return ctx.host.derived("input_copy_syncs", make)


def _idle_during(ctx: Context, calls: pl.DataFrame) -> int:
    """The time inside ``calls`` (their union, in the window) during which no GPU ran."""
    if calls.height == 0:
        return 0
    u = iv.clip(
        iv.union(calls.select("start_ns", "end_ns")), ctx.window_start_ns, ctx.window_end_ns
    )
    if u.height == 0:
        return 0
    busy = iv.union(ctx.busy.select("start_ns", "end_ns")) if ctx.busy.height else None
    inside = int(iv.overlap_with(u, busy).sum()) if busy is not None else 0
    return iv.total(u) - inside


def _after_host_to_device(ctx: Context, calls: pl.DataFrame) -> pl.Series:
    """Per sync call (in ``calls`` order): the thread's previous runtime/driver call launched a
    host-to-device copy (the sync is that copy's)."""
    if calls.height == 0:
        return pl.Series([], dtype=pl.Boolean)
    api = ctx.rows(API_KINDS).select("tid", "start_ns")
    h2d = launched(
        ctx.launches,
        [pl.col("launch_tid").alias("tid"), pl.col("launch_start_ns").alias("start_ns")],
        (pl.col("kind") == "memcpy") & (pl.col("copy_kind") == "HtoD"),
    ).with_columns(pl.lit(True).alias("_h2d"))
    prev = thread_neighbour(
        calls.with_columns((pl.col("start_ns") - 1).alias("_before")), api, "_before", "backward"
    ).join(
        h2d.unique(["tid", "start_ns"]).rename({"start_ns": "_at"}),
        on=["tid", "_at"],
        how="left",
        maintain_order="left",
    )
    return prev.get_column("_h2d").fill_null(False)


# torch.tensor(data, device=...) makes the tensor on the CPU, copies it, then lifts it: the
# lift starts right after the copy's ops return (61 us after the sync, a Llama's eager mask)
LIFT_AFTER_MAX_NS = 500_000


def _before_lift_fresh(ctx: Context, calls: pl.DataFrame) -> pl.Series:
    """Per sync call (in ``calls`` order): the next op its thread starts after the call is the
    new tensor's ``aten::lift_fresh``, within :data:`LIFT_AFTER_MAX_NS`: a tensor built from
    Python data on the device (``torch.tensor(0.0, device=...)``, pageable, so blocking)."""
    # only the ops starting soon after some call's end go to the sorted join (an nsys export's
    # 8.8M NVTX ranges, unsorted: sorting them all cost 0.3 s)
    ends = calls.get_column("end_ns").sort()
    start = ctx.ops.get_column("start_ns")
    before = ends.search_sorted(start, side="right").cast(pl.Int64) - 1
    near = (before >= 0) & (start - ends.gather(before.clip(0)) <= LIFT_AFTER_MAX_NS)
    ops = ctx.ops.filter(near).select(
        "tid", "start_ns", (pl.col("name") == "aten::lift_fresh").alias("_is_lift")
    )
    nxt = thread_neighbour(calls, ops, "end_ns", "forward")
    lift = pl.col("_is_lift") & (pl.col("_at") - pl.col("end_ns") <= LIFT_AFTER_MAX_NS)
    return nxt.select(lift.fill_null(False).alias("_lift")).get_column("_lift")


def thread_neighbour(
    calls: pl.DataFrame, rows: pl.DataFrame, at: str, strategy: str
) -> pl.DataFrame:
    """Each of ``calls`` (tid and the time column ``at``), in their order, with the row of
    ``rows`` (tid, start_ns, ...) whose start is nearest ``at`` on the same thread in
    ``strategy``'s direction ("backward": at or before it; "forward": at or after), that start
    as ``_at`` (null where none)."""
    right = rows.rename({"start_ns": "_at"})
    if not right.get_column("_at").is_sorted():  # the event table's order mostly holds
        right = right.sort("_at")
    return (
        calls.with_row_index("_i")
        .select("_i", "tid", at)
        .sort(at)
        .join_asof(
            right,
            left_on=at,
            right_on="_at",
            by="tid",
            strategy=strategy,
            check_sortedness=False,
        )
        .sort("_i")
    )


def enclosing_op(host_ops: pl.DataFrame, calls: pl.DataFrame) -> pl.DataFrame:
    """The outermost aten/user op on the same thread around each call (``calls``: call_id,
    start_ns, end_ns, tid; ``aten::item`` over ``aten::_local_scalar_dense``), else the
    innermost of any: (call_id, op)."""
    ops = host_ops.select(
        pl.col("name").alias("op"),
        pl.col("start_ns").alias("op_s"),
        pl.col("end_ns").alias("op_e"),
        pl.col("tid").alias("op_tid"),
    )
    if ops.height == 0 or calls.height == 0:
        return pl.DataFrame(schema={"call_id": pl.UInt32, "op": pl.String})
    c = calls.select("call_id", "start_ns", "end_ns", "tid")
    hits = iv.containing(
        c,
        ops,
        inner_start="start_ns",
        inner_end="end_ns",
        outer_start="op_s",
        outer_end="op_e",
        same=("op_tid", "tid"),
    )
    if hits.height == 0:
        return pl.DataFrame(schema={"call_id": pl.UInt32, "op": pl.String})
    # Prefer a recognizable user-facing op, else the innermost.
    return (
        hits.with_columns(
            pl.col("op")
            .str.contains(
                r"^aten::(item|nonzero|cpu|to|copy_|equal|is_nonzero|masked_select|unique)"
            )
            .alias("_named")
        )
        .sort(["call_id", "_named", "op_s"], descending=[False, True, False])
        .unique(subset=["call_id"], keep="first")
        .select("call_id", "op")
    )
