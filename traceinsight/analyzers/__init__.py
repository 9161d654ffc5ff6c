"""Analyzers: pure functions from a :class:`Context` to frozen result objects (no I/O, no HTML).

:class:`Results` holds one typed field per analyzer; adding an analyzer means a module with its
function and result class, one field here, and its entry in :data:`ANALYZERS`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from traceinsight.analyzers.comm import CommResult, analyze_comm
from traceinsight.analyzers.context import Context
from traceinsight.analyzers.copies import CopyResult, analyze_copies
from traceinsight.analyzers.efficiency import EfficiencyResult, analyze_efficiency
from traceinsight.analyzers.health import HealthResult, analyze_health
from traceinsight.analyzers.host_ops import HostOpsResult, analyze_host_ops
from traceinsight.analyzers.idle import IdleResult, analyze_idle
from traceinsight.analyzers.kernels import KernelResult, analyze_kernels
from traceinsight.analyzers.launch import LaunchResult, analyze_launch
from traceinsight.analyzers.memory import MemoryResult, analyze_memory
from traceinsight.analyzers.optimizer import OptimizerResult, analyze_optimizer
from traceinsight.analyzers.recompute import RecomputeResult, analyze_recompute
from traceinsight.analyzers.regions import RegionResult, analyze_regions
from traceinsight.analyzers.replay import ReplayResult, analyze_replay
from traceinsight.analyzers.sources import SourcesResult, analyze_sources
from traceinsight.analyzers.steps import StepResult, analyze_steps
from traceinsight.analyzers.syncs import SyncResult, analyze_syncs
from traceinsight.records import jsonable


@dataclass(frozen=True)
class Results:
    """Every analyzer's result for one trace (field order = the JSON ``details`` order)."""

    idle: IdleResult
    steps: StepResult
    copies: CopyResult
    comm: CommResult
    kernels: KernelResult
    launch: LaunchResult
    syncs: SyncResult
    optimizer: OptimizerResult
    recompute: RecomputeResult
    sources: SourcesResult
    health: HealthResult
    replay: ReplayResult | None  # None with --no-replay (Options.replay False)
    regions: RegionResult  # after the others: it places the idle segments (see run_analyzers)
    memory: MemoryResult  # derived too: its batch what-ifs replay the step model
    efficiency: EfficiencyResult  # FLOPs, MFU, roofline, GEMM shapes, occupancy (derived)
    host_ops: HostOpsResult  # CPU copies far below the host's speed (derived: its what-if)

    def metrics(self) -> dict[str, Any]:
        """The headline numbers (documented one by one in docs/METRICS.md)."""
        idle, steps, copies, comm = self.idle, self.steps, self.copies, self.comm
        kern, launch, syncs, rec = self.kernels, self.launch, self.syncs, self.recompute
        return {
            "window_ns": idle.window_ns,
            "gpu_busy_ratio": idle.gpu_busy_ratio,
            "gpu_idle_ratio": idle.gpu_idle_ratio,
            "kernel_busy_ratio": idle.kernel_busy_ratio,
            "copy_busy_ratio": idle.copy_busy_ratio,
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
            "elementwise_kernel_time_ratio": kern.elementwise_kernel_time_ratio,
            "elementwise_kernel_count_ratio": kern.elementwise_kernel_count_ratio,
            "kernels_per_step": kern.kernels_per_step,
            "short_kernel_ratio": launch.short_kernel_ratio,
            "fp32_gemm_time_ratio": kern.fp32_gemm_time_ratio,
            "recompute_time_ratio": rec.recompute_time_ratio,
            "replay_error_ratio": self.replay.replay_error_ratio if self.replay else None,
            "step_bound_by": self.replay.step_bound_by if self.replay else None,
            "flops_per_step": self.efficiency.flops.per_step,
            "mfu": self.efficiency.compute.mfu,
            "hfu": self.efficiency.compute.hfu,
            "math_flops_coverage_ratio": self.efficiency.compute.math_flops_coverage_ratio,
            "achieved_tflops": dict(self.efficiency.compute.achieved_tflops),
            "gemm_tflops": self.efficiency.compute.gemm_tflops,
            "memory_bound_bandwidth_ratio": self.efficiency.compute.memory_bound_bandwidth_ratio,
            "occupancy_median": self.efficiency.occupancy.median,
            "sm_active_ratio": self.efficiency.counters.sm_active_ratio,
            "tensor_active_ratio": self.efficiency.counters.tensor_active_ratio,
            "dram_bandwidth_ratio": self.efficiency.counters.dram_bandwidth_ratio,
            **self.memory_metrics(),
        }

    def memory_metrics(self) -> dict[str, Any]:
        """Per device (a plain number for one device, {device: value} for several; null
        without memory events); the allocator calls per steady step for the trace."""
        mem = self.memory
        return {
            "memory_peak_allocated_bytes": mem.metric("peak_allocated_bytes"),
            "memory_peak_reserved_bytes": mem.metric("peak_reserved_bytes"),
            "device_memory_bytes": mem.metric("device_memory_bytes"),
            "memory_headroom_ratio": mem.metric("headroom_ratio"),
            "memory_fragmentation_ratio": mem.metric("fragmentation_ratio"),
            "memory_growth_bytes_per_step": mem.metric("growth_bytes_per_step"),
            "memory_peak_by_category_bytes": mem.metric("peak_by_category_bytes"),
            "allocator_device_allocs_per_step": mem.allocator_device_allocs_per_step,
            "allocator_device_frees_per_step": mem.allocator_device_frees_per_step,
        }

    def to_json(self) -> dict[str, Any]:
        return {f.name: jsonable(getattr(self, f.name)) for f in dataclasses.fields(self)}


ANALYZERS: dict[str, Callable[[Context], Any]] = {
    "idle": analyze_idle,
    "steps": analyze_steps,
    "copies": analyze_copies,
    "comm": analyze_comm,
    "kernels": analyze_kernels,
    "launch": analyze_launch,
    "syncs": analyze_syncs,
    "optimizer": analyze_optimizer,
    "recompute": analyze_recompute,
    "sources": analyze_sources,
    "health": analyze_health,
}


# Analyzers run only when asked for (their field is None otherwise).
OPTIONAL: dict[str, Callable[[Context], Any]] = {"replay": analyze_replay}

# Analyzers that read other analyzers' results: those of ANALYZERS and OPTIONAL only (with
# threads, each waits in the pool for what it reads; one derived reading another could leave
# every thread waiting).
DERIVED: dict[str, Callable[[Context, dict[str, Any]], Any]] = {
    "regions": lambda ctx, done: analyze_regions(ctx, done["idle"]),
    # the replay is waited for only where it is read: the rest runs while the replay does
    "memory": lambda ctx, done: analyze_memory(ctx, lambda: done["replay"]),
    "efficiency": lambda ctx, done: analyze_efficiency(ctx, done["steps"], lambda: done["replay"]),
    "host_ops": lambda ctx, done: analyze_host_ops(ctx, done["replay"]),
}


# The order two threads take the analyzers in: the longest first (the replay, then the idle
# attribution), the short ones last, so that neither thread runs alone at the end (on the 10x
# trace the efficiency analyzer, last in the table order, ran 0.1 s alone). Each derived one
# comes after what it reads, which is running or done by the time it waits: a thread never
# waits on one still queued behind it.
SCHEDULE = (
    "replay",
    "idle",
    "steps",
    "memory",
    "efficiency",
    "health",
    "kernels",
    "regions",
    "comm",
    "launch",
    "optimizer",
    "copies",
    "syncs",
    "recompute",
    "sources",
    "host_ops",
)
# what each derived analyzer reads (the lambdas above)
DERIVED_READS = {
    "regions": ("idle",),
    "memory": ("replay",),
    "efficiency": ("steps", "replay"),
    "host_ops": ("replay",),
}


class _Pending(dict):  # type: ignore[type-arg]
    """The results a derived analyzer reads, each as soon as its analyzer is done."""

    def __init__(self, futures: dict[str, Any], absent: list[str]) -> None:
        super().__init__()
        self.futures, self.absent = futures, set(absent)

    def __getitem__(self, name: str) -> Any:
        return None if name in self.absent else self.futures[name].result()


def run_analyzers(ctx: Context, threads: int = 1, *, replay: bool = False) -> Results:
    """Every analyzer on one context. They are independent and spend their time inside polars,
    which releases the GIL, so two threads overlap one analyzer's Python with another's
    queries (10% faster on the 10x trace); results do not depend on the order."""
    # the replay first: the longest by far (its transforms replay the step a dozen times), so
    # the other analyzers share the second thread while it runs (0.2 s less on the 10x trace)
    chosen = {**({"replay": OPTIONAL["replay"]} if replay else {}), **ANALYZERS}
    if threads <= 1:
        done = {name: fn(ctx) for name, fn in chosen.items()}
        done.update({name: None for name in OPTIONAL if name not in done})
        for name, derived in DERIVED.items():
            done[name] = derived(ctx, done)
        return Results(**done)
    with ThreadPoolExecutor(max_workers=threads) as pool:
        futures: dict[str, Any] = {}
        waiting = _Pending(futures, [name for name in OPTIONAL if name not in chosen])
        # each derived one starts once a thread is free and waits only for what it reads (the
        # regions for the idle segments, not for the replay)
        for name in SCHEDULE:
            if name in DERIVED:
                futures[name] = pool.submit(DERIVED[name], ctx, waiting)
            elif name in chosen:
                futures[name] = pool.submit(chosen[name], ctx)
        done = {name: f.result() for name, f in futures.items()}
    done.update({name: None for name in OPTIONAL if name not in done})
    return Results(**done)
