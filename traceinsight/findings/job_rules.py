"""The job rules: what only several ranks side by side show (the straggler), each rank's
communication findings on the transfer part alone, and each per-rank finding once, at its worst
rank, graded by its share of the whole job."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from traceinsight.analyzers import Results
from traceinsight.analyzers.comm import CommResult
from traceinsight.analyzers.cross_rank import CrossRankResult
from traceinsight.constants import FRAMEWORKS, Framework
from traceinsight.findings.model import (
    SEVERITIES,
    Advice,
    Draft,
    Finding,
    Rule,
    Thresholds,
    make_finding,
    ranked,
)
from traceinsight.findings.rules import RULES, RuleInput
from traceinsight.report.format import fmt_ms, fmt_pct

# The single-trace rules that read communication time: in a job they see only the transfer part.
COMM_RULES = ("comm_not_overlapped",)


@dataclass(frozen=True)
class RankFindings:
    rank: int
    window_ns: int  # the window the rank's findings were graded against (ns x devices)
    findings: Sequence[Finding]


def _straggler(cross: CrossRankResult, t: Thresholds) -> tuple[Draft, int] | None:
    """The waiting charged to the last-arriving rank, against the job's step time on each rank
    that waits."""
    if cross.straggler_rank is None:
        return None
    late = cross.straggler_ranks or (cross.straggler_rank,)
    waiting = max(1, len(cross.ranks) - len(late))
    job_ns = max(1, cross.job_step_ns) * waiting
    if (cross.wait_caused_ratio or 0) < t["straggler_wait_ratio"]:
        return None
    others = {r: v for r, v in cross.charged_by_rank_ns.items() if int(r) not in late}
    who = (
        f"Rank {late[0]} is a straggler: the other ranks wait "
        if len(late) == 1
        else f"Ranks {', '.join(map(str, late[:-1]))} and {late[-1]} are stragglers, last to "
        f"arrive at {fmt_pct(cross.straggler_last_ratio or 0)} of the collectives together: "
        "the other ranks wait "
    )
    by_kind = {
        r: {k: v["exposed_wait_ns"] for k, v in kinds.items() if v["exposed_wait_ns"]}
        for r, kinds in cross.comm_split.items()
        if r in others
    }
    draft = Draft(
        cross.wait_caused_ns,
        f"{who}{fmt_ms(cross.wait_caused_ns / waiting)} each for "
        f"{'it' if len(late) == 1 else 'them'} in collectives "
        f"({fmt_pct(cross.wait_caused_ns / job_ns)} of the job's step time)",
        {
            "rank": cross.straggler_rank,
            "ranks": list(late),
            "steps": list(cross.straggler_steps),
            "wait_caused_ns": cross.wait_caused_ns,
            "charged_by_rank_ns": others,
            "wait_by_kind_ns": by_kind,
            "clock_offset_by_rank_ns": cross.clock_offset_by_rank_ns,
            "wait_by_rank_ns": cross.wait_by_rank_ns,
            "exposed_wait_by_rank_ns": cross.exposed_wait_by_rank_ns,
            "caused_ratio": cross.straggler_caused_ratio,
            "last_ratio": cross.straggler_last_ratio,
            "matched_collectives": cross.matched_collectives,
            "worst_collectives": list(cross.worst_collectives[:5]),
            "job_step_ns": cross.job_step_ns,
            "step_time_median_ns": cross.step_time_median_ns,
            "common_steps": cross.common_steps,
        },
        # one step cannot tell a rank late every step from one late once (its profiler
        # started late, a one-off pause): a public 8-rank DLRM capture of one step, 26.4 of its
        # 35.25 ms of waiting at the step's first collective, read HIGH (session 53)
        **({"cap": "medium", "cap_reason": ONE_STEP_CAP_REASON} if cross.common_steps == 1 else {}),
    )
    return draft, job_ns


ONE_STEP_CAP_REASON = (
    "one step recorded on every rank: a rank late in every step and one late once (its "
    "profiler started late, a one-off pause) look the same; record several steps"
)


STRAGGLER = Rule(
    "straggler",
    _straggler,
    "Find what the slow rank does before each collective that the others do not: uneven data "
    "shards or sequence lengths, extra host work (logging, checkpointing on rank 0/1), a slower "
    "or throttled GPU, a noisy neighbour on its host.",
    "# compare ranks side by side: traceinsight analyze TRACE_DIR\n"
    "# balance work: pad/bucket sequences, move rank-specific logging off the step",
    {"straggler_wait_ratio": 0.05},
    advice={
        "cuda_app": Advice(
            "Find what the slow rank does before each collective that the others do not: an "
            "uneven domain decomposition, extra host work (I/O or output on one rank), a slower "
            "or throttled GPU, a noisy neighbour on its host.",
            "# compare ranks side by side: traceinsight analyze TRACE_DIR\n"
            "# balance the decomposition: as much work (cells, particles) on every rank",
        )
    },
    no_estimate="the straggler's cause (uneven shards, extra host work, a slower GPU) is on "
    "one rank; its cost is the waiting it causes on the others, measured, not replayed",
)
JOB_RULES: list[Rule] = [STRAGGLER]


def transfer_split(
    comm: CommResult, split: Mapping[str, Mapping[str, int]], window_ns: int
) -> CommResult | None:
    """The rank's communication without its waiting for peers (``split``: kind -> {wait_ns,
    exposed_wait_ns, ...}): the transfer time, its exposed part and the share of it that
    overlaps compute; None where there is no waiting to take out. The job report's rank table
    and the rank's communication finding both read this one quantity."""
    wait = sum(v["wait_ns"] for v in split.values())
    exposed_wait = sum(v["exposed_wait_ns"] for v in split.values())
    if wait == 0 or comm.comm_compute_overlap_ratio is None:
        return None
    comm_ns = max(0, comm.comm_ns - wait)
    exposed = max(0, comm.exposed_comm_ns - exposed_wait)
    by_kind = {
        k: {
            **v,
            "comm_ns": max(0, v["comm_ns"] - split.get(k, {}).get("wait_ns", 0)),
            "exposed_ns": max(0, v["exposed_ns"] - split.get(k, {}).get("exposed_wait_ns", 0)),
        }
        for k, v in comm.by_kind.items()
    }
    return replace(
        comm,
        comm_ns=comm_ns,
        exposed_comm_ns=exposed,
        comm_compute_overlap_ratio=(comm_ns - exposed) / comm_ns if comm_ns else None,
        exposed_comm_ratio=exposed / window_ns,
        comm_time_ratio=comm_ns / window_ns,
        by_kind=by_kind,
        # the job measured the waits across ranks: the one-rank bound on them is spent
        sized_comm_ns=0,
        transfer_bound_ns=0,
        peer_wait_ns=0,
    )


def transfer_only(
    results: Results,
    findings: Sequence[Finding],
    split: Mapping[str, Mapping[str, int]],
    t: Thresholds,
    framework: Framework = FRAMEWORKS[0],
) -> list[Finding]:
    """The rank's findings with the communication rules re-run on its transfer time: waiting
    for a late peer is the straggler's (charged there), and no overlap or bucketing on this rank
    would remove it. ``split`` is the rank's kind -> {wait_ns, exposed_wait_ns, ...}."""
    window = results.idle.device_window_ns
    adjusted = transfer_split(results.comm, split, window)
    if adjusted is None:
        return list(findings)
    wait = sum(v["wait_ns"] for v in split.values())
    exposed_wait = sum(v["exposed_wait_ns"] for v in split.values())
    kept = [f for f in findings if f.id not in COMM_RULES]
    x = RuleInput(replace(results, comm=adjusted), t, window, kept, framework)
    redone = []
    for rule in (r for r in RULES if r.id in COMM_RULES and r.applies(framework)):
        draft = rule.check(x)
        if draft is not None:
            # the rank's own replay cannot tell transfer from waiting for peers: the cost is
            # the transfer time left once the waits are charged to the straggler
            # its overlap is of the transfer time: the title says so, and the per-GPU table
            # (collective time with the waiting in it) is left out so no two shares disagree
            evidence = {k: v for k, v in draft.evidence.items() if k != "per_device"}
            draft = replace(
                draft,
                title=draft.title.replace(
                    " of it overlaps",
                    " of its transfer time (waiting for peers excluded) overlaps",
                    1,
                ),
                evidence=dict(
                    evidence,
                    comm_wait_ns=wait,
                    exposed_wait_ns=exposed_wait,
                    attributed_ns=int(draft.cost_ns),
                    why_no_estimate="waiting for peers: the straggler finding's fix comes first; "
                    "the cost is the transfer time left once the waits are charged to it",
                ),
            )
            redone.append(make_finding(rule, draft, window, t, framework))
    return ranked(kept + redone)


# per-rank findings whose fix changes what every rank does (the batch): a lever for the job only
# where every rank has it
ONE_RANK_LEVERS = frozenset({"small_batch", "memory_headroom"})


def worst_per_rank(ranks: Sequence[RankFindings], t: Thresholds) -> list[Finding]:
    """Each per-rank finding once: the worst rank's title and evidence, the cost summed over the
    ranks that have it and graded against every rank's window (its share of the job), never
    above the most severe grade a rank gave it: the ranks run side by side, so the job gains
    at most what its best-placed rank's own replay does (an NCCL job's 9 ranks, each host_sync
    low, summed to medium before)."""
    caps = {r.id: r for r in RULES}
    job_window = sum(max(1, r.window_ns) for r in ranks)
    best: dict[str, tuple[Finding, int]] = {}
    for r in ranks:
        for f in r.findings:
            if f.id not in best or f.cost_ns > best[f.id][0].cost_ns:
                best[f.id] = (f, r.rank)
    out = []
    for f, rank in best.values():
        costs = {str(r.rank): x.cost_ns for r in ranks for x in r.findings if x.id == f.id}
        rule = caps.get(f.id) or Rule(
            f.id, lambda _x: None, f.recommendation, f.snippet, no_estimate="a rank's finding"
        )
        graded = make_finding(rule, Draft(sum(costs.values()), f.title, f.evidence), job_window, t)
        rank_worst = min(
            (x.severity for r in ranks for x in r.findings if x.id == f.id), key=SEVERITIES.index
        )
        severity = max(graded.severity, rank_worst, key=SEVERITIES.index)
        extra: dict[str, object] = {}
        if f.id in ONE_RANK_LEVERS and len(costs) < len(ranks):
            # a larger batch raises the job's rate only where every rank has the headroom: the
            # ranks step together, at the slowest one's pace (audit 15: "[rank 1] a 2x batch
            # would raise throughput 2.0x" beside rank 0's wait no batch shortens)
            severity = max(severity, "low", key=SEVERITIES.index)
            extra = {
                "severity_cap": "low",
                "severity_cap_reason": f"only {len(costs)} of the job's {len(ranks)} ranks have "
                "it: the ranks step together, at the slowest one's pace",
            }
        out.append(
            replace(
                f,
                severity=severity,
                cost_ns=graded.cost_ns,
                cost_ratio=graded.cost_ratio,
                title=f"[rank {rank}] {f.title}",
                evidence=dict(
                    f.evidence,
                    worst_rank=rank,
                    ranks=[int(r) for r in costs],
                    cost_by_rank_ns=costs,
                    worst_rank_severity=rank_worst,
                    **extra,
                ),
            )
        )
    return out


def diagnose_job(
    cross: CrossRankResult,
    ranks: Sequence[RankFindings],
    t: Thresholds,
    framework: Framework = FRAMEWORKS[0],
) -> list[Finding]:
    """The job's findings: the straggler (with ``framework``'s advice), then each per-rank
    finding once."""
    out: list[Finding] = []
    hit = _straggler(cross, t)
    if hit is not None:
        draft, job_ns = hit
        found = make_finding(STRAGGLER, draft, job_ns, t, framework)
        why = {**found.evidence, "why_no_estimate": STRAGGLER.no_estimate}
        out.append(replace(found, evidence=why))
    # By severity, then the priced before the unpriced (as in one trace: a lever with a fix
    # and a saving before idle no rule explains; audit 15), the straggler among the priced
    # (its fix is the wait every rank's collectives show), then share of the job: costs summed
    # over different numbers of ranks compare only as shares.
    return sorted(
        ranked(out + worst_per_rank(ranks, t)),
        key=lambda f: (
            SEVERITIES.index(f.severity),
            f.what_if is None and f.id != "straggler",
            -f.cost_ratio,
        ),
    )
