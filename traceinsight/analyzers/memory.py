"""Device memory: peaks, headroom, fragmentation, growth across steps, allocator calls per step,
the allocations never freed and what a larger batch would do (a ``DERIVED`` analyzer: the batch
prediction replays the causal step model).

Reads the memory side table (``Trace.memory``: one row per allocator event with the allocator's
totals after it), the host ops (which op allocated), ``op_args`` (its input shapes) and the
runtime calls (``cudaMalloc``/``cudaFree``). Everything is per device, vectorized: memory events
can number millions, so they are only sorted, joined as-of and grouped, never looped over.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import polars as pl

from traceinsight.analyzers.context import Context
from traceinsight.analyzers.replay import ReplayResult
from traceinsight.causal import transforms as whatif
from traceinsight.causal.build import steady_steps as steady
from traceinsight.causal.whatif import WhatIf, power_of_two_at_most
from traceinsight.model.classify import (
    ALLOCATOR_API,
    API_KINDS,
    DEVICE_ALLOC_API,
    DEVICE_FREE_API,
    HOST_OP_KINDS,
    PINNED_HOST_ALLOC_API,
)
from traceinsight.model.schema import MEMORY_CATEGORIES, by_start

# Factory ops allocate on behalf of the op around them: an allocation is charged to that op.
FACTORY_OPS = r"^aten::(empty|empty_strided|empty_like|new_empty|new_empty_strided|resize_)$"
FIT_RATIO = 0.8  # a larger batch must fit in this share of device memory (allocator slack)
TIMELINE_POINTS = 600  # buckets of the report's timeline per device (max of each bucket)
MAX_MULTIPLIER = 64  # the largest batch multiplier predicted
GAIN_TABLE_MAX_NODES = 200_000  # model nodes up to which 2x, 4x, 8x are replayed too
# a further doubling of the recommended batch is advised where it gains a quarter more per
# sample, even at the estimate's low end (_doublings)
DOUBLING_MIN_GAIN = 1.25
TOP_N = 8
THEIL_SEN_POINTS = 200  # step boundaries the growth slope is fitted on, at most


@dataclass(frozen=True)
class OpBytes:
    """An op's allocations live at the allocated peak: their bytes and how many."""

    op: str | None
    bytes: int
    allocations: int


@dataclass(frozen=True)
class NeverFreed:
    """Allocations never freed in the steady steps, by op and input shapes: bytes per step."""

    op: str | None
    input_dims: str | None
    count: int
    bytes_per_step: float


@dataclass(frozen=True)
class DeviceMemory:
    device: int
    events: int
    peak_allocated_bytes: int | None
    peak_reserved_bytes: int | None
    device_memory_bytes: int | None
    headroom_ratio: float | None  # 1 - peak reserved / device memory
    fragmentation_ratio: float | None  # 1 - (most allocated while reserved at its peak) / peak
    growth_bytes_per_step: float | None  # Theil-Sen slope of allocated at steady step boundaries
    growth_consistency_ratio: float | None  # share of step-to-step changes with the slope's sign
    boundary_allocated_bytes: tuple[int, ...]  # allocated at each steady step's start, last's end
    base_allocated_bytes: int | None  # the median of those: weights, optimizer state, kept tensors
    step_span_bytes: int | None  # median per step of (step's peak - its start): activations
    peak_ns: int | None  # when allocated memory peaked (trace time)
    peak_op: str | None  # the host op allocating then
    peak_root_op: str | None  # the outermost op around it (an autograd node, a module's op)
    top_ops_at_peak: tuple[OpBytes, ...]  # most bytes live at the peak first
    never_freed: tuple[NeverFreed, ...]  # most bytes first
    never_freed_bytes_per_step: float | None
    steps_until_full: float | None  # (device memory - peak allocated) / growth per step
    # bytes live per category at the allocated peak (MEMORY_CATEGORIES, in their order): the
    # events' bytes summed up to the peak; None where the source has no categories (Kineto, nsys)
    peak_by_category_bytes: dict[str, int] | None
    # start_ns (the window's), t_ns (from it), allocated_bytes, reserved_bytes: bucket maxima
    timeline: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class BatchGain:
    """The replayed step at ``multiplier`` x the batch (``step_time_after_ns``, for the larger
    batch) against today's (``step_time_ns``), and the throughput gain per sample."""

    multiplier: int
    step_time_ns: int
    step_time_after_ns: int
    throughput_gain: float


@dataclass(frozen=True)
class MemoryResult:
    has_memory: bool  # the trace has device memory events
    devices: tuple[DeviceMemory, ...]
    steady_steps: tuple[int, ...]  # the steps the per-step numbers are over
    allocator_device_allocs_per_step: float | None
    allocator_device_frees_per_step: float | None
    allocator_calls_ns_per_step: float | None  # host time inside those calls
    empty_cache_calls_per_step: float | None  # named empty_cache ranges (with_stack traces)
    # cudaFree outside any op: the cache released between ops, as empty_cache() does (a free
    # inside an op is the allocator freeing cached blocks to retry a failed cudaMalloc)
    frees_outside_ops_per_step: float | None
    step_time_median_ns: float | None
    gpu_busy_ns_per_step: float | None
    # the larger batch: multiplier fitting in FIT_RATIO of device memory, the one at which the GPU
    # would be busy all step, and the replay's throughput gain per multiplier (None: no model)
    fit_multiplier: int | None
    saturation_multiplier: float | None
    # the largest power of 2 within both, raised by each further doubling that fits and gains
    # DOUBLING_MIN_GAIN at the estimate's low end
    recommended_multiplier: int | None
    batch_gains: tuple[BatchGain, ...]  # by multiplier, ascending (empty: none replayed)
    churn_what_if: WhatIf | None  # the allocator calls and their syncs removed
    why_no_estimate: str | None  # why the what-ifs are missing
    # the device allocator's calls in the whole window and their host time (with or without
    # steps: a trace without steps is judged on these)
    window_allocator_calls: int = 0
    window_allocator_ns: int = 0
    # pinned host memory's (cudaHostAlloc/cudaMallocHost/cudaFreeHost): the idle cause
    # ``allocator`` counts them too, a fix of their own (allocate once, reuse)
    window_pinned_host_calls: int = 0
    window_pinned_host_ns: int = 0
    # the runtime the allocator calls went through, for their names in the findings: "hip"
    # where most are hipMalloc/hipFree (a ROCm run), else "cuda"
    allocator_api: str = "cuda"

    def metric(self, name: str) -> Any:
        """A per-device number: plain for one device, {device: value} for several, None
        without memory events."""
        if not self.devices:
            return None
        if len(self.devices) == 1:
            return getattr(self.devices[0], name)
        return {str(d.device): getattr(d, name) for d in self.devices}

    def gain(self, multiplier: int | None) -> BatchGain | None:
        return next((g for g in self.batch_gains if g.multiplier == multiplier), None)

    def headroom_what_if(self) -> tuple[WhatIf | None, str | None]:
        """The larger batch's what-if in the findings' terms: step_time_after_ns is the time
        per original batch's samples (the replayed step at ``multiplier`` x the batch, divided
        by it), so speedup is the throughput gain; None with the reason where there is none."""
        m = self.recommended_multiplier
        gain = self.gain(m)
        if gain is None or not m:
            return None, self.why_no_estimate or "no larger batch replayed (the GPU is busy)"
        w = WhatIf.larger_batch(
            gain.step_time_ns, gain.step_time_after_ns, m, whatif.gpu_work_scaled(float(m))
        )
        return w, None

    @property
    def peak(self) -> DeviceMemory | None:
        """The device with the largest allocated peak."""
        return max(self.devices, key=lambda d: d.peak_allocated_bytes or 0, default=None)


def steady_steps(ctx: Context) -> pl.DataFrame:
    """The steps the per-step numbers are over: the window's steady steps (causal/build.py
    :func:`~traceinsight.causal.build.steady_steps`, the step model's notion too)."""
    return steady(ctx.steps)


def _per_step_calls(ctx: Context, steps: pl.DataFrame, pattern: str) -> pl.DataFrame:
    """The calls matching ``pattern`` inside ``steps`` (host step start to the step's end)."""
    calls = ctx.rows(API_KINDS, pattern)
    if calls.height == 0 or steps.height == 0:
        return calls.clear()
    bounds = steps.select(pl.col("host_start_ns").alias("_s"), pl.col("end_ns").alias("_e"))
    return (
        calls.sort("start_ns")
        .join_asof(bounds.sort("_s"), left_on="start_ns", right_on="_s")
        .filter(pl.col("start_ns") < pl.col("_e"))
    )


def _outside_ops(ctx: Context, calls: pl.DataFrame) -> int:
    """How many of ``calls`` run inside no cpu_op on their thread."""
    if calls.height == 0:
        return 0
    ops = (
        ctx.rows(("cpu_op",), columns=("tid", "start_ns", "end_ns"))
        .select("tid", pl.col("start_ns").alias("_os"), pl.col("end_ns").alias("_oe"))
        .sort("_os")
    )
    # an op started earlier but still running encloses the call; the latest-started one may have
    # ended already while its parent still runs, so the running maximum of ends is what counts
    ops = ops.with_columns(pl.col("_oe").cum_max().over("tid"))
    j = calls.sort("start_ns").join_asof(
        ops, left_on="start_ns", right_on="_os", by="tid", check_sortedness=False
    )
    return int(
        j.select((pl.col("_oe").is_null() | (pl.col("_oe") < pl.col("start_ns"))).sum()).item()
    )


class _OpTables(NamedTuple):
    """What :func:`_alloc_ops` joins to, made once per trace (each device's rows use it)."""

    ops: pl.DataFrame  # cpu ops (factory ops left out) by start: tid, op, op_start_ns, op_end_ns
    shapes: pl.DataFrame | None  # op_args' input shapes by (tid, op_start_ns, op); None: none


def _op_tables(ctx: Context) -> _OpTables:
    ops = (
        ctx.rows(
            ("cpu_op",), FACTORY_OPS, negate=True, columns=("tid", "name", "start_ns", "end_ns")
        )
        .select(
            pl.col("tid"),
            pl.col("name").alias("op"),
            pl.col("start_ns").alias("op_start_ns"),
            pl.col("end_ns").alias("op_end_ns"),
        )
        .sort("op_start_ns")
    )
    args = ctx.op_args
    shapes = (
        args.select(
            "tid",
            pl.col("start_ns").alias("op_start_ns"),
            pl.col("name").alias("op"),
            pl.col("input_dims"),
        ).unique(["tid", "op_start_ns", "op"], keep="first")
        if args.height
        else None
    )
    return _OpTables(ops, shapes)


def _alloc_ops(tables: _OpTables, mem: pl.DataFrame) -> pl.DataFrame:
    """Each memory event with the host op allocating it: the latest-starting op on its thread
    still running at that time (factory ops skipped: they allocate for the op around them), and
    that op's input shapes (``op_args``)."""
    out = mem.sort("start_ns").join_asof(
        tables.ops, left_on="start_ns", right_on="op_start_ns", by="tid", check_sortedness=False
    )
    out = out.with_columns(
        pl.when(pl.col("op_end_ns") >= pl.col("start_ns")).then(pl.col("op")).alias("op")
    )
    if tables.shapes is not None:
        out = out.join(tables.shapes, on=["tid", "op_start_ns", "op"], how="left")
    else:
        out = out.with_columns(pl.lit(None, pl.String).alias("input_dims"))
    return out.with_columns(pl.col("op").fill_null("(no op)"))


def _root_op(ctx: Context, tid: int | None, t: int) -> str | None:
    """The outermost cpu_op running on ``tid`` at ``t`` (one that starts after every earlier
    op on the thread has ended is a root)."""
    if tid is None:
        return None
    mine = (pl.col("tid") == tid) & (pl.col("start_ns") <= t)
    ops = ctx.rows(("cpu_op",), where=mine, columns=("name", "start_ns", "end_ns")).sort("start_ns")
    roots = ops.filter(
        pl.col("end_ns").cum_max().shift(1).fill_null(-1) <= pl.col("start_ns")
    ).filter(pl.col("end_ns") >= t)
    return roots["name"][-1] if roots.height else None


def _theil_sen(y: pl.Series) -> tuple[float | None, float | None]:
    """Median of the pairwise slopes of ``y`` over its index (robust to a single odd step),
    and the share of consecutive changes with the slope's sign."""
    n = y.len()
    if n < 3:
        return None, None
    pts = pl.DataFrame({"i": pl.int_range(n, eager=True), "y": y.cast(pl.Float64)})
    if n > THEIL_SEN_POINTS:  # pairs grow as n^2: evenly spaced boundaries stand for the rest
        pts = pts.gather_every(-(-n // THEIL_SEN_POINTS))
    pairs = pts.join(pts, how="cross", suffix="_b").filter(pl.col("i_b") > pl.col("i"))
    slope = float(
        pairs.select(((pl.col("y_b") - pl.col("y")) / (pl.col("i_b") - pl.col("i"))).median())
        .to_series()
        .item()
    )
    diffs = y.cast(pl.Float64).diff().drop_nulls()
    sign = 1.0 if slope > 0 else -1.0 if slope < 0 else 0.0
    agree = float(((diffs * sign) > 0).mean()) if sign else 0.0
    return slope, agree


def _at(mem: pl.DataFrame, times: pl.Series, col: str) -> pl.Series:
    """``col`` of the last memory event at or before each time (None before the first)."""
    t = pl.DataFrame({"t": times.cast(pl.Int64)}).with_row_index("_i").sort("t")
    j = t.join_asof(mem.select("start_ns", col), left_on="t", right_on="start_ns")
    return j.sort("_i").get_column(col)


@dataclass(frozen=True)
class _Peaks:
    """The window's allocator peaks against the device's memory."""

    allocated_bytes: int | None
    reserved_bytes: int | None
    device_memory_bytes: int | None
    headroom_ratio: float | None
    fragmentation_ratio: float | None


def _peaks(win: pl.DataFrame, total: int | None) -> _Peaks:
    alloc = win.get_column("allocated_bytes").max()
    res = win.get_column("reserved_bytes").max()
    alloc = int(alloc) if alloc is not None else None
    res = int(res) if res is not None else None
    frag = None
    if res:
        most = win.filter(pl.col("reserved_bytes") == res).get_column("allocated_bytes").max()
        frag = 1 - int(most) / res if most is not None else None
    return _Peaks(
        allocated_bytes=alloc,
        reserved_bytes=res,
        device_memory_bytes=total,
        headroom_ratio=1 - res / total if total and res is not None else None,
        fragmentation_ratio=frag,
    )


@dataclass(frozen=True)
class _Growth:
    """Allocated memory across the steady steps."""

    boundary_allocated_bytes: tuple[int, ...]
    growth_bytes_per_step: float | None
    growth_consistency_ratio: float | None
    base_allocated_bytes: int | None
    step_span_bytes: int | None


def _growth(mem: pl.DataFrame, steady: pl.DataFrame) -> _Growth:
    # allocated at the steady steps' boundaries: each start, and the last one's host end
    boundary = pl.Series([], dtype=pl.Int64)
    if steady.height:
        bounds = pl.concat([steady["host_start_ns"], steady["host_end_ns"][-1:]])
        boundary = _at(mem, bounds, "allocated_bytes").drop_nulls()
    slope, agree = _theil_sen(boundary)
    return _Growth(
        boundary_allocated_bytes=tuple(int(v) for v in boundary),
        growth_bytes_per_step=slope,
        growth_consistency_ratio=agree,
        base_allocated_bytes=int(boundary.median()) if boundary.len() else None,
        step_span_bytes=_step_span(mem, steady),
    )


def _step_span(mem: pl.DataFrame, steady: pl.DataFrame) -> int | None:
    """The median over steady steps of (the step's allocated peak - allocated at its start)."""
    if steady.height == 0:
        return None
    tagged = mem.join_asof(
        steady.select(pl.col("host_start_ns").alias("_s"), pl.col("host_end_ns").alias("_e"))
        .sort("_s")
        .with_row_index("_k"),
        left_on="start_ns",
        right_on="_s",
    ).filter(pl.col("start_ns") < pl.col("_e"))
    if tagged.height == 0:
        return None
    per = tagged.group_by("_k").agg(pl.col("allocated_bytes").max().alias("_m"))
    starts = _at(mem, steady.get_column("host_start_ns"), "allocated_bytes")
    per = per.join(
        pl.DataFrame(
            {"_k": pl.int_range(steady.height, eager=True, dtype=pl.UInt32), "_b": starts}
        ),
        on="_k",
    )
    med = per.select((pl.col("_m") - pl.col("_b")).clip(0).median()).item()
    return int(med) if med is not None else None


@dataclass(frozen=True)
class _AtPeak:
    """What allocated the peak and what was live then; the allocations never freed."""

    peak_ns: int | None = None
    peak_op: str | None = None
    peak_root_op: str | None = None
    top_ops_at_peak: tuple[OpBytes, ...] = ()
    never_freed: tuple[NeverFreed, ...] = ()
    never_freed_bytes_per_step: float | None = None
    peak_by_category_bytes: dict[str, int] | None = None


def _allocations(mem: pl.DataFrame) -> pl.DataFrame:
    """Each allocation with its free: the first free at its address after it (an as-of join per
    address: no sort of the table by address). Events without an address (a memory timeline's
    tensors) pair with no free: left out."""
    frees = mem.filter(pl.col("bytes") < 0, pl.col("addr").is_not_null()).select(
        "addr", pl.col("start_ns").alias("_freed_ns")
    )
    return mem.filter(pl.col("bytes") > 0, pl.col("addr").is_not_null()).join_asof(
        frees,
        left_on="start_ns",
        right_on="_freed_ns",
        by="addr",
        strategy="forward",
        check_sortedness=False,
    )


def _live_at(tables: _OpTables, allocs: pl.DataFrame, t: int) -> tuple[OpBytes, ...]:
    """The ops whose allocations are live at ``t``, most bytes first (ops joined to those only)."""
    live = _alloc_ops(
        tables,
        allocs.filter(
            (pl.col("start_ns") <= t) & (pl.col("_freed_ns").is_null() | (pl.col("_freed_ns") > t))
        ),
    )
    return tuple(
        OpBytes(**r)
        for r in live.group_by("op")
        .agg(pl.col("bytes").sum().alias("bytes"), pl.len().alias("allocations"))
        .sort("bytes", "op", descending=[True, False])
        .head(TOP_N)
        .iter_rows(named=True)
    )


def _never_freed(
    tables: _OpTables, allocs: pl.DataFrame, steady: pl.DataFrame
) -> tuple[tuple[NeverFreed, ...], float | None]:
    """Allocations never freed, made in a steady step before the last (the last's tensors may
    simply outlive the recording), by op and shapes; their bytes per step."""
    if steady.height < 2:
        return (), None
    a, b = int(steady["host_start_ns"][0]), int(steady["host_start_ns"][-1])
    kept = _alloc_ops(
        tables,
        allocs.filter(
            pl.col("_freed_ns").is_null() & (pl.col("start_ns") >= a) & (pl.col("start_ns") < b)
        ),
    )
    n = steady.height - 1
    never = tuple(
        NeverFreed(**r)
        for r in kept.group_by("op", "input_dims")
        .agg(pl.col("bytes").sum().alias("_b"), pl.len().alias("count"))
        .with_columns((pl.col("_b") / n).alias("bytes_per_step"))
        .sort("_b", "op", descending=[True, False])
        .drop("_b")
        .head(TOP_N)
        .iter_rows(named=True)
    )
    return never, float(kept.get_column("bytes").sum()) / n


def _at_peak(
    ctx: Context,
    tables: _OpTables,
    mem: pl.DataFrame,
    steady: pl.DataFrame,
    window: tuple[int, int],
    peak: int | None,
) -> _AtPeak:
    if peak is None:
        return _AtPeak()
    lo, hi = window
    at = mem.filter(pl.col("start_ns") >= lo, pl.col("start_ns") < hi)
    row = _alloc_ops(
        tables, (at if at.height else mem).filter(pl.col("allocated_bytes") == peak).head(1)
    )
    peak_ns = int(row["start_ns"][0])
    tid = row["tid"][0]
    allocs = _allocations(mem)
    never, never_per_step = _never_freed(tables, allocs, steady)
    return _AtPeak(
        peak_ns=peak_ns,
        peak_op=row["op"][0],
        peak_root_op=_root_op(ctx, int(tid) if tid is not None else None, peak_ns),
        top_ops_at_peak=_live_at(tables, allocs, peak_ns),
        never_freed=never,
        never_freed_bytes_per_step=never_per_step,
        peak_by_category_bytes=_by_category_at_peak(mem, lo, hi, peak),
    )


def _device(
    ctx: Context,
    tables: _OpTables,
    dev: int,
    mem: pl.DataFrame,
    steady: pl.DataFrame,
    lo: int,
    hi: int,
) -> DeviceMemory:
    # only the columns read below: every join and sort then moves a few columns, not all
    mem = by_start(
        mem.select(
            "start_ns", "tid", "bytes", "allocated_bytes", "reserved_bytes", "addr", "category"
        )
    )
    win = mem.filter((pl.col("start_ns") >= lo) & (pl.col("start_ns") < hi))
    if win.height == 0:  # no window (a memory timeline holds no events): all of it
        win = mem
        lo, hi = int(mem["start_ns"].min()), int(mem["start_ns"].max()) + 1
    info = next((d for d in ctx.device_info if d.id == dev), None)
    peaks = _peaks(win, info.memory_bytes if info and info.memory_bytes else None)
    growth = _growth(mem, steady)
    at_peak = _at_peak(ctx, tables, mem, steady, (lo, hi), peaks.allocated_bytes)
    slope, total, peak = (
        growth.growth_bytes_per_step,
        peaks.device_memory_bytes,
        peaks.allocated_bytes,
    )
    return DeviceMemory(
        device=dev,
        events=mem.height,
        peak_allocated_bytes=peak,
        peak_reserved_bytes=peaks.reserved_bytes,
        device_memory_bytes=total,
        headroom_ratio=peaks.headroom_ratio,
        fragmentation_ratio=peaks.fragmentation_ratio,
        growth_bytes_per_step=slope,
        growth_consistency_ratio=growth.growth_consistency_ratio,
        boundary_allocated_bytes=growth.boundary_allocated_bytes,
        base_allocated_bytes=growth.base_allocated_bytes,
        step_span_bytes=growth.step_span_bytes,
        peak_ns=at_peak.peak_ns,
        peak_op=at_peak.peak_op,
        peak_root_op=at_peak.peak_root_op,
        top_ops_at_peak=at_peak.top_ops_at_peak,
        never_freed=at_peak.never_freed,
        never_freed_bytes_per_step=at_peak.never_freed_bytes_per_step,
        peak_by_category_bytes=at_peak.peak_by_category_bytes,
        steps_until_full=max(0.0, (total - peak) / slope)
        if slope and slope > 0 and total and peak is not None
        else None,
        timeline=_timeline(win, lo, hi),
    )


def _by_category_at_peak(mem: pl.DataFrame, lo: int, hi: int, peak: int) -> dict[str, int] | None:
    """Bytes per category live at the allocated peak: every event's bytes up to the peak's
    event, by category (None without categories). The peak's event is the first one in the
    window at ``peak``, with the events right after it at the same time and total (the plot
    export's other categories changing then: they carry the time's total each)."""
    if mem.get_column("category").null_count() == mem.height:
        return None
    rows = mem.with_row_index("_i")
    inside = rows.filter(pl.col("start_ns") >= lo, pl.col("start_ns") < hi)
    first = (inside if inside.height else rows).filter(pl.col("allocated_bytes") == peak)
    if first.height == 0:
        return None
    i, t = int(first["_i"][0]), int(first["start_ns"][0])
    after = rows.slice(i).select(
        ((pl.col("start_ns") == t) & (pl.col("allocated_bytes") == peak)).alias("_same")
    )["_same"]
    run = after.len() if after.all() else int(after.arg_min() or 1)
    sums = dict(
        rows.head(i + run)
        .filter(pl.col("category").is_not_null())
        .group_by("category")
        .agg(pl.col("bytes").sum())
        .iter_rows()
    )
    return {c: int(sums.get(c) or 0) for c in MEMORY_CATEGORIES}


def _timeline(win: pl.DataFrame, lo: int, hi: int) -> dict[str, Any]:
    """Allocated and reserved over the window in at most :data:`TIMELINE_POINTS` buckets (each
    bucket's maximum, so the peak survives the thinning)."""
    span = max(1, hi - lo)
    b = (
        win.with_columns(
            ((pl.col("start_ns") - lo) * TIMELINE_POINTS // span)
            .clip(0, TIMELINE_POINTS - 1)
            .alias("_b")
        )
        .group_by("_b")
        .agg(
            pl.col("start_ns").first().alias("t"),
            pl.col("allocated_bytes").max(),
            pl.col("reserved_bytes").max(),
        )
        .sort("_b")
    )
    return {
        "start_ns": lo,
        "t_ns": (b["t"] - lo).to_list(),
        "allocated_bytes": b["allocated_bytes"].to_list(),
        "reserved_bytes": b["reserved_bytes"].to_list(),
    }


def _per_device(mem: pl.DataFrame) -> dict[int, pl.DataFrame]:
    """The memory rows of each device, in order; one device (the usual trace) without a copy."""
    if mem.height == 0:
        return {}
    first = mem.get_column("device")[0]
    if mem.get_column("device").eq(first).all():
        return {first: mem}
    return {
        d: part
        for (d,), part in mem.partition_by("device", as_dict=True, maintain_order=True).items()
    }


def _device_table(ctx: Context) -> pl.DataFrame:
    """The GPU rows of the memory table (host memory is not the device's)."""
    return ctx.memory.filter(pl.col("device").is_not_null() & (pl.col("device_type") != "cpu"))


def analyze_memory(
    ctx: Context, replay: ReplayResult | Callable[[], ReplayResult | None] | None = None
) -> MemoryResult:
    """``replay``: the replay's result, or a function that waits for it (called only once the
    memory table is analyzed, so that part runs while the replay does)."""
    mem = _device_table(ctx)
    steady = steady_steps(ctx) if ctx.steps.height else ctx.steps
    n = steady.height
    lo = (
        int(min(ctx.steps["host_start_ns"].min(), ctx.window_start_ns))
        if n
        else ctx.window_start_ns
    )
    hi = ctx.window_end_ns
    parts = _per_device(mem)
    devices: tuple[DeviceMemory, ...] = ()
    if parts:
        tables = _op_tables(ctx)
        devices = tuple(
            _device(ctx, tables, int(d), part, steady, lo, hi) for d, part in parts.items()
        )
    allocs = frees = calls_ns = empties = released = None
    in_window = (pl.col("end_ns") > ctx.window_start_ns) & (pl.col("start_ns") < ctx.window_end_ns)
    w_calls = ctx.rows(API_KINDS, ALLOCATOR_API, where=in_window)
    w_pinned = ctx.rows(API_KINDS, PINNED_HOST_ALLOC_API, where=in_window)
    if n:
        a = _per_step_calls(ctx, steady, DEVICE_ALLOC_API)
        f = _per_step_calls(ctx, steady, DEVICE_FREE_API)
        allocs, frees = a.height / n, f.height / n
        calls_ns = (int(a["dur_ns"].sum()) + int(f["dur_ns"].sum())) / n
        e = ctx.rows(HOST_OP_KINDS, r"empty_cache")
        if e.height:
            inside = e.filter(
                (pl.col("start_ns") >= steady["host_start_ns"].min())
                & (pl.col("start_ns") < steady["end_ns"].max())
            )
            empties = inside.height / n
        else:
            empties = 0.0
        released = _outside_ops(ctx, f) / n
    step_med = float(steady["dur_ns"].median()) if n else None
    gpu_per_step = _gpu_busy_per_step(ctx, steady) if n else None
    fit = sat = rec = None
    gains: tuple[BatchGain, ...] = ()
    churn = None
    why = None
    if callable(replay):
        replay = replay()
    if devices:
        d = max(devices, key=lambda x: x.peak_allocated_bytes or 0)
        if d.device_memory_bytes and d.step_span_bytes and d.base_allocated_bytes is not None:
            room = FIT_RATIO * d.device_memory_bytes - d.base_allocated_bytes
            fit = max(1, int(room // d.step_span_bytes)) if room > 0 else 1
        # the un-profiled step where the model has one: the profiler's host work is no room
        unprofiled = replay.unprofiled_step_ns if replay is not None else None
        if (unprofiled or step_med) and gpu_per_step:
            sat = (unprofiled or step_med) / gpu_per_step
        if fit is not None and sat is not None:
            rec = power_of_two_at_most(min(fit, sat, MAX_MULTIPLIER))
            if rec == 1 and sat > 1 and fit >= 2:
                # the GPU's time would fill the step short of 2x: a 2x batch still gains, up to
                # the saturation (GPT-2 under the Trainer with 8 micro-batches a step, saturation
                # 1.38: 2x micro-batches measured 1.15-1.23x, 4x 1.27-1.36x, the largest lever)
                rec = 2
        if replay is None:
            why = "the causal step model did not run (--replay)"
        elif replay.model is None:
            why = "the causal step model could not be built (no steps or no GPU work)"
        else:
            gains = _batch_gains(replay, rec)
            rec, gains = _doublings(replay, rec, fit, gains)
            if (allocs or 0) + (frees or 0) > 0:  # the replay's own no_empty_cache what-if
                churn = replay.what_if.get("no_empty_cache")
    return MemoryResult(
        has_memory=bool(devices),
        devices=devices,
        steady_steps=tuple(int(s) for s in steady["step"]) if n else (),
        allocator_device_allocs_per_step=allocs,
        allocator_device_frees_per_step=frees,
        allocator_calls_ns_per_step=calls_ns,
        empty_cache_calls_per_step=empties,
        frees_outside_ops_per_step=released,
        step_time_median_ns=step_med,
        gpu_busy_ns_per_step=gpu_per_step,
        fit_multiplier=fit,
        saturation_multiplier=sat,
        recommended_multiplier=rec,
        batch_gains=gains,
        churn_what_if=churn,
        why_no_estimate=why,
        window_allocator_calls=w_calls.height,
        window_allocator_ns=int(w_calls["dur_ns"].sum()) if w_calls.height else 0,
        window_pinned_host_calls=w_pinned.height,
        window_pinned_host_ns=int(w_pinned["dur_ns"].sum()) if w_pinned.height else 0,
        allocator_api=_allocator_api(w_calls),
    )


def _allocator_api(calls: pl.DataFrame) -> str:
    """ "hip" where most of the allocator ``calls`` are HIP's, else "cuda"."""
    if calls.height == 0:
        return "cuda"
    hip = calls.select(pl.col("name").cast(pl.String).str.starts_with("hip").mean()).item()
    return "hip" if (hip or 0) > 0.5 else "cuda"


def _gpu_busy_per_step(ctx: Context, steady: pl.DataFrame) -> float | None:
    """The GPU's busy time per steady step (union over streams; devices summed)."""
    if ctx.busy.height == 0:
        return None
    a, b = int(steady["start_ns"].min()), int(steady["end_ns"].max())
    busy = ctx.busy.select(
        (pl.min_horizontal("end_ns", pl.lit(b)) - pl.max_horizontal("start_ns", pl.lit(a)))
        .clip(0)
        .sum()
    ).item()
    return float(busy) / steady.height if busy else None


def _doublings(
    replay: ReplayResult, rec: int | None, fit: int | None, gains: tuple[BatchGain, ...]
) -> tuple[int | None, tuple[BatchGain, ...]]:
    """The recommended multiplier raised by each doubling that fits and that, replayed from the
    un-profiled step's low end (the profiler's cost 2.5 times what the trace shows), still gains
    :data:`DOUBLING_MIN_GAIN` over the one before: the saturation point assumes GPU work
    linear in the batch, and where the GPU runs many streams side by side or small kernels
    the larger batch gains past it (the word-level LSTM, saturation 2.49: 4x measured
    3.29-3.60 per sample, 2x replayed 1.97). From the point estimate the next doubling
    overshoots where it keeps profiler cost (Lightning's 8x: 2.90 against 2.08-2.27; its low
    end gains 1.14 over 4x's), so the low end decides. Small models only (each doubling is
    three replays); the gains with the replays made."""
    small = replay.host_nodes + replay.gpu_nodes <= GAIN_TABLE_MAX_NODES
    if rec is None or rec < 2 or fit is None or not small:
        return rec, gains

    def low_end(g: BatchGain) -> float | None:
        w = WhatIf.larger_batch(
            g.step_time_ns,
            g.step_time_after_ns,
            g.multiplier,
            whatif.gpu_work_scaled(float(g.multiplier)),
        )
        return replay.speedup_low(w)

    current = next((g for g in gains if g.multiplier == rec), None)
    current_low = low_end(current) if current is not None else None
    while current_low and 2 * rec <= min(fit, MAX_MULTIPLIER):
        if (nxt := _gain(replay, 2 * rec)) is None:
            break
        nxt_low = low_end(nxt)
        if not nxt_low or nxt_low < DOUBLING_MIN_GAIN * current_low:
            break
        rec, current_low, gains = 2 * rec, nxt_low, (*gains, nxt)
    return rec, gains


def _batch_gains(replay: ReplayResult, rec: int | None) -> tuple[BatchGain, ...]:
    """Replayed throughput gain of a batch ``m`` times larger, for m = 2, 4, 8 up to the
    recommended multiplier, and that one (no replays where the GPU is already busy; on a large
    model only the recommended one: each replay costs as much as the model's own)."""
    if rec is None or rec < 2:
        return ()
    out: list[BatchGain] = []
    small = replay.host_nodes + replay.gpu_nodes <= GAIN_TABLE_MAX_NODES
    for m in sorted({m for m in (2, 4, 8) if m <= rec and small} | {rec}):
        if (g := _gain(replay, m)) is not None:
            out.append(g)
    return tuple(out)


def _gain(replay: ReplayResult, m: int) -> BatchGain | None:
    """The replayed step at ``m`` x the batch (None where the replay has no answer)."""
    p = replay.predict(whatif.gpu_work_scaled(float(m)))
    if p is None or not p.speedup:
        return None
    return BatchGain(m, p.step_time_ns, p.step_time_after_ns, m * p.speedup)
