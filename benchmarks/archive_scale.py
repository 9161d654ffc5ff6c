"""``traceinsight batch`` over a generated archive: throughput, the client's memory, an
interrupted run resumed, the broken items listed. Local worker processes and a Dask LocalCluster.

    python benchmarks/archive_scale.py --items 1000 [10000] [--executors local dask]
        [--runs full KILL INT] [--workers 2] [--broken-ratio 0.02] [--archive-dir DIR]
        [--code PATH] [--keep]

For each size, ``make_archive.py`` writes the archive (2% broken, planted), then for each
executor each run is one ``traceinsight batch`` process (the client) into a fresh OUTDIR:

* ``full``: the whole archive; wall time, items per second, the client's peak RSS (its VmHWM,
  the kernel's high-water mark, read while it runs) and its RSS when 10%, 50% and 90% of the rows
  were written (is it flat in the item count?), the workers' peak RSS; every planted broken file
  and nothing else failed (the summary's errors and the ``failed:`` lines, both exactly the
  planted list), exit code 1.
* ``KILL`` / ``INT``: the client is sent SIGKILL / SIGINT once half the rows are written; the
  items with a complete report (HTML and JSON) then are counted and their reports' mtimes kept;
  whether the client's worker processes outlive it (orphans, killed by pid after 20 s) is
  reported. The same command is run again: its "N up to date, skipped" must equal the count
  found, no kept report may be rewritten (redone = 0), and the summary must again hold every
  good item as ok and exactly the planted failures.

``--code PATH`` runs the command from another checkout (before/after comparisons). Markdown
table on stdout; one JSON line per run on stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import polars as pl
import psutil
from make_archive import make_archive

ROOT = Path(__file__).resolve().parents[1]
SPOOL = ".rows.jsonl"  # the rows a running batch has written (traceinsight.batch.run)
SAMPLE_S = 0.2
ORPHAN_GRACE_S = 20.0


def _hwm_bytes(pid: int) -> int:
    """The process's peak resident set (VmHWM), 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class _Lines:
    """Counts a growing file's lines without reading it again from the start; a file left by an
    earlier (killed) run counts as empty until it is written again."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset, self.count = path, 0, 0
        self.stale_mtime_ns = path.stat().st_mtime_ns if path.exists() else None

    def poll(self) -> int:
        try:
            st = self.path.stat()
            if st.st_mtime_ns == self.stale_mtime_ns:
                return 0
            if st.st_size < self.offset:  # truncated by the new run
                self.offset = self.count = 0
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return self.count
        self.offset += len(data)
        self.count += data.count(b"\n")
        return self.count


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _read_back(f: Any) -> str:
    f.seek(0)
    text = f.read()
    f.close()
    return text


def client(peak_file: Path, argv: list[str]) -> None:
    """The batch client (``traceinsight.cli.main``, as the command runs it); once done it writes
    its own peak RSS, which sampling from outside can miss (the summary is written in the last
    fraction of a second)."""
    from traceinsight.cli import main

    code = main(argv)
    sys.stdout.flush()
    peak_file.write_text(str(_hwm_bytes(os.getpid())))
    os._exit(code)


def run_client(
    argv: list[str],
    env: dict[str, str],
    cwd: Path,
    outdir: Path,
    total: int,
    kill: str | None,
    peak_file: Path,
) -> dict[str, Any]:
    """One batch client, sampled; with ``kill`` the signal it gets when half the rows are in."""
    peak_file.unlink(missing_ok=True)
    t0 = time.perf_counter()
    # files, not pipes: a worker outliving a killed client would hold a pipe open
    log_out, log_err = (open(outdir.parent / f"{outdir.name}.{s}", "w+") for s in ("out", "err"))  # noqa: SIM115
    p = subprocess.Popen(argv, env=env, stdout=log_out, stderr=log_err, text=True, cwd=cwd)
    proc = psutil.Process(p.pid)
    lines = _Lines(outdir / SPOOL)
    client_hwm = worker_hwm = 0
    kids: dict[int, psutil.Process] = {}
    rss_at: dict[str, int] = {}
    killed_at_rows = None
    while p.poll() is None:
        client_hwm = max(client_hwm, _hwm_bytes(p.pid))
        try:
            for c in proc.children(recursive=True):
                kids.setdefault(c.pid, c)
                worker_hwm = max(worker_hwm, _hwm_bytes(c.pid))
            rss = proc.memory_info().rss
        except psutil.NoSuchProcess:
            break
        rows = lines.poll()
        for mark in (0.1, 0.5, 0.9):
            if rows >= mark * total and f"{mark:.0%}" not in rss_at:
                rss_at[f"{mark:.0%}"] = rss
        if kill and killed_at_rows is None and rows >= total / 2:
            killed_at_rows = rows
            os.kill(p.pid, getattr(signal, f"SIG{kill}"))
        time.sleep(SAMPLE_S)
    p.wait()
    wall = time.perf_counter() - t0
    if peak_file.exists():  # not after SIGKILL: then the last sample's
        client_hwm = max(client_hwm, int(peak_file.read_text()))
    out, err = _read_back(log_out), _read_back(log_err)
    orphans_left, workers_gone_s = 0, None
    if kill:  # do the client's workers outlive it?
        t_end = time.monotonic()
        while time.monotonic() < t_end + ORPHAN_GRACE_S and any(_alive(k) for k in kids.values()):
            time.sleep(0.1)
        if not any(_alive(k) for k in kids.values()):
            workers_gone_s = time.monotonic() - t_end
        for k in kids.values():
            if _alive(k):
                orphans_left += 1
                k.kill()  # ours: started by the client this script started
    return {
        "rc": p.returncode,
        "wall_s": wall,
        "client_peak_rss_bytes": client_hwm,
        "client_rss_at": rss_at,
        "worker_peak_rss_bytes": worker_hwm,
        "workers_seen": len(kids),
        "killed_at_rows": killed_at_rows,
        "orphans_left": orphans_left,
        "workers_gone_s": workers_gone_s,
        "stdout": out,
        "stderr_tail": err[-2000:],
    }


def _complete_reports(outdir: Path) -> dict[str, int]:
    """Report JSON path -> mtime_ns of every item whose HTML and JSON reports both exist."""
    reports = outdir / "reports"
    if not reports.exists():
        return {}
    out = {}
    for e in os.scandir(reports):
        if e.name.endswith(".json") and (reports / (e.name[:-5] + ".html")).exists():
            out[e.path] = e.stat().st_mtime_ns
    return out


def check_outputs(outdir: Path, stdout: str, planted: dict[str, Any]) -> dict[str, Any]:
    """The summary's ok count and failures against what was planted."""
    df = pl.read_parquet(outdir / "summary.parquet")
    failed = set(df.filter(pl.col("status") != "ok")["label"].to_list())
    listed = set(re.findall(r"^  failed: (.+?): ", stdout, re.M))
    broken = {b["path"] for b in planted["broken_files"]}
    return {
        "ok": df.filter(pl.col("status") == "ok").height,
        "failed": len(failed),
        "failed_listed": len(listed),
        "failures_exact": failed == broken and listed == broken,
        "all_good_ok": df.filter(pl.col("status") == "ok").height == planted["good"],
    }


def _resumed(stdout: str) -> int | None:
    m = re.search(r"\((\d+) up to date, skipped\)", stdout)
    return int(m.group(1)) if m else None


def bench(
    archive: Path,
    planted: dict[str, Any],
    executor: str,
    run: str,
    workers: int,
    code: Path,
    work: Path,
) -> list[dict[str, Any]]:
    env = dict(os.environ, PYTHONPATH=str(code))
    outdir = work / f"out_{executor}_{run}"
    shutil.rmtree(outdir, ignore_errors=True)
    peak_file = work / f"{outdir.name}.peak"
    argv = [sys.executable, __file__, "--client", str(peak_file), "batch", str(archive)]
    argv += ["-o", str(outdir)]
    argv += ["-j", str(workers)] + (["--scheduler", "local"] if executor == "dask" else [])
    n = planted["items"]
    base = {"items": n, "executor": executor, "workers": workers, "code": code.name}
    first = run_client(argv, env, code, outdir, n, None if run == "full" else run, peak_file)
    rows = [{**base, "run": run, **first}]
    if run == "full":
        rows[0].update(check_outputs(outdir, first["stdout"], planted))
        return rows
    done = _complete_reports(outdir)
    rows[0]["done_before_resume"] = len(done)
    second = run_client(argv, env, code, outdir, n, None, peak_file)
    after = _complete_reports(outdir)
    redone = sum(1 for path, mtime in done.items() if after.get(path) != mtime)
    rows.append(
        {
            **base,
            "run": f"resume after {run}",
            **second,
            **check_outputs(outdir, second["stdout"], planted),
            "resumed": _resumed(second["stdout"]),
            "done_before_resume": len(done),
            "redone": redone,
        }
    )
    return rows


def _mib(b: int) -> str:
    return f"{b / 2**20:.0f}"


def table_row(r: dict[str, Any]) -> str:
    at = r["client_rss_at"]
    name = "local processes" if r["executor"] == "local" else "Dask LocalCluster"
    if r["run"] in ("KILL", "INT"):
        outcome = (
            f"SIG{r['run']} at {r['killed_at_rows']} rows, rc {r['rc']}: "
            f"{r['done_before_resume']} reports complete; workers gone "
            + (
                f"{r['workers_gone_s']:.1f} s after"
                if r["workers_gone_s"] is not None
                else f"NOT within {ORPHAN_GRACE_S:.0f} s ({r['orphans_left']} killed)"
            )
        )
    else:
        exact = "exact" if r["failures_exact"] else "MISMATCH"
        outcome = (
            f"rc {r['rc']}; {r['ok']} ok ({'all' if r['all_good_ok'] else 'NOT all'} good); "
            f"{r['failed']} failed, {r['failed_listed']} listed ({exact})"
        )
        if r["run"].startswith("resume"):
            ok = r["resumed"] == r["done_before_resume"] and r["redone"] == 0
            outcome += (
                f"; {r['resumed']} up to date (complete before: {r['done_before_resume']}), "
                f"redone {r['redone']}: {'ok' if ok else 'MISSED'}"
            )
    rate = r["items"] / r["wall_s"]
    return (
        f"| {r['items']} | {name} ({r['workers']}, {r['code']}) | {r['run']} | {r['wall_s']:.1f} | {rate:.1f} | "
        f"{_mib(r['client_peak_rss_bytes'])} | "
        f"{' / '.join(_mib(at[k]) if k in at else '-' for k in ('10%', '50%', '90%'))} | "
        f"{_mib(r['worker_peak_rss_bytes'])} | {outcome} |"
    )


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--client":
        client(Path(sys.argv[2]), sys.argv[3:])
    ap = argparse.ArgumentParser()
    ap.add_argument("--items", type=int, nargs="+", default=[1000])
    ap.add_argument("--executors", nargs="+", default=["local", "dask"], choices=["local", "dask"])
    ap.add_argument("--runs", nargs="+", default=["full", "KILL"], choices=["full", "KILL", "INT"])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument(
        "--broken-ratio",
        type=float,
        default=0.02,
        help="1.0: every item broken (fails in milliseconds): the client's own cost per item",
    )
    ap.add_argument(
        "--archive-dir", type=Path, help="where archives and outputs go (default: a temp dir)"
    )
    ap.add_argument("--code", type=Path, default=ROOT, help="the checkout whose traceinsight runs")
    ap.add_argument("--keep", action="store_true", help="keep the archives and outputs")
    a = ap.parse_args()
    base = (a.archive_dir or Path(tempfile.mkdtemp(prefix="archive_scale_"))).resolve()
    a.code = a.code.resolve()
    print("| items | executor (workers, code) | run | wall s | items/s | client peak RSS MiB | "
          "client RSS at 10% / 50% / 90% of rows MiB | worker peak RSS MiB | outcome |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|", flush=True)
    try:
        for n in a.items:
            work = base / f"n{n}_broken{a.broken_ratio:g}"
            archive = work / "archive"
            if (archive / ".planted.json").exists():
                planted = json.loads((archive / ".planted.json").read_text())
            else:
                planted = make_archive(archive, n, a.broken_ratio)
            for executor in a.executors:
                for run in a.runs:
                    for r in bench(archive, planted, executor, run, a.workers, a.code, work):
                        print(table_row(r), flush=True)
                        r.pop("stdout")
                        print(json.dumps(r), file=sys.stderr, flush=True)
                    if not a.keep:  # 10,000 items' reports are ~1 GB
                        shutil.rmtree(work / f"out_{executor}_{run}", ignore_errors=True)
    finally:
        if not a.keep:
            shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
