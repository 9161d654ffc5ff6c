"""The fast path for well-formed Kineto traces: typed, streamed, parallel decoding with msgspec.

msgspec decodes only the fields declared below (an event's grid, shapes and stacks are skipped
without being allocated), about 2x faster than building dicts with orjson and with a fraction of
the memory. The events array is cut into chunks of whole events: Kineto writes every event on its
own line as ``\\n  {`` at depth one (JSON strings cannot hold a raw newline), so those positions
are safe cut points. :func:`decode_path` inflates the file into a shared spool and cuts it as it
fills; helper processes (decoding holds the GIL, so threads would not help) decode the chunks in
place while it keeps inflating. :func:`decode` cuts and decodes a document already in memory the
same way, for what the spool cannot take. Anything unexpected (bad types, NaN, invalid UTF-8, truncation)
returns None and the caller uses the robust orjson path with its repairs.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import tempfile
from collections import deque
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures import wait as wait_futures
from pathlib import Path
from typing import Any, Union

import msgspec
import polars as pl

from traceinsight.parsers.source import Decompressed

CHUNK_BYTES = 8 * 1024 * 1024  # ~40k events: bounded struct memory; small enough to balance helpers
EVENT_START = b"\n  {"
HEAD_MAX_BYTES = 64 * 1024 * 1024  # metadata before traceEvents beyond this: not a kineto layout
IN_FLIGHT_PER_HELPER = 3  # chunks queued per helper so it never waits on the inflating thread
MIN_HELPER_BYTES = 64 * 1024 * 1024  # smaller documents finish before a helper could start
SPOOL_MARGIN_BYTES = 256 * 1024 * 1024  # free space left beside a spool
SPOOL_PREFIX = "traceinsight-spool-"  # + owner pid: a killed parse's spool is swept by the next


class _Args(msgspec.Struct, gc=False):  # no GC tracking: millions of acyclic objects
    device: Any = None
    stream: Any = None
    correlation: Any = None
    ext: Any = msgspec.field(default=None, name="External id")
    ext_lower: Any = msgspec.field(default=None, name="external id")
    nbytes: Any = msgspec.field(default=None, name="bytes")


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
    msgspec.defstruct(f"_Phase{ord(p)}", [], tag_field="ph", tag=p, gc=False) for p in "BEiICbnestfPONDMVvRc()"
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


class _EventTime(msgspec.Struct, gc=False):
    """Only what exact timestamps need: ts/dur kept as their JSON text."""

    ph: Any = None
    ts: msgspec.Raw = msgspec.field(default_factory=lambda: msgspec.Raw(b""))
    dur: msgspec.Raw = msgspec.field(default_factory=lambda: msgspec.Raw(b""))


_TOP = msgspec.json.Decoder(_Top)
_TIMES = msgspec.json.Decoder(list[_EventTime])
_EVENTS = msgspec.json.Decoder(list[Union[(_Event, *_OTHER)]])  # noqa: UP007 - a union built at runtime
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
        v if (type(v) is float or type(v) is str or (type(v) is int and -(2**63) <= v < 2**63)) else None
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
    except OverflowError:  # an integer beyond 64 bits somewhere: drop those
        out = pl.Series([v if v is not None and -(2**63) <= v < 2**63 else None for v in ints], dtype=pl.Int64)
    if out.null_count():
        strs = [v if type(v) is str else None for v in values]
        parsed = pl.Series(strs, dtype=pl.String).str.extract(r"(-?\d+)\s*$", 1).cast(pl.Int64, strict=False)
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


def raw_frame(
    cats: list[Any], names: list[Any], ts: list[Any], dur: list[Any], pids: list[Any], tids: list[Any],
    device: list[Any], stream: list[Any], corr: list[Any], ext: list[Any], nbytes: list[Any],
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




def _frame(events: list[Any]) -> tuple[pl.DataFrame, int]:
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
    return df, len(events) - len(xs)


def decode_chunk(array: bytes | bytearray | memoryview) -> tuple[pl.DataFrame, int] | None:
    """One JSON array of events -> (frame of its X events, count of other events); None if the
    chunk is not what the fast path expects. Runs in helper processes too."""
    try:
        events = _EVENTS.decode(array)
    except (msgspec.DecodeError, msgspec.ValidationError, ValueError, UnicodeDecodeError):
        return None
    return _frame(events)


class _Unusable(Exception):
    """The document does not have the layout the streamed path relies on."""


class _Buffer:
    """A document the cutter works on: ``mm`` is writable and sliceable (a bytearray here, a
    shared mapping in :class:`_Spool`); ``len`` bytes of it have arrived."""

    def __init__(self, data: bytearray) -> None:
        self.mm: bytearray | mmap.mmap = data
        self.len = len(data)

    def find(self, sub: bytes, start: int, end: int | None = None) -> int:
        return self.mm.find(sub, start, self.len if end is None else end)

    def rfind(self, sub: bytes, start: int, end: int) -> int:
        return self.mm.rfind(sub, start, end)

    def bytes(self, start: int, end: int) -> bytes:
        return bytes(self.mm[start:end])


class _Spool(_Buffer):
    """The inflated document in a file-backed shared mapping (tmpfs where it has room), written
    block by block; helper processes map the same file and decode their chunks in place, so no
    chunk is copied through a pipe."""

    def __init__(self, size: int) -> None:  # the mapping replaces _Buffer's bytearray
        self.path = _spool_file(size)
        try:
            self.fd = os.open(self.path, os.O_RDWR)
            os.ftruncate(self.fd, size)
            self.mm = mmap.mmap(self.fd, size)
        except OSError:
            os.unlink(self.path)
            raise
        self.size = size
        self.len = 0

    def write(self, block: bytes) -> None:
        end = self.len + len(block)
        if end > self.size:  # gzip's ISIZE was wrong (several members, or over 4 GiB)
            raise _Unusable("the document is larger than announced")
        # pwrite, not a copy through the mapping: the kernel fills whole pages without a fault
        # per 4 KiB page (0.4 s less on a 433 MB trace)
        os.pwrite(self.fd, block, self.len)
        self.len = end

    def close(self) -> None:
        try:
            self.mm.close()
            os.close(self.fd)
        finally:
            os.unlink(self.path)


def _spool_file(size: int) -> str:
    """A new file for the spool where the free space holds it (writing past a full tmpfs through
    a mapping would kill the process with SIGBUS, so check first). Spools of processes that no
    longer exist (killed mid-parse) are removed first."""
    for folder in ("/dev/shm", tempfile.gettempdir()):
        try:
            _sweep(folder)
            st = os.statvfs(folder)
        except OSError:
            continue
        if st.f_bavail * st.f_frsize >= size + SPOOL_MARGIN_BYTES:
            fd, name = tempfile.mkstemp(prefix=f"{SPOOL_PREFIX}{os.getpid()}-", suffix=".json", dir=folder)
            os.close(fd)
            return name
    raise OSError("no room to spool the trace")


def _sweep(folder: str) -> None:
    for entry in os.scandir(folder):
        if not entry.name.startswith(SPOOL_PREFIX):
            continue
        pid = entry.name[len(SPOOL_PREFIX) :].split("-", 1)[0]
        if pid.isdigit() and not os.path.exists(f"/proc/{pid}") and os.path.exists("/proc/self"):
            with contextlib.suppress(OSError):
                os.unlink(entry.path)


# Helper side: the spool mapped once per process.
_HELPER_MAP: dict[str, mmap.mmap] = {}


def decode_span(spool_path: str, start: int, end: int) -> tuple[pl.DataFrame, int] | None:
    """Decode bytes [start, end) of a spool (a JSON array of events) in a helper process."""
    mm = _HELPER_MAP.get(spool_path)
    if mm is None:
        for old in _HELPER_MAP.values():
            old.close()
        _HELPER_MAP.clear()
        with open(spool_path, "rb") as fh:
            mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        _HELPER_MAP[spool_path] = mm
    with memoryview(mm) as mv, mv[start:end] as part:
        return decode_chunk(part)


class _Cutter:
    """Finds chunks of whole events (about ``CHUNK_BYTES`` each) in a buffer as it fills, and
    makes each a JSON array in place: the newline before its first event becomes '[', the comma
    after its last event ']'. Also keeps what surrounds the events array, for the metadata."""

    def __init__(self, spool: _Buffer) -> None:
        self.spool = spool
        self.head: bytes | None = None  # the document up to and including the events' '['
        self.bare = False  # 2020 traces: the document is the events array itself
        self.start = 0  # where the next chunk begins (its '[')

    def cut(self) -> list[tuple[int, int]]:
        sp = self.spool
        if self.head is None and not self._find_head():
            return []
        out = []
        while True:
            nxt = sp.find(EVENT_START, self.start + CHUNK_BYTES)
            if nxt < 0:
                return out
            comma = sp.rfind(b",", self.start, nxt)
            if comma < 0 or sp.bytes(comma + 1, nxt).strip() or not sp.bytes(max(self.start, comma - 256), comma).rstrip().endswith(b"}"):
                raise _Unusable("a cut point does not follow an event")
            sp.mm[comma] = ord("]")
            sp.mm[nxt] = ord("[")  # the newline of the next chunk's '\\n  {'
            out.append((self.start, comma + 1))
            self.start = nxt

    def _find_head(self) -> bool:
        sp = self.spool
        probe = sp.bytes(0, min(sp.len, 64))
        lead = len(probe) - len(probe.lstrip())
        if lead == len(probe):
            return False
        if probe[lead] == ord("["):
            self.bare = True
            self.head = b""
            self.start = lead
            return True
        if probe[lead] != ord("{"):
            raise _Unusable("not a JSON object or array")
        key = sp.find(b'"traceEvents"', 0)
        if key < 0:
            if sp.len > HEAD_MAX_BYTES:
                raise _Unusable("no traceEvents key near the start")
            return False
        bracket = sp.find(b"[", key)
        if bracket < 0:
            return False
        if sp.bytes(key + 13, bracket).strip() != b":":
            raise _Unusable("traceEvents is not an array")
        head = sp.bytes(0, bracket + 1)
        try:  # the head must be a well-formed prefix of the top-level object
            _TOP.decode(head + b"]}")
        except (msgspec.DecodeError, msgspec.ValidationError):
            raise _Unusable("malformed document head") from None
        self.head = head
        self.start = bracket
        return True

    def finish(self) -> tuple[tuple[int, int], dict[str, Any]]:
        """The last chunk and the top-level metadata, once the whole document has arrived."""
        if self.head is None:
            raise _Unusable("no events array")
        sp = self.spool
        pos = sp.len
        for _ in range(64):  # the events' closing bracket: the last ']' whose tail completes the top
            pos = sp.rfind(b"]", self.start + 1, pos)
            if pos < 0:
                break
            tail = sp.bytes(pos + 1, sp.len)
            if self.bare:
                if tail.strip():
                    raise _Unusable("data after the events array")
                meta: dict[str, Any] = {}
            else:
                try:
                    top = _TOP.decode(self.head + b"]" + tail)
                except (msgspec.DecodeError, msgspec.ValidationError):
                    continue
                meta = {f: getattr(top, f) for f in top.__struct_fields__ if f != "traceEvents" and getattr(top, f) is not None}
            # Does this bracket close the events? The last event before it must parse on its
            # own (one event, not the whole chunk); an array in the tail would not.
            ev = sp.rfind(EVENT_START, self.start, pos)
            last = b"[" + sp.bytes(ev + 1, pos) + b"]" if ev >= 0 else sp.bytes(self.start, pos + 1)
            try:
                msgspec.json.decode(last)
            except msgspec.DecodeError:
                continue
            return (self.start, pos + 1), meta
        raise _Unusable("the events array does not close")


def default_helpers() -> int:
    """Helper processes for one parse: one per core this process may use (the parent mostly
    waits); none on one core, e.g. a batch worker limited by POLARS_MAX_THREADS."""
    from traceinsight.parallel import cores_available

    raw = os.environ.get("TRACEINSIGHT_PARSE_HELPERS")
    if raw is not None and raw.strip().isdigit():
        return int(raw)
    cores = cores_available()
    return 0 if cores < 2 else min(cores, 8)


class _Scheduler:
    """Chunks (byte spans of the spool) in, frames out in document order, a few queued to each
    helper at a time. With helpers, this process only inflates and hands out work: decoding
    here too would hold the GIL its result thread needs to unpickle the helpers' frames (the
    10x trace: 3.7 s with two helpers and an idle parent, 4.2 s with one helper plus the parent).
    Without helpers (or once they are lost) it decodes everything itself."""

    def __init__(self, spool: _Buffer, helpers: int) -> None:
        self.spool = spool  # a _Spool whenever helpers > 0: they map its file
        self.helpers = helpers
        self.todo: deque[tuple[int, int, int]] = deque()
        self.done: dict[int, tuple[pl.DataFrame, int] | None] = {}
        self.inflight: dict[Future[Any], tuple[int, int, int]] = {}
        self.pool: ProcessPoolExecutor | None = None
        self.count = 0

    def add(self, start: int, end: int) -> None:
        self.todo.append((self.count, start, end))
        self.count += 1
        self._top_up()

    def start(self) -> None:
        if self.pool is not None or not self.helpers:
            return
        from multiprocessing import get_context

        old = os.environ.get("POLARS_MAX_THREADS")
        os.environ["POLARS_MAX_THREADS"] = "1"  # read by the children as they import polars
        try:
            self.pool = ProcessPoolExecutor(max_workers=self.helpers, mp_context=get_context("spawn"))
            for _ in range(self.helpers):  # spawn them now, while the environment says one thread
                self.pool.submit(int)
        except (OSError, RuntimeError):
            self.pool = None  # no processes here (sandbox, limits): decode in this process
        finally:
            if old is None:
                os.environ.pop("POLARS_MAX_THREADS", None)
            else:
                os.environ["POLARS_MAX_THREADS"] = old

    def _local(self, start: int, end: int) -> tuple[pl.DataFrame, int] | None:
        with memoryview(self.spool.mm) as mv, mv[start:end] as part:
            return decode_chunk(part)

    def _collect(self, block: bool = False) -> None:
        if block and self.inflight:
            wait_futures(list(self.inflight))
        for fut in [f for f in self.inflight if f.done()]:
            i, start, end = self.inflight.pop(fut)
            try:
                self.done[i] = fut.result()
            except Exception:  # noqa: BLE001 - a lost helper: decode its chunk here instead
                self.done[i] = self._local(start, end)

    def _top_up(self) -> None:
        if self.pool is None:
            return
        self._collect()
        while self.todo and len(self.inflight) < IN_FLIGHT_PER_HELPER * self.helpers:
            item = self.todo.pop()  # helpers take from the back, this process from the front
            try:
                fut = self.pool.submit(decode_span, self.spool.path, item[1], item[2])  # type: ignore[attr-defined]
            except RuntimeError:  # broken pool
                self.todo.append(item)
                self.pool = None
                return
            self.inflight[fut] = item

    def results(self) -> list[tuple[pl.DataFrame, int]] | None:
        while self.todo:
            if self.pool is not None:  # see the class docstring
                wait_futures(list(self.inflight), return_when="FIRST_COMPLETED")
                self._top_up()
                continue
            i, start, end = self.todo.popleft()
            self.done[i] = self._local(start, end)
            if self.done[i] is None:
                return None
            self._top_up()
        self._collect(block=True)
        out = [self.done.get(i) for i in range(self.count)]
        if any(r is None for r in out):
            return None
        return out  # type: ignore[return-value]

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)
            self.pool = None


def _inflated_size(path: Path, kind: str) -> int:
    """The document's size: the file's, or for gzip the trailer's ISIZE (mod 4 GiB, last member)."""
    size = path.stat().st_size
    if kind != "gzip":
        return size
    with open(path, "rb") as fh:
        fh.seek(max(0, size - 4))
        return int.from_bytes(fh.read(4), "little")


def decode(data: bytes) -> tuple[pl.DataFrame, dict[str, Any], str, int] | None:
    """:func:`decode_path` for a document already in memory (what the spool cannot take: a
    gzip of several members, no room for the spool), in this process: (raw event frame,
    top-level metadata, era note, non-X event count), or None to fall back."""
    buf = _Buffer(bytearray(data))
    cutter = _Cutter(buf)
    sched = _Scheduler(buf, 0)
    try:
        for span in cutter.cut():
            sched.add(*span)
        return _finish(cutter, sched)
    except _Unusable:
        return None


def decode_path(path: Path, max_bytes: int | None, helpers: int = 0) -> tuple[pl.DataFrame, dict[str, Any], str, int] | None:
    """Inflate ``path`` into a spool, cutting chunks as it fills and handing them to ``helpers``
    processes (or decoding them here, without helpers or below ``MIN_HELPER_BYTES``). Same result
    as :func:`decode`; None to fall back (truncated, unusual layout, unexpected types, no room
    for the spool)."""
    stream = Decompressed(path, max_bytes, read_size=1024 * 1024)  # ~10-20 MB inflated per read
    try:
        size = _inflated_size(path, stream.kind)
        if size <= 0 or size > stream.limit:
            return None  # unknown size (or the limit applies): the whole-document path decides
        spool = _Spool(size)
    except OSError:
        return None
    sched = _Scheduler(spool, helpers if size >= MIN_HELPER_BYTES else 0)
    try:
        sched.start()  # helpers import while this process inflates the first blocks
        cutter = _Cutter(spool)
        for block in stream:
            spool.write(block)
            for span in cutter.cut():
                sched.add(*span)
        if stream.truncated or spool.len != spool.size:
            return None
        return _finish(cutter, sched)
    except (_Unusable, OSError):  # OSError: the spool ran out of room (another parse took it)
        return None
    finally:
        sched.close()
        spool.close()


def _finish(cutter: _Cutter, sched: _Scheduler) -> tuple[pl.DataFrame, dict[str, Any], str, int] | None:
    """The last chunk in, every chunk's frame out, in document order."""
    last, meta = cutter.finish()
    sched.add(*last)
    parts = sched.results()
    if parts is None:
        return None
    df = pl.concat([df for df, _ in parts], how="vertical_relaxed")
    other = sum(n for _, n in parts)
    if df.height == 0 and other and cutter.bare:
        return None  # an array of something else: let the robust path explain
    return df, meta, "2020 bare event array" if cutter.bare else "", other


def exact_times(data: bytes) -> tuple[pl.Series, pl.Series] | None:
    """ts/dur of the X events as int64 ns parsed from their decimal text, for traces whose
    absolute microseconds carry more digits than a float holds (kineto#853). None if unsure."""
    try:
        top = _TOP.decode(data) if data.lstrip()[:1] == b"{" else None
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
        return s.cast(pl.Float64, strict=False).mul(1000).round().cast(pl.Int64, strict=False)
    parts = s.str.split_exact(".", 1).struct.rename_fields(["i", "f"]).struct.unnest()
    whole = parts["i"].cast(pl.Int64, strict=False)
    frac = parts["f"].fill_null("").str.pad_end(3, "0").str.slice(0, 3).cast(pl.Int64, strict=False)
    sign = pl.Series([-1 if t is not None and t.startswith("-") else 1 for t in text], dtype=pl.Int64)
    return whole * 1000 + frac * sign
