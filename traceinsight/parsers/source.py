"""Reading inputs safely: read-only, gzip detected by content, decompressed size capped."""

from __future__ import annotations

import os
import zlib
from collections.abc import Iterator
from pathlib import Path

from traceinsight.errors import InputError

# Decompressed JSON larger than this is refused (a gzip bomb, or a trace beyond this machine).
# Override with TRACEINSIGHT_MAX_BYTES or the CLI's --max-bytes.
DEFAULT_MAX_BYTES = 8 * 1024**3
GZIP_MAGIC = b"\x1f\x8b"
SQLITE_MAGIC = b"SQLite format 3\x00"
_CHUNK = 8 * 1024 * 1024


def max_bytes_default() -> int:
    raw = os.environ.get("TRACEINSIGHT_MAX_BYTES")
    return int(raw) if raw and raw.isdigit() else DEFAULT_MAX_BYTES


def sniff(path: Path) -> str:
    """'gzip', 'sqlite', 'json' or 'empty', from the first bytes."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(16)
    except IsADirectoryError:
        raise InputError("is a directory, expected a trace file", str(path)) from None
    except OSError as exc:
        raise InputError(f"cannot open: {exc.strerror or exc}", str(path)) from None
    if not head:
        return "empty"
    if head.startswith(GZIP_MAGIC):
        return "gzip"
    if head.startswith(SQLITE_MAGIC):
        return "sqlite"
    return "json"


class Decompressed:
    """The file's (decompressed) bytes as a stream of blocks; ``truncated`` is set once the
    stream is exhausted if the gzip data ended early.

    Decompression is streamed so a bomb is stopped at ``max_bytes`` rather than after it has
    filled memory, and so a consumer can start on the first blocks while the rest inflate.
    """

    def __init__(self, path: Path, max_bytes: int | None = None, read_size: int = _CHUNK) -> None:
        self.path = path
        self.limit = max_bytes or max_bytes_default()
        self.kind = sniff(path)
        if self.kind == "empty":
            raise InputError("empty file (0 bytes)", str(path))
        self.read_size = read_size
        self.truncated = False

    def __iter__(self) -> Iterator[bytes]:
        path, limit = self.path, self.limit
        try:
            fh = open(path, "rb")  # noqa: SIM115 - closed by the with-block below
        except OSError as exc:
            raise InputError(f"cannot open: {exc.strerror or exc}", str(path)) from None
        with fh:
            if self.kind != "gzip":
                size = os.fstat(fh.fileno()).st_size
                if size > limit:
                    raise InputError(
                        f"file is {size / 1e9:.1f} GB, over the {limit / 1e9:.1f} GB limit (--max-bytes)",
                        str(path),
                    )
                while block := fh.read(self.read_size):
                    yield block
                return
            size = 0
            d = zlib.decompressobj(wbits=47)  # gzip header, multi-member handled below
            try:
                while True:
                    chunk = fh.read(self.read_size)
                    if not chunk:
                        self.truncated = not d.eof
                        break
                    while chunk:
                        part = d.decompress(chunk, max(1, limit + 1 - size))
                        size += len(part)
                        if size > limit:
                            raise InputError(
                                f"decompresses to more than {limit / 1e9:.1f} GB (limit --max-bytes); refusing",
                                str(path),
                            )
                        if part:
                            yield part
                        chunk = d.unconsumed_tail
                        if d.eof and d.unused_data:  # concatenated gzip members
                            rest = d.unused_data
                            d = zlib.decompressobj(wbits=47)
                            chunk = rest
            except zlib.error as exc:
                if not size:
                    raise InputError(f"corrupt gzip data ({exc})", str(path)) from None
                self.truncated = True
            if self.truncated and not size:
                raise InputError("truncated gzip: nothing could be decompressed", str(path))


def read_bytes(path: Path, max_bytes: int | None = None) -> tuple[bytes, bool]:
    """The file's (decompressed) bytes and whether the gzip stream ended early."""
    stream = Decompressed(path, max_bytes)
    data = b"".join(stream)
    return data, stream.truncated
