"""Memory checks (traceinsight.resources) and the whitespace squeeze of the input stream."""

from __future__ import annotations

import random
import re
import shutil
import subprocess
import sys

import pytest

from traceinsight import resources
from traceinsight.parsers import source

from .conftest import ROOT


def _cgroup_tree(tmp_path, v2: bool, limit: int, usage: int, inactive: int):
    rel = "a/b"
    if v2:
        folder = tmp_path / "fs" / rel
        files = ("memory.max", "memory.current")
        line = f"0::/{rel}\n"
    else:
        folder = tmp_path / "fs" / "memory" / rel
        files = ("memory.limit_in_bytes", "memory.usage_in_bytes")
        line = f"4:memory:/{rel}\n1:cpu:/{rel}\n0::/\n"
    folder.mkdir(parents=True)
    (folder / files[0]).write_text(f"{limit}\n")
    (folder / files[1]).write_text(f"{usage}\n")
    (folder / "memory.stat").write_text(f"anon 5\ninactive_file {inactive}\n")
    (folder.parent / files[0]).write_text("max\n" if v2 else "9223372036854771712\n")  # no limit
    (folder.parent / files[1]).write_text("1\n")
    (tmp_path / "cgroup").write_text(line)
    return tmp_path / "fs", tmp_path / "cgroup"


@pytest.mark.parametrize("v2", [False, True], ids=["cgroup-v1", "cgroup-v2"])
def test_cgroup_limit_bounds_available_memory(v2, tmp_path, monkeypatch):
    root, proc = _cgroup_tree(
        tmp_path, v2, limit=1_000_000_000, usage=900_000_000, inactive=40_000_000
    )
    monkeypatch.setattr(resources, "CGROUP_ROOT", root)
    monkeypatch.setattr(resources, "PROC_CGROUP", proc)
    # the limit less the usage, plus the page cache the kernel would reclaim first
    assert resources._cgroup_headroom() == 140_000_000
    assert resources.available_bytes() == 140_000_000


def test_no_cgroup_files_means_no_cgroup_bound(tmp_path, monkeypatch):
    monkeypatch.setattr(resources, "CGROUP_ROOT", tmp_path)
    monkeypatch.setattr(resources, "PROC_CGROUP", tmp_path / "absent")
    assert resources._cgroup_headroom() >= 1 << 62
    # MemAvailable read once, held: two reads of it differ by what other processes did between
    monkeypatch.setattr(resources, "_meminfo_available", lambda: 12_345_678_900)
    expected = min(12_345_678_900, resources._address_space_headroom())
    assert resources.available_bytes() == expected


@pytest.mark.skipif(not shutil.which("prlimit"), reason="prlimit not installed")
def test_address_space_limit_bounds_available_memory():
    code = "from traceinsight import resources; print(resources.available_bytes())"
    limit = 2 * 1024**3
    out = subprocess.run(
        ["prlimit", f"--as={limit}", sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert 0 < int(out.stdout) < limit  # what is left after the interpreter's own mappings


def _reference_squeeze(block: bytes) -> tuple[bytes, int]:
    # every maximal blank run of PAD_RUN or more, looking at every byte (the lookbehind: a run is
    # tried from its first byte only, else a near-miss run is rescanned from each of its bytes)
    out, n = re.subn(rb"(?<![ \t\r\n])[ \t\r\n]{%d,}" % source.PAD_RUN, b" ", block)
    return out, len(block) - len(out)


def test_squeeze_matches_a_plain_regex():
    """Runs of PAD_RUN blanks or more become one space, wherever they fall against the samples;
    shorter runs (a pretty-printer's indentation) and everything else are kept byte for byte."""
    rnd = random.Random(17)
    run = source.PAD_RUN
    for _ in range(60):
        parts = []
        for _ in range(rnd.randrange(1, 8)):
            kind = rnd.randrange(4)
            if kind == 0:
                parts.append(bytes(rnd.choices(b' \t\r\n"{}[],:ab\\', k=rnd.randrange(1, 3000))))
            elif kind == 1:
                parts.append(
                    b"\r\n" + b" " * rnd.randrange(run - 5, run + 5)
                )  # around the threshold
            elif kind == 2:
                parts.append(bytes(rnd.choices(b" \t\r\n", k=rnd.randrange(run, 3 * run))))
            else:
                parts.append(b"x" + b" " * rnd.randrange(1, run // 2) + b"y")
        block = b"".join(parts)
        assert source.squeeze(block) == _reference_squeeze(block)
    assert source.squeeze(b" " * (4 * run)) == (b" ", 4 * run - 1)
    assert source.squeeze(b"[1, 2]") == (b"[1, 2]", 0)
