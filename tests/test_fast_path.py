"""The streamed msgspec path must give exactly the result of the reference orjson path."""

import os
from dataclasses import fields

import polars as pl
import pytest

import traceinsight.parsers.kineto.stream as fast
from traceinsight.api import analyze_trace
from traceinsight.parsers import load_trace
from traceinsight.parsers.source import inflated_size

from .conftest import CORPUS, H200, TINY, raw_json

CASES = [
    H200 / "healthy_bf16.pt.trace.json.xz",
    H200 / "ddp_straggler" / "rank1.pt.trace.json.xz",
    H200 / "h2d_pageable.pt.trace.json.xz",
    CORPUS / "plugin_2021-01_resnet50_nw0_worker0.pt.trace.json.xz",  # bare array era
    CORPUS / "libkineto_test_after_fix_trace.json",
    CORPUS / "inference_vllm_decode_full_graph_execution.json.gz",
    TINY / "step_dataloader_sync.json",
    H200 / "memory" / "mem_leak.pt.trace.json.xz",  # profile_memory: the memory frames
]


def _parsed(
    path,
    monkeypatch,
    *,
    use_fast: bool,
    chunk: int = fast.CHUNK_BYTES,
    streamed: bool = True,
    helpers: int = 0,
):
    """``load_trace(path)`` by the path asked for. Module constants patched on purpose: the cut
    points (CHUNK_BYTES) and the helper threshold are fixed policy with no public knob, and cuts
    inside strings or nested values, or helpers on a small file, are reached only with them
    shrunk; what is compared is the public result."""
    monkeypatch.setattr(fast, "CHUNK_BYTES", chunk)
    monkeypatch.setattr(fast, "MIN_HELPER_BYTES", 0)
    if not use_fast:
        monkeypatch.setattr(fast, "decode", lambda data: None)
    if not use_fast or not streamed:
        monkeypatch.setattr(fast, "decode_path", lambda *a, **k: None)
    try:
        return load_trace(path, parse_helpers=helpers)
    finally:
        monkeypatch.undo()


def _doc(path, monkeypatch, **kw):
    """The analysis document of :func:`_parsed`'s trace."""
    return analyze_trace(_parsed(path, monkeypatch, **kw)).to_json()


def _trace(path, monkeypatch, **kw) -> tuple:
    """The parsed trace (what the analysis is a function of) as a comparable value: the event
    table, the metadata and every side table; one parse instead of :func:`_doc`'s analysis."""
    t = _parsed(path, monkeypatch, **kw)
    return (t.meta, *(Frame(getattr(t, f.name)) for f in fields(t) if f.name != "meta"))


class Frame:
    """A frame compared by its schema and values (``DataFrame.__eq__`` is elementwise)."""

    def __init__(self, df: pl.DataFrame) -> None:
        self.df = df

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Frame) and self.df.equals(other.df)

    def __repr__(self) -> str:
        return repr(self.df)


@pytest.mark.parametrize("path", CASES, ids=lambda p: p.name)
def test_fast_path_json_identical(path, monkeypatch):
    # compared as parsed traces: the analysis is a function of the trace (the helper-process
    # and spool tests below compare whole analyses)
    parsed = _trace(path, monkeypatch, use_fast=False)
    assert _trace(path, monkeypatch, use_fast=True) == parsed
    # the whole document in memory, cut into small chunks: many cut points inside the array
    assert _trace(path, monkeypatch, use_fast=True, streamed=False, chunk=64 * 1024) == parsed
    # streamed and cut while inflating, small chunks
    assert _trace(path, monkeypatch, use_fast=True, chunk=64 * 1024) == parsed


def test_streamed_with_helper_processes_identical(monkeypatch):
    """Chunks decoded in a spawned helper give the same analysis as one process."""
    path = H200 / "ddp_straggler" / "rank1.pt.trace.json.xz"
    reference = _doc(path, monkeypatch, use_fast=False)
    assert _doc(path, monkeypatch, use_fast=True, chunk=256 * 1024, helpers=1) == reference


def test_streamed_path_is_taken(monkeypatch):
    """The streamed decoder accepts kineto's layouts (object and bare array) and declines others."""
    for path in (
        H200 / "healthy_bf16.pt.trace.json.xz",
        CORPUS / "plugin_2021-01_resnet50_nw0_worker0.pt.trace.json.xz",
    ):
        assert fast.decode_path(path, None) is not None, path


def test_streamed_path_declines(tmp_path):
    cases = {
        "args_list.json": b'{"traceEvents": [\n  {"ph": "X", "args": [1]}\n]}',
        "numbers.json": b"[1, 2]",
        "events_not_array.json": b'{"traceEvents": {"a": 1}}',
        "unclosed.json": b'{"traceEvents": [\n  {"ph": "X", "name": "a", "ts": 1, "dur": 1}',
        "trailing_garbage.json": b'[{"ph": "X"}] xx',
    }
    for name, text in cases.items():
        p = tmp_path / name
        p.write_bytes(text)
        assert fast.decode_path(p, None) is None, name


def test_streamed_metadata_after_events(tmp_path):
    """Keys after the events array (baseTimeNanoseconds, arrays with brackets) are read."""
    p = tmp_path / "t.json"
    p.write_bytes(
        b'{"schemaVersion": 1, "traceEvents": [\n  {"ph": "X", "cat": "kernel", "name": "k]", "ts": 1, "dur": 2},'
        b'\n  {"ph": "i", "name": "x"}\n],\n "deviceProperties": [{"id": 0, "name": "G]"}], "baseTimeNanoseconds": 5}'
    )
    df, meta, era, other, notes, _side, _memory = fast.decode_path(p, None)
    assert df.height == 1 and other == 1 and era == "" and notes == []
    assert meta["baseTimeNanoseconds"] == 5 and meta["deviceProperties"][0]["name"] == "G]"


def test_fast_path_is_taken_for_kineto_output(monkeypatch):
    from traceinsight.parsers.source import read_bytes

    data, _ = read_bytes(H200 / "healthy_bf16.pt.trace.json.xz")
    assert fast.decode(data) is not None
    assert (
        fast.decode(b'{"traceEvents": [{"ph": "X", "args": [1]}]}') is None
    )  # bad args: robust path
    assert fast.decode(b"[1, 2]") is None


def _spool_files():
    """This process's spool files (the name holds the owner's pid: other analyses running on
    the machine have their own)."""
    import glob
    import os
    import tempfile

    own = f"traceinsight-spool-{os.getpid()}-*"
    return set(glob.glob(f"/dev/shm/{own}")) | set(glob.glob(f"{tempfile.gettempdir()}/{own}"))


def test_spool_is_removed_and_optional(monkeypatch):
    """The spool file is deleted after the parse; without room for one, the whole-document path
    gives the same analysis."""
    path = H200 / "h2d_pageable.pt.trace.json.xz"
    before = _spool_files()
    reference = _doc(path, monkeypatch, use_fast=True)
    assert _spool_files() == before

    def no_room(size):
        raise OSError("no room")

    monkeypatch.setattr(fast, "_spool_file", no_room)
    assert fast.decode_path(path, None) is None
    assert analyze_trace(load_trace(path)).to_json() == reference


def test_multi_member_gzip(tmp_path, monkeypatch):
    """gzip's ISIZE only covers the last member: the spool grows past it and the streamed path
    still reads the whole document."""
    import gzip

    data = raw_json(H200 / "h2d_pinned.pt.trace.json.xz")
    cut = len(data) // 2
    p = tmp_path / "two_members.json.gz"
    p.write_bytes(gzip.compress(data[:cut]) + gzip.compress(data[cut:]))
    assert fast.decode_path(p, None) is not None
    single = tmp_path / "one.json.gz"
    single.write_bytes(gzip.compress(data))
    assert analyze_trace(load_trace(p)).metrics == analyze_trace(load_trace(single)).metrics


def test_lost_helper_chunks_are_decoded_here(tmp_path):
    """A helper that dies (or a pool that breaks) costs time, not results."""
    from concurrent.futures import Future

    path = H200 / "healthy_bf16.pt.trace.json.xz"
    stream = fast.Decompressed(path, None)
    spool = fast._Spool(inflated_size(path, stream.kind))
    try:
        cutter = fast._Cutter(spool)
        spans = []
        for block in stream:
            spool.write(block)
            spans += cutter.cut()
        start, closes = cutter.finish(0)
        spans.append((start, closes[0][0]))

        class DeadPool:
            def submit(self, *a, **k):
                f = Future()
                f.set_exception(RuntimeError("helper died"))
                return f

            def shutdown(self, **k):
                pass

        sched = fast._Scheduler(spool, helpers=1)
        sched.pool = DeadPool()
        for span in spans:
            sched.add(*span)
        parts = sched.results()
        assert parts is not None and len(parts) == len(spans)
        local = fast._Scheduler(spool, helpers=0)
        for span in spans:
            local.add(*span)
        assert all(
            a[0].equals(b[0]) and a[1] == b[1] for a, b in zip(parts, local.results(), strict=True)
        )
    finally:
        spool.close()


def test_spool_of_a_killed_parse_is_swept(tmp_path, monkeypatch):
    """A spool left by a process that no longer exists is removed by the next parse; a live
    process's spool is not."""
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead = tmp_path / f"{fast.SPOOL_PREFIX}999999999-abc.json"
    live = tmp_path / f"{fast.SPOOL_PREFIX}{os.getpid()}-abc.json"
    dead.write_bytes(b"x")
    live.write_bytes(b"x")
    fast._sweep(str(tmp_path))
    assert not dead.exists() and live.exists()


def _mem(ts, args, **kw):
    return {
        "ph": "i",
        "cat": "cpu_instant_event",
        "s": "t",
        "name": "[memory]",
        "pid": 1,
        "tid": 1,
        "ts": ts,
        "args": args,
        **kw,
    }


MEM_ARGS = {
    "Device Type": 1,
    "Device Id": 0,
    "Addr": 4096,
    "Bytes": 1024,
    "Total Allocated": 5000,
    "Total Reserved": 8192,
    "Ev Idx": 3,
}


@pytest.mark.parametrize(
    "odd",
    [
        {},  # Kineto's own: the NDJSON reader
        {"Bytes": 1.5e3},  # a float: the typed decode's conversion (1500)
        {"Bytes": "2048"},  # a number as text
        {"Bytes": [1]},  # not a number: null
        None,  # args null: the instant is dropped by both paths
    ],
    ids=["kineto", "float", "string", "list", "null"],
)
@pytest.mark.parametrize("indent", [None, 2])
def test_memory_instants_identical_on_both_paths(odd, indent, tmp_path, monkeypatch):
    import json

    events = [
        {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 10, "dur": 5},
        _mem(11, MEM_ARGS),
        _mem(12, None if odd is None else {**MEM_ARGS, **odd, "Addr": 8192}),
        _mem(13, {**MEM_ARGS, "Bytes": -1024}),
    ]
    p = tmp_path / "m.json"
    p.write_text(json.dumps({"traceEvents": events}, indent=indent))
    monkeypatch.setattr(fast, "MIN_HELPER_BYTES", 0)
    fast_mem = load_trace(p).memory
    monkeypatch.setattr(fast, "decode", lambda data: None)
    monkeypatch.setattr(fast, "decode_path", lambda *a, **k: None)
    reference = load_trace(p).memory
    assert fast_mem.equals(reference), (fast_mem, reference)
    assert fast_mem.height == (2 if odd is None else 3)
