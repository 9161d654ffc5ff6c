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


def test_launch_join_takes_the_first_call_per_rank_and_correlation():
    from traceinsight.analyzers.context import launch_join
    from traceinsight.model.schema import EVENT_SCHEMA, conform

    def ev(kind, name, start, rank, corr):
        return {"kind": kind, "name": name, "start_ns": start, "end_ns": start + 5, "dur_ns": 5, "rank": rank, "correlation": corr, "tid": 1}

    rows = [
        ev("runtime", "cudaLaunchKernel", 0, 0, 7),
        ev("runtime", "cudaMemcpyAsync", 10, 0, 7),  # a repeated id: the first call wins
        ev("runtime", "cudaLaunchKernel", 20, 1, 7),  # the same id on another rank is its own call
        ev("kernel", "k0", 30, 0, 7),
        ev("kernel", "k1", 40, 1, 7),
    ]
    events = conform(pl.DataFrame(rows).cast({c: t for c, t in EVENT_SCHEMA.items() if c in rows[0]}))
    got = launch_join(events).select("name", "launch_name", "launch_start_ns").rows()
    assert got == [("k0", "cudaLaunchKernel", 0), ("k1", "cudaLaunchKernel", 20)]
    # One rank with unique ids takes the unfiltered path: same pairs.
    one = events.filter(pl.col("rank") == 1)
    assert launch_join(one).select("name", "launch_start_ns").rows() == [("k1", 20)]


def test_conform_sorts_by_start_keeping_ties_in_input_order():
    from traceinsight.model.schema import conform

    df = pl.DataFrame({"name": ["c", "a", "b", "d"], "start_ns": [5, 1, 5, 1], "end_ns": [6, 2, 6, 2]})
    out = conform(df)
    assert out.select("name", "start_ns").rows() == [("a", 1), ("d", 1), ("c", 5), ("b", 5)]
    assert out.get_column("start_ns").flags["SORTED_ASC"]


def test_nsys_rank_of_both_paths_agree():
    from traceinsight.parsers.nsys import _rank_of

    gpid = pl.DataFrame({"gpid": [30, 10, None, 20, 99, 10]})
    assert gpid.select(_rank_of([10, 20, 30])).to_series().to_list() == [2, 0, 0, 1, 0, 0]
    many = list(range(0, 200, 10))  # over 16 processes: the lookup table
    assert gpid.select(_rank_of(many)).to_series().to_list() == [3, 1, 0, 2, 0, 1]
