"""nsys GPU_METRICS samples in the window (``nsys profile --gpu-metrics-devices``): SM active,
tensor active and DRAM throughput, each of the GPU's peak, averaged overall, per device, per step
and per class of the kernel running at each sample. A section of the efficiency analyzer
(analyzers/efficiency.py); empty without samples.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from traceinsight.analyzers.context import Context


@dataclass(frozen=True)
class DeviceCounters:
    device: int
    samples: int  # sample times
    sm_active_ratio: float | None
    tensor_active_ratio: float | None
    dram_bandwidth_ratio: float | None


@dataclass(frozen=True)
class StepCounters:
    step: int
    samples: int  # sample times, over the devices
    sm_active_ratio: float | None
    tensor_active_ratio: float | None
    dram_bandwidth_ratio: float | None


@dataclass(frozen=True)
class ClassCounters:
    kernel_class: str | None  # "idle": no kernel running on the sample's device
    samples: int
    sm_active_ratio: float | None
    tensor_active_ratio: float | None
    dram_bandwidth_ratio: float | None


@dataclass(frozen=True)
class GpuCounters:
    """Means over the samples (None / empty without them); DRAM = read + write throughput (or
    the combined counter)."""

    sm_active_ratio: float | None = None
    tensor_active_ratio: float | None = None
    dram_bandwidth_ratio: float | None = None
    devices: tuple[DeviceCounters, ...] = ()
    steps: tuple[StepCounters, ...] = ()
    classes: tuple[ClassCounters, ...] = ()  # most samples first


def _counter_aggs() -> list[pl.Expr]:
    """Means of the counters over a group of samples. DRAM read and write are averaged apart
    and then added: their samples need not share timestamps."""

    def mean(metric: str) -> pl.Expr:
        return pl.col("value_ratio").filter(pl.col("metric") == metric).mean()

    split = mean("dram_read").fill_null(0) + mean("dram_write").fill_null(0)
    has_split = pl.col("metric").is_in(["dram_read", "dram_write"]).any()
    return [
        pl.struct("device", "start_ns").n_unique().alias("samples"),  # sample times per GPU
        mean("sm_active").alias("sm_active_ratio"),
        mean("tensor_active").alias("tensor_active_ratio"),
        pl.when(has_split)
        .then(split)
        .otherwise(mean("dram_bandwidth"))
        .alias("dram_bandwidth_ratio"),
    ]


def _per_step(ctx: Context, g: pl.DataFrame) -> tuple[StepCounters, ...]:
    if ctx.steps.height == 0:
        return ()
    bounds = ctx.steps.select("step", "start_ns", "end_ns").sort("start_ns")
    per = (
        g.join_asof(
            bounds.rename({"end_ns": "s_e", "start_ns": "s_s"}),
            left_on="start_ns",
            right_on="s_s",
        )
        .filter(pl.col("start_ns") < pl.col("s_e"))
        .group_by("step")
        .agg(_counter_aggs())
        .sort("step")
    )
    return tuple(StepCounters(**r) for r in per.iter_rows(named=True))


def _per_class(g: pl.DataFrame, k: pl.DataFrame) -> tuple[ClassCounters, ...]:
    """By the class of the kernel running on the sample's device (the latest one started: with
    concurrent streams one of them stands for all)."""
    running = (
        k.select("device", "start_ns", pl.col("end_ns").alias("k_end"), "kernel_class")
        .filter(pl.col("device").is_not_null())
        .sort("start_ns")
    )
    per = (
        g.join_asof(running, on="start_ns", by="device", check_sortedness=False)  # both by time
        .with_columns(
            pl.when(pl.col("start_ns") < pl.col("k_end"))
            .then(pl.col("kernel_class"))
            .otherwise(pl.lit("idle"))
            .alias("kernel_class")
        )
        .group_by("kernel_class")
        .agg(_counter_aggs())
        .sort(["samples", "kernel_class"], descending=[True, False])
    )
    return tuple(ClassCounters(**r) for r in per.iter_rows(named=True))


def gpu_counters(ctx: Context, k: pl.DataFrame) -> GpuCounters:
    """The window's GPU_METRICS samples; ``k``: the window's kernels (device, start_ns, end_ns,
    kernel_class)."""
    g = ctx.gpu_metrics
    if g.height == 0:
        return GpuCounters()
    lo, hi = ctx.window_start_ns, ctx.window_end_ns
    g = g.filter((pl.col("start_ns") >= lo) & (pl.col("start_ns") < hi)).sort("start_ns")
    if g.height == 0:
        return GpuCounters()
    overall = g.select(_counter_aggs()).row(0, named=True)
    devices = g.group_by("device").agg(_counter_aggs()).sort("device")
    return GpuCounters(
        sm_active_ratio=overall["sm_active_ratio"],
        tensor_active_ratio=overall["tensor_active_ratio"],
        dram_bandwidth_ratio=overall["dram_bandwidth_ratio"],
        devices=tuple(DeviceCounters(**r) for r in devices.iter_rows(named=True)),
        steps=_per_step(ctx, g),
        classes=_per_class(g, k),
    )
