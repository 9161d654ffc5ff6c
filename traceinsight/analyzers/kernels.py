"""Kernel breakdown by class, elementwise share (eager vs Triton-fused), top kernels, precision."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import polars as pl

from traceinsight.analyzers.context import Context
from traceinsight.model.classify import (
    ATEN_DEPTHWISE_PATTERN,
    EAGER_ELEMENTWISE,
    INDUCTOR_KERNELS,
    LAYOUT_KERNELS,
    NCHW_BATCH_NORM_KERNELS,
    TRITON_POINTWISE,
    coded_names,
    is_fp32_math,
    is_half_math,
    is_tf32_math,
    names_matching,
)

TOP_KERNELS = 25
MATH_CLASSES = ("gemm", "conv", "attention")


@dataclass(frozen=True)
class KernelResult:
    kernel_count: int
    kernel_ns: int  # sum of kernel durations (not a union)
    by_class: tuple[dict[str, Any], ...]
    elementwise_kernel_time_ratio: float | None
    elementwise_kernel_count_ratio: float | None
    elementwise_eager_count: int  # of the elementwise kernels, ATen's eager ones
    elementwise_triton_count: int  # and Inductor's; the rest (cat copies, libraries') neither
    kernels_per_step: float | None
    top_kernels: tuple[dict[str, Any], ...]
    math_ns: int  # GEMM + conv + attention kernel time
    fp32_math_ns: int  # of which on CUDA cores in fp32 (no tensor cores)
    fp32_gemm_time_ratio: float | None
    top_fp32_kernels: tuple[dict[str, Any], ...]
    # of math_ns, on TF32 tensor cores (cuDNN's default for fp32 convolutions): bf16 runs it on
    # tensor cores twice as fast at peak
    tf32_math_ns: int = 0
    # of math_ns, on 16-bit or narrower inputs by the kernel's name (model/classify.py
    # is_half_math): beside fp32 math, a mixed-precision step with work its autocast left out
    half_math_ns: int = 0
    # of kernel_count, torch.compile's (Inductor's Triton kernels): compiled code, whose advice
    # is not "torch.compile" again (audit 19)
    compiled_kernel_ratio: float | None = None
    tf32_gemm_time_ratio: float | None = None
    # ATen's channels-first depthwise kernels (model/classify.py ATEN_DEPTHWISE_PATTERN): their
    # time and count; channels_last sends those layers to cuDNN's NHWC kernels
    aten_depthwise_ns: int = 0
    aten_depthwise_count: int = 0
    # what else channels_last changes: cuDNN's layout transposes around convolutions on
    # channels-first tensors (gone) and its channels-first batch norm (NHWC kernels instead)
    layout_transpose_ns: int = 0
    layout_transpose_count: int = 0
    nchw_batch_norm_ns: int = 0
    # the elementwise class's kernels, of which the eager and Triton counts are parts
    elementwise_count: int = 0
    # the most kernels one stream ran, counted in small windows only (under
    # SMALL_WINDOW_KERNELS, all a one-pass program's test reads): 1 where each stream ran one
    # kernel, so no copy on it fed a later pass (a chunked vecAdd over 4 streams), more where a
    # stream repeats its pass (an MPI saxpy copying its 262 MB arrays around each of 5 kernels)
    kernels_per_stream_max: int | None = None


SMALL_WINDOW_KERNELS = 64


def analyze_kernels(ctx: Context) -> KernelResult:
    # the four columns read here, before the filter copies them
    k = ctx.gpu.select("kind", "name", "kernel_class", "dur_ns").filter(pl.col("kind") == "kernel")
    n = k.height
    per_stream = None
    if 0 < n < SMALL_WINDOW_KERNELS:
        per_stream = (
            ctx.gpu.filter(pl.col("kind") == "kernel")
            .group_by("device", "stream")
            .len()
            .get_column("len")
            .max()
        )
    total = int(k["dur_ns"].sum()) if n else 0
    by_class = (
        k.group_by("kernel_class")
        .agg(pl.len().alias("count"), pl.col("dur_ns").sum().alias("total_ns"))
        .with_columns(
            pl.col("kernel_class").cast(pl.String),
            (pl.col("total_ns") / max(1, total)).alias("time_ratio"),
            (pl.col("count") / max(1, n)).alias("count_ratio"),
        )
        .sort(["total_ns", "kernel_class"], descending=[True, False])
    )
    ew = k.filter(pl.col("kernel_class") == "elementwise")
    ew_names = ew.get_column("name").unique()  # matched once for both patterns
    eager = names_matching(ew, EAGER_ELEMENTWISE, names=ew_names).height
    triton = names_matching(ew, TRITON_POINTWISE, names=ew_names).height
    by_name = (
        coded_names(k)
        .group_by("name", "kernel_class")
        .agg(
            pl.len().alias("count"),
            pl.col("dur_ns").sum().alias("total_ns"),
            pl.col("dur_ns").mean().alias("mean_ns"),
            pl.col("dur_ns").median().alias("median_ns"),
            pl.col("dur_ns").max().alias("max_ns"),
        )
        .with_columns(
            pl.col("name").cast(pl.String),
            pl.col("kernel_class").cast(pl.String),
            (pl.col("total_ns") / max(1, total)).alias("time_ratio"),
        )
    )
    top = by_name.sort(["total_ns", "name"], descending=[True, False]).head(TOP_KERNELS)
    # (from the kernels counted by name: another pass over the rows took the 1 GB nsys export
    # from 0.99x to 0.96x of the session's start)
    compiled = by_name.filter(pl.col("name").str.contains(INDUCTOR_KERNELS))["count"].sum()
    # cuDNN's layout transposes around channels-first convolutions are classed with the
    # convolutions but do no math: not in the shares' denominator (audit 21: "TF32 and fp32:
    # 71.2% and 10.5%" left 18.3% to transposes; channels_first_layers counts them)
    # (decided once per distinct name)
    math = k.filter(pl.col("kernel_class").is_in(MATH_CLASSES))
    classed = math["name"].drop_nulls().unique()
    layout_names = classed.filter(classed.str.to_lowercase().str.contains(LAYOUT_KERNELS))
    if layout_names.len():
        math = math.filter(~pl.col("name").is_in(layout_names.implode()))
    names = math["name"].drop_nulls().unique()

    def of_precision(is_kind: Callable[[pl.Series], pl.Series]) -> pl.DataFrame:
        """The math kernels whose names ``is_kind`` reads as that precision."""
        return math.filter(pl.col("name").is_in(names.filter(is_kind(names)).implode()))

    fp32, tf32, half = (of_precision(p) for p in (is_fp32_math, is_tf32_math, is_half_math))
    math_ns, fp32_ns, tf32_ns, half_ns = (int(d["dur_ns"].sum()) for d in (math, fp32, tf32, half))
    top_fp32 = (
        fp32.group_by("name")
        .agg(pl.len().alias("count"), pl.col("dur_ns").sum().alias("total_ns"))
        .sort(["total_ns", "name"], descending=[True, False])
        .head(5)
    )
    k_names = k.get_column("name").unique()  # hashed once for the three patterns
    dw = names_matching(k, ATEN_DEPTHWISE_PATTERN, names=k_names)
    # the two patterns are lower-cased names (cuDNN's are camelCase)
    layout = names_matching(k, f"(?i){LAYOUT_KERNELS}", names=k_names)
    bn = names_matching(k, f"(?i){NCHW_BATCH_NORM_KERNELS}", names=k_names)
    steps = ctx.steps.height
    return KernelResult(
        kernel_count=n,
        kernel_ns=total,
        by_class=tuple(by_class.iter_rows(named=True)),
        elementwise_kernel_time_ratio=(int(ew["dur_ns"].sum()) / total) if total else None,
        elementwise_kernel_count_ratio=(ew.height / n) if n else None,
        elementwise_eager_count=eager,
        elementwise_triton_count=triton,
        elementwise_count=ew.height,
        kernels_per_step=(n / steps) if steps else None,
        top_kernels=tuple(top.iter_rows(named=True)),
        math_ns=math_ns,
        fp32_math_ns=fp32_ns,
        fp32_gemm_time_ratio=(fp32_ns / math_ns) if math_ns else None,
        top_fp32_kernels=tuple(top_fp32.iter_rows(named=True)),
        compiled_kernel_ratio=(compiled / n) if n else None,
        tf32_math_ns=tf32_ns,
        half_math_ns=half_ns,
        aten_depthwise_ns=int(dw["dur_ns"].sum()) if dw.height else 0,
        aten_depthwise_count=dw.height,
        layout_transpose_ns=int(layout["dur_ns"].sum()) if layout.height else 0,
        layout_transpose_count=layout.height,
        nchw_batch_norm_ns=int(bn["dur_ns"].sum()) if bn.height else 0,
        tf32_gemm_time_ratio=(tf32_ns / math_ns) if math_ns else None,
        kernels_per_stream_max=per_stream,
    )
