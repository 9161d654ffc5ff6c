"""Findings: rules (data) that turn typed analyzer results into graded, ranked findings."""

from __future__ import annotations

from collections.abc import Mapping

from traceinsight.analyzers import Results
from traceinsight.causal.whatif import WhatIf

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
)
from traceinsight.findings.rules import RULES

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
    "default_thresholds",
    "diagnose",
    "diagnose_job",
    "make_finding",
    "thresholds",
]


def diagnose(results: Results, t: Thresholds) -> list[Finding]:
    """Every rule on one trace's results, each finding's cost the saving the causal model
    predicts for its fix (findings/savings.py), ranked: ``[0]`` is the biggest lever."""
    found = _rules.diagnose(results, t)
    return savings.with_savings(found, results, RULES, t, results.idle.device_window_ns)


def all_fixes(results: Results, findings: list[Finding]) -> WhatIf | None:
    """Every finding's fix applied together and replayed once (findings/savings.py)."""
    return savings.all_fixes(results, findings, RULES)


def default_thresholds() -> Thresholds:
    return Thresholds.defaults([*RULES, *JOB_RULES])


def thresholds(overrides: Mapping[str, float] | None = None) -> Thresholds:
    """The defaults with ``overrides`` applied; ValueError names unknown keys."""
    return default_thresholds().with_overrides(overrides or {})
