"""What a batch writes: one summary row per item, summary.parquet/.csv and index.html."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import polars as pl

from traceinsight.api import quality_errors
from traceinsight.batch.discover import Failure, Item
from traceinsight.constants import HEADLINE_METRICS
from traceinsight.io import atomic_path

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
    # a data-quality error (a truncated file, lost device activity, no events) leaves numbers
    # that cannot be trusted: the row says so (audit 12: a truncated trace's row read "ok" with
    # another top finding than the intact file's)
    broken = quality_errors(doc)
    row.update(
        label=item.label,
        kind="job" if is_job else "trace",
        status="degraded" if broken else "ok",
        error=f"data quality: {broken[0]['check']}: {broken[0]['message']}" if broken else None,
        ranks=len(doc["source"]["ranks"]),
        top_finding=f[0]["id"] if f else None,
        top_severity=f[0]["severity"] if f else None,
        finding_ids=",".join(x["id"] for x in f if x["severity"] != "info"),
        report=report,
    )
    return row


_INT_COLUMNS = [k for k, t in SUMMARY_SCHEMA.items() if t == pl.Int64()]


class RowSpool:
    """The rows as they arrive, one JSON line each in a file under OUTDIR: the client keeps
    counts, not rows, so its memory does not grow with the number of items."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.count = self.failed = self.resumed = 0
        self._file = open(path, "wb")  # noqa: SIM115 - closed by frame() or close()

    def add(self, row: dict[str, Any]) -> None:
        self.count += 1
        self.failed += row["status"] != "ok"
        self.resumed += bool(row.get("_resumed"))
        clean = {k: row.get(k) for k in SUMMARY_SCHEMA}
        for k in _INT_COLUMNS:  # a job's median over an even count of steps ends in .5
            if isinstance(clean[k], float):
                clean[k] = int(clean[k])  # toward zero, as polars casts
        self._file.write(orjson.dumps(clean) + b"\n")

    def close(self) -> None:
        self._file.close()

    def frame(self) -> pl.DataFrame:
        """All rows, sorted by label (columnar: a few hundred bytes a row)."""
        self.close()
        if not self.count:
            return pl.DataFrame(schema=SUMMARY_SCHEMA)
        return pl.read_ndjson(self.path, schema=SUMMARY_SCHEMA).sort("label")


@dataclass(frozen=True)
class BatchResult:
    summary: pl.DataFrame  # one row per item (SUMMARY_SCHEMA), sorted by label
    resumed: int  # items whose report was up to date (not analyzed again)
    seconds: float

    @property
    def failed(self) -> int:
        return self.summary.filter(pl.col("status") != "ok").height

    def failures(self) -> list[tuple[str, str, str]]:
        """(label, status, error) of every item that failed or was read with a data-quality
        error (``degraded``)."""
        bad = self.summary.filter(pl.col("status") != "ok")
        return list(
            zip(
                bad["label"].to_list(), bad["status"].to_list(), bad["error"].to_list(), strict=True
            )
        )

    @property
    def degraded(self) -> int:
        return self.summary.filter(pl.col("status") == "degraded").height


class _Rows:
    """The summary's rows for the index template: sized, and iterated without a list of dicts."""

    def __init__(self, df: pl.DataFrame) -> None:
        self._df = df

    def __len__(self) -> int:
        return self._df.height

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return self._df.iter_rows(named=True)


# the files a batch writes at the top of OUTDIR (besides reports/)
OUTPUT_FILES = ("summary.parquet", "summary.csv", "index.html")


def write_outputs(result: BatchResult, outdir: Path) -> None:
    from traceinsight.report.html import stream_index_html

    parquet, csv, index = (outdir / name for name in OUTPUT_FILES)
    df = result.summary
    with atomic_path(parquet) as tmp:
        df.write_parquet(tmp)
    with atomic_path(csv) as tmp:
        df.write_csv(tmp)
    with atomic_path(index) as tmp, open(tmp, "w", encoding="utf-8") as out:
        out.writelines(stream_index_html(_Rows(df), result.failed))
