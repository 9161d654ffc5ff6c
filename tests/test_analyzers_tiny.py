"""Every number here is computed by hand from fixtures/tiny (see fixtures/SOURCES.md)."""

import polars as pl
import pytest

from traceinsight.api import analyze_path

from .conftest import TINY

US = 1000


def test_busy_and_idle_by_cause(tiny_analysis):
    m = tiny_analysis.metrics
    assert m["span_ns"] == 1000 * US
    assert m["gpu_busy_ratio"] == pytest.approx(0.49)
    idle = m["idle_by_cause_ns"]
    assert idle["dataloader"] == 330 * US  # [0, 330): host in __next__ for 300 of 330 us
    assert idle["host_sync"] == 180 * US  # [530, 540) and [550, 720): sync in progress as the GPU ran dry
    assert sum(idle.values()) == 510 * US


def test_steps_syncs_copies_kernels(tiny_analysis):
    m = tiny_analysis.metrics
    assert m["steps"] == 1 and m["step_time_median_ns"] == 1000 * US
    assert m["dataloader_ratio"] == pytest.approx(0.3)
    assert m["host_sync_count"] == 1 and m["host_sync_blocked_ns"] == 200 * US
    assert tiny_analysis.results["syncs"].by_op[0]["op"] == "aten::item"
    assert m["h2d_bytes"] == 0 and m["h2d_pageable_bytes_ratio"] is None
    assert m["elementwise_kernel_count_share"] == pytest.approx(0.5)
    assert m["elementwise_kernel_time_share"] == pytest.approx(200 / 480)
    assert m["fp32_gemm_time_share"] == 0.0
    assert m["comm_compute_overlap_ratio"] is None and m["exposed_comm_ratio"] is None


def test_findings_rank_dataloader_first(tiny_analysis):
    ids = [f.id for f in tiny_analysis.findings]
    assert ids[0] == "dataloader_stall"
    assert tiny_analysis.findings[0].severity == "high"  # 330 us of a 1000 us window
    assert "host_sync" in ids
    sync = next(f for f in tiny_analysis.findings if f.id == "host_sync")
    assert sync.cost_ns == 180 * US


def test_comm_overlap_exact():
    a = analyze_path(TINY / "comm_overlap.json")
    m = a.metrics
    assert m["comm_compute_overlap_ratio"] == pytest.approx(0.5)
    comm = a.results["comm"]
    assert comm.comm_ns == 100 * US and comm.exposed_comm_ns == 50 * US
    assert m["exposed_comm_ratio"] == pytest.approx(50 / 150)  # window = GPU span 150 us


def test_json_shape_is_stable(tiny_analysis):
    doc = tiny_analysis.to_json()
    assert doc["schema"] == "traceinsight/1"
    src = doc["source"]
    assert src["format"] == "kineto" and src["ranks"] == [0]
    assert src["devices"][0]["name"] == "Tiny GPU"
    assert src["event_counts"]["kernel"] == 2 and src["event_counts"]["memcpy"] == 1
    for f in doc["findings"]:
        assert set(f) >= {"id", "severity", "title", "evidence", "recommendation"}


def test_join_pair_equals_a_two_column_join():
    from traceinsight.analyzers.context import join_pair

    left = pl.DataFrame({"rank": [0, 1, 1, None, 0], "corr": [5, 5, 7, 5, None], "x": [1, 2, 3, 4, 5]})
    right = pl.DataFrame({"rank": [1, 0, 1], "corr": [5, 5, 9], "y": ["a", "b", "c"]})
    want = [(0, 5, 1, "b"), (1, 5, 2, "a"), (1, 7, 3, None), (None, 5, 4, None), (0, None, 5, None)]
    assert join_pair(left, right, "rank", "corr").rows() == want  # packed key
    # Values too wide to pack (a negative rank, a span of 2**50): the plain join, same answer.
    wide = right.with_columns(pl.col("corr") + pl.Series([0, 0, 2**50]))
    assert join_pair(left, wide, "rank", "corr").rows() == want
    neg = left.with_columns(pl.Series("rank", [0, 1, 1, -1, 0]))
    assert join_pair(neg, right, "rank", "corr").rows() == [(0, 5, 1, "b"), (1, 5, 2, "a"), (1, 7, 3, None), (-1, 5, 4, None), (0, None, 5, None)]
