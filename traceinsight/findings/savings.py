"""Every finding's cost as the time its fix would save, predicted by the causal step model.

A rule detects a cause and attributes time to it (its evidence); what the fix would save is
what the rule declares (findings/model.py :class:`Rule`): its ``fix``, a transform of
causal/transforms.py applied to the un-profiled step model and replayed (analyzers/replay.py);
its own ``estimate``; or, with ``no_estimate``, why there is none. ``cost_ns`` becomes that
saving over the window, the severity its share of the step, the order by saving; the
attributed time stays in the evidence (``attributed_ns``). All the fixes together are one
combined replay (:func:`all_fixes`), so the savings never add up to more than the step.
Findings without a prediction keep their attributed cost and say why in
``evidence.why_no_estimate``. docs/FINDINGS.md lists each finding's transform and its
assumptions.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import replace

import polars as pl

from traceinsight.analyzers import Results
from traceinsight.analyzers.sources import Source
from traceinsight.causal import transforms
from traceinsight.causal.whatif import (
    LOADER_ASSUMED_THROUGHPUT,
    LOADER_BOUND_MIN_SPEEDUP,
    LoaderPlan,
    WhatIf,
    loader_plan,
)
from traceinsight.constants import SEVERITIES, Severity
from traceinsight.findings.model import Finding, Rule, Thresholds, capped, ranked
from traceinsight.report.format import fmt_ms

# all fixes below the best single fix by more than this: a fix slows the others (all_fixes)
SLOWER_TOGETHER_MIN_RATIO = 0.005
PER_SITE_MAX = 3  # the costliest call sites only: each is one more replay
UNPRICED_CAP = SEVERITIES.index("low")  # a fix the replay cannot price: at most this
# The fixes of the loader itself: every other one leaves a loader that bounds the step bounding it
LOADER_TRANSFORMS = frozenset({"dataloader_floor", "dataloader_unpinned"})


def loader_bound_ns(r: Results) -> int | None:
    """The step as run, where DataLoader workers bound it: they deliver a batch at that
    interval whatever the rest of the step takes, so a fix of anything else moves its saving
    into the step thread's wait for the next batch (the timm loop with 3 workers: bf16 and
    channels_last measured 0.71-1.05x, no per-step syncs 0.88-0.98x, pinned copies 0.96-1.07x,
    where the replay gave 1.11-1.31x). The waits are those beyond receiving each batch (the
    replay's ``dataloader_unpinned``): a ViT fed by 4 workers spends 1.4 ms a step in
    ``__next__`` receiving 2 tensors, not waiting, and its compile measured 1.19-1.22x. None
    where the step thread loads (its loading is work on the step's path, which the replay
    keeps) or the waits are not the bound."""
    waits = loader_waits(r)
    if waits is None or (waits.speedup or 0) < LOADER_BOUND_MIN_SPEEDUP:
        return None
    return waits.step_time_ns


def loader_plan_of(r: Results) -> LoaderPlan | None:
    """The loader's plan from the replay's step with its waits hidden (causal/whatif.py)."""
    rp = r.replay
    hidden = rp.what_if.get("dataloader_floor") if rp is not None else None
    if hidden is None:
        return None
    return loader_plan(
        hidden.step_time_ns,
        hidden.step_time_after_ns,
        r.steps.loader_iterator,
        rp.batch_tensors,
        r.steps.loader_calls_per_step,
    )


def loader_fixed_interval_ns(r: Results) -> int | None:
    """The step the loader's fix delivers batches at, at its stated assumption (twice the
    rate: :data:`LOADER_ASSUMED_THROUGHPUT`): where the step thread loads, its loading
    shared by two workers; where workers bound the step, half their interval. None where
    the trace does not show the loader's rate (workers that kept up)."""
    plan = loader_plan_of(r)
    if plan is None:
        return None
    if plan.loading_per_batch_ns is not None:
        # (each worker's loading and its sending of the tensors: causal/whatif.py)
        sent = plan.receive_step_ns
        loading = plan.loading_per_batch_ns * plan.batches_per_step + sent
        return round(max(loading / LOADER_ASSUMED_THROUGHPUT, sent))
    if loader_bound_ns(r) is None:
        return None
    return round(plan.batch_interval_ns / LOADER_ASSUMED_THROUGHPUT)


def loader_waits(r: Results) -> WhatIf | None:
    """Where workers load: the step with their waits beyond receiving each batch hidden (the
    replay's ``dataloader_unpinned``); None elsewhere."""
    rp = r.replay
    if rp is None or r.steps.loader_iterator != "multi_process":
        return None
    return rp.what_if.get("dataloader_unpinned")


def loader_shown_ns(r: Results) -> int | None:
    """Where DataLoader workers feed the step and its thread found each batch waiting (their
    waits do not bound it): the step as recorded, the interval the workers were shown to keep
    up with. How much faster they could deliver is not in the trace: they run in processes the
    profiler does not record. None elsewhere."""
    rp = r.replay
    if rp is None or r.steps.loader_iterator != "multi_process" or not rp.trace_step_median_ns:
        return None
    if loader_bound_ns(r) is not None or workers_shown_fast(r):
        return None
    return int(rp.trace_step_median_ns)


def workers_shown_fast(r: Results) -> bool:
    """Whether a pin-memory thread shows the workers delivering each batch sooner after the
    step asked for it than the un-profiled step takes (analyzers/steps.py
    loader_arrival_lag_ns): one worker alone keeps up with it, whatever the profiler cost the
    step. A torchvision ResNet fed tensors by 4 workers: 4.7 ms against a 9.3 ms step, where
    more workers measured 0.89-1.02x and the 4x batch 3.15-3.70x per sample."""
    lag, rp = r.steps.loader_arrival_lag_ns, r.replay
    return lag is not None and rp is not None and lag <= (rp.unprofiled_step_ns or 0)


def _headroom_needed(shown: int, w: WhatIf | None) -> float | None:
    """How many times the rate the workers were shown to keep up with (``shown``, their
    interval) a prediction asks of them: that interval over the predicted step (per the
    original batch's samples). None without a prediction, or for the loader's own fix."""
    if w is None or w.step_time_after_ns <= 0:
        return None
    names = set(w.transforms or ()) | ({w.transform.name} if w.transform is not None else set())
    if names & LOADER_TRANSFORMS:
        return None
    return shown / w.step_time_after_ns


def loader_unverified(r: Results) -> tuple[int, float] | None:
    """Where DataLoader workers kept up with the profiled step but the un-profiled step is
    more than :data:`LOADER_ASSUMED_THROUGHPUT` times faster: the interval they were shown
    to keep up with and the most they could then bound (that interval over the un-profiled
    step). None elsewhere."""
    shown = loader_shown_ns(r)
    rp = r.replay
    if shown is None or rp is None or not rp.unprofiled_step_ns:
        return None
    speedup = shown / rp.unprofiled_step_ns
    return (shown, speedup) if speedup > LOADER_ASSUMED_THROUGHPUT else None


# The same process's un-profiled step (traceinsight.capture times it just before recording) at
# least this many times the model's estimate: beyond the profiler's spread between processes
# (the own step over the estimate 0.66-1.37 on 67 of the 70 third-party recordings, 1.95-3.2 on
# the three whose workers fell behind without the profiler), and where workers kept up with
# the profiled step it is their pace (the DLRM loop's 4 workers: 18.16 ms timed against 10.50
# modelled, its 3 recorded steps 14.45 ms without a wait; a 4x batch predicted 3.93x HIGH,
# while batches and workers together measured 1.2-1.3x over the workers alone)
LOADER_MEASURED_MIN_RATIO = 1.5


def loader_measured_ns(r: Results) -> int | None:
    """Where DataLoader workers kept up with the profiled step and the process's own timed
    un-profiled step (ReplayResult.measured_step_ns) is at least
    :data:`LOADER_MEASURED_MIN_RATIO` times the model's: that step, the workers' likely pace.
    None elsewhere (and where the loader's what-if already bounds the step)."""
    rp = r.replay
    if loader_shown_ns(r) is None or rp is None or not rp.unprofiled_step_ns:
        return None
    measured = rp.measured_step_ns
    if not measured or measured < LOADER_MEASURED_MIN_RATIO * rp.unprofiled_step_ns:
        return None
    return measured


def _bounded(w: WhatIf | None, bound: int | None, loader_too: bool = False) -> WhatIf | None:
    """``w`` no faster than the loader's interval ``bound`` (per the original batch's samples:
    the workers deliver samples at their rate whatever the batch); a what-if of the loader's
    own fix only with ``loader_too`` (the bound is then the fixed loader's)."""
    if w is None or bound is None or w.step_time_after_ns >= bound:
        return w
    names = set(w.transforms or ()) | ({w.transform.name} if w.transform is not None else set())
    if names & LOADER_TRANSFORMS and not loader_too:
        return w
    return replace(
        w,
        step_time_after_ns=bound,
        speedup=w.step_time_ns / bound,
        batch_step_time_after_ns=bound * w.multiplier if w.multiplier else None,
        speedup_low=None,
    )


def _per_site(r: Results, sources: list[Source]) -> list[Source]:
    """The finding's sources, the costliest each with ``what_if``: its syncs alone removed."""
    sites, rp = r.sources.sites, r.replay
    if sites is None or rp is None or sites.height == 0:
        return sources
    out = []
    for i, s in enumerate(sources):
        if i >= PER_SITE_MAX:
            out.append(s)
            continue
        calls = sites.filter((pl.col("location") == s.location) & (pl.col("trigger") == s.trigger))
        w = rp.predict(transforms.remove_syncs_at(calls)) if calls.height else None
        if w is None and rp.unprofiled_step_ns is not None:
            # the site's calls did not wait in the modelled steps: its fix saves nothing there
            w = WhatIf.unchanged(rp.unprofiled_step_ns)
        out.append(replace(s, what_if=w))
    return out


def _saving_ratio(speedup: float | None) -> float | None:
    """The saving's share of the step, ``1 - after/before``, of a speedup (None: none)."""
    return None if speedup is None or speedup <= 0 else max(0.0, 1.0 - 1.0 / speedup)


def _lowered(t: Thresholds, severity: Severity, share: float | None) -> Severity | None:
    """The severity ``share`` grades, where it is below ``severity`` (None otherwise)."""
    if share is None:
        return None
    graded = t.severity(share)
    return graded if SEVERITIES.index(graded) > SEVERITIES.index(severity) else None


def _assured_share(r: Results, share: float | None) -> float | None:
    """On compiled code recorded with shapes, the share of the profiled window a finding's
    attributed time holds at the least: less the share of the profiled step the profiler may
    have added outside its events (down to the un-profiled range's low end). None elsewhere."""
    rp = r.replay
    if rp is None or rp.compiled_unprofiled_ratio is None or share is None:
        return None
    low, profiled = rp.unprofiled_step_low_ns, rp.trace_step_median_ns
    if low is None or not profiled:
        return None
    return max(0.0, share - max(0.0, 1.0 - low / profiled))


def _timeline_share(rule: Rule, r: Results, share: float | None, window_ns: int) -> float | None:
    """A GPU-time finding's share of the window where no step model prices it: its share times
    what the window's GPU timeline keeps of a GPU-time saving with the host as recorded
    (:func:`analyzers.launch.gpu_timeline_saving_ratio`; launch-bound: none of it). A host
    blocked on the GPU would return from each wait sooner, by at most the time it waited: the
    window's blocked time is added to the saving. None where the rule saves more than GPU time,
    a step model exists, or the timeline was not replayed."""
    ratio = r.launch.gpu_timeline_saving_ratio
    modelled = r.replay is not None and r.replay.unprofiled_step_ns is not None
    if not rule.gpu_work or modelled or ratio is None or share is None or window_ns <= 0:
        return None
    waited = r.syncs.host_sync_blocked_ns / window_ns
    return min(share, share * ratio + waited)


def what_if_of(rule: Rule, r: Results, fix: str | None = None) -> tuple[WhatIf | None, str | None]:
    """The rule's predicted fix (None with the reason where there is none); ``fix``: another
    of the replay's transforms the finding's advice names instead (``evidence.priced_by``)."""
    if rule.estimate is not None:
        return rule.estimate(r)
    fix = fix or rule.fix
    if fix is None:
        return None, rule.no_estimate
    rp = r.replay
    if rp is None or rp.unprofiled_step_ns is None:
        return None, "no step model: the trace has no steps or no GPU work to replay"
    if fix in rp.unpriced:
        return None, rp.unpriced[fix]
    # a transform that changes nothing in the model (what_if absent) saves nothing
    return rp.what_if.get(fix) or WhatIf.unchanged(rp.unprofiled_step_ns), None


# A fix replayed at under this speedup is a slowdown the title says (0.99x or less as shown)
SLOWER_MAX_SPEEDUP = 0.995


def with_savings(
    findings: Iterable[Finding], r: Results, rules: Iterable[Rule], t: Thresholds, window_ns: int
) -> list[Finding]:
    """``findings`` with cost_ns = predicted saving over ``window_ns`` (the window summed over
    devices), severity from the saving's share of the step, ranked by saving."""
    by_id = {rule.id: rule for rule in rules}
    bound = loader_bound_ns(r)
    unverified = loader_unverified(r)
    measured = loader_measured_ns(r) if unverified is None else None
    out = []
    for f in findings:
        rule = by_id[f.id]
        fix = f.evidence.get("priced_by") or rule.fix
        w, why = what_if_of(rule, r, fix)
        if f.evidence.get("unpriced_because"):
            # what was found puts the saving out of the trace's reach (another rank's wait)
            fix, w, why = None, None, f.evidence["unpriced_because"]
        # (a variance the loader's waits cause is fixed by the loader's fix: not bounded)
        loader_caused = f.evidence.get("caused_by") == "dataloader"
        bounded = w if loader_caused else _bounded(w, bound)
        if bounded is not w:
            # the saving moves into the wait for the workers' next batch; so do the finding's
            # other priced fixes (evidence.what_if_NAME)
            w = bounded
            others = {
                k: _bounded(v, bound)
                for k, v in f.evidence.items()
                if k.startswith("what_if_") and isinstance(v, WhatIf)
            }
            f = replace(f, evidence={**f.evidence, **others, "loader_bound_ns": bound})
        unpriced = r.replay is not None and fix is not None and fix in r.replay.unpriced
        if w is None and unpriced and SEVERITIES.index(f.severity) < UNPRICED_CAP:
            # the fix has a transform the trace cannot price (a device the spec table lacks):
            # the attributed time is only an upper bound on the saving, and severity never
            # rests on an upper bound alone
            f = replace(f, severity=SEVERITIES[UNPRICED_CAP])
        if w is None:
            evidence = {**f.evidence, "why_no_estimate": why}
            if capped(t.severity(f.cost_ratio), rule.cap) == f.severity:
                evidence.pop("severity_cap_reason", None)  # the cap lowered nothing
            lowered = _lowered(t, f.severity, _assured_share(r, f.cost_ratio))
            if lowered is not None:
                f = replace(f, severity=lowered)
                evidence["graded_on_range"] = True
            timeline = _timeline_share(rule, r, f.cost_ratio, window_ns)
            if timeline is not None:
                kept = r.launch.gpu_timeline_saving_ratio
                evidence["gpu_timeline_saving_ratio"] = kept
                lowered = _lowered(t, f.severity, timeline)
                if lowered is not None:
                    f = replace(f, severity=lowered)
                    evidence["graded_on_gpu_timeline"] = True
                    evidence["severity_cap_reason"] = (
                        "no step model prices it, and with the GPU's work at half its time the "
                        f"window's GPU work ends {kept:.1%} of that sooner (plus at most "
                        "the host's waits for the GPU): the host's launches pace the GPU, so "
                        "shorter kernels barely shorten the window"
                    )
            out.append(replace(f, evidence=evidence))
            continue
        ratio = w.saving_ratio
        uncapped = capped(t.severity(ratio), rule.cap)
        sev = capped(uncapped, f.evidence.get("severity_cap"))
        floor = f.evidence.get("severity_floor")
        if floor is not None and SEVERITIES.index(sev) > SEVERITIES.index(floor):
            sev = floor
        evidence = {**f.evidence, "attributed_ns": f.cost_ns}
        if sev == uncapped:
            # the draft's cap lowered nothing: no reason to give (audit 17's review: "graded
            # low: one slow step ..." beside a 1.05x saving, low anyway)
            evidence.pop("severity_cap_reason", None)
        if fix is not None or w.transform is not None:
            # the transform replayed (an estimate's own, where it replayed one)
            evidence["transform"] = fix or w.transform.name
            if r.replay is not None and fix in r.replay.unconverged:
                # the replay stopped before the change reached every blocking call
                evidence["what_if_lower_bound"] = True
        if r.replay is not None and "unprofiled" in r.replay.unconverged:
            # the step it starts from did not settle: a fix that settles in fewer rounds (fewer
            # blocking calls) reads as a saving it is not (host_sync 1.54x on the torchdiffeq
            # loop cut at 64 rounds; 1.01x settled), so no grade rests on it
            evidence["what_if_unsettled"] = True
            sev = capped(sev, "low")
        # (the loader's own finding says what the workers' rate leaves open: its plan)
        mine = unverified is None or "loader_plan" in f.evidence
        need = None if mine else _headroom_needed(unverified[0], w)
        if need is not None:
            # the workers were shown to keep up with the profiled step only, and the step the
            # predictions start from asks more than the loader what-if's own assumption (twice
            # that rate): the trace cannot say they keep up (a DCGAN fed by 2 workers:
            # launch_bound 2.20x and a 2x batch 1.92x from an 11.6 ms step, which ran 20-23 ms
            # un-profiled at the workers' rate; the 4x batch measured 0.83-0.93x per sample,
            # torch.compile 0.79-0.95x, 8 workers 1.13-1.89x)
            evidence["loader_headroom_needed"] = need
            evidence["loader_shown_interval_ns"] = unverified[0]
            sev = capped(sev, "low")
        elif measured is not None and "loader_plan" not in f.evidence:
            # the process ran far slower without the profiler than the model allows, with
            # workers whose rate the trace does not show: every other saving needs them to keep
            # up at a pace the process did not reach (graded on it alone: no)
            need = _headroom_needed(measured, w)
            if need is not None and need > 1.0:
                evidence["loader_measured_step_ns"] = measured
                if capped(sev, "low") != sev:
                    sev = "low"
                    evidence["severity_cap_reason"] = (
                        f"the process ran {fmt_ms(measured)} a step without the profiler (timed "
                        f"before the capture), "
                        f"{measured / (r.replay.unprofiled_step_ns or 1):.2f}x the model's step, "
                        "fed by DataLoader workers that kept up with the profiled step only: "
                        "the saving needs them to deliver faster than it shows"
                    )
        if rule.per_site and evidence.get("sources"):
            evidence["sources"] = [
                replace(s, what_if=_bounded(s.what_if, bound))
                for s in _per_site(r, evidence["sources"])
            ]
        if (
            r.replay is not None
            and "loader_bound_ns" not in evidence
            and (
                rule.fix is not None
                or w.multiplier is not None
                or getattr(rule.estimate, "replays", False)
            )
        ):
            # the other end of the range the trace leaves: the fix from the un-profiled step's
            # low end (an estimate's own arithmetic, the loader's plan, is not a replay of it)
            w = replace(w, speedup_low=r.replay.speedup_low(w))
            low_ratio = _saving_ratio(w.speedup_low)
            if r.replay.compiled_unprofiled_ratio is not None and low_ratio is not None:
                # compiled code recorded with shapes: every measured step lay below the
                # estimate, so the point is an upper end and the severity is what both ends
                # of the range assure (the saving, and the order, stay the point's)
                lowered = _lowered(t, sev, min(ratio, low_ratio))
                if lowered is not None:
                    sev = lowered
                    evidence["graded_on_range"] = True
        title = f.title
        if w.speedup is not None and w.speedup < SLOWER_MAX_SPEEDUP:
            # the fix adds more to this step than it takes away (bf16 autocast's casts on a
            # host-bound step: 0.85x replayed): the advice stands for other steps, the title
            # says it is no lever here (the invariant audit s57: 66 such findings unsaid)
            title += (
                f"; on this step its fix replays slower ({w.speedup:.2f}x): what it adds "
                "outweighs what it saves"
            )
        out.append(
            replace(
                f,
                title=title,
                severity=sev,
                cost_ns=int(ratio * window_ns),
                cost_ratio=ratio,
                what_if=w,
                evidence=evidence,
            )
        )
    return ranked(out)


def combined(r: Results, findings: Iterable[Finding]) -> WhatIf | None:
    """The findings' fixes applied together to the un-profiled model and replayed once (each
    saving counted once; a larger batch's time per the original batch's samples): every
    finding whose what-if replayed a transform, its rule's ``fix`` or its own estimate's."""
    rp = r.replay
    chosen = [f for f in findings if f.what_if is not None and f.what_if.transform is not None]
    if rp is None or not chosen:
        return None
    steps = list({id(f.what_if.transform): f.what_if.transform for f in chosen}.values())
    multiplier = math.prod(f.what_if.multiplier or 1 for f in chosen)
    w = rp.predict(transforms.combined(steps))
    if w is None:
        return None
    names = tuple(t.name for t in steps)
    if multiplier == 1:
        together = replace(w, transforms=names, transform=None)
    else:
        batch = WhatIf.larger_batch(w.step_time_ns, w.step_time_after_ns, multiplier)
        together = replace(batch, transforms=names)
    loader = set(names) & LOADER_TRANSFORMS
    plan = loader_plan_of(r) if "dataloader_floor" in loader else None
    if plan is not None and (floor := plan.receive_step_ns):
        # the loading hidden still arrives through the pin-memory thread (per the original
        # batch's samples: a k-times batch carries as many tensors, k times larger)
        together = _bounded(together, round(floor / multiplier), loader_too=True) or together
    fixed = loader_fixed_interval_ns(r) if loader else None
    at_rate = _bounded(together, fixed, loader_too=True) if fixed is not None else None
    if at_rate is not None and at_rate.speedup != together.speedup:
        # the replay hides the loading entirely (the timm loop's all fixes with 14 workers
        # for 3 measured 2.72-3.68x: 3.05x hidden, 2.00x at twice the rate); where the
        # loader's fix at its own assumption (twice its rate) would bound the rest, that end
        # too (audit 19: all fixes 4.82 ms beside the loader fix's assumed 11.22)
        together = replace(together, speedup_loader_assumed=at_rate.speedup)
    return _bounded(together, loader_bound_ns(r))


def all_fixes(r: Results, findings: Iterable[Finding]) -> WhatIf | None:
    """Every finding's fix together (those that save something), replayed once. Where one fix
    alone replays faster than all of them, some fix slows the others' step (a step thread that
    no longer waits at a sync issues work its graph then waits for): such fixes are left out
    one at a time, the one whose absence helps most first, while that helps, so no single
    fix's saving exceeds the combination (word_lm's CUDA-graph after: 1.032x with every fix,
    launch_bound's 1.055x alone). ``left_out`` names them."""
    # a fix whose saving the loader's bound took is in: with the loader's fix it saves again
    chosen = [f for f in findings if f.cost_ns > 0 or "loader_bound_ns" in f.evidence]
    best = combined(r, chosen)
    if best is None or best.speedup is None:
        return best
    alone = max((f.what_if.speedup or 0.0 for f in chosen if f.what_if is not None), default=0.0)
    left: list[Finding] = []
    while alone > best.speedup * (1 + SLOWER_TOGETHER_MIN_RATIO):
        kept = [f for f in chosen if all(f is not g for g in left)]
        trials = [
            (w, f)
            for f in kept
            if f.what_if is not None
            and f.what_if.transform is not None
            and (w := combined(r, [g for g in kept if g is not f])) is not None
            and w.speedup is not None
        ]
        if not trials:
            break
        w, f = max(trials, key=lambda t: t[0].speedup or 0.0)
        if (w.speedup or 0.0) <= best.speedup:
            break
        best, left = w, [*left, f]
    if not left:
        return best
    names = tuple(dict.fromkeys(f.what_if.transform.name for f in left if f.what_if))
    return replace(best, left_out=names)
