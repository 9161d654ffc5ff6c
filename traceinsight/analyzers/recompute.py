"""Activation-checkpointing recompute: forward ops executed again inside backward.

Backward nodes run as ``autograd::engine::evaluate_function: XBackward0`` ranges. Forward-only
ops (``aten::linear``, attention, layer norm, activations...) nested inside one of them can
only be a recomputation; the GPU time of the kernels they launch is the recompute cost.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from traceinsight.analyzers.context import Context, launched
from traceinsight.model import intervals as iv
from traceinsight.model.classify import names_matching

FORWARD_OPS = (
    r"^aten::(linear|conv[123]d|convolution|scaled_dot_product_attention|_scaled_dot_product_\w+"
    r"|layer_norm|group_norm|batch_norm|gelu|relu|silu|softmax|_softmax|dropout|embedding|matmul|addmm)$"
)
BACKWARD_NODE = r"^autograd::engine::evaluate_function: "
# Backward formulas multiply matrices themselves: linalg's (LinalgCholeskyExBackward0,
# LinalgQrBackward0, LinalgSolveTriangularBackward0) and custom Functions' (GPyTorch's
# InvQuadLogdetBackward) call aten::matmul, which read as checkpointing's recompute on a GPyTorch
# GP regression with no checkpointing (session 46). A recomputed block re-runs a layer (a linear,
# a norm, an activation, dropout...), so a backward node recomputes only where it holds a forward
# op other than these.
PRODUCTS_ONLY = r"^aten::(matmul|addmm)$"


@dataclass(frozen=True)
class RecomputeResult:
    recomputed_ops: int
    recompute_kernel_ns: int  # GPU time of kernels launched by recomputed ops
    recompute_host_ns: int  # host time spent re-running the forward ops
    recompute_ns: int  # the cost: the larger of the two (a launch-bound step pays the host time)
    recompute_time_ratio: float | None  # recompute_ns / analysis window


def recomputed_forward(ctx: Context, where: pl.Expr | None = None) -> pl.DataFrame | None:
    """Forward ops running inside a backward node (checkpointing's recomputation): start_ns,
    end_ns, tid; None when the trace has no backward nodes or no forward ops (``where``)."""
    bw = ctx.rows(("cpu_op",), BACKWARD_NODE)
    fw = names_matching(ctx.rows(("cpu_op",), FORWARD_OPS), "backward", negate=True)
    if where is not None:
        bw, fw = bw.filter(where), fw.filter(where)
    if bw.height == 0 or fw.height == 0:
        return None
    bw = bw.select(
        pl.col("start_ns").alias("b_s"), pl.col("end_ns").alias("b_e"), pl.col("tid").alias("b_tid")
    )
    inside = iv.containing(
        fw.select("name", "start_ns", "end_ns", "tid"),
        bw,
        inner_start="start_ns",
        inner_end="end_ns",
        outer_start="b_s",
        outer_end="b_e",
        same=("b_tid", "tid"),
    )
    layer_op = ~pl.col("name").str.contains(PRODUCTS_ONLY)
    recomputing = inside.group_by("b_tid", "b_s").agg(layer_op.any().alias("_layer"))
    return (
        inside.join(recomputing.filter(pl.col("_layer")), on=["b_tid", "b_s"], how="semi")
        .select("start_ns", "end_ns", "tid")
        .unique()
    )


def launched_inside(kernels: pl.DataFrame, ranges: pl.DataFrame) -> pl.DataFrame:
    """The kernels (launch_start_ns, launch_tid, ...) whose launch call started inside one of
    ``ranges`` (start_ns, end_ns, tid: recomputed forward ops) on the same thread."""
    return iv.containing(
        kernels.with_columns(pl.col("launch_start_ns").alias("_ls")),
        ranges.rename({"start_ns": "r_s", "end_ns": "r_e", "tid": "r_tid"}),
        inner_start="launch_start_ns",
        inner_end="_ls",
        outer_start="r_s",
        outer_end="r_e",
        same=("r_tid", "launch_tid"),
    )


def analyze_recompute(ctx: Context) -> RecomputeResult:
    lo, hi = ctx.window_start_ns, ctx.window_end_ns
    nested = recomputed_forward(ctx, pl.col("start_ns").is_between(lo, hi))
    if nested is None:
        has_bw = ctx.rows(("cpu_op",), BACKWARD_NODE).filter(pl.col("start_ns").is_between(lo, hi))
        return RecomputeResult(0, 0, 0, 0, 0.0 if has_bw.height else None)
    if nested.height == 0:
        return RecomputeResult(0, 0, 0, 0, 0.0)
    # Outermost recomputed ops only, then the kernels launched from inside them.
    k = launched(
        ctx.launches,
        ["dur_ns", "launch_start_ns", "launch_tid", "correlation", "start_ns"],
        pl.col("kind") == "kernel",
    )
    inside = launched_inside(k, nested).unique(subset=["correlation", "start_ns"])
    ns = int(inside["dur_ns"].sum()) if inside.height else 0
    host_ns = iv.total(iv.union(nested))
    cost = max(ns, host_ns)
    return RecomputeResult(
        recomputed_ops=nested.height,
        recompute_kernel_ns=ns,
        recompute_host_ns=host_ns,
        recompute_ns=cost,
        recompute_time_ratio=cost / ctx.window_ns if ctx.window_ns else None,
    )


def recompute_ranges(ctx: Context) -> pl.DataFrame:
    """Checkpointing's recomputation (the forward ops the recompute analyzer finds running
    inside a backward node, over the whole trace), as one range per backward node: from the
    node's start (the checkpoint restoring its RNG state and hooks) through its last recomputed
    op and on to where the node's own work begins, i.e. all but the time the same backward
    node takes where it recomputes nothing (its median; without one, the range ends at the
    last recomputed op). The Python between the ops re-runs the block's forward too (module
    calls, hooks), and goes with them. Measured on the H200 checkpointing pair's profiled
    before/after: a recomputing LayerNorm node 2.8 ms, the same node elsewhere 70 us; of the
    difference, 250 us before the first recomputed op and 250 us after the last."""
    nested = recomputed_forward(ctx)
    if nested is None or nested.height == 0:
        return pl.DataFrame(schema={"start_ns": pl.Int64, "end_ns": pl.Int64, "tid": pl.Int64})
    nodes = ctx.rows(("cpu_op",), BACKWARD_NODE).select(
        pl.col("start_ns").alias("b_s"),
        pl.col("end_ns").alias("b_e"),
        pl.col("tid").alias("b_tid"),
        pl.col("name").alias("b_name"),
    )
    inside = iv.containing(
        nested,
        nodes,
        inner_start="start_ns",
        inner_end="end_ns",
        outer_start="b_s",
        outer_end="b_e",
        same=("b_tid", "tid"),
    )
    # the outermost backward node holding each op: nodes nest (evaluate_function > ...Backward)
    outer = inside.sort("b_s").unique(subset=["start_ns", "end_ns", "tid"], keep="first")
    ranges = outer.group_by("tid", "b_s").agg(
        pl.col("start_ns").min(),
        pl.col("end_ns").max(),
        pl.col("b_e").first(),
        pl.col("b_name").first(),
    )
    recomputing = inside.select(pl.col("b_s"), pl.col("b_tid")).unique()
    typical = (
        nodes.join(recomputing, on=["b_s", "b_tid"], how="anti")
        .group_by("b_name")
        .agg((pl.col("b_e") - pl.col("b_s")).median().alias("_own"))
    )
    own_start = pl.col("b_e") - pl.col("_own").cast(pl.Int64)
    return ranges.join(typical, on="b_name", how="left").select(
        pl.col("b_s").alias("start_ns"),
        pl.max_horizontal("end_ns", own_start.fill_null(pl.col("end_ns"))).alias("end_ns"),
        "tid",
    )
