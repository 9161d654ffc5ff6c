"""nsys GPU_METRICS: the parser's side table, its views, and the efficiency analyzer's means.

The export is the small nsys-ai mock (copied, never modified) with a GEMM kernel and hand-made
GPU_METRICS / TARGET_INFO_GPU_METRICS tables added; every expected value is worked out by hand.
"""

from __future__ import annotations

import shutil
import sqlite3
from dataclasses import replace
from pathlib import Path

import polars as pl
import pytest

from traceinsight.api import analyze_trace
from traceinsight.jobs import load_rank_tables
from traceinsight.model.schema import GPU_METRICS_SCHEMA, conform_side
from traceinsight.options import Options
from traceinsight.parsers import load_trace
from traceinsight.report.html import render_html
from traceinsight.report.terminal import render_summary

from .builder import Events
from .conftest import FIXTURES, unpacked_db

MOCK = unpacked_db(FIXTURES / "nsys" / "nsys-ai__mock.sqlite")
SESSION_START_NS = 1776781226557295056  # TARGET_INFO_SESSION_START_TIME of the mock
# session-relative sample times: inside the mock's elementwise kernel, inside the added GEMM, and
# between them with no kernel running (all inside the window: first to last GPU activity)
T_ELEMENTWISE, T_IDLE, T_GEMM = 1_517_728_000, 1_550_000_000, 1_600_005_000
GEMM_NS = (1_600_000_000, 1_600_010_000)
GPU0, GPU1 = 0x2100, 0x2101  # typeId: the GPU in the low byte
METRICS = {
    1: "SM Active [Throughput %]",
    2: "Tensor Active [Throughput %]",
    3: "DRAM Read Bandwidth [Throughput %]",
    4: "DRAM Write Bandwidth [Throughput %]",
    5: "Compute Warps in Flight [Avg]",  # a count, not a percentage: dropped
    6: "PCIe RX Throughput [Throughput %]",  # kept under its own name
}
# (typeId, time, {metricId: percent})
SAMPLES = [
    (GPU0, T_ELEMENTWISE, {1: 80, 2: 0, 3: 30, 4: 10, 5: 500, 6: 5}),
    (GPU0, T_GEMM, {1: 90, 2: 60, 3: 10, 4: 10}),
    (GPU0, T_IDLE, {1: 0, 2: 0, 3: 0, 4: 0}),
    (GPU1, T_GEMM, {1: 40, 2: 20, 3: 20, 4: 0}),
]


def _export(
    tmp_path: Path,
    with_metrics: bool = True,
    names: dict[int, str] = METRICS,
    type_ids: bool = True,
    sample_cols: str = "timestamp INTEGER, typeId INTEGER NOT NULL",
) -> Path:
    path = tmp_path / "gpu_metrics.sqlite"
    shutil.copy(MOCK, path)
    con = sqlite3.connect(path)
    try:
        # a GEMM kernel: the mock's first kernel row with another name, time and correlation
        cols = [r[1] for r in con.execute("PRAGMA table_info(CUPTI_ACTIVITY_KIND_KERNEL)")]
        con.execute(
            "INSERT INTO StringIds VALUES (90001, 'ampere_bf16_s16816gemm_bf16_128x128_tn')"
        )
        new = {
            "start": str(GEMM_NS[0]),
            "end": str(GEMM_NS[1]),
            "correlationId": "99999",
            "demangledName": "90001",
            "shortName": "90001",
            "mangledName": "90001",
        }
        select = ", ".join(new.get(c, f'"{c}"') for c in cols)
        con.execute(
            f"INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL SELECT {select} "
            "FROM CUPTI_ACTIVITY_KIND_KERNEL ORDER BY start LIMIT 1"
        )
        if with_metrics:
            type_col = "typeId INTEGER NOT NULL, " if type_ids else ""
            con.execute(
                f"CREATE TABLE TARGET_INFO_GPU_METRICS ({type_col}sourceId INTEGER NOT NULL,"
                " typeName TEXT NOT NULL, metricId INTEGER NOT NULL, metricName TEXT NOT NULL)"
            )
            con.execute(
                f"CREATE TABLE GPU_METRICS ({sample_cols}, metricId INTEGER NOT NULL,"
                " value INTEGER NOT NULL)"
            )
            info = [(t, t, "GH100", m, n) for t in (GPU0, GPU1) for m, n in names.items()]
            con.executemany(
                f"INSERT INTO TARGET_INFO_GPU_METRICS VALUES ({'?, ' * type_ids}?, ?, ?, ?)",
                [row if type_ids else row[1:] for row in info],
            )
            rows = [(ts, t, m, v) for t, ts, vals in SAMPLES for m, v in vals.items()]
            if "typeId" not in sample_cols:
                rows = [(ts, m, v) for ts, _, m, v in rows]
            con.executemany(
                f"INSERT INTO GPU_METRICS VALUES ({', '.join('?' * len(rows[0]))})", rows
            )
        con.commit()
    finally:
        con.close()
    return path


def test_side_table_from_the_export(tmp_path: Path) -> None:
    g = load_trace(_export(tmp_path)).gpu_metrics
    assert g.height == 5 + 4 + 4 + 4  # the warps count is dropped
    assert set(g["metric"]) == {
        "sm_active",
        "tensor_active",
        "dram_read",
        "dram_write",
        "pcie rx throughput [throughput %]",
    }
    sm0 = g.filter((pl.col("metric") == "sm_active") & (pl.col("device") == 0))
    times = [SESSION_START_NS + t for t in (T_ELEMENTWISE, T_IDLE, T_GEMM)]
    assert sm0["start_ns"].to_list() == times
    assert sm0["value_ratio"].to_list() == pytest.approx([0.8, 0.0, 0.9])
    assert set(g["rank"]) == {0} and set(g["device"]) == {0, 1}
    # the original fixture is untouched
    assert "GPU_METRICS" not in {
        r[0] for r in sqlite3.connect(MOCK).execute("SELECT name FROM sqlite_master")
    }


def test_older_names_and_no_type_id(tmp_path: Path) -> None:
    """Other spellings ("SMs Active", a combined DRAM counter) and a metric list without typeId."""
    older = {
        1: "SMs Active",
        2: "Tensor Active / FP16 Active",
        3: "DRAM Bandwidth [Throughput %]",
        4: "NVLink RX Throughput [Throughput %]",
    }
    t = load_trace(_export(tmp_path, names=older, type_ids=False))
    metrics = t.gpu_metrics.group_by("metric").len().sort("metric")
    assert metrics.rows() == [
        ("dram_bandwidth", 4),
        ("nvlink rx throughput [throughput %]", 4),
        ("sm_active", 4),
        ("tensor_active", 4),
    ]
    m = analyze_trace(t).metrics
    assert m["sm_active_ratio"] == pytest.approx(0.525)
    assert m["dram_bandwidth_ratio"] == pytest.approx(0.15)  # the combined counter, id 3


def test_samples_without_type_id(tmp_path: Path) -> None:
    """GPU_METRICS with ``start`` for the time and no typeId: every sample is GPU 0's."""
    t = load_trace(_export(tmp_path, sample_cols="start INTEGER"))
    assert t.gpu_metrics.height == 17 and set(t.gpu_metrics["device"]) == {0}
    assert analyze_trace(t).metrics["sm_active_ratio"] == pytest.approx(0.525)


def test_views_cut_the_samples(tmp_path: Path) -> None:
    t = load_trace(_export(tmp_path))
    lo, hi = SESSION_START_NS + T_IDLE, SESSION_START_NS + T_GEMM + 1
    assert t.view(t.events, rank=0, window=(lo, hi)).gpu_metrics.height == 4 + 4 + 4
    assert t.view(t.events, rank=1).gpu_metrics.height == 0
    assert t.view(t.events, device=1).gpu_metrics.height == 4


def test_means_overall_per_device_and_per_kernel_class(tmp_path: Path) -> None:
    a = analyze_trace(load_trace(_export(tmp_path)))
    m, e = a.metrics, a.results.efficiency.counters
    # four samples: SM (80 + 90 + 0 + 40) / 4, tensor (0 + 60 + 0 + 20) / 4,
    # DRAM read (30 + 10 + 0 + 20) / 4 + write (10 + 10 + 0 + 0) / 4
    assert m["sm_active_ratio"] == pytest.approx(0.525)
    assert m["tensor_active_ratio"] == pytest.approx(0.20)
    assert m["dram_bandwidth_ratio"] == pytest.approx(0.15 + 0.05)
    dev = {d.device: d for d in e.devices}
    assert dev[0].samples == 3 and dev[1].samples == 1
    assert dev[0].sm_active_ratio == pytest.approx(170 / 300)
    assert dev[0].dram_bandwidth_ratio == pytest.approx(40 / 300 + 20 / 300)
    assert dev[1].tensor_active_ratio == pytest.approx(0.20)
    cls = {c.kernel_class: c for c in e.classes}
    assert set(cls) == {"gemm", "elementwise", "idle"}
    assert cls["gemm"].tensor_active_ratio == pytest.approx(0.6)
    assert cls["gemm"].sm_active_ratio == pytest.approx(0.9)
    assert cls["elementwise"].tensor_active_ratio == pytest.approx(0.0)
    assert cls["elementwise"].dram_bandwidth_ratio == pytest.approx(0.4)
    # idle: GPU 0 at T_IDLE and GPU 1 (no kernels there) at T_GEMM
    assert cls["idle"].samples == 2
    assert cls["idle"].sm_active_ratio == pytest.approx(0.2)
    assert cls["idle"].dram_bandwidth_ratio == pytest.approx(0.1)
    (line,) = [ln for ln in render_summary(a.to_json()).splitlines() if "SM active" in ln]
    assert "SM active 52.5%" in line and "tensor active 20.0%" in line


def test_no_gpu_metrics_no_counters(tmp_path: Path) -> None:
    t = load_trace(_export(tmp_path, with_metrics=False))
    assert t.gpu_metrics.height == 0
    a = analyze_trace(t)
    assert a.metrics["sm_active_ratio"] is None
    assert a.metrics["tensor_active_ratio"] is None
    assert a.metrics["dram_bandwidth_ratio"] is None
    assert a.results.efficiency.counters.classes == ()


def test_means_per_step() -> None:
    """Two steps, one GEMM each; SM active sampled twice in step 1 (1.0 in the GEMM, 0.5 after
    it) and once in step 2 (0.2): per step 0.75 and 0.2, overall 1.7 / 3."""
    ev = Events()
    for n, at in ((1, 0), (2, 100)):
        ev.step(n, at, 100).kernel(
            "ampere_bf16_s16816gemm_bf16_128x128_tn", at + 5, 60, launch_us=at
        )
    samples = pl.DataFrame(
        {
            "rank": [0, 0, 0],
            "device": [0, 0, 0],
            "start_ns": [10_000, 80_000, 110_000],
            "metric": ["sm_active"] * 3,
            "value_ratio": [1.0, 0.5, 0.2],
        }
    )
    t = replace(ev.trace(), gpu_metrics=conform_side(samples, GPU_METRICS_SCHEMA))
    a = analyze_trace(t)
    e = a.results.efficiency.counters
    assert [(s.step, s.samples) for s in e.steps] == [(1, 2), (2, 1)]
    assert [s.sm_active_ratio for s in e.steps] == pytest.approx([0.75, 0.2])
    assert a.metrics["sm_active_ratio"] == pytest.approx(1.7 / 3)
    assert a.metrics["tensor_active_ratio"] is None  # not sampled
    assert {c.kernel_class: c.samples for c in e.classes} == {
        "gemm": 2,
        "idle": 1,
    }


def test_html_shows_the_sampled_counters(tmp_path: Path) -> None:
    html = render_html(analyze_trace(load_trace(_export(tmp_path))))
    assert "SM active" in html and "tensor active" in html and "52.5%" in html


def test_rank_files_stack_the_samples(tmp_path: Path) -> None:
    """A directory of per-rank exports: each file's samples under its rank (as the events)."""
    for r in (0, 1):
        (tmp_path / f"r{r}").mkdir()
        _export(tmp_path / f"r{r}").rename(tmp_path / f"rank{r}.sqlite")
    t = load_rank_tables(tmp_path, Options())
    assert t.gpu_metrics.group_by("rank").len().sort("rank").rows() == [(0, 17), (1, 17)]
