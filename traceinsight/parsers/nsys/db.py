"""Reading an export: probing tables and columns through sqlite3, fetching rows through the
native reader (``_ksqlite``, where it is built), else ADBC, else sqlite3.

The file is opened read-only (SQLite URI ``mode=ro``, ``query_only``) and nothing is written to it:
no temp tables, no indexes.
"""

from __future__ import annotations

import sqlite3
import urllib.parse
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import polars as pl

from traceinsight.errors import InputError
from traceinsight.native import ArrowTable, ksqlite
from traceinsight.parsers.source import SQLITE_LOCK_WAIT_S

FETCH_ROWS = 200_000
FETCH_THREADS = 2  # SQLite steps rows without the GIL: two scans at once on two cores
ROWS_PER_PART = 1_000_000  # big tables are fetched as rowid ranges of about this many rows


def text_replacing(raw: bytes) -> str:
    """SQLite text as str, invalid UTF-8 replaced (U+FFFD): Windows exports hold cp1252 user
    names in ``EXPORT_META_DATA`` and binary protobuf in ``TARGET_INFO_SYSTEM_ENV``; sqlite3's
    default decoder raises on them."""
    return raw.decode("utf-8", errors="replace")


def connect(uri: str, *, replacing: bool = True) -> sqlite3.Connection:
    """A read-only connection; with ``replacing`` its text never fails to decode
    (:func:`text_replacing`)."""
    con = sqlite3.connect(uri, uri=True, timeout=SQLITE_LOCK_WAIT_S)
    if replacing:
        con.text_factory = text_replacing
    con.execute("PRAGMA query_only = ON")
    return con


class Rows:
    """A fetch split into parts, in rowid order."""

    def __init__(self, parts: list[Future[pl.DataFrame]]) -> None:
        self.parts = parts

    def result(self) -> pl.DataFrame:
        frames = [f.result() for f in self.parts]
        return frames[0] if len(frames) == 1 else pl.concat(frames)


class Db:
    """Probing and small queries through sqlite3; the big row fetches through the native reader
    (:func:`fetch_native`), else ADBC's SQLite driver when it is installed (Arrow columns straight
    into polars, ~1 us/row against ~5 us/row for Python tuples), two at a time on separate
    read-only connections."""

    def __init__(self, path: Path, finish: Callable[[pl.DataFrame, int], pl.DataFrame]) -> None:
        self.finish = (
            finish  # each fetched part's last step, on the fetch thread (tables.event_rows)
        )
        self.uri = "file:" + urllib.parse.quote(str(path.resolve())) + "?mode=ro"
        try:
            self.con = connect(self.uri)
            rows = self.con.execute(
                "SELECT name FROM sqlite_master WHERE type IN ('table', 'view')"
            ).fetchall()
        except sqlite3.OperationalError as exc:
            msg = str(exc)
            if "locked" in msg:
                raise InputError(
                    "SQLite database is locked (still being written by nsys?)", str(path)
                ) from None
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
    ) -> Rows:
        """``SELECT cols FROM table [WHERE where]`` as a frame with ``schema`` (one name and type
        per column, each column aliased to its name), fetched on the pool and, with ``to_events``,
        turned into event rows there (``finish``). A large table is read as several
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
        return Rows([self.pool.submit(self._fetch, q, schema, to_events) for q in sqls])

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
        self,
        sql: str,
        schema: dict[str, pl.DataType],
        to_events: Callable[[pl.DataFrame], pl.DataFrame] | None = None,
    ) -> pl.DataFrame:
        df = fetch_native(self.uri, sql, schema)
        if df is None:
            df = fetch_adbc(self.uri, sql)
        if df is None:
            df = self._fetch_sqlite3(sql, schema)
        blobs = [c for c, t in df.schema.items() if t == pl.Binary != schema.get(c)]
        if blobs:
            df = df.with_columns(unblob(df.get_column(c), schema[c]) for c in blobs)
        df = df.cast(schema, strict=False)  # type: ignore[arg-type]
        # Arrow's batches stay as they are: conform copies each column into one chunk once, on
        # its way into the table (re-chunking every part here as well cost 0.4 s on a 1 GB export).
        return self.finish(to_events(df), self.offset_ns) if to_events is not None else df

    def _fetch_sqlite3(self, sql: str, schema: dict[str, pl.DataType]) -> pl.DataFrame:
        """Rows in batches straight into polars frames: Python tuples never outlive one batch.
        Text that is not UTF-8 fails the fast decoder; the query is then read again with
        replacement (:func:`text_replacing`, slower: a Python call per value)."""
        try:
            return self._fetch_rows(sql, schema, replacing=False)
        except sqlite3.OperationalError as exc:
            if "decode" not in str(exc):
                raise InputError(
                    f"export is damaged or unreadable ({exc})", str(self.path)
                ) from None
            return self._fetch_rows(sql, schema, replacing=True)

    def _fetch_rows(
        self, sql: str, schema: dict[str, pl.DataType], *, replacing: bool
    ) -> pl.DataFrame:
        frames = []
        uri_con = connect(self.uri, replacing=replacing)
        try:
            cur = uri_con.execute(sql)
            while rows := cur.fetchmany(FETCH_ROWS):
                frames.append(rows_frame(rows, schema))
        except sqlite3.OperationalError as exc:
            if "decode" in str(exc) and not replacing:
                raise
            raise InputError(f"export is damaged or unreadable ({exc})", str(self.path)) from None
        except sqlite3.DatabaseError as exc:
            raise InputError(f"export is damaged or unreadable ({exc})", str(self.path)) from None
        finally:
            uri_con.close()
        return pl.concat(frames) if frames else pl.DataFrame(schema=schema)

    def close(self) -> None:
        self.pool.shutdown(wait=True)
        self.con.close()


def unblob(s: pl.Series, dtype: pl.DataType) -> pl.Series:
    """A BLOB anywhere in a column makes ADBC return all of it as bytes, integers as their
    ASCII digits; polars casts no bytes to numbers, nor invalid UTF-8 to text. Integers are
    read back from the digits' hex codes (0x30-0x39, a leading 0x2d minus), text columns as
    UTF-8, invalid bytes replaced (U+FFFD); integers that are not digits become null."""
    if not dtype.is_integer():
        try:
            return s.cast(pl.String)
        except pl.exceptions.ComputeError:  # invalid UTF-8 somewhere: decoded with replacement
            return s.map_elements(text_replacing, return_dtype=pl.String, skip_nulls=True)
    hexed = pl.col(s.name).bin.encode("hex")
    digits = hexed.str.replace(r"^2d", "-").str.replace_all(r"3([0-9])", "$1")
    is_int = hexed.str.contains(r"^(2d)?(3[0-9])+$")
    return s.to_frame().select(pl.when(is_int).then(digits)).to_series()


def rows_frame(rows: list[tuple[Any, ...]], schema: dict[str, pl.DataType]) -> pl.DataFrame:
    try:
        return pl.DataFrame(rows, schema=schema, orient="row")
    except pl.exceptions.ComputeError:
        # SQLite keeps any value in any column: text or a BLOB among numbers fails the row
        # builder; column by column, such values become null.
        cols = zip(*rows, strict=True)
        named = zip(schema.items(), cols, strict=True)
        return pl.DataFrame([pl.Series(n, c, dtype=t, strict=False) for (n, t), c in named])


def fetch_native(uri: str, sql: str, schema: dict[str, pl.DataType]) -> pl.DataFrame | None:
    """The rows through the native reader: integer and text columns written straight from
    SQLite's values, 30% less CPU than ADBC on the 1 GB export (benchmarks/RESULTS.md, issue 33).
    None when it is not built, a column is of another type, or it declines: a value of another
    storage class than the schema's (a REAL or BLOB among integers), invalid UTF-8, any SQLite
    error; ADBC and sqlite3 then read the query as before."""
    if ksqlite is None:
        return None
    kinds = "".join(
        "i" if t.is_integer() else "s" if t == pl.String else "?" for t in schema.values()
    )
    if "?" in kinds:
        return None
    columns = ksqlite.fetch(uri, sql, tuple(schema), kinds)
    if columns is None:
        return None
    # one Series per column, each owning its buffers (freed as soon as it is dropped)
    return pl.DataFrame([pl.Series(ArrowTable(c)) for c in columns])


def fetch_adbc(uri: str, sql: str) -> pl.DataFrame | None:
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
