"""Nsight Systems exports: numbers cross-checked with plain SQL written independently here."""

import hashlib
import sqlite3

import polars as pl
import pytest

from traceinsight.cli import main
from traceinsight.errors import InputError
from traceinsight.parsers import load_trace

from .conftest import FIXTURES, SHARED, analyzed, shared_or_skip, unpacked_db

NSYS = FIXTURES / "nsys"


def sql(path, q):
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return con.execute(q).fetchall()
    finally:
        con.close()


@pytest.mark.parametrize(
    "name", ["nsys-ai__mock.sqlite", "nsys-ai__mfu_2gpu_after.sqlite", "Mordred__report1.sqlite"]
)
def test_counts_and_times_match_sql(name):
    path = unpacked_db(NSYS / name)
    ev = load_trace(path).events
    k = ev.filter(pl.col("kind") == "kernel")
    n, total = sql(path, "SELECT COUNT(*), SUM(end - start) FROM CUPTI_ACTIVITY_KIND_KERNEL")[0]
    assert k.height == n and int(k["dur_ns"].sum()) == total
    by_kind = dict(
        sql(
            path,
            "SELECT srcKind, SUM(bytes) FROM CUPTI_ACTIVITY_KIND_MEMCPY WHERE copyKind = 1 GROUP BY srcKind",
        )
    )
    h2d = ev.filter(pl.col("copy_kind") == "HtoD")
    got = {
        str(kk): int(v) for kk, v in h2d.group_by("src_kind").agg(pl.col("bytes").sum()).iter_rows()
    }
    names = {0: "pageable", 1: "pinned", 2: "device", 4: "managed"}
    assert got == {names[kk]: v for kk, v in by_kind.items()}


def test_nccl_kernels_and_two_key_correlation():
    path = unpacked_db(NSYS / "nsys-ai__mfu_2gpu_after.sqlite")
    want = sql(
        path,
        "SELECT COUNT(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.shortName WHERE s.value LIKE 'nccl%'",
    )[0][0]
    t = load_trace(path)
    assert t.events.filter(pl.col("kernel_class") == "communication").height == want > 0
    assert sorted(t.events["rank"].unique().to_list()) == [0, 1]
    # kernel -> launch join on (process, correlationId), as NVIDIA's own reports do
    joined = sql(
        path,
        "SELECT COUNT(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN CUPTI_ACTIVITY_KIND_RUNTIME r "
        "ON r.correlationId = k.correlationId AND k.globalPid = (r.globalTid & ~16777215)",
    )[0][0]
    from traceinsight.analyzers.context import launch_join

    lj = launch_join(t.events).filter(
        (pl.col("kind") == "kernel") & pl.col("launch_start_ns").is_not_null()
    )
    assert lj.height == joined


def test_input_bytes_unchanged(tmp_path):
    path = unpacked_db(NSYS / "nsys-ai__mfu_2gpu_after.sqlite")
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    assert main(["analyze", str(path), "-o", str(tmp_path / "r.html"), "-q"]) == 0
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before
    assert not list(path.parent.glob("*-journal")) and not list(path.parent.glob("*-wal"))


def test_not_an_nsys_export(tmp_path):
    p = tmp_path / "other.sqlite"
    con = sqlite3.connect(p)
    con.execute("CREATE TABLE t (x)")
    con.commit()
    con.close()
    with pytest.raises(InputError, match="not an Nsight Systems export"):
        load_trace(p)
    bad = tmp_path / "corrupt.sqlite"
    bad.write_bytes(b"SQLite format 3\x00" + b"\x00garbage" * 100)
    assert main(["analyze", str(bad), "--no-html"]) == 2


def test_old_layout_devices():
    t = load_trace(unpacked_db(NSYS / "Mordred__report1.sqlite"))
    assert t.meta.devices and t.meta.devices[0].name == "Quadro RTX 6000"
    assert "no export metadata" in t.meta.format_version


def all_exports():
    d = SHARED / "nsys"
    return sorted(d.glob("*.sqlite")) if d.is_dir() else []


@pytest.mark.parametrize(
    "path", all_exports() or [None], ids=lambda p: p.name if p else "corpus-absent"
)
def test_every_shared_export(path, tmp_path):
    shared_or_skip()
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    assert main(["analyze", str(path), "--no-html", "-q", "--json", str(tmp_path / "o.json")]) == 0
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before


def test_nsys_rep_without_nsys_says_how_to_export(tmp_path, capsys, monkeypatch):
    import shutil as _sh

    monkeypatch.setattr(_sh, "which", lambda name: None)
    rep = tmp_path / "profile.nsys-rep"
    rep.write_bytes(b"\x00binary report")
    assert main(["analyze", str(rep), "--no-html"]) == 2
    err = capsys.readouterr().err
    assert "nsys export --type sqlite" in err and len(err.strip().splitlines()) == 1


def test_step_range_from_nvtx(tmp_path):
    """--step-range makes every NVTX range of that name a step: the 2-GPU export has 30
    ``ncclGroupStart`` ranges per process (counted and timed by SQL here), so 30 steps per rank
    less the first, which ends while work queued before it runs (29); one step per distinct
    name would give 1, an ignored --step-range 0 (no ProfilerStep ranges)."""
    import json

    from traceinsight.analyzers.context import build_context
    from traceinsight.model.schema import Trace, by_rank

    path = unpacked_db(NSYS / "nsys-ai__mfu_2gpu_after.sqlite")
    (session,) = sql(path, "SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME")[0]
    rows = sql(
        path,
        "SELECT (n.globalTid >> 24) & 16777215, n.start FROM NVTX_EVENTS n LEFT JOIN StringIds s ON s.id = n.textId "
        "WHERE COALESCE(n.text, s.value) = 'ncclGroupStart' AND n.eventType IN (59, 60) ORDER BY n.start",
    )
    want: dict[int, list[int]] = {}
    for pid, start in rows:
        want.setdefault(pid, []).append(session + start)
    assert sorted(len(v) for v in want.values()) == [30, 30]
    trace = load_trace(path)
    got = {}
    for rank, events in by_rank(trace.events):
        steps = build_context(Trace(events=events, meta=trace.meta), "^ncclGroupStart").steps
        # repeated names: numbered in time order; the first range (0.4 us) ends while work
        # queued before it still runs (0.27 ms on): its aligned start is its end, no time, no
        # step (session 57)
        assert steps["step"].to_list() == list(range(1, 30))
        got[rank] = steps["host_start_ns"].to_list()
    assert sorted(got.values()) == sorted(v[1:] for v in want.values())

    out = tmp_path / "o.json"
    args = ["analyze", str(path), "--no-html", "-q", "--json", str(out)]
    assert main([*args, "--step-range", "ncclGroupStart"]) == 0
    per_rank = json.loads(out.read_text())["metrics"]["per_rank"]
    assert {r: m["steps"] for r, m in per_rank.items()} == {"0": 29, "1": 29}
    assert main([*args, "--force"]) == 0
    assert {m["steps"] for m in json.loads(out.read_text())["metrics"]["per_rank"].values()} == {0}


FAKE_NSYS = """#!{python}
# Stands in for Nsight Systems' CLI: 'profile ... -o STEM CMD...' runs CMD and writes STEM.sqlite,
# 'export --type sqlite -o OUT REPORT' writes OUT; both copy a real export.
import shutil, subprocess, sys
args = sys.argv[1:]
out = args[args.index("-o") + 1]
if args[0] == "profile":
    cmd = args[args.index("true") + 1:] if "true" in args else []
    subprocess.call(cmd)
    shutil.copy({src!r}, out + ".sqlite")
elif args[0] == "export":
    shutil.copy({src!r}, out)
"""


def _fake_nsys(tmp_path, monkeypatch):
    import os
    import sys

    bindir = tmp_path / "bin"
    bindir.mkdir()
    exe = bindir / "nsys"
    exe.write_text(
        FAKE_NSYS.format(python=sys.executable, src=str(unpacked_db(NSYS / "nsys-ai__mock.sqlite")))
    )
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")


def test_profile_with_nsys_orchestration(tmp_path, monkeypatch, capsys):
    import sys

    _fake_nsys(tmp_path, monkeypatch)
    marker = tmp_path / "ran.txt"
    rc = main(
        [
            "profile",
            "--with",
            "nsys",
            "--out",
            str(tmp_path / "t"),
            "--",
            sys.executable,
            "-c",
            f"open({str(marker)!r}, 'w').write('x')",
        ]
    )
    assert rc == 0 and marker.exists()  # the command ran under "nsys profile"
    assert list((tmp_path / "t").glob("*.sqlite")) and list(
        (tmp_path / "t").glob("*.traceinsight.html")
    )
    assert "GPU busy" in capsys.readouterr().out


def test_nsys_rep_is_exported_then_analyzed(tmp_path, monkeypatch):
    _fake_nsys(tmp_path, monkeypatch)
    rep = tmp_path / "profile.nsys-rep"
    rep.write_bytes(b"\x00binary report")
    out = tmp_path / "r.json"
    assert main(["analyze", str(rep), "--no-html", "-q", "--json", str(out)]) == 0
    import json

    doc = json.loads(out.read_text())
    assert doc["source"]["path"] == str(rep) and doc["source"]["format"] == "nsys-sqlite"
    assert doc["source"]["event_counts"]["kernel"] == 2


def test_times_are_aligned_to_session_start():
    """Ranks exported separately line up: session-relative ns + TARGET_INFO_SESSION_START_TIME."""
    path = unpacked_db(NSYS / "nsys-ai__mfu_2gpu_after.sqlite")
    start = sql(path, "SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME")[0][0]
    first = sql(path, "SELECT MIN(start) FROM CUPTI_ACTIVITY_KIND_KERNEL")[0][0]
    ev = load_trace(path).events.filter(pl.col("kind") == "kernel")
    assert int(ev["start_ns"].min()) == start + first
    old = load_trace(unpacked_db(NSYS / "Mordred__report1.sqlite"))  # 2021: no session table
    assert any("relative to the capture start" in w for w in old.meta.warnings)


def test_ts_normalized_export_is_not_shifted_again(tmp_path):
    """``nsys export --ts-normalize=true`` writes UTC ns (the session start added,
    EXPORT_CONFIG_TIME_SHIFT): adding the session start again moved each rank of a 9-rank NCCL
    job by its own start (193.5 ms apart) and named the wrong straggler (a public job, session
    34's audit). The same export with its times made absolute and the flag set gives the same
    absolute times as the session-relative one."""
    import shutil

    src = unpacked_db(NSYS / "nsys-ai__mfu_2gpu_after.sqlite")
    path = tmp_path / "normalized.sqlite"
    shutil.copy(src, path)
    start = sql(src, "SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME")[0][0]
    con = sqlite3.connect(path)
    tables = [t for (t,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    for t in tables:
        cols = {c[1] for c in con.execute(f"PRAGMA table_info({t})")}
        if t.startswith(("CUPTI_ACTIVITY_KIND_", "NVTX_EVENTS")) and {"start", "end"} <= cols:
            con.execute(f"UPDATE {t} SET start = start + ?, end = end + ?", (start, start))
    if "META_DATA_EXPORT" not in tables:
        con.execute("CREATE TABLE META_DATA_EXPORT (name TEXT, value TEXT)")
    con.executemany(
        "INSERT INTO META_DATA_EXPORT (name, value) VALUES (?, ?)",
        [("EXPORT_PARAM_TIME_NORMALIZE", "true"), ("EXPORT_CONFIG_TIME_SHIFT", str(start))],
    )
    con.commit()
    con.close()
    want = load_trace(src).events.filter(pl.col("kind") == "kernel")["start_ns"]
    got = load_trace(path).events.filter(pl.col("kind") == "kernel")["start_ns"]
    first = sql(src, "SELECT MIN(start) FROM CUPTI_ACTIVITY_KIND_KERNEL")[0][0]
    assert int(got.min()) == int(want.min()) == start + first
    assert got.to_list() == want.to_list()


@pytest.mark.parametrize("name", ["nsys-ai__mfu_2gpu_after.sqlite", "Mordred__report1.sqlite"])
def test_page_native_adbc_and_sqlite3_fetch_agree(name, monkeypatch):
    """Each fetch path is taken in turn (the page reader and the native row reader where they
    are built, ADBC, sqlite3) and all give the same table."""
    import traceinsight.parsers.nsys.db as nsys

    path = unpacked_db(NSYS / name)
    taken = {"pages": [], "native": [], "adbc": []}

    def spying(key, real):
        def spy(*args):
            out = real(*args)
            taken[key].append(out is not None)
            return out

        return spy

    monkeypatch.setattr(nsys, "read_pages", spying("pages", nsys.read_pages))
    monkeypatch.setattr(nsys, "fetch_native", spying("native", nsys.fetch_native))
    monkeypatch.setattr(nsys, "fetch_adbc", spying("adbc", nsys.fetch_adbc))
    pages = load_trace(path).events
    if nsys.kbtree is not None:  # the activity tables and names are plain columns: page-read
        assert taken["pages"] and all(taken["pages"]) and not taken["adbc"]
        assert len(taken["native"]) < len(taken["pages"])  # only the queries with SQL in them
    monkeypatch.setattr(nsys, "kbtree", None)
    taken["native"].clear()
    native = load_trace(path).events
    if nsys.ksqlite is not None:  # every fetch went through the native row reader
        assert taken["native"] and all(taken["native"]) and not taken["adbc"]
    monkeypatch.setattr(nsys, "ksqlite", None)
    adbc = load_trace(path).events
    assert taken["adbc"] and all(taken["adbc"])  # every fetch then went through ADBC
    monkeypatch.setattr(nsys, "fetch_adbc", lambda uri, q: None)
    slow = load_trace(path).events
    assert pages.equals(native)
    assert native.equals(adbc)
    assert adbc.equals(slow)


def test_pages_are_read_only_under_sqlites_shared_lock(tmp_path, monkeypatch):
    """While an export is being read, no writer commits to it (the reader holds SQLite's
    shared lock); with a rollback journal beside it (a writer died mid-commit: SQLite would roll
    it back first) the pages are not read at all, SQLite reads every query."""
    import shutil

    import traceinsight.parsers.nsys.db as nsys

    path = tmp_path / "held.sqlite"
    shutil.copy(unpacked_db(NSYS / "nsys-ai__mock.sqlite"), path)
    db = nsys.Db(path, lambda df, offset: df)
    try:
        assert db.pages_readable == (nsys.kbtree is not None)
        writer = sqlite3.connect(path, timeout=0)
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            writer.execute("DELETE FROM StringIds")
            writer.commit()
        writer.close()
    finally:
        db.close()
    whole = load_trace(path).events
    (tmp_path / "held.sqlite-journal").write_bytes(b"\0" * 512)
    db = nsys.Db(path, lambda df, offset: df)
    assert not db.pages_readable
    db.close()
    read = []
    monkeypatch.setattr(nsys, "read_pages", lambda *a: read.append(a))
    assert load_trace(path).events.equals(whole) and not read


def test_rowid_range_parts_give_the_same_table(monkeypatch):
    """Big tables are fetched as rowid ranges on two threads; the table must not change. Parts
    of 997 rows: the export's kernel, runtime and NVTX tables (3587, 6682 and 17113 rows) come
    in 4, 7 and 18 parts, the last of each a partial one."""
    import traceinsight.parsers.nsys.db as nsys

    path = unpacked_db(NSYS / "nsys-ai__mfu_2gpu_after.sqlite")
    whole = load_trace(path).events
    monkeypatch.setattr(nsys, "ROWS_PER_PART", 997)
    parts = load_trace(path).events
    assert parts.equals(whole)


def test_emit_nvtx_decorations_are_stripped():
    """emit_nvtx ranges keep their count but are named by their op, as in Kineto."""
    from traceinsight.parsers.nsys import strip_emit_nvtx

    names = {
        "aten::mul, seq = 7, op_id = 12, sizes = [[8, 4]]": "aten::mul",
        "aten::lift_fresh, op_id = 993403": "aten::lift_fresh",
        "my range, with comma": "my range, with comma",
        "a, b, sizes = [[1]]": "a, b",  # the first decoration, after a comma of the name
        "ünïcode op, stashed seq = 3": "ünïcode op",  # a byte offset cut as bytes
        "q, seq = 1\nmore": "q",
        "": "",
        None: None,
    }
    got = (
        pl.select(strip_emit_nvtx(pl.lit(pl.Series(list(names), dtype=pl.String))))
        .to_series()
        .to_list()
    )
    assert got == list(names.values())
    path = unpacked_db(NSYS / "nsys-ai__mfu_2gpu_after.sqlite")
    ev = load_trace(path).events.filter(pl.col("kind") == "user_annotation")
    (n,) = sql(
        path,
        "SELECT COUNT(*) FROM NVTX_EVENTS WHERE eventType IN (59, 60) AND end IS NOT NULL AND end >= start AND COALESCE(text, textId) IS NOT NULL",
    )[0]
    assert ev.height == n
    assert not ev["name"].str.contains(", op_id = |, seq = ").any()
    decorated = sql(path, "SELECT COUNT(*) FROM NVTX_EVENTS WHERE text LIKE '%, op_id = %'")[0][0]
    assert decorated > 0  # the fixture really has emit_nvtx ranges


def test_nccl_nvtx_domain_names_its_ranges(tmp_path):
    """Ranges in NCCL's own NVTX domain become nccl:<range>; other domains' ranges do not.
    No corpus export has that domain, so a copy of one gets a domain and two ranges added."""
    import shutil

    path = tmp_path / "with_nccl_domain.sqlite"
    shutil.copy(unpacked_db(NSYS / "nsys-ai__mfu_2gpu_after.sqlite"), path)
    con = sqlite3.connect(path)
    (tid, start) = con.execute(
        "SELECT globalTid, start FROM NVTX_EVENTS WHERE eventType = 59 LIMIT 1"
    ).fetchone()
    con.executemany(
        "INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid, domainId) VALUES (?, ?, ?, ?, ?, ?)",
        [
            (start, None, 75, "NCCL", tid, 7),
            (start, start + 500, 59, "ncclAllReduce", tid, 7),
            (start, None, 75, "MyLib", tid, 8),
            (start, start + 400, 59, "my_op", tid, 8),
        ],
    )
    con.commit()
    con.close()
    names = load_trace(path).events.filter(pl.col("kind") == "user_annotation")["name"]
    assert "nccl:ncclAllReduce" in names.to_list()
    assert "my_op" in names.to_list() and "nccl:my_op" not in names.to_list()
    assert (
        "NCCL" not in names.to_list() and "MyLib" not in names.to_list()
    )  # domain rows are not ranges


def test_nvtx_registered_strings_and_dropped_rows(tmp_path):
    """NVTX names come from the inline text or, for registered strings, from StringIds (fetched
    as a marker plus the id in the same column); marks, unclosed and backwards ranges and ids
    with no string are left out."""
    import shutil

    path = tmp_path / "registered.sqlite"
    shutil.copy(unpacked_db(NSYS / "nsys-ai__mfu_2gpu_after.sqlite"), path)
    con = sqlite3.connect(path)
    (tid, start) = con.execute(
        "SELECT globalTid, start FROM NVTX_EVENTS WHERE eventType = 59 LIMIT 1"
    ).fetchone()
    (sid,) = con.execute("SELECT MAX(id) + 1 FROM StringIds").fetchone()
    con.execute("INSERT INTO StringIds (id, value) VALUES (?, ?)", (sid, "registered range"))
    con.executemany(
        "INSERT INTO NVTX_EVENTS (start, end, eventType, text, textId, globalTid) VALUES (?, ?, ?, ?, ?, ?)",
        [
            (start, start + 300, 59, None, sid, tid),  # a registered string
            (start, start + 250, 60, None, sid + 1000, tid),  # an id with no string: dropped
            (
                start,
                start + 200,
                59,
                "\x01not an id",
                None,
                tid,
            ),  # starts with the marker, kept as is
            (start, None, 59, "unclosed", None, tid),
            (start, start - 5, 59, "backwards", None, tid),
            (start, None, 34, "a mark", None, tid),
        ],
    )
    con.commit()
    con.close()
    before = load_trace(unpacked_db(NSYS / "nsys-ai__mfu_2gpu_after.sqlite")).events.filter(
        pl.col("kind") == "user_annotation"
    )
    ev = load_trace(path).events.filter(pl.col("kind") == "user_annotation")
    assert ev.height == before.height + 2
    added = ev.filter(pl.col("name").is_in(["registered range", "\x01not an id"]))
    assert sorted(added.select("name", "dur_ns").rows()) == [
        ("\x01not an id", 200),
        ("registered range", 300),
    ]
    for dropped in ("unclosed", "backwards", "a mark"):
        assert dropped not in ev["name"].to_list()


def test_text_and_blob_values_in_number_columns(tmp_path, monkeypatch):
    """SQLite keeps any value in any column; a BLOB in correlationId made ADBC return the column
    as bytes and the analysis fail with exit 1 (found by tests/test_fuzz_new_inputs.py). Such
    values become null, on both fetch paths; the other rows keep their values (read by SQL)."""
    import shutil

    import traceinsight.parsers.nsys.db as nsys

    path = tmp_path / "mixed.sqlite"
    shutil.copy(unpacked_db(NSYS / "nsys-ai__mock.sqlite"), path)
    con = sqlite3.connect(path)
    update = "UPDATE CUPTI_ACTIVITY_KIND_RUNTIME SET correlationId = {} WHERE correlationId = {}"
    con.execute(update.format("x''", 143))
    con.execute(update.format("'x'", 159))
    # a string stored as a BLOB, and a number, in the names' table
    con.execute("INSERT INTO StringIds (id, value) VALUES (100000, x'6e6f7420757365'), (100001, 7)")
    con.commit()
    con.close()
    ids = sql(path, "SELECT correlationId FROM CUPTI_ACTIVITY_KIND_RUNTIME")
    want = sorted(c for (c,) in ids if isinstance(c, int))
    fast = load_trace(path).events
    monkeypatch.setattr(nsys, "ksqlite", None)
    adbc = load_trace(path).events
    monkeypatch.setattr(nsys, "fetch_adbc", lambda uri, q: None)
    slow = load_trace(path).events
    assert fast.equals(adbc)
    assert fast.equals(slow)
    runtime = fast.filter(pl.col("kind").is_in(["runtime", "driver"]))  # the table holds both
    assert sorted(runtime["correlation"].drop_nulls().to_list()) == want
    assert runtime["correlation"].null_count() == 2
    names = "SELECT s.value FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.demangledName"
    kernels = sorted(v for (v,) in sql(path, names))
    assert sorted(fast.filter(pl.col("kind") == "kernel")["name"].to_list()) == kernels


def test_an_api_calls_echo_row_is_dropped():
    """Audit 13: exports of about 2021-2022 record each runtime call twice, cudaMalloc_v3020
    (event class 0) and a plain cudaMalloc of class 67 with the same correlation id: an extrap
    export read "runtime 36" for 18 calls. One row a call: the plain one (the backtraces are
    keyed to it); a call recorded once stays whatever its class."""
    from traceinsight.parsers.nsys.tables import _without_echoes

    df = pl.DataFrame(
        {
            "correlation": [410, 410, 411, 411, 500, 600],
            "event_class": [67, 0, 67, 0, 67, 0],
            "start_ns": [1, 2, 10, 11, 20, 30],
        }
    )
    kept = _without_echoes(df)
    assert kept.get_column("correlation").to_list() == [410, 411, 500, 600]
    assert kept.get_column("event_class").to_list() == [67, 67, 67, 0]


def test_the_saxpy_exports_echo_rows_are_not_calls():
    import sqlite3

    path = shared_or_skip() / "nsys" / "pipit__saxpy-mpi-cuda_nsys_perlmutter0.sqlite"
    con = sqlite3.connect(path)
    (calls,) = con.execute(
        "SELECT count(DISTINCT correlationId) FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE eventClass = 0"
    ).fetchone()
    (echoes,) = con.execute(
        "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE eventClass = 67"
    ).fetchone()
    assert (calls, echoes) == (56, 38)
    assert analyzed(path).source["event_counts"]["runtime"] == calls
