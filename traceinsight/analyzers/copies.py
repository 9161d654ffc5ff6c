"""Host<->device copies: bytes and time by direction and memory kind, overlap, host blocking."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import polars as pl

from traceinsight.analyzers.context import Context, calls_inside, kernel_names, launched
from traceinsight.analyzers.syncs import enclosing_op
from traceinsight.causal.build import PAGEABLE_COPY, pinned_copy_ns, pinned_rate
from traceinsight.model import intervals as iv
from traceinsight.model.classify import BLOCKING_COPY_API, HOST_OP_KINDS
from traceinsight.model.devices import host_links


@dataclass(frozen=True)
class CopyResult:
    by_kind: tuple[dict[str, Any], ...]  # copy_kind, src_kind, dst_kind, count, bytes, dur_ns
    h2d_bytes: int
    h2d_pageable_bytes: int
    h2d_pageable_bytes_ratio: float | None
    h2d_dur_ns: int
    h2d_overlap_ratio: float | None  # share of HtoD copy time overlapped with compute kernels
    copy_dur_ns: int
    host_blocking_copy_ns: int  # host time blocked in synchronous/pageable copy calls
    host_blocking_copy_count: int
    # the blocked time by direction (HtoD, DtoH, ...): a read-back wants a different fix
    host_blocking_copy_ns_by_kind: dict[str, int]
    pageable_calls: tuple[dict[str, Any], ...]  # top pageable copies with timestamps
    # the part of that time after each copy began (its own time, not the wait for queued
    # work before it: a read-back's wait is the sync's, not the pageable buffer's)
    host_blocking_copy_own_ns: int = 0
    # that own time by direction: the copies' own split (the blocked time by direction holds
    # the waits too, and read 187.76 + 167.68 ms beside 266.07 ms on a public export)
    host_blocking_copy_own_ns_by_kind: dict[str, int] = field(default_factory=dict)
    # the blocking copies to or from pageable memory: their time on the GPU as recorded, and
    # at the pinned rate (the trace's own pinned uploads, else the spec's host link): pinning
    # stages no bounce buffer, but the bytes still cross the link (audit 21: 102 GB of
    # OpenMP offload copies priced as if pinned ones took no time)
    pageable_copy_ns: int = 0
    pageable_copy_pinned_ns: int = 0
    pinned_bytes_per_s: float | None = None  # the rate of that estimate (the first device's)
    # every copy to or from pageable memory on the GPU in the window (those whose call began
    # before it too), as recorded and at the pinned rate: what the copy engines would hold
    gpu_pageable_copy_ns: int = 0
    gpu_pageable_copy_pinned_ns: int = 0
    # the share of host-to-device bytes launched inside FSDP's hooks (``FSDP::...`` ranges):
    # parameters FSDP's CPU offload brings back to the GPU, not batches
    h2d_fsdp_bytes_ratio: float | None = None
    # device-to-device copies in the window: their count and bytes, the time the GPU ran only
    # them (their union less the compute kernels'), and the host ops that launched them, the
    # costliest first (op, count, bytes, dur_ns); how many were launched inside a torch.compile
    # graph's call (CompiledFunction ranges: its inputs copied in, mutations copied back)
    dtod_count: int = 0
    dtod_bytes: int = 0
    dtod_exposed_ns: int = 0
    dtod_by_op: tuple[dict[str, Any], ...] = ()
    dtod_compiled_count: int = 0


def analyze_copies(ctx: Context) -> CopyResult:
    copies = ctx.gpu.filter(pl.col("kind") == "memcpy")
    by_kind = (
        copies.group_by("copy_kind", "src_kind", "dst_kind")
        .agg(pl.len().alias("count"), pl.col("bytes").sum().alias("bytes"), pl.col("dur_ns").sum())
        .sort(
            ["dur_ns", "copy_kind", "src_kind", "dst_kind"], descending=[True, False, False, False]
        )
        .with_columns(pl.col(c).cast(pl.String) for c in ("copy_kind", "src_kind", "dst_kind"))
    )
    h2d = copies.filter(pl.col("copy_kind") == "HtoD")
    h2d_bytes = int(h2d["bytes"].fill_null(0).sum())
    pageable = int(h2d.filter(pl.col("src_kind") == "pageable")["bytes"].fill_null(0).sum())
    known = int(
        h2d.filter(pl.col("src_kind").is_in(["pageable", "pinned", "managed"]))["bytes"]
        .fill_null(0)
        .sum()
    )

    overlap_ratio = None
    if h2d.height:
        cu = ctx.compute_busy
        hu = iv.union(h2d, by=["device"])
        overlap_ratio = sum(iv.overlap_by(hu, cu, "device").values()) / max(1, iv.total(hu))

    # the calls that overlap the window, from its start: one that began before it (a pageable
    # upload staging its bytes before the window's first GPU work) blocked inside it too (a
    # CUTLASS benchmark's first 268 MB cudaMemcpy, 117 us early, had been left out: 342.08 ms
    # blocked against 361.6: session 53)
    lo, hi = ctx.window_start_ns, ctx.window_end_ns
    launched = ctx.launches.filter(
        (pl.col("kind") == "memcpy")
        & (pl.col("launch_end_ns") > lo)
        & (pl.col("launch_start_ns") < hi)
    )
    blocking = launched.filter(
        (pl.col("src_kind") == "pageable")
        | (pl.col("dst_kind") == "pageable")
        | pl.col("launch_name").str.contains(BLOCKING_COPY_API)
    )
    # from the window's start (a call's return after the window's last GPU work stays whole,
    # as it did: the read-back that ends a capture)
    blocking = blocking.with_columns(
        (pl.col("launch_end_ns") - pl.max_horizontal("launch_start_ns", pl.lit(lo))).alias(
            "blocked_ns"
        ),
        # the call's time but its wait for the work queued before the copy: a read-back waits
        # until its copy starts for the work before it (a sync's cost, which pinned memory does
        # not remove; on another stream too); a host-to-device copy's call stages pageable
        # data before its copy starts, waiting only while its stream is busy (audit 11: three
        # loops' pageable copies read "0.00 ms blocked" where their calls blocked 72-156 us)
        (
            pl.col("launch_end_ns")
            - pl.max_horizontal(
                "launch_start_ns",
                pl.lit(lo),
                pl.when(pl.col("copy_kind") == "DtoH")
                .then(pl.col("start_ns"))
                .otherwise(pl.min_horizontal("start_ns", _stream_busy_until(ctx, blocking))),
            )
        )
        .clip(0)
        .alias("own_ns"),
    )
    # each device's pinned rate, once: the trace's own pinned uploads, else the spec's link
    rates = (
        copies.select("device")
        .with_columns(
            pinned_rate(
                copies, host_links(ctx.device_info, lambda: kernel_names(ctx), ctx.devices)
            ).alias("_rate")
        )
        .unique("device", keep="first")
    )
    pageable_ns, pinned_ns, rate = _at_pinned_rate(blocking, rates)
    gpu_pageable_ns, gpu_pinned_ns, _ = _at_pinned_rate(copies, rates)
    top_pageable = blocking.sort(["blocked_ns", "launch_start_ns"], descending=[True, False]).head(
        10
    )
    return CopyResult(
        by_kind=tuple(by_kind.iter_rows(named=True)),
        h2d_bytes=h2d_bytes,
        h2d_pageable_bytes=pageable,
        h2d_pageable_bytes_ratio=(pageable / known) if known else None,
        h2d_dur_ns=int(h2d["dur_ns"].sum()) if h2d.height else 0,
        h2d_overlap_ratio=overlap_ratio,
        copy_dur_ns=int(copies["dur_ns"].sum()) if copies.height else 0,
        host_blocking_copy_ns=int(blocking["blocked_ns"].sum()) if blocking.height else 0,
        host_blocking_copy_count=blocking.height,
        host_blocking_copy_own_ns=int(blocking["own_ns"].sum()) if blocking.height else 0,
        host_blocking_copy_ns_by_kind=_by_kind(blocking, "blocked_ns"),
        host_blocking_copy_own_ns_by_kind=_by_kind(blocking, "own_ns"),
        pageable_copy_ns=pageable_ns,
        pageable_copy_pinned_ns=pinned_ns,
        pinned_bytes_per_s=rate,
        gpu_pageable_copy_ns=gpu_pageable_ns,
        gpu_pageable_copy_pinned_ns=gpu_pinned_ns,
        h2d_fsdp_bytes_ratio=_fsdp_share(ctx, h2d_bytes),
        **_device_copies(ctx, copies),
        pageable_calls=tuple(
            {
                "name": r["name"],
                "copy_kind": None if r["copy_kind"] is None else str(r["copy_kind"]),
                "api": r["launch_name"],
                "bytes": r["bytes"],
                "copy_ns": r["dur_ns"],
                "blocked_ns": r["blocked_ns"],
                "offset_ns": max(0, r["launch_start_ns"] - ctx.window_start_ns),
            }
            for r in top_pageable.iter_rows(named=True)
        ),
    )


# torch.compile's AOTAutograd wraps a compiled graph's forward and backward in these ranges
COMPILED_FUNCTION = r"^CompiledFunction"


def _device_copies(ctx: Context, copies: pl.DataFrame) -> dict[str, Any]:
    """CopyResult's device-to-device fields (none: {})."""
    d2d = copies.filter(pl.col("copy_kind") == "DtoD")
    if d2d.height == 0:
        return {}
    du = iv.union(d2d.select("device", "start_ns", "end_ns"), by=["device"])
    # beside any kernel, communication's too: the time the GPU ran nothing but these copies
    kernels = iv.union(
        ctx.gpu.lazy().filter(pl.col("kind") == "kernel").select("device", "start_ns", "end_ns"),
        by=["device"],
    )
    exposed = iv.total(du) - sum(iv.overlap_by(du, kernels, "device").values())
    calls = launched(
        ctx.launches,
        [
            pl.col("launch_tid").alias("tid"),
            pl.col("launch_start_ns").alias("start_ns"),
            pl.col("launch_end_ns").alias("end_ns"),
            pl.col("bytes").fill_null(0).alias("bytes"),
            "dur_ns",
        ],
        (pl.col("kind") == "memcpy")
        & (pl.col("copy_kind") == "DtoD")
        & pl.col("start_ns").is_between(ctx.window_start_ns, ctx.window_end_ns, closed="left"),
    ).with_row_index("call_id")
    by_op: tuple[dict[str, Any], ...] = ()
    compiled = 0
    if calls.height:
        named = calls.join(enclosing_op(ctx.ops, calls), on="call_id", how="left")
        by_op = tuple(
            named.with_columns(pl.col("op").fill_null("(no enclosing op)"))
            .group_by("op")
            .agg(pl.len().alias("count"), pl.col("bytes").sum(), pl.col("dur_ns").sum())
            .sort(["dur_ns", "op"], descending=[True, False])
            .head(5)
            .iter_rows(named=True)
        )
        ranges = ctx.ops.filter(pl.col("name").str.contains(COMPILED_FUNCTION)).select(
            "tid", "start_ns", "end_ns"
        )
        if ranges.height:
            inside = calls_inside(calls.select("tid", "start_ns", "end_ns"), ranges)
            compiled = inside.unique(["tid", "start_ns"]).height  # (nested ranges: once)
    return {
        "dtod_count": d2d.height,
        "dtod_bytes": int(d2d.get_column("bytes").fill_null(0).sum()),
        "dtod_exposed_ns": int(exposed),
        "dtod_by_op": by_op,
        "dtod_compiled_count": int(compiled),
    }


def _at_pinned_rate(rows: pl.DataFrame, rates: pl.DataFrame) -> tuple[int, int, float | None]:
    """The pageable copies among ``rows``: their time as recorded and at their device's pinned
    rate (``rates``: device, _rate in bytes/ns), and that rate in bytes/s (the first device's)."""
    pageable = rows.filter(PAGEABLE_COPY)
    if pageable.height == 0:
        return 0, 0, None
    timed = pageable.join(rates, on="device", how="left").with_columns(
        pinned_copy_ns("_rate").alias("_pinned")
    )
    rate = timed.get_column("_rate").drop_nulls()
    return (
        int(timed.get_column("dur_ns").sum()),
        int(timed.get_column("_pinned").sum()),
        float(rate[0]) * 1e9 if rate.len() else None,
    )


# FSDP's hooks (FSDP1 and FSDP2 name their ranges "FSDP::pre_forward (layer)", ...)
FSDP_RANGE = r"^FSDP::"


def _fsdp_share(ctx: Context, h2d_bytes: int) -> float | None:
    """The share of the window's host-to-device bytes (of the copies whose launch is known)
    whose copy was launched inside one of
    FSDP's hook ranges on its thread (audit 22: an FSDP CPU-offload inference export, 28.8 GB of
    parameters a window read as batches to prefetch); None without such ranges."""
    ranges = ctx.rows(HOST_OP_KINDS, FSDP_RANGE, columns=("start_ns", "end_ns", "tid"))
    if ranges.height == 0 or h2d_bytes <= 0:
        return None
    ups = ctx.launches.filter(
        (pl.col("kind") == "memcpy")
        & (pl.col("copy_kind") == "HtoD")
        & pl.col("launch_start_ns").is_between(ctx.window_start_ns, ctx.window_end_ns)
    ).select("launch_start_ns", "launch_end_ns", "launch_tid", pl.col("bytes").fill_null(0))
    inside = iv.containing(
        ups.with_row_index("_u"),
        ranges.select(pl.col("start_ns").alias("o_s"), pl.col("end_ns").alias("o_e"), "tid"),
        inner_start="launch_start_ns",
        inner_end="launch_end_ns",
        outer_start="o_s",
        outer_end="o_e",
        same=("tid", "launch_tid"),
    ).unique("_u")
    # of the copies whose launch the trace links (an unlinked one's caller is unknown)
    linked = int(ups.get_column("bytes").sum())
    return int(inside.get_column("bytes").sum()) / linked if linked else None


def _by_kind(blocking: pl.DataFrame, col: str) -> dict[str, int]:
    """``col`` summed by copy direction."""
    if blocking.height == 0:
        return {}
    sums = blocking.group_by("copy_kind").agg(pl.col(col).sum())
    # in the kinds' order, not the hash's: the JSON is the same from run to run (audit 20)
    return dict(sorted((str(k), int(v)) for k, v in sums.iter_rows()))


def _stream_busy_until(ctx: Context, copies: pl.DataFrame) -> pl.Series:
    """Per copy of ``copies`` (in order): when the work queued before it on its stream ended
    (the latest end of the stream's activities that started before it; 0 where none did)."""
    uploads = copies.filter(pl.col("copy_kind") != "DtoH").select("device", "stream").unique()
    if uploads.height == 0:  # read-backs only: their own time is from the copy's start
        return pl.Series("_busy", [0] * copies.height, dtype=pl.Int64)
    work = (
        ctx.launches.lazy()
        .filter(pl.col("kind").is_in(("kernel", "memcpy", "memset")))
        # only the streams the uploads ran on (a 1 GB export: 1.8M kernels elsewhere)
        .join(uploads.lazy(), on=["device", "stream"], how="semi")
        .select("device", "stream", "start_ns", "end_ns")
        .sort("start_ns")
        .with_columns(pl.col("end_ns").cum_max().over("device", "stream").alias("_busy"))
        .select("device", "stream", pl.col("start_ns").alias("_s"), "_busy")
        .collect()
    )
    hit = (
        copies.select("device", "stream", pl.col("start_ns") - 1)
        .with_row_index("_row")
        .sort("start_ns")
        .join_asof(
            work,
            left_on="start_ns",
            right_on="_s",
            by=["device", "stream"],
            strategy="backward",
            check_sortedness=False,  # both by time, the groups within them
        )
        .sort("_row")
    )
    return hit.get_column("_busy").fill_null(0).alias("_busy")
