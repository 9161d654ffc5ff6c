"""Kernel classification: one ordered rule table, applied vectorized to unique names.

The first matching rule wins, so more specific classes come first (an ``implicit_gemm`` is a
convolution, a ``reduce_scatter`` is communication). Extend by adding a row; tests in
tests/test_classify.py hold one real kernel name per rule.
"""

from __future__ import annotations

import polars as pl

from traceinsight.model.schema import KernelClassT

# (class, case-insensitive regex on the kernel name)
KERNEL_RULES: list[tuple[str, str]] = [
    (
        "communication",
        r"^nccl|ncclkernel|nccldevkernel|rccl|all_?reduce|allgather|all_gather|reduce_?scatter"
        r"|all_?to_?all|alltoall|sendrecv|cross_device_reduce|multimem_|deep_ep|nvshmem|^hccl",
    ),
    (
        "attention",
        r"flash|fmha|attention|_attn|attn_|sdpa|xformers|mha_|paged_?attention|cudnn_?mha",
    ),
    (
        "conv",
        r"conv|implicit_gemm|implicit_convolve|wgrad|dgrad|fprop|winograd|im2col|miopen|cudnn",
    ),
    (
        "gemm",
        r"gemm|gemv|cublas|cutlass|matmul|nvjet|wgmma|xmma|triton_tem_|^cijk_|bmm|_mm_|^mm_|hmma|s884|h884|s1688|h1688|i8816|16816",
    ),
    # "lamb" must not match "lambda", which every templated ATen kernel name contains
    (
        "optimizer",
        r"adam|sgd|lamb(?:[^d]|$)|adagrad|rmsprop|multi_tensor_apply|optimizer|_foreach_",
    ),
    (
        "reduction",
        r"reduce_kernel|reduction|gammabeta|layer_?norm|rms_?norm|batch_?norm|group_?norm|softmax|norm_kernel"
        r"|triton_red_|triton_per_|cub::|welford|argmax|argmin|cross_entropy|nll_loss|cunn_|bn_fw|bn_bw"
        r"|topk|sort|scan",
    ),
    (
        "elementwise",
        r"elementwise|triton_poi_|pointwise|copy_kernel|fill_kernel|catarraybatchedcopy|cat_kernel"
        r"|index_kernel|scatter_gather|gather_kernel|where_kernel|dropout|unary|binary",
    ),
]

# Kernels whose name alone says they are eager-mode elementwise (fusion candidates) vs fused.
EAGER_ELEMENTWISE = (
    r"vectorized_elementwise_kernel|unrolled_elementwise_kernel|(^|[^_])elementwise_kernel"
)
TRITON_POINTWISE = r"^triton_poi_"

# Host ops under which a launched kernel is communication even if its name is not.
COMM_OP_PATTERN = r"^nccl:|^gloo:|record_param_comms|^c10d::|^c10d_functional::|^_c10d_functional::"

# GEMM/conv/attention kernels that run on CUDA cores in fp32 (no tensor cores): cuBLAS/CUTLASS
# SIMT sgemm, xmma kernels with fp32 inputs and FFMA math, fp32 memory-efficient attention.
# Everything else in those classes (wgmma, nvjet, hmma, 16816, tf32, bf16/f16 names) counts as
# tensor-core work.
FP32_SIMT_PATTERN = r"simt|sgemm|ffma|dgemm|gemmsn|f32f32_f32f32_f32|cutlass[fb]_f32|fmha_cutlass[fb]_f32|gemv2t_kernel_val<int, int, float"


def classify_names(names: pl.Series) -> pl.Series:
    """Class of each kernel name (``other`` when no rule matches)."""
    lower = names.str.to_lowercase()
    frame = pl.DataFrame({"n": lower})
    expr: pl.Expr = pl.lit("other")
    for cls, pattern in reversed(KERNEL_RULES):
        expr = pl.when(pl.col("n").str.contains(pattern)).then(pl.lit(cls)).otherwise(expr)
    return frame.select(expr.cast(KernelClassT).alias("kernel_class")).to_series()


def names_matching(
    df: pl.DataFrame,
    pattern: str,
    *,
    col: str = "name",
    negate: bool = False,
    names: pl.Series | None = None,
) -> pl.DataFrame:
    """Rows of ``df`` whose ``col`` matches the regex (or not, with ``negate``); null never matches.

    The regex runs once per distinct name and the rows are picked by hash lookup: a long trace
    repeats a few thousand names millions of times. ``names``: the column's distinct values,
    where the caller already has them.
    """
    if names is None:
        names = df.get_column(col).unique()
    hits = names.filter(names.str.contains(pattern))
    member = pl.col(col).is_in(hits.implode())
    return df.filter(pl.col(col).is_not_null() & (~member if negate else member))


def add_kernel_class(events: pl.DataFrame) -> pl.DataFrame:
    """Fill ``kernel_class`` for GPU activity rows; rules run once per unique kernel name and
    only kernel rows are looked up (a join over every row would hash every host op's name).
    Kernels a parser already classified (nsys, by string id) keep their class."""
    base = (
        pl.when(pl.col("kind") == "memcpy")
        .then(pl.lit("memcpy").cast(KernelClassT))
        .when(pl.col("kind") == "memset")
        .then(pl.lit("memset").cast(KernelClassT))
        .when(pl.col("kind") == "kernel")
        .then(pl.col("kernel_class"))
        .otherwise(pl.lit(None, KernelClassT))
        .alias("kernel_class")
    )
    out = events.with_columns(base)
    rows = (
        (out.get_column("kind") == "kernel") & out.get_column("kernel_class").is_null()
    ).arg_true()
    if rows.len() == 0:
        return out
    names = out.get_column("name").gather(rows)
    uniq = names.drop_nulls().unique()
    classes = names.replace_strict(
        uniq, classify_names(uniq), default=None, return_dtype=KernelClassT
    ).fill_null("other")
    return out.with_columns(out.get_column("kernel_class").scatter(rows, classes))


def mark_comm_by_launcher(events: pl.DataFrame) -> pl.DataFrame:
    """Kernels launched from a collective op (``record_param_comms``, ``nccl:*``) are communication.

    Join kernel -> runtime call on correlation (per pid where known), then runtime call -> host op
    on the runtime call's external id: the kernel's own external id is unreliable for NCCL in
    torch 2.0/2.1 (kineto#782).
    """
    cols = events.select("kind", "name", "external_id", "correlation")  # filter 4 columns, not all
    host_ops = (
        names_matching(
            cols.filter(
                pl.col("kind").is_in(["cpu_op", "user_annotation"])
                & pl.col("external_id").is_not_null()
            ),
            COMM_OP_PATTERN,
        )
        .select("external_id")
        .unique()
    )
    if host_ops.height == 0:
        return events
    calls = cols.filter(
        pl.col("kind").is_in(["runtime", "driver"]) & pl.col("correlation").is_not_null()
    ).join(host_ops, on="external_id", how="semi")
    if calls.height == 0:
        return events
    # a membership test, not a join: joining would copy every column of every event
    comm = (pl.col("kind") == "kernel") & pl.col("correlation").is_in(
        calls.get_column("correlation").unique().implode()
    )
    return events.with_columns(
        pl.when(comm)
        .then(pl.lit("communication", KernelClassT))
        .otherwise(pl.col("kernel_class"))
        .alias("kernel_class")
    )
