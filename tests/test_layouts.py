"""The streamed fast path cuts the events array in any JSON layout: compact single
line, one event per line, indented, CRLF; and cuts that fall inside strings or nested values
are mended. In every case its analysis equals the reference (orjson) path's.

The stream module's sizes (CHUNK_BYTES, SLAB_BYTES, the source's block) are patched on purpose:
they are fixed policy with no public knob, and a cut at every comma (inside strings, nested
values, across slabs) is reached only with them shrunk; what is compared is the public result."""

from __future__ import annotations

import gzip
import json

import orjson
import pytest

import traceinsight.parsers.kineto.stream as fast
from traceinsight.parsers import source
from traceinsight.parsers.source import read_bytes

from .conftest import CORPUS, H200, SHARED, TINY
from .test_fast_path import _doc, _trace

CASES = [
    H200 / "healthy_bf16.pt.trace.json.xz",
    CORPUS / "libkineto_test_after_fix_trace.json",
    TINY / "step_dataloader_sync.json",
    H200 / "memory" / "mem_leak.pt.trace.json.xz",  # memory instants, shapes (op_args)
]
# Real traces that are already compact (json.dump, trace filters) or indented by 4.
SHARED_CASES = [
    SHARED / "hta" / "timeline_analysis" / "sampled_rank-0.json.gz",
    SHARED / "hta" / "trace_compare" / "base" / "base.json.gz",
    SHARED / "tracelens" / "inference_sglang_decode_sglang_Qwen3-8B_decode.json.gz",
    SHARED / "hta" / "call_stack" / "backward_thread.json",
]


def relayout(data: bytes, layout: str) -> bytes:
    doc = orjson.loads(data)
    if layout == "compact":  # no whitespace at all
        return orjson.dumps(doc)
    if layout == "spaced":  # json.dump's defaults: ", " and ": ", non-ASCII escaped
        return json.dumps(doc).encode()
    text = orjson.dumps(doc, option=orjson.OPT_INDENT_2)
    return text.replace(b"\n", b"\r\n") if layout == "crlf" else text


def _write(tmp_path, name: str, data: bytes):
    p = tmp_path / f"{name}.json.gz"
    p.write_bytes(gzip.compress(data, 1))
    return p


# Each case in two of the four layouts, each layout on two cases (the layouts differ in
# whitespace alone; all 16 pairs cost 7.5 s of the suite's time, session 54).
LAYOUTS = ("compact", "spaced", "indent", "crlf")
CASE_LAYOUTS = [(path, LAYOUTS[(i + j) % 4]) for i, path in enumerate(CASES) for j in (0, 2)]


@pytest.mark.parametrize(
    ("path", "layout"),
    CASE_LAYOUTS,
    ids=[f"{p.name.split('.')[0]}-{lay}" for p, lay in CASE_LAYOUTS],
)
def test_layout_identical_to_reference(path, layout, tmp_path, monkeypatch):
    p = _write(tmp_path, layout, relayout(read_bytes(path)[0], layout))
    assert fast.decode_path(p, None) is not None  # streamed, not the whole-document fallback
    # compared as parsed traces, what the analysis is a function of (test_fast_path holds the
    # two paths' analyses equal on these files)
    reference = _trace(p, monkeypatch, use_fast=False)
    assert _trace(p, monkeypatch, use_fast=True) == reference
    # small chunks: dozens of cuts, all found without newlines
    assert _trace(p, monkeypatch, use_fast=True, chunk=64 * 1024) == reference


@pytest.mark.parametrize("path", SHARED_CASES, ids=lambda p: p.name.split(".")[0])
def test_real_compact_and_indented_traces(path, monkeypatch):
    if not path.exists():
        pytest.skip(f"corpus not present at {SHARED}")
    assert fast.decode_path(path, None) is not None
    reference = _trace(path, monkeypatch, use_fast=False)
    assert _trace(path, monkeypatch, use_fast=True, chunk=16 * 1024) == reference


def _spans(monkeypatch, path) -> int:
    """How many spans the streamed parse cut ``path`` into (and that it took the streamed path)."""
    seen = []
    add = fast._Scheduler.add
    monkeypatch.setattr(
        fast._Scheduler, "add", lambda self, a, b: (seen.append((a, b)), add(self, a, b))[1]
    )
    assert fast.decode_path(path, None) is not None
    monkeypatch.undo()
    return len(seen)


# Strings and nested values holding what a cut looks for: '},{', escaped quotes, backslashes.
TRAPS = [
    'x},{"ph": "X", "name": "y',
    "a\\",  # a backslash right before the closing quote
    '\\"},{\\"',
    "}, {",
    "k]}],{[",
]


def _trap_doc() -> dict:
    events = []
    for i in range(60):
        name = TRAPS[i % len(TRAPS)] + str(i)
        args = {"External id": i, "correlation": i, "list": [{"a": name}, {"b": "}, {"}]}
        events.append(
            {
                "ph": "X",
                "cat": "cpu_op",
                "name": name,
                "pid": 1,
                "tid": 1,
                "ts": 10 * i,
                "dur": 5,
                "args": args,
            }
        )
        events.append(
            {
                "ph": "X",
                "cat": "kernel",
                "name": name,
                "pid": 0,
                "tid": 7,
                "ts": 10 * i + 2,
                "dur": 2,
                "args": {"device": 0, "stream": 7, "correlation": i},
            }
        )
    return {
        "schemaVersion": 1,
        "traceEvents": events,
        "deviceProperties": [{"id": 0, "name": "G]"}, {"id": 1}],
    }


@pytest.mark.parametrize("layout", ["compact", "spaced", "indent", "crlf"])
def test_cuts_inside_strings_and_nested_values_are_mended(layout, tmp_path, monkeypatch):
    """A cut at every candidate comma: those inside strings, nested objects and the tail fail
    to decode and are joined with the next span; the result is still the reference's."""
    p = _write(tmp_path, layout, relayout(orjson.dumps(_trap_doc()), layout))
    monkeypatch.setattr(fast, "CHUNK_BYTES", 1)
    assert _spans(monkeypatch, p) > 100
    reference = _doc(p, monkeypatch, use_fast=False)
    assert _doc(p, monkeypatch, use_fast=True, chunk=1) == reference
    assert _doc(p, monkeypatch, use_fast=True, chunk=1, streamed=False) == reference


def test_too_many_false_cuts_fall_back_with_the_same_result(tmp_path, monkeypatch):
    """An event whose strings hold more candidate commas than MAX_JOIN joins: the streamed path
    declines and the reference path gives the analysis."""
    doc = _trap_doc()
    doc["traceEvents"][0]["name"] = "},{" * (fast.MAX_JOIN + 3)
    p = _write(tmp_path, "many", orjson.dumps(doc))
    monkeypatch.setattr(fast, "CHUNK_BYTES", 1)
    assert fast.decode_path(p, None) is None
    monkeypatch.undo()
    assert _doc(p, monkeypatch, use_fast=True, chunk=1) == _doc(p, monkeypatch, use_fast=False)


def test_bare_array_and_leading_blanks_in_any_layout(tmp_path, monkeypatch):
    """The 2020 bare event array, compact; and a document after 100 KB of blank lines."""
    events = orjson.loads(read_bytes(TINY / "step_dataloader_sync.json")[0])["traceEvents"]
    bare = _write(tmp_path, "bare", orjson.dumps(events))
    padded = _write(
        tmp_path,
        "padded",
        b"\r\n" * 50_000 + relayout(orjson.dumps({"traceEvents": events}), "crlf"),
    )
    for p in (bare, padded):
        assert fast.decode_path(p, None) is not None, p
        assert _doc(p, monkeypatch, use_fast=True, chunk=4096) == _doc(
            p, monkeypatch, use_fast=False
        )


@pytest.mark.skipif(not fast.native_scanner(), reason="helper threads need the native scanner")
@pytest.mark.parametrize("layout", ["compact", "indent", "crlf"])
def test_helper_threads_over_small_slabs(layout, tmp_path, monkeypatch):
    """Helper threads reading spans from small reused slabs: every block moves the uncut tail to
    another slab, spans cut inside strings are mended across slabs, and the analysis is still
    the reference's. The slabs are all given back."""
    p = _write(tmp_path, layout, relayout(orjson.dumps(_trap_doc()), layout))
    reference = _doc(p, monkeypatch, use_fast=False)
    closed, close = [], fast._Slabs.close
    threaded, view = [], fast._decode_view
    for chunk in (1, 300, 2000):
        # _doc undoes every patch when it returns
        monkeypatch.setattr(fast._Slabs, "close", lambda self: (closed.append(self), close(self)))
        monkeypatch.setattr(fast, "_decode_view", lambda part: (threaded.append(1), view(part))[1])
        monkeypatch.setattr(fast, "decode", lambda data: None)  # streamed or nothing
        monkeypatch.setattr(fast, "SLAB_BYTES", 2 * chunk)
        monkeypatch.setattr(source, "_BLOCK_MAX", 1500)  # many blocks from a small file
        monkeypatch.setattr(fast, "CHUNK_BYTES", chunk)
        assert fast.decode_path(p, None, helpers=2) is not None  # streamed, not a fallback
        assert _doc(p, monkeypatch, use_fast=True, chunk=chunk, helpers=2) == reference
    assert len(closed) == 6 and all(s.slabs and s.slabs[0].mm.closed for s in closed)
    assert len(threaded) > 100  # spans decoded by the helper threads


@pytest.mark.skipif(not fast.native_scanner(), reason="helper threads need the native scanner")
def test_slabs_by_hand():
    """Spans held in their slab; the tail since the last cut moves with a block that does not
    fit; released spans give their slab back for reuse; reads across slabs join them."""
    slabs = fast._Slabs()
    try:
        size = fast.SLAB_BYTES
        first = b"a" * (size - 10)
        slabs.write(first)
        slabs.cut([(0, size - 20)])  # a span ends 20 bytes before the slab's end
        slabs.write(b"b" * 30)  # does not fit: the 10 uncut bytes move along with it
        assert len(slabs.slabs) == 2 and slabs.base == size - 20 and slabs.len == size + 20
        assert slabs.bytes(size - 25, size - 15) == b"a" * 10  # across the two slabs
        assert slabs.rfind(b"a", 0, slabs.len) == size - 11
        old = slabs.slabs[0].mm
        slabs.release(0, size - 20)
        assert slabs.pool == [old] and len(slabs.slabs) == 1
        slabs.cut([(size - 19, size + 20)])
        slabs.write(b"c" * size)  # the second slab is full: the first one is reused
        assert slabs.mm is old and not slabs.pool
    finally:
        slabs.close()
