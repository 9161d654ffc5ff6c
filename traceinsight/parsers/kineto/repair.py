"""The reference path: the whole document decoded with orjson, and the repairs of damaged files
(truncated gzip or xz, stray quotes in names, a cut-off events array). Slower and larger than
:mod:`.stream`, and the definition of what the fast path must produce.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import orjson

from traceinsight import resources
from traceinsight.errors import InputError
from traceinsight.parsers.kineto.decode import (
    MEMORY_KEYS,
    Chunk,
    Parsed,
    memory_args_of,
    memory_frame,
    raw_frame,
    side_frame,
)
from traceinsight.parsers.source import (
    COMPRESSED_KINDS,
    Decompressed,
    padding_note,
    stream_cut_note,
)
from traceinsight.report.format import plural

# Memory the whole-document path takes per byte of JSON (orjson's dicts of the compact 10x
# trace: 2.9 GiB for 433 MB); an input it cannot hold is refused before it is read.
WHOLE_DOCUMENT_FACTOR = 8
_EMPTY: dict[str, Any] = {}
# How the notes of a cut-off document begin (parse_kineto records the trace as truncated).
TRUNCATED_NOTE = "the file is truncated"
STREAM_CUT_NOTES = tuple(stream_cut_note(k) for k in COMPRESSED_KINDS)


def whole_document(path: Path, max_bytes: int | None) -> tuple[bytes, str, list[str]]:
    """The document in memory, how its compressed stream ended early ("" if it did not, see
    :func:`~traceinsight.parsers.source.stream_cut_note`), and the padding note:
    whitespace padding is dropped as it streams, and the input is refused once it passes what
    the memory available can parse this way."""
    stream = Decompressed(
        path, max_bytes, squeeze=True, room=resources.available_bytes() // WHOLE_DOCUMENT_FACTOR
    )
    data = b"".join(stream)
    cut = stream_cut_note(stream.kind) if stream.truncated else ""
    return data, cut, [padding_note(stream.padding)] if stream.padding else []


def _decode(data: bytes, path: Path, cut: str) -> tuple[Any, list[str]]:
    """orjson first; then the repairs real traces need (bad UTF-8, quotes, NaN, truncation)."""
    warnings: list[str] = []
    try:
        return orjson.loads(data), warnings
    except orjson.JSONDecodeError as exc:
        first_error = str(exc)
    if "depth limit" in first_error:  # no repair applies; the salvage's retries would all fail too
        raise InputError(
            f"JSON nested deeper than 1024 levels, not a profiler trace ({first_error})", str(path)
        )
    if "UTF-8" in first_error or "surrogates" in first_error:
        data = data.decode("utf-8", "replace").encode("utf-8", "replace")
        warnings.append("invalid UTF-8 bytes in names were replaced")
        try:
            return orjson.loads(data), warnings
        except orjson.JSONDecodeError as exc:
            first_error = str(exc)
    if "64-bit" in first_error or "exceeds" in first_error:
        try:  # integers beyond 64 bits: the standard library reads them; they become missing later
            return json.loads(data, parse_constant=lambda _c: None), [
                *warnings,
                "integers beyond 64 bits were ignored",
            ]
        except (ValueError, RecursionError):
            pass
    repaired = _escape_stray_quotes(data)
    if repaired is not data:
        try:
            obj = orjson.loads(repaired)
            return obj, [
                *warnings,
                "unescaped quotes in event names were repaired (pytorch#146900)",
            ]
        except orjson.JSONDecodeError:
            data = repaired
    if cut:
        warnings.append(f"{cut}; analyzed the events before the cut")
    salvaged = _salvage(data)
    if salvaged is not None:
        obj, note = salvaged
        warnings.append(note)
        return obj, warnings
    if cut:
        raise InputError(f"{cut} and no complete event could be recovered", str(path))
    raise InputError(f"not valid JSON ({first_error})", str(path))


# Kineto writes `"name": "<value>", "<next key>"`; a name with a raw `"` inside (older writers did
# not escape it) breaks the document. Re-escape quotes between `"name": "` and the next known key.
_NAME_VALUE = re.compile(rb'("name": ")(.*?)(", "(?:pid|tid|ts|dur|cat|ph|args|id|s|bp)")')


def _escape_stray_quotes(data: bytes) -> bytes:
    def fix(m: re.Match[bytes]) -> bytes:
        inner = re.sub(rb'(?<!\\)"', rb'\\"', m.group(2))
        return m.group(1) + inner + m.group(3)

    out = _NAME_VALUE.sub(fix, data)
    return data if out == data else out


def _salvage(data: bytes) -> tuple[Any, str] | None:
    """Recover what a crashed or buggy writer left: bare NaN/Infinity, or a cut-off file."""
    text = data
    # Kineto never writes these, but other tools' Chrome traces do.
    fixed = re.sub(rb"(?<=[:\[,\s])(-?Infinity|NaN)(?=[,\]\}\s])", b"null", text)
    try:
        return orjson.loads(fixed), "non-standard NaN/Infinity values were read as missing"
    except orjson.JSONDecodeError:
        pass
    # A truncated file: cut after the last complete event of the traceEvents array and close it.
    start = fixed.find(b"[")
    if start < 0:
        return None
    for cut in _candidate_cuts(fixed):
        head = fixed[:cut]
        for tail in (b"]}", b"]"):
            try:
                obj = orjson.loads(head + tail)
            except orjson.JSONDecodeError:
                continue
            events = (
                obj
                if isinstance(obj, list)
                else obj.get("traceEvents")
                if isinstance(obj, dict)
                else None
            )
            if isinstance(events, list) and events:
                return obj, (
                    f"{TRUNCATED_NOTE} (damaged after byte {cut:,}); "
                    f"analyzed the {plural(len(events), 'complete event')} before the damage"
                )
    return None


def _candidate_cuts(data: bytes, tries: int = 64) -> list[int]:
    """Positions just after a '}' that could close the last complete event, latest first."""
    cuts: list[int] = []
    pos = len(data)
    while len(cuts) < tries:
        pos = data.rfind(b"}", 0, pos)
        if pos < 0:
            break
        cuts.append(pos + 1)
    return cuts


def _events_and_top(obj: Any, path: Path) -> tuple[list[Any], dict[str, Any], str]:
    if isinstance(obj, list):
        if obj and not any(type(e) is dict and "ph" in e for e in obj[:1000]):
            raise InputError(
                "not a Kineto trace (a JSON array without trace events; a memory timeline or other export?)",
                str(path),
            )
        return obj, {}, "2020 bare event array"
    if not isinstance(obj, dict):
        raise InputError("not a Kineto trace (JSON is not an object or array of events)", str(path))
    events = obj.get("traceEvents")
    if events is None:
        if "nodes" in obj and "schema" in obj:
            raise InputError(
                "this is a PyTorch Execution Trace, not a Kineto profiler trace; "
                "pass the matching *.pt.trace.json from torch.profiler",
                str(path),
            )
        if "workload_graph" in obj:
            raise InputError(
                "this is a Chakra execution trace (its workload_graph), not a profiler trace; "
                "pass the *.pt.trace.json torch.profiler wrote",
                str(path),
            )
        raise InputError("not a Kineto trace (no 'traceEvents' array)", str(path))
    if not isinstance(events, list):
        raise InputError("not a Kineto trace ('traceEvents' is not an array)", str(path))
    return events, obj, ""


def _frame_from_dicts(events: list[Any]) -> Chunk:
    """The typed decode's chunk (see :func:`..decode._frame`) from decoded dicts."""
    xs = [e for e in events if type(e) is dict and e.get("ph") == "X"]
    args = [a if type(a) is dict else _EMPTY for a in (e.get("args") for e in xs)]
    df = raw_frame(
        [e.get("cat") for e in xs],
        [e.get("name") for e in xs],
        [e.get("ts") for e in xs],
        [e.get("dur") for e in xs],
        [e.get("pid") for e in xs],
        [e.get("tid") for e in xs],
        [a.get("device") for a in args],
        [a.get("stream") for a in args],
        [a.get("correlation") for a in args],
        [a.get("External id", a.get("external id")) for a in args],
        [a.get("bytes") for a in args],
    )
    mems = [
        e
        for e in events
        if type(e) is dict
        and e.get("ph") == "i"
        and e.get("name") == "[memory]"
        and type(e.get("args")) is dict
    ]
    ma = [e["args"] for e in mems]
    memory = memory_frame(
        [e.get("ts") for e in mems],
        [e.get("pid") for e in mems],
        [e.get("tid") for e in mems],
        memory_args_of({k: [a.get(k) for a in ma] for k in MEMORY_KEYS.values()}),
    )
    return Chunk(df, len(events) - len(xs) - len(mems), side_frame(_side_groups(xs, args)), memory)


def _axis(v: Any, i: int) -> Any:
    return v[i] if type(v) is list and len(v) > i else None


def _side_groups(xs: list[Any], args: list[Any]) -> list[dict[str, list[Any]]]:
    """decode._side_groups over dicts: kernels' launch configuration, ops' shapes."""
    kernels = [
        i
        for i, (e, a) in enumerate(zip(xs, args, strict=True))
        if e.get("cat") == "kernel" and a.get("grid") is not None
    ]
    ka = [args[i] for i in kernels]
    ops = [
        i
        for i, (e, a) in enumerate(zip(xs, args, strict=True))
        if e.get("cat") == "cpu_op"
        and (
            a.get("Input Dims") is not None
            or a.get("flops") is not None
            or type(a.get("In msg nelems")) in (int, float)
        )
    ]
    oa = [args[i] for i in ops]
    dims = {
        f"{k}_{axis}": [_axis(a.get(k), i) for a in ka]
        for k in ("grid", "block")
        for i, axis in enumerate("xyz")
    }
    return [
        {
            "row": kernels,
            **dims,
            **{c: [a.get(k) for a in ka] for c, k in _KERNEL_KEYS.items()},
        },
        {
            "row": ops,
            **{c: [a.get(k) for a in oa] for c, k in _OP_KEYS.items()},
        },
    ]


# side-row column <- the Kineto args key (see decode._Args)
_OP_KEYS = {
    "input_dims": "Input Dims",
    "input_types": "Input type",
    "concrete_inputs": "Concrete Inputs",
    "flops": "flops",
    "msg_nelems": "In msg nelems",
    "msg_dtype": "dtype",
    "group_size": "Group size",
}
_KERNEL_KEYS = {
    "registers_per_thread": "registers per thread",
    "shared_memory_bytes": "shared memory",
    "occupancy_pct": "est. achieved occupancy %",
    "blocks_per_sm": "blocks per SM",
    "warps_per_sm": "warps per SM",
    "collective": "Collective name",
    "msg_nelems": "In msg nelems",
    "msg_dtype": "dtype",
    "group_size": "Group size",
}


def robust(data: bytes, path: Path, cut: str) -> Parsed:
    """orjson into dicts, with every repair; the path for damaged or unusual files (``cut``:
    how the compressed stream ended early, "" if it did not)."""
    obj, warnings = _decode(data, path, cut)
    events, top, array_era = _events_and_top(obj, path)
    del obj
    chunk = _frame_from_dicts(events)
    return Parsed(chunk.frame, top, array_era, chunk.n_other, warnings, chunk.side, chunk.memory)
