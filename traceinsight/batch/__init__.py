"""Batch mode: analyze every trace or job under some paths (directories, .tar/.tar.gz archives).

Writes, under OUTDIR: ``summary.parquet`` and ``summary.csv`` (one row per trace or job), one HTML
report and one JSON result per item in ``reports/``, and ``index.html`` linking them.
:mod:`.discover` finds the items, :mod:`.run` analyzes them (local pool or Dask),
:mod:`.outputs` writes the tables.
"""

from traceinsight.batch.discover import Item, discover
from traceinsight.batch.outputs import OUTPUT_FILES, SUMMARY_METRICS, SUMMARY_SCHEMA, BatchResult
from traceinsight.batch.run import analyze_item, run_batch

__all__ = [
    "OUTPUT_FILES",
    "SUMMARY_METRICS",
    "SUMMARY_SCHEMA",
    "BatchResult",
    "Item",
    "analyze_item",
    "discover",
    "run_batch",
]
