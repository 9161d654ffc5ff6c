"""The I/O floor: output checks and atomic writes (a temp file beside the target, renamed into place)."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

from traceinsight.errors import OutputError
from traceinsight.inputs import discover_rank_files


def check_writable(out: Path, force: bool) -> None:
    if out.exists() and not force:
        raise OutputError("already exists; pass --force to overwrite", str(out))
    if not out.parent.exists():
        raise OutputError(f"directory {out.parent} does not exist", str(out))


def same_file(a: Path, b: Path) -> bool:
    """``a`` and ``b`` name one file: through symlinks and hard links where both exist, by
    their resolved paths otherwise."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return a.resolve() == b.resolve()


def input_files(path: Path) -> list[Path]:
    """The files an input reads: itself, or a job directory's rank files."""
    try:
        return discover_rank_files(path) if path.is_dir() else [path]
    except OSError:  # an unreadable directory: reading it fails later, with its own message
        return [path]


def refuse_replacing_inputs(
    outputs: Iterable[Path | str | None], inputs: Iterable[Path | None]
) -> None:
    """An output never replaces an input, --force or not (checked before anything is read);
    ``-`` (stdout) and None are no files."""
    sources = [f for p in inputs if p is not None for f in input_files(Path(p))]
    for out in outputs:
        if out is None or str(out) == "-":
            continue
        hit = next((src for src in sources if same_file(Path(out), src)), None)
        if hit is not None:
            raise OutputError(
                f"is the input {hit}; an output never replaces an input (--force or not): "
                "choose another path",
                str(out),
            )


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
