"""The common event table every parser produces, and the trace metadata beside it.

One row per timed activity (a kernel, a copy, a runtime call, a CPU op, ...). Times are int64
nanoseconds on the trace's own clock (absolute where the format allows, so ranks line up).
See docs/SCHEMA.md for the meaning of every column.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from traceinsight.model.devices import spec_of

# What an event is. GPU-side kinds carry device and stream; host-side kinds carry pid/tid.
KINDS = [
    "kernel",
    "memcpy",
    "memset",
    "gpu_sync",  # CUPTI synchronization records on a stream (Kineto cuda_sync, nsys SYNCHRONIZATION)
    "gpu_annotation",  # GPU-side mirror of a user annotation (ProfilerStep on the stream)
    "runtime",  # CUDA/HIP runtime API call
    "driver",  # CUDA driver API call (Triton launches are cuLaunchKernel)
    "cpu_op",
    "user_annotation",  # record_function ranges, NVTX ranges
    "python_function",
    "overhead",  # profiler's own work
    # an OS call that held a thread (nsys OSRT_API: read, getc, poll, a lock's wait), from
    # OS_CALL_MIN_NS: what a CUDA application's host did while the GPU waited
    "os_call",
]
OS_CALL_MIN_NS = 1_000_000
GPU_KINDS = ("kernel", "memcpy", "memset", "gpu_sync", "gpu_annotation")
GPU_ACTIVITY_KINDS = ("kernel", "memcpy", "memset")  # what makes a GPU busy

KERNEL_CLASSES = [
    "communication",
    "memcpy",
    "memset",
    "gemm",
    "conv",
    "attention",
    "elementwise",
    "reduction",
    "optimizer",
    "other",
]
# "unified": unified-memory page migrations (nsys copyKind 11-13), not copies a call launched
COPY_KINDS = ["HtoD", "DtoH", "DtoD", "HtoH", "PtoP", "other", "unified"]
MEMORY_KINDS = ["pageable", "pinned", "device", "managed", "array", "host", "unknown"]

KindT = pl.Enum(KINDS)
KernelClassT = pl.Enum(KERNEL_CLASSES)
CopyKindT = pl.Enum(COPY_KINDS)
MemoryKindT = pl.Enum(MEMORY_KINDS)

EVENT_SCHEMA: dict[str, pl.DataType] = {
    "kind": KindT,
    "name": pl.String(),
    "start_ns": pl.Int64(),
    "end_ns": pl.Int64(),
    "dur_ns": pl.Int64(),
    "rank": pl.Int32(),
    "device": pl.Int32(),  # GPU index for GPU-side rows, null on the host
    "stream": pl.Int64(),
    "pid": pl.Int64(),
    "tid": pl.Int64(),
    "correlation": pl.Int64(),  # GPU activity <-> launching runtime/driver call
    "external_id": pl.Int64(),  # runtime call <-> CPU op (Kineto); null where unknown
    "copy_kind": CopyKindT,
    "src_kind": MemoryKindT,
    "dst_kind": MemoryKindT,
    "bytes": pl.Int64(),
    "kernel_class": KernelClassT,
}
COLUMNS = list(EVENT_SCHEMA)


def empty_events() -> pl.DataFrame:
    return pl.DataFrame(schema=EVENT_SCHEMA)


# Side tables: facts that only some events carry, kept out of the event table (a column of
# nulls per fact would cost every row). Each has rank (and device/start_ns where it applies) so
# the views that cut the event table (rank, device, window) cut them alike: see Trace.view.

# Allocator activity: Kineto ``[memory]`` instants (profile_memory=True: signed bytes, the
# allocator's totals after the event), nsys CUDA_GPU_MEMORY_USAGE_EVENTS (driver allocations:
# reserved memory) and PyTorch's export_memory_timeline output. device: the GPU, null for host
# memory; device_type "cuda" | "cpu" | other names. category: what the tensor is, from PyTorch's
# memory profiler (export_memory_timeline files only; null for Kineto and nsys rows).
MEMORY_CATEGORIES = (
    "parameter",
    "optimizer_state",
    "input",
    "temporary",
    "activation",
    "gradient",
    "autograd_detail",
    "unknown",
)  # in torch's _CATEGORY_TO_INDEX order (index 7: None, a tensor the profiler did not place)
MEMORY_SCHEMA: dict[str, pl.DataType] = {
    "rank": pl.Int32(),
    "device": pl.Int32(),
    "device_type": pl.String(),
    "start_ns": pl.Int64(),
    "pid": pl.Int64(),
    "tid": pl.Int64(),
    "bytes": pl.Int64(),  # > 0 allocated, < 0 freed
    "allocated_bytes": pl.Int64(),  # the allocator's total allocated after it, null if unknown
    "reserved_bytes": pl.Int64(),  # the allocator's total reserved after it, null if unknown
    "addr": pl.Int64(),
    "source": pl.String(),  # "kineto" | "nsys" | "memory_timeline"
    "category": pl.String(),  # one of MEMORY_CATEGORIES; null where the source has none
}

# Arguments of host ops recorded with record_shapes / with_flops: the JSON text of Kineto's
# ``Input Dims``, ``Input type``, ``Concrete Inputs``, and the profiler's FLOP estimate. Joined to
# the ops by (rank, pid, tid, start_ns, name) and to their kernels by external_id.
OP_ARGS_SCHEMA: dict[str, pl.DataType] = {
    "rank": pl.Int32(),
    "pid": pl.Int64(),
    "tid": pl.Int64(),
    "start_ns": pl.Int64(),
    "dur_ns": pl.Int64(),
    "name": pl.String(),
    "external_id": pl.Int64(),
    "input_dims": pl.String(),
    "input_types": pl.String(),
    "concrete_inputs": pl.String(),
    "flops": pl.Int64(),
    # a collective's message as record_param_comms records it (Kineto's "In msg nelems",
    # "dtype", "Group size"): the elements each rank sends, their type, the ranks in its group
    "msg_nelems": pl.Int64(),
    "msg_dtype": pl.String(),
    "group_size": pl.Int64(),
}

# Launch configuration of kernels: Kineto kernel args, nsys CUPTI_ACTIVITY_KIND_KERNEL columns.
# Joined to the kernels by (rank, device, correlation). occupancy_ratio: Kineto's estimated
# achieved occupancy in 0..1 (null where the trace has none).
KERNEL_ARGS_SCHEMA: dict[str, pl.DataType] = {
    "rank": pl.Int32(),
    "device": pl.Int32(),
    "correlation": pl.Int64(),
    "start_ns": pl.Int64(),
    "grid_x": pl.Int64(),
    "grid_y": pl.Int64(),
    "grid_z": pl.Int64(),
    "block_x": pl.Int64(),
    "block_y": pl.Int64(),
    "block_z": pl.Int64(),
    "registers_per_thread": pl.Int64(),
    "shared_memory_bytes": pl.Int64(),
    "occupancy_ratio": pl.Float64(),
    "blocks_per_sm": pl.Float64(),
    "warps_per_sm": pl.Float64(),
    # a communication kernel's collective as Kineto names it ("allreduce", "broadcast"): NCCL's
    # and RCCL's generic kernels say it nowhere else; null elsewhere and in nsys
    "collective": pl.String(),
    # its message, where the kernel carries it (PyTorch 2.1 on; else on record_param_comms)
    "msg_nelems": pl.Int64(),
    "msg_dtype": pl.String(),
    "group_size": pl.Int64(),
}


# Backtraces (nsys ``--backtrace`` / ``--cudabacktrace``): one row per frame of each call stack
# the export attached to an event: a CUDA API call (CUDA_CALLCHAINS), an OS runtime call
# (OSRT_CALLCHAINS) or a CPU sample taken inside a CUDA API call (COMPOSITE_EVENTS with
# SAMPLING_CALLCHAINS). start_ns/end_ns: the event's span (a sample: an instant); chain: the
# stack's id, unique in the table; depth 0 is the innermost frame.
CALLCHAIN_SCHEMA: dict[str, pl.DataType] = {
    "rank": pl.Int32(),
    "pid": pl.Int64(),
    "tid": pl.Int64(),
    "start_ns": pl.Int64(),
    "end_ns": pl.Int64(),
    "source": pl.String(),  # "cuda_api" | "osrt" | "sampling" (in a call) | "cpu_sample"
    "chain": pl.Int64(),
    "depth": pl.Int32(),
    "symbol": pl.String(),
    "module": pl.String(),
}


# Sampled GPU counters (nsys ``--gpu-metrics-devices``: GPU_METRICS): one row per sample and
# metric. device: the GPU the sample was taken on; start_ns: the sample's time on the events'
# clock; metric: "sm_active" | "tensor_active" | "dram_read" | "dram_write" | the export's own
# name (lower-cased) for the others; value_ratio: the counter in 0..1 where it is a percentage
# (others are kept as exported, e.g. warps in flight).
GPU_METRICS_SCHEMA: dict[str, pl.DataType] = {
    "rank": pl.Int32(),
    "device": pl.Int32(),
    "start_ns": pl.Int64(),
    "metric": pl.String(),
    "value_ratio": pl.Float64(),
}


def empty_gpu_metrics() -> pl.DataFrame:
    return pl.DataFrame(schema=GPU_METRICS_SCHEMA)


def empty_callchains() -> pl.DataFrame:
    return pl.DataFrame(schema=CALLCHAIN_SCHEMA)


def empty_memory() -> pl.DataFrame:
    return pl.DataFrame(schema=MEMORY_SCHEMA)


def empty_op_args() -> pl.DataFrame:
    return pl.DataFrame(schema=OP_ARGS_SCHEMA)


def empty_kernel_args() -> pl.DataFrame:
    return pl.DataFrame(schema=KERNEL_ARGS_SCHEMA)


def conform_side(df: pl.DataFrame, schema: dict[str, pl.DataType]) -> pl.DataFrame:
    """A side table with exactly ``schema``'s columns (missing ones null), sorted by start."""
    out = df.select(
        pl.col(c).cast(t, strict=False) if c in df.columns else pl.lit(None, t).alias(c)
        for c, t in schema.items()
    )
    return by_start(out, nulls_last=True)


def by_start(df: pl.DataFrame, *, nulls_last: bool = False) -> pl.DataFrame:
    """``df`` in start order (a stable sort); one already in order is only flagged sorted (the
    sort would copy every column to leave it as it is)."""
    start = df.get_column("start_ns")
    if start.null_count() == 0 and start.is_sorted():
        return df.with_columns(start.set_sorted())
    return df.sort("start_ns", maintain_order=True, nulls_last=nulls_last)


PER_COLUMN_MIN_ROWS = 1_000_000  # conform: below this, a thread pool costs more than it saves


def conform(df: pl.DataFrame, threads: int = 1) -> pl.DataFrame:
    """Add missing columns as nulls, cast to the schema, order the columns, sort by start
    (stable: rows that start together keep their input order). ``threads``: the runtime's
    threads for a large table's columns."""
    return conform_taking([df], threads)


def conform_taking(
    handed: list[pl.DataFrame],
    threads: int = 1,
    freed: Callable[[], None] | None = None,
    first: tuple[str, ...] = (),
) -> pl.DataFrame:
    """:func:`conform` of the frame in ``handed``, a one-item list the caller gives up (it is
    emptied): where nothing else holds the frame, each of its columns is freed as soon as its
    sorted copy is made, so the table and the frame are never both whole in memory (0.1 GB
    less peak on the 10x trace). ``freed`` is called after each column's source is released
    (the parser hands back the memory its decoder's columns held: another allocator's);
    ``first``: columns to sort before the others (the parser's that share one allocation,
    freed only with the last of them)."""
    df = handed.pop()
    n = df.height
    # The order from the start column alone: a select over the whole frame would first copy
    # every column into one chunk when the input is a concatenation (1.5 GB and 0.6 s of page
    # faults on a 1 GB nsys export). A stable arg-sort and one gather per column take 0.5 s
    # there where DataFrame.sort(maintain_order=True) took 1-2 s.
    several_ranks = "rank" in df.columns and _several(df.get_column("rank"))
    order = _row_order(df, several_ranks)
    if (
        n < PER_COLUMN_MIN_ROWS or threads < 2
    ):  # one select and one gather: less overhead on small tables
        exprs = [
            pl.col(name).cast(dtype)
            if name in df.columns
            else pl.lit(None, dtype=dtype).alias(name)
            for name, dtype in EVENT_SCHEMA.items()
        ]
        out = df.select(exprs)[order]
    else:
        columns = {name: df.get_column(name) for name in EVENT_SCHEMA if name in df.columns}
        del df

        def column(name: str, dtype: pl.DataType) -> pl.Series:
            src = columns.pop(name, None)
            if src is None or src.null_count() == n:  # nothing to gather
                return pl.repeat(None, n, dtype=dtype, eager=True).alias(name)
            # One chunk before the gather: gathering across many chunks is several times slower.
            out = src.cast(dtype).rechunk().gather(order)
            del src
            if freed is not None:
                freed()
            return out

        # Two columns at a time where there are two cores: polars releases the GIL, and a
        # column's copy and gather run on one core, mostly waiting on memory.
        names = [c for c in first if c in EVENT_SCHEMA] + [
            c for c in EVENT_SCHEMA if c not in first
        ]
        with ThreadPoolExecutor(max_workers=2) as pool:
            done = dict(
                zip(names, pool.map(column, names, [EVENT_SCHEMA[c] for c in names]), strict=True)
            )
        out = pl.DataFrame([done.pop(c) for c in EVENT_SCHEMA])
    if out.get_column("start_ns").null_count() or several_ranks:
        return out
    return out.with_columns(pl.col("start_ns").set_sorted())


def _several(values: pl.Series) -> bool:
    """``values.n_unique() > 1`` (a null counts as a value) without hashing them: a null beside
    a value, or two values (0.07 s less on the 15M rows of a 1 GB nsys export)."""
    nulls, n = values.null_count(), values.len()
    return 0 < nulls < n or (nulls < n and values.min() != values.max())


def _row_order(df: pl.DataFrame, several_ranks: bool) -> pl.Series:
    """The table's row order: by start, stable; with several ranks in one table (an nsys export
    of several processes), rank by rank, so each rank's rows are one slice (see
    :func:`by_rank`) and nothing copies them out again. The start order split by rank keeps
    each rank's rows in it: polars' two-key arg-sort took 5 s on 15M rows, this 0.5 s."""
    start = df.get_column("start_ns").cast(pl.Int64)
    order = start.to_frame().select(pl.arg_sort_by("start_ns", maintain_order=True)).to_series()
    if not several_ranks:
        return order
    rank = df.get_column("rank").cast(pl.Int32).gather(order)
    parts = pl.DataFrame({"i": order, "rank": rank}).partition_by("rank", as_dict=True)
    nulls_first = sorted(parts, key=lambda k: (k[0] is not None, k[0] or 0))
    return pl.concat([parts[k].get_column("i") for k in nulls_first])


def by_rank(events: pl.DataFrame) -> list[tuple[int, pl.DataFrame]]:
    """Each rank's rows (ranks ascending, rows without a rank left out), in start order: slices
    of a table that :func:`conform` ordered rank by rank (no copy), filters of any other."""
    ranks = events.get_column("rank")
    if ranks.null_count() or not ranks.is_sorted():
        return [
            (r, events.filter(pl.col("rank") == r))
            for r in sorted(ranks.drop_nulls().unique().to_list())
        ]
    out = []
    offset = 0
    for n, rank in ranks.rle().struct.unnest().iter_rows():
        part = events.slice(offset, n)
        if part.get_column("start_ns").null_count() == 0:
            part = part.with_columns(pl.col("start_ns").set_sorted())
        out.append((int(rank), part))
        offset += n
    return out


@dataclass(frozen=True)
class DeviceInfo:
    id: int
    name: str | None = None
    sm_count: int | None = None
    memory_bytes: int | None = None
    compute_capability: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.name,
            "sm_count": self.sm_count,
            "memory_bytes": self.memory_bytes,
            "compute_capability": self.compute_capability,
            # the spec table's figures (model/devices.py); null for a device it does not know
            **device_spec_json(self),
        }


def device_spec_json(device: DeviceInfo | None) -> dict[str, Any]:
    spec = spec_of(device)
    if spec is None:
        return {
            "spec": None,
            "peak_tflops": None,
            "memory_bandwidth_bytes_per_s": None,
            "memory_type": None,
        }
    return spec.to_json()


@dataclass
class TraceMeta:
    """Trace-level facts beside the event table."""

    source_path: str
    format: str  # "kineto" | "nsys-sqlite"
    format_version: str
    rank: int | None = None
    world_size: int | None = None
    backend: str | None = None
    devices: list[DeviceInfo] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.source_path,
            "format": self.format,
            "format_version": self.format_version,
            "rank": self.rank,
            "world_size": self.world_size,
            "backend": self.backend,
            "devices": [d.to_json() for d in self.devices],
        }


# The Trace fields holding side tables: views cut them and jobs stack them all alike.
SIDE_TABLES = ("memory", "op_args", "kernel_args", "callchains", "gpu_metrics")


@dataclass
class Trace:
    """One rank's (or one export's) events and metadata, and the side tables beside them."""

    events: pl.DataFrame
    meta: TraceMeta
    memory: pl.DataFrame = field(default_factory=empty_memory)
    op_args: pl.DataFrame = field(default_factory=empty_op_args)
    kernel_args: pl.DataFrame = field(default_factory=empty_kernel_args)
    callchains: pl.DataFrame = field(default_factory=empty_callchains)
    gpu_metrics: pl.DataFrame = field(default_factory=empty_gpu_metrics)

    def view(
        self,
        events: pl.DataFrame,
        *,
        rank: int | None = None,
        device: int | None = None,
        window: tuple[int, int] | None = None,
        meta: TraceMeta | None = None,
    ) -> Trace:
        """This trace with other rows of its event table (a rank's, a device's, a window's):
        the side tables cut the same way (host rows of a device view kept, as in the events)."""

        def cut(side: pl.DataFrame) -> pl.DataFrame:
            if side.height == 0:
                return side
            keep = pl.lit(True)
            if rank is not None:
                keep &= pl.col("rank").eq_missing(rank)
            if device is not None and "device" in side.columns:
                keep &= pl.col("device").is_null() | (pl.col("device") == device)
            if window is not None:
                keep &= (pl.col("start_ns") >= window[0]) & (pl.col("start_ns") < window[1])
            return side.filter(keep)

        return Trace(
            events=events,
            meta=meta or self.meta,
            **{name: cut(getattr(self, name)) for name in SIDE_TABLES},
        )
