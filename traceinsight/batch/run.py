"""Running a batch: each item analyzed in a local process pool or on a Dask cluster.

Re-running skips items whose report is newer than their input (checked in the client: such an
item is never sent). A bad item is recorded with its error; the others go on. At most a few items
per worker are in flight and each row goes to a file as it comes, so the client's memory does not
grow with the number of items.
"""

from __future__ import annotations

import itertools
import os
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, wait
from pathlib import Path
from typing import Any

import orjson

from traceinsight.api import analyze_with
from traceinsight.batch.discover import Item, discover
from traceinsight.batch.outputs import (
    BatchResult,
    RowSpool,
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


# Items submitted and not yet collected, per worker: enough to keep each busy across a result's
# round trip, few enough that the client (futures, the Dask scheduler's tasks, results waiting to
# be read) holds a bounded number however many items the batch has.
IN_FLIGHT_PER_WORKER = 2
# on Dask between half this and this per worker thread: a task's round trip is longer, and
# each refill is one message to the scheduler
DASK_IN_FLIGHT_PER_THREAD = 8
DASK_RESIZE_EVERY = 256  # results between looks at the cluster's size (workers may join)


def _to_submit(items: list[Item], outdir: Path, force: bool, on_row: OnRow) -> Iterator[Item]:
    """The items to analyze, largest first (the long ones do not start last and leave a worker
    idle at the end); an item whose report is up to date gives its recorded row here, in the
    client, and is never sent to a worker."""
    reports = outdir / "reports"
    for it in sorted(items, key=_size, reverse=True):
        cached = (
            None
            if force
            else _cached_row(reports / f"{it.key}.html", reports / f"{it.key}.json", it)
        )
        if cached is None:
            yield it
        else:
            on_row(cached)


def _run_local(
    items: list[Item], outdir: Path, force: bool, opts: Options, runtime: Runtime, on_row: OnRow
) -> None:
    todo = _to_submit(items, outdir, force, on_row)
    if (first := next(todo, None)) is None:
        return  # every report up to date: no worker started
    todo = itertools.chain([first], todo)
    workers = min(runtime.workers, len(items))
    if workers <= 1:
        solo = runtime.for_workers(1)
        for it in todo:
            on_row(analyze_item(it, str(outdir), force, opts, solo))
        return
    window = IN_FLIGHT_PER_WORKER * workers
    with process_pool(workers, runtime) as (pool, child):
        pending: dict[Future[dict[str, Any]], Item] = {}
        try:
            while True:
                for it in itertools.islice(todo, window - len(pending)):
                    pending[pool.submit(analyze_item, it, str(outdir), force, opts, child)] = it
                if not pending:
                    break
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                for fut in done:
                    it = pending.pop(fut)
                    try:
                        row = fut.result()
                    except Exception as exc:  # a worker died (out of memory, signal)
                        row = error_row(it, f"worker failed: {type(exc).__name__}: {exc}")
                    on_row(row)
        except BaseException:  # interrupted: what was not started is dropped, not waited for
            for fut in pending:
                fut.cancel()
            raise


def _dask_window(client: Any, workers: int) -> int:
    threads = sum(client.nthreads().values()) or workers
    return DASK_IN_FLIGHT_PER_THREAD * max(1, threads)


def _run_dask(
    items: list[Item],
    outdir: Path,
    force: bool,
    opts: Options,
    runtime: Runtime,
    scheduler: str,
    on_row: OnRow,
) -> None:
    todo = _to_submit(items, outdir, force, on_row)
    if (first := next(todo, None)) is None:
        return  # every report up to date: no cluster started or reached
    todo = itertools.chain([first], todo)
    with dask_client(scheduler, runtime.workers) as client:
        from dask.distributed import as_completed as dask_completed  # there: dask is installed

        window = _dask_window(client, runtime.workers)
        pending: dict[str, Item] = {}
        # results come with their futures, fetched by Dask's own loop: no round trip per item
        stream = dask_completed(with_results=True, raise_errors=False)

        def submit(n: int) -> None:
            batch = list(itertools.islice(todo, n))
            if not batch:
                return
            # one message to the scheduler for the batch, not one per item
            futs = client.map(
                analyze_item,
                batch,
                outdir=str(outdir),
                force=force,
                opts=opts,
                runtime=DASK_TASK_RUNTIME,
                pure=False,
            )
            pending.update((f.key, it) for f, it in zip(futs, batch, strict=True))
            stream.update(futs)

        submit(window)
        for n, (fut, result) in enumerate(stream, 1):
            it = pending.pop(fut.key)
            if fut.status == "finished":
                row = result
            else:  # a worker died, or the task was lost: (type, exception, traceback) or the error
                exc = result[1] if isinstance(result, tuple) else result
                row = error_row(it, f"worker failed: {type(exc).__name__}: {exc}")
            fut.release()  # the worker forgets the result: nothing accumulates there either
            on_row(row)
            if n % DASK_RESIZE_EVERY == 0:
                window = _dask_window(client, runtime.workers)
            if len(pending) <= window // 2:  # refill by halves
                submit(window - len(pending))


# rows of the run in progress (a hidden name: never taken for a trace when OUTDIR is walked)
SPOOL_NAME = ".rows.jsonl"


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
    spool = RowSpool(outdir / SPOOL_NAME)
    try:

        def on_row(row: dict[str, Any]) -> None:
            spool.add(row)
            bar.update(row)

        if scheduler:
            _run_dask(items, outdir, force, opts, runtime, scheduler, on_row)
        else:
            _run_local(items, outdir, force, opts, runtime, on_row)
        for f in failures:
            spool.add(failure_row(f))
    finally:
        bar.close()
        spool.close()
    result = BatchResult(
        summary=spool.frame(), resumed=spool.resumed, seconds=time.perf_counter() - t0
    )
    write_outputs(result, outdir)
    spool.path.unlink()
    return result
