"""What an analysis returns: :class:`TraceAnalysis` for one rank, :class:`JobAnalysis` for a job.

Both are frozen and serialize to the documented JSON document (``to_json``); reporters read
that document or these objects, never the other way round.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import polars as pl

from traceinsight.analyzers import Results
from traceinsight.analyzers.context import activity_devices
from traceinsight.analyzers.cross_rank import CrossRankResult
from traceinsight.causal.whatif import WhatIf
from traceinsight.constants import FRAMEWORKS, SCHEMA, Framework
from traceinsight.constants import VERSION as __version__
from traceinsight.findings import Finding
from traceinsight.findings.job_rules import transfer_split
from traceinsight.findings.quality import rank_clock_skew
from traceinsight.model import intervals as iv
from traceinsight.model.classify import API_KINDS, COMPILED_CODE_RANGE
from traceinsight.model.schema import KINDS, Trace, device_spec_json
from traceinsight.records import jsonable

KERNEL_TABLE_SCHEMA = {
    "name": pl.String,
    "kernel_class": pl.String,
    "count": pl.Float64,
    "total_ns": pl.Float64,
}


def tool_json() -> dict[str, str]:
    return {"name": "traceinsight", "version": __version__}


@dataclass(frozen=True)
class SelectedFixes:
    """``--what-if``: the chosen finding ids, their fixes replayed together (None without a
    step model), the ids this trace did not raise, those with no fix to replay, and the
    larger batches priced although their rule did not fire (``memory_headroom@K``)."""

    fixes: tuple[str, ...]
    what_if: WhatIf | None
    not_raised: tuple[str, ...] = ()
    no_fix: tuple[str, ...] = ()
    priced_not_raised: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        w = jsonable(self.what_if) if self.what_if is not None else {}
        return {
            "fixes": list(self.fixes),
            "step_time_ns": w.get("step_time_ns"),
            "step_time_after_ns": w.get("step_time_after_ns"),
            "speedup": w.get("speedup"),
            "transforms": w.get("transforms", []),
            # a larger batch among the fixes: its factor and its own step (step_time_after_ns
            # is the time per original batch's samples)
            "multiplier": w.get("multiplier"),
            "batch_step_time_after_ns": w.get("batch_step_time_after_ns"),
            # a loader fix among them: the speedup at its stated assumption (the loader twice
            # as fast), beside the replay's loading hidden (a held-out DLRM's 4x batch with
            # workers: 12.67x hidden, 2.32x assumed, 4.09-4.85x measured with 4 workers)
            **(
                {"speedup_loader_assumed": w["speedup_loader_assumed"]}
                if w.get("speedup_loader_assumed")
                else {}
            ),
            "not_raised": list(self.not_raised),
            "no_fix": list(self.no_fix),
            "priced_not_raised": list(self.priced_not_raised),
        }


@dataclass(frozen=True)
class TraceAnalysis:
    """One rank's (or one single-process trace's) analysis.

    ``trace`` holds the event table; it is None for ranks analyzed in a worker process, which
    send back only their results and their per-step kernel table."""

    rank: int
    source: dict[str, Any]
    results: Results
    metrics: dict[str, Any]
    findings: list[Finding]
    warnings: list[str]
    command: str | None = None
    trace: Trace | None = field(default=None, repr=False, compare=False)
    kernels: pl.DataFrame | None = field(default=None, repr=False, compare=False)
    data_quality: list[dict[str, Any]] = field(default_factory=list)  # findings/quality.py
    annotated_path: str | None = None  # the annotated Chrome trace, when one was written
    # the combined what-if of every finding's fix (findings/savings.py), null without a model
    what_if: WhatIf | None = None
    selected: SelectedFixes | None = None  # --what-if

    def _what_ifs(self) -> dict[str, Any]:
        out = {"all_fixes": jsonable(self.what_if)}
        if self.selected is not None:
            out["selected"] = self.selected.to_json()
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "tool": tool_json(),
            "command": self.command,
            "source": self.source,
            "metrics": self.metrics,
            "findings": [f.to_json() for f in self.findings],
            "data_quality": self.data_quality,
            "annotated_trace": self.annotated_path,
            "warnings": self.warnings,
            "details": {**self.results.to_json(), "what_if": self._what_ifs()},
        }

    def kernel_table(self) -> pl.DataFrame:
        """Kernels per step of the analysis window by name and class (count, total_ns): what
        ``diff`` and a baseline compare."""
        if self.kernels is not None:
            return self.kernels
        if self.trace is None:
            return pl.DataFrame(schema=KERNEL_TABLE_SCHEMA)
        steps = max(1, self.metrics["steps"] or 1)
        k = (
            self.trace.events.lazy()
            .filter(pl.col("kind") == "kernel")
            .select("name", "kernel_class", "start_ns", "end_ns")
            .collect()
        )
        window = self.source.get("window")
        if window:
            # the window's kernels only, clipped as the analyzers clip them: the steps divided
            # by are the window's, and warm-up or flush kernels outside it ran in none of them
            k = iv.clip(k, window["start_ns"], window["end_ns"])
        return (
            k.group_by("name", "kernel_class")
            .agg(
                pl.len().alias("count"),
                (pl.col("end_ns") - pl.col("start_ns")).sum().alias("total_ns"),
            )
            .select(
                "name",
                pl.col("kernel_class").cast(pl.String),
                (pl.col("count") / steps).alias("count"),
                (pl.col("total_ns") / steps).alias("total_ns"),
            )
        )

    def detached(self) -> TraceAnalysis:
        """This analysis without the event table, the step model and the idle gaps (to send
        from a worker: the gaps were read by the region breakdown already, and are most of a
        long rank's summary); kernels kept."""
        r = replace(self.results, idle=replace(self.results.idle, segments=None))
        results = replace(r, replay=replace(r.replay, model=None)) if r.replay else r
        return replace(self, trace=None, kernels=self.kernel_table(), results=results)

    def as_rank(self, rank: int) -> TraceAnalysis:
        return replace(self, rank=rank, source=dict(self.source, ranks=[rank]))


def job_framework(frameworks: Iterable[str | None]) -> Framework:
    """A job's framework: PyTorch where any rank shows it (a launcher rank may not), else the
    ranks' (constants.FRAMEWORKS order)."""
    seen = {f for f in frameworks if f}
    return next((f for f in FRAMEWORKS if f in seen), FRAMEWORKS[0])


def source_json(trace: Trace, results: Results, capture_span_ns: int) -> dict[str, Any]:
    """The ``source`` block: the file, its format, ranks, the devices, event counts. The devices
    are those with GPU activity anywhere in the trace (what ``--device`` selects from), or where
    there are none those its metadata names, each with ``active`` saying which it is."""
    m = trace.meta
    ev = trace.events
    active = activity_devices(ev)
    known = {d.id: d for d in m.devices}
    devices = [
        {
            **(
                known[i].to_json()
                if i in known
                else {
                    "id": i,
                    "name": None,
                    "sm_count": None,
                    "memory_bytes": None,
                    "compute_capability": None,
                    **device_spec_json(None),
                }
            ),
            "active": bool(active),
        }
        for i in (active or sorted(known))
    ]
    counts = dict.fromkeys(KINDS, 0)
    for kind, n in ev.group_by("kind").len().iter_rows():
        counts[str(kind)] = int(n)
    ranks = sorted({int(r) for r in ev["rank"].drop_nulls().unique().to_list()}) or [m.rank or 0]
    return {
        "path": m.source_path,
        "format": m.format,
        "format_version": m.format_version,
        "ranks": ranks,
        "world_size": m.world_size,
        "backend": m.backend,
        "devices": devices,
        "capture_span_ns": capture_span_ns,
        "event_counts": counts,
        # CUDA/HIP runtime, driver and CUPTI versions where the trace records them (diff compares them)
        "versions": {k: v for k, v in m.extra.items() if k.endswith("_version")},
    }


@dataclass(frozen=True)
class JobAnalysis:
    """A multi-rank job: one :class:`TraceAnalysis` per rank (rank order), the cross-rank
    comparison, and the job's own findings."""

    path: str
    ranks: list[TraceAnalysis]
    cross: CrossRankResult
    findings: list[Finding]
    warnings: list[str] = field(default_factory=list)
    command: str | None = None

    @property
    def source(self) -> dict[str, Any]:
        """The job's ``source`` block: the ranks' files, devices and event counts together."""
        ranks = self.ranks
        counts: dict[str, int] = {}
        for r in ranks:
            for k, v in r.source["event_counts"].items():
                counts[k] = counts.get(k, 0) + v
        first = ranks[0].source if ranks else {}
        return {
            "path": self.path,
            "format": first.get("format"),
            "format_version": first.get("format_version"),
            "ranks": [r.rank for r in ranks],
            "world_size": len(ranks),
            # the world size the ranks' traces record, where larger (a subset of the job)
            "recorded_world_size": max((r.source.get("world_size") or 0 for r in ranks), default=0)
            or None,
            "backend": first.get("backend"),
            "framework": job_framework(r.source.get("framework") for r in ranks),
            "devices": [dict(dev, rank=r.rank) for r in ranks for dev in r.source["devices"]],
            "capture_span_ns": max((r.source["capture_span_ns"] for r in ranks), default=0),
            "event_counts": counts,
        }

    @property
    def step_time_median_ns(self) -> float | None:
        """The middle rank's median step time (the upper middle for an even count)."""
        medians = sorted(
            r.metrics["step_time_median_ns"]
            for r in self.ranks
            if r.metrics["step_time_median_ns"] is not None
        )
        return medians[len(medians) // 2] if medians else None

    def to_json(self) -> dict[str, Any]:
        ranks = self.ranks
        busy = [
            r.metrics["gpu_busy_ratio"] for r in ranks if r.metrics["gpu_busy_ratio"] is not None
        ]
        return {
            "schema": SCHEMA,
            "kind": "job",
            "tool": tool_json(),
            "command": self.command,
            "source": self.source,
            "metrics": {
                "ranks": len(ranks),
                "gpu_busy_ratio_mean": sum(busy) / len(busy) if busy else None,
                "gpu_busy_ratio_min": min(busy) if busy else None,
                "step_time_median_ns": self.step_time_median_ns,
                "step_skew_mean_ns": self.cross.step_skew_mean_ns,
                "straggler_rank": self.cross.straggler_rank,
                "straggler_ranks": list(self.cross.straggler_ranks),
                "straggler_wait_ns": self.cross.wait_caused_ns,
                "straggler_wait_ratio": self.cross.wait_caused_ratio,
                "job_step_ns": self.cross.job_step_ns,
                "per_rank": {str(r.rank): r.metrics for r in ranks},
            },
            "findings": [f.to_json() for f in self.findings],
            "data_quality": self.data_quality(),
            "warnings": self.warnings,
            "ranks": [
                {
                    "rank": r.rank,
                    "path": r.source["path"],
                    "metrics": r.metrics,
                    "findings": [f.to_json() for f in r.findings],
                    "data_quality": r.data_quality,
                    "warnings": r.warnings,
                    "comm_split": self.comm_split(r.rank),
                    "regions": jsonable(r.results.regions),  # details.regions of the rank
                }
                for r in ranks
            ],
            "step_table": self.step_table(),
            "details": {"cross_rank": jsonable(self.cross)},
        }

    def data_quality(self) -> list[dict[str, Any]]:
        """The job's own health checks (each rank's are in its entry)."""
        starts = {
            r.rank: {s.step: s.start_ns for s in r.results.steps.per_step} for r in self.ranks
        }
        return rank_clock_skew(starts, self.step_time_median_ns, self.findings)

    def comm_split(self, rank: int) -> dict[str, Any]:
        """The rank's matched collective time: waiting for peers (all, and not hidden behind its
        compute), transfer, the waiting charged to the straggler, and each by collective kind."""
        kinds = self.cross.comm_split.get(str(rank), {})
        key = str(rank)
        r = next(x for x in self.ranks if x.rank == rank)
        transfer = transfer_split(r.results.comm, kinds, r.results.idle.device_window_ns)
        comm = transfer or r.results.comm
        return {
            # the share of the transfer time (waiting for peers excluded) that overlaps compute:
            # what the rank's communication finding reports
            "transfer_overlap_ratio": comm.comm_compute_overlap_ratio,
            "wait_ns": self.cross.wait_by_rank_ns.get(key, 0),
            "exposed_wait_ns": self.cross.exposed_wait_by_rank_ns.get(key, 0),
            "transfer_ns": self.cross.transfer_by_rank_ns.get(key, 0),
            "charged_wait_ns": self.cross.charged_by_rank_ns.get(key, 0),
            "by_kind": kinds,
        }

    def step_table(self, limit: int = 200) -> list[dict[str, Any]]:
        """Step number -> each rank's step time (ranks in the job's order), for steps all ranks have."""
        per = [{s.step: s.dur_ns for s in r.results.steps.per_step} for r in self.ranks]
        common = sorted(set.intersection(*(set(p) for p in per))) if per else []
        return [{"step": st, "times": [p[st] for p in per]} for st in common[:limit]]


def quality_errors(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """An analysis document's error-level data-quality checks, its ranks' included: what makes
    its numbers untrustworthy whatever they say (a gate fails on one)."""
    checks = [
        *doc.get("data_quality", []),
        *(q for r in doc.get("ranks", []) for q in r.get("data_quality", [])),
    ]
    return [q for q in checks if q.get("severity") == "error"]


# op names of the compiler's and CUDA-graph machinery (and Inductor's Triton launches): a compiled
# side has them in place of the eager ops they replaced, so a diff's program identity leaves
# them out (diff.program_identity)
COMPILE_MACHINERY = (
    COMPILED_CODE_RANGE
    + r"|^triton_|^TorchDynamo|^AOTDispatcher|^Pregraph bytecode|^Inductor|^cudagraphify"
    + r"|^CUDAGraph"
)


def op_signature(events: pl.DataFrame) -> tuple[tuple[str, ...], bool]:
    """The torch op names a trace ran (an autograd node's name without its engine prefix, a
    numbered name without its number), less the compiler's and CUDA-graph machinery; and whether
    it is compiled or replays CUDA graphs (its eager ops replaced)."""
    names = (
        events.lazy()
        .filter(pl.col("kind") == "cpu_op")
        .select(pl.col("name").unique())
        .collect()
        .get_column("name")
        .str.replace(r"^autograd::engine::evaluate_function: ", "")
        .str.replace(r"#\d+$", "")
    )
    machinery = names.str.contains(COMPILE_MACHINERY)
    graphs = (
        events.lazy()
        .filter(pl.col("kind").is_in(API_KINDS) & pl.col("name").str.contains("GraphLaunch"))
        .select(pl.len())
        .collect()
        .item()
    )
    ops = tuple(sorted(names.filter(~machinery).unique().to_list()))
    return ops, bool(machinery.any() or graphs)


def kernels_launched(events: pl.DataFrame, lo: int, hi: int) -> int:
    """Kernels whose launching call (by rank and correlation id) started in [lo, hi)."""
    calls = events.filter(
        pl.col("kind").is_in(API_KINDS)
        & pl.col("correlation").is_not_null()
        & (pl.col("start_ns") >= lo)
        & (pl.col("start_ns") < hi)
    ).select("rank", "correlation")
    return (
        events.filter(pl.col("kind") == "kernel")
        .select("rank", "correlation")
        .join(calls.unique(), on=["rank", "correlation"], how="semi")
        .height
    )
