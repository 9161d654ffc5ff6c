"""The machine-readable result (``--json``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, BinaryIO

import orjson

from traceinsight.io import write_bytes_atomic


def dumps(doc: dict[str, Any]) -> bytes:
    # Analyzer results can hold numpy-free polars scalars only; default=str guards the rest.
    return orjson.dumps(doc, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS, default=str)


def write_json(doc: dict[str, Any], out: Path) -> None:
    write_bytes_atomic(out, dumps(doc) + b"\n")


def write_all(out: BinaryIO, data: bytes) -> None:
    """All of ``data``: a buffered write may stop short where a pipe's reader went away or a
    signal came, and drops the rest; the next write raises the error (BrokenPipeError)."""
    view = memoryview(data)
    while view:
        n = out.write(view)
        if not n:
            raise BrokenPipeError("stdout accepts no more")
        view = view[n:]


def emit_json(doc: dict[str, Any], json_out: str | None) -> None:
    """``--json -`` writes to stdout, ``--json FILE`` to a file (atomically), None does nothing."""
    import sys

    if json_out == "-":
        write_all(sys.stdout.buffer, dumps(doc) + b"\n")
    elif json_out:
        write_json(doc, Path(json_out))
