"""Analyzers against what the generator measured on the H200 itself (fixtures/h200/*.truth.json)."""

import json

import pytest

from .conftest import H200, analyzed, raw_json

# The 4th recorded step contains the profiler's own trace export: compare the first three.
COMPARED_STEPS = 3
STEP_TOLERANCE = 0.03  # 3% of the CUDA-event step time


def load(name):
    return analyzed(H200 / f"{name}.pt.trace.json.xz"), json.loads(
        (H200 / f"{name}.truth.json").read_text()
    )


@pytest.mark.parametrize(
    "name",
    [
        "healthy_bf16",
        "sync_item_print",
        "fp32",
        "act_checkpoint_bf16",
        "dataloader_starved",
        "launch_bound_eager",
        "launch_bound_compiled",
        "launch_bound_cudagraph",
        "h2d_pageable",
        "h2d_pinned",
        "unfused_adamw_bf16",
    ],
)
def test_step_times_match_cuda_events(name):
    a, truth = load(name)
    got = [s.dur_ns / 1e6 for s in a.results.steps.per_step][:COMPARED_STEPS]
    want = truth["step_time_ms"][:COMPARED_STEPS]
    assert len(got) == COMPARED_STEPS
    for g, w in zip(got, want, strict=True):
        assert g == pytest.approx(w, rel=STEP_TOLERANCE)


# workload -> the finding that must come first
FIRST = {
    "dataloader_starved": "dataloader_stall",
    "launch_bound_eager": "launch_bound",
    "h2d_pageable": "pageable_memcpy",
    "fp32": "fp32_compute",
    "unfused_adamw_bf16": "unfused_optimizer",
    "act_checkpoint_bf16": "recompute_overhead",
    "sync_item_print": "host_sync",
}


@pytest.mark.parametrize(("name", "first"), sorted(FIRST.items()))
def test_diagnosis_names_the_right_cause_first(name, first):
    """The recorded cause is among the first two findings (ordered by the saving the causal
    model predicts) and graded above info. Some of these loops hold a second cause the model
    ranks level with or above it: launch_bound_eager also runs AdamW(foreach=False) (CUDA
    graphs 1.63x vs the fused optimizer 1.64x), act_checkpoint_bf16 is launch-bound too
    (1.26x vs 1.20x), and unfused_adamw_bf16's GPU is 81% busy, so its optimizer fix saves 8%
    there (elementwise fusion 25%)."""
    a, _ = load(name)
    # a larger batch (small_batch, memory_headroom) is a lever that changes the workload, not
    # a cause of these loops; none of them recorded it: the causes are ranked among the rest
    ids = [f.id for f in a.findings if f.id not in ("small_batch", "memory_headroom")]
    assert first in ids[:2], ids
    f = a.findings[ids.index(first)]
    assert f.severity != "info"
    assert f.what_if is not None and f.what_if.speedup > 1.05


@pytest.mark.parametrize("name", ["healthy_bf16", "h2d_pinned", "launch_bound_cudagraph"])
def test_healthy_or_fixed_workloads_have_no_starvation_finding(name):
    a, _ = load(name)
    bad = {"dataloader_stall", "launch_bound", "host_sync", "pageable_memcpy", "gpu_underutilized"}
    assert not [f.id for f in a.findings if f.id in bad and f.severity in ("high", "medium")]


def test_healthy_has_no_high_or_medium_and_busy_matches_compute():
    a, truth = load("healthy_bf16")
    assert not [f for f in a.findings if f.severity in ("high", "medium")]
    # compute_only_ms: the same step timed by CUDA events with nothing but compute in it (33.48 ms).
    # The GPU's busy time in each recorded step is that, less the ~2.5% of launch gaps between
    # kernels that the CUDA-event span includes: within 4% below, never above.
    compute_ns = truth["compute_only_ms"] * 1e6
    for s in a.results.steps.per_step[:COMPARED_STEPS]:
        assert 0.96 * compute_ns <= s.gpu_busy_ns <= compute_ns
    # busy share of the window: compute-only time over the CUDA-event step time (0.99), within 3 points
    step_ms = sum(truth["step_time_ms"][:COMPARED_STEPS]) / COMPARED_STEPS
    assert a.metrics["gpu_busy_ratio"] == pytest.approx(
        truth["compute_only_ms"] / step_ms, abs=0.03
    )


def test_dataloader_idle_matches_time_in_next():
    a, truth = load("dataloader_starved")
    # time in next(loader), measured with perf_counter in the loop
    in_next_ns = sum(s["next_ns"] for s in truth["per_step"])
    assert a.metrics["idle_by_cause_ns"]["dataloader"] == pytest.approx(in_next_ns, rel=0.05)
    assert a.metrics["dataloader_ratio"] == pytest.approx(
        in_next_ns / sum(s.dur_ns for s in a.results.steps.per_step), rel=0.05
    )


def test_pageable_vs_pinned_copies():
    pageable, t1 = load("h2d_pageable")
    pinned, t2 = load("h2d_pinned")
    per_step = t1["per_step"][0]["bytes_h2d"]
    assert pageable.metrics["h2d_bytes"] == pytest.approx(4 * per_step, rel=0.01)
    assert pageable.metrics["h2d_pageable_bytes_ratio"] == 1.0
    assert pinned.metrics["h2d_pageable_bytes_ratio"] == 0.0
    assert pinned.metrics["h2d_overlap_ratio"] > 0.8  # side-stream prefetch hides the copies
    assert pageable.metrics["h2d_overlap_ratio"] < 0.05


def test_launch_bound_fixes_raise_busy_and_cut_kernels():
    eager, _ = load("launch_bound_eager")
    graph, _ = load("launch_bound_cudagraph")
    assert eager.metrics["gpu_busy_ratio"] < 0.2 < 0.8 < graph.metrics["gpu_busy_ratio"]
    assert eager.metrics["short_kernel_ratio"] > 0.5
    assert graph.results.launch.graph_launches >= 4


def test_ddp_overlap_vs_no_overlap():
    over = analyzed(H200 / "ddp_overlap" / "rank0.pt.trace.json.xz")
    none = analyzed(H200 / "ddp_no_overlap" / "rank0.pt.trace.json.xz")
    assert none.metrics["comm_compute_overlap_ratio"] == pytest.approx(0.0, abs=0.02)
    assert over.metrics["comm_compute_overlap_ratio"] > 0.3
    assert none.results.comm.comm_kernel_count > 0


def test_fp32_ratio():
    a, _ = load("fp32")
    h, _ = load("healthy_bf16")
    assert a.metrics["fp32_gemm_time_ratio"] > 0.95
    assert h.metrics["fp32_gemm_time_ratio"] < 0.01


def test_recompute_only_with_checkpointing():
    ck, truth = load("act_checkpoint_bf16")
    h, htruth = load("healthy_bf16")
    assert h.metrics["recompute_time_ratio"] == 0.0
    # Checkpointing adds compute_only 44.69 - 33.48 = 11.2 ms (CUDA events, truth files) to a
    # 67.9 ms step (mean of the compared steps): 16.5%. Within 10%: the checkpointed step times
    # themselves spread 5% (65.6-69.0 ms); counting only the recomputed kernels (12.4%) fails.
    step_ms = sum(truth["step_time_ms"][:COMPARED_STEPS]) / COMPARED_STEPS
    expected = (truth["compute_only_ms"] - htruth["compute_only_ms"]) / step_ms
    assert ck.metrics["recompute_time_ratio"] == pytest.approx(expected, rel=0.10)


def test_sync_count_matches_item_calls():
    a, truth = load("sync_item_print")
    per_step = truth["per_step"][0]["item_calls"]  # 1 loss.item() + 98 grad-norm .item() per step
    assert a.metrics["host_sync_count"] == per_step * len(truth["per_step"])
    sync = next(f for f in a.findings if f.id == "host_sync")
    assert sync.severity in ("high", "medium")
    assert sync.evidence["by_op"][0]["op"] == "aten::item"


def _gaps_opened_inside(name: str, op: str) -> int:
    """Plain sweep over the raw events: the GPU idle gaps (all kernels, copies and memsets merged)
    inside the host ProfilerStep ranges that begin while a host ``op`` is running and before the
    call that launched the work after them returned, summed in ns."""
    import bisect
    import itertools
    from decimal import Decimal

    raw = json.loads(raw_json(H200 / f"{name}.pt.trace.json.xz"))["traceEvents"]
    xs = [e for e in raw if e.get("ph") == "X"]

    def span(e: dict) -> tuple[int, int]:
        start = int(Decimal(str(e["ts"])) * 1000)
        return start, start + int(Decimal(str(e["dur"])) * 1000)

    # each launch call's end by correlation: a gap whose next work's call had returned before
    # it began is the device's own gap between queued work, no sync's (audit s58)
    returned = {
        e["args"]["correlation"]: span(e)[1]
        for e in xs
        if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})
    }
    busy: list[list[int]] = []  # [start, end, the first op's launch end]
    gpu = [e for e in xs if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    for s, e, c in sorted((*span(e), e["args"].get("correlation")) for e in gpu):
        if busy and s <= busy[-1][1]:
            busy[-1][1] = max(busy[-1][1], e)
        else:
            busy.append([s, e, returned.get(c)])
    steps = [
        span(e)
        for e in xs
        if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#")
    ]
    ops = sorted(span(e) for e in xs if e.get("cat") == "cpu_op" and e["name"] == op)
    starts = [s for s, _ in ops]

    def inside_op(t: int) -> bool:
        k = bisect.bisect_right(starts, t) - 1
        return k >= 0 and ops[k][0] <= t < ops[k][1]

    lo, hi = min(s for s, _ in steps), max(e for _, e in steps)
    gaps = [(a[1], b[0], b[2]) for a, b in itertools.pairwise(busy)]
    return sum(
        e - s for s, e, ret in gaps if lo <= s < hi and inside_op(s) and (ret is None or ret > s)
    )


def test_sync_cost_matches_the_control():
    """healthy_bf16 is the same model and batch without the syncs: the syncs cost the difference."""
    a, truth = load("sync_item_print")
    h, control = load("healthy_bf16")
    idle = a.metrics["idle_by_cause_ns"]
    # host_sync is the idle opened while a sync runs: the gaps that begin inside aten::item (the
    # op that syncs, 396 calls), summed from the raw events here (19.5 ms; 20.1 with the
    # device's own gaps before the read-backs it had queued, audit s58). Within 3%.
    assert idle["host_sync"] == pytest.approx(
        _gaps_opened_inside("sync_item_print", "aten::item"), rel=0.03
    )
    # The control has no host_sync, launch_overhead or cpu_work idle: all of it here is the
    # syncs' doing, so together it is at most their cost, the extra step time measured by CUDA
    # events (truth files: 43.65 - 33.71 ms a step, 4 steps), and most of it (the rest is the
    # gradient-norm kernels' own busy time). 100.0% measured (95% before the launches the
    # device waited for while their calls ran were launch overhead, audit 23); at least 85%,
    # and at most 2% over: the two means are of two processes' CUDA-event step times.
    assert all(
        h.metrics["idle_by_cause_ns"][c] == 0 for c in ("host_sync", "launch_overhead", "cpu_work")
    )
    steps = len(a.results.steps.per_step)
    mean = lambda t: sum(t["step_time_ms"][:COMPARED_STEPS]) / COMPARED_STEPS  # noqa: E731
    extra_ns = (mean(truth) - mean(control)) * 1e6 * steps
    caused = idle["host_sync"] + idle["launch_overhead"] + idle["cpu_work"]
    assert 0.85 * extra_ns <= caused <= 1.02 * extra_ns


@pytest.mark.parametrize(
    "name", ["dataloader_starved", "healthy_bf16", "sync_item_print", "h2d_pageable"]
)
def test_per_step_idle_plus_busy_is_step_time(name):
    a, _ = load(name)
    idle = {s.step: s.idle_ns for s in a.results.idle.per_step}
    for s in a.results.steps.per_step:
        assert idle[s.step] + s.gpu_busy_ns == s.dur_ns


def test_phase_shares_on_host_ranges():
    a, truth = load("dataloader_starved")
    assert len(a.results.steps.per_step) == len(truth["per_step"]) == 4  # every recorded step
    for s, t in zip(a.results.steps.per_step, truth["per_step"], strict=True):
        assert s.dataloader_ns == pytest.approx(t["next_ns"], rel=0.02)
        assert s.forward_ns > 0 and s.backward_ns > 0
