"""Multi-rank jobs: one trace per rank in a directory, or one nsys export with several processes.

Ranks are parsed and analyzed in parallel processes; each sends back its analysis without the
event table and a small payload for the cross-rank analysis, so peak memory is one trace per
worker, not the whole job.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import polars as pl

from traceinsight.analysis import JobAnalysis, TraceAnalysis
from traceinsight.analyzers.comm import with_kinds
from traceinsight.analyzers.cross_rank import (
    COLLECTIVE_SCHEMA,
    RankPayload,
    analyze_cross_rank,
    differing_tops,
)
from traceinsight.api import analyze_trace
from traceinsight.errors import InputError
from traceinsight.findings import RankFindings, diagnose_job
from traceinsight.findings.job_rules import transfer_only
from traceinsight.model import intervals as iv
from traceinsight.model.classify import KERNEL_RULES, names_matching
from traceinsight.model.schema import GPU_ACTIVITY_KINDS, SIDE_TABLES, Trace, by_rank
from traceinsight.options import Options
from traceinsight.parsers import load_trace
from traceinsight.runtime import Runtime, process_pool

TRACE_SUFFIXES = (".json", ".json.gz", ".sqlite", ".nsys-rep")
COLLECTIVE_KERNEL = KERNEL_RULES[0][1]  # the communication rule's name pattern
RANK_IN_NAME = re.compile(r"(?:rank|worker)[-_.]?(\d+)", re.IGNORECASE)


def discover_rank_files(directory: Path) -> list[Path]:
    """Trace files of a job directory: ``*.pt.trace.json[.gz]`` if any, else any trace-like file."""
    files = sorted(p for p in directory.iterdir() if p.is_file())
    kineto = [p for p in files if ".pt.trace.json" in p.name]
    if kineto:
        return kineto
    return [
        p for p in files if p.name.endswith(TRACE_SUFFIXES) and not p.name.endswith(".truth.json")
    ]


def rank_from_name(name: str) -> int | None:
    m = RANK_IN_NAME.search(name)
    return int(m.group(1)) if m else None


def rank_payload(analysis: TraceAnalysis, rank: int) -> RankPayload:
    """The rank's collective kernels (by name: NCCL/RCCL, not helper kernels launched under a
    collective op) on its first GPU, each tagged with its kind and the step it ran in, and the
    union of that GPU's compute kernels in the window (what waiting can hide behind)."""
    if analysis.trace is None:
        raise ValueError("rank_payload needs the analysis with its event table")
    ev = analysis.trace.events
    kernels = ev.filter(pl.col("kind") == "kernel")
    comm = names_matching(kernels, f"(?i){COLLECTIVE_KERNEL}")
    steps = analysis.results.steps.per_step
    if steps:
        lo, hi = min(s["start_ns"] for s in steps), max(s["end_ns"] for s in steps)
    else:
        gpu = ev.filter(pl.col("kind").is_in(GPU_ACTIVITY_KINDS))
        span = gpu if gpu.height else ev
        lo, hi = (int(span["start_ns"].min() or 0), int(span["end_ns"].max() or 0))
    compute = kernels.head(0)
    if comm.height:
        first_dev = comm["device"].min()
        comm = with_kinds(
            comm.filter(pl.col("device") == first_dev).sort("start_ns"),
            ev,
            analysis.trace.kernel_args,
        )
        compute = kernels.filter(
            (pl.col("device") == first_dev) & (pl.col("kernel_class") != "communication")
        )
        if steps:
            st = pl.DataFrame(
                {
                    "step": [s["step"] for s in steps],
                    "s_s": [s["start_ns"] for s in steps],
                    "s_e": [s["end_ns"] for s in steps],
                }
            )
            # A collective still running when the window opens is the first step's (its waiting
            # is clipped to the window): dropping it would pair the later ones off by one.
            comm = (
                comm.join_asof(st, left_on="start_ns", right_on="s_s", strategy="backward")
                .filter(
                    pl.when(pl.col("s_s").is_null())
                    .then(pl.col("end_ns") > lo)
                    .otherwise(pl.col("start_ns") < pl.col("s_e"))
                )
                .with_columns(pl.col("step").fill_null(st["step"][0]))
            )
        else:
            comm = comm.with_columns(pl.lit(0, pl.Int64).alias("step"))
    else:
        comm = comm.with_columns(pl.lit("other").alias("kind"), pl.lit(0, pl.Int64).alias("step"))
    return RankPayload(
        rank=rank,
        window_ns=analysis.results.idle.window_ns,
        collectives=comm.select(list(COLLECTIVE_SCHEMA)).cast(COLLECTIVE_SCHEMA),
        step_times_ns=tuple(s["dur_ns"] for s in steps),
        step_starts_ns=tuple(s["start_ns"] for s in steps),
        top_finding=analysis.findings[0].id if analysis.findings else None,
        steps=tuple(s["step"] for s in steps),
        window_start_ns=lo,
        window_end_ns=hi,
        compute_busy=iv.clip(iv.union(compute), lo, hi),
    )


def _analyze_rank(
    path: str, opts: Options, runtime: Runtime
) -> tuple[TraceAnalysis, int | None, RankPayload]:
    """Worker: parse and analyze one rank file; send back the analysis without its events."""
    trace = load_trace(
        path,
        max_bytes=opts.max_bytes,
        parse_helpers=runtime.parse_helpers,
        threads=runtime.analyzer_threads,
    )
    a = analyze_trace(trace, opts, runtime)
    return a.detached(), trace.meta.rank, rank_payload(a, trace.meta.rank or 0)


def choose_ranks(meta: list[int | None], paths: list[Path]) -> tuple[list[int], str | None]:
    """Ranks from distributedInfo, else from file names, else sorted order (with a warning)."""
    if all(r is not None for r in meta) and len(set(meta)) == len(meta):
        return [int(r) for r in meta if r is not None], None
    named = [rank_from_name(p.name) for p in paths]
    if all(r is not None for r in named) and len(set(named)) == len(named):
        return [
            int(r) for r in named if r is not None
        ], "ranks taken from file names (no usable distributedInfo)"
    return list(
        range(len(paths))
    ), "ranks could not be read from distributedInfo or file names; numbered in sorted file order"


def _assign_ranks(
    results: list[tuple[Path, tuple[TraceAnalysis, int | None, RankPayload]]], warnings: list[str]
) -> list[tuple[int, TraceAnalysis, RankPayload]]:
    ranks, warning = choose_ranks([res[1] for _, res in results], [p for p, _ in results])
    if warning:
        warnings.append(warning)
    out = [
        (r, a.as_rank(r), replace(p, rank=r))
        for r, (_, (a, _m, p)) in zip(ranks, results, strict=True)
    ]
    return sorted(out, key=lambda t: t[0])


def _job(
    path: str,
    ranked: list[tuple[int, TraceAnalysis, RankPayload]],
    opts: Options,
    warnings: list[str],
) -> JobAnalysis:
    cross = analyze_cross_rank([p for _, _, p in ranked])
    t = opts.graded()
    # Each rank's communication findings on its transfer time: its waiting is the straggler's.
    ranks = [
        replace(
            a,
            findings=transfer_only(a.results, a.findings, cross.comm_split.get(str(a.rank), {}), t),
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
    findings = diagnose_job(cross, per, t)
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
        raise InputError(
            "directory holds no trace files (*.pt.trace.json[.gz], *.json, *.sqlite)", str(d)
        )
    workers = max(1, min(len(files), runtime.workers))
    if workers == 1:
        solo = runtime.for_workers(1) if not runtime.in_worker else runtime
        results = [(p, _analyze_rank(str(p), opts, solo)) for p in files]
    else:
        with process_pool(workers, runtime) as (pool, child):
            futs = [(p, pool.submit(_analyze_rank, str(p), opts, child)) for p in files]
            results = [(p, f.result()) for p, f in futs]
    warnings: list[str] = []
    ranked = _assign_ranks(results, warnings)
    return _job(str(d), ranked, opts, warnings)


def analyze_trace_ranks(
    trace: Trace, opts: Options | None = None, runtime: Runtime | None = None
) -> JobAnalysis:
    """One parsed trace holding several ranks (an nsys export of several processes)."""
    opts = opts or Options()
    ranked = []
    for rank, events in by_rank(trace.events):
        a = analyze_trace(trace.view(events, rank=rank), opts, runtime)
        ranked.append((rank, a.as_rank(rank), rank_payload(a, rank)))
    return _job(trace.meta.source_path, ranked, opts, list(trace.meta.warnings))


def load_rank_tables(directory: Path, opts: Options) -> Trace:
    """Every rank file's events in one table, the ``rank`` column set as :func:`analyze_job`
    numbers the ranks (one file at a time: this is for ``export``)."""
    files = discover_rank_files(directory)
    if not files:
        raise InputError(
            "directory holds no trace files (*.pt.trace.json[.gz], *.json, *.sqlite)",
            str(directory),
        )
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
