"""Audits 23 and 24 (session 43: /work/audit23 and /work/audit24, 36 corpus traces not
examined by audits 16-22), each defect fixed held by a test: on the corpus's trace where the
corpus is present (skipped with a message otherwise), with the figures from independent sums
over the raw records, and by hand-made traces where the pattern can be built."""

from __future__ import annotations

import gzip
import json
import math
import re
import sqlite3
from functools import cache

import orjson
import pytest

import traceinsight
from traceinsight.analyzers.health import SAMPLED_CORRELATION_STEP
from traceinsight.analyzers.replay import REPLAY_ERROR_MAX_RATIO
from traceinsight.cli import main
from traceinsight.findings.rules import COMM_ITSELF_ADVICE
from traceinsight.model.devices import HOST_LINK_GB_S_BY_ARCH, arch_of_kernels, host_links
from traceinsight.model.flops import op_cost
from traceinsight.model.schema import DeviceInfo
from traceinsight.pipeline import analyze_trace
from traceinsight.report.format import no_findings_words

from .builder import US, Events
from .conftest import shared_or_skip


def _union(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[list[int]] = []
    for s, e in sorted(spans):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def _overlap(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> int:
    i = j = t = 0
    while i < len(a) and j < len(b):
        s, e = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        t += max(0, e - s)
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return t


@cache
def _rocprof_sums() -> tuple[int, int, int]:
    """(compute union, communication union, their overlap) in ns over the rocprofv3 JSON's
    kernel dispatches, RCCL's by name."""
    path = shared_or_skip() / "rocprof" / "tracelens_908_results.json.gz"
    d = json.loads(gzip.decompress(path.read_bytes()))["rocprofiler-sdk-tool"][0]
    names = {k["kernel_id"]: k["kernel_name"] for k in d["kernel_symbols"]}
    comm, compute = [], []
    for r in d["buffer_records"]["kernel_dispatch"]:
        name = names.get(r["dispatch_info"]["kernel_id"], "")
        span = (r["start_timestamp"], r["end_timestamp"])
        (comm if re.search(r"nccl|rccl", name, re.I) else compute).append(span)
    cu, pu = _union(comm), _union(compute)
    return sum(e - s for s, e in pu), sum(e - s for s, e in cu), _overlap(cu, pu)


def test_comm_overlap_is_bounded_by_the_rank_compute() -> None:
    """D1: a rocprofv3 rank with 4.16 s of RCCL kernels and 0.28 s of other kernels in 15.1 s
    was told, HIGH, to let DDP's buckets overlap 3.95 s of exposed communication. Overlap hides
    communication behind compute the rank has: at most its compute not yet under
    communication, here ~75 ms: info, with advice that says so."""
    compute_ns, comm_ns, overlap_ns = _rocprof_sums()
    path = shared_or_skip() / "rocprof" / "tracelens_908_results.json.gz"
    f = next(f for f in traceinsight.analyze(path).findings if f.id == "comm_not_overlapped")
    assert f.evidence["compute_ns"] == pytest.approx(compute_ns, rel=0.01)
    assert f.evidence["comm_ns"] == pytest.approx(comm_ns, rel=0.01)
    hideable = compute_ns - overlap_ns
    assert f.evidence["hideable_ns"] == pytest.approx(hideable, rel=0.02)
    assert f.cost_ns == f.evidence["hideable_ns"] < 0.1 * f.evidence["exposed_comm_ns"]
    assert f.severity == "info"
    assert f.recommendation == COMM_ITSELF_ADVICE
    assert "overlap can hide at most" in f.title


def _mtia_in_call_gaps_ns() -> int:
    """The idle gaps of the MTIA rank (between the union of its device events) that end in a
    compute event whose submit call (mtia_runtime, by correlation) began before the gap and
    was still running at its start: the device waited for that call."""
    path = shared_or_skip() / "hta" / "mtia_trace_single_rank" / "mtia_rank_0.json.gz"
    ev = [e for e in orjson.loads(gzip.decompress(path.read_bytes()))["traceEvents"]]
    ev = [e for e in ev if e.get("ph") == "X"]
    device = sorted((e for e in ev if e.get("cat") == "mtia_ccp_events"), key=lambda e: e["ts"])
    calls = {
        e["args"]["correlation"]: e
        for e in ev
        if e.get("cat") == "mtia_runtime" and "correlation" in e.get("args", {})
    }
    by_start: dict[float, list[dict]] = {}
    for e in device:
        by_start.setdefault(e["ts"], []).append(e)
    spans = _union([(e["ts"], e["ts"] + e["dur"]) for e in device])
    total = 0.0
    for (_, a), (b, _) in zip(spans, spans[1:], strict=False):
        nxt = [e for e in by_start.get(b, ()) if "correlation" in e.get("args", {})]
        call = calls.get(nxt[0]["args"]["correlation"]) if nxt else None
        if call is not None and call["ts"] < a < call["ts"] + call["dur"]:
            total += b - a
    return int(total * 1000)  # us -> ns


def test_a_running_submit_call_is_launch_overhead_not_a_dependency() -> None:
    """D2: an MTIA rank's ~320 us submit calls (each compute event starting a median 65 us
    before its call returned) left the device idle in 2,136 gaps, 603.4 ms, read as gpu_wait
    ("work queued that waited on a dependency", stream-event advice). The device waited for
    the call still running: launch overhead."""
    in_call = _mtia_in_call_gaps_ns()
    assert 590e6 < in_call < 620e6
    path = shared_or_skip() / "hta" / "mtia_trace_single_rank" / "mtia_rank_0.json.gz"
    a = traceinsight.analyze(path)
    idle = a.metrics["idle_by_cause_ns"]
    assert idle["gpu_wait"] < 0.01 * in_call
    assert idle["launch_overhead"] >= 0.95 * in_call
    under = next((f for f in a.findings if f.id == "gpu_underutilized"), None)
    assert under is None or under.severity in ("info", "low")


def test_no_gpu_activity_is_not_a_clean_bill(capsys: pytest.CaptureFixture[str]) -> None:
    """D11: nsys exports of NVTX ranges and OS calls only (ICON's rank_ export,
    EfficientCenterFormer's) read "nothing measurable stands out", the words of a healthy run."""
    idle = {
        "source": {"devices": [{"id": 0, "active": False}]},
        "metrics": {"gpu_busy_ratio": None},
    }
    assert "no GPU activity" in no_findings_words(idle)
    busy = {"source": {"devices": [{"id": 0, "active": True}]}, "metrics": {"gpu_busy_ratio": 0.9}}
    assert no_findings_words(busy) == "No findings: nothing measurable stands out."
    path = shared_or_skip() / "nsys" / "ISC25-ICON-C__rank_.sqlite"
    assert main(["analyze", str(path), "--no-html", "--format", "markdown"]) == 0
    assert "the trace records no GPU activity" in capsys.readouterr().out


def test_a_cast_and_a_gather_move_what_they_touch() -> None:
    """D7: on an H100 Qwen inference trace the fp32 -> bf16 casts (aten::copy_ into a bf16
    tensor) read 4 bytes and write 2 an element, 2.69 GB over their 51 copies, at 2.99 TB/s
    under the 3.35 TB/s peak; they were counted as 10 bytes an element (4.98 TB/s). The
    embedding reads the 8,944 rows its indices pick, not the 311 MB table (12.0 TB/s read)."""
    path = shared_or_skip() / "tracelens" / "h100_Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz"
    ev = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    cast_bytes = 0
    for e in ev:
        args = e.get("args") or {}
        if e.get("name") == "aten::copy_" and (args.get("Input type") or [])[:2] == [
            "c10::BFloat16",
            "float",
        ]:
            dst, src = args["Input Dims"][:2]
            cast_bytes += math.prod(dst) * 2 + math.prod(src) * 4
    assert cast_bytes == 2_693_074_176
    top = traceinsight.analyze(path).results.efficiency.roofline.top_kernels
    cast = next(k for k in top if "bfloat16_copy_kernel" in k.name)
    assert cast.bytes == pytest.approx(cast_bytes, rel=0.001)
    assert cast.bandwidth_bytes_per_s < 3.35e12
    # the embedding as recorded: a [151936, 1024] bf16 table, [16, 559] int64 indices
    emb = next(e for e in ev if e.get("name") == "aten::embedding")["args"]
    cost = op_cost(
        "aten::embedding", json.dumps(emb["Input Dims"]), json.dumps(emb["Input type"]), None
    )
    assert cost.bytes == 8944 * 8 + 2 * 8944 * 1024 * 2


def test_an_unlisted_gpu_gets_its_architecture_pcie_link() -> None:
    """D9: a Quadro RTX 6000 (compute capability 7.5, not in the spec table) and a 2021
    trace's V100 that names no device (volta_sgemm_* kernels) were priced at PCIe 4.0's 25 GB/s
    pinned rate, twice their PCIe 3.0 link's 12."""
    assert arch_of_kernels(["volta_sgemm_128x64_nt", "void at::native::foo"]) == "sm70"
    # cuBLAS ships older kernels too: the newest named is the floor of the device's
    assert arch_of_kernels(["sm80_xmma_gemm_f32f32", "sm90_xmma_gemm_bf16bf16"]) == "sm90"
    assert arch_of_kernels(["void at::native::foo"]) is None
    quadro = DeviceInfo(id=0, name="Quadro RTX 6000", compute_capability="7.5")
    assert host_links([quadro]) == {0: HOST_LINK_GB_S_BY_ARCH["sm75"] * 1e9}
    # no properties at all: the kernels say which architecture
    assert host_links([], lambda: ["volta_sgemm_128x64_nt"], active=(0,)) == {0: 12e9}
    assert host_links([], lambda: ["void k"], active=(0,)) == {}
    for name in (
        "kineto-samples/plugin_2021-01_resnet50_nw0_worker0.pt.trace.json.gz",
        "nsys/Mordred__report1.sqlite",
    ):
        copies = traceinsight.analyze(shared_or_skip() / name).results.copies
        assert copies.pinned_bytes_per_s == 12e9, name


def _zero_grad_loop(fills: int) -> Events:
    """3 host-bound steps of 1000 us: a 600 us GEMM launched at each step's start, 645 us of
    other host work, optimizer.zero_grad() from 650 to 750 us launching ``fills`` 1 us fill
    kernels (10 us launch calls, 10 us apart), then host work to 990 us and a last kernel."""
    e = Events()
    for s in range(3):
        t0 = s * 1000
        e.step(s + 1, t0, 1000)
        e.kernel("ampere_sgemm_128x64_nn", t0 + 5, 600, launch_us=t0)
        e.op("aten::cpu_work", t0 + 5, 645)
        e.op("Optimizer.zero_grad#SGD.zero_grad", t0 + 650, 100)
        for i in range(fills):
            at = t0 + 650 + 10 * i
            e.op("aten::zero_", at, 10)
            e.kernel(
                "void at::native::vectorized_elementwise_kernel<4, FillFunctor>",
                at + 8,
                1,
                launch_us=at + 2,
                launch_dur_us=5,
            )
        e.op("aten::cpu_more", t0 + 750, 240)
        e.kernel("void at::native::elementwise_kernel<mul>", t0 + 995, 3, launch_us=t0 + 990)
    return e


def test_zero_grad_fills_found_and_priced() -> None:
    """D5: SGD.zero_grad launched 161 fill kernels a step on three 2021 ResNet-50 samples
    (12.6 / 13.1 / 6.0 ms of host time a call, the GPU idle) and only launch_bound's CUDA
    graphs were advised. By hand here: 10 fills a call, 100 us of host time, and dropping
    the gradients (set_to_none=True) removes that host time from each 1000 us step."""
    a = analyze_trace(_zero_grad_loop(10).trace())
    o = a.results.optimizer
    assert (o.zero_grad_calls, o.zero_grad_kernels_per_call) == (3, 10)
    assert o.zero_grad_host_ns_per_call == 100 * US
    assert o.zero_grad_gpu_ns_per_call == 10 * US
    f = next(f for f in a.findings if f.id == "zero_grad_fills")
    assert "10 kernels" in f.title and "set_to_none=True" in f.recommendation
    w = f.what_if
    assert w is not None
    # the 100 us of the range, less the profiler's per-event cost the un-profiled step has
    # already taken out of it (2 us an event without no-work ops: 21 events in the range)
    saved = w.step_time_ns - w.step_time_after_ns
    assert 100 * US - 21 * 2 * US <= saved <= 100 * US
    # set_to_none=True: the range launches nothing, and nothing is found
    quiet = analyze_trace(_zero_grad_loop(0).trace())
    assert quiet.results.optimizer.zero_grad_calls == 3
    assert not any(f.id == "zero_grad_fills" for f in quiet.findings)


def test_zero_grad_fills_on_the_2021_samples() -> None:
    """The three samples: 161 fills a call, the host time the helper summed from the raw
    events (12.6, 13.1, 6.0 ms a call), a saving of 3-7% of the step."""
    for name, host_ms in (
        ("plugin_2021-01_resnet50_nw0_worker0.pt.trace.json.gz", 12.59),
        ("plugin_2021-01_resnet50_nw4_worker0.pt.trace.json.gz", 13.06),
        ("worker0.1623143089861.pt.trace.json.gz", 6.02),
    ):
        path = shared_or_skip() / "kineto-samples" / name
        ev = orjson.loads(gzip.decompress(path.read_bytes()))
        ev = ev if isinstance(ev, list) else ev["traceEvents"]
        ranges = [e for e in ev if e.get("name", "").startswith("Optimizer.zero_grad#")]
        raw_ms = sum(e["dur"] for e in ranges) / len(ranges) / 1000
        assert raw_ms == pytest.approx(host_ms, abs=0.01)
        if "nw4" in name:
            continue  # nw0 with 4 workers: its range checked above, one analysis of the pair
        a = traceinsight.analyze(path)
        assert a.results.optimizer.zero_grad_kernels_per_call == 161
        assert a.results.optimizer.zero_grad_host_ns_per_call / 1e6 == pytest.approx(
            raw_ms, rel=0.01
        )
        f = next(f for f in a.findings if f.id == "zero_grad_fills")
        assert 1.02 < f.what_if.speedup < 1.08


def test_a_class_rate_says_which_time_it_is_over(capsys: pytest.CaptureFixture[str]) -> None:
    """D8: a B200 eager trace's GEMM row read 300.5 TFLOP/s beside 0.236 TFLOP and 6.25 ms of
    kernels (37.7 TFLOP/s): the rate is over the 0.78 ms of the three nvjet kernels whose
    FLOPs are known (11.4% of the math time). The row and the header now say so."""
    path = shared_or_skip() / "tracelens" / "b200_eager_trace.json.gz"
    a = traceinsight.analyze(path)
    gemm = next(c for c in a.results.efficiency.roofline.classes if c.kernel_class == "gemm")
    assert gemm.flops_time_ns < 0.2 * gemm.time_ns
    assert gemm.achieved_tflops == pytest.approx(gemm.flops / gemm.flops_time_ns / 1e3)
    assert main(["analyze", str(path), "--no-html"]) == 0
    assert "TFLOP/s where FLOPs are known (11.4% of the time)" in capsys.readouterr().out


def _mordred_after_return_ns() -> int:
    """Idle that begins while a blocking call (cudaMemcpy, cudaMemset, a synchronize) runs,
    after that call returned (+1 ms): the host at work on what it read back. Raw SQLite."""
    path = shared_or_skip() / "nsys" / "Mordred__report1.sqlite"
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        names = dict(db.execute("select id, value from StringIds"))
        gpu = db.execute(
            "select start, end from CUPTI_ACTIVITY_KIND_KERNEL union all "
            "select start, end from CUPTI_ACTIVITY_KIND_MEMCPY union all "
            "select start, end from CUPTI_ACTIVITY_KIND_MEMSET"
        ).fetchall()
        calls = [
            (s, e)
            for s, e, n in db.execute("select start, end, nameId from CUPTI_ACTIVITY_KIND_RUNTIME")
            if any(k in names.get(n, "") for k in ("cudaMemcpy_", "cudaMemset_", "Synchronize"))
        ]
    busy = _union(gpu)
    after = 0
    for (_, a), (b, _) in zip(busy, busy[1:], strict=False):
        ends = [e for s, e in calls if s <= a < e]
        if ends:
            after += (b - a) - (min(b, max(ends) + 1_000_000) - a)
    return after


def test_read_back_processing_is_said_without_a_replay() -> None:
    """D3: a CUDA app's (Mordred's nsys export, no steps) "205 host syncs leave the GPU idle
    171.37 ms" held 161.6 ms (raw) of the host working on its read-back data after the calls
    returned, which removing the syncs does not give back. Without a replay the title says so
    and only the rest is graded."""
    raw = _mordred_after_return_ns()
    assert 155e6 < raw < 170e6
    a = traceinsight.analyze(shared_or_skip() / "nsys" / "Mordred__report1.sqlite")
    f = next(f for f in a.findings if f.id == "host_sync")
    after = f.evidence["idle_after_return_ns"]
    assert after == pytest.approx(raw, rel=0.10)
    assert "after the calls returned" in f.title
    assert f.cost_ns == f.evidence["idle_ns"] - after


def test_host_work_after_unpriced_syncs_is_the_gpus_idle() -> None:
    """Session 52 (a public nsys export of a streamed Llama's simulation, 512 syncs, 598 ms of
    the host in its own ranges after they returned, the GPU 97% idle): host_sync says that
    idle but grades only the syncs' own part, so gpu_underutilized counts the host's work as
    unexplained, rather than nothing above low. By hand: 12 rounds
    of a 100 us kernel, a sync returning 2 us after it, 2.8 ms of host work, then the next
    launch; 11 gaps of 2,900 us, 2 us of each in the sync."""
    ev = Events()
    for i in range(12):
        t = i * 3000
        ev.op("launch_layer", t, 8)
        ev.kernel("gemm", t + 10, 100, launch_us=t + 1)
        ev.runtime("cudaDeviceSynchronize", t + 6, 106)
        ev.op("prepare_next", t + 120, 2800)
    a = analyze_trace(ev.trace())
    by_id = {f.id: f for f in a.findings}
    sync = by_id["host_sync"]
    assert sync.evidence["idle_ns"] == 11 * 2_900 * US
    assert "after the calls returned" in sync.title
    after = sync.evidence["idle_after_return_ns"]
    # each gap's host work: its 2,900 us less the sync's 2 us and the next launch's few us
    assert 11 * 2_890 * US <= after <= 11 * 2_898 * US
    assert sync.cost_ns == sync.evidence["idle_ns"] - after  # graded: the syncs' own part
    assert sync.severity == "info"
    under = by_id["gpu_underutilized"]
    assert under.cost_ns == after
    assert under.severity == "high"  # the GPU 3.6% busy, 12 rounds of one steady pattern


def test_tuning_syncs_are_not_host_syncs_sources() -> None:
    """Session 52 (a DLProf nsys export: "14 host syncs" whose sources listed 15 more, the
    cudaEventSynchronize calls cudnn.benchmark timed its convolutions with): the tuning syncs
    host_sync leaves out are left out of its sources too. By hand: 3 event syncs inside a
    cudnn_convolution range, 1 user sync, NVTX-like ranges only (no cpu ops)."""
    ev = Events()
    ev.annotation("train_loop", 0, 20_000)
    for i in range(12):
        ev.kernel("gemm", i * 1500 + 20, 300, launch_us=i * 1500 + 5)
    ev.annotation("aten::cudnn_convolution", 100, 600)
    for k in range(3):
        ev.runtime("cudaEventSynchronize", 150 + k * 100, 50)
    ev.runtime("cudaDeviceSynchronize", 3000, 400)
    a = analyze_trace(ev.trace())
    assert (a.results.syncs.host_sync_count, a.results.syncs.autotune_syncs) == (1, 3)
    f = next(f for f in a.findings if f.id == "host_sync")
    sites = [(s.location, s.trigger, s.count) for s in f.evidence["sources"]]
    assert sites == [("train_loop", "cudaDeviceSynchronize", 1)]


AUTOGRAD_NW0 = "kineto-samples/tbplugin_2021-01_resnet50_autograd_nw0_worker0.pt.trace.json.gz"


@cache
def _raw_events(rel: str) -> list[dict]:
    """A corpus Kineto trace's events, decoded once per test process (read only)."""
    doc = orjson.loads(gzip.decompress((shared_or_skip() / rel).read_bytes()))
    return doc if isinstance(doc, list) else doc["traceEvents"]


def test_zero_grad_per_call_counts_the_calls_that_filled() -> None:
    """Audit 24: the first zero_grad() of a run without steps (no gradients yet) launched
    nothing, and the mean read "134.2 kernels and 8.83 ms a call" where the other 5 calls
    launched 161 fills in 10.49 ms each (the raw ranges below)."""
    path = shared_or_skip() / AUTOGRAD_NW0
    ev = _raw_events(AUTOGRAD_NW0)
    ranges = sorted(
        (e for e in ev if e.get("name", "").startswith("Optimizer.zero_grad#")),
        key=lambda e: e["ts"],
    )
    o = traceinsight.analyze(path).results.optimizer
    assert (o.zero_grad_calls, o.zero_grad_filling_calls) == (len(ranges), len(ranges) - 1)
    assert o.zero_grad_kernels_per_call == 161
    later_ms = sum(e["dur"] for e in ranges[1:]) / (len(ranges) - 1) / 1000
    assert o.zero_grad_host_ns_per_call / 1e6 == pytest.approx(later_ms, rel=0.001)


def test_cudnn_benchmark_timing_syncs_are_tuning_not_the_loops() -> None:
    """Audit 24: a 2021 ResNet-50 without step markers read "373 host syncs ... 131 ms; most
    from CudnnConvolutionBackward", advising to remove .item(): 357 are cudaEventSynchronize
    inside cuDNN convolution ops, cudnn.benchmark timing its candidate algorithms once per
    shape. They are one-time tuning now, not host syncs."""
    path = shared_or_skip() / AUTOGRAD_NW0
    ev = _raw_events(AUTOGRAD_NW0)
    convs = [
        (e["tid"], e["ts"], e["ts"] + e["dur"])
        for e in ev
        if e.get("ph") == "X"
        and re.search(r"cudnn_convolution|CudnnConvolution", e.get("name", ""))
    ]
    syncs = [e for e in ev if e.get("name") == "cudaEventSynchronize"]
    inside = [e for e in syncs if any(t == e["tid"] and s <= e["ts"] <= x for t, s, x in convs)]
    assert len(inside) == 357
    a = traceinsight.analyze(path)
    assert a.results.syncs.autotune_syncs == len(inside)
    f = next(f for f in a.findings if f.id == "host_sync")
    assert f.evidence["host_sync_count"] == 373 - 357
    assert "CudnnConvolution" not in f.title
    assert a.metrics["idle_by_cause_ns"]["host_sync"] < 10e6  # 131 ms before


def test_cuda_module_loading_is_warm_up_not_the_profiler() -> None:
    """Audit 24: nsys-ai's mock export read "idle: profiler 18.25 ms, warmup 4.20 ms": every
    CUPTI overhead row was "profiler overhead", though 14.36 ms of the gap lay under rows of
    type "Runtime module loading (CUDA)", which CUDA pays without a profiler too. The types
    are read now: loading is one-time warm-up."""
    path = shared_or_skip() / "nsys" / "nsys-ai__mock.sqlite"
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        loading = db.execute(
            "select start, end from CUPTI_ACTIVITY_KIND_OVERHEAD where overheadType = 6"
        ).fetchall()
    loading_ns = sum(e - s for s, e in _union(loading))
    assert loading_ns > 14e6
    idle = traceinsight.analyze(path).metrics["idle_by_cause_ns"]
    assert idle["profiler"] == 0
    assert idle["warmup"] >= 4.20e6 + 14.36e6


def _launches(step: int, extra: str | None = None) -> Events:
    """600 kernels, each launched by a cudaLaunchKernel whose correlation id is ``step`` past
    the last one's (one step of 600 ms); ``extra``: one more runtime call of that name."""
    e = Events()
    e.step(1, 0, 700_000)
    for i in range(600):
        e._corr = i * step  # the next kernel's correlation: i * step + 1
        e.kernel("void gemm_kernel", i * 1000 + 10, 500, launch_us=i * 1000)
    if extra:
        e.runtime(extra, 650_000, 10, correlation=600 * step + 1)
    return e


def test_a_trace_whose_runtime_calls_were_filtered_is_said() -> None:
    """Audit 24: HTA's sampled ranks (its trace filter kept only launches and copies, the
    correlation ids 36-37 apart at the median; 6-15 in complete traces) read gpu_underutilized
    HIGH on "work queued that waited on a dependency". The check says the calls were filtered,
    and the idle findings are graded on that."""

    def checks(e: Events) -> list[str]:
        return [q["check"] for q in analyze_trace(e.trace()).to_json()["data_quality"]]

    assert "runtime_calls_filtered" in checks(_launches(SAMPLED_CORRELATION_STEP + 12))
    assert "runtime_calls_filtered" not in checks(_launches(15))
    # one sync among them: the calls were not filtered to launches
    assert "runtime_calls_filtered" not in checks(_launches(40, "cudaStreamSynchronize"))
    path = shared_or_skip() / "hta" / "trace_filter" / "sampled_rank-0.json.gz"
    a = traceinsight.analyze(path)
    assert [q["check"] for q in a.to_json()["data_quality"]] == ["runtime_calls_filtered"]
    under = next((f for f in a.findings if f.id == "gpu_underutilized"), None)
    assert under is None or under.severity in ("info", "low")


def test_the_range_profiler_mode_is_named_not_called_lost() -> None:
    """Audit 24: HTA's cupti_profiler trace (Kineto with profiler metrics, 2023) holds one
    cuda_profiler_range event per kernel, replayed for its counters, and no kernel activity:
    it read "the device side was lost". The mode is named and the re-record says how."""
    rel = "hta/cupti_profiler/benchmark_result_924719_1679055439_trace.json.gz"
    ranges = [e for e in _raw_events(rel) if e.get("cat") == "cuda_profiler_range"]
    assert len(ranges) == 77
    a = traceinsight.analyze(shared_or_skip() / rel)
    (q,) = [q for q in a.to_json()["data_quality"] if q["check"] == "device_activity_missing"]
    assert "range-profiler mode" in q["message"] and "77 cuda_profiler_range events" in q["message"]
    assert "was lost" not in q["message"]


def test_a_step_the_alignment_leaves_no_time_is_no_step():
    """HTA's trace_compare samples (session 57's invariant audit): two ProfilerSteps, the
    trimmed trace ties none of the first's GPU work to its launches, and the alignment moved
    that step's start to its end. The empty step was counted: the median of two halved to
    58.56 ms and small_batch read HIGH (4.00x) on its two steps. Now one step; and base's step
    model, which replays the step in 0.145 ms from the two launches recorded (117.13 ms
    recorded), prices nothing: the warning says so and no saving is replayed."""
    for name in ("base/base.json.gz", "test/test.json.gz"):
        path = shared_or_skip() / "hta" / "trace_compare" / name
        with gzip.open(path) as f:
            doc = json.load(f)
        marks = [
            e for e in doc["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep#")
        ]
        assert len(marks) == 2 and all(e["dur"] > 0 for e in marks)
        a = traceinsight.analyze(path)
        assert a.metrics["steps"] == 1
        assert all(s.dur_ns > 0 for s in a.results.steps.per_step)
        assert "small_batch" not in {f.id for f in a.findings}
        assert a.findings[0].id == "gpu_underutilized"  # 0.2-0.3% busy
        r = a.results.replay
        # base's model replays 0.145 ms of its 117.13 ms step; test's 58.25 of 65.08 ms
        off = r.replay_error_ratio > REPLAY_ERROR_MAX_RATIO
        assert off == (name.startswith("base"))
        assert (r.unprofiled_step_ns is None) == off
        assert any("did not capture the step" in w for w in a.warnings) == off
