"""rocpd: rocprofv3's SQLite output (its default since ROCm 7.0), read through its views.

Schema v3 writes every table with the file's GUID in its name (``rocpd_region_<guid>``) and an
unsuffixed view over each, plus joined views (``kernels``, ``memory_copies``, ``regions``); the
views are the stable surface, so only they are read. ``rocpd_metadata`` names the schema version:
a major version other than :data:`KNOWN_MAJOR` is refused rather than misread. The older
rocmProfileData ("RPD") format also names its tables ``rocpd_*`` (``rocpd_op``, ``rocpd_api``)
but is another schema: it is recognised and refused.

Facts of the writer (rocprofiler-sdk ``generateRocpd.cpp``) this reader rests on: an event's
``stack_id`` is the record's internal correlation id (the API call's and its dispatches' alike;
``correlation_id`` holds the external one, 0 unless the application pushed one), an API call
with zero duration is a sample rather than a region, and a roctx range's message is the
``message`` of its event's ``extdata``.
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl

from traceinsight.errors import InputError
from traceinsight.parsers.nsys.db import Db
from traceinsight.parsers.rocprof.capture import (
    API_COLUMNS,
    COPY_COLUMNS,
    KERNEL_COLUMNS,
    MARKER_COLUMNS,
    Agent,
    Capture,
    frame,
)

KNOWN_MAJOR = 3
# rocmProfileData's own tables: what tells RPD apart (it has a rocpd_metadata table too).
RPD_NAMES = {"rocpd_op", "rocpd_api"}
# rocprof v1/v2's database (--hip-trace, --hsa-trace: results.db): KERN beside HIP, OPS, COPY
LEGACY_OTHER_NAMES = frozenset({"HIP", "OPS", "COPY", "HSA"})
LEGACY_MESSAGE = (
    "rocprof v1/v2 output ({what}), which this tool does not read: record with rocprofv3 "
    "(--runtime-trace --output-format rocpd, or json) or torch.profiler"
)
# Region categories read as host API calls, and the one read as annotations (roctx ranges).
API_CATEGORIES = (
    "HIP_RUNTIME_API",
    "HIP_RUNTIME_API_EXT",
    "HIP_COMPILER_API",
    "HIP_COMPILER_API_EXT",
    "HSA_CORE_API",
    "HSA_AMD_EXT_API",
    "HSA_IMAGE_EXT_API",
    "HSA_FINALIZE_EXT_API",
    "RCCL_API",
)
MARKER_CATEGORY = "MARKER_CORE_RANGE_API"


def flavour(names: set[str]) -> str | None:
    """'rocpd' (rocprofv3), 'rpd' (rocmProfileData), 'rocprof1' (rocprof v1/v2's own
    database) or None, from a database's table names."""
    if names >= RPD_NAMES:
        return "rpd"
    if "KERN" in names and names & LEGACY_OTHER_NAMES:
        return "rocprof1"
    if "rocpd_metadata" in names and any(
        n.startswith("rocpd_") for n in names - {"rocpd_metadata"}
    ):
        return "rocpd"
    return None


def read_rocpd(path: Path) -> Capture:
    db = Db(path, lambda df, _offset: df)
    try:
        kind = flavour(db.tables)
        if kind == "rpd":
            raise InputError(
                "a rocmProfileData (RPD) database, not rocprofv3's rocpd: RPD is a different "
                "schema that this tool does not read (profile with rocprofv3 instead)",
                str(path),
            )
        if kind == "rocprof1":
            raise InputError(
                LEGACY_MESSAGE.format(
                    what="its database: tables "
                    + ", ".join(sorted(db.tables & (LEGACY_OTHER_NAMES | {"KERN"})))
                ),
                str(path),
            )
        if kind is None:
            raise InputError(
                "SQLite file is neither an Nsight Systems export nor a rocpd database", str(path)
            )
        meta = _metadata(db, path)
        version = meta.get("schema_version", "")
        major = version.split(".")[0]
        if not major.isdigit():
            raise InputError(
                f"rocpd database without a readable schema version (rocpd_metadata "
                f"schema_version={version!r})",
                str(path),
            )
        if int(major) != KNOWN_MAJOR:
            raise InputError(
                f"rocpd schema version {version} is not supported (this tool reads schema "
                f"{KNOWN_MAJOR})",
                str(path),
            )
        missing = sorted({"kernels", "memory_copies", "regions", "rocpd_info_agent"} - db.tables)
        if missing:
            raise InputError(
                f"rocpd schema {version} database lacks the views {', '.join(missing)}", str(path)
            )
        kernels = db.query(
            [
                "start",
                '"end"',
                "pid",
                "agent_type_index",
                "queue_id",
                "stack_id",
                "name",
                "grid_x",
                "grid_y",
                "grid_z",
                "workgroup_x",
                "workgroup_y",
                "workgroup_z",
                "lds_size",
                "COALESCE(vgpr_count, 0) + COALESCE(accum_vgpr_count, 0)",
            ],
            "kernels",
            dict(KERNEL_COLUMNS),
        )
        regions = db.query(
            ["start", '"end"', "pid", "tid", "stack_id", "name", "category", "extdata"],
            "regions",
            {**API_COLUMNS, "extdata": pl.String()},
        )
        copies = db.query(
            [
                "start",
                '"end"',
                "pid",
                "stack_id",
                "stream_id",
                "size",
                "name",
                "CASE WHEN src_agent_type = 'GPU' THEN src_agent_type_index END",
                "CASE WHEN dst_agent_type = 'GPU' THEN dst_agent_type_index END",
            ],
            "memory_copies",
            dict(COPY_COLUMNS),
        )
        gpus = _gpus(db)
        k, r, c = kernels.result(), regions.result(), copies.result()
    finally:
        db.close()
    markers, api, other = _split_regions(r)
    # the JSON's domain names, so both outputs say alike what the capture recorded
    cats = set(api.get_column("category").unique().to_list())
    domains = {"hip_api": "HIP_", "hsa_api": "HSA_", "rccl_api": "RCCL_"}
    traced = sorted(
        [
            *(["kernel_dispatch"] if k.height else []),
            *(d for d, prefix in domains.items() if any(c.startswith(prefix) for c in cats)),
            *(["marker_api"] if markers.height else []),
            *(["memory_copy"] if c.height else []),
        ]
    )
    cap = Capture(
        path=str(path),
        format="rocpd",
        format_version=f"rocpd schema {version}",
        kernels=frame(k, KERNEL_COLUMNS),
        api=frame(api, API_COLUMNS),
        copies=frame(c, COPY_COLUMNS),
        markers=frame(markers, MARKER_COLUMNS),
        gpus=gpus,
        traced=traced,
        extra={"clock": "monotonic ns", "rocpd_guid": meta.get("guid")},
    )
    if other:
        cap.warnings.append(
            "regions of categories this reader does not map were left out: " + ", ".join(other)
        )
    return cap


def _metadata(db: Db, path: Path) -> dict[str, str]:
    try:
        rows = db.con.execute("SELECT tag, value FROM rocpd_metadata").fetchall()
    except Exception as exc:  # noqa: BLE001 - any damage of the table is one clear line
        raise InputError(f"rocpd_metadata is unreadable ({exc})", str(path)) from None
    return {str(t): str(v) for t, v in rows}


def _gpus(db: Db) -> list[Agent]:
    rows = db.con.execute(
        "SELECT type_index, product_name, name, extdata FROM rocpd_info_agent WHERE type = 'GPU'"
    ).fetchall()
    out = []
    for index, product, name, extdata in rows:  # one row per agent of the node: a handful
        ext = _json_object(extdata)
        banks = ext.get("mem_banks")
        memory = (
            sum(int(b.get("size_in_bytes") or 0) for b in banks if isinstance(b, dict))
            if isinstance(banks, list)
            else 0
        )
        cus = ext.get("cu_count")
        out.append(
            Agent(
                key=int(index),
                index=int(index),
                name=product or name or None,
                cu_count=int(cus) if isinstance(cus, int) and cus > 0 else None,
                memory_bytes=memory or None,
                arch=name or None,
            )
        )
    return sorted(out, key=lambda a: a.index)


def _json_object(text: object) -> dict[str, object]:
    if not isinstance(text, str | bytes):
        return {}
    try:
        obj = json.loads(text)
    except ValueError:
        return {}
    return obj if isinstance(obj, dict) else {}


def _split_regions(r: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame, list[str]]:
    """roctx ranges (named by their message), the API calls, and the categories of the rest."""
    cat = pl.col("category")
    markers = r.filter(cat == MARKER_CATEGORY).with_columns(
        pl.coalesce(pl.col("extdata").str.json_path_match("$.message"), pl.col("name")).alias(
            "name"
        )
    )
    api = r.filter(cat.is_in(API_CATEGORIES))
    other = sorted(
        r.filter(~cat.is_in([*API_CATEGORIES, MARKER_CATEGORY]) | cat.is_null())
        .get_column("category")
        .fill_null("(none)")
        .unique()
        .to_list()
    )
    return markers, api, other
