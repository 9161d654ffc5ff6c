"""How much memory this process can still take, before it commits to holding an input.

The kernel's MemAvailable alone is not the answer: a container's cgroup limit (v1 or v2) or an
address-space limit (``ulimit -v``, ``prlimit --as``) can be far lower, and going past the first
gets the process killed without a word (exit 137). Files in /dev/shm are memory too.
"""

from __future__ import annotations

import resource
from pathlib import Path

from traceinsight.errors import InputError

CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_CGROUP = Path("/proc/self/cgroup")
_UNLIMITED = 1 << 62  # cgroup v1 writes "no limit" as a page-rounded 2**63 - 1


def available_bytes() -> int:
    """Bytes this process can still allocate: the least of MemAvailable, what each memory cgroup
    it is in (and their parents) leaves, and what RLIMIT_AS leaves of the address space."""
    return min(_meminfo_available(), _cgroup_headroom(), _address_space_headroom())


def too_big(path: Path | str, kept: int, room: int, limit: int) -> InputError:
    """The refusal for an input that does not fit: one line, naming the limit option."""
    return InputError(
        f"does not fit in the memory available: over {fmt_size(kept)} of JSON to hold, room for "
        f"{fmt_size(room)} (free memory, cgroup and address-space limits); refusing "
        f"(the input limit, --max-bytes, is {fmt_size(limit)})",
        str(path),
    )


def fmt_size(n: int) -> str:
    """Bytes in the largest binary unit that keeps the number at 1 or more (``--max-bytes``
    counts K, M, G in powers of 1024): ``1000 bytes``, ``1.5 MiB``, ``8 GiB``."""
    for unit, scale in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f}".removesuffix(".0") + f" {unit}"
    return f"{n} byte" if n == 1 else f"{n} bytes"


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except (OSError, ValueError):
        return None
    return int(text) if text.isdigit() else None  # "max" (v2, no limit) is not a number


def _meminfo_available() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return _UNLIMITED


def _cgroup_dirs() -> list[tuple[Path, str, str]]:
    """(directory, limit file, usage file) of each memory cgroup this process is in, its
    ancestors included (a parent's limit binds too)."""
    out = []
    try:
        lines = PROC_CGROUP.read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        if line.count(":") < 2:
            continue
        _, controllers, rel = line.split(":", 2)
        if controllers == "":  # v2: one unified hierarchy
            base, files = (
                CGROUP_ROOT / "unified" if (CGROUP_ROOT / "unified").is_dir() else CGROUP_ROOT,
                ("memory.max", "memory.current"),
            )
        elif "memory" in controllers.split(","):
            base, files = CGROUP_ROOT / "memory", ("memory.limit_in_bytes", "memory.usage_in_bytes")
        else:
            continue
        parts = [p for p in rel.split("/") if p]
        for depth in range(len(parts), -1, -1):
            out.append((base.joinpath(*parts[:depth]), *files))
    return out


def _cgroup_headroom() -> int:
    room = _UNLIMITED
    for folder, limit_file, usage_file in _cgroup_dirs():
        limit = _read_int(folder / limit_file)
        usage = _read_int(folder / usage_file)
        if limit is None or usage is None or limit >= _UNLIMITED:
            continue
        # usage counts page cache the kernel would reclaim first: the working set is without it
        room = min(room, max(0, limit - usage + _inactive_file(folder)))
    return room


def _inactive_file(folder: Path) -> int:
    try:
        for line in (folder / "memory.stat").read_text().splitlines():
            key, _, value = line.partition(" ")
            if key in ("inactive_file", "total_inactive_file") and value.strip().isdigit():
                return int(value)
    except OSError:
        pass
    return 0


def _address_space_headroom() -> int:
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        return _UNLIMITED
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmSize:"):
                return max(0, soft - int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        pass
    return soft
