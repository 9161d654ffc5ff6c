"""The native reader of SQLite rows (traceinsight/_native/ksqlite.c) against what SQLite holds:
integer and text columns with their nulls, read as sqlite3 reads them; every value of another
storage class, invalid UTF-8 and every SQLite error declined (None: parsers/nsys/db.py then
reads the query through ADBC or sqlite3)."""

from __future__ import annotations

import sqlite3

import polars as pl
import pytest

from traceinsight.native import ArrowTable, ksqlite

from .conftest import require_native

require_native(ksqlite, "traceinsight._ksqlite (the native SQLite reader)")


def _db(tmp_path, rows: list[tuple[object, ...]]) -> str:
    path = tmp_path / "t.sqlite"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE t (a INTEGER, b TEXT, c)")  # c: no type, any storage class
    con.executemany("INSERT INTO t VALUES (?, ?, ?)", rows)
    con.commit()
    con.close()
    return f"file:{path}?mode=ro"


def _fetch(uri: str, sql: str, names: tuple[str, ...], kinds: str) -> pl.DataFrame | None:
    out = ksqlite.fetch(uri, sql, names, kinds)
    return None if out is None else pl.DataFrame([pl.Series(ArrowTable(c)) for c in out])


def test_integers_text_and_nulls(tmp_path):
    rows = [
        (1, "aten::mm", 7),
        (None, None, None),
        (-(2**63), "ünïcödé ✓ 𝄞", 2**63 - 1),
        (0, "", -5),
        (42, "x" * 100_000, 3),  # longer than any buffer's first size
    ]
    uri = _db(tmp_path, rows)
    df = _fetch(uri, "SELECT a, b, c FROM t ORDER BY rowid", ("a", "b", "c"), "isi")
    assert df is not None
    assert df.schema == {"a": pl.Int64, "b": pl.String, "c": pl.Int64}
    assert df.rows() == rows


def test_expressions_and_empty_results(tmp_path):
    uri = _db(tmp_path, [(3, "a", 4), (5, None, 6)])
    df = _fetch(uri, "SELECT a + c, ifnull(b, char(1) || a) FROM t", ("s", "t"), "is")
    assert df is not None and df.rows() == [(7, "a"), (11, "\x015")]
    empty = _fetch(uri, "SELECT a, b FROM t WHERE a > 100", ("a", "b"), "is")
    assert empty is not None and empty.height == 0
    assert empty.schema == {"a": pl.Int64, "b": pl.String}


@pytest.mark.parametrize(
    ("value", "kind"),
    [
        (1.5, "i"),  # a REAL among integers
        (b"\x01\x02", "i"),  # a BLOB among integers
        ("12", "i"),  # text among integers
        (12, "s"),  # a number among text
        (b"abc", "s"),  # a BLOB among text
    ],
)
def test_other_storage_classes_are_declined(tmp_path, value, kind):
    uri = _db(tmp_path, [(1, "a", 1 if kind == "i" else "one"), (2, "b", value)])
    assert _fetch(uri, "SELECT c FROM t", ("c",), kind) is None
    # the row before it alone is read
    assert _fetch(uri, "SELECT c FROM t WHERE a = 1", ("c",), kind) is not None


def test_invalid_utf8_is_declined(tmp_path):
    uri = _db(tmp_path, [(1, "ok", 1)])
    con = sqlite3.connect(uri.removeprefix("file:").removesuffix("?mode=ro"))
    con.execute("INSERT INTO t VALUES (2, CAST(x'41ff42' AS TEXT), 2)")  # stored as TEXT
    con.commit()
    con.close()
    assert _fetch(uri, "SELECT b FROM t WHERE a = 1", ("b",), "s") is not None
    assert _fetch(uri, "SELECT b FROM t", ("b",), "s") is None


def test_sqlite_errors_are_declined(tmp_path):
    uri = _db(tmp_path, [(1, "a", 1)])
    assert _fetch(uri, "SELECT nope FROM t", ("a",), "i") is None  # no such column
    assert _fetch(uri, "SELECT a, b FROM t", ("a",), "i") is None  # another column count
    missing = f"file:{tmp_path / 'missing.sqlite'}?mode=ro"
    assert _fetch(missing, "SELECT 1", ("a",), "i") is None
    not_db = tmp_path / "x.sqlite"
    not_db.write_bytes(b"not a database" * 100)
    assert _fetch(f"file:{not_db}?mode=ro", "SELECT a FROM t", ("a",), "i") is None


def test_read_only(tmp_path):
    """The connection writes nothing: a statement that would is declined, the file unchanged."""
    uri = _db(tmp_path, [(1, "a", 1)])
    path = tmp_path / "t.sqlite"
    before = path.read_bytes()
    assert _fetch(uri, "DELETE FROM t RETURNING a", ("a",), "i") is None
    assert path.read_bytes() == before


def test_each_column_owns_its_buffers(tmp_path):
    """Each column comes as an array of its own: dropping one frees its buffers while another
    lives (a struct of them all would keep every column while the text column lives)."""
    uri = _db(tmp_path, [(i, f"name {i}", i) for i in range(1000)])
    out = ksqlite.fetch(uri, "SELECT a, b FROM t", ("a", "b"), "is")
    assert isinstance(out, tuple) and len(out) == 2
    assert all(isinstance(c, tuple) and len(c) == 2 for c in out)
    a, b = (pl.Series(ArrowTable(c)) for c in out)
    assert a.name == "a" and b.name == "b"
    assert a.to_list() == list(range(1000))
    del a
    assert b[999] == "name 999"


def test_bad_arguments_raise():
    with pytest.raises(ValueError):
        ksqlite.fetch("file:x?mode=ro", "SELECT 1", ("a", "b"), "i")
    with pytest.raises(ValueError):
        ksqlite.fetch("file:x?mode=ro", "SELECT 1", ("a",), "f")
    with pytest.raises(TypeError):
        ksqlite.fetch("file:x?mode=ro", "SELECT 1", ["a"], "i")
