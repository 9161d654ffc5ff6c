"""The combined what-if of a chosen set of fixes: one replay of their transforms together.

Each finding's ``what_if`` replays its own fix alone and ``details.what_if.all_fixes`` every
fix at once (findings/savings.py). Between the two, a user (or an agent) asks "what if I fix
only these?": :func:`predict_fixes` applies the chosen findings' transforms (their
``what_if.transform``, causal/transforms.py) to the un-profiled step model and replays it once, so
the saving of fixes that overlap is counted once, as in ``all_fixes``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from traceinsight.analysis import JobAnalysis, TraceAnalysis
from traceinsight.errors import InputError
from traceinsight.findings import selected_fixes


@dataclass(frozen=True)
class FixesWhatIf:
    """The un-profiled step's median before and after the chosen fixes, replayed together."""

    fixes: tuple[str, ...]  # finding ids, as chosen (duplicates dropped)
    transforms: tuple[str, ...]  # their transforms, each once, in the order applied
    step_time_ns: int
    step_time_after_ns: int
    speedup: float | None
    # a transform whose own replay stopped before settling: the saving is a lower bound
    lower_bound: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "fixes": list(self.fixes),
            "transforms": list(self.transforms),
            "step_time_ns": self.step_time_ns,
            "step_time_after_ns": self.step_time_after_ns,
            "saving_ns": max(0, self.step_time_ns - self.step_time_after_ns),
            "speedup": self.speedup,
            "lower_bound": self.lower_bound,
        }


def predict_fixes(analysis: TraceAnalysis | JobAnalysis, finding_ids: Iterable[str]) -> FixesWhatIf:
    """The chosen findings' fixes replayed together on ``analysis``'s step model.

    Raises :class:`InputError` (one line) for an empty choice, an id that is not a finding of
    this analysis, a finding whose fix has no transform of the step model, and an analysis
    without a step model (a job, ``--no-replay``, a trace without steps)."""
    where = str(analysis.source.get("path"))
    if isinstance(analysis, JobAnalysis):
        raise InputError("a what-if replays one rank's step model: choose a rank", where)
    ids = tuple(dict.fromkeys(finding_ids))
    if not ids:
        raise InputError("no fixes chosen: give one or more finding ids", where)
    by_id = {f.id: f for f in analysis.findings}
    unknown = [fid for fid in ids if fid not in by_id]
    if unknown:
        known = ", ".join(by_id) or "none"
        raise InputError(f"no finding {unknown[0]!r} in this analysis (findings: {known})", where)
    rp = analysis.results.replay
    if rp is not None and rp.model is None and rp.unprofiled_step_ns is not None:
        # a job's ranks come back from worker processes without their models (detached())
        raise InputError("this rank's step model was not kept: analyze the rank's own file", where)
    if rp is None or rp.model is None or rp.unprofiled_step_ns is None:
        raise InputError("no step model to replay (no steps or GPU work, or --no-replay)", where)
    for fid in ids:
        f = by_id[fid]
        if f.what_if is None or f.what_if.transform is None:
            why = f.evidence.get("why_no_estimate") or (
                "its what_if is its analyzer's own arithmetic, not a change of the step model"
            )
            raise InputError(f"finding {fid!r} has no fix to replay: {why}", where)
    w = selected_fixes(analysis.results, analysis.findings, ids)
    before = round(rp.unprofiled_step_ns)
    chosen = [by_id[i] for i in ids]
    # a choice that changes nothing in the model saves nothing (as a rule's unchanged fix)
    return FixesWhatIf(
        fixes=ids,
        transforms=w.transforms or () if w else (),
        step_time_ns=w.step_time_ns if w else before,
        step_time_after_ns=w.step_time_after_ns if w else before,
        speedup=w.speedup if w else 1.0,
        lower_bound=any(f.evidence.get("what_if_lower_bound") for f in chosen),
    )
