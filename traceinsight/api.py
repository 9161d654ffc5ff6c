"""The library's one entry point: :func:`analyze` decides what an input is and analyzes it.

A trace file gives a :class:`TraceAnalysis`; a directory of rank traces, or one Nsight export
holding several processes, gives a :class:`JobAnalysis`. Every command calls this.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

import polars as pl

from traceinsight.analysis import JobAnalysis, TraceAnalysis, source_json
from traceinsight.analyzers import run_analyzers
from traceinsight.analyzers.context import build_context
from traceinsight.analyzers.regions import with_findings
from traceinsight.errors import InputError
from traceinsight.findings import all_fixes, diagnose
from traceinsight.findings.quality import apply_data_quality
from traceinsight.io import atomic_path
from traceinsight.model.schema import Trace
from traceinsight.options import Options
from traceinsight.parsers import load_trace
from traceinsight.runtime import Runtime

# Findings whose evidence names the user's code when stacks were recorded (analyzers/sources.py).
SOURCED_RULES = ("host_sync", "dataloader_stall", "launch_bound", "pageable_memcpy")


def analyze(
    path: str | Path,
    *,
    thresholds: Mapping[str, float] | None = None,
    step_range: str | None = None,
    max_bytes: int | None = None,
    command: str | None = None,
    runtime: Runtime | None = None,
    steps: str | None = None,
    window: str | None = None,
    rank: int | None = None,
    device: int | None = None,
    replay: bool = True,
) -> TraceAnalysis | JobAnalysis:
    """Analyze a trace file, a directory of rank traces, or a multi-process Nsight export.

    ``runtime`` says how much of the machine to use (default: every core, no decoder helper
    processes, since those need the caller's ``if __name__ == "__main__":`` guard). The view:
    ``steps`` ``"A..B"``, ``window`` ``"START:END"`` (``2s:4s``, from the capture start),
    ``rank`` (one rank of a job), ``device`` (one GPU's activity); ``replay`` runs the causal
    step model too (``details.replay``)."""
    opts = Options(
        dict(thresholds or {}), step_range, max_bytes, command, steps, window, rank, device, replay
    )
    return analyze_with(Path(path), opts, runtime or Runtime.detect(helpers=False))


def analyze_with(path: Path, opts: Options, runtime: Runtime) -> TraceAnalysis | JobAnalysis:
    """:func:`analyze` with the options already gathered (what commands and workers call)."""
    opts.graded()  # unknown threshold names fail before any parsing
    if path.is_dir():
        from traceinsight.jobs import analyze_job

        job = analyze_job(path, opts, runtime)
        return job if opts.rank is None else _one_rank(job, opts.rank)
    trace = load_trace(
        path,
        max_bytes=opts.max_bytes,
        parse_helpers=runtime.parse_helpers,
        threads=runtime.analyzer_threads,
    )
    if opts.rank is not None:
        trace = _rank_rows(trace, opts.rank)
    if trace.events["rank"].n_unique() > 1:
        from traceinsight.jobs import analyze_trace_ranks

        return analyze_trace_ranks(trace, opts, runtime)
    return analyze_trace(trace, opts, runtime)


def analyze_trace(
    trace: Trace, opts: Options | None = None, runtime: Runtime | None = None
) -> TraceAnalysis:
    """Every analyzer and every rule on one parsed single-rank trace."""
    opts = opts or Options()
    runtime = runtime or Runtime.detect(helpers=False)
    if opts.device is not None:
        trace = _device_rows(trace, opts.device)
    view = opts.view()
    try:
        ctx = build_context(
            trace,
            opts.step_pattern,
            runtime.analyzer_threads,
            steps_sel=view.steps,
            window_sel=view.window,
        )
    except ValueError as exc:  # the selection holds nothing
        raise InputError(str(exc), trace.meta.source_path) from None
    results = run_analyzers(ctx, runtime.analyzer_threads, replay=opts.replay)
    ev = trace.events
    span = int(ev["end_ns"].max() - ev["start_ns"].min()) if ev.height else 0
    warnings = list(trace.meta.warnings)
    warnings.extend(results.efficiency.warnings)
    if not ctx.has_gpu:
        warnings.append("no GPU activity in this trace: GPU metrics are not applicable")
    if ctx.steps.height == 0 and ctx.has_gpu:
        warnings.append("no ProfilerStep/step ranges: the whole GPU span is analyzed as one window")
    source = source_json(trace, results, span)
    # which part of the run this is (the summary says it): offsets from the capture start
    source["window"] = {
        "start_ns": ctx.window_start_ns,
        "end_ns": ctx.window_end_ns,
        "offset_ns": ctx.window_start_ns - ctx.capture_start_ns,
        "selection": view.describe() or ("all steps" if ctx.steps.height else "whole GPU span"),
        "rank": opts.rank,
        "device": opts.device,
    }
    findings, data_quality = apply_data_quality(diagnose(results, opts.graded()), results.health)
    if not results.sources.stacks_recorded and any(f.id in SOURCED_RULES for f in findings):
        warnings.append(f"no Python stacks: {results.sources.hint}")
    # the regions name the findings whose evidence lies inside them (known only now)
    results = replace(results, regions=with_findings(results.regions, findings))
    return TraceAnalysis(
        what_if=all_fixes(results, findings),
        rank=source["ranks"][0] if len(source["ranks"]) == 1 else (trace.meta.rank or 0),
        source=source,
        results=results,
        metrics=results.metrics(),
        findings=findings,
        warnings=warnings,
        command=opts.command,
        trace=trace,
        data_quality=data_quality,
    )


def _one_rank(job: JobAnalysis, rank: int) -> TraceAnalysis:
    for r in job.ranks:
        if r.rank == rank:
            return r
    raise InputError(f"--rank {rank}: the job has ranks {[r.rank for r in job.ranks]}", job.path)


def _rank_rows(trace: Trace, rank: int) -> Trace:
    """One rank's rows of a multi-process export (a one-rank trace must be that rank)."""
    ranks = trace.events["rank"].drop_nulls().unique().sort().to_list()
    if rank not in ranks and not (len(ranks) <= 1 and (trace.meta.rank or 0) == rank):
        raise InputError(f"--rank {rank}: the trace has ranks {ranks}", trace.meta.source_path)
    one = len(ranks) <= 1
    return trace.view(
        trace.events.filter(pl.col("rank").eq_missing(rank) | one), rank=None if one else rank
    )


def _device_rows(trace: Trace, device: int) -> Trace:
    """The host rows and one GPU's rows (other GPUs' activity left out)."""
    ev = trace.events
    devices = ev["device"].drop_nulls().unique().sort().to_list()
    if device not in devices:
        raise InputError(
            f"--device {device}: the trace has devices {devices}", trace.meta.source_path
        )
    keep = pl.col("device").is_null() | (pl.col("device") == device)
    return trace.view(ev.filter(keep), device=device)


def load_events(path: str | Path, opts: Options | None = None) -> Trace:
    """The event table of a trace file, or of a job directory (every rank's rows, ranks as in
    :func:`analyze`)."""
    opts = opts or Options()
    p = Path(path)
    if not p.is_dir():
        return load_trace(p, max_bytes=opts.max_bytes)
    from traceinsight.jobs import load_rank_tables

    return load_rank_tables(p, opts)


def view_events(trace: Trace, opts: Options) -> Trace:
    """The rows of the view (``--rank``, ``--device``; ``--steps``/``--window``: the rows that
    overlap the analysis window those give), for ``export``."""
    if opts.rank is not None:
        trace = _rank_rows(trace, opts.rank)
    if opts.device is not None:
        trace = _device_rows(trace, opts.device)
    view = opts.view()
    if view.steps is None and view.window is None:
        return trace
    try:
        ctx = build_context(trace, opts.step_pattern, steps_sel=view.steps, window_sel=view.window)
    except ValueError as exc:
        raise InputError(str(exc), trace.meta.source_path) from None
    inside = (pl.col("end_ns") > ctx.window_start_ns) & (pl.col("start_ns") < ctx.window_end_ns)
    return trace.view(trace.events.filter(inside), window=(ctx.window_start_ns, ctx.window_end_ns))


# callchains stay out: frames of native stacks, for the sources analyzer only
EXPORTED_SIDE_TABLES = ("memory", "op_args", "kernel_args", "gpu_metrics")


def side_paths(out: Path) -> dict[str, Path]:
    """Where ``export`` writes each side table: ``OUT.memory.parquet`` beside ``OUT.parquet``."""
    stem = out.name[: -len(".parquet")] if out.name.endswith(".parquet") else out.name
    return {name: out.with_name(f"{stem}.{name}.parquet") for name in EXPORTED_SIDE_TABLES}


def export_events(trace: Trace, out: Path) -> list[Path]:
    """Write the common event table as Parquet (atomically), and beside it each side table that
    has rows (:func:`side_paths`); returns the side tables' paths."""
    with atomic_path(out) as tmp:
        trace.events.with_columns(pl.col(pl.Enum).cast(pl.String)).write_parquet(tmp)
    written = []
    for name, path in side_paths(out).items():
        table: pl.DataFrame = getattr(trace, name)
        if table.height:
            with atomic_path(path) as tmp:
                table.write_parquet(tmp)
            written.append(path)
    return written
