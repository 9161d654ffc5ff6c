"""rocprofv3 ``--output-format json``: ``{"rocprofiler-sdk-tool": [one entry per process]}``.

Each entry holds the process (``metadata``), the node's ``agents``, the names of every record
kind and operation (``strings.buffer_records``), roctx messages by correlation id
(``strings.marker_api``), ``kernel_symbols`` (by kernel id) and ``buffer_records``: one list per
traced domain (``kernel_dispatch``, ``hip_api``, ``hsa_api``, ``marker_api``, ``rccl_api``,
``memory_copy``, ...), empty where the domain was not traced. The document is decoded into
these types at once (msgspec): a field of the wrong type is an InputError naming it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import msgspec
import polars as pl

from traceinsight.errors import InputError
from traceinsight.parsers.rocprof.capture import (
    API_COLUMNS,
    COPY_COLUMNS,
    KERNEL_COLUMNS,
    MARKER_COLUMNS,
    Agent,
    Capture,
    frame,
)
from traceinsight.parsers.source import read_bytes

TOOL_KEY = b'"rocprofiler-sdk-tool"'
_DISPATCH_FIELDS = (
    "start_ns",
    "end_ns",
    "correlation",
    "agent",
    "stream",
    "kernel_id",
    "grid_x",
    "grid_y",
    "grid_z",
    "block_x",
    "block_y",
    "block_z",
    "shared_memory_bytes",
)
GPU_AGENT = 2  # rocprofiler_agent_type_t: 1 CPU, 2 GPU
# The API domains read as host calls; marker records are read on their own.
API_DOMAINS = ("hip_api", "hsa_api", "rccl_api")
MARKER_RANGE = "MARKER_CORE_RANGE_API"  # roctx push/pop and start/stop ranges


# Every number is stored as int64: a value beyond it (rocprofiler's fields are uint64) is refused
# at decoding, naming the field, rather than failing later in a column.
N = Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]


class _Handle(msgspec.Struct):
    handle: N


class _Correlation(msgspec.Struct):
    internal: N


class _Dim3(msgspec.Struct):
    x: N
    y: N = 1
    z: N = 1


class _DispatchInfo(msgspec.Struct):
    agent_id: _Handle
    queue_id: _Handle
    kernel_id: N
    workgroup_size: _Dim3
    grid_size: _Dim3
    group_segment_size: N = 0


class _Dispatch(msgspec.Struct):
    correlation_id: _Correlation
    start_timestamp: N
    end_timestamp: N
    dispatch_info: _DispatchInfo


class _Api(msgspec.Struct):
    kind: N
    operation: N
    thread_id: N
    correlation_id: _Correlation
    start_timestamp: N
    end_timestamp: N


class _Copy(msgspec.Struct):
    kind: N
    operation: N
    correlation_id: _Correlation
    start_timestamp: N
    end_timestamp: N
    dst_agent_id: _Handle
    src_agent_id: _Handle
    bytes: N
    stream_id: _Handle | None = None


class _Buffers(msgspec.Struct):
    kernel_dispatch: list[_Dispatch] = []
    hip_api: list[_Api] = []
    hsa_api: list[_Api] = []
    rccl_api: list[_Api] = []
    marker_api: list[_Api] = []
    memory_copy: list[_Copy] = []


class _Names(msgspec.Struct):
    kind: str
    operations: list[str] = []


class _Message(msgspec.Struct):
    key: N
    value: str


class _Strings(msgspec.Struct):
    buffer_records: list[_Names] = []
    marker_api: list[_Message] = []


class _Symbol(msgspec.Struct):
    kernel_id: N
    kernel_name: str = ""
    formatted_kernel_name: str = ""
    arch_vgpr_count: N = 0
    accum_vgpr_count: N = 0


class _MemBank(msgspec.Struct):
    size_in_bytes: N = 0


class _Agent(msgspec.Struct):
    id: _Handle
    type: N
    logical_node_type_id: N | None = None  # the GPU's index among the node's GPUs
    name: str = ""
    product_name: str = ""
    cu_count: N = 0
    mem_banks: list[_MemBank] = []


class _Metadata(msgspec.Struct):
    pid: N
    init_time: N = 0
    fini_time: N = 0


class _Process(msgspec.Struct):
    metadata: _Metadata
    buffer_records: _Buffers
    agents: list[_Agent] = []
    strings: _Strings = msgspec.field(default_factory=_Strings)
    kernel_symbols: list[_Symbol] = []


class _Document(msgspec.Struct):
    processes: list[_Process] = msgspec.field(name="rocprofiler-sdk-tool")


def looks_like_rocprof_json(head: bytes) -> bool:
    """The first bytes of a document: rocprofv3 writes its one key first."""
    return head.lstrip()[:1] == b"{" and TOOL_KEY in head[:256]


def read_json(path: Path, max_bytes: int | None = None) -> Capture:
    data, truncated = read_bytes(path, max_bytes)
    if truncated:
        raise InputError(
            "the compressed stream ends early: the rocprofv3 JSON document is incomplete", str(path)
        )
    try:
        doc = msgspec.json.decode(data, type=_Document)
    except msgspec.ValidationError as exc:
        raise InputError(
            f"not a rocprofv3 JSON document this reader knows: {exc}", str(path)
        ) from None
    except msgspec.DecodeError as exc:
        raise InputError(f"damaged rocprofv3 JSON document ({exc})", str(path)) from None
    del data
    if not doc.processes:
        raise InputError("rocprofv3 JSON document lists no process", str(path))
    parts = [_process(p) for p in doc.processes]
    gpus = {a.key: a for part in parts for a in part[4]}
    traced = sorted({t for part in parts for t in part[5]})
    return Capture(
        path=str(path),
        format="rocprof-json",
        format_version="rocprofv3 JSON (rocprofiler-sdk-tool)",
        kernels=pl.concat([p[0] for p in parts]),
        api=pl.concat([p[1] for p in parts]),
        copies=pl.concat([p[2] for p in parts]),
        markers=pl.concat([p[3] for p in parts]),
        gpus=sorted(gpus.values(), key=lambda a: a.index),
        traced=traced,
        extra={
            "rocprof_pids": [p.metadata.pid for p in doc.processes],
            # rocprofiler's clock (the kernel's monotonic clock), not UTC: files of one job
            # on one node line up, files from different nodes do not
            "clock": "monotonic ns",
        },
    )


def _process(
    p: _Process,
) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame, pl.DataFrame, list[Agent], list[str]]:
    pid = p.metadata.pid
    names = p.strings.buffer_records
    b = p.buffer_records
    symbols = pl.DataFrame(
        {
            "kernel_id": [s.kernel_id for s in p.kernel_symbols],
            # the name rocprofv3's own outputs show (rocpd's display_name): demangled, no ".kd"
            "name": [s.formatted_kernel_name or s.kernel_name for s in p.kernel_symbols],
            "registers_per_thread": [
                s.arch_vgpr_count + s.accum_vgpr_count for s in p.kernel_symbols
            ],
        },
        schema={"kernel_id": pl.Int64, "name": pl.String, "registers_per_thread": pl.Int64},
    ).unique("kernel_id", keep="first")
    d = b.kernel_dispatch
    kernels = pl.DataFrame(
        {
            "start_ns": [r.start_timestamp for r in d],
            "end_ns": [r.end_timestamp for r in d],
            "correlation": [r.correlation_id.internal for r in d],
            "agent": [r.dispatch_info.agent_id.handle for r in d],
            "stream": [r.dispatch_info.queue_id.handle for r in d],
            "kernel_id": [r.dispatch_info.kernel_id for r in d],
            "grid_x": [r.dispatch_info.grid_size.x for r in d],
            "grid_y": [r.dispatch_info.grid_size.y for r in d],
            "grid_z": [r.dispatch_info.grid_size.z for r in d],
            "block_x": [r.dispatch_info.workgroup_size.x for r in d],
            "block_y": [r.dispatch_info.workgroup_size.y for r in d],
            "block_z": [r.dispatch_info.workgroup_size.z for r in d],
            "shared_memory_bytes": [r.dispatch_info.group_segment_size for r in d],
        },
        schema=dict.fromkeys(_DISPATCH_FIELDS, pl.Int64),
    )
    kernels = kernels.join(symbols, on="kernel_id", how="left", maintain_order="left").with_columns(
        pl.lit(pid).alias("pid"),
        pl.col("name").fill_null(pl.format("kernel {}", pl.col("kernel_id"))),
    )
    api = pl.concat(
        [_api_rows(getattr(b, domain), names, pid) for domain in API_DOMAINS], how="vertical"
    )
    marks = _api_rows(b.marker_api, names, pid)
    messages = pl.DataFrame(
        {
            "correlation": [m.key for m in p.strings.marker_api],
            "message": [m.value for m in p.strings.marker_api],
        },
        schema={"correlation": pl.Int64, "message": pl.String},
    ).unique("correlation", keep="first")
    markers = (
        marks.filter(pl.col("category") == MARKER_RANGE)
        .join(messages, on="correlation", how="left", maintain_order="left")
        .with_columns(pl.coalesce("message", "name").alias("name"))
    )
    c = b.memory_copy
    copies = pl.DataFrame(
        {
            "start_ns": [r.start_timestamp for r in c],
            "end_ns": [r.end_timestamp for r in c],
            "correlation": [r.correlation_id.internal for r in c],
            "stream": [r.stream_id.handle if r.stream_id else None for r in c],
            "bytes": [r.bytes for r in c],
            "src_agent": [r.src_agent_id.handle for r in c],
            "dst_agent": [r.dst_agent_id.handle for r in c],
            "kind": [r.kind for r in c],
            "op": [r.operation for r in c],
        },
        schema={
            "start_ns": pl.Int64,
            "end_ns": pl.Int64,
            "correlation": pl.Int64,
            "stream": pl.Int64,
            "bytes": pl.Int64,
            "src_agent": pl.Int64,
            "dst_agent": pl.Int64,
            "kind": pl.Int64,
            "op": pl.Int64,
        },
    )
    copies = (
        _named(copies, names).rename({"name": "operation"}).with_columns(pl.lit(pid).alias("pid"))
    )
    gpu_agents = [a for a in p.agents if a.type == GPU_AGENT]
    gpus = [
        Agent(
            key=a.id.handle,
            index=i if a.logical_node_type_id is None else a.logical_node_type_id,
            name=a.product_name or a.name or None,
            cu_count=a.cu_count or None,
            memory_bytes=sum(m.size_in_bytes for m in a.mem_banks) or None,
            arch=a.name or None,
        )
        for i, a in enumerate(gpu_agents)
    ]
    traced = [
        domain
        for domain in ("kernel_dispatch", *API_DOMAINS, "marker_api", "memory_copy")
        if getattr(b, domain)
    ]
    return (
        frame(kernels, KERNEL_COLUMNS),
        frame(api, API_COLUMNS),
        frame(copies, COPY_COLUMNS),
        frame(markers, MARKER_COLUMNS),
        gpus,
        traced,
    )


def _api_rows(records: list[_Api], names: list[_Names], pid: int) -> pl.DataFrame:
    df = pl.DataFrame(
        {
            "start_ns": [r.start_timestamp for r in records],
            "end_ns": [r.end_timestamp for r in records],
            "tid": [r.thread_id for r in records],
            "correlation": [r.correlation_id.internal for r in records],
            "kind": [r.kind for r in records],
            "op": [r.operation for r in records],
        },
        schema={c: pl.Int64 for c in ("start_ns", "end_ns", "tid", "correlation", "kind", "op")},
    )
    return _named(df, names).with_columns(pl.lit(pid, pl.Int64).alias("pid"))


def _named(df: pl.DataFrame, names: list[_Names]) -> pl.DataFrame:
    """The record kind's name (``category``) and the operation's (``name``) from the document's
    string tables, joined on the (kind, operation) numbers."""
    table = pl.DataFrame(
        {
            "kind": [k for k, n in enumerate(names) for _ in n.operations],
            "op": [o for n in names for o in range(len(n.operations))],
            "category": [n.kind for n in names for _ in n.operations],
            "name": [o for n in names for o in n.operations],
        },
        schema={"kind": pl.Int64, "op": pl.Int64, "category": pl.String, "name": pl.String},
    )
    return df.join(table, on=["kind", "op"], how="left", maintain_order="left").drop("kind", "op")
