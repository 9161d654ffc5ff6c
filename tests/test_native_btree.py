"""The page reader of SQLite tables (traceinsight/_native/kbtree.c) against SQLite itself: the
same rows, values and nulls as ``SELECT ... ORDER BY rowid`` on tables built to reach every part
of the file format it reads (interior pages several levels deep, records spilled to overflow
pages, every integer width, rowid aliases, columns added by ALTER TABLE, rowid ranges and
gaps); and None (SQLite then reads the query, parsers/nsys/db.py) for every value, page or
file it does not read exactly as SQLite would. Damaged files never crash it."""

from __future__ import annotations

import random
import sqlite3

import polars as pl
import pytest

from traceinsight.native import ArrowTable, kbtree

from .conftest import FIXTURES, require_native, shared_or_skip, unpacked_db

require_native(kbtree, "traceinsight._kbtree (the SQLite page reader)")

ALL = (-(1 << 63), (1 << 63) - 1)
# one value per serial type's width, both signs, at each width's edge (1, 2, 3, 4, 6, 8 bytes
# and the constants 0 and 1)
EDGES = [0, 1, -1, 2, 127, -128, 128, 32767, -32768, 32768, 2**23 - 1, -(2**23), 2**23]
EDGES += [2**31 - 1, -(2**31), 2**31, 2**47 - 1, -(2**47), 2**47, 2**63 - 1, -(2**63)]


def _root(path, table: str) -> int:
    con = sqlite3.connect(path)
    (root,) = con.execute("SELECT rootpage FROM sqlite_master WHERE name = ?", (table,)).fetchone()
    con.close()
    return root


def _scan(path, table, terms, names, kinds, rowids=ALL, keep=(-1, ())) -> pl.DataFrame | None:
    out = kbtree.scan(str(path), _root(path, table), *rowids, terms, names, kinds, *keep)
    return None if out is None else pl.DataFrame([pl.Series(ArrowTable(c)) for c in out])


def _sqlite(path, sql: str) -> list[tuple[object, ...]]:
    con = sqlite3.connect(path)
    rows = con.execute(sql).fetchall()
    con.close()
    return rows


def _execute(path, *statements: str) -> None:
    con = sqlite3.connect(path)
    for sql in statements:
        con.execute(sql)
    con.commit()
    con.close()


def _build(tmp_path, page_size: int, rows: int, seed: int = 0):
    """A table with every integer width, NULLs, short and long text (long enough to spill to
    one or more overflow pages at this page size), rows deleted here and there (gaps in the
    rowids) and one column added after some rows were written."""
    rng = random.Random(seed)
    path = tmp_path / f"t{page_size}.sqlite"
    con = sqlite3.connect(path)
    con.execute(f"PRAGMA page_size = {page_size}")
    con.execute("CREATE TABLE t (a INTEGER, b TEXT, c INTEGER, d)")
    words = ["aten::mm", "ünïcödé ✓ 𝄞", "", "cudaLaunchKernel"]

    def row(i: int) -> tuple[object, ...]:
        text = rng.choice(words) if i % 7 else "x" * rng.choice([page_size, 3 * page_size, 40])
        return (
            rng.choice(EDGES) if i % 5 else None,
            None if i % 11 == 0 else f"{text}{i}",
            i * 1000 + rng.randrange(1000),
            rng.choice(EDGES),
        )

    con.executemany("INSERT INTO t VALUES (?, ?, ?, ?)", [row(i) for i in range(rows // 2)])
    con.execute("ALTER TABLE t ADD COLUMN e INTEGER")  # the rows before read e as NULL
    con.executemany(
        "INSERT INTO t VALUES (?, ?, ?, ?, ?)",
        [(*row(i), rng.choice([None, *EDGES])) for i in range(rows // 2, rows)],
    )
    con.execute("DELETE FROM t WHERE rowid % 13 = 0")
    con.commit()
    con.close()
    return path


@pytest.mark.parametrize("page_size", [512, 4096])
def test_every_row_and_value_as_sqlite_reads_them(tmp_path, page_size):
    path = _build(tmp_path, page_size, 6000)
    names = ("rowid", "a", "b", "c", "d", "e")
    terms = ((-1,), (0,), (1,), (2,), (3,), (4,))
    df = _scan(path, "t", terms, names, "iisiii")
    want = _sqlite(path, "SELECT rowid, a, b, c, d, e FROM t ORDER BY rowid")
    assert df is not None and df.schema == dict.fromkeys(names, pl.Int64) | {"b": pl.String}
    assert df.rows() == want
    # the table reaches past one interior level and has spilled records
    assert _sqlite(path, "PRAGMA page_count")[0][0] > 100
    assert max(len(r[2] or "") for r in want) > 2 * page_size


@pytest.mark.parametrize("page_size", [512, 4096])
def test_text_as_dictionary_codes_reads_the_same_texts(tmp_path, page_size):
    """Kind 'd': each distinct text once (first-seen order), a code per row, null for NULL;
    spread back by code, the column SQLite reads. Enough distinct texts to grow the table."""
    path = _build(tmp_path, page_size, 6000, seed=7)
    _execute(path, "UPDATE t SET b = 'n' || (rowid % 3000) WHERE rowid % 17 = 0")
    out = kbtree.scan(str(path), _root(path, "t"), *ALL, ((1,), (-1,)), ("b", "r"), "di", -1, ())
    assert out is not None
    codes, values = (pl.Series(ArrowTable(c)) for c in out[0])
    assert codes.dtype == pl.UInt32 and values.dtype == pl.String and codes.name == "b"
    want = [r[0] for r in _sqlite(path, "SELECT b FROM t ORDER BY rowid")]
    assert values.gather(codes).to_list() == want
    assert values.to_list() == list(dict.fromkeys(w for w in want if w is not None))
    assert pl.Series(ArrowTable(out[1])).len() == len(want)
    _execute(path, "UPDATE t SET b = CAST(x'c328' AS TEXT) WHERE rowid = 40")  # invalid UTF-8
    assert kbtree.scan(str(path), _root(path, "t"), *ALL, ((1,),), ("b",), "d", -1, ()) is None


def test_adds_shift_each_integer_not_nulls_and_decline_an_overflow(tmp_path):
    path = _build(tmp_path, 4096, 500, seed=8)
    _execute(path, "UPDATE t SET a = a % 1000, c = c % 1000")
    root, terms = _root(path, "t"), ((0,), (2,), (1,))
    out = kbtree.scan(str(path), root, *ALL, terms, ("a", "c", "b"), "iis", -1, (), (5, -7, 0))
    assert out is not None
    df = pl.DataFrame([pl.Series(ArrowTable(c)) for c in out])
    assert df.rows() == _sqlite(path, "SELECT a + 5, c - 7, b FROM t ORDER BY rowid")
    assert df["a"].null_count() > 0  # NULL + 5 stays NULL
    big = (2**63 - 1, 0, 0)  # any a > 0 overflows
    assert kbtree.scan(str(path), root, *ALL, terms, ("a", "c", "b"), "iis", -1, (), big) is None
    with pytest.raises(ValueError):
        kbtree.scan(str(path), root, *ALL, terms, ("a", "c", "b"), "iis", -1, (), (1,))


def test_rowid_ranges_select_exactly_their_rows(tmp_path):
    path = _build(tmp_path, 512, 3000, seed=1)
    rng = random.Random(2)
    bounds = [(1, 1), (0, 0), (13, 13), (-5, 40), (2990, 5000), (1, 3000)]
    bounds += [tuple(sorted(rng.sample(range(-10, 3100), 2))) for _ in range(20)]
    for lo, hi in bounds:
        df = _scan(path, "t", ((-1,), (1,)), ("rowid", "b"), "is", (lo, hi))
        want = _sqlite(path, f"SELECT rowid, b FROM t WHERE rowid BETWEEN {lo} AND {hi}")
        assert df is not None and df.rows() == want, (lo, hi)
    assert _scan(path, "t", ((-1,),), ("r",), "i", (10, 5)).height == 0


def test_sparse_and_negative_rowids(tmp_path):
    path = tmp_path / "s.sqlite"
    con = sqlite3.connect(path)
    con.execute("PRAGMA page_size = 512")
    con.execute("CREATE TABLE s (id INTEGER PRIMARY KEY, v TEXT)")  # id is the rowid
    rng = random.Random(3)
    ids = sorted({rng.randrange(-(2**62), 2**62) for _ in range(4000)} | {2**63 - 1, -(2**63)})
    con.executemany("INSERT INTO s VALUES (?, ?)", [(i, f"v{i}") for i in ids])
    con.commit()
    con.close()
    df = _scan(path, "s", ((-1,), (1,)), ("id", "v"), "is")
    assert df is not None and df.rows() == _sqlite(path, "SELECT id, v FROM s ORDER BY id")
    assert df["id"].to_list() == ids
    lo, hi = ids[100], ids[2000]
    part = _scan(path, "s", ((-1,),), ("id",), "i", (lo, hi))
    assert part is not None and part["id"].to_list() == ids[100:2001]


def test_sums_and_the_in_filter_as_sql_computes_them(tmp_path):
    path = _build(tmp_path, 4096, 2000, seed=4)
    _execute(
        path,
        "UPDATE t SET d = NULL WHERE rowid % 3 = 0",
        "UPDATE t SET a = 7 WHERE rowid % 4 = 0",
        "UPDATE t SET a = a % 1000, c = c % 1000",  # sums within int64
    )
    df = _scan(path, "t", ((0, 2), (2, 0, 2)), ("ac", "cac"), "ii")
    assert df is not None
    assert df.rows() == _sqlite(path, "SELECT a + c, c + a + c FROM t ORDER BY rowid")
    keep = (0, (7, 2**63 - 1, -1))
    df = _scan(path, "t", ((-1,), (2,)), ("rowid", "c"), "ii", keep=keep)
    want = _sqlite(path, "SELECT rowid, c FROM t WHERE a IN (7, 9223372036854775807, -1)")
    assert df is not None and df.rows() == want and df.height > 100


@pytest.mark.parametrize(
    ("update", "terms", "kinds", "read"),
    [
        ("SET a = 1.5", ((0,),), "i", False),  # a REAL among integers
        ("SET d = '12'", ((3,),), "i", False),  # d has no type: the text stays text
        ("SET a = '12'", ((0,),), "i", True),  # INTEGER affinity stored it as 12
        ("SET d = x'00'", ((3,),), "i", False),  # a BLOB among integers
        ("SET b = x'6869'", ((1,),), "s", False),  # a BLOB among text
        ("SET b = 12", ((1,),), "s", True),  # TEXT affinity stored it as '12'
        ("SET b = CAST(x'c328' AS TEXT)", ((1,),), "s", False),  # invalid UTF-8
        ("SET a = 9223372036854775807, c = 1", ((0, 2),), "i", False),  # SQL: a REAL
    ],
)
def test_values_it_does_not_read_as_sql_would_are_declined(tmp_path, update, terms, kinds, read):
    path = _build(tmp_path, 4096, 100, seed=5)
    # only row 40 can overflow a sum
    _execute(
        path, "UPDATE t SET a = a % 1000 WHERE rowid != 40", f"UPDATE t {update} WHERE rowid = 40"
    )
    df = _scan(path, "t", terms, ("x",), kinds)
    if read:
        assert df is not None
        assert df.rows() == _sqlite(
            path,
            "SELECT a FROM t ORDER BY rowid" if kinds == "i" else "SELECT b FROM t ORDER BY rowid",
        )
    else:
        assert df is None
    assert _scan(path, "t", terms, ("x",), kinds, (1, 39)) is not None  # the rows before it


def test_files_it_does_not_read_are_declined(tmp_path):
    path = _build(tmp_path, 4096, 500, seed=6)
    _execute(
        path,
        "CREATE TABLE w (k INTEGER PRIMARY KEY, v TEXT) WITHOUT ROWID",
        "INSERT INTO w VALUES (1, 'a')",
    )
    assert _scan(path, "w", ((0,),), ("k",), "i") is None  # an index B-tree
    assert kbtree.scan(str(path), 10**6, *ALL, ((0,),), ("a",), "i", -1, ()) is None
    assert kbtree.scan(str(tmp_path / "missing"), 2, *ALL, ((0,),), ("a",), "i", -1, ()) is None
    utf16 = tmp_path / "u16.sqlite"
    _execute(
        utf16,
        "PRAGMA encoding = 'UTF-16le'",
        "CREATE TABLE t (b TEXT)",
        "INSERT INTO t VALUES ('x')",
    )
    assert _scan(utf16, "t", ((0,),), ("b",), "s") is None
    cut = tmp_path / "cut.sqlite"
    data = path.read_bytes()
    cut.write_bytes(data[: len(data) // 2])
    root = _root(path, "t")
    out = kbtree.scan(str(cut), root, *ALL, ((0,), (1,)), ("a", "b"), "is", -1, ())
    assert out is None  # pages past the end


def test_damaged_pages_never_crash_it(tmp_path):
    """Random bytes over the table's pages: each scan returns a frame or declines, never
    crashes or loops (page numbers checked, the depth and the pages read bounded)."""
    path = _build(tmp_path, 512, 1500, seed=7)
    data = bytearray(path.read_bytes())
    root = _root(path, "t")
    rng = random.Random(8)
    declined = 0
    for k in range(60):
        bad = bytearray(data)
        for _ in range(1 + k % 8):
            at = rng.randrange(512, len(bad))
            bad[at] = rng.randrange(256)
        damaged = tmp_path / f"bad{k}.sqlite"
        damaged.write_bytes(bytes(bad))
        out = kbtree.scan(str(damaged), root, *ALL, ((0,), (1,)), ("a", "b"), "is", -1, ())
        declined += out is None
        damaged.unlink()
    assert declined > 0


def test_arguments_are_checked():
    with pytest.raises(ValueError, match="kind"):
        kbtree.scan("x", 2, *ALL, ((0,),), ("a",), "f", -1, ())
    with pytest.raises(ValueError, match="term"):
        kbtree.scan("x", 2, *ALL, ((-1,),), ("a",), "s", -1, ())  # the rowid is no text
    with pytest.raises(ValueError, match="term"):
        kbtree.scan("x", 2, *ALL, ((300,),), ("a",), "i", -1, ())
    with pytest.raises(ValueError):
        kbtree.scan("x", 2, *ALL, ((0,), (1,)), ("a",), "i", -1, ())
    with pytest.raises(TypeError):
        kbtree.scan("x", 2, *ALL, [(0,)], ("a",), "i", -1, ())


def _every_column(path) -> tuple[int, list[str]]:
    """Each integer or text column of every table in ``path`` (records as SQLite keeps them:
    no DEFAULT, no REAL affinity, no generated columns), page-read alone and compared with
    SQLite's own values. Returns the columns read and those declined; fails on any difference."""
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    con.text_factory = bytes
    read, declined = 0, []
    tables = con.execute("SELECT name, rootpage FROM sqlite_master WHERE type = 'table'")
    for name, root in tables.fetchall():
        table = name.decode()
        info = con.execute(f'PRAGMA table_xinfo("{table}")').fetchall()
        if any(r[6] for r in info):
            continue
        pk = [r for r in info if r[5]]
        alias = pk[0][1] if len(pk) == 1 and (pk[0][2] or b"").upper() == b"INTEGER" else None
        for cid, col, typ, _, default, _, _ in info:
            typ = (typ or b"").upper()
            real = b"INT" not in typ and any(t in typ for t in (b"REAL", b"FLOA", b"DOUB"))
            if default is not None or real:
                continue
            sel = f'SELECT "{col.decode()}" FROM "{table}" ORDER BY rowid'
            want = [v for (v,) in con.execute(sel)]
            kind = "s" if {type(v) for v in want if v is not None} == {bytes} else "i"
            term = -1 if col == alias else cid
            if kind == "s" and term == -1:
                continue
            out = kbtree.scan(str(path), root, *ALL, ((term,),), ("x",), kind, -1, ())
            if out is None:
                declined.append(f"{table}.{col.decode()}")
                continue
            got = pl.Series(ArrowTable(out[0])).to_list()
            assert got == [v.decode() if isinstance(v, bytes) else v for v in want], (table, col)
            read += 1
    con.close()
    return read, declined


def _sqlite_files(root) -> list:
    # the fixtures keep their exports packed (X.sqlite.xz): each read unpacked
    packed = [unpacked_db(p) for p in sorted(root.rglob("*.sqlite.xz"))]
    return sorted(root.rglob("*.sqlite")) + packed + sorted(root.rglob("*.db"))


def test_every_column_of_the_fixtures_exports_reads_as_sqlite_reads_it():
    """The SQLite files of fixtures/ (Nsight Systems exports and rocpd databases)."""
    read, declined = 0, []
    for path in _sqlite_files(FIXTURES):
        n, d = _every_column(path)
        read += n
        declined += d
    assert read > 1000  # 1,270 on the fixtures of 2026-12-06
    # text that is not UTF-8: an environment's binary protobuf, a cp1252 user name
    assert {d.split(".")[0] for d in declined} <= {"TARGET_INFO_SYSTEM_ENV", "EXPORT_META_DATA"}


def test_every_column_of_the_corpus_exports_reads_as_sqlite_reads_it():
    """The corpus's SQLite files (Nsight Systems 2021-2026.2 and rocpd): 5,719 columns with
    the fixtures' on 2026-12-06, all equal but 5 declined (text that is not UTF-8)."""
    paths = _sqlite_files(shared_or_skip())
    assert paths
    read, declined = 0, []
    for path in paths:
        n, d = _every_column(path)
        read += n
        declined += d
    assert read > 3000
    assert {d.split(".")[0] for d in declined} <= {"TARGET_INFO_SYSTEM_ENV", "EXPORT_META_DATA"}


def test_columns_read_otherwise_by_sql_are_not_page_read(tmp_path):
    """A whole float in a REAL column is stored as an integer and SQLite returns it as a float;
    a column with a DEFAULT reads that default in records older than the column: the export
    reader leaves both to SQL (parsers/nsys/db.py ``Db._layout``)."""
    from traceinsight.parsers.nsys.db import ROWID, Db

    path = tmp_path / "r.sqlite"
    _execute(
        path,
        "CREATE TABLE t (id INTEGER PRIMARY KEY, r REAL, x DOUBLE, i INTEGER, s TEXT)",
        "INSERT INTO t VALUES (5, 3.0, 2.0, 1, 'a')",
        "ALTER TABLE t ADD COLUMN d INTEGER DEFAULT 7",
    )
    assert _sqlite(path, "SELECT r, d FROM t") == [(3.0, 7)]
    raw = _scan(path, "t", ((1,),), ("r",), "i")
    assert raw is not None and raw.rows() == [(3,)]  # on disk: the integer 3
    db = Db(path, lambda df, offset: df)
    try:
        assert db._layout("t") == {"id": ROWID, "i": 3, "s": 4}
        frame = db.query(["id", "r", "d"], "t", {"a": pl.Int64, "b": pl.Int64, "c": pl.Int64})
        assert frame.result().rows() == [(5, 3, 7)]
    finally:
        db.close()


def test_a_query_past_the_readers_bounds_is_left_to_sql(tmp_path):
    """Record columns past the 256th (the reader's bound) are read through SQL, never an error."""
    from traceinsight.parsers.nsys.db import Db

    path = tmp_path / "wide.sqlite"
    cols = ", ".join(f"c{i} INTEGER" for i in range(300))
    _execute(path, f"CREATE TABLE t ({cols})", "INSERT INTO t (c0, c299) VALUES (1, 299)")
    db = Db(path, lambda df, offset: df)
    try:
        assert db._page_read("t", ["c0"], {"a": pl.Int64}, None) is not None
        assert db._page_read("t", ["c299"], {"a": pl.Int64}, None) is None
        assert db._page_read("t", ["c0"], {"a": pl.Int64}, ("c299", (1,))) is None
        rows = db.query(["c0", "c299"], "t", {"a": pl.Int64, "b": pl.Int64}).result()
        assert rows.rows() == [(1, 299)]
    finally:
        db.close()


def test_an_integer_primary_key_kept_apart_is_read_from_its_records(tmp_path):
    """``INTEGER PRIMARY KEY DESC`` is not the rowid (SQLite's documented quirk: it gets an
    index of its own and the records hold it); ``INTEGER PRIMARY KEY`` is."""
    from traceinsight.parsers.nsys.db import ROWID, Db

    path = tmp_path / "pk.sqlite"
    _execute(
        path,
        "CREATE TABLE a (id INTEGER PRIMARY KEY, v TEXT)",
        "CREATE TABLE d (id INTEGER PRIMARY KEY DESC, v TEXT)",
        "INSERT INTO a VALUES (7, 'x'), (9, 'y')",
        "INSERT INTO d VALUES (7, 'x'), (9, 'y')",
    )
    db = Db(path, lambda df, offset: df)
    try:
        assert db._layout("a") == {"id": ROWID, "v": 1}
        assert db._layout("d") == {"id": 0, "v": 1}
        for table in ("a", "d"):
            got = db.query(["id", "v"], table, {"id": pl.Int64, "v": pl.String}).result()
            assert got.rows() == _sqlite(path, f"SELECT id, v FROM {table} ORDER BY rowid")
    finally:
        db.close()
