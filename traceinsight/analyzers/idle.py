"""GPU idle segments and their causes.

Busy = the union of kernels, copies and memsets on a device (all streams). Every gap inside the
analysis window is an idle segment, attributed by what the host was doing during it:

1. ``profiler``: the profiler's own work (buffer requests, its closing sync) covers most of it.
2. ``capture``: a CUDA/HIP graph capture is in progress (its launches run nothing).
3. ``dataloader``: the main thread is inside ``DataLoader.__next__`` for most of it.
4. ``warmup``: one-time costs cover most of it: a launch far slower than its thread's usual
   launch and the first of its kernel (lazy module loading), module and library loads, stream,
   event and context creation, torch.compile's compilation, a host op's first call far slower
   than all its later ones (first-use set-up).
5. ``pageable_copy``: a host-synchronous copy from pageable memory covers most of it.
6. ``allocator``: cudaMalloc/cudaFree (hipMalloc/hipFree) calls cover most of it.
7. ``host_sync``: a blocking sync (stream/device/event synchronize, blocking memcpy) was in
   progress when the GPU ran dry, so nothing could be queued ahead; or syncs cover most of it.
8. ``communication``: the host is blocked in a collective or barrier.
9. ``launch_overhead``: the work after the gap was launched only after the GPU went idle, and
   the gap is short or the host spent it in launch calls: the CPU cannot feed the GPU fast enough.
10. ``cpu_work``: launched late after a longer stretch of other host work (the op is named).
11. ``gpu_wait``: the next work was already queued (a cross-stream or event dependency).
12. ``host_untraced``: none of the above, and the capture recorded no runtime/driver API calls
    at all (a rocprofv3 kernel trace): when the next work was launched is unknown, so the gap is
    not blamed on the host's work (``cpu_work``) or a dependency (``gpu_wait``) by guess.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import polars as pl

from traceinsight.analyzers.context import (
    Context,
    autotune_syncs,
    calls_inside,
    capture_spans,
    closing_profiler_sync,
    host_ranges,
    join_beside,
    launched,
    outermost,
)
from traceinsight.analyzers.frames import innermost_user, native_frames, user_frames
from traceinsight.analyzers.optimizer import OPTIMIZER_PATTERN, optimizer_ranges
from traceinsight.causal.build import without_cpu_only_ops
from traceinsight.causal.transforms import (
    DISPATCH_CAP_RATIO,
    MIN_DISPATCH_CAP_NS,
    UNTRACED_WAIT_MIN_NS,
)
from traceinsight.constants import IDLE_CAUSES
from traceinsight.model import intervals as iv
from traceinsight.model.classify import (
    ALLOCATOR_API,
    API_KINDS,
    CAPTURE_ANNOTATION,
    CAPTURE_BEGIN_API,
    CAPTURE_END_API,
    COMM_HOST_PATTERN,
    COMM_SETUP_PATTERN,
    COMPILE_PATTERN,
    COMPILED_CODE_RANGE,
    COPY_LAUNCH_API,
    CUDA_DRIVER_OVERHEAD,
    CUDA_LOADING_OVERHEAD,
    CUDAGRAPH_RECORD_FRAME,
    DATALOADER_PATTERN,
    DEVICE_ALLOC_API,
    FUNC_ATTRIBUTE_API,
    HOST_OP_KINDS,
    INDUCTOR_KERNELS,
    LAUNCH_API,
    MODULE_PATTERN,
    PINNED_HOST_ALLOC_API,
    STREAM_WAIT_API,
    WARMUP_API,
    name_matches,
)

CAUSES = tuple(IDLE_CAUSES)
# the cause column is built as an enum and cast to text once: a chain of text literals over a
# million gaps copied a string per branch (2-3x the time)
_CAUSE = pl.Enum(CAUSES)


def _cause(cause: str) -> pl.Expr:
    """An idle cause as a literal of the cause enum."""
    return pl.lit(cause, _CAUSE)


# A gap at least this covered by one host activity is blamed on it.
MAJORITY = 0.5
# A gap whose next kernel was launched late is launch overhead when the host spent it mostly
# in launch calls, or in the launching thread's torch ops for no longer than the step model's
# dispatch cap (DISPATCH_CAP_RATIO x the median such gap, at least MIN_DISPATCH_CAP_NS: what
# its cuda_graphs transform removes per launch); otherwise CPU work (Python outside any op, or
# work inside an op beyond dispatch). Where the trace records no host ops (nsys, Kineto
# without CPU activity) the host's time cannot be split: gaps up to this long are then taken
# as launch overhead.
UNSPLIT_LAUNCH_GAP_NS = 100_000
# A kernel launch call is a one-time cost (its kernel's module loaded on first use, lazy
# loading) when it is its kernel's first launch in the trace and takes at least this long,
# and this many times its thread's median launch (taken as at most a warm launch's cost, so a
# thread with one launch is judged too): warm launches take 2-20 us; first ones 1 ms to
# seconds on the audited traces (benchmarks/audit/AUDIT.md). Copies and memsets launched
# through the same calls are no kernel's first launch.
WARMUP_LAUNCH_MIN_NS = 1_000_000
WARMUP_LAUNCH_FACTOR = 20.0
WARM_LAUNCH_MAX_NS = 50_000
# Work launched this long (or half the gap) before the gap ended was queued: a launch's latency
# is microseconds (the step model's MAX_LAUNCH_LATENCY_NS)
QUEUED_MIN_NS = 50_000
# A host faulting through managed memory goes through the pages each migration brings at the
# fault stream's pace: 100-3,000 MB/s between the migrations of two public exports (a T4
# softmax reading its results, 1 MB per 2.8 ms at the slowest; ICON-C). A gap in which the host
# took longer over the pages before it held the host at other work: a CLUE export printing its
# results as text, 2.6-2.8 MB/s over 22-99 ms gaps (its CPU samples in snprintf; audit s57).
FAULT_STREAM_MIN_BYTES_PER_MS = 10_000
# A host-synchronous copy's call stages its bytes in about the copy's own time (pageable
# uploads: calls of 3.0-3.9 ms for copies of 2.9-3.6 ms on a V100); one that began more than
# twice that before its copy ran waited on its stream.
STAGING_RATIO = 2
# host_sync idle outside the syncs counts as the host's other work from this much in a gap: a
# refill's launch after a sync takes microseconds
AFTER_RETURN_MIN_NS = 1_000_000
WARMUP_CALLS_REPORTED = 10
# A host op called at least this many times whose first call took WARMUP_LAUNCH_MIN_NS or more
# and this many times its slowest later call did first-use set-up: a library's handles, its
# heuristics, lazy initialisation. A compiled ResNet-18's three iterations in one window (no
# steps): the first SumBackward0 8.7 ms against 5-6 us after, the first compiled region 13.3 ms
# against 1.9-2.0 ms. A cost the loop pays each step recurs in later calls and is not one-time.
FIRST_CALL_MIN_CALLS = 3
FIRST_CALL_FACTOR = 4.0
# A steady loop creates no streams or contexts and loads no modules: a window with this many
# such calls after its first step is (part of) a first pass, whatever idle they cover.
COLD_CREATIONS_MIN = 4
# ... and one whose one-time costs cover this share of the idle is a cold pass.
COLD_IDLE_MIN_RATIO = 0.5
# Allocator calls churn when memory is given back and asked for again: frees at least this
# share of the mallocs. Mallocs without frees are the cache filling: first allocations,
# one-time (the caching allocator keeps the blocks).
CHURN_FREE_MIN_RATIO = 0.5
# ... and mallocs that keep coming are no fill either, freed or not: at least this many, every
# quarter of the window holding CHURN_STEADY_MIN_SHARE of them (audit s63: an OpenACC loop's
# 1,942 cuMemAlloc, one an iteration and never freed, 190-200 in each tenth of the window,
# listed as 1,942 one-time calls "later steps do not pay"); a fill comes first, then stops
CHURN_STEADY_MIN_MALLOCS = 20
CHURN_STEADY_MIN_SHARE = 0.1
TIMELINE_BINS = 600
TOP_SEGMENTS = 25


@dataclass(frozen=True)
class IdleSegment:
    """One idle gap of a device: its span, its offset from the window's start, its cause and
    the host op running while the GPU waited (None: none)."""

    device: int | None
    start_ns: int
    end_ns: int
    dur_ns: int
    offset_ns: int
    cause: str
    host_op: str | None


@dataclass(frozen=True)
class StepIdle:
    """One step's idle time, in all and by cause."""

    step: int
    idle_ns: int
    idle_by_cause_ns: dict[str, int]


@dataclass(frozen=True)
class WarmupCall:
    """A one-time host call in the window (see :func:`warmup_calls`): its name, when (from the
    window's start), how long, and why it is one-time (``first_launch``, ``load``, ``create``,
    ``compile``, ``autotune``, ``first_call``: a host op's first call far slower than its
    later ones)."""

    name: str
    offset_ns: int
    dur_ns: int
    kind: str


@dataclass(frozen=True)
class IdleResult:
    window_ns: int
    devices: tuple[dict[str, Any], ...]
    busy_ns: int
    idle_ns: int
    gpu_busy_ratio: float | None
    gpu_idle_ratio: float | None
    idle_by_cause_ns: dict[str, int]
    segment_count: int
    top_segments: tuple[IdleSegment, ...]
    timeline: dict[str, Any] = field(default_factory=dict)  # per-device busy bins, for the report
    per_step: tuple[StepIdle, ...] = ()
    # every gap with its cause (device, start_ns, end_ns, cause, host_op: named for the
    # reported ones only): for the region breakdown, which places the same segments in the
    # model's regions, and the annotated trace's idle track over the whole window; not in the JSON
    segments: pl.DataFrame | None = field(
        default=None, repr=False, compare=False, metadata={"json": False}
    )
    # the engines apart (gpu_busy_ratio counts either): kernels on the SMs, copies and memsets
    # on the copy engines, each as its union's share of the window x devices
    kernel_busy_ratio: float | None = None
    copy_busy_ratio: float | None = None
    # the window is (part of) a first pass: its one-time costs cover most of the idle, or it
    # creates streams, events or handles or loads modules (see COLD_CREATIONS_MIN)
    cold_window: bool = False
    # the longest one-time calls of the window (first launches, loads, creations, compiling)
    warmup_calls: tuple[WarmupCall, ...] = ()
    warmup_call_count: int = 0
    # GPU idle inside DataLoader.__next__ over every gap, whatever each gap's cause: a gap goes
    # to the cause covering most of it, so a loader wait inside a longer gap of other host work
    # counts there (the 2021 ResNet sample: 2.8 ms a step inside the loader, 0.02 ms attributed)
    dataloader_idle_ns: int = 0
    # the GPU idle (cause dataloader) of the gaps around the window's first loader call where
    # that call is the iterator's first batch, the workers starting (first_batch_start_ns)
    dataloader_first_batch_idle_ns: int = 0
    dataloader_first_batch_start_ns: int | None = None
    dataloader_first_batch_end_ns: int | None = None
    # the queued-work idle (gpu_wait) in gaps of UNTRACED_WAIT_MIN_NS or more: waits on
    # something the trace does not hold (an event another process records)
    gpu_wait_long_ns: int = 0
    # the queued-work idle (gpu_wait) in gaps whose next work had been launched QUEUED_MIN_NS
    # or more before it started: a wait, not the device's own gap between queued kernels
    gpu_wait_queued_ns: int = 0
    # the most streams any device's work ran on in the window (0: unknown) and the calls that
    # made a stream wait on an event: on one stream without them no work waits on another's,
    # so gpu_wait there is the device's own gap between queued work
    max_streams_per_device: int = 0
    stream_wait_calls: int = 0
    # cpu_work idle between two launches of one step: gaps strictly inside a step (the loop's
    # own Python before the step's first launch, and after its last, stays out). A
    # whole-step capture replays the step without it (launch_bound's what_if_whole_step);
    # torch.compile traces the model's Python away
    cpu_work_between_launches_ns: int = 0
    # cpu_work idle in the gaps left out above (a step's start, a boundary) while the host ran
    # the model's own nn.Module frames (Python stacks): its dispatch before its first kernel,
    # which a capture removes as well (a public eager transformer layer: MultiheadAttention's
    # Python 130-320 us into each step before its first launch, read "not explained")
    cpu_work_model_lead_ns: int = 0
    # host_sync idle outside every sync (and the op around it), where that is at least
    # AFTER_RETURN_MIN_NS of a gap: the host at other work once the sync had returned, which
    # removing the syncs does not shorten (audit 16: a diffusion step's read-back returned
    # 27 us into a 10.83 ms gap)
    host_sync_after_return_ns: int = 0
    # unified_memory idle after the device's last kernel: the host reading what the GPU wrote
    # through page faults, no GPU work waiting on it (audit s58: an A100 vector add's host
    # check loop, 3.55 s of its 3.57 s)
    unified_memory_after_kernels_ns: int = 0
    # unified-memory page migrations that ran while a kernel of their device ran: pages the
    # kernels faulted in (or out) as they touched them, which stretches the kernels rather
    # than idling the GPU (audit s60: a managed-memory vector add, 155 migrations to the
    # device inside its 1.45 ms kernel): how many, their bytes, and the kernel time beside them
    unified_migrations_in_kernels: int = 0
    unified_migrations_in_kernels_bytes: int = 0
    unified_migrations_in_kernels_ns: int = 0
    # launch_overhead idle in gaps ended by one of torch.compile's Triton kernels: the compiled
    # code's launches, against the eager code's (the rest); a program compiled in part gets
    # advice for the part its launch gaps precede (audit 16: a fusion demo, 19 of 64 kernels
    # Triton, 2.27 ms of its launch idle before them and 2.03 ms before eager kernels)
    launch_overhead_compiled_ns: int = 0

    @property
    def device_window_ns(self) -> int:
        """The window summed over the active devices: what a cost's share is taken of."""
        return max(1, self.window_ns) * max(1, len(self.devices))


def _overlap_frac(gaps: pl.DataFrame, u: pl.DataFrame, name: str) -> pl.Series:
    if u.height == 0:
        return pl.repeat(0.0, gaps.height, dtype=pl.Float64, eager=True).alias(name)
    ov = iv.overlap_with(gaps, u)
    return (ov / gaps["dur_ns"].cast(pl.Float64)).alias(name)


def _launching_ops(ctx: Context) -> pl.DataFrame:
    """Union of the torch ops of the threads that launch GPU work (a pin-memory or data
    thread's ops are not the launching thread's dispatch), clipped to the window, less the
    ops that launched nothing for a millisecond or longer: CPU computation
    (:func:`~traceinsight.causal.build.without_cpu_only_ops`)."""
    tids = ctx.launches.get_column("launch_tid").drop_nulls().unique()
    ops = ctx.rows(
        ("cpu_op",),
        where=pl.col("tid").is_in(tids.implode()),
        columns=("kind", "tid", "start_ns", "end_ns"),
    )
    if ops.height == 0:
        return _clipped(ctx, ops)
    kept = without_cpu_only_ops(
        ops, ctx.launches.get_column("launch_tid"), ctx.launches.get_column("launch_start_ns")
    )
    return _clipped(ctx, kept)


def _profiler_ranges(ctx: Context) -> pl.DataFrame:
    # the driver's own work is not the profiler's: a function's lazy load, and a module's
    # load or JIT compile (one-time warm-up: a compiled ResNet's 4.3 ms "Runtime Triggered
    # Module Loading" under AccumulateGrad read as profiler idle, its cold pass missed)
    rows = ctx.rows(("overhead",), CUDA_DRIVER_OVERHEAD, negate=True)
    closing = closing_profiler_sync(ctx)
    if closing is not None:
        tail = ctx.sync_calls.filter(closing)
        rows = pl.concat([rows.select("start_ns", "end_ns"), tail.select("start_ns", "end_ns")])
    if rows.height == 0:
        return pl.DataFrame(schema={"start_ns": pl.Int64, "end_ns": pl.Int64})
    return iv.clip(iv.union(rows), ctx.window_start_ns, ctx.window_end_ns)


def _pageable_copy_calls(ctx: Context) -> pl.DataFrame:
    calls = launched(
        ctx.launches,
        [pl.col("launch_start_ns").alias("start_ns"), pl.col("launch_end_ns").alias("end_ns")],
        (pl.col("kind") == "memcpy")
        & ((pl.col("src_kind") == "pageable") | (pl.col("dst_kind") == "pageable")),
    )
    if calls.height == 0:
        return calls.cast({"start_ns": pl.Int64, "end_ns": pl.Int64})
    return iv.clip(iv.union(calls), ctx.window_start_ns, ctx.window_end_ns)


def top_gaps(gaps: pl.DataFrame) -> pl.DataFrame:
    """The reported segments: longest first, ties in time order (deterministic, so the gaps
    that get a host op are exactly the ones listed). Only gaps at least as long as the 25th
    longest are sorted, not the hundreds of thousands a long trace has."""
    if gaps.height > TOP_SEGMENTS:
        gaps = gaps.filter(pl.col("dur_ns") >= gaps.get_column("dur_ns").top_k(TOP_SEGMENTS).min())
    return gaps.sort(["dur_ns", "start_ns", "device"], descending=[True, False, False]).head(
        TOP_SEGMENTS
    )


# How an OS call that held a launching thread is named in a gap (nsys OSRT_API)
OS_CALL_SUFFIX = " (an OS call)"


def _os_calls(ctx: Context) -> pl.DataFrame:
    """The long OS calls (schema ``os_call``) of the threads that launch GPU work, named with
    :data:`OS_CALL_SUFFIX`: where no op or Python frame covers a gap, the call the launching
    thread sat in (getc, read, a lock's wait). Other threads' waits (a pool's poll, a
    semaphore) last all capture long and name nothing."""
    calls = ctx.rows(("os_call",))
    if calls.height == 0:
        return calls
    tids = ctx.launches.get_column("launch_tid").drop_nulls().unique().implode()
    return calls.filter(pl.col("tid").is_in(tids)).with_columns(
        (pl.col("name") + OS_CALL_SUFFIX).alias("name")
    )


def dominant_ops(ctx: Context, gaps: pl.DataFrame) -> pl.DataFrame:
    """For each reported gap (``gap_id``, start/end; a handful, see :func:`top_gaps`), the host
    op covering most of it (deepest on ties). One scan of the ops per gap: cheaper than the sort
    of millions of ops an interval join needs."""
    # torch ops and annotations, and the user's own Python frames where the trace has them
    # (with_stack): a gap spent in the user's Python is named by its frame ("train.py(88):
    # log"); a torch op covering it wins, else the innermost user frame at its middle
    sources = [
        (ctx.ops, 0),
        (user_frames(ctx.rows(("python_function",))), 1),
        (_os_calls(ctx), 2),
    ]
    sources = [(df, py) for df, py in sources if df.height]
    none = pl.DataFrame(schema={"gap_id": pl.UInt32, "op": pl.String})
    if gaps.height == 0:
        return none
    named = _covering(ctx, gaps, sources) if sources else none
    # where nothing recorded covers a gap, the host code nsys's CPU samples found running in it
    sampled = _sampled(ctx, gaps.join(named.drop_nulls("op"), on="gap_id", how="anti"))
    return pl.concat([named.drop_nulls("op"), sampled]) if sampled.height else named


def _covering(
    ctx: Context, gaps: pl.DataFrame, sources: list[tuple[pl.DataFrame, int]]
) -> pl.DataFrame:
    """:func:`dominant_ops` from the recorded ops, frames and OS calls: each gap's name, where
    one covers its middle."""
    g = gaps.select(
        "gap_id", "start_ns", "end_ns", ((pl.col("start_ns") + pl.col("end_ns")) // 2).alias("mid")
    )
    # filtered on their times first: only the few ops at a gap's middle carry their names on
    hits = pl.concat(
        [
            df.filter((pl.col("start_ns") <= mid) & (pl.col("end_ns") > mid)).select(
                pl.col("name").alias("op"),
                pl.col("start_ns").alias("op_s"),
                pl.col("end_ns").alias("op_e"),
                pl.col("tid").alias("op_tid"),
                pl.lit(py, pl.Int8).alias("_py"),
                (pl.col("kind") == "cpu_op").alias("_op"),
                pl.lit(gid, pl.UInt32).alias("gap_id"),
                pl.lit(s, pl.Int64).alias("start_ns"),
                pl.lit(e, pl.Int64).alias("end_ns"),
            )
            for df, py in sources
            for gid, s, e, mid in g.iter_rows()
        ]
    )
    if hits.height == 0:
        return pl.DataFrame(schema={"gap_id": pl.UInt32, "op": pl.String})
    # Of the ops covering most of the gap: the loader's or the optimizer's range (the step's
    # phases a user knows), else the outermost torch op (what the code called), else the
    # innermost annotation: a record_function around the whole loop covers as much as the op
    # inside it that did the work (audit 18: "mostly while the host ran model_inference" where
    # a CPU aten::randn held 654 of its 670 ms)
    ov = pl.min_horizontal("op_e", "end_ns") - pl.max_horizontal("op_s", "start_ns")
    most = (pl.col("_py") == 0) & (ov >= MAJORITY * (pl.col("end_ns") - pl.col("start_ns")))
    phase = pl.col("op").str.contains(f"{DATALOADER_PATTERN}|{OPTIMIZER_PATTERN}")
    span = pl.col("op_e") - pl.col("op_s")
    named = (
        hits.with_columns(
            pl.when(pl.col("_py") == 0).then(ov).otherwise(0).alias("ov"),
            pl.when(most & phase)
            .then(0)
            .when(most & pl.col("_op"))
            .then(1)
            .when(most)
            .then(2)
            .otherwise(3)
            .alias("_tier"),
        )
        .with_columns(
            pl.when(pl.col("_tier") == 1)
            .then(-span)
            .when(pl.col("_tier") < 3)
            .then(span)
            .otherwise(-pl.col("ov"))
            .alias("_rank")
        )
        .sort(
            ["gap_id", "_py", "_tier", "_rank", "op_s"],
            descending=[False, False, False, False, True],
        )
        .unique(subset=["gap_id"], keep="first")
        # the autograd engine's wrapper of a backward op: the op's own name says it
        .with_columns(pl.col("op").str.replace(r"^autograd::engine::evaluate_function: ", ""))
    )
    return _with_callee(ctx, _in_closure(ctx, named)).select("gap_id", "op")


# How host code named by CPU samples is marked in a gap's name, and the samples it takes: at
# least this many in the gap, the named function's a majority of them
CPU_SAMPLES_SUFFIX = " (CPU samples)"
CPU_SAMPLES_MIN = 3


def _sampled(ctx: Context, gaps: pl.DataFrame) -> pl.DataFrame:
    """Each gap's host code by the CPU samples nsys took in it between the CUDA calls of the
    launching threads (``cpu_sample`` chains): the innermost user function of most of them, with
    the call beneath it where it is resolved (``CLUEAlgo::verboseResults > snprintf (CPU
    samples)``: a CLUE export's host printing its results, audit s57); none where the samples
    are too few or split."""
    none = pl.DataFrame(schema={"gap_id": pl.UInt32, "op": pl.String})
    chains = ctx.callchains
    if gaps.height == 0 or chains.height == 0:
        return none
    samples = chains.filter(pl.col("source") == "cpu_sample")
    if samples.height == 0:
        return none
    at = samples.group_by("chain").agg(pl.col("start_ns").first().alias("t"))
    spans = gaps.select("gap_id", "start_ns", "end_ns")
    hits = pl.concat(
        [
            at.filter((pl.col("t") >= s) & (pl.col("t") < e)).with_columns(
                pl.lit(gid, pl.UInt32).alias("gap_id")
            )
            for gid, s, e in spans.iter_rows()
        ]
    )
    if hits.height == 0:
        return none
    frames = native_frames(samples.join(hits.select("chain"), on="chain"))
    named = hits.join(innermost_user(frames), on="chain", how="left").with_columns(
        pl.when(pl.col("callee").is_not_null())
        .then(pl.format("{}{}{}", "function", pl.lit(CALLEE_SEP), "callee"))
        .otherwise(pl.col("function"))
        .alias("op")
    )
    counts = named.group_by("gap_id", "op").agg(pl.len().alias("n"))
    total = named.group_by("gap_id").agg(pl.len().alias("all"))
    return (
        counts.drop_nulls("op")
        .join(total, on="gap_id")
        .filter((pl.col("all") >= CPU_SAMPLES_MIN) & (pl.col("n") > MAJORITY * pl.col("all")))
        .select("gap_id", (pl.col("op") + CPU_SAMPLES_SUFFIX).alias("op"))
    )


# How a gap inside an optimizer step's closure is named: the model's work, not the optimizer's
CLOSURE_WORDS = "'s closure (the model's forward and backward)"


def _in_closure(ctx: Context, named: pl.DataFrame) -> pl.DataFrame:
    """Gaps named by an ``Optimizer.step#`` range that lie before its own part (Lightning runs
    forward and backward inside ``optimizer.step(closure)``: audit 11's Lightning loop read
    "mostly while the host ran Optimizer.step#AdamW.step" for idle in its forward) are named
    as its closure's (:data:`CLOSURE_WORDS`)."""
    opt = named.filter(pl.col("op").str.starts_with("Optimizer.step#"))
    if opt.height == 0:
        return named
    own = optimizer_ranges(ctx).select(
        pl.col("name").alias("op"), pl.col("tid").alias("op_tid"), pl.col("start_ns").alias("_own")
    )
    closure = (
        opt.join(own, on=["op", "op_tid"], how="inner")
        .filter(
            (pl.col("_own") >= pl.col("op_s"))
            & (pl.col("_own") <= pl.col("op_e"))
            & (pl.col("end_ns") <= pl.col("_own"))
        )
        .select("gap_id")
        .unique()
        .get_column("gap_id")
        .implode()
    )
    return named.with_columns(
        pl.when(pl.col("gap_id").is_in(closure))
        .then(pl.col("op") + CLOSURE_WORDS)
        .otherwise(pl.col("op"))
        .alias("op")
    )


# a library frame under the user's frame names the gap where it covers this share of it
CALLEE_MIN_RATIO = 0.5
CALLEE_SEP = " > "  # between the user's frame and the library frame under it


def _with_callee(ctx: Context, named: pl.DataFrame) -> pl.DataFrame:
    """A gap named by the user's own frame gets the deepest library frame under it that covers
    :data:`CALLEE_MIN_RATIO` of the gap: "run_on_input > .../image_processing_videomae.py(235):
    preprocess" says what the 269 ms the user's line took was (audit 5: a TimeSformer pipeline's
    video decoding and preprocessing, named by the user's outermost call alone)."""
    by_user = named.filter(pl.col("_py") == 1)
    frames = ctx.rows(("python_function",), columns=("name", "start_ns", "end_ns", "tid"))
    if by_user.height == 0 or frames.height == 0:
        return named
    callees = []
    for gid, s, e, u_s, u_e, tid in by_user.select(
        "gap_id", "start_ns", "end_ns", "op_s", "op_e", "op_tid"
    ).iter_rows():
        under = frames.filter(
            (pl.col("tid") == tid)
            & (pl.col("start_ns") > u_s)
            & (pl.col("end_ns") <= u_e)
            & (
                pl.min_horizontal(pl.col("end_ns"), pl.lit(e))
                - pl.max_horizontal(pl.col("start_ns"), pl.lit(s))
                >= CALLEE_MIN_RATIO * (e - s)
            )
        )
        if under.height:  # nested frames covering the same span: the latest to start is deepest
            callees.append((gid, under.sort("start_ns").get_column("name")[-1]))
    if not callees:
        return named
    got = pl.DataFrame(callees, schema={"gap_id": pl.UInt32, "callee": pl.String}, orient="row")
    return named.join(got, on="gap_id", how="left").with_columns(
        pl.when(pl.col("callee").is_not_null())
        .then(pl.concat_str("op", pl.lit(CALLEE_SEP), "callee"))
        .otherwise("op")
        .alias("op")
    )


def analyze_idle(ctx: Context) -> IdleResult:
    lo, hi = ctx.window_start_ns, ctx.window_end_ns
    if not ctx.has_gpu and ctx.trace_devices and hi > lo:
        # a window none of the trace's GPUs worked in (inside a loader stall): they were idle
        # all of it, and its cause is what the host did then
        ctx = replace(ctx, devices=ctx.trace_devices)
    if not ctx.devices or hi <= lo:
        return IdleResult(ctx.window_ns, (), 0, 0, None, None, {c: 0 for c in CAUSES}, 0, ())
    busy = ctx.busy
    gaps = iv.gaps(busy, lo, hi, by=["device"])
    quiet = [d for d in ctx.devices if d not in set(busy.get_column("device").to_list())]
    if quiet:  # a device without one busy interval has no gap from iv.gaps: the whole window
        whole = pl.DataFrame(
            {"device": quiet, "start_ns": [lo] * len(quiet), "end_ns": [hi] * len(quiet)}
        )
        gaps = pl.concat([gaps, whole.cast(gaps.schema)])
    gaps = gaps.with_columns((pl.col("end_ns") - pl.col("start_ns")).alias("dur_ns")).filter(
        pl.col("dur_ns") > 0
    )
    gaps = gaps.with_row_index("gap_id")
    if gaps.get_column("device").n_unique() == 1:  # one device's gaps: disjoint, in time order
        gaps = gaps.with_columns(pl.col("start_ns").set_sorted(), pl.col("end_ns").set_sorted())

    per_dev = []
    busy_total = 0
    for dev in ctx.devices:
        b = iv.total(busy.filter(pl.col("device") == dev))
        busy_total += b
        per_dev.append(
            {
                "device": dev,
                "busy_ns": b,
                "idle_ns": ctx.window_ns - b,
                "busy_ratio": b / ctx.window_ns,
            }
        )

    every_once = warmup_calls(ctx)
    # the one-time calls the idle's attribution counts: with the allocator's calls where the
    # cache fills (not churning), the frees too (a cudaFree(0) creating the context)
    attributed = every_once
    allocs = ctx.rows(API_KINDS, f"{ALLOCATOR_API}|{PINNED_HOST_ALLOC_API}")
    if not churning(ctx, allocs):
        first = allocs.select(every_once.columns[:-1]).with_columns(
            pl.lit("first_alloc").alias("kind")
        )
        attributed = pl.concat([every_once, first]).sort("start_ns")
        # the first allocations are counted and listed with the other one-time calls (audit
        # 21: "a cold first pass ... (0 one-time calls)" where the warm-up idle was a first
        # cudaMalloc's); a free is no allocation (the review: "the longest cudaFree 6.01 s")
        mallocs = first.filter(pl.col("name").str.contains(DEVICE_ALLOC_API))
        every_once = pl.concat([every_once, mallocs]).sort("start_ns")
        allocs = allocs.clear()
    if gaps.height:
        gaps = _attribute(ctx, gaps, attributed, allocs)
    else:
        gaps = gaps.with_columns(
            pl.lit("gpu_wait").alias("cause"), pl.lit(None, pl.String).alias("op")
        )

    by_cause = {c: 0 for c in CAUSES}
    for cause, total in gaps.group_by("cause").agg(pl.col("dur_ns").sum()).iter_rows():
        by_cause[cause] = int(total)
    in_loader = (
        int(gaps.select((pl.col("f_dataloader") * pl.col("dur_ns")).sum()).item())
        if "f_dataloader" in gaps.columns
        else 0
    )
    top = top_gaps(gaps)
    top_rows = tuple(
        IdleSegment(
            r["device"],
            r["start_ns"],
            r["end_ns"],
            r["dur_ns"],
            r["start_ns"] - lo,
            r["cause"],
            r["op"],
        )
        for r in top.iter_rows(named=True)
    )
    denom = ctx.window_ns * max(1, len(ctx.devices))
    per_step = _per_step(ctx, gaps)
    once = every_once.filter(iv.overlapping(lo, hi))
    cold = _cold(ctx, gaps, once)
    reported = tuple(
        WarmupCall(r["name"], r["start_ns"] - lo, r["dur_ns"], r["kind"])
        for r in once.sort(["dur_ns", "start_ns"], descending=[True, False])
        .head(WARMUP_CALLS_REPORTED)
        .iter_rows(named=True)
    )
    return IdleResult(
        window_ns=ctx.window_ns,
        devices=tuple(per_dev),
        busy_ns=busy_total,
        idle_ns=denom - busy_total,
        gpu_busy_ratio=busy_total / denom,
        gpu_idle_ratio=1 - busy_total / denom,
        idle_by_cause_ns=by_cause,
        segment_count=gaps.height,
        top_segments=top_rows,
        timeline=_timeline(ctx, busy, gaps),
        per_step=per_step,
        segments=gaps.select(
            "device", "start_ns", "end_ns", "cause", pl.col("op").alias("host_op")
        ),
        kernel_busy_ratio=_engine_busy(ctx, ("kernel",)) / denom,
        copy_busy_ratio=_engine_busy(ctx, ("memcpy", "memset")) / denom,
        warmup_calls=reported,
        warmup_call_count=once.height,
        cold_window=cold,
        dataloader_idle_ns=in_loader,
        **_first_batch(ctx, gaps),
        gpu_wait_long_ns=int(
            gaps.filter(
                (pl.col("cause") == "gpu_wait") & (pl.col("dur_ns") >= UNTRACED_WAIT_MIN_NS)
            )
            .get_column("dur_ns")
            .sum()
        ),
        gpu_wait_queued_ns=int(
            gaps.filter((pl.col("cause") == "gpu_wait") & pl.col("_queued_wait"))
            .get_column("dur_ns")
            .sum()
        )
        if "_queued_wait" in gaps.columns  # not without attribution (no launch calls to read)
        else 0,
        max_streams_per_device=_max_streams(ctx),
        stream_wait_calls=ctx.rows(API_KINDS, STREAM_WAIT_API, columns=("start_ns",)).height,
        cpu_work_between_launches_ns=_between_launches(ctx, gaps, "cpu_work"),
        cpu_work_model_lead_ns=_model_lead(ctx, gaps, "cpu_work"),
        host_sync_after_return_ns=_after_return(gaps),
        unified_memory_after_kernels_ns=_after_kernels(ctx, gaps, "unified_memory"),
        **_migrations_in_kernels(ctx),
        launch_overhead_compiled_ns=_before_compiled(ctx, gaps, "launch_overhead"),
    )


# The window's first loader call is the iterator's first batch, its workers starting (processes
# spawned, the dataset sent to each), where it took this many times the longest of the window's
# other loader calls, of which there are at least FIRST_BATCH_MIN_CALLS (audit 17: a cold
# ResNet's first __next__ 1,938.9 ms, the others 0.1-747.6 ms): a one-time cost per iterator.
FIRST_BATCH_FACTOR = 2.0
FIRST_BATCH_MIN_CALLS = 3


def _first_batch(ctx: Context, gaps: pl.DataFrame) -> dict[str, Any]:
    """The dataloader idle of the gaps overlapping the window's first loader call where that
    call is the workers' start (:data:`FIRST_BATCH_FACTOR`); its start."""
    calls = (
        ctx.rows(HOST_OP_KINDS, DATALOADER_PATTERN, columns=("start_ns", "end_ns", "tid"))
        .filter((pl.col("end_ns") > ctx.window_start_ns) & (pl.col("start_ns") < ctx.window_end_ns))
        .sort("start_ns")
    )
    if calls.height <= FIRST_BATCH_MIN_CALLS:
        return {}
    first = calls.row(0, named=True)
    # the first call's thread, its outermost calls (a range nested in another is the same call)
    rest = calls.slice(1).filter(
        (pl.col("tid") == first["tid"]) & (pl.col("start_ns") >= first["end_ns"])
    )
    dur = pl.col("end_ns") - pl.col("start_ns")
    longest = rest.select(dur.max()).item()
    if rest.height < FIRST_BATCH_MIN_CALLS or (
        first["end_ns"] - first["start_ns"] < FIRST_BATCH_FACTOR * (longest or 0)
    ):
        return {}
    idle = (
        gaps.filter(
            (pl.col("cause") == "dataloader")
            & (pl.col("end_ns") > first["start_ns"])
            & (pl.col("start_ns") < first["end_ns"])
        )
        .select(dur.sum())
        .item()
    )
    if not idle:
        return {}
    return {
        "dataloader_first_batch_idle_ns": int(idle),
        "dataloader_first_batch_start_ns": int(first["start_ns"]),
        "dataloader_first_batch_end_ns": int(first["end_ns"]),
    }


def _migrations_in_kernels(ctx: Context) -> dict[str, int]:
    """IdleResult's ``unified_migrations_in_kernels*``: the unified-memory migrations that
    overlap a kernel of their device, their bytes, and the kernel time they overlap."""
    g = ctx.gpu
    if g.height == 0 or "copy_kind" not in g.columns:
        return {}
    moved = g.filter(pl.col("copy_kind") == "unified").select(
        "device", "start_ns", "end_ns", pl.col("bytes").fill_null(0)
    )
    if moved.height == 0:
        return {}
    kernels = iv.union(
        g.filter(pl.col("kind") == "kernel").select("device", "start_ns", "end_ns"), ["device"]
    )
    if kernels.height == 0:
        return {}
    # per device (a handful): each migration's time covered by its device's kernels
    beside = pl.concat(
        [
            m.filter(iv.overlap_with(m, kernels.filter(pl.col("device") == m["device"][0])) > 0)
            for m in moved.partition_by("device")
        ]
    )
    if beside.height == 0:
        return {}
    spans = iv.union(beside.select("device", "start_ns", "end_ns"), ["device"])
    return {
        "unified_migrations_in_kernels": beside.height,
        "unified_migrations_in_kernels_bytes": int(beside.get_column("bytes").sum()),
        "unified_migrations_in_kernels_ns": iv.total(iv.intersect(spans, kernels, ["device"])),
    }


def _after_kernels(ctx: Context, gaps: pl.DataFrame, cause: str) -> int:
    """The idle of ``cause`` in gaps that begin at or after their device's last kernel ended."""
    mine = gaps.filter(pl.col("cause") == cause)
    if mine.height == 0:
        return 0
    last = (
        ctx.gpu.lazy()
        .filter(pl.col("kind") == "kernel")
        .group_by(pl.col("device").cast(gaps.schema["device"]))
        .agg(pl.col("end_ns").max().alias("_last"))
        .collect()
    )
    return int(
        mine.join(last, on="device", how="inner")
        .filter(pl.col("start_ns") >= pl.col("_last"))
        .get_column("dur_ns")
        .sum()
    )


def _after_return(gaps: pl.DataFrame) -> int:
    """host_sync gaps' idle outside every sync (and the op around it), where that is at least
    AFTER_RETURN_MIN_NS in the gap (``unsynced_ns``, set in :func:`_attribute`)."""
    if "unsynced_ns" not in gaps.columns:
        return 0
    after = pl.col("unsynced_ns")
    return int(
        gaps.filter((pl.col("cause") == "host_sync") & (after >= AFTER_RETURN_MIN_NS))
        .select(after.sum())
        .item()
        or 0
    )


def _in_step(ctx: Context, gaps: pl.DataFrame, cause: str) -> pl.DataFrame:
    """The gaps of ``cause`` (device, start_ns, end_ns, dur_ns) with ``_inside``: strictly
    inside one step, between two of its launches. A step starts once the work launched in the
    previous one is done (context._device_aligned_steps), so work that ends inside it was
    launched in it; a gap from the step's start (before its first work) or across a boundary
    is not inside, nor one ending with the step (no launch of it after). Empty without steps."""
    cols = ["device", "start_ns", "end_ns", "dur_ns"]
    if ctx.steps.height == 0:
        return gaps.select(cols).head(0).with_columns(pl.lit(False).alias("_inside"))
    steps = iv.in_time_order(
        ctx.steps.select(pl.col("start_ns").alias("_s"), pl.col("end_ns").alias("_e")), "_s"
    )
    return (
        iv.in_time_order(gaps.filter(pl.col("cause") == cause).select(cols), "start_ns")
        .join_asof(steps, left_on="start_ns", right_on="_s")
        .select(
            *cols,
            ((pl.col("start_ns") > pl.col("_s")) & (pl.col("end_ns") < pl.col("_e")))
            .fill_null(False)
            .alias("_inside"),
        )
    )


def _between_launches(ctx: Context, gaps: pl.DataFrame, cause: str) -> int:
    """The idle of ``cause`` in gaps strictly inside one step (:func:`_in_step`)."""
    g = _in_step(ctx, gaps, cause)
    return int(g.filter(pl.col("_inside")).get_column("dur_ns").sum())


def _before_compiled(ctx: Context, gaps: pl.DataFrame, cause: str) -> int:
    """The idle of ``cause`` in the gaps whose next work the compiled code launched: the next
    kernel on their device (the first starting at or after the gap's end) is torch.compile's
    (:data:`INDUCTOR_KERNELS`), or the host launched it inside a compiled range
    (:data:`COMPILED_CODE_RANGE`: a compiled graph's cuBLAS call is compiled code too)."""
    g = gaps.filter(pl.col("cause") == cause)
    if g.height == 0 or ctx.gpu.height == 0:
        return 0
    g = g.select("device", "end_ns", "dur_ns", "next_launch_ns")
    # the kernels' times and row numbers only: their names are read for the matched rows
    # alone (copying a million kernel names for the join cost the 1 GB nsys export 100 MiB)
    k = (
        ctx.gpu.select("device", pl.col("start_ns").alias("_k"), pl.col("kind"))
        .with_row_index("_row")
        .filter(pl.col("kind") == "kernel")
        .drop("kind")
    )
    if k.height == 0:
        return 0
    g = iv.in_time_order(g, "end_ns").join_asof(
        iv.in_time_order(k, "_k"),
        left_on="end_ns",
        right_on="_k",
        by="device",
        strategy="forward",
        check_sortedness=False,  # both sorted by time: within each device too
    )
    rows = g.get_column("_row")
    names = ctx.gpu.get_column("name").gather(rows.fill_null(0))
    triton = names.str.contains(INDUCTOR_KERNELS).fill_null(False) & rows.is_not_null()
    ranges = ctx.rows(HOST_OP_KINDS, COMPILED_CODE_RANGE, columns=("start_ns", "end_ns"))
    inside = pl.repeat(False, g.height, eager=True)
    if ranges.height:
        at = g.select(
            pl.col("next_launch_ns").fill_null(-1).alias("start_ns"),
            (pl.col("next_launch_ns").fill_null(-1) + 1).alias("end_ns"),
        )
        inside = iv.overlap_with(at, iv.union(ranges)) > 0
    return int(g.filter(triton | inside).get_column("dur_ns").sum())


def _model_lead(ctx: Context, gaps: pl.DataFrame, cause: str) -> int:
    """The idle of ``cause`` in the gaps not strictly inside a step (:func:`_in_step`: from a
    step's start, across a boundary, to its end) while the host ran an ``nn.Module`` frame:
    the model's own Python before its first kernel (0 without Python stacks or steps)."""
    mods = ctx.rows(("python_function",), MODULE_PATTERN, columns=("start_ns", "end_ns"))
    if mods.height == 0 or ctx.steps.height == 0:
        return 0
    edge = _in_step(ctx, gaps, cause).filter(~pl.col("_inside"))
    if edge.height == 0:
        return 0
    model = iv.union(mods.select("start_ns", "end_ns"))
    # per device, as the idle is counted (one host frame overlaps each device's gap)
    model = edge.select("device").unique().join(model, how="cross")
    return iv.total(iv.intersect(iv.union(edge, ["device"]), model, ["device"]))


def _between_migrations(ctx: Context, gaps: pl.DataFrame) -> pl.Series:
    """Per gap: the GPU work that ended at its start and the work that began at its end are
    both unified-memory page migrations (copy kind "unified": the driver's, on a page fault or
    a prefetch; nsys records them), and the host went through the pages that moved before the
    gap at no less than :data:`FAULT_STREAM_MIN_BYTES_PER_MS`. Between two migrations the
    device did nothing but take pages in or out while the host faulted through managed memory;
    a gap slower than that held the host at other work between its touches."""
    g = ctx.gpu
    none = pl.repeat(False, gaps.height, eager=True).alias("between_migrations")
    if g.height == 0 or "copy_kind" not in g.columns:
        return none
    moved = (
        g.lazy()
        .filter(pl.col("copy_kind") == "unified")
        .select("device", "start_ns", "end_ns", pl.col("bytes").fill_null(0))
        .collect()
    )
    if moved.height == 0:
        return none
    dev = gaps.schema["device"]
    ends = moved.group_by(pl.col("device").cast(dev), pl.col("end_ns").alias("start_ns")).agg(
        pl.col("bytes").sum().alias("_bytes")
    )
    starts = moved.select(pl.col("device").cast(dev), pl.col("start_ns").alias("end_ns")).unique()
    keys = gaps.select("device", "start_ns", "end_ns")
    after = keys.join(ends, on=["device", "start_ns"], how="left", maintain_order="left")
    moved_bytes = after.get_column("_bytes")
    # (an export without the bytes moved: any gap between migrations, as before the pace)
    streamed = (moved_bytes == 0) | (
        moved_bytes * 1_000_000
        >= (after.get_column("end_ns") - after.get_column("start_ns"))
        * FAULT_STREAM_MIN_BYTES_PER_MS
    )
    before = keys.join(
        starts.with_columns(pl.lit(True).alias("_b")),
        on=["device", "end_ns"],
        how="left",
        maintain_order="left",
    )
    return (streamed.fill_null(False) & before.get_column("_b").fill_null(False)).alias(
        "between_migrations"
    )


def _max_streams(ctx: Context) -> int:
    """The most distinct streams one device's GPU work in the window ran on (0: unknown)."""
    g = ctx.gpu
    if g.height == 0 or "stream" not in g.columns:
        return 0
    per = g.lazy().group_by("device").agg(pl.col("stream").drop_nulls().n_unique().alias("n"))
    return int(per.select(pl.col("n").max()).collect().item() or 0)


def _engine_busy(ctx: Context, kinds: tuple[str, ...]) -> int:
    """Union time of these kinds of GPU activity in the window, summed over devices."""
    rows = ctx.gpu.lazy().filter(pl.col("kind").is_in(kinds)).select("device", "start_ns", "end_ns")
    return iv.total(iv.union(rows, by=["device"]))


def _per_step(ctx: Context, gaps: pl.DataFrame) -> tuple[StepIdle, ...]:
    """Idle time by cause inside each step; a gap spanning a step boundary is split there.

    A device's gaps are disjoint and sorted, so each (device, cause) set is a union and its
    overlap with every step is two sorted searches (no pairwise join of gaps and steps).
    """
    if ctx.steps.height == 0 or gaps.height == 0:
        return ()
    steps = ctx.steps.select("start_ns", "end_ns")
    zero = pl.repeat(0, steps.height, dtype=pl.Int64, eager=True)
    totals = dict.fromkeys(CAUSES, zero)
    for (_dev, cause), part in (
        gaps.sort("start_ns").partition_by(["device", "cause"], as_dict=True).items()
    ):
        totals[str(cause)] = totals[str(cause)] + iv.overlap_with(
            steps, part.select("start_ns", "end_ns")
        )
    per_cause = {c: totals[c].to_list() for c in CAUSES}
    rows = []
    for i, step in enumerate(ctx.steps["step"].to_list()):
        causes = {c: int(per_cause[c][i]) for c in CAUSES}
        rows.append(StepIdle(step, sum(causes.values()), causes))
    return tuple(rows)


def _attribute(
    ctx: Context, gaps: pl.DataFrame, once: pl.DataFrame, allocs: pl.DataFrame
) -> pl.DataFrame:
    host = ("runtime", "driver")
    dataloader = host_ranges(ctx, DATALOADER_PATTERN)
    # cudnn.benchmark's timing syncs are one-time tuning (in ``once``), not the loop's syncs
    tuning = once.filter(pl.col("kind") == "autotune").select("tid", "start_ns")
    sync_calls = (
        ctx.sync_calls.join(tuning, on=["tid", "start_ns"], how="anti")
        if tuning.height
        else ctx.sync_calls
    )
    syncs = (
        iv.clip(iv.union(sync_calls), ctx.window_start_ns, ctx.window_end_ns)
        if sync_calls.height
        else sync_calls.select("start_ns", "end_ns")
    )
    not_setup = ~pl.col("name").str.contains(COMM_SETUP_PATTERN)
    comm_rows = ctx.rows(
        HOST_OP_KINDS, COMM_HOST_PATTERN, where=not_setup, columns=("start_ns", "end_ns")
    )
    comm = _clipped(ctx, comm_rows)
    # communicator setup is one-time, as a module load is
    comm_setup = ctx.rows(HOST_OP_KINDS, COMM_SETUP_PATTERN)
    if comm_setup.height:
        once = pl.concat(
            [
                once,
                comm_setup.select(once.columns[:-1]).with_columns(
                    pl.lit("comm_setup").alias("kind")
                ),
            ]
        )
    launch = host_ranges(ctx, LAUNCH_API, host)
    torch_ops = _launching_ops(ctx)
    profiler = _profiler_ranges(ctx)
    pageable = _pageable_copy_calls(ctx)
    warmup = _clipped(ctx, once)
    allocator = _clipped(ctx, allocs)
    capture = capture_ranges(ctx)
    migrating = _between_migrations(ctx, gaps)

    gaps = gaps.with_columns(
        migrating,
        _overlap_frac(gaps, dataloader, "f_dataloader"),
        _overlap_frac(gaps, syncs, "f_sync"),
        _overlap_frac(gaps, comm, "f_comm"),
        _overlap_frac(gaps, launch, "f_launch"),
        _overlap_frac(gaps, torch_ops, "f_ops"),
        _overlap_frac(gaps, profiler, "f_profiler"),
        _overlap_frac(gaps, pageable, "f_pageable"),
        _overlap_frac(gaps, warmup, "f_warmup"),
        _overlap_frac(gaps, _clipped(ctx, once.filter(pl.col("kind") == "load")), "f_load"),
        _overlap_frac(gaps, allocator, "f_allocator"),
        _overlap_frac(gaps, capture, "f_capture"),
    )
    # Was a blocking sync (or an op that performs one, like aten::item launching its copy) in
    # progress when the GPU ran dry? Then the queue was empty because of the sync.
    sync_scope = _sync_op_ranges(ctx, syncs, sync_calls)
    at_start = gaps.select(pl.col("start_ns"), (pl.col("start_ns") + 1).alias("end_ns"))
    gaps = gaps.with_columns(
        (iv.overlap_with(at_start, sync_scope) > 0).alias("sync_at_start")
        if sync_scope.height
        else pl.lit(False).alias("sync_at_start")
    )
    # the gap's time outside every sync and the op around it: the host at other work
    gaps = gaps.with_columns(
        (
            pl.col("dur_ns")
            - (iv.overlap_with(gaps, sync_scope) if sync_scope.height else pl.lit(0))
        ).alias("unsynced_ns")
    )
    gaps = gaps.hstack(_next_launch(ctx, gaps))
    untraced = ctx.rows(host).height == 0  # no API call anywhere: no gap's launch is known
    # the next work was queued while the GPU stayed idle for most of the gap (longer than a
    # launch's latency): it waited on a dependency, not on the host. Queued once its launching
    # call had returned: a pageable copy's call stages the data before its copy can run, so
    # the host's call, not a dependency, kept the GPU waiting
    queued_long = (
        pl.col("next_launch_ns").is_not_null()
        & (pl.col("dur_ns") > QUEUED_MIN_NS)
        & (
            (pl.col("end_ns") - pl.max_horizontal("next_launch_ns", "next_launch_end_ns"))
            > pl.max_horizontal(pl.lit(QUEUED_MIN_NS), pl.col("dur_ns") * MAJORITY)
        )
    )
    # however short: its call had returned before the GPU ran dry, so the queue never drained
    # and no host work explains the gap (audit s58: an MI300X micro-benchmark's 21-44 us gaps
    # between ten kernels queued 0.35-1.4 ms ahead read as a sync's, MEDIUM)
    queued_before = queued_long | (
        pl.col("next_launch_end_ns").is_not_null()  # (no launch: False, not null)
        & (pl.col("next_launch_end_ns") <= pl.col("start_ns"))
    )
    # a host-synchronous copy's call that began long before its copy could have been staged
    # waited on its stream: the stream held work the trace does not show (recording began
    # mid-queue) or a dependency, not the host's staging of the bytes (audit 16: a V100
    # ResNet's first upload called 36.4 ms before its 3.5 ms copy ran, nothing recorded ahead;
    # its 44 ms lead-in read as pageable_copy idle). Staging takes about the copy's own time.
    waited_in_call = (
        pl.col("next_copy").fill_null(False)
        # begun inside the gap: one begun before waited on recorded work until the gap began,
        # then woke and staged (a synchronous copy called under a kernel starts 150 us after it)
        & (pl.col("next_launch_ns") >= pl.col("start_ns"))
        & (pl.col("next_launch_end_ns") > pl.col("end_ns"))
        & (pl.col("dur_ns") > QUEUED_MIN_NS)
        & (
            pl.col("end_ns") - pl.col("next_launch_ns") - STAGING_RATIO * pl.col("next_dur_ns")
            > pl.max_horizontal(pl.lit(QUEUED_MIN_NS), pl.col("dur_ns") * MAJORITY)
        )
    )
    # one column, not the expression repeated in each branch of the cause below
    gaps = gaps.with_columns(
        (queued_before | waited_in_call).alias("_queued"),
        # queued longer than a launch's latency before the gap ended: a wait (a short gap
        # after a call returned is the device's own between queued work)
        (queued_long | waited_in_call).alias("_queued_wait"),
    )
    queued_before = pl.col("_queued")
    # the next work's launch call still running when the GPU ran dry, through most of the
    # gap: the device waited for that call (audit 23: an MTIA rank's ~320 us submit calls,
    # each kernel starting 65 us before its call returned, 603 ms of such gaps read as a
    # dependency's wait); a call that returned early in the gap left the rest to the device
    in_call = (pl.col("next_launch_ns") < pl.col("start_ns")) & (
        pl.col("next_launch_end_ns") - pl.col("start_ns") >= MAJORITY * pl.col("dur_ns")
    )
    begun_in_gap = (
        pl.col("next_launch_ns").is_not_null()
        & (pl.col("next_launch_ns") >= pl.col("start_ns"))
        & ~queued_before
    )
    launched_late = begun_in_gap | (
        pl.col("next_launch_ns").is_not_null() & in_call & ~queued_before
    )
    # queued work whose launch was its kernel's slow first one (the module loaded lazily): the
    # device waited for that load, a one-time cost, not for another stream (a vecAdd's only
    # kernel started 1.1 ms after its 1.04 ms first launch returned)
    first_launches = once.filter(pl.col("kind") == "first_launch").get_column("start_ns")
    after_first = pl.col("_queued_wait") & pl.col("next_launch_ns").is_in(first_launches.implode())
    # a module loaded in the gap for the work after it, launched for the first time: the host
    # compiled or loaded that kernel (audit 13: CuPy's JIT kernels in an A100 export, a 0.25 ms
    # cuModuleLoadData in each 0.77-2.06 ms gap before a new kernel's only launch, read as
    # steady cpu_work "outside any recorded op")
    loaded = gaps.select((pl.col("f_load") > 0).any()).item()  # the first launches only then
    loaded_for_first = (
        (pl.col("f_load") > 0)
        & pl.col("next_launch_ns").is_in(
            _first_launches(ctx).get_column("launch_start_ns").implode()
        )
        if loaded
        else pl.lit(False)
    )
    in_launch = pl.col("f_launch") >= MAJORITY
    if torch_ops.height:
        # (the dispatch cap from gaps whose launch began in them, as measured)
        in_ops = begun_in_gap & (pl.col("f_ops") >= MAJORITY)
        typical = gaps.filter(in_ops).get_column("dur_ns").median()
        cap = max(MIN_DISPATCH_CAP_NS, DISPATCH_CAP_RATIO * float(typical or 0))
        dispatching = in_launch | ((pl.col("f_ops") >= MAJORITY) & (pl.col("dur_ns") <= cap))
    else:
        dispatching = in_launch | (pl.col("dur_ns") <= UNSPLIT_LAUNCH_GAP_NS)
    # what the host did explains a gap only where the next work was not queued before it
    # (below): queued work that the GPU did not start waited on a dependency while the host's
    # call waited with it (an HTA trace: a memset of a CUDA graph launched 66 ms before a 64 ms
    # gap, the host in a 704-byte pageable read-back and in the profiler's closing sync)
    cause = (
        pl.when((pl.col("f_profiler") >= MAJORITY) & ~queued_before)
        .then(_cause("profiler"))
        .when(pl.col("f_capture") >= MAJORITY)
        .then(_cause("capture"))
        .when(pl.col("f_dataloader") >= MAJORITY)
        .then(_cause("dataloader"))
        .when((pl.col("f_warmup") >= MAJORITY) | after_first | loaded_for_first)
        .then(_cause("warmup"))
        # between two unified-memory migrations: pages moved on demand (faults), the GPU
        # idle while the host touched managed memory
        .when(pl.col("between_migrations") & ~queued_before)
        .then(_cause("unified_memory"))
        .when((pl.col("f_pageable") >= MAJORITY) & ~queued_before)
        .then(_cause("pageable_copy"))
        .when((pl.col("f_allocator") >= MAJORITY) & ~queued_before)
        .then(_cause("allocator"))
        # a sync explains a gap only where the host launched the next work after the GPU went
        # idle: work queued before the gap waited on a dependency (another stream, an event
        # recorded outside the trace), not on the host
        .when((pl.col("sync_at_start") | (pl.col("f_sync") >= MAJORITY)) & ~queued_before)
        .then(_cause("host_sync"))
        .when(pl.col("f_comm") >= MAJORITY)
        .then(_cause("communication"))
        .when(launched_late & dispatching)
        .then(_cause("launch_overhead"))
        .when(pl.lit(untraced))
        .then(_cause("host_untraced"))
        .when(launched_late | pl.col("next_launch_ns").is_null())
        .then(_cause("cpu_work"))
        .otherwise(_cause("gpu_wait"))
    )
    gaps = gaps.with_columns(cause.cast(pl.String).alias("cause"))
    # Only the reported (longest) segments name their host op; the join is per gap, so skip
    # the hundreds of thousands of short gaps a long trace has.
    ops = dominant_ops(ctx, top_gaps(gaps))
    return join_beside(gaps, ops, ["gap_id"])  # ops: one row per reported gap


def _clipped(ctx: Context, calls: pl.DataFrame) -> pl.DataFrame:
    if calls.height == 0:
        return pl.DataFrame(schema={"start_ns": pl.Int64, "end_ns": pl.Int64})
    return iv.clip(
        iv.union(calls.select("start_ns", "end_ns")), ctx.window_start_ns, ctx.window_end_ns
    )


def _cold(ctx: Context, gaps: pl.DataFrame, once: pl.DataFrame) -> bool:
    """The window is a cold pass: after its first step (a first step is often cold; the rest
    are what the window is for), one-time costs cover most of the idle, or streams or
    contexts are created or modules loaded (a steady loop does neither; events it may create
    every step, for timing)."""
    lo = ctx.window_start_ns
    if ctx.steps.height >= 2:
        lo = int(ctx.steps.get_column("start_ns").sort()[1])
    rest = gaps.filter(pl.col("end_ns") > lo).with_columns(
        (pl.col("end_ns") - pl.max_horizontal("start_ns", pl.lit(lo))).alias("_in")
    )
    idle = int(rest.get_column("_in").sum()) if rest.height else 0
    # A CUDA graph's capture is a first pass too (once per shape, before its replays), where
    # the window holds one step or none: with steps after the first, a capture in them would be
    # the loop's own (SGLang's decode capture: one range, its idle all capture, its two frees
    # the capture's own empty_cache, read as allocator churn)
    once_causes = ["warmup", "capture"] if ctx.steps.height <= 1 else ["warmup"]
    warm = (
        int(rest.filter(pl.col("cause").is_in(once_causes)).get_column("_in").sum()) if idle else 0
    )
    setup = once.filter(
        (pl.col("start_ns") >= lo)
        & ((pl.col("kind") == "load") | pl.col("name").str.contains(r"StreamCreate|CtxCreate"))
    )
    return setup.height >= COLD_CREATIONS_MIN or (idle > 0 and warm >= COLD_IDLE_MIN_RATIO * idle)


def churning(ctx: Context, allocs: pl.DataFrame) -> bool:
    """The window's allocator calls give memory back and ask for it again (frees at least
    :data:`CHURN_FREE_MIN_RATIO` of the mallocs), or keep allocating all through the window
    (:data:`CHURN_STEADY_MIN_MALLOCS`), rather than fill the cache once."""
    lo, hi = ctx.window_start_ns, ctx.window_end_ns
    inside = allocs.filter(iv.overlapping(lo, hi))
    if inside.height == 0:
        return False
    is_free = pl.col("name").str.contains("Free")
    frees = inside.filter(is_free).height
    if frees >= CHURN_FREE_MIN_RATIO * (inside.height - frees):
        return True
    mallocs = inside.filter(~is_free)
    if mallocs.height < CHURN_STEADY_MIN_MALLOCS or hi <= lo:
        return False
    quarter = ((pl.col("start_ns").clip(lo, hi - 1) - lo) * 4 // (hi - lo)).alias("q")
    per = mallocs.select(quarter).get_column("q").value_counts()
    least = per.get_column("count").min() if per.height == 4 else 0
    return least >= CHURN_STEADY_MIN_SHARE * mallocs.height


def _as_slow_as_a_load(usual: str) -> pl.Expr:
    """A call that took as long as loading a module: at least :data:`WARMUP_LAUNCH_MIN_NS` and
    :data:`WARMUP_LAUNCH_FACTOR` times its thread's ``usual`` call (at most
    :data:`WARM_LAUNCH_MAX_NS`)."""
    return (pl.col("dur_ns") >= WARMUP_LAUNCH_MIN_NS) & (
        pl.col("dur_ns")
        >= WARMUP_LAUNCH_FACTOR * pl.min_horizontal(usual, pl.lit(WARM_LAUNCH_MAX_NS))
    )


def _first_launches(ctx: Context) -> pl.DataFrame:
    """Each kernel's (by name) first launch in the trace: name, launch_start_ns, launch_tid."""
    return (
        launched(ctx.launches, ["name", "launch_start_ns", "launch_tid"])
        .group_by("name")
        .agg(pl.col("launch_start_ns").min(), pl.col("launch_tid").first())
    )


def warmup_calls(ctx: Context) -> pl.DataFrame:
    """The host's one-time calls (name, start_ns, end_ns, dur_ns, kind): each kernel's first
    launch where it is far slower than its thread's usual launch (:data:`WARMUP_LAUNCH_MIN_NS`,
    :data:`WARMUP_LAUNCH_FACTOR`), module and library loads, stream, event and context
    creation, and torch.compile's compilation ranges. Worked out once per trace."""
    return ctx.host.derived("warmup_calls", lambda: _warmup_calls(ctx))


def _warmup_calls(ctx: Context) -> pl.DataFrame:
    cols = ["name", "start_ns", "end_ns", "dur_ns", "tid"]
    calls = ctx.rows(API_KINDS)
    once = ctx.rows(API_KINDS, WARMUP_API)
    loads = once.select(
        *cols,
        pl.when(name_matches(once, r"Create|Retain|Init$"))
        .then(pl.lit("create"))
        .otherwise(pl.lit("load"))
        .alias("kind"),
    )
    compiling = ctx.rows(HOST_OP_KINDS, COMPILE_PATTERN)
    compiling = compiling.select(*cols, pl.lit("compile").alias("kind"))
    launches = ctx.rows(
        API_KINDS,
        LAUNCH_API,
        where=~ctx.name_matches(API_KINDS, COPY_LAUNCH_API),
        columns=tuple(cols),
    )
    first = pl.DataFrame(schema={**{c: calls.schema[c] for c in cols}, "kind": pl.String})
    if launches.height:
        typical = launches.group_by("tid").agg(pl.col("dur_ns").median().alias("_med"))
        slow = launches.join(typical, on="tid", how="left").filter(_as_slow_as_a_load("_med"))
        if slow.height:
            # its kernel's first launch in the trace (a launch whose work is unknown counts)
            firsts = _first_launches(ctx)
            # the launches at the slow calls' starts only (a few), not every launch's key
            # deduplicated (0.37 s a rank of the 1 GB nsys export)
            at = slow.get_column("start_ns").unique().implode()
            known = launched(ctx.launches, ["launch_start_ns", "launch_tid"]).filter(
                pl.col("launch_start_ns").is_in(at)
            )
            is_first = slow.join(
                firsts.select(
                    pl.col("launch_start_ns").alias("start_ns"),
                    pl.col("launch_tid").alias("tid"),
                    pl.lit(True).alias("_first"),
                ).unique(["start_ns", "tid"]),
                on=["start_ns", "tid"],
                how="left",
            ).join(
                known.select(
                    pl.col("launch_start_ns").alias("start_ns"),
                    pl.col("launch_tid").alias("tid"),
                    pl.lit(True).alias("_known"),
                ).unique(["start_ns", "tid"]),
                on=["start_ns", "tid"],
                how="left",
            )
            first = is_first.filter(
                pl.col("_first").fill_null(False) | pl.col("_known").is_null()
            ).select(*cols, pl.lit("first_launch").alias("kind"))
    # a function attribute query as slow as a first launch loaded the function's module
    queries = ctx.rows(API_KINDS, FUNC_ATTRIBUTE_API, columns=tuple(cols))
    if queries.height:  # the thread's usual call only where there is a query to judge
        usual = calls.group_by("tid").agg(pl.col("dur_ns").median().alias("_med"))
        queries = queries.join(usual, on="tid", how="left").filter(_as_slow_as_a_load("_med"))
    queries = queries.select(*cols, pl.lit("load").alias("kind"))
    tuning = autotune_syncs(ctx).select(*cols, pl.lit("autotune").alias("kind"))
    slow_firsts = _slow_first_calls(ctx, cols).with_columns(pl.lit("first_call").alias("kind"))
    # the driver loading a module or JIT compiling (its overhead rows; a function's lazy load
    # recurs with new kernels: not one-time)
    loading = ctx.rows(("overhead",), CUDA_LOADING_OVERHEAD, columns=tuple(cols))
    loading = loading.select(*cols, pl.lit("load").alias("kind"))
    # nsys may record a call twice, nested (cudaLaunchKernel around cudaLaunchKernel_v7000)
    return (
        pl.concat([loads, compiling, first, queries, tuning, loading, slow_firsts])
        .unique(["tid", "start_ns"])
        .sort("start_ns")
    )


def _slow_first_calls(ctx: Context, cols: list[str]) -> pl.DataFrame:
    """Host ops whose first call in the trace was far slower than every later one
    (:data:`FIRST_CALL_MIN_CALLS`, :data:`FIRST_CALL_FACTOR`), outermost on their thread, in
    ``cols``. Only in a window without steps: a stepped capture starts after its warm-up
    steps, where a lone slow call is a pause (a collection, the OS: nanoGPT's one aten::mul
    of 2.1 ms in 3 steps against 27 us), not set-up. A first call that holds a blocking sync,
    and a collective's or the loader's, is left out: those wait (on the GPU's queue, the
    other ranks, the workers) by different amounts call by call."""
    ops = ctx.ops
    empty = ops.head(0).select(cols)
    if ctx.steps.height:
        return empty
    # only names with a call as slow as a module load can qualify: a scan, then a few names
    long = (
        ops.lazy()
        .filter(pl.col("dur_ns") >= WARMUP_LAUNCH_MIN_NS)
        .select(pl.col("name").unique())
        .collect()
        .get_column("name")
    )
    if long.len() == 0:
        return empty
    # nor an optimizer step's range: slow the first time for the first calls it holds (audit
    # s62: sqrt's 15 ms module load), which are the one-time cost, not the step around them
    long = long.filter(
        ~long.str.contains(f"{COMM_HOST_PATTERN}|{DATALOADER_PATTERN}|{OPTIMIZER_PATTERN}")
    )
    if long.len() == 0:
        return empty
    if not ops.get_column("start_ns").is_sorted():
        ops = ops.sort("start_ns")  # the event table is in time order; a frame made otherwise
    # each such name's first call, where it is as slow as a load; then, for those names only,
    # the count and the two longest calls (no sort or group of every call: 1.7M calls of the
    # long names on a rank of the 1 GB export)
    firsts = (
        ops.lazy()
        .filter(pl.col("name").is_in(long.implode()))
        .filter(pl.col("name").is_first_distinct())
        .filter(pl.col("dur_ns") >= WARMUP_LAUNCH_MIN_NS)
        .select(cols)
        .collect()
    )
    if firsts.height == 0:
        return empty
    top2 = pl.col("dur_ns").top_k(2)
    counts = (
        ops.lazy()
        .filter(pl.col("name").is_in(firsts.get_column("name").implode()))
        .group_by("name")
        .agg(pl.len().alias("_n"), top2.first().alias("_top"), top2.last().alias("_second"))
        .collect()
    )
    # the slowest later call: the second longest where the first call is the longest
    later = pl.when(pl.col("dur_ns") == pl.col("_top")).then("_second").otherwise("_top")
    by_name = (
        firsts.join(counts, on="name")
        .filter(
            (pl.col("_n") >= FIRST_CALL_MIN_CALLS) & (pl.col("dur_ns") >= FIRST_CALL_FACTOR * later)
        )
        .select(cols)
    )
    if by_name.height == 0:
        return empty
    if ctx.sync_calls.height:
        waits = calls_inside(ctx.sync_calls.select("start_ns", "end_ns", "tid"), by_name)
        by_name = by_name.join(
            waits.select(pl.col("c_s").alias("start_ns"), pl.col("c_tid").alias("tid")),
            on=["start_ns", "tid"],
            how="anti",
        )
    return outermost(by_name).select(cols)


def capture_ranges(ctx: Context) -> pl.DataFrame:
    """Graph captures in the window: each thread's begin-capture call to its next end-capture
    call, and the annotations frameworks put around a capture (start_ns, end_ns)."""
    calls = ctx.rows(
        API_KINDS,
        f"{CAPTURE_BEGIN_API}|{CAPTURE_END_API}",
        columns=("name", "tid", "start_ns", "end_ns"),
    )
    spans = pl.concat(
        [
            capture_spans(calls, ["tid"]).drop_nulls("end_ns").select("start_ns", "end_ns"),
            ctx.rows(("user_annotation", "cpu_op"), CAPTURE_ANNOTATION).select(
                "start_ns", "end_ns"
            ),
            ctx.rows(("python_function",), CUDAGRAPH_RECORD_FRAME).select("start_ns", "end_ns"),
        ]
    )
    return _clipped(ctx, spans)


def _next_launch(ctx: Context, gaps: pl.DataFrame) -> pl.DataFrame:
    """For each gap (in ``gaps`` order), when the work that ends it was launched: the earliest
    launch call of the activities starting at the gap's end on its device (``next_launch_ns``)
    and when that call returned (``next_launch_end_ns``).

    Per device, both sides are in time order (gaps from :func:`iv.gaps`, the launches from the
    sorted event table), so a forward as-of join on the distinct start times finds them: a
    fifth of the cost of a group-by and hash join over (device, time) pairs."""
    calls = launched(
        ctx.launches,
        [
            "device",
            "start_ns",
            "launch_start_ns",
            "launch_end_ns",
            (pl.col("kind") == "memcpy").alias("_copy"),
            "dur_ns",
        ],
    )
    ends = gaps.select("gap_id", "device", "end_ns")
    parts = []
    for (dev,), g in ends.partition_by("device", as_dict=True, maintain_order=True).items():
        on_dev = calls.filter(pl.col("device").eq_missing(dev))
        starts = on_dev.get_column("start_ns")
        if starts.is_sorted() and not (starts.diff() == 0).any():
            # no two activities start at one time (the usual case): each is its own first,
            # and the group-by below (0.15 s a call on a 1 GB export) has nothing to pick
            first = on_dev.select("start_ns", "launch_start_ns", "launch_end_ns", "_copy", "dur_ns")
        else:
            first = on_dev.group_by("start_ns", maintain_order=True).agg(
                # the earliest launching call's row: one sort for its four columns
                pl.col("launch_start_ns", "launch_end_ns", "_copy", "dur_ns")
                .sort_by("launch_start_ns")
                .first()
            )
        first = first.rename(
            {
                "start_ns": "_at",
                "launch_start_ns": "next_launch_ns",
                "launch_end_ns": "_end",
                "dur_ns": "_dur",
            }
        )
        hit = iv.in_time_order(g, "end_ns").join_asof(
            iv.in_time_order(first, "_at"), left_on="end_ns", right_on="_at", strategy="forward"
        )
        at = pl.col("_at") == pl.col("end_ns")
        parts.append(
            hit.select(
                "gap_id",
                pl.when(at).then(pl.col("next_launch_ns")).alias("next_launch_ns"),
                pl.when(at).then(pl.col("_end")).alias("next_launch_end_ns"),
                pl.when(at).then(pl.col("_copy")).alias("next_copy"),
                pl.when(at).then(pl.col("_dur")).alias("next_dur_ns"),
            )
        )
    names = ("next_launch_ns", "next_launch_end_ns", "next_copy", "next_dur_ns")
    if not parts:
        types = (pl.Int64, pl.Int64, pl.Boolean, pl.Int64)
        return pl.DataFrame(
            {n: [None] * gaps.height for n in names}, schema=dict(zip(names, types, strict=True))
        )
    out = pl.concat(parts)
    if not out.get_column("gap_id").equals(gaps.get_column("gap_id")):
        out = gaps.select("gap_id").join(out, on="gap_id", how="left", maintain_order="left")
    return out.select(names)


def _sync_op_ranges(ctx: Context, syncs: pl.DataFrame, sync_calls: pl.DataFrame) -> pl.DataFrame:
    """Sync calls plus the innermost host op around each (``aten::_local_scalar_dense``...);
    ``syncs``: the calls' union, ``sync_calls``: the calls."""
    calls = sync_calls.select(
        pl.col("start_ns").alias("c_s"), pl.col("end_ns").alias("c_e"), pl.col("tid").alias("c_tid")
    )
    if calls.height == 0:
        return syncs
    ops = ctx.rows(("cpu_op",), r"^aten::", columns=("start_ns", "end_ns", "tid"))
    inner = (
        iv.containing(
            calls,
            ops,
            inner_start="c_s",
            inner_end="c_e",
            outer_start="start_ns",
            outer_end="end_ns",
            same=("tid", "c_tid"),
        )
        .sort("start_ns", descending=True)
        .unique(subset=["c_s", "c_tid"], keep="first")  # the innermost enclosing op per call
        .select("start_ns", "end_ns")
    )
    both = pl.concat([syncs.select("start_ns", "end_ns"), inner])
    return iv.clip(iv.union(both), ctx.window_start_ns, ctx.window_end_ns) if both.height else syncs


def _timeline(ctx: Context, busy: pl.DataFrame, gaps: pl.DataFrame) -> dict[str, Any]:
    """Busy fraction per bin and per device, plus the idle time per cause per bin (bounded size)."""
    lo, hi = ctx.window_start_ns, ctx.window_end_ns
    bins = TIMELINE_BINS
    width = max(1, -(-(hi - lo) // bins))
    edges = pl.DataFrame(
        {
            "bin": list(range(bins)),
            "start_ns": [lo + i * width for i in range(bins)],
            "end_ns": [lo + (i + 1) * width for i in range(bins)],
        }
    )
    out: dict[str, Any] = {"start_ns": lo, "bin_ns": width, "bins": bins, "devices": {}}
    for dev in ctx.devices:
        u = busy.filter(pl.col("device") == dev).select("start_ns", "end_ns")
        cov = iv.overlap_with(edges, u)
        busy_frac = [round(v / width, 4) for v in cov.to_list()]
        causes: dict[str, list[float]] = {}
        g = (
            gaps.select("device", "cause", "start_ns", "end_ns")
            .filter(pl.col("device") == dev)
            .drop("device")
        )
        by_cause = {
            str(k[0]): part.drop("cause")
            for k, part in g.partition_by("cause", as_dict=True).items()
        }
        for cause in CAUSES:  # in CAUSES order, as before
            cg = by_cause.get(cause)
            if cg is not None and cg.height:
                causes[cause] = [round(v / width, 4) for v in iv.overlap_with(edges, cg).to_list()]
        out["devices"][str(dev)] = {"busy": busy_frac, "idle_by_cause": causes}
    return out
