"""The native scanner (traceinsight/_native/kscan.c) against the typed msgspec decode it
replaces: on every input it gives the same chunk (frame, side rows, memory rows, other-event
count) or declines, and never crashes. Run on real traces in every layout, on hand-made edge
cases and on generated and mutated event lists."""

from __future__ import annotations

import json
import random

import msgspec
import orjson
import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from polars.testing import assert_frame_equal

from traceinsight.parsers.kineto import decode as D
from traceinsight.parsers.source import read_bytes

from .conftest import CORPUS, H200, SHARED, TINY, raw_json, require_native
from .test_layouts import relayout

require_native(D._kscan, "traceinsight._kscan (the native scanner)")


def _elements(data: bytes) -> bytes:
    """The events array's elements, without its brackets (what the stream cuts into spans)."""
    top = D.TOP.decode(data) if data.lstrip()[:1] == b"{" else None
    raw = (bytes(top.traceEvents) if top is not None else data).strip()
    assert raw[:1] == b"[" and raw[-1:] == b"]"
    return raw[1:-1]


def _same(native: D.Chunk, typed: D.Chunk) -> None:
    assert native.n_other == typed.n_other
    for name in ("frame", "side", "memory"):
        assert_frame_equal(getattr(native, name), getattr(typed, name), check_exact=True)


def check(elements: bytes, *, must_scan: bool = False) -> D.Chunk | None:
    """The native chunk equals the typed one, or the scanner declined (where it may)."""
    typed = D.typed_chunk(elements)
    native = D._native_chunk(elements)
    if must_scan:
        assert native is not None, f"declined at byte {D._kscan.declined_at()}"
    if native is not None:
        assert typed is not None, "the native scanner accepted what msgspec rejects"
        _same(native, typed)
    return native


REAL = [
    H200 / "healthy_bf16.pt.trace.json.xz",
    H200 / "memory" / "mem_leak.pt.trace.json.xz",  # [memory] instants, shapes
    H200 / "ddp_straggler" / "rank1.pt.trace.json.xz",  # NCCL kernels: collective names
    CORPUS / "plugin_2021-01_resnet50_nw0_worker0.pt.trace.json.xz",  # bare array, string tids
    CORPUS / "libkineto_test_after_fix_trace.json",
    TINY / "step_dataloader_sync.json",
]


# Each trace as written and in two of the four other layouts, each layout on three of the
# traces: whitespace is the layouts' only difference and no trace's feature depends on it (all
# 30 pairs cost 16 s of the suite's time, session 54).
RELAYOUTS = ("compact", "spaced", "indent", "crlf")
REAL_LAYOUTS = [
    (path, layout)
    for i, path in enumerate(REAL)
    for layout in ("lines", RELAYOUTS[i % 4], RELAYOUTS[(i + 1) % 4])
]


@pytest.mark.parametrize(
    ("path", "layout"),
    REAL_LAYOUTS,
    ids=[f"{p.name.split('.')[0]}-{lay}" for p, lay in REAL_LAYOUTS],
)
def test_real_traces_scan_to_the_typed_chunk(path, layout):
    data = read_bytes(path)[0]
    if layout != "lines":
        data = relayout(data, layout)
    check(_elements(data), must_scan=True)


def test_whole_shared_corpus():
    """Every Kineto trace of the shared corpus: the same chunk or a decline (ROCm's string
    byte counts decline; everything else scans)."""
    if not SHARED.exists():
        pytest.skip(f"{SHARED} is absent: the shared corpus is not here")
    scanned = declined = 0
    for path in sorted(SHARED.rglob("*.json*")):
        data = read_bytes(path)[0]
        try:
            elements = _elements(data)
        except (AssertionError, msgspec.DecodeError):  # not an events array (execution traces)
            continue
        if check(elements) is None:
            declined += 1
        else:
            scanned += 1
    assert scanned >= 40 and declined <= 6, (scanned, declined)


def _events(*events: object, sep: bytes = b", ") -> bytes:
    return sep.join(e if isinstance(e, bytes) else orjson.dumps(e) for e in events)


BASE = {"ph": "X", "cat": "kernel", "name": "k", "pid": 1, "tid": 7, "ts": 1.5, "dur": 2}


@pytest.mark.parametrize(
    "event",
    [
        BASE,
        {**BASE, "pid": "Spans", "tid": "stream 7 "},  # string ids: their trailing number
        {**BASE, "tid": "-12"},
        {**BASE, "tid": "99999999999999999999"},  # beyond int64: null, as polars casts it
        {**BASE, "ts": 1712195495406752.797, "dur": 0.001},
        {**BASE, "ts": 12345678901234567890.5},  # strtod's path
        {**BASE, "ts": -0.0, "dur": 1e-3},
        {**BASE, "ts": 5, "dur": None},
        {**BASE, "args": None},
        {**BASE, "args": {"grid": [1, 2, 3], "block": [128, 1, 1], "registers per thread": 32}},
        {**BASE, "args": {"grid": None, "est. achieved occupancy %": 12.5}},
        {**BASE, "args": {"External id": None, "external id": 9, "correlation": 3}},
        {**BASE, "args": {"Collective name": "allreduce", "grid": [1, 1, 1]}},
        {**BASE, "cat": "cpu_op", "args": {"Input Dims": [[2, 3], []], "Input type": ["float"]}},
        {**BASE, "cat": "cpu_op", "args": {"flops": 1024, "Concrete Inputs": ["", "1"]}},
        {**BASE, "name": 'void f<"a">(\\x) \u00e9\u4e2d\U0001f600', "cat": None},
        {"ph": "i", "name": "[memory]", "pid": 1, "tid": 2, "ts": 3.0, "args": {"Bytes": -512}},
        {"ph": "i", "name": "[memory]", "pid": 1, "tid": 2, "ts": 3.0, "args": {}},
        {"ph": "i", "name": "[memory]", "pid": 1, "tid": 2, "ts": 3.0},  # no args: another event
        {"ph": "i", "name": "mark", "args": [1, {"a": [None, True, False]}]},
        {"ph": "f", "id": 1, "bp": "e", "args": {"x": {"y": [1e300, -2]}}},
        {"ph": "M", "name": "process_name", "args": {"name": "python3"}},
    ],
)
def test_edge_cases_scan_to_the_typed_chunk(event):
    for sep in (b",", b", ", b",\n  ", b"\r\n,\r\n"):
        check(_events(event, BASE, sep=sep), must_scan=True)


@pytest.mark.parametrize(
    "ts",
    [
        b"1669783687389245.0",  # json.dump's whole float: 17 digits, exact once the zero goes
        b"1669783687389245.000",
        b"9007199254740993.0",  # 2**53 + 1: not a double, rounded (strtod's path)
        b"123.4500",
        b"0.10",
        b"-0.0",
        b"0.000",
        b"1234567890123456789.0",  # 19 digits before the zero: still past 2**53
        b"12345678901234567890.0",  # 20 digits: the mantissa holds 19
        b"1.0e3",
    ],
)
def test_numbers_as_written_scan_to_the_typed_values(ts: bytes) -> None:
    event = b'{"ph": "X", "cat": "kernel", "name": "k", "pid": 1, "tid": 7, "ts": %s, "dur": %s}'
    check(event % (ts, ts), must_scan=True)


@pytest.mark.parametrize(
    "text",
    [
        b'{"ph": "X", "p\\u0069d": 1}',  # an escaped key might spell a known one
        b'{"ph": "X", "pid": 1, "pid": 2}',  # a duplicate key
        b'{"ph": "X", "pid": 1.5}',  # a float id
        b'{"ph": "X", "pid": 9223372036854775808}',  # beyond int64 (it once broke the typed path)
        b'{"ph": "X", "args": {"bytes": "128"}}',  # ROCm's string byte count
        b'{"ph": "X", "name": 5}',
        b'{"ph": "X", "args": [1]}',
        b'{"ph": "Q"}',  # an unknown phase
        b'{"name": "no phase"}',
        b'{"ph": "X", "ts": 1e999}',
        b'{"ph": "X", "ts": NaN}',
        b'{"ph": "X", "ts": 01}',
        b'{"ph": "X", "name": "\xff"}',  # invalid UTF-8
        b'{"ph": "X", "name": "\xed\xa0\x80"}',  # an encoded surrogate
        b'{"ph": "X", "name": "\\ud800"}',  # a lone surrogate escape
        b'{"ph": "X", "name": "a\tb"}',  # a raw control character
        b'{"ph": "X", "args": {"x": ' + b"[" * 100 + b"]" * 100 + b"}}",  # deep nesting
        b'{"ph": "X"},',  # a trailing comma
        b'{"ph": "X"} {"ph": "X"}',  # no comma
        b'{"ph": "X", "name": "unterminated',
        b"[1]",
    ],
)
def test_what_it_declines_the_typed_path_decides(text):
    assert check(text) is None
    typed, chosen = D.typed_chunk(text), D.decode_chunk(text)  # the typed path takes over
    assert (typed is None) == (chosen is None)
    if typed is not None:
        _same(chosen, typed)


def test_empty_span():
    chunk = check(b"  \n ", must_scan=True)
    assert chunk.frame.height == 0 and chunk.n_other == 0


# Generated events: every key the scanner reads, with values of every JSON type.
_scalar = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8)
    | st.sampled_from(["stream 7", "Spans", "kernel", "cpu_op", "[memory]", "12", " 3 "])
)
_value = st.recursive(
    _scalar,
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=4), c, max_size=3),
    max_leaves=6,
)
_ints = st.integers(min_value=-(2**63), max_value=2**63 - 1)
_arg_keys = list(
    {
        *("device", "stream", "correlation", "External id", "external id", "bytes"),
        *("Input Dims", "Input type", "Concrete Inputs", "flops", "grid", "block"),
        *("registers per thread", "shared memory", "est. achieved occupancy %"),
        *("blocks per SM", "warps per SM", "Collective name"),
        *("Bytes", "Total Allocated", "Total Reserved", "Addr", "Device Type", "Device Id"),
        "other",
    }
)
_args = st.dictionaries(st.sampled_from(_arg_keys), _ints | _value, max_size=6)
_event = st.fixed_dictionaries(
    {"ph": st.sampled_from(["X", "X", "X", "i", "f", "s", "M", "C"])},
    optional={
        "cat": st.sampled_from(["kernel", "cpu_op", "cuda_runtime"]) | _value,
        "name": st.sampled_from(["[memory]", "aten::mm", "k"]) | _value,
        "pid": _ints | _value,
        "tid": _ints | _value,
        "ts": st.floats(0, 1e16) | _ints | _value,
        "dur": st.floats(0, 1e6) | _ints | _value,
        "args": _args | st.none() | _value,
        "id": _value,
    },
)


def _dump(events: list[dict], indent: bool, ascii_only: bool) -> bytes:
    return json.dumps(events, indent=2 if indent else None, ensure_ascii=ascii_only).encode()[1:-1]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_event, max_size=8), st.booleans(), st.booleans())
def test_generated_events(events, indent, ascii_only):
    check(_dump(events, indent, ascii_only))


@settings(max_examples=300, deadline=None)
@given(st.randoms(use_true_random=False), st.integers(1, 8))
def test_mutated_bytes_never_crash(rnd: random.Random, flips: int):
    """Random bytes of a real span overwritten: the same chunk, or a decline."""
    data = bytearray(_SAMPLE)
    for _ in range(flips):
        data[rnd.randrange(len(data))] = rnd.choice(b'{}[]",:\\ 0123456789.-eEtfnu\xff\x80X')
    check(bytes(data))


_SAMPLE = _elements(raw_json(H200 / "memory" / "mem_leak.pt.trace.json.xz"))[:6000]
_SAMPLE = _SAMPLE[: _SAMPLE.rfind(b"},") + 1]


def test_memory_rows_and_side_rows_are_read():
    """A hand-counted span: 2 X events (one kernel with a grid, one op with shapes), one
    allocation and one free, one flow."""
    span = _events(
        {**BASE, "args": {"grid": [4, 1, 1], "block": [256, 1, 1], "shared memory": 1024}},
        {**BASE, "cat": "cpu_op", "name": "aten::mm", "args": {"Input Dims": [[8, 8], [8, 8]]}},
        {"ph": "i", "name": "[memory]", "pid": 1, "tid": 1, "ts": 10, "args": {"Bytes": 4096}},
        {"ph": "i", "name": "[memory]", "pid": 1, "tid": 1, "ts": 11, "args": {"Bytes": -4096}},
        {"ph": "s", "id": 1, "pid": 1, "tid": 1, "ts": 1},
    )
    chunk = check(span, must_scan=True)
    assert chunk.frame.height == 2 and chunk.n_other == 1
    assert chunk.memory.get_column("mem_bytes").to_list() == [4096, -4096]
    side = chunk.side
    assert side.get_column("row").to_list() == [0, 1]
    assert side.get_column("grid_x").to_list() == [4, None]
    assert side.get_column("shared_memory_bytes").to_list() == [1024, None]
    assert side.get_column("input_dims").to_list() == [None, "[[8,8],[8,8]]"]
    assert chunk.frame.schema == pl.Schema(
        {
            "cat": pl.String,
            "name": pl.String,
            "ts": pl.Float64,
            "dur": pl.Float64,
            **dict.fromkeys(
                ("pid", "tid", "a_device", "a_stream", "correlation", "external_id", "bytes"),
                pl.Int64,
            ),
        }
    )


def test_collective_messages_scan_to_the_typed_chunk():
    from .test_side_tables import COMMS

    chunk = check(_elements(json.dumps(COMMS).encode()), must_scan=True)
    assert chunk is not None
    assert chunk.side.get_column("msg_nelems").drop_nulls().to_list() == [2873320, 2873320]
