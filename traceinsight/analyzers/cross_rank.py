"""Cross-rank analysis of a job: stragglers, step-time skew, ranks whose diagnosis differs.

Input is per rank: the ordered collective kernels (name, kind, start, end, step) of its first GPU
(or, where it has none, gloo's collectives: host ranges that likewise span arrival to end),
the union of its compute kernels there, its window and its steps. Collectives are matched across
ranks per step and by order (the k-th collective of a step is the same operation on every rank,
as NCCL requires) and checked by kernel name. An NCCL kernel starts when its GPU reaches it and
spins until every rank has arrived, so each rank's kernel splits into waiting
``[start, last arrival)`` and transfer ``[last arrival, end)``. Waiting costs the rank only where
its GPU has nothing else to do: the part hidden behind its own compute (a bucket launched early in
backward) is not charged. What is charged to the straggler is that exposed waiting inside the
window, per step, with arrivals compared on one clock: each rank's clock offset is read off the
collectives' ends, which every rank reaches together.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from traceinsight.analyzers.comm import with_kinds
from traceinsight.analyzers.steps import StepTime
from traceinsight.model import intervals as iv
from traceinsight.model.classify import KERNEL_RULES, names_matching
from traceinsight.model.schema import GPU_ACTIVITY_KINDS, Trace
from traceinsight.report.format import plural

# A rank is the straggler when it causes this share of all exposed waiting (or more).
STRAGGLER_CAUSED_MIN_RATIO = 0.6
# Or the fewest ranks, at most this share of them, that cause it together (audit s61: a public
# Megatron TP8 job on A100s, ranks 0 and 6 last at 60 of 84 all-reduces, the others waiting
# 191-445 ms of a 610 ms step, read no straggler: rank 0 alone caused 52%)
STRAGGLER_SET_MAX_RATIO = 0.25
COLLECTIVE_SCHEMA = {
    "name": pl.String,
    "kind": pl.String,
    "start_ns": pl.Int64,
    "end_ns": pl.Int64,
    "step": pl.Int64,
}
INTERVAL_SCHEMA = {"start_ns": pl.Int64, "end_ns": pl.Int64}
COLLECTIVE_KERNEL = KERNEL_RULES[0][1]  # the communication rule's name pattern


@dataclass(frozen=True)
class RankPayload:
    rank: int
    window_ns: int
    collectives: pl.DataFrame  # COLLECTIVE_SCHEMA, time order, the rank's first GPU
    step_times_ns: tuple[int, ...]
    top_finding: str | None
    steps: tuple[int, ...] = ()  # step numbers of step_times_ns
    window_start_ns: int = 0
    window_end_ns: int = 0
    compute_busy: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=INTERVAL_SCHEMA))


def rank_payload(
    trace: Trace,
    per_step: Sequence[StepTime],
    window_ns: int,
    top_finding: str | None,
    rank: int,
) -> RankPayload:
    """The rank's collective kernels (by name: NCCL/RCCL, not helper kernels launched under a
    collective op) on its first GPU, each tagged with its kind and the step it ran in, and the
    union of that GPU's compute kernels in the window (what waiting can hide behind)."""
    ev = trace.events
    # the kernels' columns read here and by with_kinds, copied alone (not all of the table's)
    kernels = (
        ev.lazy()
        .filter(pl.col("kind") == "kernel")
        .select("name", "device", "start_ns", "end_ns", "correlation", "kernel_class")
        .collect()
    )
    comm = names_matching(kernels, f"(?i){COLLECTIVE_KERNEL}")
    steps = per_step
    if steps:
        lo, hi = min(s.start_ns for s in steps), max(s.end_ns for s in steps)
    else:
        gpu = ev.filter(pl.col("kind").is_in(GPU_ACTIVITY_KINDS))
        span = gpu if gpu.height else ev
        lo, hi = (int(span["start_ns"].min() or 0), int(span["end_ns"].max() or 0))
    compute = kernels.head(0)
    if comm.height:
        first_dev = comm["device"].min()
        comm = with_kinds(
            comm.filter(pl.col("device") == first_dev).sort("start_ns"),
            ev,
            trace.kernel_args,
        )
    elif (gloo := _gloo_ranges(ev)).height:  # no NCCL/RCCL kernel: gloo's host ranges
        comm = gloo
        first_dev = kernels["device"].min() if kernels.height else None
    if comm.height:
        compute = kernels.filter(
            (pl.col("device") == first_dev) & (pl.col("kernel_class") != "communication")
        )
        if steps:
            st = pl.DataFrame(
                {
                    "step": [s.step for s in steps],
                    "s_s": [s.start_ns for s in steps],
                    "s_e": [s.end_ns for s in steps],
                }
            )
            # A collective still running when the window opens is the first step's (its waiting
            # is clipped to the window): dropping it would pair the later ones off by one.
            comm = (
                comm.join_asof(st, left_on="start_ns", right_on="s_s", strategy="backward")
                .filter(
                    pl.when(pl.col("s_s").is_null())
                    .then(pl.col("end_ns") > lo)
                    .otherwise(pl.col("start_ns") < pl.col("s_e"))
                )
                .with_columns(pl.col("step").fill_null(st["step"][0]))
            )
        else:
            comm = comm.with_columns(pl.lit(0, pl.Int64).alias("step"))
    else:
        comm = comm.with_columns(pl.lit("other").alias("kind"), pl.lit(0, pl.Int64).alias("step"))
    return RankPayload(
        rank=rank,
        window_ns=window_ns,
        collectives=comm.select(list(COLLECTIVE_SCHEMA)).cast(COLLECTIVE_SCHEMA),
        step_times_ns=tuple(s.dur_ns for s in steps),
        top_finding=top_finding,
        steps=tuple(s.step for s in steps),
        window_start_ns=lo,
        window_end_ns=hi,
        # only where its collectives ran: a wait lies within its collective's span (what
        # _split overlaps with this), and the whole union is most of a long rank's summary
        compute_busy=iv.intersect(
            iv.clip(iv.union(compute), lo, hi), iv.clip(iv.union(comm), lo, hi)
        ),
    )


GLOO_PREFIX = "gloo:"


def _gloo_ranges(ev: pl.DataFrame) -> pl.DataFrame:
    """gloo's collectives (``gloo:all_reduce``, ...): host ranges, not kernels. gloo reduces on
    the host even for CUDA tensors, its range running from the rank's arrival to the reduction's
    end, as an NCCL kernel spins from its GPU's arrival (session 54: a 2-rank DDP job over gloo,
    one rank sleeping 30 ms a step, read no collective and no straggler)."""
    return (
        ev.lazy()
        .filter(
            (pl.col("kind") == "user_annotation")
            & pl.col("name").cast(pl.String).str.starts_with(GLOO_PREFIX)
        )
        .select(
            pl.col("name").cast(pl.String),
            pl.col("name").cast(pl.String).str.strip_prefix(GLOO_PREFIX).alias("kind"),
            "start_ns",
            "end_ns",
        )
        .sort("start_ns")
        .collect()
    )


# Collectives on one host end within a few microseconds of each other, not together (the H200
# DDP pair: medians 0.4-7.7 us apart, one arrival in 52 flipped by taking that out): a clock
# offset below this is such noise, not another host's clock.
CLOCK_OFFSET_MIN_NS = 50_000


@dataclass(frozen=True)
class CrossRankResult:
    ranks: tuple[int, ...]
    matched_collectives: int
    collective_counts: dict[str, int]
    name_mismatches: int
    straggler_rank: int | None
    straggler_last_ratio: float | None  # share of collectives at which it arrives last
    wait_caused_ns: int  # waiting charged to the straggler, summed over the other ranks
    wait_by_rank_ns: dict[str, int]  # time each rank's collectives spent waiting for peers
    straggler_steps: tuple[int, ...]  # steps in which it is charged waiting
    worst_collectives: tuple[dict[str, Any], ...]
    step_time_median_ns: dict[str, float | None]
    step_skew_mean_ns: float | None  # mean over steps of (slowest - fastest rank)
    differing_diagnosis: dict[str, str | None] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()
    # every late rank where several cause the waiting together (straggler_rank: the first)
    straggler_ranks: tuple[int, ...] = ()
    straggler_caused_ratio: float | None = None  # its share of all exposed waiting
    exposed_wait_by_rank_ns: dict[str, int] = field(default_factory=dict)  # not behind compute
    transfer_by_rank_ns: dict[str, int] = field(default_factory=dict)
    charged_by_rank_ns: dict[str, int] = field(default_factory=dict)  # to the straggler, net
    # each rank's clock against the others' (from the collectives' ends), taken out of arrivals
    clock_offset_by_rank_ns: dict[str, int] = field(default_factory=dict)
    # rank -> kind -> {count, wait_ns, exposed_wait_ns, transfer_ns}
    comm_split: dict[str, dict[str, dict[str, int]]] = field(default_factory=dict)
    job_step_ns: int = 0  # sum over common steps of the slowest rank's step (else widest window)
    wait_caused_ratio: float | None = None  # wait_caused_ns / (job_step_ns x waiting ranks)
    common_steps: int = 0  # the steps every rank recorded


def differing_tops(tops: dict[str, str | None]) -> dict[str, str | None]:
    """Ranks whose top finding differs from the most common one."""
    common = Counter(tops.values()).most_common(1)[0][0] if tops else None
    return {r: t for r, t in tops.items() if t != common}


def _steps(payloads: list[RankPayload]) -> tuple[int, float | None, int]:
    """Over the steps every rank has: the job's step time, the skew and how many."""
    rows = pl.DataFrame(
        {
            "rank": [p.rank for p in payloads for _ in p.steps],
            "step": [s for p in payloads for s in p.steps],
            "dur_ns": [s for p in payloads for s in p.step_times_ns[: len(p.steps)]],
        },
        schema={"rank": pl.Int64, "step": pl.Int64, "dur_ns": pl.Int64},
    )
    common = rows.filter(pl.col("rank").n_unique().over("step") == len(payloads))
    per_step = common.group_by("step").agg(
        pl.col("dur_ns").max().alias("hi"), pl.col("dur_ns").min().alias("lo")
    )
    widest = max((p.window_ns for p in payloads), default=0)
    job_step = int(per_step["hi"].sum()) if per_step.height else widest
    skew = float((per_step["hi"] - per_step["lo"]).mean()) if per_step.height > 0 else None
    return job_step, skew if len(payloads) > 1 else None, per_step.height


def _split(df: pl.DataFrame, payloads: list[RankPayload]) -> pl.DataFrame:
    """Each matched collective's waiting and transfer, clipped to the rank's window; the waiting
    made disjoint per rank (collectives on several streams can wait at once) and its part hidden
    behind the rank's compute."""
    win = pl.DataFrame(
        {
            "rank": [p.rank for p in payloads],
            "lo": [p.window_start_ns for p in payloads],
            "hi": [p.window_end_ns for p in payloads],
        },
        schema={"rank": pl.Int64, "lo": pl.Int64, "hi": pl.Int64},
    )
    clip = lambda e: e.clip(pl.col("lo"), pl.col("hi"))  # noqa: E731
    df = (
        df.join(win, on="rank")
        .with_columns(
            clip(pl.col("start_ns")).alias("w_s"),
            clip(pl.min_horizontal("last_start", "end_ns")).alias("w_e"),
            (clip(pl.col("end_ns")) - clip(pl.max_horizontal("start_ns", "last_start")))
            .clip(0, None)
            .alias("transfer_ns"),
        )
        .sort("rank", "w_s")
        .with_columns(
            pl.max_horizontal(
                "w_s", pl.col("w_e").cum_max().shift(1).over("rank").fill_null(pl.col("w_s"))
            ).alias("w_s")
        )
        .with_columns((pl.col("w_e") - pl.col("w_s")).clip(0, None).alias("wait_ns"))
    )
    parts = []
    busy = {p.rank: p.compute_busy for p in payloads}
    for (rank,), part in df.partition_by("rank", as_dict=True, maintain_order=True).items():
        waits = part.select(
            pl.col("w_s").alias("start_ns"), pl.max_horizontal("w_s", "w_e").alias("end_ns")
        )
        parts.append(part.with_columns(iv.overlap_with(waits, busy[rank]).alias("hidden_ns")))
    return pl.concat(parts).with_columns(
        (pl.col("wait_ns") - pl.col("hidden_ns")).clip(0, None).alias("exposed_wait_ns")
    )


def _by_rank(df: pl.DataFrame, col: str, ranks: tuple[int, ...]) -> dict[str, int]:
    got = dict(df.group_by("rank").agg(pl.col(col).sum()).iter_rows())
    return {str(r): int(got.get(r, 0)) for r in ranks}


def analyze_cross_rank(payloads: list[RankPayload]) -> CrossRankResult:
    payloads = sorted(payloads, key=lambda p: p.rank)
    ranks = tuple(p.rank for p in payloads)
    warnings: list[str] = []
    counts = {str(p.rank): p.collectives.height for p in payloads}

    medians: dict[str, float | None] = {}
    for p in payloads:
        s = pl.Series(p.step_times_ns, dtype=pl.Int64)
        medians[str(p.rank)] = float(s.median()) if s.len() else None
    job_step, skew, common_steps = _steps(payloads)

    differing = differing_tops({str(p.rank): p.top_finding for p in payloads})
    empty = CrossRankResult(
        ranks, 0, counts, 0, None, None, 0, {str(r): 0 for r in ranks}, (), (), medians, skew,
        differing, (), job_step_ns=job_step, common_steps=common_steps,
    )  # fmt: skip
    if len(payloads) < 2:
        return empty

    df = pl.concat(
        [
            p.collectives.select(list(COLLECTIVE_SCHEMA))
            .cast(COLLECTIVE_SCHEMA)
            .sort("start_ns")
            .with_columns(
                pl.lit(p.rank, pl.Int64).alias("rank"),
                pl.int_range(pl.len(), dtype=pl.Int64).over("step").alias("k"),
            )
            for p in payloads
        ]
    )
    # Match the k-th collective of each step across ranks; keep only (step, k) every rank has.
    df = df.filter(pl.col("rank").n_unique().over("step", "k") == len(payloads))
    n = df.height // len(payloads)
    unmatched = sum(counts.values()) - df.height
    if unmatched:
        warnings.append(
            f"{plural(unmatched, 'collective kernel')} without a counterpart on every rank "
            f"(steps {counts}): not matched"
        )
    if n == 0:
        return CrossRankResult(**{**empty.__dict__, "warnings": tuple(warnings)})
    # Each rank's clock against the others': a collective ends on every rank within
    # microseconds of the last arrival, so the median distance of a rank's ends from each
    # matched collective's median end is its clock's offset (ranks on other hosts read other
    # clocks; one host's ranks share one). Arrivals are compared on the common clock.
    # (two steps: a window inside a window of other keys is not evaluated as one)
    df = (
        df.with_columns(
            (pl.col("end_ns") - pl.col("end_ns").median().over("step", "k")).alias("_d")
        )
        .with_columns(pl.col("_d").median().over("rank").round().cast(pl.Int64).alias("clock_ns"))
        .with_columns(
            pl.when(pl.col("clock_ns").abs() >= CLOCK_OFFSET_MIN_NS)
            .then("clock_ns")
            .otherwise(0)
            .alias("clock_ns")
        )
        .with_columns((pl.col("start_ns") - pl.col("clock_ns")).alias("_arrival"))
    )
    df = df.with_columns(
        (pl.col("_arrival").max().over("step", "k") + pl.col("clock_ns")).alias("last_start"),
        pl.col("rank").sort_by("_arrival", "rank").last().over("step", "k").alias("last_rank"),
        pl.col("name").n_unique().over("step", "k").alias("names"),
    )
    clocks = df.group_by("rank").agg(pl.col("clock_ns").first())
    mismatches = df.filter(pl.col("names") > 1).select("step", "k").unique().height
    if mismatches:
        warnings.append(
            f"{plural(mismatches, 'matched collective')} with different kernel names across ranks"
        )
    df = _split(df, payloads)

    # The straggler: the rank whose late arrivals cause most of the exposed waiting, or the
    # fewest ranks (up to STRAGGLER_SET_MAX_RATIO of them) that cause it together.
    waited = df.filter(pl.col("rank") != pl.col("last_rank"))
    caused = waited.group_by("last_rank").agg(pl.col("exposed_wait_ns").sum().alias("caused"))
    caused = caused.sort(["caused", "last_rank"], descending=[True, False])
    total_caused = int(caused["caused"].sum()) if caused.height else 0
    cands: list[int] = []
    if total_caused:
        most = max(1, int(STRAGGLER_SET_MAX_RATIO * len(ranks)))
        cum = caused["caused"].cum_sum()
        k = int((cum < STRAGGLER_CAUSED_MIN_RATIO * total_caused).sum()) + 1
        cands = caused["last_rank"].head(min(k, most)).to_list()
    elif caused.height:
        cands = [caused["last_rank"][0]]
    cand = cands[0] if cands else None
    in_set = pl.col("last_rank").is_in(cands)
    set_ns = int(caused.filter(in_set)["caused"].sum()) if cands else 0
    share = set_ns / total_caused if total_caused else None
    last_ratio = (
        df.filter(pl.col("rank") == pl.col("last_rank"))
        .select(pl.col("rank").is_in(cands).mean())
        .item()
        if cand is not None
        else None
    )
    # Charged: per waiting rank and step, the exposed waiting (on the common clock) for the
    # candidate. A rank entering the step late is late: DLRM's rank 7 entered its step 7.5 ms
    # after rank 1 and kept the others waiting 5.1 ms each at the first all-to-all, which a
    # lead subtracted at step entry charged as 1.5 ms (audit 5); a clock's offset is taken out
    # by the collectives' ends instead.
    charged = pl.DataFrame(schema={"rank": pl.Int64, "step": pl.Int64, "charged_ns": pl.Int64})
    if cand is not None:
        charged = (
            waited.filter(in_set & ~pl.col("rank").is_in(cands))
            .group_by("rank", "step")
            .agg(pl.col("exposed_wait_ns").sum().alias("charged_ns"))
        )
    charged_total = int(charged["charged_ns"].sum()) if charged.height else 0
    straggler = (
        cand
        if share is not None and share >= STRAGGLER_CAUSED_MIN_RATIO and charged_total > 0
        else None
    )
    split = (
        df.group_by("rank", "kind")
        .agg(
            pl.len().alias("count"),
            pl.col("wait_ns").sum(),
            pl.col("exposed_wait_ns").sum(),
            pl.col("transfer_ns").sum(),
        )
        .sort("rank", "kind")
    )
    comm_split: dict[str, dict[str, dict[str, int]]] = {str(r): {} for r in ranks}
    for row in split.iter_rows(named=True):
        rank, kind = str(row.pop("rank")), str(row.pop("kind"))
        comm_split[rank][kind] = {k: int(v) for k, v in row.items()}
    worst = (
        waited.group_by("step", "k", "name", "kind", "last_rank")
        .agg(pl.col("wait_ns").sum(), pl.col("exposed_wait_ns").sum())
        .sort(["exposed_wait_ns", "step", "k"], descending=[True, False, False])
        .head(10)
    )
    hit_steps = charged.filter(pl.col("charged_ns") > 0)["step"].unique().sort().to_list()
    return CrossRankResult(
        ranks=ranks,
        matched_collectives=n,
        collective_counts=counts,
        name_mismatches=mismatches,
        straggler_rank=straggler,
        straggler_last_ratio=last_ratio,
        wait_caused_ns=charged_total if straggler is not None else 0,
        wait_by_rank_ns=_by_rank(df, "wait_ns", ranks),
        straggler_steps=tuple(hit_steps) if straggler is not None else (),
        worst_collectives=tuple(worst.iter_rows(named=True)),
        step_time_median_ns=medians,
        step_skew_mean_ns=skew,
        differing_diagnosis=differing,
        warnings=tuple(warnings),
        straggler_caused_ratio=share,
        wait_caused_ratio=(
            charged_total / (max(1, job_step) * max(1, len(ranks) - len(cands)))
            if straggler is not None
            else None
        ),
        straggler_ranks=tuple(cands) if straggler is not None else (),
        exposed_wait_by_rank_ns=_by_rank(df, "exposed_wait_ns", ranks),
        transfer_by_rank_ns=_by_rank(df, "transfer_ns", ranks),
        charged_by_rank_ns=_by_rank(charged, "charged_ns", ranks) if straggler is not None else {},
        clock_offset_by_rank_ns=_by_rank(clocks, "clock_ns", ranks),
        comm_split=comm_split,
        job_step_ns=job_step,
        common_steps=common_steps,
    )
