"""Property-based pass over the source-attribution inputs: nsys backtrace tables (CUDA_CALLCHAINS, OSRT_API
with OSRT_CALLCHAINS, COMPOSITE_EVENTS with SAMPLING_CALLCHAINS), DIAGNOSTIC_EVENT messages,
Kineto's logged WARNING/ERROR lines, and ``annotate`` of hostile traces (the annotated output
must be strict JSON and analyze again).

The property: exit 0 with valid output, or 2 with one clean stderr line; never a traceback.
CI runs a small derandomized budget; ``TRACEINSIGHT_FUZZ_NEW=2000`` runs a longer random pass.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from traceinsight.cli import main

from .conftest import FIXTURES, raw_json, unpacked_db
from .test_fuzz_new_inputs import (
    LONG,
    SETTINGS,
    TRIED,
    check_cli,
    count,
    kineto_trace,
    new_events,
    sql_any,
    sql_int,
    weird,
)

BASES = [
    unpacked_db(FIXTURES / "nsys" / "nsys-ai__mock.sqlite"),
    unpacked_db(FIXTURES / "nsys" / "Mordred__report1.sqlite"),
]
DDL = {
    "CUDA_CALLCHAINS": "(id INTEGER, symbol INTEGER, module INTEGER, unresolved INTEGER, "
    "originalIP INTEGER, stackDepth INTEGER)",
    "OSRT_CALLCHAINS": "(id INTEGER, symbol INTEGER, module INTEGER, kernelMode INTEGER, "
    "thumbCode INTEGER, unresolved INTEGER, specialEntry INTEGER, originalIP INTEGER, "
    "unwindMethod INTEGER, stackDepth INTEGER)",
    "SAMPLING_CALLCHAINS": "(id INTEGER, symbol INTEGER, module INTEGER, kernelMode INTEGER, "
    "thumbCode INTEGER, unresolved INTEGER, specialEntry INTEGER, originalIP INTEGER, "
    "unwindMethod INTEGER, stackDepth INTEGER)",
    "OSRT_API": "(start INTEGER, end INTEGER, eventClass INTEGER, globalTid INTEGER, "
    "nameId INTEGER, returnValue INTEGER, nestingLevel INTEGER, callchainId INTEGER)",
    "COMPOSITE_EVENTS": "(id INTEGER, start INTEGER, cpu INTEGER, threadState INTEGER, "
    "globalTid INTEGER, cpuCycles INTEGER)",
    "DIAGNOSTIC_EVENT": "(timestamp INTEGER, timestampType INTEGER, source INTEGER, "
    "severity INTEGER, text TEXT, globalPid INTEGER)",
}
SYMBOLS = [
    "main",
    "0x7f72b460a58d",
    "cudaStreamSynchronize",
    "cudaError cudaMalloc<double>(double**, unsigned long)",
    "void thrust::detail::wrapped_function<graupel(int)::{lambda(int)#1}, void>(",
    "clover::par_ranged2(int) const",
    "__cudart1050",
    "_start",
    "",
    "((((<<<<",
]
MODULES = [
    "/usr/lib64/libcuda.so.1",
    "/home/u/app",
    "[kernel.kallsyms]",
    "",
    "/x/site-packages/a.so",
]
GTID = 283004824020018  # the mock export's host thread
frame = st.tuples(
    st.integers(0, 6) | sql_any,  # id
    st.integers(0, len(SYMBOLS) - 1) | sql_any,  # symbol (a string id, offset below)
    st.integers(0, len(MODULES) - 1) | sql_any,  # module
    st.integers(0, 8) | sql_any,  # stackDepth
)
near = st.integers(1_300_000_000, 1_560_000_000) | sql_int
event = st.tuples(near, st.integers(-1_000, 50_000_000) | sql_any, st.integers(0, 6) | sql_any)
# each example analyzes a whole export or trace: a smaller CI budget than the parsers' own pass
FEW = settings(SETTINGS, max_examples=LONG or 6)
message = st.sampled_from(
    ["3 CUDA events were dropped.", "Profiling has stopped.", "buffers full", "lost 2**70 records"]
) | st.text(max_size=20)


def export(tmp: Path, base: Path, tables: dict[str, list[tuple]], cuda: list[tuple]) -> Path:
    p = tmp / "b.sqlite"
    shutil.copy(base, p)
    con = sqlite3.connect(p)

    def run(sql: str, row: tuple = ()) -> None:
        with contextlib.suppress(sqlite3.IntegrityError, sqlite3.OperationalError, OverflowError):
            con.execute(sql, row)

    (sid,) = con.execute("SELECT COALESCE(MAX(id), 0) + 1 FROM StringIds").fetchone()
    for i, s in enumerate(SYMBOLS + MODULES):
        run("INSERT INTO StringIds (id, value) VALUES (?, ?)", (sid + i, s))

    def sym(v: Any, offset: int) -> Any:
        return sid + offset + v if isinstance(v, int) and not isinstance(v, bool) else v

    for t, ddl in DDL.items():
        run(f"CREATE TABLE IF NOT EXISTS {t} {ddl}")
    for t in ("CUDA_CALLCHAINS", "OSRT_CALLCHAINS", "SAMPLING_CALLCHAINS"):
        for cid, s, m, depth in tables.get(t, []):
            run(
                f"INSERT INTO {t} (id, symbol, module, stackDepth) VALUES (?, ?, ?, ?)",
                (cid, sym(s, 0), sym(m, len(SYMBOLS)), depth),
            )
    for start, length, cid in tables.get("OSRT_API", []):
        end = start + length if isinstance(length, int) else length
        run(
            "INSERT INTO OSRT_API (start, end, eventClass, globalTid, nameId, returnValue, "
            "callchainId) VALUES (?, ?, 27, ?, ?, 0, ?)",
            (start, end, GTID, sid, cid),
        )
    for start, _length, cid in tables.get("COMPOSITE_EVENTS", []):
        run(
            "INSERT INTO COMPOSITE_EVENTS (id, start, globalTid, cpuCycles) VALUES (?, ?, ?, 0)",
            (cid, start, GTID),
        )
    for (text,) in tables.get("DIAGNOSTIC_EVENT", []):
        run("INSERT INTO DIAGNOSTIC_EVENT (timestamp, severity, text) VALUES (0, 2, ?)", (text,))
    run("ALTER TABLE CUPTI_ACTIVITY_KIND_RUNTIME ADD COLUMN callchainId INTEGER")
    for start, length, cid in cuda:  # syncs with a stack
        end = start + length if isinstance(length, int) and isinstance(start, int) else length
        run(
            "INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME (start, end, eventClass, globalTid, "
            "correlationId, nameId, returnValue, callchainId) VALUES (?, ?, 0, ?, 0, ?, 0, ?)",
            (start, end, GTID, sid + 2, cid),
        )
    con.commit()
    con.close()
    return p


@FEW
@given(
    base=st.sampled_from(range(len(BASES))),
    chains=st.fixed_dictionaries(
        {},
        optional={
            "CUDA_CALLCHAINS": st.lists(frame, max_size=12),
            "OSRT_CALLCHAINS": st.lists(frame, max_size=12),
            "SAMPLING_CALLCHAINS": st.lists(frame, max_size=12),
            "OSRT_API": st.lists(event, max_size=6),
            "COMPOSITE_EVENTS": st.lists(event, max_size=6),
            "DIAGNOSTIC_EVENT": st.lists(st.tuples(message), max_size=3),
        },
    ),
    cuda=st.lists(event, max_size=6),
)
def test_nsys_backtrace_and_diagnostic_tables(base, chains, cuda, tmp_path_factory, capsys):
    p = export(tmp_path_factory.mktemp("bt"), BASES[base], chains, cuda)
    count("nsys_backtraces")
    check_cli(p, capsys, "--rank", "0")


logged = st.lists(message | weird, max_size=3) | weird


@FEW
@given(extra=new_events, warning=logged, error=logged, gz=st.booleans())
def test_annotate_hostile_kineto(extra, warning, error, gz, tmp_path_factory, capsys):
    """Kineto traces with the new kinds and logged lines: annotate exits 0 with strict JSON
    that analyzes again (exit 0), or 2 with one line."""
    tmp = tmp_path_factory.mktemp("an")
    p = kineto_trace(tmp, extra, list(range(0, 300, 10)))
    if p is None:
        return
    doc = json.loads(p.read_text())
    doc["WARNING"], doc["ERROR"] = warning, error
    try:
        p.write_text(json.dumps(doc, allow_nan=True))
    except (TypeError, ValueError, OverflowError, RecursionError):
        return
    count("annotate")
    out = tmp / ("a.json.gz" if gz else "a.json")
    rc = main(["annotate", str(p), "-o", str(out), "--force", "-q"])
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    if rc != 0:
        assert rc == 2 and len(err.strip().splitlines()) == 1, err
        return

    raw = raw_json(out) if gz else out.read_bytes()

    def no_constant(c: str) -> None:
        raise ValueError(c)

    ours = json.loads(raw, parse_constant=no_constant) if b"NaN" not in raw else None
    if ours is not None:
        evs = ours["traceEvents"] if isinstance(ours, dict) else ours
        added = evs[len(doc["traceEvents"]) :]  # the input's own events pass through as they are
        assert added and all({"ph", "pid", "tid", "cat"} <= set(e) for e in added)
    assert check_cli(out, capsys) in (0, 2)


@pytest.fixture(scope="module", autouse=True)
def _report():
    yield
    if LONG:
        print(f"\nfuzz inputs tried: {TRIED}")
