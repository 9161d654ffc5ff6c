"""Running a batch: each item analyzed in a local process pool or on a Dask cluster.

Re-running skips items whose report is newer than their input. A bad item is recorded with
its error; the others go on.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from concurrent.futures import as_completed
from pathlib import Path
from typing import Any

import orjson

from traceinsight.api import analyze_with
from traceinsight.batch.discover import Item, discover
from traceinsight.batch.outputs import (
    BatchResult,
    error_row,
    failure_row,
    summary_row,
    write_outputs,
)
from traceinsight.errors import TraceInsightError
from traceinsight.io import write_bytes_atomic, write_text_atomic
from traceinsight.options import Options
from traceinsight.runtime import DASK_TASK_RUNTIME, Runtime, dask_client, process_pool

OnRow = Callable[[dict[str, Any]], None]


def _cached_row(html_path: Path, json_path: Path, item: Item) -> dict[str, Any] | None:
    if not (
        html_path.exists() and json_path.exists() and html_path.stat().st_mtime_ns >= item.mtime_ns
    ):
        return None
    try:
        return dict(orjson.loads(json_path.read_bytes())["row"], _resumed=True)
    except (OSError, orjson.JSONDecodeError, KeyError):
        return None  # damaged cache: analyze again


def analyze_item(
    item: Item,
    outdir: str,
    force: bool = False,
    opts: Options | None = None,
    runtime: Runtime | None = None,
) -> dict[str, Any]:
    """Worker (local process or Dask): analyze one item, write its report and JSON, return its row."""
    from traceinsight.report.html import render

    reports = Path(outdir) / "reports"
    html_path = reports / f"{item.key}.html"
    json_path = reports / f"{item.key}.json"
    if not force and (cached := _cached_row(html_path, json_path, item)) is not None:
        return cached
    try:
        analysis = analyze_with(
            Path(item.path), opts or Options(), runtime or Runtime().for_workers(1)
        )
        doc = analysis.to_json()
        doc["source"]["path"] = item.label
        page = render(doc)
        row = summary_row(item, doc, f"reports/{item.key}.html")
    except TraceInsightError as exc:
        return error_row(item, exc.message)
    except Exception as exc:  # one bad trace never stops the batch
        return error_row(item, f"internal error {type(exc).__name__}: {exc}")
    reports.mkdir(parents=True, exist_ok=True)
    write_text_atomic(html_path, page)
    write_bytes_atomic(json_path, orjson.dumps({"row": row, "result": doc}, default=str))
    return row


class _Progress:
    """A one-line progress bar on a terminal; silent in pipes and CI."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.total, self.done, self.failed = total, 0, 0
        self.enabled = enabled and sys.stderr.isatty() and not os.environ.get("CI")

    def update(self, row: dict[str, Any]) -> None:
        self.done += 1
        self.failed += row["status"] != "ok"
        if self.enabled:
            width = 30
            fill = int(width * self.done / max(1, self.total))
            sys.stderr.write(
                f"\r[{'#' * fill}{'.' * (width - fill)}] {self.done}/{self.total} analyzed, {self.failed} failed"
            )
            sys.stderr.flush()

    def close(self) -> None:
        if self.enabled:
            sys.stderr.write("\n")


def _size(item: Item) -> int:
    p = Path(item.path)
    try:
        return sum(f.stat().st_size for f in p.iterdir()) if p.is_dir() else p.stat().st_size
    except OSError:
        return 0


def _run_local(
    items: list[Item], outdir: Path, force: bool, opts: Options, runtime: Runtime, on_row: OnRow
) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    workers = min(runtime.workers, len(items))
    if workers <= 1:
        solo = runtime.for_workers(1)
        for it in items:
            rows.append(analyze_item(it, str(outdir), force, opts, solo))
            on_row(rows[-1])
        return rows
    with process_pool(workers, runtime) as (pool, child):
        # largest first, so the long items do not start last and leave a worker idle at the end
        ordered = sorted(items, key=_size, reverse=True)
        futs = {
            pool.submit(analyze_item, it, str(outdir), force, opts, child): it for it in ordered
        }
        for fut in as_completed(futs):
            try:
                row = fut.result()
            except Exception as exc:  # a worker died (out of memory, signal)
                row = error_row(futs[fut], f"worker failed: {type(exc).__name__}: {exc}")
            rows.append(row)
            on_row(row)
    return rows


def _run_dask(
    items: list[Item],
    outdir: Path,
    force: bool,
    opts: Options,
    runtime: Runtime,
    scheduler: str,
    on_row: OnRow,
) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    with dask_client(scheduler, runtime.workers) as client:
        from dask.distributed import as_completed as dask_completed  # there: dask is installed

        futs = client.map(
            analyze_item,
            items,
            outdir=str(outdir),
            force=force,
            opts=opts,
            runtime=DASK_TASK_RUNTIME,
            pure=False,
        )
        index = {f.key: it for f, it in zip(futs, items, strict=True)}
        for fut in dask_completed(futs):
            try:
                row = fut.result()
            except Exception as exc:
                row = error_row(index[fut.key], f"worker failed: {type(exc).__name__}: {exc}")
            rows.append(row)
            on_row(row)
    return rows


def run_batch(
    paths: list[Path],
    outdir: Path,
    *,
    workers: int | None = None,
    scheduler: str | None = None,
    force: bool = False,
    progress: bool = True,
    opts: Options | None = None,
    runtime: Runtime | None = None,
) -> BatchResult:
    """Analyze every item under ``paths`` into ``outdir`` (see :mod:`traceinsight.batch`)."""
    t0 = time.perf_counter()
    opts = opts or Options()
    runtime = runtime or Runtime.detect(helpers=False)
    if workers:
        runtime = Runtime(threads=runtime.threads, parse_helpers=0, workers=workers)
    outdir.mkdir(parents=True, exist_ok=True)
    items, failures = discover(paths, (outdir / ".extracted").resolve())
    bar = _Progress(len(items), progress)
    if scheduler:
        rows = _run_dask(items, outdir, force, opts, runtime, scheduler, bar.update)
    else:
        rows = _run_local(items, outdir, force, opts, runtime, bar.update)
    bar.close()
    resumed = sum(1 for r in rows if r.pop("_resumed", False))
    result = BatchResult(
        rows=rows + [failure_row(f) for f in failures],
        resumed=resumed,
        seconds=time.perf_counter() - t0,
    )
    write_outputs(result, outdir)
    return result
