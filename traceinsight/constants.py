"""Names shared across layers, defined once (and cheap to import: the CLI's --help reads them)."""

from __future__ import annotations

from typing import Literal

VERSION = "0.1.0"  # the package version (pyproject.toml says the same; a test holds them equal)
SCHEMA = "traceinsight/1"  # the JSON document's version (docs/METRICS.md, "JSON result")
Severity = Literal["high", "medium", "low", "info"]
SEVERITIES: tuple[Severity, ...] = ("high", "medium", "low", "info")  # most severe first
# GPU idle causes (analyzers/idle.py attributes each idle gap to one) and the finding that
# explains each (None: none; the summary names it). Adding a cause: here, its colour in
# report/html.py, its test in analyzers/idle.py's attribution.
IDLE_CAUSES: dict[str, str | None] = {
    "dataloader": "dataloader_stall",
    "host_sync": "host_sync",
    "launch_overhead": "launch_bound",
    "pageable_copy": "pageable_memcpy",
    "unified_memory": "unified_memory",
    "communication": "comm_not_overlapped",
    "cpu_work": "gpu_underutilized",
    "gpu_wait": None,
    "profiler": None,
    "warmup": "cold_start",
    "allocator": "allocator_churn",
    "capture": "graph_capture",
    "host_untraced": None,
}
# A duration this many times the capture's span of starts is an overflowed or corrupted value
# (analyzers/health.py's duration_invalid check; the steps leave such a range out)
ABSURD_SPAN_FACTOR = 10
# What program a trace records (model/framework.py reads it off the trace): the first is the
# default, whose advice is each rule's own; every other has its advice declared on each rule.
Framework = Literal["pytorch", "cuda_app"]
FRAMEWORKS: tuple[Framework, ...] = ("pytorch", "cuda_app")
# Steps: ProfilerStep#N (torch.profiler) or train_step#N (traceinsight.capture, NVTX)
DEFAULT_STEP_PATTERN = r"^(ProfilerStep#\d+|train_step#\d+)$"
# The few metrics a one-line-per-trace view shows: batch's summary table, the diff's terminal table.
HEADLINE_METRICS = (
    "gpu_busy_ratio",
    "step_time_median_ns",
    "window_ns",
    "dataloader_ratio",
    "host_sync_count",
    "h2d_pageable_bytes_ratio",
    "comm_compute_overlap_ratio",
    "exposed_comm_ratio",
    "elementwise_kernel_time_ratio",
    "fp32_gemm_time_ratio",
    "recompute_time_ratio",
)

# A profiler's own words for events it could not keep (CUPTI buffers full, records dropped,
# events lost): Kineto's logged WARNING/ERROR lines, nsys' DIAGNOSTIC_EVENT texts.
DROPPED_EVENTS_PATTERN = (
    r"(?i)\b(dropped|lost|discarded|overflow(ed|s)?|buffers? (is |are |were )?full)\b"
)

# The memory metrics of an analysis (Results.metrics), for the diff and the job report: per
# device (a dict by GPU where a trace has several), then the allocator's calls per steady step.
MEMORY_DEVICE_METRICS = (
    "memory_peak_allocated_bytes",
    "memory_peak_reserved_bytes",
    "device_memory_bytes",
    "memory_headroom_ratio",
    "memory_fragmentation_ratio",
    "memory_growth_bytes_per_step",
)
MEMORY_STEP_METRICS = ("allocator_device_allocs_per_step", "allocator_device_frees_per_step")
