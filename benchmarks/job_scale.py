"""A generated N-rank job analyzed by local worker processes and on a Dask LocalCluster.

    python benchmarks/job_scale.py [--ranks 16 32] [--workers 2] [--factor 2.0]

For each size: ``make_job.py`` writes the job (a planted straggler, ``planted.json``), then each
executor runs in a fresh process (``traceinsight.jobs.rank_summaries`` + ``merge_job``, what
``analyze DIR [--scheduler local]`` runs) and reports its wall time, the client's peak RSS (the
process merging the summaries; with Dask it also hosts the LocalCluster's scheduler), the
workers' peak RSS (the largest a worker reached: what to size one by), ranks per second, and
whether the planted straggler is named with its wait per waiting rank within 10% of the planted
lateness. Markdown table on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from make_job import make_job

ROOT = Path(__file__).resolve().parents[1]
BASE = ROOT / "fixtures" / "h200" / "ddp_overlap" / "rank0.pt.trace.json.gz"


def child(mode: str, job: Path, workers: int) -> None:
    """One executor on one job, in this process: one JSON line."""
    from traceinsight.jobs import merge_job, rank_summaries
    from traceinsight.options import Options
    from traceinsight.runtime import Runtime

    runtime = Runtime(threads=1, workers=workers, scheduler=None if mode == "local" else "local")
    t0 = time.perf_counter()
    summaries = rank_summaries(job, Options(), runtime)
    merged = merge_job(job, summaries, Options())
    wall = time.perf_counter() - t0
    c = merged.cross
    n = len(merged.ranks)
    print(
        json.dumps(
            {
                "wall_s": wall,
                "client_peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                "worker_peak_rss_bytes": max(s.worker_peak_rss_bytes for s in summaries),
                "ranks": n,
                "straggler": c.straggler_rank,
                "wait_per_waiting_rank_ns": c.wait_caused_ns / max(1, n - 1),
            }
        )
    )


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, nargs="+", default=[16, 32])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--factor", type=float, default=2.0)
    ap.add_argument("--child", nargs=2, metavar=("MODE", "JOB"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(a.child[0], Path(a.child[1]), a.workers)
        return 0
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    print("| ranks | executor | wall s | ranks/s | client peak RSS | worker peak RSS | straggler "
          "(planted) | wait per waiting rank vs planted |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as d:
        for n in a.ranks:
            job = Path(d) / f"job{n}"
            planted = make_job(job, n, n // 3, a.factor, [BASE])
            late = planted["late_total_ns"]
            for mode in ("local", "dask"):
                out = subprocess.run(
                    [sys.executable, __file__, "--workers", str(a.workers), "--child", mode, str(job)],
                    capture_output=True, text=True, env=env, check=True,
                )  # fmt: skip
                r = json.loads(out.stdout.strip().splitlines()[-1])
                ok = (
                    r["straggler"] == planted["straggler"]
                    and abs(r["wait_per_waiting_rank_ns"] - late) <= 0.1 * late
                )
                name = "local processes" if mode == "local" else "Dask LocalCluster"
                print(
                    f"| {n} | {name} ({a.workers} workers) | {r['wall_s']:.1f} | "
                    f"{n / r['wall_s']:.1f} | {r['client_peak_rss_bytes'] / 2**20:.0f} MiB | "
                    f"{r['worker_peak_rss_bytes'] / 2**20:.0f} MiB | {r['straggler']} "
                    f"({planted['straggler']}) | {r['wait_per_waiting_rank_ns'] / 1e6:.2f} ms vs "
                    f"{late / 1e6:.2f} ms: {'ok' if ok else 'MISSED'} |",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
