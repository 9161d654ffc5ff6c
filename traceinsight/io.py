"""The I/O floor: output checks and atomic writes (a temp file beside the target, renamed into place)."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from traceinsight.errors import OutputError


def check_writable(out: Path, force: bool) -> None:
    if out.exists() and not force:
        raise OutputError("already exists; pass --force to overwrite", str(out))
    if not out.parent.exists():
        raise OutputError(f"directory {out.parent} does not exist", str(out))


def check_outputs(report: Path | None, json_out: str | None, force: bool) -> None:
    """A command's report and ``--json`` file (``-`` is stdout), refused before any analysis."""
    if report is not None:
        check_writable(report, force)
    if json_out and json_out != "-":
        check_writable(Path(json_out), force)


@contextlib.contextmanager
def atomic_path(out: Path) -> Iterator[Path]:
    """Yield a temp path in the target's directory; rename it over ``out`` on success."""
    out = Path(out)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent or ".")
    os.close(fd)
    try:
        yield Path(tmp)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp creates 0600; outputs are ordinary files
        os.replace(tmp, out)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_text_atomic(out: Path, text: str) -> None:
    with atomic_path(out) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_bytes_atomic(out: Path, data: bytes) -> None:
    with atomic_path(out) as tmp:
        tmp.write_bytes(data)
