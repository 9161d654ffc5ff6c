"""Multi-rank jobs: collective time split into waiting and transfer, the waiting charged to the
straggler (net of hidden and step-entry waiting), the ranks' communication findings on transfer
time alone, advice by collective kind, and job findings graded by their share of the job.

Sources: a hand-made 2-rank job (tests/builder.py) with hand-computed values; the H200 2-rank
fixtures (fixtures/h200/ddp_*; the straggler's injected delay is in rank1.truth.json and
fixtures/generate/record.py); a variant of the ddp_overlap pair with rank 1 delayed by a known
amount before its first collective of every step."""

from __future__ import annotations

import json
import re
from pathlib import Path

import polars as pl
import pytest

from traceinsight.analyzers.comm import collective_kind
from traceinsight.analyzers.cross_rank import (
    COLLECTIVE_KERNEL,
    COLLECTIVE_SCHEMA,
    RankPayload,
    analyze_cross_rank,
)
from traceinsight.api import analyze_trace
from traceinsight.findings import default_thresholds
from traceinsight.findings.job_rules import RankFindings, worst_per_rank
from traceinsight.findings.model import Finding
from traceinsight.findings.rules import (
    COMM_ADVICE_BY_KIND,
    COMM_ITSELF_ADVICE,
    COMM_LESS_ADVICE,
    DDP_FSDP_ADVICE,
    PEER_WAIT_ADVICE,
)
from traceinsight.jobs import analyze_job, analyze_trace_ranks
from traceinsight.model.classify import names_matching
from traceinsight.model.schema import GPU_KINDS, Trace
from traceinsight.parsers import load_trace

from .builder import US, Events
from .conftest import FIXTURES, H200, SHARED

GEMM = "ampere_bf16_s16816gemm_bf16_128x128"
ALL_REDUCE = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
SEND_RECV = "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)"


def _collective(e: Events, name: str, start_us: float, dur_us: float, launch_us: float, op: str):
    """A collective kernel, its launch and the host op (``nccl:...``) the launch belongs to."""
    corr = e.next_correlation()
    e._add("cpu_op", op, launch_us - 5, 20, tid=1, external_id=corr)
    e._add("runtime", "cudaLaunchKernel", launch_us, 5, tid=1, correlation=corr, external_id=corr)
    e._add("kernel", name, start_us, dur_us, device=0, stream=20, correlation=corr)


def hand_job() -> Trace:
    """Two ranks, two steps (times in us). Rank 1 computes longer before each collective.

    step 1: rank 0 all-reduce [300, 800), rank 1 arrives at 700 and ends at 800; rank 0's GPU
    also computes [300, 400) on another stream, so 100 of its 400 waiting hides behind compute.
    step 2: rank 1 enters at 1050 (rank 0 at 1000); all-to-all (SendRecv kernels under
    nccl:all_to_all): rank 0 [1200, 1650), rank 1 arrives at 1450, both end at 1650.
    """
    r0, r1 = Events(rank=0, pid=1), Events(rank=1, pid=2)
    r0.step(1, 0, 1000).step(2, 1000, 1000)
    r0.kernel(GEMM, 0, 300, launch_us=0).kernel(GEMM, 300, 100, launch_us=10, stream=8)
    _collective(r0, ALL_REDUCE, 300, 500, 30, "nccl:all_reduce")
    _collective(r0, SEND_RECV, 1200, 450, 1100, "nccl:all_to_all")
    r1.step(1, 0, 1050).step(2, 1050, 950)
    r1.kernel(GEMM, 0, 690, launch_us=0).kernel(GEMM, 1050, 390, launch_us=1050)
    _collective(r1, ALL_REDUCE, 700, 100, 30, "nccl:all_reduce")
    _collective(r1, SEND_RECV, 1450, 200, 1100, "nccl:all_to_all")
    return Events(rows=r0.rows + r1.rows).trace("hand_job")


def test_wait_transfer_split_by_hand():
    job = analyze_trace_ranks(hand_job())
    c = job.cross
    assert (
        c.straggler_rank == 1 and c.straggler_last_ratio == 1.0 and c.straggler_caused_ratio == 1.0
    )
    # rank 0 waits 400 (step 1) + 250 (step 2); 100 of it hides behind its own compute
    assert c.wait_by_rank_ns == {"0": 650 * US, "1": 0}
    assert c.exposed_wait_by_rank_ns == {"0": 550 * US, "1": 0}
    assert c.transfer_by_rank_ns == {"0": 300 * US, "1": 300 * US}
    # charged: 300 in step 1 and 250 in step 2 (rank 1 entered step 2 50 us late: late is
    # late, no lead is subtracted); one host's clock: no offset
    assert c.clock_offset_by_rank_ns == {"0": 0, "1": 0}
    assert c.charged_by_rank_ns == {"0": 550 * US, "1": 0}
    assert c.wait_caused_ns == 550 * US and c.straggler_steps == (1, 2)
    assert c.comm_split["0"] == {
        "all_reduce": {"count": 1, "wait_ns": 400 * US, "exposed_wait_ns": 300 * US, "transfer_ns": 100 * US},
        "all_to_all": {"count": 1, "wait_ns": 250 * US, "exposed_wait_ns": 250 * US, "transfer_ns": 200 * US},
    }  # fmt: skip
    # the job's step time: max over ranks per step, 1050 + 1000; graded 550 / 2050 = 27%
    assert c.job_step_ns == 2050 * US and c.wait_caused_ratio == pytest.approx(550 / 2050)
    f = next(f for f in job.findings if f.id == "straggler")
    assert f.cost_ratio == pytest.approx(550 / 2050) and f.severity == "high"
    assert f.evidence["wait_by_kind_ns"] == {"0": {"all_reduce": 300 * US, "all_to_all": 250 * US}}


def test_clock_offset_between_hosts_is_taken_out():
    """Rank 1's clock 1 ms ahead (another host): its every timestamp +1000 us. Its collectives
    end 1000 us after rank 0's, so each clock reads +-500 us off their median end, and the
    arrivals, compared on one clock, charge what the same-clock job charges."""
    trace = hand_job()
    ev = trace.events.with_columns(
        [
            pl.when(pl.col("rank") == 1).then(pl.col(c) + 1000 * US).otherwise(pl.col(c)).alias(c)
            for c in ("start_ns", "end_ns")
        ]
    )
    c = analyze_trace_ranks(Trace(ev, trace.meta)).cross
    assert c.clock_offset_by_rank_ns == {"0": -500 * US, "1": 500 * US}
    assert c.straggler_rank == 1 and c.charged_by_rank_ns == {"0": 550 * US, "1": 0}
    assert c.exposed_wait_by_rank_ns == {"0": 550 * US, "1": 0}


def test_waiting_rank_comm_findings_use_transfer_only():
    trace = hand_job()
    # Rank 0 alone (no peers to wait for): all 950 us of communication, 850 us exposed.
    alone = analyze_trace(Trace(trace.events.filter(pl.col("rank") == 0), trace.meta))
    solo = {f.id: f for f in alone.findings}
    # (the time each rule attributes, kept in the evidence beside the model's predicted saving)
    # communication is 950 of 2000 us (47.5% >= comm_heavy_ratio 30%), but all-to-all: not
    # gradient reduction, whose levers "communicate less" names (audit 20)
    # overlap hides at most the compute not yet under communication: 400 us of compute, 100
    # of it under communication already, so 300 us of the 850 exposed (audit 23)
    solo_comm = solo["comm_not_overlapped"]
    assert solo_comm.evidence["attributed_ns"] == 300 * US
    assert solo_comm.evidence["hideable_ns"] == 300 * US
    assert solo_comm.recommendation == COMM_ITSELF_ADVICE
    assert solo["comm_not_overlapped"].evidence["most_exposed_kind"] == "all_to_all"
    assert COMM_LESS_ADVICE not in solo["comm_not_overlapped"].recommendation
    # In the job: 950 - 650 waiting = 300 us of transfer, none hidden; 15% < 30%: no such advice.
    job = analyze_trace_ranks(trace)
    rank0 = {f.id: f for f in job.ranks[0].findings}
    assert rank0["comm_not_overlapped"].evidence["attributed_ns"] == 300 * US
    assert COMM_LESS_ADVICE not in rank0["comm_not_overlapped"].recommendation
    assert rank0["comm_not_overlapped"].evidence["comm_wait_ns"] == 650 * US
    # all-to-all is the most exposed kind (450 - 250 = 200 us vs 400 - 300 = 100 us): its advice
    assert rank0["comm_not_overlapped"].evidence["most_exposed_kind"] == "all_to_all"
    assert rank0["comm_not_overlapped"].recommendation == COMM_ADVICE_BY_KIND["all_to_all"]
    # Job finding: rank 0's 300 us of transfer + rank 1's predicted saving, 0: its collectives
    # run on its one compute stream, so the overlap transform has no side stream to free
    # (attributed 300 us, kept in its evidence); over both windows (2 x 2000 us) = 7.5% (low)
    r1 = {f.id: f for f in job.ranks[1].findings}["comm_not_overlapped"]
    assert r1.cost_ns == 0 and r1.evidence["attributed_ns"] == 300 * US
    jf = next(f for f in job.findings if f.id == "comm_not_overlapped")
    assert jf.cost_ns == 300 * US and jf.cost_ratio == pytest.approx(0.075)
    assert jf.severity == "low"


def test_collective_kinds_from_names():
    # kernel and host op names as they appear in the corpus (hta/, nsys-ai, our H200 fixtures)
    names = {
        "ncclKernel_AllReduce_RING_LL_Sum_float": "all_reduce",
        "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL": "reduce_scatter",
        "ncclDevKernel_AllGather_RING_LL": "all_gather",
        "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t": "send_recv",
        "ncclKernel_Broadcast_RING_LL_Sum_int": "broadcast",
        "nccl:_all_gather_base": "all_gather",
        "nccl:all_to_all": "all_to_all",
        "nccl:recv": "send_recv",
        "ncclDevKernel_Generic": "other",
        # DeepEP's expert-parallel all-to-all (deepseek-ai/profile-data train.json; DeepEP's own
        # namespace), not its layout kernel
        "void dpsk::ep::internode::combine<false, 8, __nv_bfloat16, 8, 2, 16, 24>": "all_to_all",
        "void deep_ep::internode_ll::dispatch<false, 3, 7168>": "all_to_all",
        "void dpsk::ep::cuda::get_dispatch_layout<256, 32, 8>": "other",
    }
    got = pl.DataFrame({"n": list(names)}).select(collective_kind(pl.col("n"))).to_series()
    assert got.to_list() == list(names.values())


def test_job_findings_graded_by_share_of_job():
    t = default_thresholds()
    hot = Finding("launch_bound", "high", "t", 30, 0.3, {}, "r")
    ranks = [RankFindings(0, 100, [hot]), RankFindings(1, 100, [])]
    (f,) = worst_per_rank(ranks, t)
    # 30 of rank 0's 100 is high there, but 30 of the job's 200 is 15%: medium
    assert f.cost_ratio == pytest.approx(0.15) and f.severity == "medium"
    assert f.evidence["worst_rank_severity"] == "high" and f.evidence["cost_by_rank_ns"] == {
        "0": 30
    }


def test_job_finding_never_above_its_worst_ranks_grade():
    """A public 9-rank NCCL job (session 34's audit): each rank's host_sync was low by its own
    replay, the costs summed over the ranks to 13.7% of the job's windows, medium. The ranks run
    side by side: the job gains at most what its best-placed rank does, so low."""
    t = default_thresholds()
    ranks = [
        RankFindings(r, 1600, [Finding("host_sync", "low", "t", 219, 219 / 1600, {}, "r")])
        for r in range(9)
    ]
    (f,) = worst_per_rank(ranks, t)
    assert f.cost_ratio == pytest.approx(9 * 219 / (9 * 1600))  # 13.7%: medium by share
    assert t.severity(f.cost_ratio) == "medium"
    assert f.severity == "low" and f.evidence["worst_rank_severity"] == "low"


STRAGGLE_MS = 30.0  # fixtures/generate/record.py: rank 1 busy-waits 30 ms before each backward


def test_straggler_fixture_charged_wait_matches_injected_delay():
    job = analyze_job(H200 / "ddp_straggler")
    truth = json.loads((H200 / "ddp_straggler" / "rank1.truth.json").read_text())
    injected_ns = sum(s["straggle_ms"] for s in truth["per_step"]) * 1e6  # 4 steps x 30 ms
    c = job.cross
    assert c.straggler_rank == 1 and c.straggler_steps == (3, 4, 5, 6)
    # rank 0's kernels spin 186.7 ms, but 55.7 ms of that is under its own backward
    assert c.wait_by_rank_ns["0"] > 1.5 * injected_ns
    assert c.charged_by_rank_ns["0"] == pytest.approx(injected_ns, rel=0.10)
    f = job.findings[0]
    assert f.id == "straggler" and f.severity == "high" and f.evidence["rank"] == 1
    # Rank 0 alone: its spinning is exposed communication, but its messages (the kernels' and
    # record_param_comms' sizes) move in a fraction of it even at 12.5 GB/s: at least 114 ms of
    # the 193 ms is waiting for the other rank, so the advice is the slow rank, and no saving
    # is priced from one rank (in the job it is the straggler's, and what is left, transfer,
    # ~6 ms of a 246 ms window, is minor)
    alone = analyze_trace(load_trace(H200 / "ddp_straggler" / "rank0.pt.trace.json.xz"))
    solo = next(f for f in alone.findings if f.id == "comm_not_overlapped")
    assert solo.cost_ns > injected_ns and solo.severity == "low"
    assert 0.5 * injected_ns < solo.evidence["peer_wait_ns"] < c.wait_by_rank_ns["0"]
    assert solo.recommendation == PEER_WAIT_ADVICE and solo.what_if is None
    assert "this rank waiting for the others" in solo.title
    # the late rank itself waits for nobody
    late = analyze_trace(load_trace(H200 / "ddp_straggler" / "rank1.pt.trace.json.xz"))
    assert late.results.comm.peer_wait_ns == 0
    rank0 = next(f for f in job.ranks[0].findings if f.id == "comm_not_overlapped")
    assert rank0.severity in ("info", "low")
    assert rank0.evidence["attributed_ns"] < 0.1 * injected_ns
    assert COMM_LESS_ADVICE not in rank0.recommendation


def _first_collectives(trace: Trace) -> pl.DataFrame:
    """Per GPU-aligned step: the first collective kernel's start and its launching call's start."""
    steps = pl.DataFrame(analyze_trace(trace).results.steps.per_step).select(
        "step", pl.col("start_ns").alias("s"), pl.col("end_ns").alias("e")
    )
    ev = trace.events
    kernels = names_matching(ev.filter(pl.col("kind") == "kernel"), f"(?i){COLLECTIVE_KERNEL}")
    first = (
        kernels.sort("start_ns")
        .join_asof(steps, left_on="start_ns", right_on="s")
        .filter(pl.col("start_ns") < pl.col("e"))
        .group_by("step")
        .agg(pl.col("start_ns").first(), pl.col("correlation").first())
    )
    calls = ev.filter(pl.col("kind").is_in(["runtime", "driver"])).select(
        "correlation", pl.col("start_ns").alias("launch_ns")
    )
    return first.join(calls, on="correlation").sort("start_ns")


def _delayed(ev: pl.DataFrame, cuts: pl.DataFrame, delay_ns: int, *, waits: bool) -> pl.DataFrame:
    """Every event after each cut moved ``delay_ns`` later (cumulative over the steps).

    The late rank (``waits=False``) moves from its first collective on (GPU) and from that
    collective's launch on (host): a delay before it reaches the collective. The waiting rank's
    first collective keeps its start and spins ``delay_ns`` longer, and its later GPU work moves
    after it, as when its GPU has nothing else to do. GPU rows move whole (no kernel is stretched
    over the waiting); host ranges that hold a cut stretch over it."""
    gcut, hcut = cuts["start_ns"].sort(), cuts["launch_ns"].sort()
    n_gpu = gcut.search_sorted(ev["start_ns"], side="left" if waits else "right")
    n_host_s = hcut.search_sorted(ev["start_ns"], side="right")
    n_host_e = hcut.search_sorted(ev["end_ns"], side="left")
    gpu = pl.col("kind").is_in(GPU_KINDS)
    cut = (pl.col("kind") == "kernel") & pl.col("correlation").is_in(cuts["correlation"].implode())
    s = pl.when(gpu).then(pl.lit(n_gpu)).otherwise(pl.lit(n_host_s)).cast(pl.Int64)
    e = pl.when(gpu).then(pl.lit(n_gpu).cast(pl.Int64) + (cut & waits).cast(pl.Int64))
    e = e.otherwise(pl.lit(n_host_e)).cast(pl.Int64)
    return ev.with_columns(
        pl.col("start_ns") + s * delay_ns, pl.col("end_ns") + e * delay_ns
    ).with_columns((pl.col("end_ns") - pl.col("start_ns")).alias("dur_ns"))


@pytest.mark.parametrize("delay_ms", [0.0, 25.0])
def test_shifted_variant_charges_the_known_delay(delay_ms):
    """ddp_overlap (balanced, no straggler) with rank 1 delayed before its first collective."""
    t0, t1 = (load_trace(H200 / "ddp_overlap" / f"rank{r}.pt.trace.json.xz") for r in (0, 1))
    delay_ns = int(delay_ms * 1e6)
    c0, c1 = _first_collectives(t0), _first_collectives(t1)
    assert c0.height == c1.height == 4
    ev = pl.concat(
        [
            _delayed(t0.events.with_columns(pl.lit(0, pl.Int32).alias("rank")), c0, delay_ns, waits=True),
            _delayed(t1.events.with_columns(pl.lit(1, pl.Int32).alias("rank")), c1, delay_ns, waits=False),
        ]
    ).sort("rank", "start_ns")  # fmt: skip
    job = analyze_trace_ranks(Trace(ev, t0.meta))
    c = job.cross
    if delay_ms == 0:
        assert c.straggler_rank is None and "straggler" not in [f.id for f in job.findings]
        return
    injected_ns = c0.height * delay_ns
    assert c.straggler_rank == 1 and c.straggler_steps == (3, 4, 5, 6)
    assert c.charged_by_rank_ns["0"] == pytest.approx(injected_ns, rel=0.10)
    # rank 0's comm finding keeps only the transfer: well under the delay it waited
    rank0 = next((f for f in job.ranks[0].findings if f.id == "comm_not_overlapped"), None)
    assert rank0 is None or rank0.cost_ns < 0.2 * injected_ns


def test_sampled_send_recv_kernels_take_their_host_ranges_kind():
    """hta/trace_filter (embedding model, 2 of 128 ranks, sampled): its 10 collectives a rank
    are ncclKernel_SendRecv kernels, whose launches link to no op. Read before as 10
    all-to-alls; session 53: each launch lies inside the host range that names its collective,
    on each rank 4 in nccl:all_to_all, 4 in nccl:all_reduce and 2 in nccl:_all_gather_base
    (counted from the raw events: the runtime call's correlation, its thread and time)."""
    path = SHARED / "hta" / "trace_filter"
    if not path.is_dir():
        pytest.skip("corpus absent")
    job = analyze_job(path)
    counts = {r: {k: v["count"] for k, v in kinds.items()} for r, kinds in job.cross.comm_split.items()}  # fmt: skip
    raw = {"all_to_all": 4, "all_reduce": 4, "all_gather": 2}
    assert counts == {"0": raw, "1": raw}
    f = next(f for f in job.findings if f.id == "comm_not_overlapped")
    assert f.evidence["most_exposed_kind"] == "all_gather"
    # the parameters' all-gather and the gradients' all-reduce: DDP's and FSDP's overlap
    assert f.recommendation == DDP_FSDP_ADVICE


def _payload(rank: int, lo_us: float, collectives: list[tuple[float, float]]) -> RankPayload:
    """One step [lo, 1000 us) with all-reduces given as (start, end) in us; no compute."""
    rows = [(ALL_REDUCE, "all_reduce", round(s * US), round(e * US), 1) for s, e in collectives]
    return RankPayload(
        rank=rank,
        window_ns=round((1000 - lo_us) * US),
        collectives=pl.DataFrame(rows, schema=COLLECTIVE_SCHEMA, orient="row"),
        step_times_ns=(round((1000 - lo_us) * US),),
        top_finding=None,
        steps=(1,),
        window_start_ns=round(lo_us * US),
        window_end_ns=1000 * US,
    )


def test_waiting_before_the_window_is_not_charged():
    # rank 0's window opens at 100 us, but its first all-reduce was queued at 50 and spins until
    # rank 1 arrives at 500: 400 us inside the window, not 450. Rank 1 entered the step at 0,
    # before rank 0, so there is no lead to subtract. The second all-reduce: rank 0 at 700,
    # rank 1 at 760 (60 us).
    c = analyze_cross_rank(
        [_payload(0, 100, [(50, 600), (700, 800)]), _payload(1, 0, [(500, 600), (760, 800)])]
    )
    assert c.matched_collectives == 2 and c.straggler_rank == 1
    assert c.wait_by_rank_ns == {"0": 460 * US, "1": 0}
    assert c.charged_by_rank_ns == {"0": 460 * US, "1": 0}
    assert c.transfer_by_rank_ns == {"0": 140 * US, "1": 140 * US}


def test_a_real_job_whose_straggler_enters_the_step_late():
    """facebookresearch/param's 8-rank DLRM job (fixtures/foreign/param_dlrm_8rank, audit 5):
    rank 7 enters its step 7.5 ms after rank 1 and arrives last at the first collectives. The
    waiting it causes, from the raw events (each rank's k-th NCCL kernel against rank 7's start,
    capped at the waiting kernel): 35.55 ms. Charged net of a lead at step entry it read
    10.35 ms (1.48 ms per rank, low); on one clock it is that wait less what hides behind
    compute. One step on every rank (session 53): a rank late once and one late every step look
    the same, so the finding is capped at medium and says so."""
    import lzma

    import orjson

    folder = FIXTURES / "foreign" / "param_dlrm_8rank"
    kernels = {}
    for f in sorted(folder.glob("*.json.xz")):
        doc = orjson.loads(lzma.decompress(f.read_bytes()))
        ks = [e for e in doc["traceEvents"] if e.get("cat") == "kernel" and "nccl" in e["name"].lower()]  # fmt: skip
        kernels[doc["distributedInfo"]["rank"]] = sorted(ks, key=lambda e: e["ts"])
    raw_us = 0.0
    for k in range(min(len(v) for v in kernels.values())):
        start = {r: ks[k]["ts"] for r, ks in kernels.items()}
        if max(start, key=start.get) == 7:
            raw_us += sum(
                max(0.0, min(start[7] - start[r], kernels[r][k]["dur"])) for r in start if r != 7
            )
    assert raw_us == pytest.approx(35_552, abs=1)
    job = analyze_job(folder)
    c = job.cross
    assert c.straggler_rank == 7 and set(c.clock_offset_by_rank_ns.values()) == {0}
    assert 0.95 * raw_us * 1e3 <= c.wait_caused_ns <= raw_us * 1e3
    f = next(f for f in job.findings if f.id == "straggler")
    assert f.severity == "medium" and job.findings[0] is f and c.common_steps == 1
    assert f.evidence["severity_cap_reason"].startswith("one step recorded on every rank")
    assert "wait 5.04 ms each" in f.title


def test_a_process_without_gpu_work_is_no_rank():
    """Audit 8: an nvFuser export's test runner (18 kernels) and a helper python3 process (2 CUDA
    calls, no GPU work) read as a two-rank job, rank 1 all "n/a". Left out, said in a warning."""
    from traceinsight.api import without_idle_processes

    r0, r1 = Events(rank=0, pid=1), Events(rank=1, pid=2)
    r0.kernel(GEMM, 10, 100, launch_us=1).kernel(GEMM, 200, 100, launch_us=150)
    r1.runtime("cudaGetDeviceCount", 5, 2).runtime("cudaFree", 20, 3)
    trace = Events(rows=r0.rows + r1.rows).trace("helper")
    one = without_idle_processes(trace)
    assert one.events["rank"].unique().to_list() == [0] and one.meta.world_size is None
    assert "1 process with no GPU work left out (ranks [1])" in one.meta.warnings[-1]
    # both with GPU work: the job as it is
    r1.kernel(GEMM, 10, 100, launch_us=1)
    both = Events(rows=r0.rows + r1.rows).trace("two")
    assert without_idle_processes(both) is both


def test_one_ranks_peer_wait_summed_over_its_raw_events():
    """The straggler fixture's waiting rank: each NCCL kernel's message (its own args, else its
    launch's record_param_comms op by External id), the bus bytes of its kind, the most moving
    them takes at 12.5 GB/s plus 100 us and 5 us a rank, and the time beyond it: summed over
    the raw JSON by hand, equal to the analyzer's to the nanosecond of rounding."""
    from traceinsight.analyzers.comm import COMM_DTYPE_BYTES

    from .conftest import raw_json

    path = H200 / "ddp_straggler" / "rank0.pt.trace.json.xz"
    doc = json.loads(raw_json(path))
    events = doc["traceEvents"]
    ops = {
        e["args"]["External id"]: e["args"]
        for e in events
        if e.get("name") == "record_param_comms" and "In msg nelems" in e.get("args", {})
    }
    launch_ext = {
        e["args"]["correlation"]: e["args"].get("External id")
        for e in events
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})
    }
    sized = wait = 0.0
    for e in events:
        if e.get("cat") != "kernel" or not e["name"].startswith("nccl"):
            continue
        a = e["args"]
        msg = a if "In msg nelems" in a else ops.get(launch_ext.get(a["correlation"]), {})
        p = msg.get("Group size", 0)
        if p < 2:
            continue
        kind = e["name"].lower()
        factor = 2 * (p - 1) / p if "allreduce" in kind else 1.0  # all-reduces and broadcasts
        assert "allreduce" in kind or "broadcast" in kind
        bus = msg["In msg nelems"] * COMM_DTYPE_BYTES[msg["dtype"]] * factor
        bound_us = bus / 12.5e9 * 1e6 + 100 + 5 * p
        sized += e["dur"]
        wait += max(0.0, e["dur"] - bound_us)
    comm = analyze_trace(load_trace(path)).results.comm
    assert comm.sized_comm_ns == pytest.approx(sized * 1e3, abs=1e3)
    assert comm.peer_wait_ns == pytest.approx(wait * 1e3, rel=1e-4)
    assert 100e6 < comm.peer_wait_ns < comm.sized_comm_ns  # 114 ms of 193 ms


def test_a_batch_lever_of_one_rank_is_no_job_lever():
    """Audit 15: a job's "[rank 1] a 2x batch would raise throughput 2.0x" came from one rank of
    two (the straggler fixture's late rank, host-bound by its planted busy-wait), while the ranks
    step together at the slowest one's pace: at most low, saying why."""
    job = analyze_job(H200 / "ddp_straggler")
    per_rank = {r.rank: {f.id for f in r.findings} for r in job.ranks}
    batch = next(f for f in job.findings if f.id == "small_batch")
    assert "small_batch" in per_rank[1] and "small_batch" not in per_rank[0]
    assert batch.severity == "low" and batch.evidence["severity_cap"] == "low"
    assert batch.evidence["severity_cap_reason"].startswith("only 1 of the job's 2 ranks")


MOE_COMBINE = "void dpsk::ep::internode::combine<false, 8, __nv_bfloat16>(int4*, float*)"
EXPERT_GEMM = "void cutlass::device_kernel<dpsk::grouped_gemm_kernel>(Params)"


def _overlapped_moe_step(comm_name: str = MOE_COMBINE, read_back: bool = False) -> Events:
    """Four 1000 us steps of one rank (audit 20's DeepSeek-V3 shape): the compute stream's GEMM
    [0, 900) us; the all-to-all kernel on stream 20 [100, 950) (850 us, 50 exposed after the
    GEMM); an expert GEMM on stream 23 launched at +10 but started at +600 (590 us the trace
    does not explain), [600, 800)."""
    ev = Events()
    for i in range(4):
        s = i * 1000
        ev.step(i, s, 1000)
        ev.kernel(GEMM, s, 900, launch_us=s)
        _collective(ev, comm_name, s + 100, 850, s + 20, "nccl:all_to_all")
        ev.kernel(EXPERT_GEMM, s + 600, 200, launch_us=s + 10, stream=23)
        if read_back:  # 8 bytes back to the host after the expert GEMM, on its stream
            ev.memcpy("DtoH", s + 805, 2, nbytes=8, src="device", dst="pageable", stream=23)
            ev.runtime("cudaMemcpyAsync", s + 20, 3, correlation=ev.rows[-1]["correlation"])
    return ev


@pytest.mark.parametrize("read_back", [False, True])
def test_overlapping_communication_frees_no_compute_stream(read_back: bool):
    """Audit 20 (DeepSeek-V3's rank 0: 4.16 ms of communication exposed, priced at 6.27 ms):
    comm_overlapped started every side stream's work at its launch, the expert GEMMs' own
    stream too. Only chains that communicate or copy are side work: the expert GEMM keeps its
    590 us delay and the saving stays within the exposed communication. A stream of compute
    with a small read-back among its kernels is no copy stream either (session 53: a 2023
    TorchRec rank's 8-byte device-to-host copies beside its kernels, priced 2.04x where 32 ms of
    communication a step is exposed): copy streams are mostly copies."""
    from traceinsight.causal import transforms

    from .test_replay import model_of

    m = model_of(_overlapped_moe_step(read_back=read_back))
    changed = transforms.comm_overlapped(m)
    assert changed is not None
    g = changed.gpu.with_columns(pl.col("name").cast(pl.String))
    expert = g.filter(pl.col("name") == EXPERT_GEMM)
    before = m.gpu.with_columns(pl.col("name").cast(pl.String)).filter(
        pl.col("name") == EXPERT_GEMM
    )
    assert expert["gap_ns"].to_list() == before["gap_ns"].to_list()
    assert (expert["gap_ns"] > 500 * US).all()
    comm = g.filter(pl.col("name") == MOE_COMBINE)
    assert (comm["gap_ns"] == 0).all()
    a = analyze_trace(_overlapped_moe_step(read_back=read_back).trace())
    f = next(f for f in a.findings if f.id == "comm_not_overlapped")
    assert f.evidence["exposed_comm_ns"] == 4 * 50 * US
    assert f.what_if.step_time_ns - f.what_if.step_time_after_ns <= 50 * US


def test_expert_all_to_all_gets_moe_advice_not_gradient_levers():
    """Audit 20: DeepEP's dispatch and combine (85% of the window, 94% overlapped) were told
    to "communicate less (gradient accumulation, ZeRO-2, bf16 gradient reduction)" beside a DDP
    snippet. An all-to-all named for expert parallelism gets MoE's levers and snippet; a
    gradient all-reduce exposed over a tenth of the window still gets "communicate less"."""
    from traceinsight.findings.rules import MOE_ALL_TO_ALL_ADVICE, MOE_COMM_PATTERN

    a = analyze_trace(_overlapped_moe_step().trace())
    f = next(f for f in a.findings if f.id == "comm_not_overlapped")
    assert f.evidence["comm_time_ratio"] >= 0.3
    assert f.recommendation.startswith(MOE_ALL_TO_ALL_ADVICE)
    # expert parallelism by its kernels' names, not any "dispatch" (an embedding's)
    names = {MOE_COMBINE: True, "fused_moe_kernel": True, "embedding_dispatch_kernel": False}
    assert {n: bool(re.search(MOE_COMM_PATTERN, n)) for n in names} == names
    assert COMM_LESS_ADVICE not in f.recommendation and "DDP(" not in f.snippet
    # the same shape, a gradient all-reduce, its last 300 us exposed (30% of the window)
    ev = Events()
    for i in range(4):
        s = i * 1000
        ev.step(i, s, 1000)
        ev.kernel(GEMM, s, 600, launch_us=s)
        # launched in backward (DDP's buckets): gradient reduction, not a forward's TP
        ev.op("autograd::engine::evaluate_function: AddmmBackward0", s + 10, 40)
        _collective(ev, ALL_REDUCE, s + 300, 600, s + 20, "nccl:all_reduce")
    # launched outside backward: a forward's collectives, tensor parallelism's advice and
    # snippet, not the DDP buckets' (session 41's review)
    fwd = Events(rows=[r for r in ev.rows if not str(r["name"]).startswith("autograd::")])
    tp = next(f for f in analyze_trace(fwd.trace()).findings if f.id == "comm_not_overlapped")
    assert "tensor/sequence parallelism" in tp.recommendation
    assert "_micro_pipeline_tp" in tp.snippet and "DDP(" not in tp.snippet
    g = next(f for f in analyze_trace(ev.trace()).findings if f.id == "comm_not_overlapped")
    assert g.evidence["most_exposed_kind"] == "all_reduce"
    assert g.evidence["exposed_comm_ratio"] == pytest.approx(0.3, abs=0.01)
    assert COMM_LESS_ADVICE in g.recommendation and "DDP(" in g.snippet


def test_a_manual_all_reduce_after_backward_is_gradient_reduction():
    """The DDP fixture without overlap all-reduces the gradients by hand after backward: none
    launched inside a backward op, so it read as a forward's tensor parallelism (its advice,
    and since session 41's review its snippet). Launched after the step's backward began, it
    is gradient reduction: DDP's buckets."""
    from traceinsight.findings.rules import DDP_FSDP_ADVICE

    a = analyze_trace(load_trace(H200 / "ddp_no_overlap" / "rank0.pt.trace.json.xz"))
    c = a.results.comm
    assert c.backward_comm_ratio == 0.0 and c.after_backward_comm_ratio == 1.0
    f = next(f for f in a.findings if f.id == "comm_not_overlapped")
    assert f.recommendation.startswith(DDP_FSDP_ADVICE) and "DDP(" in f.snippet


def _gloo_rank(folder: Path, rank: int, late_us: float) -> None:
    """One rank of a DDP job over gloo, 4 steps of 100 ms: a kernel of 10 ms launched at each
    step's start, then gloo's all-reduce as a host range (``gloo:all_reduce``) from the rank's
    arrival, 20 ms in plus ``late_us``, to the reduction's end at 70 ms on every rank."""
    events: list[dict[str, object]] = []
    for i in range(4):
        t = 100_000.0 * i
        events += [
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": f"ProfilerStep#{i + 1}",
                "ts": t,
                "dur": 99_000.0,
                "pid": 1,
                "tid": 1,
            },  # fmt: skip
            {
                "ph": "X",
                "cat": "cuda_runtime",
                "name": "cudaLaunchKernel",
                "ts": t + 10,
                "dur": 5.0,
                "pid": 1,
                "tid": 1,
                "args": {"correlation": i + 1},
            },  # fmt: skip
            {
                "ph": "X",
                "cat": "kernel",
                "name": "sgemm_128x64",
                "ts": t + 20,
                "dur": 10_000.0,
                "pid": 0,
                "tid": 7,
                "args": {"device": 0, "stream": 7, "correlation": i + 1},
            },  # fmt: skip
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": "gloo:all_reduce",
                "ts": t + 20_000 + late_us,
                "dur": 50_000.0 - late_us,
                "pid": 1,
                "tid": 9,
            },  # fmt: skip
        ]
    doc = {
        "schemaVersion": 1,
        "distributedInfo": {"backend": "gloo", "rank": rank, "world_size": 2},
        "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3", "numSms": 132}],
        "traceEvents": events,
    }
    (folder / f"rank{rank}.pt.trace.json").write_text(json.dumps(doc))


def test_a_gloo_jobs_straggler_from_its_host_ranges(tmp_path: Path) -> None:
    """Session 54: a 2-rank DDP job over gloo on one H100, rank 1 sleeping 30 ms a step, read
    no collective and no straggler (gpu_underutilized HIGH on rank 0 instead): gloo reduces on
    the host, its collectives are host ranges, not kernels. Its raw waits: rank 1 arrives
    30.4-31.0 ms after rank 0 at two buckets a step and 6.6-6.9 ms at the third, rank 0's waits
    192.86 ms in union; traceinsight charges 187.26 ms. Here rank 1 arrives 15 ms late at each
    of 4 steps, with no kernel during the waits: 60 ms charged."""
    _gloo_rank(tmp_path, 0, 0.0)
    _gloo_rank(tmp_path, 1, 15_000.0)
    job = analyze_job(tmp_path)
    c = job.cross
    assert c.matched_collectives == 4 and c.straggler_rank == 1
    assert c.charged_by_rank_ns["0"] == 4 * 15_000_000
    (f,) = [f for f in job.findings if f.id == "straggler"]
    assert f.evidence["rank"] == 1
