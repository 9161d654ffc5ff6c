"""PyTorch's ``export_memory_timeline`` files (``torch/profiler/_memory_profiler.py``): no
events, only the memory table (``source`` "memory_timeline").

Two layouts, both JSON (gzip by content): the raw export (``.raw.json.gz``), one
``[time_ns, action, bytes, category]`` per tensor event (action 1 PREEXISTING, 2 CREATE,
3 INCREMENT_VERSION (a -bytes and a +bytes row), 4 DESTROY (negative bytes); time -1 for
tensors alive before the recording), and the plot export (``.json``), ``[times_us, sizes]`` with
one list of bytes per category at each time. The file names no device (``export_memory_timeline``
takes it as an argument): the rows are GPU 0's. Allocated memory is the running sum; the
profiler's tensors are not the allocator's blocks, so reserved memory is unknown (null).
"""

from __future__ import annotations

import re
from pathlib import Path

import msgspec
import polars as pl

from traceinsight.errors import InputError
from traceinsight.model.schema import MEMORY_SCHEMA, Trace, TraceMeta, conform_side, empty_events
from traceinsight.parsers.source import Decompressed, read_bytes

# An array of arrays of numbers (a Kineto 2020 bare array holds objects): either layout.
_HEAD = re.compile(rb"^\s*\[\s*\[\s*-?\d")


def is_memory_timeline(path: Path, max_bytes: int | None = None) -> bool:
    """From the first decompressed block only."""
    for block in Decompressed(path, max_bytes, read_size=4096):
        return bool(_HEAD.match(block[:256]))
    return False


def parse_memory_timeline(path: Path, max_bytes: int | None = None) -> Trace:
    data, _ = read_bytes(path, max_bytes)
    try:
        obj = msgspec.json.decode(data)
    except msgspec.DecodeError as exc:
        raise InputError(f"damaged memory timeline export ({exc})", str(path)) from None
    if _is_plot(obj):
        times, sizes = obj
        total = pl.Series([sum(row) for row in sizes], dtype=pl.Int64)
        df = pl.DataFrame(
            {"start_ns": pl.Series(times, dtype=pl.Int64) * 1000, "allocated_bytes": total}
        ).with_columns(
            pl.col("allocated_bytes").diff().fill_null(pl.col("allocated_bytes")).alias("bytes")
        )
        layout = "plot points (times, sizes by category)"
    elif isinstance(obj, list) and all(isinstance(r, list) and len(r) == 4 for r in obj):
        df = pl.DataFrame(obj, schema=["start_ns", "action", "bytes", "category"], orient="row")
        first = df.filter(pl.col("start_ns") >= 0).get_column("start_ns").min()
        df = (
            df.with_columns(
                # tensors alive before the recording: at its first timestamp
                pl.when(pl.col("start_ns") < 0)
                .then(pl.lit(first if first is not None else 0))
                .otherwise(pl.col("start_ns"))
                .alias("start_ns")
            )
            .sort("start_ns", maintain_order=True)
            .with_columns(pl.col("bytes").cum_sum().alias("allocated_bytes"))
        )
        layout = "raw events (time, action, bytes, category)"
    else:
        raise InputError(
            "not a trace: a JSON array that is neither a Kineto event array nor a memory timeline",
            str(path),
        )
    memory = conform_side(
        df.with_columns(
            pl.lit(0).alias("rank"),
            pl.lit(0).alias("device"),
            pl.lit("cuda").alias("device_type"),
            pl.lit("memory_timeline").alias("source"),
        ),
        MEMORY_SCHEMA,
    )
    meta = TraceMeta(
        source_path=str(path),
        format="memory-timeline",
        format_version=f"torch export_memory_timeline: {layout}",
        warnings=[
            "a memory timeline holds no events: only the memory metrics apply (device 0 assumed)"
        ],
    )
    return Trace(events=empty_events(), meta=meta, memory=memory)


def _is_plot(obj: object) -> bool:
    return (
        isinstance(obj, list)
        and len(obj) == 2
        and isinstance(obj[0], list)
        and isinstance(obj[1], list)
        and len(obj[0]) == len(obj[1])
        and all(isinstance(r, list) for r in obj[1][:16])
        and (len(obj[0]) != 4 or bool(obj[1]) and isinstance(obj[1][0], list))
    )
