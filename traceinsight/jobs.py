"""Multi-rank jobs: one trace per rank in a directory, or one nsys export with several processes.

Ranks are parsed and analyzed in parallel processes; each sends back its analysis without the
event table and a small payload for the cross-rank analysis, so peak memory is one trace per
worker, not the whole job.
"""

from __future__ import annotations

from dataclasses import replace
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
from traceinsight.runtime import Runtime, process_pool


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


# A rank's analysis and payload, or None with the devices it has where --device names a GPU
# it did not use (each rank of a job usually drives its own GPU).
RankResult = tuple[TraceAnalysis | None, int | None, RankPayload | None, tuple[int, ...]]


def _analyze_rank(path: str, opts: Options, runtime: Runtime) -> RankResult:
    """Worker: parse and analyze one rank file; send back the analysis without its events."""
    trace = load_trace(
        path,
        max_bytes=opts.max_bytes,
        parse_helpers=runtime.parse_helpers,
        threads=runtime.analyzer_threads,
    )
    return _rank_result(trace, opts, runtime, trace.meta.rank or 0, detach=True)


def _rank_result(
    trace: Trace, opts: Options, runtime: Runtime | None, rank: int, *, detach: bool
) -> RankResult:
    devices = activity_devices(trace.events)
    if opts.device is not None and opts.device not in devices:
        return None, trace.meta.rank, None, devices
    a = analyze_trace(trace, opts, runtime)
    return (a.detached() if detach else a), trace.meta.rank, payload_of(a, rank), devices


def _assign_ranks(
    results: list[tuple[Path, RankResult]], warnings: list[str]
) -> list[tuple[int, TraceAnalysis | None, RankPayload | None, tuple[int, ...]]]:
    ranks, warning = choose_ranks([res[1] for _, res in results], [p for p, _ in results])
    if warning:
        warnings.append(warning)
    out = [
        (r, a.as_rank(r) if a else None, replace(p, rank=r) if p else None, devs)
        for r, (_, (a, _m, p, devs)) in zip(ranks, results, strict=True)
    ]
    return sorted(out, key=lambda t: t[0])


def _with_device(
    ranked: list[tuple[int, TraceAnalysis | None, RankPayload | None, tuple[int, ...]]],
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
    return JobAnalysis(path, ranks, cross, findings, warnings + list(cross.warnings), opts.command)


def analyze_job(
    directory: str | Path, opts: Options | None = None, runtime: Runtime | None = None
) -> JobAnalysis:
    """A directory holding one trace per rank."""
    opts = opts or Options()
    runtime = runtime or Runtime.detect(helpers=False)
    d = Path(directory)
    files = discover_rank_files(d)
    if not files:
        raise InputError(no_traces_message(d), str(d))
    workers = max(1, min(len(files), runtime.workers))
    if workers == 1:
        solo = runtime.for_workers(1) if not runtime.in_worker else runtime
        results = [(p, _analyze_rank(str(p), opts, solo)) for p in files]
    else:
        with process_pool(workers, runtime) as (pool, child):
            futs = [(p, pool.submit(_analyze_rank, str(p), opts, child)) for p in files]
            results = [(p, f.result()) for p, f in futs]
    warnings: list[str] = []
    ranked = _with_device(_assign_ranks(results, warnings), opts, str(d), warnings)
    return _job(str(d), ranked, opts, warnings)


def analyze_trace_ranks(
    trace: Trace, opts: Options | None = None, runtime: Runtime | None = None
) -> JobAnalysis:
    """One parsed trace holding several ranks (an nsys export of several processes)."""
    opts = opts or Options()
    results = []
    for rank, events in by_rank(trace.events):
        a, _, p, devs = _rank_result(
            trace.view(events, rank=rank), opts, runtime, rank, detach=False
        )
        results.append((rank, a.as_rank(rank) if a else None, p, devs))
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
