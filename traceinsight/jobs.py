"""Multi-rank jobs: one trace per rank in a directory, or one nsys export with several processes.

Ranks are parsed and analyzed in parallel processes; each returns only its JSON result and a small
payload for the cross-rank analysis, so peak memory is one trace per worker, not the whole job.
"""

from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from traceinsight import __version__
from traceinsight.analyzers.cross_rank import CrossRankResult, RankPayload, analyze_cross_rank
from traceinsight.diagnosis import SEVERITIES, Finding, Thresholds
from traceinsight.errors import InputError
from traceinsight.model.classify import KERNEL_RULES, names_matching
from traceinsight.parallel import process_pool

TRACE_SUFFIXES = (".json", ".json.gz", ".sqlite", ".nsys-rep")
COLLECTIVE_KERNEL = KERNEL_RULES[0][1]  # the communication rule's name pattern
RANK_IN_NAME = re.compile(r"(?:rank|worker)[-_.]?(\d+)", re.IGNORECASE)


def discover_rank_files(directory: Path) -> list[Path]:
    """Trace files of a job directory: ``*.pt.trace.json[.gz]`` if any, else any trace-like file."""
    files = sorted(p for p in directory.iterdir() if p.is_file())
    kineto = [p for p in files if ".pt.trace.json" in p.name]
    if kineto:
        return kineto
    return [p for p in files if p.name.endswith(TRACE_SUFFIXES) and not p.name.endswith(".truth.json")]


def rank_from_name(name: str) -> int | None:
    m = RANK_IN_NAME.search(name)
    return int(m.group(1)) if m else None


def _payload(analysis: Any, rank: int) -> RankPayload:
    """The rank's collective kernels (by name: NCCL/RCCL, not helper kernels launched under a
    collective op), each tagged with the step it ran in."""
    ev = analysis.trace.events
    comm = names_matching(ev.filter(pl.col("kind") == "kernel"), f"(?i){COLLECTIVE_KERNEL}")
    steps = analysis.results["steps"].per_step
    if comm.height:
        first_dev = comm["device"].min()
        comm = comm.filter(pl.col("device") == first_dev).sort("start_ns")
        if steps:
            st = pl.DataFrame({"step": [s["step"] for s in steps], "s_s": [s["start_ns"] for s in steps], "s_e": [s["end_ns"] for s in steps]})
            comm = comm.join_asof(st, left_on="start_ns", right_on="s_s", strategy="backward").filter(pl.col("start_ns") < pl.col("s_e"))
        else:
            comm = comm.with_columns(pl.lit(0, pl.Int64).alias("step"))
    else:
        comm = comm.with_columns(pl.lit(0, pl.Int64).alias("step"))
    return RankPayload(
        rank=rank,
        window_ns=analysis.results["idle"].window_ns,
        collectives=tuple(comm.select("name", "start_ns", "end_ns", "step").iter_rows()),
        step_times_ns=tuple(s["dur_ns"] for s in steps),
        step_starts_ns=tuple(s["start_ns"] for s in steps),
        top_finding=analysis.findings[0].id if analysis.findings else None,
    )


def _analyze_rank(path: str, max_bytes: int | None, thresholds: dict[str, float]) -> dict[str, Any]:
    """Worker: parse and analyze one rank file; return only small, picklable results."""
    from traceinsight.api import analyze_path

    a = analyze_path(path, max_bytes=max_bytes, thresholds=Thresholds.from_overrides(thresholds))
    return {"doc": a.to_json(), "meta_rank": a.trace.meta.rank, "payload": asdict(_payload(a, a.trace.meta.rank or 0))}


@dataclass
class JobAnalysis:
    source: str
    ranks: list[dict[str, Any]]  # rank, path, doc
    cross: CrossRankResult
    findings: list[Finding]
    warnings: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        docs = [r["doc"] for r in self.ranks]
        busy = [d["metrics"]["gpu_busy_ratio"] for d in docs if d["metrics"]["gpu_busy_ratio"] is not None]
        medians = [d["metrics"]["step_time_median_ns"] for d in docs if d["metrics"]["step_time_median_ns"] is not None]
        counts: dict[str, int] = {}
        for d in docs:
            for k, v in d["source"]["event_counts"].items():
                counts[k] = counts.get(k, 0) + v
        devices = [dict(dev, rank=r["rank"]) for r in self.ranks for dev in r["doc"]["source"]["devices"]]
        return {
            "schema": "traceinsight/1",
            "kind": "job",
            "tool": {"name": "traceinsight", "version": __version__},
            "command": None,
            "source": {
                "path": self.source,
                "format": docs[0]["source"]["format"] if docs else None,
                "format_version": docs[0]["source"]["format_version"] if docs else None,
                "ranks": [r["rank"] for r in self.ranks],
                "world_size": len(self.ranks),
                "backend": docs[0]["source"].get("backend") if docs else None,
                "devices": devices,
                "span_ns": max((d["source"]["span_ns"] for d in docs), default=0),
                "event_counts": counts,
            },
            "metrics": {
                "ranks": len(self.ranks),
                "gpu_busy_ratio_mean": sum(busy) / len(busy) if busy else None,
                "gpu_busy_ratio_min": min(busy) if busy else None,
                "step_time_median_ns": sorted(medians)[len(medians) // 2] if medians else None,
                "step_skew_mean_ns": self.cross.step_skew_mean_ns,
                "straggler_rank": self.cross.straggler_rank,
                "straggler_wait_ns": self.cross.wait_caused_ns,
                "per_rank": {str(r["rank"]): r["doc"]["metrics"] for r in self.ranks},
            },
            "findings": [f.to_json() for f in self.findings],
            "warnings": self.warnings,
            "ranks": [
                {"rank": r["rank"], "path": r["path"], "metrics": r["doc"]["metrics"], "findings": r["doc"]["findings"], "warnings": r["doc"]["warnings"]}
                for r in self.ranks
            ],
            "step_table": self._step_table(),
            "details": {"cross_rank": asdict(self.cross)},
        }

    def _step_table(self) -> list[dict[str, Any]]:
        """Step number -> each rank's step time (ranks in the job's order), for steps all ranks have."""
        per = [{s["step"]: s["dur_ns"] for s in r["doc"]["details"]["steps"]["per_step"]} for r in self.ranks]
        common = sorted(set.intersection(*(set(p) for p in per))) if per else []
        return [{"step": st, "times": [p[st] for p in per]} for st in common[:200]]


def _assign_ranks(results: list[tuple[Path, dict[str, Any]]], warnings: list[str]) -> list[tuple[int, Path, dict[str, Any]]]:
    meta = [res["meta_rank"] for _, res in results]
    if all(r is not None for r in meta) and len(set(meta)) == len(meta):
        ranks = meta
    else:
        named = [rank_from_name(p.name) for p, _ in results]
        if all(r is not None for r in named) and len(set(named)) == len(named):
            ranks = named
            warnings.append("ranks taken from file names (no usable distributedInfo)")
        else:
            ranks = list(range(len(results)))
            warnings.append("ranks could not be read from distributedInfo or file names; numbered in sorted file order")
    return sorted(((int(r), p, res) for r, (p, res) in zip(ranks, results, strict=True)), key=lambda t: t[0])


def job_findings(cross: CrossRankResult, rank_docs: list[dict[str, Any]], t: Thresholds | None = None) -> list[Finding]:
    """The job's findings: the straggler, then each per-rank finding once (worst rank's cost)."""
    t = t or Thresholds()
    out: list[Finding] = []
    windows = [d["metrics"]["span_ns"] or 0 for d in rank_docs]
    others = max(1, len(rank_docs) - 1)
    if cross.straggler_rank is not None:
        window = max(windows or [1]) or 1
        share = cross.wait_caused_ns / (window * others)
        if share >= t.straggler_wait_share:
            sev = "high" if share >= t.high_share else "medium" if share >= t.medium_share else "low"
            out.append(
                Finding(
                    "straggler",
                    sev,
                    f"Rank {cross.straggler_rank} is a straggler: it arrives last at {100 * (cross.straggler_last_share or 0):.0f}% of "
                    f"collectives, making the other ranks wait {cross.wait_caused_ns / 1e6:.2f} ms in NCCL",
                    cross.wait_caused_ns,
                    min(1.0, share),
                    {
                        "rank": cross.straggler_rank,
                        "steps": list(cross.straggler_steps),
                        "wait_caused_ns": cross.wait_caused_ns,
                        "last_share": cross.straggler_last_share,
                        "wait_by_rank_ns": cross.wait_by_rank_ns,
                        "matched_collectives": cross.matched_collectives,
                        "worst_collectives": list(cross.worst_collectives[:5]),
                        "step_time_median_ns": cross.step_time_median_ns,
                    },
                    "Find what the slow rank does before each collective that the others do not: uneven data "
                    "shards or sequence lengths, extra host work (logging, checkpointing on rank 0/1), a slower "
                    "or throttled GPU, a noisy neighbour on its host.",
                    "# compare ranks side by side: traceinsight analyze TRACE_DIR\n"
                    "# balance work: pad/bucket sequences, move rank-specific logging off the step",
                )
            )
    best: dict[str, tuple[dict[str, Any], int]] = {}
    for d in rank_docs:
        rank = d["source"]["ranks"][0] if d["source"]["ranks"] else 0
        for f in d["findings"]:
            if f["id"] not in best or f["cost_ns"] > best[f["id"]][0]["cost_ns"]:
                best[f["id"]] = (f, rank)
    for f, rank in best.values():
        ranks_with = [d["source"]["ranks"][0] for d in rank_docs if any(x["id"] == f["id"] for x in d["findings"])]
        ev = dict(f["evidence"], worst_rank=rank, ranks=ranks_with)
        out.append(Finding(f["id"], f["severity"], f"[rank {rank}] {f['title']}", f["cost_ns"], f["cost_share"], ev, f["recommendation"], f.get("snippet", "")))
    out.sort(key=lambda f: (SEVERITIES.index(f.severity), -f.cost_ns))
    return out


def analyze_job(
    directory: str | Path,
    *,
    max_workers: int | None = None,
    max_bytes: int | None = None,
    thresholds: dict[str, float] | None = None,
) -> JobAnalysis:
    d = Path(directory)
    files = discover_rank_files(d)
    if not files:
        raise InputError("directory holds no trace files (*.pt.trace.json[.gz], *.json, *.sqlite)", str(d))
    th = thresholds or {}
    workers = max(1, min(len(files), max_workers or os.cpu_count() or 1))
    if workers == 1:
        results = [(p, _analyze_rank(str(p), max_bytes, th)) for p in files]
    else:
        with process_pool(workers) as pool:
            futs = [(p, pool.submit(_analyze_rank, str(p), max_bytes, th)) for p in files]
            results = [(p, f.result()) for p, f in futs]
    warnings: list[str] = []
    ordered = _assign_ranks(results, warnings)
    ranks = []
    payloads = []
    for rank, path, res in ordered:
        doc = res["doc"]
        doc["source"]["ranks"] = [rank]
        ranks.append({"rank": rank, "path": str(path), "doc": doc})
        pl_dict = dict(res["payload"], rank=rank)
        pl_dict["collectives"] = tuple(tuple(c) for c in pl_dict["collectives"])
        payloads.append(RankPayload(**pl_dict))
    cross = analyze_cross_rank(payloads)
    warnings.extend(cross.warnings)
    findings = job_findings(cross, [r["doc"] for r in ranks], Thresholds.from_overrides(th))
    return JobAnalysis(source=str(d), ranks=ranks, cross=cross, findings=findings, warnings=warnings)


def analyze_trace_ranks(
    trace: Any, thresholds: dict[str, float] | None = None, step_pattern: str | None = None
) -> JobAnalysis:
    """One parsed trace holding several ranks (an nsys export of several processes)."""
    from traceinsight.api import analyze_trace
    from traceinsight.model.schema import Trace, by_rank

    ranks = []
    payloads = []
    th = Thresholds.from_overrides(thresholds or {})
    for rank, events in by_rank(trace.events):
        sub = Trace(events=events, meta=trace.meta)
        a = analyze_trace(sub, thresholds=th, step_pattern=step_pattern)
        doc = a.to_json()
        doc["source"]["ranks"] = [rank]
        ranks.append({"rank": rank, "path": trace.meta.source_path, "doc": doc})
        payloads.append(_payload(a, rank))
    cross = analyze_cross_rank(payloads)
    findings = job_findings(cross, [r["doc"] for r in ranks], th)
    return JobAnalysis(source=trace.meta.source_path, ranks=ranks, cross=cross, findings=findings, warnings=list(trace.meta.warnings) + list(cross.warnings))
