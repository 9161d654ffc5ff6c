"""Audit 21's defects, on traces built to the pattern the public traces showed (the traces'
repositories carry no licence, so they are not fixtures).

D1: an OpenMP target-offload program (nsys, Tesla T4) mapped two 512 MB arrays to the device and
back around each of its 50 kernels: 200 pageable copies, 95.8% of the window, kernels 3.9%. It
read "GPU busy 99.7%", and pageable_memcpy priced pinning at the copies' whole 26.13 s, as if
pinned copies took no time; the lever that remains at the pinned rate (keep the data on the
device) went unnamed because the copies were pageable.
"""

from __future__ import annotations

from typing import Any

import pytest

from traceinsight.api import analyze_trace
from traceinsight.model.schema import DeviceInfo
from traceinsight.report.terminal import render_summary

from .builder import Events

T4 = DeviceInfo(0, "Tesla T4", 40, 15637086208, "7.5")
ITERATIONS = 10
COPY_BYTES = 12_000_000  # 3 ms each way at 4 GB/s as recorded; 1 ms at the T4's 12 GB/s pinned
COPY_US, KERNEL_US, PERIOD_US = 3000, 200, 7000


def _offload(copy_bytes: int = COPY_BYTES, copy_us: float = COPY_US) -> Any:
    """Each iteration: a blocking pageable upload, one kernel, a blocking pageable read-back
    (the offload runtime's copies around each `target` region), then 0.77 ms of host work."""
    e = Events()
    for i in range(ITERATIONS):
        t = i * PERIOD_US
        e.memcpy("HtoD", t + 5, copy_us, nbytes=copy_bytes, src="pageable", dst="device")
        e.runtime("cudaMemcpy", t, copy_us + 10, correlation=e._corr)
        e.kernel("solve_kernel", t + 3020, KERNEL_US, launch_us=t + 3012)
        e.memcpy("DtoH", t + 3225, copy_us, nbytes=copy_bytes, src="device", dst="pageable")
        e.runtime("cudaMemcpy", t + 3018, copy_us + 210, correlation=e._corr)
    trace = e.trace("offload")
    trace.meta.devices = [T4]
    return trace


@pytest.fixture(scope="module")
def offload() -> Any:
    return analyze_trace(_offload())


def test_the_busy_figure_splits_kernels_and_copies(offload: Any) -> None:
    """Window: the first copy's start (5 us) to the last read-back's end (63,000 + 3,225 +
    3,000 us): 69,220 us. Kernels 10 x 200 us = 2.9%, copies 20 x 3,000 us = 86.7%, busy
    62,000 us = 89.6%."""
    doc = offload.to_json()
    m = doc["metrics"]
    assert m["window_ns"] == 69_220_000
    assert m["kernel_busy_ratio"] == pytest.approx(2_000 / 69_220)
    assert m["copy_busy_ratio"] == pytest.approx(60_000 / 69_220)
    assert "GPU busy  89.6% (kernels 2.9%, copies 86.7%)" in render_summary(doc)


def test_pinning_is_priced_net_of_the_copies_at_the_pinned_rate(offload: Any) -> None:
    """Pinned, each 12 MB copy takes 12e6 B / 12 B/ns + 1 us = 1,001,000 ns (the T4's PCIe 3.0
    x16 link, the replay's transform's price). All 20 copies count: the first upload's call
    began before the GPU span the window covers, and counts from the window's start (session 53:
    19 had counted). Their recorded time is 20 x 3 ms."""
    (f,) = [f for f in offload.findings if f.id == "pageable_memcpy"]
    ev = f.evidence
    assert ev["pageable_copy_ns"] == 20 * 3_000_000
    assert ev["pageable_copy_pinned_ns"] == 20 * 1_001_000
    assert ev["pinned_bytes_per_s"] == 12e9
    blocked = max(
        ev["host_blocking_copy_own_ns"],
        offload.results.idle.idle_by_cause_ns.get("pageable_copy", 0),
    )
    assert f.cost_ns == blocked - 20 * 1_001_000
    assert "from pinned memory they would still take 20.02 ms (12 GB/s)" in f.title


def test_copies_that_bound_the_run_when_pinned_are_named(offload: Any) -> None:
    """All 20 copies on the GPU count here (the copy engines hold them whenever their calls
    began): at the pinned rate they shrink by 20 x 1,999,000 ns = 39.98 ms, so copies (60 -
    39.98) ms of a (69.22 - 39.98) ms window = 68.5%, kernels 2 ms = 6.8%: still copy-bound
    (over half the window, over twice the kernels), exposed (20.02 - 2) ms."""
    (f,) = [f for f in offload.findings if f.id == "copy_bound"]
    shrink = 20 * 1_999_000
    assert f.evidence["at_pinned_rate"] is True
    assert f.cost_ns == pytest.approx((60_000_000 - shrink) - 2_000_000, rel=1e-9)
    assert "Copies bound the run even from pinned memory" in f.title
    assert "busy 68.5% of the window at the pinned rate, kernels 6.8%" in f.title


def test_small_pageable_uploads_beside_kernels_are_not_copy_bound() -> None:
    """The same loop with 100x fewer bytes: pinning leaves 30 us a copy beside 200 us kernels,
    no copy-bound run."""
    a = analyze_trace(_offload(copy_bytes=120_000, copy_us=30))
    assert "copy_bound" not in {f.id for f in a.findings}


def test_layout_transposes_are_not_matrix_math() -> None:
    """Audit 21 D3: fp32_compute's shares counted cuDNN's layout transposes in their
    denominator ("TF32 and fp32: 71.2% and 10.5%", 18.3% unexplained). Here 600 us of a TF32
    convolution, 200 us of an fp32 one and 200 us of transposes: 75% and 25%."""
    e = Events()
    e.step(1, 0, 2000)
    names = [
        ("sm86_xmma_fprop_implicit_gemm_tf32f32_tf32f32_f32_nhwckrsc_nhwc_tilesize128x64x32", 600),
        (
            "void implicit_convolve_sgemm<float, float, 1024, 5, 5, 3, 3, 3, 1, false, false, true>"
            "(int, int, int, float const*, int, float*)",
            200,
        ),
        (
            "void cudnn::ops::nchwToNhwcKernel<float, float, float, false, true, "
            "(cudnnKernelDataType_t)2>(cudnn::ops::nchw2nhwc_params_t<float>, float const*)",
            100,
        ),
        (
            "void cudnn::ops::nhwcToNchwKernel<float, float, float, true, false, "
            "(cudnnKernelDataType_t)0>(cudnn::ops::nhwc2nchw_params_t<float>, float const*)",
            100,
        ),
    ]
    t = 10
    for name, dur in names:
        e.kernel(name, t, dur, launch_us=t - 5)
        t += dur + 10
    k = analyze_trace(e.trace()).results.kernels
    assert k.math_ns == 800_000
    assert k.tf32_gemm_time_ratio == pytest.approx(0.75)
    assert k.fp32_gemm_time_ratio == pytest.approx(0.25)


def test_the_format_era_from_the_categories() -> None:
    """Audit 21 D4: cpu_op beside Kernel/Runtime (a Kineto between the two namings; the trace
    held aten::_reshape_alias, torch 1.11 on) read "legacy categories (<= torch 1.9)"."""
    from traceinsight.parsers.kineto import _era

    mixed = _era({"schemaVersion": 1}, {"cpu_op", "Kernel", "Runtime"}, False, False, "")
    assert "transitional" in mixed and "<= torch 1.9" not in mixed
    old = _era({"schemaVersion": 1}, {"Operator", "Kernel", "Runtime"}, False, False, "")
    assert "legacy categories (<= torch 1.9)" in old
    # session 52: a 2022 GPU-only capture (no cpu_op) with Kernel/Memcpy beside cuda_runtime
    gpu_only = _era({"schemaVersion": 1}, {"Kernel", "Memcpy", "cuda_runtime"}, False, False, "")
    assert "beside cuda_runtime (a transitional Kineto)" in gpu_only
    new = _era({"schemaVersion": 1}, {"cpu_op", "kernel", "cuda_runtime"}, False, False, "")
    assert "legacy" not in new and "transitional" not in new


LOADER = "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__"


def _loader_loop(first_us: float, k0_us: float = 10, others: tuple = (300, 200, 250, 300)) -> Any:
    """A kernel (``k0_us`` long), then five loader calls each followed by a kernel: the first
    call (from 20 us) ``first_us`` long, the others ``others``, each inside a gap 20 us longer."""
    e = Events()
    e.kernel("k0", 0, k0_us, launch_us=0)
    t = 20.0
    for dur in (first_us, *others):
        e.op(LOADER, t, dur)
        launch = t + dur + 5
        e.op("aten::add", launch - 1, 4)  # a torch op launching it: a PyTorch trace
        e.kernel("k", launch + 5, 100, launch_us=launch)
        t = launch + 5 + 100 + 10
    return analyze_trace(e.trace())


def test_loader_idle_around_the_calls_is_not_said_to_be_in_them() -> None:
    """Session 52 (a ResNet-50 recorded on an H100): "35.48 ms idle in DataLoader.__next__" where
    its calls held 24.70 ms, each gap going whole to the loader as the cause covering most of it.
    By hand: four gaps of 501 us, each a 300 us loader call and 180 us of other host work."""
    e = Events()
    e.kernel("k0", 0, 10, launch_us=0)
    t = 20.0
    for _ in range(4):
        e.op(LOADER, t, 300)
        e.op("aten::copy_", t + 300, 180)
        e.op("aten::add", t + 485, 4)
        e.kernel("k", t + 491, 100, launch_us=t + 486)
        t += 491 + 100 + 10
    a = analyze_trace(e.trace())
    assert a.results.idle.idle_by_cause_ns["dataloader"] == 4 * 501_000
    assert a.results.idle.dataloader_idle_ns == 4 * 300_000
    (f,) = [f for f in a.findings if f.id == "dataloader_stall"]
    assert (
        "2.00 ms idle in gaps mostly in DataLoader.__next__ (1.20 ms inside its calls)" in f.title
    )


def test_the_workers_start_is_not_the_steady_loader_stall() -> None:
    """Audit 17 D8b: a cold ResNet's "7345.86 ms idle in DataLoader.__next__" held the first
    batch's 2.25 s (its __next__ 1,938.9 ms, the others 0.1-747.6 ms), and the "why" line was that
    gap. Here the first call is 2,000 us against at most 300 for the others (over twice): its gap
    (10 -> 2,030 us) is the workers' start, 2,020 us; the steady stall is the other four gaps,
    320 + 220 + 270 + 320 = 1,130 us."""
    a = _loader_loop(2000)
    assert a.results.idle.idle_by_cause_ns["dataloader"] == 3_150_000
    assert a.results.idle.dataloader_first_batch_idle_ns == 2_020_000
    (f,) = [f for f in a.findings if f.id == "dataloader_stall"]
    assert f.evidence["first_batch_idle_ns"] == 2_020_000
    # (each gap 20 us longer than its call: in and around them, session 63)
    assert "1.13 ms idle in and around DataLoader.__next__" in f.title
    assert "besides, 2.02 ms for the first batch while the workers started" in f.title
    assert "at 0.00 ms" not in f.evidence["causal_chain"]


def test_the_example_is_no_gap_of_the_first_batch_begun_inside_it() -> None:
    """The review: with the GPU still busy when the first __next__ began (k0 to 30 us, the call
    from 20), its gap (30 -> 2,030 us) begins inside the call; the example skips it too."""
    a = _loader_loop(2000, k0_us=30)
    assert a.results.idle.dataloader_first_batch_idle_ns == 2_000_000
    (f,) = [f for f in a.findings if f.id == "dataloader_stall"]
    assert "at 0.01 ms" not in f.evidence["causal_chain"]
    assert "idled 2.00 ms" not in f.evidence["causal_chain"]


def test_a_first_batch_alone_is_no_steady_stall() -> None:
    """The review: a first-batch-only stall (the later calls 1 us, in gaps the host's launch
    work holds) read HIGH "GPU waits for the input pipeline"; now it names the workers' start
    and costs nothing steady."""
    a = _loader_loop(2000, others=(1, 1, 1, 1))
    assert a.results.idle.dataloader_first_batch_idle_ns == 2_020_000
    (f,) = [f for f in a.findings if f.id == "dataloader_stall"]
    assert f.cost_ns == 0 and f.severity in ("info", "low")
    assert f.title.startswith("The DataLoader's first batch kept the GPU idle 2.02 ms")


def test_a_first_call_like_the_others_is_no_start() -> None:
    """500 us against the others' longest 300: under twice, so the stall is all five gaps."""
    a = _loader_loop(500)
    assert a.results.idle.dataloader_first_batch_idle_ns == 0
    (f,) = [f for f in a.findings if f.id == "dataloader_stall"]
    assert "first batch" not in f.title


SEND_RECV = "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)"


@pytest.mark.parametrize(
    ("outer", "kind"),
    [
        (("c10d::alltoall_base_",), "all_to_all"),
        ((), "send_recv"),
        # session 53: a 2023 TorchRec rank (launches linked to no op) whose DDP all-reduce ran
        # SendRecv kernels inside nccl:all_reduce, 126.6 ms read as all-to-all
        (("nccl:all_reduce",), "all_reduce"),
        (("c10d::allreduce_", "nccl:all_reduce"), "all_reduce"),
        # the outermost range is the user's call: the all-to-all around NCCL's sends
        (("c10d::alltoall_base_", "nccl:send"), "all_to_all"),
        (("record_param_comms",), "send_recv"),  # names no collective
    ],
)
def test_send_recv_inside_an_all_to_all_is_the_all_to_all(
    outer: tuple[str, ...], kind: str
) -> None:
    """Audit 22 D2: NCCL runs an all-to-all as grouped sends and receives; an FSDP job's
    Ulysses all-to-all (``c10d::alltoall_base_`` around the launch) read as pipeline
    parallelism's send/recv. Outside any all-to-all range a SendRecv kernel stays send_recv;
    inside a range that names another collective it is that one."""
    from traceinsight.analyzers.comm import with_kinds

    e = Events()
    for depth, name in enumerate(outer):  # nested, outermost first
        e.op(name, depth, 50 - 2 * depth)
    e.kernel(SEND_RECV, 60, 100, launch_us=10)
    events = e.trace().events
    comm = events.filter(events["kind"] == "kernel").select(
        "name", "correlation", "device", "start_ns"
    )
    assert with_kinds(comm, events).get_column("kind").to_list() == [kind]


def test_a_costly_low_finding_keeps_the_page_from_healthy(offload: Any) -> None:
    """Audit 22 D3: "No high or medium finding: this trace looks healthy" on a DDP rank whose
    exposed all-reduce, graded low (its rank waits for the others), cost 62% of the window."""
    import copy

    from traceinsight.report.html import render_html

    doc = copy.deepcopy(offload.to_json())
    for f in doc["findings"]:
        f["severity"], f["cost_ratio"] = "low", 0.05
    assert "this trace looks healthy" in render_html(doc)
    # an info finding is no lever (a graph capture's window): still healthy
    doc["findings"][1]["severity"], doc["findings"][1]["cost_ratio"] = "info", 0.9
    assert "this trace looks healthy" in render_html(doc)
    doc["findings"][1]["severity"], doc["findings"][1]["cost_ratio"] = "low", 0.62
    page = render_html(doc)
    assert "this trace looks healthy" not in page
    assert "No high or medium finding, but" in page and "62.0% of the window" in page


def test_a_wait_on_an_unrecorded_event_is_no_high_underutilization() -> None:
    """Audit 22 D5: an SGLang decode read "GPU busy only 2.1%" (HIGH) on one 463 ms wait for an
    event recorded outside the trace (hipStreamWaitEvent, then a kernel queued at 0.02 ms ran
    at 463.3 ms), the GPU 93.5% busy after it. Here a kernel queued at 30 us runs 100 ms later,
    after a stream wait; the idle is gpu_wait and the finding is capped at low."""
    e = Events()
    e.kernel("k0", 10, 5, launch_us=2)
    e.runtime("cudaStreamWaitEvent", 20, 3)
    e.kernel("k1", 100_030, 50, launch_us=25)
    for i in range(5):
        e.kernel("k", 100_090 + 60 * i, 50, launch_us=100_085 + 60 * i)
    a = analyze_trace(e.trace())
    assert a.results.idle.idle_by_cause_ns["gpu_wait"] >= 100_000_000 - 20_000
    (f,) = [f for f in a.findings if f.id == "gpu_underutilized"]
    assert f.severity == "low"
    assert "not in the trace" in f.evidence["severity_cap_reason"]


@pytest.mark.parametrize(
    ("names", "forward_only"), [(["aten::mm"], True), (["aten::mm", "MmBackward0"], False)]
)
def test_an_nsys_exports_nvtx_ops_tell_a_forward_only_window(
    names: list[str], forward_only: bool
) -> None:
    """Audit 22 D6: an nsys export (ops as emit_nvtx ranges, no cpu_op rows) of FSDP inference
    was told to "train in bf16": its forward-only window is told from the NVTX ops too."""
    e = Events()
    for i, name in enumerate(names):
        e.annotation(name, 100 * i, 50)
        e.kernel("k", 100 * i + 20, 10, launch_us=100 * i + 5)
    assert analyze_trace(e.trace()).results.host_ops.forward_only is forward_only


def test_the_busy_words_name_copies_and_exposed_communication() -> None:
    """Audit 21 D1 and audit 22 D3: copies and exposed collectives count as busy; where either
    is 5% of the window or more the busy figure says so."""
    from traceinsight.report.format import busy_words

    m = {"gpu_busy_ratio": 0.997, "kernel_busy_ratio": 0.039, "copy_busy_ratio": 0.958}
    assert busy_words(m) == "99.7% (kernels 3.9%, copies 95.8%)"
    ddp = {"gpu_busy_ratio": 0.995, "kernel_busy_ratio": 0.99, "copy_busy_ratio": 0.01}
    assert busy_words({**ddp, "exposed_comm_ratio": 0.624}) == "99.5% (exposed communication 62.4%)"
    assert busy_words({**ddp, "exposed_comm_ratio": 0.01}) == "99.5%"


def test_the_backward_split_is_the_host_steps_own() -> None:
    """Audit 22 D7: a DDP rank's host ran 30 ms ahead of its GPU; the per-step backward,
    clipped to the GPU-aligned window, read 0, 1.75 and 9.22 ms where each host step held
    8.3-9.2 ms. Here each host step (1,000 us) holds a 300 us backward node at +500 us, and its
    kernel runs 900 us after its launch: each step's backward is 300 us."""
    e = Events()
    for i in range(3):
        t = 1000.0 * i
        e.step(i + 1, t, 1000)
        e.op("aten::mm", t + 10, 20)
        e.kernel("gemm_fwd", t + 920, 400, launch_us=t + 15)
        e.op("autograd::engine::evaluate_function: MmBackward0", t + 500, 300)
        e.kernel("gemm_bwd", t + 1330, 400, launch_us=t + 510)
    st = analyze_trace(e.trace()).results.steps
    assert [s.backward_ns for s in st.per_step] == [300_000, 300_000, 300_000]


def test_fsdp_offload_copies_are_named_as_parameters() -> None:
    """Audit 22 D6: an FSDP CPU-offload export's 28.8 GB of uploads, all launched inside
    ``FSDP::pre_forward`` ranges, were told "prefetch the next batch". Here 9 of 10 uploads of
    100 MB (pinned, 4 ms each) are launched inside FSDP's hook: 90% of the bytes."""
    e = Events()
    e.kernel("k0", 0, 5, launch_us=0)  # the window from 0: every upload's launch inside it
    for i in range(10):
        t = 5000.0 * i
        if i:
            e.annotation("FSDP::pre_forward (layer)", t, 100)
        e.op("aten::copy_", t + 8, 10)  # a PyTorch program's copy
        e.memcpy("HtoD", t + 50, 4000, nbytes=100_000_000, src="pinned", dst="device")
        e.runtime("cudaMemcpyAsync", t + 10, 5, correlation=e._corr)
        e.kernel("k", t + 4100, 100, launch_us=t + 20)
    a = analyze_trace(e.trace())
    assert a.results.copies.h2d_fsdp_bytes_ratio == pytest.approx(0.9)
    (f,) = [f for f in a.findings if f.id == "copy_bound"]
    assert f.title.startswith("FSDP's CPU offload: copies bound the run")
    assert "FSDP's hooks" in f.recommendation and "offload_params=False" in f.snippet
