"""Findings: rules (data) that turn typed analyzer results into graded, ranked findings."""

from __future__ import annotations

from collections.abc import Mapping

# efficiency_rules imports rules.py first, so its rules register (and are checked) after those
from traceinsight.findings import efficiency_rules  # noqa: F401
from traceinsight.findings.job_rules import JOB_RULES, RankFindings, diagnose_job
from traceinsight.findings.model import (
    SEVERITIES,
    Finding,
    Rule,
    Severity,
    Thresholds,
    make_finding,
)
from traceinsight.findings.rules import RULES, diagnose

__all__ = [
    "JOB_RULES",
    "RULES",
    "SEVERITIES",
    "Finding",
    "RankFindings",
    "Rule",
    "Severity",
    "Thresholds",
    "default_thresholds",
    "diagnose",
    "diagnose_job",
    "make_finding",
    "thresholds",
]


def default_thresholds() -> Thresholds:
    return Thresholds.defaults([*RULES, *JOB_RULES])


def thresholds(overrides: Mapping[str, float] | None = None) -> Thresholds:
    """The defaults with ``overrides`` applied; ValueError names unknown keys."""
    return default_thresholds().with_overrides(overrides or {})
