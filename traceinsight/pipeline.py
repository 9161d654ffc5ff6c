"""One trace through the stages: context, analyzers, rules and savings, data quality, the
analysis record. Below both the facade (:mod:`traceinsight.api`) and the job runner
(:mod:`traceinsight.jobs`), which call it once per trace or rank.
"""

from __future__ import annotations

from dataclasses import replace

import polars as pl

from traceinsight.analysis import SelectedFixes, TraceAnalysis, source_json
from traceinsight.analyzers import Results, run_analyzers
from traceinsight.analyzers.context import activity_devices, build_context
from traceinsight.analyzers.memory import MAX_MULTIPLIER
from traceinsight.analyzers.regions import with_findings
from traceinsight.causal.transforms import gpu_work_scaled
from traceinsight.causal.whatif import WhatIf
from traceinsight.errors import InputError
from traceinsight.findings import (
    RULES,
    Thresholds,
    all_fixes,
    combined_fixes,
    diagnose,
    thresholds,
)
from traceinsight.findings.model import Finding
from traceinsight.findings.platform import in_runtime_words, names_hardware
from traceinsight.findings.quality import apply_data_quality
from traceinsight.model.framework import detect_framework, runtime_of
from traceinsight.model.schema import Trace
from traceinsight.options import Options
from traceinsight.runtime import Runtime

# Findings whose evidence names the user's code when stacks were recorded (analyzers/sources.py).
SOURCED_RULES = ("host_sync", "dataloader_stall", "launch_bound", "pageable_memcpy")
NO_STACKS = {"pytorch": "no Python stacks", "cuda_app": "no call stacks"}


def graded(opts: Options) -> Thresholds:
    """The thresholds with the options' overrides applied; InputError names unknown keys (and
    unknown finding ids in ``--what-if``, or a larger batch's multiplier out of range)."""
    known = {r.id for r in RULES}
    unknown = [i for i in opts.what_if if i.partition("@")[0] not in known]
    if unknown:
        raise InputError(
            f"--what-if: unknown finding id(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}"
        )
    for raw in opts.what_if:  # a larger batch's multiplier is checked before any parsing
        fid, _, k = raw.partition("@")
        if k and fid in BATCH_RULES.values():
            _multiplier(fid, k)
    try:
        return thresholds(opts.thresholds)
    except ValueError as exc:
        raise InputError(str(exc)) from None


def analyze_trace(
    trace: Trace, opts: Options | None = None, runtime: Runtime | None = None
) -> TraceAnalysis:
    """Every analyzer and every rule on one parsed single-rank trace."""
    opts = opts or Options()
    runtime = runtime or Runtime.detect(helpers=False)
    # read once off the whole trace: the findings' advice follows it
    framework = detect_framework(trace)
    if opts.device is not None:
        trace = device_rows(trace, opts.device)
    view = opts.view()
    try:
        ctx = build_context(
            trace,
            opts.step_pattern,
            runtime.analyzer_threads,
            steps_sel=view.steps,
            window_sel=view.window,
        )
    except ValueError as exc:  # the selection holds nothing
        raise InputError(str(exc), trace.meta.source_path) from None
    if opts.step_range and ctx.steps.height == 0 and view.window is None:
        # a --window may leave out every step; anything else found none by that name
        raise InputError(
            f"--step-range {opts.step_range!r}: no annotation or NVTX range name starts with "
            "it; expected NAME, the literal start of the step ranges' names (e.g. train_step, "
            "ProfilerStep#)",
            trace.meta.source_path,
        )
    results = run_analyzers(ctx, runtime.analyzer_threads, replay=opts.replay)
    ev = trace.events
    span = int(ev["end_ns"].max() - ev["start_ns"].min()) if ev.height else 0
    if not ev.height and trace.memory.height:  # a memory timeline: its points' span
        t = trace.memory.get_column("start_ns")
        span = int(t.max() - t.min())
    warnings = list(trace.meta.warnings)
    warnings.extend(results.efficiency.warnings)
    lost = [c for c in results.health.checks if c["check"] == "device_activity_missing"]
    if not ctx.has_gpu and any(c["severity"] == "error" for c in lost):
        warnings.append("no GPU activity recorded although the job used the GPU: see data_quality")
    elif not ctx.has_gpu and lost:  # GPUs named, no CUDA call: CPU-only, or CUDA not recorded
        warnings.append("no GPU activity in this trace, though it names a GPU: see data_quality")
    elif not ctx.has_gpu and ctx.trace_devices:
        warnings.append("no GPU activity in the window: its GPUs were idle all of it")
    elif not ctx.has_gpu and trace.meta.format != "memory-timeline":  # its parser's warning says it
        warnings.append("no GPU activity in this trace: GPU metrics are not applicable")
    if ctx.steps.height == 0 and ctx.has_gpu and view.window is not None:
        # the selection, not the recording, left the steps out (session 54: a window inside
        # two steps was told to call prof.step())
        warnings.append(
            "no whole step lies inside --window: the GPU's span in it is analyzed as one window"
        )
    elif ctx.steps.height == 0 and ctx.has_gpu:
        n_opt = results.optimizer.optimizer_steps
        # a training loop profiled without a schedule: its iterations are there, unmarked (an
        # MI300X ResNet-18's 5 SGD steps read as one window)
        marks = (
            f" (the trace has {n_opt} optimizer steps: profile with a torch.profiler schedule "
            "and call prof.step() each iteration to mark them)"
            if n_opt >= 2
            else ""
        )
        warnings.append(
            f"no ProfilerStep/step ranges: the whole GPU span is analyzed as one window{marks}"
        )
    rp = results.replay
    if rp is not None and rp.replay_error_ratio is not None and rp.unprofiled_step_ns is None:
        warnings.append(
            f"the step model replays the recorded step in {(rp.replayed_step_median_ns or 0) / 1e6:.2f}"
            f" ms against {(rp.trace_step_median_ns or 0) / 1e6:.2f} ms recorded: it did not capture the step "
            "(events missing from the trace), so no saving is replayed; the findings' costs are "
            "the time attributed to each cause"
        )
    if results.replay is not None and "unprofiled" in results.replay.unconverged:
        warnings.append(
            "the un-profiled step's replay stopped before its blocking calls settled (a model "
            "too large for a round per call, or the replay without its C loop: install with a C "
            "compiler): every saving starts from a step that may be long, and is graded low at "
            "most"
        )
    source = source_json(trace, results, span)
    source["framework"] = framework
    # which part of the run this is (the summary says it): offsets from the capture start
    source["window"] = {
        "start_ns": ctx.window_start_ns,
        "end_ns": ctx.window_end_ns,
        "offset_ns": ctx.window_start_ns - ctx.capture_start_ns,
        "selection": view.describe()
        or (
            "all steps"
            if ctx.steps.height
            else "whole GPU span"
            if ctx.has_gpu
            else "whole capture (no GPU activity)"
        ),
        "rank": opts.rank,
        "device": opts.device,
    }
    findings, data_quality = apply_data_quality(
        diagnose(results, graded(opts), framework), results.health
    )
    if framework == "cuda_app":  # its advice names the runtime's calls: HIP's on ROCm
        findings = in_runtime_words(findings, runtime_of(trace))
    elif names_hardware(findings):  # the hardware's words, AMD's on ROCm
        findings = in_runtime_words(findings, runtime_of(trace), api=False)
    if not results.sources.stacks_recorded and any(f.id in SOURCED_RULES for f in findings):
        warnings.append(f"{NO_STACKS[framework]}: {results.sources.hint}")
    # the regions name the findings whose evidence lies inside them (known only now)
    results = replace(results, regions=with_findings(results.regions, findings))
    return TraceAnalysis(
        what_if=all_fixes(results, findings),
        selected=selected_fixes(results, findings, opts.what_if) if opts.what_if else None,
        rank=source["ranks"][0] if len(source["ranks"]) == 1 else (trace.meta.rank or 0),
        source=source,
        results=results,
        metrics=results.metrics(),
        findings=findings,
        warnings=warnings,
        command=opts.command,
        trace=trace,
        data_quality=data_quality,
    )


def selected_fixes(
    results: Results, findings: list[Finding], ids: tuple[str, ...]
) -> SelectedFixes:
    """``--what-if``: the chosen findings' fixes replayed together, and which of them this
    trace did not raise or has no fix to replay for. ``ID@K`` picks the batch multiplier K
    of a larger-batch fix (memory_headroom, small_batch) in place of the recommended one;
    ``ID@NAME`` another fix the finding prices (its ``evidence.what_if_NAME``:
    ``launch_bound@whole_step``, the whole step in one CUDA graph). A larger batch the rules
    did not raise (``memory_headroom@K`` where memory events show K x the batch fits,
    ``small_batch@K`` without memory events) is priced all the same: the user's own lever."""
    chosen, by_id = [], {f.id: f for f in findings}
    unraised: list[str] = []
    for raw in ids:
        fid, _, k = raw.partition("@")
        f = by_id.get(fid)
        if f is not None and k:
            batch = f.what_if is not None and f.what_if.multiplier is not None
            f = _at_multiplier(f, k) if k.isdigit() or batch else _at_variant(f, k)
            if f.what_if is not None and not _fits(results, fid, f.what_if.multiplier or 1):
                f = None  # the memory events show it does not fit, raised or not
        elif f is None and k.isdigit() and (f := _unraised_batch(results, fid, int(k))):
            unraised.append(raw)
        chosen.append((raw, fid, f))
    not_raised = tuple(raw for raw, _, f in chosen if f is None)
    no_fix = tuple(
        raw
        for raw, _, f in chosen
        if f is not None and (f.what_if is None or f.what_if.transform is None)
    )
    w = combined_fixes(results, [f for _, _, f in chosen if f is not None])
    rp = results.replay
    if w is None and rp is not None and rp.unprofiled_step_ns is not None:
        w = WhatIf.unchanged(rp.unprofiled_step_ns)  # nothing chosen changes the model
    return SelectedFixes(ids, w, not_raised, no_fix, tuple(unraised))


# the larger-batch rules, by whether the trace has memory events (which bound the fit)
BATCH_RULES = {True: "memory_headroom", False: "small_batch"}


def _unraised_batch(results: Results, fid: str, m: int) -> Finding | None:
    """A stand-in finding carrying ``m`` x the batch's replayed fix, for ``fid@m`` where the
    rule did not fire: only the batch rule for this trace's kind (memory_headroom with memory
    events, ``m`` within what fits; small_batch without) and with a step model to replay."""
    mem, rp = results.memory, results.replay
    if rp is None or BATCH_RULES[mem.has_memory] != fid:
        return None
    _multiplier(fid, str(m))
    if not _fits(results, fid, m):
        return None
    p = rp.predict(gpu_work_scaled(float(m)))
    if p is None:
        return None
    w = WhatIf.larger_batch(p.step_time_ns, p.step_time_after_ns, m, p.transform)
    return Finding(fid, "info", f"{m}x the batch (not raised)", 0, 0.0, {}, "", what_if=w)


def _fits(results: Results, fid: str, m: int) -> bool:
    """``m`` x the batch within what the memory events show fits (True without them)."""
    fit = results.memory.fit_multiplier
    return fid != "memory_headroom" or fit is None or m <= fit


def _at_variant(f: Finding, name: str) -> Finding:
    """The finding with the other fix its evidence prices (``what_if_<name>``) as its fix."""
    w = f.evidence.get(f"what_if_{name}")
    if not isinstance(w, WhatIf) or w.transform is None:
        known = sorted(k[len("what_if_") :] for k in f.evidence if k.startswith("what_if_"))
        raise InputError(
            f"--what-if {f.id}@{name}: {f.id} prices no fix named {name!r} on this trace"
            + (f" (it prices: {', '.join(known)})" if known else "")
        )
    return replace(f, what_if=w)


def _multiplier(fid: str, k: str) -> int:
    """``ID@K``'s batch multiplier: a whole number from 2 to MAX_MULTIPLIER (InputError else)."""
    try:
        m = int(k)
    except ValueError:
        raise InputError(f"--what-if {fid}@{k}: the multiplier must be a whole number") from None
    if not 2 <= m <= MAX_MULTIPLIER:
        raise InputError(f"--what-if {fid}@{k}: the multiplier must be 2 to {MAX_MULTIPLIER}")
    return m


def _at_multiplier(f: Finding, k: str) -> Finding:
    """The finding with its larger-batch fix at ``k`` x the batch (InputError otherwise)."""
    if f.what_if is None or f.what_if.multiplier is None:
        raise InputError(f"--what-if {f.id}@{k}: {f.id}'s fix is not a larger batch")
    m = _multiplier(f.id, k)
    w = replace(f.what_if, multiplier=m).of_transform(gpu_work_scaled(float(m)))
    return replace(f, what_if=w)


def rank_rows(trace: Trace, rank: int) -> Trace:
    """One rank's rows of a multi-process export (a one-rank trace must be that rank)."""
    ranks = trace.events["rank"].drop_nulls().unique().sort().to_list()
    if rank not in ranks and not (len(ranks) <= 1 and (trace.meta.rank or 0) == rank):
        raise InputError(f"--rank {rank}: the trace has ranks {ranks}", trace.meta.source_path)
    one = len(ranks) <= 1
    return trace.view(
        trace.events.filter(pl.col("rank").eq_missing(rank) | one), rank=None if one else rank
    )


def device_rows(trace: Trace, device: int) -> Trace:
    """The host rows and one GPU's rows (other GPUs' activity left out)."""
    ev = trace.events
    # the devices source.devices lists as active: a device the metadata names but that ran
    # nothing here cannot be analyzed
    active = list(activity_devices(ev))
    if device not in active:
        idle = sorted(d.id for d in trace.meta.devices if d.id not in active)
        named = f" (its metadata also names {idle}, with no activity)" if idle else ""
        raise InputError(
            f"--device {device}: no GPU activity on it; the trace has GPU activity on devices "
            f"{active}{named}",
            trace.meta.source_path,
        )
    keep = pl.col("device").is_null() | (pl.col("device") == device)
    rows = ev.filter(keep)
    if rows.height == ev.height:
        return trace.view(rows, device=device)
    # the other GPUs' records are left out, their launch calls kept: the health check of launches
    # without a GPU record must not read that as lost activity
    meta = replace(trace.meta, extra={**trace.meta.extra, "device_view": device})
    return trace.view(rows, device=device, meta=meta)


def view_events(trace: Trace, opts: Options) -> Trace:
    """The rows of the view (``--rank``, ``--device``; ``--steps``/``--window``: the rows that
    overlap the analysis window those give), for ``export``."""
    if opts.rank is not None:
        trace = rank_rows(trace, opts.rank)
    if opts.device is not None:
        trace = device_rows(trace, opts.device)
    view = opts.view()
    if view.steps is None and view.window is None:
        return trace
    try:
        ctx = build_context(trace, opts.step_pattern, steps_sel=view.steps, window_sel=view.window)
    except ValueError as exc:
        raise InputError(str(exc), trace.meta.source_path) from None
    inside = (pl.col("end_ns") > ctx.window_start_ns) & (pl.col("start_ns") < ctx.window_end_ns)
    return trace.view(trace.events.filter(inside), window=(ctx.window_start_ns, ctx.window_end_ns))
