"""The export's tables as event rows: GPU activity, API calls, overhead, and the session facts."""

from __future__ import annotations

import polars as pl

from traceinsight.model.classify import classify_names
from traceinsight.model.schema import (
    EVENT_SCHEMA,
    KERNEL_ARGS_SCHEMA,
    OS_CALL_MIN_NS,
    DeviceInfo,
    conform_side,
    empty_kernel_args,
)
from traceinsight.parsers.nsys.db import Db, Rows

# ENUM_CUDA_MEMCPY_OPER / ENUM_CUDA_MEM_KIND values (stable since 2021; the ENUM tables are
# missing before 2022.4, so the values are fixed here). 11-13 ("Unified HtoD/DtoH/DtoD") are
# unified-memory page migrations the driver made on a fault or prefetch, not copies a call
# launched: copy kind "unified", managed memory on both ends (their srcKind/dstKind say 7).
COPY_KIND = {
    1: "HtoD",
    2: "DtoH",
    8: "DtoD",
    9: "HtoH",
    10: "PtoP",
    11: "unified",
    12: "unified",
    13: "unified",
}
UNIFIED_COPY_KINDS = (11, 12, 13)
COPY_LABEL = {
    0: "Unknown",
    1: "HtoD",
    2: "DtoH",
    3: "HtoA",
    4: "AtoH",
    5: "AtoA",
    6: "AtoD",
    7: "DtoA",
    8: "DtoD",
    9: "HtoH",
    10: "PtoP",
    11: "Unified HtoD",
    12: "Unified DtoH",
    13: "Unified DtoD",
}
MEM_KIND = {
    0: "pageable",
    1: "pinned",
    2: "device",
    3: "array",
    4: "managed",
    5: "device",
    6: "managed",
    7: "unknown",
}
MEM_LABEL = {
    0: "Pageable",
    1: "Pinned",
    2: "Device",
    3: "Array",
    4: "Managed",
    5: "Device Static",
    6: "Managed Static",
    7: "Unknown",
}


def event_rows(df: pl.DataFrame, offset_ns: int) -> pl.DataFrame:
    """What every table's rows need, done per fetched part on the fetch threads (in parallel,
    and on parts small enough to reuse memory, where the whole 15M-row table after the concat
    spent seconds faulting in fresh pages): times moved by ``offset_ns``, ``dur_ns``, negative
    durations dropped, pid/tid of host rows from their thread id and of GPU rows from their
    process id, the event schema's types. NVTX domain-creation rows (no end, a negative
    ``domain_create``) are kept for :func:`~.nvtx.nccl_domain`."""
    if offset_ns:  # 0 where the page reader added it (a column less to make per part)
        df = df.with_columns(pl.col("start_ns") + offset_ns, pl.col("end_ns") + offset_ns)
    # globalTid / globalPid pack (hardware id, pid, tid) as 24-bit fields. Host rows carry the
    # thread id, unpacked here rather than by SQL expressions (those cost SQLite a third of its
    # time on the NVTX and runtime scans); GPU rows carry the process id.
    if "gtid" in df.columns:
        gtid = pl.col("gtid")
        df = df.with_columns(
            packed_pid(gtid).alias("pid"),
            (gtid & 0xFFFFFF).alias("tid"),
            (gtid // (1 << 24) * (1 << 24)).alias("gpid"),
        ).drop("gtid")
    else:
        df = df.with_columns(packed_pid(pl.col("gpid")).alias("pid"))
    keep = (pl.col("end_ns") - pl.col("start_ns")) >= 0
    if "domain_create" in df.columns:  # NVTX: DomainCreate rows (no end) name the domains
        keep = keep | pl.col("domain_create")
    df = keep_rows(df, keep).with_columns((pl.col("end_ns") - pl.col("start_ns")).alias("dur_ns"))
    return df.cast({c: t for c, t in EVENT_SCHEMA.items() if c in df.columns})  # type: ignore[arg-type]


def keep_rows(df: pl.DataFrame, keep: pl.Expr) -> pl.DataFrame:
    """``df.filter(keep)``, without the copy of every column when every row is kept (the
    usual case: a filter of millions of rows copies them all)."""
    mask = df.select(keep.fill_null(False)).to_series()
    return df if mask.all() else df.filter(mask)


def packed_pid(packed: pl.Expr) -> pl.Expr:
    return (packed // (1 << 24)) & 0xFFFFFF  # floor division: SQLite's arithmetic >> 24


def named(df: pl.DataFrame, strings: pl.DataFrame, id_col: str = "name_id") -> pl.DataFrame:
    """Resolve a StringIds id column into ``name`` in polars rather than with a correlated
    subquery per row in SQL: where the ids are the rows' positions (nsys numbers its strings
    0..n-1), a gather by id; else a hash join (a third of the time on 3.4M runtime calls)."""
    sid = strings.get_column("sid")
    n = strings.height
    if n and sid.null_count() == 0 and sid.is_sorted() and sid[0] == 0 and sid[-1] == n - 1:
        ids = df.get_column(id_col)
        at = ids.to_frame().select(pl.when(pl.col(id_col).is_between(0, n - 1)).then(id_col))
        name = strings.get_column("svalue").gather(at.to_series()).alias("name")
        return df.with_columns(name).drop(id_col)
    named = df.join(strings, left_on=id_col, right_on="sid", how="left", maintain_order="left")
    return named.rename({"svalue": "name"}).drop(id_col)


def metadata(db: Db) -> dict[str, str]:
    for name in ("META_DATA_EXPORT", "EXPORT_META_DATA"):
        if name in db.tables:
            return {
                str(k): str(v)
                for k, v in db.con.execute(f"SELECT name, value FROM {name}").fetchall()
            }
    return {}


def pick(cols: set[str], name: str, default: str = "NULL") -> str:
    """The column if this export has it, else an SQL default: tables gain columns over versions."""
    return name if name in cols else default


# CUPTI_ACTIVITY_KIND_KERNEL's launch configuration -> the kernel_args side table's columns
LAUNCH_CONFIG = {
    "gridX": "grid_x",
    "gridY": "grid_y",
    "gridZ": "grid_z",
    "blockX": "block_x",
    "blockY": "block_y",
    "blockZ": "block_z",
    "registersPerThread": "registers_per_thread",
    # per block, static + dynamic: summed by SQLite (one column less through the driver)
    "staticSharedMemory + dynamicSharedMemory": "shared_memory_bytes",
}


def _config_column(cols: set[str], expr: str) -> str:
    """A launch-configuration expression where this export has its columns, else NULL."""
    return expr if all(c.strip() in cols for c in expr.split("+")) else "NULL"


def kernel_args(
    gpu: list[pl.DataFrame], rank: pl.Expr
) -> tuple[list[pl.DataFrame], pl.DataFrame | None]:
    """The kernels' launch configuration split off the kernel frame (so the event table's
    concatenation never carries it): the frames without it, and its rows (None without a
    kernel frame), for :func:`launch_config` (occupancy is estimated by the efficiency
    analyzer)."""
    out, rows = [], None
    for f in gpu:
        if "grid_x" not in f.columns:
            out.append(f)
            continue
        rows = f.select(
            "start_ns",
            pl.col("device").cast(pl.Int32),
            "correlation",
            *LAUNCH_CONFIG.values(),
            rank.alias("rank"),
        )
        out.append(f.drop(*LAUNCH_CONFIG.values()))
    return out, rows


def launch_config(rows: pl.DataFrame | None) -> pl.DataFrame:
    """The kernel_args side table of :func:`kernel_args`' rows (sorted by start)."""
    return empty_kernel_args() if rows is None else conform_side(rows, KERNEL_ARGS_SCHEMA)


def gpu_base(cols: set[str]) -> list[str]:
    """The leading columns every GPU activity table shares (base_schema's order)."""
    return ["start", "end", "deviceId", "streamId", "correlationId", pick(cols, "globalPid")]


def gpu_rows(db: Db, strings: pl.DataFrame) -> list[Rows]:
    out = []
    base_schema = {
        "start_ns": pl.Int64,
        "end_ns": pl.Int64,
        "device": pl.Int64,
        "stream": pl.Int64,
        "correlation": pl.Int64,
        "gpid": pl.Int64,
    }
    kt = db.table("CUPTI_ACTIVITY_KIND_KERNEL")
    if kt:
        cols = db.columns(kt)
        name_col = pick(cols, "demangledName", pick(cols, "shortName"))
        out.append(
            db.query(
                [*gpu_base(cols), name_col, *(_config_column(cols, c) for c in LAUNCH_CONFIG)],
                kt,
                {
                    **base_schema,
                    "name_id": pl.Int64,
                    **dict.fromkeys(LAUNCH_CONFIG.values(), pl.Int64),
                },
                to_events=lambda df: named(kernel_classes(df, strings), strings).with_columns(
                    pl.lit("kernel").alias("kind")
                ),
            )
        )
    mt = db.table("CUPTI_ACTIVITY_KIND_MEMCPY")
    if mt:
        cols = db.columns(mt)
        out.append(
            db.query(
                [
                    *gpu_base(cols),
                    "bytes",
                    "copyKind",
                    pick(cols, "srcKind", "7"),
                    pick(cols, "dstKind", "7"),
                ],
                mt,
                {**base_schema, "bytes": pl.Int64, "ck": pl.Int64, "sk": pl.Int64, "dk": pl.Int64},
                to_events=memcpy_rows,
            )
        )
    st = db.table("CUPTI_ACTIVITY_KIND_MEMSET")
    if st:
        cols = db.columns(st)
        out.append(
            db.query(
                [*gpu_base(cols), "bytes", pick(cols, "memKind", "2")],
                st,
                {**base_schema, "bytes": pl.Int64, "mk": pl.Int64},
                to_events=lambda df: df.with_columns(
                    pl.lit("memset").alias("kind"),
                    pl.format(
                        "Memset ({})",
                        pl.col("mk").replace_strict(
                            MEM_LABEL, default="Unknown", return_dtype=pl.String
                        ),
                    ).alias("name"),
                ).drop("mk"),
            )
        )
    yt = db.table("CUPTI_ACTIVITY_KIND_SYNCHRONIZATION")
    if yt:
        cols = db.columns(yt)
        names = {1: "Event Sync", 2: "Stream Wait Event", 3: "Stream Sync", 4: "Context Sync"}
        out.append(
            db.query(
                [*gpu_base(cols), "syncType"],
                yt,
                {**base_schema, "sync_type": pl.Int64},
                to_events=lambda df: df.with_columns(
                    pl.lit("gpu_sync").alias("kind"),
                    pl.col("sync_type")
                    .replace_strict(names, default="Sync", return_dtype=pl.String)
                    .alias("name"),
                ).drop("sync_type"),
            )
        )
    return out


def kernel_classes(df: pl.DataFrame, strings: pl.DataFrame) -> pl.DataFrame:
    """Classify each distinct kernel name id once and join back on the integer id: hashing
    millions of long demangled names is the slow part otherwise."""
    ids = df.select(pl.col("name_id").unique()).join(
        strings, left_on="name_id", right_on="sid", how="left"
    )
    ids = ids.with_columns(
        classify_names(ids["svalue"].fill_null("")).alias("kernel_class")
    ).select("name_id", "kernel_class")
    return df.join(ids, on="name_id", how="left", maintain_order="left")


def memcpy_rows(df: pl.DataFrame) -> pl.DataFrame:
    return df.with_columns(
        pl.lit("memcpy").alias("kind"),
        pl.col("ck")
        .replace_strict(COPY_KIND, default="other", return_dtype=pl.String)
        .alias("copy_kind"),
        pl.when(pl.col("ck").is_in(UNIFIED_COPY_KINDS))
        .then(pl.lit("managed"))
        .otherwise(pl.col("sk").replace_strict(MEM_KIND, default="unknown", return_dtype=pl.String))
        .alias("src_kind"),
        pl.when(pl.col("ck").is_in(UNIFIED_COPY_KINDS))
        .then(pl.lit("managed"))
        .otherwise(pl.col("dk").replace_strict(MEM_KIND, default="unknown", return_dtype=pl.String))
        .alias("dst_kind"),
        pl.format(
            "Memcpy {} ({} -> {})",
            pl.col("ck").replace_strict(COPY_LABEL, default="Unknown", return_dtype=pl.String),
            pl.col("sk").replace_strict(MEM_LABEL, default="Unknown", return_dtype=pl.String),
            pl.col("dk").replace_strict(MEM_LABEL, default="Unknown", return_dtype=pl.String),
        ).alias("name"),
    ).drop("ck", "sk", "dk")


HOST_SCHEMA = {"start_ns": pl.Int64, "end_ns": pl.Int64, "gtid": pl.Int64}
HOST_COLS = ["start", "end", "globalTid"]


def host_rows(db: Db, strings: pl.DataFrame) -> list[Rows]:
    """The runtime/driver API calls and the profiler's overhead rows."""
    out = []
    rt = db.table("CUPTI_ACTIVITY_KIND_RUNTIME")
    if rt:
        cols = db.columns(rt)
        api_names = strings.with_columns(
            pl.col("svalue").str.replace(r"_v\d+$", "")
        )  # cudaLaunchKernel_v7000
        out.append(
            db.query(
                [*HOST_COLS, "correlationId", pick(cols, "eventClass", "0"), "nameId"],
                rt,
                {
                    **HOST_SCHEMA,
                    "correlation": pl.Int64,
                    "event_class": pl.Int64,
                    "name_id": pl.Int64,
                },
                to_events=lambda df: (
                    named(_without_echoes(df), api_names)
                    .with_columns(
                        pl.when(pl.col("event_class") == 1)
                        .then(pl.lit("driver"))
                        .otherwise(pl.lit("runtime"))
                        .alias("kind"),
                    )
                    .drop("event_class")
                ),
            )
        )
    osrt = db.table("OSRT_API")
    if osrt and {"start", "end", "globalTid", "nameId"} <= db.columns(osrt):
        # only the calls long enough to hold a thread while the GPU waits (Mordred's main
        # thread: getc 4.65 s for keyboard input, read 1.24 s of file loading, read as "host
        # code between CUDA calls"); the short ones are most of the table
        out.append(
            db.query(
                [*HOST_COLS, "nameId"],
                osrt,
                {**HOST_SCHEMA, "name_id": pl.Int64},
                where=f"end - start >= {OS_CALL_MIN_NS}",
                to_events=lambda df: named(df, strings).with_columns(
                    pl.lit("os_call").alias("kind")
                ),
            )
        )
    for table in ("CUPTI_ACTIVITY_KIND_OVERHEAD", "PROFILER_OVERHEAD"):
        ot = db.table(table)
        if ot and {"start", "end", "globalTid"} <= db.columns(ot):
            typed = "overheadType" in db.columns(ot)
            out.append(
                db.query(
                    [*HOST_COLS, "overheadType"] if typed else HOST_COLS,
                    ot,
                    {**HOST_SCHEMA, "overhead_type": pl.Int64} if typed else HOST_SCHEMA,
                    to_events=_overhead_rows,
                )
            )
    return out


# CUPTI's overhead rows by ENUM_CUPTI_OVERHEAD_TYPE: the CUDA driver's own work (loading a
# module or function on first use, JIT compiling, a full command buffer) is paid with or
# without a profiler, so it keeps its name (model/classify.py CUDA_OWN_OVERHEAD) and is not the
# profiler's (audit 24: nsys-ai's mock export, 14.36 ms of lazy module loading read as
# "profiler" idle); the rest is the profiler's
OVERHEAD_TYPE_NAMES = {
    2: "Driver JIT compiler (CUDA)",
    6: "Runtime module loading (CUDA)",
    7: "Lazy function loading (CUDA)",
    8: "Command buffer full (CUDA)",
}


def _overhead_rows(df: pl.DataFrame) -> pl.DataFrame:
    name = pl.lit("profiler overhead")
    if "overhead_type" in df.columns:
        name = (
            pl.col("overhead_type")
            .replace_strict(OVERHEAD_TYPE_NAMES, default=None, return_dtype=pl.String)
            .fill_null("profiler overhead")
        )
    return df.with_columns(pl.lit("overhead").alias("kind"), name.alias("name")).drop(
        "overhead_type", strict=False
    )


def _without_echoes(df: pl.DataFrame) -> pl.DataFrame:
    """One row per API call: exports of about 2021-2022 record each call twice,
    ``cudaMalloc_v3020`` (event class 0) and a plain ``cudaMalloc`` of another class (67) with
    the same correlation id, starting ns apart (audit 13: an extrap export read "runtime 36"
    for 18 calls, and its slow first launch twice as a one-time call). The plain row stays:
    the call's backtrace (CUDA_CALLCHAINS) is keyed to it. Per fetched part: the pair's rows
    are neighbours."""
    other = ~pl.col("event_class").is_in((0, 1))
    if not df.select(other.any()).item():
        return df
    echoed = df.filter(other).get_column("correlation").implode()
    return df.filter(other | ~pl.col("correlation").is_in(echoed))


def session_start(db: Db) -> int | None:
    t = db.table("TARGET_INFO_SESSION_START_TIME")
    if not t or "utcEpochNs" not in db.columns(t):
        return None
    row = db.con.execute(f"SELECT utcEpochNs FROM {t} LIMIT 1").fetchone()
    return int(row[0]) if row and isinstance(row[0], int) and 0 < row[0] < 4 * 10**18 else None


def devices(db: Db) -> list[DeviceInfo]:
    t = db.table("TARGET_INFO_GPU")
    if t:
        cols = db.columns(t)
        idc = "id" if "id" in cols else "deviceId" if "deviceId" in cols else None
        if idc:
            sm = pick(cols, "smCount")
            mem = pick(cols, "totalMemory")
            cc = (
                "computeMajor || '.' || computeMinor"
                if {"computeMajor", "computeMinor"} <= cols
                else "NULL"
            )
            rows = db.con.execute(f"SELECT {idc}, name, {sm}, {mem}, {cc} FROM {t}").fetchall()
            if rows:
                return [
                    DeviceInfo(int(r[0]), r[1], r[2], r[3], r[4]) for r in rows if r[0] is not None
                ]
    t = db.table("TARGET_INFO_CUDA_GPU")  # 2021 exports
    if t and {"deviceId", "name"} <= db.columns(t):
        rows = db.con.execute(f"SELECT DISTINCT deviceId, name FROM {t}").fetchall()
        return [DeviceInfo(int(r[0]), r[1]) for r in rows if r[0] is not None]
    return []
