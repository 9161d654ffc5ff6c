"""What the export says about its own completeness: the profiler's messages about events it
dropped (``DIAGNOSTIC_EVENT``, nsys >= 2024.5), and rows that are not in time order on their
timeline (nsys 2025.6+ may write them unsorted; the table is sorted on reading, so only this
count, taken before the sort, can tell). Both go into ``TraceMeta.extra`` for the health checks.
"""

from __future__ import annotations

import polars as pl

from traceinsight.constants import DROPPED_EVENTS_PATTERN as DROPPED
from traceinsight.parsers.nsys.db import Db

MAX_MESSAGES = 5
# kind of a fetched frame's rows -> the export table it came from
TABLE_OF = {
    "kernel": "CUPTI_ACTIVITY_KIND_KERNEL",
    "memcpy": "CUPTI_ACTIVITY_KIND_MEMCPY",
    "memset": "CUPTI_ACTIVITY_KIND_MEMSET",
    "gpu_sync": "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION",
    "runtime": "CUPTI_ACTIVITY_KIND_RUNTIME",
    "driver": "CUPTI_ACTIVITY_KIND_RUNTIME",
    "overhead": "PROFILER_OVERHEAD",
    "user_annotation": "NVTX_EVENTS",
}


def dropped_messages(db: Db) -> list[str]:
    """The export's diagnostics that report lost or dropped events (at most a few)."""
    t = db.table("DIAGNOSTIC_EVENT")
    if not t or "text" not in db.columns(t):
        return []
    rows = db.con.execute(f"SELECT text FROM {t} WHERE text IS NOT NULL").fetchall()
    texts = pl.Series("text", [r[0] for r in rows], dtype=pl.String, strict=False)
    hit = texts.drop_nulls().filter(texts.drop_nulls().str.contains(DROPPED))
    return [s.strip() for s in hit.head(MAX_MESSAGES).to_list()]


def out_of_order(frames: list[pl.DataFrame]) -> dict[str, dict[str, int]]:
    """Per export table: ``rows``, and ``breaks``, the rows that start before the previous row
    of their timeline (a GPU stream, a host thread) in the export's own row order. Healthy
    exports are written in per-thread buffer flushes, each in order, so they have a few breaks
    (one per flush: 2026.2's mfu_2gpu_after has RUNTIME rows of one thread in two blocks);
    rows written in no order have about one break per two rows."""
    out: dict[str, dict[str, int]] = {}
    for f in frames:
        if f.height < 2 or "start_ns" not in f.columns or "kind" not in f.columns:
            continue
        start = pl.col("start_ns")
        # The usual case, one pass: the whole table in order, so every timeline is.
        if not f.select((start < start.shift(1)).any()).item():
            continue
        line = ["gpid", "device", "stream"] if "stream" in f.columns else ["gpid", "tid"]
        line = [c for c in line if c in f.columns]
        if not line:
            continue
        n = int(f.select((start < start.shift(1)).over(line).sum()).item() or 0)
        table = TABLE_OF.get(str(f.get_column("kind")[0]), str(f.get_column("kind")[0]))
        seen = out.setdefault(table, {"rows": 0, "breaks": 0})
        seen["rows"] += f.height
        seen["breaks"] += n
    return {t: v for t, v in out.items() if v["breaks"]}
