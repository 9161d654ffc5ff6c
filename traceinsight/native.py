"""The C extensions, where the install built them (hatch_build.py; traceinsight/_native/).

Each is a fast path with a polars, msgspec or ADBC reference that gives the same result:
``kscan`` decodes Kineto event spans (parsers/kineto/decode.py), ``kreplay`` runs the step
model's replay loop (causal/graph.py), ``ksqlite`` reads the rows of Nsight Systems exports
through SQLite and ``kbtree`` straight from their tables' B-tree pages (parsers/nsys/db.py). A
pure-Python install (no C compiler) has none of them, and ``TRACEINSIGHT_NO_NATIVE=1`` turns
them all off to compare.
"""

from __future__ import annotations

import os
from types import ModuleType

import polars as pl

kscan: ModuleType | None
kreplay: ModuleType | None
ksqlite: ModuleType | None
kbtree: ModuleType | None
try:
    from traceinsight import _kscan as kscan
except ImportError:
    kscan = None
try:
    from traceinsight import _kreplay as kreplay
except ImportError:
    kreplay = None
try:
    from traceinsight import _ksqlite as ksqlite
except ImportError:  # not built, or the system's SQLite library is missing
    ksqlite = None
try:
    from traceinsight import _kbtree as kbtree
except ImportError:
    kbtree = None
if os.environ.get("TRACEINSIGHT_NO_NATIVE") == "1":
    kscan = kreplay = ksqlite = kbtree = None


class ArrowTable:
    """An Arrow array a native module made (a pair of PyCapsules): a struct array, a table
    (``pl.DataFrame(ArrowTable(...))``), or one column (``pl.Series(ArrowTable(...))``); polars
    reads it through the Arrow PyCapsule interface without a copy."""

    __slots__ = ("capsules",)

    def __init__(self, capsules: tuple[object, object]) -> None:
        self.capsules = capsules

    def __arrow_c_array__(self, requested_schema: object | None = None) -> tuple[object, object]:
        return self.capsules


def int64_streams(*columns: pl.Series) -> tuple[object, ...]:
    """Columns as int64 Arrow streams (PyCapsules), what the C loops read (a single chunk
    without a copy)."""
    return tuple(c.cast(pl.Int64).__arrow_c_stream__() for c in columns)
