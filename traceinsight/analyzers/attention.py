"""Eager attention: softmax over a [..., T, T] score matrix between two batched matmuls
(Q @ K^T and P @ V), with no fused attention kernel, and what a fused kernel would take.

Found from the recorded shapes (``record_shapes=True``): the softmax ops give T and the batch
times heads (B·H); the batched matmul whose inputs are [..., T, d] and [..., d, T] gives the
head size d. The eager kernels are those launched by ops that take a [..., T, T] tensor (the
softmax, the mask and scale, P @ V, their backward) or compute Q @ K^T. A fused kernel
(FlashAttention, memory-efficient, cuDNN: ``F.scaled_dot_product_attention``) does the forward's
4·B·H·T²·d FLOPs (the backward's 2.5x that) at :data:`FUSED_ATTENTION_EFFICIENCY` of the
device's tensor peak for the dtype, and moves Q, K, V and O (4·B·H·T·d elements, 2.5x that
backward) at :data:`FUSED_MEMORY_EFFICIENCY` of its bandwidth: it never writes the T x T
matrix. The loop over distinct shapes is Python (a handful); the kernels are polars.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any

import orjson
import polars as pl

from traceinsight.analyzers.context import Context, outermost
from traceinsight.analyzers.replay import ReplayResult
from traceinsight.analyzers.syncs import input_copy_syncs, thread_neighbour
from traceinsight.causal import transforms
from traceinsight.causal.whatif import WhatIf
from traceinsight.model.devices import DeviceSpec
from traceinsight.model.flops import ATTENTION, ATTENTION_BACKWARD_RATIO, DTYPE_BYTES, DTYPE_NAMES
from traceinsight.records import OMIT_NONE

SOFTMAX_OPS = ("aten::softmax", "aten::_softmax", "aten::_safe_softmax")
SOFTMAX_BACKWARD_OPS = ("aten::_softmax_backward_data",)
# Compiled code: inductor's Triton kernels that compute a softmax, recorded (record_shapes) as
# launches with their inputs' shapes. Eager attention compiled stays eager where inductor does
# not match it to SDPA: its softmax kernel still reads and writes the T x T scores (a compiled
# Llama: 6.85 ms a step forward, 5.96 backward, beside the score matmuls)
TRITON_SOFTMAX = r"^triton_\w*_softmax"
TRITON_SOFTMAX_BACKWARD = r"^triton_\w*_softmax_backward"
MATMUL_OPS = ("aten::bmm", "aten::matmul", "aten::baddbmm", "aten::mm")
# A score matrix this long on a side is attention (short ones are cheap either way).
MIN_SEQ_LEN = 128
# FlashAttention-2's forward reaches 50-73% of an A100's bf16 peak (its paper, d = 64/128);
# FlashAttention-3 about 75% of an H100's: half the peak is the assumption, stated.
FUSED_ATTENTION_EFFICIENCY = 0.5
FUSED_MEMORY_EFFICIENCY = 0.8  # of the datasheet's HBM bandwidth


def _softmax_forward() -> pl.Expr:
    """A forward softmax: ATen's, or an inductor kernel's that is not a backward."""
    name = pl.col("name")
    return name.is_in(SOFTMAX_OPS) | (
        name.str.contains(TRITON_SOFTMAX) & ~name.str.contains(TRITON_SOFTMAX_BACKWARD)
    )


def _softmax_backward() -> pl.Expr:
    """A softmax backward: ATen's, or an inductor kernel's (a recompute fused in counts here)."""
    name = pl.col("name")
    return name.is_in(SOFTMAX_BACKWARD_OPS) | name.str.contains(TRITON_SOFTMAX_BACKWARD)


@dataclass(frozen=True)
class EagerAttention:
    """Eager attention in the window: the score matrix's side (``seq_len``), B·H, the head size
    (None where no Q @ K^T was recorded), the softmax dtype, the forward and backward softmax
    calls, the eager kernels' time and share of kernel time, and the fused estimate (None with
    ``why_no_estimate`` where the trace cannot tell)."""

    seq_len: int
    batch_heads: int
    head_dim: int | None
    dtype: str | None
    forward_calls: int
    backward_calls: int
    kernel_count: int
    kernel_ns: int
    kernel_time_ratio: float | None
    fused_estimate_ns: int | None = None
    saving_ns: int | None = None
    # the softmax is inductor's Triton kernel: compiled code whose attention stays eager
    compiled: bool = False
    # syncs of device constants made for the attention's mask (a torch.tensor(x, device=...)
    # whose next op takes a [..., T, T] mask: transformers' eager masking), which a fused
    # kernel's causal flag does without (:func:`mask_syncs`)
    mask_syncs: int = 0
    what_if: WhatIf | None = field(default=None, metadata=OMIT_NONE)
    why_no_estimate: str | None = field(default=None, metadata=OMIT_NONE)


def _square(dims: list[Any]) -> int | None:
    """The side of a [..., T, T] tensor among ``dims`` (T >= MIN_SEQ_LEN), else None."""
    for d in dims:
        if (
            isinstance(d, list)
            and len(d) >= 3
            and all(isinstance(x, int) for x in d)
            and d[-1] == d[-2] >= MIN_SEQ_LEN
        ):
            return int(d[-1])
    return None


def _loads(text: str | None) -> list[Any]:
    try:
        v = orjson.loads(text) if text else []
    except orjson.JSONDecodeError:
        return []
    return v if isinstance(v, list) else []


def _qk_head_dim(dims: list[Any], seqs: set[int]) -> int | None:
    """d of a Q @ K^T: two consecutive inputs [..., T, d] and [..., d, T] with T a softmax's
    side (bmm/matmul's first two; baddbmm's second and third, after the bias)."""
    mats = [d if isinstance(d, list) and len(d) >= 2 else None for d in dims]
    for a, b in zip(mats, mats[1:], strict=False):
        if a is None or b is None:
            continue
        if a[-2] == b[-1] and a[-2] in seqs and a[-1] == b[-2] and a[-1] < a[-2]:
            return int(a[-1])
    return None


def _scores(dims: list[Any]) -> set[tuple[int, int]]:
    """(elements, T) of each [..., T, T] input: a score matrix is known by both, whatever
    split of its batch and heads (a [B, H, T, T] view of a [B*H, T, T] tensor)."""
    out = set()
    for d in dims:
        square = isinstance(d, list) and len(d) >= 3 and all(isinstance(x, int) for x in d)
        if square and d[-1] == d[-2] >= MIN_SEQ_LEN:
            out.add((math.prod(d), int(d[-1])))
    return out


# the constant's lift and the mask op that takes it follow the copy's sync within this (61 and
# 78 us after it on a Llama: aten::lift_fresh, detach_, then aten::where on [4, 1, 2048, 2048])
MASK_OP_AFTER_MAX_NS = 1_000_000


def mask_syncs(ctx: Context, seqs: set[int]) -> pl.DataFrame:
    """The syncs (tid, start_ns) of device constants made for an attention mask: a copy that
    built a tensor from Python data (syncs.input_copy_syncs) whose thread's next op with
    a tensor input, within :data:`MASK_OP_AFTER_MAX_NS`, takes a [..., T, T] one with T an eager
    softmax's side. transformers' eager masking makes its zero so each forward (a Llama's one
    sync a step, 24-49 ms of waiting); its SDPA path builds no mask for a causal model, as
    F.scaled_dot_product_attention(..., is_causal=True) needs none."""
    syncs = input_copy_syncs(ctx).filter(pl.col("constructed"))
    syncs = syncs.select(pl.col("tid").cast(pl.Int64), "start_ns", "end_ns")
    none = pl.DataFrame(schema={"tid": pl.Int64, "start_ns": pl.Int64})
    if syncs.height == 0 or not seqs:
        return none
    shaped = ctx.op_args.filter(pl.col("input_dims").str.contains(r"\[\d"))  # a shaped input
    masks = {
        d
        for d in shaped.get_column("input_dims").unique().to_list()
        if any(t in seqs for _, t in _scores(_loads(d)))
    }
    ops = shaped.select(pl.col("tid").cast(pl.Int64), "start_ns", "input_dims")
    # each sync's next shaped op, in the syncs' order
    nxt = thread_neighbour(syncs, ops, "end_ns", "forward").with_columns(syncs["start_ns"])
    mask = pl.col("input_dims").is_in(list(masks)) & (
        pl.col("_at") - pl.col("end_ns") <= MASK_OP_AFTER_MAX_NS
    )
    return nxt.filter(mask).select("tid", pl.col("start_ns").cast(pl.Int64))


def _fused_transform(
    ek: pl.DataFrame, eager_ops: pl.DataFrame, fused_ns: float, kernel_ns: int
) -> transforms.Transform:
    """The eager kernels ``ek`` replaced by the fused kernel: its time ``fused_ns`` spread over
    the softmax kernels (forward and backward: one per call, where the fused kernel runs), the
    other eager kernels gone with their launches and their ops' dispatch. Where no softmax
    launched a kernel of its own, every eager kernel is scaled to the fused time instead."""
    softmax = eager_ops.filter(_softmax_forward() | _softmax_backward())
    kept = ek.join(softmax.select("rank", "external_id").unique(), on=["rank", "external_id"])
    kept_ns = int(kept.get_column("dur_ns").sum()) if kept.height else 0
    if kept_ns <= 0:
        factor = min(1.0, fused_ns / kernel_ns) if kernel_ns else 1.0
        keys = ek.select("device", "start_ns", pl.lit(factor).alias("factor"))
        return transforms.scaled_kernels(keys)
    share = fused_ns / kept_ns
    keys = ek.join(
        kept.select("device", "start_ns", pl.lit(True).alias("_kept")),
        on=["device", "start_ns"],
        how="left",
    ).select(
        "device",
        "start_ns",
        pl.when(pl.col("_kept"))
        .then((pl.col("dur_ns") * share).round().cast(pl.Int64).clip(1))
        .otherwise(0)
        .alias("dur_ns"),
    )
    return transforms.kernels_fused(keys)


def eager_attention(
    ctx: Context,
    k: pl.DataFrame,
    spec: DeviceSpec | None,
    replay: ReplayResult | None,
    step_ns: float | None,
    steps: int,
) -> tuple[EagerAttention | None, pl.DataFrame]:
    """The eager attention of the window (None without), and the eager kernels' ops
    (rank, external_id) for other analyses to leave out (their GEMMs are attention's)."""
    none = pl.DataFrame(schema={"rank": pl.Int32, "external_id": pl.Int64})
    oa = ctx.op_args
    if oa.height == 0 or k.height == 0:
        return None, none
    lo, hi = ctx.window_start_ns, ctx.window_end_ns
    ops = oa.filter(pl.col("start_ns").is_between(lo, hi, closed="left"))
    fused = (
        ops.get_column("name").is_in(list(ATTENTION)).any()
        or (k.get_column("kernel_class") == "attention").any()
    )
    if fused:  # a fused kernel already runs attention here
        return None, none
    # in the trace's order: ties among head sizes and dtypes resolve alike on every run
    shapes = ops.select("name", "input_dims", "input_types").unique(maintain_order=True)
    softmax = shapes.filter(_softmax_forward() | _softmax_backward())
    # the score matrices: the softmax inputs' shapes; an op takes one when an input has the
    # same elements and side (activations whose last two sizes happen to equal T do not)
    scores = set().union(*(_scores(_loads(x)) for x in softmax.get_column("input_dims")))
    seqs = {t for _, t in scores}
    if not seqs:
        return None, none
    eager_rows, heads, qk_types = [], Counter(), Counter()
    for name, dims_text, types_text in shapes.iter_rows():  # distinct shapes: a handful
        dims = _loads(dims_text)
        d = _qk_head_dim(dims, seqs) if name in MATMUL_OPS else None
        if _scores(dims) & scores or d is not None:
            eager_rows.append((name, dims_text))
        if d is not None:
            heads[d] += 1
            types = _loads(types_text)
            if types and isinstance(types[0], str) and types[0] in DTYPE_NAMES:
                qk_types[DTYPE_NAMES[types[0]]] += 1
    eager_ops = ops.join(
        pl.DataFrame(eager_rows, schema=["name", "input_dims"], orient="row"),
        on=["name", "input_dims"],
        nulls_equal=True,
    ).select(
        "rank",
        "tid",
        "start_ns",
        (pl.col("start_ns") + pl.col("dur_ns")).alias("end_ns"),
        "external_id",
        "name",
        "input_dims",
        "input_types",
    )
    ids = eager_ops.select("rank", "external_id").unique()
    ek = k.join(ids, on=["rank", "external_id"])
    if ek.height == 0:
        return None, none
    kernel_ns = int(ek.get_column("dur_ns").sum())
    all_ns = int(k.get_column("dur_ns").sum())
    # the forward and backward softmax calls: B·H and T each. One call records nested ops
    # (aten::softmax under autocast's aten::softmax, then aten::_softmax): only the outermost
    # counts (a GPT-2's 36 calls read as 180 and priced its fused kernel 5x too dear)
    fwd = outermost(eager_ops.filter(_softmax_forward()))
    bwd = outermost(eager_ops.filter(_softmax_backward()))
    head_dim = heads.most_common(1)[0][0] if heads else None
    # the fused kernel's dtype is Q's and K's, what scaled_dot_product_attention would take:
    # under autocast the softmax runs in fp32 while the matmuls run in bf16 (the fp32 peak
    # had priced a fused bf16 kernel 15x too slow); the softmax's where no Q @ K^T was seen
    dtype = qk_types.most_common(1)[0][0] if qk_types else None
    for types in fwd.get_column("input_types").head(1 if dtype is None else 0):
        t = _loads(types)
        dtype = DTYPE_NAMES.get(t[0]) if t and isinstance(t[0], str) else None
    elem = next((b for n, b in DTYPE_BYTES.items() if DTYPE_NAMES.get(n) == dtype), 2)

    def work(rows: pl.DataFrame) -> tuple[float, float, int, int]:
        flops = nbytes = 0.0
        side = bh = 0
        # per distinct shape with its calls (a handful of shapes, however many calls)
        per_shape = rows.group_by("input_dims").len()
        for dims_text, calls in per_shape.iter_rows():
            dims = _loads(dims_text)
            t = _square(dims)
            if t is None:
                continue
            b = math.prod(dims[0][:-2])
            side, bh = t, b
            if head_dim is not None:
                flops += calls * 4.0 * b * t * t * head_dim
                nbytes += calls * 4.0 * b * t * head_dim * elem
        return flops, nbytes, side, bh

    f_flops, f_bytes, side, bh = work(fwd)
    b_flops, b_bytes, _, _ = work(bwd)
    flops = f_flops + ATTENTION_BACKWARD_RATIO * b_flops
    nbytes = f_bytes + ATTENTION_BACKWARD_RATIO * b_bytes
    result = EagerAttention(
        seq_len=side or max(seqs),
        batch_heads=bh,
        head_dim=head_dim,
        dtype=dtype,
        forward_calls=fwd.height,
        backward_calls=bwd.height,
        kernel_count=ek.height,
        kernel_ns=kernel_ns,
        kernel_time_ratio=kernel_ns / all_ns if all_ns else None,
        compiled=bool(fwd.get_column("name").str.starts_with("triton_").any()),
    )
    masked = mask_syncs(ctx, seqs)
    result = replace(result, mask_syncs=masked.height)
    why = None
    peak = spec.peak_tflops.get(dtype or "") if spec is not None else None
    if head_dim is None:
        why = "no Q @ K^T matmul with the softmax's shape was recorded: the head size is unknown"
    elif spec is None or not peak:
        why = "the device (or its peak for this dtype) is not in the spec table"
    if why is not None or spec is None or not peak:
        return replace(result, why_no_estimate=why), ids
    fused_ns = max(
        flops / (peak * 1e3 * FUSED_ATTENTION_EFFICIENCY),
        nbytes / (spec.memory_bandwidth_bytes_per_s / 1e9 * FUSED_MEMORY_EFFICIENCY),
    )
    saving = max(0.0, kernel_ns - fused_ns)
    what_if = None
    if replay is not None and replay.model is not None:
        fused = _fused_transform(ek, eager_ops, fused_ns, kernel_ns)
        if masked.height:
            # the mask's constants go with the mask: the fused kernel's causal flag needs none
            fused = transforms.combined([fused, transforms.remove_syncs_at(masked)])
        what_if = replay.predict(fused)
    elif step_ns:
        per_step = saving / max(1, steps)
        what_if = WhatIf.of(step_ns, max(0.0, step_ns - per_step))
    done = replace(result, fused_estimate_ns=int(fused_ns), saving_ns=int(saving), what_if=what_if)
    return done, ids
