"""The job rules: what only several ranks side by side show (the straggler), and each per-rank
finding once, at its worst rank."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from traceinsight.analyzers.cross_rank import CrossRankResult
from traceinsight.findings.model import Draft, Finding, Rule, Thresholds, make_finding, ranked


@dataclass(frozen=True)
class RankFindings:
    rank: int
    window_ns: int
    findings: Sequence[Finding]


def _straggler(
    cross: CrossRankResult, ranks: Sequence[RankFindings], t: Thresholds
) -> tuple[Draft, int] | None:
    """The waiting the last-arriving rank causes, over the other ranks' windows."""
    if cross.straggler_rank is None:
        return None
    window = max([r.window_ns for r in ranks] or [1]) or 1
    window_all = window * max(1, len(ranks) - 1)
    if cross.wait_caused_ns / window_all < t["straggler_wait_ratio"]:
        return None
    draft = Draft(
        cross.wait_caused_ns,
        f"Rank {cross.straggler_rank} is a straggler: it arrives last at {100 * (cross.straggler_last_ratio or 0):.0f}% of "
        f"collectives, making the other ranks wait {cross.wait_caused_ns / 1e6:.2f} ms in NCCL",
        {
            "rank": cross.straggler_rank,
            "steps": list(cross.straggler_steps),
            "wait_caused_ns": cross.wait_caused_ns,
            "last_ratio": cross.straggler_last_ratio,
            "wait_by_rank_ns": cross.wait_by_rank_ns,
            "matched_collectives": cross.matched_collectives,
            "worst_collectives": list(cross.worst_collectives[:5]),
            "step_time_median_ns": cross.step_time_median_ns,
        },
    )
    return draft, window_all


STRAGGLER = Rule(
    "straggler",
    _straggler,
    "Find what the slow rank does before each collective that the others do not: uneven data "
    "shards or sequence lengths, extra host work (logging, checkpointing on rank 0/1), a slower "
    "or throttled GPU, a noisy neighbour on its host.",
    "# compare ranks side by side: traceinsight analyze TRACE_DIR\n"
    "# balance work: pad/bucket sequences, move rank-specific logging off the step",
    {"straggler_wait_ratio": 0.05},
)
JOB_RULES: list[Rule] = [STRAGGLER]


def worst_per_rank(ranks: Sequence[RankFindings]) -> list[Finding]:
    """Each per-rank finding once: the worst rank's (by cost), naming every rank that has it."""
    best: dict[str, tuple[Finding, int]] = {}
    for r in ranks:
        for f in r.findings:
            if f.id not in best or f.cost_ns > best[f.id][0].cost_ns:
                best[f.id] = (f, r.rank)
    out = []
    for f, rank in best.values():
        having = [r.rank for r in ranks if any(x.id == f.id for x in r.findings)]
        out.append(
            replace(
                f,
                title=f"[rank {rank}] {f.title}",
                evidence=dict(f.evidence, worst_rank=rank, ranks=having),
            )
        )
    return out


def diagnose_job(
    cross: CrossRankResult, ranks: Sequence[RankFindings], t: Thresholds
) -> list[Finding]:
    """The job's findings, ranked: the straggler, then each per-rank finding once."""
    out: list[Finding] = []
    hit = _straggler(cross, ranks, t)
    if hit is not None:
        draft, window_all = hit
        out.append(make_finding(STRAGGLER, draft, window_all, t))
    return ranked(out + worst_per_rank(ranks))
