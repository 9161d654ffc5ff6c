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
