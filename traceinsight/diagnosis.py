"""Turn analyzer results into findings: what is wrong, the evidence, and the change to make.

Each finding's ``cost_ns`` is the time it measurably costs in the analysis window; severity
follows ``cost_ns`` as a share of that window (summed over devices), so the first finding is the
biggest lever. Thresholds are named, documented in docs/FINDINGS.md, and overridable.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

SEVERITIES = ("high", "medium", "low", "info")


@dataclass(frozen=True)
class Thresholds:
    high_share: float = 0.25  # cost >= 25% of the window -> high
    medium_share: float = 0.10
    low_share: float = 0.03  # below this a finding is only "info"
    elementwise_time_share: float = 0.25  # of kernel time
    elementwise_count_share: float = 0.5  # of kernel count
    fp32_math_share: float = 0.2  # of GEMM/conv/attention time
    comm_overlap_min: float = 0.5  # below this overlap, exposed comm is a finding
    comm_heavy_share: float = 0.3  # communication union / window
    step_cv: float = 0.15
    underutilized_busy_ratio: float = 0.6
    h2d_overlap_min: float = 0.5
    straggler_wait_share: float = 0.05

    @classmethod
    def from_overrides(cls, overrides: dict[str, float]) -> Thresholds:
        unknown = set(overrides) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"unknown threshold(s): {', '.join(sorted(unknown))}")
        return replace(cls(), **{k: float(v) for k, v in overrides.items()})


@dataclass(frozen=True)
class Finding:
    id: str
    severity: str
    title: str
    cost_ns: int
    cost_share: float
    evidence: dict[str, Any]
    recommendation: str
    snippet: str = ""
    tags: tuple[str, ...] = field(default_factory=tuple)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["tags"] = list(self.tags)
        return d


def _ms(ns: float | int | None) -> str:
    return "n/a" if ns is None else f"{ns / 1e6:.2f} ms"


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def _severity(share: float, t: Thresholds) -> str:
    if share >= t.high_share:
        return "high"
    if share >= t.medium_share:
        return "medium"
    if share >= t.low_share:
        return "low"
    return "info"


SNIPPETS = {
    "dataloader_stall": (
        "loader = DataLoader(dataset, batch_size=B, num_workers=8, pin_memory=True,\n"
        "                    prefetch_factor=4, persistent_workers=True)\n"
        "# and tokenize/pre-process once, offline (datasets.map(..., num_proc=16) -> Arrow/Parquet)"
    ),
    "host_sync": (
        "# before: print(loss.item()) every step\n"
        "if step % 100 == 0:\n"
        "    print(loss.detach().float().item())   # one sync per 100 steps\n"
        "# time steps with torch.cuda.Event(enable_timing=True) instead of synchronize()"
    ),
    "launch_bound": (
        "model = torch.compile(model, mode=\"reduce-overhead\")  # fuses ops and replays CUDA graphs\n"
        "# or capture a static step by hand: g = torch.cuda.CUDAGraph(); with torch.cuda.graph(g): ...\n"
        "# and raise the per-step work: a larger batch or sequence length"
    ),
    "pageable_memcpy": (
        "loader = DataLoader(..., pin_memory=True)\n"
        "x = x.to(device, non_blocking=True)          # async only from pinned memory\n"
        "# for your own buffers: host = torch.empty(shape, pin_memory=True)"
    ),
    "h2d_not_overlapped": (
        "copy_stream = torch.cuda.Stream()\n"
        "with torch.cuda.stream(copy_stream):          # prefetch batch i+1 while computing batch i\n"
        "    nxt = next_batch.to(device, non_blocking=True)\n"
        "torch.cuda.current_stream().wait_stream(copy_stream)"
    ),
    "comm_not_overlapped": (
        "model = DDP(model, device_ids=[rank], bucket_cap_mb=100,\n"
        "            gradient_as_bucket_view=True, static_graph=True)\n"
        "# do not reduce gradients by hand after backward(); let DDP overlap them with backward"
    ),
    "comm_heavy": (
        "# accumulate gradients: reduce every K micro-batches\n"
        "with model.no_sync():\n"
        "    loss.backward()\n"
        "# FSDP: ShardingStrategy.SHARD_GRAD_OP (ZeRO-2) instead of FULL_SHARD"
    ),
    "elementwise_heavy": (
        "model = torch.compile(model)   # fuses elementwise chains into Triton kernels\n"
        "# attention: F.scaled_dot_product_attention (Flash); norms: fused LayerNorm/RMSNorm"
    ),
    "unfused_optimizer": "optimizer = torch.optim.AdamW(model.parameters(), lr=lr, fused=True)",
    "fp32_compute": (
        "with torch.autocast(\"cuda\", dtype=torch.bfloat16):\n"
        "    loss = model(batch)\n"
        "# at least: torch.set_float32_matmul_precision(\"high\")  # TF32 tensor cores"
    ),
    "recompute_overhead": (
        "# checkpoint only what memory needs, e.g. every other block:\n"
        "x = checkpoint(block, x, use_reentrant=False) if i % 2 == 0 else block(x)\n"
        "# or use selective activation checkpointing (torch.utils.checkpoint.create_selective_checkpoint_contexts)"
    ),
    "step_time_variance": (
        "# time every step with CUDA events and look at the slow ones\n"
        "gc.freeze(); gc.disable()  # if Python GC pauses line up with the slow steps"
    ),
    "gpu_underutilized": (
        "# give the GPU more work per launch: larger batch / sequence, fewer small ops\n"
        "model = torch.compile(model)"
    ),
    "straggler": (
        "# find what the slow rank does differently: data shard, host load, thermal throttling\n"
        "# torchrun ... then compare: traceinsight analyze TRACE_DIR"
    ),
}


def diagnose(metrics: dict[str, Any], results: dict[str, Any], t: Thresholds | None = None) -> list[Finding]:
    """Findings ordered by severity, then cost: ``findings[0]`` is the biggest lever."""
    t = t or Thresholds()
    idle = results["idle"]
    steps = results["steps"]
    copies = results["copies"]
    comm = results["comm"]
    kern = results["kernels"]
    launch = results["launch"]
    syncs = results["syncs"]
    opt = results["optimizer"]
    rec = results["recompute"]
    ndev = max(1, len(idle.devices))
    window = max(1, idle.window_ns) * ndev
    by_cause = idle.idle_by_cause_ns
    out: list[Finding] = []

    def add(fid: str, cost: float, title: str, evidence: dict[str, Any], rec_text: str, cap: str | None = None) -> None:
        share = min(1.0, max(0.0, cost / window))
        sev = _severity(share, t)
        if cap and SEVERITIES.index(sev) < SEVERITIES.index(cap):
            sev = cap
        out.append(Finding(fid, sev, title, int(cost), share, evidence, rec_text, SNIPPETS.get(fid, "")))

    def segs(cause: str, n: int = 5) -> list[dict[str, Any]]:
        return [s for s in idle.top_segments if s["cause"] == cause][:n]

    if by_cause.get("dataloader", 0) > 0 or (steps.dataloader_ratio or 0) > 0.05:
        cost = by_cause.get("dataloader", 0)
        add(
            "dataloader_stall",
            cost,
            f"GPU waits for the input pipeline: {_ms(cost)} idle in DataLoader.__next__ ({_pct(cost / window)} of the window)",
            {
                "idle_ns": cost,
                "dataloader_ratio": steps.dataloader_ratio,
                "dataloader_ns": steps.dataloader_ns,
                "per_step_dataloader_ns": [s["dataloader_ns"] for s in steps.per_step],
                "top_segments": segs("dataloader"),
            },
            "Load batches in parallel and ahead of time: num_workers > 0, pin_memory=True, prefetch_factor 4, "
            "persistent_workers=True; move tokenization/decoding out of __getitem__ (pre-tokenize to Arrow/Parquet).",
        )
    if syncs.host_sync_count > 0:
        cost = by_cause.get("host_sync", 0)
        top = syncs.by_op[0] if syncs.by_op else {}
        add(
            "host_sync",
            cost,
            f"{syncs.host_sync_count} host syncs ({_fmt(syncs.syncs_per_step)} per step) leave the GPU idle {_ms(cost)}"
            + (f"; most from {top.get('op')}" if top else ""),
            {
                "idle_ns": cost,
                "host_sync_count": syncs.host_sync_count,
                "syncs_per_step": syncs.syncs_per_step,
                "host_sync_blocked_ns": syncs.host_sync_blocked_ns,
                "by_op": list(syncs.by_op),
                "top_segments": segs("host_sync"),
                "profiler_syncs_excluded": syncs.profiler_syncs,
            },
            "Remove per-step .item(), .cpu(), print(tensor) and tensor-valued if-conditions from the loop; "
            "accumulate metrics on the GPU and read them every N steps; time with CUDA events.",
        )
    launch_cost = by_cause.get("launch_overhead", 0)
    if launch_cost > 0:
        add(
            "launch_bound",
            launch_cost,
            f"Launch-bound: the GPU drains faster than the CPU issues kernels ({_ms(launch_cost)} idle between launches)",
            {
                "idle_ns": launch_cost,
                "kernels_per_step": kern.kernels_per_step,
                "launch_calls_per_step": launch.launch_calls_per_step,
                "launch_call_median_ns": launch.launch_call_median_ns,
                "kernel_median_ns": launch.kernel_median_ns,
                "short_kernel_ratio": launch.short_kernel_ratio,
                "queue_depth_median": launch.queue_depth_median,
                "top_segments": segs("launch_overhead"),
            },
            "Cut per-kernel CPU cost: torch.compile (mode='reduce-overhead' adds CUDA graphs), capture the step "
            "in a CUDA graph, use fused kernels, or give each kernel more work (larger batch).",
        )
    pageable_share = copies.h2d_pageable_bytes_ratio
    if copies.h2d_pageable_bytes > 0 or by_cause.get("pageable_copy", 0) > 0:
        pageable_blocked = sum(c["blocked_ns"] for c in copies.pageable_calls if c["blocked_ns"]) if copies.pageable_calls else 0
        cost = max(copies.host_blocking_copy_ns, by_cause.get("pageable_copy", 0))
        add(
            "pageable_memcpy",
            cost,
            f"Host-to-device copies from pageable memory block the host: {_pct(pageable_share)} of HtoD bytes, "
            f"{_ms(cost)} blocked",
            {
                "h2d_bytes": copies.h2d_bytes,
                "h2d_pageable_bytes": copies.h2d_pageable_bytes,
                "h2d_pageable_bytes_ratio": pageable_share,
                "host_blocking_copy_ns": copies.host_blocking_copy_ns,
                "host_blocking_copy_count": copies.host_blocking_copy_count,
                "top_blocked_ns": pageable_blocked,
                "top_copies": list(copies.pageable_calls[:5]),
            },
            "Copy from pinned memory (DataLoader(pin_memory=True) or tensor.pin_memory()) with "
            "non_blocking=True so the copy runs asynchronously and can overlap compute.",
        )
    mostly_pageable = (pageable_share or 0) >= 0.5  # then pageable_memcpy already names the fix
    if (
        copies.h2d_overlap_ratio is not None
        and copies.h2d_overlap_ratio < t.h2d_overlap_min
        and copies.h2d_dur_ns
        and not mostly_pageable
    ):
        exposed = copies.h2d_dur_ns * (1 - copies.h2d_overlap_ratio)
        add(
            "h2d_not_overlapped",
            exposed,
            f"Host-to-device copies run alone: only {_pct(copies.h2d_overlap_ratio)} of copy time overlaps compute",
            {
                "h2d_dur_ns": copies.h2d_dur_ns,
                "h2d_overlap_ratio": copies.h2d_overlap_ratio,
                "exposed_copy_ns": int(exposed),
                "by_kind": list(copies.by_kind),
            },
            "Prefetch the next batch on a side stream from pinned memory (non_blocking=True) so copies overlap "
            "the current step's kernels.",
        )
    if comm.comm_compute_overlap_ratio is not None:
        if comm.comm_compute_overlap_ratio < t.comm_overlap_min:
            add(
                "comm_not_overlapped",
                comm.exposed_comm_ns,
                f"Communication is exposed: {_pct(comm.comm_compute_overlap_ratio)} of it overlaps compute, "
                f"{_ms(comm.exposed_comm_ns)} exposed",
                {
                    "comm_ns": comm.comm_ns,
                    "exposed_comm_ns": comm.exposed_comm_ns,
                    "comm_compute_overlap_ratio": comm.comm_compute_overlap_ratio,
                    "exposed_comm_ratio": comm.exposed_comm_ratio,
                    "per_device": list(comm.per_device),
                    "top_collectives": list(comm.top_collectives[:5]),
                },
                "Let gradient reduction overlap backward: DDP with buckets (bucket_cap_mb), static_graph=True, "
                "gradient_as_bucket_view=True; no manual all_reduce after backward(); FSDP backward_prefetch.",
            )
        if (comm.comm_time_share or 0) >= t.comm_heavy_share:
            add(
                "comm_heavy",
                comm.exposed_comm_ns,
                f"Communication takes {_pct(comm.comm_time_share)} of the window",
                {"comm_ns": comm.comm_ns, "comm_time_share": comm.comm_time_share, "top_collectives": list(comm.top_collectives[:5])},
                "Communicate less often or less: gradient accumulation, larger per-GPU batch, ZeRO-2/SHARD_GRAD_OP "
                "instead of full sharding, bf16 gradient reduction.",
            )
    ew_t, ew_c = kern.elementwise_kernel_time_share, kern.elementwise_kernel_count_share
    if ew_t is not None and (ew_t >= t.elementwise_time_share or (ew_c or 0) >= t.elementwise_count_share):
        ew_ns = int(ew_t * kern.kernel_ns)
        add(
            "elementwise_heavy",
            ew_ns / 2,  # fusion typically removes about half of the elementwise memory traffic
            f"Elementwise kernels: {_pct(ew_t)} of kernel time, {_pct(ew_c)} of kernels "
            f"({kern.elementwise_eager_count} eager, {kern.elementwise_triton_count} Triton-fused)",
            {
                "elementwise_kernel_time_share": ew_t,
                "elementwise_kernel_count_share": ew_c,
                "elementwise_eager_count": kern.elementwise_eager_count,
                "elementwise_triton_count": kern.elementwise_triton_count,
                "elementwise_ns": ew_ns,
            },
            "Fuse elementwise chains: torch.compile, fused LayerNorm/RMSNorm, Flash attention "
            "(F.scaled_dot_product_attention); each unfused op reads and writes memory again.",
            cap="low",  # an optimization opportunity, not a reason the GPU starves
        )
    if opt.mode in ("per_parameter", "foreach") and opt.optimizer_steps:
        per_step = max(opt.gpu_ns_per_step or 0, opt.host_ns_per_step or 0)
        cost = per_step * min(opt.optimizer_steps, max(1, steps.steps or opt.optimizer_steps))
        if opt.mode == "foreach":
            cost *= 0.3  # foreach is already batched; fused saves a fraction
        add(
            "unfused_optimizer",
            cost,
            f"{opt.optimizer} runs {opt.mode.replace('_', '-')}: {_fmt(opt.kernels_per_step)} kernels and "
            f"{_ms(per_step)} per optimizer step",
            {
                "optimizer": opt.optimizer,
                "mode": opt.mode,
                "kernels_per_step": opt.kernels_per_step,
                "gpu_ns_per_step": opt.gpu_ns_per_step,
                "host_ns_per_step": opt.host_ns_per_step,
            },
            f"Use the fused implementation: torch.optim.{opt.optimizer}(..., fused=True) "
            "(or foreach=True where fused is unavailable).",
        )
    fp32 = kern.fp32_gemm_time_share
    if fp32 is not None and fp32 >= t.fp32_math_share:
        add(
            "fp32_compute",
            kern.fp32_math_ns * 0.5,  # bf16 tensor cores run these several times faster; count half
            f"Matrix math runs in fp32 on CUDA cores: {_pct(fp32)} of GEMM/conv/attention time",
            {
                "fp32_gemm_time_share": fp32,
                "fp32_math_ns": kern.fp32_math_ns,
                "math_ns": kern.math_ns,
                "top_fp32_kernels": list(kern.top_fp32_kernels),
            },
            "Train in bf16 with torch.autocast (no GradScaler needed), or at least enable TF32 "
            "(torch.set_float32_matmul_precision('high')).",
        )
    if rec.recompute_ns > 0:
        add(
            "recompute_overhead",
            rec.recompute_ns,
            f"Activation checkpointing recomputes the forward in backward: {_ms(rec.recompute_ns)} "
            f"({_pct(rec.recompute_time_share)} of the window)",
            {
                "recomputed_ops": rec.recomputed_ops,
                "recompute_kernel_ns": rec.recompute_kernel_ns,
                "recompute_host_ns": rec.recompute_host_ns,
                "recompute_time_share": rec.recompute_time_share,
            },
            "Checkpoint only as much as memory requires (every other block, or selective checkpointing of "
            "cheap ops); if memory allows, turn it off.",
        )
    if steps.steps >= 3 and steps.step_time_cv is not None and (steps.step_time_cv >= t.step_cv or steps.outlier_steps):
        median = steps.step_time_median_ns or 0
        excess = sum(max(0, s["dur_ns"] - median) for s in steps.per_step if s["step"] in steps.outlier_steps)
        add(
            "step_time_variance",
            excess,
            f"Step time varies: CV {steps.step_time_cv:.2f}, outlier steps {list(steps.outlier_steps) or 'none'}",
            {
                "step_time_cv": steps.step_time_cv,
                "step_time_median_ns": median,
                "outlier_steps": list(steps.outlier_steps),
                "step_times_ns": [s["dur_ns"] for s in steps.per_step],
            },
            "Find what differs in the slow steps (data, GC pauses, logging/checkpointing every N steps, other "
            "processes) and move it out of the step or amortize it.",
        )
    if idle.gpu_busy_ratio is not None and idle.gpu_busy_ratio < t.underutilized_busy_ratio:
        explained = sum(f.cost_ns for f in out if f.id in ("dataloader_stall", "host_sync", "launch_bound", "pageable_memcpy"))
        rest = max(0, idle.idle_ns - explained)
        cpu = by_cause.get("cpu_work", 0)
        top_ops = [s["host_op"] for s in segs("cpu_work", 10) if s["host_op"]]
        add(
            "gpu_underutilized",
            rest,
            f"GPU busy only {_pct(idle.gpu_busy_ratio)}; {_ms(rest)} of idle time has no more specific cause",
            {
                "gpu_busy_ratio": idle.gpu_busy_ratio,
                "idle_ns": idle.idle_ns,
                "unexplained_idle_ns": rest,
                "cpu_work_idle_ns": cpu,
                "top_host_ops_during_idle": top_ops[:5],
            },
            "Give the GPU more work per step (batch/sequence) and look at the host ops named in the idle "
            "segments: they run while the GPU waits.",
        )
    out.sort(key=lambda f: (SEVERITIES.index(f.severity), -f.cost_ns))
    return out


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1f}"
