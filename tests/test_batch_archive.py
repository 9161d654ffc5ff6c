"""Batch over large archives: a bounded number of items in flight, resume without sending the
finished items anywhere, an interrupted run that exits 130 and resumes, pool workers that do not
outlive a killed client. Measured at 10,000 items by benchmarks/archive_scale.py."""

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import polars as pl
import pytest

from traceinsight.batch import run as batch_run
from traceinsight.cli import main
from traceinsight.errors import EXIT_ANALYSIS_ERROR, EXIT_INTERRUPTED
from traceinsight.runtime import Runtime

from .conftest import ROOT, TINY

GOOD = ("comm_overlap", "repeated_step_names", "step_dataloader_sync")


def _archive(src, broken: int = 1):
    """The three tiny traces and ``broken`` files that fail fast (not JSON)."""
    src.mkdir()
    for name in GOOD:
        shutil.copy(TINY / f"{name}.json", src / f"{name}.json")
    for i in range(broken):
        (src / f"bad{i:02d}.json").write_text("not json")
    return src


class _Counting:
    """Submitted and not yet collected: the most at any time."""

    def __init__(self) -> None:
        self.outstanding = self.most = self.submitted = 0

    def submitted_one(self) -> None:
        self.submitted += 1
        self.outstanding += 1
        self.most = max(self.most, self.outstanding)

    def collected_one(self) -> None:
        self.outstanding -= 1


def test_local_pool_keeps_a_bounded_number_in_flight(tmp_path, monkeypatch):
    """2 workers, 23 items: never more than 2 x 2 submitted and not collected (all 23 at once
    before: the futures, their rows and the pool's queue grew with the item count)."""
    src = _archive(tmp_path / "in", broken=20)
    count = _Counting()

    class Pool(ThreadPoolExecutor):  # threads stand in for processes: no spawn in a unit test
        def submit(self, fn, *args, **kwargs):
            count.submitted_one()
            return super().submit(fn, *args, **kwargs)

    @contextlib.contextmanager
    def pool(workers, runtime):
        with Pool(workers) as p:
            yield p, runtime.for_workers(workers)

    monkeypatch.setattr(batch_run, "process_pool", pool)
    rows = []

    def on_row(row):
        rows.append(row)
        count.collected_one()

    items, _ = batch_run.discover([src], tmp_path / "x")
    batch_run._run_local(
        items, tmp_path / "out", False, batch_run.Options(), Runtime(workers=2), on_row
    )
    assert len(rows) == count.submitted == 23
    assert count.most == batch_run.IN_FLIGHT_PER_WORKER * 2 == 4
    assert sum(r["status"] == "ok" for r in rows) == 3


def test_dask_keeps_a_bounded_number_in_flight(tmp_path, monkeypatch):
    """One 2-thread in-process Dask worker: at most 8 x 2 tasks submitted and not collected
    out of 33 (a task graph of every item before); a task that fails is its item's error."""
    distributed = pytest.importorskip("dask.distributed")
    src = _archive(tmp_path / "in", broken=30)
    count = _Counting()

    @contextlib.contextmanager
    def client(scheduler, workers):
        with (
            distributed.LocalCluster(
                n_workers=1, threads_per_worker=2, processes=False, dashboard_address=":0"
            ) as cluster,
            distributed.Client(cluster) as c,
        ):
            submit = c.map

            def counted(fn, items, **kwargs):
                for _ in items:
                    count.submitted_one()
                return submit(fn, items, **kwargs)

            c.map = counted
            yield c

    monkeypatch.setattr(batch_run, "dask_client", client)
    analyze = batch_run.analyze_item

    def dies_on_bad00(item, *args, **kwargs):  # as a task whose worker died would
        if item.label.endswith("bad00.json"):
            raise RuntimeError("worker lost")
        return analyze(item, *args, **kwargs)

    monkeypatch.setattr(batch_run, "analyze_item", dies_on_bad00)
    rows = []

    def on_row(row):
        rows.append(row)
        count.collected_one()

    items, _ = batch_run.discover([src], tmp_path / "x")
    opts, runtime = batch_run.Options(), Runtime(workers=2)
    batch_run._run_dask(items, tmp_path / "out", False, opts, runtime, "local", on_row)
    assert len(rows) == count.submitted == 33
    assert count.most == batch_run.DASK_IN_FLIGHT_PER_THREAD * 2 == 16
    died = [r for r in rows if r["label"].endswith("bad00.json")]
    assert [r["error"] for r in died] == ["worker failed: RuntimeError: worker lost"]
    assert sum(r["status"] == "ok" for r in rows) == 3


def test_resume_sends_no_finished_item_and_lists_the_broken(tmp_path, monkeypatch, capsys):
    src = _archive(tmp_path / "in", broken=2)
    out = tmp_path / "out"
    assert main(["batch", str(src), "-o", str(out), "-j", "1"]) == EXIT_ANALYSIS_ERROR
    first = pl.read_parquet(out / "summary.parquet")
    assert first["status"].to_list() == ["error", "error", "ok", "ok", "ok"]  # sorted by label
    listed = capsys.readouterr().out
    assert listed.count("  failed: ") == 2 and f"failed: {src / 'bad01.json'}: " in listed
    reports = {p: p.stat().st_mtime_ns for p in (out / "reports").iterdir()}
    assert len(reports) == 6  # HTML and JSON of each good item
    sent = []
    analyze = batch_run.analyze_item

    def counted(item, *args, **kwargs):
        sent.append(item.label)
        return analyze(item, *args, **kwargs)

    monkeypatch.setattr(batch_run, "analyze_item", counted)
    assert main(["batch", str(src), "-o", str(out), "-j", "1"]) == EXIT_ANALYSIS_ERROR
    assert "3 up to date (skipped), 2 failed" in capsys.readouterr().out
    assert sorted(sent) == [str(src / "bad00.json"), str(src / "bad01.json")]  # only the broken
    assert {p: p.stat().st_mtime_ns for p in (out / "reports").iterdir()} == reports
    assert pl.read_parquet(out / "summary.parquet").equals(first)
    assert not (out / batch_run.SPOOL_NAME).exists()


def test_interrupted_batch_exits_130_and_resumes(tmp_path, monkeypatch, capsys):
    src = _archive(tmp_path / "in", broken=0)
    out = tmp_path / "out"
    analyze = batch_run.analyze_item
    done = []

    def interrupted_at_the_third(item, *args, **kwargs):
        if len(done) == 2:
            raise KeyboardInterrupt
        done.append(item.label)
        return analyze(item, *args, **kwargs)

    monkeypatch.setattr(batch_run, "analyze_item", interrupted_at_the_third)
    assert main(["batch", str(src), "-o", str(out), "-j", "1"]) == EXIT_INTERRUPTED
    assert "traceinsight: interrupted" in capsys.readouterr().err
    assert not (out / "summary.parquet").exists()
    monkeypatch.setattr(batch_run, "analyze_item", analyze)
    assert main(["batch", str(src), "-o", str(out), "-j", "1"]) == 0
    assert "3 items: 1 analyzed, 2 up to date (skipped), 0 failed" in capsys.readouterr().out


PARENT = """
import os, time
from traceinsight.runtime import Runtime, process_pool
with process_pool(1, Runtime(workers=1)) as (pool, _):
    print(pool.submit(os.getpid).result(), flush=True)
    time.sleep(60)
"""


def _alive(pid: int) -> bool:
    """Running (an exited orphan may stay a zombie where init does not reap)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False
    except OSError:  # no /proc (macOS)
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True


def test_pool_worker_ends_with_its_killed_parent():
    """A SIGKILLed client runs no cleanup; its pool worker must not wait for work forever."""
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT],
        stdout=subprocess.PIPE,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )
    worker = int(parent.stdout.readline())
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _alive(worker):
        time.sleep(0.1)
    if _alive(worker):
        os.kill(worker, signal.SIGKILL)
        pytest.fail("the pool worker outlived its killed parent by 10 s")


def test_a_truncated_trace_is_degraded_not_ok(tmp_path, capsys):
    """Audit 12: a truncated trace's row read status ok (with another top finding than the
    intact file's); its analysis has the trace_truncated error."""
    src = tmp_path / "in"
    src.mkdir()
    good = ROOT / "fixtures" / "h200" / "pairs" / "checkpointing.after.pt.trace.json.xz"
    shutil.copy(good, src / "good.pt.trace.json.xz")
    (src / "cut.pt.trace.json.xz").write_bytes(good.read_bytes()[:100_000])
    out = tmp_path / "out"
    assert main(["batch", str(src), "-o", str(out), "-j", "1"]) == EXIT_ANALYSIS_ERROR
    printed = capsys.readouterr().out
    assert "0 failed, 1 degraded (a data-quality error)" in printed
    assert f"degraded: {src / 'cut.pt.trace.json.xz'}: data quality: trace_truncated" in printed
    df = pl.read_parquet(out / "summary.parquet").sort("label")
    assert df["status"].to_list() == ["degraded", "ok"]


def test_a_batch_of_nothing_that_exists_is_bad_input(tmp_path, capsys):
    """Audit 12: `batch /nonexistent` exited 1 and wrote an index page, where analyze and diff
    exit 2 for a missing path."""
    assert main(["batch", str(tmp_path / "nope"), "-o", str(tmp_path / "out")]) == 2
    assert "no such file or directory" in capsys.readouterr().err
    assert not (tmp_path / "out" / "index.html").exists()
