"""What a finding is, how it is graded, and the shape of a rule that makes one.

A rule is data: an id, a check (results in, a :class:`Draft` or None out), its recommendation,
its snippet and its own thresholds. :func:`make_finding` turns a draft into a graded
:class:`Finding` the same way for single traces and for jobs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from traceinsight.causal.whatif import WhatIf
from traceinsight.constants import FRAMEWORKS, IDLE_CAUSES, SEVERITIES, Framework, Severity
from traceinsight.records import jsonable

__all__ = [
    "SEVERITIES",
    "Advice",
    "Draft",
    "Finding",
    "Rule",
    "Severity",
    "Thresholds",
    "make_finding",
    "ranked",
]
# Severity from the cost's share of the window (summed over devices).
GRADING: Mapping[str, float] = MappingProxyType(
    {"high_ratio": 0.25, "medium_ratio": 0.10, "low_ratio": 0.03}
)


@dataclass(frozen=True)
class Finding:
    id: str
    severity: Severity
    title: str
    cost_ns: int
    cost_ratio: float
    evidence: dict[str, Any]
    recommendation: str
    snippet: str = ""
    tags: tuple[str, ...] = ()
    snippet_language: str = "python"  # what the snippet is written in (a fence's language)
    # the causal model's prediction for this finding's fix (None where nothing predicts it:
    # evidence.why_no_estimate says why)
    what_if: WhatIf | None = None

    def to_json(self) -> dict[str, Any]:
        return jsonable(self)


@dataclass(frozen=True)
class Thresholds:
    """Every rule's thresholds and the grading ones, by name; overridable (``--threshold``)."""

    values: Mapping[str, float]

    def __getitem__(self, name: str) -> float:
        return self.values[name]

    @classmethod
    def defaults(cls, rules: Iterable[Rule]) -> Thresholds:
        merged = dict(GRADING)
        for r in rules:
            merged.update(r.thresholds)
        return cls(MappingProxyType(merged))

    def with_overrides(self, overrides: Mapping[str, float]) -> Thresholds:
        unknown = set(overrides) - set(self.values)
        if unknown:
            raise ValueError(
                f"unknown threshold(s): {', '.join(sorted(unknown))}; "
                f"valid names: {', '.join(sorted(self.values))}"
            )
        return Thresholds(
            MappingProxyType({**self.values, **{k: float(v) for k, v in overrides.items()}})
        )

    def severity(self, ratio: float) -> Severity:
        if ratio >= self["high_ratio"]:
            return "high"
        if ratio >= self["medium_ratio"]:
            return "medium"
        if ratio >= self["low_ratio"]:
            return "low"
        return "info"


@dataclass(frozen=True)
class Draft:
    """What a rule's check found: the cost, the title, the evidence (and, where the advice
    depends on what was found, the recommendation)."""

    cost_ns: float
    title: str
    evidence: dict[str, Any]
    recommendation: str | None = None
    snippet: str | None = None  # where the code to change depends on what was found
    # the most severe grade this finding may get where what was found puts its fix out of
    # reach (recorded in the evidence as ``severity_cap``); the rule's own cap still holds
    cap: Severity | None = None
    # why (recorded as ``severity_cap_reason``; audit 15: one fixed "the advised fix is out of
    # reach" for every cap, where memory_headroom's was a batch that would not double the rate)
    cap_reason: str | None = None
    # where what was found changes another framework's advice too: that framework's, before
    # the rule's declared one
    advice: Mapping[str, Advice] = field(default_factory=dict)


@dataclass(frozen=True)
class Advice:
    """A rule's recommendation and snippet for one framework (constants.FRAMEWORKS)."""

    recommendation: str
    snippet: str = ""
    language: str = "cpp"  # the snippet's (CUDA C++ for a CUDA/HIP application)


# A rule's own estimate of what its fix saves: the what-if, or None with the reason.
Estimate = Callable[[Any], "tuple[WhatIf | None, str | None]"]


@dataclass(frozen=True)
class Rule:
    """A rule and its fix's prediction, declared once and exactly once: ``fix`` (the name of a
    causal/transforms.py transform, replayed on the un-profiled model), ``estimate`` (the rule's
    own, from the results), or ``no_estimate`` (why nothing predicts it). ``per_site``: each
    of the finding's call sites also gets the fix at that site alone (a ``fix`` that removes
    blocking calls). ``advice``: the recommendation and snippet for each framework but the
    default (``pytorch``, the rule's own and the draft's), None where the rule does not apply
    to that framework's programs (it reads what only they record: it is not checked)."""

    id: str
    check: Callable[..., Draft | None]
    recommendation: str
    snippet: str = ""
    thresholds: Mapping[str, float] = field(default_factory=dict)
    cap: Severity | None = None  # the most severe grade this finding may get
    fix: str | None = None
    estimate: Estimate | None = None
    no_estimate: str | None = None
    per_site: bool = False
    advice: Mapping[str, Advice | None] = field(default_factory=dict)
    # the fix saves GPU time alone (kernels shorter or gone, the host as it is): where no step
    # model prices it, graded by what the window's GPU timeline would save (findings/savings.py)
    gpu_work: bool = False

    def applies(self, framework: Framework) -> bool:
        return framework == FRAMEWORKS[0] or self.advice.get(framework, Advice("")) is not None

    def __post_init__(self) -> None:
        declared = [x for x in (self.fix, self.estimate, self.no_estimate) if x is not None]
        if len(declared) != 1:
            raise ValueError(f"rule {self.id} declares {len(declared)} of fix/estimate/no_estimate")


def capped(sev: Severity, *caps: Severity | None) -> Severity:
    """``sev``, no more severe than any of ``caps`` (None: no cap)."""
    for cap in caps:
        if cap and SEVERITIES.index(sev) < SEVERITIES.index(cap):
            sev = cap
    return sev


def make_finding(
    rule: Rule, draft: Draft, window_ns: int, t: Thresholds, framework: Framework = FRAMEWORKS[0]
) -> Finding:
    """Grade ``draft`` by its cost's share of ``window_ns`` (capped by the rule); the advice is
    the framework's (the draft's and the rule's own are the default framework's)."""
    ratio = min(1.0, max(0.0, draft.cost_ns / max(1, window_ns)))
    sev = capped(t.severity(ratio), rule.cap, draft.cap)
    advice = _advice(rule, draft, framework)
    evidence = {**draft.evidence, "severity_cap": draft.cap} if draft.cap else draft.evidence
    if draft.cap and draft.cap_reason:
        evidence["severity_cap_reason"] = draft.cap_reason
    return Finding(
        rule.id,
        sev,
        draft.title,
        int(draft.cost_ns),
        ratio,
        evidence,
        advice.recommendation,
        advice.snippet,
        snippet_language=advice.language,
    )


def _advice(rule: Rule, draft: Draft, framework: Framework) -> Advice:
    """The advice for ``framework``: the rule's declared advice for it, or for the default
    framework (PyTorch, Python snippets) the draft's (what was found) before the rule's own."""
    declared = rule.advice.get(framework) if framework != FRAMEWORKS[0] else None
    declared = draft.advice.get(framework, declared)
    if declared is not None:
        return declared
    return Advice(
        draft.recommendation or rule.recommendation,
        rule.snippet if draft.snippet is None else draft.snippet,
        "python",
    )


# Evidence of a finding whose check every other prediction rests on: it ranks first among its
# severity. Workers that kept up with the profiled step only (findings/rules.py): each other
# fix's saving needs them to deliver faster than the trace shows (held-out DCGAN and the
# torchmetrics loop: more workers measured the largest lever, 1.13-1.89x and 1.90-2.26x, where
# this finding's own point is 1.00x and its upper end 2.78x and 3.08x). Not where a pin-memory
# thread shows the workers fast (findings/savings.py workers_shown_fast: the same loop fed
# tensors, where more workers measured 0.89-1.02x)
CHECK_FIRST = "loader_unverified_speedup"


def ranked(findings: Iterable[Finding]) -> list[Finding]:
    """By severity, then the predicted savings (``what_if``) before the costs no model
    estimates (attributed time, not what a fix saves), each by size: ``[0]`` is the biggest
    lever (ties keep rule order), a check the others rest on (:data:`CHECK_FIRST`) first
    among its severity. A symptom (step_time_variance, whose ``caused_by`` idle
    cause has a finding here) comes right after its cause's finding, whatever its saving:
    every re-ranking keeps that (a data-quality pass had put a loader's variance before the
    loader's own finding)."""
    out = sorted(
        findings,
        key=lambda f: (
            SEVERITIES.index(f.severity),
            CHECK_FIRST not in f.evidence,
            f.what_if is None,
            -f.cost_ns,
        ),
    )
    ids = [f.id for f in out]
    for i, f in enumerate(out):
        cause = IDLE_CAUSES.get(f.evidence.get("caused_by") or "") if f.evidence else None
        if cause is not None and cause in ids and ids.index(cause) > i:
            out.insert(ids.index(cause), out.pop(i))
            break
    return out
