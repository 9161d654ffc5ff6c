"""The fourteenth search of public traces (session 60): what it found, on hand-written traces and
hand-built events (its traces are not kept: the fixtures sit near the device's transfer cap).

- kmcho2019/Rodinia_3.1_Gaussian (nsys, RTX 3090): ``Fan2`` in 4 x 4 blocks, 99.5% of kernel
  time, read "occupancy 33.3%" and nothing above info; the same program with 16 x 16 blocks
  ran the kernel 4.0x faster (682.5 -> 171.2 us a launch). Occupancy counts warps: a block of
  16 threads fills half of its one warp's lanes.
- Navi-AI-Lab/nvllm's GB10 export (compute capability 12.1): no occupancy at all (no limits
  for 12.x).
- MohanadOdema/DLProf (nsys): 11 of 13 syncs the stream syncs after ``Tensor.cuda()`` copies,
  advised to remove ``.item()``.
- sdroruganti/cuda-kernel-library (nsys): a managed-memory vector add whose 155 migrations to
  the device ran inside its kernel: only the idle after it was said.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import traceinsight
from traceinsight.model.devices import ARCH_OF_CAPABILITY, occupancy_basis
from traceinsight.model.schema import DeviceInfo
from traceinsight.pipeline import analyze_trace

from .builder import Events

US = 1_000


def kineto_doc(block: list[int], grid: list[int], *, launches: int = 6) -> dict:
    """A GPU-bound loop of one kernel on an RTX 3090-like device (compute capability 8.6, 82
    SMs, not Kineto's occupancy: ours from the launch configuration), 680 us a launch."""
    events: list[dict] = []
    t = 0.0
    for i in range(launches):
        corr = 100 + i
        events.append(
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
             "ts": t, "dur": 5.0, "args": {"correlation": corr}}
        )  # fmt: skip
        events.append(
            {"ph": "X", "cat": "kernel", "name": "Fan2", "pid": 0, "tid": 7, "ts": t + 10,
             "dur": 680.0, "args": {"device": 0, "stream": 7, "correlation": corr, "grid": grid,
             "block": block, "registers per thread": 16, "shared memory": 0}}
        )  # fmt: skip
        t += 700.0
    return {
        "schemaVersion": 1,
        "deviceProperties": [
            {
                "id": 0,
                "name": "NVIDIA GeForce RTX 3090",
                "totalGlobalMem": 25_769_803_776,
                "computeMajor": 8,
                "computeMinor": 6,
                "numSms": 82,
                "warpSize": 32,
            }
        ],  # fmt: skip
        "traceEvents": events,
    }


def analyzed(tmp: Path, block: list[int], grid: list[int]) -> traceinsight.TraceAnalysis:
    path = tmp / f"fan2_{block[0]}x{block[1]}.json"
    path.write_text(json.dumps(kineto_doc(block, grid)))
    return traceinsight.analyze(path)


def test_blocks_smaller_than_a_warp_are_low_occupancy(tmp_path) -> None:
    """4 x 4 = 16 threads a block on compute capability 8.6: at most 16 blocks an SM, so 16 of
    48 warps (33.3%, the warp occupancy), each warp with 16 of its 32 lanes: 16.7% of the SM's
    threads. Named with its block size and advised whole warps; 16 x 16 blocks are not."""
    a = analyzed(tmp_path, [4, 4, 1], [4096, 1, 1])
    top = a.results.efficiency.occupancy.low_kernels[0]
    assert top.name == "Fan2" and top.block_threads == 16
    assert top.occupancy == pytest.approx(16 / 48)
    assert top.lane_use == pytest.approx(0.5)
    f = next(f for f in a.findings if f.id == "low_occupancy")
    assert f.severity == "low"  # capped: occupancy is not speed
    assert "in blocks of 16 threads: 50.0% of each warp's lanes work" in f.title
    # a CUDA application's own kernel: whole warps advised
    from traceinsight.findings.efficiency_rules import low_occupancy
    from traceinsight.findings.model import Thresholds
    from traceinsight.findings.rules import RULES, RuleInput

    t, window = Thresholds.defaults(RULES), a.results.idle.device_window_ns
    app = low_occupancy(RuleInput(a.results, t, window, (), "cuda_app")).advice["cuda_app"]
    assert "multiple of 32" in app.recommendation and "dim3 threads(16, 16)" in app.snippet

    full = analyzed(tmp_path, [16, 16, 1], [1024, 1, 1])
    assert not full.results.efficiency.occupancy.low_kernels
    assert not any(f.id == "low_occupancy" for f in full.findings)


def test_a_partial_last_warp_counts_its_idle_lanes(tmp_path) -> None:
    """48 threads a block: two warps, the second half full (48 of 64 lanes), one block an SM
    (a grid of 82 blocks on 82 SMs: 2 of 48 warps, limited by the grid)."""
    a = analyzed(tmp_path, [48, 1, 1], [82, 1, 1])
    top = a.results.efficiency.occupancy.low_kernels[0]
    assert top.occupancy == pytest.approx(2 / 48) and top.limiter == "grid"
    assert top.lane_use == pytest.approx(0.75)
    f = next(f for f in a.findings if f.id == "low_occupancy")
    assert "limited by grid, in blocks of 48 threads: 75.0% of each warp's lanes work" in f.title


@pytest.mark.parametrize(
    ("cc", "warps", "blocks", "shared_kb"),
    [("12.0", 48, 24, 100), ("12.1", 48, 24, 100), ("8.7", 48, 16, 164), ("11.0", 48, 24, 228)],
)
def test_occupancy_limits_of_newer_capabilities(cc: str, warps: int, blocks: int, shared_kb: int):
    """The CUDA Programming Guide's per-capability limits (NVIDIA's CCCL arch_traits): 12.x
    1536 threads, 24 blocks, 100 KB of shared memory an SM; 8.7 (Orin) 16 blocks, 164 KB; 11.0
    (Thor) 24 blocks, 228 KB."""
    d = DeviceInfo(id=0, name="NVIDIA GB10", sm_count=48, memory_bytes=0, compute_capability=cc)
    limits, sms = occupancy_basis(d)
    assert sms == 48 and ARCH_OF_CAPABILITY[cc]
    assert (limits.max_warps_per_sm, limits.max_blocks_per_sm) == (warps, blocks)
    assert limits.shared_memory_per_sm_bytes == shared_kb * 1024


def test_integrated_gpus_have_no_pcie_rate() -> None:
    """GB10, Orin and Thor share the host's memory: no PCIe pinned-copy rate is assumed."""
    from traceinsight.model.devices import host_links

    gb10 = DeviceInfo(
        id=0, name="NVIDIA GB10", sm_count=48, memory_bytes=0, compute_capability="12.1"
    )
    rtx = DeviceInfo(
        id=1, name="NVIDIA Foo RTX 5090", sm_count=170, memory_bytes=0, compute_capability="12.0"
    )
    rates = host_links([gb10, rtx])
    assert 0 not in rates and rates[1] == 50e9


def test_host_sync_advice_where_most_syncs_are_input_copies() -> None:
    """11 stream syncs after input copies (pageable HtoD, the sync inside aten::to) and 2
    .item() read-backs: the input copies' lever first, then the others'."""
    ev = Events()
    t = 0
    for i in range(13):
        ev.step(i, t, 1_000)
        ev.op("aten::mm", t + 5, 10)
        ev.kernel("gemm", t + 20, 600, launch_us=t + 8)
        if i < 11:
            ev.op("aten::to", t + 30, 700)
            ev.memcpy("HtoD", t + 640, 5, nbytes=64 << 10, src="pageable", dst="device")
            ev.runtime("cudaMemcpyAsync", t + 35, 10, correlation=ev._corr)
            ev.runtime("cudaStreamSynchronize", t + 50, 650)
        else:
            ev.op("aten::item", t + 30, 700)
            ev.op("aten::_local_scalar_dense", t + 31, 698)
            ev.memcpy("DtoH", t + 640, 5, nbytes=4, src="device", dst="pageable")
            ev.runtime("cudaMemcpyAsync", t + 35, 10, correlation=ev._corr)
            ev.runtime("cudaStreamSynchronize", t + 50, 650)
        ev.op("aten::add", t + 760, 10)
        ev.kernel("add", t + 900, 50, launch_us=t + 765)
        t += 1_000
    a = analyze_trace(ev.trace())
    f = next(f for f in a.findings if f.id == "host_sync")
    assert f.evidence["host_sync_count"] == 13 and f.evidence["input_copy_sync_count"] == 11
    assert f.recommendation.startswith("Copy inputs without waiting")
    assert "The other 2 syncs: remove per-step .item()" in f.recommendation


def test_migrations_inside_kernels_are_said() -> None:
    """A managed-memory kernel of 1.45 ms faulting its inputs in (10 migrations to the device of
    40 us each inside it), then the host reading its results back (20 migrations out after it,
    100 us apart): the idle after the kernel as before, and the migrations inside it named with
    the kernel time beside them (400 us), not added to the graded idle."""
    ev = Events()
    ev.runtime("cudaLaunchKernel", 0, 5, correlation=ev.next_correlation())
    ev.kernel("vectorAdd", 10, 1_450)
    for i in range(10):
        ev.memcpy("unified", 100 + i * 120, 40, nbytes=64 << 10, src="host", dst="device")
    for i in range(20):
        ev.memcpy("unified", 1_500 + i * 100, 30, nbytes=64 << 10, src="device", dst="host")
    a = analyze_trace(ev.trace())
    r = a.results.idle
    assert r.unified_migrations_in_kernels == 10
    assert r.unified_migrations_in_kernels_bytes == 10 * (64 << 10)
    assert r.unified_migrations_in_kernels_ns == 10 * 40 * US
    f = next(f for f in a.findings if f.id == "unified_memory")
    assert "10 migrations (655.4 KB) ran inside kernels, beside 0.40 ms of kernel time" in f.title
    assert f.evidence["migrations_in_kernels_ns"] == 400 * US
    assert f.evidence["idle_ns"] == r.idle_by_cause_ns["unified_memory"]


@pytest.mark.parametrize(
    ("kind", "name", "engine"),
    [
        ("cpu_op", "vllm::unified_attention_with_output", "vLLM"),
        ("python_function", "/sgl-workspace/sglang/python/sglang/srt/managers/scheduler.py(2919): _run_batch_inner", "SGLang"),
        ("python_function", "train.py(12): step", None),
    ],
)  # fmt: skip
def test_a_serving_loops_syncs_are_advised_as_a_servers(kind: str, name: str, engine) -> None:
    """Audits s59 and s60: vLLM decode captures' per-step cudaEventSynchronize waits (the engine
    reading sampled tokens back) were advised to drop .item() calls. An inference server, known
    by its ops' namespace or its Python frames, is advised its scheduler's overlap, graphs and
    more sequences a step; a training loop keeps the usual advice."""
    ev = Events()
    t = 0
    for i in range(4):
        ev.step(i, t, 1_000)
        ev._add(kind, name, t + 2, 900, tid=1)
        ev.op("aten::mm", t + 5, 10)
        ev.kernel("gemm", t + 20, 600, launch_us=t + 8)
        ev.runtime("cudaEventSynchronize", t + 30, 600)
        ev.op("aten::add", t + 700, 10)
        ev.kernel("add", t + 800, 50, launch_us=t + 705)
        t += 1_000
    a = analyze_trace(ev.trace())
    assert a.results.host_ops.serving_engine == engine
    f = next(f for f in a.findings if f.id == "host_sync")
    if engine is None:
        assert ".item()" in f.recommendation
    else:
        assert f.recommendation.startswith(f"This is {engine}'s serving loop")
        assert ".item()" not in f.recommendation
