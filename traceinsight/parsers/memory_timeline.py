"""PyTorch's ``export_memory_timeline`` files (``torch/profiler/_memory_profiler.py``): no
events, only the memory table (``source`` "memory_timeline").

Two layouts, both JSON (gzip by content), each decoded into its types at once (msgspec): anything
else is an :class:`InputError` naming what is wrong.

- The raw export (``.raw.json.gz``, ``export_memory_timeline_raw``): one
  ``[time_ns, action, bytes, category]`` per tensor event, sorted by (time, action): action 1
  PREEXISTING, 2 CREATE, 3 INCREMENT_VERSION (a -bytes row in the old version's category and a
  +bytes row in the new one's), 4 DESTROY (negative bytes); time -1 for tensors alive before the
  recording; category the index in torch's ``_CATEGORY_TO_INDEX`` (:data:`MEMORY_CATEGORIES`).
- The plot export (``.json``, ``.json.gz``; ``_coalesce_timeline``): ``[times_us, sizes]``, the
  times in µs (``int(t_ns / 1000)``), ``sizes[i]`` the bytes live after that time per category,
  position 0 unused (always 0) and position k + 1 category index k. One row per time and category
  whose bytes changed, ``bytes`` that change, ``allocated_bytes`` the total over categories then.

The file names no device (``export_memory_timeline`` takes it as an argument): the rows are GPU
0's. Allocated memory is the running sum; the profiler's tensors are not the allocator's blocks,
so reserved memory is unknown (null).
"""

from __future__ import annotations

import re
from itertools import chain
from pathlib import Path
from typing import Annotated

import msgspec
import polars as pl

from traceinsight.errors import InputError
from traceinsight.model.schema import (
    MEMORY_CATEGORIES,
    MEMORY_SCHEMA,
    Trace,
    TraceMeta,
    conform_side,
    empty_events,
)
from traceinsight.parsers.source import Decompressed, read_bytes
from traceinsight.report.format import plural

# An array of arrays of numbers (a Kineto 2020 bare array holds objects): either layout.
_HEAD = re.compile(rb"^\s*\[\s*\[\s*-?\d")

# Bounds that keep every later sum in int64: a time in ns, a tensor's bytes (64 PiB at most).
_NS_MAX = 2**63 - 1
_BYTES_MAX = 2**56
Time = Annotated[int, msgspec.Meta(ge=-1, le=_NS_MAX)]
Action = Annotated[int, msgspec.Meta(ge=1, le=4)]
Bytes = Annotated[int, msgspec.Meta(ge=-_BYTES_MAX, le=_BYTES_MAX)]
CategoryIndex = Annotated[int, msgspec.Meta(ge=0, le=len(MEMORY_CATEGORIES) - 1)]
# plot times are µs: ns must fit int64
TimeUs = (
    Annotated[int, msgspec.Meta(ge=-1, le=_NS_MAX // 1000 - 1)]
    | Annotated[float, msgspec.Meta(ge=-1, le=_NS_MAX // 1000 - 1)]
)

RAW_TYPE = list[tuple[Time, Action, Bytes, CategoryIndex]]
PLOT_TYPE = tuple[list[TimeUs], list[list[Bytes]]]
LAYOUTS = {
    "raw": "raw events [time_ns, action, bytes, category]",
    "plot": "plot points [times_us, sizes by category]",
}
# the plot's sizes rows: position 0 unused, then one per category
PLOT_ROW_MAX = 1 + len(MEMORY_CATEGORIES)


def is_memory_timeline(path: Path, max_bytes: int | None = None) -> bool:
    """From the first decompressed block only."""
    for block in Decompressed(path, max_bytes, read_size=4096):
        return bool(_HEAD.match(block[:256]))
    return False


def parse_memory_timeline(path: Path, max_bytes: int | None = None) -> Trace:
    data, _ = read_bytes(path, max_bytes)
    layout, obj = _decode(data, str(path))
    if layout == "plot":
        times, sizes = obj  # type: ignore[misc]
        df = _plot_rows(times, sizes, str(path))
    else:
        df = _raw_rows(obj, str(path))  # type: ignore[arg-type]
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
        format_version=f"torch export_memory_timeline: {LAYOUTS[layout]}",
        warnings=[
            "a memory timeline holds no events: only the memory metrics apply (device 0 assumed)"
        ],
    )
    return Trace(events=empty_events(), meta=meta, memory=memory)


def _decode(data: bytes, path: str) -> tuple[str, object]:
    """The document in the first layout its types accept; else an InputError with the error of
    the layout it looks like (see :func:`_looks_like`)."""
    errors: dict[str, str] = {}
    for layout, typ in (("raw", RAW_TYPE), ("plot", PLOT_TYPE)):
        try:
            return layout, msgspec.json.decode(data, type=typ)
        except msgspec.ValidationError as exc:
            errors[layout] = str(exc)
        except msgspec.DecodeError as exc:  # not JSON at all: no layout can take it
            raise InputError(f"damaged memory timeline export ({exc})", path) from None
    layout = _looks_like(data)
    raise InputError(
        f"not a memory timeline export ({LAYOUTS[layout]}): {errors[layout]}", path
    ) from None


def _looks_like(data: bytes) -> str:
    """Which layout a document neither accepts was meant to be (only read for the error
    message): the plot's second part holds arrays, or it is two parts and the first is no row
    of four; a raw export's rows hold numbers."""
    try:
        obj = msgspec.json.decode(data)
    except (msgspec.DecodeError, RecursionError):
        return "raw"
    if not isinstance(obj, list) or len(obj) < 2 or not isinstance(obj[1], list):
        return "raw"
    if any(isinstance(r, list) for r in obj[1][:16]):
        return "plot"
    return "plot" if len(obj) == 2 and isinstance(obj[0], list) and len(obj[0]) != 4 else "raw"


def _categories(index: pl.Expr) -> pl.Expr:
    """Category index -> its name (indices are validated by the decode)."""
    return index.replace_strict(
        list(range(len(MEMORY_CATEGORIES))), list(MEMORY_CATEGORIES), return_dtype=pl.String
    )


def _raw_rows(rows: list[tuple[int, int, int, int]], path: str) -> pl.DataFrame:
    df = pl.DataFrame(
        rows,
        schema={
            "start_ns": pl.Int64,
            "action": pl.Int64,
            "bytes": pl.Int64,
            "category": pl.Int64,
        },
        orient="row",
    )
    # each row's bytes are bounded by the decode; many of them must still sum within int64
    if df.select(pl.col("bytes").cast(pl.Float64).abs().sum()).item() >= 2**62:
        raise InputError(
            f"not a memory timeline export ({LAYOUTS['raw']}): the bytes sum past 2**62", path
        )
    first = df.filter(pl.col("start_ns") >= 0).get_column("start_ns").min()
    return (
        df.with_columns(
            # tensors alive before the recording: at its first timestamp
            pl.when(pl.col("start_ns") < 0)
            .then(pl.lit(first if first is not None else 0))
            .otherwise(pl.col("start_ns"))
            .alias("start_ns"),
            _categories(pl.col("category")).alias("category"),
        )
        .sort("start_ns", maintain_order=True)
        .with_columns(pl.col("bytes").cum_sum().alias("allocated_bytes"))
    )


def _plot_rows(times: list[int | float], sizes: list[list[int]], path: str) -> pl.DataFrame:
    if len(times) != len(sizes):
        raise InputError(
            f"not a memory timeline export ({LAYOUTS['plot']}): {plural(len(times), 'time')} "
            f"but {plural(len(sizes), 'size row')}",
            path,
        )
    widths = {len(r) for r in sizes}
    if len(widths) > 1 or not widths <= set(range(1, PLOT_ROW_MAX + 1)):
        raise InputError(
            f"not a memory timeline export ({LAYOUTS['plot']}): rows of sizes must all hold "
            f"1 to {PLOT_ROW_MAX} numbers (0, then one per category), not "
            + ", ".join(str(w) for w in sorted(widths)[:4]),
            path,
        )
    width = widths.pop() if widths else 1
    if all(isinstance(t, int) for t in times):
        ns = pl.Series(times, dtype=pl.Int64) * 1000
    else:  # µs as floats: rounded to the ns
        ns = (pl.Series(times, dtype=pl.Float64) * 1000).round().cast(pl.Int64)
    first = ns.filter(ns >= 0).min()
    # -1: the tensors alive before the recording, at its first time
    ns = pl.select(
        pl.when(ns < 0).then(pl.lit(first if first is not None else 0, pl.Int64)).otherwise(ns)
    ).to_series()
    # one column per position, every width-th value of the rows laid end to end (polars' list
    # and array constructors, and a transpose in Python, take 4-15x longer); position 0 is
    # never written by torch, bytes there have no category: unknown
    flat = pl.Series(list(chain.from_iterable(sizes)), dtype=pl.Int64)
    columns = [flat.gather_every(width, offset=k) for k in range(width)] if len(ns) else []
    names = ["unknown", *MEMORY_CATEGORIES][:width]
    total = pl.select(pl.sum_horizontal(columns)).to_series() if columns else ns.clear()
    parts = [
        pl.DataFrame({"_i": pl.int_range(len(ns), eager=True), "start_ns": ns, "size": col})
        .with_columns(
            pl.col("size").diff().fill_null(pl.col("size")).alias("bytes"),
            allocated_bytes=total,
        )
        .filter(pl.col("bytes") != 0)
        .select("_i", "start_ns", "bytes", "allocated_bytes", pl.lit(name).alias("category"))
        for col, name in zip(columns, names, strict=True)
    ]
    if not parts:
        return pl.DataFrame(
            schema={"start_ns": pl.Int64, "bytes": pl.Int64, "allocated_bytes": pl.Int64}
        )
    # in time order, a time's categories in their order
    return pl.concat(parts).sort("_i", maintain_order=True).drop("_i")
