"""Performance policy in one place: threads, decoder helpers, worker pools, allocator settings.

A :class:`Runtime` is decided once (by the command, or by :func:`traceinsight.analyze`) and passed
down explicitly; nothing below reads environment variables back as signals. The only variables
this module sets are the ones polars itself reads as it loads (its thread count, its allocator),
and it sets them where polars loads: before the first import, or in a worker at spawn.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
import types
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from multiprocessing.context import SpawnContext, SpawnProcess
from typing import Any

from traceinsight.errors import InputError

# polars' allocator (jemalloc) hands freed memory back to the OS within half a second, so each
# phase of a large analysis faults fresh pages in again. For one trace, kept 10 s: on the 1 GB
# nsys export 25% fewer page faults and 0.5 s less wall. Blocks from 64 KiB (not 8 MiB) come
# from the arena all threads share, so a column freed by one thread is reused by the next: at 1
# MiB 0.3 GB less peak there, 0.1 GB on the 10x trace; at 64 KiB another 0.1-0.15 GB less on both
# (10x: 912-960 MB against 1037-1066 MB) in the same CPU time (benchmarks/RESULTS.md; 16 KiB is
# no better, 256 KiB keeps half the gain). Not for a directory of ranks,
# nor in `batch`: worker processes holding on to freed memory made two-worker batches 10%
# slower. jemalloc takes the last value, polars appends this to its own defaults; a user's own
# setting wins.
ALLOCATOR_ENV = "_RJEM_MALLOC_CONF"
ALLOCATOR_CONF = "dirty_decay_ms:10000,muzzy_decay_ms:10000,oversize_threshold:65536"
POLARS_THREADS_ENV = "POLARS_MAX_THREADS"
PARSE_HELPERS_ENV = "TRACEINSIGHT_PARSE_HELPERS"  # a user's switch: 0 parses in one process
HELPERS_MAX = 8
ANALYZER_THREADS_MAX = 2  # more threads than two only add contention (benchmarks/RESULTS.md)


def cores_available() -> int:
    """Cores this process may use (its CPU affinity)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


@dataclass(frozen=True)
class Runtime:
    """How much of the machine one analysis may use.

    ``threads``: threads for polars work and the analyzers' two-thread overlap; ``parse_helpers``:
    helpers that decode chunks of one large Kineto trace (threads with the native scanner, else
    processes); ``workers``: processes for the
    ranks of a job or the items of a batch; ``in_worker``: this process is one of such workers
    (its polars pool was sized at spawn)."""

    threads: int = 1
    parse_helpers: int = 0
    workers: int = 1
    in_worker: bool = False
    scheduler: str | None = None  # a Dask scheduler's address, or "local": a job's ranks there

    @classmethod
    def detect(cls, *, helpers: bool = True) -> Runtime:
        """The whole machine: every core, decoder helpers unless the user turned them off."""
        cores = cores_available()
        raw = os.environ.get(PARSE_HELPERS_ENV, "").strip()
        # the parent mostly waits on them; past 8 they queue on the inflate
        n = int(raw) if raw.isdigit() else (0 if cores < 2 else min(cores, HELPERS_MAX))
        return cls(threads=cores, parse_helpers=n if helpers else 0, workers=cores)

    @property
    def analyzer_threads(self) -> int:
        return max(1, min(ANALYZER_THREADS_MAX, self.threads))

    def for_workers(self, n: int) -> Runtime:
        """What each of ``n`` worker processes gets: its share of the cores, no helpers of its own."""
        share = max(1, cores_available() // max(1, n))
        return replace(
            self, threads=share, parse_helpers=0, workers=1, in_worker=True, scheduler=None
        )


# glibc's malloc (the inflated blocks, the scanner's columns) returns the top of its heap to
# the system whenever a freed block leaves it free, so the next block of the same size faults
# its pages in again: a 4 MiB block at a time, a third of the decode's page faults. Kept
# padded by 32 MiB, the memory-events benchmark's trace decodes with 120k -> 80k page faults
# and analyzes in 1.15-1.18 s against 1.23-1.27 s (16 MiB: no gain; benchmarks/RESULTS.md).
# Only for files this large (on disk): a small trace's blocks do not churn, and the pad would
# only raise its peak (healthy_bf16: +13 MiB).
GLIBC_TOP_PAD_BYTES = 32 * 1024 * 1024
GLIBC_TOP_PAD_MIN_FILE_BYTES = 8 * 1024 * 1024
_M_TOP_PAD = -2  # glibc's <malloc.h>


def configure_single_trace_process(file_bytes: int = 0) -> None:
    """Allocator settings for a process that analyzes one large trace (``file_bytes`` on
    disk): polars' (effective only before polars is imported: afterwards its allocator is
    fixed) and glibc's heap padding."""
    if "polars" not in sys.modules:
        os.environ.setdefault(ALLOCATOR_ENV, ALLOCATOR_CONF)
    if file_bytes >= GLIBC_TOP_PAD_MIN_FILE_BYTES:
        _pad_glibc_heap(GLIBC_TOP_PAD_BYTES)


def _pad_glibc_heap(n_bytes: int) -> None:
    """glibc's M_TOP_PAD (a user's MALLOC_TOP_PAD_ wins); nothing on another C library."""
    try:
        if "MALLOC_TOP_PAD_" in os.environ or not os.confstr("CS_GNU_LIBC_VERSION"):
            return
    except (ValueError, OSError, AttributeError):  # not glibc, or no confstr
        return
    import ctypes  # here: only a process that analyzes one large trace needs it

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).mallopt(_M_TOP_PAD, n_bytes)


class _SpawnWithoutMain(SpawnProcess):
    """A spawned process that does not run the parent's ``__main__`` again. Spawn re-imports
    the main script in each child so functions defined there unpickle; ours run only
    traceinsight's own functions, and a plain script without an ``if __name__ ==
    "__main__":`` guard would run again in every child (which then fails to start its own
    pool: BrokenProcessPool). The child is told of no main module instead."""

    @staticmethod
    def _Popen(process_obj: Any) -> Any:  # noqa: N802 - multiprocessing's name
        # pools start their processes from the thread that submits: the caller's, for a moment
        with _no_main_module():
            return SpawnProcess._Popen(process_obj)


@contextlib.contextmanager
def _no_main_module() -> Iterator[None]:
    """No ``__main__`` for processes spawned inside the block (read by
    multiprocessing.spawn.get_preparation_data as each child is launched)."""
    main = sys.modules.get("__main__")
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        if main is None:
            sys.modules.pop("__main__", None)
        else:
            sys.modules["__main__"] = main


class _SpawnContextWithoutMain(SpawnContext):
    Process = _SpawnWithoutMain


def spawn_context() -> SpawnContext:
    """Spawned workers (forking a process that runs polars' thread pool can deadlock) that
    never re-run the caller's ``__main__``: the library works from a plain script."""
    return _SpawnContextWithoutMain()


PARENT_POLL_S = 1.0


def _exit_with_parent(parent_pid: int) -> None:
    """A pool worker's initializer: end the worker once the process that started it is gone.
    A killed parent (SIGKILL, out of memory) runs no cleanup, and a worker holds both ends of
    its own task queue, so it would wait for work forever (measured: still there 15 minutes
    after its batch was killed)."""

    def watch() -> None:
        while os.getppid() == parent_pid:  # re-parented (to init or a subreaper) once it dies
            time.sleep(PARENT_POLL_S)
        os._exit(1)

    threading.Thread(target=watch, name="traceinsight-parent-watch", daemon=True).start()


@contextlib.contextmanager
def process_pool(workers: int, runtime: Runtime) -> Iterator[tuple[ProcessPoolExecutor, Runtime]]:
    """Spawned workers (forking a process that runs polars' thread pool can deadlock) and the
    runtime each of them runs under; polars in each child starts with that many threads. The
    workers end within a second of this process being killed."""
    child = runtime.for_workers(workers)
    with (
        _env(POLARS_THREADS_ENV, str(child.threads)),
        ProcessPoolExecutor(
            max_workers=workers,
            mp_context=spawn_context(),
            initializer=_exit_with_parent,
            initargs=(os.getpid(),),
        ) as pool,
    ):
        yield pool, child


# A Dask worker's task: one thread of its own (the worker runs one task per thread).
DASK_TASK_RUNTIME = Runtime(threads=1, workers=1, in_worker=True)
# Dask's statistical profiler keeps a call tree of each second's samples for an hour: a worker
# analyzing ranks grew by ~18 KB pickled (several times that in memory) a second, its peak 1.46x
# one rank's alone after 16 minutes of a 256-rank job, 1.19x without it (and polars on one
# thread; benchmarks/RESULTS.md, "Jobs on Dask"). The LocalCluster's workers start without it;
# docs/COMMANDS.md says how to start a cluster's.
DASK_WORKER_CONFIG = {"distributed.worker.profile.enabled": False}


@contextlib.contextmanager
def dask_client(scheduler: str, workers: int) -> Iterator[Any]:
    """A ``dask.distributed`` client on ``scheduler`` (an address), or on a LocalCluster of
    ``workers`` one-thread processes for ``"local"``; closed (and the cluster) on leaving."""
    try:
        import dask
        from dask.distributed import Client, LocalCluster
    except ImportError:
        raise InputError(
            "Dask is not installed: pip install 'traceinsight-analyzer[dask]'"
        ) from None
    cluster = None
    if scheduler == "local":
        # its workers are spawned while this waits: a plain script is not run again in each;
        # without Dask's profiler (see DASK_WORKER_CONFIG)
        with _no_main_module(), dask.config.set(DASK_WORKER_CONFIG):
            cluster = LocalCluster(
                n_workers=max(1, workers),
                threads_per_worker=1,
                processes=True,
                dashboard_address=None,
                # its health endpoint on a free port: no warning when 8787 is taken
                scheduler_kwargs={"dashboard_address": ":0"},
                # the cluster lives for one command, and its shutdown races on a busy machine
                # (a worker's heartbeat to the closing scheduler, a nanny killing a slow
                # worker): tracebacks after a good run. A task's own failure still reaches
                # the client, as its exception.
                silence_logs=logging.CRITICAL,
                # polars in each worker with its share of the cores, as in process_pool (it
                # sizes its pool at import, after the nanny has set this in the worker)
                env={POLARS_THREADS_ENV: str(max(1, cores_available() // max(1, workers)))},
            )
        client = Client(cluster)
    else:
        try:
            client = Client(scheduler, timeout="20s")
        except (OSError, TimeoutError) as exc:
            raise InputError(f"cannot reach the Dask scheduler at {scheduler}: {exc}") from None
    try:
        yield client
    finally:
        client.close()
        if cluster is not None:
            cluster.close()


@contextlib.contextmanager
def single_thread_children() -> Iterator[None]:
    """Children spawned inside this block start polars with one thread (decoder helpers)."""
    with _env(POLARS_THREADS_ENV, "1"):
        yield


@contextlib.contextmanager
def _env(name: str, value: str) -> Iterator[None]:
    """``name=value`` for children spawned inside the block (read by polars at its import)."""
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


def peak_rss_bytes() -> int:
    """This process's peak resident size: Linux's VmHWM, else ru_maxrss (0 where neither is
    known). Not ru_maxrss on Linux: a process started by fork + exec (a spawned worker) keeps
    its parent's size at the fork in it, so a worker spawned by a 0.9 GB process read 0.9 GB."""
    with (
        contextlib.suppress(OSError, ValueError, IndexError),
        open("/proc/self/status", encoding="ascii", errors="replace") as f,
    ):
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024  # kB
    try:
        import resource
    except ImportError:  # not on a POSIX system
        return 0
    scale = 1 if sys.platform == "darwin" else 1024  # bytes on macOS, KiB elsewhere
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale


def exit_now(code: int) -> None:
    """End the process without the interpreter's teardown of the event tables (70 ms per run,
    more on large traces); every output must be written and every pool shut down by now."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(
            OSError, ValueError
        ):  # a closed pipe (| head): nothing more to say
            stream.flush()
    os._exit(code)


def template_cache(directory: str | None = None) -> Any:
    """A bytecode cache for the report templates in jinja's per-user temp folder (checked
    against the template source on load): compiling them takes 0.1 s of every ``analyze``.
    None where no private temp folder can be had; an unreadable entry is compiled anew."""
    import jinja2

    class _Cache(jinja2.FileSystemBytecodeCache):
        def load_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
            try:
                super().load_bytecode(bucket)
            except Exception:  # noqa: BLE001 - a truncated or foreign entry: compile instead
                bucket.reset()

        def dump_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
            with contextlib.suppress(OSError):
                super().dump_bytecode(bucket)

    try:
        return _Cache(directory)
    except (OSError, RuntimeError):
        return None
