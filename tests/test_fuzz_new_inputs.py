"""Property-based pass over the inputs of this round that the parsers do not interpret yet but
must survive: Kineto ``[memory]`` instants, ``python_function`` events, traces annotated by
traceinsight (``cat: "traceinsight"``: X/i/C events and ``s``/``f`` flows with ``id``/``bp``),
and nsys exports with a ``CUDA_GPU_MEMORY_USAGE_EVENTS`` table and ``cudaMalloc``/``cudaFree``
runtime rows. Each input is mixed into a real trace, so the analyzers run on it too.

The property, as for the other hostile inputs: the CLI exits 0 with valid JSON, or 2 with one
clean stderr line; never a traceback. CI runs a small derandomized budget (a few seconds);
``TRACEINSIGHT_FUZZ_NEW=5000 python -m pytest tests/test_fuzz_new_inputs.py`` runs a longer,
random pass and prints how many inputs each test tried.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sqlite3
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import traceinsight.parsers.nsys.db as nsys
from traceinsight.cli import main

from .conftest import FIXTURES, TINY, unpacked_db

LONG = int(os.environ.get("TRACEINSIGHT_FUZZ_NEW", "0"))
SETTINGS = settings(
    max_examples=LONG or 15,
    derandomize=not LONG,  # CI: the same inputs every run
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
TRIED: dict[str, int] = {}

BASE = json.loads((TINY / "step_dataloader_sync.json").read_text())  # kernels, a step, a sync
NSYS_BASES = [
    unpacked_db(FIXTURES / "nsys" / "nsys-ai__mock.sqlite"),
    unpacked_db(FIXTURES / "nsys" / "nsys-ai__mfu_2gpu_after.sqlite"),
]


def check_cli(path: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> int:
    out = path.with_suffix(".result.json")
    rc = main(["analyze", str(path), "--no-html", "-q", "--force", "--json", str(out), *extra])
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    if rc == 0:
        json.loads(out.read_text())
    else:
        assert rc == 2, err
        assert len(err.strip().splitlines()) == 1, err
    return rc


def count(name: str) -> None:
    TRIED[name] = TRIED.get(name, 0) + 1


@pytest.fixture(scope="module", autouse=True)
def _report_counts():
    yield
    if LONG:
        print(f"\nfuzz inputs tried: {TRIED}")


# --- values: plausible, then hostile -----------------------------------------------------------

leaf = (
    st.none()
    | st.booleans()
    | st.integers(-(2**64), 2**64)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=10)
)
weird = st.recursive(
    leaf,
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=5), c, max_size=3),
    max_leaves=8,
)
# µs around the base trace's events (1.000000 s .. 1.001000 s), so new events land among them
ts = st.integers(999_000, 1_003_000) | st.floats(999_000, 1_003_000) | weird
dur = st.integers(-5, 3_000) | st.floats(-1, 3_000) | st.none() | weird
pid = st.sampled_from([0, 100, -1, "Spans", "python"]) | weird
tid = st.sampled_from([7, 100, 0, "stream 7", "PyTorch Profiler"]) | weird
num = st.integers(-(2**63), 2**63 - 1) | st.floats(allow_nan=True, allow_infinity=True) | weird


def event(fixed: dict[str, Any], optional: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(fixed, optional=optional)


memory = event(
    {
        "ph": st.sampled_from(["i", "I", "X", "C"]) | weird,
        "name": st.sampled_from(["[memory]", "[OutOfMemory]"]),
        "ts": ts,
    },
    {
        "cat": st.sampled_from(["cpu_instant_event", "memory", None]) | weird,
        "s": st.sampled_from(["t", "p", "g"]) | weird,
        "pid": pid,
        "tid": tid,
        "dur": dur,
        "args": st.fixed_dictionaries(
            {},
            optional={
                "Bytes": st.integers(-(2**40), 2**40) | num,  # negative on free
                "Total Allocated": num,
                "Total Reserved": num,
                "Addr": st.integers(0, 2**64) | num,
                "Device Type": st.sampled_from([0, 1, 8]) | weird,
                "Device Id": st.integers(-1, 16) | weird,
            },
        )
        | weird,
    },
)
python_function = event(
    {
        "ph": st.sampled_from(["X", "B", "E", "i"]) | weird,
        "cat": st.just("python_function"),
        "name": st.sampled_from(
            [
                "train.py(259): step",
                "nn.Module: Linear_0",
                "<built-in method item of Tensor object>",
                "torch/nn/modules/module.py(1736): _call_impl",
            ]
        )
        | st.text(max_size=30),
        "ts": ts,
    },
    {
        "dur": dur,
        "pid": pid,
        "tid": tid,
        "args": st.fixed_dictionaries(
            {},
            optional={
                "Python id": num,
                "Python parent id": num,
                "Python module id": num,
                "Python thread": num,
            },
        )
        | weird,
    },
)
annotated = event(
    {
        "ph": st.sampled_from(["X", "i", "C", "s", "f", "t", "b", "e"]) | weird,
        "cat": st.just("traceinsight"),
        "name": st.sampled_from(["train_step", "finding: host_sync", "gpu idle", "step#1", "flow"])
        | st.text(max_size=20),
        "ts": ts,
    },
    {
        "dur": dur,
        "pid": pid,
        "tid": tid,
        "id": st.integers(-3, 2**64) | st.text(max_size=6) | weird,
        "bp": st.sampled_from(["e", "s"]) | weird,
        "s": st.sampled_from(["t", "p", "g"]) | weird,
        "args": st.dictionaries(
            st.sampled_from(["value", "cause", "cost_ns", "step", "correlation"]), num, max_size=4
        )
        | weird,
    },
)
new_events = st.lists(memory | python_function | annotated, min_size=1, max_size=30)
step_ranges = st.sampled_from([None, "train_step", "train.py", "[memory]", "(", "flow"])


def kineto_trace(tmp: Path, extra: list[Any], positions: list[int]) -> Path | None:
    evs = list(BASE["traceEvents"])
    for e, at in zip(extra, positions, strict=False):
        evs.insert(at % (len(evs) + 1), e)
    try:
        body = json.dumps(dict(BASE, traceEvents=evs), allow_nan=True)
    except (TypeError, ValueError, OverflowError, RecursionError):
        return None
    p = tmp / "t.json"
    p.write_text(body)
    return p


@SETTINGS
@given(
    extra=new_events,
    positions=st.lists(st.integers(0, 10**6), min_size=30, max_size=30),
    step=step_ranges,
)
def test_kineto_new_event_kinds(extra, positions, step, tmp_path_factory, capsys):
    p = kineto_trace(tmp_path_factory.mktemp("kn"), extra, positions)
    if p is None:
        return
    count("kineto")
    check_cli(p, capsys, *(["--step-range", step] if step else []))


@SETTINGS
@given(extra=st.lists(memory | python_function | annotated, min_size=1, max_size=12))
def test_new_event_kinds_alone(extra, tmp_path_factory, capsys):
    """No kernels or steps around them: a trace of only the new kinds, bare array or object."""
    p = tmp_path_factory.mktemp("ka") / "t.json"
    try:
        p.write_text(
            json.dumps({"traceEvents": extra} if len(extra) % 2 else extra, allow_nan=True)
        )
    except (TypeError, ValueError, OverflowError, RecursionError):
        return
    count("kineto_alone")
    check_cli(p, capsys)


# --- nsys: memory-usage rows and cudaMalloc/cudaFree runtime rows added to real exports --------

MEMORY_TABLE = """CREATE TABLE IF NOT EXISTS CUDA_GPU_MEMORY_USAGE_EVENTS (
    start INTEGER NOT NULL, globalPid INTEGER NOT NULL, deviceId INTEGER NOT NULL,
    contextId INTEGER NOT NULL, address INTEGER NOT NULL, pc INTEGER NOT NULL,
    bytes INTEGER NOT NULL, memKind INTEGER NOT NULL, memoryOperationType INTEGER NOT NULL,
    name TEXT, correlationId INTEGER)"""  # as nsys 2022.2 writes it (pipit saxpy export)

# sqlite keeps any value in any column without STRICT: text, reals and blobs reach the parser too
sql_int = st.integers(-(2**63), 2**63 - 1)
sql_any = (
    sql_int | st.floats(allow_nan=False) | st.text(max_size=6) | st.binary(max_size=4) | st.none()
)
near = st.integers(1_300_000_000, 1_560_000_000)  # the exports' own ns range
memory_row = st.tuples(
    near | sql_int,  # start
    st.sampled_from([283004823928832, 0]) | sql_int,  # globalPid
    st.integers(-1, 8),  # deviceId
    st.integers(0, 4),  # contextId
    st.integers(0, 2**63 - 1),  # address
    sql_int,  # pc
    st.integers(-(2**40), 2**40) | sql_any,  # bytes
    st.integers(-1, 9) | sql_any,  # memKind (0-7 named)
    st.integers(-1, 2) | sql_any,  # memoryOperationType: 0 alloc, 1 free
    st.text(max_size=8) | st.none(),
    st.integers(0, 200) | sql_any,
)
runtime_row = st.tuples(
    st.sampled_from(
        [
            "cudaMalloc_v3020",
            "cudaFree_v3020",
            "cudaMallocAsync_v11020",
            "cudaFreeAsync_v11020",
            "cudaMallocHost_v3020",
        ]
    ),
    near | sql_any,  # start
    st.integers(-1_000, 5_000_000) | sql_any,  # duration (end = start + it; negative: backwards)
    st.sampled_from([283004824020018]) | sql_any,  # globalTid
    st.integers(0, 200) | sql_any,  # correlationId (colliding with kernels' on purpose)
)


def nsys_export(tmp: Path, base: Path, mem: list[tuple], calls: list[tuple], table: bool) -> Path:
    p = tmp / "e.sqlite"
    shutil.copy(base, p)
    con = sqlite3.connect(p)

    def insert(sql: str, row: tuple) -> None:
        # NOT NULL, or an int beyond 64 bits, is refused by sqlite itself
        with contextlib.suppress(sqlite3.IntegrityError, OverflowError):
            con.execute(sql, row)

    if table:
        con.execute(MEMORY_TABLE)
        for row in mem:
            insert("INSERT INTO CUDA_GPU_MEMORY_USAGE_EVENTS VALUES (?,?,?,?,?,?,?,?,?,?,?)", row)
    (sid,) = con.execute("SELECT COALESCE(MAX(id), 0) + 1 FROM StringIds").fetchone()
    for i, (name, start, length, gtid, corr) in enumerate(calls):
        insert("INSERT INTO StringIds (id, value) VALUES (?, ?)", (sid + i, name))
        end = start + length if isinstance(start, int) and isinstance(length, int) else length
        insert(
            "INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME (start, end, eventClass, globalTid, correlationId, nameId, returnValue) "
            "VALUES (?, ?, 0, ?, ?, ?, 0)",
            (start, end, gtid, corr, sid + i),
        )
    con.commit()
    con.close()
    return p


@SETTINGS
@given(
    base=st.sampled_from(range(len(NSYS_BASES))),
    mem=st.lists(memory_row, max_size=20),
    calls=st.lists(runtime_row, max_size=12),
    table=st.booleans(),
    adbc=st.booleans(),
)
def test_nsys_memory_tables_and_malloc_rows(
    base, mem, calls, table, adbc, tmp_path_factory, capsys
):
    p = nsys_export(tmp_path_factory.mktemp("ns"), NSYS_BASES[base], mem, calls, table)
    count("nsys")
    if adbc:
        check_cli(p, capsys)
        return
    with mock.patch.object(nsys, "fetch_adbc", lambda uri, q: None):  # the sqlite3 fallback
        check_cli(p, capsys)


def test_fractional_and_exponent_timestamps(tmp_path, capsys):
    """Found by a local fuzz pass: one fractional and one exponent-notation ts exited 1
    (internal error: the exact-decimal path called a polars method that does not exist)."""
    p = tmp_path / "t.json"
    evs = [
        {"ph": "X", "name": "a", "ts": 1.5, "dur": 1},
        {"ph": "X", "name": "a", "ts": 1e16, "dur": 1},
    ]
    p.write_text(json.dumps({"traceEvents": evs}))
    check_cli(p, capsys)
