"""A generated N-rank job: ``analyze JOBDIR`` on local processes and on a Dask LocalCluster,
``batch`` over the same rank files, one rank alone, and the peer on the largest count it loads.

    python benchmarks/job_scale.py [--ranks 16 32] [--workers 2] [--factor 2.0] [--repeat 1]
        [--modes job-local,batch-local,job-dask,batch-dask] [--jobs-dir DIR] [--hta-ranks 2 4]

For each size ``make_job.py`` writes the job (``--repeat K``: each rank K times the base's steps;
kept under ``--jobs-dir`` and reused while its ``planted.json`` matches), then each mode runs in a
fresh process, in this order, so the timings sit side by side under the same load:

* ``job-*``: ``traceinsight analyze JOBDIR -j W [--scheduler local]`` with its HTML and JSON (the
  CLI's own ``main`` in the child): wall time, the client's peak RSS (the process that merges the
  summaries and renders; with Dask it also hosts the LocalCluster's scheduler), the workers' peak
  RSS (the largest any reached, from the summaries), ranks per second, and whether the planted
  straggler is named with its wait per waiting rank within 10% of the planted lateness;
* ``batch-*``: ``traceinsight batch RANKFILE... -o OUT -j W [--scheduler local]`` over the same
  files (each a report of its own): wall time and ranks per second, the job's rate against it.

Before them one rank (the straggler's file and a waiting rank's) is analyzed alone by
``traceinsight analyze RANKFILE --no-html`` in a fresh process: its peak RSS is what a worker's
is compared with. ``--hta-ranks K...``: the peer (HTA 0.6.1, its venv from ``bench.py --hta``'s
installer) loads the first K rank files of the largest job (``hta_run.py``: load, temporal, idle,
overlap and kernel breakdowns) beside ``analyze`` of the same K files; peak RSS there is the
largest single process (``wait4``: the process or any child it reaped). Markdown tables on stdout.
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
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BASE = ROOT / "fixtures" / "h200" / "ddp_overlap" / "rank0.pt.trace.json.xz"
MODES = ("job-local", "batch-local", "job-dask", "batch-dask")
MIB = 2**20


def _child(mode: str, path: Path, workers: int, out: Path) -> None:
    """One mode on one job (or ``single``: one rank file), in this process, through the CLI's
    ``main``: one JSON line. Peaks are VmHWM (``peak_rss_bytes``): ru_maxrss would also count
    the size of the process that started this one."""
    import traceinsight.jobs as jobs
    from traceinsight.cli import main
    from traceinsight.runtime import peak_rss_bytes

    peaks: list[int] = []
    spans: list[float] = []
    summaries = jobs.rank_summaries

    def recording(*args: Any, **kwargs: Any) -> Any:  # the workers' peaks ride on the summaries
        t0 = time.perf_counter()
        got = summaries(*args, **kwargs)
        spans.append(time.perf_counter() - t0)
        peaks.extend(s.worker_peak_rss_bytes for s in got)
        return got

    jobs.rank_summaries = recording  # type: ignore[assignment]
    what, _, executor = mode.partition("-")
    dask = ["--scheduler", "local"] if executor == "dask" else []
    files = sorted(path.glob("rank*.pt.trace.json.gz"), key=lambda p: int(p.name[4:].split(".")[0]))
    if what == "single":
        argv = ["analyze", str(path), "--no-html", "-q", "--json", str(out / "one.json")]
    elif what == "job":
        argv = ["analyze", str(path), "-j", str(workers), *dask, "-q", "--force"]
        argv += ["-o", str(out / "job.html"), "--json", str(out / "job.json")]
    else:
        argv = ["batch", *map(str, files), "-o", str(out / "batch"), "-j", str(workers), *dask]
        argv += ["-q", "--force"]
    t0 = time.perf_counter()
    code = main(argv)
    wall = time.perf_counter() - t0
    row: dict[str, Any] = {
        "code": code,
        "wall_s": wall,
        "summaries_s": sum(spans),
        "ranks": len(files),
        "client_peak_rss_bytes": peak_rss_bytes(),
        "worker_peak_rss_bytes": max(peaks, default=0),
    }
    if what == "job":
        doc = json.loads((out / "job.json").read_text())
        c = doc["details"]["cross_rank"]
        row["straggler"] = c["straggler_rank"]
        row["wait_per_waiting_rank_ns"] = c["wait_caused_ns"] / max(1, len(doc["ranks"]) - 1)
    print(json.dumps(row), flush=True)


def _in_child(mode: str, path: Path, workers: int, env: dict[str, str]) -> dict[str, Any] | None:
    """``mode`` in a fresh process; ``cpu_s``: the CPU time of it and every process under it
    (the workers are reaped by it, their nannies' or the pool's), which the other work on the
    machine changes far less than the wall time."""
    before = _children_cpu_s()
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, __file__, "--workers", str(workers), "--child", mode]
        res = subprocess.run(
            [*cmd, str(path), out], capture_output=True, text=True, env=env, check=False
        )
    lines = [x for x in res.stdout.splitlines() if x.startswith("{")]
    if res.returncode or not lines or json.loads(lines[-1])["code"]:
        print(f"<!-- {mode} failed: {res.stderr.strip()[-400:]} -->", flush=True)
        return None
    return dict(json.loads(lines[-1]), cpu_s=_children_cpu_s() - before)


def _children_cpu_s() -> float:
    u = resource.getrusage(resource.RUSAGE_CHILDREN)
    return u.ru_utime + u.ru_stime


def _run_peak(cmd: list[str], env: dict[str, str]) -> tuple[float, int, int]:
    """Wall seconds, peak RSS (the process or any child it reaped) and exit code of ``cmd``."""
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    err = p.stderr.read().decode(errors="replace") if p.stderr else ""
    if p.returncode:
        print(f"<!-- {' '.join(cmd[:4])}...: exit {p.returncode}: {err.strip()[-300:]} -->")
    return wall, usage.ru_maxrss * 1024, p.returncode


def _load() -> str:
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())


def _job(jobs_dir: Path, n: int, factor: float, repeat: int) -> tuple[Path, dict[str, Any]]:
    """The job, generated in a process of its own (this one stays small: the peer's peaks are
    read with wait4, which counts this process's size at the fork)."""
    job = jobs_dir / f"job{n}_x{repeat}_f{factor:g}"
    mark = job / "planted.json"
    if mark.exists() and len(list(job.glob("rank*.pt.trace.json.gz"))) == n:
        return job, json.loads(mark.read_text())
    t0 = time.perf_counter()
    make = [sys.executable, str(ROOT / "benchmarks" / "make_job.py"), str(job)]
    make += ["--ranks", str(n), "--factor", str(factor), "--repeat", str(repeat)]
    subprocess.run([*make, "--threads", "2"], check=True, stdout=subprocess.DEVNULL)
    print(f"<!-- generated {job} in {time.perf_counter() - t0:.0f} s -->", flush=True)
    return job, json.loads(mark.read_text())


def _single(job: Path, planted: dict[str, Any], workers: int, env: dict[str, str]) -> int:
    """Each of two ranks (the straggler's file, a waiting rank's) alone: the larger peak."""
    peaks = []
    waiting = 0 if planted["straggler"] != 0 else 1
    for r in (planted["straggler"], waiting):
        f = job / f"rank{r}.pt.trace.json.gz"
        row = _in_child("single", f, workers, env)
        if row is None:
            continue
        peaks.append(row["client_peak_rss_bytes"])
        print(
            f"<!-- rank {r} alone ({f.stat().st_size / 1e6:.1f} MB gzipped): "
            f"{row['wall_s']:.1f} s, peak {peaks[-1] / MIB:.0f} MiB -->",
            flush=True,
        )
    return max(peaks, default=1)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, nargs="+", default=[16, 32])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--factor", type=float, default=2.0)
    ap.add_argument("--repeat", type=int, default=1, help="each rank K times the base's steps")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument(
        "--jobs-dir", type=Path, help="keep the generated jobs here (default: a temp dir)"
    )
    ap.add_argument("--hta-ranks", type=int, nargs="*", default=[])
    ap.add_argument("--child", nargs=3, metavar=("MODE", "JOB", "OUT"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        _child(a.child[0], Path(a.child[1]), a.workers, Path(a.child[2]))
        return 0
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    modes = [m for m in a.modes.split(",") if m]
    with tempfile.TemporaryDirectory() as tmp:
        jobs_dir = a.jobs_dir or Path(tmp)
        print(f"<!-- uptime before: load average {_load()} -->")
        print("| ranks | MB per rank (gz) | mode | wall s (ranks' part) | ranks/s | CPU s per rank | vs batch (ranks/s; CPU) | client peak RSS "
              "| worker peak RSS (x one rank alone) | straggler (planted) "
              "| wait per waiting rank vs planted |")  # fmt: skip
        print("|---|---|---|---|---|---|---|---|---|---|---|", flush=True)
        job = None
        for n in a.ranks:
            job, planted = _job(jobs_dir, n, a.factor, a.repeat)
            late = planted["late_total_ns"]
            gz_mb = sum(f.stat().st_size for f in job.glob("rank*.json.gz")) / n / 1e6
            alone = _single(job, planted, a.workers, env)
            rates: dict[str, float] = {}
            for mode in modes:
                r = _in_child(mode, job, a.workers, env)
                if r is None:
                    continue
                rate, cpu = n / r["wall_s"], r["cpu_s"] / n
                rates[mode] = (rate, cpu)
                # the job's rate over the batch's, and the batch's CPU per rank over the job's
                # (both above 1 where the job is the faster), once both have run
                jm, bm = mode.replace("batch", "job"), mode.replace("job", "batch")
                versus = ""
                if jm in rates and bm in rates:
                    (jr, jc), (br, bc) = rates[jm], rates[bm]
                    versus = f"{jr / br:.2f}x; {bc / jc:.2f}x"
                worker = (
                    f"{r['worker_peak_rss_bytes'] / MIB:.0f} MiB "
                    f"({r['worker_peak_rss_bytes'] / alone:.2f}x)"
                    if r["worker_peak_rss_bytes"]
                    else "-"
                )
                straggler = wait = "-"
                # the ranks' part alone (rank_summaries), without the merge and the report
                summ = f" ({r['summaries_s']:.1f})" if r["summaries_s"] else ""
                if "straggler" in r:
                    w = r["wait_per_waiting_rank_ns"]
                    ok = r["straggler"] == planted["straggler"] and abs(w - late) <= 0.1 * late
                    straggler = f"{r['straggler']} ({planted['straggler']})"
                    wait = (
                        f"{w / 1e6:.2f} ms vs {late / 1e6:.2f} ms ({w / late - 1:+.1%}): "
                        f"{'ok' if ok else 'MISSED'}"
                    )
                print(
                    f"| {n} | {gz_mb:.1f} | {mode} ({a.workers} workers) | {r['wall_s']:.1f}"
                    f"{summ} | "
                    f"{rate:.2f} | {cpu:.2f} | {versus} | {r['client_peak_rss_bytes'] / MIB:.0f} MiB | "
                    f"{worker} | {straggler} | {wait} |",
                    flush=True,
                )
            print(f"<!-- one rank alone: peak {alone / MIB:.0f} MiB; load {_load()} -->")
        if a.hta_ranks and job is not None:
            _peer(job, a.hta_ranks, a.workers, env)
        print(f"<!-- uptime after: load average {_load()} -->")
    return 0


def _peer(job: Path, counts: list[int], workers: int, env: dict[str, str]) -> None:
    """HTA on the first K rank files beside ``analyze`` of the same files, K by K."""
    from bench import hta_python

    hpy = hta_python()
    peer_env = {k: v for k, v in env.items() if k != "PYTHONPATH"}  # its own venv only
    print("\n| ranks | ours: analyze DIR -j W | ours peak (largest process) | HTA 0.6.1 "
          "| HTA peak (largest process) | speedup |")  # fmt: skip
    print("|---|---|---|---|---|---|", flush=True)
    for k in counts:
        with tempfile.TemporaryDirectory() as d:
            sub = Path(d) / "job"
            sub.mkdir()
            for r in range(k):
                (sub / f"rank{r}.pt.trace.json.gz").symlink_to(job / f"rank{r}.pt.trace.json.gz")
            ours = [sys.executable, "-m", "traceinsight", "analyze", str(sub), "-j", str(workers)]
            ow, op, _ = _run_peak([*ours, "-q", "-o", f"{d}/r.html", "--json", f"{d}/r.json"], env)
            hta = [hpy, str(ROOT / "benchmarks" / "hta_run.py"), str(sub)]
            hw, hp, code = _run_peak(hta, peer_env)
            peer = f"{hw:.1f} s" if code == 0 else f"failed (exit {code}) after {hw:.1f} s"
            print(
                f"| {k} | {ow:.1f} s | {op / MIB:.0f} MiB | {peer} | {hp / MIB:.0f} MiB | "
                f"{hw / ow:.1f}x |",
                flush=True,
            )
            if code:
                break


if __name__ == "__main__":
    sys.exit(main())
