"""Evidence from nsys: backtraces and NVTX ranges as sources, the dropped-events and
row-order health checks on broken variants of real traces."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path
from typing import Any

import orjson
import polars as pl
import pytest

from traceinsight import api
from traceinsight.analyzers.context import build_context
from traceinsight.analyzers.health import analyze_health
from traceinsight.parsers import load_trace
from traceinsight.parsers.nsys import parse_nsys

from .conftest import raw_json, unpacked_db

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT.parent / "shared/traces/nsys"
SAXPY = CORPUS / "pipit__saxpy-mpi-cuda_nsys_perlmutter0.sqlite"
CLOVER = CORPUS / "pipit__perlmutter-cloverleaf-cuda.sqlite"
MFU = unpacked_db(ROOT / "fixtures/nsys/nsys-ai__mfu_2gpu_after.sqlite")
MOCK = unpacked_db(ROOT / "fixtures/nsys/nsys-ai__mock.sqlite")
HEALTHY = ROOT / "fixtures/h200/healthy_bf16.pt.trace.json.xz"
corpus = pytest.mark.skipif(not CORPUS.is_dir(), reason="../shared/traces is not here")


def _checks(path: Path) -> dict[str, dict[str, Any]]:
    h = analyze_health(build_context(load_trace(path)))
    return {c["check"]: c for c in h.checks}


def _sources(a: Any, category: str) -> list[dict[str, Any]]:
    return list(a.results.sources.by_category[category])


# --- backtraces ---------------------------------------------------------------------------------


@corpus
def test_cuda_api_backtraces_name_main_and_the_copy() -> None:
    # Truth from SQL: the backtraced cudaMemcpy calls (the 2022.2 export writes each again,
    # nested, without a chain: counted once) and their time; the stack says main called it.
    con = sqlite3.connect(f"file:{SAXPY}?mode=ro", uri=True)
    n, total = con.execute(
        "SELECT count(*), sum(r.end - r.start) FROM CUPTI_ACTIVITY_KIND_RUNTIME r "
        "JOIN StringIds s ON s.id = r.nameId WHERE s.value = 'cudaMemcpy' "
        "AND r.callchainId IS NOT NULL"
    ).fetchone()
    a = api.analyze(SAXPY)
    assert isinstance(a, api.TraceAnalysis)
    (copy,) = _sources(a, "blocking_copy")
    assert copy.location == "main (saxpy-mpi-cuda)" and copy.trigger == "cudaMemcpy"
    assert (copy.count, copy.cost_ns) == (n, total) == (15, 374_343_896)
    (launch,) = _sources(a, "launch")  # the five launches come from the saxpy() wrapper
    assert (launch.function, launch.trigger, launch.count) == (
        "saxpy",
        "cudaLaunchKernel",
        5,
    )


@corpus
def test_callchain_ids_of_2022_are_zero_based() -> None:
    # callchainId k is CUDA_CALLCHAINS id k + 1 there: each call's stack holds its own API name
    t = parse_nsys(SAXPY)
    c = t.callchains.filter(pl.col("source") == "cuda_api")
    calls = t.events.filter(pl.col("kind") == "runtime").select("tid", "start_ns", "name")
    own = c.join(calls, on=["tid", "start_ns"]).filter(pl.col("symbol") == pl.col("name"))
    assert own.get_column("chain").n_unique() == c.get_column("chain").n_unique() == 38


@corpus
def test_os_runtime_backtraces_attribute_device_syncs() -> None:
    a = api.analyze(CLOVER)
    assert isinstance(a, api.TraceAnalysis) and a.results.sources.stacks_recorded
    syncs = _sources(a, "host_sync")
    assert {s.trigger for s in syncs} == {"cudaDeviceSynchronize"}
    assert syncs[0].location == "clover::par_ranged2 (cuda-cloverleaf)"
    # every frame that names a location is the application's, not a library's
    assert {s.file for s in syncs} == {"cuda-cloverleaf"}
    (sync,) = [f for f in a.findings if f.id == "host_sync"]
    assert sync.evidence["sources"][0].location == syncs[0].location


def test_nvtx_ranges_are_the_location_without_backtraces() -> None:
    a = api.analyze(MFU)
    assert isinstance(a, api.JobAnalysis)
    r = a.ranks[0]
    assert not r.results.sources.stacks_recorded
    launches = _sources(r, "launch")
    assert launches and all(s.file is None and s.line is None for s in launches)
    # no op range (emit_nvtx aten::..., NCCL's domain) and no step number is a location
    assert not any(s.location.startswith(("aten::", "nccl:")) for s in launches)
    assert "nsys profile --cudabacktrace" in r.results.sources.hint


@corpus
def test_callchains_are_cut_by_the_window_view() -> None:
    t = parse_nsys(CLOVER)
    lo = int(t.callchains["start_ns"].min())
    hi = int(t.callchains["start_ns"].quantile(0.5))
    v = t.view(t.events, window=(lo, hi))
    assert 0 < v.callchains.height < t.callchains.height
    assert v.callchains["start_ns"].max() < hi


# --- dropped events -----------------------------------------------------------------------------


def test_kineto_dropped_records(tmp_path: Path) -> None:
    doc = orjson.loads(raw_json(HEALTHY))
    kernels = sum(1 for e in doc["traceEvents"] if e.get("cat") == "kernel")
    # what libkineto's logger collects into the trace when CUPTI's buffers overflow
    doc["WARNING"] = [f"Dropped {kernels} activity records"]
    p = tmp_path / "dropped.json"
    p.write_bytes(orjson.dumps(doc))
    c = _checks(p)
    assert set(c) == {"events_dropped"}
    assert c["events_dropped"]["severity"] == "error" and c["events_dropped"]["count"] == kernels
    a = api.analyze(p)
    assert a.to_json()["data_quality"][0]["check"] == "events_dropped"
    # an unrelated warning is not a drop
    doc["WARNING"] = ["Failed to recover relationship between all profiler and kineto events"]
    p.write_bytes(orjson.dumps(doc))
    assert _checks(p) == {}


def test_nsys_diagnostic_says_events_were_lost(tmp_path: Path) -> None:
    p = tmp_path / "lost.sqlite"
    shutil.copy(MOCK, p)
    con = sqlite3.connect(p)
    con.execute(
        "INSERT INTO DIAGNOSTIC_EVENT (timestamp, timestampType, source, severity, text) "
        "VALUES (0, 0, 1, 2, 'CUPTI buffers were full: 3 CUDA events were dropped.')"
    )
    con.commit()
    con.close()
    assert _checks(MOCK) == {}
    c = _checks(p)
    assert set(c) == {"events_dropped"}
    assert c["events_dropped"]["count"] == 3 and "were dropped" in c["events_dropped"]["message"]


# --- row order ----------------------------------------------------------------------------------


def _reorder(src: Path, dst: Path, table: str, order: str) -> None:
    shutil.copy(src, dst)
    con = sqlite3.connect(dst)
    con.execute(f"CREATE TEMP TABLE t AS SELECT * FROM {table} ORDER BY {order}")
    con.execute(f"DELETE FROM {table}")
    con.execute(f"INSERT INTO {table} SELECT * FROM t")
    con.commit()
    con.close()


def test_rows_in_no_time_order(tmp_path: Path) -> None:
    # healthy: mfu_2gpu_after's runtime rows come in per-thread flushes (2 breaks of 6682)
    assert "rows_out_of_order" not in _checks(MFU)
    shuffled = tmp_path / "shuffled.sqlite"
    _reorder(MFU, shuffled, "CUPTI_ACTIVITY_KIND_KERNEL", "(rowid * 7919) % 1009, rowid")
    c = _checks(shuffled)
    assert set(c) == {"rows_out_of_order"}
    assert "CUPTI_ACTIVITY_KIND_KERNEL" in c["rows_out_of_order"]["message"]
    assert (
        c["rows_out_of_order"]["severity"] == "warning" and c["rows_out_of_order"]["affects"] == []
    )
    # sorted on reading: the same analysis
    a, b = api.analyze(MFU), api.analyze(shuffled)
    assert [r.metrics for r in a.ranks] == [r.metrics for r in b.ranks]
    assert [f.to_json() for f in a.findings] == [f.to_json() for f in b.findings]
    # reversed whole: each row a break
    rev = tmp_path / "reversed.sqlite"
    _reorder(MFU, rev, "CUPTI_ACTIVITY_KIND_KERNEL", "start DESC")
    assert set(_checks(rev)) == {"rows_out_of_order"}
