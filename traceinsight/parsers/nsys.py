"""Nsight Systems SQLite exports (``nsys export --type sqlite``), nsys 2021 through 2026.2.

The file is opened read-only (SQLite URI ``mode=ro``) and nothing is written to it: no temp tables,
no indexes. Tables are created lazily by nsys, so every table and column is probed first; SQL
does the string joins and only the needed columns are pulled. Schema notes: ../shared/NSYS_SCHEMA.md.
"""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
import tempfile
import urllib.parse
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import polars as pl

from traceinsight.errors import InputError
from traceinsight.model.classify import add_kernel_class, classify_names, mark_comm_by_launcher
from traceinsight.model.schema import (
    EVENT_SCHEMA,
    DeviceInfo,
    Trace,
    TraceMeta,
    conform,
    empty_events,
)

# ENUM_CUDA_MEMCPY_OPER / ENUM_CUDA_MEM_KIND values (stable since 2021; the ENUM tables are
# missing before 2022.4, so the values are fixed here).
COPY_KIND = {1: "HtoD", 2: "DtoH", 8: "DtoD", 9: "HtoH", 10: "PtoP", 11: "HtoD", 12: "DtoH", 13: "DtoD"}
COPY_LABEL = {0: "Unknown", 1: "HtoD", 2: "DtoH", 3: "HtoA", 4: "AtoH", 5: "AtoA", 6: "AtoD", 7: "DtoA", 8: "DtoD",
              9: "HtoH", 10: "PtoP", 11: "Unified HtoD", 12: "Unified DtoH", 13: "Unified DtoD"}
MEM_KIND = {0: "pageable", 1: "pinned", 2: "device", 3: "array", 4: "managed", 5: "device", 6: "managed", 7: "unknown"}
MEM_LABEL = {0: "Pageable", 1: "Pinned", 2: "Device", 3: "Array", 4: "Managed", 5: "Device Static", 6: "Managed Static", 7: "Unknown"}
FETCH_ROWS = 200_000
FETCH_THREADS = 2  # SQLite steps rows without the GIL: two scans at once on two cores
ROWS_PER_PART = 1_000_000  # big tables are fetched as rowid ranges of about this many rows
NVTX_RANGE_TYPES = (59, 60)  # PushPopRange, StartEndRange
NVTX_DOMAIN_CREATE = 75
REGISTERED = "\x01"  # marks an NVTX name fetched as a StringIds id (see _host_rows)
# NVTX DomainCreate rows: fetched with -1 - their domain id in ``domain`` (see _host_rows)
IS_DOMAIN_CREATE = (pl.col("domain") < 0).fill_null(False)


class _Rows:
    """A fetch split into parts, in rowid order."""

    def __init__(self, parts: list[Future[pl.DataFrame]]) -> None:
        self.parts = parts

    def result(self) -> pl.DataFrame:
        frames = [f.result() for f in self.parts]
        return frames[0] if len(frames) == 1 else pl.concat(frames)


class _Db:
    """Probing and small queries through sqlite3; the big row fetches through ADBC's SQLite
    driver when it is installed (Arrow columns straight into polars, ~1 us/row against ~5 us/row
    for Python tuples), two at a time on separate read-only connections."""

    def __init__(self, path: Path) -> None:
        self.uri = "file:" + urllib.parse.quote(str(path.resolve())) + "?mode=ro"
        try:
            self.con = sqlite3.connect(self.uri, uri=True)
            self.con.execute("PRAGMA query_only = ON")
            rows = self.con.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')").fetchall()
        except sqlite3.OperationalError as exc:
            msg = str(exc)
            if "locked" in msg:
                raise InputError("SQLite database is locked (still being written by nsys?)", str(path)) from None
            raise InputError(f"cannot read SQLite database: {msg}", str(path)) from None
        except sqlite3.DatabaseError as exc:
            raise InputError(f"corrupt or not a SQLite database: {exc}", str(path)) from None
        self.tables = {r[0] for r in rows}
        self.path = path
        self.offset_ns = 0  # added to every event time (the session start, once known)
        self.pool = ThreadPoolExecutor(max_workers=FETCH_THREADS)

    def table(self, prefix: str) -> str | None:
        """The table named ``prefix`` or a versioned variant (``PREFIX_V2``)."""
        if prefix in self.tables:
            return prefix
        variants = sorted(t for t in self.tables if t.startswith(prefix + "_V"))
        return variants[-1] if variants else None

    def columns(self, table: str) -> set[str]:
        return {r[1] for r in self.con.execute(f'PRAGMA table_info("{table}")').fetchall()}

    def query(
        self,
        cols: list[str],
        table: str,
        schema: dict[str, pl.DataType],
        where: str = "",
        to_events: Callable[[pl.DataFrame], pl.DataFrame] | None = None,
    ) -> _Rows:
        """``SELECT cols FROM table [WHERE where]`` as a frame with ``schema`` (one name and type
        per column, each column aliased to its name), fetched on the pool and, with ``to_events``,
        turned into event rows there (see :func:`_event_rows`). A large table is read as several
        rowid ranges so both threads stay busy until the end (polars releases the GIL, so the
        conversion of one part runs beside the fetch of the next)."""
        exprs = ", ".join(f'{c} AS "{n}"' for c, n in zip(cols, schema, strict=True))
        sql = f"SELECT {exprs} FROM {table}"
        ranges = self._rowid_ranges(table)
        if not ranges:
            sqls = [sql + (f" WHERE {where}" if where else "")]
        else:
            cond = f"({where}) AND " if where else ""
            sqls = [f"{sql} WHERE {cond}rowid BETWEEN {lo} AND {hi}" for lo, hi in ranges]
        return _Rows([self.pool.submit(self._fetch, q, schema, to_events) for q in sqls])

    def _rowid_ranges(self, table: str) -> list[tuple[int, int]]:
        try:  # one B-tree descent each; asked together, SQLite would scan the table
            (lo,) = self.con.execute(f"SELECT MIN(rowid) FROM {table}").fetchone()
            (hi,) = self.con.execute(f"SELECT MAX(rowid) FROM {table}").fetchone()
        except sqlite3.DatabaseError:
            return []  # a view or a table without rowid: one query
        if lo is None or hi - lo < ROWS_PER_PART:
            return []
        parts = -(-(hi - lo + 1) // ROWS_PER_PART)
        step = -(-(hi - lo + 1) // parts)
        return [(a, min(hi, a + step - 1)) for a in range(lo, hi + 1, step)]

    def _fetch(
        self, sql: str, schema: dict[str, pl.DataType], to_events: Callable[[pl.DataFrame], pl.DataFrame] | None = None
    ) -> pl.DataFrame:
        df = _fetch_adbc(self.uri, sql)
        if df is None:
            df = self._fetch_sqlite3(sql, schema)
        blobs = [c for c, t in df.schema.items() if t == pl.Binary != schema.get(c)]
        if blobs:
            df = df.with_columns(_unblob(df.get_column(c), schema[c]) for c in blobs)
        df = df.cast(schema, strict=False)  # type: ignore[arg-type]
        # Arrow's batches stay as they are: conform copies each column into one chunk once, on
        # its way into the table (re-chunking every part here as well cost 0.4 s on a 1 GB export).
        return _event_rows(to_events(df), self.offset_ns) if to_events is not None else df

    def _fetch_sqlite3(self, sql: str, schema: dict[str, pl.DataType]) -> pl.DataFrame:
        """Rows in batches straight into polars frames: Python tuples never outlive one batch."""
        frames = []
        uri_con = sqlite3.connect(self.uri, uri=True)
        try:
            uri_con.execute("PRAGMA query_only = ON")
            cur = uri_con.execute(sql)
            while rows := cur.fetchmany(FETCH_ROWS):
                frames.append(_rows_frame(rows, schema))
        except sqlite3.DatabaseError as exc:
            raise InputError(f"export is damaged or unreadable ({exc})", str(self.path)) from None
        finally:
            uri_con.close()
        return pl.concat(frames) if frames else pl.DataFrame(schema=schema)

    def close(self) -> None:
        self.pool.shutdown(wait=True)
        self.con.close()


def _unblob(s: pl.Series, dtype: pl.DataType) -> pl.Series:
    """A BLOB anywhere in a column makes ADBC return all of it as bytes, integers as their
    ASCII digits; polars casts no bytes to numbers, nor invalid UTF-8 to text. Integers are
    read back from the digits' hex codes (0x30-0x39, a leading 0x2d minus), text columns as
    UTF-8 where all of it is; anything else becomes null."""
    if not dtype.is_integer():
        try:
            return s.cast(pl.String)
        except pl.exceptions.ComputeError:
            return pl.Series(s.name, [None] * s.len(), dtype=pl.String)
    hexed = pl.col(s.name).bin.encode("hex")
    digits = hexed.str.replace(r"^2d", "-").str.replace_all(r"3([0-9])", "$1")
    is_int = hexed.str.contains(r"^(2d)?(3[0-9])+$")
    return s.to_frame().select(pl.when(is_int).then(digits)).to_series()


def _rows_frame(rows: list[tuple[Any, ...]], schema: dict[str, pl.DataType]) -> pl.DataFrame:
    try:
        return pl.DataFrame(rows, schema=schema, orient="row")
    except pl.exceptions.ComputeError:
        # SQLite keeps any value in any column: text or a BLOB among numbers fails the row
        # builder; column by column, such values become null.
        cols = zip(*rows, strict=True)
        named = zip(schema.items(), cols, strict=True)
        return pl.DataFrame([pl.Series(n, c, dtype=t, strict=False) for (n, t), c in named])


def _fetch_adbc(uri: str, sql: str) -> pl.DataFrame | None:
    """None when ADBC is missing or declines the query (e.g. a column whose SQLite storage
    class changes mid-table); the caller then uses sqlite3."""
    try:
        import adbc_driver_sqlite.dbapi as adbc
    except ImportError:
        return None
    try:
        with adbc.connect(uri) as con, con.cursor() as cur:
            cur.execute("PRAGMA query_only = ON")
            cur.execute(sql)
            return pl.DataFrame(cur.fetch_arrow())
    except (Exception, pl.exceptions.PanicException):  # noqa: BLE001 - any driver error: sqlite3 reports real damage
        return None


def _event_rows(df: pl.DataFrame, offset_ns: int) -> pl.DataFrame:
    """What every table's rows need, done per fetched part on the fetch threads (in parallel,
    and on parts small enough to reuse memory, where the whole 15M-row table after the concat
    spent seconds faulting in fresh pages): times moved by ``offset_ns``, ``dur_ns``, negative
    durations dropped, pid/tid of host rows from their thread id and of GPU rows from their
    process id, the event schema's types. NVTX domain-creation rows (no end, a negative
    ``domain``) are kept for :func:`_nccl_domain`."""
    df = df.with_columns(pl.col("start_ns") + offset_ns, pl.col("end_ns") + offset_ns)
    # globalTid / globalPid pack (hardware id, pid, tid) as 24-bit fields. Host rows carry the
    # thread id, unpacked here rather than by SQL expressions (those cost SQLite a third of its
    # time on the NVTX and runtime scans); GPU rows carry the process id.
    if "gtid" in df.columns:
        gtid = pl.col("gtid")
        df = df.with_columns(
            _packed_pid(gtid).alias("pid"), (gtid & 0xFFFFFF).alias("tid"), (gtid // (1 << 24) * (1 << 24)).alias("gpid")
        ).drop("gtid")
    else:
        df = df.with_columns(_packed_pid(pl.col("gpid")).alias("pid"))
    keep = (pl.col("end_ns") - pl.col("start_ns")) >= 0
    if "domain" in df.columns:  # NVTX: DomainCreate rows (no end) name the domains
        keep = keep | IS_DOMAIN_CREATE
    df = _keep(df, keep).with_columns((pl.col("end_ns") - pl.col("start_ns")).alias("dur_ns"))
    return df.cast({c: t for c, t in EVENT_SCHEMA.items() if c in df.columns})  # type: ignore[arg-type]


def _keep(df: pl.DataFrame, keep: pl.Expr) -> pl.DataFrame:
    """``df.filter(keep)``, without the copy of every column when every row is kept (the
    usual case: a filter of millions of rows copies them all)."""
    mask = df.select(keep.fill_null(False)).to_series()
    return df if mask.all() else df.filter(mask)


def _packed_pid(packed: pl.Expr) -> pl.Expr:
    return (packed // (1 << 24)) & 0xFFFFFF  # floor division: SQLite's arithmetic >> 24


def _named(df: pl.DataFrame, strings: pl.DataFrame, id_col: str = "name_id") -> pl.DataFrame:
    """Resolve a StringIds id column into ``name`` in polars (a hash join) rather than with a
    correlated subquery per row in SQL."""
    named = df.join(strings, left_on=id_col, right_on="sid", how="left", maintain_order="left")
    return named.rename({"svalue": "name"}).drop(id_col)


def _registered_names(df: pl.DataFrame, strings: pl.DataFrame) -> pl.DataFrame:
    """NVTX names: the inline text, or for the few rows that carry ``REGISTERED`` + a StringIds
    id instead, that string (looked up only for those rows)."""
    name = df.get_column("name")
    need = name.str.starts_with(REGISTERED).arg_true()
    if need.len() == 0:
        return df
    marked = name.gather(need)
    ids = marked.str.slice(1).cast(pl.Int64, strict=False).alias("sid").to_frame()
    found = ids.join(strings, on="sid", how="left", maintain_order="left").get_column("svalue")
    # A text of its own that merely starts with the marker (no id after it) stays as it is.
    found = ids.select(pl.when(pl.col("sid").is_null()).then(marked).otherwise(found)).to_series()
    return df.with_columns(name.scatter(need, found))


def _metadata(db: _Db) -> dict[str, str]:
    for name in ("META_DATA_EXPORT", "EXPORT_META_DATA"):
        if name in db.tables:
            return {str(k): str(v) for k, v in db.con.execute(f"SELECT name, value FROM {name}").fetchall()}
    return {}


def _pick(cols: set[str], name: str, default: str = "NULL") -> str:
    """The column if this export has it, else an SQL default: tables gain columns over versions."""
    return name if name in cols else default


def _gpu_base(cols: set[str]) -> list[str]:
    """The leading columns every GPU activity table shares (base_schema's order)."""
    return ["start", "end", "deviceId", "streamId", "correlationId", _pick(cols, "globalPid")]


def _gpu_rows(db: _Db, strings: pl.DataFrame) -> list[_Rows]:
    out = []
    base_schema = {
        "start_ns": pl.Int64, "end_ns": pl.Int64, "device": pl.Int64, "stream": pl.Int64,
        "correlation": pl.Int64, "gpid": pl.Int64,
    }
    kt = db.table("CUPTI_ACTIVITY_KIND_KERNEL")
    if kt:
        cols = db.columns(kt)
        name_col = _pick(cols, "demangledName", _pick(cols, "shortName"))
        out.append(
            db.query(
                [*_gpu_base(cols), name_col],
                kt,
                {**base_schema, "name_id": pl.Int64},
                to_events=lambda df: _named(_kernel_classes(df, strings), strings).with_columns(pl.lit("kernel").alias("kind")),
            )
        )
    mt = db.table("CUPTI_ACTIVITY_KIND_MEMCPY")
    if mt:
        cols = db.columns(mt)
        out.append(
            db.query(
                [*_gpu_base(cols), "bytes", "copyKind", _pick(cols, "srcKind", "7"), _pick(cols, "dstKind", "7")],
                mt,
                {**base_schema, "bytes": pl.Int64, "ck": pl.Int64, "sk": pl.Int64, "dk": pl.Int64},
                to_events=_memcpy_rows,
            )
        )
    st = db.table("CUPTI_ACTIVITY_KIND_MEMSET")
    if st:
        cols = db.columns(st)
        out.append(
            db.query(
                [*_gpu_base(cols), "bytes", _pick(cols, "memKind", "2")],
                st,
                {**base_schema, "bytes": pl.Int64, "mk": pl.Int64},
                to_events=lambda df: df.with_columns(
                    pl.lit("memset").alias("kind"),
                    pl.format("Memset ({})", pl.col("mk").replace_strict(MEM_LABEL, default="Unknown", return_dtype=pl.String)).alias("name"),
                ).drop("mk"),
            )
        )
    yt = db.table("CUPTI_ACTIVITY_KIND_SYNCHRONIZATION")
    if yt:
        cols = db.columns(yt)
        names = {1: "Event Sync", 2: "Stream Wait Event", 3: "Stream Sync", 4: "Context Sync"}
        out.append(
            db.query(
                [*_gpu_base(cols), "syncType"],
                yt,
                {**base_schema, "sync_type": pl.Int64},
                to_events=lambda df: df.with_columns(
                    pl.lit("gpu_sync").alias("kind"),
                    pl.col("sync_type").replace_strict(names, default="Sync", return_dtype=pl.String).alias("name"),
                ).drop("sync_type"),
            )
        )
    return out


def _kernel_classes(df: pl.DataFrame, strings: pl.DataFrame) -> pl.DataFrame:
    """Classify each distinct kernel name id once and join back on the integer id: hashing
    millions of long demangled names is the slow part otherwise."""
    ids = df.select(pl.col("name_id").unique()).join(strings, left_on="name_id", right_on="sid", how="left")
    ids = ids.with_columns(classify_names(ids["svalue"].fill_null("")).alias("kernel_class")).select("name_id", "kernel_class")
    return df.join(ids, on="name_id", how="left", maintain_order="left")


def _memcpy_rows(df: pl.DataFrame) -> pl.DataFrame:
    return df.with_columns(
        pl.lit("memcpy").alias("kind"),
        pl.col("ck").replace_strict(COPY_KIND, default="other", return_dtype=pl.String).alias("copy_kind"),
        pl.col("sk").replace_strict(MEM_KIND, default="unknown", return_dtype=pl.String).alias("src_kind"),
        pl.col("dk").replace_strict(MEM_KIND, default="unknown", return_dtype=pl.String).alias("dst_kind"),
        pl.format(
            "Memcpy {} ({} -> {})",
            pl.col("ck").replace_strict(COPY_LABEL, default="Unknown", return_dtype=pl.String),
            pl.col("sk").replace_strict(MEM_LABEL, default="Unknown", return_dtype=pl.String),
            pl.col("dk").replace_strict(MEM_LABEL, default="Unknown", return_dtype=pl.String),
        ).alias("name"),
    ).drop("ck", "sk", "dk")


_HOST_SCHEMA = {"start_ns": pl.Int64, "end_ns": pl.Int64, "gtid": pl.Int64}
_HOST_COLS = ["start", "end", "globalTid"]


def _host_rows(db: _Db, strings: pl.DataFrame) -> list[_Rows]:
    out = []
    rt = db.table("CUPTI_ACTIVITY_KIND_RUNTIME")
    if rt:
        cols = db.columns(rt)
        api_names = strings.with_columns(pl.col("svalue").str.replace(r"_v\d+$", ""))  # cudaLaunchKernel_v7000
        out.append(
            db.query(
                [*_HOST_COLS, "correlationId", _pick(cols, "eventClass", "0"), "nameId"],
                rt,
                {**_HOST_SCHEMA, "correlation": pl.Int64, "event_class": pl.Int64, "name_id": pl.Int64},
                to_events=lambda df: _named(df, api_names).with_columns(
                    pl.when(pl.col("event_class") == 1).then(pl.lit("driver")).otherwise(pl.lit("runtime")).alias("kind"),
                ).drop("event_class"),
            )
        )
    nt = db.table("NVTX_EVENTS")
    if nt:
        cols = db.columns(nt)
        dom = _pick(cols, "domainId")
        # Ranges and domain names in one scan of the (largest) table, in as few columns as
        # possible: each integer column costs the driver about as much as SQLite's whole row
        # step. A registered string's id rides in the text column (REGISTERED + id; the text is
        # NULL on those rows) and the event type in the domain column (DomainCreate rows get
        # -1 - domainId): 20% less time on the NVTX scan than the four columns fetched apart.
        text_id = f"char({ord(REGISTERED)}) || textId" if "textId" in cols else "NULL"
        out.append(
            db.query(
                [*_HOST_COLS, f"ifnull(text, {text_id})", f"CASE eventType WHEN {NVTX_DOMAIN_CREATE} THEN -1 - ifnull({dom}, 0) ELSE {dom} END"],
                nt,
                {**_HOST_SCHEMA, "name": pl.String, "domain": pl.Int64},
                f"eventType IN {(*NVTX_RANGE_TYPES, NVTX_DOMAIN_CREATE)}",
                to_events=lambda df: _nvtx_rows(_registered_names(df, strings)),
            )
        )
    for table in ("CUPTI_ACTIVITY_KIND_OVERHEAD", "PROFILER_OVERHEAD"):
        ot = db.table(table)
        if ot and {"start", "end", "globalTid"} <= db.columns(ot):
            out.append(
                db.query(
                    _HOST_COLS,
                    ot,
                    _HOST_SCHEMA,
                    to_events=lambda df: df.with_columns(pl.lit("overhead").alias("kind"), pl.lit("profiler overhead").alias("name")),
                )
            )
    return out


# torch.autograd.profiler.emit_nvtx decorates each op's range: "aten::mul, seq = 7, op_id = 12,
# sizes = [[8, 4]], input_op_ids = [...]". The op is the part before; keeping the counters would
# make every range's name unique (millions of distinct names) and unlike Kineto's.
EMIT_NVTX_DECORATION = r", (?:seq|op_id|sizes|input_op_ids|stashed seq) = "


def strip_emit_nvtx(name: pl.Expr) -> pl.Expr:
    """``name`` up to its first emit_nvtx decoration. The search gives a byte offset, so the
    bytes are cut (at an ASCII comma: still valid UTF-8); half the cost of a regex replace that
    rewrites every one of millions of names."""
    cut = name.str.find(EMIT_NVTX_DECORATION).fill_null(1 << 32)
    return name.cast(pl.Binary).bin.head(cut).cast(pl.String)


def _nvtx_rows(df: pl.DataFrame) -> pl.DataFrame:
    return _keep(df, pl.col("name").is_not_null()).with_columns(strip_emit_nvtx(pl.col("name")), pl.lit("user_annotation").alias("kind"))


def _nccl_domain(nvtx: pl.DataFrame) -> pl.DataFrame:
    """The NVTX ranges, those of NCCL's own domain (NCCL >= 2.8.3) named ``nccl:<range>`` so
    collectives are recognized. Domain-creation rows (``domain`` = -1 - the domain's id) name
    the domains."""
    domains = nvtx.filter(IS_DOMAIN_CREATE)  # a handful of rows: only those have their names compared
    nccl = domains.filter(pl.col("name").str.to_uppercase() == "NCCL").select(-1 - pl.col("domain")).to_series().unique()
    df = _keep(nvtx, ~IS_DOMAIN_CREATE)
    if nccl.len() == 0:
        return df.drop("domain")
    return df.with_columns(
        pl.when(pl.col("domain").is_in(nccl.implode()))
        .then(pl.format("nccl:{}", pl.col("name")))
        .otherwise(pl.col("name"))
        .alias("name")
    ).drop("domain")


def _session_start(db: _Db) -> int | None:
    t = db.table("TARGET_INFO_SESSION_START_TIME")
    if not t or "utcEpochNs" not in db.columns(t):
        return None
    row = db.con.execute(f"SELECT utcEpochNs FROM {t} LIMIT 1").fetchone()
    return int(row[0]) if row and isinstance(row[0], int) and 0 < row[0] < 4 * 10**18 else None


def _devices(db: _Db) -> list[DeviceInfo]:
    t = db.table("TARGET_INFO_GPU")
    if t:
        cols = db.columns(t)
        idc = "id" if "id" in cols else "deviceId" if "deviceId" in cols else None
        if idc:
            sm = _pick(cols, "smCount")
            mem = _pick(cols, "totalMemory")
            cc = "computeMajor || '.' || computeMinor" if {"computeMajor", "computeMinor"} <= cols else "NULL"
            rows = db.con.execute(f"SELECT {idc}, name, {sm}, {mem}, {cc} FROM {t}").fetchall()
            if rows:
                return [DeviceInfo(int(r[0]), r[1], r[2], r[3], r[4]) for r in rows if r[0] is not None]
    t = db.table("TARGET_INFO_CUDA_GPU")  # 2021 exports
    if t and {"deviceId", "name"} <= db.columns(t):
        rows = db.con.execute(f"SELECT DISTINCT deviceId, name FROM {t}").fetchall()
        return [DeviceInfo(int(r[0]), r[1]) for r in rows if r[0] is not None]
    return []


def parse_nsys(path: str | Path) -> Trace:
    path = Path(path)
    db = _Db(path)
    try:
        if "StringIds" not in db.tables or not any(
            t.startswith(("CUPTI_", "NVTX_", "TARGET_INFO_", "ThreadNames")) for t in db.tables
        ):
            raise InputError("SQLite file is not an Nsight Systems export (no StringIds/CUPTI/NVTX tables)", str(path))
        meta_kv = _metadata(db)
        session_start_ns = _session_start(db)
        # Session-relative ns -> UTC ns: ranks exported separately line up (as Kineto's do).
        db.offset_ns = session_start_ns or 0
        devices = _devices(db)
        strings = db.query(["id", "value"], "StringIds", {"sid": pl.Int64, "svalue": pl.String}).result()
        # The host tables (NVTX, runtime: the costliest rows) are queued first, so the GPU
        # tables' smaller parts fill the end, when one thread would otherwise wait on the other.
        pending_host = _host_rows(db, strings)
        pending_gpu = _gpu_rows(db, strings)
        gpu = [p.result() for p in pending_gpu]
        host = [_nccl_domain(h) if "domain" in h.columns else h for h in (p.result() for p in pending_host)]
    finally:
        db.close()

    frames = [f for f in gpu + host if f.height]
    version = meta_kv.get("EXPORT_PRODUCT_VERSION") or meta_kv.get("EXPORT_PRODUCT_VERSION_STRING")
    schema = meta_kv.get("EXPORT_SCHEMA_VERSION")
    if not schema and {"EXPORT_SCHEMA_VERSION_MAJOR", "EXPORT_SCHEMA_VERSION_MINOR"} <= set(meta_kv):
        schema = f"{meta_kv['EXPORT_SCHEMA_VERSION_MAJOR']}.{meta_kv['EXPORT_SCHEMA_VERSION_MINOR']}.{meta_kv.get('EXPORT_SCHEMA_VERSION_MICRO', 0)}"
    era = f"nsys {version or 'unknown (no export metadata, ~2021)'}" + (f"; schema {schema}" if schema else "")
    meta = TraceMeta(source_path=str(path), format="nsys-sqlite", format_version=era, devices=devices)
    if not gpu or not any(f.height for f in gpu):
        meta.warnings.append("the export has no CUDA GPU activity (kernels, copies, memsets)")
    if not frames:
        return Trace(events=empty_events(), meta=meta)

    # One process = one rank (ordered by process id); correlation ids are unique only per process.
    # Only processes with CUDA activity are ranks; host-only processes (launchers) fold into rank 0.
    cuda_kinds = ["kernel", "memcpy", "memset", "gpu_sync", "runtime", "driver"]
    procs = sorted(
        {g for f in frames for g in f.select("kind", "gpid").filter(pl.col("kind").is_in(cuda_kinds)).get_column("gpid").drop_nulls().unique()}
    )
    df = pl.concat(frames, how="diagonal_relaxed")
    # The rank as its own column: with_columns would first copy the concatenation's every
    # column into one chunk (conform gathers them once anyway).
    df.insert_column(df.width, df.get_column("gpid").to_frame().with_columns(_rank_of(procs)).get_column("rank"))
    if session_start_ns:
        meta.extra["session_start_utc_ns"] = session_start_ns
    else:
        meta.warnings.append("no session start time in the export: times are relative to the capture start")
    if len(procs) > 1:
        meta.world_size = len(procs)
        meta.warnings.append(f"{len(procs)} processes in one export: analyzed as ranks 0..{len(procs) - 1} by process id")
    table = mark_comm_by_launcher(add_kernel_class(conform(df)))
    return Trace(events=table, meta=meta)


def _rank_of(procs: list[int]) -> pl.Expr:
    """The rank of each row: the index of its process id in ``procs``, 0 for other processes.
    A chain of comparisons for the usual few processes (0.3 s less than a hash lookup on 15M
    rows), the lookup beyond that."""
    if len(procs) > 16:
        return pl.col("gpid").replace_strict({g: i for i, g in enumerate(procs)}, default=0, return_dtype=pl.Int32).alias("rank")
    rank = pl.lit(0, pl.Int32)
    for i, g in enumerate(procs):
        rank = pl.when(pl.col("gpid") == g).then(pl.lit(i, pl.Int32)).otherwise(rank)
    return rank.alias("rank")


def parse_nsys_rep(path: str | Path) -> Trace:
    """A ``.nsys-rep`` report: export it with the local ``nsys`` into a temp dir, then parse."""
    path = Path(path)
    nsys = shutil.which("nsys")
    if nsys is None:
        raise InputError(
            "a .nsys-rep needs the nsys binary to export it; run "
            f"'nsys export --type sqlite -o report.sqlite {path}' and pass the .sqlite",
            str(path),
        )
    with tempfile.TemporaryDirectory(prefix="traceinsight-") as tmp:
        out = Path(tmp) / "export.sqlite"
        r = subprocess.run([nsys, "export", "--type", "sqlite", "-o", str(out), str(path)], capture_output=True, text=True)
        if r.returncode != 0 or not out.exists():
            raise InputError(f"nsys export failed: {(r.stderr or r.stdout).strip()[-300:]}", str(path))
        trace = parse_nsys(out)
    trace.meta.source_path = str(path)
    return trace

