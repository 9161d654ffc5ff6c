"""Nsight Systems exports archived packed (report.sqlite.xz / .sqlite.gz) are read directly:
unpacked into a private temporary file (SQLite reads only files), the input untouched, the
result the same as the unpacked export's, a damaged or oversized one refused in one line."""

from __future__ import annotations

import gzip
import hashlib
import lzma
import shutil
from pathlib import Path

import orjson
import pytest

import traceinsight
from traceinsight.cli import main
from traceinsight.errors import EXIT_BAD_INPUT, InputError
from traceinsight.inputs import discover_rank_files
from traceinsight.parsers import PACKED_SQLITE, detect_format, load_trace

from .conftest import FIXTURES, unpacked_db

MOCK = FIXTURES / "nsys" / "nsys-ai__mock.sqlite.xz"


def _doc(path: Path) -> bytes:
    doc = traceinsight.analyze(path).to_json()
    return orjson.dumps(doc).replace(str(path).encode(), b"PATH")


def test_packed_export_reads_as_the_export(tmp_path: Path) -> None:
    raw = unpacked_db(MOCK)
    gz = tmp_path / "nsys-ai__mock.sqlite.gz"
    gz.write_bytes(gzip.compress(raw.read_bytes()))
    assert detect_format(MOCK) == detect_format(gz) == PACKED_SQLITE
    assert detect_format(raw) == "nsys-sqlite"
    want = _doc(raw)
    assert _doc(MOCK) == want and _doc(gz) == want
    t = load_trace(MOCK)
    assert t.meta.source_path == str(MOCK) and t.meta.format == "nsys-sqlite"


def test_input_untouched_and_no_temporary_left(tmp_path: Path, monkeypatch) -> None:
    src = tmp_path / "r.sqlite.xz"
    shutil.copy(MOCK, src)
    before = hashlib.sha256(src.read_bytes()).hexdigest()
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)  # TMPDIR read again
    load_trace(src)
    assert hashlib.sha256(src.read_bytes()).hexdigest() == before
    assert list(scratch.iterdir()) == []  # the unpacked copy removed


def test_truncated_packed_export_refused_naming_the_input(tmp_path: Path, capsys) -> None:
    data = MOCK.read_bytes()
    cut = tmp_path / "cut.sqlite.xz"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(InputError) as exc:
        load_trace(cut)
    assert exc.value.path == str(cut) and "ends early" in exc.value.message
    assert main(["analyze", str(cut), "--no-html", "-q"]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(cut) in err[0] and "Traceback" not in err[0]


def test_packed_database_over_the_size_limit_refused(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="decompresses to more than"):
        load_trace(MOCK, max_bytes=100_000)  # the export is 364,544 bytes unpacked


def test_packed_non_trace_database_names_the_input(tmp_path: Path) -> None:
    import sqlite3

    db = tmp_path / "other.sqlite"
    con = sqlite3.connect(db)
    con.execute("CREATE TABLE t (x)")
    con.commit()
    con.close()
    packed = tmp_path / "other.sqlite.xz"
    packed.write_bytes(lzma.compress(db.read_bytes()))
    with pytest.raises(InputError) as exc:
        load_trace(packed)
    assert exc.value.path == str(packed)
    assert "unpacked" not in str(exc.value)  # never the temporary file's name


def test_job_directory_finds_packed_exports(tmp_path: Path) -> None:
    shutil.copy(MOCK, tmp_path / "rank0.sqlite.xz")
    (tmp_path / "notes.txt").write_text("x")
    assert [p.name for p in discover_rank_files(tmp_path)] == ["rank0.sqlite.xz"]
