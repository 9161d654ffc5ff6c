"""Renderers: terminal summary, JSON and the HTML diagnosis (one module per output)."""

from __future__ import annotations

from pathlib import Path

REPORT_SUFFIX = ".traceinsight.html"
_TRACE_SUFFIXES = (".gz", ".xz", ".json", ".sqlite", ".nsys-rep", ".db")


def report_name(trace: Path) -> str:
    """The HTML report's file name for a trace, one scheme for ``analyze`` (in the working
    directory), ``profile`` and ``capture(analyze=True)`` (beside the trace):
    ``NAME.pt.trace.json.gz`` and ``NAME.sqlite`` -> ``NAME.traceinsight.html``."""
    name = trace.name
    for suffix in _TRACE_SUFFIXES:
        name = name.removesuffix(suffix)
    return name.removesuffix(".pt.trace") + REPORT_SUFFIX
