"""The streamed path: inflate into a spool, cut the events array into spans, decode them.

The events array is cut into spans of whole events in any layout (compact, one event per line,
indented, CRLF): a span ends at a comma between two objects, found by a byte search, and is
trusted only once the span before it has decoded (a comma inside a string or a nested value makes
the span fail; it is then joined with the next, see :func:`_mend`). :func:`decode_path` inflates
the file into a spool (reused slabs for helper threads, a shared file for helper processes),
dropping whitespace padding, and cuts it as it fills; helpers decode the spans in place while it
keeps inflating: threads where the native scanner is built (it decodes without the GIL), else
processes (the typed msgspec decode holds the GIL). :func:`decode` cuts and decodes a document
already in memory the same way, for what the spool cannot take. Anything unexpected returns None and the caller uses :mod:`.repair`.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import re
import tempfile
from collections import deque
from concurrent.futures import Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from pathlib import Path
from typing import Any, NamedTuple

import msgspec
import polars as pl

from traceinsight import resources
from traceinsight.parsers.kineto.decode import TOP, Chunk, Parsed, decode_chunk, native_scanner
from traceinsight.parsers.source import Decompressed, inflated_size, padding_note
from traceinsight.runtime import single_thread_children, spawn_context

CHUNK_BYTES = 8 * 1024 * 1024  # ~40k events: bounded struct memory; small enough to balance helpers
HEAD_MAX_BYTES = 64 * 1024 * 1024  # metadata before (or after) traceEvents beyond this: not a trace
IN_FLIGHT_PER_HELPER = 3  # chunks queued per helper so it never waits on the inflating thread
IN_FLIGHT_PER_THREAD = 2  # threads are handed their chunks without a pipe
MAX_CLOSE_TRIES = 4  # ']' whose tail completes the document, tried as the events' end (last first)
MAX_JOIN = 4  # spans joined to one that failed before giving up: its data, not its cut, is bad
MIN_HELPER_BYTES = 64 * 1024 * 1024  # smaller documents finish before a helper process could start
SPOOL_MARGIN_BYTES = 256 * 1024 * 1024  # memory (or disk) left free beside a spool
SPOOL_MIN_BYTES = 1024 * 1024
_MADV_REMOVE = getattr(mmap, "MADV_REMOVE", None)  # Linux: punch a hole through a mapping
SLAB_BYTES = 2 * CHUNK_BYTES  # a slab: a span, the tail after it, the next block
SLAB_POOL = 4  # free slabs kept for reuse
SPOOL_PREFIX = "traceinsight-spool-"  # + owner pid: a killed parse's spool is swept by the next


class _Unusable(Exception):
    """The document does not have the layout the streamed path relies on."""


class _NoRoom(Exception):
    """The spool cannot grow: the memory it and the parse need is not there."""


class _Buffer:
    """A document the cutter reads: ``mm`` is bytes-like (the document itself here, a shared
    mapping in :class:`_Spool`, the newest slab in :class:`_Slabs`) holding the document from
    offset ``base``; ``len`` bytes of it have arrived. Offsets are the document's."""

    base = 0

    def __init__(self, data: bytes) -> None:
        self.mm: bytes | mmap.mmap = data
        self.len = len(data)

    def find(self, sub: bytes, start: int) -> int:
        at = self.mm.find(sub, start - self.base, self.len - self.base)
        return at + self.base if at >= 0 else -1

    def rfind(self, sub: bytes, start: int, end: int) -> int:
        at = self.mm.rfind(sub, start - self.base, end - self.base)
        return at + self.base if at >= 0 else -1

    def bytes(self, start: int, end: int) -> bytes:
        return bytes(self.mm[start - self.base : end - self.base])

    def view(self, start: int, end: int) -> memoryview:
        """[start, end) without a copy where it can (release it before the buffer grows)."""
        with memoryview(self.mm) as mv:
            return mv[start - self.base : end - self.base]

    def search(self, pattern: re.Pattern[bytes], start: int) -> tuple[int, int] | None:
        """Where ``pattern``'s group 1 is, at its first match from ``start`` on."""
        m = pattern.search(self.mm, start - self.base, self.len - self.base)
        return None if m is None else (m.start(1) + self.base, m.end(1) + self.base)

    def match_end(self, pattern: re.Pattern[bytes], start: int) -> tuple[int, bool] | None:
        """The end of ``pattern`` matched at ``start``, and whether its group 1 matched."""
        m = pattern.match(self.mm, start - self.base, self.len - self.base)
        if m is None:
            return None
        return m.end() + self.base, pattern.groups > 0 and m.group(1) is not None

    def byte(self, at: int) -> int:
        return self.mm[at - self.base]

    def cut(self, spans: list[tuple[int, int]]) -> None:
        """Spans cut from what has arrived (see :class:`_Slabs`)."""


class _Spool(_Buffer):
    """The inflated document in a file-backed shared mapping (tmpfs where memory allows),
    written block by block and grown as it fills (gzip's size field is only a hint: mod 4 GiB,
    last member only, and whitespace padding is never written); helpers map the same file and
    decode their spans in place, so no chunk is copied through a pipe."""

    def __init__(self, hint: int) -> None:  # the mapping replaces _Buffer's bytes
        self.path, self.in_memory = _spool_file(hint)
        # the first mapping's address space is taken at once: bounded, so ulimit -v still leaves room
        self.size = max(SPOOL_MIN_BYTES, min(hint, resources.available_bytes() // 4))
        try:
            self.fd = os.open(self.path, os.O_RDWR)
            os.ftruncate(self.fd, self.size)
            self.mm = mmap.mmap(self.fd, self.size)
        except OSError:
            os.unlink(self.path)
            raise
        self.len = 0

    def write(self, block: bytes) -> None:
        end = self.len + len(block)
        if end > self.size:
            self._grow(end)
        # pwrite, not a copy through the mapping: the kernel fills whole pages without a fault
        # per 4 KiB page (0.4 s less on a 433 MB trace); a full tmpfs is ENOSPC here, not SIGBUS
        os.pwrite(self.fd, block, self.len)
        self.len = end

    def _grow(self, need: int) -> None:
        new = max(need, self.size + self.size // 2)
        # what is still to come needs its pages (counted twice in tmpfs: RAM) and the frames
        # decoded from it; refuse before the kernel's OOM killer decides instead
        if (
            resources.available_bytes()
            < (new - self.size) * (2 if self.in_memory else 1) + SPOOL_MARGIN_BYTES
        ):
            raise _NoRoom
        self.mm.resize(new)  # the file too
        self.size = new

    def release(self, start: int, end: int) -> None:
        """Free the whole pages of [start, end): a hole in the file (tmpfs: memory back)."""
        lo, hi = -(-start // mmap.PAGESIZE) * mmap.PAGESIZE, end // mmap.PAGESIZE * mmap.PAGESIZE
        if hi > lo and _MADV_REMOVE is not None:
            with contextlib.suppress(OSError, ValueError):  # a file system without holes
                self.mm.madvise(_MADV_REMOVE, lo, hi - lo)

    def close(self) -> None:
        try:
            self.mm.close()
            os.close(self.fd)
        finally:
            os.unlink(self.path)


class _Slab(NamedTuple):
    mm: mmap.mmap
    base: int  # the document offset of its first byte


class _Slabs(_Buffer):
    """The spool of a parse whose helpers are threads: the document in reusable anonymous
    slabs rather than one growing file. A slab holds whole spans (a span never straddles two)
    and the uncut tail after them; when a block does not fit, the tail moves to a fresh or
    reused slab. A slab whose spans are all released goes back to a small pool: writing into
    pages already there costs a tenth of what new pages (a file's or anonymous) cost, and the
    writes are the inflating thread's second-largest cost (benchmarks/RESULTS.md)."""

    def __init__(self) -> None:
        self.slabs: list[_Slab] = []  # in document order, each up to where the next begins
        self.live: dict[int, int] = {}  # id(slab mm) -> spans of it not yet released
        self.pool: list[mmap.mmap] = []
        self.tail = 0  # where the last span cut ends: a new slab starts there
        self.len = 0
        self._add(SLAB_BYTES, 0)

    def _add(self, size: int, base: int) -> None:
        mm = next((m for m in self.pool if len(m) >= size), None)
        if mm is not None:
            self.pool.remove(mm)
        else:
            if resources.available_bytes() < size + SPOOL_MARGIN_BYTES:
                raise _NoRoom
            mm = mmap.mmap(-1, max(size, SLAB_BYTES))
        self.slabs.append(_Slab(mm, base))
        self.live[id(mm)] = 0
        self.mm, self.base = mm, base

    def write(self, block: bytes) -> None:
        at = self.len - self.base
        if at + len(block) > len(self.mm):
            keep = self.len - self.tail  # the tail since the last cut moves along
            old = self.mm
            need = keep + len(block)  # doubled past a slab: a long uncut run stays linear
            self._add(need if need <= SLAB_BYTES else 2 * need, self.tail)
            with memoryview(old) as mv, mv[self.tail - self.slabs[-2].base : at] as rest:
                self.mm[:keep] = rest
            self._done_with(self.slabs[-2])
            at = keep
        self.mm[at : at + len(block)] = block
        self.len += len(block)

    def cut(self, spans: list[tuple[int, int]]) -> None:
        for _, end in spans:  # a span lies in the newest slab: it is held there
            self.live[id(self.mm)] += 1
            self.tail = end

    def _index_of(self, at: int) -> int:
        """The slab holding offset ``at``."""
        for i in range(len(self.slabs) - 1, -1, -1):
            if self.slabs[i].base <= at:
                return i
        raise _Unusable("a span no longer held")  # not reached: released spans are not read

    def view(self, start: int, end: int) -> memoryview:
        pieces, i = [], self._index_of(start)
        while start < end:
            slab = self.slabs[i]
            top = self.slabs[i + 1].base if i + 1 < len(self.slabs) else self.len
            stop = min(end, top)
            with memoryview(slab.mm) as mv:
                pieces.append(mv[start - slab.base : stop - slab.base])
            start, i = stop, i + 1
        if len(pieces) == 1:
            return pieces[0]
        joined = b"".join(pieces)  # a mended span across slabs: rare
        for piece in pieces:
            piece.release()
        return memoryview(joined)

    def rfind(self, sub: bytes, start: int, end: int) -> int:
        for i in range(len(self.slabs) - 1, -1, -1):  # sub is one byte here: never split
            slab = self.slabs[i]
            top = self.slabs[i + 1].base if i + 1 < len(self.slabs) else self.len
            lo, hi = max(start, slab.base), min(end, top)
            if lo < hi and (at := slab.mm.rfind(sub, lo - slab.base, hi - slab.base)) >= 0:
                return at + slab.base
            if slab.base <= start:
                break
        return -1

    def bytes(self, start: int, end: int) -> bytes:
        with self.view(start, end) as part:
            return bytes(part)

    def release(self, start: int, end: int) -> None:
        slab = self.slabs[self._index_of(start)]
        self.live[id(slab.mm)] -= 1
        if slab.mm is not self.mm:
            self._done_with(slab)

    def _done_with(self, slab: _Slab) -> None:
        """A slab no longer written: back to the pool once none of its spans is held."""
        if self.live.get(id(slab.mm)) or slab not in self.slabs:
            return
        del self.live[id(slab.mm)]
        self.slabs.remove(slab)  # spans are released in order: the slabs before it went first
        if len(self.pool) < SLAB_POOL and len(slab.mm) == SLAB_BYTES:
            self.pool.append(slab.mm)
        else:
            with contextlib.suppress(BufferError):
                slab.mm.close()

    def close(self) -> None:
        for mm in [s.mm for s in self.slabs] + self.pool:
            with contextlib.suppress(BufferError):  # a helper thread still reading: freed with it
                mm.close()


def _spool_file(hint: int) -> tuple[str, bool]:
    """A new file for the spool, and whether it is memory: /dev/shm where the memory available
    (cgroup and address-space limits included) holds it twice over (it and the frames decoded
    from it), else the temporary directory on disk. Spools of processes that no longer exist
    (killed mid-parse) are removed first."""
    in_memory = resources.available_bytes() >= 2 * hint + SPOOL_MARGIN_BYTES
    for folder in ("/dev/shm", tempfile.gettempdir()) if in_memory else (tempfile.gettempdir(),):
        try:
            _sweep(folder)
            st = os.statvfs(folder)
        except OSError:
            continue
        if st.f_bavail * st.f_frsize >= hint + SPOOL_MARGIN_BYTES:
            fd, name = tempfile.mkstemp(
                prefix=f"{SPOOL_PREFIX}{os.getpid()}-", suffix=".json", dir=folder
            )
            os.close(fd)
            return name, folder == "/dev/shm" or _is_memory_fs(folder)
    raise OSError("no room to spool the trace")


def _is_memory_fs(folder: str) -> bool:
    """Whether ``folder`` is on tmpfs/ramfs (its files are memory), from /proc/mounts."""
    best, fstype = "", ""
    try:
        with open("/proc/mounts") as fh:
            for line in fh:
                fields = line.split()
                if len(fields) > 2 and folder.startswith(fields[1]) and len(fields[1]) > len(best):
                    best, fstype = fields[1], fields[2]
    except OSError:
        return False
    return fstype in ("tmpfs", "ramfs")


def _sweep(folder: str) -> None:
    for entry in os.scandir(folder):
        if not entry.name.startswith(SPOOL_PREFIX):
            continue
        pid = entry.name[len(SPOOL_PREFIX) :].split("-", 1)[0]
        if pid.isdigit() and not os.path.exists(f"/proc/{pid}") and os.path.exists("/proc/self"):
            with contextlib.suppress(OSError):
                os.unlink(entry.path)


# Helper side: the spool mapped once per process (again when it has grown past the mapping).
_HELPER_MAP: dict[str, mmap.mmap] = {}


def decode_span(spool_path: str, start: int, end: int) -> Chunk | None:
    """Decode the span [start, end) of a spool (see :func:`decode_chunk`) in a helper process."""
    mm = _HELPER_MAP.get(spool_path)
    if mm is None or end > len(mm):
        for old in _HELPER_MAP.values():
            old.close()
        _HELPER_MAP.clear()
        with open(spool_path, "rb") as fh:
            mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        _HELPER_MAP[spool_path] = mm
    with memoryview(mm) as mv, mv[start:end] as part:
        return decode_chunk(part)


def _decode_view(part: memoryview) -> Chunk | None:
    """Decode a span of a slab in a helper thread; the view is released here."""
    with part:
        return decode_chunk(part)


# A comma between two objects ('}' ',' '{', any whitespace): where a span may end. A failed
# match backtracks over the blanks after one '}' only, so a search stays linear.
_CUT = re.compile(rb"\}[ \t\r\n]*(,)[ \t\r\n]*\{")
_BLANK = re.compile(rb"[ \t\r\n]*")
_KEY_TAIL = re.compile(rb"[ \t\r\n]*:[ \t\r\n]*(\[)?")  # after "traceEvents": the array opens


class _Cutter:
    """Cuts the events array into spans of whole events (about ``CHUNK_BYTES`` each) as the
    buffer fills, in any layout (one event per line, compact, indented, CRLF): a span ends at
    a comma between two objects, found by a byte search without decoding. Such a comma can
    also lie inside a string or a nested value; the span then fails to decode and
    :func:`_mend` joins it to the next, so a cut is trusted only once the span before it has
    decoded. Also keeps what surrounds the events array, for the metadata."""

    def __init__(self, buf: _Buffer) -> None:
        self.buf = buf
        self.head: bytes | None = None  # the document up to and including the events' '['
        self.bare = False  # 2020 traces: the document is the events array itself
        self.start = 0  # first byte of the next span: just after the '[' or a cut comma
        self.scan = 0  # where the next search for a cut begins: nothing before it can start one

    def cut(self) -> list[tuple[int, int]]:
        b = self.buf
        if self.head is None and not self._find_head():
            return []
        out = []
        while (at := max(self.scan, self.start + CHUNK_BYTES)) < b.len:
            comma = b.search(_CUT, at)
            if comma is None:  # a cut may straddle what has arrived: search again from its last '}'
                last = b.rfind(b"}", at, b.len)
                self.scan = last if last >= 0 else b.len
                break
            out.append((self.start, comma[0]))
            self.start = self.scan = comma[1]
        return out

    def _find_head(self) -> bool:
        b = self.buf
        lead = b.match_end(_BLANK, 0)[0]  # type: ignore[index] - always matches
        if lead == b.len:
            return False
        if b.byte(lead) == ord("["):
            self.bare = True
            self.head = b""
            self.start = self.scan = lead + 1
            return True
        if b.byte(lead) != ord("{"):
            raise _Unusable("not a JSON object or array")
        key = b.find(b'"traceEvents"', lead)
        if key < 0:
            if b.len > HEAD_MAX_BYTES:
                raise _Unusable("no traceEvents key near the start")
            return False
        m = b.match_end(_KEY_TAIL, key + 13)
        if m is None or not m[1]:
            if (m[0] if m else key + 13) < b.len:
                raise _Unusable("traceEvents is not an array")
            return False  # the rest has not arrived
        head = b.bytes(0, m[0])
        try:  # a well-formed prefix of the top-level object, and that key its own (not in a string)
            top = TOP.decode(head + b"]}")
        except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
            raise _Unusable("malformed document head") from None
        if bytes(top.traceEvents) != b"[]":
            raise _Unusable("traceEvents is not a top-level key")
        self.head = head
        self.start = self.scan = m[0]
        return True

    def finish(self, lo: int) -> tuple[int, list[tuple[int, dict[str, Any]]]]:
        """Once the whole document has arrived: where the last span starts, and the candidates
        for the events' closing bracket at or after ``lo`` (the last first), each with the
        top-level metadata the rest of the document gives. Which one closes the events, the
        spans decide (:func:`_mend`); ``lo`` reaches back a few spans in case a cut fell in
        what follows the events (a tail with ``},{`` in it)."""
        if self.head is None:
            raise _Unusable("no events array")
        b, out, pos = self.buf, [], self.buf.len
        for _ in range(64):
            pos = b.rfind(b"]", min(lo, self.start), pos)
            if pos < 0 or b.len - pos > HEAD_MAX_BYTES:
                break
            meta = self._meta(b.bytes(pos + 1, b.len))
            if meta is not None:
                out.append((pos, meta))
                if len(out) == MAX_CLOSE_TRIES:
                    break
            elif self.bare:  # only blanks may follow a bare array: an earlier ']' will not do
                break
        if not out or out[0][0] < self.start:
            raise _Unusable("the events array does not close")
        return self.start, out

    def _meta(self, tail: bytes) -> dict[str, Any] | None:
        if self.bare:
            return {} if not tail.strip() else None
        try:
            top = TOP.decode(self.head + b"]" + tail)  # type: ignore[operator] - head is set
        except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
            return None
        return {
            f: getattr(top, f)
            for f in top.__struct_fields__
            if f != "traceEvents" and getattr(top, f) is not None
        }


def _mend(
    spans: list[tuple[int, int]],
    parts: list[Chunk | None],
    closes: list[tuple[int, dict[str, Any]]],
    local: Any,
) -> tuple[list[Chunk], dict[str, Any]] | None:
    """Every span's frame in document order, and the metadata, trusting a cut only once the
    span before it has decoded: its start is then known to lie between two events, and a span
    that decodes from there ends between two as well (a cut inside a string leaves it in the
    string; inside a nested value, unbalanced). A span that fails is joined with the next, up
    to ``MAX_JOIN`` times, then tried against each candidate closing bracket within them (a
    cut in the document's tail). None: the data is not what the fast path reads."""
    out, i, n = [], 0, len(spans)
    while i < n:
        part, j = parts[i], i
        while part is None and j + 1 < n and j - i < MAX_JOIN:
            j += 1
            part = local(spans[i][0], spans[j][1])
        if part is None:
            for close, meta in closes:  # within the joined spans: never a decode of the rest
                if (
                    spans[i][0] <= close <= spans[j][1]
                    and (part := local(spans[i][0], close)) is not None
                ):
                    return [*out, part], meta
            return None
        out.append(part)
        i = j + 1
    return out, closes[0][1]


class _Scheduler:
    """Chunks (byte spans of the spool) in, frames out in document order, a few queued to each
    helper at a time. With helpers, this thread only inflates and hands out work: with helper
    processes, decoding here too would hold the GIL its result thread needs to unpickle their
    frames (the 10x trace: 3.7 s with two helpers and an idle parent, 4.2 s with one helper plus
    the parent). Without helpers (or once they are lost) it decodes everything itself."""

    def __init__(self, spool: _Buffer, helpers: int, threads: bool = False) -> None:
        self.spool = spool  # with helpers: a _Slabs for threads, a _Spool (its file) for processes
        self.helpers = helpers
        self.todo: deque[tuple[int, int, int]] = deque()
        self.done: dict[int, Chunk | None] = {}
        self.inflight: dict[Future[Any], tuple[int, int, int]] = {}
        self.pool: Executor | None = None
        self.threads = threads  # helpers are threads (the native scanner) or processes
        self.spans: list[tuple[int, int]] = []
        self.released = 0  # spans whose spool pages are given back

    def add(self, start: int, end: int) -> None:
        self.todo.append((len(self.spans), start, end))
        self.spans.append((start, end))
        self._top_up()

    def start(self) -> None:
        if self.pool is not None or not self.helpers:
            return
        if self.threads:  # the native scanner decodes without the GIL: nothing to unpickle
            self.pool = ThreadPoolExecutor(self.helpers, thread_name_prefix="traceinsight-decode")
            return
        try:
            with single_thread_children():  # each helper's polars starts with one thread
                self.pool = ProcessPoolExecutor(
                    max_workers=self.helpers, mp_context=spawn_context()
                )
                for _ in range(self.helpers):  # spawn them now, inside the block
                    self.pool.submit(int)
        except (OSError, RuntimeError):
            self.pool = None  # no processes here (sandbox, limits): decode in this process

    def local(self, start: int, end: int) -> Chunk | None:
        with self.spool.view(start, end) as part:
            return decode_chunk(part)

    def _collect(self, block: bool = False) -> None:
        if block and self.inflight:
            wait_futures(list(self.inflight))
        for fut in [f for f in self.inflight if f.done()]:
            i, start, end = self.inflight.pop(fut)
            try:
                self.done[i] = fut.result()
            except Exception:  # noqa: BLE001 - a lost helper: decode its chunk here instead
                self.done[i] = self.local(start, end)

    def _top_up(self) -> None:
        if self.pool is None:
            return
        self._collect()
        self._release()
        per = IN_FLIGHT_PER_THREAD if self.threads else IN_FLIGHT_PER_HELPER
        while self.todo and len(self.inflight) < per * self.helpers:
            item = self.todo.popleft()  # in document order: the decoded prefix is released
            part = self.spool.view(item[1], item[2]) if self.threads else None
            try:
                if part is not None:
                    fut = self.pool.submit(_decode_view, part)
                else:
                    fut = self.pool.submit(decode_span, self.spool.path, item[1], item[2])  # type: ignore[attr-defined]
            except RuntimeError:  # broken pool
                if part is not None:
                    part.release()
                self.todo.appendleft(item)
                self.pool = None
                return
            self.inflight[fut] = item

    def throttle(self) -> None:
        """With helper threads, wait while more spans are queued than they have in flight: the
        slabs under queued spans are memory, and inflating further only adds to them."""
        while self.pool is not None and self.threads and self.todo:
            wait_futures(list(self.inflight), return_when="FIRST_COMPLETED")
            self._top_up()

    def _release(self) -> None:
        """Give back the spool's pages under spans decoded so far, in order up to the first one
        not yet decoded (or failed): the 10x trace's peak is then its frames and the spans in
        flight, not the whole document beside them. The last ``MAX_JOIN`` spans are kept for
        :meth:`_Cutter.finish` and :func:`_mend`, which may read them again."""
        release = getattr(self.spool, "release", None)
        while (
            release is not None
            and self.released + MAX_JOIN < len(self.spans)
            and self.done.get(self.released) is not None
        ):
            release(*self.spans[self.released])
            self.released += 1

    def results(self) -> list[Chunk | None]:
        """Each span's frame in order, None where it did not decode (see :func:`_mend`)."""
        while self.todo:
            if self.pool is not None:  # see the class docstring
                wait_futures(list(self.inflight), return_when="FIRST_COMPLETED")
                self._top_up()
                continue
            i, start, end = self.todo.popleft()
            self.done[i] = self.local(start, end)
            self._release()  # one process (batch workers): the spool shrinks as frames grow
        self._collect(block=True)
        return [self.done.get(i) for i in range(len(self.spans))]

    def close(self) -> None:
        if self.pool is not None:
            # not waiting for the helpers to exit: 50 ms on the 10x trace, and nothing of
            # theirs is read after this (a spool still mapped there outlives its unlink)
            self.pool.shutdown(wait=False, cancel_futures=True)
            self.pool = None


def decode(data: bytes) -> Parsed | None:
    """:func:`decode_path` for a document already in memory (what the spool cannot take), in
    this process: (raw event frame, top-level metadata, era note, non-X event count, warnings),
    or None to fall back."""
    buf = _Buffer(data)
    cutter = _Cutter(buf)
    sched = _Scheduler(buf, 0)
    try:
        for span in cutter.cut():
            sched.add(*span)
        return _finish(cutter, sched, [])
    except _Unusable:
        return None


def decode_path(path: Path, max_bytes: int | None, helpers: int = 0) -> Parsed | None:
    """Inflate ``path`` into a spool, dropping whitespace padding, cutting spans as it fills
    and handing them to ``helpers`` threads or processes (see :class:`_Scheduler`; decoded here
    without helpers, and below two chunks for threads or ``MIN_HELPER_BYTES`` for processes).
    Same result as :func:`decode`; None to fall back (truncated, unusual layout, unexpected
    types, no room for the spool). Raises InputError for an input over
    ``max_bytes`` or one whose spool and frames would not fit in the memory available."""
    # ~10-20 MB inflated per read
    stream = Decompressed(path, max_bytes, read_size=1024 * 1024, squeeze=True)
    hint = inflated_size(path, stream.kind)
    # a gzip's ISIZE is mod 4 GiB: its compressed size also tells a large document; threads
    # start at once, processes take ~0.3 s to import
    native = native_scanner()
    large = max(hint, path.stat().st_size) >= (2 * CHUNK_BYTES if native else MIN_HELPER_BYTES)
    threads = native and large and helpers > 0
    try:
        spool: _Slabs | _Spool = _Slabs() if threads else _Spool(hint)
    except (OSError, _NoRoom):
        return None
    sched = _Scheduler(spool, helpers if large else 0, threads)
    try:
        sched.start()  # helper processes import while this one inflates the first blocks
        cutter = _Cutter(spool)
        for block in stream:
            spool.write(block)
            spans = cutter.cut()
            spool.cut(spans)
            for span in spans:
                sched.add(*span)
            sched.throttle()
        if stream.truncated:
            return None
        notes = [padding_note(stream.padding)] if stream.padding else []
        return _finish(cutter, sched, notes)
    except _NoRoom:
        # room: what the spool could have used, the margin left for everything else excluded
        # (slabs are never more than a few spans)
        held = spool.len if isinstance(spool, _Spool) else 0
        room = max(0, resources.available_bytes() + held - SPOOL_MARGIN_BYTES)
        raise resources.too_big(path, spool.len, room, stream.limit) from None
    except (_Unusable, OSError, BufferError):  # OSError: no room left (another parse took it)
        return None
    finally:
        sched.close()
        spool.close()


def _finish(cutter: _Cutter, sched: _Scheduler, notes: list[str]) -> Parsed | None:
    """The last span in, every span's frame out, in document order."""
    lo = sched.spans[-MAX_JOIN][0] if len(sched.spans) >= MAX_JOIN else 0
    start, closes = cutter.finish(lo)
    sched.spool.cut([(start, closes[0][0])])
    sched.add(start, closes[0][0])
    mended = _mend(sched.spans, sched.results(), closes, sched.local)
    if mended is None:
        return None
    parts, meta = mended
    df = pl.concat([p.frame for p in parts], how="vertical_relaxed")
    other = sum(p.n_other for p in parts)
    if df.height == 0 and other and cutter.bare:
        return None  # an array of something else: let the robust path explain
    # each chunk's side rows point into its own frame: shift them to the concatenation's rows
    offsets = [0]
    for part in parts[:-1]:
        offsets.append(offsets[-1] + part.frame.height)
    side = pl.concat(
        [p.side.with_columns(pl.col("row") + o) for p, o in zip(parts, offsets, strict=True)]
    )
    memory = pl.concat([p.memory for p in parts])
    era = "2020 bare event array" if cutter.bare else ""
    return Parsed(df, meta, era, other, notes, side, memory)
