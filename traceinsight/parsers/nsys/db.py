"""Reading an export: probing tables and columns through sqlite3, fetching rows from the
tables' B-tree pages (``_kbtree``) where a query is plain columns, else through SQLite with the
native row reader (``_ksqlite``), else ADBC, else sqlite3.

The file is opened read-only (SQLite URI ``mode=ro``, ``query_only``) and nothing is written to it:
no temp tables, no indexes. A read transaction stays open while the rows are fetched (SQLite's
shared lock), so no writer commits under the page reader.
"""

from __future__ import annotations

import os
import re
import sqlite3
import urllib.parse
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from traceinsight.errors import InputError
from traceinsight.native import ArrowTable, kbtree, ksqlite
from traceinsight.parsers.source import SQLITE_LOCK_WAIT_S

FETCH_ROWS = 200_000
SHIFTED = ("start_ns", "end_ns")  # the event rows' times (tables.event_rows adds the offset)
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


ROWID = -1  # a page-read term: the row's rowid (an INTEGER PRIMARY KEY column reads it)
ALL_ROWIDS = (-(1 << 63), (1 << 63) - 1)
_INT_LITERAL = re.compile(r"-?\d{1,18}")
# SQLite's rule for a declared type's affinity: INT first (INTEGER), then text, BLOB, then these
_REAL_AFFINITY = re.compile(r"^(?!.*INT)(?!.*(?:CHAR|CLOB|TEXT)).*(?:REAL|FLOA|DOUB)")


TextMap = Callable[[pl.Series], pl.Series]


@dataclass(frozen=True, slots=True)
class PageRead:
    """A query the page reader runs itself: each output column of ``schema`` from its record
    columns (summed for integers; ``ROWID`` for the rowid) or a constant (None: NULL), rows kept
    where the column ``keep_col`` (-1: none) holds one of ``keep_vals``. ``text_map``: the text
    columns read as dictionary codes, each with what maps its distinct values (None: as
    they are) before they are spread over the rows. ``adds``: per column, added to its
    integers as they are read (the event times' shift, :attr:`Db.offset_ns`)."""

    schema: dict[str, pl.DataType]
    root_page: int
    terms: tuple[tuple[int, ...] | None, ...]
    constants: tuple[int | None, ...]
    keep_col: int
    keep_vals: tuple[int, ...]
    text_map: dict[str, TextMap | None]
    adds: tuple[int, ...]


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
        self.pages_readable = kbtree is not None and _settled(path) and self._hold_shared_lock()
        self._layouts: dict[str, dict[str, int] | None] = {}
        self.offset_ns = 0  # added to every event time (the session start, once known)
        self.pool = ThreadPoolExecutor(max_workers=FETCH_THREADS)

    def _hold_shared_lock(self) -> bool:
        """SQLite's shared lock until close (a read transaction): no writer commits under the
        page reader. False where it cannot be had (a writer holds the file): SQLite then reads
        every query and reports the lock as it would."""
        try:
            self.con.execute("BEGIN")
            self.con.execute("SELECT count(*) FROM sqlite_master").fetchone()
        except sqlite3.Error:
            if self.con.in_transaction:
                self.con.rollback()
            return False
        return True

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
        keep_in: tuple[str, tuple[int, ...]] | None = None,
        plain: tuple[list[str], dict[str, pl.DataType]] | None = None,
        text_map: dict[str, TextMap | None] | None = None,
    ) -> Rows:
        """``SELECT cols FROM table [WHERE where] [AND keep_in[0] IN keep_in[1]]`` as a frame
        with ``schema`` (one name and type per column, each column aliased to its name), fetched
        on the pool and, with ``to_events``, turned into event rows there (``finish``). A large
        table is read as several rowid ranges so both threads stay busy until the end (polars
        releases the GIL, so the conversion of one part runs beside the fetch of the next).
        Plain columns, integer constants and sums of columns without a ``where`` are read from
        the table's pages (:func:`read_pages`); anything else, or what that reader declines,
        through SQLite. ``plain``: the same rows as plain columns and their schema, for the page
        reader, where ``cols`` pack several into one for SQL (each column fetched costs ADBC
        about as much as SQLite's whole row step; the page reader, little): ``to_events`` then
        takes a frame of either schema. ``text_map``: page-read text columns whose values repeat,
        read as a dictionary (each distinct value copied once), their distinct values mapped by
        the function given (a regex over thousands of values instead of millions of rows): the
        page reader's frame holds them mapped."""
        # the page reader filters on keep_in itself; any other condition is SQL's
        page_cols, page_schema = plain or (cols, schema)
        # event rows' times move by offset_ns: the page reader adds it as it reads them
        shift = self.offset_ns if to_events is not None else 0
        pages = (
            None
            if where
            else self._page_read(table, page_cols, page_schema, keep_in, text_map, shift)
        )
        if keep_in is not None:
            in_list = f"{keep_in[0]} IN ({', '.join(str(int(v)) for v in keep_in[1])})"
            where = f"({where}) AND {in_list}" if where else in_list
        exprs = ", ".join(f'{c} AS "{n}"' for c, n in zip(cols, schema, strict=True))
        sql = f"SELECT {exprs} FROM {table}"
        ranges = self._rowid_ranges(table)
        if not ranges:
            parts = [(sql + (f" WHERE {where}" if where else ""), ALL_ROWIDS)]
        else:
            cond = f"({where}) AND " if where else ""
            parts = [
                (f"{sql} WHERE {cond}rowid BETWEEN {lo} AND {hi}", (lo, hi)) for lo, hi in ranges
            ]
        return Rows(
            [
                self.pool.submit(self._fetch, q, schema, to_events, pages, rowids)
                for q, rowids in parts
            ]
        )

    def _layout(self, table: str) -> dict[str, int] | None:
        """Each column's place in the table's records (``ROWID`` for an INTEGER PRIMARY KEY,
        which SQLite keeps as the rowid); left out: columns with a DEFAULT (a record written
        before ALTER TABLE added one reads as that default, not NULL) and columns of REAL
        affinity (SQLite stores a whole float as an integer there and returns it as a float).
        None where the records are not plain (generated columns)."""
        if table not in self._layouts:
            info = self.con.execute(f'PRAGMA table_xinfo("{table}")').fetchall()
            pk = [r for r in info if r[5]]
            # an INTEGER PRIMARY KEY is the rowid, unless SQLite keeps it apart with an index
            # of its own (declared DESC): then the records hold it
            own_index = any(r[3] == "pk" for r in self.con.execute(f'PRAGMA index_list("{table}")'))
            integer_pk = len(pk) == 1 and str(pk[0][2]).upper() == "INTEGER"
            alias = pk[0][1] if integer_pk and not own_index else None
            plain = all(r[6] == 0 for r in info)
            self._layouts[table] = (
                {
                    r[1]: ROWID if r[1] == alias else r[0]
                    for r in info
                    if r[4] is None and not _REAL_AFFINITY.search(str(r[2]).upper())
                }
                if plain
                else None
            )
        return self._layouts[table]

    def _page_read(
        self,
        table: str,
        cols: list[str],
        schema: dict[str, pl.DataType],
        keep_in: tuple[str, tuple[int, ...]] | None,
        text_map: dict[str, TextMap | None] | None = None,
        shift: int = 0,
    ) -> PageRead | None:
        """The query as a :class:`PageRead`, or None where SQLite must run it; ``shift``
        added to its :data:`SHIFTED` columns."""
        if not self.pages_readable or table not in self.tables:
            return None
        layout = self._layout(table)
        row = self.con.execute(
            "SELECT rootpage, sql FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)
        ).fetchone()
        if layout is None or row is None or not row[0] or "WITHOUT ROWID" in (row[1] or "").upper():
            return None
        terms: list[tuple[int, ...] | None] = []
        constants: list[int | None] = []
        for expr, dtype in zip(cols, schema.values(), strict=True):
            names = [c.strip() for c in expr.split("+")]
            if all(n in layout for n in names) and (dtype.is_integer() or len(names) == 1):
                if dtype != pl.String and not dtype.is_integer():
                    return None
                if dtype == pl.String and layout[names[0]] == ROWID:
                    return None
                terms.append(tuple(layout[n] for n in names))
                constants.append(None)
            elif expr.strip().upper() == "NULL" or (
                _INT_LITERAL.fullmatch(expr.strip()) and dtype.is_integer()
            ):
                terms.append(None)
                constants.append(None if expr.strip().upper() == "NULL" else int(expr))
            else:
                return None
        read = [t for t in terms if t is not None]
        # the reader's bounds (kbtree.c): 64 outputs of up to 4 terms, record columns 0-255
        if not read or len(read) > 64 or any(len(t) > 4 or max(t) >= 256 for t in read):
            return None
        keep_col = -1
        if keep_in is not None:
            keep_col = layout.get(keep_in[0], ROWID)
            if keep_col == ROWID or keep_col >= 256 or len(keep_in[1]) > 64:
                return None
        return PageRead(
            schema,
            int(row[0]),
            tuple(terms),
            tuple(constants),
            keep_col,
            tuple(int(v) for v in keep_in[1]) if keep_in else (),
            dict(text_map or {}),
            tuple(shift if n in SHIFTED else 0 for n in schema),
        )

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
        pages: PageRead | None = None,
        rowids: tuple[int, int] = ALL_ROWIDS,
    ) -> pl.DataFrame:
        df = None
        offset_ns = self.offset_ns
        if pages is not None and (df := read_pages(self.path, pages, rowids)) is not None:
            schema = pages.schema  # the page reader's own columns (Db.query's ``plain``)
            offset_ns = 0  # added by the reader (PageRead.adds)
        if df is None:
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
        return self.finish(to_events(df), offset_ns) if to_events is not None else df

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


def _settled(path: Path) -> bool:
    """Whether every page of the database is in the file itself: no rollback journal (a crashed
    writer's, SQLite would roll it back) and no WAL holding newer pages."""
    for suffix in ("-journal", "-wal"):
        try:
            if os.path.getsize(str(path) + suffix) > 0:
                return False
        except OSError:
            continue
    return True


def read_pages(path: Path, read: PageRead, rowids: tuple[int, int]) -> pl.DataFrame | None:
    """The rows read from the table's B-tree pages by ``_kbtree``: no SQL engine, half the
    CPU of SQLite's own row step on the 1 GB export (benchmarks/RESULTS.md, issue 33). None
    where it declines (a value of another storage class than the schema's, a sum past int64,
    invalid UTF-8, anything in the file it does not expect); SQLite then reads the query."""
    if kbtree is None:
        return None
    schema = read.schema
    names = tuple(schema)
    read_cols = [i for i, t in enumerate(read.terms) if t is not None]
    kinds = "".join(
        ("d" if names[i] in read.text_map else "s") if schema[names[i]] == pl.String else "i"
        for i in read_cols
    )
    columns = kbtree.scan(
        str(path),
        read.root_page,
        rowids[0],
        rowids[1],
        tuple(read.terms[i] for i in read_cols),
        tuple(names[i] for i in read_cols),
        kinds,
        read.keep_col,
        read.keep_vals,
        tuple(read.adds[i] for i in read_cols),
    )
    if columns is None:
        return None
    # one Series per column, each owning its buffers (freed as soon as it is dropped)
    got = {
        names[i]: _dictionary_text(c, read.text_map[names[i]])
        if kind == "d"
        else pl.Series(ArrowTable(c))
        for i, c, kind in zip(read_cols, columns, kinds, strict=True)
    }
    n = len(next(iter(got.values())))
    return pl.DataFrame(
        [
            got[c]
            if c in got
            else pl.repeat(
                None if read.constants[i] is None else read.constants[i] + read.adds[i],
                n,
                dtype=schema[c],
                eager=True,
            ).alias(c)
            for i, c in enumerate(names)
        ]
    )


def _dictionary_text(
    read: tuple[tuple[object, object], tuple[object, object]], text_map: TextMap | None
) -> pl.Series:
    """A dictionary column of the page reader (codes, distinct values) as text: the values
    mapped by ``text_map``, then gathered by code (each row a view into the few values' bytes)."""
    codes, values = (pl.Series(ArrowTable(c)) for c in read)
    if text_map is not None:
        values = text_map(values)
    return values.gather(codes).alias(codes.name)


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
