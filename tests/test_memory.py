"""Memory: the analyzer and its findings on hand-computed tables, and against the
H200 recordings' own counters (torch.cuda.memory_stats() per step, measured outside the trace)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import polars as pl
import pytest

import traceinsight
from tests.builder import US, Events
from traceinsight.analysis import TraceAnalysis
from traceinsight.analyzers.memory import OpBytes
from traceinsight.api import analyze_trace
from traceinsight.model.schema import MEMORY_SCHEMA, OP_ARGS_SCHEMA, DeviceInfo, conform_side
from traceinsight.options import Options

from .conftest import analyzed, raw_json, unpacked_db

MIB = 1 << 20
FIX = Path(__file__).resolve().parent.parent / "fixtures" / "h200" / "memory"
MEMORY_IDS = {"memory_growth", "memory_fragmentation", "allocator_churn", "memory_headroom"}


def _memory(rows: list[tuple[float, int, int]], reserved: int, tid: int = 1) -> pl.DataFrame:
    """(time µs, signed bytes, addr) rows on GPU 0, totals as the allocator would report them."""
    df = pl.DataFrame(
        {
            "start_ns": [round(t * US) for t, _, _ in rows],
            "bytes": [b for _, b, _ in rows],
            "addr": [a for _, _, a in rows],
        }
    ).with_columns(
        pl.col("bytes").cum_sum().alias("allocated_bytes"),
        pl.lit(reserved).alias("reserved_bytes"),
        pl.lit(0).alias("rank"),
        pl.lit(0).alias("device"),
        pl.lit("cuda").alias("device_type"),
        pl.lit(1).alias("pid"),
        pl.lit(tid).alias("tid"),
        pl.lit("kineto").alias("source"),
    )
    return conform_side(df, MEMORY_SCHEMA)


def _run(ev: Events, memory: pl.DataFrame, device_bytes: int, **opts: Any) -> TraceAnalysis:
    t = ev.trace()
    t.meta.devices = [DeviceInfo(0, "GPU", memory_bytes=device_bytes)]
    t.memory = memory
    return analyze_trace(t, Options(**opts))


def _leaky(steps: int = 5, mallocs_in: tuple[int, ...] = (2, 3)) -> tuple[Events, pl.DataFrame]:
    """Steps of 100 µs; in each, aten::leaky keeps 1 MiB (never freed) and aten::mm allocates
    4 MiB it frees 40 µs later; kernels keep the GPU busy; cudaMalloc in ``mallocs_in``."""
    ev = Events()
    rows: list[tuple[float, int, int]] = []
    for k in range(steps):
        t0 = k * 100
        ev.step(k, t0, 100)
        ev.op("aten::leaky", t0 + 5, 10)
        ev.op("aten::mm", t0 + 18, 10)
        ev.kernel("gemm", t0 + 30, 60, launch_us=t0 + 20)
        rows += [(t0 + 10, MIB, 1000 + k), (t0 + 20, 4 * MIB, 50), (t0 + 60, -4 * MIB, 50)]
        if k in mallocs_in:
            ev.runtime("cudaMalloc", t0 + 19, 2)
    return ev, _memory(rows, reserved=12 * MIB)


def test_hand_computed_leak() -> None:
    ev, mem = _leaky()
    a = _run(ev, mem, 16 * MIB)
    m = a.metrics
    # steady steps 1..4 (five steps: the first is warm-up); allocated at their starts 1..4 MiB,
    # 5 MiB at the last one's end: 1 MiB per step
    assert a.results.memory.steady_steps == (1, 2, 3, 4)
    assert m["memory_growth_bytes_per_step"] == MIB
    assert m["memory_peak_allocated_bytes"] == 9 * MIB  # 5 kept + 4 live in step 4
    assert m["memory_peak_reserved_bytes"] == 12 * MIB
    assert m["device_memory_bytes"] == 16 * MIB
    assert m["memory_headroom_ratio"] == pytest.approx(1 - 12 / 16)
    assert m["memory_fragmentation_ratio"] == pytest.approx(1 - 9 / 12)
    assert m["allocator_device_allocs_per_step"] == pytest.approx(2 / 4)
    assert m["allocator_device_frees_per_step"] == 0
    d = a.results.memory.devices[0]
    assert d.never_freed_bytes_per_step == MIB  # steps 1..3 (the last's may outlive the trace)
    assert d.never_freed[0].op == "aten::leaky"
    assert d.steps_until_full == pytest.approx((16 - 9) / 1)
    assert d.peak_op == d.peak_root_op == "aten::mm"  # the 4 MiB of step 4 at 420 µs
    assert d.step_span_bytes == 5 * MIB  # each step's peak above its start (the kept 1 MiB too)
    assert d.top_ops_at_peak[0] == OpBytes("aten::leaky", 5 * MIB, 5)
    assert {t.op: t.bytes for t in d.top_ops_at_peak}["aten::mm"] == 4 * MIB
    f = next(f for f in a.findings if f.id == "memory_growth")
    assert f.severity == "high"  # full in 7 steps
    assert f.evidence["never_freed"][0].op == "aten::leaky"


def test_shapes_of_never_freed_allocations_from_op_args() -> None:
    ev, mem = _leaky()
    t = ev.trace()
    t.meta.devices = [DeviceInfo(0, "GPU", memory_bytes=16 * MIB)]
    t.memory = mem
    leaky = t.events.filter(pl.col("name") == "aten::leaky")
    t.op_args = conform_side(
        leaky.select("rank", "pid", "tid", "start_ns", "dur_ns", "name").with_columns(
            pl.lit("[[256, 1024]]").alias("input_dims")
        ),
        OP_ARGS_SCHEMA,
    )
    d = analyze_trace(t, Options()).results.memory.devices[0]
    assert d.never_freed[0].input_dims == "[[256, 1024]]"


def test_no_memory_events_gives_null_metrics() -> None:
    ev, _ = _leaky(mallocs_in=())
    a = _run(ev, conform_side(pl.DataFrame(), MEMORY_SCHEMA), 16 * MIB)
    for k in ("memory_peak_allocated_bytes", "memory_growth_bytes_per_step", "device_memory_bytes"):
        assert a.metrics[k] is None
    assert not MEMORY_IDS & {f.id for f in a.findings}


def _cached(mallocs_per_step: int, empty_cache: bool = False) -> TraceAnalysis:
    """Reserved 100 MiB, at most 10 MiB allocated: blocks cached by earlier work."""
    ev = Events()
    rows: list[tuple[float, int, int]] = [(0.5, 2 * MIB, 1)]
    for k in range(4):
        t0 = k * 100
        ev.step(k, t0, 100)
        ev.kernel("gemm", t0 + 5, 90, launch_us=t0 + 1)
        rows += [(t0 + 10, 8 * MIB, 7), (t0 + 50, -8 * MIB, 7)]
        ev.op("aten::mm", t0 + 15, 70)  # a cudaMalloc inside an op: a cache miss, a retry
        for i in range(mallocs_per_step):
            ev.runtime("cudaMalloc", t0 + 20 + i * 5, 2)
            ev.runtime("cudaFree", t0 + 60 + i * 5, 2)
        if empty_cache:
            ev.op("torch.cuda.empty_cache", t0 + 58, 20)
    return _run(ev, _memory(rows, reserved=100 * MIB), 1000 * MIB, replay=False)


def test_reserved_far_above_allocated_alone_is_not_fragmentation() -> None:
    a = _cached(0)
    assert a.metrics["memory_fragmentation_ratio"] == pytest.approx(0.9)
    assert not MEMORY_IDS & {f.id for f in a.findings}


def test_fragmentation_needs_allocator_activity() -> None:
    ids = {f.id: f for f in _cached(2).findings}
    assert "memory_fragmentation" in ids and "allocator_churn" not in ids
    assert "expandable_segments:True" in ids["memory_fragmentation"].recommendation
    # empty_cache() in the steps explains the calls: churn, not fragmentation
    ids = {f.id: f for f in _cached(2, empty_cache=True).findings}
    assert "allocator_churn" in ids and "memory_fragmentation" not in ids
    assert ids["allocator_churn"].what_if is None  # no replay: no estimate
    assert ids["allocator_churn"].evidence["why_no_estimate"]


def test_headroom_never_raised_on_a_busy_gpu() -> None:
    a = _cached(0)  # GPU 90% busy, 90% of memory unused
    assert a.metrics["memory_headroom_ratio"] == pytest.approx(0.9)
    assert "memory_headroom" not in {f.id for f in a.findings}
    assert a.results.memory.batch_gains == ()


# --- the H200 recordings ---------------------------------------------------------------------


def _truth(name: str) -> dict[str, Any]:
    return json.loads((FIX / f"{name}.truth.json").read_text())


def _analysis(name: str) -> TraceAnalysis:
    return traceinsight.analyze(FIX / f"{name}.pt.trace.json.xz", replay=True)


def _by_iteration(truth: dict[str, Any]) -> dict[int, dict[str, int]]:
    return {it["iteration"]: it["memory"] for it in truth["profiled"]["iterations"]}


ALL = [
    "mem_healthy",
    "mem_leak",
    "mem_empty_cache",
    "mem_small_batch",
    "mem_dynamic_default",
    "mem_dynamic_expandable",
]


@pytest.fixture(scope="module")
def analyses() -> dict[str, TraceAnalysis]:
    return {n: _analysis(n) for n in ALL}


@pytest.mark.parametrize("name", ALL)
def test_h200_peaks_growth_and_allocator_calls_match_torch(name: str, analyses) -> None:
    a, truth = analyses[name], _truth(name)
    m, mem = a.metrics, a.results.memory
    it = _by_iteration(truth)
    steps = mem.steady_steps  # ProfilerStep#N is iteration N of the recording
    assert steps and all(s in it for s in steps)
    # peaks: torch's per-iteration peak (reset before each iteration) over the steps
    peak = max(it[s]["allocated_bytes.all.peak"] for s in steps)
    assert m["memory_peak_allocated_bytes"] == pytest.approx(peak, rel=0.05)
    reserved = max(it[s]["reserved_bytes.all.current"] for s in steps)
    if truth.get("empty_cache_calls_per_step"):
        # reserved is read after empty_cache() released it; the trace sees it before
        assert m["memory_peak_reserved_bytes"] >= reserved
    else:
        assert m["memory_peak_reserved_bytes"] == pytest.approx(reserved, rel=0.05)
    assert m["device_memory_bytes"] == truth["total_memory"]
    # growth: allocated after each step's work was issued (the boundaries the trace reads)
    cur = [it[s]["allocated_bytes.all.current"] for s in (steps[0] - 1, *steps)]
    measured = (cur[-1] - cur[0]) / len(steps)
    assert abs(m["memory_growth_bytes_per_step"] - measured) <= 0.1 * max(measured, MIB)
    # cudaMalloc/cudaFree inside the steps vs the allocator's own device allocs/frees
    for key, metric in (
        ("num_device_alloc", "allocator_device_allocs_per_step"),
        ("num_device_free", "allocator_device_frees_per_step"),
    ):
        calls = (it[steps[-1]][key] - it[steps[0] - 1][key]) / len(steps)
        assert m[metric] == pytest.approx(calls, rel=0.15, abs=1e-9)


def test_h200_leak_is_found_with_the_op_that_keeps_it(analyses) -> None:
    a, truth = analyses["mem_leak"], _truth("mem_leak")
    f = next(f for f in a.findings if f.id == "memory_growth")
    leaked = truth["leaked_bytes_per_step"]
    assert f.evidence["growth_bytes_per_step"] == pytest.approx(leaked, rel=0.1)
    top = f.evidence["never_freed"][0]
    # the model's last linear keeps its bf16 output [32 * 256, 512]
    assert top.op == "aten::addmm" and "[8192, 512]" in top.input_dims
    assert top.bytes_per_step == pytest.approx(leaked, rel=0.1)
    # the peak is in backward: the op allocating then and the autograd node around it
    d = a.results.memory.devices[0]
    assert d.peak_root_op.startswith("autograd::engine::evaluate_function: ")
    free = truth["total_memory"] - a.metrics["memory_peak_allocated_bytes"]
    assert f.evidence["steps_until_full"] == pytest.approx(free / leaked, rel=0.1)


def test_h200_empty_cache_churn_with_the_models_estimate(analyses) -> None:
    a = analyses["mem_empty_cache"]
    f = next(f for f in a.findings if f.id == "allocator_churn")
    # empty_cache() itself is no op in the trace: its cudaFree calls run between ops
    assert f.evidence["frees_outside_ops_per_step"] == pytest.approx(15, rel=0.15)
    assert "empty_cache" in f.title and "empty_cache()" in f.recommendation
    # the cost is the causal model's saving: its no_empty_cache transform (findings/savings.py)
    w = f.what_if
    assert w == a.results.replay.what_if["no_empty_cache"] and w.speedup > 1
    saved = 1 - w.step_time_after_ns / w.step_time_ns
    assert f.cost_ratio == pytest.approx(saved)
    assert f.evidence["attributed_ns"] > 0 and f.evidence["transform"] == "no_empty_cache"


def test_h200_headroom_prediction_matches_measured_throughput(analyses) -> None:
    a, truth = analyses["mem_small_batch"], _truth("mem_small_batch")
    f = next(f for f in a.findings if f.id == "memory_headroom")
    # graded by its saving, as every finding (it is often the largest lever)
    assert f.severity == "high" and f.cost_ratio >= 0.25
    base = next(t for t in truth["throughput_unprofiled"] if t["multiple"] == 1)
    gains = {g.multiplier: g.throughput_gain for g in f.evidence["gain_by_multiplier"]}
    compared = 0
    for t in truth["throughput_unprofiled"]:
        m = t["multiple"]
        if m in gains:
            measured = t["samples_per_s"] / base["samples_per_s"]
            assert gains[m] == pytest.approx(measured, rel=0.3), m
            compared += 1
    assert compared >= 3
    m = f.evidence["multiplier"]
    assert f.what_if.speedup == gains[m]
    assert f.cost_ratio == pytest.approx(1 - 1 / f.what_if.speedup, abs=1e-3)
    # the batch that fits stays within 80% of the device
    assert f.evidence["predicted_peak_allocated_bytes"] <= 0.8 * truth["total_memory"]


def test_headroom_advice_on_a_forward_only_loop_keeps_to_inference(analyses) -> None:
    """Session 52 (a public H100 inference loop under no_grad): memory_headroom told it to
    scale the learning rate and accumulate fewer micro-batches. Where no backward or optimizer
    step ran, the advice is to batch more per forward pass; a training loop keeps the rest."""
    from dataclasses import replace

    from traceinsight.findings import default_thresholds, diagnose

    r = analyses["mem_small_batch"].results
    train = next(f for f in diagnose(r, default_thresholds()) if f.id == "memory_headroom")
    assert "learning rate" in train.recommendation
    serve = replace(r, host_ops=replace(r.host_ops, forward_only=True))
    f = next(f for f in diagnose(serve, default_thresholds()) if f.id == "memory_headroom")
    assert "learning rate" not in f.recommendation and "micro-batches" not in f.recommendation
    assert f.recommendation.endswith("batch more requests or samples per forward pass.")
    assert "accumulation" not in (f.snippet or "")


def test_h200_headroom_without_the_model_says_why() -> None:
    a = traceinsight.analyze(FIX / "mem_small_batch.pt.trace.json.xz", replay=False)
    f = next(f for f in a.findings if f.id == "memory_headroom")
    assert f.what_if is None and "replay" in f.evidence["why_no_estimate"]


@pytest.mark.parametrize(
    "name", ["mem_healthy", "mem_dynamic_default", "mem_dynamic_expandable", "mem_small_batch"]
)
def test_h200_no_memory_alarm_above_low(name: str, analyses) -> None:
    """No memory problem is raised on these loops; a larger batch (memory_headroom, a lever
    graded by its predicted saving like any other) may be."""
    loud = [
        (f.id, f.severity)
        for f in analyses[name].findings
        if f.id in MEMORY_IDS - {"memory_headroom"} and f.severity not in ("low", "info")
    ]
    assert not loud
    ids = {f.id for f in analyses[name].findings}
    assert not {"memory_growth", "memory_fragmentation", "allocator_churn"} & ids


def test_h200_dynamic_default_is_fragmented_but_not_flagged(analyses) -> None:
    # 3 GB reserved for 0.5 GB allocated, cached by the warm-up's ramp: no allocator activity
    d, e = analyses["mem_dynamic_default"], analyses["mem_dynamic_expandable"]
    assert d.metrics["memory_fragmentation_ratio"] > 0.8
    assert e.metrics["memory_fragmentation_ratio"] < 0.3
    assert d.metrics["allocator_device_allocs_per_step"] == 0


# --- inputs: export_memory_timeline, nsys CUDA_GPU_MEMORY_USAGE_EVENTS, export ----------------


def test_memory_timeline_raw_and_plot_exports(tmp_path: Path) -> None:
    import gzip

    from traceinsight.parsers import load_trace

    # as torch writes them (_memory_profiler.py export_memory_timeline_raw / _coalesce_timeline):
    # (time ns, action, bytes, category), PREEXISTING at -1; and [times µs, sizes by category]
    raw = [
        [-1, 1, 1000, 0],
        [5000, 2, 300, 3],
        [6000, 3, -300, 3],
        [6000, 3, 300, 4],
        [9000, 4, -300, 4],
    ]
    p = tmp_path / "m.raw.json.gz"
    p.write_bytes(gzip.compress(json.dumps(raw).encode()))
    t = load_trace(p)
    assert t.events.height == 0 and t.meta.format == "memory-timeline"
    assert t.memory["allocated_bytes"].to_list() == [1000, 1300, 1000, 1300, 1000]
    assert t.memory["start_ns"].to_list() == [5000, 5000, 6000, 6000, 9000]
    assert set(t.memory["source"]) == {"memory_timeline"}
    # _CATEGORY_TO_INDEX: 0 parameter, 3 temporary, 4 activation
    assert t.memory["category"].to_list() == [
        "parameter",
        "temporary",
        "temporary",
        "activation",
        "activation",
    ]
    a = analyzed(p)
    assert a.metrics["memory_peak_allocated_bytes"] == 1300
    assert a.metrics["memory_peak_reserved_bytes"] is None
    plot = [[5, 6, 9], [[0, 1000, 300, 0], [0, 1000, 0, 300], [0, 1000, 0, 0]]]
    q = tmp_path / "m.json"
    q.write_text(json.dumps(plot))
    t = load_trace(q)
    # one row per time and category that changed (sizes[i][k + 1]: category index k), bytes
    # its change, allocated the total then
    assert t.memory["start_ns"].to_list() == [5000, 5000, 6000, 6000, 9000]
    assert t.memory["category"].to_list() == [
        "parameter",
        "optimizer_state",
        "optimizer_state",
        "input",
        "input",
    ]
    assert t.memory["bytes"].to_list() == [1000, 300, -300, 300, -300]
    assert t.memory["allocated_bytes"].to_list() == [1300, 1300, 1300, 1300, 1000]
    assert analyzed(q).metrics["memory_peak_allocated_bytes"] == 1300


def test_the_real_memory_timeline_export_is_read() -> None:
    a = analyzed(FIX.parent.parent / "corpus" / "memory_timeline.raw.gz")
    assert a.metrics["memory_peak_allocated_bytes"] > 0
    assert a.results.memory.devices[0].timeline["t_ns"]


def test_a_memory_timeline_is_no_empty_trace() -> None:
    """torch's export_memory_timeline holds the allocator's timeline and no events by design:
    no empty_trace error, PyTorch's advice, and the capture span of its points (session 56's
    audit: a public ResNet-50 timeline read "nothing was recorded", "no PyTorch seen", 0 ns).
    Raw events at time -1 are the allocations made before the profiler started."""
    path = FIX.parent.parent / "corpus" / "memory_timeline.raw.gz"
    times = [e[0] for e in json.loads(gzip.decompress(path.read_bytes())) if e[0] >= 0]
    a = analyzed(path)
    assert not [c for c in a.data_quality if c["severity"] == "error"]
    assert a.source["framework"] == "pytorch"
    assert a.source["capture_span_ns"] == max(times) - min(times)


def test_nsys_memory_usage_events(tmp_path: Path) -> None:
    import shutil
    import sqlite3

    from traceinsight.parsers import load_trace

    src = unpacked_db(FIX.parent.parent / "nsys" / "nsys-ai__mock.sqlite")
    db = tmp_path / "m.sqlite"
    shutil.copy(src, db)
    con = sqlite3.connect(db)
    (gpid,) = con.execute("SELECT globalPid FROM CUPTI_ACTIVITY_KIND_KERNEL LIMIT 1").fetchone()
    con.execute(
        "CREATE TABLE CUDA_GPU_MEMORY_USAGE_EVENTS (start INTEGER, globalPid INTEGER, deviceId "
        "INTEGER, contextId INTEGER, address INTEGER, pc INTEGER, bytes INTEGER, memKind INTEGER, "
        "memoryOperationType INTEGER, name TEXT, correlationId INTEGER)"
    )
    rows = [
        (100, 2 << 20, 2, 0, 1),
        (200, 4 << 20, 2, 0, 2),
        (300, 2 << 20, 2, 1, 1),
        (400, 8, 1, 0, 9),
    ]
    con.executemany(
        "INSERT INTO CUDA_GPU_MEMORY_USAGE_EVENTS VALUES (?, ?, 0, 1, ?, 0, ?, ?, ?, NULL, NULL)",
        [(s, gpid, addr, b, kind, op) for s, b, kind, op, addr in rows],
    )
    con.commit()
    con.close()
    t = load_trace(db)
    m = t.memory
    # pinned host memory (memKind 1) left out; frees negative; reserved = the running total
    assert m["bytes"].to_list() == [2 << 20, 4 << 20, -(2 << 20)]
    assert m["reserved_bytes"].to_list() == [2 << 20, 6 << 20, 4 << 20]
    assert m["allocated_bytes"].null_count() == 3 and set(m["source"]) == {"nsys"}
    offset = t.meta.extra.get("session_start_utc_ns", 0)
    assert m["start_ns"][0] == 100 + offset


def test_export_writes_the_memory_table_beside_the_events(tmp_path: Path) -> None:
    from traceinsight.cli import main

    out = tmp_path / "ev.parquet"
    assert main(["export", str(FIX / "mem_leak.pt.trace.json.xz"), "-o", str(out), "-q"]) == 0
    mem = pl.read_parquet(tmp_path / "ev.memory.parquet")
    assert mem.schema == pl.Schema(MEMORY_SCHEMA) and mem.height > 1000
    assert mem["category"].null_count() == mem.height  # Kineto's events name no category
    assert pl.read_parquet(tmp_path / "ev.op_args.parquet").height > 0


# --- reports --------------------------------------------------------------------------------


def test_reports_show_memory(analyses, tmp_path: Path) -> None:
    from traceinsight.diff import compare
    from traceinsight.report.diff_html import render_diff_html
    from traceinsight.report.html import render_html
    from traceinsight.report.terminal import render_diff_summary, render_summary

    a = analyses["mem_leak"]
    doc = a.to_json()
    text = render_summary(doc)
    (line,) = [x for x in text.splitlines() if x.startswith("  memory ")]
    assert "748.6 MB allocated" in line and "+8.4 MB per step" in line
    html = render_html(doc)
    section = html[html.index('<section id="memory">') :]
    section = section[: section.index("</section>")]
    assert section.count("<polyline") == 2 and "peak 748.6 MB allocated" in section
    assert "never freed" in section and "memory_growth" in section
    # no memory events: the section says how to record them, the summary has no memory line
    ev, _ = _leaky(mallocs_in=())
    plain = _run(ev, conform_side(pl.DataFrame(), MEMORY_SCHEMA), MIB).to_json()
    assert "profile_memory=True" in render_html(plain)
    assert "  memory " not in render_summary(plain)
    d = compare(analyses["mem_healthy"], a)
    rows = {r["metric"]: r for r in d["memory"]}
    assert rows["memory_growth_bytes_per_step"]["after"] == pytest.approx(8 * MIB)
    assert rows["memory_peak_allocated_bytes"]["before"] == 706083328
    assert "memory_growth_bytes_per_step" in render_diff_summary(d)
    assert '<section id="memory">' in render_diff_html(d)


def test_two_devices_give_per_device_metrics() -> None:
    ev, mem = _leaky(mallocs_in=())
    other = mem.with_columns(pl.lit(1, pl.Int32).alias("device"), (pl.col("addr") + 10**6))
    t = ev.trace()
    t.meta.devices = [
        DeviceInfo(0, "GPU", memory_bytes=16 * MIB),
        DeviceInfo(1, "GPU", memory_bytes=32 * MIB),
    ]
    t.memory = conform_side(pl.concat([mem, other]), MEMORY_SCHEMA)
    m = analyze_trace(t, Options()).metrics
    assert m["memory_peak_allocated_bytes"] == {"0": 9 * MIB, "1": 9 * MIB}
    assert m["device_memory_bytes"] == {"0": 16 * MIB, "1": 32 * MIB}
    assert m["memory_headroom_ratio"]["1"] == pytest.approx(1 - 12 / 32)
    assert isinstance(m["allocator_device_allocs_per_step"], float)  # per trace


@pytest.fixture(scope="module")
def torch_timeline(tmp_path_factory) -> tuple[Path, Path]:
    """A CPU torch recording's export_memory_timeline, raw and plot: a two-layer MLP trained
    three steps with Adam (parameters, optimizer state, inputs, activations, gradients)."""
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    with profile(
        activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True
    ) as p:
        for _ in range(3):
            model(torch.randn(128, 64)).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
    d = tmp_path_factory.mktemp("timeline")
    raw, plot = d / "t.raw.json.gz", d / "t.json"
    import warnings

    with warnings.catch_warnings():  # deprecated in torch 2.x, still written
        warnings.simplefilter("ignore", FutureWarning)
        p.export_memory_timeline(str(raw), device="cpu")
        p.export_memory_timeline(str(plot), device="cpu")
    return raw, plot


def test_memory_timeline_as_torch_writes_it(torch_timeline) -> None:
    peaks = [analyzed(f).metrics["memory_peak_allocated_bytes"] for f in torch_timeline]
    assert peaks[0] == peaks[1] > 0  # the two layouts of one recording agree


def _torch_category_names() -> dict[int, str]:
    """torch's own index -> category map (_memory_profiler._CATEGORY_TO_INDEX; None: unknown)."""
    from torch.profiler._memory_profiler import _CATEGORY_TO_INDEX

    return {
        i: c.name.lower() if c is not None else "unknown" for c, i in _CATEGORY_TO_INDEX.items()
    }


def test_categories_at_the_peak_from_torchs_timeline(torch_timeline, tmp_path: Path) -> None:
    from itertools import accumulate

    from traceinsight.model.schema import MEMORY_CATEGORIES
    from traceinsight.parsers import load_trace
    from traceinsight.report.html import render_html

    raw, plot = torch_timeline
    names = _torch_category_names()
    assert tuple(names[i] for i in range(len(names))) == MEMORY_CATEGORIES
    # the raw rows by hand: pre-existing tensors (-1) at the first time, rows in time order,
    # the running sum's first maximum, the bytes of every row up to it by category
    rows = json.loads(raw_json(raw))
    first = min(r[0] for r in rows if r[0] >= 0)
    rows = sorted(([t if t >= 0 else first, b, c] for t, _, b, c in rows), key=lambda r: r[0])
    running = list(accumulate(b for _, b, _ in rows))
    peak = max(running)
    i = running.index(peak)
    want = dict.fromkeys(MEMORY_CATEGORIES, 0)
    for _, b, c in rows[: i + 1]:
        want[names[c]] += b
    assert sum(want.values()) == peak
    assert min(want[c] for c in ("parameter", "optimizer_state", "activation", "gradient")) > 0
    a = analyzed(raw)
    assert a.metrics["memory_peak_allocated_bytes"] == peak
    assert a.metrics["memory_peak_by_category_bytes"] == want
    assert a.results.memory.devices[0].peak_by_category_bytes == want
    # Adam keeps two moments per parameter (twice the parameters' bytes) and a float32 step
    # count per parameter tensor (2 weights, 2 biases)
    assert want["optimizer_state"] == 2 * want["parameter"] + 4 * 4
    # the plot by hand: the first time of the highest total, sizes[i][k + 1] for category k
    times, sizes = json.loads(plot.read_text())
    totals = [sum(s) for s in sizes]
    j = totals.index(max(totals))
    want_plot = {names[k]: sizes[j][k + 1] for k in range(len(names))}
    b = analyzed(plot)
    assert b.metrics["memory_peak_by_category_bytes"] == want_plot == want
    # the table's rows: a category per row, its change, the total over categories then
    t = load_trace(plot).memory
    assert set(t["category"].drop_nulls()) <= set(MEMORY_CATEGORIES)
    assert t["category"].null_count() == 0
    assert t["allocated_bytes"].max() == max(totals)
    # the report: the bytes by category at the peak
    html = render_html(a.to_json())
    section = html[html.index('<section id="memory">') :]
    section = section[: section.index("</section>")]
    assert "<th>at the peak</th>" in section
    from traceinsight.report.format import fmt_bytes

    line = "At the peak: " + ", ".join(
        f"{label} {fmt_bytes(want[c])}"
        for c, label in (
            ("parameter", "parameters"),
            ("optimizer_state", "optimizer state"),
            ("input", "inputs"),
            ("temporary", "temporaries"),
            ("activation", "activations"),
            ("gradient", "gradients"),
            ("autograd_detail", "autograd detail"),
            ("unknown", "unknown"),
        )
        if want[c]
    )
    assert line in section
    # a Kineto trace's memory events have no categories: no table, a null metric
    k = traceinsight.analyze(FIX / "mem_small_batch.pt.trace.json.xz", replay=False)
    assert k.metrics["memory_peak_by_category_bytes"] is None
    assert "<th>at the peak</th>" not in render_html(k.to_json())


def test_export_writes_the_category_column(torch_timeline, tmp_path: Path) -> None:
    from traceinsight.cli import main

    raw, _ = torch_timeline
    out = tmp_path / "t.parquet"
    assert main(["export", str(raw), "-o", str(out), "-q"]) == 0
    mem = pl.read_parquet(tmp_path / "t.memory.parquet")
    assert mem.schema == pl.Schema(MEMORY_SCHEMA) and mem["category"].null_count() == 0
    # the raw rows one for one, each with its category

    rows = json.loads(raw_json(raw))
    names = _torch_category_names()
    counts = {}
    for r in rows:
        counts[names[r[3]]] = counts.get(names[r[3]], 0) + 1
    assert dict(mem.group_by("category").len().iter_rows()) == counts


def test_headroom_uses_the_measured_activation_share() -> None:
    from traceinsight.parsers import load_trace

    t = load_trace(FIX / "mem_small_batch.pt.trace.json.xz")
    # categories by address (an allocation and its free share one): 3 kinds of tensor
    t.memory = t.memory.with_columns(
        pl.col("addr")
        .mod(3)
        .replace_strict([0, 1, 2], ["activation", "temporary", "parameter"], return_dtype=pl.String)
        .alias("category")
    )
    a = analyze_trace(t, Options(replay=False))
    d = a.results.memory.devices[0]
    f = next(f for f in a.findings if f.id == "memory_headroom")
    # by hand: the rows up to the peak's, summed by category
    rows = t.memory.select("start_ns", "bytes", "allocated_bytes", "category").rows()
    i = next(
        k for k, (s, _, al, _) in enumerate(rows) if s == d.peak_ns and al == d.peak_allocated_bytes
    )
    act = sum(b for _, b, _, c in rows[: i + 1] if c in ("activation", "temporary"))
    assert f.evidence["activation_bytes_at_peak"] == act > 0
    assert f.evidence["activation_ratio"] == pytest.approx(act / d.peak_allocated_bytes)
    assert f.evidence["activation_ratio_source"].startswith("measured")
    assert f.evidence["peak_by_category_bytes"]["parameter"] == sum(
        b for _, b, _, c in rows[: i + 1] if c == "parameter"
    )
    # without categories: the step-span estimate, said so
    plain = traceinsight.analyze(FIX / "mem_small_batch.pt.trace.json.xz", replay=False)
    g = next(f for f in plain.findings if f.id == "memory_headroom")
    e = plain.results.memory.devices[0]
    assert g.evidence["activation_ratio"] == pytest.approx(
        e.step_span_bytes / e.peak_allocated_bytes
    )
    assert g.evidence["activation_ratio_source"].startswith("estimated")
    assert g.evidence["peak_by_category_bytes"] is None


def test_job_summary_has_the_memory_line(tmp_path: Path, capsys) -> None:
    import shutil

    from traceinsight.cli import main

    for r, name in enumerate(("mem_healthy", "mem_leak")):
        shutil.copy(FIX / f"{name}.pt.trace.json.xz", tmp_path / f"rank{r}.pt.trace.json.xz")
    assert main(["analyze", str(tmp_path), "--no-html"]) == 0
    (line,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith("  memory ")]
    assert "rank 1: peak 748.6 MB allocated" in line  # the rank with the highest peak


def test_headroom_gaining_under_its_minimum_is_no_finding(analyses) -> None:
    """Audit 20: "a 2x batch fits ... and would raise throughput 1.0x" on a GH200 loop, counted
    in all fixes. The small-batch loop's batch gains well over the minimum (headroom_min_speedup,
    1.10 by default); a minimum just above its gain leaves no finding."""
    a = analyses["mem_small_batch"]
    f = next(f for f in a.findings if f.id == "memory_headroom")
    gain = f.what_if.speedup
    assert gain >= 1.10 and f"{gain:.2f}x" in f.title
    above = traceinsight.analyze(
        FIX / "mem_small_batch.pt.trace.json.xz", thresholds={"headroom_min_speedup": gain + 0.01}
    )
    assert "memory_headroom" not in {f.id for f in above.findings}
