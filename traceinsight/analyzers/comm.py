"""Communication/computation overlap per device: |comm ∩ compute| / |comm| over interval unions."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import polars as pl

from traceinsight.analyzers.context import Context
from traceinsight.model import intervals as iv


@dataclass(frozen=True)
class CommResult:
    comm_kernel_count: int
    comm_ns: int  # union of communication kernels, summed over devices
    exposed_comm_ns: int  # communication not hidden behind compute
    comm_compute_overlap_ratio: float | None  # null when there is no communication
    exposed_comm_ratio: float | None  # exposed communication / analysis window
    comm_time_ratio: float | None  # communication union / window
    per_device: tuple[dict[str, Any], ...]
    top_collectives: tuple[dict[str, Any], ...]


def analyze_comm(ctx: Context) -> CommResult:
    k = ctx.gpu.filter(pl.col("kind") == "kernel")
    comm = k.filter(pl.col("kernel_class") == "communication")
    if comm.height == 0:
        return CommResult(0, 0, 0, None, None, None, (), ())
    cu = iv.union(comm, by=["device"])
    pu = ctx.compute_busy
    overlapped = iv.overlap_by(cu, pu, "device")
    per_device = []
    tot_c = tot_b = 0
    for dev in sorted(cu["device"].unique().to_list()):
        c = iv.total(cu.filter(pl.col("device") == dev))
        b = overlapped.get(dev, 0)
        tot_c += c
        tot_b += b
        per_device.append(
            {
                "device": dev,
                "comm_ns": c,
                "overlapped_ns": b,
                "exposed_ns": c - b,
                "overlap_ratio": b / c if c else None,
            }
        )
    window = max(1, ctx.window_ns) * max(1, len(ctx.devices))
    top = (
        comm.group_by("name")
        .agg(pl.len().alias("count"), pl.col("dur_ns").sum().alias("total_ns"))
        .sort(["total_ns", "name"], descending=[True, False])
        .head(10)
    )
    return CommResult(
        comm_kernel_count=comm.height,
        comm_ns=tot_c,
        exposed_comm_ns=tot_c - tot_b,
        comm_compute_overlap_ratio=tot_b / tot_c if tot_c else None,
        exposed_comm_ratio=(tot_c - tot_b) / window,
        comm_time_ratio=tot_c / window,
        per_device=tuple(per_device),
        top_collectives=tuple(top.iter_rows(named=True)),
    )
