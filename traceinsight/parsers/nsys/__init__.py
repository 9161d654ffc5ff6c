"""Nsight Systems SQLite exports (``nsys export --type sqlite``), nsys 2021 through 2026.2.

Tables are created lazily by nsys, so every table and column is probed first; only the needed
columns are pulled. :mod:`.db` reads (read-only), :mod:`.tables` turns GPU activity, API calls and
session facts into event rows, :mod:`.nvtx` the NVTX ranges. Schema notes: ../shared/NSYS_SCHEMA.md.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from traceinsight.errors import InputError
from traceinsight.model.classify import add_kernel_class, mark_comm_by_launcher
from traceinsight.model.schema import Trace, TraceMeta, conform, empty_events
from traceinsight.parsers.nsys import backtraces, diagnostics
from traceinsight.parsers.nsys.db import Db, Rows
from traceinsight.parsers.nsys.gpu_metrics import gpu_metric_rows, gpu_metrics_table
from traceinsight.parsers.nsys.memory import memory_rows, memory_table
from traceinsight.parsers.nsys.nvtx import nccl_domain, nvtx_query, strip_emit_nvtx
from traceinsight.parsers.nsys.tables import (
    devices,
    event_rows,
    gpu_rows,
    host_rows,
    kernel_args,
    launch_config,
    metadata,
    session_start,
)

__all__ = ["parse_nsys", "parse_nsys_rep", "strip_emit_nvtx"]


def time_normalized(meta_kv: dict[str, str]) -> bool:
    """Whether the export's times are UTC ns already (``nsys export --ts-normalize=true``)."""
    return meta_kv.get("EXPORT_PARAM_TIME_NORMALIZE", "").strip().lower() == "true"


def parse_nsys(path: str | Path, threads: int = 1) -> Trace:
    path = Path(path)
    db = Db(path, event_rows)
    try:
        if "StringIds" not in db.tables or not any(
            t.startswith(("CUPTI_", "NVTX_", "TARGET_INFO_", "ThreadNames")) for t in db.tables
        ):
            raise InputError(
                "SQLite file is not an Nsight Systems export (no StringIds/CUPTI/NVTX tables)",
                str(path),
            )
        meta_kv = metadata(db)
        session_start_ns = session_start(db)
        # Session-relative ns -> UTC ns: ranks exported separately line up (as Kineto's do).
        # `nsys export --ts-normalize=true` wrote UTC ns already (EXPORT_CONFIG_TIME_SHIFT, the
        # session's start, added): shifting again would move each rank by its own session start
        db.offset_ns = 0 if time_normalized(meta_kv) else (session_start_ns or 0)
        found_devices = devices(db)
        strings = db.query(
            ["id", "value"], "StringIds", {"sid": pl.Int64, "svalue": pl.String}
        ).result()
        # The host tables (NVTX, runtime: the costliest rows) are queued first, so the GPU
        # tables' smaller parts fill the end, when one thread would otherwise wait on the other.
        pending_host = host_rows(db, strings)
        nvtx = nvtx_query(db, strings)
        pending_gpu = gpu_rows(db, strings)
        pending_mem = memory_rows(db)
        pending_stacks = backtraces.Pending(db)
        pending_counters = gpu_metric_rows(db)
        gpu = [p.result() for p in pending_gpu]
        host = [p.result() for p in pending_host]
        if nvtx is not None:
            host.append(nccl_domain(nvtx.result()))
        mem = pending_mem.result() if pending_mem is not None else None
        callchains = pending_stacks.result(strings, backtraces.api_calls(host))
        dropped = diagnostics.dropped_messages(db)
    finally:
        db.close()

    frames = [f for f in gpu + host if f.height]
    version = meta_kv.get("EXPORT_PRODUCT_VERSION") or meta_kv.get("EXPORT_PRODUCT_VERSION_STRING")
    schema = meta_kv.get("EXPORT_SCHEMA_VERSION")
    if not schema and {"EXPORT_SCHEMA_VERSION_MAJOR", "EXPORT_SCHEMA_VERSION_MINOR"} <= set(
        meta_kv
    ):
        schema = f"{meta_kv['EXPORT_SCHEMA_VERSION_MAJOR']}.{meta_kv['EXPORT_SCHEMA_VERSION_MINOR']}.{meta_kv.get('EXPORT_SCHEMA_VERSION_MICRO', 0)}"
    era = f"nsys {version or 'unknown (no export metadata, ~2021)'}" + (
        f"; schema {schema}" if schema else ""
    )
    meta = TraceMeta(
        source_path=str(path), format="nsys-sqlite", format_version=era, devices=found_devices
    )
    if not gpu or not any(f.height for f in gpu):
        meta.warnings.append("the export has no CUDA GPU activity (kernels, copies, memsets)")
    if dropped:
        meta.extra["profiler_dropped"] = dropped
    if not frames:
        return Trace(events=empty_events(), meta=meta)
    # The row-order count and the launch configuration's sort, each mostly on one core, run
    # beside the event table's concatenation and sort where there are two cores.
    fetched = _Fetched(session_start_ns, db.offset_ns, mem, callchains, pending_counters)
    with ThreadPoolExecutor(max_workers=1) as pool:
        return _event_tables(frames, meta, threads, pool if threads > 1 else None, fetched)


@dataclass(frozen=True)
class _Fetched:
    """What the side tables are made of, besides the event frames."""

    session_start_ns: int | None
    offset_ns: int
    mem: pl.DataFrame | None
    callchains: pl.DataFrame
    pending_counters: tuple[Rows, pl.DataFrame] | None


def _event_tables(
    frames: list[pl.DataFrame],
    meta: TraceMeta,
    threads: int,
    side: ThreadPoolExecutor | None,
    fetched: _Fetched,
) -> Trace:
    """The event table and the side tables of the fetched frames."""

    def beside(fn: Callable[..., Any], *args: Any) -> Callable[[], Any]:
        if side is None:
            done = fn(*args)
            return lambda: done
        return side.submit(fn, *args).result

    # Counted before conform sorts them (the only place the export's own order is seen); its
    # key keeps its place in the metadata while it is counted.
    unordered = beside(diagnostics.out_of_order, frames)
    meta.extra["rows_out_of_order"] = {}
    session_start_ns, offset_ns = fetched.session_start_ns, fetched.offset_ns

    # One process = one rank (ordered by process id); correlation ids are unique only per process.
    # Only processes with CUDA activity are ranks; host-only processes (launchers) fold into rank 0.
    cuda_kinds = ["kernel", "memcpy", "memset", "gpu_sync", "runtime", "driver"]
    procs = sorted(
        {
            g
            for f in frames
            for g in f.select("kind", "gpid")
            .filter(pl.col("kind").is_in(cuda_kinds))
            .get_column("gpid")
            .drop_nulls()
            .unique()
        }
    )
    frames, launch_rows = kernel_args(frames, _rank_of(procs))
    launch_args = beside(launch_config, launch_rows)
    df = pl.concat(frames, how="diagonal_relaxed")
    # The rank as its own column: with_columns would first copy the concatenation's every
    # column into one chunk (conform gathers them once anyway).
    df.insert_column(
        df.width, df.get_column("gpid").to_frame().with_columns(_rank_of(procs)).get_column("rank")
    )
    if session_start_ns:
        meta.extra["session_start_utc_ns"] = session_start_ns
    else:
        meta.warnings.append(
            "no session start time in the export: times are relative to the capture start"
        )
    if len(procs) > 1:
        meta.world_size = len(procs)
        meta.warnings.append(
            f"{len(procs)} processes in one export: analyzed as ranks 0..{len(procs) - 1} by process id"
        )
    table = mark_comm_by_launcher(add_kernel_class(conform(df, threads)))
    memory = memory_table(fetched.mem, offset_ns, _rank_of(procs))
    callchains = fetched.callchains.with_columns(_rank_of(procs)).drop("gpid")
    counters = gpu_metrics_table(fetched.pending_counters, offset_ns, table)
    if rows_out_of_order := unordered():
        meta.extra["rows_out_of_order"] = rows_out_of_order
    else:
        del meta.extra["rows_out_of_order"]
    return Trace(
        events=table,
        meta=meta,
        memory=memory,
        kernel_args=launch_args(),
        callchains=callchains,
        gpu_metrics=counters,
    )


def _rank_of(procs: list[int]) -> pl.Expr:
    """The rank of each row: the index of its process id in ``procs``, 0 for other processes.
    A chain of comparisons for the usual few processes (0.3 s less than a hash lookup on 15M
    rows), the lookup beyond that."""
    if len(procs) > 16:
        return (
            pl.col("gpid")
            .replace_strict({g: i for i, g in enumerate(procs)}, default=0, return_dtype=pl.Int32)
            .alias("rank")
        )
    rank = pl.lit(0, pl.Int32)
    for i, g in enumerate(procs):
        rank = pl.when(pl.col("gpid") == g).then(pl.lit(i, pl.Int32)).otherwise(rank)
    return rank.alias("rank")


def parse_nsys_rep(path: str | Path, threads: int = 1) -> Trace:
    """A ``.nsys-rep`` report: export it with the local ``nsys`` into a temp dir, then parse."""
    path = Path(path)
    nsys = shutil.which("nsys")
    if nsys is None:
        raise InputError(
            "a .nsys-rep needs the nsys binary to export it; run "
            f"'nsys export --type sqlite -o report.sqlite {path}' and pass the .sqlite",
            str(path),
        )
    with tempfile.TemporaryDirectory(prefix="traceinsight-") as tmp:
        out = Path(tmp) / "export.sqlite"
        r = subprocess.run(
            [nsys, "export", "--type", "sqlite", "-o", str(out), str(path)],
            capture_output=True,
            text=True,
        )
        if r.returncode != 0 or not out.exists():
            raise InputError(
                f"nsys export failed: {(r.stderr or r.stdout).strip()[-300:]}", str(path)
            )
        trace = parse_nsys(out, threads)
    trace.meta.source_path = str(path)
    return trace
