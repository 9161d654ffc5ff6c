"""The library's one entry point: :func:`analyze` decides what an input is and analyzes it.

A trace file gives a :class:`TraceAnalysis`; a directory of rank traces, or one Nsight export
holding several processes, gives a :class:`JobAnalysis`. Every command calls this.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import polars as pl

from traceinsight import jobs
from traceinsight.analysis import JobAnalysis, TraceAnalysis, quality_errors
from traceinsight.errors import InputError, OutputError
from traceinsight.inputs import ARCHIVE_SUFFIXES
from traceinsight.io import atomic_path
from traceinsight.model.schema import GPU_ACTIVITY_KINDS, Trace
from traceinsight.options import Options
from traceinsight.parsers import load_trace
from traceinsight.pipeline import analyze_trace, graded, rank_rows, view_events
from traceinsight.runtime import Runtime

__all__ = [
    "analyze",
    "analyze_trace",
    "analyze_with",
    "export_events",
    "export_format",
    "load_events",
    "quality_errors",
    "side_paths",
    "view_events",
]


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
    what_if: Sequence[str] = (),
    scheduler: str | None = None,
) -> TraceAnalysis | JobAnalysis:
    """Analyze a trace file, a directory of rank traces, or a multi-process Nsight export.

    ``runtime`` says how much of the machine to use (default: every core, no decoder helper
    processes; worker processes never re-run the caller's script: no ``__main__`` guard is
    needed). The view:
    ``steps`` ``"A..B"``, ``window`` ``"START:END"`` (``2s:4s``, from the capture start),
    ``rank`` (one rank of a job), ``device`` (one GPU's activity); ``replay`` runs the causal
    step model too (``details.replay``); ``what_if``: finding ids whose fixes are replayed
    together (``details.what_if.selected``); ``scheduler``: a job's ranks as Dask tasks on that
    scheduler (``"tcp://host:8786"``, or ``"local"`` for a LocalCluster of ``runtime.workers``),
    the same result as local processes."""
    opts = Options(
        dict(thresholds or {}),
        step_range,
        max_bytes,
        command,
        steps,
        window,
        rank,
        device,
        replay,
        tuple(what_if),
    )
    runtime = runtime or Runtime.detect(helpers=False)
    if scheduler is not None:
        runtime = replace(runtime, scheduler=scheduler)
    return analyze_with(Path(path), opts, runtime)


def analyze_with(path: Path, opts: Options, runtime: Runtime) -> TraceAnalysis | JobAnalysis:
    """:func:`analyze` with the options already gathered (what commands and workers call)."""
    graded(opts)  # unknown threshold names fail before any parsing
    refuse_archive(path)
    if path.is_dir():
        job = jobs.analyze_job(path, opts, runtime)
        return job if opts.rank is None else _one_rank(job, opts.rank)
    trace = load_trace(
        path,
        max_bytes=opts.max_bytes,
        parse_helpers=runtime.parse_helpers,
        threads=runtime.analyzer_threads,
    )
    if opts.rank is not None:
        trace = rank_rows(trace, opts.rank)
    elif trace.events["rank"].n_unique() > 1:
        trace = without_idle_processes(trace)
    if trace.events["rank"].n_unique() > 1:
        return jobs.analyze_trace_ranks(trace, opts, runtime)
    return analyze_trace(trace, opts, runtime)


def without_idle_processes(trace: Trace) -> Trace:
    """A multi-process export less the processes that ran no GPU work while others did (a test
    runner's helper with two CUDA calls made a one-GPU nvFuser export a two-rank job, audit 8),
    said in a warning; the trace as it is where none or each of them ran some."""
    ev = trace.events
    working = (
        ev.lazy()
        .filter(pl.col("kind").is_in(GPU_ACTIVITY_KINDS))
        .select(pl.col("rank").unique())
        .collect()
        .get_column("rank")
        .drop_nulls()
    )
    ranks = ev.get_column("rank").drop_nulls().unique()
    idle = ranks.filter(~ranks.is_in(working.implode())).sort().to_list()
    if working.len() == 0 or not idle:
        return trace
    kept = ev.filter(pl.col("rank").is_in(working.implode()))
    what = "process" if len(idle) == 1 else "processes"
    note = f"{len(idle)} {what} with no GPU work left out (ranks {idle}): not a rank of the job"
    one = working.len() == 1
    view = trace.view(kept, rank=int(working[0]) if one else None)
    meta = replace(
        view.meta,
        warnings=(*view.meta.warnings, note),
        world_size=working.len() if not one else None,
    )
    return replace(view, meta=meta)


def refuse_archive(path: Path) -> None:
    """A .tar[.gz] holds many traces: ``batch``'s input, named so, not a parse error."""
    if path.name.endswith(ARCHIVE_SUFFIXES) and path.is_file():
        raise InputError(
            f"is an archive, not a trace: for the traces in it run 'traceinsight batch {path} "
            "-o OUTDIR'",
            str(path),
        )


def _one_rank(job: JobAnalysis, rank: int) -> TraceAnalysis:
    for r in job.ranks:
        if r.rank == rank:
            return r
    # with --device the job holds only the ranks that ran on that GPU: its warning says which not
    left_out = next((w for w in job.warnings if w.startswith("--device ")), None)
    raise InputError(
        f"--rank {rank}: the job has ranks {[r.rank for r in job.ranks]}"
        + (f" ({left_out})" if left_out else ""),
        job.path,
    )


def load_events(path: str | Path, opts: Options | None = None) -> Trace:
    """The event table of a trace file, or of a job directory (every rank's rows, ranks as in
    :func:`analyze`)."""
    opts = opts or Options()
    p = Path(path)
    refuse_archive(p)
    if not p.is_dir():
        return load_trace(p, max_bytes=opts.max_bytes)
    return jobs.load_rank_tables(p, opts)


# callchains stay out: frames of native stacks, for the sources analyzer only
EXPORTED_SIDE_TABLES = ("memory", "op_args", "kernel_args", "gpu_metrics")
# export's formats by the output's suffix (every table is flat: CSV holds them too)
EXPORT_FORMATS = {
    ".parquet": "parquet",
    ".csv": "csv",
    ".arrow": "ipc",
    ".feather": "ipc",
    ".ndjson": "ndjson",
    ".jsonl": "ndjson",
}


def export_format(out: Path) -> str:
    """The format ``out``'s suffix names; OutputError (exit 2) for any other suffix."""
    fmt = EXPORT_FORMATS.get(out.suffix.lower())
    if fmt is None:
        raise OutputError(
            f"unknown suffix {out.suffix or '(none)'!r}: export writes "
            f"{', '.join(EXPORT_FORMATS)} (the format follows the suffix)",
            str(out),
        )
    return fmt


def side_paths(out: Path) -> dict[str, Path]:
    """Where ``export`` writes each side table: ``OUT.memory.parquet`` beside ``OUT.parquet``
    (``OUT.memory.csv`` beside ``OUT.csv``)."""
    stem = out.name.removesuffix(out.suffix)
    return {name: out.with_name(f"{stem}.{name}{out.suffix}") for name in EXPORTED_SIDE_TABLES}


def _write_table(table: pl.DataFrame, out: Path, fmt: str) -> None:
    table = table.with_columns(pl.col(pl.Enum).cast(pl.String))  # plain strings in every format
    with atomic_path(out) as tmp:
        getattr(table, f"write_{fmt}")(tmp)


def export_events(trace: Trace, out: Path) -> list[Path]:
    """Write the common event table in the format ``out``'s suffix names (atomically), and
    beside it each side table that has rows (:func:`side_paths`); returns the side tables'
    paths."""
    fmt = export_format(out)
    _write_table(trace.events, out, fmt)
    written = []
    for name, path in side_paths(out).items():
        table: pl.DataFrame = getattr(trace, name)
        if table.height:
            _write_table(table, path, fmt)
            written.append(path)
    return written
