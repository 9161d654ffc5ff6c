"""Trace health: can the event table be trusted? Each check names the rules whose evidence rests
on what it found (findings/quality.py downgrades and tags those findings).

- ``graph_kernels_missing``: CUDA-graph launches with no recorded kernels (CUPTI did not record
  graph kernels): the GPU looks idle where it ran the graph (TraceLens #827, #728, HTA #290).
- ``stream_overlap``: a kernel inside an earlier one on its stream (one stream runs in order).
- ``duration_invalid``: negative durations (nsys, tables; the Kineto parser already skips them
  with a warning), or ones far longer than the capture's robust span (an overflowed ``dur``,
  TraceLens #669, inflates kernel time by orders of magnitude).
- ``launched_before_recording``: GPU work in the window with no recorded launch, ahead of all
  launched work: queued before the profiler started, yet counted.
- ``correlation_collision``: one correlation id on launch calls at different times in one
  process (merged traces, TraceLens #581): GPU work is joined to the wrong launch.
- ``events_dropped``: the profiler says it dropped events (Kineto's logged ``WARNING``/``ERROR``
  lines, nsys' ``DIAGNOSTIC_EVENT``): GPU work may be missing, so idle looks larger and
  kernel totals smaller.
- ``one_gap``: no steps, and one idle gap holds 90% of the window or more: the figures are that
  gap's, and the message gives the GPU's busy share in the rest (a warning affecting no
  finding).
- ``copy_activity_missing``: kernels recorded and copy calls traced (``hipMemcpy``,
  ``cudaMemcpyAsync``, ...) but no copy at all: copy tracing was off (rocprofv3 without
  ``--memory-copy-trace``: an MI300X benchmark's 24.35 ms of ``hipMemcpy`` read as a host sync
  leaving the GPU idle, HIGH). The copies' time reads as idle and a blocking copy's as a
  sync: an error for the findings that rest on idle or copies.
- ``memset_activity_missing``: kernels recorded and memset calls traced but no memset: their
  GPU time reads as idle (a warning affecting no finding: memsets are short).
- ``device_activity_missing``: launch calls traced but no GPU activity at all (the CUPTI/
  roctracer buffers were lost or never flushed: Zoology's A100 trace has 244 launches, 268
  ``ac2g`` flows and no kernel), or copies/memsets but no kernel while launches were traced or
  modules loaded (a Rust cudarc program on nsys 2026: no kernel table). Not a CPU-only job: an
  error, the GPU's side of the job is missing.
- ``device_activity_partial``: some GPU activity recorded, but launch calls (kernel launches and
  copies, by rank and correlation id) without their GPU record beyond the capture's end effects
  (CUPTI buffers dropped or not flushed part-way: audit 19, 67% of a trace's launches had lost
  their kernels and the trace passed a diff's gate). Not counted: CUDA-graph launches
  (``graph_kernels_missing`` judges those), memsets (healthy traces leave up to 27% of
  ``cudaMemsetAsync`` calls without a record), and the backlog at the end of the capture
  (launches after the last recorded one, issued while the GPU was still running recorded work:
  queued when the profiler stopped). An error.
- ``device_records_stop``: the last steps ran at least half the usual step's torch ops but
  recorded no runtime or driver call and no GPU work, after steps that did: the device side's
  records stop while the host's go on (a file cut where host events come first, device buffers
  lost). An error.
- ``trace_truncated``: the file ends early (a cut gzip or xz stream, a cut-off events array): only the
  events written before the cut were read; an error.
- ``empty_trace``: the file parsed but holds no event at all (``traceEvents: []``): nothing to
  analyze, an error (audit 12: such an AFTER passed a diff's gate).
- ``rows_out_of_order``: an nsys export whose rows are in no time order on their stream or
  thread (nsys 2025.6+ may write them so). The parser sorts them, so no finding rests on it:
  a warning for other tools that read the export as written.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import polars as pl

from traceinsight.analyzers.context import Context, capture_spans
from traceinsight.constants import ABSURD_SPAN_FACTOR
from traceinsight.model.classify import (
    API_KINDS,
    COPY_LAUNCH_API,
    LAUNCH_API,
    names_matching,
)
from traceinsight.report.format import fmt_ns, plural

IDLE_RULES = (
    "dataloader_stall",
    "host_sync",
    "launch_bound",
    "pageable_memcpy",
    "gpu_underutilized",
)
KERNEL_RULES = (
    "elementwise_heavy",
    "fp32_compute",
    "comm_not_overlapped",
    "recompute_overhead",
)
# Overlap on one stream below this is timestamp rounding (Kineto's us-resolution eras).
STREAM_OVERLAP_MIN_NS = 1_000
# GPU work launched before the recording matters from this share of the window (nsys-ai's
# mfu_2gpu_after has 0.15% at the start of its capture; h100_2gpu_1s 43%).
PRE_RECORDING_MIN_RATIO = 0.01
# Out-of-order rows: healthy exports are written in per-thread flushes, each in order, with a
# few breaks between them (mock's PROFILER_OVERHEAD: 2 of 25 rows); rows in no order break
# about every other row.
ROW_ORDER_BREAK_RATIO = 0.1
ROW_ORDER_MIN_BREAKS = 20
# Dropped events are an error from this share of the GPU activity (a count the message gives).
DROPPED_ERROR_RATIO = 0.01
# A row this many times longer than the span covered by 98% of the rows (1%..99%: one bad row
# in a small trace cannot stretch it) is not a real one (constants.ABSURD_SPAN_FACTOR: the steps
# leave such a range out too, analyzers/context.py).
QUANTILE_SAMPLE = 200_000  # rows the median end is taken from (every k-th row)
# Calls that load device code (module or library loading): kernels are coming. Only the
# health check reads it, so it lives here, not in model/classify.py's shared name tables.
MODULE_LOAD_API = r"^(cuModuleLoad|cuLibraryLoad|cudaLibraryLoad|hipModuleLoad)"
# A trace whose runtime calls were filtered to the launches and copies (HTA's trace filter, a
# sampled capture): no sync, event or stream call among many calls, and consecutive correlation
# ids this far apart at the median (complete Kineto traces: 6-15 over the corpus and fixtures;
# HTA's sampled ranks 36-37). Without the calls that order the work, idle cannot be attributed
# (audit 24: gpu_underutilized HIGH on "dependency waits" the filtered calls had made).
SAMPLED_CORRELATION_STEP = 25
SAMPLED_MIN_CALLS = 500
LAUNCH_OR_COPY_API = r"^cuda(LaunchKernel\w*|Memcpy\w*|Memset\w*)$"
# GPU activity that a launch call produces (gpu_sync and GPU annotations are not launched work).
GPU_WORK_KINDS = ("kernel", "memcpy", "memset")
# Launch calls without a GPU record (device_activity_partial) are an error from this share of the
# counted launches, and this many: over the corpus and fixtures (250 traces with kernel or copy
# launches: Kineto 2020-2025, nsys, rocprof, CUDA graphs, torch.compile) no healthy trace has
# one outside the end-of-capture backlog (nsys-ai's h100_2gpu_1s: 51% of its launches queued
# behind 25 GB of copies when the 1 s capture ended, the GPU busy to its end); dropped events
# are an error from 1% too. The count spares the last few launches before the profiler stops.
PARTIAL_ERROR_RATIO = 0.01
PARTIAL_MIN_CALLS = 5
# launch calls device_activity_partial does not count: graph launches (one call, many kernels,
# judged by graph_kernels_missing) and memsets (CUPTI leaves many without a record)
PARTIAL_SKIP_API = r"GraphLaunch|Memset"
# without steps, a GPU span under this share of the capture is flagged (the window is that span)
GPU_SPAN_MIN_RATIO = 0.01
# without steps, one idle gap of at least this share of the window is what the window's
# figures describe: said, with how busy the GPU was in the rest
ONE_GAP_MIN_RATIO = 0.9


@dataclass(frozen=True)
class HealthResult:
    # check, severity (warning|error), message, count, affects (rule ids)
    checks: tuple[dict[str, Any], ...]


def analyze_health(ctx: Context) -> HealthResult:
    ev = ctx.events
    durations, absurd = _durations(ev)
    if absurd is not None:  # the other checks judge the rows that are left
        ev = ev.filter(~absurd)
    # the runtime/driver calls' columns both call checks read, filtered once
    api = (
        ev.lazy()
        .filter(pl.col("kind").is_in(API_KINDS))
        .select("name", "rank", "pid", "tid", "correlation", "start_ns", "end_ns")
        .collect()
    )
    # the GPU's work by kind, counted once for the checks that read it
    work = dict(
        ev.lazy()
        .filter(pl.col("kind").is_in(GPU_WORK_KINDS))
        .group_by("kind")
        .len()
        .collect()
        .iter_rows()
    )
    checks = [
        c
        for c in (
            _graph_kernels_missing(ev, api),
            _stream_overlap(ev),
            durations,
            _collisions(api),
            _launched_before_recording(ctx, absurd),
            _events_dropped(ctx),
            _device_activity_missing(
                ev,
                api,
                work,
                len(ctx.device_info),
                int(ctx.source_extra.get("range_profiler_events") or 0),
                # a file cut off lost the GPU's events written after the cut: trace_truncated
                # says it, not a recording without them
                None if ctx.source_extra.get("truncated") else ctx.memory,
            ),
            _copy_activity_missing(api, work),
            _memset_activity_missing(api, work),
            # a --device view left the other GPUs' records out, not the profiler
            None
            if ctx.source_extra.get("device_view") is not None
            else _device_activity_partial(ev, api, work),
            _truncated(ctx),
            # a file cut off: trace_truncated says it
            None if ctx.source_extra.get("truncated") else _device_records_stop(ctx, api),
            _rows_out_of_order(ctx),
            _runtime_calls_filtered(api),
            _gpu_span_small(ctx, ev),
            _one_gap(ctx),
            _empty(ev, ctx.memory),
        )
        if c is not None
    ]
    return HealthResult(tuple(checks))


# A step that ran at least this share of the usual step's torch ops records launches too
RECORDS_STOP_MIN_OPS_RATIO = 0.5


def _device_records_stop(ctx: Context, api: pl.DataFrame) -> dict[str, Any] | None:
    """Steps that ran their torch ops but recorded no runtime or driver call and no GPU work,
    after steps that did: the device side's records stop while the host's go on (a file cut
    where the events are written host first, or the profiler's device buffers lost). Audit 19:
    a trace cut at 70% in file order and closed kept steps 3 and 4's 1,129 ops each and none of
    their launches, and passed a diff's gate. An error."""
    steps = ctx.steps
    if steps.height < 2 or api.height == 0:
        return None
    bounds = steps.select(
        pl.col("host_start_ns").alias("s"), pl.col("host_end_ns").alias("e")
    ).sort("s")
    # the host index's rows (read once per trace) and the window's GPU rows: the steps lie in it
    ops = ctx.rows(("cpu_op",), columns=("start_ns",))
    gpu = ctx.gpu.filter(pl.col("kind").is_in(GPU_WORK_KINDS)).select("start_ns")

    def per_step(starts: pl.Series) -> pl.Series:
        srt = starts.sort()
        return srt.search_sorted(bounds.get_column("e"), side="left") - srt.search_sorted(
            bounds.get_column("s"), side="left"
        )

    n_ops = per_step(ops.get_column("start_ns"))
    n_api = per_step(api.get_column("start_ns"))
    n_gpu = per_step(gpu.get_column("start_ns"))
    busy = n_api > 0
    if not busy.any():
        return None  # no step launched anything: a CPU-only or host-only recording
    usual = float(n_ops.filter(busy).median() or 0)
    silent = (~busy) & (n_gpu == 0) & (n_ops >= RECORDS_STOP_MIN_OPS_RATIO * max(usual, 1.0))
    # only steps after the last one that recorded its launches: the records stopped
    last = int(busy.arg_true().max())
    lost = int(silent.slice(last + 1).sum())
    if lost == 0:
        return None
    message = (
        f"the last {plural(lost, 'step')} ran their torch ops ({int(n_ops.slice(last + 1).max())} "
        f"a step at most, against {usual:.0f} usually) but recorded no runtime call and no GPU "
        "work: the device side's records stop while the host's go on (a file cut after its "
        "host events, or device buffers lost), so step times, idle and kernel totals are wrong"
    )
    affects = IDLE_RULES + KERNEL_RULES + ("step_time_variance",)
    return _check("device_records_stop", "error", lost, message, affects)


def _runtime_calls_filtered(api: pl.DataFrame) -> dict[str, Any] | None:
    """CUDA runtime calls that are only launches and copies, their correlation ids far apart
    (:data:`SAMPLED_CORRELATION_STEP`): the other calls were filtered out of the trace."""
    calls = api.filter(pl.col("correlation").is_not_null() & pl.col("name").str.starts_with("cuda"))
    if calls.height < SAMPLED_MIN_CALLS:
        return None
    if not calls.select(pl.col("name").str.contains(LAUNCH_OR_COPY_API).all()).item():
        return None
    step = (
        calls.sort("rank", "pid", "correlation")
        .select(pl.col("correlation").diff().over("rank", "pid").alias("d"))
        .filter(pl.col("d") > 0)
        .get_column("d")
        .median()
    )
    if step is None or step < SAMPLED_CORRELATION_STEP:
        return None
    return _check(
        "runtime_calls_filtered",
        "error",
        calls.height,
        f"the trace's {calls.height} CUDA runtime calls are all launches and copies, their "
        f"correlation ids {step:.0f} apart at the median: the syncs, event and stream calls "
        "were filtered out (a sampled or filtered trace), so what the GPU waited for cannot be "
        "told; record the full trace for the idle-time findings.",
        (*IDLE_RULES, "small_batch"),  # whether the host bounds the step: from the same calls
    )


def _gpu_span_small(ctx: Context, ev: pl.DataFrame) -> dict[str, Any] | None:
    """No steps, and the GPU's work spans a sliver of the capture: the window (the GPU span)
    then describes that sliver, not the run (a public nsys export: one 1.5 us memset in a
    426 ms capture read as 100% busy)."""
    if ctx.steps.height or ev.height == 0:
        return None
    gpu = pl.col("kind").is_in(GPU_WORK_KINDS)
    n, lo, hi, capture = ev.select(
        gpu.sum().alias("n"),
        pl.col("start_ns").filter(gpu).min().alias("lo"),
        pl.col("end_ns").filter(gpu).max().alias("hi"),
        (pl.col("end_ns").max() - pl.col("start_ns").min()).alias("capture"),
    ).row(0)
    if not n or not capture or capture <= 0 or hi - lo >= GPU_SPAN_MIN_RATIO * capture:
        return None
    return _check(
        "gpu_span_small",
        "warning",
        n,
        f"the GPU worked within {fmt_ns(hi - lo)} of the {fmt_ns(capture)} capture "
        f"({plural(n, 'GPU activity', 'GPU activities')}) and no step marks the rest: the "
        "window is that span, so its busy and idle figures describe it alone, not the run. "
        "Record the part of the run that uses the GPU (nsys: --capture-range=cudaProfilerApi "
        "or --delay; torch.profiler: a schedule over the training steps)",
        (),
    )


def _one_gap(ctx: Context) -> dict[str, Any] | None:
    """No steps, and one idle gap of a device holds most of the window (:data:`ONE_GAP_MIN_RATIO`):
    the window's busy share describes that gap; the GPU's work ran in the rest (a public nsys
    export: a 615.7 s host gap after a cudaMemcpy, then 2,100 GEMMs in 0.61 s at 70% busy, read
    "GPU busy only 0.1%" with nothing said of the burst: session 53)."""
    window = ctx.window_ns
    if ctx.steps.height or ctx.busy.height < 2 or window <= 0:
        return None
    gaps = (
        ctx.busy.sort("device", "start_ns")
        .with_columns((pl.col("start_ns") - pl.col("end_ns").shift(1).over("device")).alias("_gap"))
        .filter(pl.col("_gap").is_not_null())
    )
    if gaps.height == 0:
        return None
    widest = gaps.sort("_gap", descending=True).row(0, named=True)
    gap = int(widest["_gap"])
    if gap < ONE_GAP_MIN_RATIO * window:
        return None
    device = widest["device"]
    busy = ctx.busy.filter(pl.col("device") == device)
    busy_ns = int((busy["end_ns"] - busy["start_ns"]).sum())
    rest = max(1, window - gap)
    return _check(
        "one_gap",
        "warning",
        1,
        f"one idle gap of {fmt_ns(gap)} ({gap / window:.1%} of the window, from "
        f"+{fmt_ns(widest['start_ns'] - gap - ctx.window_start_ns)}) on GPU {device}: the "
        "window's busy and idle figures are mostly that gap's; in the rest of the window "
        f"({fmt_ns(rest)}) the GPU was {min(1.0, busy_ns / rest):.1%} busy. Record the part of "
        "the run that uses the GPU, or mark the iterations (NVTX ranges, a torch.profiler "
        "schedule), to see it",
        (),
    )


def _empty(ev: pl.DataFrame, memory: pl.DataFrame) -> dict[str, Any] | None:
    # an export_memory_timeline file holds the allocator's timeline and no events by design:
    # its memory is what was recorded (session 56: a public ResNet-50 timeline, 16,418 points,
    # read "nothing was recorded" as an error)
    if ev.height or memory.height:
        return None
    return _check(
        "empty_trace",
        "error",
        0,
        "the trace holds no events: nothing was recorded, or the recording was not written",
        ("all",),
    )


def _check(
    name: str, severity: str, count: int, message: str, affects: tuple[str, ...]
) -> dict[str, Any]:
    return {
        "check": name,
        "severity": severity,
        "count": count,
        "message": message,
        "affects": list(affects),
    }


def _graph_kernels_missing(ev: pl.DataFrame, api: pl.DataFrame) -> dict[str, Any] | None:
    launches = names_matching(api, "GraphLaunch").select("rank", "correlation")
    if launches.height == 0:
        return None
    # Kernels only: a graph's memcpy nodes may be recorded when its kernels are not.
    gpu = (
        ev.lazy()
        .filter(pl.col("kind") == "kernel")
        .select("rank", "correlation")
        .collect()
        .unique()
    )
    missing = launches.join(gpu, on=["rank", "correlation"], how="anti", nulls_equal=True).height
    if missing == 0:
        return None
    every = missing == launches.height
    return _check(
        "graph_kernels_missing",
        "error" if every else "warning",
        missing,
        f"{missing} of {launches.height} CUDA-graph launches have no recorded kernels: the GPU "
        "looks idle where it ran the graphs. Record graph kernels (PyTorch >= 2.1 profiler, "
        "or nsys --cuda-graph-trace=node).",
        IDLE_RULES + KERNEL_RULES,
    )


def _stream_overlap(ev: pl.DataFrame) -> dict[str, Any] | None:
    k = (
        ev.lazy()
        .filter((pl.col("kind") == "kernel") & pl.col("stream").is_not_null())
        .select("rank", "device", "stream", "start_ns", "end_ns")
        .collect()
    )
    if not k.get_column("start_ns").is_sorted():  # the table is in start order (per rank)
        k = k.sort("rank", "start_ns")
    # Only a kernel inside an earlier one counts: programmatic dependent launch (Hopper,
    # Blackwell) lets the next kernel start before the previous ends (b200_eager: up to 4 us),
    # and MTIA queues overlap their DMA requests; neither ends a kernel inside another.
    prev_end = pl.col("end_ns").cum_max().shift(1).over("rank", "device", "stream")
    n = k.filter(
        (prev_end - pl.col("start_ns") > STREAM_OVERLAP_MIN_NS)
        & (pl.col("end_ns") + STREAM_OVERLAP_MIN_NS <= prev_end)
    ).height
    if n == 0:
        return None
    return _check(
        "stream_overlap",
        "warning",
        n,
        f"{plural(n, 'kernel')} inside an earlier kernel on its stream: timestamps are "
        "off (clock conversion, merged or edited trace); busy and kernel times may be wrong.",
        KERNEL_RULES + ("gpu_underutilized",),
    )


def _durations(ev: pl.DataFrame) -> tuple[dict[str, Any] | None, pl.Expr | None]:
    """The check, and which rows it rejects (None when it passed)."""
    # the three columns read, and a copy only where a row has no duration
    timed = ev.select("start_ns", "end_ns", "dur_ns")
    if timed.get_column("dur_ns").null_count():
        timed = timed.filter(pl.col("dur_ns").is_not_null())
    if timed.height == 0:
        return None, None
    # The capture's span from the starts (a wrong duration does not move its row's start), and
    # at least the median row's end past the first start (a capture of a few long rows, or of
    # rows that all start together). Quantiles of the starts would shrink it to the burst where
    # most rows are (SGLang's prefill+decode: 98% of the rows in the decode steps, while a
    # 493 ms copy and the 523 ms prefill annotation are real).
    first, last = timed.select(
        pl.col("start_ns").min().alias("first"), pl.col("start_ns").max().alias("last")
    ).row(0)
    sample = timed.get_column("end_ns").gather_every(max(1, timed.height // QUANTILE_SAMPLE))
    median_end = sample.median()
    span = max(1, int(last - first), int((median_end or first) - first))
    bad = (pl.col("dur_ns") < 0) | (pl.col("dur_ns") > ABSURD_SPAN_FACTOR * span)
    counts = timed.select(
        (pl.col("dur_ns") < 0).sum().alias("negative"), bad.sum().alias("bad")
    ).row(0, named=True)
    if counts["bad"] == 0:
        return None, None
    negative, absurd = counts["negative"], counts["bad"] - counts["negative"]
    check = _check(
        "duration_invalid",
        "error",
        counts["bad"],
        f"{plural(negative, 'event')} with a negative duration and {absurd} longer than "
        f"{ABSURD_SPAN_FACTOR}x the capture's span of starts ({span / 1e6:.2f} ms; an overflowed "
        "dur): times summed over them are wrong.",
        IDLE_RULES
        + KERNEL_RULES
        + ("step_time_variance", "h2d_not_overlapped", "unfused_optimizer"),
    )
    return check, bad.fill_null(False)


def _collisions(api: pl.DataFrame) -> dict[str, Any] | None:
    # Launch calls only: nsys exports repeat some cudaMalloc rows under one id and MTIA runtimes
    # share ids across threads; neither joins GPU work to the wrong launch.
    calls = names_matching(api.filter(pl.col("correlation").is_not_null()), LAUNCH_API)
    if calls.get_column("correlation").n_unique() == calls.height:
        return None  # every id once (the usual case): no grouping of millions of calls
    # Calls under one id that overlap in time are one call recorded twice (a nested wrapper,
    # pipit's nsys export); a collision is two calls at different times.
    dup = (
        calls.group_by("rank", "pid", "correlation")
        .agg(pl.len(), pl.col("start_ns").max().alias("s"), pl.col("end_ns").min().alias("e"))
        .filter((pl.col("len") > 1) & (pl.col("s") > pl.col("e")))
    )
    if dup.height == 0:
        return None
    return _check(
        "correlation_collision",
        "warning",
        dup.height,
        f"{dup.height} correlation ids belong to several launch calls (merged or concatenated "
        "traces): GPU work may be joined to the wrong launch.",
        ("launch_bound", "host_sync", "gpu_underutilized"),
    )


def _launched_before_recording(ctx: Context, bad: pl.Expr | None) -> dict[str, Any] | None:
    """GPU work with no launch recorded, ahead of all the launched work and inside the window.
    With steps the aligner starts the window at the first step's launched work, leaving such
    work out (every warmed-up Kineto trace has some: the queue still draining); without steps
    the window is the GPU span and it counts as the first step's."""
    gpu = ctx.launches if bad is None else ctx.launches.filter(~bad)
    launched = (
        gpu.lazy()
        .filter(pl.col("launch_start_ns").is_not_null())
        .select("start_ns")
        .collect()
        .get_column("start_ns")
    )
    if launched.len() == 0:
        return None
    # unified-memory migrations are the driver's, on a page fault or prefetch: never launched
    orphans = gpu.filter(
        pl.col("launch_start_ns").is_null()
        & (pl.col("copy_kind") != "unified").fill_null(True)
        & (pl.col("start_ns") < int(launched.min()))
        & (pl.col("end_ns") > ctx.window_start_ns)
    )
    orphan_ns = int(orphans.get_column("dur_ns").sum()) if orphans.height else 0
    if orphan_ns < PRE_RECORDING_MIN_RATIO * ctx.window_ns * max(1, len(ctx.devices)):
        return None
    return _check(
        "launched_before_recording",
        "warning",
        orphans.height,
        f"{orphans.height} GPU activities in the window ({orphan_ns / 1e6:.2f} ms) were "
        "launched before the recording began, or by an API that was not traced (no launch call "
        "recorded, ahead of all launched work): their host side is missing; skip a step or two "
        "before recording (schedule wait/warmup).",
        ("step_time_variance", "launch_bound", "gpu_underutilized"),
    )


def _events_dropped(ctx: Context) -> dict[str, Any] | None:
    said = [m for m in ctx.source_extra.get("profiler_dropped") or [] if isinstance(m, str)]
    if not said:
        return None
    # the number of records a message says were dropped, where it gives one
    counts = [int(n.group(1)) for m in said if (n := re.search(r"\b(\d+)\b", m))]
    n = sum(counts)
    gpu = max(1, ctx.gpu.height)
    severe = not counts or n >= DROPPED_ERROR_RATIO * gpu
    return _check(
        "events_dropped",
        "error" if severe else "warning",
        n or len(said),
        f"the profiler dropped events ({'; '.join(said)[:300]}): GPU work may be missing, so "
        "idle looks larger and kernel time smaller; record fewer steps or raise the profiler's "
        "buffer size.",
        IDLE_RULES + KERNEL_RULES + ("step_time_variance",),
    )


def _device_activity_missing(
    ev: pl.DataFrame,
    api: pl.DataFrame,
    count: dict[str, int],
    named_gpus: int = 0,
    range_events: int = 0,
    memory: pl.DataFrame | None = None,
) -> dict[str, Any] | None:
    """Launch calls (or module loads) but no GPU work of the kind they make (``count``: the
    trace's GPU work by kind); or GPUs named
    (``named_gpus``: the trace's device properties) and torch ops run, with no CUDA call at all
    (a Kineto trace recorded without ProfilerActivity.CUDA on a GPU machine, audit 6: an RTX
    4080's 511 ms ``aten::to`` read "no GPU activity", no finding, no warning); or no CUDA call
    where the job's ops or allocations (``memory``; None: not judged, a file cut off) show it
    ran on a GPU."""
    kernels, other = count.get("kernel", 0), count.get("memcpy", 0) + count.get("memset", 0)
    if kernels:
        return None
    launching = names_matching(api, LAUNCH_API)
    launches = launching.height
    # kernel launches alone: an async copy or memset call makes a copy or memset, which is there
    # (WeatherBench2's export: one cudaMemsetAsync, its memset recorded, no kernel launched)
    kernel_launches = launching.filter(~pl.col("name").str.contains(COPY_LAUNCH_API)).height
    loads = names_matching(api, MODULE_LOAD_API).height
    if other == 0 and launches:
        message = (
            f"{plural(launches, 'launch call')} traced but no GPU activity (no kernel, "
            "copy or memset): the device side was lost (CUPTI/roctracer buffers not flushed, or "
            "the GPU activity not enabled). This is not a CPU-only job: re-record it."
        )
        if range_events:
            message = (
                f"{plural(launches, 'launch call')} traced but no kernel activity: the trace was "
                f"recorded in Kineto's range-profiler mode (profiler metrics), its "
                f"{plural(range_events, 'cuda_profiler_range event')} standing for the kernels, "
                "their durations the counters' replays, not the kernels' time. Re-record without "
                "profiler metrics to time the GPU."
            )
        n = launches
    elif not other and api.height == 0 and memory is not None and (used := _gpu_used(ev, memory)):
        # no CUDA call, yet the job ran on the GPU: torch.profiler without ProfilerActivity.CUDA
        # (session 56's audit: a public audio CNN's aten::cudnn_convolution and 22 CUDA memory
        # events read "no GPU activity, nothing to diagnose", no data-quality note)
        message = (
            f"the job used the GPU ({used}) but the trace holds no CUDA call and no GPU "
            "activity: it was recorded without ProfilerActivity.CUDA. Re-record with "
            "activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA] to see the GPU's time"
        )
        n = 1
    elif not other and api.height == 0 and named_gpus:
        ops = ev.lazy().filter(pl.col("kind") == "cpu_op").select(pl.len()).collect().item()
        if not ops:
            return None
        message = (
            f"the trace names {plural(named_gpus, 'GPU')} but holds no CUDA call and no GPU "
            f"activity beside {plural(ops, 'torch op')}: if the job used the GPU, its activity "
            "was not recorded (torch.profiler without ProfilerActivity.CUDA); a CPU-only run is "
            "analyzed as it is"
        )
        return _check("device_activity_missing", "warning", named_gpus, message, IDLE_RULES)
    elif other and (kernel_launches or loads):
        why = (
            plural(kernel_launches, "kernel launch call")
            if kernel_launches
            else plural(loads, "module load")
        )
        message = (
            f"{plural(other, 'copy/memset', 'copies/memsets')} recorded but no kernel, while "
            f"{why} traced: "
            "the kernel activity is missing (not enabled or lost), so busy time, idle and "
            "kernel totals are wrong. Re-record with kernel tracing (nsys --trace=cuda)."
        )
        n = kernel_launches or loads
    else:
        return None
    affects = IDLE_RULES + KERNEL_RULES + ("step_time_variance", "h2d_not_overlapped")
    if other:  # the copies were recorded: what rests on them alone stands
        affects = tuple(a for a in affects if a != "pageable_memcpy")
    return _check("device_activity_missing", "error", n, message, affects)


def _outside_capture(api: pl.DataFrame, calls: pl.DataFrame) -> pl.DataFrame:
    """``calls`` less those made while their thread captured a CUDA/HIP graph (between a
    StreamBeginCapture and the next StreamEndCapture): a captured launch runs only when the graph
    replays, so it has no GPU record of its own (TraceLens' xDiT Flux capture on MI300: 994 of
    its 2,550 launches inside one hipStreamBeginCapture ... hipStreamEndCapture)."""
    thread = ["rank", "pid", "tid"]
    spans = capture_spans(api, thread).rename({"start_ns": "_b", "end_ns": "_e"})
    if spans.height == 0:
        return calls
    # each call with the last capture begun before it on its thread, and that capture's end
    hit = (
        calls.with_row_index("_i")
        .sort("start_ns")
        .join_asof(
            spans,
            left_on="start_ns",
            right_on="_b",
            by=thread,
            strategy="backward",
            check_sortedness=False,
        )
        .filter(pl.col("_b").is_not_null() & (pl.col("start_ns") <= pl.col("_e").fill_null(2**62)))
        .select("_i")
    )
    return calls.with_row_index("_i").join(hit, on="_i", how="anti").drop("_i")


def _device_activity_partial(
    ev: pl.DataFrame, api: pl.DataFrame, count: dict[str, int]
) -> dict[str, Any] | None:
    """Kernel launches and copies (by rank and correlation id) with no GPU record, beyond the
    backlog the capture's end leaves: :data:`PARTIAL_ERROR_RATIO` of them or more is an error.
    With no GPU work at all, ``device_activity_missing`` says it."""
    if not any(count.get(k) for k in GPU_WORK_KINDS):
        return None
    calls = names_matching(api.filter(pl.col("correlation").is_not_null()), LAUNCH_API)
    calls = _outside_capture(api, names_matching(calls, PARTIAL_SKIP_API, negate=True))
    if calls.height < PARTIAL_MIN_CALLS:
        return None
    gpu = (
        ev.lazy()
        .filter(pl.col("kind").is_in(GPU_WORK_KINDS) & pl.col("correlation").is_not_null())
        .select("rank", "correlation", "end_ns")
        .collect()
    )
    recorded = gpu.select("rank", "correlation").unique().with_columns(pl.lit(True).alias("_rec"))
    tagged = calls.select("rank", "correlation", "start_ns").join(
        recorded, on=["rank", "correlation"], how="left", nulls_equal=True
    )
    # per rank: the last launch whose work was recorded, and the end of the GPU's recorded work
    ends = (
        tagged.filter(pl.col("_rec"))
        .group_by("rank")
        .agg(pl.col("start_ns").max().alias("_last"))
        .join(
            gpu.group_by("rank").agg(pl.col("end_ns").max().alias("_end")),
            on="rank",
            how="full",
            coalesce=True,
            nulls_equal=True,
        )
    )
    # lost: before the last recorded launch (a hole), or after the GPU's last recorded work
    # ended (the GPU had nothing queued, yet nothing more was recorded)
    lost = (
        tagged.join(ends, on="rank", how="left", nulls_equal=True)
        .filter(
            pl.col("_rec").is_null()
            & (
                (pl.col("start_ns") <= pl.col("_last")).fill_null(False)
                | (pl.col("start_ns") > pl.col("_end")).fill_null(True)
            )
        )
        .select(pl.len().alias("n"), (pl.col("start_ns") > pl.col("_end")).sum().alias("after"))
        .row(0, named=True)
    )
    n, after = int(lost["n"]), int(lost["after"] or 0)
    if n < PARTIAL_MIN_CALLS or n < PARTIAL_ERROR_RATIO * calls.height:
        return None
    where = (
        f", {after} of them launched after the GPU's last recorded work had ended" if after else ""
    )
    message = (
        f"{n} of {plural(calls.height, 'kernel launch or copy call')} ({n / calls.height:.1%}) "
        f"have no GPU record{where}: part of the device side was lost "
        "(CUPTI/roctracer buffers dropped or not flushed), so busy time, idle, kernel totals "
        "and step times are wrong. Re-record (fewer steps, or a larger profiler buffer)."
    )
    affects = IDLE_RULES + KERNEL_RULES + ("step_time_variance", "h2d_not_overlapped")
    return _check("device_activity_partial", "error", n, message, affects)


# torch ops that run only on a GPU (cuDNN, MIOpen, the fused attention kernels, NCCL)
GPU_ONLY_OP = (
    r"^aten::_?(cudnn|miopen)_|^aten::_(flash|efficient|scaled_dot_product_flash|"
    r"scaled_dot_product_efficient|scaled_dot_product_cudnn)_attention|^nccl:|^c10d::"
)


def _gpu_used(ev: pl.DataFrame, memory: pl.DataFrame) -> str | None:
    """What shows a job used a GPU where no GPU activity was recorded: torch ops that run only
    on one, or the profiler's allocator events on a GPU; None where nothing does (a memory
    timeline, which holds no events by design, included)."""
    if ev.height == 0:
        return None
    said = []
    ops = (
        ev.lazy()
        .filter((pl.col("kind") == "cpu_op") & pl.col("name").str.contains(GPU_ONLY_OP))
        .select(pl.col("name").unique().sort())
        .collect()
        .get_column("name")
    )
    if ops.len():
        said.append(", ".join(ops.head(2).to_list()) + (" ..." if ops.len() > 2 else ""))
    if memory.height:
        gpu = memory.filter(
            pl.col("device_type").is_in(["cuda", "hip"]) & (pl.col("source") != "memory_timeline")
        )
        if gpu.height:
            said.append(plural(gpu.height, "GPU memory event"))
    return "; ".join(said) or None


# the copy calls: each makes a copy on the device, which a capture with copy tracing records
COPY_CALL_API = r"Memcpy"
COPY_RULES = ("copy_bound", "h2d_not_overlapped")


def _calls_without_activity(
    api: pl.DataFrame, count: dict[str, int], kind: str, pattern: str, noun: str
) -> tuple[int, str] | None:
    """Kernels recorded and calls matching ``pattern`` traced, but no GPU activity of ``kind``:
    how many such calls, and the words "N NOUN calls traced (names) but no NOUN recorded"."""
    if not count.get("kernel") or count.get(kind):
        return None
    calls = names_matching(api, pattern)
    if calls.height == 0:
        return None
    names = ", ".join(sorted(calls.get_column("name").cast(pl.String).unique().to_list())[:3])
    return (
        calls.height,
        f"{plural(calls.height, noun + ' call')} traced ({names}) but no {noun} recorded",
    )


def _copy_activity_missing(api: pl.DataFrame, count: dict[str, int]) -> dict[str, Any] | None:
    """Kernels recorded and copy calls traced, but no copy: the copies were not recorded."""
    found = _calls_without_activity(api, count, "memcpy", COPY_CALL_API, "copy")
    if found is None:
        return None
    message = (
        f"{found[1]}: copy tracing was off (rocprofv3 --memory-copy-trace; nsys --trace=cuda), "
        "so the copies' time reads as GPU idle and a blocking copy's as a host sync. Re-record "
        "with copies."
    )
    return _check("copy_activity_missing", "error", found[0], message, IDLE_RULES + COPY_RULES)


# the memset calls: each makes a memset on the device (CUPTI's MEMSET activity)
MEMSET_CALL_API = r"^(cuda|hip)Memset|^cuMemsetD"


def _memset_activity_missing(api: pl.DataFrame, count: dict[str, int]) -> dict[str, Any] | None:
    """Kernels recorded and memset calls traced, but no memset: their GPU time reads as idle
    (audit 68: a Colab T4 trace's 34 cudaMemsetAsync calls inside cuDNN convolutions, no
    memset recorded). A warning affecting no finding: memsets are short beside the kernels,
    so a finding resting on idle time is not downgraded for them."""
    found = _calls_without_activity(api, count, "memset", MEMSET_CALL_API, "memset")
    if found is None:
        return None
    message = f"{found[1]}: their GPU time, if any, reads as idle"
    return _check("memset_activity_missing", "warning", found[0], message, ())


def _truncated(ctx: Context) -> dict[str, Any] | None:
    said = ctx.source_extra.get("truncated")
    if not said:
        return None
    return _check(
        "trace_truncated",
        "error",
        1,
        f"the file is cut off ({str(said)[:300]}): every event written after the cut is "
        "missing, so the analysis covers an arbitrary part of the capture. Copy or export the "
        "trace again.",
        IDLE_RULES + KERNEL_RULES + ("step_time_variance", "h2d_not_overlapped"),
    )


def _rows_out_of_order(ctx: Context) -> dict[str, Any] | None:
    seen = ctx.source_extra.get("rows_out_of_order") or {}
    bad = {
        t: v
        for t, v in seen.items()
        if isinstance(v, dict)
        and v.get("breaks", 0) >= ROW_ORDER_MIN_BREAKS
        and v["breaks"] >= ROW_ORDER_BREAK_RATIO * max(1, v.get("rows", 0))
    }
    if not bad:
        return None
    n = sum(v["breaks"] for v in bad.values())
    tables = ", ".join(f"{t} ({v['breaks']} of {v['rows']})" for t, v in sorted(bad.items()))
    return _check(
        "rows_out_of_order",
        "warning",
        n,
        f"rows of the export are not in time order on their stream or thread: {tables}. "
        "They were sorted on reading, so the findings are unaffected; tools that read the "
        "export in row order (nsys 2025.6+ writes rows unsorted) may misread it.",
        (),
    )
