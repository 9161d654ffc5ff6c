"""Mechanisms found by auditing public traces against their raw events (session 32), each
rebuilt by hand as a small Kineto document with the same shape: the public files themselves
stay out of the repository (benchmarks/RESULTS.md names them and their sources).

- WeatherBench2's Nsight export: one 1.5 us memset (its cudaMemsetAsync traced) and no kernel in
  a 426 ms capture read as copy_bound HIGH ("copy engines busy 100%") and as kernel activity
  missing ("1 launch call traced"): the memset call made the memset that is there.
- A vecAdd (cuda-perf-sandbox): the only kernel started 1.1 ms after its 1.04 ms first launch
  (the module loaded lazily) read as queued work waiting on another stream (gpu_underutilized
  HIGH), and cold_start did not fire.
- SGLang's decode capture (TraceLens): one range, its GPU idle all graph capture, its two
  frees the capture's own empty_cache, read as allocator_churn MEDIUM (1.18x).

Session 33:
- A kineto 2021 ResNet50 sample (4 workers, V100): dataloader_stall said 0.02 ms of idle in
  DataLoader.__next__ while 7.1 ms of GPU idle lies inside its calls, in gaps whose larger part
  the host spent elsewhere (each gap goes to the cause covering most of it).

Session 33 (a reading of the audit's, held as it is):
- SGLang's prefill+decode on MI300X (TraceLens): a 493 ms gap with the host in a blocking
  60-byte copy (torch.tensor -> aten::to -> hipMemcpyWithStream) reads as queued work waiting
  on a dependency (gpu_underutilized HIGH). The audit took the copy for the cause; the raw
  events have the queued kernel (resolve_future_token_ids) launched behind a
  hipStreamWaitEvent on the copy's stream: the copy waited for that event like the kernel.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import traceinsight

PROPS = [{"id": 0, "name": "NVIDIA H100 80GB HBM3", "numSms": 132, "totalGlobalMem": 85e9}]


def _x(name: str, cat: str, ts: float, dur: float, tid: int = 1, **args: Any) -> dict[str, Any]:
    pid = 0 if cat in ("kernel", "gpu_memset", "gpu_memcpy") else 100
    return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "pid": pid, "tid": tid, "args": args}  # fmt: skip


def _dev(name: str, cat: str, ts: float, dur: float, stream: int, corr: int, **args: Any) -> dict[str, Any]:  # fmt: skip
    """A device activity (kernel, copy, memset) on GPU 0: its stream and launch correlation."""
    return _x(name, cat, ts, dur, 7, device=0, stream=stream, correlation=corr, **args)


def _launch(op: str, api: str, t: float, kernel: str, k_t: float, k_dur: float, stream: int, corr: int) -> list[dict[str, Any]]:  # fmt: skip
    """An op at ``t`` whose launch call (``api``, 1 us in, 3 us long) ran ``kernel``."""
    return [
        _x(op, "cpu_op", t, 5.0),
        _x(api, "cuda_runtime", t + 1, 3.0, correlation=corr),
        _dev(kernel, "kernel", k_t, k_dur, stream, corr),
    ]


def _write(tmp: Path, events: list[dict[str, Any]], name: str) -> Path:
    p = tmp / f"{name}.json"
    doc = {"schemaVersion": 1, "deviceProperties": PROPS, "traceEvents": events}
    p.write_text(json.dumps(doc))
    return p


def _checks(a: Any) -> set[str]:
    return {c["check"] for c in a.results.health.checks}


def test_one_memset_is_not_a_copy_bound_run(tmp_path: Path) -> None:
    rt = "cuda_runtime"
    events = [
        _x("cudaMalloc", rt, 0.0, 65.0),
        _x("cudaMemsetAsync", rt, 1000.0, 8.0, correlation=1),
        _dev("Memset (Device)", "gpu_memset", 1010.0, 1.5, 7, 1),
        _x("cudaFree", rt, 2000.0, 118_000.0),
    ]
    a = traceinsight.analyze(_write(tmp_path, events, "one_memset"))
    assert a.results.idle.copy_busy_ratio == 1.0  # the window is the memset
    assert "copy_bound" not in {f.id for f in a.findings}
    # the memset call made the memset that is there: no kernel activity is missing
    assert "device_activity_missing" not in _checks(a)


def test_a_gpu_span_that_is_a_sliver_of_the_capture_is_said(tmp_path: Path) -> None:
    """Session 52, the same export seen again: its 100% busy is true of the window, which is
    the memset's 1.5 us of a 120 ms capture; a data-quality warning says the figures describe
    that span alone (no finding rests on it). Not where the GPU span is 1% of the capture or
    more, nor where steps mark the window."""
    rt = "cuda_runtime"

    def run(name: str, memset_us: float, *step: dict[str, Any]) -> Any:
        events = [
            _x("cudaMalloc", rt, 0.0, 65.0),
            _x("cudaMemsetAsync", rt, 1000.0, 8.0, correlation=1),
            _dev("Memset (Device)", "gpu_memset", 1010.0, memset_us, 7, 1),
            _x("cudaFree", rt, 2000.0, 50.0),
            _x("aten::copy_", "cpu_op", 119_000.0, 1000.0),  # the capture: 0..120 ms
            *step,
        ]
        return traceinsight.analyze(_write(tmp_path, events, name))

    a = run("sliver", 1.5)
    (check,) = [c for c in a.results.health.checks if c["check"] == "gpu_span_small"]
    assert (check["severity"], check["count"], check["affects"]) == ("warning", 1, [])
    assert "within 1.5 us of the 120.00 ms capture" in check["message"]
    assert a.findings == run("sliver_again", 1.5).findings  # graded as before: nothing rests on it
    assert "gpu_span_small" not in _checks(run("one_percent", 1200.0))  # 1.2 ms of 120 ms
    step = _x("ProfilerStep#1", "user_annotation", 900.0, 200.0)
    assert "gpu_span_small" not in _checks(run("stepped", 1.5, step))


def test_a_kernel_launched_but_no_kernel_is_still_missing(tmp_path: Path) -> None:
    """The same memset with a kernel launch traced beside it: that launch's kernel is lost."""
    rt = "cuda_runtime"
    events = [
        _x("cudaMemsetAsync", rt, 1000.0, 8.0, correlation=1),
        _dev("Memset (Device)", "gpu_memset", 1010.0, 1.5, 7, 1),
        _x("cudaLaunchKernel", rt, 1100.0, 5.0, correlation=2),
    ]
    a = traceinsight.analyze(_write(tmp_path, events, "lost_kernel"))
    check = next(c for c in a.results.health.checks if c["check"] == "device_activity_missing")
    assert check["count"] == 1 and "1 kernel launch call" in check["message"]


def test_a_first_launch_that_loads_its_module_is_warm_up(tmp_path: Path) -> None:
    """vecAdd: copies in (the second still running on the device into the launch call), the
    kernel's first launch 1.04 ms (lazy loading), a device synchronize during which the kernel
    starts 1.1 ms after the launch returned, a copy out. The gap before the kernel lies mostly
    outside the one-time calls, and its work was queued before it began."""
    rt = "cuda_runtime"
    mc = "gpu_memcpy"
    events = [
        _x("cudaMemcpy", rt, 0.0, 1544.0, correlation=1),
        _dev("Memcpy HtoD (Pageable -> Device)", mc, 600.0, 900.0, 7, 1),
        _x("cudaMemcpy", rt, 1548.0, 874.0, correlation=2),
        # as recorded there, the device's copy ran on into the kernel's launch call
        _dev("Memcpy HtoD (Pageable -> Device)", mc, 1900.0, 2100.0, 7, 2),
        _x("cuLibraryLoadData", "cuda_driver", 2430.0, 1088.0),
        _x("cudaLaunchKernel", rt, 3530.0, 1040.0, correlation=3),
        _x("cudaDeviceSynchronize", rt, 4575.0, 1149.0),
        _dev("vecAdd", "kernel", 5690.0, 39.0, 7, 3),
        _x("cudaMemcpy", rt, 5730.0, 827.0, correlation=4),
        _dev("Memcpy DtoH (Device -> Pageable)", mc, 5760.0, 400.0, 7, 4),
    ]
    a = traceinsight.analyze(_write(tmp_path, events, "vecadd"))
    idle = a.results.idle.idle_by_cause_ns
    assert idle["warmup"] >= 1_000_000 and idle.get("gpu_wait", 0) == 0, idle
    by = {f.id: f for f in a.findings}
    assert "cold_start" in by
    assert by.get("gpu_underutilized") is None or by["gpu_underutilized"].severity in ("low", "info")  # fmt: skip


def test_a_window_that_is_one_graph_capture_is_a_first_pass(tmp_path: Path) -> None:
    """One range around a graph capture: torch.cuda.graph's empty_cache frees before the
    capture begins, the capture's launches, the GPU idle all the while."""
    rt = "cuda_runtime"
    events = [
        _x("capture_32_DECODE", "user_annotation", 0.0, 30_000.0),
        _x("cudaFree", rt, 100.0, 240.0),
        _x("cudaFree", rt, 400.0, 240.0),
        _x("cudaStreamBeginCapture", rt, 700.0, 5.0),
    ]
    events += [
        _x("cudaLaunchKernel", rt, 800.0 + 20.0 * i, 10.0, correlation=10 + i) for i in range(50)
    ]
    events += [
        _x("cudaStreamEndCapture", rt, 29_000.0, 50.0),
        _x("cudaGraphInstantiate", rt, 29_060.0, 500.0),
        # the warm-up run before the capture and the graph's first replay: the GPU's only work
        _dev("k", "kernel", 20.0, 5.0, 7, 1),
        _dev("k", "kernel", 29_990.0, 5.0, 7, 2),
        _x("cudaLaunchKernel", rt, 10.0, 5.0, correlation=1),
        _x("cudaGraphLaunch", rt, 29_980.0, 5.0, correlation=2),
    ]
    a = traceinsight.analyze(_write(tmp_path, events, "capture"), step_range="capture_32_DECODE")
    assert a.results.idle.idle_by_cause_ns["capture"] > 0.9 * a.results.idle.idle_ns
    assert a.results.idle.cold_window
    above_low = [f.id for f in a.findings if f.severity not in ("low", "info")]
    assert "allocator_churn" not in above_low, [(f.id, f.severity) for f in a.findings]
    # nor at all (audit 6: the real capture's two frees, under torch.cuda.graph's __enter__,
    # were told low to "remove torch.cuda.empty_cache() from the loop")
    assert "allocator_churn" not in {f.id for f in a.findings}


def test_queued_work_behind_an_event_wait_is_a_dependency_under_a_blocking_copy(
    tmp_path: Path,
) -> None:
    """SGLang's shape on one stream: a kernel, then the stream made to wait on an event
    (hipStreamWaitEvent: the overlap scheduler's previous batch, recorded on a stream the trace
    does not show), a kernel launched behind it 40 us into the gap, and the host in a blocking
    60-byte host-to-device copy on that stream for the whole 100 ms gap; the kernel and the copy
    run as the event fires. The copy waited for the stream, the stream for the event: the gap is
    the dependency's (gpu_wait), not the copy's (an audit read the copy as the cause; the
    recorded trace has resolve_future_token_ids_kernel behind the event wait)."""
    rt = "cuda_runtime"
    events = [
        *_launch("aten::arange", "hipLaunchKernel", 0.0, "arange", 10.0, 90.0, 3, 1),
        _x("hipStreamWaitEvent", rt, 120.0, 10.0, correlation=2),
        _x("hipLaunchKernel", rt, 140.0, 5.0, correlation=3),
        _dev("resolve_future_token_ids", "kernel", 100_150.0, 5.0, 3, 3),
        _x("aten::to", "cpu_op", 150.0, 100_010.0),
        _x("aten::copy_", "cpu_op", 151.0, 100_007.0),
        _x("hipMemcpyWithStream", rt, 152.0, 100_003.0, correlation=4),
        _dev("Memcpy HtoD (Host -> Device)", "gpu_memcpy", 100_157.0, 1.0, 3, 4, bytes=60),
        *_launch("aten::mm", "hipLaunchKernel", 100_170.0, "gemm", 100_200.0, 90.0, 3, 5),
    ]
    a = traceinsight.analyze(_write(tmp_path, events, "event_wait"))
    idle = a.results.idle.idle_by_cause_ns
    # the gap, from 0.1 to 100.15 ms, and the 2 us between the kernel and its copy, whose call
    # had returned as that gap began (the device's own gap between queued work)
    assert idle["gpu_wait"] == 100_150_000 - 100_000 + 2_000, idle
    assert idle["host_sync"] == 0, idle
    assert a.findings[0].id == "gpu_underutilized"
    assert "dependency" in a.findings[0].title
    by = {f.id: f for f in a.findings}
    assert "host_sync" not in by or by["host_sync"].severity in ("info", "low")
    # and the advice is the dependency's, not "more work per step" (audit 5: the prefill keeps
    # the GPU 99.8% busy on either side of the gap)
    f = a.findings[0]
    assert "A larger batch does not shorten such a wait" in f.recommendation
    assert "batch/sequence" not in f.recommendation and "wait_event" in f.snippet


def test_a_gap_in_the_users_call_names_the_library_frame_under_it(tmp_path: Path) -> None:
    """Audit 5: a TimeSformer pipeline's 269 ms before its first kernel read "mostly while the
    host ran .../model.py(40): run_on_input" (the user's outermost call; library frames are not
    the user's), where 190 ms of it was VideoMAE's preprocess. The gap [0.1, 100] ms: the user's
    frame covers it, a library frame 70 ms of it (named after the user's), one inside that
    20 ms (less than half: not named)."""
    lib = "site-packages/transformers/models/videomae/image_processing_videomae.py(235): preprocess"
    events = [
        *_launch("aten::mm", "cudaLaunchKernel", 0.0, "gemm", 5.0, 95.0, 7, 1),
        _x("app/model.py(40): run_on_input", "python_function", 50.0, 100_500.0),
        _x(
            "site-packages/transformers/pipelines/base.py(1200): __call__",
            "python_function",
            60.0,
            100_000.0,
        ),  # fmt: skip
        _x(lib, "python_function", 20_000.0, 70_000.0),
        _x("site-packages/av/container.py(12): decode", "python_function", 25_000.0, 20_000.0),
        *_launch("aten::mm", "cudaLaunchKernel", 100_600.0, "gemm", 100_610.0, 95.0, 7, 2),
    ]
    a = traceinsight.analyze(_write(tmp_path, events, "preprocess"))
    f = next(f for f in a.findings if f.id == "gpu_underutilized")
    assert f"mostly while the host ran app/model.py(40): run_on_input > {lib}" in f.title, f.title


def _read_back_gap(tmp: Path, *, queued: bool) -> Any:
    """HTA's queue-length trace, rebuilt: a kernel (0-0.1 ms) on the compute stream; the host in
    a pageable 704-byte read-back (cudaMemcpyAsync on stream 27) from 0.15 ms to 64.1 ms, its
    copy at the end. ``queued``: the work after the gap is a CUDA graph's memset, launched
    (cudaGraphLaunch) at 0.01 ms, returned at 0.02 ms; else the read-back's own copy is."""
    rt = "cuda_runtime"
    events = [
        *_launch("aten::mm", "cudaLaunchKernel", 0.0, "gemm", 4.0, 96.0, 7, 1),
        _x("aten::copy_", "cpu_op", 149.0, 63_955.0),
        _x("cudaMemcpyAsync", rt, 150.0, 63_950.0, correlation=3),
        _dev("Memcpy DtoH (Device -> Pageable)", "gpu_memcpy", 64_080.0, 2.0, 27, 3, bytes=704),
        *_launch("aten::add", "cudaLaunchKernel", 64_150.0, "add", 64_160.0, 40.0, 7, 4),
    ]
    if queued:
        events += [
            _x("cudaGraphLaunch", rt, 10.0, 10.0, correlation=2),
            _dev("Memset (Device)", "gpu_memset", 64_050.0, 2.0, 7, 2),
        ]
    return traceinsight.analyze(_write(tmp, events, f"read_back_{queued}"))


def test_queued_work_under_a_pageable_read_back_is_a_dependency_wait(tmp_path: Path) -> None:
    """HTA's trace: 376.6 ms of idle read as pageable_copy and 101.5 ms as the profiler's, each
    gap's next work a CUDA graph's memset launched tens of ms before it. The host's call did not
    keep queued work from the GPU: the gap (0.1 to 64.05 ms) is gpu_wait. Without the queued
    memset, the read-back's own copy ends the gap, 63.93 ms after its call began for a 2 us
    copy: no staging takes that long, the stream waited on work the trace does not show (audit
    16: a V100 ResNet's first upload, called 36.4 ms before its 3.5 ms copy ran), gpu_wait too."""
    idle = _read_back_gap(tmp_path, queued=True).results.idle.idle_by_cause_ns
    assert idle["gpu_wait"] == 64_050_000 - 100_000, idle
    assert idle["pageable_copy"] == 64_080_000 - 64_052_000, idle  # memset to its own copy
    a = _read_back_gap(tmp_path, queued=False)
    idle = a.results.idle.idle_by_cause_ns
    assert idle["gpu_wait"] == 64_080_000 - 100_000 and idle["pageable_copy"] == 0, idle
    # no idle of the copy's: pinning it would give the GPU nothing, so no finding says it would
    assert all(f.severity == "info" for f in a.findings if f.id == "pageable_memcpy")
    # audit 10: where the call's wait is its copy's staging (0.4 ms gap, a 0.2 ms copy whose
    # call began 0.35 ms before it ran), the figure is the idle under the call, the copy a
    # small part of it (the title had named "0.00 ms host-to-device" beside the read-back's own
    # time); its own time: from the copy's start to the call's end, 0.22 ms
    events = [
        *_launch("aten::mm", "cudaLaunchKernel", 0.0, "gemm", 4.0, 96.0, 7, 1),
        _x("aten::copy_", "cpu_op", 149.0, 575.0),
        _x("cudaMemcpyAsync", "cuda_runtime", 150.0, 570.0, correlation=3),
        _dev("Memcpy DtoH (Device -> Pageable)", "gpu_memcpy", 500.0, 200.0, 27, 3, bytes=704),
        *_launch("aten::add", "cudaLaunchKernel", 750.0, "add", 760.0, 40.0, 7, 4),
    ]
    a = traceinsight.analyze(_write(tmp_path, events, "staged"))
    assert a.results.idle.idle_by_cause_ns["pageable_copy"] == 400_000
    f = next(f for f in a.findings if f.id == "pageable_memcpy")
    assert f.title.endswith("0.40 ms blocked (0.22 ms of it the copies themselves)"), f.title


def test_read_backs_that_block_in_their_copy_call_are_named(tmp_path: Path) -> None:
    """HTA's TorchRec control trace: each aten::to read-back (cudaMemcpyAsync into pageable
    memory) blocks 6.59 ms behind queued kernels, the stream sync after it 3 us; host_sync's
    title counted the syncs' 0.2 ms. Three such read-backs here, 5 ms each behind a 5 ms
    kernel: the title says the copies hold the host 15 ms (their calls' sum)."""
    rt = "cuda_runtime"
    events = []
    for i in range(3):
        t = i * 10_000.0
        events += [
            _x("aten::mm", "cpu_op", t, 10.0),
            _x("cudaLaunchKernel", rt, t + 1, 5.0, correlation=10 * i + 1),
            _dev("gemm", "kernel", t + 10, 5_000.0, 7, 10 * i + 1),
            _x("aten::to", "cpu_op", t + 20, 5_010.0),
            _x("cudaMemcpyAsync", rt, t + 22, 5_000.0, correlation=10 * i + 2),
            _dev(
                "Memcpy DtoH (Device -> Pageable)",
                "gpu_memcpy",
                t + 5_012,
                2.0,
                7,
                10 * i + 2,
                bytes=984,
            ),
            _x("cudaStreamSynchronize", rt, t + 5_025, 3.0),
        ]
    # a last kernel: the window (the GPU's span) holds the last sync too
    events += [
        _x("cudaLaunchKernel", rt, 30_000.0, 5.0, correlation=99),
        _dev("gemm", "kernel", 30_010.0, 100.0, 7, 99),
    ]
    a = traceinsight.analyze(_write(tmp_path, events, "read_backs"))
    f = next(f for f in a.findings if f.id == "host_sync")
    assert f.evidence["readback_blocked_ns"] == 3 * 5_000_000
    assert f.evidence["host_sync_blocked_ns"] == 3 * 3_000
    assert "device-to-host copies into pageable memory hold the host 15.00 ms" in f.title
    # audit 10: the calls' time is the wait for the kernel queued before each (their own
    # time: from the copy's start to the call's end, 10 us each)
    assert (
        "hold the host 15.00 ms (14.97 ms of it waiting for the work queued before them)" in f.title
    )


def test_loader_idle_inside_longer_gaps_is_named(tmp_path: Path) -> None:
    """Three gaps: 0.1-2.1 ms all inside DataLoader.__next__ (attributed to it), then two 10 ms
    gaps with 3 ms of loader wait each and 7 ms of untraced host time (each goes to cpu_work by
    majority). The finding keeps its 2 ms cost and says 8 ms of GPU idle lies inside the calls."""
    loader = "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__"
    events = [*_launch("aten::mm", "cudaLaunchKernel", 0.0, "gemm", 4.0, 96.0, 7, 1)]
    events.append(_x(loader, "user_annotation", 100.0, 2_000.0))
    events += _launch("aten::mm", "cudaLaunchKernel", 2_094.0, "gemm", 2_100.0, 100.0, 7, 2)
    for i, gap_start in enumerate((2_200.0, 12_300.0)):
        events.append(_x(loader, "user_annotation", gap_start + 100, 3_000.0))
        t = gap_start + 9_994
        events += _launch("aten::mm", "cudaLaunchKernel", t, "gemm", t + 6, 100.0, 7, 3 + i)
    a = traceinsight.analyze(_write(tmp_path, events, "loader_inside"))
    assert a.results.idle.idle_by_cause_ns["dataloader"] == 2_000_000
    assert a.results.idle.dataloader_idle_ns == 2_000_000 + 2 * 3_000_000
    f = next(f for f in a.findings if f.id == "dataloader_stall")
    assert f.cost_ns == 2_000_000 and f.evidence["idle_inside_calls_ns"] == 8_000_000
    assert "8.00 ms of GPU idle falls inside its calls" in f.title


def test_a_gpu_named_but_no_cuda_recorded_is_said(tmp_path: Path) -> None:
    """Audit 6: a Kineto trace from an RTX 4080 machine, its aten::to 511 ms, no runtime call
    and no GPU event (the profiler's activities without CUDA), read "no GPU activity" with no
    data-quality note. Now a warning (a CPU-only run on a GPU machine looks the same)."""
    events = [_x("aten::to", "cpu_op", 0.0, 511_000.0), _x("aten::_to_copy", "cpu_op", 1.0, 510_000.0)]  # fmt: skip
    a = traceinsight.analyze(_write(tmp_path, events, "no_cuda"))
    check = next(c for c in a.results.health.checks if c["check"] == "device_activity_missing")
    assert check["severity"] == "warning" and "ProfilerActivity.CUDA" in check["message"]
    assert "no GPU activity in this trace, though it names a GPU: see data_quality" in a.warnings


def test_pageable_copy_parts_add_up_to_the_title(tmp_path: Path) -> None:
    """Audit 8: a saxpy export's title read "266.07 ms blocked (187.76 ms device-to-host, 167.68
    ms host-to-device)": the parts were the calls' blocked time, the read-backs' waits for the
    kernel included, and named the direction by them. The parts are the copies' own time: here
    a 1.98 ms pageable HtoD, then a read-back that waits 5 ms for a kernel and copies 1 ms."""
    rt = "cuda_runtime"
    events = [
        *_launch("aten::zero_", "cudaLaunchKernel", 0.0, "fill", 10.0, 5.0, 7, 9),
        _x("cudaMemcpy", rt, 20.0, 1_990.0, correlation=1),
        _dev("Memcpy HtoD (Pageable -> Device)", "gpu_memcpy", 25.0, 1_980.0, 7, 1, bytes=8 << 20),
        *_launch("aten::mul", "cudaLaunchKernel", 2_020.0, "saxpy", 2_030.0, 5_000.0, 7, 2),
        _x("cudaMemcpy", rt, 2_030.0, 6_010.0, correlation=3),
        _dev(
            "Memcpy DtoH (Device -> Pageable)", "gpu_memcpy", 7_035.0, 1_000.0, 7, 3, bytes=4 << 20
        ),
    ]
    a = traceinsight.analyze(_write(tmp_path, events, "saxpy_like"))
    f = next(f for f in a.findings if f.id == "pageable_memcpy")
    assert f.title.startswith("Copies to and from pageable memory"), f.title  # a third reads
    # the upload's whole call (staging included: its stream idle), the read-back's copy on
    assert (
        "3.00 ms blocked beyond waiting for earlier GPU work (1.99 ms host-to-device, 1.00 ms device-to-host)"
        in f.title
    ), f.title


def test_an_overflowed_step_is_no_step(tmp_path: Path) -> None:
    """Audit 9: HTA's Triton example, a ProfilerStep of 13.34 s around events that fit in
    1.8 ms (its duration_invalid check flagged it), analyzed as a 13.34 s window ("cpu_work
    13.33 s"). Such a range is no step: the window is the GPU's span."""
    events = [
        _x("ProfilerStep#1", "user_annotation", 0.0, 13_340_000.0),
        *_launch(
            "aten::add", "cudaLaunchKernel", 1_000.0, "triton_poi_fused_add", 1_350.0, 2.0, 7, 1
        ),
        *_launch(
            "aten::mul", "cudaLaunchKernel", 1_500.0, "triton_poi_fused_mul", 1_800.0, 2.0, 7, 2
        ),
    ]
    a = traceinsight.analyze(_write(tmp_path, events, "overflowed"))
    assert a.results.steps.steps == 0
    assert a.metrics["window_ns"] < 1_000_000
    assert "duration_invalid" in _checks(a)


def test_host_work_between_a_steps_launches_is_launch_bounds(tmp_path: Path) -> None:
    """Audits 6, 7 and 9: Python between the launches of a step (a BERT forward's, DDP's)
    read as a second HIGH finding, gpu_underutilized, advising a larger batch. The idle
    between two launches of one step is counted apart: two steps of 3 ms, each with a 2020 us
    gap of host work outside any op between its two kernels (counted); the gap across the
    step boundary and the last step's trailing gap (no launch after it in the step) are not."""
    rt = "cuda_runtime"
    events = [
        _x("ProfilerStep#1", "user_annotation", 0.0, 3000.0),
        _x("ProfilerStep#2", "user_annotation", 3000.0, 3000.0),
    ]
    for op_t, k_t, corr in ((100.0, 300.0, 1), (2400.0, 2410.0, 2), (3100.0, 3300.0, 3), (5400.0, 5410.0, 4)):  # fmt: skip
        events += _launch("aten::mul", "cudaLaunchKernel", op_t, "mul_kernel", k_t, 90.0, 7, corr)
    events.append(_x("cudaDeviceSynchronize", rt, 5990.0, 5.0))
    a = traceinsight.analyze(_write(tmp_path, events, "python_between_launches"))
    idle = a.results.idle
    assert idle.cpu_work_between_launches_ns == 2 * 2_020_000
    assert idle.cpu_work_between_launches_ns <= idle.idle_by_cause_ns["cpu_work"]


def test_queued_work_started_late_on_one_stream_is_an_unseen_wait() -> None:
    """Session 52 (a public RTX 3090 ResNet inference pass): kernels launched 190-370 us before
    they started, on the only stream with nothing ahead of them, read "the device's own gaps
    between queued kernels: fewer, larger kernels shorten them" (HIGH). A wait of that length is
    no gap between queued kernels (a few us, under the 50 us queued threshold): the trace does
    not show what held the work, so it says so and is graded low. By hand: 12 kernels of 100 us,
    each launched 250 us before it starts, 400 us after the previous ended: 11 gaps of 400 us."""
    from tests.builder import Events
    from traceinsight.pipeline import analyze_trace

    ev = Events()
    for k in range(12):
        ev.op("aten::relu", k * 500 + 48, 10)
        ev.kernel("relu_kernel", k * 500 + 300, 100, launch_us=k * 500 + 50)
    a = analyze_trace(ev.trace())
    assert a.results.idle.gpu_wait_queued_ns == 11 * 400_000
    f = next(f for f in a.findings if f.id == "gpu_underutilized")
    assert f.cost_ns == 11 * 400_000
    assert "started long after it was launched and the stream was free" in f.title
    assert "fewer, larger kernels" not in f.title
    assert f.severity == "low"  # 21.4% busy, but what held the work is not in the trace


def test_a_module_load_under_the_driver_is_warm_up_not_the_profiler() -> None:
    """Session 52 (a public compiled ResNet-18 on an RTX 4090 D): Kineto's overhead rows
    "Runtime Triggered Module Loading" (3.50 and 0.83 ms, under AccumulateGrad) read as the
    profiler's idle, so the cold pass went unsaid. The driver loads modules with or without a
    profiler: warm-up. By hand: 12 launches 300 us apart, then a 3,970 us gap holding a 3.5 ms
    module load."""
    from tests.builder import Events
    from traceinsight.pipeline import analyze_trace

    ev = Events()
    for i in range(12):
        ev.op("aten::mm", i * 300, 20)
        ev.kernel("gemm", i * 300 + 30, 200, launch_us=i * 300 + 5)
    ev._add("overhead", "Runtime Triggered Module Loading", 3700, 3500, tid=1)
    ev.op("aten::mm", 7400, 20)
    ev.kernel("gemm", 7500, 200, launch_us=7405)
    a = analyze_trace(ev.trace())
    causes = a.metrics["idle_by_cause_ns"]
    assert (causes["warmup"], causes["profiler"]) == (3_970_000, 0)
    assert "cold_start" in {f.id for f in a.findings}


def test_unmarked_training_steps_are_pointed_out() -> None:
    """Session 52 (TraceLens' MI300X ResNet-18: 5 SGD iterations profiled without a schedule):
    the window is the whole GPU span, as without steps; the warning says the trace holds the
    optimizer's steps and how to mark them. One step of it says nothing more."""
    from tests.builder import Events
    from traceinsight.pipeline import analyze_trace

    def warning(iterations: int) -> str:
        e = Events()
        for i in range(iterations):
            t = i * 1000
            e.op("aten::mm", t, 20)
            e.kernel("gemm", t + 30, 300, launch_us=t + 5)
            e.annotation("Optimizer.step#SGD.step", t + 400, 100)
            e.op("aten::add_", t + 410, 10)
            e.kernel("sgd_kernel", t + 430, 50, launch_us=t + 415)
        (w,) = [w for w in analyze_trace(e.trace()).to_json()["warnings"] if "ProfilerStep" in w]
        return w

    assert "(the trace has 3 optimizer steps: profile with a torch.profiler schedule" in warning(3)
    assert warning(1).endswith("the whole GPU span is analyzed as one window")


def _cold_iterations(first_region_us: float, *, sync_in_first: bool = False, slow_again: bool = False) -> list[dict[str, Any]]:  # fmt: skip
    """Three iterations of a compiled model's step in one window without steps (Wings236's
    compiled ResNet-18 on an RTX 4090 D): each a compiled region whose kernels are launched at
    its start and end, SumBackward0, then the backward's kernel. The first iteration's compiled region and
    SumBackward0 are its one-time set-up (13.3 and 8.7 ms against 2.0 ms and 6 us later)."""
    rt = "cuda_runtime"
    events: list[dict[str, Any]] = []
    t, corr = 0.0, 1
    for i in range(3):
        cold = i == 0 or (slow_again and i == 2)
        region = first_region_us if cold else 2000.0
        backward = 8700.0 if cold else 6.0
        events.append(_x("Torch-Compiled Region: 0/0", "cpu_op", t, region))
        if sync_in_first and i == 0:
            events.append(_x("cudaStreamSynchronize", rt, t + 100.0, region - 500.0))
        for k in range(4):  # the region's first kernels (10 or more kernels: a program)
            u, c = t + 40.0 + 30.0 * k, corr + 2 + k
            events += _launch("aten::convolution", "cudaLaunchKernel", u, f"triton_{k}", u + 10.0, 20.0, 7, c)  # fmt: skip
        end = t + region
        events += _launch("aten::mm", "cudaLaunchKernel", end - 300.0, "triton_fwd", end - 290.0, 250.0, 7, corr)  # fmt: skip
        events.append(_x("SumBackward0", "cpu_op", end + 10.0, backward))
        b = end + 10.0 + backward + 20.0
        events += _launch("aten::mm", "cudaLaunchKernel", b, "triton_bwd", b + 10.0, 800.0, 7, corr + 1)  # fmt: skip
        t, corr = b + 900.0, corr + 6
    return events


def test_a_first_iteration_in_a_window_without_steps_is_a_cold_pass(tmp_path: Path) -> None:
    """Session 53: Wings236's compiled ResNet-18 window (no step markers, three iterations) read
    "GPU busy only 19.0%" HIGH: 34.75 ms of its 42.50 ms idle lay in the first iteration, whose
    first calls (compiled region 13.3 ms, SumBackward0 8.7 ms, AccumulateGrad 4.4 ms) took 6.5x
    to 1,450x their later calls; the two later iterations keep the GPU 66% busy. A host op's
    first call far slower than all its later ones is one-time set-up."""
    a = traceinsight.analyze(_write(tmp_path, _cold_iterations(13_300.0), "cold_iterations"))
    once = {c.name: c for c in a.results.idle.warmup_calls}
    assert set(once) == {"Torch-Compiled Region: 0/0", "SumBackward0"}
    assert once["SumBackward0"].dur_ns == 8_700_000
    by = {f.id: f for f in a.findings}
    assert "cold_start" in by
    assert by.get("gpu_underutilized") is None or by["gpu_underutilized"].severity in ("low", "info")  # fmt: skip
    # 13.3 - 0.3 ms of the region before its kernel, and SumBackward0's 8.7 ms, are warm-up
    assert a.results.idle.idle_by_cause_ns["warmup"] >= 20_000_000


def test_a_first_call_that_waits_on_the_gpu_or_recurs_is_not_set_up(tmp_path: Path) -> None:
    """A first call that holds a blocking sync waited on the GPU's queue (which differs call by
    call), and one slow again later is the loop's own cost: neither is one-time set-up. Nor is
    a first call under 4x the slowest later one (6.5x in the compiled ResNet-18)."""
    synced = _cold_iterations(13_300.0, sync_in_first=True)
    a = traceinsight.analyze(_write(tmp_path, synced, "first_call_synced"))
    assert {c.name for c in a.results.idle.warmup_calls} == {"SumBackward0"}
    again = _cold_iterations(13_300.0, slow_again=True)
    a = traceinsight.analyze(_write(tmp_path, again, "slow_again"))
    assert a.results.idle.warmup_calls == ()
    near = _cold_iterations(7_900.0)  # 3.95x the later 2.0 ms
    a = traceinsight.analyze(_write(tmp_path, near, "near"))
    assert {c.name for c in a.results.idle.warmup_calls} == {"SumBackward0"}


def test_copy_calls_without_copies_are_said_and_nothing_rests_on_them(tmp_path: Path) -> None:
    """Session 53: an MI300X batched-GEMM benchmark recorded by rocprofv3 without
    --memory-copy-trace: 3 hipMemcpy calls (24.35 ms) and no copy. host_sync read HIGH, "4 host
    syncs leave the GPU idle 12.15 ms; most from hipMemcpy", where the copy engine was busy in
    12.07 ms of that gap. Copy calls traced with kernels but no copy at all: the copies were not
    recorded, an error every idle-based finding rests on. With the copy recorded: no check."""
    rt = "cuda_runtime"

    def run(name: str, with_copy: bool) -> Any:
        events = []
        for i in range(12):  # a kernel every 100 us, then a blocking read-back of 10 ms
            events += _launch("aten::mm", "cudaLaunchKernel", 100.0 * i, f"gemm_{i % 3}", 100.0 * i + 10, 80.0, 7, i + 1)  # fmt: skip
        events.append(_x("cudaMemcpy", rt, 1200.0, 10_000.0, correlation=100))
        if with_copy:
            events.append(_dev("Memcpy DtoH (Device -> Pageable)", "gpu_memcpy", 1300.0, 9_800.0, 7, 100))  # fmt: skip
        for i in range(12, 24):
            t = 11_300.0 + 100.0 * (i - 12)
            events += _launch("aten::mm", "cudaLaunchKernel", t, f"gemm_{i % 3}", t + 10, 80.0, 7, i + 1)  # fmt: skip
        return traceinsight.analyze(_write(tmp_path, events, name))

    a = run("copy_missing", with_copy=False)
    (check,) = [c for c in a.results.health.checks if c["check"] == "copy_activity_missing"]
    assert (check["severity"], check["count"]) == ("error", 1)
    assert "1 copy call traced (cudaMemcpy) but no copy recorded" in check["message"]
    assert all(f.severity in ("info", "low") for f in a.findings if f.id == "host_sync")
    assert "copy_activity_missing" not in _checks(run("copy_recorded", with_copy=True))


def test_memset_calls_without_memsets_are_said_and_downgrade_nothing(tmp_path: Path) -> None:
    """Audit 68: a Colab T4 trace traced 34 cudaMemsetAsync calls (inside cuDNN's
    convolutions) and recorded no memset. Said as a warning affecting no finding: memsets are
    short beside the kernels."""
    rt = "cuda_runtime"

    def run(name: str, recorded: bool) -> Any:
        events = [
            *_launch("aten::mm", "cudaLaunchKernel", 0.0, "gemm_0", 10.0, 80.0, 7, 1),
            _x("cudaMemsetAsync", rt, 100.0, 4.0, correlation=2),
            *_launch("aten::mm", "cudaLaunchKernel", 200.0, "gemm_1", 210.0, 80.0, 7, 3),
        ]
        if recorded:
            events.append(_dev("Memset (Device)", "gpu_memset", 105.0, 1.5, 7, 2))
        return traceinsight.analyze(_write(tmp_path, events, name))

    a = run("memset_missing", recorded=False)
    (check,) = [c for c in a.results.health.checks if c["check"] == "memset_activity_missing"]
    assert (check["severity"], check["count"], check["affects"]) == ("warning", 1, [])
    assert "1 memset call traced (cudaMemsetAsync) but no memset recorded" in check["message"]
    assert not any("data_quality" in f.tags for f in a.findings)
    assert "memset_activity_missing" not in _checks(run("memset_recorded", recorded=True))


def test_a_sync_with_no_gpu_work_is_no_finding(tmp_path: Path) -> None:
    """Session 53: a course's baseline trace, no kernel, one cudaDeviceSynchronize, read
    host_sync "1 host sync leaves the GPU idle 0.00 ms". Nothing ran on the GPU to idle."""
    events = [
        _x("aten::add", "cpu_op", 0.0, 500.0),
        _x("cudaDeviceSynchronize", "cuda_runtime", 600.0, 20.0),
        _x("aten::mul", "cpu_op", 700.0, 500.0),
    ]
    a = traceinsight.analyze(_write(tmp_path, events, "no_gpu_sync"))
    assert a.results.syncs.host_sync_count == 1 and a.findings == []


def test_a_hip_applications_advice_names_hips_calls(tmp_path: Path) -> None:
    """Session 53: a rocprofv3 capture of an MI300X benchmark (a HIP application) was told to
    take out cudaDeviceSynchronize, capture a CUDA graph (cudaStreamBeginCapture), ask
    cudaOccupancyMaxPotentialBlockSize and sample with nsys. HIP mirrors CUDA's API names:
    a HIP trace's application advice is renamed (findings/platform.py); a CUDA one keeps its."""
    from traceinsight.findings.platform import hip_words

    assert hip_words("cudaStreamWaitEvent, then cudaMallocHost and cudaHostAllocDefault") == (
        "hipStreamWaitEvent, then hipHostMalloc and hipHostMallocDefault"
    )
    assert hip_words("capture it in a CUDA graph; torch.cuda.synchronize()") == (
        "capture it in a HIP graph; torch.cuda.synchronize()"
    )

    def run(api: str) -> Any:
        rt = "cuda_runtime"
        events = []
        for i in range(20):  # a kernel, then a 2 ms device sync with the GPU idle
            t = 3000.0 * i
            events += [
                _x(f"{api}LaunchKernel", rt, t, 5.0, correlation=i + 1),
                _dev(f"vector_add_{i % 2}", "kernel", t + 10, 500.0, 7, i + 1),
                _x(f"{api}DeviceSynchronize", rt, t + 20, 2500.0),
            ]
        p = tmp_path / f"{api}_app.json"  # no schemaVersion, no torch op: an application
        p.write_text(json.dumps({"traceEvents": events}))
        a = traceinsight.analyze(p)
        assert a.to_json()["source"]["framework"] == "cuda_app"
        return next(f for f in a.findings if f.id == "host_sync")

    hip, cuda = run("hip"), run("cuda")
    assert "hipDeviceSynchronize" in hip.recommendation and "cuda" not in hip.recommendation
    assert "cudaDeviceSynchronize" in cuda.recommendation


def test_a_rocm_traces_findings_name_amds_hardware(tmp_path: Path) -> None:
    """Session 54: an MI300X trace read "GEMMs with dimensions off the tensor-core alignment"
    (fp32_compute says "CUDA cores" likewise). On a HIP trace the hardware's words are AMD's
    whatever the framework; a PyTorch trace's advice keeps its Python (no hip* call names)."""
    from dataclasses import replace

    from traceinsight.findings.platform import hip_words, in_runtime_words, names_hardware

    text = (
        "Matrix math runs in fp32 on CUDA cores: put it on tensor cores; the tensor-core alignment"
    )
    assert hip_words(text, api=False) == (
        "Matrix math runs in fp32 on vector ALUs: put it on matrix cores; the matrix-core alignment"
    )
    assert hip_words("torch.cuda.synchronize(); cudaMemcpy", api=False) == (
        "torch.cuda.synchronize(); cudaMemcpy"
    )
    base = traceinsight.analyze(
        Path(__file__).resolve().parents[1] / "fixtures" / "tiny" / "step_dataloader_sync.json"
    ).findings[0]
    f = replace(base, title="GEMMs off the tensor-core alignment", snippet="x.cuda()")
    assert names_hardware([f]) and not names_hardware([base])
    (hip,) = in_runtime_words([f], "hip", api=False)
    assert hip.title == "GEMMs off the matrix-core alignment" and hip.snippet == "x.cuda()"
    assert in_runtime_words([f], "cuda", api=False) == [f]

    # a PyTorch step whose GEMMs run in fp32, on ROCm (hipLaunchKernel) and on CUDA: the same
    # finding, its hardware words AMD's on ROCm and nothing else changed
    def fp32(api: str) -> Any:
        events = [_x(f"ProfilerStep#{s + 1}", "user_annotation", 10_000.0 * s, 9_990.0) for s in range(3)]  # fmt: skip
        for s in range(3):
            for i in range(10):
                t = 10_000.0 * s + 10 + 900 * i
                events += _launch("aten::mm", f"{api}LaunchKernel", t, "volta_sgemm_128x64_nn", t + 10, 850.0, 7, 100 * s + i + 1)  # fmt: skip
        a = traceinsight.analyze(_write(tmp_path, events, f"{api}_fp32"))
        return next(f for f in a.findings if f.id == "fp32_compute")

    rocm, cuda = fp32("hip"), fp32("cuda")
    assert rocm.title.startswith("Matrix math runs in fp32 on vector ALUs: 100.0% of")
    assert cuda.title.startswith("Matrix math runs in fp32 on CUDA cores: 100.0% of")
    for field in ("title", "recommendation", "snippet"):
        assert getattr(rocm, field) == hip_words(getattr(cuda, field), api=False)


def test_a_copy_call_begun_before_the_window_counts_inside_it(tmp_path: Path) -> None:
    """Session 53: a CUTLASS benchmark's first pageable cudaMemcpy (268 MB) began 117 us before
    the window (the GPU span, which its copy opens: the call stages the bytes first) and was
    left out of the blocking total: 342.08 ms against 361.6 ms raw. A call that overlaps the
    window counts, from the window's start."""
    rt, mc = "cuda_runtime", "gpu_memcpy"
    events = [
        # staged 117 us, then its 19.3 ms copy: the window opens at the copy's start (1117 us)
        _x("cudaMemcpy", rt, 1000.0, 19_450.0, correlation=1),
        _dev("Memcpy HtoD (Pageable -> Device)", mc, 1117.0, 19_300.0, 7, 1),
        *_launch("aten::mm", "cudaLaunchKernel", 20_500.0, "gemm", 20_510.0, 5_000.0, 7, 2),
        _x("cudaMemcpy", rt, 25_600.0, 2_000.0, correlation=3),
        _dev("Memcpy DtoH (Device -> Pageable)", mc, 25_610.0, 1_900.0, 7, 3),
    ]
    a = traceinsight.analyze(_write(tmp_path, events, "straddle"))
    c = a.results.copies
    assert c.host_blocking_copy_count == 2
    # 19,450 - 117 us of the first call inside the window, and the read-back's whole call
    assert c.host_blocking_copy_ns == (19_450 - 117) * 1000 + 2_000 * 1000


def test_one_gap_that_holds_the_window_is_said_with_the_rest_busy(tmp_path: Path) -> None:
    """Session 53: an RTX 5070 Ti laptop's nsys export, no steps: one 615.7 s host gap after a
    cudaMemcpy, then 2,100 GEMMs in 0.61 s at 70% busy, read "GPU busy only 0.1%" with nothing
    said of the burst. One gap of 90% of the window or more is said, with the GPU's busy share
    in the rest; nothing rests on it. Not with steps marking the window."""

    def run(name: str, *extra: dict[str, Any]) -> Any:
        events = [*_launch("aten::mm", "cudaLaunchKernel", 0.0, "gemm_0", 10.0, 40.0, 7, 1)]
        for i in range(10):  # 100 ms later, 10 kernels of 80 us every 100 us
            t = 100_050.0 + 100.0 * i
            events += _launch("aten::mm", "cudaLaunchKernel", t - 5, f"gemm_{i % 2}", t, 80.0, 7, i + 2)  # fmt: skip
        return traceinsight.analyze(_write(tmp_path, [*events, *extra], name))

    a = run("one_gap")
    (check,) = [c for c in a.results.health.checks if c["check"] == "one_gap"]
    assert (check["severity"], check["affects"]) == ("warning", [])
    # the gap 50 us -> 100,050 us of a window 10 -> 101,030 us; the rest 1.02 ms, 0.84 ms busy
    assert "one idle gap of 100.00 ms (99.0% of the window, from +40.0 us)" in check["message"]
    assert "the GPU was 82.4% busy" in check["message"]
    step = _x("ProfilerStep#1", "user_annotation", 0.0, 101_100.0)
    assert "one_gap" not in _checks(run("stepped", step))


def test_a_one_shot_programs_copies_are_no_lever(tmp_path: Path) -> None:
    """Session 54: a T4 vecAdd's nsys export (pinned cudaHostAlloc buffers, 8 copies of 2 MiB,
    4 kernels on 4 streams) read copy_bound HIGH, "0.0 GB host-to-device at 11.4 GB/s",
    advising to keep the data resident: a program that copies each input once, for one kernel,
    has nothing to keep, and a buffer pinned for one copy pays its page-locking (cudaHostAlloc
    took 316.7 ms there). One pass of under 10 kernels, one a stream, caps the copy findings at
    low and says why; the bytes read in MB. The same copies where a stream runs its kernels
    one pass after another (a Perlmutter saxpy: 5 kernels, its arrays copied around each), or
    around 12 kernels, keep their grade."""

    def run(name: str, n_kernels: int, streams: int) -> Any:
        events, t = [], 0.0
        for i in range(8):  # 2 MiB at 11.4 GB/s: 184 us a copy, one after another
            events.append(_x("cudaMemcpyAsync", "cuda_runtime", t, 5.0, correlation=100 + i))
            events.append(_dev("Memcpy HtoD (Pinned -> Device)", "gpu_memcpy", t + 10, 184.0, 7 + i % streams, 100 + i, bytes=2_097_152))  # fmt: skip
            t += 190.0
        for i in range(n_kernels):  # then the kernels, 24 us each
            events += _launch("vecAdd", "cudaLaunchKernel", t, f"vecAdd_{i % 2}", t + 10, 24.0, 7 + i % streams, i + 1)  # fmt: skip
            t += 26.0
        a = traceinsight.analyze(_write(tmp_path, events, name))
        (f,) = [f for f in a.findings if f.id == "copy_bound"]
        return f

    f = run("one_shot_copies", 4, streams=4)
    assert f.severity == "low" and "one_shot" in f.tags
    assert "each input is copied once, for one kernel" in f.evidence["severity_cap_reason"]
    # 8 x 2,097,152 B = 16,777,216 B
    assert f.evidence["h2d_bytes"] == 16_777_216 and "; 16.8 MB host-to-device at" in f.title
    for f in (run("passes_on_one_stream", 4, streams=1), run("repeated", 12, streams=4)):
        assert f.severity != "low" and "one_shot" not in f.tags


FALCONSAI = (
    Path(__file__).resolve().parents[1] / "fixtures" / "foreign" / "tl_mi300_falconsai.json.xz"
)


def test_a_small_gemm_that_cannot_fill_the_device_is_not_misaligned() -> None:
    """Session 54: TraceLens' MI300X ViT inference (batch 4: 788 = 4 x 197 tokens, off 8) read
    gemm_shape_inefficient "padding saves about 0.73 ms" against half the roofline. The raw
    events: the same 788 rows run 109, 163 and 178 TFLOP/s as N and K grow at the same
    misalignment, and a 4x768x768 addmm takes 7.50 us against the 788x768x768's 8.53: the size
    bounds them, not the alignment. Their output grids (128-square tiles: 42 and 168) are under
    the device's 304 CUs, so no roofline judges them; a GEMM of no more work also bounds what
    one can take from below."""
    import lzma
    from collections import defaultdict

    from traceinsight.analyzers.gemm_shapes import _judged
    from traceinsight.model.devices import lookup

    doc = json.loads(lzma.decompress(FALCONSAI.read_bytes()))
    ops = {e["args"]["External id"]: e for e in doc["traceEvents"] if e.get("cat") == "cpu_op" and e["name"] == "aten::addmm"}  # fmt: skip
    by_shape: dict[tuple[int, int, int], list[float]] = defaultdict(list)
    for e in doc["traceEvents"]:
        op = ops.get(e.get("args", {}).get("External id")) if e.get("cat") == "kernel" else None
        if op is not None:
            (m, k), n = op["args"]["Input Dims"][1], op["args"]["Input Dims"][2][1]
            by_shape[(m, n, k)].append(float(e["dur"]))
    assert {s: len(v) for s, v in by_shape.items()} == {
        (788, 768, 768): 48, (788, 768, 3072): 12, (788, 3072, 768): 12, (4, 768, 768): 1,
    }  # fmt: skip
    tflops = {s: 2 * s[0] * s[1] * s[2] * len(v) / sum(v) / 1e6 for s, v in by_shape.items()}
    assert tflops[(788, 768, 768)] < tflops[(788, 768, 3072)] < tflops[(788, 3072, 768)]
    a = traceinsight.analyze(FALCONSAI)
    assert "gemm_shape_inefficient" not in {f.id for f in a.findings}
    assert a.results.efficiency.unaligned_gemms.gemms == ()

    # the floor alone: a 788x4096 output (224 tiles) fills a 132-SM device; 200 us a kernel
    spec = lookup("NVIDIA H100 80GB HBM3")
    assert spec is not None and (spec.sm_count, spec.peak_tflops["bf16"]) == (132, 989.5)

    def shape(m: int, n: int, k: int, each_us: float) -> dict[str, Any]:
        flops, count = 2.0 * m * n * k, 10
        return {"gemm_m": m, "gemm_n": n, "gemm_k": k, "dtype": "bf16", "off8": m % 8 != 0, "off64": True, "op": "aten::mm", "count": count, "time_ns": count * each_us * 1e3, "flops": flops * count, "bytes": 2.0 * (m * k + k * n + m * n) * count, "flops_each": flops}  # fmt: skip

    big = shape(788, 4096, 4096, 200.0)
    u = _judged(big, [big], spec)
    # alone: at half of 989.5 TFLOP/s its 26.44 GFLOP take 53.44 us a kernel
    assert u is not None and u.reference == "roofline"
    assert abs(u.aligned_estimate_ns - 10 * 2 * 788 * 4096 * 4096 / (0.5 * 989.5e3)) < 10
    # beside a GEMM of a quarter the work at 100 us a kernel: no faster than that one
    u = _judged(big, [big, shape(780, 4096, 1024, 100.0)], spec)
    assert u is not None and u.aligned_estimate_ns == 10 * 100_000
    assert _judged(big, [big, shape(780, 4096, 1024, 250.0)], spec) is None
    # a 788x768 output, 42 tiles, does not fill it: not judged against the roofline
    assert _judged(shape(788, 768, 768, 200.0), [], spec) is None
