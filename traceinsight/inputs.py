"""What an input is, before anything is parsed: trace file suffixes, the rank files of a job
directory, and rank numbers (from the traces' own metadata, else file names, else order).

Light on purpose: batch discovery and the job runner both use it, and neither needs the
analysis stack to decide what to analyze.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

TRACE_SUFFIXES = (
    ".json",
    ".json.gz",
    ".json.xz",
    ".sqlite",
    ".sqlite.gz",
    ".sqlite.xz",
    ".nsys-rep",
)
ARCHIVE_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tar.xz")
BELOW_LIMIT = 10_000  # directory entries looked at, at most, before saying what lies below
RANK_IN_NAME = re.compile(r"(?:rank|worker)[-_.]?(\d+)", re.IGNORECASE)


def is_trace_name(name: str) -> bool:
    """A file name that may hold a trace (not a ``*.truth.json`` beside one, not hidden)."""
    return (
        name.endswith(TRACE_SUFFIXES)
        and not name.endswith(".truth.json")
        and not name.startswith(".")
    )


def discover_rank_files(directory: Path) -> list[Path]:
    """Trace files of a job directory: ``*.pt.trace.json[.gz|.xz]`` if any, else any trace-like file."""
    files = sorted(p for p in directory.iterdir() if p.is_file())
    kineto = [p for p in files if ".pt.trace.json" in p.name]
    if kineto:
        return kineto
    return [
        p for p in files if p.name.endswith(TRACE_SUFFIXES) and not p.name.endswith(".truth.json")
    ]


def holds_traces_below(directory: Path) -> bool:
    """Trace files in subdirectories of ``directory``, or archives in it: a collection for
    ``batch`` rather than one job (bounded: a huge tree is not walked to its end)."""
    seen = 0
    for top, dirs, files in os.walk(directory):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        below = Path(top) != directory
        if any(f.endswith(ARCHIVE_SUFFIXES) or (below and is_trace_name(f)) for f in files):
            return True
        seen += len(files) + len(dirs)
        if seen > BELOW_LIMIT:
            break
    return False


def no_traces_message(directory: Path) -> str:
    """Why a directory is no job, and what to run where it holds traces deeper down."""
    msg = "directory holds no trace files (*.pt.trace.json[.gz|.xz], *.json, *.sqlite[.gz|.xz])"
    if holds_traces_below(directory):
        msg += (
            f"; its subdirectories or archives do: for many traces run "
            f"'traceinsight batch {directory} -o OUTDIR'"
        )
    return msg


def rank_from_name(name: str) -> int | None:
    m = RANK_IN_NAME.search(name)
    return int(m.group(1)) if m else None


def choose_ranks(meta: list[int | None], paths: list[Path]) -> tuple[list[int], str | None]:
    """Ranks from distributedInfo, else from file names, else sorted order (with a warning)."""
    if all(r is not None for r in meta) and len(set(meta)) == len(meta):
        return [int(r) for r in meta if r is not None], None
    named = [rank_from_name(p.name) for p in paths]
    if all(r is not None for r in named) and len(set(named)) == len(named):
        return [
            int(r) for r in named if r is not None
        ], "ranks taken from file names (no usable distributedInfo)"
    return list(
        range(len(paths))
    ), "ranks could not be read from distributedInfo or file names; numbered in sorted file order"
