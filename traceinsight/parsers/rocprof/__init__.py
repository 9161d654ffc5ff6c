"""AMD's rocprofv3 (rocprofiler-sdk): its JSON document and its rocpd SQLite database.

Both become the one event table: kernel dispatches (agent as device, HSA queue as stream, grid
and workgroup sizes into ``kernel_args``, names from the kernel symbols), HIP/HSA/RCCL API calls
(runtime/driver rows, correlated with their dispatches by rocprofiler's internal correlation
id), memory copies (direction, bytes), roctx ranges (annotations); one rank per process. What
rocprofv3 never records (PyTorch's CPU ops, their shapes and stacks) stays absent:
``meta.extra["rocprof_traced"]`` lists the domains the capture holds.
"""

from __future__ import annotations

from pathlib import Path

from traceinsight.model.schema import Trace
from traceinsight.parsers.rocprof.capture import to_trace
from traceinsight.parsers.rocprof.json_doc import looks_like_rocprof_json, read_json
from traceinsight.parsers.rocprof.rocpd import flavour, read_rocpd

__all__ = ["flavour", "looks_like_rocprof_json", "parse_rocpd", "parse_rocprof_json"]


def parse_rocprof_json(path: str | Path, max_bytes: int | None = None, threads: int = 1) -> Trace:
    return to_trace(read_json(Path(path), max_bytes), threads)


def parse_rocpd(path: str | Path, threads: int = 1) -> Trace:
    return to_trace(read_rocpd(Path(path)), threads)
