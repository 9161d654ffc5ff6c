"""Findings: rules (data) that turn typed analyzer results into graded, ranked findings."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace

from traceinsight.analyzers import Results
from traceinsight.causal.whatif import WhatIf
from traceinsight.constants import FRAMEWORKS, IDLE_CAUSES, Framework

# memory_rules imports rules.py first, so its rules register after rules.py's own
# efficiency_rules imports rules.py first, so its rules register (and are checked) after those
from traceinsight.findings import (
    efficiency_rules,  # noqa: F401
    memory_rules,  # noqa: F401
    savings,
)
from traceinsight.findings import rules as _rules
from traceinsight.findings.job_rules import JOB_RULES, RankFindings, diagnose_job
from traceinsight.findings.model import (
    SEVERITIES,
    Finding,
    Rule,
    Severity,
    Thresholds,
    make_finding,
    ranked,
)
from traceinsight.findings.rules import RULES, one_shot

__all__ = [
    "JOB_RULES",
    "RULES",
    "SEVERITIES",
    "Finding",
    "RankFindings",
    "Rule",
    "Severity",
    "Thresholds",
    "all_fixes",
    "combined_fixes",
    "selected_fixes",
    "default_thresholds",
    "diagnose",
    "diagnose_job",
    "make_finding",
    "thresholds",
]


# Steady-state findings a first pass's one-time costs feed (launches that load modules, cuDNN's
# first-call setup, the cache filling): in a cold window they are no lever, at most low.
COLD_CAPPED = (
    "launch_bound",
    "host_sync",
    "gpu_underutilized",
    "allocator_churn",
    "step_time_variance",
    "small_batch",
    "memory_headroom",
    # a process's first collectives set up and connect, and wait for the others to start
    "comm_not_overlapped",
)


# A one-shot program whose streams each ran one kernel copied each input once, for that
# kernel: nothing to keep resident on the device, and a buffer pinned for its one copy pays
# the page-locking the pinned rate saves (sessions 53-54: public nsys exports of a vectorAdd
# read pageable_memcpy MEDIUM and copy_bound HIGH for 0.95 and 2.01 ms of a 1.08 s and a
# 542 ms capture, where cudaHostAlloc alone took 316.7 ms). Not where a stream ran several:
# a Perlmutter saxpy copies its two 262 MB arrays around each of its 5 kernels, and pinned
# once they would serve all 5 passes.
ONE_SHOT_COPIES = ("copy_bound", "pageable_memcpy")

CAP_REASONS = {
    "cold_window": "the window is (part of) a first pass: its one-time costs are not a steady "
    "step's, so no steady-state lever is graded above low (record after warm-up)",
    "one_shot": "one pass of a small program (under 10 kernels, no steps): nothing in it repeats",
    "one_shot_copies": "one pass of a small program (under 10 kernels, no steps, one kernel a "
    "stream): each input is copied once, for one kernel, so nothing can stay resident and a "
    "buffer pinned for its one copy pays its page-locking (cudaHostAlloc, cudaHostRegister), "
    "which no saving here counts",
}


def diagnose(
    results: Results, t: Thresholds, framework: Framework = FRAMEWORKS[0]
) -> list[Finding]:
    """Every rule that applies to ``framework`` on one trace's results, with its advice for
    that framework, each finding's cost the saving the causal model predicts for its fix
    (findings/savings.py), ranked: ``[0]`` is the biggest lever."""
    found = _rules.diagnose(results, t, framework)
    priced = savings.with_savings(found, results, RULES, t, results.idle.device_window_ns)
    once = one_shot(results)
    if results.idle.cold_window:
        priced = _capped(priced, "cold_window", COLD_CAPPED)
    elif once:
        priced = _capped(priced, "one_shot", COLD_CAPPED)
    # a one-shot program's first pass is often cold too: its copies are capped either way
    if once and results.kernels.kernels_per_stream_max == 1:
        priced = _capped(priced, "one_shot", ONE_SHOT_COPIES, reason="one_shot_copies")
    return _symptom_after_cause(priced)


def _symptom_after_cause(findings: list[Finding]) -> list[Finding]:
    """step_time_variance never outranks the cause that produces it (its ``caused_by`` idle
    cause's finding): after it and graded low at most, since that finding's fix removes
    the variance and its saving is counted there (a public T4 loop read dataloader_stall HIGH,
    2.00x, and its variance HIGH too, 1.36x, for the same waits: session 53)."""
    var = next((f for f in findings if f.id == "step_time_variance"), None)
    cause = IDLE_CAUSES.get(var.evidence.get("caused_by") or "") if var else None
    by_id = {f.id: f for f in findings}
    if var is None or cause is None or cause not in by_id:
        return findings
    top = by_id[cause]
    worst = max(SEVERITIES.index(var.severity), SEVERITIES.index(top.severity))
    sev = SEVERITIES[max(worst, SEVERITIES.index(SYMPTOM_MAX_SEVERITY))]
    evidence = var.evidence
    if sev != var.severity:
        evidence = {**evidence, "severity_cap_reason": SYMPTOM_CAP_REASON.format(cause=cause)}
    # never before its cause: ranked() moves it after, and every later re-ranking keeps that
    changed = replace(var, severity=sev, evidence=evidence)
    return ranked([changed if f is var else f for f in findings])


SYMPTOM_MAX_SEVERITY = "low"
SYMPTOM_CAP_REASON = (
    "a symptom of {cause}: the steps vary with its idle, and its fix removes the variance "
    "(the saving is counted there)"
)


def _capped(
    findings: list[Finding], tag: str, ids: tuple[str, ...], reason: str | None = None
) -> list[Finding]:
    """In a cold window (or a one-shot program's) the findings ``ids`` are at most low,
    tagged ``tag``, with ``CAP_REASONS[reason or tag]`` where that lowered the grade."""
    low = SEVERITIES.index("low")
    out = [
        replace(
            f,
            severity=SEVERITIES[max(SEVERITIES.index(f.severity), low)],
            tags=(*f.tags, tag),
            # said where it lowered the grade (audit 17: an MI250 toy's launch_bound LOW beside
            # "2.68x predicted", its cold_window tag printed by no report)
            evidence={**f.evidence, "severity_cap_reason": CAP_REASONS[reason or tag]}
            if SEVERITIES.index(f.severity) < low
            else f.evidence,
        )
        if f.id in ids
        else f
        for f in findings
    ]
    return ranked(out)


def all_fixes(results: Results, findings: list[Finding]) -> WhatIf | None:
    """Every finding's fix applied together and replayed once (findings/savings.py)."""
    return savings.all_fixes(results, findings)


def combined_fixes(results: Results, findings: Iterable[Finding]) -> WhatIf | None:
    """These findings' fixes (as their what-ifs carry them) applied together, replayed once."""
    return savings.combined(results, findings)


def selected_fixes(results: Results, findings: list[Finding], ids: Iterable[str]) -> WhatIf | None:
    """The chosen findings' fixes (by id) applied together and replayed once; the ids of this
    trace's findings only (``unknown_fixes`` says which are not)."""
    wanted = set(ids)
    return savings.combined(results, [f for f in findings if f.id in wanted])


def default_thresholds() -> Thresholds:
    return Thresholds.defaults([*RULES, *JOB_RULES])


def thresholds(overrides: Mapping[str, float] | None = None) -> Thresholds:
    """The defaults with ``overrides`` applied; ValueError names unknown keys."""
    return default_thresholds().with_overrides(overrides or {})
