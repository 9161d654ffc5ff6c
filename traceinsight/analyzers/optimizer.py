"""Optimizer step: kernels and GPU time inside ``Optimizer.step#...``; fused/foreach/per-parameter;
and what ``Optimizer.zero_grad#...`` launches (fills where the gradients are zeroed, not dropped)."""

from __future__ import annotations

import re
from dataclasses import dataclass

import polars as pl

from traceinsight.analyzers.context import Context, launched
from traceinsight.model import intervals as iv
from traceinsight.model.classify import FUSED_OPTIMIZER_KERNELS, HOST_OP_KINDS

# Fused (model/classify.py FUSED_OPTIMIZER_KERNELS): one kernel runs the whole update per chunk of
# tensors. PyTorch's fused=True kernels
# (FusedAdamMathFunctor, _fused_sgd) and Apex/DeepSpeed/Transformer Engine's multi_tensor_apply
# kernels whose functor is the optimizer itself (AdamFunctor, LAMBStage1Functor, SGDFunctor).
# Foreach: multi_tensor_apply with generic list ops (BinaryOpListAlphaFunctor, PointwiseOpScalar).
FOREACH = r"(?i)multi_tensor_apply"
# the host ops of a multi-tensor or fused step (ATen's), where the kernels do not say it: a
# sampled trace, or a custom optimizer's foreach math (audit 15: HTA's Shampoo read
# "per-parameter" around 117 ms of aten::_foreach_mul_)
FOREACH_OPS = r"^aten::_foreach_"
FUSED_OPS = r"^aten::_fused_"
# an optimizer class that says it is fused (apex.optimizers.FusedAdam, FusedLAMB)
FUSED_OPTIMIZER_CLASS = r"(?i)^fused"
OPTIMIZER_PATTERN = r"^Optimizer\.step#"
# optimizer.zero_grad(): with set_to_none=False (the default before PyTorch 2.0) it launches a
# fill kernel per gradient; with None it launches nothing
ZERO_GRAD_PATTERN = r"^Optimizer\.zero_grad#"
# The autograd engine's work: a backward pass. Inside an optimizer step it is the closure's
# (Lightning, LBFGS: ``optimizer.step(closure)`` runs forward and backward inside the range).
BACKWARD_PATTERN = r"^autograd::engine::evaluate_function"


def optimizer_ranges(ctx: Context) -> pl.DataFrame:
    """The optimizer steps' own host ranges (name, tid, start_ns, end_ns): each
    ``Optimizer.step#`` range from the end of the last backward op that started inside it (a
    closure's forward and backward are the model's work, not the optimizer's), else whole."""
    ranges = ctx.rows(HOST_OP_KINDS, OPTIMIZER_PATTERN).select("name", "tid", "start_ns", "end_ns")
    if ranges.height == 0:
        return ranges
    bw = ctx.rows(HOST_OP_KINDS, BACKWARD_PATTERN).select("start_ns", "end_ns")
    if bw.height == 0:
        return ranges
    ranges = ranges.with_row_index("_r")
    pairs = iv.containing(
        bw.rename({"start_ns": "b_s", "end_ns": "b_e"}).with_columns(pl.col("b_s").alias("_bs")),
        ranges,
        inner_start="b_s",
        inner_end="_bs",
        outer_start="start_ns",
        outer_end="end_ns",
    )
    closure_end = pairs.group_by("_r").agg(pl.col("b_e").max().alias("_own_from"))
    return (
        ranges.join(closure_end, on="_r", how="left")
        .with_columns(
            pl.max_horizontal("start_ns", pl.col("_own_from").fill_null(pl.col("start_ns")))
            .clip(upper_bound=pl.col("end_ns"))
            .alias("start_ns")
        )
        .sort("_r")
        .select("name", "tid", "start_ns", "end_ns")
    )


@dataclass(frozen=True)
class OptimizerResult:
    optimizer_steps: int
    optimizer: str | None  # e.g. "AdamW"
    mode: str | None  # "fused" | "foreach" | "per_parameter" | None
    kernels_per_step: float | None
    gpu_ns_per_step: float | None
    host_ns_per_step: float | None
    # optimizer.zero_grad() calls in the window, those that launched kernels (fills of the
    # gradients: set_to_none=False), and per such call the kernels, their GPU time and the
    # call's host time
    zero_grad_calls: int = 0
    zero_grad_filling_calls: int = 0
    zero_grad_kernels_per_call: float = 0.0
    zero_grad_gpu_ns_per_call: float = 0.0
    zero_grad_host_ns_per_call: float = 0.0
    # host time of one-time calls inside the optimizer's ranges, left out of host_ns_per_step
    one_time_host_ns: int = 0


def zero_grad_ranges(ctx: Context) -> pl.DataFrame:
    """The outermost ``Optimizer.zero_grad#`` host ranges (name, tid, start_ns, end_ns)."""
    r = ctx.rows(HOST_OP_KINDS, ZERO_GRAD_PATTERN).select("name", "tid", "start_ns", "end_ns")
    if r.height == 0:
        return r
    out = _outermost(r.rename({"start_ns": "o_s", "end_ns": "o_e", "tid": "o_tid"}))
    return out.rename({"o_s": "start_ns", "o_e": "end_ns", "o_tid": "tid"})


def _kernels_inside(ctx: Context, ranges: pl.DataFrame) -> pl.DataFrame:
    """The kernels launched inside ``ranges`` (o_s, o_e, o_tid) on the range's thread."""
    k = launched(
        ctx.launches,
        ["name", "dur_ns", "launch_start_ns", "launch_tid"],
        pl.col("kind") == "kernel",
    )
    return iv.containing(
        k.with_columns(pl.col("launch_start_ns").alias("_ls")),
        ranges,
        inner_start="launch_start_ns",
        inner_end="_ls",
        outer_start="o_s",
        outer_end="o_e",
        same=("o_tid", "launch_tid"),
    )


def _zero_grad(ctx: Context) -> dict[str, float | int]:
    lo, hi = ctx.window_start_ns, ctx.window_end_ns
    r = zero_grad_ranges(ctx).filter(iv.overlapping(lo, hi))
    if r.height == 0:
        return {}
    ranges = r.select(
        pl.col("start_ns").alias("o_s"), pl.col("end_ns").alias("o_e"), pl.col("tid").alias("o_tid")
    )
    inside = _kernels_inside(ctx, ranges)
    # per call that launched work: a first call before any backward has no gradients to zero
    # (audit 24: "134.2 kernels a call" where 5 of 6 calls launched 161 and the first none)
    filling = ranges.join(inside.select("o_s", "o_tid").unique(), on=["o_s", "o_tid"], how="semi")
    n = max(1, filling.height)
    return {
        "zero_grad_calls": ranges.height,
        "zero_grad_filling_calls": filling.height,
        "zero_grad_kernels_per_call": inside.height / n,
        "zero_grad_gpu_ns_per_call": float(inside["dur_ns"].sum() or 0) / n,
        "zero_grad_host_ns_per_call": float((filling["o_e"] - filling["o_s"]).sum()) / n,
    }


def analyze_optimizer(ctx: Context) -> OptimizerResult:
    zero = _zero_grad(ctx)
    lo, hi = ctx.window_start_ns, ctx.window_end_ns
    # ranges overlapping the window: one starts before the kernels it launches, so a window
    # that begins with the GPU's first activity (no steps) begins inside it (audit s62: a LoRA
    # loop's per-parameter AdamW, 224 kernels, left out and read as launch-bound)
    ranges = optimizer_ranges(ctx).filter(iv.overlapping(lo, hi))
    ranges = ranges.select(
        pl.col("name"),
        pl.col("start_ns").alias("o_s"),
        pl.col("end_ns").alias("o_e"),
        pl.col("tid").alias("o_tid"),
    )
    if ranges.height == 0:
        return OptimizerResult(0, None, None, None, None, None, **zero)
    ranges = _one_class(_outermost(ranges))
    name = ranges["name"][0].split("#", 1)[1].split(".")[0]
    inside = _kernels_inside(ctx, ranges)
    n = ranges.height
    ops = _ops_inside(ctx, ranges)
    once = _one_time_inside(ctx, ranges)
    if inside.height == 0:
        mode = None
    elif (
        inside.filter(pl.col("name").str.contains(FUSED_OPTIMIZER_KERNELS)).height
        or re.search(FUSED_OPTIMIZER_CLASS, name) is not None
        or ops.filter(pl.col("name").str.contains(FUSED_OPS)).height
    ):
        mode = "fused"
    elif (
        inside.filter(pl.col("name").str.contains(FOREACH)).height
        or ops.filter(pl.col("name").str.contains(FOREACH_OPS)).height
    ):
        mode = "foreach"
    else:
        mode = "per_parameter"
    return OptimizerResult(
        optimizer_steps=n,
        optimizer=name,
        mode=mode,
        kernels_per_step=inside.height / n,
        gpu_ns_per_step=float(inside["dur_ns"].sum()) / n if inside.height else 0.0,
        host_ns_per_step=max(0.0, float((ranges["o_e"] - ranges["o_s"]).sum()) - once) / n,
        one_time_host_ns=once,
        **zero,
    )


# one-time calls (idle.py warmup_calls) that are not the optimizer's steady cost
ONE_TIME_KINDS = ("first_call", "first_launch", "load")


def _one_time_inside(ctx: Context, ranges: pl.DataFrame) -> int:
    """Host time of one-time calls (a first call's lazy module load, a kernel's first launch)
    inside the optimizer's ranges: a cold pass's, not a step's (audit s62: 37.0 ms of a cold
    LoRA loop's 42.43 ms AdamW step were three first calls, sqrt 15.03, addcmul_ 14.99 and div
    7.00 ms, and the finding ranked first at 8x its steady cost)."""
    from traceinsight.analyzers.idle import warmup_calls  # idle reads this module's ranges

    # the calls inside, not the optimizer's own first range (slow for the calls it holds)
    once = warmup_calls(ctx).filter(
        pl.col("kind").is_in(ONE_TIME_KINDS) & ~pl.col("name").str.contains(OPTIMIZER_PATTERN)
    )
    if once.height == 0:
        return 0
    calls = iv.union(once.select("tid", "start_ns", "end_ns"), by=["tid"])
    spans = iv.union(
        ranges.select(
            pl.col("o_tid").alias("tid"),
            pl.col("o_s").alias("start_ns"),
            pl.col("o_e").alias("end_ns"),
        ),
        by=["tid"],
    )
    return sum(iv.overlap_by(spans, calls, "tid").values())


def _ops_inside(ctx: Context, ranges: pl.DataFrame) -> pl.DataFrame:
    """ATen's multi-tensor and fused ops inside the optimizer's step ranges (``name``)."""
    ops = ctx.rows(HOST_OP_KINDS, f"{FOREACH_OPS}|{FUSED_OPS}")
    if ops.height == 0:
        return ops.select("name")
    return iv.containing(
        ops.select("name", "start_ns", "end_ns", "tid"),
        ranges,
        inner_start="start_ns",
        inner_end="end_ns",
        outer_start="o_s",
        outer_end="o_e",
        same=("o_tid", "tid"),
    ).select("name")


def _outermost(ranges: pl.DataFrame) -> pl.DataFrame:
    """The ranges not inside another on their thread: a wrapper optimizer's step calls its
    children's (TorchRec's CombinedOptimizer: a 4.36 s step with three ranges inside read as
    six optimizer steps of 1.98 s, audit 7)."""
    r = ranges.sort("o_tid", "o_s", pl.col("o_e"), descending=[False, False, True])
    reach = pl.col("o_e").cum_max().shift(1).over("o_tid")
    return r.filter(~(pl.col("o_e") <= reach).fill_null(False))


def _one_class(ranges: pl.DataFrame) -> pl.DataFrame:
    """The ranges of the optimizer class that holds the most host time: a model stepping two
    optimizers (Shampoo and an EMA) has two per-step figures, not their mean (audit 7: "17.2
    kernels and 111.13 ms" where Shampoo's were 26.5 and 209 ms)."""
    cls = pl.col("name").str.split("#").list.get(1, null_on_oob=True).str.split(".").list.first()
    r = ranges.with_columns(cls.alias("_cls"), (pl.col("o_e") - pl.col("o_s")).alias("_d"))
    top = r.group_by("_cls").agg(pl.col("_d").sum()).sort(["_d", "_cls"], descending=[True, False])
    return r.filter(pl.col("_cls") == top["_cls"][0]).drop("_cls", "_d")
