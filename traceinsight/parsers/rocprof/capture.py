"""What both rocprofv3 readers hand over (:class:`Capture`), and the one way it becomes a Trace.

The JSON document and the rocpd database carry the same records (rocprofiler-sdk writes both from
one set of buffers), so each reader only fills these frames; ranks, devices, copy directions,
kernel classes and the launch configuration side table are decided here once.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import polars as pl

from traceinsight.model.classify import add_kernel_class
from traceinsight.model.schema import (
    KERNEL_ARGS_SCHEMA,
    DeviceInfo,
    Trace,
    TraceMeta,
    conform,
    conform_side,
    empty_events,
)

# The frames' columns (the event schema's names where they mean the same thing).
# GPU rows carry their process (the rank) but no thread, as in the other formats: the thread that
# dispatched a kernel is its API call's (found through the correlation id).
KERNEL_COLUMNS: dict[str, pl.DataType] = {
    "start_ns": pl.Int64(),
    "end_ns": pl.Int64(),
    "pid": pl.Int64(),
    "agent": pl.Int64(),  # the reader's agent key (JSON handle, rocpd agent id): see Agent.key
    "stream": pl.Int64(),  # the HSA queue the packet went to
    "correlation": pl.Int64(),  # rocprofiler's internal correlation id: the launching API call's
    "name": pl.String(),
    # work-items per dimension (HSA's grid) and per workgroup, as recorded
    "grid_x": pl.Int64(),
    "grid_y": pl.Int64(),
    "grid_z": pl.Int64(),
    "block_x": pl.Int64(),
    "block_y": pl.Int64(),
    "block_z": pl.Int64(),
    "shared_memory_bytes": pl.Int64(),  # LDS per workgroup (the dispatch's group segment)
    "registers_per_thread": pl.Int64(),  # VGPRs per work-item (arch + accumulation)
}
API_COLUMNS: dict[str, pl.DataType] = {
    "start_ns": pl.Int64(),
    "end_ns": pl.Int64(),
    "pid": pl.Int64(),
    "tid": pl.Int64(),
    "correlation": pl.Int64(),
    "name": pl.String(),
    "category": pl.String(),  # rocprofiler's buffer kind: HIP_RUNTIME_API, HSA_CORE_API, ...
}
COPY_COLUMNS: dict[str, pl.DataType] = {
    "start_ns": pl.Int64(),
    "end_ns": pl.Int64(),
    "pid": pl.Int64(),
    "correlation": pl.Int64(),
    "stream": pl.Int64(),  # the HIP stream (copies run on DMA engines, beside the queues)
    "bytes": pl.Int64(),
    "operation": pl.String(),  # MEMORY_COPY_HOST_TO_DEVICE, ...
    "src_agent": pl.Int64(),
    "dst_agent": pl.Int64(),
}
MARKER_COLUMNS: dict[str, pl.DataType] = {
    "start_ns": pl.Int64(),
    "end_ns": pl.Int64(),
    "pid": pl.Int64(),
    "tid": pl.Int64(),
    "name": pl.String(),
}

# API categories -> event kind: HIP is the runtime (what CUDA's runtime is to Kineto and nsys),
# HSA the layer beneath it (the CUDA driver's place); RCCL's API calls are host calls too.
DRIVER_CATEGORIES = ("HSA_CORE_API", "HSA_AMD_EXT_API", "HSA_IMAGE_EXT_API", "HSA_FINALIZE_EXT_API")

# MEMORY_COPY operations -> (copy kind, source memory, destination memory). rocprofiler does not
# say whether host memory was pinned, so host memory is "host", never "pinned" or "pageable".
COPY_OPERATIONS = {
    "MEMORY_COPY_HOST_TO_HOST": ("HtoH", "host", "host"),
    "MEMORY_COPY_HOST_TO_DEVICE": ("HtoD", "host", "device"),
    "MEMORY_COPY_DEVICE_TO_HOST": ("DtoH", "device", "host"),
    "MEMORY_COPY_DEVICE_TO_DEVICE": ("DtoD", "device", "device"),
}
# Copies run on the DMA engines, not on a kernel queue: their streams get ids of their own, apart
# from the queues' (a copy on HIP stream 3 is not serialised behind kernels on HSA queue 3).
COPY_STREAM_BASE = 1 << 40
COPY_LABEL = {
    "HtoH": "Host -> Host",
    "HtoD": "Host -> Device",
    "DtoH": "Device -> Host",
    "DtoD": "Device -> Device",
    "PtoP": "Device -> Peer device",
    "other": "unknown",
}


@dataclass(frozen=True)
class Agent:
    """One GPU agent: ``key`` is how the reader's rows name it; ``index`` its GPU index on the
    node (rocprofiler's logical type index: 0 for the first GPU), the event table's device."""

    key: int
    index: int
    name: str | None = None
    cu_count: int | None = None
    memory_bytes: int | None = None
    arch: str | None = None  # gfx target, e.g. "gfx950"

    def info(self) -> DeviceInfo:
        return DeviceInfo(
            id=self.index, name=self.name, sm_count=self.cu_count, memory_bytes=self.memory_bytes
        )


@dataclass
class Capture:
    """One rocprofv3 output's records as frames (columns above), before ranks and devices."""

    path: str
    format: str  # "rocprof-json" | "rocpd"
    format_version: str
    kernels: pl.DataFrame
    api: pl.DataFrame
    copies: pl.DataFrame
    markers: pl.DataFrame
    gpus: list[Agent]
    traced: list[
        str
    ]  # the domains it recorded (the JSON's names, sorted): meta.extra["rocprof_traced"]
    extra: dict[str, object] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


def frame(df: pl.DataFrame, schema: dict[str, pl.DataType]) -> pl.DataFrame:
    """``df`` with exactly ``schema``'s columns and types (missing columns null)."""
    return df.select(
        pl.col(c).cast(t) if c in df.columns else pl.lit(None, t).alias(c)
        for c, t in schema.items()
    )


def to_trace(cap: Capture, threads: int = 1) -> Trace:
    """The event table (kernels, copies, API calls, markers), the kernels' launch configuration,
    ranks by process id and devices by GPU index."""
    agents = pl.DataFrame(
        {"agent": [a.key for a in cap.gpus], "device": [a.index for a in cap.gpus]},
        schema={"agent": pl.Int64, "device": pl.Int32},
    )
    kernels = cap.kernels.join(agents, on="agent", how="left", maintain_order="left")
    copies = _copies(cap.copies, agents)
    frames = [
        kernels.with_columns(pl.lit("kernel").alias("kind")),
        copies,
        cap.api.with_columns(
            pl.when(pl.col("category").is_in(DRIVER_CATEGORIES))
            .then(pl.lit("driver"))
            .otherwise(pl.lit("runtime"))
            .alias("kind")
        ).drop("category"),
        cap.markers.with_columns(pl.lit("user_annotation").alias("kind")),
    ]
    meta = TraceMeta(source_path=cap.path, format=cap.format, format_version=cap.format_version)
    meta.warnings.append(_untraced_note(cap))
    meta.warnings.extend(cap.warnings)
    meta.extra.update(cap.extra)
    meta.extra["rocprof_traced"] = cap.traced
    frames = [f for f in frames if f.height]
    if not frames:
        meta.warnings.append("the capture holds no kernel dispatches, copies, API calls or markers")
        meta.devices = [a.info() for a in cap.gpus]
        return Trace(events=empty_events(), meta=meta)
    df = pl.concat(frames, how="diagonal_relaxed").with_columns(
        (pl.col("end_ns") - pl.col("start_ns")).alias("dur_ns")
    )
    # Records that end before they start (or, in a damaged database, lack a time) are kept out
    # and counted.
    ok = pl.col("dur_ns").fill_null(-1) >= 0
    bad = df.height - df.select(ok.sum()).item()
    if bad:
        meta.warnings.append(f"{bad:,} records end before they start or have no time: left out")
        df = df.filter(ok)
    # One process = one rank, in process id order (one file per process is rocprofv3's default).
    pids = sorted(df.get_column("pid").drop_nulls().unique().to_list())
    rank = pl.col("pid").replace_strict(
        {p: i for i, p in enumerate(pids)}, default=0, return_dtype=pl.Int32
    )
    df = df.with_columns(rank.alias("rank"))
    if len(pids) > 1:
        meta.world_size = len(pids)
        meta.warnings.append(
            f"{len(pids)} processes in one capture: analyzed as ranks 0..{len(pids) - 1} by process id"
        )
    used = set(df.get_column("device").drop_nulls().unique().to_list())
    meta.devices = [a.info() for a in cap.gpus if a.index in used] or [a.info() for a in cap.gpus]
    table = add_kernel_class(conform(df, threads))
    launch = kernels.with_columns(rank.alias("rank")).select(
        "rank",
        "device",
        "correlation",
        "start_ns",
        # HSA's grid counts work-items; the table's grid counts blocks (workgroups), as CUDA's
        *(
            ((pl.col(f"grid_{d}") + pl.col(f"block_{d}") - 1) // pl.col(f"block_{d}")).alias(
                f"grid_{d}"
            )
            for d in "xyz"
        ),
        "block_x",
        "block_y",
        "block_z",
        "registers_per_thread",
        "shared_memory_bytes",
    )
    return Trace(events=table, meta=meta, kernel_args=conform_side(launch, KERNEL_ARGS_SCHEMA))


def _untraced_note(cap: Capture) -> str:
    """The one line on what rocprofv3 cannot give (PyTorch's ops) and what this capture left out."""
    if cap.api.height == 0:
        return (
            "rocprofv3 capture without HIP/HSA API calls or PyTorch CPU ops (kernel trace only): "
            "idle causes, syncs and launches are not measured (their counts read 0), nor FLOPs/MFU, "
            "optimizer, recompute and memory; add --hip-trace (or --sys-trace) for the API calls, "
            "torch.profiler for the ops"
        )
    return (
        "rocprofv3 records no PyTorch CPU ops: FLOPs/MFU, optimizer and recompute detection, op "
        "names in idle segments and memory need torch.profiler's trace"
    )


def _copies(copies: pl.DataFrame, agents: pl.DataFrame) -> pl.DataFrame:
    """Direction, memory kinds and the GPU of each copy: the device end (the destination of a
    device-to-device copy); a copy between two GPUs is peer-to-peer."""
    if copies.height == 0:
        return copies
    op = pl.col("operation")
    kinds = {k: v[0] for k, v in COPY_OPERATIONS.items()}
    src = {k: v[1] for k, v in COPY_OPERATIONS.items()}
    dst = {k: v[2] for k, v in COPY_OPERATIONS.items()}
    df = (
        copies.join(
            agents.rename({"agent": "src_agent", "device": "src_device"}),
            on="src_agent",
            how="left",
            maintain_order="left",
        )
        .join(
            agents.rename({"agent": "dst_agent", "device": "dst_device"}),
            on="dst_agent",
            how="left",
            maintain_order="left",
        )
        .with_columns(
            op.replace_strict(kinds, default="other", return_dtype=pl.String).alias("copy_kind"),
            op.replace_strict(src, default="unknown", return_dtype=pl.String).alias("src_kind"),
            op.replace_strict(dst, default="unknown", return_dtype=pl.String).alias("dst_kind"),
            pl.coalesce("dst_device", "src_device").alias("device"),
            (pl.col("stream").fill_null(0) + COPY_STREAM_BASE).alias("stream"),
        )
    )
    peer = (
        (pl.col("copy_kind") == "DtoD")
        & pl.col("src_device").is_not_null()
        & pl.col("dst_device").is_not_null()
        & (pl.col("src_device") != pl.col("dst_device"))
    )
    df = df.with_columns(
        pl.when(peer).then(pl.lit("PtoP")).otherwise("copy_kind").alias("copy_kind")
    )
    return df.with_columns(
        pl.lit("memcpy").alias("kind"),
        pl.format(
            "Memcpy {} ({})",
            pl.col("copy_kind"),
            pl.col("copy_kind").replace_strict(
                COPY_LABEL, default="unknown", return_dtype=pl.String
            ),
        ).alias("name"),
    ).drop("operation", "src_agent", "dst_agent", "src_device", "dst_device")
