"""Records as JSON: result dataclasses, tuples and dicts as plain JSON values (the documented
result). A dataclass field with ``metadata={"json": False}`` stays out (tables kept for later
stages); one with :data:`OMIT_NONE` is left out where it is None (optional parts of a record).
"""

from __future__ import annotations

import dataclasses
from types import MappingProxyType
from typing import Any

OMIT_NONE = MappingProxyType({"omit_none": True})


def jsonable(obj: Any) -> Any:
    """``obj`` as plain JSON values (NaN as null)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        out = {}
        for f in dataclasses.fields(obj):
            if not f.metadata.get("json", True):
                continue
            value = getattr(obj, f.name)
            if value is None and f.metadata.get("omit_none"):
                continue
            out[f.name] = jsonable(value)
        return out
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, float) and obj != obj:  # NaN never reaches the JSON
        return None
    return obj
