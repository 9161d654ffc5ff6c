"""Source attribution: which line of the user's code caused each sync, blocking copy,
DataLoader wait and launch.

With ``with_stack=True`` Kineto records ``python_function`` ranges nested on the host thread
(``train.py(259): step``; a frame carries its function's first line). For each costly host event
the *location* is the innermost enclosing frame that is the user's (not torch, another library,
the standard library or site-packages), and the *trigger* is the call right beneath it
(``<built-in method item of Tensor object>`` -> ``item``), else the outermost op beneath it
(``aten::is_nonzero`` for a tensor-valued ``if``). Nesting is by interval containment per
thread, so no ``Python id``/``Python parent id`` args are needed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import polars as pl

from traceinsight.analyzers.context import Context, autotune_syncs
from traceinsight.analyzers.frames import innermost_user, native_frames, user_frames
from traceinsight.analyzers.idle import warmup_calls
from traceinsight.causal.whatif import WhatIf
from traceinsight.model import intervals as iv
from traceinsight.model.classify import (
    API_KINDS,
    BLOCKING_COPY_API,
    DATALOADER_PATTERN,
    HOST_OP_KINDS,
    LAUNCH_API,
    SYNC_API,
)
from traceinsight.records import OMIT_NONE
from traceinsight.report.format import SOURCES_KEPT

STACK_HINT = (
    "record with with_stack=True (torch.profiler.profile(with_stack=True), or "
    "traceinsight.capture.capture(with_stack=True)) to see which line of your code causes each one"
)


NSYS_STACK_HINT = (
    "record with backtraces (nsys profile --cudabacktrace=all, plus --python-backtrace=cuda for "
    "Python) to see which line of your code causes each one"
)
# rocprofv3 records the runtime's calls, no stacks or host ops of the program
ROCPROF_STACK_HINT = (
    "rocprofv3 does not record them: roctx ranges around your code (--marker-trace), or a "
    "CPU sampler (perf, rocprof-sys), show which part of it makes each call"
)
# a Kineto trace without host ops (CPU activity off): stacks need them first
NO_HOST_OPS_HINT = (
    "the trace records no host ops (torch.profiler without ProfilerActivity.CPU, or an "
    "on-demand GPU-only trace): record activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA] "
    "with with_stack=True to see which op and line of your code causes each one"
)
# NVTX ranges that are ops (emit_nvtx, NCCL's domain) or the profiler's: triggers, not places.
OP_RANGE = r"^(aten|autograd|c10d|torch|prim|profiler|cudnn|nccl)::|^nccl:"
SOURCE_ORDER = {"cuda_api": 0, "osrt": 1, "sampling": 2}  # the call's own stack first


@dataclass(frozen=True)
class Source:
    """A place in the user's code: ``location`` (file:line), its parts, the call beneath it
    that waited or launched (``trigger``), how often and how long (``cost_ns``); ``what_if``:
    the fix at this site alone, where the finding prices each site (findings/savings.py)."""

    location: str
    file: str | None
    line: int | None
    function: str | None
    trigger: str | None
    count: int
    cost_ns: int
    what_if: WhatIf | None = field(default=None, metadata=OMIT_NONE)
    # True where the trigger is a library's Python function (torchdiffeq's odeint), whose own
    # code waited or launched: the user's line calls it, the wait is inside it
    library_call: bool | None = field(default=None, metadata=OMIT_NONE)


@dataclass(frozen=True)
class SourcesResult:
    stacks_recorded: bool  # python_function frames or nsys backtraces present
    # by category (host_sync, blocking_copy, dataloader, launch): location, file, line,
    # function, trigger, count, cost_ns; most costly first
    by_category: dict[str, tuple[Source, ...]]
    hint: str = STACK_HINT  # how to record stacks, for this input's profiler
    # each located sync and blocking copy call (category, tid, start_ns, location, trigger):
    # what a fix at one call site changes (findings/savings.py); not in the JSON
    sites: pl.DataFrame | None = field(
        default=None, repr=False, compare=False, metadata={"json": False}
    )


CATEGORIES = ("host_sync", "blocking_copy", "dataloader", "launch")
LOCATED = {
    "location": pl.String,
    "file": pl.String,
    "line": pl.Int64,
    "function": pl.String,
    "trigger": pl.String,
    "library_call": pl.Boolean,
}


def analyze_sources(ctx: Context) -> SourcesResult:
    frames = ctx.rows(("python_function",))
    # the calls' own stacks (a CPU sample between calls locates none of them: idle's)
    chains = ctx.callchains.filter(pl.col("source").is_in(list(SOURCE_ORDER)))
    nsys = ctx.source_format == "nsys-sqlite"
    hint = NSYS_STACK_HINT if nsys else STACK_HINT
    # NVTX ranges stand in for stacks where they are the only host structure: nsys exports,
    # and their Chrome traces read back (no cpu ops); a Kineto trace without stacks gets the
    # hint instead of a guess from its record_function ranges.
    no_host_ops = not ctx.ops.select((pl.col("kind") == "cpu_op").any()).item()
    nvtx = nsys or no_host_ops
    if ctx.source_format in ("rocpd", "rocprof-json"):
        # not torch.profiler's (a rocprofv3 capture was told to add ProfilerActivity.CPU)
        hint = ROCPROF_STACK_HINT
    elif no_host_ops and not nsys:
        # stacks hang off the host ops, which this trace did not record (audit 14: dynolog's
        # on-demand traces and a torch.compile toy told to add with_stack=True)
        hint = NO_HOST_OPS_HINT
    if frames.height == 0 and chains.height == 0 and not nvtx:
        return SourcesResult(False, {c: () for c in CATEGORIES}, hint)
    lo, hi = ctx.window_start_ns, ctx.window_end_ns
    in_window = iv.overlapping(lo, hi)
    syncs = ctx.sync_calls.filter(in_window)
    # cudnn.benchmark's timing syncs are one-time tuning that host_sync does not count: not its
    # sources either (a DLProf export: "14 host syncs" listed over 15 + 14 syncs' sources)
    tuning = autotune_syncs(ctx).select("tid", "start_ns")
    if tuning.height:
        syncs = syncs.join(tuning, on=["tid", "start_ns"], how="anti")
    targets = pl.concat(
        [
            syncs.filter(pl.col("name").str.contains(SYNC_API)).with_columns(
                pl.lit("host_sync").alias("category")
            ),
            syncs.filter(pl.col("name").str.contains(BLOCKING_COPY_API)).with_columns(
                pl.lit("blocking_copy").alias("category")
            ),
            ctx.rows(HOST_OP_KINDS, DATALOADER_PATTERN)
            .filter(in_window)
            .with_columns(pl.lit("dataloader").alias("category")),
            _launches(ctx, in_window).with_columns(pl.lit("launch").alias("category")),
        ],
        how="diagonal_relaxed",
    ).select("category", "name", "start_ns", "end_ns", "dur_ns", "tid")
    # One call recorded twice, nested (nsys 2022.2 writes each backtraced CUDA call again as
    # its own row around the plain one): the outer one counts, once.
    prev_end = pl.col("end_ns").cum_max().shift(1).over("category", "tid")
    targets = (
        targets.sort(
            "category", "tid", "start_ns", pl.col("end_ns"), descending=[False, False, False, True]
        )
        .filter(prev_end.is_null() | (pl.col("end_ns") > prev_end))
        .with_row_index("target")
    )
    # Each target from the best evidence it has: the Python stack, a native backtrace, and
    # (nsys) the innermost NVTX range around it.
    parts = []
    left = targets
    if frames.height:
        parts.append(_locate(left, frames, ctx.ops))
        left = left.join(parts[-1].select("target"), on="target", how="anti")
    if chains.height and left.height:
        parts.append(_locate_native(left, chains))
        left = left.join(parts[-1].select("target"), on="target", how="anti")
    if nvtx and left.height:
        parts.append(_locate_nvtx(left, ctx.ops, ctx.name_matches(HOST_OP_KINDS, OP_RANGE)))
    cols = ["category", "dur_ns", *LOCATED]
    located = (
        pl.concat(
            [
                p.select(
                    (pl.col(c) if c in p.columns else pl.lit(None))
                    .cast(LOCATED.get(c) or p.schema[c])
                    .alias(c)
                    for c in cols
                )
                for p in parts
            ]
        )
        if parts
        else pl.DataFrame(schema={"category": pl.String, "dur_ns": pl.Int64, **LOCATED})
    )
    sites = (
        pl.concat([p.select("target", "location", "trigger") for p in parts])
        .join(targets.select("target", "category", "tid", "start_ns"), on="target")
        .filter(pl.col("category").is_in(["host_sync", "blocking_copy"]))
        .drop("target")
        if parts
        else None
    )
    by_category = {}
    for cat in CATEGORIES:
        rows = (
            located.filter(pl.col("category") == cat)
            .group_by("location", "file", "line", "function", "trigger")
            .agg(
                pl.len().alias("count"),
                pl.col("dur_ns").sum().alias("cost_ns"),
                # None unless a library's function (one trigger name, one kind of call)
                pl.when(pl.col("library_call").any()).then(True).alias("library_call"),
            )
            .sort(["cost_ns", "location", "trigger"], descending=[True, False, False])
            .head(SOURCES_KEPT)
        )
        by_category[cat] = tuple(Source(**row) for row in rows.iter_rows(named=True))
    return SourcesResult(frames.height > 0 or chains.height > 0, by_category, hint, sites)


def _locate_native(targets: pl.DataFrame, chains: pl.DataFrame) -> pl.DataFrame:
    """Each target with a backtrace inside it on its thread (its own CUDA API stack first, else
    an OS runtime call's or a CPU sample's): the innermost user frame is the location, the frame
    beneath it (the call it made) the trigger."""
    events = chains.group_by("chain").agg(
        pl.col("start_ns").first().alias("c_s"),
        pl.col("end_ns").first().alias("c_e"),
        pl.col("tid").first().alias("c_tid"),  # OS thread ids are unique on a host
        pl.col("source").first().replace_strict(SOURCE_ORDER, default=9).alias("order"),
    )
    hits = iv.containing(
        events,
        targets.select("target", "start_ns", "end_ns", "tid"),
        inner_start="c_s",
        inner_end="c_e",
        outer_start="start_ns",
        outer_end="end_ns",
        same=("tid", "c_tid"),
    )
    frames = native_frames(chains)
    # the location: the innermost user frame; the trigger: the call it made
    per_chain = innermost_user(frames).rename({"callee": "t_fn"})
    best = (
        hits.join(per_chain, on="chain")
        .sort("target", "order", "c_s")
        .unique("target", keep="first", maintain_order=True)
    )
    trigger = pl.col("t_fn").str.extract(r"([^:]+)$")
    return (
        targets.join(
            best.select(
                "target",
                pl.format("{} ({})", "function", "file").alias("location"),
                "file",
                pl.lit(None, pl.Int64).alias("line"),
                "function",
                trigger.alias("_t"),
            ),
            on="target",
        )
        .with_columns(pl.coalesce("_t", pl.col("name").str.replace(r"_v\d+$", "")).alias("trigger"))
        .drop("_t")
    )


MAX_NESTING = 64  # NVTX nesting levels walked up from a sibling to the range that holds a call


def _innermost(targets: pl.DataFrame, places: pl.DataFrame) -> pl.DataFrame:
    """Each target (target, start_ns, end_ns, tid) with the innermost place (u_s, u_e, u_tid,
    location) holding it on its thread: the place started last at or before it, else, if that
    one ended first (a sibling), the nearest of its ancestors that holds it. An as-of join and a
    few lookups up the nesting, where an interval join of a million launches with the ranges
    around them took seconds on a 1 GB export."""
    # (stable: of two equal places, the one listed last is the innermost)
    p = places.sort(
        "u_tid", "u_s", pl.col("u_e"), descending=[False, False, True], maintain_order=True
    ).with_row_index("pid_")
    # each place's parent (its row of p; null: none): the innermost place holding it (ties:
    # the one listed first); places are looked up by row, not joined
    up = iv.parents(p, tid="u_tid", start="u_s", end="u_e").cast(pl.UInt32)
    ends = p.get_column("u_e")
    # as-of by thread: each side sorted by start within each thread (p is; the targets, by
    # start alone: a third of a two-key sort's time)
    t = (
        targets.sort("start_ns", maintain_order=True)
        .join_asof(
            p.select("pid_", "u_s", "u_tid"),
            left_on="start_ns",
            right_on="u_s",
            by_left="tid",
            by_right="u_tid",
            check_sortedness=False,
        )
        .select("target", "end_ns", "pid_")
    )
    pid, end = t.get_column("pid_"), t.get_column("end_ns")
    for _ in range(MAX_NESTING):
        short = pid.is_not_null() & (ends.gather(pid) < end)
        if not short.any():
            break
        pid = pl.select(pl.when(short).then(up.gather(pid)).otherwise(pid)).to_series()
    t = t.with_columns(pid.alias("pid_")).drop_nulls("pid_")
    return (
        t.join(p.select("pid_", "u_s", "location"), on="pid_")
        .drop("pid_", "end_ns")
        .join(targets, on="target")
    )


def _locate_nvtx(targets: pl.DataFrame, ops: pl.DataFrame, op_range: pl.Expr) -> pl.DataFrame:
    """nsys without a backtrace: the innermost NVTX range around the target that is not an op
    (its trailing ``#N`` dropped, so one place across iterations) is the location; the
    outermost op range beneath it (not for launches), else the API call, the trigger.
    ``op_range``: whether a range's name is an op's (:data:`OP_RANGE`, matched once per
    distinct name: a regex over millions of emit_nvtx names cost 0.25 s a pass)."""
    ranges = ops.filter(pl.col("kind") == "user_annotation").select(
        "name", "start_ns", "end_ns", "tid", op_range.alias("_op")
    )
    is_op = pl.col("_op")
    places = ranges.filter(~is_op).select(
        pl.col("start_ns").alias("u_s"),
        pl.col("end_ns").alias("u_e"),
        pl.col("tid").alias("u_tid"),
        pl.col("name").str.replace(r"#\d+$", "").alias("location"),
    )
    cols = ["target", "start_ns", "end_ns", "tid"]
    loc = _innermost(targets.select(cols), places)
    # Launches' trigger is their API call: the op join over millions of launches and emit_nvtx
    # op ranges cost seconds on a 1 GB export, for a name the launch finding does not need.
    need_op = loc.join(targets.filter(pl.col("category") != "launch").select("target"), on="target")
    ops_in = iv.containing(
        need_op.select(cols + ["u_s"]),
        ranges.filter(is_op).select(
            pl.col("start_ns").alias("t_s"),
            pl.col("end_ns").alias("t_e"),
            pl.col("tid").alias("t_tid"),
            pl.col("name").alias("t_name"),
        ),
        inner_start="start_ns",
        inner_end="end_ns",
        outer_start="t_s",
        outer_end="t_e",
        same=("t_tid", "tid"),
    ).filter(pl.col("t_s") >= pl.col("u_s"))
    op = (
        ops_in.sort("target", "t_s", pl.col("t_e"), descending=[False, False, True])
        .unique("target", keep="first")
        .select("target", pl.col("t_name").str.replace(r"^\w+::", "").alias("_op"))
    )
    return (
        targets.join(loc.select("target", "location"), on="target")
        .join(op, on="target", how="left")
        .with_columns(
            pl.lit(None, pl.String).alias("file"),
            pl.lit(None, pl.Int64).alias("line"),
            pl.col("location").alias("function"),
            pl.coalesce("_op", pl.col("name").str.replace(r"_v\d+$", "")).alias("trigger"),
        )
        .drop("_op")
    )


def _launches(ctx: Context, in_window: pl.Expr) -> pl.DataFrame:
    """The window's launch calls, less the one-time ones (a kernel's first launch that loaded
    its module: idle's ``warmup_calls``, cold_start's). Session 56's audit: a cold MoE forward's
    first ``cudaLaunchKernel``, 322.5 ms, named the Embedding the worst launch site, its
    launch_bound's sources 421.7 ms against 2.45 ms of launch idle."""
    calls = ctx.rows(API_KINDS, LAUNCH_API, where=in_window)
    once = warmup_calls(ctx)
    if calls.height == 0 or once.height == 0:
        return calls
    return calls.join(once.select("tid", "start_ns"), on=["tid", "start_ns"], how="anti")


def _trigger_name() -> pl.Expr:
    """The method or function a frame calls: ``item`` of ``<built-in method item of ...>``,
    ``synchronize`` of ``torch/cuda/__init__.py(..): synchronize``, ``Linear`` of a module."""
    n = pl.col("t_name")
    return pl.coalesce(
        n.str.extract(r"^<built-in (?:method|function) (\w+)"),
        n.str.extract(r"\(\d+\): (.+)$"),
        n.str.extract(r"^nn\.Module: (\w+?)(?:_\d+)?$"),
        n,
    )


def _locate(targets: pl.DataFrame, frames: pl.DataFrame, ops: pl.DataFrame) -> pl.DataFrame:
    """Each target with its innermost user frame (location) and trigger; targets with no user
    frame around them are left out."""
    cols = ["target", "start_ns", "end_ns", "tid"]
    user = user_frames(frames).select(
        pl.col("start_ns").alias("u_s"),
        pl.col("end_ns").alias("u_e"),
        pl.col("tid").alias("u_tid"),
        pl.col("name").alias("location"),
        "file",
        "line",
        pl.col("func").alias("function"),
    )
    inner = iv.containing(
        targets.select(cols),
        user,
        inner_start="start_ns",
        inner_end="end_ns",
        outer_start="u_s",
        outer_end="u_e",
        same=("u_tid", "tid"),
    )
    loc = inner.sort("target", "u_s").unique("target", keep="last").drop("u_tid", "u_e")
    if loc.height == 0:
        return (
            targets.head(0)
            .with_columns(
                pl.lit(None, pl.String).alias(c)
                for c in ("location", "file", "function", "trigger")
            )
            .with_columns(pl.lit(None, pl.Int64).alias("line"))
        )
    beneath = loc.select(cols + ["u_s"])

    def below(rows: pl.DataFrame, name: str, *, library: bool = False) -> pl.DataFrame:
        """The outermost of ``rows`` that starts inside the user frame and holds the target;
        ``library``: also whether it is a library's Python function (``NAME_lib``)."""
        hits = iv.containing(
            beneath,
            rows.select(
                pl.col("start_ns").alias("t_s"),
                pl.col("end_ns").alias("t_e"),
                pl.col("tid").alias("t_tid"),
                pl.col("name").alias("t_name"),
            ),
            inner_start="start_ns",
            inner_end="end_ns",
            outer_start="t_s",
            outer_end="t_e",
            same=("t_tid", "tid"),
        ).filter(pl.col("t_s") > pl.col("u_s"))
        picked = [pl.col("target"), _trigger_name().alias(name)]
        if library:
            # a Python function in a file, beneath the user's innermost frame: a library's;
            # torch's own (synchronize, a tensor's __format__) are calls the user makes
            n = pl.col("t_name")
            lib = n.str.contains(r"\(\d+\): ") & ~n.str.starts_with("torch/")
            picked.append(lib.alias(f"{name}_lib"))
        return (
            hits.sort("target", "t_s", pl.col("t_e"), descending=[False, False, True])
            .unique("target", keep="first")
            .select(picked)
        )

    call = below(frames, "_call", library=True)
    op = below(ops, "_op").with_columns(pl.col("_op").str.replace(r"^aten::", ""))
    return (
        targets.join(loc.select("target", "location", "file", "line", "function"), on="target")
        .join(call, on="target", how="left")
        .join(op, on="target", how="left")
        .with_columns(
            pl.coalesce("_call", "_op", "name").alias("trigger"),
            pl.col("_call_lib").fill_null(False).alias("library_call"),
        )
        .drop("_call", "_op", "_call_lib")
    )
