"""The library entry points: trace in, :class:`Analysis` out. The CLI is a thin skin over these."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from traceinsight import __version__
from traceinsight.analyzers import run_analyzers
from traceinsight.analyzers.context import DEFAULT_STEP_PATTERN, build_context
from traceinsight.diagnosis import Finding, Thresholds, diagnose
from traceinsight.model.schema import KINDS, Trace
from traceinsight.parsers import load_trace

SCHEMA = "traceinsight/1"


@dataclass
class Analysis:
    trace: Trace
    results: dict[str, Any]
    metrics: dict[str, Any]
    findings: list[Finding]
    warnings: list[str]
    event_counts: dict[str, int]
    capture_span_ns: int
    command: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def meta(self):  # noqa: ANN201 - TraceMeta
        return self.trace.meta

    def source_json(self) -> dict[str, Any]:
        m = self.trace.meta
        active = sorted(d["device"] for d in self.results["idle"].devices)
        known = {d.id: d for d in m.devices}
        device_ids = active or sorted(known)
        devices = [
            known[i].to_json() if i in known else {"id": i, "name": None, "sm_count": None, "memory_bytes": None, "compute_capability": None}
            for i in device_ids
        ]
        ranks = sorted({int(r) for r in self.trace.events["rank"].drop_nulls().unique().to_list()}) or [m.rank or 0]
        return {
            "path": m.source_path,
            "format": m.format,
            "format_version": m.format_version,
            "ranks": ranks,
            "world_size": m.world_size,
            "backend": m.backend,
            "devices": devices,
            "span_ns": self.capture_span_ns,
            "event_counts": self.event_counts,
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "tool": {"name": "traceinsight", "version": __version__},
            "command": self.command,
            "source": self.source_json(),
            "metrics": self.metrics,
            "findings": [f.to_json() for f in self.findings],
            "warnings": self.warnings,
            "details": {k: _jsonable(v) for k, v in self.results.items()},
        }


def _jsonable(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj):
        return {f.name: _jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, float) and obj != obj:  # NaN never reaches the JSON
        return None
    return obj


def _metrics(results: dict[str, Any]) -> dict[str, Any]:
    idle, steps, copies, comm = results["idle"], results["steps"], results["copies"], results["comm"]
    kern, launch, syncs, rec = results["kernels"], results["launch"], results["syncs"], results["recompute"]
    return {
        "span_ns": idle.window_ns,
        "gpu_busy_ratio": idle.gpu_busy_ratio,
        "gpu_idle_ratio": idle.gpu_idle_ratio,
        "idle_by_cause_ns": dict(idle.idle_by_cause_ns),
        "steps": steps.steps,
        "step_time_median_ns": steps.step_time_median_ns,
        "step_time_cv": steps.step_time_cv,
        "dataloader_ratio": steps.dataloader_ratio,
        "host_sync_count": syncs.host_sync_count,
        "host_sync_blocked_ns": syncs.host_sync_blocked_ns,
        "h2d_bytes": copies.h2d_bytes,
        "h2d_pageable_bytes_ratio": copies.h2d_pageable_bytes_ratio,
        "h2d_overlap_ratio": copies.h2d_overlap_ratio,
        "comm_compute_overlap_ratio": comm.comm_compute_overlap_ratio,
        "exposed_comm_ratio": comm.exposed_comm_ratio,
        "elementwise_kernel_time_share": kern.elementwise_kernel_time_share,
        "elementwise_kernel_count_share": kern.elementwise_kernel_count_share,
        "kernels_per_step": kern.kernels_per_step,
        "short_kernel_ratio": launch.short_kernel_ratio,
        "fp32_gemm_time_share": kern.fp32_gemm_time_share,
        "recompute_time_share": rec.recompute_time_share,
    }


def analyze_trace(
    trace: Trace,
    *,
    thresholds: Thresholds | None = None,
    step_pattern: str | None = None,
    command: str | None = None,
) -> Analysis:
    """Run every analyzer and the diagnosis on one parsed trace."""
    ctx = build_context(trace, step_pattern or DEFAULT_STEP_PATTERN)
    results = run_analyzers(ctx)
    metrics = _metrics(results)
    findings = diagnose(metrics, results, thresholds)
    ev = trace.events
    counts = {k: 0 for k in KINDS}
    for kind, n in ev.group_by("kind").len().iter_rows():
        counts[str(kind)] = int(n)
    span = int(ev["end_ns"].max() - ev["start_ns"].min()) if ev.height else 0
    warnings = list(trace.meta.warnings)
    if not ctx.has_gpu:
        warnings.append("no GPU activity in this trace: GPU metrics are not applicable")
    if ctx.steps.height == 0 and ctx.has_gpu:
        warnings.append("no ProfilerStep/step ranges: the whole GPU span is analyzed as one window")
    return Analysis(
        trace=trace,
        results=results,
        metrics=metrics,
        findings=findings,
        warnings=warnings,
        event_counts=counts,
        capture_span_ns=span,
        command=command,
    )


def analyze_path(
    path: str | Path,
    *,
    thresholds: Thresholds | None = None,
    step_pattern: str | None = None,
    max_bytes: int | None = None,
    command: str | None = None,
) -> Analysis:
    trace = load_trace(path, max_bytes=max_bytes)
    return analyze_trace(trace, thresholds=thresholds, step_pattern=step_pattern, command=command)


def export_events(trace: Trace, out: Path) -> None:
    """Write the common event table as Parquet (atomically)."""
    from traceinsight.report.files import atomic_path

    with atomic_path(out) as tmp:
        trace.events.with_columns(pl.col(pl.Enum).cast(pl.String)).write_parquet(tmp)
