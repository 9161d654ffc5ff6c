"""What a batch writes: one summary row per item, summary.parquet/.csv and index.html."""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from traceinsight.batch.discover import Failure, Item
from traceinsight.constants import HEADLINE_METRICS
from traceinsight.io import atomic_path, write_text_atomic

SUMMARY_METRICS = [*HEADLINE_METRICS[:2], "step_time_cv", "steps", *HEADLINE_METRICS[2:]]
SUMMARY_SCHEMA: dict[str, pl.DataType] = {
    "label": pl.String(),
    "kind": pl.String(),
    "status": pl.String(),
    "error": pl.String(),
    "ranks": pl.Int64(),
    **{
        m: (pl.Int64() if m.endswith("_ns") or m in ("steps", "host_sync_count") else pl.Float64())
        for m in SUMMARY_METRICS
    },
    "straggler_rank": pl.Int64(),
    "top_finding": pl.String(),
    "top_severity": pl.String(),
    "finding_ids": pl.String(),
    "report": pl.String(),
}


def error_row(item: Item, message: str) -> dict[str, Any]:
    row: dict[str, Any] = dict.fromkeys(SUMMARY_SCHEMA)
    row.update(label=item.label, kind=item.kind, status="error", error=message)
    return row


def failure_row(f: Failure) -> dict[str, Any]:
    return error_row(f.item, f.message)


def summary_row(item: Item, doc: dict[str, Any], report: str) -> dict[str, Any]:
    """The item's row: its metrics (a job: the mean of ratios, the max of counts and times over
    ranks), its top finding and its report."""
    row: dict[str, Any] = dict.fromkeys(SUMMARY_SCHEMA)
    m = doc["metrics"]
    is_job = doc.get("kind") == "job"
    if is_job:
        per = list(m["per_rank"].values())
        for k in SUMMARY_METRICS:
            vals = [r.get(k) for r in per if r.get(k) is not None]
            row[k] = (
                (sum(vals) / len(vals))
                if vals and isinstance(vals[0], float)
                else (max(vals) if vals else None)
            )
        row["straggler_rank"] = m.get("straggler_rank")
    else:
        for k in SUMMARY_METRICS:
            row[k] = m.get(k)
    f = doc["findings"]
    row.update(
        label=item.label,
        kind="job" if is_job else "trace",
        status="ok",
        ranks=len(doc["source"]["ranks"]),
        top_finding=f[0]["id"] if f else None,
        top_severity=f[0]["severity"] if f else None,
        finding_ids=",".join(x["id"] for x in f if x["severity"] != "info"),
        report=report,
    )
    return row


@dataclass
class BatchResult:
    rows: list[dict[str, Any]]
    resumed: int
    seconds: float

    @property
    def failed(self) -> int:
        return sum(1 for r in self.rows if r["status"] != "ok")

    def frame(self) -> pl.DataFrame:
        clean = [{k: r.get(k) for k in SUMMARY_SCHEMA} for r in self.rows]
        return pl.DataFrame(clean, schema=SUMMARY_SCHEMA, orient="row").sort("label")


# the files a batch writes at the top of OUTDIR (besides reports/)
OUTPUT_FILES = ("summary.parquet", "summary.csv", "index.html")


def write_outputs(result: BatchResult, outdir: Path) -> None:
    from traceinsight.report.html import render_index_html

    parquet, csv, index = (outdir / name for name in OUTPUT_FILES)
    df = result.frame()
    with atomic_path(parquet) as tmp:
        df.write_parquet(tmp)
    buf = io.StringIO()
    df.write_csv(buf)
    write_text_atomic(csv, buf.getvalue())
    write_text_atomic(index, render_index_html(df.to_dicts(), result.failed))
