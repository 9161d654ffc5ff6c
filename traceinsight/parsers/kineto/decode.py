"""A span of Kineto events -> polars columns (:class:`Chunk`), two ways with one result.

The native scanner (``traceinsight._kscan``, traceinsight/_native/kscan.c) goes first where it is
built: one pass over the bytes writes the columns as Arrow arrays (:func:`_native_chunk`). Where it
declines, the typed msgspec decode decides (:func:`typed_chunk`): only the fields declared below
are read (an event's grid, shapes and stacks are skipped without being allocated), about 2x faster
than dicts with orjson; the decoded structs become polars columns at once. Anything unexpected
(bad types, NaN, invalid UTF-8) returns None: the caller falls back to :mod:`.repair`.
"""

from __future__ import annotations

import io
from typing import Any, NamedTuple, Union

import msgspec
import polars as pl

from traceinsight.model.schema import KERNEL_ARGS_SCHEMA, OP_ARGS_SCHEMA
from traceinsight.native import ArrowTable
from traceinsight.native import kscan as _kscan  # None: not built, or TRACEINSIGHT_NO_NATIVE=1

_NO_RAW = msgspec.Raw(b"")  # an absent JSON-text field (msgspec has no Raw | None)


class _Args(msgspec.Struct, gc=False):  # no GC tracking: millions of acyclic objects
    device: Any = None
    stream: Any = None
    correlation: Any = None
    ext: Any = msgspec.field(default=None, name="External id")
    ext_lower: Any = msgspec.field(default=None, name="external id")
    nbytes: Any = msgspec.field(default=None, name="bytes")
    # record_shapes / with_flops (cpu ops) and launch configuration (kernels): kept as JSON text
    # or numbers for the side tables (see :data:`RICH_COLUMNS`); absent on most events.
    input_dims: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Input Dims")
    input_types: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Input type")
    concrete: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Concrete Inputs")
    flops: Any = None
    # [x, y, z] as JSON text: decoded lists would cost 60% more decode time (GC-tracked)
    grid: msgspec.Raw = _NO_RAW
    block: msgspec.Raw = _NO_RAW
    registers: Any = msgspec.field(default=None, name="registers per thread")
    shared_memory: Any = msgspec.field(default=None, name="shared memory")
    occupancy: Any = msgspec.field(default=None, name="est. achieved occupancy %")
    blocks_per_sm: Any = msgspec.field(default=None, name="blocks per SM")
    warps_per_sm: Any = msgspec.field(default=None, name="warps per SM")
    collective: Any = msgspec.field(default=None, name="Collective name")
    msg_nelems: Any = msgspec.field(default=None, name="In msg nelems")
    msg_dtype: Any = msgspec.field(default=None, name="dtype")
    group_size: Any = msgspec.field(default=None, name="Group size")


class _MemArgs(msgspec.Struct, gc=False):
    """A ``[memory]`` instant's args (profile_memory=True): an allocation (Bytes > 0) or a free."""

    nbytes: Any = msgspec.field(default=None, name="Bytes")
    allocated: Any = msgspec.field(default=None, name="Total Allocated")
    reserved: Any = msgspec.field(default=None, name="Total Reserved")
    addr: Any = msgspec.field(default=None, name="Addr")
    device_type: Any = msgspec.field(default=None, name="Device Type")
    device_id: Any = msgspec.field(default=None, name="Device Id")


class _Instant(msgspec.Struct, gc=False, tag_field="ph", tag="i"):
    name: Any = None
    pid: Any = None
    tid: Any = None
    ts: Any = None
    # JSON text: a ``[memory]`` instant's args become columns in polars' reader at once (half
    # the decode time of structs: profile_memory traces hold millions of them)
    args: msgspec.Raw = _NO_RAW


class _Event(msgspec.Struct, gc=False, tag_field="ph", tag="X"):
    """A complete ("X") event: the only phase with a duration."""

    cat: Any = None
    name: Any = None
    pid: Any = None
    tid: Any = None
    ts: Any = None
    dur: Any = None
    args: _Args | None = None


# Every other Chrome trace phase decodes to an empty struct: its fields are skipped without
# allocating (25% less decode time on a kineto trace, where flows are ~40% of the events). An
# unknown phase fails validation and the robust path takes over.
_OTHER = tuple(
    msgspec.defstruct(f"_Phase{ord(p)}", [], tag_field="ph", tag=p, gc=False)
    for p in "BEICbnestfPONDMVvRc()"
)


class _Top(msgspec.Struct):
    traceEvents: msgspec.Raw = msgspec.field(default_factory=lambda: msgspec.Raw(b""))
    schemaVersion: Any = None
    deviceProperties: Any = None
    computeProperties: Any = None
    distributedInfo: Any = None
    baseTimeNanoseconds: Any = None
    cuda_runtime_version: Any = None
    cuda_driver_version: Any = None
    hip_runtime_version: Any = None
    cupti_version: Any = None
    # traceinsight.capture's own: the un-profiled step it measured before recording
    traceinsight: Any = None
    # libkineto's collected log lines by level (its LoggerCollector): dropped records, a
    # collection CUPTI stopped early
    WARNING: Any = None
    ERROR: Any = None


class _EventTime(msgspec.Struct, gc=False):
    """Only what exact timestamps need: ts/dur kept as their JSON text."""

    ph: Any = None
    ts: msgspec.Raw = msgspec.field(default_factory=lambda: msgspec.Raw(b""))
    dur: msgspec.Raw = msgspec.field(default_factory=lambda: msgspec.Raw(b""))


TOP = msgspec.json.Decoder(_Top)
_MEMORY_ARG = msgspec.json.Decoder(_MemArgs | None)
_MEM_FIELDS = {f.name: f.encode_name for f in msgspec.structs.fields(_MemArgs)}
_TIMES = msgspec.json.Decoder(list[_EventTime])
_EVENTS = msgspec.json.Decoder(list[Union[(_Event, _Instant, *_OTHER)]])  # noqa: UP007 - a union built at runtime
_EMPTY_ARGS = _Args()


def _series(values: list[Any]) -> pl.Series:
    """A column from Python values of unknown, possibly hostile types: numbers and strings are
    kept, anything else (lists, dicts, out-of-range ints) becomes null."""
    try:
        s = pl.Series(values, strict=False)
        if s.dtype.is_numeric() or s.dtype in (pl.String, pl.Null, pl.Boolean):
            return s
    except (OverflowError, TypeError, ValueError, pl.exceptions.PolarsError):
        pass
    clean = [
        v
        if (type(v) is float or type(v) is str or (type(v) is int and -(2**63) <= v < 2**63))
        else None
        for v in values
    ]
    return pl.Series(clean, strict=False)


def _to_int_ids(values: list[Any]) -> pl.Series:
    """pid/tid as int64: ints stay, strings like 'stream 7' give their number, others null.

    Ints and strings are converted separately: a mixed list sends polars down a slow path.
    """
    try:  # the common case, all ints: one strict conversion
        return pl.Series(values, dtype=pl.Int64)
    except (TypeError, OverflowError, ValueError, pl.exceptions.PolarsError):
        pass
    ints = [v if v.__class__ is int else None for v in values]
    try:
        out = pl.Series(ints, dtype=pl.Int64)
    except (OverflowError, TypeError):  # an integer beyond 64 bits somewhere: drop those
        out = pl.Series(
            [v if v is not None and -(2**63) <= v < 2**63 else None for v in ints], dtype=pl.Int64
        )
    if out.null_count():
        strs = [v if type(v) is str else None for v in values]
        parsed = (
            pl.Series(strs, dtype=pl.String)
            .str.extract(r"(-?\d+)\s*$", 1)
            .cast(pl.Int64, strict=False)
        )
        out = out.fill_null(parsed)
    return out


def _num(values: list[Any], dtype: pl.DataType) -> pl.Series:
    s = _series(values)
    if s.dtype == pl.String:  # numbers written as strings by some tools
        s = s.str.strip_chars().cast(pl.Float64, strict=False)
    return s.cast(dtype, strict=False)


def _text(values: list[Any]) -> pl.Series:
    s = _series(values)
    return s.cast(pl.String, strict=False) if s.dtype != pl.String else s


# The side rows of a chunk, beside its raw frame: the X events that carry shapes, FLOPs or a
# launch configuration (``row``: their row in the raw frame), a few per cent of the events; and
# its ``[memory]`` instants, their own narrow frame. Neither widens the raw frame. The parser
# turns them into the side tables (Trace.op_args, .kernel_args, .memory).
_LAUNCH = (
    "grid_x",
    "grid_y",
    "grid_z",
    "block_x",
    "block_y",
    "block_z",
    "registers_per_thread",
    "shared_memory_bytes",
)
SIDE_COLUMNS: dict[str, pl.DataType] = {
    "row": pl.Int64(),
    **{c: OP_ARGS_SCHEMA[c] for c in ("input_dims", "input_types", "concrete_inputs", "flops")},
    **{c: KERNEL_ARGS_SCHEMA[c] for c in _LAUNCH},
    "occupancy_pct": pl.Float64(),  # Kineto's percent: the parser makes it a ratio
    "blocks_per_sm": pl.Float64(),
    "warps_per_sm": pl.Float64(),
    "collective": pl.String(),
    "msg_nelems": pl.Float64(),
    "msg_dtype": pl.String(),
    "group_size": pl.Float64(),
}
# memory-row column <- the Kineto args key
MEMORY_KEYS = {
    "mem_bytes": "Bytes",
    "mem_allocated_bytes": "Total Allocated",
    "mem_reserved_bytes": "Total Reserved",
    "mem_addr": "Addr",
    "mem_device_type": "Device Type",
    "mem_device_id": "Device Id",
}
MEMORY_COLUMNS: dict[str, pl.DataType] = {
    "ts": pl.Float64(),
    "pid": pl.Int64(),
    "tid": pl.Int64(),
    **dict.fromkeys(MEMORY_KEYS, pl.Int64()),
}
_MEMORY_ARGS_SCHEMA = dict.fromkeys(MEMORY_KEYS.values(), pl.Int64())
_NO_MEMORY = pl.DataFrame(schema=MEMORY_COLUMNS)
_NO_SIDE = pl.DataFrame(schema=SIDE_COLUMNS)
JSON_TEXT = ("input_dims", "input_types", "concrete_inputs")


class Chunk(NamedTuple):
    """One span's events: the raw frame of its X events, the count of other events (memory
    instants excluded), the side rows, the memory rows."""

    frame: pl.DataFrame
    n_other: int
    side: pl.DataFrame
    memory: pl.DataFrame


def side_frame(groups: list[dict[str, Any]]) -> pl.DataFrame:
    """The side rows from groups of columns (each its own rows; columns a group lacks are null)."""
    parts = []
    for values in groups:
        if not len(next(iter(values.values()), [])):
            continue
        cols = []
        for name, vals in values.items():
            dtype = SIDE_COLUMNS[name]
            if isinstance(vals, pl.Series):
                cols.append(vals.cast(dtype).alias(name))
            elif name in JSON_TEXT:
                cols.append(pl.Series(name, [_json_text(v) for v in vals], dtype=pl.String))
            elif dtype == pl.String:
                cols.append(_text(vals).alias(name))
            else:
                cols.append(_num(vals, dtype).alias(name))
        parts.append(pl.DataFrame(cols))
    parts.append(pl.DataFrame(schema=SIDE_COLUMNS))
    return pl.concat(parts, how="diagonal_relaxed").select(
        pl.col(c).cast(t) for c, t in SIDE_COLUMNS.items()
    )


def memory_frame(
    ts: list[Any], pids: list[Any], tids: list[Any], args: pl.DataFrame
) -> pl.DataFrame:
    """The memory rows: the instants' ts/pid/tid beside their args' columns (MEMORY_KEYS)."""
    return pl.DataFrame(
        [
            _num(ts, pl.Float64).alias("ts"),
            _to_int_ids(pids).alias("pid"),
            _to_int_ids(tids).alias("tid"),
            *args.select(pl.col(k).alias(c) for c, k in MEMORY_KEYS.items()),
        ]
    ).select(pl.col(c).cast(t) for c, t in MEMORY_COLUMNS.items())


def memory_args(raws: list[msgspec.Raw]) -> tuple[pl.DataFrame, list[bool] | None]:
    """``[memory]`` args as JSON texts -> their columns, in polars' NDJSON reader. Anything it
    refuses (not an object, a float or string where Kineto writes an int) takes the typed
    decode, whose conversions the rest of the parser shares; there, args that are ``null``
    drop their instant (as the reference path does): the second value says which are kept
    (None: all)."""
    if not raws:
        return pl.DataFrame(schema=_MEMORY_ARGS_SCHEMA), None
    text = b"\n".join(raws)
    if text.count(b"\n") >= len(raws) or b"\r" in text:  # pretty-printed args: one line each
        # RS never occurs in JSON text outside strings, nor unescaped inside them
        text = b"\x1e".join(raws).replace(b"\n", b" ").replace(b"\r", b" ").replace(b"\x1e", b"\n")
    try:
        return pl.read_ndjson(io.BytesIO(text), schema=_MEMORY_ARGS_SCHEMA), None
    except (pl.exceptions.PolarsError, ValueError):
        pass
    decoded = [_MEMORY_ARG.decode(r) for r in raws]
    keep = [a is not None for a in decoded]
    args = [a for a in decoded if a is not None]
    values = {k: [getattr(a, f) for a in args] for f, k in _MEM_FIELDS.items()}
    return memory_args_of(values), keep


def memory_args_of(values: dict[str, list[Any]]) -> pl.DataFrame:
    """Decoded ``[memory]`` args values (Kineto key -> list) -> their columns."""
    return pl.DataFrame([_num(values[k], pl.Int64).alias(k) for k in MEMORY_KEYS.values()])


def _json_text(v: Any) -> str | None:
    if v is None or v is _NO_RAW:
        return None
    if v.__class__ is msgspec.Raw:
        return bytes(v).decode("utf-8", "replace")
    try:  # the robust path hands decoded values
        return msgspec.json.encode(v).decode()
    except (TypeError, ValueError, OverflowError):
        return None


def raw_frame(
    cats: list[Any],
    names: list[Any],
    ts: list[Any],
    dur: list[Any],
    pids: list[Any],
    tids: list[Any],
    device: list[Any],
    stream: list[Any],
    corr: list[Any],
    ext: list[Any],
    nbytes: list[Any],
) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "cat": _text(cats),
            "name": _text(names),
            "ts": _num(ts, pl.Float64),
            "dur": _num(dur, pl.Float64),
            "pid": _to_int_ids(pids),
            "tid": _to_int_ids(tids),
            "a_device": _num(device, pl.Int64),
            "a_stream": _num(stream, pl.Int64),
            "correlation": _num(corr, pl.Int64),
            "external_id": _num(ext, pl.Int64),
            "bytes": _num(nbytes, pl.Int64),
        }
    )


def _frame(events: list[Any]) -> Chunk:
    xs = [e for e in events if e.__class__ is _Event]
    args = [e.args or _EMPTY_ARGS for e in xs]
    df = raw_frame(
        [e.cat for e in xs],
        [e.name for e in xs],
        [e.ts for e in xs],
        [e.dur for e in xs],
        [e.pid for e in xs],
        [e.tid for e in xs],
        [a.device for a in args],
        [a.stream for a in args],
        [a.correlation for a in args],
        [a.ext if a.ext is not None else a.ext_lower for a in args],
        [a.nbytes for a in args],
    )
    mems = [e for e in events if e.__class__ is _Instant and e.name == "[memory]" and e.args]
    memory = _NO_MEMORY  # most chunks: none, and no frame to build for them
    if mems:
        mem_args, keep = memory_args([e.args for e in mems])
        if keep is not None:
            mems = [e for e, k in zip(mems, keep, strict=True) if k]
        memory = memory_frame(
            [e.ts for e in mems], [e.pid for e in mems], [e.tid for e in mems], mem_args
        )
    return Chunk(df, len(events) - len(xs) - len(mems), side_frame(_side_groups(df, args)), memory)


def _xyz(name: str, raws: list[msgspec.Raw]) -> dict[str, pl.Series]:
    """``[x, y, z]`` texts -> three int columns (null where not three integers), in one pass:
    the texts joined, split and matched by polars."""
    # NUL never occurs in JSON text (pretty-printed arrays do hold newlines)
    text = pl.Series([b"\x00".join(raws).decode("utf-8", "replace")]).str.split("\x00").explode()
    parts = text.str.strip_chars("[] \t\r\n").str.split_exact(",", 2).struct.unnest()
    return {
        f"{name}_{axis}": parts.get_column(f"field_{i}")
        .str.strip_chars()
        .cast(pl.Int64, strict=False)
        for i, axis in enumerate("xyz")
    }


def _is_number(v: Any) -> bool:
    return type(v) in (int, float)


def _message(args: list[Any]) -> dict[str, list[Any]]:
    """A collective's message columns (record_param_comms' or a NCCL kernel's args); values of
    another type than the field's are null, as the native scanner leaves them."""
    return {
        "msg_nelems": [a.msg_nelems if _is_number(a.msg_nelems) else None for a in args],
        "msg_dtype": [a.msg_dtype if type(a.msg_dtype) is str else None for a in args],
        "group_size": [a.group_size if _is_number(a.group_size) else None for a in args],
    }


def _side_groups(df: pl.DataFrame, args: list[Any]) -> list[dict[str, Any]]:
    """The side rows' columns: kernels (found by category, vectorized), then ops with shapes
    or FLOPs; rows are read only where they can be."""
    cat = df.get_column("cat")
    kernels = [
        i for i in cat.eq_missing("kernel").arg_true().to_list() if args[i].grid is not _NO_RAW
    ]
    groups: list[dict[str, Any]] = []
    if kernels:
        ka = [args[i] for i in kernels]
        dims = {**_xyz("grid", [a.grid for a in ka]), **_xyz("block", [a.block for a in ka])}
        groups.append(
            {
                "row": kernels,
                **dims,
                "registers_per_thread": [a.registers for a in ka],
                "shared_memory_bytes": [a.shared_memory for a in ka],
                "occupancy_pct": [a.occupancy for a in ka],
                "blocks_per_sm": [a.blocks_per_sm for a in ka],
                "warps_per_sm": [a.warps_per_sm for a in ka],
                "collective": [a.collective for a in ka],
                **_message(ka),
            }
        )
    ops = [
        i
        for i in cat.eq_missing("cpu_op").arg_true().to_list()
        if args[i].input_dims is not _NO_RAW
        or args[i].flops is not None
        or _is_number(args[i].msg_nelems)
    ]
    oa = [args[i] for i in ops]
    groups.append(
        {
            "row": ops,
            "input_dims": [a.input_dims for a in oa],
            "input_types": [a.input_types for a in oa],
            "concrete_inputs": [a.concrete for a in oa],
            "flops": [a.flops for a in oa],
            **_message(oa),
        }
    )
    return groups


class Parsed(NamedTuple):
    """A whole document: its chunks' parts joined, and what the top level says."""

    frame: pl.DataFrame
    top: dict[str, Any]
    era: str
    n_other: int
    warnings: list[str]
    side: pl.DataFrame
    memory: pl.DataFrame


def native_scanner() -> bool:
    """Whether the native scanner is built (and not turned off with TRACEINSIGHT_NO_NATIVE=1)."""
    return _kscan is not None


def trim_native_memory() -> None:
    """Hand the memory the scanner's freed columns held back to the system (glibc keeps freed
    blocks in its per-thread arenas): 60-70 MiB less peak on the 10x trace."""
    if _kscan is not None:
        _kscan.trim()


def _side_native(kernels: pl.DataFrame, ops: pl.DataFrame) -> pl.DataFrame:
    """The native scanner's side rows -> :func:`side_frame`'s, as the typed path builds them
    (numbers come as float64 holding integers exactly: the casts match its conversions)."""
    parts = [df for df in (kernels, ops) if df.height]
    if not parts:
        return _NO_SIDE
    return pl.concat([*parts, _NO_SIDE], how="diagonal_relaxed").select(
        pl.col(c).cast(t, strict=False) for c, t in SIDE_COLUMNS.items()
    )


def _native_chunk(elements: bytes | bytearray | memoryview) -> Chunk | None:
    """The native scanner's :class:`Chunk`, equal to the typed path's; None where it declines."""
    out = _kscan.scan(elements)
    if out is None:
        return None
    n_other, frame, kernels, ops, memory = out
    memory_df = pl.DataFrame(ArrowTable(memory))
    return Chunk(
        shared_names(pl.DataFrame(ArrowTable(frame))),
        n_other,
        _side_native(pl.DataFrame(ArrowTable(kernels)), pl.DataFrame(ArrowTable(ops))),
        memory_df if memory_df.height else _NO_MEMORY,
    )


def decode_chunk(elements: bytes | bytearray | memoryview) -> Chunk | None:
    """The elements of a JSON array of events, without its brackets (a span of the events
    array) -> its :class:`Chunk`; None if they are not what the fast path expects, or the span
    was not cut between two events. Runs in helper threads and processes too."""
    if _kscan is not None:
        chunk = _native_chunk(elements)
        if chunk is not None:
            return chunk
    chunk = typed_chunk(elements)
    return None if chunk is None else chunk._replace(frame=shared_names(chunk.frame))


# The columns the event table takes from the scanner's as they are (the others are computed
# from them, and the names are :func:`shared_names`). The scanner's columns of a span are one
# imported table, whose memory is freed only once the last of them is dropped.
SCANNED_AS_IS = ("pid", "tid", "correlation", "external_id", "bytes")


def shared_names(frame: pl.DataFrame) -> pl.DataFrame:
    """A chunk's frame with its names :func:`shared_text` (few distinct values over many rows:
    164 among the 10x trace's 1.2M events). The event table keeps them; the categories are
    read once and dropped with the rest of the raw frame."""
    return frame.with_columns(shared_text(frame.get_column("name")))


def shared_text(texts: pl.Series) -> pl.Series:
    """``texts`` with each distinct string's bytes held once. A string column is a view per row
    (16 bytes) into byte buffers; the scanner's columns (and the typed decode's) hold every
    row's bytes, which the event table's rows kept alive: the 10x trace's name column held
    191 MB, against 20 MB with every view pointing into the distinct values (a gather copies
    views, not bytes)."""
    if texts.dtype != pl.String:
        return texts
    distinct = texts.drop_nulls().unique()
    return distinct.gather(texts.cast(pl.Enum(distinct)).to_physical()).alias(texts.name)


def typed_chunk(elements: bytes | bytearray | memoryview) -> Chunk | None:
    """:func:`decode_chunk` through msgspec's typed decode: the reference of the native path."""
    doc = b"".join((b"[", elements, b"]"))
    try:  # one 8 MiB copy (under 1 ms) to add the brackets: the spool itself is never written to
        events = _EVENTS.decode(doc)
        return _frame(events)  # a [memory] args value of the wrong shape fails there
    except (
        msgspec.DecodeError,
        msgspec.ValidationError,
        ValueError,
        UnicodeDecodeError,
        RecursionError,
    ):
        return None  # RecursionError: values nested ~1000 deep; the reference path says what it is


def exact_times(data: bytes) -> tuple[pl.Series, pl.Series] | None:
    """ts/dur of the X events as int64 ns parsed from their decimal text, for traces whose
    absolute microseconds carry more digits than a float holds (kineto#853). None if unsure."""
    try:
        top = TOP.decode(data) if data.lstrip()[:1] == b"{" else None
        events = _TIMES.decode(top.traceEvents if top is not None else data)
    except (msgspec.DecodeError, msgspec.ValidationError, ValueError):
        return None
    xs = [e for e in events if e.ph == "X"]
    ts = [bytes(e.ts).decode() or None for e in xs]
    dur = [bytes(e.dur).decode() or None for e in xs]
    return _decimal_us_to_ns(ts), _decimal_us_to_ns(dur)


def _decimal_us_to_ns(text: list[str | None]) -> pl.Series:
    s = pl.Series(text, dtype=pl.String)
    if s.str.contains(r"[eE]").any():  # exponent notation: not kineto's writer
        return (s.cast(pl.Float64, strict=False) * 1000).round().cast(pl.Int64, strict=False)
    parts = s.str.split_exact(".", 1).struct.rename_fields(["i", "f"]).struct.unnest()
    whole = parts["i"].cast(pl.Int64, strict=False)
    frac = parts["f"].fill_null("").str.pad_end(3, "0").str.slice(0, 3).cast(pl.Int64, strict=False)
    sign = pl.Series(
        [-1 if t is not None and t.startswith("-") else 1 for t in text], dtype=pl.Int64
    )
    return whole * 1000 + frac * sign
