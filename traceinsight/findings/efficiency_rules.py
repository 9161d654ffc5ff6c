"""Efficiency rules: GEMM shapes that miss the tensor cores' alignment, and kernels
that run at low occupancy. Registered after rules.py's (this module imports it), so they are
checked last; they read ``x.r.efficiency`` (analyzers/efficiency.py).
"""

from __future__ import annotations

from traceinsight.analyzers import Results
from traceinsight.causal.whatif import WhatIf
from traceinsight.findings.model import Advice, Draft
from traceinsight.findings.rules import RuleInput, compiled_code, rule
from traceinsight.report.format import fmt_ms, fmt_pct, fmt_small_pct, kernel_words, plural


def unaligned_gemms_what_if(r: Results) -> tuple[WhatIf | None, str | None]:
    """The unaligned GEMMs at the rate of aligned ones of similar size, replayed."""
    w = r.efficiency.unaligned_gemms.what_if
    return (
        w,
        None
        if w is not None
        else "no step model: the saving is the GEMMs' time at the aligned rate",
    )


@rule(
    "gemm_shape_inefficient",
    gpu_work=True,
    advice={"cuda_app": None},  # the GEMMs' shapes come from ATen's recorded inputs
    estimate=unaligned_gemms_what_if,
    recommendation="Pad the GEMM dimensions to multiples of 8 for bf16/fp16 (64 where the trace shows it pays): "
    "a vocabulary padded to a multiple of 64 (8191 -> 8192, extra logits masked or never targeted), hidden and "
    "batch x sequence sizes that are multiples of 8.",
    snippet=(
        "vocab_padded = (vocab + 63) // 64 * 64  # tensor cores want M/N/K % 8 == 0 (16-bit)\n"
        "self.head = nn.Linear(d, vocab_padded, bias=False)\n"
        "logits = self.head(x)[..., :vocab]  # or keep the padded logits: the extra ids never occur"
    ),
    thresholds={"gemm_unaligned_time_ratio": 0.02},
)
def gemm_shape_inefficient(x: RuleInput) -> Draft | None:
    u = x.r.efficiency.unaligned_gemms
    ratio = u.time_ratio
    if not u.gemms or ratio is None or ratio < x.t["gemm_unaligned_time_ratio"]:
        return None
    worst = u.gemms[0]
    return Draft(
        u.saving_ns,  # measured time less the aligned GEMMs' rate on their FLOPs
        f"GEMMs with dimensions off the tensor-core alignment take {fmt_pct(ratio)} of kernel time "
        f"({worst.m}x{worst.n}x{worst.k} {worst.dtype} at {worst.achieved_tflops:.0f} TFLOP/s "
        f"against {worst.reference_tflops:.0f} "
        + (
            "for aligned GEMMs of similar size"
            if worst.reference == "aligned GEMMs"
            else "expected from the device's roofline"
        )
        + "); padding saves about "
        f"{fmt_ms(u.saving_ns)}",
        {
            "unaligned_gemm_time_ratio": ratio,
            "unaligned_gemm_ns": u.time_ns,
            "saving_ns": u.saving_ns,
            "gemms": list(u.gemms),
            "what_if": u.what_if,
        },
    )


@rule(
    "low_occupancy",
    gpu_work=True,
    advice={
        "cuda_app": Advice(
            "Give the low-occupancy kernels more parallel work: a larger grid (more, smaller "
            "blocks, or several problems per launch), 128-256 threads per block, fewer registers "
            "per thread (__launch_bounds__, -maxrregcount) or less shared memory per block; "
            "cudaOccupancyMaxPotentialBlockSize suggests a block size.",
            (
                "int min_grid, block;\n"
                "cudaOccupancyMaxPotentialBlockSize(&min_grid, &block, kernel, 0, 0);\n"
                "// and cap registers: __global__ void __launch_bounds__(256, 2) kernel(...)"
            ),
        )
    },
    no_estimate="raising a kernel's occupancy depends on its code (registers, shared "
    "memory, grid); whether it then runs faster is not in the trace",
    recommendation="Give the low-occupancy kernels more parallel work: larger batches or fused ops (grid too small), "
    "128-256 threads per block (block size), fewer registers per thread (__launch_bounds__, maxrregcount) or less "
    "shared memory per block; for PyTorch ops, torch.compile fuses small reductions and elementwise kernels.",
    snippet=(
        "model = torch.compile(model)  # fuses small kernels into fewer, fuller ones\n"
        "# custom kernels: __launch_bounds__(256, 2) caps registers so two blocks fit per SM (CU)"
    ),
    thresholds={
        "low_occupancy_time_ratio": 0.25,
        # the attributed cost: at low occupancy latency is poorly hidden, not all of the time
        # lost; count half of their time
        "low_occupancy_saving_ratio": 0.5,
        # kernels busy less than this share of the window make no kernel mix to speak of
        "low_occupancy_min_busy_ratio": 0.01,
    },
    cap="low",  # an opportunity: a kernel at low occupancy may still be bandwidth-bound
)
def low_occupancy(x: RuleInput) -> Draft | None:
    o = x.r.efficiency.occupancy
    ratio = o.low_time_ratio
    if not o.low_kernels or ratio is None or ratio < x.t["low_occupancy_time_ratio"]:
        return None
    if x.r.kernels.kernel_ns < x.t["low_occupancy_min_busy_ratio"] * x.window_ns:
        return None
    top = o.low_kernels[0]
    limit = f"limited by {top.limiter or 'unknown'}"
    serial: dict = {}
    if top.grid_blocks is not None and top.grid_blocks <= 1:
        # one block by design (torchvision's NMS mask gather: 64 threads): serial work, whose
        # lever is less of it (fewer boxes before NMS, batched NMS), not occupancy (audit 11;
        # audit 13: the title said so and the advice still asked for a larger grid). A CUDA
        # application's own kernel may be data-parallel work given one block by mistake (audit
        # s58: a public A100 export's vector add over 2^29 floats, add<<<1, 256>>>, 1.06 s a
        # launch where its bytes take ~4 ms): its author picks the grid, so both are said
        per_launch = top.time_ns / max(1, top.count)
        threads = f" of {top.block_threads:.0f} threads" if top.block_threads else ""
        limit = (
            f"a single block{threads} ({fmt_ms(per_launch)} a launch): all of it on one SM"
            if x.framework == "cuda_app"
            else "a single block: serial by design"
        )
        serial = {
            "recommendation": SERIAL_KERNEL_ADVICE,
            "snippet": "",
            "advice": {"cuda_app": Advice(ONE_BLOCK_ADVICE, ONE_BLOCK_SNIPPET)},
        }
    partial = ""
    if top.lane_use is not None and top.lane_use < 1.0 and top.block_threads:
        # blocks that fill part of a warp: occupancy counts the warp, not its idle lanes
        partial = (
            f", in blocks of {top.block_threads:.0f} threads: "
            f"{fmt_small_pct(top.lane_use)} of each warp's lanes work"
        )
        serial = serial or {
            "advice": {"cuda_app": Advice(PARTIAL_WARP_ADVICE, PARTIAL_WARP_SNIPPET)}
        }
    if not serial and compiled_code(x.r):
        serial = {
            "recommendation": COMPILED_OCCUPANCY_ADVICE,
            "snippet": COMPILED_OCCUPANCY_SNIPPET,
        }
    return Draft(
        o.low_ns * x.t["low_occupancy_saving_ratio"],
        f"{fmt_pct(ratio)} of kernel time runs below 25% occupancy; the largest, "
        f"{kernel_words(top.name)}, at {fmt_small_pct(top.occupancy)}, {limit}{partial}",
        {
            "low_occupancy_time_ratio": ratio,
            "low_occupancy_ns": o.low_ns,
            "occupancy_median": o.median,
            "kernels": list(o.low_kernels),
        },
        **serial,
    )


# compiled code (findings/rules.py compiled_code): Inductor chose the kernels' grids and
# blocks; its autotuning searches more of them (audit 19: torch.compile advised to a compiled
# nanoGPT whose low-occupancy kernels were already triton_per_fused_*)
COMPILED_OCCUPANCY_ADVICE = (
    "The program is already compiled: the low-occupancy kernels are Inductor's, whose launch "
    "configurations it picked by heuristics. Let it benchmark more of them "
    "(mode='max-autotune', or max-autotune-no-cudagraphs), and give it more parallel work: a "
    "larger batch or sequence. A kernel of your own: 128-256 threads per block, fewer "
    "registers per thread or less shared memory per block."
)
COMPILED_OCCUPANCY_SNIPPET = (
    'model = torch.compile(model, mode="max-autotune")  # autotunes Triton kernels\' launch configs'
)

PARTIAL_WARP_ADVICE = (
    "The largest such kernel's blocks are not a whole number of warps: a warp runs 32 threads "
    "in step, so a block of fewer (or of a count that is not a multiple of 32) leaves lanes of "
    "its last warp idle, and small blocks also hit the SM's limit on resident blocks before its "
    "warps are full. Use 128-256 threads per block, a multiple of 32 (for a 2-D tile, 16 x 16 "
    "or 32 x 8 rather than 4 x 4), with the grid covering the data."
)
PARTIAL_WARP_SNIPPET = (
    "dim3 threads(16, 16);  // 256 threads: 8 full warps (4 x 4 = 16 threads: half a warp)\n"
    "dim3 blocks((nx + 15) / 16, (ny + 15) / 16);\n"
    "kernel<<<blocks, threads>>>(...);"
)
ONE_BLOCK_ADVICE = (
    "The largest such kernel runs a single block, so all of its work runs on one SM. If its "
    "threads loop over the data (a grid-stride loop), the launch is what limits it: launch "
    "enough blocks to cover the data, (n + threads - 1) / threads or a few per SM, and it can "
    "run up to the SM count times faster. If its work is serial by design (a scan, a sort, "
    "NMS's gather), occupancy does not help: give it less to do or use a parallel algorithm."
)
ONE_BLOCK_SNIPPET = (
    "int threads = 256, blocks = (n + threads - 1) / threads;  // not 1: one block, one SM\n"
    "kernel<<<blocks, threads>>>(n, x, y);"
)
SERIAL_KERNEL_ADVICE = (
    "The largest such kernel runs a single block: its time is serial work by design, which "
    "occupancy does not speed up. Give it less to do (fewer items: filter boxes or candidates "
    "before it), batch several problems into one launch, or use a parallel algorithm for the "
    "step (a parallel scan or sort instead of one block's loop)."
)


def fused_attention_what_if(r: Results) -> tuple[WhatIf | None, str | None]:
    """Eager attention's kernels at a fused kernel's estimated time (analyzers/attention.py)."""
    a = r.efficiency.attention
    if a is None:
        return None, "no eager attention"
    return a.what_if, a.why_no_estimate if a.what_if is None else None


@rule(
    "attention_unfused",
    gpu_work=True,
    advice={"cuda_app": None},  # ATen's matmul-softmax-matmul
    estimate=fused_attention_what_if,
    recommendation="Attention runs eagerly: softmax over the T x T score matrix between two batched "
    "matmuls writes and reads that matrix in memory. Use a fused kernel: "
    "torch.nn.functional.scaled_dot_product_attention (FlashAttention / memory-efficient / cuDNN; "
    "on ROCm its flash and memory-efficient kernels), "
    'or attn_implementation="sdpa" (or "flash_attention_2") for Hugging Face models.',
    snippet=(
        "# before: scores = q @ k.transpose(-2, -1) / math.sqrt(d); p = scores.softmax(-1); o = p @ v\n"
        "o = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)\n"
        '# transformers: AutoModel.from_pretrained(..., attn_implementation="sdpa")'
    ),
    thresholds={"attention_unfused_min_ratio": 0.1},
)
def attention_unfused(x: RuleInput) -> Draft | None:
    a = x.r.efficiency.attention
    if a is None or (a.kernel_time_ratio or 0) < x.t["attention_unfused_min_ratio"]:
        return None
    d = f", head size {a.head_dim}" if a.head_dim else ""
    return Draft(
        a.saving_ns if a.saving_ns is not None else a.kernel_ns,
        f"Eager attention: softmax over {a.seq_len}x{a.seq_len} scores ({a.batch_heads} batch x "
        f"heads{d}) and its matmuls take {fmt_pct(a.kernel_time_ratio)} of kernel time "
        f"({fmt_ms(a.kernel_ns)}); a fused kernel would not write the score matrix"
        + (
            # torch.compile fused the softmax with its mask and casts, not the attention
            "; compiled, it still runs eager: inductor's Triton softmax reads and writes the "
            "scores between two matmuls"
            if a.compiled
            else ""
        )
        + (
            # transformers' eager masking makes a device constant per forward (pageable, so it
            # syncs); the fused path builds no mask for a causal model
            f"; its mask's device constants sync the stream {plural(a.mask_syncs, 'time')} "
            "(torch.tensor(x, device=...) before the mask), which a causal fused kernel does "
            "without"
            if a.mask_syncs
            else ""
        ),
        {
            "seq_len": a.seq_len,
            "batch_heads": a.batch_heads,
            "head_dim": a.head_dim,
            "dtype": a.dtype,
            "forward_calls": a.forward_calls,
            "backward_calls": a.backward_calls,
            "eager_kernel_ns": a.kernel_ns,
            "eager_kernel_count": a.kernel_count,
            "eager_kernel_time_ratio": a.kernel_time_ratio,
            "fused_estimate_ns": a.fused_estimate_ns,
            "compiled": a.compiled,
            "mask_syncs": a.mask_syncs,
        },
    )
