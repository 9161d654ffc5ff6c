"""Before/after comparison of two analyses (traces or jobs).

Metrics side by side, step time, idle time by cause, kernels that appeared, disappeared or changed
most (matched by name and class, normalized per step so captures of different lengths compare),
and findings resolved or introduced; for jobs, the same per matched rank.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl

from traceinsight.analysis import KERNEL_TABLE_SCHEMA, SCHEMA, JobAnalysis, TraceAnalysis, tool_json
from traceinsight.api import analyze_with
from traceinsight.options import Options
from traceinsight.runtime import Runtime

TOP_KERNEL_CHANGES = 15
Analysis = TraceAnalysis | JobAnalysis


def _step_time(doc: dict[str, Any]) -> float | None:
    m = doc["metrics"]
    if doc.get("kind") == "job":
        return m.get("step_time_median_ns")
    return m.get("step_time_median_ns") or m.get("window_ns")


def _kernels(a: Analysis) -> pl.DataFrame:
    """A trace's kernels per step; a job's top level has none (its ranks are diffed one by one)."""
    return (
        a.kernel_table()
        if isinstance(a, TraceAnalysis)
        else pl.DataFrame(schema=KERNEL_TABLE_SCHEMA)
    )


def _metric_rows(mb: dict[str, Any], ma: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for key in mb:
        vb, va = mb.get(key), ma.get(key)
        if (
            isinstance(vb, (int, float))
            and isinstance(va, (int, float))
            and not isinstance(vb, bool)
        ):
            rows.append(
                {
                    "metric": key,
                    "before": vb,
                    "after": va,
                    "delta": va - vb,
                    "change": (va - vb) / vb if vb else None,
                }
            )
    return rows


def _idle_rows(mb: dict[str, Any], ma: dict[str, Any]) -> list[dict[str, Any]]:
    ib, ia = mb.get("idle_by_cause_ns") or {}, ma.get("idle_by_cause_ns") or {}
    rows = []
    for cause in sorted(set(ib) | set(ia)):
        b, a = ib.get(cause, 0), ia.get(cause, 0)
        if b or a:
            rows.append({"cause": cause, "before_ns": b, "after_ns": a, "delta_ns": a - b})
    return rows


def _kernel_changes(kb: pl.DataFrame, ka: pl.DataFrame) -> dict[str, Any]:
    k = (
        kb.join(ka, on=["name", "kernel_class"], how="full", suffix="_after", coalesce=True)
        .with_columns(
            pl.col("total_ns").fill_null(0.0),
            pl.col("total_ns_after").fill_null(0.0),
            pl.col("count").fill_null(0.0),
            pl.col("count_after").fill_null(0.0),
        )
        .with_columns((pl.col("total_ns_after") - pl.col("total_ns")).alias("delta_ns"))
    )
    appeared = k.filter((pl.col("count") == 0) & (pl.col("count_after") > 0)).sort(
        ["total_ns_after", "name"], descending=[True, False]
    )
    gone = k.filter((pl.col("count") > 0) & (pl.col("count_after") == 0)).sort(
        ["total_ns", "name"], descending=[True, False]
    )
    changed = k.filter((pl.col("count") > 0) & (pl.col("count_after") > 0)).sort(
        [pl.col("delta_ns").abs(), pl.col("name")], descending=[True, False]
    )
    return {
        "appeared": appeared.head(TOP_KERNEL_CHANGES).to_dicts(),
        "disappeared": gone.head(TOP_KERNEL_CHANGES).to_dicts(),
        "changed": changed.head(TOP_KERNEL_CHANGES).to_dicts(),
        "appeared_count": appeared.height,
        "disappeared_count": gone.height,
    }


def _finding_changes(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> dict[str, Any]:
    fb = {f["id"]: f for f in before if f["severity"] != "info"}
    fa = {f["id"]: f for f in after if f["severity"] != "info"}
    return {
        "resolved": [
            {"id": i, "title": fb[i]["title"], "severity": fb[i]["severity"]}
            for i in fb
            if i not in fa
        ],
        "introduced": [
            {"id": i, "title": fa[i]["title"], "severity": fa[i]["severity"]}
            for i in fa
            if i not in fb
        ],
        "remaining": [
            {"id": i, "before": fb[i]["severity"], "after": fa[i]["severity"]}
            for i in fb
            if i in fa
        ],
    }


def compare_docs(
    before: dict[str, Any], after: dict[str, Any], kb: pl.DataFrame, ka: pl.DataFrame
) -> dict[str, Any]:
    """The diff of two analysis documents and their kernel tables."""
    sb, sa = _step_time(before), _step_time(after)
    return {
        "schema": SCHEMA,
        "kind": "diff",
        "tool": tool_json(),
        "before": before["source"]["path"],
        "after": after["source"]["path"],
        "step_time_before_ns": sb,
        "step_time_after_ns": sa,
        "step_time_change": (sa - sb) / sb if sb and sa is not None else None,
        "metrics": _metric_rows(before["metrics"], after["metrics"]),
        "idle_by_cause": _idle_rows(before["metrics"], after["metrics"]),
        "kernels_per_step": _kernel_changes(kb, ka),
        "findings": _finding_changes(before["findings"], after["findings"]),
    }


def _ranks(a: Analysis) -> dict[int, TraceAnalysis]:
    return {r.rank: r for r in a.ranks} if isinstance(a, JobAnalysis) else {a.rank: a}


def compare(before: Analysis, after: Analysis) -> dict[str, Any]:
    """The diff of two analyses; where either is a job, ``ranks`` has one diff per rank both
    sides have (matched by rank number)."""
    doc = compare_docs(before.to_json(), after.to_json(), _kernels(before), _kernels(after))
    if isinstance(before, JobAnalysis) or isinstance(after, JobAnalysis):
        rb, ra = _ranks(before), _ranks(after)
        doc["ranks"] = [
            {
                "rank": r,
                **compare_docs(
                    rb[r].to_json(), ra[r].to_json(), rb[r].kernel_table(), ra[r].kernel_table()
                ),
            }
            for r in sorted(set(rb) & set(ra))
        ]
    return doc


def diff_paths(
    before: Path, after: Path, opts: Options | None = None, runtime: Runtime | None = None
) -> dict[str, Any]:
    opts = opts or Options()
    runtime = runtime or Runtime.detect(helpers=False)
    return compare(
        analyze_with(Path(before), opts, runtime), analyze_with(Path(after), opts, runtime)
    )
