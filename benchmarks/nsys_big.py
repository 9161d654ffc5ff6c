"""Build a large Nsight Systems export by replicating a real one's rows, then time the analysis.

    python benchmarks/nsys_big.py [--target-mb 1024] [--repeat 3] [--nsys-ai] [--base TREE]

Works on a copy under benchmarks/data/: the activity tables are doubled repeatedly with times
shifted past the previous copy and correlation ids offset, until the file reaches the target size.

Each run is a fresh process timed by ``/usr/bin/time`` (wall, peak RSS, user + sys CPU):
``traceinsight analyze EXPORT -q --no-html`` of this checkout. ``--base TREE`` also times the
checkout at TREE (an older commit's tree) and ``--nsys-ai`` the peer nsys-ai's cold cache build
(benchmarks/nsysai_run.py; PyPI ``nsys-ai==0.3.0`` in its own venv under benchmarks/data/, with
DuckDB's SQLite extension from PyPI, which DuckDB would otherwise download), in the same rounds:
ours, base, peer, round after round, so a slow phase of the machine (other work on it) slows
each side of a round alike. The load average is printed before and after.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench import DATA, ROOT, SHARED

SRC = SHARED / "nsys" / "nsys-ai__mfu_2gpu_after.sqlite"
TABLES = {
    "CUPTI_ACTIVITY_KIND_KERNEL": ("start", "end"),
    "CUPTI_ACTIVITY_KIND_RUNTIME": ("start", "end"),
    "CUPTI_ACTIVITY_KIND_MEMCPY": ("start", "end"),
    "CUPTI_ACTIVITY_KIND_MEMSET": ("start", "end"),
    "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION": ("start", "end"),
    "NVTX_EVENTS": ("start", "end"),
}


def build(target_mb: int) -> Path:
    out = DATA / f"nsys_{target_mb}mb.sqlite"
    if out.exists():
        return out
    DATA.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".building")
    shutil.copy(SRC, tmp)
    con = sqlite3.connect(tmp)
    con.execute("PRAGMA journal_mode=OFF")
    con.execute("PRAGMA synchronous=OFF")
    while tmp.stat().st_size < target_mb * 1024 * 1024:
        lo, hi = con.execute(
            "SELECT MIN(start), MAX(end) FROM CUPTI_ACTIVITY_KIND_KERNEL"
        ).fetchone()
        span = hi - lo + 1_000_000
        corr = (
            con.execute("SELECT MAX(correlationId) FROM CUPTI_ACTIVITY_KIND_RUNTIME").fetchone()[0]
            + 1
        )
        for table, (s, e) in TABLES.items():
            cols = [r[1] for r in con.execute(f'PRAGMA table_info("{table}")')]
            if not cols:
                continue
            exprs = []
            for c in cols:
                if c in (s, e):
                    exprs.append(f'"{c}" + {span}')
                elif c == "correlationId":
                    exprs.append(f'"{c}" + {corr}')
                else:
                    exprs.append(f'"{c}"')
            con.execute(
                f'INSERT INTO "{table}" ({", ".join(map(repr, cols)).replace(chr(39), chr(34))}) SELECT {", ".join(exprs)} FROM "{table}"'
            )
        con.commit()
        print(f"  {tmp.stat().st_size / 1e6:.0f} MB", file=sys.stderr)
    con.close()
    tmp.rename(out)
    return out


NSYS_AI = "nsys-ai==0.3.0"
DUCKDB = "1.5.5"  # the newest DuckDB whose SQLite extension PyPI carries (duckdb-extension-*)


def nsys_ai_env() -> tuple[str, str]:
    """(python, HOME) for the peer: its venv, and a home whose DuckDB extension directory holds
    the SQLite scanner (DuckDB looks there before downloading it)."""
    venv = DATA / "nsysai-venv"
    home = DATA / "nsysai-home"
    py = venv / "bin" / "python"
    if not py.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        pip = [str(py), "-m", "pip", "install", "-q"]
        subprocess.run([*pip, NSYS_AI], check=True)
        subprocess.run(
            [*pip, f"duckdb=={DUCKDB}", f"duckdb-extension-sqlite-scanner=={DUCKDB}"], check=True
        )
    ext = home / ".duckdb" / "extensions" / f"v{DUCKDB}" / "linux_amd64"
    if not (ext / "sqlite_scanner.duckdb_extension").exists():
        found = next(
            venv.glob(
                "lib/python*/site-packages/duckdb_extension_sqlite_scanner/**/*.duckdb_extension"
            )
        )
        ext.mkdir(parents=True, exist_ok=True)
        shutil.copy(found, ext)
    return str(py), str(home)


Run = tuple[float, float, float]  # wall s, peak RSS MiB, CPU s (user + sys)


def timed(cmd: list[str]) -> Run:
    """One fresh process under ``/usr/bin/time``: its wall time, peak RSS and CPU time (the CPU
    time says how much of a slow wall time other work on the machine took)."""
    with tempfile.NamedTemporaryFile("r", suffix=".time") as tf:
        subprocess.run(
            ["/usr/bin/time", "-o", tf.name, "-f", "%e %M %U %S", *cmd],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=True,
        )
        wall, kb, user, sys_s = tf.read().split()[-4:]
    return float(wall), int(kb) / 1024, float(user) + float(sys_s)


def peer_run(py: str, home: str, export: Path) -> Run:
    """One cold build: the export linked into a fresh directory, where the cache is written."""
    with tempfile.TemporaryDirectory(dir=DATA, prefix="nsysai-") as d:
        link = Path(d) / export.name
        link.symlink_to(export.resolve())
        runner = ROOT / "benchmarks" / "nsysai_run.py"
        return timed(["env", f"HOME={home}", py, str(runner), str(link)])


def ours_run(tree: Path, export: Path) -> Run:
    """analyze with ``tree`` first on the path (this checkout, or --base's)."""
    # -P: the tree on PYTHONPATH, not the working directory, is the one imported
    cmd = [sys.executable, "-P", "-m", "traceinsight", "analyze", str(export), "-q", "--no-html"]
    return timed(["env", f"PYTHONPATH={tree}", *cmd])


def summary(label: str, runs: list[Run]) -> str:
    walls = [r[0] for r in runs]
    peaks = [r[1] for r in runs]
    cpus = [r[2] for r in runs]
    return (
        f"{label}: median {statistics.median(walls):.2f} s ({min(walls):.2f}-{max(walls):.2f} s), "
        f"CPU {statistics.median(cpus):.1f} s ({min(cpus):.1f}-{max(cpus):.1f}), "
        f"peak {min(peaks):.0f}-{max(peaks):.0f} MiB (runs: {[round(w, 2) for w in walls]})"
    )


def describe(run: Run) -> str:
    return f"{run[0]:.2f} s (CPU {run[2]:.1f} s) {run[1]:.0f} MiB"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--target-mb", type=int, default=1024)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--nsys-ai", action="store_true", help="also time nsys-ai's cold cache build")
    ap.add_argument("--base", type=Path, help="also time analyze with this tree on the path")
    args = ap.parse_args()
    path = build(args.target_mb)
    peer = nsys_ai_env() if args.nsys_ai else None
    rows = (
        sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        .execute("SELECT COUNT(*) FROM CUPTI_ACTIVITY_KIND_KERNEL")
        .fetchone()[0]
    )
    print(f"{path.name}: {path.stat().st_size / 1e6:.0f} MB, {rows:,} kernels")
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    ours: list[Run] = []
    base: list[Run] = []
    peers: list[Run] = []
    for i in range(args.repeat):
        load = os.getloadavg()[0]
        ours.append(ours_run(ROOT, path))
        line = f"round {i + 1}: ours {describe(ours[-1])}"
        if args.base:
            base.append(ours_run(args.base, path))
            line += f", base {describe(base[-1])}"
        if peer:
            peers.append(peer_run(*peer, path))
            line += f", nsys-ai {describe(peers[-1])}"
        print(f"{line}; load {load:.2f} -> {os.getloadavg()[0]:.2f}", flush=True)
    print(summary("ours", ours))
    if base:
        print(summary("base", base))
        pairs = statistics.median(b[0] / o[0] for o, b in zip(ours, base, strict=True))
        print(f"base/ours, median of the rounds' pairs: {pairs:.2f}")
    if peers:
        print(summary("nsys-ai cold cache build", peers))
        pairs = statistics.median(p[0] / o[0] for o, p in zip(ours, peers, strict=True))
        print(f"nsys-ai/ours, median of the rounds' pairs: {pairs:.2f}")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
