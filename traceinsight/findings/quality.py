"""Data quality: a finding whose evidence rests on a failed trace-health check is downgraded
(one grade for a warning, to info for an error) and tagged ``data_quality`` with the reason."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from traceinsight.analyzers.health import HealthResult
from traceinsight.findings.model import SEVERITIES, Finding, ranked


def apply_data_quality(
    findings: list[Finding], health: HealthResult
) -> tuple[list[Finding], list[dict[str, Any]]]:
    """The findings, downgraded where a check they rest on failed, and the ``data_quality``
    block: check, severity, message, affected (finding ids)."""
    ids = {f.id for f in findings}
    block = [
        {
            "check": c["check"],
            "severity": c["severity"],
            "message": c["message"],
            "count": c["count"],
            "affected": [i for i in c["affects"] if i in ids],
        }
        for c in health.checks
    ]
    out = []
    for f in findings:
        failed = [c for c in block if f.id in c["affected"]]
        if not failed:
            out.append(f)
            continue
        sev = SEVERITIES.index(f.severity)
        down = len(SEVERITIES) - 1 if any(c["severity"] == "error" for c in failed) else sev + 1
        out.append(
            replace(
                f,
                severity=SEVERITIES[min(len(SEVERITIES) - 1, max(sev, down))],
                tags=(*f.tags, "data_quality"),
                evidence={**f.evidence, "data_quality": [c["check"] for c in failed]},
            )
        )
    return ranked(out), block


def rank_clock_skew(
    step_starts: dict[int, dict[int, int]], step_ns: int | None, job_findings: list[Finding]
) -> list[dict[str, Any]]:
    """The job's check: ranks' step starts (rank -> step -> start_ns) offset from each other by
    more than a whole step. Synchronous training keeps ranks within a step of each other (the
    collectives wait), so a larger steady offset is the clocks, not the work."""
    common = set.intersection(*(set(s) for s in step_starts.values())) if step_starts else set()
    if len(step_starts) < 2 or not common or not step_ns:
        return []
    ranks = sorted(step_starts)
    offsets = []
    for step in sorted(common):
        starts = sorted(step_starts[r][step] for r in ranks)
        mid = starts[len(starts) // 2]
        offsets.append([step_starts[r][step] - mid for r in ranks])
    # each rank's median offset over the steps: a steady clock offset, not one slow step
    per_rank = [sorted(o[i] for o in offsets)[len(offsets) // 2] for i in range(len(ranks))]
    skew_ns = max(per_rank) - min(per_rank)
    if skew_ns <= step_ns:
        return []
    worst = ranks[max(range(len(ranks)), key=lambda i: abs(per_rank[i]))]
    return [
        {
            "check": "rank_clock_skew",
            "severity": "warning",
            "message": f"ranks' steps start {skew_ns / 1e6:.2f} ms apart (rank {worst} most), more "
            f"than a whole step ({step_ns / 1e6:.2f} ms): their clocks differ, so cross-rank "
            "waits and the straggler are not measured right.",
            "count": len(common),
            "skew_ns": skew_ns,
            "affected": [f.id for f in job_findings],
        }
    ]
