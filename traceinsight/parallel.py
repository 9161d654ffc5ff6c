"""One way to start worker processes, shared by jobs and batch mode."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context


def cores_available() -> int:
    """Cores this process may use: its CPU affinity, capped by POLARS_MAX_THREADS (which a
    worker pool sets to each worker's share)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    limit = os.environ.get("POLARS_MAX_THREADS", "")
    return min(cores, int(limit)) if limit.isdigit() and int(limit) > 0 else cores


@contextlib.contextmanager
def process_pool(workers: int) -> Iterator[ProcessPoolExecutor]:
    """Spawned workers (forking a process that runs polars' thread pool can deadlock), each
    with ``cores // workers`` polars threads so workers do not fight over the same cores."""
    threads = max(1, (os.cpu_count() or 1) // max(1, workers))
    old = os.environ.get("POLARS_MAX_THREADS")
    os.environ["POLARS_MAX_THREADS"] = str(threads)  # inherited by the children at spawn
    try:
        with ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn")) as pool:
            yield pool
    finally:
        if old is None:
            os.environ.pop("POLARS_MAX_THREADS", None)
        else:
            os.environ["POLARS_MAX_THREADS"] = old
