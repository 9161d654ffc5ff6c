"""Every finding's cost as the time its fix would save, predicted by the causal step model.

A rule detects a cause and attributes time to it (its evidence); what the fix would save comes
from one model: the finding's transform (:data:`FIXES`, see model/whatif.py) applied to the
un-profiled step model and replayed (analyzers/replay.py). ``cost_ns`` becomes that saving over
the window, the severity its share of the step, the order by saving; the attributed time stays
in the evidence (``attributed_ns``). All the fixes together are one combined replay
(:func:`all_fixes`), so the savings never add up to more than the step. Findings without a
transform keep their attributed cost and say why in ``evidence.why_no_estimate``.
docs/FINDINGS.md lists each finding's transform and its assumptions.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from types import MappingProxyType
from typing import Any

import polars as pl

from traceinsight.analyzers import Results
from traceinsight.causal import transforms as whatif
from traceinsight.causal.graph import StepModel
from traceinsight.constants import SEVERITIES
from traceinsight.findings.model import Finding, Rule, Thresholds, ranked

# finding id -> the what-if transform of its fix (model/whatif.py TRANSFORMS)
FIXES: Mapping[str, str] = MappingProxyType(
    {
        "host_sync": "remove_syncs",
        "dataloader_stall": "dataloader_floor",
        "pageable_memcpy": "pinned_copies",
        "h2d_not_overlapped": "h2d_overlapped",
        "launch_bound": "cuda_graphs",
        "elementwise_heavy": "elementwise_fused",
        "unfused_optimizer": "fused_optimizer",
        "fp32_compute": "bf16_gemms",
        "recompute_overhead": "recompute_removed",
        "comm_not_overlapped": "comm_overlapped",
        "allocator_churn": "no_empty_cache",
        # expandable segments end the cudaMalloc/cudaFree calls as keeping the cache does
        "memory_fragmentation": "no_empty_cache",
    }
)
# finding id -> why no transform estimates its fix
NO_ESTIMATE: Mapping[str, str] = MappingProxyType(
    {
        "comm_heavy": "communicating less changes the parallelism or the model; no transform of "
        "the traced step predicts it",
        "copy_bound": "moving fewer bytes changes the program (what stays on the GPU, the input "
        "format); no transform of the traced step predicts it",
        "low_occupancy": "raising a kernel's occupancy depends on its code (registers, shared "
        "memory, grid); whether it then runs faster is not in the trace",
        "gpu_underutilized": "no single fix: the other findings' what_if and "
        "details.what_if.all_fixes predict what their fixes save",
        "memory_growth": "a leak costs no time until the device is full: graded by the steps "
        "until then (evidence.steps_until_full)",
    }
)


def _unchanged(step_ns: float) -> dict[str, Any]:
    return {"step_time_ns": round(step_ns), "step_time_after_ns": round(step_ns), "speedup": 1.0}


def _steady_steps(r: Results) -> dict[str, Any] | None:
    """step_time_variance: every step as fast as the median one (no replay: the steps'
    own times say it), mean step -> median step."""
    s = r.steps
    if not s.steps or s.step_time_median_ns is None or s.step_time_mean_ns is None:
        return None
    mean, median = float(s.step_time_mean_ns), float(s.step_time_median_ns)
    if median <= 0:
        return None
    return {
        "step_time_ns": round(mean),
        "step_time_after_ns": round(min(mean, median)),
        "speedup": mean / min(mean, median),
    }


# finding id -> an estimate that needs no replay
DIRECT: Mapping[str, Callable[[Results], dict[str, Any] | None]] = MappingProxyType(
    {"step_time_variance": _steady_steps}
)


# finding id -> the estimate its analyzer made with its own transform, or why there is none
OWN: Mapping[str, Callable[[Results], tuple[dict[str, Any] | None, str | None]]] = MappingProxyType(
    {
        "memory_headroom": lambda r: r.memory.headroom_what_if(),
        # the unaligned GEMMs at the rate of aligned ones of similar size, replayed
        "gemm_shape_inefficient": lambda r: (
            r.efficiency.unaligned_gemm_what_if,
            None
            if r.efficiency.unaligned_gemm_what_if is not None
            else "no step model: the saving is the GEMMs' time at the aligned rate",
        ),
    }
)


# findings whose sources each get the what-if of a fix at that one call site
PER_SITE = frozenset({"host_sync"})
PER_SITE_MAX = 3  # the costliest sites only: each is one more replay


def _per_site(r: Results, sources: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The finding's sources, the costliest each with ``what_if``: its syncs alone removed."""
    sites, rp = r.sources.sites, r.replay
    if sites is None or rp is None or sites.height == 0:
        return sources
    out = []
    for i, s in enumerate(sources):
        if i >= PER_SITE_MAX:
            out.append(s)
            continue
        calls = sites.filter(
            (pl.col("location") == s.get("location")) & (pl.col("trigger") == s.get("trigger"))
        )
        w = rp.predict(whatif.remove_syncs_at(calls)) if calls.height else None
        out.append({**s, "what_if": w})
    return out


def what_if_of(finding_id: str, r: Results) -> tuple[dict[str, Any] | None, str | None]:
    """The finding's predicted fix (None with the reason where there is none)."""
    if finding_id in OWN:
        return OWN[finding_id](r)
    if finding_id in DIRECT:
        w = DIRECT[finding_id](r)
        return (w, None) if w is not None else (None, "the trace has no steps to compare")
    name = FIXES.get(finding_id)
    if name is None:
        return None, NO_ESTIMATE.get(finding_id, "no transform of the step model for this fix")
    rp = r.replay
    if rp is None or rp.unprofiled_step_median_ns is None:
        return None, "no step model: the trace has no steps or no GPU work to replay"
    # a transform that changes nothing in the model (what_if absent) saves nothing
    return rp.what_if.get(name) or _unchanged(rp.unprofiled_step_median_ns), None


def with_savings(
    findings: Iterable[Finding], r: Results, rules: Iterable[Rule], t: Thresholds, window_ns: int
) -> list[Finding]:
    """``findings`` with cost_ns = predicted saving over ``window_ns`` (the window summed over
    devices), severity from the saving's share of the step, ranked by saving."""
    caps = {rule.id: rule.cap for rule in rules}
    out = []
    for f in findings:
        w, why = what_if_of(f.id, r)
        if w is None:
            out.append(replace(f, evidence={**f.evidence, "why_no_estimate": why}))
            continue
        before, after = float(w["step_time_ns"]), float(w["step_time_after_ns"])
        ratio = min(1.0, max(0.0, 1.0 - after / before)) if before > 0 else 0.0
        sev = t.severity(ratio)
        cap = caps.get(f.id)
        if cap and SEVERITIES.index(sev) < SEVERITIES.index(cap):
            sev = cap
        evidence = {**f.evidence, "attributed_ns": f.cost_ns}
        if f.id in FIXES:
            evidence["transform"] = FIXES[f.id]
            if r.replay is not None and FIXES[f.id] in r.replay.unconverged:
                # the replay stopped before the change reached every blocking call
                evidence["what_if_lower_bound"] = True
        if f.id in PER_SITE and evidence.get("sources"):
            evidence["sources"] = _per_site(r, evidence["sources"])
        out.append(
            replace(
                f,
                severity=sev,
                cost_ns=int(ratio * window_ns),
                cost_ratio=ratio,
                what_if=w,
                evidence=evidence,
            )
        )
    return ranked(out)


def all_fixes(r: Results, findings: Iterable[Finding]) -> dict[str, Any] | None:
    """Every finding's transform applied together and replayed once: the combined saving
    (with the transforms applied, in finding order)."""
    rp = r.replay
    names = [FIXES[f.id] for f in findings if f.id in FIXES and f.cost_ns > 0]
    if rp is None or not names:
        return None
    steps = [whatif.TRANSFORMS[n] for n in dict.fromkeys(names) if n in whatif.TRANSFORMS]

    def combined(m: StepModel) -> StepModel | None:
        changed = False
        for step in steps:
            nxt = step(m)
            if nxt is not None:
                m, changed = nxt, True
        return m if changed else None

    w = rp.predict(combined)
    return None if w is None else {**w, "transforms": list(dict.fromkeys(names))}
