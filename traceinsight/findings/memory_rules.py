"""The memory rules: growth across steps, allocator churn, unused headroom on an
under-fed GPU, fragmentation. Registered with :func:`~traceinsight.findings.rules.rule` after
``rules.py``'s own (imported by ``findings/__init__``), so they are checked last and may read
the other findings. They read ``x.r.memory`` (analyzers/memory.py).
"""

from __future__ import annotations

from traceinsight.analyzers import Results
from traceinsight.analyzers.memory import DeviceMemory, MemoryResult
from traceinsight.causal import transforms as whatif
from traceinsight.causal.whatif import WhatIf, power_of_two_at_most
from traceinsight.findings.model import Advice, Draft
from traceinsight.findings.rules import RuleInput, rule
from traceinsight.findings.savings import loader_bound_ns
from traceinsight.report.format import a_times, fmt_bytes, fmt_ms, fmt_num, fmt_pct, plural

# Host-bound idle causes: the GPU waits for the host to launch work, not for data or peers.
HOST_BOUND_CAUSES = ("launch_overhead", "cpu_work")
# The memory profiler's categories that grow with the batch: what a larger batch multiplies.
ACTIVATION_CATEGORIES = ("activation", "temporary", "autograd_detail")


def _bytes(n: float | None) -> str:
    """Bytes as the reports write them (decimal GB/MB): a title's "about 6,135 MiB" stood
    beside the memory section's "6.4 GB" (audit 19)."""
    return "?" if n is None else fmt_bytes(int(n))


def _worst(x: RuleInput, key: str) -> DeviceMemory | None:
    devs = [d for d in x.r.memory.devices if getattr(d, key) is not None]
    return max(devs, key=lambda d: getattr(d, key), default=None)


def _releases(mem: MemoryResult) -> float:
    """empty_cache() per step: named ranges, or cudaFree between ops (its only other source)."""
    return max(mem.empty_cache_calls_per_step or 0, mem.frees_outside_ops_per_step or 0)


def activation_share(d: DeviceMemory) -> tuple[float | None, int | None, str]:
    """The activations' share of the allocated peak, their bytes and where both come from:
    measured (the activation, temporary and autograd_detail bytes live at the peak) where the
    memory events carry the profiler's categories, else the estimate (the median steady step's
    rise above its start over the peak)."""
    peak = d.peak_allocated_bytes
    cats = d.peak_by_category_bytes
    if cats is not None:
        act = sum(cats.get(c, 0) for c in ACTIVATION_CATEGORIES)
        return (
            act / peak if peak else None,
            act,
            "measured: the " + ", ".join(ACTIVATION_CATEGORIES) + " bytes live at the peak "
            "(the memory profiler's categories)",
        )
    return (
        (d.step_span_bytes or 0) / peak if peak else None,
        d.step_span_bytes,
        "estimated: the median steady step's rise above its start (activation_bytes_per_step) "
        "over the peak (no categories in these memory events)",
    )


def _steps(x: RuleInput) -> int:
    return max(1, x.r.steps.steps or 0)


def _allocator_cost(x: RuleInput) -> float:
    """The allocator calls' host time over the steps: the attributed cost (the causal model's
    saving replaces it, findings/savings.py: the no_empty_cache transform)."""
    return (x.r.memory.allocator_calls_ns_per_step or 0) * _steps(x)


@rule(
    "memory_growth",
    advice={
        "cuda_app": Advice(
            "Device memory allocated in the loop is not freed: free what each iteration allocates"
            " (cudaFree, cudaFreeAsync), or allocate the buffers once outside the loop and reuse "
            "them.",
            (
                "cudaMalloc(&tmp, bytes);                        // once, before the loop\n"
                "for (int it = 0; it < n; ++it) work<<<g, b>>>(tmp);  // reused each iteration\n"
                "cudaFree(tmp);"
            ),
        )
    },
    no_estimate="a leak costs no time until the device is full: graded by the steps "
    "until then (evidence.steps_until_full)",
    recommendation="Find the tensors kept across steps (the ops below allocate them and nothing frees them): "
    "store Python numbers, not tensors (loss.item() every N steps, or .detach() into a bounded buffer), and "
    "clear lists/caches that keep outputs.",
    snippet=(
        "# before: history.append(out)            # keeps every step's output (and its graph)\n"
        "history.append(out.detach().float().mean().item())  # a number, not a tensor\n"
        "# find holders: torch.cuda.memory._record_memory_history(); ...; "
        "torch.cuda.memory._dump_snapshot('mem.pickle')"
    ),
    thresholds={
        "growth_bytes_per_step_min": 1048576,
        "growth_consistency_min_ratio": 0.6,
        "growth_full_steps_high": 1000,
        "growth_full_steps_medium": 100000,
        # the net rise over the steps at least this share of what the slope says: rises and
        # falls that a median slope smooths into growth are no growth
        "growth_net_min_ratio": 0.5,
    },
)
def memory_growth(x: RuleInput) -> Draft | None:
    d = _worst(x, "growth_bytes_per_step")
    if (
        d is None
        or (d.growth_bytes_per_step or 0) < x.t["growth_bytes_per_step_min"]
        or (d.growth_consistency_ratio or 0) < x.t["growth_consistency_min_ratio"]
    ):
        return None
    b = d.boundary_allocated_bytes
    if b[-1] - b[0] < x.t["growth_net_min_ratio"] * d.growth_bytes_per_step * (len(b) - 1):
        return None
    # No time is lost until the device is full; graded by how soon that is.
    until = d.steps_until_full
    if until is not None and until < x.t["growth_full_steps_high"]:
        ratio = x.t["high_ratio"]
    elif until is not None and until < x.t["growth_full_steps_medium"]:
        ratio = x.t["medium_ratio"]
    else:
        ratio = x.t["low_ratio"]
    top = d.never_freed[0] if d.never_freed else None
    return Draft(
        ratio * x.window_ns,
        f"Allocated memory grows {_bytes(d.growth_bytes_per_step)} per step on GPU {d.device}"
        + (f" (device full in {plural(until, 'step')})" if until is not None else "")
        + (f"; never freed: {top.op}" if top else ""),
        {
            "device": d.device,
            "growth_bytes_per_step": d.growth_bytes_per_step,
            "growth_consistency_ratio": d.growth_consistency_ratio,
            "boundary_allocated_bytes": list(d.boundary_allocated_bytes),
            "never_freed_bytes_per_step": d.never_freed_bytes_per_step,
            "never_freed": list(d.never_freed),
            "steps_until_full": until,
            "device_memory_bytes": d.device_memory_bytes,
            "peak_allocated_bytes": d.peak_allocated_bytes,
            "steady_steps": list(x.r.memory.steady_steps),
        },
    )


@rule(
    "memory_fragmentation",
    advice={"cuda_app": None},  # PyTorch's caching allocator: reserved against allocated
    # expandable segments end the cudaMalloc/cudaFree calls as keeping the cache does
    fix="no_empty_cache",
    recommendation="Let the caching allocator grow segments instead of caching odd-sized blocks: "
    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (set before CUDA starts); pad variable shapes to a "
    "few bucket sizes.",
    snippet=(
        "# in the launcher, before the process starts CUDA:\n"
        "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True\n"
        "# or pad dynamic lengths to buckets: seq = ((seq + 127) // 128) * 128"
    ),
    thresholds={"fragmentation_min_ratio": 0.5, "fragmentation_allocs_per_step_min": 1.0},
)
def memory_fragmentation(x: RuleInput) -> Draft | None:
    mem = x.r.memory
    d = _worst(x, "fragmentation_ratio")
    allocs = mem.allocator_device_allocs_per_step or 0
    # Reserved far above allocated alone is memory cached by earlier, larger work: harmless.
    # It matters when the allocator keeps asking the driver for more (and empty_cache is not why).
    if (
        d is None
        or (d.fragmentation_ratio or 0) < x.t["fragmentation_min_ratio"]
        or allocs < x.t["fragmentation_allocs_per_step_min"]
        or _releases(mem) > 0
    ):
        return None
    cost = _allocator_cost(x)
    return Draft(
        cost,
        # the allocated figure is the one at the reserved peak, not the allocated peak (audit
        # 15: "reserved for at most 1,325 MiB allocated" beside a 1.8 GB peak)
        f"Fragmented allocator on GPU {d.device}: {_bytes(d.peak_reserved_bytes)} reserved while "
        f"{_bytes(d.peak_reserved_bytes * (1 - d.fragmentation_ratio))} was allocated (peak "
        f"allocated {_bytes(d.peak_allocated_bytes)}), and still {fmt_num(allocs)} "
        f"{mem.allocator_api}Malloc per step",
        {
            "device": d.device,
            "fragmentation_ratio": d.fragmentation_ratio,
            "peak_reserved_bytes": d.peak_reserved_bytes,
            "peak_allocated_bytes": d.peak_allocated_bytes,
            "allocator_device_allocs_per_step": allocs,
            "allocator_device_frees_per_step": mem.allocator_device_frees_per_step,
            "allocator_calls_ns_per_step": mem.allocator_calls_ns_per_step,
        },
    )


@rule(
    "allocator_churn",
    advice={
        "cuda_app": Advice(
            "The GPU waits while the host allocates and frees device memory (cudaFree "
            "synchronizes the device): allocate buffers once and reuse them, or use the stream-"
            "ordered allocator (cudaMallocAsync/cudaFreeAsync) with a pool that keeps freed "
            "memory cached.",
            (
                "cudaMemPool_t pool; cudaDeviceGetDefaultMemPool(&pool, dev);\n"
                "uint64_t keep = UINT64_MAX;  // keep freed memory in the pool\n"
                "cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep);\n"
                "cudaMallocAsync(&buf, bytes, stream); /* ... */ cudaFreeAsync(buf, stream);  // no device sync"
            ),
        )
    },
    fix="no_empty_cache",
    recommendation="Keep the caching allocator's blocks between steps: remove torch.cuda.empty_cache() (and "
    "gc-triggered frees) from the loop; each call makes the next step cudaMalloc again, and cudaFree "
    "synchronizes the device.",
    snippet=(
        "for batch in loader:\n"
        "    train_step(batch)\n"
        "    # torch.cuda.empty_cache()   # remove: the next step re-allocates everything\n"
        "# if memory is tight: export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
    ),
    thresholds={
        "churn_calls_per_step_min": 1.0,
        # without steps: the allocator's calls leave the GPU idle this share of the window
        "churn_idle_min_ratio": 0.05,
    },
)
def allocator_churn(x: RuleInput) -> Draft | None:
    mem = x.r.memory
    if not mem.steady_steps:
        return _churn_in_window(x)
    allocs = mem.allocator_device_allocs_per_step or 0
    frees = mem.allocator_device_frees_per_step or 0
    if max(allocs, frees) < x.t["churn_calls_per_step_min"]:
        return None
    if any(f.id == "memory_fragmentation" for f in x.found):
        return None  # the same calls, explained by fragmentation
    if x.r.idle.cold_window and any(f.id == "graph_capture" for f in x.found):
        # a capture pass: torch.cuda.graph's __enter__ empties the cache before it captures
        # (audit 6: SGLang's decode capture, its two frees under graphs.py's __enter__, was
        # told to take empty_cache() out of the loop)
        return None
    cost = _allocator_cost(x)
    empties = mem.empty_cache_calls_per_step or 0
    rec = None
    if not _releases(mem):
        rec = (
            "The allocator returns memory to the driver and asks for it again inside steps: keep shapes stable "
            "(pad to buckets) or set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; look for "
            "empty_cache() or memory-fraction limits in libraries."
        )
    return Draft(
        cost,
        f"{fmt_num(allocs)} {mem.allocator_api}Malloc and {fmt_num(frees)} "
        f"{mem.allocator_api}Free per step"
        + (
            f" ({fmt_num(empties)} empty_cache() per step)"
            if empties
            else " (the cache released between ops, as empty_cache() does)"
            if _releases(mem)
            else ""
        )
        + f" cost {fmt_ms(cost)}",
        {
            "allocator_device_allocs_per_step": allocs,
            "allocator_device_frees_per_step": frees,
            "allocator_calls_ns_per_step": mem.allocator_calls_ns_per_step,
            "empty_cache_calls_per_step": empties,
            "frees_outside_ops_per_step": mem.frees_outside_ops_per_step,
            "steady_steps": list(mem.steady_steps),
        },
        recommendation=rec,
    )


# Pinned host memory is slow to allocate and free (the driver pins and maps the pages, and
# cudaFreeHost synchronizes): allocate it once and reuse it
PINNED_HOST_ADVICE = Advice(
    "Pinned host memory is slow to allocate and free (the driver pins and maps every page, and "
    "cudaFreeHost synchronizes the device): allocate the pinned buffers once, outside the loop "
    "or the timed region, and reuse them (cudaHostAlloc / hipHostMalloc at setup, free at "
    "teardown).",
    (
        "float* h; cudaHostAlloc(&h, bytes, cudaHostAllocDefault);  // once, at setup\n"
        "for (int i = 0; i < iters; ++i) {\n"
        "  fill(h); cudaMemcpyAsync(d, h, bytes, cudaMemcpyHostToDevice, s); /* ... */\n"
        "}\n"
        "cudaFreeHost(h);  // once, at teardown"
    ),
)
PINNED_HOST_PYTORCH = (
    "Pinned host memory is slow to allocate and free (the driver pins and maps every page, and "
    "freeing it synchronizes the device): pin a buffer once and copy each batch into it, or let "
    "DataLoader(pin_memory=True) reuse the caching host allocator's blocks, rather than "
    "calling pin_memory() on fresh tensors or allocating pinned tensors inside the loop."
)
PINNED_HOST_SNIPPET = (
    "pinned = torch.empty(shape, dtype=dtype, pin_memory=True)  # once\n"
    "for batch in loader:\n"
    "    pinned.copy_(batch)\n"
    "    x = pinned.to('cuda', non_blocking=True)"
)


def _calls_noun(mem: MemoryResult) -> str:
    """The device allocator's calls by their runtime's names (hipMalloc/hipFree on ROCm)."""
    return f"{mem.allocator_api}Malloc/{mem.allocator_api}Free call"


def _churn_in_window(x: RuleInput) -> Draft | None:
    """allocator_churn without steps: the window's allocator calls, judged by the GPU idle
    they cover (a cold first pass's few first allocations do not reach it)."""
    mem = x.r.memory
    idle = x.idle_over("allocator", "churn_idle_min_ratio")
    if idle is None:
        return None
    evidence = {
        "idle_ns": idle,
        "window_allocator_calls": mem.window_allocator_calls,
        "window_allocator_ns": mem.window_allocator_ns,
        "window_pinned_host_calls": mem.window_pinned_host_calls,
        "window_pinned_host_ns": mem.window_pinned_host_ns,
        "top_segments": x.segments("allocator"),
    }
    device = (
        f"{plural(mem.window_allocator_calls, _calls_noun(mem))} "
        f"({fmt_ms(mem.window_allocator_ns)})"
    )
    if mem.window_pinned_host_ns > mem.window_allocator_ns:
        # mostly pinned host memory allocated and freed (audit 8: a CUDA benchmark's harness,
        # cudaHostAlloc 115.9 ms and cudaFreeHost 60.0 ms of the 238.51 ms idle, was told to
        # use cudaMallocAsync's pool, which does not touch host memory)
        return Draft(
            idle,
            f"{plural(mem.window_pinned_host_calls, 'pinned host alloc/free call')} "
            f"({fmt_ms(mem.window_pinned_host_ns)} of host time)"
            + (f" and {device}" if mem.window_allocator_calls else "")
            + f" leave the GPU idle {fmt_ms(idle)}",
            evidence,
            recommendation=PINNED_HOST_PYTORCH,
            snippet=PINNED_HOST_SNIPPET,
            advice={"cuda_app": PINNED_HOST_ADVICE},
        )
    return Draft(
        idle,
        f"{plural(mem.window_allocator_calls, _calls_noun(mem))} "
        f"{'takes' if mem.window_allocator_calls == 1 else 'take'} {fmt_ms(mem.window_allocator_ns)} "
        f"of host time and leave the GPU idle {fmt_ms(idle)}",
        evidence,
        recommendation=(
            "The GPU waits while the host allocates and frees device memory: keep PyTorch's caching "
            "allocator on (unset PYTORCH_NO_CUDA_MEMORY_CACHING / PYTORCH_NO_HIP_MEMORY_CACHING), "
            "remove torch.cuda.empty_cache() from the loop, and keep shapes stable (or set "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True)."
        ),
    )


# the saturating batch is named where it is this many times the recommended one
SATURATION_NAMED_RATIO = 1.5


# What the larger batch's prediction takes as given (both rules' evidence): the trace does not
# say which dimension is the batch, so the GPU's work is scaled linearly (session 48: an exact GP
# over its whole training set, whose kernel matrix is N x N, read 6.12x at 8x the points against
# 1.65-1.72x measured; its GEMMs took 13.3x as long at 4x)
# and the host's other work per step held: code that loops over the samples in the step thread
# (a reinforcement-learning rollout stepping its environments one by one) is not told from work
# done once a step
BATCH_ASSUMES = (
    "the GPU's work grows linearly with the batch (its optimizer's not at all): work that grows "
    "faster, such as a matrix over pairs of samples, gains less; the host's work per step holds "
    "but the loader's and the CPU ops that make the batch: host code that loops over the "
    "samples (environments stepped one by one, per-sample Python) grows with the batch and "
    "gains less too"
)


@rule(
    "memory_headroom",
    advice={
        "cuda_app": Advice(
            "The GPU waits for the host while most of its memory is unused: give each launch more"
            " work (a larger problem per kernel, or several independent problems batched into one"
            " launch).",
            (
                "// batch independent problems into one launch: one grid dimension per problem\n"
                "dim3 grid(blocks_per_problem, n_problems);\n"
                "solve<<<grid, b, 0, s>>>(problems);"
            ),
        )
    },
    estimate=lambda r: r.memory.headroom_what_if(),
    recommendation="The GPU waits for the host while most of its memory is unused: give it more work per step "
    "(a larger batch or sequence; scale the learning rate, or accumulate fewer micro-batches).",
    snippet=(
        "loader = DataLoader(dataset, batch_size=B * M)  # M: the multiplier in the evidence\n"
        "# keep the optimizer's effective batch: grad accumulation steps / M, or lr scaled with the batch"
    ),
    thresholds={
        "headroom_min_ratio": 0.5,
        "headroom_busy_max_ratio": 0.6,
        "headroom_host_bound_min_ratio": 0.5,
        # the smallest batch multiplier worth recommending (the multipliers are powers of 2:
        # 1 is the batch as it is)
        "headroom_min_multiplier": 2,
        # as small_batch's: a larger batch gaining less per sample is no lever (audit 20: a GH200
        # loop "would raise throughput 1.0x", counted in all fixes)
        "headroom_min_speedup": 1.10,
    },
)
def memory_headroom(x: RuleInput) -> Draft | None:
    mem, idle = x.r.memory, x.r.idle
    d = _worst(x, "peak_reserved_bytes")
    busy = idle.gpu_busy_ratio
    if d is None or d.headroom_ratio is None or busy is None:
        return None
    host_bound = sum(x.idle(c) for c in HOST_BOUND_CAUSES)
    if (
        d.headroom_ratio < x.t["headroom_min_ratio"]
        or busy >= x.t["headroom_busy_max_ratio"]
        or idle.idle_ns <= 0
        or host_bound / idle.idle_ns < x.t["headroom_host_bound_min_ratio"]
    ):
        return None
    m = mem.recommended_multiplier
    if m is None or m < x.t["headroom_min_multiplier"]:
        return None
    w, _ = mem.headroom_what_if()
    if w is not None and w.speedup is not None:
        gain = w.speedup
    else:  # no model: the GPU's busy time scaled, the host's unchanged
        step = mem.step_time_median_ns or 0
        gpu = mem.gpu_busy_ns_per_step or 0
        gain = m * step / max(step, gpu * m) if step else 1.0
    if gain < x.t["headroom_min_speedup"]:
        return None
    # attributed: the time per sample the larger batch saves (the model's saving replaces it)
    cost = x.window_ns * max(0.0, 1 - 1 / gain) if gain > 0 else 0
    fits = (d.base_allocated_bytes or 0) + m * (d.step_span_bytes or 0)
    share, act_bytes, share_source = activation_share(d)
    return Draft(
        cost,
        f"GPU {fmt_pct(busy)} busy with {fmt_pct(d.headroom_ratio)} of its memory unused: {a_times(m)} batch fits "
        f"(about {_bytes(fits)}) and would raise throughput {gain:.2f}x"
        # where the workers bound the step, the saving moves into the wait for their next
        # batch (the finding's what_if: none): the gain is the loader's keeping up (the
        # invariant audit s57: "would raise throughput 1.88x" over a 1.00x what_if)
        + (
            " if the DataLoader kept up (its workers bound the step: no gain as it is)"
            if loader_bound_ns(x.r) is not None
            else ""
        )
        # where the GPU's work would fill the step only at a much larger batch, say so: the
        # recommended power of two moves in steps (audit 14: two recordings of one script,
        # saturating at 3.65x and 4.14x, read "2x ... 2.0x" and "4x ... 3.7x")
        + (
            f"; the GPU's work would fill the step at about a {sat:.1f}x batch"
            if (sat := mem.saturation_multiplier) and sat >= SATURATION_NAMED_RATIO * m
            else ""
        ),
        {
            "device": d.device,
            "gpu_busy_ratio": busy,
            "host_bound_idle_ratio": host_bound / idle.idle_ns,
            "memory_headroom_ratio": d.headroom_ratio,
            "device_memory_bytes": d.device_memory_bytes,
            "peak_reserved_bytes": d.peak_reserved_bytes,
            "base_allocated_bytes": d.base_allocated_bytes,
            "activation_bytes_per_step": d.step_span_bytes,
            "activation_ratio": share,
            "activation_bytes_at_peak": act_bytes,
            "activation_ratio_source": share_source,
            "peak_by_category_bytes": d.peak_by_category_bytes,
            "multiplier": m,
            "fit_multiplier": mem.fit_multiplier,
            "saturation_multiplier": mem.saturation_multiplier,
            "predicted_peak_allocated_bytes": fits,
            "gain_by_multiplier": mem.batch_gains,
            "assumes": BATCH_ASSUMES,
        },
        recommendation=(
            f"The GPU waits for the host while {fmt_pct(d.headroom_ratio)} of its memory is unused: use a "
            f"{m}x larger batch (or sequence), which fits in 80% of device memory"
            # no backward, no optimizer step: nothing trains (a public H100 inference loop
            # was told to scale its learning rate)
            + (
                "; batch more requests or samples per forward pass."
                if x.r.host_ops.forward_only
                else "; scale the learning rate or accumulate fewer micro-batches to keep the "
                "effective batch."
            )
        ),
        snippet=(
            "loader = DataLoader(dataset, batch_size=B * M)  # M: the multiplier in the evidence"
            if x.r.host_ops.forward_only and x.r.steps.loader_calls_per_step
            # no DataLoader in the trace (a script feeding tensors): stack the inputs itself
            # (session 56's audit: an eager layer's demo was shown a DataLoader line)
            else "x = torch.cat([x_1, ..., x_M])  # M inputs per forward pass: the multiplier "
            "in the evidence"
            if x.r.host_ops.forward_only
            else None
        ),
        # short of 2x the GPU's time would fill the step: the 2x batch's gain rests on the GPU
        # work scaling no worse than linearly past that, which no held-out loop bears out in
        # general (GPT-2 under the Trainer: 1.23x against 1.15-1.23; a ViT's 1.24x against
        # 1.05-1.27; wav2vec2's 1.58x against 1.01-1.21, longer padding with more samples)
        cap="low" if (mem.saturation_multiplier or 0) < 2 else None,
        cap_reason=(
            f"the GPU's work would fill the step at a {mem.saturation_multiplier or 0:.2f}x batch, "
            "short of 2x: the gain rests on the GPU work scaling no worse than linearly past it"
        ),
    )


# Without memory events the fit is unknown: the batch multiplier where the GPU's busy time
# fills the step, at most this (the largest recorded on a third-party loop without memory
# events: the Trainer's 4x; beyond it the loop is a new one whose fit nothing here bounds).
UNKNOWN_FIT_MAX_MULTIPLIER = 4


def small_batch_plan(r: Results) -> tuple[int, WhatIf] | None:
    """The larger batch on a trace without memory events: the multiplier (the largest power of
    2 at which the GPU's busy time still fits in the un-profiled step, at most
    :data:`UNKNOWN_FIT_MAX_MULTIPLIER`) and its replayed throughput gain per sample."""
    rp, mem = r.replay, r.memory
    if rp is None or rp.unprofiled_step_ns is None or not mem.gpu_busy_ns_per_step:
        return None
    sat = rp.unprofiled_step_ns / mem.gpu_busy_ns_per_step
    m = power_of_two_at_most(min(sat, UNKNOWN_FIT_MAX_MULTIPLIER))
    if m < 2:
        return None
    p = rp.predict(whatif.gpu_work_scaled(float(m)))
    if p is None or not p.speedup:
        return None
    return m, WhatIf.larger_batch(p.step_time_ns, p.step_time_after_ns, m, p.transform)


def small_batch_what_if(r: Results) -> tuple[WhatIf | None, str | None]:
    plan = small_batch_plan(r)
    if plan is None:
        return None, "no step model, or the GPU's busy time already fills the step"
    return plan[1], None


@rule(
    "small_batch",
    advice={
        "cuda_app": Advice(
            "The GPU waits for the host: give each launch more work (a larger problem per kernel,"
            " or several independent problems batched into one launch); the trace has no memory"
            " events to say how much more fits (nsys --cuda-memory-usage=true records them).",
            (
                "// batch independent problems into one launch: one grid dimension per problem\n"
                "dim3 grid(blocks_per_problem, n_problems);\n"
                "solve<<<grid, b, 0, s>>>(problems);"
            ),
        )
    },
    estimate=small_batch_what_if,
    recommendation="The GPU waits for the host and the trace has no memory events to say how much "
    "larger a batch fits: try the multiplier in the evidence, and record once with "
    "profile_memory=True to see whether it fits (memory_headroom then bounds it).",
    snippet=(
        "loader = DataLoader(dataset, batch_size=B * M)  # M: the multiplier in the evidence\n"
        "# check it fits: torch.profiler.profile(..., profile_memory=True) or "
        "traceinsight.capture(profile_memory=True)"
    ),
    thresholds={
        "small_batch_busy_max_ratio": 0.6,
        "small_batch_host_bound_min_ratio": 0.5,
        # a per-step lever needs steps that repeat: one "step" is a capture, not a loop
        "small_batch_min_steps": 2,
        # a larger batch that would gain less per sample is no lever (audit 19: "a 4x batch
        # would raise throughput 1.0x per sample", counted in all fixes): host work that grows
        # with the batch held it
        "small_batch_min_speedup": 1.10,
    },
)
def small_batch(x: RuleInput) -> Draft | None:
    """memory_headroom's lever where the trace has no memory events: the GPU under-fed by a
    host-bound step; the fit unknown, said so."""
    mem, idle = x.r.memory, x.r.idle
    busy = idle.gpu_busy_ratio
    if (
        mem.has_memory
        or busy is None
        or idle.idle_ns <= 0
        or x.r.steps.steps < x.t["small_batch_min_steps"]
    ):
        return None
    host_bound = sum(x.idle(c) for c in HOST_BOUND_CAUSES)
    if (
        busy >= x.t["small_batch_busy_max_ratio"]
        or host_bound / idle.idle_ns < x.t["small_batch_host_bound_min_ratio"]
    ):
        return None
    plan = small_batch_plan(x.r)
    if plan is None:
        return None
    m, w = plan
    gain = w.speedup or 1.0
    if gain < x.t["small_batch_min_speedup"]:
        return None
    return Draft(
        x.window_ns * max(0.0, 1 - 1 / gain),
        f"GPU {fmt_pct(busy)} busy while the host bounds the step: {a_times(m)} batch would raise "
        f"throughput {gain:.2f}x per sample if it fits (no memory events: not known)",
        {
            "gpu_busy_ratio": busy,
            "host_bound_idle_ratio": host_bound / idle.idle_ns,
            "gpu_busy_ns_per_step": mem.gpu_busy_ns_per_step,
            "multiplier": m,
            "fits": None,
            "fit_unknown_because": "the trace has no memory events (profile_memory=False)",
            "assumes": BATCH_ASSUMES,
        },
    )
