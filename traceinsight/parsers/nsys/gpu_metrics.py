"""``GPU_METRICS`` (``nsys profile --gpu-metrics-devices``) into the ``gpu_metrics`` side table.

Layout (nsys 2021.4 on): ``GPU_METRICS(timestamp, typeId, metricId, value)``, one row per sample
and counter; ``TARGET_INFO_GPU_METRICS(typeId, sourceId, typeName, metricId, metricName)``, the
counters of each metric set. The GPU is the low byte of ``typeId`` (as nsys's own recipes read
it), taken to be the CUDA device id the kernels carry. Counter names differ across versions and
chips ("SM Active" / "SMs Active", "Tensor Active" / "Tensor Active / FP16 Active", "DRAM Read
Bandwidth"), so they are matched by lower-cased substring. Only percentages are kept (as 0..1):
the counts (warps in flight, ...) would need the chip's limits to mean anything.
"""

from __future__ import annotations

import polars as pl

from traceinsight.model.schema import GPU_METRICS_SCHEMA, conform_side, empty_gpu_metrics
from traceinsight.parsers.nsys.db import Db, Rows
from traceinsight.parsers.nsys.tables import pick

GPU_ID_MASK = 0xFF  # typeId's low byte: the GPU
KNOWN = ("sm_active", "tensor_active", "dram_read", "dram_write", "dram_bandwidth")


def metric_name(raw: pl.Expr) -> pl.Expr:
    """The normalized name of a counter: sm_active, tensor_active, dram_read, dram_write,
    dram_bandwidth (a combined DRAM counter), else the export's name lower-cased."""
    low = raw.str.to_lowercase()
    return (
        pl.when(low.str.contains(r"\bsms? active"))
        .then(pl.lit("sm_active"))
        .when(low.str.contains("tensor"))
        .then(pl.lit("tensor_active"))
        .when(low.str.contains("dram read"))
        .then(pl.lit("dram_read"))
        .when(low.str.contains("dram write"))
        .then(pl.lit("dram_write"))
        .when(low.str.contains("dram"))
        .then(pl.lit("dram_bandwidth"))
        .otherwise(low)
    )


def gpu_metric_names(db: Db) -> pl.DataFrame | None:
    """The percentage counters: (type_id, metric_id) -> metric. Metric ids are numbered per
    metric set (typeId), so two GPUs of different chips may share an id for other counters; an
    export without ``typeId`` here names each id once."""
    if not {"GPU_METRICS", "TARGET_INFO_GPU_METRICS"} <= db.tables:
        return None
    cols = db.columns("TARGET_INFO_GPU_METRICS")
    if not {"metricId", "metricName"} <= cols:
        return None
    type_id = "typeId" if "typeId" in cols else "NULL"
    rows = db.con.execute(
        f"SELECT DISTINCT {type_id}, metricId, metricName FROM TARGET_INFO_GPU_METRICS"
    ).fetchall()
    schema = {"type_id": pl.Int64, "metric_id": pl.Int64, "raw": pl.String}
    names = pl.DataFrame(rows, schema=schema, orient="row")
    names = names.unique(["type_id", "metric_id"], keep="first", maintain_order=True)
    names = names.with_columns(metric_name(pl.col("raw")).alias("metric"))
    known = pl.col("metric").is_in(KNOWN)
    return names.filter(known | pl.col("raw").str.contains("%", literal=True)).select(
        "type_id", "metric_id", "metric"
    )


def gpu_metric_rows(db: Db) -> tuple[Rows, pl.DataFrame] | None:
    """The samples of the percentage counters, fetched on the pool (None: the export has none)."""
    names = gpu_metric_names(db)
    if names is None or names.height == 0:
        return None
    cols = db.columns("GPU_METRICS")
    # the time is ``start`` and typeId is missing in some exports (then: one GPU, 0)
    when = next((c for c in ("timestamp", "start") if c in cols), None)
    if when is None or not {"metricId", "value"} <= cols:
        return None
    if "typeId" not in cols:  # the samples name no metric set: the names by id alone
        names = names.with_columns(pl.lit(None, pl.Int64).alias("type_id")).unique(
            "metric_id", keep="first", maintain_order=True
        )
    ids = ", ".join(str(i) for i in names.get_column("metric_id").unique().sort().to_list())
    rows = db.query(
        [when, pick(cols, "typeId", "0"), "metricId", "value"],
        "GPU_METRICS",
        {"start_ns": pl.Int64, "type_id": pl.Int64, "metric_id": pl.Int64, "value": pl.Float64},
        where=f"metricId IN ({ids})",
    )
    return rows, names


def gpu_metrics_table(
    pending: tuple[Rows, pl.DataFrame] | None, offset_ns: int, events: pl.DataFrame
) -> pl.DataFrame:
    """Samples on the events' clock (``offset_ns`` added), percent -> 0..1, each GPU's samples
    given the rank whose kernels ran on it (rank 0 where none did)."""
    if pending is None:
        return empty_gpu_metrics()
    rows, names = pending
    keys = (
        ["metric_id"] if names.get_column("type_id").is_null().all() else ["type_id", "metric_id"]
    )
    df = rows.result()
    if df.height == 0:
        return empty_gpu_metrics()
    owner = (
        events.lazy()
        .filter(pl.col("kind") == "kernel")
        .group_by("device")
        .agg(pl.col("rank").min())
        .collect()
        .with_columns(pl.col("device").cast(pl.Int32))
    )
    out = (
        df.join(names, on=keys, how="inner")
        .with_columns(
            (pl.col("type_id") & GPU_ID_MASK).cast(pl.Int32).alias("device"),
            pl.col("start_ns") + offset_ns,
            (pl.col("value") / 100.0).alias("value_ratio"),
        )
        .join(owner, on="device", how="left")
        .with_columns(pl.col("rank").fill_null(0))
    )
    return conform_side(out, GPU_METRICS_SCHEMA)
