"""traceinsight: why the GPU starves, from PyTorch profiler and Nsight Systems traces.

Library first: ``traceinsight.analyze(path)`` returns a :class:`TraceAnalysis` (one trace) or a
:class:`JobAnalysis` (a directory of ranks, a multi-process Nsight export); the ``traceinsight``
command is a thin skin over it. The names below load on first use so ``--help`` stays fast.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from traceinsight.constants import VERSION as __version__

__all__ = [
    "Finding",
    "JobAnalysis",
    "Options",
    "Runtime",
    "TraceAnalysis",
    "__version__",
    "analyze",
]

if TYPE_CHECKING:
    from traceinsight.analysis import JobAnalysis, TraceAnalysis
    from traceinsight.api import analyze
    from traceinsight.findings import Finding
    from traceinsight.options import Options
    from traceinsight.runtime import Runtime

_LAZY = {
    "analyze": "traceinsight.api",
    "Options": "traceinsight.options",
    "TraceAnalysis": "traceinsight.analysis",
    "JobAnalysis": "traceinsight.analysis",
    "Finding": "traceinsight.findings",
    "Runtime": "traceinsight.runtime",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'traceinsight' has no attribute {name!r}")
