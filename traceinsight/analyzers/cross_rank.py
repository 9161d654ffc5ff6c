"""Cross-rank analysis of a job: stragglers, step-time skew, ranks whose diagnosis differs.

Input is per rank: the ordered communication kernels (name, start, end) of its first GPU and its
step times. Collectives are matched across ranks by order (the j-th collective of every rank is
the same operation, as NCCL requires) and checked by kernel name. NCCL kernels start on each GPU
when that GPU reaches them and then spin until every rank has arrived, so the last rank to start
the j-th collective keeps the others waiting for ``max(start) - start_r``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from traceinsight.model import intervals as iv

# A rank is the straggler when it arrives last at this share of the collectives (or more).
STRAGGLER_LAST_SHARE = 0.6


@dataclass(frozen=True)
class RankPayload:
    rank: int
    window_ns: int
    collectives: tuple[
        tuple[str, int, int, int], ...
    ]  # (kernel name, start_ns, end_ns, step), time order
    step_times_ns: tuple[int, ...]
    step_starts_ns: tuple[int, ...]
    top_finding: str | None


@dataclass(frozen=True)
class CrossRankResult:
    ranks: tuple[int, ...]
    matched_collectives: int
    collective_counts: dict[str, int]
    name_mismatches: int
    straggler_rank: int | None
    straggler_last_ratio: float | None
    wait_caused_ns: int  # waiting the straggler imposes on the other ranks, summed
    wait_by_rank_ns: dict[str, int]  # time each rank spent waiting for later arrivals
    straggler_steps: tuple[int, ...]  # step numbers (ProfilerStep#N) in which it arrived last
    worst_collectives: tuple[dict[str, Any], ...]
    step_time_median_ns: dict[str, float | None]
    step_skew_mean_ns: float | None  # mean over steps of (slowest - fastest rank)
    differing_diagnosis: dict[str, str | None] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()


def analyze_cross_rank(payloads: list[RankPayload]) -> CrossRankResult:
    payloads = sorted(payloads, key=lambda p: p.rank)
    ranks = tuple(p.rank for p in payloads)
    warnings: list[str] = []
    counts = {str(p.rank): len(p.collectives) for p in payloads}

    medians: dict[str, float | None] = {}
    for p in payloads:
        s = pl.Series(p.step_times_ns, dtype=pl.Int64)
        medians[str(p.rank)] = float(s.median()) if s.len() else None
    steps = min((len(p.step_times_ns) for p in payloads), default=0)
    skew = None
    if steps and len(payloads) > 1:
        per_step = [
            max(p.step_times_ns[i] for p in payloads) - min(p.step_times_ns[i] for p in payloads)
            for i in range(steps)
        ]
        skew = sum(per_step) / steps

    tops = {str(p.rank): p.top_finding for p in payloads}
    common = Counter(tops.values()).most_common(1)[0][0] if tops else None
    differing = {r: t for r, t in tops.items() if t != common}

    rows = []
    for p in payloads:
        seen: dict[int, int] = {}
        for name, start, end, step in p.collectives:
            k = seen.get(step, 0)
            seen[step] = k + 1
            rows.append((p.rank, step, k, name, start, end))
    df = pl.DataFrame(
        rows,
        schema={
            "rank": pl.Int64,
            "step": pl.Int64,
            "k": pl.Int64,
            "name": pl.String,
            "start_ns": pl.Int64,
            "end_ns": pl.Int64,
        },
        orient="row",
    )
    # Match the k-th collective of each step across ranks; keep only (step, k) every rank has.
    full = (
        df.group_by("step", "k")
        .agg(pl.col("rank").n_unique().alias("n"))
        .filter(pl.col("n") == len(payloads))
    )
    unmatched = df.height - full.height * len(payloads)
    if unmatched:
        warnings.append(
            f"{unmatched} collective kernels had no counterpart on every rank (steps {counts}) and were not matched"
        )
    df = df.join(full.select("step", "k"), on=["step", "k"]).with_columns(
        (pl.col("step").rank("dense").cast(pl.Int64) * 1_000_000 + pl.col("k")).alias("j")
    )
    n = full.height
    if n == 0 or len(payloads) < 2:
        return CrossRankResult(
            ranks,
            0,
            counts,
            0,
            None,
            None,
            0,
            {str(r): 0 for r in ranks},
            (),
            (),
            medians,
            skew,
            differing,
            tuple(warnings),
        )
    per_j = df.group_by("j").agg(
        pl.col("start_ns").max().alias("last_start"),
        pl.col("rank").sort_by("start_ns", "rank").last().alias("last_rank"),
        pl.col("name").n_unique().alias("names"),
        pl.col("name").first().alias("name"),
    )
    df = df.join(per_j, on="j").with_columns(
        (pl.col("last_start") - pl.col("start_ns")).alias("wait_ns")
    )
    mismatches = int((per_j["names"] > 1).sum())
    if mismatches:
        warnings.append(
            f"{mismatches} matched collectives have different kernel names across ranks"
        )
    # A rank waits over [its start, the last arrival] of each collective; consecutive collectives'
    # waits overlap, so the time waited is the union of those intervals, not their sum.
    waits = df.filter(pl.col("wait_ns") > 0).select(
        "rank", "last_rank", "start_ns", pl.col("last_start").alias("end_ns")
    )
    wait_by_rank = {str(r): 0 for r in ranks}
    if waits.height:
        for r, w in (
            iv.union(waits, by=["rank"])
            .group_by("rank")
            .agg((pl.col("end_ns") - pl.col("start_ns")).sum())
            .iter_rows()
        ):
            wait_by_rank[str(r)] = int(w)
    # ties (replicated or symmetric ranks) resolve the same way on every run
    last_counts = (
        per_j.group_by("last_rank").len().sort(["len", "last_rank"], descending=[True, False])
    )
    cand, cand_n = last_counts.row(0)
    share = cand_n / n
    blamed = waits.filter((pl.col("last_rank") == cand) & (pl.col("rank") != cand))
    caused = (
        iv.total(iv.union(blamed, by=["rank"]).select("start_ns", "end_ns")) if blamed.height else 0
    )
    straggler = cand if share >= STRAGGLER_LAST_SHARE and caused > 0 else None
    steps_hit = set(
        df.filter((pl.col("last_rank") == cand) & (pl.col("rank") == cand))["step"].to_list()
    )
    worst = (
        df.filter(pl.col("rank") != pl.col("last_rank"))
        .group_by("j", "name", "last_rank")
        .agg(pl.col("wait_ns").sum().alias("wait_ns"))
        .sort(["wait_ns", "j"], descending=[True, False])
        .head(10)
    )
    return CrossRankResult(
        ranks=ranks,
        matched_collectives=n,
        collective_counts=counts,
        name_mismatches=mismatches,
        straggler_rank=straggler,
        straggler_last_ratio=share,
        wait_caused_ns=caused if straggler is not None else 0,
        wait_by_rank_ns=wait_by_rank,
        straggler_steps=tuple(sorted(steps_hit)) if straggler is not None else (),
        worst_collectives=tuple(worst.iter_rows(named=True)),
        step_time_median_ns=medians,
        step_skew_mean_ns=skew,
        differing_diagnosis=differing,
        warnings=tuple(warnings),
    )
