"""The causal step model: replays of hand-made tables against hand-computed times, the replay's
error on recorded traces, and what-if predictions against the H200 before/after pairs."""

import importlib.util
import json
from dataclasses import replace

import polars as pl
import pytest

from traceinsight import analyze
from traceinsight.analyzers.context import build_context
from traceinsight.analyzers.replay import analyze_replay, model_inputs, unprofiled_steps_at
from traceinsight.api import analyze_trace
from traceinsight.causal import transforms as whatif
from traceinsight.causal.build import build_model
from traceinsight.causal.graph import WAIT_DEVICE, median_step_ns, replay
from traceinsight.constants import SEVERITIES
from traceinsight.model.schema import DeviceInfo
from traceinsight.options import Options
from traceinsight.parsers import load_trace
from traceinsight.records import jsonable

from .builder import US, Events
from .conftest import H200, ROOT, SHARED, analyzed


def model_of(ev: Events):
    m = build_model(model_inputs(build_context(ev.trace())))
    assert m is not None
    return m


def step_us(m) -> float:
    return median_step_ns(m, replay(m)) / US


def test_gpu_chain_replays_and_shortens_by_hand():
    # three queued kernels (30 us each, back to back from 16 us), launched at 10, 20, 30 us
    ev = Events().step(0, 0, 50)
    for i in range(3):
        ev.kernel(f"k{i}", 16 + 30 * i, 30, launch_us=10 + 10 * i)
    m = model_of(ev)
    assert step_us(m) == 106  # the trace: GPU work launched in the step ends at 106
    # halved: k0 keeps its start (16-31); k1, k2 follow back to back: 31-46, 46-61
    half = m.with_gpu(m.gpu.with_columns(pl.col("dur_ns") // 2))
    assert step_us(half) == 61


def test_sync_waits_for_the_queue_to_drain():
    # launch k0 (runs 10-1010 us); cudaDeviceSynchronize 10-1015 (5 us after the drain);
    # launch k1 at 1020 (runs 1030-1130)
    ev = Events().step(0, 0, 1040)
    ev.kernel("k0", 10, 1000, launch_us=0)
    ev.runtime("cudaDeviceSynchronize", 10, 1005)
    ev.kernel("k1", 1030, 100, launch_us=1020)
    m = model_of(ev)
    assert (m.host["wait"] == WAIT_DEVICE).sum() == 1
    assert step_us(m) == 1130
    # k0 twice as long: the sync returns 5 us after 2010, k1 is launched 5 us later, starts
    # 10 us after its launch (its measured latency) and ends at 2130
    slower = m.with_gpu(
        m.gpu.with_columns(
            pl.when(pl.col("name") == "k0")
            .then(pl.col("dur_ns") * 2)
            .otherwise(pl.col("dur_ns"))
            .alias("dur_ns")
        )
    )
    assert step_us(slower) == 2130
    # without the sync (2 us of API cost left) k1 is queued behind k0: 1010 + 100
    assert step_us(whatif.remove_syncs(m)) == 1110


def test_launch_bound_loop_under_cuda_graphs():
    # ten 2 us kernels, each launched by an 8 us call every 10 us, starting 5 us after it
    ev = Events().step(0, 0, 100)
    for i in range(10):
        ev.kernel(f"k{i}", 10 * i + 5, 2, launch_us=10 * i, launch_dur_us=8)
    m = model_of(ev)
    assert step_us(m) == 100  # host-bound: the host leaves the step at 100
    # one graph launch (10 us) at the step's start; the 2 us of host time between the calls lie
    # outside any torch op (the user's own Python here), which a capture keeps: the last call
    # ends at 10 + 9 x 2 = 28, its kernel (no launch latency in a graph) runs 28-30
    assert step_us(whatif.cuda_graphs(m)) == 30


def dispatched_ops(names: list[str]) -> Events:
    """One op a name, each 48 us (its 2 us kernel launched 40 us in by an 8 us call: the op's
    dispatch), 2 us apart (Python outside any op), each kernel running 5 us after its call."""
    ev = Events().step(0, 0, 50 * len(names))
    for i, name in enumerate(names):
        ev.op(name, 50 * i, 48)
        ev.kernel(
            f"vectorized_elementwise_kernel<{i}>", 50 * i + 45, 2, launch_us=50 * i + 40,
            launch_dur_us=8,
        )  # fmt: skip
    return ev


def test_fused_elementwise_chain_drops_its_dispatch_once():
    # ten elementwise ops (dispatched_ops): host-bound at 500 us
    m = model_of(dispatched_ops(["aten::add"] * 10))
    assert step_us(m) == 500
    # fused into one kernel: the first call keeps its 40 us of dispatch and its 8 us; the other
    # nine lose their call and their op's dispatch, keeping the 2 us of Python before each:
    # 48 + 9 x 2, then the step's last 2 us
    assert step_us(whatif.elementwise_fused(m)) == 68
    # captured first, the dispatch is gone already (10 us graph launch + 9 x 2 + 2): fusing
    # the captured kernels takes no host time a second time (before the capture left the op
    # time it kept in gap_ops_ns, the two together read 12 us)
    graphs = whatif.cuda_graphs(m)
    assert step_us(graphs) == 30
    assert step_us(whatif.elementwise_fused(graphs)) == 30


def test_fused_chain_reads_its_input_and_writes_its_output_once():
    # three chained elementwise kernels of 10, 40 and 20 us (the middle one writes a wider
    # intermediate, as an fp32 upcast does), back to back from 10 us: the GPU ends at 80
    ev = Events().step(0, 0, 20)
    for i, (start, dur) in enumerate([(10, 10), (20, 40), (60, 20)]):
        ev.op("aten::mul", 5 * i, 4)
        ev.kernel(
            f"vectorized_elementwise_kernel<{i}>", start, dur, launch_us=5 * i + 1,
            launch_dur_us=2,
        )  # fmt: skip
    m = model_of(ev)
    assert step_us(m) == 80
    # fused, one kernel reads what the first read and writes what the last wrote: (10 + 20) / 2
    # = 15 us from 10 us (the chain's longest kernel, 40 us, had priced it at 50)
    assert step_us(whatif.elementwise_fused(m)) == 25


def test_fused_attention_drops_the_eager_ops_and_keeps_one_kernel_a_call():
    # five eager ops of one attention call (dispatched_ops): host-bound at 250 us
    m = model_of(dispatched_ops(["aten::bmm"] * 2 + ["aten::_softmax"] + ["aten::bmm"] * 2))
    assert step_us(m) == 250
    # the fused kernel (30 us) where the softmax's ran, the other four gone with their calls
    # and their ops' dispatch: 2 + 2 us of Python, the softmax's 40 us dispatch and its call
    # at 44 us, its kernel 5 us after the call's start (49-79); the host ends at 60
    keys = m.gpu.select(
        "device",
        "start_ns",
        pl.when(pl.int_range(pl.len()) == 2).then(30 * US).otherwise(0).alias("dur_ns"),
    )
    assert step_us(whatif.kernels_fused(keys)(m)) == 79


def test_graph_replays_keep_launch_order_between_streams_that_never_ran_together():
    # ten kernels alternating between streams 7 and 8, each launched 40 us into a 48 us torch op
    # (dispatch, which a capture removes), the ops 2 us apart (Python, which it keeps)
    def loop(kernel_us: int):
        ev = Events().step(0, 0, 500)
        for i in range(10):
            ev.op("aten::mm", 50 * i, 48)
            ev.kernel(
                f"k{i}", 50 * i + 45, kernel_us, launch_us=50 * i + 40, launch_dur_us=8,
                stream=7 + i % 2,
            )  # fmt: skip
        return model_of(ev)

    # 40 us kernels 50 us apart: the streams never ran side by side, so nothing shows they can
    # (cuDNN's LSTM orders its streams with event waits the trace does not link): one graph
    # launch (10 us), then the ten kernels one after another at the graph's 0.4 us node gap
    alone = loop(40)
    assert alone.gpu["alone"].all()
    assert step_us(whatif.cuda_graphs(alone)) == pytest.approx(10 + 10 * 40 + 9 * 0.4)
    # 60 us kernels: each ran beside the next on the other stream, so the replay runs the two
    # streams side by side: stream 8's five kernels from its first launch (12 us) on
    together = loop(60)
    assert not together.gpu["alone"].any()
    assert step_us(whatif.cuda_graphs(together)) == pytest.approx(12 + 5 * 60, abs=2)


# side work that comm_overlapped moves: collectives (a side stream of compute keeps its waits)
NCCL_A = "ncclDevKernel_Broadcast_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
NCCL_B = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
NCCL_GATHER = "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)"


def test_cross_stream_wait_follows_the_other_stream():
    # k1 (a collective) on stream 8 was launched at 5 us but started 2 us after k0 (stream 7) ended: a wait
    ev = Events().step(0, 0, 500)
    ev.kernel("k0", 10, 100, launch_us=0)
    ev.kernel(NCCL_A, 4, 2, launch_us=1, stream=8)
    ev.kernel(NCCL_B, 112, 50, launch_us=5, stream=8)
    for t in (200, 300, 400):  # launch-bound kernels: the launch latency is 3 us
        ev.kernel(f"late{t}", t + 3, 1, launch_us=t)
    m = model_of(ev)
    k0 = m.gpu.filter(pl.col("name") == "k0")["op"][0]
    k1 = m.gpu.filter(pl.col("name") == NCCL_B)["op"][0]
    assert m.gpu["after_op"][k1] == k0

    def k1_end_us(model) -> float:
        return replay(model).gpu_end_ns[k1] / US

    assert k1_end_us(m) == 162
    # k0 halved (10-60): the wait is kept as a fixed delay outside the overlap transform
    half = m.with_gpu(
        m.gpu.with_columns(
            pl.when(pl.col("name") == "k0")
            .then(pl.col("dur_ns") // 2)
            .otherwise(pl.col("dur_ns"))
            .alias("dur_ns")
        )
    )
    assert k1_end_us(half) == 162
    # overlapped: a reduction keeps its wait for k0, whose output it reduces (audit s61)
    assert k1_end_us(whatif.comm_overlapped(m)) == 162
    # a gather (parameters, prefetched) does not: it runs after ka as soon as launched (3 us
    # latency), 8-58
    ev = Events().step(0, 0, 500)
    ev.kernel("k0", 10, 100, launch_us=0)
    ev.kernel(NCCL_A, 4, 2, launch_us=1, stream=8)
    ev.kernel(NCCL_GATHER, 112, 50, launch_us=5, stream=8)
    for t in (200, 300, 400):
        ev.kernel(f"late{t}", t + 3, 1, launch_us=t)
    m = model_of(ev)
    k1 = m.gpu.filter(pl.col("name") == NCCL_GATHER)["op"][0]
    assert k1_end_us(whatif.comm_overlapped(m)) == 58


def _side_then_wait(side: str, side_us: float, between_us: float = 0):
    """Compute c (10-110 us, stream 7), side work ``side`` on stream 8 launched at 1 us that
    ran only after c, optionally compute e (``between_us``, launched at 2 us) beside it, then
    compute d that waits for the side work (starting 2 us after it): the model and d's op."""
    ev = Events().step(0, 0, 50)
    ev.kernel("c", 10, 100, launch_us=0)
    ev.kernel(side, 110, side_us, launch_us=1, stream=8)
    if between_us:
        ev.kernel("e", 110, between_us, launch_us=2)
    ev.kernel("d", 112 + side_us, 100, launch_us=3)
    m = model_of(ev)
    d = m.gpu.filter(pl.col("name") == "d")["op"][0]
    assert m.gpu["after_op"][d] == m.gpu.filter(pl.col("name") == side)["op"][0]
    return m, d


@pytest.mark.parametrize(("side_us", "after_us"), [(80, 212), (150, 262)])
def test_overlap_saves_at_most_the_compute_it_hides_behind(side_us, after_us):
    # a gather s that waited for c (an event wait that keeps the streams' order). Overlapped
    # (prefetched), s runs as launched, beside c, and d waits only for what the 100 us of c
    # could not hide: s of 80 us -> only the 2 us lag (d 112-212); s of 150 us -> 50 us + the
    # lag (d 162-262).
    m, d = _side_then_wait(NCCL_GATHER, side_us)
    assert replay(m).gpu_end_ns[d] / US == 212 + side_us
    assert replay(whatif.comm_overlapped(m)).gpu_end_ns[d] / US == after_us


@pytest.mark.parametrize("side_us", [80, 150])
def test_a_reduction_hides_only_behind_compute_after_its_input(side_us):
    # the same streams with an all-reduce that waited for c: c made what it reduces (audit
    # s61: Megatron's tensor-parallel all-reduce after each GEMM, priced 29-70 ms a step of
    # none), so nothing before d can hide it: d keeps its time. With compute e between c and
    # the wait (40 us, beside the all-reduce), that much hides.
    m, d = _side_then_wait(NCCL_B, side_us)
    assert replay(whatif.comm_overlapped(m)).gpu_end_ns[d] / US == 212 + side_us
    m, d = _side_then_wait(NCCL_B, side_us, between_us=40)
    assert replay(whatif.comm_overlapped(m)).gpu_end_ns[d] / US == 212 + side_us - 40


def test_a_long_wait_links_to_the_op_it_waited_for_within_one_percent():
    # d waited 7.5 ms for s and started 5.1 us after s ended (a profiled event wait on the
    # H200 comm pair): beyond the 5 us lag, within 1% of the wait
    ev = Events().step(0, 0, 50)
    ev.kernel("c", 10, 100, launch_us=0)
    ev.kernel("s", 110, 7500, launch_us=1, stream=8)
    ev.kernel("d", 7615.1, 100, launch_us=2)
    ev.kernel("e", 7715.1 + 20, 100, launch_us=3)  # 20 us after d on its own stream: no edge
    m = model_of(ev)
    g = m.gpu
    assert g["after_op"][g.filter(pl.col("name") == "d")["op"][0]] >= 0
    assert g["after_op"][g.filter(pl.col("name") == "e")["op"][0]] == -1


FIXTURES = sorted(H200.glob("*.pt.trace.json.xz")) + sorted(
    (H200 / "pairs").glob("*.before.pt.trace.json.xz")
)


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.name.split(".")[0])
def test_replay_error_on_h200_fixtures(path):
    # measured: 0.0 (to 4 decimals) on every one of them
    m = analyzed(path).metrics
    assert m["replay_error_ratio"] is not None
    assert m["replay_error_ratio"] <= 0.03


CORPUS_WITH_STEPS = [
    "hta/df_index_resolver/df_index_resolver.json.gz",
    "hta/ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz",
    # (not HTA's trace_compare samples: trimmed, they tie 1 of 17 GPU activities to a launch,
    # and read within 5% only with a phantom empty first step (session 57): the model misses
    # their steps by more than REPLAY_ERROR_MAX_RATIO, tests/test_audit23.py)
    "hta/timeline_analysis/sampled_rank-0.json.gz",
    "kineto-samples/plugin_2021-01_resnet50_nw4_worker0.pt.trace.json.gz",
    "tracelens/mi300_resnet_act_checkpoint.json.gz",
    "tracelens/h100_Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz",
]


@pytest.mark.parametrize("rel", CORPUS_WITH_STEPS)
def test_replay_error_on_corpus_traces(rel):
    path = SHARED / rel
    if not path.exists():
        pytest.skip(f"corpus trace not here: {path}")
    a = analyzed(path)
    assert a.metrics["replay_error_ratio"] <= 0.05


def _pairs_module():
    spec = importlib.util.spec_from_file_location(
        "replay_pairs", ROOT / "benchmarks" / "replay_pairs.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# Every pair's prediction is within the tolerance (benchmarks/RESULTS.md lists them
# with the measured numbers).
WITHIN_TOLERANCE = [
    "syncs",
    "dataloader",
    "h2d_pinned",
    "cudagraph",
    "fused_adamw",
    "bf16",
    "empty_cache",
    "checkpointing",
    "comm_overlap",
]
# Pairs whose finding is the first one. fused_adamw, empty_cache and checkpointing rank
# launch_bound first, which CUDA graphs measured on the same loops confirm (see below).
FIRST = ["syncs", "dataloader", "h2d_pinned", "cudagraph", "bf16", "comm_overlap"]


@pytest.mark.parametrize("pair", WITHIN_TOLERANCE)
def test_predicted_speedup_matches_the_measured_pair(pair):
    mod = _pairs_module()
    r = mod.predict(pair)
    truth = json.loads((H200 / "pairs" / f"{pair}.truth.json").read_text())
    assert r["measured"] == truth["speedup"]
    tol = mod.TOLERANCE.get(pair, mod.DEFAULT_TOLERANCE)
    # the un-profiled "before" step the model predicts (profiler cost per event taken off)
    # against the one measured outside the profiler: median over the pairs 3.8%, the worst of
    # these empty_cache's -20% (its cudaFree calls take longer profiled than the model knows)
    if r["step_statistic"] == "mean":
        # a loader pattern repeats (num_workers=0: a long wait every few steps): the model takes
        # the mean over its 3 steps, which lies between the measured median (the long steps
        # dropped) and the mean over 40 measured steps; 3 steps cannot say how often they come.
        # So the speedup lies between the medians' and the means' (2.32x and 4.31x measured),
        # and the step it predicts after the fix is the measured one.
        before, after = truth["before"]["step_ms"], truth["after"]["step_ms"]
        assert r["measured_before_ms"] <= r["replayed_before_ms"] <= sum(before) / len(before)
        by_means = sum(before) / len(before) / (sum(after) / len(after))
        assert r["measured"] * (1 - tol) <= r["predicted"] <= by_means * (1 + tol)
        assert r["predicted_after_ms"] == pytest.approx(truth["after"]["median_ms"], rel=tol)
    else:
        assert r["predicted"] == pytest.approx(r["measured"], rel=tol)
        assert r["replayed_before_ms"] == pytest.approx(r["measured_before_ms"], rel=0.25)


AFTER = json.loads((H200 / "pairs" / "after.truth.json").read_text())["pairs"]


@pytest.mark.parametrize("pair", sorted(p for p, v in AFTER.items() if v["profiled_after_trace"]))
def test_the_fixed_loop_no_longer_has_the_finding(pair):
    """The "after" loop profiled (fixtures/generate/record_after.py): the finding that named the
    cause is gone from its analysis (or at most low)."""
    after = analyzed(H200 / "pairs" / AFTER[pair]["profiled_after_trace"])
    kept = [f for f in after.findings if f.id == _pairs_module().FINDING_OF[pair]]
    assert all(SEVERITIES.index(f.severity) >= SEVERITIES.index("low") for f in kept), kept
    assert after.metrics["replay_error_ratio"] <= 0.03


@pytest.mark.parametrize("pair", sorted(AFTER))
def test_the_prediction_matches_a_second_measurement(pair):
    """The prediction made on "before" against a second, independent measurement of both loops
    (after.truth.json; one process per pair), with the issue's tolerance."""
    mod = _pairs_module()
    r = mod.predict(pair)
    tol = mod.TOLERANCE.get(pair, mod.DEFAULT_TOLERANCE)
    if r["step_statistic"] == "mean":  # the step after the fix (see the test above)
        after_ms = AFTER[pair]["unprofiled_ms"]["after"]
        assert r["predicted_after_ms"] == pytest.approx(after_ms, rel=tol)
    else:  # within the tolerance of the band the two measurements span
        lo, hi = sorted((r["measured"], AFTER[pair]["speedup"]))
        assert (1 - tol) * lo <= r["predicted"] <= (1 + tol) * hi


HOLDOUT = H200 / "holdout"
HOLDOUT_AFTER = json.loads((HOLDOUT / "after.truth.json").read_text())["pairs"]


@pytest.mark.parametrize("pair", WITHIN_TOLERANCE)
def test_the_prediction_holds_at_sizes_the_pairs_were_not_recorded_at(pair):
    """The same loops at held-out sizes (record_pairs.py --holdout: of each pair's other
    candidates, the one whose cause share is farthest from the committed pair's), predicted
    within the issue's tolerance of the band two measurements span: the recording's and a
    second one (record_after.py). Recorded after the model; the one change they prompted
    (bf16's TF32 GEMMs, below) takes the datasheet's peak ratio, not a fitted one."""
    mod = _pairs_module()
    r = mod.predict(pair, HOLDOUT)
    truth = json.loads((HOLDOUT / f"{pair}.truth.json").read_text())
    assert truth["holdout_of"] != truth["sizes"]
    assert r["measured"] == truth["speedup"]
    tol = mod.TOLERANCE.get(pair, mod.DEFAULT_TOLERANCE)
    lo, hi = sorted((r["measured"], HOLDOUT_AFTER[pair]["speedup"]))
    assert (1 - tol) * lo <= r["predicted"] <= (1 + tol) * hi


CNN = H200 / "cnn"
CNN_AFTER = json.loads((CNN / "after.truth.json").read_text())["pairs"]


@pytest.mark.parametrize("pair", ["cnn_syncs", "cnn_bf16", "cnn_fused_adamw", "cnn_empty_cache"])
def test_the_prediction_holds_in_a_conv_net(pair):
    """Four of the causes in another model family (record_pairs.py --cnn: a 7-conv BatchNorm
    net, cuDNN kernels), recorded after the model: each prediction within the issue's
    tolerance (ratios 0.76-1.11). The un-profiled step is overestimated there (empty_cache:
    12.5 ms replayed against 9.1 ms measured): the profiler costs a conv net more per event
    than the no-work ops it is measured by (FINDINGS.md)."""
    mod = _pairs_module()
    r = mod.predict(pair, CNN)
    truth = json.loads((CNN / f"{pair}.truth.json").read_text())
    assert truth["sizes"]["family"] == "cnn"
    assert r["rank"] is not None and r["measured"] == truth["speedup"]
    tol = mod.TOLERANCE.get(pair.removeprefix("cnn_"), mod.DEFAULT_TOLERANCE)
    assert r["predicted"] == pytest.approx(r["measured"], rel=tol)
    # and against the median of later measurements, one process each (after.truth.json)
    assert r["predicted"] == pytest.approx(CNN_AFTER[pair]["speedup"], rel=tol)


def test_the_conv_nets_fixed_loop_no_longer_has_the_finding():
    """cnn_bf16's loop in bf16, profiled: fp32_compute is gone, the replay reproduces it."""
    after = analyzed(CNN / CNN_AFTER["cnn_bf16"]["profiled_after_trace"])
    assert not [f for f in after.findings if f.id == "fp32_compute"]
    assert after.metrics["replay_error_ratio"] <= 0.03


def test_bf16_autocast_moves_tf32_gemms_too():
    """The held-out bf16 loop runs its GEMMs on TF32 tensor cores (27.2 ms of the profiled
    'before' kernels); its profiled 'after' ran them as bf16 GEMMs in 7.3 ms. The transform's
    TF32/BF16 peak ratio (1/2) counts them: without it the prediction was 1.75x."""
    before = analyzed(HOLDOUT / "bf16.before.pt.trace.json.xz")
    after = analyzed(HOLDOUT / "bf16.after.pt.trace.json.xz")

    def gemm_ms(a, tf32: bool) -> float:
        k = a.trace.events.filter((pl.col("kind") == "kernel") & (pl.col("kernel_class") == "gemm"))
        k = k.filter(pl.col("name").str.to_lowercase().str.contains("tf32") == tf32)
        return float(k["dur_ns"].sum()) / 1e6

    assert gemm_ms(before, True) == pytest.approx(27.24, abs=0.01)
    assert gemm_ms(after, True) == 0 and gemm_ms(after, False) == pytest.approx(7.31, abs=0.01)
    w = next(f for f in before.findings if f.id == "fp32_compute").what_if
    # 2.24x and 1.94x measured; 1.58x predicted: this encoder's ReLU FFN kept its activations
    # in bf16 (its elementwise kernels took 0.54 of their fp32 time), which the transform,
    # measured on GPT-2 and BERT where autocast left them fp32, does not assume
    assert 0.75 * 1.94 <= w.speedup < 1.94


@pytest.mark.parametrize("pair", FIRST)
def test_the_pairs_cause_is_the_first_finding(pair):
    r = _pairs_module().predict(pair)
    assert r["rank"] == 1, r


def test_savings_are_the_findings_costs():
    """cost_ns = (1 - after/before) x window; severity from that share; all_fixes combined."""
    a = analyzed(H200 / "pairs" / "syncs.before.pt.trace.json.xz")
    window = a.results.idle.device_window_ns
    for f in a.findings:
        if f.what_if is None:
            assert f.evidence["why_no_estimate"]
            continue
        ratio = 1 - f.what_if.step_time_after_ns / f.what_if.step_time_ns
        assert f.cost_ns == int(max(0.0, ratio) * window)
        assert f.evidence["attributed_ns"] >= 0
    # ordered by severity, then the predicted savings by size, then the unestimated costs
    keys = [(SEVERITIES.index(f.severity), f.what_if is None, -f.cost_ns) for f in a.findings]
    assert keys == sorted(keys)
    combined = a.to_json()["details"]["what_if"]["all_fixes"]
    best = max(f.what_if.speedup for f in a.findings if f.what_if)
    assert combined["speedup"] >= best  # every fix together saves at least the best one
    assert combined["step_time_after_ns"] > 0  # and never more than the step


def test_what_if_in_details():
    a = analyzed(H200 / "pairs" / "fused_adamw.before.pt.trace.json.xz")
    w = a.results.replay.what_if["fused_optimizer"]
    assert set(jsonable(w)) == {"step_time_ns", "step_time_after_ns", "speedup"}
    assert w.speedup > 1
    assert a.to_json()["details"]["replay"]["what_if"]["fused_optimizer"] == jsonable(w)


def test_kernel_and_copy_engines_apart():
    # no steps: the window is the GPU span, 0-150 us. A kernel 0-100 and a copy 50-150 on
    # another stream: busy all 150 us, the SMs 100 of them, the copy engine 100
    ev = Events()
    ev.kernel("k", 0, 100, launch_us=0)
    ev.memcpy("HtoD", 50, 100, nbytes=1 << 20, src="pinned", dst="device", stream=8)
    m = analyze_trace(ev.trace()).metrics
    assert m["gpu_busy_ratio"] == pytest.approx(1.0)
    assert m["kernel_busy_ratio"] == pytest.approx(2 / 3)
    assert m["copy_busy_ratio"] == pytest.approx(2 / 3)


def test_backward_on_the_autograd_thread_joins_the_step_thread():
    # The step thread (tid 1) launches k0 at 0 us, then blocks in backward() while the
    # autograd thread (tid 2, woken after idling since 1 us) launches k1 at 100 and k2 at
    # 160 us; then the step thread launches k3 at 300 us. Each call takes 5 us, each kernel 5.
    ev = Events().step(0, 0, 320)
    ev.runtime("cudaStreamIsCapturing", 0, 1, tid=2)
    ev.kernel("k0", 5, 5, launch_us=0, launch_dur_us=5)
    ev.kernel("k1", 105, 5, launch_us=100, launch_dur_us=5, tid=2)
    ev.kernel("k2", 165, 5, launch_us=160, launch_dur_us=5, tid=2)
    ev.kernel("k3", 305, 5, launch_us=300, launch_dur_us=5)
    m = model_of(ev)
    burst = m.host.filter(pl.col("name") == "cudaLaunchKernel").filter(pl.col("tid") == 2)
    assert (burst["chain_tid"] == 1).all()  # the burst is in the step thread's chain
    assert burst["gap_ns"].to_list() == [95 * US, 55 * US]  # since the call before it there
    before = step_us(m)
    assert before == 320
    # The autograd thread's host work halved (47.5 + 27.5 us less): the step thread resumes
    # 75 us earlier, so k3 is launched at 225 and runs 230-235; the step's host end (320, 15
    # us after k3's call) moves with that call to 245.
    faster = m.with_host(
        m.host.with_columns(
            pl.when(pl.col("tid") == 2)
            .then(pl.col("gap_ns") // 2)
            .otherwise(pl.col("gap_ns"))
            .alias("gap_ns")
        )
    )
    assert step_us(faster) == pytest.approx(245, abs=0.01)


NEXT = "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__"


def _loader_loop(pin_thread: bool) -> Events:
    """Six 7 ms steps: a 1 ms GEMM launched at +100 us, the step thread in DataLoader.__next__
    from +200 us for 6 ms, then two 300 us GEMMs launched at +6300 and +6400 us; with
    ``pin_thread`` the DataLoader's pin-memory thread (tid 3) makes a 20 us call at +6150 us,
    handing the batch over just before __next__ returns."""
    ev = Events()
    for i in range(6):
        s = i * 7000
        ev.step(i, s, 7000)
        ev.kernel("ampere_sgemm_128x64_tn", s + 150, 1000, launch_us=s + 100)
        ev.annotation(NEXT, s + 200, 6000)
        if pin_thread:
            ev.runtime("cudaPointerGetAttributes", s + 6150, 20, tid=3)
        ev.kernel("ampere_sgemm_128x64_tn", s + 6310, 300, launch_us=s + 6300)
        ev.kernel("ampere_sgemm_128x64_tn", s + 6620, 300, launch_us=s + 6400)
    return ev


def test_a_loader_wait_ended_by_the_pin_memory_thread_stays_the_loaders():
    """Audit 18 (a T4 loop with workers and pin_memory: 58.22 ms of waits in __next__, its
    loader fix priced 1.008x, info): the pin-memory thread's call inside the step thread's
    __next__ joins the step thread's chain (_joins), and its gap, 6045 us since the step
    thread's launch at +100 us (ending +105), carries most of the wait; counted on its own
    thread it held no loader time. Now the chain's ranges count: 5950 us of it lie in __next__
    (+200 to +6150), and 30 us of the step thread's next gap (+6170 to +6200): 5980 us a step,
    and the loader's what-if prices as the same loop without that thread does."""
    plain = analyze_trace(_loader_loop(False).trace()).results.replay
    piped = analyze_trace(_loader_loop(True).trace())
    r = piped.results.replay
    h = r.model.host.filter(pl.col("step") == 2)
    pin = h.filter(pl.col("tid") == 3)
    assert pin["chain_tid"].to_list() == [1] and pin["in_dataloader"].to_list() == [True]
    assert pin["gap_ns"].to_list() == [6045 * US]
    assert pin["gap_dataloader_ns"].to_list() == [5950 * US]
    assert h["gap_dataloader_ns"].sum() == 5980 * US
    floor = r.what_if["dataloader_floor"].speedup
    assert floor == pytest.approx(plain.what_if["dataloader_floor"].speedup, rel=1e-6)
    assert floor > 4
    stall = next(f for f in piped.findings if f.id == "dataloader_stall")
    assert stall.severity == "high"


def _compiled_after_a_wait() -> Events:
    """Six 7 ms steps: four eager aten::add ops 30 us apart at +100 us (each launching a 20 us
    kernel 5 us in), the step thread in DataLoader.__next__ from +300 us for 6 ms, then two
    inductor Triton launches (their ops 15 us, the launch 5 us in) at +6350 and +6380 us."""
    ev = Events()
    for i in range(6):
        s = i * 7000
        ev.step(i, s, 7000)
        for k in range(4):
            t = s + 100 + 30 * k
            ev.op("aten::add", t, 20)
            ev.kernel("vectorized_elementwise_kernel", t + 10, 20, launch_us=t + 5)
        ev.annotation(NEXT, s + 300, 6000)
        for t in (s + 6350, s + 6380):
            ev.op("triton_poi_fused_add_0", t, 15)
            ev.kernel("triton_poi_fused_add_0", t + 400, 300, launch_us=t + 5)
    return ev


def test_a_compiled_launchs_cap_leaves_the_loader_wait_before_it():
    """Session 40's review: capping a compiled launch's whole gap at the eager launches' took
    the 6 ms __next__ wait before a step's first Triton launch with it (the un-profiled step
    6.92 -> 0.79 ms, the loader's fix 7.13x -> 1.0x). Only the gap's time outside every op that
    holds at most one call (``gap_outside_ops_ns``: here the ~45 us between the last add and
    the first Triton op, the loader's range being one such op) is capped."""
    r = analyze_trace(_compiled_after_a_wait().trace()).results.replay
    h = r.model.host.filter(pl.col("step") == 2)
    first = h.filter(pl.col("compiled_launch")).sort("start_ns").head(1)
    assert first["gap_dataloader_ns"].item() == pytest.approx(6000 * US, rel=0.01)
    assert first["gap_ns"].item() > 6000 * US
    assert r.unprofiled_step_ns > 6.5e6
    assert r.what_if["dataloader_floor"].speedup > 3


def test_host_work_in_the_optimizer_is_no_batch_and_leaves_with_it():
    """Session 40's review: a 3 ms CPU randn inside Optimizer.step# counted as a batch made on
    the host (scaled by the batch what-if), and after the fused optimizer's what-if took the
    optimizer's host time out, that count (3.00 ms) outlived the gap (1.89 ms), so fused plus a
    4x batch added back 9 ms. The optimizer's range is its own; a transform that drops a range
    leaves the gap's other parts no longer than the gap."""
    from traceinsight.causal.columns import SUBGAPS

    ev = Events()
    for i in range(5):
        s = i * 7000
        ev.step(i, s, 7000)
        ev.kernel("ampere_sgemm_128x64_tn", s + 150, 2000, launch_us=s + 100)
        ev.annotation("Optimizer.step#SGD.step", s + 2300, 3600)
        ev.op("aten::randn", s + 2400, 3000)
        ev.op("aten::add_", s + 5500, 20)
        ev.kernel("vectorized_elementwise_kernel", s + 5520, 30, launch_us=s + 5505)
    r = analyze_trace(ev.trace()).results.replay
    h = r.model.host
    assert h["gap_host_input_ns"].sum() == 0 and h["gap_optimizer_ns"].max() > 3000 * US
    fused = whatif.fused_optimizer(r.model)
    assert fused is not None
    fh = fused.host
    assert fh["gap_optimizer_ns"].sum() == 0
    for c in SUBGAPS:
        assert (fh[c] <= fh["gap_ns"]).all(), c


def _made_on_the_cpu(op: str) -> Events:
    """Four 6.2 ms steps inside a ``model_inference`` record_function (audit 18's toy, scaled
    down): ``op`` on the CPU for 5 ms at +100 us (launching nothing; a randn fills through
    normal_), the pageable upload of its tensor (cudaMemcpy 500 us, the copy 400 us), then a
    1 ms kernel launched at +5700 us."""
    ev = Events()
    ev.annotation("model_inference", 0, 4 * 6200)
    for i in range(4):
        s = i * 6200
        ev.step(i, s, 6200)
        ev.op(op, s + 100, 5000)
        if op == "aten::randn":
            ev.op("aten::normal_", s + 150, 4900)
        ev.runtime("cudaMemcpy", s + 5150, 500, correlation=100 + i)
        ev.memcpy("HtoD", s + 5200, 400, nbytes=40_000_000, src="pageable", dst="device")
        ev.rows[-1]["correlation"] = 100 + i
        ev.kernel("ampere_sgemm_128x64_tn", s + 5710, 1000, launch_us=s + 5700)
    return ev


def test_a_batch_made_on_the_cpu_grows_with_the_batch():
    """Audit 18: torch.randn(10000, 10000) on the CPU (654 of a 742 ms step), then .cuda(),
    read "a 4x batch would raise throughput 3.1x per sample" (small_batch HIGH): the batch
    what-if held all host work. A tensor-making op on the CPU (causal/columns.py
    HOST_INPUT_OPS, >= 1 ms, no launch inside) is the batch made on the host: its 5 ms a step
    (gap_host_input_ns) grows with it, so 4x the batch is about 4x the step, where the same
    loop whose 5 ms is other CPU work (aten::sort) keeps it. The idle is named by the op that
    did the work, not the record_function around the loop, with advice to make it on the GPU."""
    made = _made_on_the_cpu("aten::randn")
    r = analyze_trace(made.trace()).results.replay
    h = r.model.host
    # (less its share of the profiler's cost, taken out of the un-profiled model)
    got = h.filter(pl.col("step") == 2)["gap_host_input_ns"].sum()
    assert got == pytest.approx(5000 * US, rel=0.001)
    other = analyze_trace(_made_on_the_cpu("aten::sort").trace()).results.replay
    assert other.model.host["gap_host_input_ns"].sum() == 0
    four = whatif.gpu_work_scaled(4.0)
    assert other.predict(four).speedup * 4 > 2.5  # per sample: the host's 5 ms held
    assert r.predict(four).speedup * 4 < 1.15  # the host's 5 ms four times over
    a = analyze_trace(made.trace())
    # the copy call's own 100 us a step is held: 1.11x per sample at 4x, low at most
    sb = next(f for f in a.findings if f.id == "small_batch")
    assert sb.what_if.speedup < 1.15 and sb.severity in ("low", "info")
    gu = next(f for f in a.findings if f.id == "gpu_underutilized")
    assert gu.title.endswith("mostly while the host ran aten::randn")
    assert gu.recommendation.startswith(
        "The host makes the step's tensors on the CPU (aten::randn) while the GPU waits"
    )


GRAPHED = json.loads((H200 / "pairs" / "graphed.truth.json").read_text())["pairs"]


@pytest.mark.parametrize("pair", sorted(GRAPHED))
def test_launch_bound_first_where_cuda_graphs_measured_faster(pair):
    """On fused_adamw, empty_cache and checkpointing the model ranks launch_bound above the
    pair's own cause. Its fix was recorded too (make_graphed_callables on the model, the same
    optimizer and empty_cache, un-profiled): 2.09x, 3.25x and 1.83x, more than the pairs' own
    fixes (1.49x, 1.63x, 1.75x), so launch_bound first is the right order, and its predicted
    speedup is within the issue's ±40% for CUDA graphs (measured: within 8%)."""
    measured = GRAPHED[pair]["speedup"]
    own = json.loads((H200 / "pairs" / f"{pair}.truth.json").read_text())["speedup"]
    assert measured > own
    a = analyzed(H200 / "pairs" / f"{pair}.before.pt.trace.json.xz")
    # of the causes: the larger batch (small_batch, unrecorded on these loops) is ranked apart
    first = next(f for f in a.findings if f.id not in ("small_batch", "memory_headroom"))
    assert first.id == "launch_bound"
    assert first.what_if.speedup == pytest.approx(measured, rel=0.40)


def test_host_sync_sources_carry_the_saving_of_one_call_site():
    """With stacks, each of the costliest sync sites gets its own what_if: the model with only
    that site's syncs removed. Each saves no more than removing every sync does, and the site
    with the most waiting syncs (6 x .item() in log_metrics) saves the most."""
    a = analyzed(H200 / "stack" / "sync_sites.pt.trace.json.xz")
    f = next(x for x in a.findings if x.id == "host_sync")
    sites = [s for s in f.evidence["sources"] if s.what_if]
    assert sites and f.what_if is not None
    for s in sites:
        assert s.what_if.step_time_ns == f.what_if.step_time_ns
        assert f.what_if.step_time_after_ns <= s.what_if.step_time_after_ns
        assert s.what_if.step_time_after_ns <= s.what_if.step_time_ns
    best = min(sites, key=lambda s: s.what_if.step_time_after_ns)
    assert best.trigger == "item" and best.count == 6


# The engine each pair's measured fix sped up: CUDA graphs, a fused optimizer, no empty_cache
# and no recomputation cut host work (measured 1.49-1.96x); bf16 made the GEMMs faster (1.61x).
# The comm stand-in alternates streams through waits the replay keeps fixed: no answer.
BOUND_BY = {
    "cudagraph": "host",
    "fused_adamw": "host",
    "empty_cache": "host",
    "checkpointing": "host",
    "bf16": "kernels",
    "comm_overlap": None,
}


@pytest.mark.parametrize("pair", sorted(BOUND_BY))
def test_the_model_says_which_engine_bounds_the_step(pair):
    a = analyzed(H200 / "pairs" / f"{pair}.before.pt.trace.json.xz")
    assert a.metrics["step_bound_by"] == BOUND_BY[pair], a.results.replay.engine_speedups


def test_engine_sensitivity_by_hand():
    # host-bound: ten 2 us kernels launched every 10 us by 8 us calls (as the graph test);
    # GPU-bound: three queued 30 us kernels launched in the first 30 us of a 50 us step
    host = Events().step(0, 0, 100)
    for i in range(10):
        host.kernel(f"k{i}", 10 * i + 5, 2, launch_us=10 * i, launch_dur_us=8)
    gpu = Events().step(0, 0, 50)
    for i in range(3):
        gpu.kernel(f"k{i}", 16 + 30 * i, 30, launch_us=10 + 10 * i)
    r_host = analyze_trace(host.trace()).results.replay
    r_gpu = analyze_trace(gpu.trace()).results.replay
    assert r_host.step_bound_by == "host"
    assert r_gpu.step_bound_by == "kernels"
    # GPU-bound: the kernels twice as fast, 106 -> 61 us (k0 keeps its start, as in the
    # hand-replayed chain above): 106 / 61
    assert r_gpu.engine_speedups["kernels"] == pytest.approx(106 / 61, rel=0.01)


def test_the_terminal_says_which_engine_bounds_the_step():
    from traceinsight.report.terminal import render_summary

    a = analyzed(H200 / "pairs" / "checkpointing.before.pt.trace.json.xz")
    text = render_summary(a.to_json())
    assert "bound by  the host (CPU) (each engine 2x faster alone: host 1.9" in text
    comm = analyzed(H200 / "pairs" / "comm_overlap.before.pt.trace.json.xz")
    assert "bound by" not in render_summary(comm.to_json())  # streams wait for each other


def test_a_pageable_copy_call_waits_for_its_own_copy():
    # 64 MiB from pageable memory each step: the call stages it chunk by chunk and returns
    # 10-20 us before the 9.2 ms DMA ends; the copies are 87-89% of the step, so the step
    # follows the copy engine (twice as fast: about 1.7x; the measured compute alone is 1.2 ms)
    a = analyzed(H200 / "h2d_pageable.pt.trace.json.xz")
    r = a.results.replay
    assert (r.model.host.filter(pl.col("name") == "cudaMemcpyAsync")["wait"] == 2).all()
    assert a.metrics["step_bound_by"] == "copies"
    assert 1.5 < r.engine_speedups["copies"] < 2.0
    assert a.metrics["replay_error_ratio"] <= 0.03


def test_a_replay_cut_short_says_its_saving_is_a_lower_bound(monkeypatch):
    # 99 syncs per step: each replay round settles one more of them. A replay may take as many
    # rounds as the model has blocking calls while rounds x rows stay under REPLAY_WORK_MAX
    # (causal/graph.py); a model too large for that stops at MAX_ROUNDS (64) before the change
    # reaches the later syncs, and its saving is said to be a lower bound
    from traceinsight.api import analyze as fresh
    from traceinsight.causal import graph

    path = H200 / "sync_item_print.pt.trace.json.xz"
    settled = analyzed(path).results.replay
    assert settled.converged and settled.unconverged == ()
    monkeypatch.setattr(graph, "REPLAY_WORK_MAX", 0)  # as if the model were too large
    monkeypatch.setattr(graph, "REPLAY_WORK_MAX_POLARS", 0)
    # and its rounds start from the trace's times (the polars loop's; the C loop's warm start
    # settles these syncs in two rounds)
    monkeypatch.setattr(graph, "WARM_START", False)
    a = fresh(path)
    r = a.results.replay
    assert r.converged  # the trace's own replay settles at once
    assert "cuda_graphs" in r.unconverged
    assert a.metrics["step_bound_by"] is None
    lb = next(f for f in a.findings if f.id == "launch_bound")
    assert lb.evidence["what_if_lower_bound"] is True
    # settled, the same transform saves more than the cut-short lower bound
    assert settled.what_if["cuda_graphs"].speedup > r.what_if["cuda_graphs"].speedup


def test_chain_ends_by_hand_on_both_paths() -> None:
    """Two chains, by hand: start_i = end_{i-1} + gap_i (the first at anchor + gap),
    end_i = max(start_i + dur_i, floor_i). Contiguous chains take the sliced path, the same
    rows interleaved take the windows; both give the hand values."""
    from traceinsight.causal.graph import NEG_NS, _chain_ends_over, chain_ends

    rows = pl.DataFrame(
        {
            "c": [0, 0, 0, 1, 1],
            "gap": [5, 2, 0, 1, 3],
            "dur": [10, 4, 6, 7, 2],
            # op 1 may not end before 40 (a wait); op 3's chain starts at anchor 100
            "floor": [NEG_NS, 40, NEG_NS, NEG_NS, NEG_NS],
            "anchor": [0, 0, 0, 100, 100],
        }
    )
    # chain 0: 5..15, 17..40 (floor), 40..46; chain 1: 101..108, 111..113
    want = {"start": [5, 17, 40, 101, 111], "end": [15, 40, 46, 108, 113]}
    assert chain_ends(rows, "c").to_dict(as_series=False) == want
    assert _chain_ends_over(rows, "c").to_dict(as_series=False) == want
    mixed = rows.with_row_index("i").sort("c", "i", descending=[True, False])  # 1s first
    got = chain_ends(mixed.select(pl.exclude("i")), "c")
    assert got.to_dict(as_series=False) == {
        "start": [101, 111, 5, 17, 40],
        "end": [108, 113, 15, 40, 46],
    }


def test_bf16_autocast_by_hand():
    """fp32 math on CUDA cores scales by the FP32/BF16 peak ratio (67/989.5), TF32 tensor-core
    math by TF32/BF16 (494.7/989.5 = 1/2); the elementwise kernel keeps its time (GEMMs, not
    convolutions, are the math: autocast leaves norms, softmax and residual streams in fp32),
    the rest keeps its time; no torch op launched the GEMMs, so no casts are added. Four
    kernels queued back to back from 0, each launched before it runs."""
    ev = Events().step(0, 0, 10)
    ev.kernel("volta_sgemm_128x64_nn", 0, 9895, launch_us=0)  # fp32 SIMT: 9895 * 67/989.5 = 670
    ev.kernel("sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n", 9895, 1000, launch_us=1)  # -> 500
    ev.kernel("vectorized_elementwise_kernel", 10895, 400, launch_us=2)  # kept
    ev.kernel("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", 11295, 300, launch_us=3)  # kept
    trace = ev.trace()
    # an H200 (data/devices.toml: fp32 67, TF32 494.5, bf16 989.5 TFLOP/s): 1000 * 494.5/989.5
    # = 499.7 for the TF32 GEMM
    h200 = replace(trace.meta, devices=[DeviceInfo(0, "NVIDIA H200", 132, 150_000_000_000)])
    m = build_model(model_inputs(build_context(replace(trace, meta=h200))))
    assert m is not None and step_us(m) == 11595
    after = 670 + 1000 * 494.5 / 989.5 + 400 + 300
    assert step_us(whatif.bf16_gemms(m)) == pytest.approx(after, abs=0.1)
    # an unknown device: the table has no peaks, so no prediction, and the transform says why
    assert whatif.bf16_gemms(model_of(ev)) is None
    assert "data/devices.toml" in whatif.TRANSFORMS["bf16_gemms"].unpriced(model_of(ev))
    # an RTX 4090 (fp32 82.6, bf16 165.2 dense): the same fp32 GEMM only 2x faster
    rtx = replace(
        trace.meta, devices=[DeviceInfo(0, "NVIDIA GeForce RTX 4090", 128, 25_000_000_000)]
    )
    m = build_model(model_inputs(build_context(replace(trace, meta=rtx))))
    assert m is not None
    g = whatif.bf16_gemms(m).gpu
    assert int(g["dur_ns"][0]) == int(9_895_000 * 82.6 / 165.2)


def test_bf16_autocast_of_a_convolution_by_hand():
    """A convolution-led step under the bf16 transform, by hand. The fp32 convolution (launched
    inside ``aten::cudnn_convolution``: its first math kernel) scales by 67/989.5 and gains
    autocast's casts, 5/3 kernels of the step's median elementwise kernel (200 us) and 5/3 x 2
    of the median launch call (5 us) of host work before its launch; the elementwise kernel
    after it halves (its input is the convolution's bf16 output); the optimizer's elementwise
    kernel, inside ``Optimizer.step#SGD.step``, keeps its time (fp32 parameters). The kernels
    run back to back on one stream, each launched before the previous ends: the step is the
    GPU's sum, the launches' 5 us each aside."""
    ev = Events().step(0, 0, 2000)
    ev.op("aten::cudnn_convolution", 1, 8)
    ev.kernel("volta_scudnn_128x64_relu_interior_nn_v1", 10, 989.5, launch_us=2)
    ev.kernel("vectorized_elementwise_kernel", 999.5, 200, launch_us=20)
    ev.annotation("Optimizer.step#SGD.step", 30, 10)
    ev.kernel("vectorized_elementwise_kernel", 1199.5, 200, launch_us=32)
    h200 = replace(ev.trace().meta, devices=[DeviceInfo(0, "NVIDIA H200", 132, 150_000_000_000)])
    m = build_model(model_inputs(build_context(replace(ev.trace(), meta=h200))))
    assert m is not None
    g = m.gpu.sort("start_ns")
    assert g.get_column("opens_math_op").to_list() == [True, False, False]
    assert g.get_column("in_optimizer").to_list() == [False, False, True]
    after = whatif.bf16_gemms(m).gpu.sort("start_ns").get_column("dur_ns").to_list()
    casts = 5 / 3 * 200_000
    assert after[0] == int(989_500 * 67 / 989.5 + casts)
    assert after[1:] == [100_000, 200_000]


def test_selected_fixes_and_all_fixes_hold_every_transform():
    """--what-if / what_if=[...]: one replay of the chosen fixes together. Each fix alone is its
    finding's own what_if; all of them equal details.what_if.all_fixes; no single fix (the
    larger batch's included, whose saving is per sample) exceeds all_fixes."""
    path = H200 / "memory" / "mem_small_batch.pt.trace.json.xz"
    base = analyzed(path)
    priced = [f for f in base.findings if f.what_if is not None and f.what_if.transform is not None]
    assert "memory_headroom" in [f.id for f in priced]
    for f in priced:
        one = analyze(path, what_if=[f.id]).to_json()["details"]["what_if"]["selected"]
        assert one["fixes"] == [f.id] and one["not_raised"] == [] and one["no_fix"] == []
        assert one["step_time_after_ns"] == pytest.approx(f.what_if.step_time_after_ns, abs=1)
    every = [f.id for f in priced if f.cost_ns > 0]
    doc = analyze(path, what_if=every).to_json()["details"]["what_if"]
    assert doc["selected"]["step_time_after_ns"] == doc["all_fixes"]["step_time_after_ns"]
    assert doc["all_fixes"]["speedup"] >= max(f.what_if.speedup for f in priced) - 1e-9
    assert "gpu_work_scaled" in doc["all_fixes"]["transforms"]


def test_what_if_option_refuses_unknown_ids_and_notes_absent_ones(tmp_path, capsys):
    from traceinsight.cli import main

    trace = str(H200 / "pairs" / "syncs.before.pt.trace.json.xz")
    assert main(["analyze", trace, "--no-html", "-q", "--what-if", "host_sync,no_such"]) == 2
    assert "no_such" in capsys.readouterr().err
    out = tmp_path / "o.json"
    rc = main(
        [
            "analyze",
            trace,
            "--no-html",
            "-q",
            "--json",
            str(out),
            "--what-if",
            "host_sync,dataloader_stall",
        ]
    )
    assert rc == 0
    sel = json.loads(out.read_text())["details"]["what_if"]["selected"]
    assert sel["fixes"] == ["host_sync", "dataloader_stall"] and sel["not_raised"] == [
        "dataloader_stall"
    ]
    host_sync = next(f for f in json.loads(out.read_text())["findings"] if f["id"] == "host_sync")
    assert sel["step_time_after_ns"] == host_sync["what_if"]["step_time_after_ns"]


@pytest.mark.parametrize(
    "name, fid",
    [("dataloader_starved", "dataloader_stall"), ("sync_item_print", "host_sync")],
)
def test_the_same_saving_whatever_steps_are_selected(name, fid):
    """Steps that repeat (within 2% here) give the same prediction from one selected step as
    from the whole window. It read 1.07x, 1.65x and 2.66x on dataloader_starved (1, 2 and
    all steps) while the
    autograd thread's first call in the window stayed where it was recorded: the backward
    of the first selected step could not move with the step thread."""
    path = H200 / f"{name}.pt.trace.json.xz"
    got = []
    for steps in (None, "3..3"):
        w = next(f for f in analyze(path, steps=steps).findings if f.id == fid).what_if
        got.append((w.speedup, w.step_time_after_ns))
    (speedup, after_ns), *others = got
    for s, a in others:
        assert s == pytest.approx(speedup, rel=0.1) and a == pytest.approx(after_ns, rel=0.1)


def _cold_loop(stub: bool) -> Events:
    """One step (0-2500 us) of ten 2 us kernels launched every 100 us by 8 us calls, the
    first launch taking 1500 us (its module loaded: a cold first pass) and its kernel starting
    when it returns; ``stub``: a second step marker with nothing in it (the profiler stopped)."""
    ev = Events().step(1, 0, 2500)
    ev.kernel("k0", 1510, 2, launch_us=0, launch_dur_us=1500)
    for i in range(1, 10):
        ev.kernel(f"k{i}", 1500 + 100 * i + 5, 2, launch_us=1500 + 100 * i, launch_dur_us=8)
    if stub:
        ev.step(2, 2510, 10)
    return ev


def test_a_step_marker_with_nothing_in_it_is_not_a_step():
    """The trailing marker launched no work while the step before did: the modelled steps are
    the first alone (its recorded 2500 us, not the median of 2500 and 10 us)."""
    with_stub = analyze_trace(_cold_loop(stub=True).trace()).results.replay
    alone = analyze_trace(_cold_loop(stub=False).trace()).results.replay
    assert with_stub.trace_step_median_ns == alone.trace_step_median_ns == 2500 * US
    assert with_stub.unprofiled_step_ns == alone.unprofiled_step_ns


def test_a_cold_first_launch_is_not_priced_as_a_saving():
    """Without the profiler (2 us per recorded event where a trace has no no-work ops) each
    8 us call takes 6 us, the first launch 1498 us; warm, that one takes its thread's usual
    6 us and its kernel starts when it returns. The host's own time between the calls stays:
    the warm step is 2500 - 1492 (module load) - 10 x 2 (profiler) = 988 us. CUDA graphs price
    the launches against that step: the ten 6 us calls go, one 10 us graph launch comes,
    938 us; the module load is no saving of theirs."""
    r = analyze_trace(_cold_loop(stub=False).trace()).results.replay
    assert r.profiler_ns_per_event == 2000
    assert (r.warmed_calls, r.warmed_ns) == (1, 1492 * US)
    assert r.unprofiled_step_ns == 988 * US
    w = r.what_if["cuda_graphs"]
    assert (w.step_time_ns, w.step_time_after_ns) == (988 * US, 938 * US)


def test_the_unprofiled_step_at_another_cost_per_event():
    """The step the cost sweep reads (benchmarks/profiler_cost_factor.py) is the analysis's
    own: at the trace's 2 us per event, 988 us as above; at twice that, each 8 us call keeps 4 us
    and 10 x 4 us go: 2500 - 1492 - 40 = 968 us, the range's low end (at 2.5 times too: a call
    keeps at least half its recorded time)."""
    ctx = build_context(_cold_loop(stub=False).trace())
    r = analyze_replay(ctx)
    at = unprofiled_steps_at(ctx, r, (1.0, 2.0))  # the trace's 2 us per event, and twice it
    assert at == [988 * US, 968 * US] == [r.unprofiled_step_ns, r.unprofiled_step_low_ns]


def test_first_launches_in_every_step_are_the_loops_own_cost():
    """New kernels every step (a new shape each time): each step's first launch of its own
    kernel takes 1500 us. That is no first pass but a cost every step pays: nothing is warmed
    and the un-profiled step keeps it."""
    ev = Events()
    for s in range(3):
        t0 = 3000 * s
        ev.step(s + 1, t0, 2500)
        ev.kernel(f"new{s}", t0 + 1510, 2, launch_us=t0, launch_dur_us=1500)
        for i in range(1, 10):
            ev.kernel(
                f"k{i}", t0 + 1500 + 100 * i + 5, 2, launch_us=t0 + 1500 + 100 * i, launch_dur_us=8
            )
    r = analyze_trace(ev.trace()).results.replay
    assert (r.warmed_calls, r.warmed_ns) == (0, 0)
    assert r.unprofiled_step_ns is not None and r.unprofiled_step_ns > 2000 * US


def test_an_unsettled_unprofiled_step_grades_nothing_above_low(monkeypatch):
    """Where the un-profiled step's own replay is cut short (a model too large for a round per
    blocking call, or the polars replay's smaller budget), a fix that removes blocking calls
    settles in fewer rounds and reads as a saving it is not: the torchdiffeq loop cut at 64
    rounds read host_sync HIGH 1.54x (measured 0.80-0.94x). Its findings are graded low at most,
    say so, and a warning names the cause."""
    from traceinsight.api import analyze as fresh
    from traceinsight.causal import graph

    monkeypatch.setattr(graph, "REPLAY_WORK_MAX", 0)
    monkeypatch.setattr(graph, "REPLAY_WORK_MAX_POLARS", 0)
    monkeypatch.setattr(graph, "WARM_START", False)  # as the polars loop starts its rounds
    a = fresh(H200 / "thirdparty" / "node.before.pt.trace.json.xz")
    assert "unprofiled" in a.results.replay.unconverged
    priced = [f for f in a.findings if f.what_if is not None]
    assert priced and all(f.severity in ("low", "info") for f in priced)
    assert all(f.evidence.get("what_if_unsettled") for f in priced)
    assert any("did not settle" in w or "stopped before" in w for w in a.warnings)


def _pinned_loader_loop() -> Events:
    """The pin-memory loop (:func:`_loader_loop`) whose batch arrives pinned: a 1 MB pinned
    upload launched at +6320 us, between the two GEMMs' launches."""
    ev = _loader_loop(True)
    for i in range(6):
        s = i * 7000
        ev.runtime("cudaMemcpyAsync", s + 6320, 10, correlation=900 + i)
        ev.memcpy("HtoD", s + 6330, 40, nbytes=1_000_000, src="pinned", dst="device")
        ev.rows[-1]["correlation"] = 900 + i
    return ev


def test_all_fixes_say_what_the_loaders_assumed_rate_leaves():
    """Audit 19: all fixes together read 4.82 ms on a T4 loop whose loader fix assumed the
    loader twice as fast, a batch every 11.22 ms. The combined replay hides the loading
    entirely (the timm loop's all fixes measured 2.72-3.68x against 3.05x so, 2.00x at twice
    the rate); where that is below the loader's interval at its fix's assumption the other end
    is said: here the workers bound the 7 ms step, so twice their rate is 2.00x. The loader's
    evidence names no tensors its step thread did not receive (a pin-memory thread did) and no
    "without pin_memory" alternative where the batches arrive pinned."""
    from traceinsight.causal.whatif import LOADER_ASSUMED_THROUGHPUT

    a = analyze_trace(_pinned_loader_loop().trace())
    w = a.what_if
    assert "dataloader_floor" in w.transforms
    assert w.speedup > 3
    assert w.speedup_loader_assumed == pytest.approx(LOADER_ASSUMED_THROUGHPUT, rel=1e-6)
    assert jsonable(w)["speedup_loader_assumed"] == pytest.approx(2.0, rel=1e-6)
    from traceinsight.report.format import saving_text

    assert "that hides the data loading entirely: 2.00x with the loader only twice as fast" in (
        saving_text(jsonable(w))
    )
    stall = next(f for f in a.findings if f.id == "dataloader_stall")
    assert stall.evidence["loader_plan"].batch_tensors is None
    assert stall.evidence["loader_plan"].receive_ns is None
    assert stall.evidence["what_if_unpinned"] is None
    # the same loop whose batches are not pinned keeps the alternative
    plain = analyze_trace(_loader_loop(True).trace())
    stall = next(f for f in plain.findings if f.id == "dataloader_stall")
    assert stall.evidence["what_if_unpinned"] is not None


def test_a_larger_batch_gaining_under_a_tenth_is_no_finding():
    """Audit 19: "a 4x batch would raise throughput 1.0x per sample" (small_batch, counted in
    all fixes) where the host made each batch on the CPU. The batch made on the CPU here gains
    1.11x at 4x (the copy call's own time held): raised at the default 1.10, and not with the
    threshold at 1.2."""
    trace = _made_on_the_cpu("aten::randn").trace()
    a = analyze_trace(trace)
    sb = next(f for f in a.findings if f.id == "small_batch")
    assert 1.10 <= sb.what_if.speedup < 1.2
    assert f"{sb.what_if.speedup:.2f}x per sample" in sb.title
    high = analyze_trace(trace, Options(thresholds={"small_batch_min_speedup": 1.2}))
    assert "small_batch" not in {f.id for f in high.findings}


def test_tensors_made_on_the_cpu_are_a_lever_on_a_busy_enough_gpu():
    """Audit 20 (a T4 loop, GPU 61.9% busy, torch.randn on the CPU 9.7 ms a step): no finding
    named the host's random fills, the largest lever (the header: host-bound, 1.40x), since
    gpu_underutilized asks for a GPU under 60% busy. Here 7 ms steps: aten::randn 2.5 ms on
    the CPU, a blocking 400 us upload, a 4.4 ms kernel running into the next step's randn: the
    GPU is over 60% busy and making the tensors on the GPU (the replay's inputs_on_device:
    the randn's host time gone) is priced by the finding, with its advice."""
    ev = Events()
    for i in range(5):
        s = i * 7000
        ev.step(i, s, 7000)
        ev.op("aten::randn", s + 100, 2500)
        ev.op("aten::normal_", s + 150, 2400)
        ev.runtime("cudaMemcpy", s + 2650, 500, correlation=100 + i)
        ev.memcpy("HtoD", s + 2700, 400, nbytes=4_000_000, src="pageable", dst="device")
        ev.rows[-1]["correlation"] = 100 + i
        ev.kernel("ampere_sgemm_128x64_tn", s + 3210, 4400, launch_us=s + 3200)
    a = analyze_trace(ev.trace())
    assert a.results.idle.gpu_busy_ratio >= 0.6
    w = a.results.replay.what_if["inputs_on_device"]
    assert w.speedup > 1.2
    f = next(f for f in a.findings if f.id == "gpu_underutilized")
    assert f.title.startswith("GPU busy ") and not f.title.startswith("GPU busy only")
    assert f.title.endswith("mostly while the host ran aten::randn")
    assert f.evidence["priced_by"] == "inputs_on_device" and f.what_if == w
    assert "device='cuda'" in f.recommendation
    # the same step whose 2.5 ms is other CPU work (aten::sort) is no such lever
    for row in ev.rows:
        if row["name"] in ("aten::randn", "aten::normal_"):
            row["name"] = "aten::sort" if row["name"] == "aten::randn" else "aten::copy_"
    b = analyze_trace(ev.trace())
    assert "inputs_on_device" not in b.results.replay.what_if
    assert "gpu_underutilized" not in {f.id for f in b.findings}


def test_cross_stream_waits_are_a_share_of_the_steps():
    """The invariant audit (session 57): the waits of a CUDA-graphed word LM's streams summed
    over ops came to 43x its steps. Now the union of the waits over the modelled steps' recorded
    span, in 0..1: here the same union taken by hand from the recorded model's rows."""
    path = ROOT / "fixtures/h100/thirdparty/word_lm.cudagraph_bf16.after.pt.trace.json.xz"
    ratio = analyze(path).results.replay.cross_stream_wait_ratio
    m = build_model(model_inputs(build_context(load_trace(path))))
    rows = m.gpu.filter((pl.col("after_op") >= 0) & (pl.col("gap_ns") > 0))
    total = 0
    for dev in set(rows["device"].to_list()):
        spans = sorted(
            (s - g, s)
            for s, g, d in rows.select("start_ns", "gap_ns", "device").iter_rows()
            if d == dev
        )
        end = None
        for lo, hi in spans:
            if end is None or lo > end:
                total += hi - lo
                end = hi
            elif hi > end:
                total += hi - end
                end = hi
    span = m.gpu["end_ns"].max() - m.steps["host_start_ns"].min()
    assert ratio == pytest.approx(total / span)
    assert 0 < ratio < 1


def test_all_fixes_leave_out_a_fix_that_slows_the_others():
    """The invariant audit (session 57): on a CUDA-graphed word LM all fixes replayed 1.032x
    beside launch_bound's 1.055x alone (cuda_graphs with remove_syncs replays slower than
    cuda_graphs alone). all_fixes now leaves host_sync's fix out, names it, and is launch_bound's
    own replay; the reports say which fix was left out and why."""
    path = ROOT / "fixtures/h100/thirdparty/word_lm.cudagraph_bf16.after.pt.trace.json.xz"
    a = analyze(path)
    by_id = {f.id: f for f in a.findings}
    both = analyze(path, what_if=["launch_bound", "host_sync"]).to_json()["details"]["what_if"]
    assert both["selected"]["speedup"] < by_id["launch_bound"].what_if.speedup  # together
    w = a.to_json()["details"]["what_if"]["all_fixes"]
    assert w["transforms"] == ["cuda_graphs"] and w["left_out"] == ["remove_syncs"]
    assert w["step_time_after_ns"] == by_id["launch_bound"].what_if.step_time_after_ns
    assert w["speedup"] >= max(f.what_if.speedup for f in a.findings if f.what_if)
    from traceinsight.report.terminal import render_summary

    assert "without host_sync, whose fix with the others replays slower" in render_summary(
        a.to_json()
    )
    from traceinsight.report.evidence import TRANSFORM_WORDS
    from traceinsight.report.html import render_html

    page = render_html(a.to_json())
    words = TRANSFORM_WORDS["remove_syncs"]
    assert f"left out, since with the others it replays slower: {words}" in page
