"""``CUDA_GPU_MEMORY_USAGE_EVENTS`` (``nsys profile --cuda-memory-usage=true``) into the memory
table: the driver's allocations and frees, i.e. what the caching allocator reserves, so their
running total per process and device is ``reserved_bytes`` (allocated by tensors is unknown)."""

from __future__ import annotations

import polars as pl

from traceinsight.model.schema import MEMORY_SCHEMA, conform_side, empty_memory
from traceinsight.parsers.nsys.db import Db, Rows
from traceinsight.parsers.nsys.tables import packed_pid, pick

# CUDA_MEMOPR_MEMORY_KIND: 2 device, 5 device static (pageable/pinned/managed are not the GPU's)
DEVICE_KINDS = (2, 5)


def memory_rows(db: Db) -> Rows | None:
    table = db.table("CUDA_GPU_MEMORY_USAGE_EVENTS")
    if table is None:
        return None
    cols = db.columns(table)
    return db.query(
        [
            "start",
            "globalPid",
            "deviceId",
            "address",
            "bytes",
            "memoryOperationType",
            pick(cols, "memKind", "2"),
        ],
        table,
        {
            "start_ns": pl.Int64,
            "gpid": pl.Int64,
            "device": pl.Int64,
            "addr": pl.Int64,
            "nbytes": pl.Int64,
            "op": pl.Int64,
            "mk": pl.Int64,
        },
    )


def memory_table(df: pl.DataFrame | None, offset_ns: int, rank: pl.Expr) -> pl.DataFrame:
    """Signed bytes (a free is negative), the running reserved total per process and device,
    times on the session timeline as the events' are; ``rank``: the process's rank."""
    if df is None or df.height == 0:
        return empty_memory()
    out = (
        df.filter(pl.col("mk").is_in(DEVICE_KINDS))
        .sort("start_ns", maintain_order=True)
        .with_columns(
            (pl.col("start_ns") + offset_ns),
            pl.when(pl.col("op") == 1)
            .then(-pl.col("nbytes"))
            .otherwise(pl.col("nbytes"))
            .alias("bytes"),
            packed_pid(pl.col("gpid")).alias("pid"),
            rank,
            pl.lit("cuda").alias("device_type"),
            pl.lit("nsys").alias("source"),
        )
        .with_columns(pl.col("bytes").cum_sum().over("gpid", "device").alias("reserved_bytes"))
    )
    return conform_side(out, MEMORY_SCHEMA)
