"""Multi-rank jobs: one trace per rank in a directory, or one nsys export with several processes.

Ranks are parsed and analyzed in parallel, in local worker processes or as Dask tasks
(``Runtime.scheduler``): each sends back a :class:`RankSummary` (its analysis without the event
table, and the small tables the cross-rank analysis reads), and the job is merged from those
alone, so peak memory is one trace per worker and the summaries in the client, not the whole
job.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import polars as pl

from traceinsight.analysis import JobAnalysis, TraceAnalysis, job_framework
from traceinsight.analyzers.context import activity_devices
from traceinsight.analyzers.cross_rank import (
    RankPayload,
    analyze_cross_rank,
    differing_tops,
    rank_payload,
)
from traceinsight.errors import InputError
from traceinsight.findings import RankFindings, diagnose_job
from traceinsight.findings.job_rules import transfer_only
from traceinsight.inputs import choose_ranks, discover_rank_files, no_traces_message
from traceinsight.model.schema import SIDE_TABLES, Trace, by_rank
from traceinsight.options import Options
from traceinsight.parsers import load_trace
from traceinsight.pipeline import analyze_trace, graded
from traceinsight.runtime import (
    DASK_TASK_RUNTIME,
    Runtime,
    dask_client,
    peak_rss_bytes,
    process_pool,
)


def payload_of(analysis: TraceAnalysis, rank: int) -> RankPayload:
    """What the cross-rank analysis needs of one rank's analysis (its event table still held)."""
    if analysis.trace is None:
        raise ValueError("payload_of needs the analysis with its event table")
    return rank_payload(
        analysis.trace,
        analysis.results.steps.per_step,
        analysis.results.idle.window_ns,
        analysis.findings[0].id if analysis.findings else None,
        rank,
    )


@dataclass(frozen=True)
class RankSummary:
    """What a worker sends back for one rank file, the job merged from these alone.

    ``analysis``: the rank's analysis without its event table or step model (results, metrics,
    findings, the per-step kernel table: what the job document and the per-rank communication
    rules read); ``payload``: the cross-rank tables (its collectives, steps, compute union).
    Both None where ``--device`` names a GPU the rank did not use (``devices``: those it did)."""

    path: str
    meta_rank: int | None  # the rank its metadata names, before the job numbers the ranks
    analysis: TraceAnalysis | None
    payload: RankPayload | None
    devices: tuple[int, ...]
    worker_peak_rss_bytes: int = 0  # the worker process's peak so far (what to size one by)


def summarize_rank(path: str, opts: Options, runtime: Runtime) -> RankSummary:
    """Worker (local process or Dask task): parse and analyze one rank file into its
    :class:`RankSummary`; the event table stays in the worker."""
    trace = load_trace(
        path,
        max_bytes=opts.max_bytes,
        parse_helpers=runtime.parse_helpers,
        threads=runtime.analyzer_threads,
    )
    s = _summary(path, trace, opts, runtime, trace.meta.rank or 0, detach=True)
    return replace(s, worker_peak_rss_bytes=peak_rss_bytes())


def _summary(
    path: str, trace: Trace, opts: Options, runtime: Runtime | None, rank: int, *, detach: bool
) -> RankSummary:
    devices = activity_devices(trace.events)
    if opts.device is not None and opts.device not in devices:
        return RankSummary(path, trace.meta.rank, None, None, devices)
    a = analyze_trace(trace, opts, runtime)
    return RankSummary(
        path, trace.meta.rank, a.detached() if detach else a, payload_of(a, rank), devices
    )


Ranked = list[tuple[int, TraceAnalysis | None, RankPayload | None, tuple[int, ...]]]


def _assign_ranks(summaries: list[RankSummary], warnings: list[str]) -> Ranked:
    ranks, warning = choose_ranks(
        [s.meta_rank for s in summaries], [Path(s.path) for s in summaries]
    )
    if warning:
        warnings.append(warning)
    out = [
        (
            r,
            s.analysis.as_rank(r) if s.analysis else None,
            replace(s.payload, rank=r) if s.payload else None,
            s.devices,
        )
        for r, s in zip(ranks, summaries, strict=True)
    ]
    return sorted(out, key=lambda t: t[0])


def _with_device(
    ranked: Ranked,
    opts: Options,
    path: str,
    warnings: list[str],
) -> list[tuple[int, TraceAnalysis, RankPayload]]:
    """``--device`` on a job: each rank's rows on that GPU; the ranks that ran nothing on it
    are left out, in one warning line (all of them: refused, with each rank's devices)."""
    kept = [(r, a, p) for r, a, p, _ in ranked if a is not None and p is not None]
    missing = [(r, devs) for r, a, _, devs in ranked if a is None]
    if not missing:
        return kept
    by_rank = "; ".join(f"rank {r}: {list(devs)}" for r, devs in missing)
    if not kept:
        all_ranks = "; ".join(f"rank {r}: {list(devs)}" for r, _, _, devs in ranked)
        raise InputError(
            f"--device {opts.device}: no rank has GPU activity on it; devices by rank: {all_ranks}",
            path,
        )
    warnings.append(
        f"--device {opts.device}: {'rank' if len(missing) == 1 else 'ranks'} without GPU "
        f"activity on it left out ({by_rank})"
    )
    return kept


def _job(
    path: str,
    ranked: list[tuple[int, TraceAnalysis, RankPayload]],
    opts: Options,
    warnings: list[str],
) -> JobAnalysis:
    cross = analyze_cross_rank([p for _, _, p in ranked])
    t = graded(opts)
    # Each rank's communication findings on its transfer time: its waiting is the straggler's.
    ranks = [
        replace(
            a,
            findings=transfer_only(
                a.results,
                a.findings,
                cross.comm_split.get(str(a.rank), {}),
                t,
                a.source["framework"],
            ),
        )
        for _, a, _ in ranked
    ]
    cross = replace(
        cross,
        differing_diagnosis=differing_tops(
            {str(a.rank): a.findings[0].id if a.findings else None for a in ranks}
        ),
    )
    per = [
        RankFindings(
            a.rank,
            a.results.idle.device_window_ns,
            a.findings,
        )
        for a in ranks
    ]
    framework = job_framework(a.source["framework"] for a in ranks)
    findings = diagnose_job(cross, per, t, framework)
    recorded = max((a.source.get("world_size") or 0 for a in ranks), default=0)
    if recorded > len(ranks):
        # a subset of the job's ranks (HTA's sampled traces: 2 of 128): the cross-rank view,
        # the straggler included, covers these only (audit 12)
        warnings = [
            *warnings,
            f"{len(ranks)} of the job's {recorded} ranks are here (their traces record a world "
            f"size of {recorded}): the cross-rank analysis, the straggler included, covers "
            "these ranks only",
        ]
    return JobAnalysis(path, ranks, cross, findings, warnings + list(cross.warnings), opts.command)


def analyze_job(
    directory: str | Path, opts: Options | None = None, runtime: Runtime | None = None
) -> JobAnalysis:
    """A directory holding one trace per rank: its ranks summarized by workers (local processes,
    or Dask tasks with ``runtime.scheduler``), the job merged from the summaries."""
    opts = opts or Options()
    runtime = runtime or Runtime.detect(helpers=False)
    return merge_job(directory, rank_summaries(directory, opts, runtime), opts)


def rank_summaries(directory: str | Path, opts: Options, runtime: Runtime) -> list[RankSummary]:
    """Each rank file's :class:`RankSummary`, in file order: one function, two executors."""
    d = Path(directory)
    files = discover_rank_files(d)
    if not files:
        raise InputError(no_traces_message(d), str(d))
    paths = [str(p) for p in files]
    if runtime.scheduler and not runtime.in_worker:
        return _on_dask(paths, opts, runtime.scheduler, runtime.workers)
    workers = max(1, min(len(files), runtime.workers))
    if workers == 1:
        solo = runtime.for_workers(1) if not runtime.in_worker else runtime
        return [summarize_rank(p, opts, solo) for p in paths]
    with process_pool(workers, runtime) as (pool, child):
        futs = [pool.submit(summarize_rank, p, opts, child) for p in paths]
        return [f.result() for f in futs]


def _on_dask(paths: list[str], opts: Options, scheduler: str, workers: int) -> list[RankSummary]:
    """The ranks as Dask tasks; every worker must read the rank files at these paths. Each
    summary is fetched as its task ends and released there: a worker keeps a task's result
    until the client lets it go, and gathering them at the end left every summary in its
    worker's memory until the last rank was done."""
    with dask_client(scheduler, min(workers, len(paths))) as client:
        from dask.distributed import as_completed  # there: dask_client found dask

        futs = client.map(summarize_rank, paths, opts=opts, runtime=DASK_TASK_RUNTIME, pure=False)
        slot = {f.key: i for i, f in enumerate(futs)}
        out: list[RankSummary | None] = [None] * len(paths)
        done = as_completed(futs)
        del futs  # the iterator holds each future until it is yielded
        for fut in done:
            out[slot[fut.key]] = fut.result()
            fut.release()
        return [s for s in out if s is not None]


def merge_job(directory: str | Path, summaries: list[RankSummary], opts: Options) -> JobAnalysis:
    """The job from its ranks' summaries (the client's part: no event table here)."""
    warnings: list[str] = []
    d = str(Path(directory))
    ranked = _with_device(_assign_ranks(summaries, warnings), opts, d, warnings)
    return _job(d, ranked, opts, warnings)


def analyze_trace_ranks(
    trace: Trace, opts: Options | None = None, runtime: Runtime | None = None
) -> JobAnalysis:
    """One parsed trace holding several ranks (an nsys export of several processes)."""
    opts = opts or Options()
    results = []
    for rank, events in by_rank(trace.events):
        s = _summary(
            trace.meta.source_path, trace.view(events, rank=rank), opts, runtime, rank, detach=False
        )
        a = s.analysis
        results.append((rank, a.as_rank(rank) if a else None, s.payload, s.devices))
    warnings = list(trace.meta.warnings)
    ranked = _with_device(results, opts, trace.meta.source_path, warnings)
    return _job(trace.meta.source_path, ranked, opts, warnings)


def load_rank_tables(directory: Path, opts: Options) -> Trace:
    """Every rank file's events in one table, the ``rank`` column set as :func:`analyze_job`
    numbers the ranks (one file at a time: this is for ``export``)."""
    files = discover_rank_files(directory)
    if not files:
        raise InputError(no_traces_message(directory), str(directory))
    traces = [load_trace(p, max_bytes=opts.max_bytes) for p in files]
    ranks, _ = choose_ranks([t.meta.rank for t in traces], files)

    def stacked(table: str) -> pl.DataFrame:
        return pl.concat(
            [
                getattr(t, table).with_columns(pl.lit(r, pl.Int32).alias("rank"))
                for r, t in zip(ranks, traces, strict=True)
            ]
        )

    first = traces[0].meta
    return Trace(
        events=stacked("events"),
        meta=replace(first, source_path=str(directory), rank=None, world_size=len(files)),
        **{name: stacked(name) for name in SIDE_TABLES},
    )
