"""The causal package's contracts: every transform runs on a model holding only the graph's
own columns and those it declares, with the same result as on the whole model (so a column it
reads undeclared fails here); the build makes every column a transform may declare; and every
rule declares its fix's prediction exactly once, a ``fix`` naming a transform that exists."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from traceinsight.analyzers.context import build_context
from traceinsight.analyzers.replay import model_inputs
from traceinsight.causal import transforms
from traceinsight.causal.build import build_model
from traceinsight.causal.columns import GPU_FLAGS, GPU_GRAPH_COLUMNS, HOST_FLAGS, HOST_GRAPH_COLUMNS
from traceinsight.causal.graph import StepModel, median_step_ns, replay
from traceinsight.findings import JOB_RULES, RULES
from traceinsight.findings.model import Rule
from traceinsight.options import Options
from traceinsight.parsers import load_trace

from .conftest import H200

PAIRS = H200 / "pairs"
# Each of these has what some transforms change: syncs, pageable copies, a DataLoader, the
# optimizer, checkpointing, fp32 math, empty_cache, a side stream.
MODELS = [
    PAIRS / "syncs.before.pt.trace.json.xz",
    PAIRS / "dataloader.before.pt.trace.json.xz",
    PAIRS / "checkpointing.before.pt.trace.json.xz",
    PAIRS / "empty_cache.before.pt.trace.json.xz",
    PAIRS / "comm_overlap.before.pt.trace.json.xz",
    PAIRS / "h2d_pinned.before.pt.trace.json.xz",
    H200 / "fp32.pt.trace.json.xz",
    H200 / "unfused_adamw_bf16.pt.trace.json.xz",
    H200 / "launch_bound_eager.pt.trace.json.xz",
]


def model_of(path: Path) -> StepModel:
    ctx = build_context(load_trace(path), Options().step_pattern, 1)
    model = build_model(model_inputs(ctx))
    assert model is not None
    return model


def only(model: StepModel, t: transforms.Transform) -> StepModel:
    """The model with just the graph's columns and those ``t`` declares."""
    host = [c for c in model.host.columns if c in HOST_GRAPH_COLUMNS or c in t.host_reads]
    gpu = [c for c in model.gpu.columns if c in GPU_GRAPH_COLUMNS or c in t.gpu_reads]
    return StepModel(model.host.select(host), model.gpu.select(gpu), model.steps)


def every_transform(model: StepModel) -> list[transforms.Transform]:
    g = model.gpu
    some = g.head(max(1, g.height // 3)).select("device", "start_ns", pl.lit(0.5).alias("factor"))
    return [
        *transforms.TRANSFORMS.values(),
        *(transforms.engine_faster(e) for e in transforms.ENGINES),
        transforms.gpu_work_scaled(2.0),
        transforms.scaled_kernels(some),
        transforms.remove_syncs_at(model.host.select("tid", "start_ns").head(50)),
        transforms.host_time_cut(
            model.host.select(
                "tid",
                (pl.col("start_ns") - 1_001).alias("start_ns"),
                (pl.col("start_ns") - 1).alias("end_ns"),
                pl.lit(1_000).alias("saved_ns"),
            ).head(50)
        ),
        transforms.host_spans_removed(
            model.host.select("tid", (pl.col("start_ns") - 1_001).alias("start_ns"), "end_ns").head(
                50
            )
        ),
    ]


@pytest.mark.parametrize("path", MODELS, ids=[p.name.split(".")[0] for p in MODELS])
def test_each_transform_reads_only_what_it_declares(path: Path) -> None:
    model = model_of(path)
    assert set(HOST_GRAPH_COLUMNS) | set(HOST_FLAGS) <= set(model.host.columns)
    assert set(GPU_GRAPH_COLUMNS) | set(GPU_FLAGS) <= set(model.gpu.columns)
    changed = 0
    for t in every_transform(model):
        declared = (t.host_reads - set(model.host.columns)) | (t.gpu_reads - set(model.gpu.columns))
        assert not declared, f"{t.name} declares columns the model has not: {declared}"
        full, narrow = t(model), t(only(model, t))
        assert (full is None) == (narrow is None), t.name
        if full is None or narrow is None:
            continue
        changed += 1
        a, b = median_step_ns(full, replay(full)), median_step_ns(narrow, replay(narrow))
        assert a == b, f"{t.name}: {a} on the whole model, {b} on its declared columns"
    assert changed >= 5  # the transforms this trace is for ran (and the engines, the batch)


def test_every_transform_states_what_it_assumes() -> None:
    for t in transforms.TRANSFORMS.values():
        assert len(t.assumes) > 80, t.name


def test_every_rule_declares_its_prediction_once() -> None:
    for rule in [*RULES, *JOB_RULES]:
        declared = [x for x in (rule.fix, rule.estimate, rule.no_estimate) if x is not None]
        assert len(declared) == 1, rule.id
        if rule.fix is not None:
            assert rule.fix in transforms.TRANSFORMS, (rule.id, rule.fix)
        if rule.per_site:
            assert rule.fix is not None, rule.id
    with pytest.raises(ValueError, match="declares 0"):
        Rule("x", lambda _x: None, "advice")
    with pytest.raises(ValueError, match="declares 2"):
        Rule("x", lambda _x: None, "advice", fix="remove_syncs", no_estimate="why")


def test_a_host_time_cut_comes_out_of_the_gaps_inside_the_op() -> None:
    """host_time_cut takes an op's saved time out of the gaps of its thread's calls inside the op
    and of the first call after it, each in proportion to its gap's part inside the op: here,
    by hand, an op spanning three calls of the step thread, and a cut of half its time."""
    model = model_of(MODELS[0])
    h = model.host.sort("tid", "start_ns")
    tid = int(h.get_column("tid").mode().item(0))
    calls = h.filter((pl.col("tid") == tid) & (pl.col("gap_ns") > 0)).sort("start_ns")
    a, b, c, d = (calls.row(i, named=True) for i in range(10, 14))  # four calls in a row
    # the op: from inside a's gap to inside d's gap (b's and c's gaps wholly inside)
    start = a["start_ns"] - a["gap_ns"] // 2
    end = d["start_ns"] - d["gap_ns"] // 2
    inside = {
        "a": a["start_ns"] - start,
        "b": b["gap_ns"],
        "c": c["gap_ns"],
        "d": end - (d["start_ns"] - d["gap_ns"]),
    }
    assert (
        b["start_ns"] - b["gap_ns"] >= a["start_ns"]
        and c["start_ns"] - c["gap_ns"] >= b["start_ns"]
    )
    saved = sum(inside.values()) // 2
    cut = pl.DataFrame({"tid": [tid], "start_ns": [start], "end_ns": [end], "saved_ns": [saved]})
    after = transforms.host_time_cut(cut)(model)
    assert after is not None
    gap = dict(zip(after.host["node"], after.host["gap_ns"], strict=True))
    total = sum(inside.values())
    for name, row in zip("abcd", (a, b, c, d), strict=True):
        expect = row["gap_ns"] - saved * inside[name] // total
        assert abs(gap[row["node"]] - expect) <= 1, name
    untouched = h.filter(~pl.col("node").is_in([r["node"] for r in (a, b, c, d)]))
    assert all(gap[n] == g for n, g in zip(untouched["node"], untouched["gap_ns"], strict=True))


def test_host_spans_removed_takes_the_span_out_of_gaps_and_calls() -> None:
    """host_spans_removed deletes the code inside a span: calls starting inside it take no time
    and wait for nothing, and each gap loses its part inside the span in proportion to its time
    in the trace (start_ns - gap_from_ns). By hand: a span from inside a's gap to inside d's."""
    model = model_of(MODELS[0])
    h = model.host.sort("tid", "start_ns")
    tid = int(h.get_column("tid").mode().item(0))
    calls = h.filter((pl.col("tid") == tid) & (pl.col("gap_ns") > 0)).sort("start_ns")
    a, b, c, d = (calls.row(i, named=True) for i in range(10, 14))
    start = (a["gap_from_ns"] + a["start_ns"]) // 2
    end = (d["gap_from_ns"] + d["start_ns"]) // 2
    assert a["gap_from_ns"] < start < a["start_ns"] and d["gap_from_ns"] < end < d["start_ns"]
    span = pl.DataFrame({"tid": [tid], "start_ns": [start], "end_ns": [end]})
    after = transforms.host_spans_removed(span)(model)
    assert after is not None
    out = {r["node"]: r for r in after.host.iter_rows(named=True)}

    def kept(row: dict, lo: int, hi: int) -> int:
        raw = row["start_ns"] - row["gap_from_ns"]
        inside = max(0, min(row["start_ns"], hi) - max(row["gap_from_ns"], lo))
        return int(row["gap_ns"] * (1 - inside / raw))

    for row in (a, b, c):  # calls inside: no time, no wait
        assert out[row["node"]]["dur_ns"] == 0 and out[row["node"]]["wait"] == 0
        assert abs(out[row["node"]]["gap_ns"] - kept(row, start, end)) <= 1
    assert out[a["node"]]["gap_ns"] > 0  # the half of a's gap before the span stays
    assert abs(out[d["node"]]["gap_ns"] - kept(d, start, end)) <= 1
    assert out[d["node"]]["dur_ns"] == d["dur_ns"] and out[d["node"]]["wait"] == d["wait"]
    rest = h.filter(~pl.col("node").is_in([r["node"] for r in (a, b, c, d)]))
    for n, g, dur in zip(rest["node"], rest["gap_ns"], rest["dur_ns"], strict=True):
        assert (out[n]["gap_ns"], out[n]["dur_ns"]) == (g, dur)


def test_a_larger_batch_after_the_advised_loader_scales_what_the_loader_left() -> None:
    """The advised loader takes the batch's loading off the step thread; a larger batch after it
    (the applied set ``dataloader_stall,memory_headroom@4``) scales only what the step thread
    still spends on the loader (the floor: a ``__next__`` that finds its batch ready), not the
    loading the workers now do. Until session 30 the loader left its column as it was, and the
    4x batch added back 3x the loading it had removed (the held-out image loop's set: 2.08x
    priced, 7.61-8.49x measured). Hand-computed over the model's own columns."""
    from traceinsight.causal.whatif import DATALOADER_FLOOR_NS

    model = model_of(PAIRS / "dataloader.before.pt.trace.json.xz")
    h = model.host
    loading = int(h["gap_dataloader_ns"].sum())
    floor = int(h["gap_dataloader_ns"].clip(upper_bound=DATALOADER_FLOOR_NS).sum())
    assert loading > 100 * floor > 0
    floored = transforms.dataloader_floor(model)
    assert floored is not None
    assert int(floored.host["gap_dataloader_ns"].sum()) == floor
    both = transforms.gpu_work_scaled(4.0)(floored)
    assert both is not None
    added = int(both.host["gap_ns"].sum()) - int(floored.host["gap_ns"].sum())
    assert abs(added - 3 * floor) <= h.height  # the Int64 casts, a ns a row
    # the workers-without-pinning variant keeps the receiving, scaled likewise
    unpinned = transforms.dataloader_unpinned(model)
    assert unpinned is not None
    kept = int(unpinned.host["gap_dataloader_ns"].sum())
    assert 0 < kept < loading
    scaled = transforms.gpu_work_scaled(4.0)(unpinned)
    assert scaled is not None
    added = int(scaled.host["gap_ns"].sum()) - int(unpinned.host["gap_ns"].sum())
    assert abs(added - 3 * kept) <= h.height


def test_without_profiler_gives_up_each_threads_whole_share_per_step() -> None:
    """Hand-computed, at 1 us an event. Thread 1, step 0: A's 20 events want 20 us of a 10 us
    gap (10 us short); B (50 us) and E (30 us, 20 us of it the loader's wait) keep 50 and 10
    us outside the loader, so each gives 1/6 of that: B 50 -> 41.67 us (its ops' share 20 ->
    16.67), E 30 -> 28.33 with the loader's 20 whole. Removed: 10 + 8.33 + 1.67 = 20 us, the
    events' share. Step 1 (C: 5 events' share from 30 us) and thread 2 (D) keep their own."""
    from traceinsight.causal.columns import SUBGAPS
    from traceinsight.causal.graph import WAIT_NONE

    rows = [  # name, tid, step, gap_ns, events, loader_ns, ops_ns
        ("A", 1, 0, 10_000, 21, 0, 6_000),
        ("B", 1, 0, 50_000, 1, 0, 20_000),
        ("E", 1, 0, 30_000, 1, 20_000, 0),
        ("C", 1, 1, 30_000, 6, 0, 0),
        ("D", 2, 0, 8_000, 1, 0, 0),
    ]
    host = pl.DataFrame(
        {
            "name": [r[0] for r in rows],
            "tid": [r[1] for r in rows],
            "step": [r[2] for r in rows],
            "gap_ns": [r[3] for r in rows],
            "recorded_events": [r[4] for r in rows],
            "dur_ns": [10_000] * len(rows),
            "wait": [WAIT_NONE] * len(rows),
            **{c: [0] * len(rows) for c in SUBGAPS},
        }
    ).with_columns(
        pl.Series("gap_dataloader_ns", [r[5] for r in rows]),
        pl.Series("gap_ops_ns", [r[6] for r in rows]),
    )
    empty = pl.DataFrame()
    out = transforms.without_profiler(StepModel(host, empty, empty), 1_000).host
    got = {r["name"]: r for r in out.iter_rows(named=True)}
    assert [got[n]["gap_ns"] for n in "ABECD"] == [0, 41_666, 28_333, 25_000, 8_000]
    assert got["E"]["gap_dataloader_ns"] == 20_000
    assert got["B"]["gap_ops_ns"] == 16_666 and got["A"]["gap_ops_ns"] == 0
    removed = sum(r[3] for r in rows[:3]) - sum(got[n]["gap_ns"] for n in "ABE")
    assert abs(removed - 20_000) <= 2  # the step's events' whole share (integer ns)
    assert all(got[n]["dur_ns"] == 9_000 for n in "ABECD")  # a call's own: at most its half


def test_overlapped_input_copies_leave_the_collectives_waits() -> None:
    """h2d_overlapped on a compute stream (1), a copy stream (2: a pinned host-to-device copy
    held 50 us by no edge, and a cast kernel) and a collective stream (3: an all-to-all held
    70 us): the copy stream's work starts when launched, the collective keeps its wait (overlapping it is comm_overlapped's
    fix; an HTA trace's 3.4 ms of side-stream copies a step were priced at the 25 ms the
    NCCL streams' overlap saves)."""
    from traceinsight.causal.graph import WAIT_NONE

    gpu = pl.DataFrame(
        {
            "op": [0, 1, 2, 4, 3],
            "chain": [1, 1, 2, 2, 3],
            "kind": ["kernel", "kernel", "memcpy", "kernel", "kernel"],
            "kernel_class": ["gemm", "gemm", None, "elementwise", "communication"],
            "copy_kind": [None, None, "HtoD", None, None],
            "name": ["gemm", "gemm", "Memcpy HtoD", "cast", "ncclDevKernel_AllToAll_RING_LL"],
            "gap_ns": [0, 0, 50_000, 10_000, 70_000],
            "dur_ns": [100_000, 100_000, 20_000, 5_000, 30_000],
            "after_op": [-1, 4, -1, -1, -1],
            "after_lag_ns": [0] * 5,
            "launched": [True] * 5,
            "start_ns": [0, 100_000, 50_000, 80_000, 70_000],
        }
    )
    host = pl.DataFrame(
        {"own_op": [-1], "wait": pl.Series([WAIT_NONE], dtype=pl.Int8), "dur_ns": [5_000]}
    )
    out = transforms.h2d_overlapped(StepModel(host, gpu, pl.DataFrame()))
    assert out is not None
    gaps = dict(zip(out.gpu["op"], out.gpu["gap_ns"], strict=True))
    assert gaps[2] == 0 and gaps[4] == 0 and gaps[3] == 70_000
    both = transforms.comm_overlapped(StepModel(host, gpu, pl.DataFrame()))
    assert both is not None and dict(zip(both.gpu["op"], both.gpu["gap_ns"], strict=True))[3] == 0
