"""The fifteenth search of public traces (session 61): what it found, on hand-written traces and
hand-built payloads (its traces are not kept: the fixtures sit near the device's transfer cap).

- danae-pan/hpc_assignment3 (nsys, H100 PCIe): an OpenMP-offload matmul
  (``nvkernel_matmult_mnk_offload_F1L115_7``, classed a GEMM by its name) in one block of 32
  threads, 90-97% of the run, read "occupancy 0.0%" and no finding: GEMMs were left out of
  low occupancy by class. The same loop with 131,072 blocks ran in 10.7 ms.
- astra-sim/astra-sim's Megatron TP8 job (Kineto, 8 x A100): ranks 0 and 6 arrive last at 60
  of 84 all-reduces and the others wait 191-445 ms of a 610 ms step; no straggler was named
  (rank 0 alone caused 52% of the waiting, the threshold 60%). Its ranks' overlap what-if
  priced 29-70 ms a step where each tensor-parallel all-reduce reduces the GEMM before it
  (tests/test_replay.py holds the transform on hand-built streams).
- The same job's ranks, one at a time: 81 identical f16 all-reduces (NCCL's LL protocol, no
  message sizes in that torch's traces) from 582 us to 37.5 ms read "the collectives' own time
  is the cost"; 404 of their 452 ms lie beyond the fastest.
- Kernels of one CUDA graph launch share its correlation id: every kernel of a graph read the
  launch configuration of the graph's first (a compiled step's cuBLAS GEMMs "one block of 32
  threads").
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl

import traceinsight
from traceinsight.analyzers.cross_rank import COLLECTIVE_SCHEMA, RankPayload, analyze_cross_rank

US = 1_000
H100 = {
    "id": 0,
    "name": "NVIDIA H100 80GB HBM3",
    "totalGlobalMem": 85_017_493_504,
    "computeMajor": 9,
    "computeMinor": 0,
    "numSms": 132,
    "warpSize": 32,
}


def kineto_doc(kernels: list[tuple[str, list[int], list[int], int, int]]) -> dict:
    """Kernels (name, grid, block, registers, correlation) 680 us each, 700 us apart, each
    after a 5 us launch call with its correlation; on an H100 (132 SMs)."""
    events: list[dict] = []
    t = 0.0
    for name, grid, block, regs, corr in kernels:
        events.append(
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
             "ts": t, "dur": 5.0, "args": {"correlation": corr}}
        )  # fmt: skip
        events.append(
            {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": t + 10,
             "dur": 680.0, "args": {"device": 0, "stream": 7, "correlation": corr, "grid": grid,
             "block": block, "registers per thread": regs, "shared memory": 0}}
        )  # fmt: skip
        t += 700.0
    return {"schemaVersion": 1, "deviceProperties": [H100], "traceEvents": events}


def analyzed(tmp: Path, name: str, kernels: list) -> traceinsight.TraceAnalysis:
    path = tmp / f"{name}.json"
    path.write_text(json.dumps(kineto_doc(kernels)))
    return traceinsight.analyze(path)


OFFLOAD = "nvkernel_matmult_mnk_offload_F1L115_7"


def test_a_gemm_in_one_warp_is_low_occupancy(tmp_path) -> None:
    """Named like a GEMM, launched as one 32-thread block on 132 SMs: low_occupancy names it
    as a single block (the one-block advice), graded low like every occupancy finding."""
    a = analyzed(
        tmp_path, "offload", [(OFFLOAD, [1, 1, 1], [32, 1, 1], 106, 100 + i) for i in range(6)]
    )
    top = a.results.efficiency.occupancy.low_kernels[0]
    assert (top.name, top.kernel_class, top.grid_blocks, top.block_threads) == (
        OFFLOAD,
        "gemm",
        1,
        32,
    )
    f = next(f for f in a.findings if f.id == "low_occupancy")
    # (a Kineto trace reads as PyTorch's: serial by design; the nsys export, a CUDA
    # application's, reads "a single block of 32 threads ... all of it on one SM")
    assert f.severity == "low" and "a single block" in f.title


def test_a_library_gemm_in_a_few_blocks_is_not(tmp_path) -> None:
    """A tensor-core GEMM in 8 blocks of 128 threads (a small model's): its lever is the
    batch, which the batch rules price; occupancy says nothing of it."""
    gemm = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1"
    a = analyzed(
        tmp_path, "cublas", [(gemm, [8, 1, 1], [128, 1, 1], 168, 100 + i) for i in range(6)]
    )
    assert a.results.efficiency.occupancy.low_kernels == ()
    assert "low_occupancy" not in {f.id for f in a.findings}


def test_each_kernel_of_a_graph_launch_has_its_own_configuration(tmp_path) -> None:
    """Three launches of a graph of two kernels, each launch one correlation: a one-warp
    kernel, then a GEMM of 264 blocks of 256 threads. Only the first is low occupancy; the
    GEMM read the first's configuration before (joined by correlation alone)."""
    kernels = []
    for i in range(3):
        kernels.append(("tiny_kernel", [1, 1, 1], [32, 1, 1], 16, 100 + i))
        kernels.append(("ampere_sgemm_128x64_nn", [264, 1, 1], [256, 1, 1], 128, 100 + i))
    a = analyzed(tmp_path, "graph", kernels)
    low = a.results.efficiency.occupancy.low_kernels
    assert [(k.name, k.block_threads) for k in low] == [("tiny_kernel", 32)]


ALL_REDUCE = "ncclDevKernel_AllReduce_Sum_f16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"


def payload(rank: int, collectives: list[tuple[float, float]]) -> RankPayload:
    rows = [(ALL_REDUCE, "all_reduce", round(s * US), round(e * US), 1) for s, e in collectives]
    return RankPayload(
        rank=rank,
        window_ns=1000 * US,
        collectives=pl.DataFrame(rows, schema=COLLECTIVE_SCHEMA, orient="row"),
        step_times_ns=(1000 * US,),
        top_finding=None,
        steps=(1,),
        window_start_ns=0,
        window_end_ns=1000 * US,
    )


def test_two_late_ranks_are_named_together() -> None:
    """8 ranks, 4 all-reduces ending together at 200, 400, 600 and 800 us: rank 0 arrives
    last (100 us after the others) at the first and third, rank 6 at the second and fourth
    (80 us after). Neither alone causes 60% of the waiting (rank 0: 7 x 200 = 1,400 us of
    2,520), together all of it: both are named, and the other 6 ranks are charged 360 us
    each (100 + 80 + 100 + 80); what rank 0 and rank 6 wait for each other is not charged."""

    def ends(rank: int) -> list[tuple[float, float]]:
        out = []
        for i, end in enumerate((200, 400, 600, 800)):
            who, lag = (0, 100) if i % 2 == 0 else (6, 80)
            start = end - 20 if rank == who else end - 20 - lag
            out.append((start, end))
        return out

    c = analyze_cross_rank([payload(r, ends(r)) for r in range(8)])
    assert c.straggler_rank == 0 and c.straggler_ranks == (0, 6)
    assert c.straggler_last_ratio == 1.0
    charged = {int(r): v for r, v in c.charged_by_rank_ns.items()}
    assert {r: charged.get(r, 0) for r in range(8)} == {
        **{r: 360 * US for r in (1, 2, 3, 4, 5, 7)},
        0: 0,
        6: 0,
    }
    assert c.wait_caused_ns == 6 * 360 * US
    # one rank that causes most of the waiting alone is named alone, as before
    one = analyze_cross_rank(
        [
            payload(r, [(180 if r == 0 else 80, 200), (380 if r == 0 else 280, 400)])
            for r in range(8)
        ]
    )
    assert one.straggler_ranks == (0,)


def nccl_doc(name: str, durs_us: list[float]) -> dict:
    """One rank's all-reduces (no message sizes: an older torch's record_param_comms) on
    stream 20, one after each 100 us GEMM on stream 7."""
    events: list[dict] = []
    t = 0.0
    for i, d in enumerate(durs_us):
        for k, (kname, stream, dur) in enumerate((("gemm_kernel", 7, 100.0), (name, 20, d))):
            corr = 1000 + 2 * i + k
            events.append(
                {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1,
                 "tid": 1, "ts": t, "dur": 5.0, "args": {"correlation": corr}}
            )  # fmt: skip
            events.append(
                {"ph": "X", "cat": "kernel", "name": kname, "pid": 0, "tid": stream,
                 "ts": t + 10, "dur": dur, "args": {"device": 0, "stream": stream,
                 "correlation": corr}}
            )  # fmt: skip
            t += dur + 20
    return {"schemaVersion": 1, "deviceProperties": [H100], "traceEvents": events}


DURS_US = [500, 520, 1000, 1500, 2000, 2500, 3000, 3500, 4000, 4500, 5000, 5500]


def test_a_repeated_small_collective_beyond_its_fastest_calls_is_waiting(tmp_path) -> None:
    """12 calls of one low-latency (LL) all-reduce, no sizes recorded: the fastest tenth of
    them (the lower 10% quantile: 520 us) is taken as the transfer, the rest as waiting for the
    other ranks: 33,520 - 500 - 11 x 520 = 27,300 us of waiting, 500 + 11 x 520 = 6,220 us of
    transfer (Megatron TP8's rank 3: 404 of 452 ms, the job's cross-rank analysis 422 ms)."""
    path = tmp_path / "ll.json"
    path.write_text(json.dumps(nccl_doc(ALL_REDUCE, DURS_US)))
    comm = traceinsight.analyze(path).results.comm
    assert comm.peer_wait_source == "repeats"
    assert (comm.sized_comm_ns, comm.peer_wait_ns, comm.transfer_bound_ns) == (
        33_520 * US,
        27_300 * US,
        6_220 * US,
    )


def test_a_large_message_protocol_is_not_read_as_waiting(tmp_path) -> None:
    """The same durations on NCCL's SIMPLE protocol (large messages, whose sizes may differ
    call to call: DDP's first bucket is smaller): no waiting is claimed without sizes."""
    path = tmp_path / "simple.json"
    simple = ALL_REDUCE.replace("RING_LL", "RING_SIMPLE")
    path.write_text(json.dumps(nccl_doc(simple, DURS_US)))
    comm = traceinsight.analyze(path).results.comm
    assert comm.peer_wait_source is None and comm.peer_wait_ns == 0


def stall_doc(stall_us: float) -> dict:
    """A launch-bound loop of 30 iterations on one thread: aten::empty (5 us, no runtime call),
    then aten::add launching a 20 us kernel. The 12th aten::empty takes ``stall_us``."""
    events: list[dict] = []
    t = 0.0
    for i in range(30):
        empty = stall_us if i == 11 else 5.0
        events.append(
            {"ph": "X", "cat": "cpu_op", "name": "aten::empty", "pid": 1, "tid": 1, "ts": t,
             "dur": empty, "args": {}}
        )  # fmt: skip
        t += empty + 2
        corr = 500 + i
        events.append(
            {"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, "ts": t,
             "dur": 12.0, "args": {}}
        )  # fmt: skip
        events.append(
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
             "ts": t + 2, "dur": 8.0, "args": {"correlation": corr}}
        )  # fmt: skip
        events.append(
            {"ph": "X", "cat": "kernel", "name": "add_kernel", "pid": 0, "tid": 7, "ts": t + 12,
             "dur": 20.0, "args": {"device": 0, "stream": 7, "correlation": corr}}
        )  # fmt: skip
        t += 14
    return {"schemaVersion": 1, "deviceProperties": [H100], "traceEvents": events}


def test_a_quick_op_the_thread_stalled_in_is_named(tmp_path) -> None:
    """One aten::empty of 30 (median 5 us) took 20 ms with no runtime call inside: the thread
    stalled (audit s61: Megatron TP8's ranks 0 and 6, aten::empty 18.7 ms, aten::reshape 27.6
    ms against 19 us). The GPU idled through it but for the 18 us the previous kernel still
    ran: 20,000 us of stall, 19,982 us idle. gpu_underutilized says where its idle went."""
    path = tmp_path / "stall.json"
    path.write_text(json.dumps(stall_doc(20_000.0)))
    a = traceinsight.analyze(path)
    h = a.results.host_ops
    assert [(s.name, s.dur_ns, s.median_ns) for s in h.host_stalls] == [
        ("aten::empty", 20_000 * US, 5 * US)
    ]
    assert (h.host_stall_ns, h.host_stall_idle_ns) == (20_000 * US, 19_982 * US)
    f = next(f for f in a.findings if f.id == "gpu_underutilized")
    assert "while the thread stalled inside usually quick ops (aten::empty 20.00 ms" in f.title
    assert f.recommendation.startswith("The launching thread stalls")


def test_a_slow_first_call_is_setup_not_a_stall(tmp_path) -> None:
    """The same 20 ms in the thread's first aten::empty (first use sets up) and a 0.4 ms one
    (under 1 ms): no stall."""
    doc = stall_doc(5.0)
    doc["traceEvents"][0]["dur"] = 20_000.0
    for e in doc["traceEvents"][1:]:
        e["ts"] += 20_000.0
    path = tmp_path / "first.json"
    path.write_text(json.dumps(doc))
    assert traceinsight.analyze(path).results.host_ops.host_stalls == ()
    path.write_text(json.dumps(stall_doc(400.0)))
    assert traceinsight.analyze(path).results.host_ops.host_stalls == ()
