"""The side tables (memory, op args, kernel args) from Kineto traces: both decode paths, views."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from traceinsight.parsers.kineto import parse_kineto

TRACE = {
    "schemaVersion": 1,
    "traceEvents": [
        {
            "ph": "X",
            "cat": "cpu_op",
            "name": "aten::mm",
            "pid": 1,
            "tid": 2,
            "ts": 10,
            "dur": 5,
            "args": {
                "External id": 7,
                "Input Dims": [[64, 128], [128, 256]],
                "Input type": ["c10::BFloat16", "c10::BFloat16"],
                "Concrete Inputs": ["", ""],
            },
        },
        {
            "ph": "X",
            "cat": "kernel",
            "name": "gemm",
            "pid": 0,
            "tid": 7,
            "ts": 12,
            "dur": 3,
            "args": {
                "External id": 7,
                "device": 0,
                "stream": 7,
                "correlation": 11,
                "grid": [4, 2, 1],
                "block": [128, 1, 1],
                "registers per thread": 96,
                "shared memory": 49152,
                "est. achieved occupancy %": 25,
                "blocks per SM": 0.5,
                "warps per SM": 2.0,
            },
        },
        {
            "ph": "i",
            "cat": "cpu_instant_event",
            "s": "t",
            "name": "[memory]",
            "pid": 1,
            "tid": 2,
            "ts": 11,
            "args": {
                "Total Reserved": 2097152,
                "Total Allocated": 65536,
                "Bytes": 65536,
                "Device Id": 0,
                "Device Type": 1,
                "Addr": 4096,
            },
        },
        {
            "ph": "i",
            "cat": "cpu_instant_event",
            "s": "t",
            "name": "[memory]",
            "pid": 1,
            "tid": 2,
            "ts": 14,
            "args": {
                "Total Reserved": 2097152,
                "Total Allocated": 0,
                "Bytes": -65536,
                "Device Id": 0,
                "Device Type": 1,
                "Addr": 4096,
            },
        },
        {
            "ph": "i",
            "cat": "cpu_instant_event",
            "s": "t",
            "name": "[memory]",
            "pid": 1,
            "tid": 2,
            "ts": 15,
            "args": {
                "Total Reserved": 0,
                "Total Allocated": 8,
                "Bytes": 8,
                "Device Id": -1,
                "Device Type": 0,
                "Addr": 99,
            },
        },
    ],
}


def _write(tmp_path: Path, doc: dict, indent: int | None = None) -> Path:
    p = tmp_path / "t.pt.trace.json"
    p.write_text(json.dumps(doc, indent=indent))
    return p


def test_side_tables_from_the_typed_decode(tmp_path):
    t = parse_kineto(_write(tmp_path, TRACE))
    assert t.events.height == 2  # the instants are not events
    mem = t.memory
    assert mem["bytes"].to_list() == [65536, -65536, 8]
    assert mem["allocated_bytes"].to_list() == [65536, 0, 8]
    assert mem["reserved_bytes"].to_list() == [2097152, 2097152, 0]
    assert mem["device"].to_list() == [0, 0, None]
    assert mem["device_type"].to_list() == ["cuda", "cuda", "cpu"]
    assert mem["start_ns"].to_list() == [11_000, 14_000, 15_000]
    op = t.op_args.row(0, named=True)
    assert op["name"] == "aten::mm" and op["external_id"] == 7 and op["start_ns"] == 10_000
    assert json.loads(op["input_dims"]) == [[64, 128], [128, 256]]
    assert json.loads(op["input_types"]) == ["c10::BFloat16", "c10::BFloat16"]
    k = t.kernel_args.row(0, named=True)
    assert (k["grid_x"], k["grid_y"], k["grid_z"]) == (4, 2, 1)
    assert (k["block_x"], k["block_y"], k["block_z"]) == (128, 1, 1)
    assert k["registers_per_thread"] == 96 and k["shared_memory_bytes"] == 49152
    assert k["occupancy_ratio"] == 0.25 and k["correlation"] == 11 and k["device"] == 0
    assert t.meta.extra["non_duration_events"] == 0


def test_side_tables_same_in_every_layout_and_path(tmp_path):
    """Pretty-printed (newlines inside the grid arrays) and the robust path give the same."""
    ref = parse_kineto(_write(tmp_path, TRACE))
    pretty = parse_kineto(_write(tmp_path, TRACE, indent=2))
    broken = dict(TRACE, traceEvents=[*TRACE["traceEvents"], {"ph": "X", "args": [1]}])
    robust = parse_kineto(_write(tmp_path, broken))  # an odd event: the dict path decodes it

    def normal(df: pl.DataFrame) -> pl.DataFrame:  # JSON texts keep their input's spacing
        text = [c for c in ("input_dims", "input_types", "concrete_inputs") if c in df.columns]
        return df.with_columns(
            pl.col(c).map_elements(lambda v: json.dumps(json.loads(v)), pl.String) for c in text
        )

    for t in (pretty, robust):
        for table in ("memory", "op_args", "kernel_args"):
            assert normal(getattr(t, table)).equals(normal(getattr(ref, table))), table


def test_views_cut_the_side_tables(tmp_path):
    t = parse_kineto(_write(tmp_path, TRACE))
    v = t.view(t.events, window=(12_000, 20_000))
    assert v.memory["start_ns"].to_list() == [14_000, 15_000]
    assert v.op_args.height == 0 and v.kernel_args.height == 1
    assert t.view(t.events, device=1).memory["device"].to_list() == [None]  # host memory kept
    assert t.view(t.events, rank=3).memory.height == 0
    assert isinstance(v.memory, pl.DataFrame)


def test_generic_collective_kernels_take_their_kind_from_kinetos_kernel_args():
    # MI300 (RCCL) traces launch ncclDevKernel_Generic for every collective; Kineto's kernel
    # args say which: 6 allreduce, 6 broadcast (counted in the raw JSON), the launches are not
    # linked to the host ops
    from traceinsight import analyze

    from .conftest import SHARED

    path = SHARED / "tracelens" / "mi300_resnet_act_checkpoint.json.gz"
    if not path.exists():
        pytest.skip(f"corpus trace not here: {path}")
    a = analyze(path)
    named = a.trace.kernel_args.get_column("collective").drop_nulls().value_counts(sort=True)
    assert dict(named.iter_rows()) == {"allreduce": 6, "broadcast": 6}
    by_kind = a.results.comm.by_kind
    assert set(by_kind) <= {"all_reduce", "broadcast"} and "other" not in by_kind
    f = next(f for f in a.findings if f.id == "comm_not_overlapped")
    assert "mostly all_reduce; at least" in f.title  # and mostly waiting for other ranks


COMMS = {
    "traceEvents": [
        # record_param_comms: the message of the collective it wraps (no shapes recorded)
        {
            "ph": "X",
            "cat": "cpu_op",
            "name": "record_param_comms",
            "pid": 1,
            "tid": 2,
            "ts": 10,
            "dur": 50,
            "args": {
                "External id": 9,
                "Collective name": "allreduce",
                "dtype": "BFloat16",
                "In msg nelems": 2873320,
                "Out msg nelems": 2873320,
                "Group size": 8,
                "Process Group Ranks": "[0, 1, 2, 3, 4, 5, 6, 7]",
            },
        },
        # a NCCL kernel carrying it too (PyTorch 2.1 on)
        {
            "ph": "X",
            "cat": "kernel",
            "name": "ncclDevKernel_AllReduce_Sum_bf16_RING_LL",
            "pid": 0,
            "tid": 7,
            "ts": 40,
            "dur": 6680,
            "args": {
                "External id": 9,
                "device": 0,
                "stream": 30,
                "correlation": 12,
                "grid": [8, 1, 1],
                "block": [512, 1, 1],
                "Collective name": "allreduce",
                "dtype": "BFloat16",
                "In msg nelems": 2873320,
                "Group size": 8,
            },
        },
        # a wait: no message, not an op with shapes
        {
            "ph": "X",
            "cat": "cpu_op",
            "name": "record_param_comms",
            "pid": 1,
            "tid": 2,
            "ts": 70,
            "dur": 4,
            "args": {"External id": 10, "Collective name": "wait", "dtype": 5, "Group size": 1},
        },
    ]
}


def test_collective_messages_in_both_paths(tmp_path):
    """A collective's message (elements, dtype, group) on its record_param_comms op and on its
    kernel; a dtype that is no name is null; the robust (dict) path reads the same."""
    ref = parse_kineto(_write(tmp_path, COMMS))
    op = ref.op_args.select("name", "external_id", "msg_nelems", "msg_dtype", "group_size")
    assert op.rows() == [("record_param_comms", 9, 2873320, "BFloat16", 8)]
    k = ref.kernel_args.select("correlation", "collective", "msg_nelems", "msg_dtype", "group_size")
    assert k.rows() == [(12, "allreduce", 2873320, "BFloat16", 8)]
    broken = dict(COMMS, traceEvents=[*COMMS["traceEvents"], {"ph": "X", "args": [1]}])
    robust = parse_kineto(_write(tmp_path, broken))
    for table in ("op_args", "kernel_args"):
        assert getattr(robust, table).equals(getattr(ref, table)), table
