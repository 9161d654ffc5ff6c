"""What a batch analyzes: items found under directories, archives and files.

A directory whose trace files carry distinct ranks in their names is one job; archive members
are copied to generated names under a work directory (member paths are never disk paths).
"""

from __future__ import annotations

import hashlib
import os
import re
import tarfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from traceinsight.inputs import is_trace_name, rank_from_name

ARCHIVE_RE = re.compile(r"\.(tar|tar\.gz|tgz|tar\.bz2|tar\.xz)$")
MAX_MEMBER_BYTES = 8 * 1024**3


@dataclass(frozen=True)
class Item:
    label: str  # what the user knows it by: a path, or archive.tar.gz!member
    path: str  # local file or directory to analyze
    kind: str  # "trace" | "job" (a trace file holding several ranks becomes a job when analyzed)
    mtime_ns: int
    key: str  # safe, unique stem for output files


@dataclass(frozen=True)
class Failure:
    """An item that could not even be set up for analysis (missing path, unreadable archive)."""

    item: Item
    message: str


def item_key(label: str) -> str:
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", Path(label.replace("!", "/")).name)[:60] or "trace"
    return f"{stem}-{hashlib.sha1(label.encode()).hexdigest()[:8]}"


def _item(label: str, path: str = "", kind: str = "trace", mtime_ns: int = 0) -> Item:
    return Item(label, path, kind, mtime_ns, item_key(label))


def _group_dir(d: Path, files: list[Path]) -> list[Item]:
    """A directory whose trace files each carry a distinct rank in their name is one job."""
    if len(files) >= 2:
        ranks = [rank_from_name(f.name) for f in files]
        if all(r is not None for r in ranks) and len(set(ranks)) == len(ranks):
            return [_item(str(d), str(d), "job", max(f.stat().st_mtime_ns for f in files))]
    return [_item(str(f), str(f), "trace", f.stat().st_mtime_ns) for f in files]


def _extract_group(
    tar: tarfile.TarFile,
    archive: Path,
    members: list[tarfile.TarInfo],
    gdir: Path,
    failures: list[Failure],
) -> list[tuple[Path, str]]:
    """Copy ``members`` into ``gdir`` under safe names; (local path, label) of each."""
    gdir.mkdir(parents=True, exist_ok=True)
    local = []
    for m in sorted(members, key=lambda m: m.name):
        label = f"{archive}!{m.name}"
        if m.size > MAX_MEMBER_BYTES:
            failures.append(Failure(_item(label), "archive member larger than the size limit"))
            continue
        src = tar.extractfile(m)
        if src is None:
            continue
        dest = gdir / re.sub(r"[^A-Za-z0-9._-]+", "_", Path(m.name).name)
        with src, open(dest, "wb") as out:
            while chunk := src.read(1 << 20):
                out.write(chunk)
        local.append((dest, label))
    return local


def _from_archive(archive: Path, workdir: Path) -> tuple[list[Item], list[Failure]]:
    """Trace members, grouped by their folder in the archive (links and devices skipped)."""
    items: list[Item] = []
    failures: list[Failure] = []
    base = workdir / item_key(str(archive))
    try:
        with tarfile.open(archive, "r:*") as tar:
            groups: dict[str, list[tarfile.TarInfo]] = {}
            for m in tar.getmembers():
                if m.isfile() and is_trace_name(Path(m.name).name):
                    groups.setdefault(str(Path(m.name).parent), []).append(m)
            mtime = archive.stat().st_mtime_ns
            for parent, ms in sorted(groups.items()):
                gdir = base / hashlib.sha1(parent.encode()).hexdigest()[:10]
                local = _extract_group(tar, archive, ms, gdir, failures)
                names = dict(local)
                for it in _group_dir(gdir, [d for d, _ in local]):
                    label = f"{archive}!{parent}" if it.kind == "job" else names[Path(it.path)]
                    items.append(_item(label, it.path, it.kind, mtime))
    except (tarfile.TarError, OSError, EOFError) as exc:
        failures.append(Failure(_item(str(archive), str(archive)), f"unreadable archive: {exc}"))
    return items, failures


def _walk(root_dir: Path, workdir: Path) -> tuple[list[Item], list[Failure]]:
    items: list[Item] = []
    failures: list[Failure] = []
    for root, dirs, files in os.walk(root_dir):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        rootp = Path(root)
        if workdir in (rootp, *rootp.parents):
            continue
        items.extend(_group_dir(rootp, sorted(rootp / f for f in files if is_trace_name(f))))
        for f in sorted(files):
            if ARCHIVE_RE.search(f):
                a_items, a_fail = _from_archive(rootp / f, workdir)
                items.extend(a_items)
                failures.extend(a_fail)
    return items, failures


def discover(paths: Iterable[Path], workdir: Path) -> tuple[list[Item], list[Failure]]:
    """Every item under ``paths`` (each once), and what could not be set up."""
    items: list[Item] = []
    failures: list[Failure] = []
    for p in paths:
        if not p.exists():
            failures.append(Failure(_item(str(p), str(p)), "no such file or directory"))
        elif p.is_dir():
            found, failed = _walk(p, workdir)
            items.extend(found)
            failures.extend(failed)
        elif ARCHIVE_RE.search(p.name) or (p.suffix == ".gz" and tarfile.is_tarfile(p)):
            found, failed = _from_archive(p, workdir)
            items.extend(found)
            failures.extend(failed)
        else:
            items.append(_item(str(p), str(p), "trace", p.stat().st_mtime_ns))
    unique = {it.key: it for it in reversed(items)}  # first occurrence wins
    return [it for it in items if unique.get(it.key) is it], failures
