"""Before/after comparison of two traces (or two job directories).

Metrics side by side, step time, idle time by cause, kernels that appeared, disappeared or changed
most (matched by name and class, normalized per step so captures of different lengths compare),
and findings resolved or introduced.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl

from traceinsight import __version__

TOP_KERNEL_CHANGES = 15


def _load(path: Path) -> tuple[dict[str, Any], pl.DataFrame]:
    """The result document and a per-step kernel table (name, class, count, total_ns)."""
    if path.is_dir():
        from traceinsight.jobs import analyze_job

        doc = analyze_job(path).to_json()  # job results carry no kernel table: metrics-level diff
        return doc, pl.DataFrame(schema={"name": pl.String, "kernel_class": pl.String, "count": pl.Float64, "total_ns": pl.Float64})
    from traceinsight.api import analyze_path

    a = analyze_path(path)
    doc = a.to_json()
    ev = a.trace.events.filter(pl.col("kind") == "kernel")
    steps = max(1, a.metrics["steps"] or 1)
    table = (
        ev.group_by("name", "kernel_class")
        .agg(pl.len().alias("count"), pl.col("dur_ns").sum().alias("total_ns"))
        .with_columns(
            pl.col("kernel_class").cast(pl.String),
            (pl.col("count") / steps).alias("count"),
            (pl.col("total_ns") / steps).alias("total_ns"),
        )
    )
    return doc, table


def _step_time(doc: dict[str, Any]) -> float | None:
    m = doc["metrics"]
    if doc.get("kind") == "job":
        return m.get("step_time_median_ns")
    return m.get("step_time_median_ns") or m.get("span_ns")


def compare_docs(before: dict[str, Any], after: dict[str, Any], kb: pl.DataFrame, ka: pl.DataFrame) -> dict[str, Any]:
    mb, ma = before["metrics"], after["metrics"]
    metrics = []
    for key in mb:
        vb, va = mb.get(key), ma.get(key)
        if isinstance(vb, (int, float)) and isinstance(va, (int, float)) and not isinstance(vb, bool):
            metrics.append({"metric": key, "before": vb, "after": va, "delta": va - vb, "change": (va - vb) / vb if vb else None})
    idle = []
    ib, ia = mb.get("idle_by_cause_ns") or {}, ma.get("idle_by_cause_ns") or {}
    for cause in sorted(set(ib) | set(ia)):
        b, a = ib.get(cause, 0), ia.get(cause, 0)
        if b or a:
            idle.append({"cause": cause, "before_ns": b, "after_ns": a, "delta_ns": a - b})
    sb, sa = _step_time(before), _step_time(after)
    step_change = (sa - sb) / sb if sb and sa is not None else None
    k = kb.join(ka, on=["name", "kernel_class"], how="full", suffix="_after", coalesce=True).with_columns(
        pl.col("total_ns").fill_null(0.0), pl.col("total_ns_after").fill_null(0.0),
        pl.col("count").fill_null(0.0), pl.col("count_after").fill_null(0.0),
    ).with_columns((pl.col("total_ns_after") - pl.col("total_ns")).alias("delta_ns"))
    appeared = k.filter((pl.col("count") == 0) & (pl.col("count_after") > 0)).sort(["total_ns_after", "name"], descending=[True, False])
    gone = k.filter((pl.col("count") > 0) & (pl.col("count_after") == 0)).sort(["total_ns", "name"], descending=[True, False])
    changed = k.filter((pl.col("count") > 0) & (pl.col("count_after") > 0)).sort([pl.col("delta_ns").abs(), pl.col("name")], descending=[True, False])
    fb = {f["id"]: f for f in before["findings"] if f["severity"] != "info"}
    fa = {f["id"]: f for f in after["findings"] if f["severity"] != "info"}
    return {
        "schema": "traceinsight/1",
        "kind": "diff",
        "tool": {"name": "traceinsight", "version": __version__},
        "before": before["source"]["path"],
        "after": after["source"]["path"],
        "step_time_before_ns": sb,
        "step_time_after_ns": sa,
        "step_time_change": step_change,
        "metrics": metrics,
        "idle_by_cause": idle,
        "kernels_per_step": {
            "appeared": appeared.head(TOP_KERNEL_CHANGES).to_dicts(),
            "disappeared": gone.head(TOP_KERNEL_CHANGES).to_dicts(),
            "changed": changed.head(TOP_KERNEL_CHANGES).to_dicts(),
            "appeared_count": appeared.height,
            "disappeared_count": gone.height,
        },
        "findings": {
            "resolved": [{"id": i, "title": fb[i]["title"], "severity": fb[i]["severity"]} for i in fb if i not in fa],
            "introduced": [{"id": i, "title": fa[i]["title"], "severity": fa[i]["severity"]} for i in fa if i not in fb],
            "remaining": [{"id": i, "before": fb[i]["severity"], "after": fa[i]["severity"]} for i in fb if i in fa],
        },
    }


def diff_paths(before: Path, after: Path) -> dict[str, Any]:
    db, kb = _load(before)
    da, ka = _load(after)
    return compare_docs(db, da, kb, ka)
