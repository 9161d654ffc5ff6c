"""Launch statistics: launch calls per step, CPU launch cost vs GPU kernel time, queue depth."""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from traceinsight.analyzers.context import Context
from traceinsight.model.classify import API_KINDS, LAUNCH_API, names_matching

# A launch call longer than this is not launch overhead: a first launch that loads the module
# (lazy loading: awsgpu_report2's only cudaLaunchKernel, 39.2 ms, with its 35.6 ms kernel inside
# it), or one blocked on a full queue. Its kernel has no measured launch cost and stays out of
# short_kernel_ratio (warm launches take 2-20 us).
LAUNCH_MEASURED_MAX_NS = 1_000_000


@dataclass(frozen=True)
class LaunchResult:
    launch_calls: int
    launch_calls_per_step: float | None
    launch_call_median_ns: float | None
    kernel_median_ns: float | None
    # kernels shorter than their own launch call, among those whose launch call was measured
    # (at most LAUNCH_MEASURED_MAX_NS); None without any
    short_kernel_ratio: float | None
    queue_delay_median_ns: float | None  # kernel start - launch call end
    queue_depth_median: float | None  # kernels launched but not yet started, at each launch
    graph_launches: int
    graph_kernels: int


def analyze_launch(ctx: Context) -> LaunchResult:
    lo, hi = ctx.window_start_ns, ctx.window_end_ns
    in_window = pl.col("start_ns").is_between(lo, hi)
    calls = ctx.rows(API_KINDS, LAUNCH_API, where=in_window, columns=("dur_ns",))
    kl = (
        ctx.launches.lazy()
        .filter((pl.col("kind") == "kernel") & pl.col("launch_start_ns").is_not_null() & in_window)
        .select(
            "launch_name",
            "correlation",
            "device",
            "start_ns",
            "dur_ns",
            "launch_start_ns",
            "launch_end_ns",
        )
        .collect()
        .with_columns(
            (pl.col("launch_end_ns") - pl.col("launch_start_ns")).alias("launch_ns"),
            (pl.col("start_ns") - pl.col("launch_end_ns")).alias("queue_ns"),
        )
    )
    names = kl.get_column("launch_name").unique()  # matched once per distinct API name, for both
    graph = names_matching(kl, "GraphLaunch", col="launch_name", names=names)
    steps = ctx.steps.height
    if kl.height == 0:
        return LaunchResult(
            calls.height,
            calls.height / steps if steps else None,
            None,
            None,
            None,
            None,
            None,
            0,
            0,
        )
    direct = names_matching(kl, "GraphLaunch", col="launch_name", negate=True, names=names)
    depth = _queue_depth(direct) if direct.height else None
    return LaunchResult(
        launch_calls=calls.height,
        launch_calls_per_step=calls.height / steps if steps else None,
        launch_call_median_ns=float(calls["dur_ns"].median()) if calls.height else None,
        kernel_median_ns=float(kl["dur_ns"].median()),
        short_kernel_ratio=_short_kernel_ratio(direct),
        queue_delay_median_ns=float(direct["queue_ns"].median()) if direct.height else None,
        queue_depth_median=depth,
        graph_launches=graph["correlation"].n_unique() if graph.height else 0,
        graph_kernels=graph.height,
    )


def _short_kernel_ratio(direct: pl.DataFrame) -> float | None:
    measured = direct.filter(pl.col("launch_ns") <= LAUNCH_MEASURED_MAX_NS)
    if measured.height == 0:
        return None
    return float((measured["dur_ns"] < measured["launch_ns"]).mean())


def _queue_depth(kl: pl.DataFrame) -> float:
    """Median number of kernels waiting in the device queue at each launch (per device).

    depth(t) = #kernels whose launch call ended by t - #kernels started by t.
    """
    depths = []
    for dev in kl["device"].unique().to_list():
        d = kl.filter(pl.col("device") == dev)
        ends = d["launch_end_ns"].sort()
        starts = d["start_ns"].sort()
        t = d["launch_end_ns"]
        depth = ends.search_sorted(t, side="right").cast(pl.Int64) - starts.search_sorted(
            t, side="right"
        ).cast(pl.Int64)
        depths.append(depth.clip(0, None))
    return float(pl.concat(depths).median())
