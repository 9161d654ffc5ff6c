"""Reading inputs safely: read-only, gzip and xz detected by content, decompressed size capped."""

from __future__ import annotations

import contextlib
import lzma
import os
import re
import tempfile
import zlib

try:  # ISA-L's inflate: the same API as zlib's, 40% faster (see pyproject.toml)
    from isal import isal_zlib as _inflate
except ImportError:  # pragma: no cover - a platform without its wheel
    _inflate = zlib  # type: ignore[misc]
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from traceinsight.errors import InputError
from traceinsight.resources import fmt_size

# Decompressed JSON larger than this is refused (a gzip bomb, or a trace beyond this machine).
# Override with TRACEINSIGHT_MAX_BYTES or the CLI's --max-bytes.
DEFAULT_MAX_BYTES = 8 * 1024**3
GZIP_MAGIC = b"\x1f\x8b"
# xz (the standard library's lzma): Kineto JSON packs to about 0.55 of gzip -9's size at
# ~275 MB/s of output, so archives and this project's own fixtures keep traces as .json.xz.
XZ_MAGIC = b"\xfd7zXZ\x00"
COMPRESSED_KINDS = ("gzip", "xz")
SQLITE_MAGIC = b"SQLite format 3\x00"
_CHUNK = 8 * 1024 * 1024
# Inflated bytes per zlib call: a bomb's megabyte of input is not one gigabyte block.
_BLOCK_MAX = 4 * 1024 * 1024
# Whitespace runs at least this long are padding: no JSON writer's layout makes them, and inside a
# string (spaces only: raw tabs and newlines are not JSON) such a value is pathological anyway.
# They are cut to one space as they stream, so a whitespace bomb is never held.
PAD_RUN = 64 * 1024
_STRIDE = 4096  # one sampled byte per stride finds runs of PAD_RUN without looking at every byte
_WS = b" \t\r\n"
_WS_AS_ZERO = bytes(0 if c in _WS else 1 for c in range(256))
_SAMPLED_RUN = bytes(PAD_RUN // _STRIDE - 1)  # consecutive whitespace samples in any run of PAD_RUN
_PAD = re.compile(rb"(?<![ \t\r\n])[ \t\r\n]{%d,}" % PAD_RUN)


def max_bytes_default() -> int:
    raw = os.environ.get("TRACEINSIGHT_MAX_BYTES")
    return int(raw) if raw and raw.isdigit() else DEFAULT_MAX_BYTES


# A Git LFS pointer: what a clone without `git lfs pull` holds in place of a large file (many
# public traces are stored so: audit 5 met 7 among its candidates)
LFS_POINTER = b"version https://git-lfs.github.com/spec/v1"


ZIP_MAGIC = b"PK\x03\x04"
PARQUET_MAGIC = b"PAR1"
# bytes JSON text never holds raw (it escapes them): a NUL or another control character in
# the first bytes is a binary file (an XPlane protobuf, a Parquet file)
_BINARY_BYTES = bytes(range(0, 9)) + bytes(range(14, 32))


def sniff(path: Path) -> str:
    """'gzip', 'xz', 'sqlite', 'zip', 'parquet', 'binary', 'json', 'lfs-pointer' or 'empty',
    from the first bytes."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(512)
    except IsADirectoryError:
        raise InputError("is a directory, expected a trace file", str(path)) from None
    except OSError as exc:
        raise InputError(f"cannot open: {exc.strerror or exc}", str(path)) from None
    if not head:
        return "empty"
    if head.startswith(GZIP_MAGIC):
        return "gzip"
    if head.startswith(XZ_MAGIC):
        return "xz"
    if head.startswith(SQLITE_MAGIC):
        return "sqlite"
    if head.startswith(LFS_POINTER):
        return "lfs-pointer"
    if head.startswith(ZIP_MAGIC):
        return "zip"
    if head.startswith(PARQUET_MAGIC):
        return "parquet"
    if any(b in _BINARY_BYTES for b in head):
        return "binary"
    return "json"


def head_bytes(path: Path, n: int = 4096, max_bytes: int | None = None) -> bytes:
    """The first ``n`` (decompressed) bytes, for detecting a format by content."""
    try:
        for block in Decompressed(path, max_bytes, read_size=n):
            return block[:n]
    except InputError:
        pass  # damaged: the format's parser says how, in its own words
    return b""


# How long a read waits for a writer's lock before the file is reported locked: a profiler
# holds it for its whole export, so waiting longer (sqlite3's default is 5 s) only delays the
# message.
SQLITE_LOCK_WAIT_S = 1.0


def sqlite_names(path: Path) -> set[str]:
    """The tables and views of an SQLite file (read-only), empty when it cannot be read."""
    import sqlite3
    import urllib.parse

    uri = "file:" + urllib.parse.quote(str(path.resolve())) + "?mode=ro"
    try:
        con = sqlite3.connect(uri, uri=True, timeout=SQLITE_LOCK_WAIT_S)
        try:
            rows = con.execute(
                "SELECT name FROM sqlite_master WHERE type IN ('table', 'view')"
            ).fetchall()
        finally:
            con.close()
    except sqlite3.OperationalError as exc:
        if "locked" in str(exc):  # before any parser: the file may be either profiler's
            raise InputError(
                "SQLite database is locked (is the profiler still writing it?)", str(path)
            ) from None
        return set()  # the parser reports the damage with its own message
    except sqlite3.DatabaseError:
        return set()
    return {r[0] for r in rows}


# Kineto JSON inflates ~20-30x from xz; a spool sized on this grows past a short guess anyway.
XZ_RATIO_GUESS = 20


def inflated_size(path: Path, kind: str) -> int:
    """The document's size as the file tells it: the file's own, for gzip the trailer's ISIZE
    (mod 4 GiB, last member), for xz the last stream's index (a guess where unreadable)."""
    size = path.stat().st_size
    if kind == "gzip":
        with open(path, "rb") as fh:
            fh.seek(max(0, size - 4))
            return int.from_bytes(fh.read(4), "little")
    if kind == "xz":
        return xz_inflated_size(path) or size * XZ_RATIO_GUESS
    return size


def xz_inflated_size(path: Path) -> int:
    """The uncompressed size the last xz stream's index records, 0 where it cannot be read:
    the footer's backward size locates the index, which holds a record count, then per block
    its unpadded and uncompressed sizes, each a little-endian base-128 number."""
    try:
        with open(path, "rb") as fh:
            end = fh.seek(0, 2)
            while end >= 12:  # stream padding: zero bytes in fours after the footer
                fh.seek(end - 4)
                if fh.read(4) != bytes(4):
                    break
                end -= 4
            fh.seek(max(0, end - 12))
            footer = fh.read(12)
            if len(footer) < 12 or footer[10:] != b"YZ":
                return 0
            index_size = (int.from_bytes(footer[4:8], "little") + 1) * 4
            fh.seek(max(0, end - 12 - index_size))
            index = fh.read(index_size)
    except OSError:
        return 0
    if not index or index[0] != 0:  # the index indicator
        return 0
    numbers: list[int] = []
    value = shift = 0
    for byte in index[1:]:
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            numbers.append(value)
            value = shift = 0
            if len(numbers) == 1 + 2 * numbers[0]:
                return sum(numbers[2::2])
    return 0


def stream_cut_note(kind: str) -> str:
    """How a trace whose compressed stream ends early is described (its notes begin so)."""
    return f"the {kind} stream ends early"


def padding_note(dropped: int) -> str:
    return f"{dropped:,} bytes of whitespace padding (runs of {PAD_RUN // 1024} KiB or more) were skipped"


def squeeze(block: bytes) -> tuple[bytes, int]:
    """``block`` with each whitespace run of ``PAD_RUN`` bytes or more cut to one space, and the
    number of bytes dropped. Only sampled bytes are looked at unless a run is there."""
    samples = block[_STRIDE - 1 :: _STRIDE].translate(_WS_AS_ZERO)
    at = samples.find(_SAMPLED_RUN)
    if at < 0:
        return block, 0
    if b"\x01" not in samples and len(block) >= PAD_RUN and not block.translate(None, _WS):
        return b" ", len(block) - 1  # a bomb's block: twice as fast as the regex
    parts, pos, dropped = [], 0, 0
    while at >= 0:
        # the runs holding these samples start after the last non-blank sample before them and
        # end before the next one
        nxt = samples.find(b"\x01", at)
        end = len(block) if nxt < 0 else nxt * _STRIDE + _STRIDE - 1
        for m in _PAD.finditer(block, max(pos, at * _STRIDE), end):
            parts += (block[pos : m.start()], b" ")
            dropped += m.end() - m.start() - 1
            pos = m.end()
        if nxt < 0:
            break
        at = samples.find(_SAMPLED_RUN, nxt)
    if not parts:
        return block, 0
    parts.append(block[pos:])
    return b"".join(parts), dropped


class Decompressed:
    """The file's (decompressed) bytes as a stream of blocks; ``truncated`` is set once the
    stream is exhausted if the gzip or xz data ended early.

    Decompression is streamed so a bomb is stopped at ``max_bytes`` rather than after it has
    filled memory, and so a consumer can start on the first blocks while the rest inflate.
    With ``squeeze``, whitespace padding is dropped as it streams (:func:`squeeze`; counted in
    ``padding``); ``max_bytes`` still counts it. ``room``: the most bytes the consumer can keep
    in the memory there is (see :mod:`traceinsight.resources`); more is refused as it arrives.
    """

    def __init__(
        self,
        path: Path,
        max_bytes: int | None = None,
        read_size: int = _CHUNK,
        *,
        squeeze: bool = False,
        room: int | None = None,
    ) -> None:
        self.path = path
        self.limit = max_bytes or max_bytes_default()
        self.kind = sniff(path)
        if self.kind == "empty":
            raise InputError("empty file (0 bytes)", str(path))
        self.read_size = read_size
        self.truncated = False
        self.squeeze = squeeze
        self.room = room
        self.padding = 0  # whitespace bytes dropped
        self.kept = 0  # bytes yielded

    def __iter__(self) -> Iterator[bytes]:
        for block in self._raw():
            if self.squeeze:
                block, dropped = squeeze(block)
                self.padding += dropped
            self.kept += len(block)
            if self.room is not None and self.kept > self.room:
                from traceinsight.resources import too_big

                raise too_big(self.path, self.kept, self.room, self.limit)
            yield block

    def _raw(self) -> Iterator[bytes]:
        path, limit = self.path, self.limit
        try:
            fh = open(path, "rb")  # noqa: SIM115 - closed by the with-block below
        except OSError as exc:
            raise InputError(f"cannot open: {exc.strerror or exc}", str(path)) from None
        with fh:
            if self.kind not in COMPRESSED_KINDS:
                size = os.fstat(fh.fileno()).st_size
                if size > limit:
                    raise InputError(
                        f"file is {fmt_size(size)}, over the {fmt_size(limit)} limit (--max-bytes)",
                        str(path),
                    )
                while block := fh.read(self.read_size):
                    yield block
                return
            yield from self._inflate(fh)

    def _inflate(self, fh: BinaryIO) -> Iterator[bytes]:
        """gzip or xz blocks of at most ``_BLOCK_MAX`` bytes, refused past ``limit``; gzip
        members or xz streams written one after another are read as one document."""
        path, limit, kind = self.path, self.limit, self.kind
        size = 0
        d = _decompressor(kind)
        try:
            while True:
                chunk = fh.read(self.read_size)
                if not chunk:
                    self.truncated = not d.eof
                    break
                while True:
                    if d.eof:  # one member or stream ended: what follows starts the next
                        if kind == "xz":
                            chunk = chunk.lstrip(b"\x00")  # xz's stream padding
                        if not chunk:
                            break
                        d = _decompressor(kind)
                    cap = min(_BLOCK_MAX, max(1, limit + 1 - size))
                    part = d.decompress(chunk, cap)
                    size += len(part)
                    if size > limit:
                        raise InputError(
                            f"decompresses to more than {fmt_size(limit)} (limit --max-bytes); refusing",
                            str(path),
                        )
                    if part:
                        yield part
                    # input held back: zlib hands it back, lzma keeps it (fed b"" for more)
                    chunk = d.unused_data if d.eof else getattr(d, "unconsumed_tail", b"")
                    if not chunk and len(part) < cap:  # a full block: more may wait inside
                        break
        except (zlib.error, _inflate.error, lzma.LZMAError, EOFError) as exc:
            if not size:
                raise InputError(f"corrupt {kind} data ({exc})", str(path)) from None
            self.truncated = True
        if self.truncated and not size:
            raise InputError(f"truncated {kind}: nothing could be decompressed", str(path))


def _decompressor(kind: str) -> Any:
    if kind == "xz":
        return lzma.LZMADecompressor(lzma.FORMAT_XZ)
    return _inflate.decompressobj(wbits=47)  # the gzip header


@contextlib.contextmanager
def unpacked(path: Path, max_bytes: int | None = None) -> Iterator[Path]:
    """A gzip- or xz-packed database (an Nsight Systems or rocprofv3 SQLite export archived
    packed: SQLite files shrink 7-13x under xz) unpacked into a private temporary file, removed
    after; SQLite reads only files, and the input itself is never touched. Its decompressed size
    is capped as a JSON trace's is (--max-bytes)."""
    with tempfile.TemporaryDirectory(prefix="traceinsight-") as tmp:
        out = Path(tmp) / "unpacked.sqlite"
        stream = Decompressed(path, max_bytes)
        try:
            with open(out, "wb") as fh:
                for block in stream:
                    fh.write(block)
        except OSError as exc:  # the temporary directory's disk full
            raise InputError(
                f"cannot unpack the database into {tmp}: {exc.strerror or exc} "
                "(set TMPDIR to a disk with room)",
                str(path),
            ) from None
        if stream.truncated:  # a database cut short is no database: refuse, never half-read it
            raise InputError(f"truncated {stream.kind}: the packed database ends early", str(path))
        yield out


def read_bytes(
    path: Path, max_bytes: int | None = None, *, squeeze: bool = False, room: int | None = None
) -> tuple[bytes, bool]:
    """The file's (decompressed) bytes and whether the gzip stream ended early; ``squeeze`` and
    ``room`` as in :class:`Decompressed`."""
    stream = Decompressed(path, max_bytes, squeeze=squeeze, room=room)
    data = b"".join(stream)
    return data, stream.truncated
