"""Build a large Nsight Systems export by replicating a real one's rows, then time the analysis.

    python benchmarks/nsys_big.py [--target-mb 1024] [--repeat 3]

Works on a copy under benchmarks/data/: the activity tables are doubled repeatedly with times
shifted past the previous copy and correlation ids offset, until the file reaches the target size.
"""

from __future__ import annotations

import argparse
import shutil
import sqlite3
import statistics
import sys
from pathlib import Path

from bench import DATA, SHARED, timed

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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--target-mb", type=int, default=1024)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    path = build(args.target_mb)
    runs = [
        timed([sys.executable, "-m", "traceinsight", "analyze", str(path), "-q", "--no-html"])
        for _ in range(args.repeat)
    ]
    rows = (
        sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        .execute("SELECT COUNT(*) FROM CUPTI_ACTIVITY_KIND_KERNEL")
        .fetchone()[0]
    )
    print(
        f"{path.name}: {path.stat().st_size / 1e6:.0f} MB, {rows:,} kernels: median {statistics.median(r[0] for r in runs):.2f} s, "
        f"peak {statistics.median(r[1] for r in runs):.0f} MiB (runs: {[round(r[0], 2) for r in runs]})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
