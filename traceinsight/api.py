"""The library's one entry point: :func:`analyze` decides what an input is and analyzes it.

A trace file gives a :class:`TraceAnalysis`; a directory of rank traces, or one Nsight export
holding several processes, gives a :class:`JobAnalysis`. Every command calls this.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import polars as pl

from traceinsight.analysis import JobAnalysis, TraceAnalysis, source_json
from traceinsight.analyzers import run_analyzers
from traceinsight.analyzers.context import build_context
from traceinsight.analyzers.sources import STACK_HINT
from traceinsight.findings import diagnose
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
) -> TraceAnalysis | JobAnalysis:
    """Analyze a trace file, a directory of rank traces, or a multi-process Nsight export.

    ``runtime`` says how much of the machine to use (default: every core, no decoder helper
    processes, since those need the caller's ``if __name__ == "__main__":`` guard)."""
    opts = Options(dict(thresholds or {}), step_range, max_bytes, command)
    return analyze_with(Path(path), opts, runtime or Runtime.detect(helpers=False))


def analyze_with(path: Path, opts: Options, runtime: Runtime) -> TraceAnalysis | JobAnalysis:
    """:func:`analyze` with the options already gathered (what commands and workers call)."""
    opts.graded()  # unknown threshold names fail before any parsing
    if path.is_dir():
        from traceinsight.jobs import analyze_job

        return analyze_job(path, opts, runtime)
    trace = load_trace(
        path,
        max_bytes=opts.max_bytes,
        parse_helpers=runtime.parse_helpers,
        threads=runtime.analyzer_threads,
    )
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
    ctx = build_context(trace, opts.step_pattern, runtime.analyzer_threads)
    results = run_analyzers(ctx, runtime.analyzer_threads)
    ev = trace.events
    span = int(ev["end_ns"].max() - ev["start_ns"].min()) if ev.height else 0
    warnings = list(trace.meta.warnings)
    if not ctx.has_gpu:
        warnings.append("no GPU activity in this trace: GPU metrics are not applicable")
    if ctx.steps.height == 0 and ctx.has_gpu:
        warnings.append("no ProfilerStep/step ranges: the whole GPU span is analyzed as one window")
    source = source_json(trace, results, span)
    findings, data_quality = apply_data_quality(diagnose(results, opts.graded()), results.health)
    if not results.sources.stacks_recorded and any(f.id in SOURCED_RULES for f in findings):
        warnings.append(f"no Python stacks: {STACK_HINT}")
    return TraceAnalysis(
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


def load_events(path: str | Path, opts: Options | None = None) -> Trace:
    """The event table of a trace file, or of a job directory (every rank's rows, ranks as in
    :func:`analyze`)."""
    opts = opts or Options()
    p = Path(path)
    if not p.is_dir():
        return load_trace(p, max_bytes=opts.max_bytes)
    from traceinsight.jobs import load_rank_tables

    return load_rank_tables(p, opts)


def export_events(trace: Trace, out: Path) -> None:
    """Write the common event table as Parquet (atomically)."""
    with atomic_path(out) as tmp:
        trace.events.with_columns(pl.col(pl.Enum).cast(pl.String)).write_parquet(tmp)
