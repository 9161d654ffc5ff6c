"""The single-trace rules, in the order they are checked (data: one small function each).

Each check reads the typed analyzer results and returns a :class:`Draft` (cost, title, evidence)
or None. Costs are the time the cause measurably takes in the analysis window; severity follows
from the cost's share of the window (:func:`make_finding`). docs/FINDINGS.md has a row per rule.
"""

from __future__ import annotations

import json
import re
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from traceinsight.analyzers import Results
from traceinsight.analyzers.comm import COMM_FLOOR_BYTES_PER_S
from traceinsight.analyzers.host_ops import HOST_STALL_MIN_NS, HostOpsResult
from traceinsight.analyzers.idle import (
    CALLEE_SEP,
    MAJORITY,
    OS_CALL_SUFFIX,
    QUEUED_MIN_NS,
    IdleSegment,
)
from traceinsight.analyzers.sources import Source
from traceinsight.analyzers.syncs import SyncResult
from traceinsight.causal.build import CUDNN_SDPA_PLAN_NS
from traceinsight.causal.columns import HOST_INPUT_OPS
from traceinsight.causal.transforms import BF16_KNOWN_SHAPES
from traceinsight.causal.whatif import LoaderPlan, WhatIf
from traceinsight.constants import FRAMEWORKS, IDLE_CAUSES, Framework
from traceinsight.findings.model import (
    Advice,
    Draft,
    Estimate,
    Finding,
    Rule,
    Severity,
    Thresholds,
    make_finding,
    ranked,
)
from traceinsight.findings.savings import (
    loader_bound_ns,
    loader_plan_of,
    loader_unverified,
    loader_waits,
)
from traceinsight.report.format import fmt_bytes, fmt_ms, fmt_ns, fmt_num, fmt_pct, plural

RULES: list[Rule] = []


@dataclass(frozen=True)
class RuleInput:
    """What a check sees: the results, the thresholds, the window (ns x devices), the
    findings of the rules before it and the framework the trace records."""

    r: Results
    t: Thresholds
    window_ns: int
    found: Sequence[Finding]
    framework: Framework = FRAMEWORKS[0]

    def per_step(self, value: float | None) -> str:
        """``N per step`` (``per iteration`` in an application) where the trace has steps;
        without them the window's total."""
        noun = "iteration" if self.framework == "cuda_app" else "step"
        return f"{fmt_num(value)} per {noun}" if self.r.steps.steps else "over the window"

    def idle(self, cause: str) -> int:
        return self.r.idle.idle_by_cause_ns.get(cause, 0)

    def idle_over(self, cause: str, ratio: str) -> int | None:
        """The idle of ``cause`` where it is at least the threshold ``ratio`` of the window
        (and any at all), else None."""
        idle = self.idle(cause)
        return idle if idle > 0 and idle >= self.t[ratio] * self.window_ns else None

    def sources(self, *categories: str) -> list[Source]:
        """Where in the user's code these host events come from (analyzers/sources.py), most
        costly first; empty without with_stack=True."""
        rows = [s for c in categories for s in self.r.sources.by_category.get(c, ())]
        return sorted(rows, key=lambda s: -s.cost_ns)

    def segments(self, cause: str, n: int = 5) -> list[IdleSegment]:
        return [s for s in self.r.idle.top_segments if s.cause == cause][:n]

    def chain(
        self, cause: str, what: str, skip: tuple[int | None, int | None] | None = None
    ) -> str | None:
        """The causal chain at the largest idle segment of ``cause`` (not one overlapping
        ``skip``, a one-time wait's start and end), in words: what the host did, and how long
        the GPU then waited for work (None without such a segment)."""
        segs = self.segments(cause, 2)
        if skip is not None and skip[0] is not None and skip[1] is not None:
            lo, hi = skip
            segs = [s for s in segs if not (s.start_ns < hi and s.end_ns > lo)]
        seg = next(iter(segs), None)
        if seg is None:
            return None
        op = f" in {seg.host_op}" if seg.host_op else ""
        return (
            f"{what}{op} at {fmt_ms(seg.offset_ns)} into the window: the GPU ran out of "
            f"queued work and idled {fmt_ms(seg.dur_ns)} until the host launched work again"
        )


def rule(
    rule_id: str,
    *,
    recommendation: str,
    snippet: str = "",
    thresholds: Mapping[str, float] | None = None,
    cap: Severity | None = None,
    fix: str | None = None,
    estimate: Estimate | None = None,
    no_estimate: str | None = None,
    per_site: bool = False,
    advice: Mapping[str, Advice | None] | None = None,
    gpu_work: bool = False,
) -> Callable[[Callable[[RuleInput], Draft | None]], Callable[[RuleInput], Draft | None]]:
    """Register the decorated check as a rule (registry order = checking order) with its fix's
    prediction: exactly one of ``fix`` (a transform's name, causal/transforms.py), ``estimate``
    or ``no_estimate`` (findings/model.py :class:`Rule`)."""

    def register(check: Callable[[RuleInput], Draft | None]) -> Callable[[RuleInput], Draft | None]:
        if check.__name__ != rule_id:
            # a helper put between a rule's decorator and its check would run as the check
            raise TypeError(f"rule {rule_id!r} decorates {check.__name__!r}, not its check")
        RULES.append(
            Rule(
                rule_id,
                check,
                recommendation,
                snippet,
                dict(thresholds or {}),
                cap,
                fix=fix,
                estimate=estimate,
                no_estimate=no_estimate,
                per_site=per_site,
                advice=dict(advice or {}),
                gpu_work=gpu_work,
            )
        )
        return check

    return register


# the loading's share in contended CPU copies (analyzers/host_ops.py) from which the advice is
# to fix the contention first
CONTENDED_LOADING_RATIO = 0.5


def loader_what_if(r: Results) -> tuple[WhatIf | None, str | None]:
    """dataloader_stall's fix at the stated assumption (the loader twice as fast, on free
    cores: :class:`LoaderPlan`); the loading hidden entirely is its upper bound, in the
    evidence; all fixes together hold the same assumption (findings/savings.py combined)."""
    rp = r.replay
    if rp is None or rp.unprofiled_step_ns is None:
        return None, "no step model: the trace has no steps or no GPU work to replay"
    hidden = rp.what_if.get("dataloader_floor")
    plan = loader_plan_of(r)
    if hidden is None or plan is None:
        return WhatIf.unchanged(rp.unprofiled_step_ns), None
    w = WhatIf.of(plan.batch_interval_ns, plan.assumed_step_ns)
    return (w.of_transform(hidden.transform) if w is not None else None), None


def unpinned_what_if(r: Results, plan: LoaderPlan | None) -> WhatIf | None:
    """Workers without pin_memory at the plan's assumed loader: the step thread receives each
    batch (the replay's ``dataloader_unpinned``), and the loader still bounds the step where
    the assumed throughput does not keep up."""
    hidden = r.replay.what_if.get("dataloader_unpinned") if r.replay is not None else None
    if hidden is None or plan is None:
        return None
    after = max(hidden.step_time_after_ns, plan.assumed_step_ns)
    w = WhatIf.of(plan.batch_interval_ns, after)
    return w.of_transform(hidden.transform) if w is not None else None


# the loading hidden entirely is priced beside the assumed loader where it saves this much more
HIDDEN_PRICED_RATIO = 1.25


def hidden_what_if(r: Results, plan: LoaderPlan | None) -> WhatIf | None:
    """The loading hidden entirely (the replay's ``dataloader_floor``): the upper bound, enough
    workers on free cores or the per-sample work moved out of ``__getitem__``, priced where it
    is well beyond the plan's assumed loader (a pandas row-per-sample loader: 2.10x at twice
    the loader's rate; its 8 workers measured 4.6-6.4x, a batch-indexed Dataset 19-28x)."""
    hidden = r.replay.what_if.get("dataloader_floor") if r.replay is not None else None
    if hidden is None or plan is None:
        return None
    after = hidden.step_time_after_ns
    if after <= 0 or plan.assumed_step_ns < HIDDEN_PRICED_RATIO * after:
        return None
    w = WhatIf.of(plan.batch_interval_ns, after)
    return w.of_transform(hidden.transform) if w is not None else None


# receiving batches in the step thread named in the title from this share of the planned step
RECEIVE_NAMED_RATIO = 0.05


# the GPU idle inside DataLoader.__next__ is named where it is this many times, and this much
# more than, the idle whose gaps it covers most of
LOADER_INSIDE_NAMED_RATIO = 2.0
LOADER_INSIDE_NAMED_NS = 1_000_000
# the loader's idle beyond this multiple of the idle inside its calls is said to lie around
# them, not in them
LOADER_AROUND_RATIO = 1.1
FIRST_BATCH_ADVICE = (
    "The wait is the DataLoader's workers starting (processes spawned, the dataset sent to each): "
    "once per iterator. persistent_workers=True keeps them across epochs; a profile of later "
    "steps shows the steady loop."
)


@rule(
    "dataloader_stall",
    advice={"cuda_app": None},  # DataLoader waits: only a PyTorch trace records them
    estimate=loader_what_if,
    recommendation="Load batches in parallel and ahead of time: num_workers > 0, pin_memory=True, prefetch_factor 4, "
    "persistent_workers=True; move per-sample CPU work (decoding, tokenization, feature "
    "extraction) out of __getitem__ and the collate function (pre-process once to Arrow/Parquet).",
    snippet=(
        "loader = DataLoader(dataset, batch_size=B, num_workers=8, pin_memory=True,\n"
        "                    prefetch_factor=4, persistent_workers=True)\n"
        "# and tokenize/pre-process once, offline (datasets.map(..., num_proc=16) -> Arrow/Parquet)"
    ),
    # without GPU idle to blame (a CPU-only trace), the loader's share of the steps must be this
    thresholds={"dataloader_host_min_ratio": 0.05},
)
def dataloader_stall(x: RuleInput) -> Draft | None:
    steps = x.r.steps
    cost = x.idle("dataloader")
    unverified = loader_unverified(x.r)
    if (
        cost <= 0
        and (steps.dataloader_ratio or 0) <= x.t["dataloader_host_min_ratio"]
        and unverified is None
    ):
        return None
    plan = loader_plan_of(x.r)
    need = ""
    workers_snippet = None
    contended = x.r.host_ops.contended_in_loader_ns
    advice: dict[str, str] = {}
    # where workers load: their waits bound the step, or the step thread's loader time is
    # mostly receiving their batches (hiding the waits beyond it would not bound the step)
    bound = loader_bound_ns(x.r)
    receiving = bool(
        plan and plan.batch_tensors and loader_waits(x.r) is not None and bound is None
    )
    if contended and contended >= CONTENDED_LOADING_RATIO * max(1, steps.dataloader_ns or 0):
        # the loading is slow because its threads do not get the cores: more workers would add
        # threads to the contention (host_thread_contention's fix first)
        need = (
            f"; {fmt_pct(contended / max(1, steps.dataloader_ns or 0))} of the loading is CPU "
            "copies whose threads did not get the cores (host_thread_contention)"
        )
        advice = {
            "recommendation": "Most of the loading time is CPU copies whose threads did not get "
            "the cores (host_thread_contention): fix that first (fewer intra-op threads: "
            "OMP_NUM_THREADS=1; TORCHINDUCTOR_COMPILE_THREADS=1 after torch.compile found a warm "
            "cache); more DataLoader workers would add threads to the contention. Then load "
            "ahead: num_workers > 0, pin_memory=True, persistent_workers=True."
        }
    elif plan is not None and plan.workers_needed is not None:
        n = plan.workers_needed
        several = (
            f" ({plan.batches_per_step:g} batches a step)" if plan.batches_per_step > 1 else ""
        )
        # the plan's loading is the un-profiled step's; the calls as recorded took longer
        # (audit 7: "35.21 ms per batch" where the loader calls took 50.7 ms)
        recorded = (
            steps.dataloader_ns / (steps.steps * plan.batches_per_step) if steps.steps else None
        )
        # the plan's loading is what it adds to the step: where the GPU ran queued work
        # beside it, less than the loader's calls took (audit s58: a 2021 ResNet's 13.49 ms
        # beside calls of 40-63 ms, read as "loading of 13.49 ms per batch")
        as_recorded = (
            f" (its calls take {fmt_ms(recorded)} a batch as recorded: the rest ran beside "
            "queued GPU work or was the profiler's cost)"
            if recorded and plan.loading_per_batch_ns and recorded > 1.1 * plan.loading_per_batch_ns
            else ""
        )
        need = (
            f"; num_workers={n} would hide the {fmt_ms(plan.loading_per_batch_ns or 0)} per "
            f"batch{several} that loading adds to the un-profiled step{as_recorded}"
        )
        # the snippet's count: the workers the plan needs, at least the two its prediction
        # assumes (LOADER_ASSUMED_THROUGHPUT; audit 15: 1 in the title, 8 in the snippet)
        workers_snippet = (
            f"loader = DataLoader(dataset, batch_size=B, num_workers={max(2, n)}, "
            "pin_memory=True,\n                    prefetch_factor=4, persistent_workers=True)\n"
            "# and tokenize/pre-process once, offline (datasets.map(..., num_proc=16) -> "
            "Arrow/Parquet)"
        )
    elif plan is not None and plan.workers_factor is not None and receiving:
        # the step thread's time in the loader is receiving, not waiting: more workers would
        # not shorten it, the pin-memory thread would take it (a ViT fed by 4 workers: 1.4 ms a
        # step, pin_memory measured 1.07-1.26x)
        need = (
            # the receive time is modelled (a fixed cost and one a tensor), not the recorded
            # call's: said so (audit 11)
            f"; mostly receiving each batch ({plural(round(plan.batch_tensors), 'tensor')}, about "
            f"{fmt_ms(plan.receive_ns or 0)} as modelled) from the workers, not waiting for them: "
            "pin_memory=True moves that to the pin-memory thread"
        )
    elif plan is not None and plan.workers_factor is not None and unverified is None:
        # (where the workers' rate is not shown, neither is the factor: said below instead)
        need = f"; about {plan.workers_factor:.1f}x the current workers would keep up"
        if bound is not None:
            # findings/savings.py: the other fixes' savings wait for the workers' next batch
            need += "; until then they bound the step and other fixes save nothing"
    receive = plan.receive_ns if plan is not None and plan.batch_tensors else None
    named = receive and plan and receive >= RECEIVE_NAMED_RATIO * plan.assumed_step_ns
    unverified_evidence: dict[str, object] = {}
    if unverified is not None and not advice:
        shown, speedup = unverified
        rp = x.r.replay
        need += (
            f"; the workers kept up with the profiled step ({fmt_ms(shown)}), but without the "
            f"profiler the step takes about {fmt_ms(rp.unprofiled_step_ns or 0)}: their rate is "
            f"not in the trace, so they may bound it (up to {speedup:.2f}x from them)"
        )
        advice = {"recommendation": _UNVERIFIED_LOADER_ADVICE}
        unverified_evidence = {
            "loader_shown_interval_ns": shown,
            "loader_unverified_speedup": speedup,
            # a check worth making first, whose saving rests on an upper bound alone (and capped
            # there: the Draft's cap)
            "severity_floor": "low",
        }
    if not advice and receiving and not _inputs_pinned(x.r):
        # the workers keep up and the step thread's loader time is receiving their batches:
        # more workers would not shorten it (audit 15: "num_workers > 0" advised to a loop fed
        # by 4 persistent workers)
        advice = {"recommendation": _RECEIVING_LOADER_ADVICE, "snippet": _RECEIVING_SNIPPET}
    elif not advice and x.r.steps.loader_iterator == "multi_process" and not _inputs_pinned(x.r):
        advice = {"recommendation": _MORE_WORKERS_ADVICE}
    if not advice and _inputs_pinned(x.r):
        # the batches already come pinned (a Trainer's dataloader_pin_memory default): the
        # advice is the rest (audit 11: pin_memory=True advised where every upload was pinned)
        advice = {"recommendation": _PINNED_LOADER_ADVICE}
    if named and not advice and not receiving:
        # without pin_memory the step thread receives each batch (benchmarks/loader_receive_cost.py)
        n = plan.batch_tensors or 0
        need += (
            f"; pin_memory=True matters: without it the step thread spends about "
            f"{fmt_ms(receive)} receiving each batch ({n:.0f} tensor{'s' if n >= 1.5 else ''})"
        )
    inside = x.r.idle.dataloader_idle_ns
    if inside >= LOADER_INSIDE_NAMED_RATIO * cost and inside - cost >= LOADER_INSIDE_NAMED_NS:
        # each gap goes to the cause covering most of it: say what the loader's calls hold
        need += (
            f"; {fmt_ms(inside)} of GPU idle falls inside its calls, most of it in gaps the "
            "host spent longer elsewhere"
        )
    if workers_snippet and "snippet" not in advice:
        advice = {**advice, "snippet": workers_snippet}
    # each gap goes to the cause covering most of it, so the loader's idle can hold the step's
    # other host work around its calls: said where it does (a public H100 ResNet-50's "35.48
    # ms idle in DataLoader.__next__" held 24.70 ms inside the calls)
    place = "in DataLoader.__next__"
    if cost > LOADER_AROUND_RATIO * inside:
        place = f"in gaps mostly in DataLoader.__next__ ({fmt_ms(inside)} inside its calls)"
    elif cost > inside:
        # a gap starts a little before the call or ends a little after it (a pageable copy's
        # staging): idle "in" a call cannot exceed the call (audit s63 (18): 37.36 ms "in"
        # calls lasting 36.08 ms)
        place = "in and around DataLoader.__next__"
    # the iterator's first batch, its workers starting, is a one-time cost (per epoch without
    # persistent_workers): out of the steady cost, named, and not the example (audit 17 D8b: a
    # cold ResNet's 7.35 s held a 2.25 s first batch, and the "why" line was that gap)
    first = x.r.idle.dataloader_first_batch_idle_ns
    once = (
        "for the first batch while the workers started (once per iterator: "
        "persistent_workers=True keeps them across epochs)"
    )
    if first and cost - first <= 0:
        # nothing steady is left: the finding is the workers' start alone (the review: a
        # first-batch-only stall read HIGH "GPU waits for the input pipeline")
        return Draft(
            0,
            f"The DataLoader's first batch kept the GPU idle {fmt_ms(first)} {once}; no steady "
            "wait for batches",
            {"idle_ns": 0, "first_batch_idle_ns": first, "dataloader_ns": steps.dataloader_ns},
            recommendation=FIRST_BATCH_ADVICE,
        )
    if first:
        cost -= first
        need += f"; besides, {fmt_ms(first)} {once}"
    return Draft(
        cost,
        # receiving, the step thread is held, not the GPU starved (audit 17: "GPU waits for
        # the input pipeline: 0.02 ms idle" beside a 1.37 ms saving from pinned receiving)
        (
            "The input pipeline holds the step thread, receiving batches: the GPU idles "
            if receiving
            else "GPU waits for the input pipeline: "
        )
        + f"{fmt_ms(cost)}{'' if receiving else ' idle'} {place} "
        f"({fmt_pct(cost / x.window_ns)} of the window){need}",
        {
            "idle_ns": cost,
            "idle_inside_calls_ns": inside,
            "dataloader_ratio": steps.dataloader_ratio,
            "dataloader_ns": steps.dataloader_ns,
            "per_step_dataloader_ns": [s.dataloader_ns for s in steps.per_step],
            "top_segments": x.segments("dataloader"),
            "causal_chain": x.chain(
                "dataloader",
                "the main thread waited for the next batch",
                skip=(
                    (
                        x.r.idle.dataloader_first_batch_start_ns,
                        x.r.idle.dataloader_first_batch_end_ns,
                    )
                    if first
                    else None
                ),
            ),
            "first_batch_idle_ns": first,
            "sources": x.sources("dataloader"),
            "loader_plan": plan,
            # the other priced fix: workers without pin_memory, each batch received in the
            # step thread (the PyG loop: 4 workers measured 1.49-1.61x against 1.79x)
            # (not where the batches already arrive pinned: audit 19, "workers without
            # pin_memory" beside the advice's "the batches already arrive pinned")
            "what_if_unpinned": None if _inputs_pinned(x.r) else unpinned_what_if(x.r, plan),
            # the upper bound beside the stated assumption (issue 37 item 4)
            "what_if_hidden": hidden_what_if(x.r, plan),
            "contended_in_loader_ns": contended,
            **unverified_evidence,
        },
        **advice,
        cap="low" if unverified_evidence else None,
        cap_reason="the DataLoader workers' own rate is not in the trace: the saving rests on "
        "an upper bound",
    )


_RECEIVING_LOADER_ADVICE = (
    "The workers keep up; the step thread's time in the loader is receiving each batch from "
    "them: pin_memory=True hands that to the DataLoader's pin-memory thread and lets the "
    "copies to the GPU run asynchronously (.to(device, non_blocking=True)); keep "
    "prefetch_factor 4 and persistent_workers=True so batches wait ready."
)
_RECEIVING_SNIPPET = (
    "loader = DataLoader(dataset, batch_size=B, num_workers=N, pin_memory=True,\n"
    "                    prefetch_factor=4, persistent_workers=True)\n"
    "for x, y in loader:\n"
    "    x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)"
)
# workers already load (a multi-process DataLoader): the advice is more of them, not "> 0"
_MORE_WORKERS_ADVICE = (
    "Workers already load in parallel: give them more (raise num_workers as far as the host's "
    "cores allow), pin_memory=True, prefetch_factor 4, persistent_workers=True; move per-sample "
    "CPU work (decoding, tokenization, feature extraction) out of __getitem__ and the collate "
    "function (pre-process once to Arrow/Parquet)."
)
_PINNED_LOADER_ADVICE = (
    "Load batches in parallel and ahead of time: more workers (num_workers), prefetch_factor "
    "4, persistent_workers=True (the batches already arrive pinned); move per-sample CPU work "
    "(decoding, tokenization, feature extraction) out of __getitem__ and the collate function "
    "(pre-process once to Arrow/Parquet)."
)


def _inputs_pinned(r: Results) -> bool:
    """Most host-to-device bytes came from pinned memory: the loader pins its batches."""
    c = r.copies
    pinned = sum(
        int(k["bytes"] or 0)
        for k in c.by_kind
        if k["copy_kind"] == "HtoD" and k["src_kind"] == "pinned"
    )
    return pinned > 0 and pinned >= c.h2d_pageable_bytes


# what the workers' rate needs to be checked against (the DCGAN fed by 2 workers: the step
# thread never waited in the profile, yet the workers' own rate, 24-31 ms a batch, bound the
# 11.6 ms un-profiled step: 8 workers measured 1.13-1.89x)
_UNVERIFIED_LOADER_ADVICE = (
    "Check that the DataLoader keeps up without the profiler before acting on the other "
    "findings: time the loop with and without the model's work (iterate the loader alone, "
    "moving each batch to the GPU), or raise num_workers (with pin_memory=True, "
    "persistent_workers=True) and compare the step time; the workers' processes are not in "
    "this trace."
)


_INPUT_COPY_ADVICE = (
    "Copy inputs without waiting: pinned batches (DataLoader(pin_memory=True)) and "
    ".to(device, non_blocking=True). A .to(device) without non_blocking synchronizes the stream "
    "after the copy, so the host waits for all queued GPU work before it can go on."
)
_INPUT_COPY_SNIPPET = (
    "loader = DataLoader(dataset, batch_size=B, pin_memory=True)\n"
    "x = x.to(device, non_blocking=True)   # no stream sync after the copy"
)
# torch.tensor(x, device=...) each step: a tensor built on the CPU and copied from pageable
# memory, which syncs (a held-out Llama's and GPT-2's eager attention masks: transformers'
# masking makes its zero this way each forward; SDPA builds no such mask)
_CONSTRUCTED_COPY_ADVICE = (
    "Do not build device tensors from Python data each step: torch.tensor(x, device=...) (and "
    "t.new_tensor(x)) makes the tensor on the CPU and copies it from pageable memory, which "
    "synchronizes the stream, so the host waits for all queued GPU work. A constant: create it once outside the step, or on "
    "the device (torch.full((), x, device=...)), or pass a Python number where the op takes one "
    "(torch.where(mask, 0.0, x)). Data that changes each step: build it on the CPU, pin it and "
    "copy it with non_blocking=True. Inside a library the call is not yours: transformers' "
    'eager attention builds its mask this way each forward, and attn_implementation="sdpa" '
    "builds none."
)
_CONSTRUCTED_COPY_SNIPPET = (
    "# before, each step: zero = torch.tensor(0.0, device=x.device)\n"
    'zero = torch.zeros((), device="cuda")  # once, outside the loop\n'
    "y = torch.where(mask, zero, x)          # or torch.where(mask, 0.0, x)\n"
    "# data: torch.tensor(obs).pin_memory().to(device, non_blocking=True)"
)


def _all_constructed(syncs: SyncResult) -> bool:
    """Every syncing host-to-device copy built a tensor from Python data (none an input's)."""
    return syncs.constructed_copy_sync_count >= syncs.input_copy_sync_count > 0


def _copy_advice(syncs: SyncResult) -> tuple[str, str]:
    """The copies' advice and snippet: where the tensor is made, where every syncing copy built
    a tensor from Python data; the input copies' otherwise."""
    if _all_constructed(syncs):
        return _CONSTRUCTED_COPY_ADVICE, _CONSTRUCTED_COPY_SNIPPET
    return _INPUT_COPY_ADVICE, _INPUT_COPY_SNIPPET


_SYNC_ADVICE = (
    "Remove per-step .item(), .cpu(), print(tensor) and tensor-valued if-conditions from the "
    "loop; accumulate metrics on the GPU and read them every N steps; time with CUDA events."
)

# the same, after another sentence's colon
_SYNC_ADVICE_AFTER = _SYNC_ADVICE[0].lower() + _SYNC_ADVICE[1:]


_SERVING_SYNC_ADVICE = (
    "This is {}'s serving loop: it reads each step's sampled tokens back by design, so the host "
    "waits for the GPU once a step. What shortens the wait is less host work between steps and "
    "more work in each: let the scheduler prepare the next step while the GPU runs this one "
    "(vLLM's --async-scheduling; SGLang's overlap scheduler, on unless disabled), keep decode in "
    "CUDA graphs, and run more sequences a step (vLLM's max_num_seqs, SGLang's "
    "--max-running-requests)."
)


# host_sync idle below this is not said as a time ("0.00 ms"): the GPU kept working
SYNC_IDLE_SAY_MIN_NS = 5_000


@rule(
    "host_sync",
    advice={
        "cuda_app": Advice(
            "Take cudaDeviceSynchronize/cudaStreamSynchronize out of the loop: order work with "
            "streams and events (cudaEventRecord, then cudaStreamWaitEvent) so the host keeps "
            "queuing kernels; read results back only every N iterations and time with "
            "cudaEventElapsedTime, not a sync.",
            (
                "// before: kernel<<<g, b, 0, s>>>(...); cudaDeviceSynchronize();\n"
                "cudaEventRecord(done, s);              // mark what the consumer needs\n"
                "cudaStreamWaitEvent(other, done, 0);   // the GPU waits, not the host\n"
                "if (iter % N == 0) cudaEventSynchronize(done);  // host reads every N iterations"
            ),
        )
    },
    fix="remove_syncs",
    per_site=True,
    recommendation=_SYNC_ADVICE,
    snippet=(
        "# before: print(loss.item()) every step\n"
        "if step % 100 == 0:\n"
        "    print(loss.detach().float().item())   # one sync per 100 steps\n"
        "# time steps with torch.cuda.Event(enable_timing=True) instead of synchronize()"
    ),
)
def host_sync(x: RuleInput) -> Draft | None:
    syncs = x.r.syncs
    # a sync with no GPU work recorded idles nothing (a public course trace's one
    # cudaDeviceSynchronize and no kernel read "leaves the GPU idle 0.00 ms": session 53)
    if syncs.host_sync_count <= 0 or x.r.idle.busy_ns == 0:
        return None
    cost = x.idle("host_sync")
    top = syncs.by_op[0] if syncs.by_op else {}
    sources = x.sources("host_sync", "blocking_copy")
    advice: dict[str, str] = {}
    site = sources[0] if sources else None
    if x.r.host_ops.serving_engine is not None:
        advice = {"recommendation": _SERVING_SYNC_ADVICE.format(x.r.host_ops.serving_engine)}
    elif 0 < syncs.host_sync_count <= syncs.input_copy_sync_count:
        # every sync is an input copy's, .to(device) without non_blocking (audit 17: a V100
        # ResNet's 12 syncs all in aten::to, told to remove .item())
        text, code = _copy_advice(syncs)
        advice = {"recommendation": text, "snippet": code}
    elif 0 < syncs.host_sync_count < 2 * syncs.input_copy_sync_count:
        # most are (audit s60: 11 of 13 syncs after Tensor.cuda() copies, told to remove
        # .item()): their lever first, then the others'
        rest = syncs.host_sync_count - syncs.input_copy_sync_count
        text, code = _copy_advice(syncs)
        advice = {
            "recommendation": f"{text} The other {plural(rest, 'sync')}: " + _SYNC_ADVICE_AFTER,
            "snippet": code,
        }
    elif site is not None and site.library_call:
        advice["recommendation"] = (
            _LIBRARY_SYNCS.format(
                n=site.count, total=syncs.host_sync_count, call=site.trigger, at=site.location
            )
            + _SYNC_ADVICE_AFTER
        )
    # read-backs into pageable memory block in their copy call, not in the stream sync after
    # it (an HTA TorchRec trace: 60 syncs 0.2 ms, their cudaMemcpyAsync 75.7 ms): remove_syncs
    # takes both, so the title says where the host waits
    readback = x.r.copies.host_blocking_copy_ns_by_kind.get("DtoH", 0)
    # most of a read-back's call can be its wait for the work queued before it (audit 10: a
    # TorchRec rank's 704-byte copies behind a 25 ms all-to-all, 617.32 ms held, 2.77 ms
    # copying): said, since pinned memory does not shorten that wait
    copying = x.r.copies.host_blocking_copy_own_ns_by_kind.get("DtoH", readback)
    waiting = (
        f" ({fmt_ms(readback - copying)} of it waiting for the work queued before them)"
        if copying < 0.5 * readback
        else ""
    )
    held = (
        f"; device-to-host copies into pageable memory hold the host {fmt_ms(readback)}{waiting}"
        if readback > syncs.host_sync_blocked_ns
        else ""
    )
    # without a step model no replay says whether the host's work after a sync returned would
    # overlap the GPU once the sync went: where most of the idle is that work (audit 23: a CUDA
    # app's 161.6 of 171.4 ms after its read-backs returned, processing the data), it is said
    # and only the rest is graded (severity never rests on an upper bound alone)
    after = _sync_after_unpriced(x)
    after_words = ""
    graded = cost
    if after:
        after_words = (
            f"; {fmt_ms(after)} of it after the calls returned, the host working on what they "
            f"read back (a saving only where that work can run beside the GPU's)"
        )
        graded = cost - after
    # nor does it say whether the host would queue ahead once the syncs went: it gains the time
    # it waited in them (and in its blocking copies) and no more, so the GPU's idle shrinks
    # by at most that (audit s63: an OpenACC loop's 1,942 syncs "leave the GPU idle 55.72 ms",
    # the host inside them 10.34 ms, each sync returning 1-3 us into a 29 us gap that its
    # next allocation and launch filled)
    waited = syncs.host_sync_blocked_ns + sum(x.r.copies.host_blocking_copy_ns_by_kind.values())
    if (x.r.replay is None or x.r.replay.unprofiled_step_ns is None) and graded > waited:
        after_words += (
            f"; removing them gives the host back the {fmt_ms(waited)} it waits in them, "
            "no more: the rest is its own work between launches"
        )
        graded = waited
    elif (
        not held
        and not after_words
        and cost >= SYNC_IDLE_SAY_MIN_NS  # (under it the title says the host is blocked)
        and syncs.host_sync_blocked_ns >= 2 * cost
    ):
        # the wait is the lever where the GPU stays busy through most of it: the host could
        # do its next work meanwhile, as the replay prices (audit s63 (18): "leave the GPU idle
        # 0.05 ms" beside a 1.38 ms saving a step, the host 4.68 ms in .item()'s syncs)
        after_words += f"; the host waits {fmt_ms(syncs.host_sync_blocked_ns)} in them"
    return Draft(
        graded,
        f"{plural(syncs.host_sync_count, 'host sync')} ({x.per_step(syncs.syncs_per_step)}) "
        + (
            f"{'leaves' if syncs.host_sync_count == 1 else 'leave'} the GPU idle {fmt_ms(cost)}"
            if cost >= SYNC_IDLE_SAY_MIN_NS
            # the GPU kept busy through them: its queue never drained (audit s58: "leave the
            # GPU idle 0.00 ms" where the kernels were queued well ahead)
            else f"{'blocks' if syncs.host_sync_count == 1 else 'block'} the host while the "
            "GPU works through its queue"
        )
        + (f"; most from {_sync_site(top)}" if top else "")
        + held
        + after_words,
        {
            "readback_blocked_ns": readback,
            "idle_ns": cost,
            "host_sync_count": syncs.host_sync_count,
            "syncs_per_step": syncs.syncs_per_step,
            "host_sync_blocked_ns": syncs.host_sync_blocked_ns,
            # of that idle, the part outside every sync and the op around it (1 ms or more of
            # a gap): the host at other work once a sync returned. Not said in the title: where
            # the host then queues more work, removing the sync lets it overlap (the H200 syncs
            # pair: 17.71 of 18.98 ms so, the fix measured 1.45-1.62x); where it does not (a
            # diffusion step's read-back 27 us into a 10.83 ms gap), the replay's saving says so
            "idle_after_return_ns": x.r.idle.host_sync_after_return_ns,
            "by_op": list(syncs.by_op),
            "top_segments": x.segments("host_sync"),
            "causal_chain": x.chain("host_sync", "a sync blocked the host until the queue drained"),
            "profiler_syncs_excluded": syncs.profiler_syncs,
            "input_copy_sync_count": syncs.input_copy_sync_count,
            # of these, torch.distributions' checks' read-backs: distribution_checks prices
            # their ops too (their waits alone are host_sync's)
            **(
                {"distribution_check_syncs": x.r.host_ops.distribution_check_syncs}
                if x.r.host_ops.distribution_check_syncs
                else {}
            ),
            # removing these syncs moves the wait to the blocking calls that remain
            "wait_moves_to": list(x.r.replay.wait_moves) if x.r.replay else [],
            "sources": sources,
        },
        **advice,
    )


def _sync_after_unpriced(x: RuleInput) -> int:
    """The host_sync idle after the calls returned that host_sync does not grade: without a
    step model no replay says whether that host work would overlap the GPU once the syncs went,
    so where it is most of the idle it is said, not priced (0 otherwise). gpu_underutilized
    counts it as the host's work the GPU waited through."""
    cost = x.idle("host_sync")
    after = x.r.idle.host_sync_after_return_ns
    unreplayed = x.r.replay is None or x.r.replay.unprofiled_step_ns is None
    return after if unreplayed and cost > 0 and after >= MAJORITY * cost else 0


def _kernels(n: float | None) -> str:
    """``1 kernel``, ``7 kernels``, ``4.9 kernels`` (a mean over steps keeps its decimal)."""
    n = n or 0
    return plural(int(n), "kernel") if float(n).is_integer() else f"{fmt_num(n)} kernels"


# the costliest site is a call into a library whose own code reads the GPU (torchdiffeq's
# adaptive solver: 398 of 434 syncs inside one odeint call of the loop)
_LIBRARY_SYNCS = (
    "Most of these syncs ({n} of {total}) are inside {call}(), called at {at}: that library's "
    "own code reads the GPU there, so removing .item() from the loop does not touch them; they go "
    "only with fewer calls (more work per call) or a setting of the library that avoids the read "
    "(for an adaptive ODE solver, a fixed step). For the loop's own: "
)


@rule(
    "sync_input_copy",
    advice={"cuda_app": None},  # .to(device) copies: read off ATen's copy ops
    fix="async_input_copies",
    recommendation=_INPUT_COPY_ADVICE,
    snippet=_INPUT_COPY_SNIPPET,
    thresholds={"input_copy_blocked_min_ratio": 0.01},
)
def sync_input_copy(x: RuleInput) -> Draft | None:
    syncs = x.r.syncs
    blocked = syncs.input_copy_blocked_ns
    if (
        syncs.input_copy_sync_count <= 0
        or blocked < x.t["input_copy_blocked_min_ratio"] * x.window_ns
    ):
        return None
    n, built = syncs.input_copy_sync_count, syncs.constructed_copy_sync_count
    evidence = {
        "input_copy_sync_count": n,
        "input_copy_blocked_ns": blocked,
        "input_copy_idle_ns": syncs.input_copy_idle_ns,
        "host_sync_count": syncs.host_sync_count,
        "constructed_copy_sync_count": built,
    }
    # attributed: the GPU idle while those syncs held the host (blocked time with the GPU busy
    # costs nothing by itself; the model prices the rest where there is one)
    if _all_constructed(syncs):
        # every one is a tensor built from Python data, not an input's .to(): the advice is
        # where the constant is made (audit of a held-out Llama: "each .to(device) without
        # non_blocking" named a copy inside transformers' eager masking)
        att = x.r.efficiency.attention
        shared = (
            # the eager attention's mask makes them: its fused fix removes them too
            "; they make the eager attention's mask: attention_unfused's fix removes them too"
            if att is not None and att.mask_syncs >= n
            else ""
        )
        if shared:
            evidence["saving_shared_with"] = "attention_unfused"
        return Draft(
            syncs.input_copy_idle_ns,
            f"{plural(n, 'tensor')} built from Python data on the device "
            f"{'waits' if n == 1 else 'wait'} for the GPU: torch.tensor(x, device=...) (or "
            f"t.new_tensor(x)) copies from pageable memory and syncs the stream, "
            f"{fmt_ms(blocked)} of host time blocked{shared}",
            evidence,
            recommendation=_CONSTRUCTED_COPY_ADVICE,
            snippet=_CONSTRUCTED_COPY_SNIPPET,
        )
    of_them = (
        f" ({built} of them tensors built from Python data: torch.tensor(x, device=...) or "
        "t.new_tensor(x))"
        if built
        else ""
    )
    return Draft(
        syncs.input_copy_idle_ns,
        f"{plural(n, 'input copy', 'input copies')}{of_them} "
        f"{'waits' if n == 1 else 'wait'} for the GPU: each .to(device) without "
        f"non_blocking syncs the stream, {fmt_ms(blocked)} of host time blocked",
        evidence,
    )


_STATIC_SHAPES = (
    "Inputs change shape between steps ({op}: {dims}; {ops} ops in {steps} steps), and a CUDA "
    "graph replays fixed shapes (each new shape is another capture; torch.compile's "
    "reduce-overhead mode crashed a sentence-transformers loop like this): pad every batch to a "
    "fixed length, or to a few bucket lengths, first (a T5 loop padded to multiples of 64, "
    "then under reduce-overhead, ran 2.1-2.6x faster, after one capture per padded shape); then "
    "cut per-kernel CPU cost with torch.compile (mode='reduce-overhead' adds CUDA graphs) or a "
    "captured step, or give each kernel more work (larger batch). The prediction assumes the "
    "shapes fixed."
)
_INFERENCE_LAUNCH_SNIPPET = (
    'model = torch.compile(model, mode="reduce-overhead")  # fuses ops and replays CUDA graphs\n'
    "# or capture the forward by hand on static inputs (one graph per input shape):\n"
    "# g = torch.cuda.CUDAGraph(); with torch.cuda.graph(g): static_out = model(static_x)\n"
    "# then each call: static_x.copy_(x); g.replay()\n"
    "# and raise the work per call: a larger batch"
)


# (the default mode alone launches each Triton kernel from Python, dearer than eager's: a
# held-out DDPM U-Net's host-bound step ran 0.75-0.83x compiled by default, session 61; the
# priced fix is the graphs)
def _stall_words(ho: HostOpsResult) -> str:
    """The host stalls named by the longest: "usually quick ops (OP D against M a call)"."""
    top = ho.host_stalls[0]
    return (
        f"usually quick ops ({top.name} {fmt_ms(top.dur_ns)} against "
        f"{fmt_ns(top.median_ns)} a call)"
    )


# the launching thread stalled inside quick ops: what holds it comes first
HOST_STALL_WHY = (
    "The launching thread stalls inside ops that usually take microseconds (the title's): it "
    "was descheduled or waited on a lock, which no launch saving removes. Give the process "
    "cores of its own (taskset or numactl; fewer DataLoader workers, OMP/MKL threads or other "
    "jobs on the host) and look for another thread holding what the step needs (a "
    "pin-memory, logging or checkpoint thread; py-spy dump during a stall shows it)."
)
_HOST_STALL_ADVICE = HOST_STALL_WHY + " Then: "
_LAUNCH_ADVICE = (
    "Cut per-kernel CPU cost: torch.compile (mode='reduce-overhead' adds CUDA graphs; the "
    "default mode alone fuses kernels but launches each from Python, and on a step this "
    "host-bound can run slower), capture the step in a CUDA graph, use fused kernels, or give "
    "each kernel more work (larger batch). The saving assumes the model compiles without graph "
    "breaks: each break is one more graph replayed from Python (check with "
    "TORCH_LOGS=graph_breaks). On ROCm the same calls record HIP graphs."
)
# the step already compiled (COMPILED_KERNEL_MIN_RATIO of its kernels Inductor's): its launches
# are compiled code's, and the lever left is replaying them (session 54: a default-mode compiled
# training step, 65% of its kernels Triton, told "torch.compile ... use fused kernels")
_COMPILED_LAUNCH = (
    "The step is already compiled ({pct} of its kernels are torch.compile's Triton kernels), so "
    "the launches left are the compiled code's own: replay them as CUDA graphs, "
    "torch.compile's mode='reduce-overhead' (it needs the same shapes every step), or capture "
    "the whole step by hand; or give each kernel more work (larger batch). On ROCm the same "
    "calls record HIP graphs."
)
# the compiled code's launches are the lever where the idle before what it launched is at least
# this share of the launch-bound idle; below it, the launches outside it are (audit 16: a fusion
# demo 30% Triton kernels, 9% of its launch idle before compiled code, told "already compiled")
COMPILED_LAUNCH_MIN_SHARE = 0.5
_PARTLY_COMPILED = (
    "Part of the program is compiled ({pct} of its kernels are torch.compile's), but {share} of "
    "the launch-bound idle ({outside}) comes before work launched outside the compiled code "
    "(its sources below): that part runs eager. "
)
# a compiled step in this many pieces a step or more (CUDA graph replays or compiled-region
# calls): graph breaks or recompiles, not launch cost, are the lever (a step compiled whole
# calls one or two regions and replays one graph each way)
COMPILED_PIECES_MIN_PER_STEP = 16
_COMPILED_PIECES = (
    "The step is compiled, but in pieces: {pieces} a step ({regions} compiled-region calls of "
    "{frames} compiled frames{graphs}). Graph breaks (a .item(), print, data-dependent branch "
    "or untraceable call inside forward) and recompiles (shapes, dtypes or flags changing) "
    "split it, and each piece costs its own Python call, guards and launch; reduce-overhead "
    "then replays many small graphs (a diffusion U-Net so: 205 compiled regions and 311 graph "
    "replays a step, 0.90-1.14x against eager). Find them with "
    'TORCH_LOGS="graph_breaks,recompiles" or torch._dynamo.explain, remove the breaks, keep '
    "shapes fixed; one graph each way replays the step with few launches."
)
_COMPILED_PIECES_SNIPPET = (
    'TORCH_LOGS="graph_breaks,recompiles" python train.py  # each break and recompile, with its line\n'
    "# or: ex = torch._dynamo.explain(model)(*example_inputs)\n"
    "#     print(ex.graph_count, ex.graph_break_count, ex.break_reasons)"
)


@dataclass(frozen=True)
class CompiledPieces:
    """A compiled step's pieces a step: the more of its CUDA graph replays and compiled-region
    calls, each a step, and the distinct compiled frames."""

    pieces: float
    regions: float
    graphs: float
    frames: int


def compiled_pieces(r: Results) -> CompiledPieces | None:
    """:class:`CompiledPieces` where they reach :data:`COMPILED_PIECES_MIN_PER_STEP`; None
    otherwise or without steps."""
    la = r.launch
    if not la.steps or not la.compiled_regions:
        return None
    regions, graphs = la.compiled_regions / la.steps, la.graph_launches / la.steps
    if max(regions, graphs) < COMPILED_PIECES_MIN_PER_STEP:
        return None
    return CompiledPieces(max(regions, graphs), regions, graphs, la.compiled_frames)


_COMPILED_LAUNCH_SNIPPET = (
    'model = torch.compile(model, mode="reduce-overhead")  # was the default mode: adds CUDA graphs\n'
    "# or capture the whole step by hand (static inputs, the optimizer made capturable):\n"
    "# g = torch.cuda.CUDAGraph(); with torch.cuda.graph(g): loss = step(static_x, static_y)"
)
_FIXED_PATH = (
    "The steps run different ops ({op}: {lo} to {hi} calls a step; {pct} of a step's op calls "
    "vary: a module skipped at random, such as LayerDrop, or a data-dependent branch), and a "
    "CUDA graph replays one path: torch.compile's reduce-overhead mode breaks the graph at each "
    "such branch and records each new path again (0.22-0.27x measured on a wav2vec2 loop with "
    "LayerDrop). Fix the path first (turn the random skipping off, or take the branch out of "
    "the captured code); until then the saving below is out of reach, and this is graded low. "
)
_DATA_SIZED = (
    "The model's own ops size their outputs from the data ({op}: {op_n} calls a step; {n} a step "
    "of nonzero, masked_select and unique: sampling or filtering such as a detector's proposals): "
    "each reads the GPU, and neither a CUDA graph nor one compiled graph can hold it "
    "(torch.compile breaks its graph at each). Until they have static sizes (torch.nonzero_static, "
    "masks applied with torch.where) the saving below is out of reach, and this is graded low. "
)
_RNN = (
    "The model runs recurrent modules ({op}), which torch.compile does not trace "
    "(torch._dynamo.config.allow_rnn is off by default): reduce-overhead leaves them eager "
    "between graph breaks (0.82-0.83x measured on pytorch/examples' word-level LSTM). Capture "
    "the whole step by hand with torch.cuda.graph instead (static inputs and hidden state; "
    "2.32-2.67x there). Then cut per-kernel CPU cost further with fused kernels, or give each "
    "kernel more work (larger batch)."
)
_RNN_SNIPPET = (
    "# after 3 warm-up steps on a side stream, with grads set to None:\n"
    "g = torch.cuda.CUDAGraph()\n"
    "with torch.cuda.graph(g):\n"
    "    out, (h, c) = model(static_x, static_hidden)\n"
    "    loss = criterion(out, static_y)\n"
    "    loss.backward()\n"
    "    optimizer.step()  # fused=True, or capturable=True\n"
    "    static_hidden[0].copy_(h.detach()); static_hidden[1].copy_(c.detach())\n"
    "# each step: static_x.copy_(x); static_y.copy_(y); g.replay()"
)
_STATIC_SNIPPET = (
    "# pad to one length so every step has the same shapes, e.g. a tokenizer's\n"
    'batch = tokenizer(texts, padding="max_length", max_length=128, truncation=True, '
    'return_tensors="pt")\n'
    'model = torch.compile(model, mode="reduce-overhead")  # fuses ops and replays CUDA graphs'
)


# the host twice as fast moves the un-profiled step by less than this: it does not bound it
HOST_MOOT_SPEEDUP = 1.02
# the host's other work between a step's launches is named in launch_bound's title from this
# share of its launch idle
LAUNCH_MORE_MIN_RATIO = 0.1


def shape_words(dims: str) -> str:
    """Recorded input dims (``[[], [300, 2048], []]``: Kineto's text) as shapes in words
    (``300x2048``), the dimensionless inputs left out (audit 19: Python lists in the advice)."""
    try:
        parsed = json.loads(dims)
    except ValueError:
        return dims
    if not isinstance(parsed, list):
        return dims
    shapes = [_shape(d) for d in parsed if isinstance(d, list) and d]
    return ", ".join(shapes) or "scalars"


def _shape(d: list[Any]) -> str:
    """One input's dims: ``2x3``; a list of tensors (``torch.cat``'s) as ``(2x3 + 4x5)``."""
    if all(isinstance(n, list) for n in d):
        return "(" + " + ".join(_shape(n) if n else "scalar" for n in d) + ")"
    return "x".join(str(n) for n in d)


# what launch_bound's priced capture holds (evidence.captured)
_CAPTURED_MODEL = (
    "the model's forward, and its backward where the step runs one (its nn.Module frames in "
    "the Python stacks, with the "
    "user's function that calls them where that function holds none of the loop's backward, "
    "optimizer step or step boundary: compile that function); the loop's other ops stay eager"
)
_CAPTURED_ALL = (
    "every torch op of the step: the trace has no nn.Module frames (Python stacks) to tell the "
    "model's ops from the loop's own (a loss or metrics outside the model, an RL loop's rollout "
    "writes and returns), so where the loop runs such ops the saving is the upper end; "
    "with_stack=True prices the model alone"
)
# Python stacks recorded, but no nn.Module frame in them (a model of hand-written kernels called
# from a script; session 56's audit: a T4 trace recorded with_stack=True was told to record it)
_CAPTURED_STACKS_NO_MODULE = (
    "every torch op of the step: the trace's Python stacks hold no nn.Module frame (the work "
    "is not called through torch.nn modules) to tell the model's ops from the loop's own, so "
    "where the loop runs such ops the saving is the upper end"
)


@rule(
    "launch_bound",
    advice={
        "cuda_app": Advice(
            "Cut per-launch CPU cost: capture an iteration's launches in a CUDA graph once "
            "(cudaStreamBeginCapture, cudaStreamEndCapture, cudaGraphInstantiate) and replay it "
            "with one cudaGraphLaunch; fuse small kernels and batch small launches so each does "
            "more work.",
            (
                "cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);\n"
                "for (auto& t : tasks) small_kernel<<<g, b, 0, s>>>(t);  // the iteration's launches\n"
                "cudaStreamEndCapture(s, &graph);\n"
                "cudaGraphInstantiate(&exec, graph, 0);  // once\n"
                "cudaGraphLaunch(exec, s);               // each iteration: one launch"
            ),
        )
    },
    fix="cuda_graphs",
    recommendation=_LAUNCH_ADVICE,
    snippet=(
        'model = torch.compile(model, mode="reduce-overhead")  # fuses ops and replays CUDA graphs\n'
        "# or capture the whole step by hand (static inputs, the optimizer made capturable: fused=True\n"
        "# adds no kernels, capturable=True on a per-parameter AdamW adds ~14 a parameter):\n"
        "# g = torch.cuda.CUDAGraph(); with torch.cuda.graph(g): loss = step(static_x, static_y)\n"
        "# and raise the per-step work: a larger batch or sequence length"
    ),
)
def launch_bound(x: RuleInput) -> Draft | None:
    cost = x.idle("launch_overhead")
    if cost <= 0:
        return None
    launch = x.r.launch
    shapes, path = launch.shape_change, launch.path_change
    advice: dict[str, str] = {}
    if shapes is not None and x.framework == "pytorch":
        advice = {
            "recommendation": _STATIC_SHAPES.format(
                op=shapes.op,
                dims=" and ".join(shape_words(d) for d in shapes.input_dims),
                ops=shapes.ops,
                steps=shapes.steps,
            ),
            "snippet": _STATIC_SNIPPET,
        }
    if path is not None and x.framework == "pytorch":
        first = _FIXED_PATH.format(
            op=path.op, lo=path.calls[0], hi=path.calls[1], pct=fmt_pct(path.ratio)
        )
        advice["recommendation"] = first + advice.get("recommendation", _LAUNCH_ADVICE)
    sized = launch.data_sized
    if sized is not None and x.framework == "pytorch":
        first = _DATA_SIZED.format(
            op=sized.op, op_n=fmt_num(sized.op_per_step), n=fmt_num(sized.per_step)
        )
        advice["recommendation"] = first + advice.get("recommendation", _LAUNCH_ADVICE)
    if launch.rnn_op is not None and x.framework == "pytorch" and not advice:
        advice = {"recommendation": _RNN.format(op=launch.rnn_op), "snippet": _RNN_SNIPPET}
    pieces = compiled_pieces(x.r)
    if pieces is not None and x.framework == "pytorch" and not advice:
        advice = {
            "recommendation": _COMPILED_PIECES.format(
                pieces=fmt_num(pieces.pieces),
                regions=fmt_num(pieces.regions),
                frames=pieces.frames,
                graphs=f"; {fmt_num(pieces.graphs)} CUDA graph replays"
                if pieces.graphs >= 1
                else "",
            ),
            "snippet": _COMPILED_PIECES_SNIPPET,
        }
    if compiled_code(x.r) and x.framework == "pytorch" and not advice:
        pct = fmt_pct(x.r.kernels.compiled_kernel_ratio)
        outside = max(0, cost - x.r.idle.launch_overhead_compiled_ns)
        if outside <= (1 - COMPILED_LAUNCH_MIN_SHARE) * cost:
            advice = {
                "recommendation": _COMPILED_LAUNCH.format(pct=pct),
                "snippet": _COMPILED_LAUNCH_SNIPPET,
            }
        else:
            first = _PARTLY_COMPILED.format(
                pct=pct, share=fmt_pct(outside / cost), outside=fmt_ms(outside)
            )
            advice = {"recommendation": first + _LAUNCH_ADVICE}
    if x.r.host_ops.forward_only and x.framework == "pytorch" and "snippet" not in advice:
        # no backward, no optimizer: the training step's snippet does not fit (audit 17: an
        # inference trace told to make its optimizer capturable)
        advice["snippet"] = _INFERENCE_LAUNCH_SNIPPET
    # the host's longer work between the step's launches starved the GPU too: said here, where
    # the whole-step capture prices it, not as a second finding (gpu_underutilized)
    between = x.r.idle.cpu_work_between_launches_ns
    more = (
        f"; {fmt_ms(between)} more while the host ran other work between them"
        if between >= LAUNCH_MORE_MIN_RATIO * cost
        else ""
    )
    # the thread stalled inside usually quick ops: neither launch cost nor the Python between
    # them, and no graph's doing (audit s61: Megatron TP8's rank 0)
    ho = x.r.host_ops
    if ho.host_stalls and ho.host_stall_idle_ns >= max(
        HOST_STALL_MIN_NS, LAUNCH_MORE_MIN_RATIO * (cost + between)
    ):
        more += (
            f"; the thread stalled {fmt_ms(ho.host_stall_idle_ns)} of the GPU's idle inside "
            f"{_stall_words(ho)}: descheduled or blocked, not launching"
        )
        advice["recommendation"] = _HOST_STALL_ADVICE + advice.get("recommendation", _LAUNCH_ADVICE)
    rp = x.r.replay
    host_alone = rp.engine_speedups.get("host") if rp is not None else None
    # what the priced capture holds: with nn.Module frames, the model's calls; without, every
    # torch op of the step (CleanRL's PPO, no stacks: 2.63x priced, its policy compiled with
    # reduce-overhead measured 1.55-1.71x, GAE's loop, the rollout's writes and the optimizer
    # left eager)
    h = rp.model.host if rp is not None and rp.model is not None else None
    captured = None
    if h is not None and x.framework == "pytorch":
        model_only = "in_model" in h.columns and bool(h["in_model"].any())
        captured = (
            _CAPTURED_MODEL
            if model_only
            else _CAPTURED_STACKS_NO_MODULE
            if x.r.sources.stacks_recorded
            else _CAPTURED_ALL
        )
    if rp is not None and rp.step_bound_by == "kernels" and (host_alone or 2.0) < HOST_MOOT_SPEEDUP:
        # the profiled trace's launch gaps, which the un-profiled step does not have: there the
        # kernels bound it (audit 20: a GH200 loop, host 2x faster 1.00x, kernels 1.87x), and
        # a graph saves the device's gaps between its kernels, not host time
        more += (
            "; without the profiler the kernels bound the step: a graph saves the gaps between "
            "them, not host time"
        )
    return Draft(
        cost,
        f"Launch-bound: the GPU drains faster than the CPU issues kernels ({fmt_ms(cost)} idle "
        f"between launches{more})",
        {
            "idle_ns": cost,
            "kernels_per_step": x.r.kernels.kernels_per_step,
            "launch_calls_per_step": launch.launch_calls_per_step,
            "launch_call_median_ns": launch.launch_call_median_ns,
            "kernel_median_ns": launch.kernel_median_ns,
            "short_kernel_ratio": launch.short_kernel_ratio,
            "queue_depth_median": launch.queue_depth_median,
            "top_segments": x.segments("launch_overhead"),
            "causal_chain": x.chain(
                "launch_overhead", "each kernel finished before the host had launched the next"
            ),
            # the other priced fix: the whole step in one graph, the optimizer's step too, a
            # larger change (the saving and severity rest on the model-only capture, the first
            # fix advised: measured on the launch-bound loop, 1.49-2.36x against 1.54x)
            "what_if_whole_step": x.r.replay.what_if.get("cuda_graphs_whole_step")
            if x.r.replay
            else None,
            # the host's other work between a step's launches (Python, ops' CPU work): the
            # whole-step capture removes it too, the model-only one not (gpu_underutilized
            # counts it explained here)
            "cpu_work_between_launches_ns": x.r.idle.cpu_work_between_launches_ns,
            # usually quick ops the thread stalled in, and the GPU's idle during them
            "host_stalls": list(ho.host_stalls),
            "host_stall_idle_ns": ho.host_stall_idle_ns,
            "sources": x.sources("launch"),
            # torch ops whose input shapes change between steps: CUDA graphs need them fixed
            "shape_change": shapes,
            # ops whose count changes between steps: a graph replays one path
            "path_change": path,
            # ops whose output size depends on the data: no graph holds them
            "data_sized": sized,
            # a recurrent module torch.compile leaves eager: the advice, and the saving, is the
            # whole step captured by hand
            "rnn_op": launch.rnn_op,
            **({"priced_by": "cuda_graphs_whole_step"} if launch.rnn_op is not None else {}),
            **({"captured": captured} if captured is not None else {}),
        },
        **advice,
        # the priced fixes replay one path of fixed sizes for every step: out of reach while
        # the path varies or the model's ops size their outputs from the data
        cap="low" if path is not None or sized is not None else None,
        cap_reason="the steps' shapes or op paths vary (or ops size their outputs from the "
        "data): a CUDA graph or compiled step needs them fixed first",
    )


# a direction's share of pageable_memcpy's figure from which its title names both directions
PART_MIN_RATIO = 0.01


# each direction at least this share of the blocked copies' own time: the title names both
BOTH_DIRECTIONS_RATIO = 0.25


# the pageable copies' time at the pinned rate from this share of the blocked time on: the title
# says what pinning leaves
PINNED_STILL_MIN_RATIO = 0.05
PINNED_STILL_MIN_NS = 10_000  # and at least this: "would still take 0.00 ms" says nothing


@rule(
    "pageable_memcpy",
    advice={
        "cuda_app": Advice(
            "Copy to and from pinned host memory: allocate host buffers with cudaHostAlloc (or "
            "pin existing ones with cudaHostRegister) and copy with cudaMemcpyAsync on a stream, "
            "so the copy neither blocks the host nor stages through a bounce buffer and can "
            "overlap kernels (hipHostMalloc, hipMemcpyAsync on ROCm). OpenMP offload or OpenACC "
            "with the NVIDIA HPC compilers: build with -gpu=pinned (the runtime's host copies "
            "are staged otherwise). A buffer copied once gains only if pinning it costs less "
            "than the time saved.",
            (
                "double* h; cudaHostAlloc(&h, bytes, cudaHostAllocDefault);  // once, not malloc/new\n"
                "cudaMemcpyAsync(d, h, bytes, cudaMemcpyHostToDevice, stream);\n"
                "// or pin a buffer you have: cudaHostRegister(buf, bytes, cudaHostRegisterDefault);"
            ),
        )
    },
    fix="pinned_copies",
    recommendation="Copy from pinned memory (DataLoader(pin_memory=True) or tensor.pin_memory()) with "
    "non_blocking=True so the copy runs asynchronously and can overlap compute.",
    snippet=(
        "loader = DataLoader(..., pin_memory=True)\n"
        "x = x.to(device, non_blocking=True)          # async only from pinned memory\n"
        "# for your own buffers: host = torch.empty(shape, pin_memory=True)"
    ),
    # copies costing less than this share of the window and of the uploaded bytes are no lever
    # (audit 17: a B200's two 8-byte uploads read "0.0% of HtoD bytes, 0.02 ms blocked")
    thresholds={"pageable_min_ratio": 0.001},
)
def pageable_memcpy(x: RuleInput) -> Draft | None:
    copies = x.r.copies
    if copies.h2d_pageable_bytes <= 0 and x.idle("pageable_copy") <= 0:
        return None
    ratio = copies.h2d_pageable_bytes_ratio
    blocked = (
        sum(c["blocked_ns"] for c in copies.pageable_calls if c["blocked_ns"])
        if copies.pageable_calls
        else 0
    )
    # the copies' own time under their calls: a read-back's wait for the queued work before it
    # is a sync's, which pinned memory does not remove
    cost = max(copies.host_blocking_copy_own_ns, x.idle("pageable_copy"))
    if cost < x.t["pageable_min_ratio"] * x.window_ns and (ratio or 0) < x.t["pageable_min_ratio"]:
        # a few bytes beside pinned uploads: the replay can still price a loop's own small
        # pageable copies (accelerate's, LoRA's 0.07 ms: their fixes measured)
        return None
    # the copies' own time by direction (the blocked time holds the waits for queued work)
    by_kind = copies.host_blocking_copy_own_ns_by_kind or copies.host_blocking_copy_ns_by_kind
    dtoh, htod = by_kind.get("DtoH", 0), by_kind.get("HtoD", 0)
    readback = dtoh > htod
    # both directions a large part: the title names both (audit 14: "Device-to-host copies
    # ... 671.25 ms blocked" summed 348 ms of reads and 323 ms of uploads)
    both = min(dtoh, htod) >= BOTH_DIRECTIONS_RATIO * max(1, dtoh + htod)
    # the calls' own time, beyond their wait for the GPU work queued before them (a sync's
    # cost, which pinned memory does not remove; the evidence's calls hold both: audit 19,
    # "0.26 ms blocked" beside "host blocked in copies 1.27 ms")
    blocked = f"{fmt_ms(cost)} blocked" + (
        "" if cost > copies.host_blocking_copy_own_ns else " beyond waiting for earlier GPU work"
    )
    title = (
        f"Copies to and from pageable memory block the host: {blocked}"
        if both
        else f"Device-to-host copies into pageable memory block the host: {blocked}"
        if readback
        else f"Host-to-device copies from pageable memory block the host: {fmt_pct(ratio)} of HtoD bytes, {blocked}"
    )
    own = copies.host_blocking_copy_own_ns
    if cost > own:
        # the figure is the GPU's idle under the calls, longer than the copies themselves
        # (audit 10: "7.70 ms blocked (2.77 ms device-to-host, 0.00 ms host-to-device)")
        title += f" ({fmt_ms(own)} of it the copies themselves)" if own else ""
    elif min(dtoh, htod) >= PART_MIN_RATIO * cost:
        # both directions block: their own times, which the title's figure holds
        title += (
            f" ({fmt_ms(dtoh)} device-to-host, {fmt_ms(htod)} host-to-device)"
            if readback
            else f" ({fmt_ms(htod)} host-to-device, {fmt_ms(dtoh)} device-to-host)"
        )
    # pinned, the bytes still cross the link: the saving is the copies' time beyond that
    # (audit 21: 102 GB of offload copies, 26.13 s, priced as if pinned ones took none)
    pinned = copies.pageable_copy_pinned_ns
    # the saving: the host's blocked time less the copies at the pinned rate; where the cost is
    # the GPU's idle under the calls (longer than the calls' own time), that idle held no copy
    # (a copy is busy time) and goes whole
    saving = own - pinned if cost <= own else cost
    idle = x.r.idle
    if idle.kernel_busy_ratio is not None:
        # the run ends no earlier than its kernels: the host's blocked time beyond the window
        # less the kernels' busy union ran beside another stream's kernels (audit s62: 271.79 ms
        # claimed of a 509.33 ms window whose kernels ran 257.8 ms)
        floor = round(idle.kernel_busy_ratio * idle.device_window_ns)
        saving = min(saving, max(0, x.window_ns - floor))
    if (
        copies.pinned_bytes_per_s
        and PINNED_STILL_MIN_RATIO * cost <= pinned < cost
        and pinned >= PINNED_STILL_MIN_NS
        and cost <= own
    ):
        title += (
            f"; from pinned memory they would still take {fmt_ms(pinned)} "
            f"({copies.pinned_bytes_per_s / 1e9:.0f} GB/s)"
        )
    shared = not readback and "dataloader_stall" in {f.id for f in x.found}
    if shared:
        title += "; the same fix as dataloader_stall's pin_memory=True, not an extra saving"
    return Draft(
        max(0, saving),
        title,
        {
            "h2d_bytes": copies.h2d_bytes,
            "h2d_pageable_bytes": copies.h2d_pageable_bytes,
            "h2d_pageable_bytes_ratio": ratio,
            "host_blocking_copy_ns": copies.host_blocking_copy_ns,
            "host_blocking_copy_own_ns": copies.host_blocking_copy_own_ns,
            "host_blocking_copy_count": copies.host_blocking_copy_count,
            "top_blocked_ns": blocked,
            "top_copies": list(copies.pageable_calls[:5]),
            "blocked_ns_by_kind": dict(copies.host_blocking_copy_ns_by_kind),
            "own_ns_by_kind": dict(by_kind),
            "pageable_copy_ns": copies.pageable_copy_ns,
            "pageable_copy_pinned_ns": pinned,
            "pinned_bytes_per_s": copies.pinned_bytes_per_s,
            "sources": x.sources("blocking_copy"),
            # the loader's fix (pin_memory=True) pins the uploads too: the two savings overlap
            # (audit 15: 14.33 and 12.94 ms a step claimed, 14.33 together)
            **({"saving_shared_with": "dataloader_stall"} if shared else {}),
        },
        *(READBACK_ADVICE if readback else (None, None)),
    )


def _sync_site(top: Mapping[str, object]) -> str:
    """Where most syncs come from: their enclosing op, or their API call outside any op (a CUDA
    application records none)."""
    op, api = top.get("op"), top.get("api")
    return f"{api} outside any recorded op" if op == "(no enclosing op)" and api else str(op)


@rule(
    "unified_memory",
    advice={
        "cuda_app": Advice(
            "Pages of managed memory (cudaMallocManaged) migrate on demand: the GPU idles while "
            "the host touches them and they move back and forth a page at a time. Prefetch them "
            "to the device before the kernels that use them (cudaMemPrefetchAsync), advise "
            "where they live (cudaMemAdvise: SetPreferredLocation; SetReadMostly for data both "
            "sides read), move results back only where the host reads them; or use device "
            "memory (cudaMalloc) with explicit copies.",
            (
                "cudaMemAdvise(buf, bytes, cudaMemAdviseSetPreferredLocation, dev);\n"
                "cudaMemPrefetchAsync(buf, bytes, dev, stream);  // before the kernels\n"
                "kernel<<<grid, block, 0, stream>>>(buf);\n"
                "cudaMemPrefetchAsync(buf, bytes, cudaCpuDeviceId, stream);  // only if the host reads it"
            ),
        )
    },
    no_estimate="how long the pages take to move once prefetched in bulk depends on the access "
    "pattern, which the trace does not show: the cost is the GPU's idle between migrations",
    recommendation="Managed (unified) memory migrates page by page on demand while the GPU "
    "waits: allocate device memory instead (a library or allocator may be set to managed "
    "memory: RMM's managed_memory_resource, CuPy's malloc_managed), or prefetch the pages to "
    "the GPU before the kernels that use them and keep the host from touching them between.",
    snippet=(
        "import cupy  # e.g. when a library allocates managed memory\n"
        "cupy.cuda.set_allocator(cupy.cuda.MemoryPool().malloc)  # device memory, not managed"
    ),
    thresholds={"unified_idle_min_ratio": 0.05},
)
def unified_memory(x: RuleInput) -> Draft | None:
    idle = x.idle_over("unified_memory", "unified_idle_min_ratio")
    if idle is None:
        return None
    after = x.r.idle.unified_memory_after_kernels_ns
    title = (
        f"Unified memory: the GPU idles {fmt_ms(idle)} between on-demand page migrations "
        f"({fmt_pct(idle / max(1, x.window_ns))} of the window)"
    )
    advice: dict = {}
    if after >= 0.5 * idle:  # most of it
        # no kernel after it: the host reads what the GPU wrote a page at a time, which a
        # prefetch to the host turns into one bulk migration (audit s58: an A100 vector add's
        # check loop over 2.15 GB of results at 0.59 GB/s, told to prefetch to the device)
        title += (
            f", {fmt_ms(after)} of it after the last kernel: the host reads the results "
            "through page faults"
        )
        advice = {
            "recommendation": UM_READBACK_ADVICE[0],
            "snippet": UM_READBACK_ADVICE[1],
            "advice": {"cuda_app": Advice(*UM_READBACK_ADVICE)},
        }
    um = x.r.idle
    inside = um.unified_migrations_in_kernels_ns
    if inside >= x.t["unified_idle_min_ratio"] * x.window_ns:
        # the kernels faulted pages in as they ran: kernel time, not idle, so not in the
        # graded cost (how much of it the kernel's own work would take is not in the trace)
        title += (
            f"; {plural(um.unified_migrations_in_kernels, 'migration')} "
            f"({fmt_bytes(um.unified_migrations_in_kernels_bytes)}) ran inside kernels, beside "
            f"{fmt_ms(inside)} of kernel time: the kernels faulted their pages in (prefetch "
            "them to the device before the launch)"
        )
    return Draft(
        idle,
        title,
        {
            "idle_ns": idle,
            "after_last_kernel_ns": after,
            "migrations_in_kernels": um.unified_migrations_in_kernels,
            "migrations_in_kernels_bytes": um.unified_migrations_in_kernels_bytes,
            "migrations_in_kernels_ns": inside,
            "top_segments": x.segments("unified_memory"),
        },
        **advice,
    )


UM_READBACK_ADVICE = (
    "Most of it comes after the GPU's last kernel: the host reads managed memory the GPU "
    "wrote, and each page it touches faults and migrates on its own. Prefetch the results to "
    "the host in bulk before reading them (cudaMemPrefetchAsync to cudaCpuDeviceId, then "
    "synchronize), or copy them once into host memory (cudaMemcpy); keep the prefetches to the "
    "device before the kernels.",
    "kernel<<<grid, block, 0, stream>>>(buf);\n"
    "cudaMemPrefetchAsync(buf, bytes, cudaCpuDeviceId, stream);  // results to the host in bulk\n"
    "cudaStreamSynchronize(stream);  // then read buf on the host",
)


# torch.compile's copies: inputs it mutates copied back after the graph, and under CUDA graphs
# inputs not at static addresses copied into the graph's buffers on each replay
COMPILED_COPIES_ADVICE = (
    "Most of these copies are launched inside torch.compile's CompiledFunction: a compiled "
    "graph copies back the inputs it mutates in place, and under CUDA graphs "
    "(mode='reduce-overhead') copies inputs that are not at static addresses into the graph's "
    "own buffers on every replay. Keep the inputs at fixed addresses (reuse the same tensors; "
    "torch._dynamo.mark_static_address for buffers updated in place), avoid mutating graph "
    "inputs in place, and check what each graph copies with TORCH_LOGS=cudagraphs."
)


@rule(
    "device_copies",
    advice={
        "cuda_app": Advice(
            "Device-to-device copies hold the GPU with no kernel beside them: write each "
            "result where its consumer reads it (one buffer passed along, or kernels that read "
            "the source in place) instead of cudaMemcpy between device buffers, and overlap the "
            "copies that must stay with kernels on another stream.",
            "// instead of cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s):\n"
            "consumer<<<grid, block, 0, s>>>(src /* read in place */, out);",
        )
    },
    no_estimate="whether the copies can go depends on why the program makes them (layouts, "
    "mutated inputs, graph inputs), which the trace does not show: the cost is the time the "
    "GPU ran only them",
    recommendation="Copies on the device hold the GPU with no kernel beside them. Find the ops "
    "that make them (the evidence names them): .contiguous() or .clone() of large tensors, "
    "copy_ into new buffers each step, torch.cat of growing tensors, layouts the next op cannot "
    "read. Keep tensors in the layout their consumer wants, write into preallocated buffers "
    "(out=), or drop the copy.",
    snippet=(
        "buf = torch.empty_like(x)        # once, before the loop\n"
        "torch.mul(x, scale, out=buf)     # each step: written in place, not copied over\n"
        "q = q.transpose(1, 2)            # a view: SDPA takes strided inputs, no .contiguous()"
    ),
    thresholds={"dtod_exposed_min_ratio": 0.05},
)
def device_copies(x: RuleInput) -> Draft | None:
    c = x.r.copies
    if c.dtod_exposed_ns < x.t["dtod_exposed_min_ratio"] * x.window_ns or not c.dtod_count:
        return None
    top = c.dtod_by_op[0] if c.dtod_by_op else None
    compiled = c.dtod_compiled_count >= 0.5 * c.dtod_count
    return Draft(
        c.dtod_exposed_ns,
        f"Device-to-device copies: the GPU runs only copies for {fmt_ms(c.dtod_exposed_ns)} "
        f"({fmt_pct(c.dtod_exposed_ns / max(1, x.window_ns))} of the window), "
        f"{plural(c.dtod_count, 'copy', 'copies')} of {fmt_bytes(c.dtod_bytes)}"
        + (
            f", {fmt_pct(c.dtod_compiled_count / c.dtod_count)} of them inside torch.compile's "
            "CompiledFunction"
            if compiled
            else ""
        )
        + (f"; most from {top['op']}" if top else ""),
        {
            "exposed_ns": c.dtod_exposed_ns,
            "copies": c.dtod_count,
            "bytes": c.dtod_bytes,
            "compiled_function_copies": c.dtod_compiled_count,
            "by_op": list(c.dtod_by_op),
        },
        **({"recommendation": COMPILED_COPIES_ADVICE} if compiled else {}),
    )


# Mostly read-backs: pinning the loader's batches does not help; the destination does.
READBACK_ADVICE = (
    "Read results back into a pinned host buffer with non_blocking=True and wait on an event only "
    "where the value is needed (a pageable destination makes every copy synchronous).",
    "host_buf = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)  # once\n"
    "host_buf.copy_(t, non_blocking=True); done = torch.cuda.Event(); done.record()\n"
    "# ... more GPU work ...\n"
    "done.synchronize()  # only when host_buf is read",
)


@rule(
    "h2d_not_overlapped",
    advice={
        "cuda_app": Advice(
            "Overlap copies with compute: split the data into chunks and issue each chunk's "
            "cudaMemcpyAsync (from pinned memory) and kernel on alternating streams, so one "
            "chunk's copy runs under the previous chunk's kernel; order with events, not device "
            "syncs.",
            (
                "for (int i = 0; i < n; ++i) {\n"
                "  cudaStream_t s = streams[i % 2];\n"
                "  cudaMemcpyAsync(d + off[i], h + off[i], sz[i], cudaMemcpyHostToDevice, s);\n"
                "  kernel<<<g, b, 0, s>>>(d + off[i], sz[i]);\n"
                "}"
            ),
        )
    },
    fix="h2d_overlapped",
    recommendation="Prefetch the next batch on a side stream from pinned memory (non_blocking=True) so copies overlap "
    "the current step's kernels.",
    snippet=(
        "copy_stream = torch.cuda.Stream()\n"
        "with torch.cuda.stream(copy_stream):          # prefetch batch i+1 while computing batch i\n"
        "    nxt = next_batch.to(device, non_blocking=True)\n"
        "torch.cuda.current_stream().wait_stream(copy_stream)"
    ),
    thresholds={
        "h2d_overlap_min": 0.5,
        # at least this share of the HtoD bytes pageable: pinning, not a prefetch stream, is the
        # fix, and pageable_memcpy names it
        "h2d_pageable_max_ratio": 0.5,
        # copies exposed for less than this share of the window are no lever (audit 16: 17 us
        # of copies in a 250 ms diffusion step read "only 0.0% of copy time overlaps compute")
        "h2d_exposed_min_ratio": 0.001,
    },
)
def h2d_not_overlapped(x: RuleInput) -> Draft | None:
    copies = x.r.copies
    overlap = copies.h2d_overlap_ratio
    mostly_pageable = (copies.h2d_pageable_bytes_ratio or 0) >= x.t["h2d_pageable_max_ratio"]
    if (
        overlap is None
        or overlap >= x.t["h2d_overlap_min"]
        or not copies.h2d_dur_ns
        or mostly_pageable
    ):
        return None
    exposed = copies.h2d_dur_ns * (1 - overlap)
    if exposed < x.t["h2d_exposed_min_ratio"] * x.window_ns:
        return None
    # overlapping hides copies behind compute: no more than the kernel time not already
    # hiding copies (25 GB of copies beside 22 ms of kernels: 22 ms, not the copies' 920 ms)
    idle = x.r.idle
    kernel_ns = (idle.kernel_busy_ratio or 0.0) * idle.device_window_ns
    hideable = max(0.0, kernel_ns - copies.h2d_dur_ns * overlap)
    fsdp = (copies.h2d_fsdp_bytes_ratio or 0) >= FSDP_OFFLOAD_MIN_RATIO
    return Draft(
        min(exposed, hideable),
        ("FSDP's CPU offload: host-to-device" if fsdp else "Host-to-device")
        + f" copies run alone: only {fmt_pct(overlap)} of copy time overlaps compute",
        {
            "h2d_dur_ns": copies.h2d_dur_ns,
            "h2d_overlap_ratio": overlap,
            "exposed_copy_ns": int(exposed),
            "hideable_ns": int(hideable),
            "by_kind": list(copies.by_kind),
            "h2d_fsdp_bytes_ratio": copies.h2d_fsdp_bytes_ratio,
        },
        # parameters, not batches: FSDP's prefetch, not the loader's (audit 22)
        recommendation=FSDP_OFFLOAD_ADVICE if fsdp else None,
        snippet=FSDP_OFFLOAD_SNIPPET if fsdp else None,
    )


# the share of host-to-device bytes launched inside FSDP's hooks from which the copies are its
# CPU offload's parameters (analyzers/copies.py h2d_fsdp_bytes_ratio)
FSDP_OFFLOAD_MIN_RATIO = 0.5
FSDP_OFFLOAD_ADVICE = (
    "The host-to-device copies are launched inside FSDP's hooks: its CPU offload bringing the "
    "parameters to the GPU for each forward (and backward), not batches. Where the GPU's memory "
    "allows, keep the parameters on it (no CPU offload; shard over more GPUs if one does not "
    "hold its shard); else let FSDP prefetch the next layer's parameters under the current "
    "layer's compute (forward_prefetch=True, backward_prefetch) from pinned memory."
)
FSDP_OFFLOAD_SNIPPET = (
    "model = FSDP(model, cpu_offload=CPUOffload(offload_params=False),  # where memory allows\n"
    "             forward_prefetch=True, backward_prefetch=BackwardPrefetch.BACKWARD_PRE)"
)


@rule(
    "copy_bound",
    advice={
        "cuda_app": Advice(
            "The copy engines bound the run: move fewer bytes between host and device. Keep the "
            "data resident on the GPU across iterations (copy it once, not every iteration), "
            "exchange only halos or boundaries, send compact types and convert on the GPU; with "
            "MPI use CUDA-aware MPI (GPUDirect) so device buffers need no host staging. OpenMP "
            "offload: one `target data` region (or `target enter data`/`exit data`) around the "
            "loop instead of `map` clauses on each `target`; OpenACC: a `data` region.",
            (
                "cudaMemcpy(d_field, h_field, bytes, cudaMemcpyHostToDevice);  // once, before the loop\n"
                "for (int it = 0; it < n; ++it) step<<<g, b>>>(d_field);      // copy back halos or results only"
            ),
        )
    },
    no_estimate="moving fewer bytes changes the program (what stays on the GPU, the input "
    "format); no transform of the traced step predicts it",
    recommendation="The copy engines bound the run: move fewer bytes between host and device. Keep "
    "the data resident on the GPU (load the dataset, weights or lookup tables once, not every "
    "step), send compact inputs (uint8 images, int token ids, bf16) and decode or cast on the GPU, "
    "and check the link's rate (pinned HtoD: about 25 GB/s on PCIe Gen4 x16, 50 on Gen5).",
    snippet=(
        "data = dataset.tensors.to('cuda')            # once, outside the loop\n"
        "x = batch_u8.to('cuda', non_blocking=True).float().div_(255)  # cast on the GPU"
    ),
    thresholds={
        "copy_bound_min_ratio": 0.5,
        "copy_bound_kernel_factor": 2.0,  # copies busy at least this many times the kernels
        # mostly pageable bytes: pageable_memcpy names that fix instead
        "copy_bound_pageable_max_ratio": 0.5,
        # less exposed copy time than this over the window bounds no run: a window that is one
        # memset long (WeatherBench2's export: 1.5 us of GPU work in a 426 ms capture) is not a
        # copy-bound program
        "copy_bound_min_ns": 100_000,
    },
)
def copy_bound(x: RuleInput) -> Draft | None:
    """Copies (not pageable ones: pageable_memcpy names that fix) keep the copy engines busy
    over half the window and at least twice as long as the kernels run."""
    idle, copies = x.r.idle, x.r.copies
    copy, kern = idle.copy_busy_ratio, idle.kernel_busy_ratio
    if (
        copy is None
        or kern is None
        or copy < x.t["copy_bound_min_ratio"]
        or copy < x.t["copy_bound_kernel_factor"] * kern
    ):
        return None
    window = idle.device_window_ns
    pinned = ""
    if (copies.h2d_pageable_bytes_ratio or 0) >= x.t["copy_bound_pageable_max_ratio"]:
        # pageable_memcpy names pinning; the copies still bound the run at the pinned rate only
        # where the bytes themselves are the problem (audit 21: an OpenMP offload mapping two
        # 512 MB arrays both ways around every kernel, 8.5 s of copies pinned, 1.1 s of kernels)
        # (pinned copies can run beside kernels: the window after, with the copies' time taken
        # out serially, is an upper bound, so the copies' share of it a lower bound; h2d_pinned
        # ran its 67 MB a step beside its 1.2 ms of kernels)
        shrink = max(0, copies.gpu_pageable_copy_ns - copies.gpu_pageable_copy_pinned_ns)
        if not copies.pinned_bytes_per_s or shrink >= window:
            return None
        copy = max(0.0, copy * window - shrink) / (window - shrink)
        kern = kern * window / (window - shrink)
        window -= shrink
        if copy < x.t["copy_bound_min_ratio"] or copy < x.t["copy_bound_kernel_factor"] * kern:
            return None
        pinned = " even from pinned memory"
    # the copy time no kernel runs beside, at least (the unions' difference)
    exposed = (copy - kern) * window
    if exposed < x.t["copy_bound_min_ns"]:
        return None
    rate = copies.h2d_bytes / (copies.h2d_dur_ns / 1e9) if copies.h2d_dur_ns else None  # B/s
    fsdp = (copies.h2d_fsdp_bytes_ratio or 0) >= FSDP_OFFLOAD_MIN_RATIO
    # most copy time between or within GPUs: the host link's advice does not apply (audit s62:
    # 1.2 GB of peer copies GPU0 -> GPU1 at 88 GB/s told "move fewer bytes between host and
    # device ... 25 GB/s on PCIe")
    device_side = [k for k in copies.by_kind if k["copy_kind"] in DEVICE_SIDE_COPY_KINDS]
    side_ns = sum(int(k["dur_ns"] or 0) for k in device_side)
    peer = not fsdp and side_ns > 0.5 * sum(int(k["dur_ns"] or 0) for k in copies.by_kind)
    side_bytes = sum(int(k["bytes"] or 0) for k in device_side)
    return Draft(
        exposed,
        ("FSDP's CPU offload: copies" if fsdp else "Copies")
        + f" bound the run{pinned}: the copy engines are busy {fmt_pct(copy)} of the window"
        f"{' at the pinned rate' if pinned else ''}, kernels {fmt_pct(kern)}"
        + (
            f"; {fmt_bytes(side_bytes)} between or within GPUs at "
            f"{side_bytes / (side_ns / 1e9) / 1e9:.1f} GB/s"
            if peer and side_ns
            else f"; {fmt_bytes(copies.h2d_bytes)} host-to-device at {rate / 1e9:.1f} GB/s"
            if rate and not pinned
            else f"; {fmt_bytes(copies.h2d_bytes)} host-to-device"
            if pinned
            else ""
        ),
        {
            "copy_busy_ratio": copy,
            "kernel_busy_ratio": kern,
            "h2d_bytes": copies.h2d_bytes,
            "h2d_dur_ns": copies.h2d_dur_ns,
            "h2d_bytes_per_s": rate,
            "by_kind": list(copies.by_kind),
            # from pageable memory: the shares above are at the pinned rate
            "at_pinned_rate": bool(pinned),
            "h2d_fsdp_bytes_ratio": copies.h2d_fsdp_bytes_ratio,
        },
        recommendation=FSDP_OFFLOAD_ADVICE if fsdp else PEER_COPY_ADVICE if peer else None,
        snippet=FSDP_OFFLOAD_SNIPPET if fsdp else PEER_COPY_SNIPPET if peer else None,
        advice={"cuda_app": PEER_COPY_CUDA} if peer else {},
    )


# copies that never cross the host link: peer (GPU to GPU) and device-to-device
DEVICE_SIDE_COPY_KINDS = ("PtoP", "DtoD")
PEER_COPY_ADVICE = (
    "The copy engines bound the run moving bytes between or within GPUs, not over the host "
    "link. Between GPUs: check that peer access is on and the pair is linked directly "
    "(torch.cuda.can_device_access_peer, nvidia-smi topo -m: NVLink rather than PCIe through "
    "the host), keep each tensor on the GPU that uses it, send fewer bytes (bf16, only what the "
    "other GPU reads) and overlap the copies with compute on another stream; a collective "
    "pattern belongs in NCCL (torch.distributed all_gather, send/recv). Within a GPU: the "
    "device copies' ops (.contiguous(), .clone(), torch.cat) are the lever."
)
PEER_COPY_SNIPPET = (
    "assert torch.cuda.can_device_access_peer(0, 1)  # else the copy stages through the host\n"
    "side = torch.cuda.Stream()\n"
    "with torch.cuda.stream(side):  # the copy beside compute on the default stream\n"
    "    y = x.to('cuda:1', non_blocking=True)"
)

PEER_COPY_CUDA = Advice(
    "The copy engines bound the run moving bytes between or within GPUs, not over the host "
    "link. Between GPUs: enable peer access (cudaDeviceCanAccessPeer, cudaDeviceEnablePeerAccess) "
    "so copies go GPU to GPU, check the pair is linked directly (nvidia-smi topo -m: NVLink "
    "rather than PCIe through the host), send fewer bytes and overlap the copies with kernels "
    "on another stream; a collective pattern belongs in NCCL.",
    (
        "cudaDeviceEnablePeerAccess(1, 0);  // on device 0, once: copies go GPU to GPU\n"
        "cudaMemcpyPeerAsync(d1, 1, d0, 0, bytes, copy_stream);  // beside kernels on another stream"
    ),
    "cpp",
)


# Advice by the collective kind whose time is most exposed: what overlaps it depends on the
# parallelism that issues it (the rule's own recommendation is the data-parallel one).
COMM_ADVICE_BY_KIND: Mapping[str, str] = {
    "all_to_all": "All-to-all is exposed (embedding, expert or sequence parallelism): pipeline "
    "the sparse stage so the next batch's all-to-all runs under this batch's dense compute "
    "(TorchRec TrainPipelineSparseDist); for MoE overlap token dispatch/combine with expert "
    "compute (chunked all-to-all, shared-expert overlap) and cap tokens per expert (capacity "
    "factor); for Ulysses-style sequence parallelism split the heads into chunks so one chunk's "
    "all-to-all runs under another's attention.",
    "send_recv": "Point-to-point send/recv is exposed (pipeline parallelism): more micro-batches "
    "per step, an interleaved 1F1B schedule (virtual pipeline stages) and batched, asynchronous "
    "P2P (batch_isend_irecv) shrink the bubbles in which stages wait for activations.",
    "broadcast": "Broadcasts are exposed: broadcast parameters once at start-up, not per step; DDP "
    "broadcast_buffers=False when buffers need no syncing.",
}
# Tensor/sequence parallelism: all-gathers and reduce-scatters in the forward, none in backward
# (an inference or forward-only trace): data-parallel bucket advice does not apply.
TP_ADVICE = (
    "Collectives of the forward (tensor/sequence parallelism: all-gather and reduce-scatter "
    "around the sharded layers) are exposed: overlap them with the matmuls they feed (async "
    "tensor parallelism: torch.compile with torch._inductor.config._micro_pipeline_tp = True; "
    "Megatron's --tp-comm-overlap), keep the tensor-parallel group within one NVLink domain, "
    "or lower the tensor-parallel degree where the model fits."
)
# expert parallelism's dispatch and combine (DeepEP's dpsk::ep kernels, MoE libraries'): the
# all-to-all advice leads with MoE's levers, not TorchRec's (audit 20: DeepSeek-V3's trace)
MOE_COMM_PATTERN = r"(?i)\bep::|deep_?ep|moe|expert\w*(dispatch|combine)"
MOE_ALL_TO_ALL_ADVICE = (
    "All-to-all is exposed (expert parallelism: token dispatch and combine): overlap it with "
    "expert and shared-expert compute (chunked or two-micro-batch overlap, as DualPipe or "
    "DeepEP's hook-based overlap do), keep dispatch within a node's NVLink domain where the "
    "routing allows (node-limited routing), and cap tokens per expert (capacity factor)."
)
# the collectives that gradient reduction issues: what "communicate less" levers shrink
GRADIENT_KINDS = frozenset({"all_reduce", "reduce_scatter", "all_gather"})
# comm_time_ratio at which communicating less becomes the advice too (it was comm_heavy), where
# gradient collectives are the exposed kind and this share of the window is exposed (audit 20:
# an expert-parallel all-to-all 96% overlapped told to use ZeRO-2 and bf16 gradients)
COMM_LESS_MIN_EXPOSED_RATIO = 0.1
COMM_LESS_ADVICE = (
    " Communication is a large share of the window: communicate less often or less "
    "(gradient accumulation, a larger per-GPU batch, ZeRO-2/SHARD_GRAD_OP instead of full "
    "sharding, bf16 gradient reduction)."
)
# Where the collectives' messages would move in a fraction of their time even over a slow link
# (analyzers/comm.py COMM_FLOOR_BYTES_PER_S), the rest is this rank waiting for the others: no
# overlap or bucket setting on this rank removes it, the slowest rank does
PEER_WAIT_ADVICE = (
    "Most of the collectives' time is this rank waiting for the other ranks to reach them, not "
    "moving data: find the rank that arrives last (analyze the job's rank traces together: "
    "traceinsight analyze JOB_DIR) and what holds it (uneven batches or sequence lengths, a "
    "slower data loader or GPU, host work before the collective). Overlapping or bucketing "
    "this rank's communication cannot remove a wait for another rank."
)
PEER_WAIT_SNIPPET = (
    "# on every rank, the same steps, into one directory:\n"
    "prof = torch.profiler.profile(\n"
    "    schedule=torch.profiler.schedule(wait=1, warmup=1, active=3),\n"
    '    on_trace_ready=torch.profiler.tensorboard_trace_handler("JOB_DIR"))\n'
    "# then `traceinsight analyze JOB_DIR` names the straggler and what holds it"
)
PEER_WAIT_CUDA_APP = Advice(
    "Most of the collectives' time is this rank waiting for the others to reach them: balance "
    "the work across ranks (the domain decomposition, the data each rank reads) and profile every "
    "rank (nsys profile per rank, then traceinsight analyze on the directory) to find the one that "
    "arrives last; posting the transfer non-blocking cannot remove a wait for another rank.",
    "nsys profile -o rank%q{OMPI_COMM_WORLD_RANK} ./app   # one report per rank\n"
    "traceinsight analyze JOB_DIR/",
    language="bash",
)
# Overlap hides communication behind the compute a rank has: where that is under half of
# what is exposed, the collectives themselves are the cost (audit 23: a rocprofv3 rank with
# 0.28 s of kernels beside 4.16 s of RCCL in 15.1 s, told to bucket DDP for 3.95 s)
COMM_HIDEABLE_MIN_RATIO = 0.5
COMM_ITSELF_ADVICE = (
    "This rank has too little compute to hide its communication behind, so overlap cannot "
    "help much: the collectives' own time is the cost. Either this rank waits for the others "
    "to reach each collective (analyze every rank's trace together, traceinsight analyze "
    "JOB_DIR, to find the one that arrives last and what holds it) or it moves too much too "
    "often (communicate less: gradient accumulation, a larger per-GPU batch, bf16 gradient "
    "reduction, fewer ranks for a small model)."
)
PEER_WAIT_UNPRICED = (
    "the exposed time is mostly this rank waiting for others: what removing it saves depends on "
    "the slowest rank, which a one-rank trace does not hold"
)
DDP_FSDP_ADVICE = (
    "Let gradient reduction overlap backward: DDP with buckets (bucket_cap_mb), static_graph=True, "
    "gradient_as_bucket_view=True; no manual all_reduce after backward(); FSDP backward_prefetch "
    "and forward_prefetch so all-gathers and reduce-scatters run under compute."
)


# A window whose GPU ran fewer kernels than this is one pass of a small program (audit 6: a
# one-kernel CUDA test, its 108 us first launch loading the module, read launch_bound HIGH
# 3.92x): nothing in it repeats, so nothing a loop would gain from
ONE_SHOT_MAX_KERNELS = 10
# ... unless its host syncs this often: a loop of read-backs (audit s62: 4,096 `.cpu()` calls
# and no kernel, 94% of the window idle in their syncs, were capped as one pass). Copies alone
# do not say it: one kernel's unified-memory migrations are thousands (2,370 on a T4 softmax),
# and a one-pass MPI saxpy syncs after each of its 15 copies
ONE_SHOT_MAX_SYNCS = 100


def one_shot(results: Results) -> bool:
    """No steps, fewer than :data:`ONE_SHOT_MAX_KERNELS` kernels (the kernels, not the launch
    calls: a rocprof trace records no host calls) and fewer than :data:`ONE_SHOT_MAX_SYNCS`
    host syncs in the window."""
    return (
        results.steps.steps == 0
        and results.kernels.kernel_count < ONE_SHOT_MAX_KERNELS
        and results.syncs.host_sync_count < ONE_SHOT_MAX_SYNCS
    )


# the snippet by the most exposed kind (the rule's own: the data-parallel buckets)
COMM_SNIPPET_BY_KIND: Mapping[str, str] = {
    "all_to_all": "# pipeline the sparse stage (TorchRec): the next batch's all-to-all runs under\n"
    "# this batch's dense compute\n"
    "pipeline = TrainPipelineSparseDist(model, optimizer, device)",
    "moe": "# MoE: overlap dispatch/combine with expert compute, e.g. two micro-batches in\n"
    "# flight (one's all-to-all under the other's experts); cap tokens per expert\n"
    "capacity_factor = 1.25",
    "send_recv": "# pipeline parallelism: more micro-batches, interleaved stages\n"
    "schedule = ScheduleInterleaved1F1B(stages, n_microbatches=4 * n_stages, loss_fn=loss_fn)",
    "broadcast": "model = DDP(model, device_ids=[rank], broadcast_buffers=False)",
    # a forward's collectives (tensor/sequence parallelism): TP_ADVICE's
    "tensor_parallel": "# async tensor parallelism: matmuls overlap their all-gather/reduce-scatter\n"
    "torch._inductor.config._micro_pipeline_tp = True\n"
    "model = torch.compile(model)",
}


@rule(
    "comm_not_overlapped",
    advice={
        "cuda_app": Advice(
            "Communication is exposed: post it non-blocking (NCCL on its own stream, or "
            "MPI_Isend/MPI_Irecv with CUDA-aware MPI) and compute the interior while it runs; "
            "wait (cudaStreamWaitEvent, MPI_Waitall) only before the boundary work that needs the"
            " data.",
            (
                "ncclAllReduce(sendbuf, recvbuf, n, ncclFloat, ncclSum, comm, comm_stream);\n"
                "interior<<<g, b, 0, compute_stream>>>(...);   // runs under the transfer\n"
                "cudaEventRecord(ev, comm_stream); cudaStreamWaitEvent(compute_stream, ev, 0);\n"
                "boundary<<<g, b, 0, compute_stream>>>(...);   // needs the received data"
            ),
        )
    },
    fix="comm_overlapped",
    recommendation=DDP_FSDP_ADVICE,
    snippet=(
        "# all-reduce / reduce-scatter / all-gather (DDP, FSDP):\n"
        "model = DDP(model, device_ids=[rank], bucket_cap_mb=100,\n"
        "            gradient_as_bucket_view=True, static_graph=True)\n"
        "# FSDP(model, backward_prefetch=BackwardPrefetch.BACKWARD_PRE, forward_prefetch=True)\n"
        "# all-to-all (TorchRec): TrainPipelineSparseDist(model, optimizer, device)\n"
        "# send/recv (pipeline): ScheduleInterleaved1F1B(stages, n_microbatches=4 * n_stages)"
    ),
    thresholds={
        "comm_overlap_min": 0.5,
        "comm_heavy_ratio": 0.3,
        # communication launched in backward under this share: a forward's collectives (TP)
        "comm_forward_max_backward_ratio": 0.1,
        # the collectives with a recorded message cover this share of the communication, and
        # at least this share of their time is waiting beyond the slowest link's transfer
        "comm_sized_min_ratio": 0.5,
        "comm_peer_wait_min_ratio": 0.5,
    },
)
def comm_not_overlapped(x: RuleInput) -> Draft | None:
    """Exposed communication, one finding whatever its share of the window (a heavy share adds
    the advice to communicate less); the advice follows the parallelism that issues it."""
    comm = x.r.comm
    if comm.comm_compute_overlap_ratio is None or comm.exposed_comm_ns <= 0:
        return None
    heavy = (comm.comm_time_ratio or 0) >= x.t["comm_heavy_ratio"]
    if comm.comm_compute_overlap_ratio >= x.t["comm_overlap_min"] and not heavy:
        return None
    by_kind = comm.by_kind
    worst = max(by_kind, key=lambda k: (by_kind[k]["exposed_ns"], k)) if by_kind else None
    # (and not launched after the step's backward began either: a manual all-reduce of the
    # gradients after backward read as tensor parallelism on the DDP fixture)
    forward_only = (
        comm.backward_comm_ratio is not None
        and comm.backward_comm_ratio < x.t["comm_forward_max_backward_ratio"]
        and (comm.after_backward_comm_ratio or 0) < x.t["comm_forward_max_backward_ratio"]
    )
    moe = worst == "all_to_all" and any(
        re.search(MOE_COMM_PATTERN, str(c.get("name") or "")) for c in comm.top_collectives[:5]
    )
    if moe:
        advice = MOE_ALL_TO_ALL_ADVICE
    elif worst in COMM_ADVICE_BY_KIND:
        advice = COMM_ADVICE_BY_KIND[worst]
    elif forward_only and worst in GRADIENT_KINDS:
        advice = TP_ADVICE
    else:
        advice = DDP_FSDP_ADVICE
    gradients = worst in GRADIENT_KINDS and not forward_only
    if heavy and gradients and (comm.exposed_comm_ratio or 0) >= COMM_LESS_MIN_EXPOSED_RATIO:
        advice += COMM_LESS_ADVICE
    # the collectives whose messages the trace records, where they cover most of the time
    # (not in a one-pass window: a process's first collectives also wait for the others to
    # start and connect, audit 14's toy with one all-reduce)
    waiting = (
        not one_shot(x.r)
        and comm.sized_comm_ns >= x.t["comm_sized_min_ratio"] * comm.comm_ns
        and comm.peer_wait_ns >= x.t["comm_peer_wait_min_ratio"] * comm.sized_comm_ns
    )
    wait_ratio = comm.peer_wait_ns / comm.sized_comm_ns if comm.sized_comm_ns else None
    # overlap saves at most the compute not yet under communication (the replay's transform
    # bounds it the same way where there are steps)
    hideable = comm.hideable_ns
    itself = not waiting and hideable < COMM_HIDEABLE_MIN_RATIO * comm.exposed_comm_ns
    title = (
        f"Communication is exposed: {fmt_pct(comm.comm_compute_overlap_ratio)} of it overlaps compute, "
        f"{fmt_ms(comm.exposed_comm_ns)} exposed"
        # "other": a kernel naming no collective (RCCL's ncclDevKernel_Generic) and no host op
        # saying which (audit 17: a rocprofv3 kernel trace read "mostly other")
        + (
            f", mostly {worst}"
            if worst and worst != "other"
            else ", of collectives the trace does not name"
            if worst
            else ""
        )
    )
    if waiting:
        title += (
            f"; at least {fmt_pct(wait_ratio)} of the collectives' time is this rank waiting "
            + (
                "for the others (the trace records no message sizes: repeated small "
                "collectives took that much longer than the fastest tenth of their calls, "
                f"{fmt_ms(comm.transfer_bound_ns)} at that pace)"
                if comm.peer_wait_source == "repeats"
                else f"for the others (moving their messages takes at most "
                f"{fmt_ms(comm.transfer_bound_ns)}, even at {COMM_FLOOR_BYTES_PER_S / 1e9:g} GB/s)"
            )
        )
        advice = PEER_WAIT_ADVICE
    elif itself:
        title += (
            f"; overlap can hide at most {fmt_ms(hideable)} of it: the rank computes for "
            f"{fmt_ms(comm.compute_ns)} in all"
        )
        advice = COMM_ITSELF_ADVICE
    return Draft(
        # (a wait for another rank is not hidden by overlap but by that rank: kept whole)
        comm.exposed_comm_ns if waiting else min(comm.exposed_comm_ns, hideable),
        title,
        {
            "comm_ns": comm.comm_ns,
            "exposed_comm_ns": comm.exposed_comm_ns,
            "comm_compute_overlap_ratio": comm.comm_compute_overlap_ratio,
            "exposed_comm_ratio": comm.exposed_comm_ratio,
            "per_device": list(comm.per_device),
            "top_collectives": list(comm.top_collectives[:5]),
            "by_kind": by_kind,
            "most_exposed_kind": worst,
            "comm_time_ratio": comm.comm_time_ratio,
            "backward_comm_ratio": comm.backward_comm_ratio,
            "sized_comm_ns": comm.sized_comm_ns,
            "transfer_bound_ns": comm.transfer_bound_ns,
            "peer_wait_ns": comm.peer_wait_ns,
            "peer_wait_ratio": wait_ratio,
            "peer_wait_source": comm.peer_wait_source,
            "compute_ns": comm.compute_ns,
            "hideable_ns": hideable,
            **({"unpriced_because": PEER_WAIT_UNPRICED} if waiting else {}),
        },
        advice,
        # the bucket settings' snippet does not apply to a wait for another rank, nor to
        # collectives of another kind
        snippet=PEER_WAIT_SNIPPET
        if waiting or itself
        else COMM_SNIPPET_BY_KIND.get(
            "moe" if moe else "tensor_parallel" if advice == TP_ADVICE else worst or "", None
        ),
        advice={"cuda_app": PEER_WAIT_CUDA_APP} if waiting or itself else {},
        # overlap on this rank saves at most what moving the data takes: the rest is another
        # rank's doing (a one-rank trace cannot say which, nor what it would save)
        cap="low" if waiting else None,
        cap_reason="most of it is this rank waiting for others: the saving is the slowest rank's",
    )


@rule(
    "elementwise_heavy",
    gpu_work=True,
    advice={
        "cuda_app": Advice(
            "Fuse elementwise kernels: compute a chain of elementwise operations in one kernel so"
            " each value is read and written once, not once per kernel.",
            (
                "// before: scale<<<g, b>>>(x); add<<<g, b>>>(x, y); relu<<<g, b>>>(x);  // 3 passes\n"
                "__global__ void fused(float* x, const float* y, float a, int n) {\n"
                "  int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
                "  if (i < n) x[i] = fmaxf(a * x[i] + y[i], 0.f);  // one pass\n"
                "}"
            ),
        )
    },
    fix="elementwise_fused",
    recommendation="Fuse elementwise chains: torch.compile, fused LayerNorm/RMSNorm, Flash attention "
    "(F.scaled_dot_product_attention); each unfused op reads and writes memory again.",
    snippet=(
        "model = torch.compile(model)   # fuses elementwise chains into Triton kernels\n"
        "# attention: F.scaled_dot_product_attention (Flash); norms: fused LayerNorm/RMSNorm"
    ),
    thresholds={
        "elementwise_time_ratio": 0.25,
        "elementwise_count_ratio": 0.5,
        # the attributed cost: fusion typically removes about half of the elementwise memory
        # traffic (each fused chain reads and writes once)
        "elementwise_fusion_saving_ratio": 0.5,
        # kernels busy less than this share of the window make no kernel mix to speak of
        # (audit 16: a graph capture's two 5 us fills read "100.0% of kernel time")
        "kernel_mix_min_busy_ratio": 0.01,
    },
    cap="low",  # an optimization opportunity, not a reason the GPU starves
)
def elementwise_heavy(x: RuleInput) -> Draft | None:
    kern = x.r.kernels
    time_ratio, count_ratio = (
        kern.elementwise_kernel_time_ratio,
        kern.elementwise_kernel_count_ratio,
    )
    if time_ratio is None or (
        time_ratio < x.t["elementwise_time_ratio"]
        and (count_ratio or 0) < x.t["elementwise_count_ratio"]
    ):
        return None
    if kern.kernel_ns < x.t["kernel_mix_min_busy_ratio"] * x.window_ns:
        return None
    ew_ns = int(time_ratio * kern.kernel_ns)
    # fused attention kernels already run (flash, memory-efficient, cuDNN): the advice leaves
    # attention out (audit 15: Flash attention advised to a job whose flash_fwd_kernel held
    # 49% of its kernel time)
    fused_attention = any(
        c.get("kernel_class") == "attention" and (c.get("total_ns") or 0) > 0 for c in kern.by_class
    )
    # no optimizer in a forward-only trace (audit 17: an MI300X Qwen forward's advice named one)
    fused_advice = (
        _EW_ADVICE_FUSED_ATTENTION_INFERENCE
        if x.r.host_ops.forward_only
        else _EW_ADVICE_FUSED_ATTENTION
    )
    advice = {"recommendation": fused_advice} if fused_attention else {}
    has = {c.get("kernel_class") for c in kern.by_class if (c.get("total_ns") or 0) > 0}
    transformer = any(re.search(TRANSFORMER_KERNELS, k.get("name") or "") for k in kern.top_kernels)
    if "conv" in has and "attention" not in has and not transformer:
        # a convolutional network: no attention to fuse, its norms batch norms (audit 17: two
        # ResNets advised Flash attention and fused LayerNorm/RMSNorm); a transformer with a
        # conv stem runs layer norms and softmax (a TimeSformer); no optimizer when forward-only
        advice = {
            "recommendation": _EW_ADVICE_CONV_INFERENCE
            if x.r.host_ops.forward_only
            else _EW_ADVICE_CONV,
            "snippet": _EW_SNIPPET_COMPILE if x.r.host_ops.forward_only else _EW_SNIPPET_CONV,
        }
    # the kernels neither ATen's eager nor Inductor's (cat copies, a library's) named too, so
    # the parts add up to the class (audit s67: a TimeSformer's 38 CatArrayBatchedCopy)
    other = kern.elementwise_count - kern.elementwise_eager_count - kern.elementwise_triton_count
    title = (
        f"Elementwise kernels: {fmt_pct(time_ratio)} of kernel time, {fmt_pct(count_ratio)} of kernels "
        f"({kern.elementwise_eager_count} eager, {kern.elementwise_triton_count} Triton-fused"
        + (f", {other} other)" if other > 0 else ")")
    )
    gather_ns = sum(
        int(k.get("total_ns") or 0)
        for k in kern.top_kernels
        if k.get("kernel_class") == "elementwise"
        and re.search(GATHER_KERNELS, k.get("name") or "", re.I)
    )
    if ew_ns and gather_ns >= GATHER_MAJORITY * ew_ns:
        # most of it is index gathers, copies of the rows an index selects: no chain to fuse
        # (audit s59: a B300 MoE's 12 vectorized_gather_kernel of 540 us, expert weights
        # gathered per token under aten::index, 6.49 of 10.24 ms kernel time)
        title += f"; most of it index gathers ({fmt_ms(gather_ns)})"
        advice = {"recommendation": _GATHER_ADVICE, "snippet": _GATHER_SNIPPET}
    return Draft(
        ew_ns * x.t["elementwise_fusion_saving_ratio"],
        title,
        {
            "elementwise_kernel_time_ratio": time_ratio,
            "elementwise_kernel_count_ratio": count_ratio,
            "elementwise_eager_count": kern.elementwise_eager_count,
            "elementwise_triton_count": kern.elementwise_triton_count,
            "elementwise_ns": ew_ns,
            "gather_ns": gather_ns,
        },
        **advice,
    )


# ATen's gather kernels (aten::index, gather, index_select, embedding lookups): each copies the
# rows an index selects into a new tensor
GATHER_KERNELS = r"gather_kernel|index_kernel|indexselect|index_select|scatter_gather"
GATHER_MAJORITY = 0.5  # of the elementwise time: the finding speaks of gathers
_GATHER_ADVICE = (
    "Most of this time is index gathers (aten::index, torch.gather, index_select): each copies "
    "the rows an index selects into a new tensor, and there is no chain to fuse. Gather the "
    "smaller operand: index the activations, not a weight tensor (a mixture of experts: sort "
    "the tokens by expert and run one matmul per expert, or a grouped GEMM, on the weights in "
    "place, not weights gathered per token); torch.compile fuses a gather into the pointwise "
    "kernel that reads it."
)
_GATHER_SNIPPET = (
    "# before: w = experts_w[idx]            # copies a weight matrix per token\n"
    "#         y = torch.bmm(x.unsqueeze(1), w)\n"
    "order = idx.argsort()\n"
    "counts = torch.bincount(idx, minlength=n_experts).tolist()\n"
    "chunks = x[order].split(counts)            # the tokens of each expert, together\n"
    "y = torch.cat([c @ experts_w[e] for e, c in enumerate(chunks)])[order.argsort()]"
)


_EW_ADVICE_CONV = (
    "Fuse elementwise chains: torch.compile fuses the activations, residual adds and batch "
    "norm's elementwise work into fewer kernels; a fused (foreach or fused=True) optimizer "
    "takes the per-parameter updates; each unfused op reads and writes memory again."
)
_EW_ADVICE_CONV_INFERENCE = (
    "Fuse elementwise chains: torch.compile fuses the activations, residual adds and batch "
    "norm's elementwise work into fewer kernels; each unfused op reads and writes memory again."
)
# kernels of a transformer's layers: not a convolutional network's
TRANSFORMER_KERNELS = r"(?i)layer_?norm|rms_?norm|softmax"
_EW_SNIPPET_COMPILE = (
    "model = torch.compile(model)   # fuses activations, adds and norms' elementwise work"
)
_EW_SNIPPET_CONV = (
    _EW_SNIPPET_COMPILE + "\n"
    "# and the optimizer's per-parameter updates in a few kernels: foreach=True, or fused=True\n"
    "# for Adam/AdamW/SGD: torch.optim.AdamW(model.parameters(), lr=lr, fused=True)"
)
_EW_ADVICE_FUSED_ATTENTION_INFERENCE = (
    "Fuse elementwise chains: torch.compile, fused LayerNorm/RMSNorm, fused activations (the "
    "attention already runs fused kernels); each unfused op reads and writes memory again."
)
_EW_ADVICE_FUSED_ATTENTION = (
    "Fuse elementwise chains: torch.compile, fused LayerNorm/RMSNorm, fused activations and "
    "optimizer (the attention already runs fused kernels); each unfused op reads and writes "
    "memory again."
)


@rule(
    "channels_first_layers",
    gpu_work=True,
    advice={"cuda_app": None},  # ATen's and cuDNN's kernels for torch tensors: a PyTorch program
    fix="channels_last_layers",
    recommendation="Put the model and its inputs in channels_last memory format "
    "(channels_last_3d for 3-D convolutions): on channels-first tensors cuDNN transposes each "
    "convolution's input and output to NHWC and back, batch norm runs cuDNN's NCHW kernels and "
    "PyTorch runs depthwise convolutions on its own direct kernels; in channels_last all of "
    "them run on cuDNN's NHWC kernels. bf16 alone keeps the transposes and the depthwise "
    "kernels (R(2+1)D-18 measured 1.25x for bf16, 1.46x for channels_last, 1.91x for both).",
    snippet=(
        "model = model.to(memory_format=torch.channels_last)\n"
        "x = x.to(memory_format=torch.channels_last)   # each batch, before the forward\n"
        "# 3-D convolutions (video): torch.channels_last_3d for both"
    ),
    # the channels-first kernels' share of kernel time for the finding to be checked
    thresholds={"channels_first_time_ratio": 0.05},
)
def channels_first_layers(x: RuleInput) -> Draft | None:
    """Kernels that run only because the tensors are channels-first: cuDNN's layout transposes
    around convolutions, its NCHW batch norm, ATen's depthwise convolutions (the
    channels_last_layers replay prices each: the transposes go, the others run at the memory
    bandwidth their bytes need)."""
    kern = x.r.kernels
    parts = {
        "layout_transpose_ns": kern.layout_transpose_ns,
        "nchw_batch_norm_ns": kern.nchw_batch_norm_ns,
        "aten_depthwise_ns": kern.aten_depthwise_ns,
    }
    total = sum(parts.values())
    if not kern.kernel_ns or total < x.t["channels_first_time_ratio"] * kern.kernel_ns:
        return None
    steps = max(1, x.r.steps.steps or 1)
    # each part per step where the trace marks steps (audit 15: "653.46 ms a step" in a window
    # without any; and only the last part had said so)
    per = " a step" if x.r.steps.steps else ""
    said = {
        "layout_transpose_ns": "cuDNN's layout transposes around convolutions",
        "nchw_batch_norm_ns": "batch norm on cuDNN's NCHW kernels",
        "aten_depthwise_ns": "depthwise convolutions on ATen's direct kernels "
        f"({kern.aten_depthwise_count / steps:.0f}{per or ' in the window'})",
    }
    listed = ", ".join(
        f"{said[k]} {fmt_ms(v / steps)}"
        for k, v in sorted(parts.items(), key=lambda kv: (-kv[1], kv[0]))
        if v > 0
    )
    ratio = total / kern.kernel_ns
    return Draft(
        total,
        f"Layers run channels-first ({'per step' if per else 'in the window'}): {listed}; "
        f"{fmt_pct(ratio)} of kernel time",
        {
            **parts,
            "aten_depthwise_count": kern.aten_depthwise_count,
            "layout_transpose_count": kern.layout_transpose_count,
            "channels_first_time_ratio": ratio,
            "aten_depthwise_time_ratio": kern.aten_depthwise_ns / kern.kernel_ns,
        },
    )


@rule(
    "unfused_optimizer",
    advice={"cuda_app": None},  # torch.optim's per-parameter kernels
    fix="fused_optimizer",
    recommendation="Use the fused implementation: torch.optim.<Optimizer>(..., fused=True) (or foreach=True where fused is unavailable).",
    snippet="optimizer = torch.optim.AdamW(model.parameters(), lr=lr, fused=True)",
    # foreach is already batched: fused saves this share of its time (the attributed cost)
    thresholds={
        "foreach_fused_saving_ratio": 0.3,
        # host time per kernel above which the step's host work is not launching (eager
        # dispatch and launch: 10-50 us an op; per-parameter AdamW: 39 us a kernel)
        "optimizer_host_per_kernel_max_ns": 1_000_000,
    },
)
def unfused_optimizer(x: RuleInput) -> Draft | None:
    opt = x.r.optimizer
    if opt.mode not in ("per_parameter", "foreach") or not opt.optimizer_steps:
        return None
    per_step = max(opt.gpu_ns_per_step or 0, opt.host_ns_per_step or 0)
    cost = per_step * min(opt.optimizer_steps, max(1, x.r.steps.steps or opt.optimizer_steps))
    if opt.mode == "foreach":
        cost *= x.t["foreach_fused_saving_ratio"]
    # host time far beyond launching its kernels is the optimizer's own work (a Shampoo step's
    # preconditioner math: 209 ms around 26.5 kernels, audit 15), which a fused step keeps:
    # the fused what-if, which drops the step's host time, cannot price it
    host_per_kernel = (opt.host_ns_per_step or 0) / max(1.0, opt.kernels_per_step or 0)
    own_work = host_per_kernel > x.t["optimizer_host_per_kernel_max_ns"]
    mode = opt.mode.replace("_", "-")
    if opt.optimizer not in FUSED_OPTIMIZERS | FOREACH_OPTIMIZERS:
        # "foreach" is torch.optim's word (audit 19: "Shampoo runs foreach")
        mode = {"foreach": "multi-tensor kernels", "per_parameter": "per-parameter kernels"}[
            opt.mode
        ]
    title = (
        f"{opt.optimizer} runs {mode}: {_kernels(opt.kernels_per_step)} and "
        f"{fmt_ms(per_step)} per optimizer step"
    )
    if own_work:
        title += (
            f"; its {fmt_ms(host_per_kernel)} of host time per kernel is its own work, not launches"
        )
    return Draft(
        cost,
        title,
        {
            "optimizer": opt.optimizer,
            "mode": opt.mode,
            "kernels_per_step": opt.kernels_per_step,
            "gpu_ns_per_step": opt.gpu_ns_per_step,
            "host_ns_per_step": opt.host_ns_per_step,
            # one-time calls inside its ranges, left out of the host time (a cold pass's)
            "one_time_host_ns": opt.one_time_host_ns,
            "host_ns_per_kernel": host_per_kernel,
            **(
                {
                    "unpriced_because": "the optimizer's host time is its own work, not the "
                    "launches a fused step removes: what fusing saves is not in the trace"
                }
                if own_work
                else {}
            ),
        },
        *_optimizer_advice(opt.optimizer, priced=not own_work),
        cap="low" if own_work else None,
        cap_reason="the optimizer's host time is its own work, not launches a fused step removes",
    )


@rule(
    "zero_grad_fills",
    advice={"cuda_app": None},  # torch.optim's zero_grad
    fix="grads_set_to_none",
    recommendation="Drop the gradients instead of zeroing them: optimizer.zero_grad(set_to_none=True) "
    "(the default from PyTorch 2.0; model.zero_grad() likewise). Each gradient then skips its fill "
    "kernel and launch, and the next backward writes it instead of adding to zeros. Keep "
    "set_to_none=False only where code reads .grad before backward refills it.",
    snippet="optimizer.zero_grad(set_to_none=True)  # no fill kernel per parameter",
)
def zero_grad_fills(x: RuleInput) -> Draft | None:
    """optimizer.zero_grad() that zeroes each gradient with a kernel (set_to_none=False, the
    default before PyTorch 2.0): a launch per parameter a step (audit 23: a 2021 ResNet-50's
    SGD.zero_grad launched 161 fills in 12.6 ms of host time a step, the GPU idle)."""
    opt = x.r.optimizer
    if not opt.zero_grad_calls or opt.zero_grad_kernels_per_call < 1:
        return None
    calls = opt.zero_grad_filling_calls
    title = (
        f"optimizer.zero_grad() zeroes the gradients with kernels: "
        f"{_kernels(opt.zero_grad_kernels_per_call)} and {fmt_ms(opt.zero_grad_host_ns_per_call)} "
        f"of host time a call"
        + (
            f" ({calls} of {opt.zero_grad_calls} calls launched any)"
            if calls < opt.zero_grad_calls
            else ""
        )
    )
    return Draft(
        opt.zero_grad_host_ns_per_call * calls,
        title,
        {
            "optimizer": opt.optimizer,
            "zero_grad_calls": opt.zero_grad_calls,
            "zero_grad_filling_calls": calls,
            "kernels_per_call": opt.zero_grad_kernels_per_call,
            "gpu_ns_per_call": opt.zero_grad_gpu_ns_per_call,
            "host_ns_per_call": opt.zero_grad_host_ns_per_call,
        },
    )


# torch.optim's optimizers with a fused (single-kernel, CUDA) implementation; most others have
# foreach=True (multi-tensor kernels)
FUSED_OPTIMIZERS = frozenset({"Adam", "AdamW", "SGD", "Adagrad"})
# the PyTorch release whose torch.optim first took fused=True for each (audit 24: fused SGD
# advised on a 2021 trace; it came in 2.3); an older install has foreach=True (from 1.12)
FUSED_SINCE = {"Adam": "1.13", "AdamW": "2.0", "SGD": "2.3"}
FOREACH_OPTIMIZERS = frozenset({"Adadelta", "Adamax", "ASGD", "NAdam", "RAdam", "RMSprop", "Rprop"})


def _optimizer_advice(name: str | None, priced: bool = True) -> tuple[str, str]:
    """(recommendation, snippet) for the optimizer the trace names; ``priced``: the finding
    carries a prediction (whose assumption is said)."""
    if name in FUSED_OPTIMIZERS:
        since = FUSED_SINCE.get(name)
        older = (
            f" (fused=True from PyTorch {since}; on an older release, foreach=True, from 1.12; "
            f"before it, torch.optim._multi_tensor.{name})"
            if since
            else " (fused=True in recent PyTorch releases; on an older one, foreach=True)"
        )
        return (
            f"Use the fused implementation: torch.optim.{name}(..., fused=True){older}.",
            f"optimizer = torch.optim.{name}(model.parameters(), lr=lr, fused=True)",
        )
    if name in FOREACH_OPTIMIZERS:
        return (
            f"torch.optim.{name} has no fused kernel: use foreach=True (multi-tensor kernels), or "
            "compile the step (torch.compile fuses the per-parameter math).",
            f"optimizer = torch.optim.{name}(model.parameters(), lr=lr, foreach=True)\n"
            "opt_step = torch.compile(optimizer.step)  # then call opt_step()",
        )
    return (
        f"{name or 'This optimizer'} is not one of torch.optim's: use its multi-tensor or fused "
        "variant if it has one, or compile its step (torch.compile(optimizer.step)) so the "
        "per-parameter math runs as few kernels"
        + (" (the prediction assumes a fused step)." if priced else "."),
        "opt_step = torch.compile(optimizer.step)  # then call opt_step() each step",
    )


_FP32_ADVICE = (
    "Train in bf16 with torch.autocast (no GradScaler needed), or at least enable TF32 "
    "(torch.set_float32_matmul_precision('high'))."
)
# bf16 needs its own per-shape plans (cuDNN convolutions and attention): where input shapes keep
# changing, switching alone can slow the step down (a wav2vec2 loop: bf16 alone 0.23-0.30x, bf16
# with the inputs padded to one length 1.48-1.55x; benchmarks/RESULTS.md, sessions 22-23)
_SHAPES_BEFORE_BF16 = (
    "The inputs change shape from step to step and {op} sets up each new shape on the host "
    "(new_shape_setup, {steps}): bf16 needs its own plans per shape, so on varying shapes the "
    "switch alone can slow the step down. Give the inputs fixed shapes first (pad to one "
    "length or a few buckets), then switch; the saving below is for bf16 alone, and the "
    "`--what-if new_shape_setup,fp32_compute` replay prices both. "
)


@rule(
    "fp32_compute",
    gpu_work=True,
    advice={
        "cuda_app": Advice(
            "Matrix math runs in fp32 on CUDA cores: put it on tensor cores, with cuBLAS's TF32 "
            "math mode where the precision allows, or bf16/fp16 inputs with fp32 accumulation "
            "(cublasGemmEx).",
            (
                "cublasSetMathMode(handle, CUBLAS_TF32_TENSOR_OP_MATH);  // fp32 GEMMs on TF32 tensor cores\n"
                "// or bf16 inputs, fp32 accumulation:\n"
                "cublasGemmEx(handle, ta, tb, m, n, k, &alpha, A, CUDA_R_16BF, lda, B, CUDA_R_16BF, ldb,\n"
                "             &beta, C, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);"
            ),
        )
    },
    fix="bf16_gemms",
    recommendation=_FP32_ADVICE,
    snippet=(
        'with torch.autocast("cuda", dtype=torch.bfloat16):\n'
        "    loss = model(batch)\n"
        '# at least: torch.set_float32_matmul_precision("high")  # TF32 tensor cores'
    ),
    thresholds={
        "fp32_math_ratio": 0.2,
        # the attributed cost: bf16 tensor cores run this math several times faster; count half
        # (the bf16_gemms replay prices it by the device's peaks)
        "fp32_saving_ratio": 0.5,
        # per-shape setup over this share of the window (new_shape_setup's own threshold) puts
        # fixing the shapes before the switch
        "shapes_first_min_ratio": 0.05,
        # 16-bit math over this share of the math time: the step runs mixed precision already,
        # and its fp32 math is work left outside the autocast region
        "half_math_min_ratio": 0.05,
    },
)
def fp32_compute(x: RuleInput) -> Draft | None:
    kern = x.r.kernels
    fp32 = kern.fp32_gemm_time_ratio
    if fp32 is None:
        return None
    # TF32 tensor-core math counts where the device has bf16 (twice TF32's peak): cuDNN runs
    # fp32 convolutions in TF32 by default, and torchvision's DeepLabV3 (15% fp32, the rest
    # TF32) measured 1.14-1.17x for bf16 alone, 1.12-1.41x with channels_last, with no finding
    tf32 = (kern.tf32_gemm_time_ratio or 0.0) if x.r.efficiency.device.has_bf16 else 0.0
    if fp32 + tf32 < x.t["fp32_math_ratio"]:
        return None
    tf32_bound = fp32 < x.t["fp32_math_ratio"]  # raised by the TF32 share
    title = f"Matrix math runs in fp32 on CUDA cores: {fmt_pct(fp32)} of GEMM/conv/attention time"
    if tf32_bound:
        title = (
            f"Matrix math runs in TF32 and fp32: {fmt_pct(tf32)} and {fmt_pct(fp32)} of "
            "GEMM/conv/attention time, where bf16 tensor cores run twice TF32's peak"
        )
    # the math on 16-bit (or narrower) inputs, by the kernels' names
    half = kern.half_math_ns / kern.math_ns if kern.math_ns else 0.0
    mixed = half >= x.t["half_math_min_ratio"]
    if mixed:
        title += (
            f", beside {fmt_pct(half)} already in 16-bit: mixed precision leaves this part in fp32"
        )
    device = x.r.efficiency.device
    rec, snippet = _fp32_advice(
        device.has_bf16,
        device.has_tf32,
        x.r.host_ops,
        x.t["shapes_first_min_ratio"],
        tf32_bound=tf32_bound,
        tf32_faster=device.tf32_faster,
        mixed=mixed,
    )
    priced = x.r.replay is not None and "bf16_gemms" in x.r.replay.what_if
    plans = _sdpa_plan_steps(x.r) if priced else 0
    known_shapes = None
    if plans and x.r.replay is not None:
        # bf16 sends SDPA to cuDNN's attention, whose graph builds per new shape it prices; the
        # other end: a run whose shapes all recur builds none
        steps = x.r.replay.model.steps.height if x.r.replay.model else 0
        known_shapes = x.r.replay.predict(BF16_KNOWN_SHAPES)
        other = (
            f" (without them, where the run's shapes recur: {known_shapes.speedup:.2f}x)"
            if known_shapes is not None
            else ""
        )
        note = _CUDNN_SDPA.format(new=plans, steps=plural(steps, "step"), other=other)
        rec = f"{rec or _FP32_ADVICE} {note}"
    if device.priced_by and priced:  # a device the table lacks: say what the saving assumes
        rec = (
            f"{rec or _FP32_ADVICE} The saving assumes the weakest card of the GPU's family "
            f"({device.priced_by}): the GPU is not in the spec table."
        )
    return Draft(
        (kern.fp32_math_ns + (kern.tf32_math_ns if tf32 else 0)) * x.t["fp32_saving_ratio"],
        title,
        {
            "fp32_gemm_time_ratio": fp32,
            "tf32_gemm_time_ratio": kern.tf32_gemm_time_ratio,
            "fp32_math_ns": kern.fp32_math_ns,
            "math_ns": kern.math_ns,
            # 16-bit math beside it: a mixed-precision step whose fp32 math is left outside
            "half_math_ns": kern.half_math_ns,
            "top_fp32_kernels": list(kern.top_fp32_kernels),
            # a device the table lacks: the saving assumes the family's weakest card
            **({"peaks_assumed": device.priced_by} if device.priced_by else {}),
            # cuDNN attention's graph builds priced: the steps that met new shapes, and the
            # saving where the run's shapes recur (none built)
            **(
                {
                    "sdpa_plan_steps": plans,
                    "speedup_known_shapes": known_shapes.speedup if known_shapes else None,
                }
                if plans
                else {}
            ),
        },
        rec,
        snippet,
    )


# bf16 under autocast sends scaled_dot_product_attention to cuDNN's attention on Hopper and
# Blackwell (causal/build.py sdpa_plan_ns): a new shape's first call builds its graph
_CUDNN_SDPA = (
    "On this GPU bf16 sends scaled_dot_product_attention from its efficient backend to cuDNN's "
    "attention, which builds a graph on the host for each new input shape (47-82 ms a forward "
    "and 50-87 ms a backward measured on H100 and H200), and the attention met new shapes in "
    "{new} of {steps}: the saving below prices those builds, as often as the window met new "
    "shapes{other}. Pad the inputs to a few bucket lengths "
    "first, or keep SDPA on the efficient backend (with torch.nn.attention.sdpa_kernel("
    "SDPBackend.EFFICIENT_ATTENTION)); a T5 loop measured 0.21-0.33x in bf16 alone and "
    "0.80-0.87x with cuDNN's attention off."
)


def _sdpa_plan_steps(r: Results) -> int:
    """The modelled steps whose attention would build cuDNN graphs in bf16 (their forwards)."""
    m = r.replay.model if r.replay is not None else None
    if m is None or "sdpa_plan_ns" not in m.gpu.columns:
        return 0
    return int((m.gpu.get_column("sdpa_plan_ns") == CUDNN_SDPA_PLAN_NS["forward"]).sum())


# An inference (forward-only) window: no GradScaler (loss scaling is for gradients).
INFERENCE_FP32_ADVICE = (
    "Run the model in bf16 (torch.autocast, or model.to(torch.bfloat16) for inference), or at "
    "least enable TF32 (torch.set_float32_matmul_precision('high')).",
    'with torch.inference_mode(), torch.autocast("cuda", dtype=torch.bfloat16):\n'
    "    out = model(batch)",
)
# an inference step whose math is TF32 already, or on a GeForce card (TF32 at the fp32 rate):
# "or at least enable TF32" gains nothing there (audit s63: a public RTX 3090 ResNet pass, 86.9%
# of its math TF32 convolutions, told to enable TF32)
INFERENCE_TF32_TO_BF16_ADVICE = (
    "Run the model in bf16 (torch.autocast, or model.to(torch.bfloat16) for inference): the "
    "math already runs on TF32 tensor cores, and bf16 ones run twice as fast at peak.",
    INFERENCE_FP32_ADVICE[1],
)
INFERENCE_NO_TF32_GAIN_ADVICE = (
    "Run the model in bf16 (torch.autocast, or model.to(torch.bfloat16) for inference): on this "
    "GPU TF32 tensor math runs at the fp32 rate (GeForce cards), so enabling TF32 saves "
    "nothing; bf16 runs twice as fast at peak.",
    INFERENCE_FP32_ADVICE[1],
)
INFERENCE_FP16_ADVICE = (
    "This GPU has no bf16 or TF32 tensor cores (e.g. V100, T4): run the model in fp16 "
    "(torch.autocast, or model.half() for inference); no GradScaler: loss scaling is for "
    "training.",
    'with torch.inference_mode(), torch.autocast("cuda", dtype=torch.float16):\n'
    "    out = model(batch)",
)


# Volta (V100) has fp16 tensor cores only: no bf16, no TF32 (from the device spec table).
FP16_ADVICE = (
    "This GPU has no bf16 or TF32 tensor cores (e.g. V100): train in fp16 with torch.autocast and "
    "a GradScaler (fp16's range needs loss scaling).",
    'scaler = torch.amp.GradScaler("cuda")\n'
    'with torch.autocast("cuda", dtype=torch.float16):\n'
    "    loss = model(batch)\n"
    "scaler.scale(loss).backward(); scaler.step(opt); scaler.update()",
)


# The math already runs on TF32 tensor cores (cuDNN's default for fp32 convolutions): bf16 is
# the step left, and bf16 convolutions want channels_last (NCHW inputs add layout transposes):
# DeepLabV3 measured 1.14-1.17x for bf16 alone, 1.12-1.41x with channels_last.
TF32_TO_BF16_ADVICE = (
    "Train in bf16 with torch.autocast (no GradScaler needed): the math already runs on TF32 "
    "tensor cores, and bf16 ones run twice as fast at peak. For convolutions also put the model "
    "and its inputs in channels_last memory format, so bf16 convolutions need no layout "
    "transposes.",
    "model = model.to(memory_format=torch.channels_last)\n"
    "x = x.to(memory_format=torch.channels_last)\n"
    'with torch.autocast("cuda", dtype=torch.bfloat16):\n'
    "    loss = model(x)",
)


# GeForce cards (RTX 30, 40, 50) run TF32 tensor math at their fp32 rate and bf16 with fp32
# accumulation at twice it (the GA102 and Ada whitepapers: RTX 3090 35.6 / 35.6 / 71 TFLOP/s,
# RTX 4090 82.6 / 82.6 / 165.2): TF32 saves nothing there.
NO_TF32_GAIN_ADVICE = (
    "Train in bf16 with torch.autocast (no GradScaler needed): on this GPU TF32 tensor math "
    "runs at the fp32 rate (GeForce cards), so enabling TF32 saves nothing; bf16 runs twice "
    "as fast at peak.",
    'with torch.autocast("cuda", dtype=torch.bfloat16):\n    loss = model(batch)',
)


# CDNA2 (MI200) has bf16 matrix cores but no TF32 (xf32 came with MI300).
BF16_ONLY_ADVICE = (
    "Train in bf16 with torch.autocast (no GradScaler needed); this GPU has no TF32 matrix math.",
    'with torch.autocast("cuda", dtype=torch.bfloat16):\n    loss = model(batch)',
)


# A step that runs part of its math in 16-bit already: its fp32 math is work the autocast
# region leaves out. Session 67's held-out distillation loop: the Trainer's fp16 autocasts the
# student it prepared (accelerate wraps that model's forward), while the teacher, called in
# compute_loss, ran its GEMMs in fp32: 87.6% of the math time beside 11.8% in fp16; advised
# "train in bf16 with torch.autocast", which the loop already did.
_MIXED_ADVICE = (
    "Part of the step's math already runs in 16-bit, so its fp32 math is work the mixed "
    "precision leaves out: a second model called directly (a distillation teacher, an EMA or "
    "reference model: a framework's mixed precision wraps only the model it prepared), code "
    "under autocast(enabled=False), or modules kept in fp32 beside 16-bit weights (PEFT's "
    "LoRA adapters, upcast by default). Run that work under the same torch.autocast (the "
    "dtype the rest of the step uses), or cast a model that is not trained to that "
    "dtype{tf32}."
)
_MIXED_TF32 = ", or at least enable TF32 (torch.set_float32_matmul_precision('high'))"


def _mixed_advice(has_bf16: bool | None, tf32_gains: bool | None) -> tuple[str, str]:
    """(recommendation, snippet) for fp32 math beside 16-bit math in one step."""
    dtype = "bfloat16" if has_bf16 is not False else "float16"
    return (
        _MIXED_ADVICE.format(tf32=_MIXED_TF32 if tf32_gains else ""),
        "# the model called outside the prepared one (here a frozen teacher), under the same autocast\n"
        f'with torch.no_grad(), torch.autocast("cuda", dtype=torch.{dtype}):\n'
        "    teacher_out = teacher(**inputs)",
    )


def _fp32_advice(
    has_bf16: bool | None,
    has_tf32: bool | None,
    host: HostOpsResult,
    shapes_min_ratio: float,
    *,
    tf32_bound: bool = False,
    tf32_faster: bool | None = None,
    mixed: bool = False,
) -> tuple[str | None, str | None]:
    """(recommendation, snippet) for the device; (None, None): the rule's own (bf16 or TF32).
    Where new input shapes cost per-shape setup (at least ``shapes_min_ratio`` of the window,
    in more than one step), fixing the shapes comes first. ``tf32_bound``: the math is TF32
    already, so the advice is bf16 (with channels_last for convolutions); ``tf32_faster``
    False: TF32 runs at the fp32 rate (GeForce), so the advice is bf16 alone; ``mixed``: part
    of the math runs in 16-bit already, so the advice is the work left outside autocast."""
    rec, snippet = None, None
    if mixed:
        rec, snippet = _mixed_advice(
            has_bf16, has_tf32 and tf32_faster is not False and not tf32_bound
        )
    elif has_bf16 is False and has_tf32 is False:
        rec, snippet = INFERENCE_FP16_ADVICE if host.forward_only else FP16_ADVICE
    elif host.forward_only and tf32_bound:
        rec, snippet = INFERENCE_TF32_TO_BF16_ADVICE
    elif host.forward_only and has_bf16 and tf32_faster is False:
        rec, snippet = INFERENCE_NO_TF32_GAIN_ADVICE
    elif host.forward_only:
        rec, snippet = INFERENCE_FP32_ADVICE
    elif tf32_bound:
        rec, snippet = TF32_TO_BF16_ADVICE
    elif has_bf16 and has_tf32 is False:
        rec, snippet = BF16_ONLY_ADVICE
    elif has_bf16 and tf32_faster is False:
        rec, snippet = NO_TF32_GAIN_ADVICE
    ratio = host.new_shape_ratio
    varying = host.new_shape_steps > 1 and ratio is not None and ratio >= shapes_min_ratio
    if host.new_shape and varying:
        first = _SHAPES_BEFORE_BF16.format(
            op=host.new_shape[0].name, steps=plural(host.new_shape_steps, "step")
        )
        rec = first + (rec or _FP32_ADVICE)
    return rec, snippet


@rule(
    "recompute_overhead",
    advice={"cuda_app": None},  # torch.utils.checkpoint's recomputed forward
    fix="recompute_removed",
    recommendation="Checkpoint only as much as memory requires (every other block, or selective checkpointing of "
    "cheap ops); if memory allows, turn it off.",
    snippet=(
        "# checkpoint only what memory needs, e.g. every other block:\n"
        "x = checkpoint(block, x, use_reentrant=False) if i % 2 == 0 else block(x)\n"
        "# or use selective activation checkpointing (torch.utils.checkpoint.create_selective_checkpoint_contexts)"
    ),
)
def recompute_overhead(x: RuleInput) -> Draft | None:
    rec = x.r.recompute
    if rec.recompute_ns <= 0:
        return None
    return Draft(
        rec.recompute_ns,
        f"Activation checkpointing recomputes the forward in backward: {fmt_ms(rec.recompute_ns)} "
        f"({fmt_pct(rec.recompute_time_ratio)} of the window)",
        {
            "recomputed_ops": rec.recomputed_ops,
            "recompute_kernel_ns": rec.recompute_kernel_ns,
            "recompute_host_ns": rec.recompute_host_ns,
            "recompute_time_ratio": rec.recompute_time_ratio,
        },
    )


def steady_steps_what_if(r: Results) -> tuple[WhatIf | None, str | None]:
    """step_time_variance's fix: every step as fast as the median one (no replay: the steps'
    own times say it), mean step -> median step, as a ratio of the un-profiled step where the
    model has one."""
    s = r.steps
    if not s.steps or s.step_time_median_ns is None or s.step_time_mean_ns is None:
        return None, "the trace has no steps to compare"
    mean, median = float(s.step_time_mean_ns), float(s.step_time_median_ns)
    if median <= 0:
        return None, "the trace has no steps to compare"
    rp = r.replay
    if rp is not None and rp.unprofiled_step_ns is not None:
        # in the un-profiled step every other prediction starts from: the same ratio
        before = rp.unprofiled_step_ns
        return WhatIf.of(before, before * min(1.0, median / mean)), None
    return WhatIf.of(mean, min(mean, median)), None


@rule(
    "step_time_variance",
    advice={
        "cuda_app": Advice(
            "Find what differs in the slow iterations (I/O, output or checkpoint writes every N "
            "iterations, load imbalance across MPI ranks, other processes) and move it off the "
            "critical path or amortize it.",
            "// time each iteration with cudaEventRecord/cudaEventElapsedTime and compare the "
            "slow ones",
        )
    },
    estimate=steady_steps_what_if,
    recommendation="Find what differs in the slow steps (data, GC pauses, logging/checkpointing every N steps, other "
    "processes) and move it out of the step or amortize it.",
    snippet=(
        "# time every step with CUDA events and look at the slow ones\n"
        "gc.freeze(); gc.disable()  # if Python GC pauses line up with the slow steps"
    ),
    thresholds={
        "step_cv": 0.15,
        "variance_cause_min_ratio": 0.5,
        # fewer steps than this have no spread to speak of (two steps: one differs, no pattern)
        "variance_min_steps": 3,
    },
)
def step_time_variance(x: RuleInput) -> Draft | None:
    steps = x.r.steps
    if (
        steps.steps < x.t["variance_min_steps"]
        or steps.step_time_cv is None
        or (steps.step_time_cv < x.t["step_cv"] and not steps.outlier_steps)
    ):
        return None
    median = steps.step_time_median_ns or 0
    excess = sum(max(0, s.dur_ns - median) for s in steps.per_step if s.step in steps.outlier_steps)
    cause = variance_cause(x.r, x.t["variance_cause_min_ratio"], x.t["variance_min_steps"])
    # One slow step cannot say whether it recurs, so its saving (the window's mean to its
    # median) is a guess at a frequency; workers that fall behind make a period by mechanism
    # (each delivers in turn). Measured: fast neural style's loader in the step thread, its
    # third profiled step 87.5 ms against 64.7 and 63.9 (its ToTensor ops 10-30x slower in that
    # step), its 40 un-profiled steps 38.5-55.0 ms with no such step.
    periodic = cause == "dataloader" and steps.loader_iterator == "multi_process"
    one_off = len(steps.outlier_steps) == 1 and not periodic
    return Draft(
        excess,
        f"Step time varies: CV {steps.step_time_cv:.2f}, "
        + (
            f"outlier step{'s' if len(steps.outlier_steps) > 1 else ''} "
            f"{', '.join(map(str, steps.outlier_steps))}"
            if steps.outlier_steps
            else "no outlier step"
        )
        + (f"; the {cause} idle varies with it" if cause else ""),
        {
            "step_time_cv": steps.step_time_cv,
            "step_time_median_ns": median,
            "outlier_steps": list(steps.outlier_steps),
            "step_times_ns": [s.dur_ns for s in steps.per_step],
            # the idle cause whose per-step time varies as the steps do: the variance is its
            # symptom, ranked after its finding (findings/__init__.py)
            "caused_by": cause,
            # one slow step, no period by mechanism: graded low at most
            "single_slow_step": one_off,
        },
        cap="low" if one_off else None,
        cap_reason="one slow step with no repeating pattern",
    )


# the share of each outlier step's excess over the median its named cause must account for
OUTLIER_SHARE_MIN = 0.25


def variance_cause(r: Results, min_ratio: float, min_steps: float) -> str | None:
    """The idle cause whose time per step varies most, where its spread is at least
    ``min_ratio`` of the steps' own (standard deviations over the steps, at least ``min_steps``
    of them): a periodic loader stall, a sync every N steps. None where no cause carries the
    variance."""
    per = r.idle.per_step
    durs = {s.step: s.dur_ns for s in r.steps.per_step}
    if len(per) < min_steps or len(durs) < min_steps:
        return None

    def std(xs: list[float]) -> float:
        m = sum(xs) / len(xs)
        return (sum((x - m) ** 2 for x in xs) / len(xs)) ** 0.5

    step_std = std([float(durs[s.step]) for s in per if s.step in durs])
    if step_std <= 0:
        return None
    spread = {c: std([float(s.idle_by_cause_ns.get(c, 0)) for s in per]) for c in IDLE_CAUSES}
    cause = max(spread, key=lambda c: (spread[c], c))
    if spread[cause] < min_ratio * step_std:
        return None
    return cause if _in_every_outlier(r, per, durs, cause) else None


def _in_every_outlier(r: Results, per: Sequence[Any], durs: dict[int, int], cause: str) -> bool:
    """Whether ``cause``'s idle rises in each outlier step by a share of that step's excess
    over the median (OUTLIER_SHARE_MIN), and by half their excess in all: the largest spread
    alone named one cause for outliers of different causes (audit 16: a V100 ResNet's step 9,
    37 ms slower in sub-millisecond launch gaps, read "the pageable_copy idle varies with it",
    a copy that ran as in every other step)."""
    outliers = [s for s in per if s.step in set(r.steps.outlier_steps) and s.step in durs]
    if not outliers:
        return True
    med = statistics.median(float(d) for d in durs.values())
    med_c = statistics.median(float(s.idle_by_cause_ns.get(cause, 0)) for s in per)
    rise = [(float(s.idle_by_cause_ns.get(cause, 0)) - med_c, durs[s.step] - med) for s in outliers]
    return all(c >= OUTLIER_SHARE_MIN * e for c, e in rise if e > 0) and sum(
        c for c, _ in rise
    ) >= 0.5 * sum(max(0.0, e) for _, e in rise)


# cold_start's advice where the window is steady but holds some one-time idle
ONE_TIME_IN_STEADY_WINDOW = (
    "Part of this window's idle is one-time cost (a first allocation, a module load, a kernel's "
    "first launch): later steps do not pay it. The other findings describe the steady loop; "
    "record after a warm-up to leave these costs out."
)


@rule(
    "cold_start",
    advice={
        "cuda_app": Advice(
            "The window holds the run's first pass: its idle time is one-time cost (module "
            "loading, context and handle creation, JIT compilation). Profile steady-state "
            "iterations: start the capture after warm-up (cudaProfilerStart/cudaProfilerStop with"
            " nsys --capture-range=cudaProfilerApi); build for the GPU's architecture so nothing "
            "is JIT-compiled.",
            (
                "for (int it = 0; it < n; ++it) {\n"
                "  if (it == warmup) cudaProfilerStart();  // nsys profile --capture-range=cudaProfilerApi\n"
                "  step(it);\n"
                "}\n"
                "cudaProfilerStop();"
            ),
        )
    },
    no_estimate="one-time costs (first launches that load their modules, module loads, stream "
    "and handle creation, compilation) are not paid again by a warmed-up loop: record after "
    "warm-up to see what the steady state spends",
    cap="low",  # not a change to the program: the recording's window
    recommendation="The window holds the run's first pass: its idle time is one-time cost, not "
    "what each step pays. Record steady-state steps after a warm-up (and after torch.compile "
    "has compiled) to see the levers.",
    snippet=(
        "from torch.profiler import profile, schedule\n"
        "with profile(schedule=schedule(wait=1, warmup=1, active=3), record_shapes=True) as prof:\n"
        "    for step, batch in enumerate(loader):\n"
        "        train_step(batch)\n"
        "        prof.step()\n"
        "        if step >= 5:\n"
        "            break"
    ),
    thresholds={"cold_start_min_ratio": 0.03},
)
def cold_start(x: RuleInput) -> Draft | None:
    cost = x.idle("warmup")
    idle = x.r.idle
    if not idle.cold_window and (cost <= 0 or cost < x.t["cold_start_min_ratio"] * x.window_ns):
        return None
    calls = idle.warmup_calls
    first = sum(1 for c in calls if c.kind == "first_launch")
    longest = calls[0] if calls else None
    calls_text = plural(idle.warmup_call_count, "one-time call") + (
        f", the longest {longest.name} {fmt_ms(longest.dur_ns)}" if longest else ""
    )
    # a graph's capture is the first pass here, with no one-time call to count (audit 16: an
    # SGLang decode capture read "part of a first pass (0 one-time calls)")
    captured = x.idle("capture")
    what = (
        f"a CUDA graph's capture, {fmt_ms(captured)} of GPU idle while it recorded"
        if idle.warmup_call_count == 0 and captured > 0
        else calls_text
    )
    return Draft(
        cost,
        # a steady window with some one-time idle is no first pass: its other findings stand
        # (audit 21: "a cold first pass" beside an uncapped HIGH finding)
        (
            f"A cold first pass: {fmt_ms(cost)} of GPU idle is one-time cost ({calls_text})"
            if idle.cold_window
            else f"One-time costs in the window: {fmt_ms(cost)} of GPU idle ({calls_text})"
        )
        if cost >= x.t["cold_start_min_ratio"] * x.window_ns
        else f"The window is part of a first pass ({what}): its costs are not all a steady step's",
        {
            "idle_ns": cost,
            "warmup_call_count": idle.warmup_call_count,
            "first_launches_reported": first,
            "warmup_calls": list(calls),
            "top_segments": x.segments("warmup"),
        },
        None if idle.cold_window else ONE_TIME_IN_STEADY_WINDOW,
        # a CUDA application's declared advice says "first pass" too (the review)
        advice={} if idle.cold_window else {"cuda_app": Advice(ONE_TIME_IN_STEADY_WINDOW, "")},
    )


@rule(
    "graph_capture",
    advice={
        "cuda_app": Advice(
            "This window is a CUDA/HIP graph capture phase (launches are recorded into a graph, "
            "not run): its utilization is not the steady state. Profile the iterations that "
            "replay the graph (cudaGraphLaunch).",
            (
                "// profile the replays: cudaProfilerStart() after cudaGraphInstantiate, with nsys\n"
                "// profile --capture-range=cudaProfilerApi"
            ),
        )
    },
    no_estimate="a graph capture runs no work: its GPU time says nothing about the replayed "
    "graph's; profile the replay",
    cap="info",
    recommendation="This window is a CUDA/HIP graph capture phase (launches are recorded into a "
    "graph, not run): its utilization is not the steady state. Profile the steps that replay "
    "the captured graphs.",
    snippet="# profile after capture: the replayed steps (e.g. skip the warm-up/capture iterations)",
    thresholds={"graph_capture_min_ratio": 0.03},
)
def graph_capture(x: RuleInput) -> Draft | None:
    cost = x.idle("capture")
    if cost <= 0 or cost < x.t["graph_capture_min_ratio"] * x.window_ns:
        return None
    return Draft(
        cost,
        f"A graph capture phase: {fmt_ms(cost)} of GPU idle while launches were captured, not run",
        {"idle_ns": cost, "top_segments": x.segments("capture")},
    )


def host_contention_what_if(r: Results) -> tuple[WhatIf | None, str | None]:
    """The contended copies at a low rate for one core (analyzers/host_ops.py), replayed."""
    w = r.host_ops.what_if
    why = "no step model, or no host call after the copies on their thread: the copies' time"
    return w, None if w is not None else why


@rule(
    "host_thread_contention",
    advice={"cuda_app": None},  # ATen's CPU ops: a PyTorch trace
    estimate=host_contention_what_if,
    recommendation="CPU copies run at a hundredth of what one core copies: the intra-op thread "
    "pool does not get the cores. Give it fewer threads than free cores: OMP_NUM_THREADS=1 (or "
    "torch.set_num_threads(k), k at most the cores per process over 1 + DataLoader workers); "
    "after torch.compile in a process that found a warm inductor cache, "
    "TORCHINDUCTOR_COMPILE_THREADS=1; and look for other processes on the same cores "
    "(taskset/numactl per rank).",
    snippet=(
        "# before torch is imported (or: torch.set_num_threads(1) at the start)\n"
        "import os\n"
        'os.environ.setdefault("OMP_NUM_THREADS", "1")\n'
        'os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")  # with torch.compile\n'
        "import torch"
    ),
    thresholds={"host_contention_min_ratio": 0.05},
)
def host_thread_contention(x: RuleInput) -> Draft | None:
    h = x.r.host_ops
    ratio = h.contended_ratio
    if not h.contended or ratio is None or ratio < x.t["host_contention_min_ratio"]:
        return None
    top = h.contended[0]
    return Draft(
        h.contended_ns,
        f"Host threads contend: {top.name} copied {fmt_num(top.bytes_per_call / 2**20)} MiB in "
        f"{fmt_ms(top.dur_ns / top.count)} ({fmt_num(top.bytes_per_s / 2**20)} MiB/s, where one "
        f"core copies GB/s): {fmt_pct(ratio)} of the window in such copies",
        {
            "contended_ns": h.contended_ns,
            "contended_ratio": ratio,
            "ops": list(h.contended),
            "assumed_bytes_per_s": h.assumed_bytes_per_s,
            "what_if": h.what_if,
            # the copies at a fast core's rate: the upper end of the range
            "what_if_upper": h.what_if_upper,
            "assumes": "the copies at 2 GB/s once their threads get cores (20 GB/s: the upper "
            "end); the rest of the host's work as recorded, though contention may slow it too: "
            "the saving can be larger",
        },
    )


def new_shape_what_if(r: Results) -> tuple[WhatIf | None, str | None]:
    """The new shapes' calls at their op's known-shape median (analyzers/host_ops.py), replayed."""
    w = r.host_ops.what_if_new_shape
    return w, None if w is not None else "no step model to replay the shortened calls in"


# steps the window needs, each meeting new shapes, before new_shape_setup may be graded above low
NEW_SHAPE_MIN_STEPS = 3


# an op beside the first named in new_shape_setup's title from this share of the excess
NEW_SHAPE_NAMED_RATIO = 0.25


@rule(
    "new_shape_setup",
    advice={"cuda_app": None},  # ATen's ops: a PyTorch trace
    estimate=new_shape_what_if,
    # The saving holds while new shapes keep coming at the window's rate; they fade as the run
    # meets its shapes again (measured on the sentence-transformers loop in bf16: 9 slow steps
    # in its first 50, 0-1 in each later 50; padding to one length 1.43-1.61x over 30 steps
    # where a 3-step trace with 2 slow steps predicted 2.85x): the window's rate is the upper end.
    # Medium at most, and only where every step of the window met new shapes (no sign of them
    # fading yet: the HF course's T5 loop in bf16, 3 of 3 steps, 2.84x predicted, fixed shapes
    # measured 2.84-3.71x over 50 steps); low where some steps met none
    cap="medium",
    recommendation="The first call with each new input shape sets up for it on the host (cuDNN "
    "attention and convolutions build an execution plan per shape; cudnn.benchmark=True also "
    "times the convolutions of each new shape): give the inputs fixed shapes (pad to one length, or a few bucket "
    "lengths), or choose a path that needs no per-shape setup (another attention backend; "
    "cudnn.benchmark=False when shapes vary). The cost fades as shapes repeat, so a long run "
    "pays it mostly early.",
    snippet=(
        "# one length for every batch (or a few buckets): the per-shape setup runs once each\n"
        'batch = tokenizer(texts, padding="max_length", max_length=128, truncation=True, '
        'return_tensors="pt")\n'
        "# or an attention backend without per-shape plans\n"
        "from torch.nn.attention import SDPBackend, sdpa_kernel\n"
        "with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]):\n"
        "    loss = model(batch)"
    ),
    thresholds={"new_shape_min_ratio": 0.05},
)
def new_shape_setup(x: RuleInput) -> Draft | None:
    h = x.r.host_ops
    ratio = h.new_shape_ratio
    if not h.new_shape or ratio is None or ratio < x.t["new_shape_min_ratio"]:
        return None
    top = h.new_shape[0]
    steps = x.r.steps.steps or 0
    fading = not (steps >= NEW_SHAPE_MIN_STEPS and h.new_shape_steps >= steps)
    known = (
        f"against {fmt_ms(top.repeat_median_ns)} with a known one"
        if top.reference == "op"
        # nearly every call of the op had a new shape: the window's usual call is the reference
        else f"against {fmt_ns(top.repeat_median_ns)} for the window's median op call with a "
        "known shape (too few of its own)"
    )
    # the ops beside the first that hold a share of the excess: the share is all of theirs
    # (audit 11: wav2vec2's 27.9% was convolution_backward's 50.3 ms and cudnn_convolution's
    # 48.8 ms, the title naming the first alone)
    others = [
        o for o in h.new_shape[1:] if o.excess_ns >= NEW_SHAPE_NAMED_RATIO * h.new_shape_excess_ns
    ]
    also = "".join(
        f"; {o.name} {fmt_ms(o.dur_ns / o.count)} a call on {plural(o.count, 'first call')} "
        f"({fmt_ms(o.dur_ns)})"
        for o in others
    )
    return Draft(
        h.new_shape_excess_ns,
        f"New input shapes cost setup on the host: {top.name} took "
        f"{fmt_ms(top.dur_ns / top.count)} a call on {plural(top.count, 'first call')} with a new "
        f"shape ({fmt_ms(top.dur_ns)}) {known}{also}; setup beyond the usual calls: "
        f"{fmt_pct(ratio)} of the window",
        {
            "excess_ns": h.new_shape_excess_ns,
            "excess_ratio": ratio,
            "steps_with_new_shapes": h.new_shape_steps,
            "ops": list(h.new_shape),
            "assumes": "new shapes keep coming at the window's rate, each call then at its op's "
            "median with a known shape (where the op ran too few, the window's median op call; "
            "time inside runtime calls, a wait, kept); they fade as the run meets its shapes "
            "again, so this is the upper end",
            "steps": steps,
        },
        cap="low" if fading else None,
        cap_reason="new shapes fade as the run meets its shapes again: the saving is the upper end",
    )


def _host_ops_estimate(field: str) -> Callable[[Results], tuple[WhatIf | None, str | None]]:
    """A rule's estimate: the host ops' what-if ``field`` (analyzers/host_ops.py: the ops taken
    out of the model, replayed), or why there is none."""

    def estimate(r: Results) -> tuple[WhatIf | None, str | None]:
        w = getattr(r.host_ops, field)
        return w, None if w is not None else "no step model to replay the step without them in"

    estimate.replays = True  # type: ignore[attr-defined]  # a replay: its low end replays too
    return estimate


def _host_ops_share(x: RuleInput, ns: int, calls: int, threshold: str) -> tuple[float, int] | None:
    """The share of the window host ops' time ``ns`` takes and the window's steps, where there
    are such ``calls`` and the share reaches the rule's ``threshold`` (None elsewhere)."""
    ratio = ns / x.window_ns if x.window_ns else 0.0
    if calls == 0 or ratio < x.t[threshold]:
        return None
    return ratio, x.r.steps.steps or 0


@rule(
    "ddp_buffer_broadcast",
    advice={"cuda_app": None},  # torch.nn.parallel.DistributedDataParallel's own ops
    estimate=_host_ops_estimate("what_if_buffer_sync"),
    recommendation="DistributedDataParallel broadcasts every buffer from rank 0 at each forward "
    "(broadcast_buffers=True, the default): flattening them, the broadcast and copying them back "
    "into each module run on the host before the forward. Where the buffers need not match "
    "across ranks at every step (BatchNorm's running statistics: each rank's own are fine for "
    "training, or use SyncBatchNorm), pass broadcast_buffers=False; buffers that never change "
    "after construction can be registered with persistent=False or as plain attributes.",
    snippet=(
        "model = torch.nn.parallel.DistributedDataParallel(\n"
        "    model, device_ids=[local_rank], broadcast_buffers=False)\n"
        "# or keep BatchNorm statistics in sync every step where it matters:\n"
        "# model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)"
    ),
    thresholds={"buffer_sync_min_ratio": 0.05},
)
def ddp_buffer_broadcast(x: RuleInput) -> Draft | None:
    h = x.r.host_ops
    share = _host_ops_share(x, h.buffer_sync_ns, h.buffer_sync_calls, "buffer_sync_min_ratio")
    if share is None:
        return None
    ratio, steps = share
    per = f"{fmt_ms(h.buffer_sync_ns / steps)} a step" if steps else fmt_ms(h.buffer_sync_ns)
    return Draft(
        h.buffer_sync_ns,
        f"DistributedDataParallel broadcasts its buffers at every forward: flattening, "
        f"broadcasting and copying them back take {per} of host time "
        f"({fmt_pct(ratio)} of the window)",
        {
            "buffer_sync_ns": h.buffer_sync_ns,
            "buffer_sync_calls": h.buffer_sync_calls,
            "buffer_sync_ratio": ratio,
            "steps": steps,
        },
    )


@rule(
    "distribution_checks",
    advice={"cuda_app": None},  # torch.distributions' own checks
    estimate=_host_ops_estimate("what_if_distribution_checks"),
    recommendation="torch.distributions checks each distribution's parameters when it is built "
    "and each value passed to log_prob (validate_args defaults to Python's __debug__, so on): "
    "every check computes a mask and reads it back to the host (for a GPU tensor, a device "
    "sync), with a dozen small ops around it. Once the code is known to pass them (a policy's logits, a "
    "sampled action), turn them off for the loop: "
    "torch.distributions.Distribution.set_default_validate_args(False) once, or "
    "validate_args=False where each distribution is built; python -O turns them off too.",
    snippet=(
        "import torch\n"
        "torch.distributions.Distribution.set_default_validate_args(False)  # once, before the loop\n"
        "# or where the distribution is built:\n"
        "dist = torch.distributions.Categorical(logits=logits, validate_args=False)"
    ),
    thresholds={"distribution_checks_min_ratio": 0.02},
)
def distribution_checks(x: RuleInput) -> Draft | None:
    h = x.r.host_ops
    share = _host_ops_share(
        x, h.distribution_checks_ns, h.distribution_checks, "distribution_checks_min_ratio"
    )
    if share is None:
        return None
    ratio, steps = share
    if steps:
        per = (
            f"{plural(h.distribution_checks / steps, 'check')} a step take "
            f"{fmt_ms(h.distribution_checks_ns / steps)} of host time"
        )
    else:
        per = f"{h.distribution_checks} checks take {fmt_ms(h.distribution_checks_ns)} of host time"
    # checks of CPU tensors read their mask without a device sync
    synced = h.distribution_check_syncs * 2 >= h.distribution_checks
    how = "on the GPU" if synced else "on every call"
    read = ", each read back with a device sync" if synced else ""
    return Draft(
        h.distribution_checks_ns,
        f"torch.distributions validates its arguments {how}: {per}{read} "
        f"({fmt_pct(ratio)} of the window)",
        {
            "checks": h.distribution_checks,
            "check_syncs": h.distribution_check_syncs,
            "host_time_ns": h.distribution_checks_ns,
            "host_time_ratio": ratio,
            "steps": steps,
            "assumes": "the checks pass (turned off, a value they would reject is no longer "
            "caught); each check's ops and the Python between them, from its first comparison "
            "to the read-back's end, go; the kernels they launched (a few microseconds) stay",
        },
    )


@rule(
    "grouped_mm_fallback",
    advice={"cuda_app": None},  # torch._grouped_mm's own fallback
    estimate=_host_ops_estimate("what_if_grouped_mm_fallback"),
    recommendation="PyTorch's grouped matmul (torch._grouped_mm, which MoE experts call) ran "
    "its per-group fallback here: it loops over the groups and reads their offsets back to the "
    "host, a device sync each call. In bf16 it is one kernel and no sync (measured on an H100); "
    "autocast leaves it alone, so fp32 weights reach it in fp32. Keep the experts' weights (or "
    "the model) in bf16, with fp32 master weights in the optimizer where training needs them, "
    "or cast the experts' weights and inputs to bf16 around the call.",
    snippet=(
        "model = model.to(torch.bfloat16)  # the experts' grouped matmuls: one kernel, no sync\n"
        "# or only the experts: for e in experts: e.to(torch.bfloat16)"
    ),
    thresholds={"grouped_mm_fallback_min_ratio": 0.02},
)
def grouped_mm_fallback(x: RuleInput) -> Draft | None:
    h = x.r.host_ops
    share = _host_ops_share(
        x, h.grouped_mm_fallback_ns, h.grouped_mm_fallback_calls, "grouped_mm_fallback_min_ratio"
    )
    if share is None:
        return None
    ratio, steps = share
    n, ns, syncs = (
        h.grouped_mm_fallback_calls,
        h.grouped_mm_fallback_ns,
        h.grouped_mm_fallback_syncs,
    )
    per = (
        f"{plural(n / steps, 'call')} a step hold {fmt_ms(ns / steps)} of host time and "
        f"{plural(syncs / steps, 'device sync')}"
        if steps
        else f"{plural(n, 'call')} hold {fmt_ms(ns)} of host time and {plural(syncs, 'device sync')}"
    )
    dtypes = h.grouped_mm_fallback_dtypes
    typed = f" on {'/'.join(dtypes)} inputs" if dtypes else ""
    return Draft(
        ns,
        f"Grouped matmuls run PyTorch's per-group fallback{typed}: {per} "
        f"({fmt_pct(ratio)} of the window)",
        {
            "calls": n,
            "syncs": syncs,
            "input_dtypes": list(dtypes),
            "host_time_ns": ns,
            "host_time_ratio": ratio,
            "steps": steps,
            "assumes": "the fallback's host time goes (its loop over the groups and the "
            "offsets' read-back); its per-group kernels stay (one bf16 kernel is faster: not "
            "priced), as do autocast's casts of the other weights, which bf16 weights drop too: "
            "a lower bound (a held-out MoE LM: 1.30x against 1.59-1.96x measured for bf16 "
            "weights)",
        },
    )


def _per_step(n: float, ns: int, steps: int, what: str) -> str:
    """``n`` calls taking ``ns``, a step where the window has steps."""
    if steps:
        return f"{plural(n / steps, what)} a step take {fmt_ms(ns / steps)}"
    return f"{plural(n, what)} take {fmt_ms(ns)}"


@rule(
    "inference_train_mode",
    advice={"cuda_app": None},  # torch.nn.Module's training flag
    estimate=_host_ops_estimate("what_if_eval_mode"),
    recommendation="The model runs forward only here (no backward, no optimizer step) but in "
    "training mode: model.eval() was not called. Dropout then draws a random mask at every "
    "call and drops activations, stochastic depth drops whole blocks, and batch norm "
    "normalizes with the batch's statistics and updates its running ones: the outputs are "
    "not the model's, and the masks cost kernels and launches. torch.no_grad() and "
    "torch.inference_mode() turn off gradients only, not these. Call model.eval() before "
    "inference (and model.train() before training resumes).",
    snippet=(
        "model.eval()  # dropout off, batch norm on its running statistics\n"
        "with torch.inference_mode():\n"
        "    out = model(batch)"
    ),
)
def inference_train_mode(x: RuleInput) -> Draft | None:
    h = x.r.host_ops
    if not h.forward_only or (h.train_mode_dropout_kernels == 0 and h.train_mode_norm_kernels == 0):
        return None
    steps = x.r.steps.steps or 0
    parts = []
    if h.train_mode_dropouts:
        parts.append(
            f"{_per_step(h.train_mode_dropouts, h.train_mode_dropout_ns, steps, 'dropout call')}"
            f" of host time and launch {plural(h.train_mode_dropout_kernels / max(steps, 1), 'kernel')}"
            f"{' a step' if steps else ''} drawing masks"
        )
    if h.train_mode_norm_kernels:
        n = h.train_mode_norm_kernels / max(steps, 1)
        saved = h.train_mode_norm_saved_ns / max(steps, 1)
        parts.append(
            f"batch norm computes the batch's statistics ({plural(n, 'kernel')} "
            f"{'a step ' if steps else ''}spend {fmt_ms(saved)} on the pass eval mode skips)"
        )
    cost = max(h.train_mode_dropout_ns, h.train_mode_dropout_gpu_ns + h.train_mode_norm_saved_ns)
    return Draft(
        cost,
        "Inference runs the model in training mode (model.eval() not called), so its outputs "
        "are not the model's: " + "; ".join(parts),
        {
            "dropout_calls": h.train_mode_dropouts,
            "dropout_host_time_ns": h.train_mode_dropout_ns,
            "dropout_kernels": h.train_mode_dropout_kernels,
            "dropout_gpu_time_ns": h.train_mode_dropout_gpu_ns,
            "batch_norm_training_kernels": h.train_mode_norm_kernels,
            "batch_norm_statistics_time_ns": h.train_mode_norm_saved_ns,
            # the outputs are wrong whatever the step saves: shown at least as low
            "severity_floor": "low",
            "steps": steps,
            "assumes": "in eval mode dropout returns its input: its calls' host time and "
            "kernels go; batch norm applies its running statistics: ATen's statistics kernels "
            "go and cuDNN's fused training forward takes 2/3 of its time (a read and a write "
            "of the input instead of two reads and a write); their launches and the rest of "
            "the step as recorded",
        },
    )


CAST_ONCE_ADVICE = (
    "Forward-only work under torch.autocast over fp32 weights: autocast casts each weight to "
    "16 bits inside every op that uses it, at every call (its cast cache lasts one autocast "
    "region), and casts activations between 16 and 32 bits around the ops it runs in fp32, "
    "although in inference the weights never change. Cast the model once and run without "
    "autocast: model.to(torch.bfloat16) (Hugging Face: from_pretrained(..., "
    "torch_dtype=torch.bfloat16); the Trainer's evaluation: bf16_full_eval=True with "
    "bf16=False, as bf16=True keeps autocast on and its casts around the norms). Norms and "
    "softmax then run in bf16 as well: compare the outputs with the fp32 model's once."
)
CAST_ONCE_SNIPPET = (
    "model = model.to(torch.bfloat16).eval()  # once, no autocast\n"
    "with torch.inference_mode():\n"
    "    out = model(batch.to(torch.bfloat16))"
)


@rule(
    "inference_autocast_casts",
    advice={"cuda_app": None},  # torch.autocast's casts
    estimate=_host_ops_estimate("what_if_cast_once"),
    recommendation=CAST_ONCE_ADVICE,
    snippet=CAST_ONCE_SNIPPET,
    thresholds={"inference_casts_min_ratio": 0.02},
)
def inference_autocast_casts(x: RuleInput) -> Draft | None:
    h = x.r.host_ops
    if not h.forward_only or h.inference_cast_kernels == 0:
        return None
    cost = max(h.inference_cast_ns, h.inference_cast_gpu_ns)
    share = _host_ops_share(x, cost, h.inference_cast_kernels, "inference_casts_min_ratio")
    if share is None:
        return None
    ratio, steps = share
    per = _per_step(h.inference_casts, h.inference_cast_ns, steps, "cast")
    gpu = fmt_ms(h.inference_cast_gpu_ns / steps) if steps else fmt_ms(h.inference_cast_gpu_ns)
    dtype = h.inference_cast_dtype
    advice = (
        {}
        if dtype is None
        else {
            "recommendation": CAST_ONCE_ADVICE.replace("torch.bfloat16", f"torch.{dtype}"),
            "snippet": CAST_ONCE_SNIPPET.replace("torch.bfloat16", f"torch.{dtype}"),
        }
    )
    if dtype == "float16":
        advice = {
            k: v.replace("bf16_full_eval", "fp16_full_eval")
            .replace("bf16=", "fp16=")
            .replace("in bf16", "in fp16")
            for k, v in advice.items()
        }
    return Draft(
        cost,
        f"Autocast re-casts tensors at every inference call: {per} of host time and {gpu} of "
        f"GPU time ({fmt_pct(ratio)} of the window); a model cast once to "
        f"{dtype or '16 bits'} needs none of them",
        {
            "casts": h.inference_casts,
            "cast_host_time_ns": h.inference_cast_ns,
            "cast_kernels": h.inference_cast_kernels,
            "cast_gpu_time_ns": h.inference_cast_gpu_ns,
            "cast_ratio": ratio,
            "cast_dtype": dtype,
            "steps": steps,
            "assumes": "with the model cast once, the casts autocast makes inside the ops "
            "(weights, and inputs of the ops it runs in fp32) go, their host time and "
            "kernels; the math kernels are kept as recorded (already 16-bit)",
        },
        **advice,
    )


def unprofiled_busy_ratio(r: Results) -> float | None:
    """The GPU's busy share of the un-profiled step (its busy time per step over the replay's
    step without the profiler's cost), None without a step model."""
    rp, busy = r.replay, r.memory.gpu_busy_ns_per_step
    if rp is None or not rp.unprofiled_step_ns or not busy:
        return None
    return min(1.0, busy / rp.unprofiled_step_ns)


# causes whose finding is checked after gpu_underutilized (the memory rules): their idle is
# explained all the same
LATER_CAUSES = ("allocator",)


# the share of the idle the other findings must leave unexplained for this one to be raised
UNDERUTILIZED_REST_MIN_RATIO = 0.01


@rule(
    "gpu_underutilized",
    advice={
        "cuda_app": Advice(
            "Give the GPU more work per launch (a larger problem per kernel, independent work on "
            "concurrent streams) and look at the host calls named in the idle segments: they run "
            "while the GPU waits.",
            (
                "// independent work on concurrent streams keeps the GPU fed while one stream waits\n"
                "for (int i = 0; i < nstreams; ++i) work<<<g, b, 0, streams[i]>>>(part[i]);"
            ),
        )
    },
    no_estimate="no single fix: the other findings' what_if and "
    "details.what_if.all_fixes predict what their fixes save",
    recommendation="Give the GPU more work at a time (a larger batch or sequence) and look at the host ops named "
    "in the idle segments: they run while the GPU waits.",
    snippet=(
        "# give the GPU more work per launch: larger batch / sequence, fewer small ops\n"
        "model = torch.compile(model)"
    ),
    thresholds={
        "underutilized_busy_ratio": 0.6,
        # the op named in the title covers at least this share of the CPU-work idle
        "underutilized_op_min_ratio": 0.5,
    },
)
def gpu_underutilized(x: RuleInput) -> Draft | None:
    idle = x.r.idle
    if idle.gpu_busy_ratio is None:
        return None
    on_device = _inputs_on_device(x)
    unprofiled_busy = unprofiled_busy_ratio(x.r)
    # busy enough as profiled, or as it runs where only the profiler's own host cost starved
    # the GPU (nanoGPT under CUDA graphs: 28% busy profiled, 89% of its 6.52 ms un-profiled
    # step); raised then only where the host makes the step's tensors on the CPU and making
    # them on the GPU is a lever (audit 20: a T4 loop 61.9% busy, torch.randn 9.7 ms a step)
    profiled_busy = idle.gpu_busy_ratio >= x.t["underutilized_busy_ratio"]
    busy = profiled_busy or (
        unprofiled_busy is not None and unprofiled_busy >= x.t["underutilized_busy_ratio"]
    )
    if busy and on_device is None:
        return None
    # the idle of every cause whose finding was raised (or is checked later) is explained
    raised = {f.id for f in x.found}
    explained = sum(
        x.idle(c)
        for c, fid in IDLE_CAUSES.items()
        if c in LATER_CAUSES or (fid is not None and fid != "gpu_underutilized" and fid in raised)
    )
    if "new_shape_setup" in raised:
        # the host's per-shape setup is host work the GPU waited through: explained there
        explained += min(x.idle("cpu_work"), x.r.host_ops.new_shape_excess_ns)
    # the profiler's own work is no idle of the program's (audit 8: an nsys export's 18.25 ms
    # under the profiler's overhead rows read "not explained by the other findings")
    explained += x.idle("profiler")
    if "cold_start" not in raised:
        # one-time costs below cold_start's bar are known all the same, no steady idle (audit
        # s58: an A100 vector add's 42.74 ms first launch read "not explained")
        explained += x.idle("warmup")
    if "host_sync" in raised:
        # the host's work after its syncs returned, which host_sync says but does not price
        # (no step model): unexplained, the host's time the GPU waited through (a public
        # export's 598 ms after 512 syncs returned, 97% idle, read nothing above low)
        explained -= min(x.idle("host_sync"), _sync_after_unpriced(x))
    if "launch_bound" in raised:
        # host work between two launches of a step starved the GPU as the launches did:
        # launch_bound's whole-step capture replays the step without it (audits 6, 7, 9: the
        # Python of a BERT's forward read a second HIGH finding advising a larger batch)
        # and, with Python stacks, the model's own Python before a step's first launch
        explained += min(
            x.idle("cpu_work"), idle.cpu_work_between_launches_ns + idle.cpu_work_model_lead_ns
        )
    rest = max(0, idle.idle_ns - explained)
    if rest < UNDERUTILIZED_REST_MIN_RATIO * max(1, idle.idle_ns):
        # the other findings explain the idle (audit 15: "0.00 ms of its 207.72 ms idle time
        # not explained by the other findings")
        return None
    segs = x.segments("cpu_work", 10)
    top_ops = [s.host_op for s in segs if s.host_op]
    where = _mostly(segs, x.idle("cpu_work"), x.t["underutilized_op_min_ratio"], x.framework)
    advice = None
    if x.idle("gpu_wait") >= x.t["underutilized_op_min_ratio"] * max(1, rest):
        # work was queued and waited on something the trace does not show; on one stream
        # nothing but the device's own gap between queued kernels
        one_stream = idle.max_streams_per_device == 1 and idle.stream_wait_calls == 0
        # queued long before it ran, on one stream with nothing ahead of it: not a gap between
        # queued kernels (a few us) but a wait the trace does not show (a public RTX 3090
        # inference pass: kernels launched 190-370 us before they started, read as "the
        # device's own gaps: fewer, larger kernels")
        waited = idle.gpu_wait_queued_ns >= MAJORITY * x.idle("gpu_wait")
        if one_stream and waited:
            where = (
                ", mostly with work queued on one stream that started long after it was "
                f"launched and the stream was free (waits over {fmt_ns(QUEUED_MIN_NS)}; "
                "nothing in the trace held it: a first pass's one-time device work, another "
                "process on the GPU)"
            )
            advice = UNSEEN_WAIT_ADVICE
        elif one_stream:
            where = (
                ", mostly between kernels already queued on one stream (the device's own "
                "gaps between them: fewer, larger kernels shorten them)"
            )
        else:
            where = (
                ", mostly with work queued that waited on a dependency (another stream, or an "
                "event recorded outside the trace)"
            )
            # more work per step does not shorten a wait for another stream's or process's
            # event (audit 5: an SGLang prefill's 493 ms, the GPU 99.8% busy on either side)
            advice = DEPENDENCY_WAIT_ADVICE
    if x.idle("host_untraced") >= x.t["underutilized_op_min_ratio"] * max(1, rest):
        # a kernel-only capture: when the next work was launched is not in it (audit 17: a
        # rocprofv3 kernel trace of an MI350X job told to "look at the host ops")
        where = (
            ", mostly where the capture recorded no host activity (a kernel trace: what the "
            "GPU waited for is not in it)"
        )
        advice = UNTRACED_ADVICE
    os_wait = OS_CALL_SUFFIX in where
    if os_wait:
        advice = OS_WAIT_ADVICE
    named = re.search(r"while the host ran (aten::\w+)$", where)
    made = named is not None and _made_on_host(x, named.group(1))
    if made and named is not None:
        # the host made the step's tensors on the CPU: a larger batch grows that work with
        # the GPU's (audit 18: torch.randn on the CPU, 88% of a step, then .cuda())
        advice = HOST_INPUT_ADVICE.format(op=named.group(1))
    elif busy:
        return None  # raised for the tensors made on the host, which are not what idles it
    ho = x.r.host_ops
    if not made and ho.host_stalls and ho.host_stall_idle_ns >= MAJORITY * rest:
        # the thread stalled inside usually quick ops (audit s61): not the op's own work
        where = (
            f", mostly while the thread stalled inside {_stall_words(ho)}: descheduled or blocked"
        )
        advice = HOST_STALL_WHY
    busy_words = f"GPU busy {'' if profiled_busy else 'only '}{fmt_pct(idle.gpu_busy_ratio)}"
    return Draft(
        rest,
        f"{busy_words}; {fmt_ms(rest)} of its {fmt_ms(idle.idle_ns)} idle "
        f"time not explained by the other findings{where}",
        {
            "gpu_busy_ratio": idle.gpu_busy_ratio,
            "unprofiled_gpu_busy_ratio": unprofiled_busy,
            "idle_ns": idle.idle_ns,
            "unexplained_idle_ns": rest,
            "cpu_work_idle_ns": x.idle("cpu_work"),
            "top_host_ops_during_idle": top_ops[:5],
            # the tensors made on the GPU instead: the replay prices that change
            **({"priced_by": "inputs_on_device"} if made and on_device is not None else {}),
        },
        recommendation=advice,
        # the dependency's snippet; none for the OS wait's and the unrecorded host's advice
        # (the rule's own torch.compile snippet read under "record the host side")
        snippet=DEPENDENCY_WAIT_SNIPPET
        if advice == DEPENDENCY_WAIT_ADVICE
        else ""
        if advice in (OS_WAIT_ADVICE, UNTRACED_ADVICE, UNSEEN_WAIT_ADVICE, HOST_STALL_WHY) or made
        else COMPILED_UNDERUTILIZED_SNIPPET
        if compiled_code(x.r)
        else None,
        advice={"cuda_app": Advice(advice, "")}
        if advice in (OS_WAIT_ADVICE, UNTRACED_ADVICE, UNSEEN_WAIT_ADVICE)
        else {},
        # what the queued work waited for is not in the trace: its saving rests on the idle
        # alone, and the first change is a recording (audit 22: an SGLang decode "GPU busy only
        # 2.1%" HIGH on one 463 ms wait for an event recorded outside it, 93.5% busy after),
        # where long waits hold most of it (a loop's short waits between its own streams,
        # cuDNN's LSTM on 11, are no such wait)
        # likewise where work queued on one stream waited with nothing recorded ahead of it
        **(
            {"cap": "low", "cap_reason": DEPENDENCY_WAIT_CAP_REASON}
            if advice == DEPENDENCY_WAIT_ADVICE
            and idle.gpu_wait_long_ns >= MAJORITY * x.idle("gpu_wait")
            else {"cap": "low", "cap_reason": UNSEEN_WAIT_CAP_REASON}
            if advice == UNSEEN_WAIT_ADVICE
            else {}
        ),
    )


# of the kernels, torch.compile's (Inductor's) from this share: the program is compiled, and
# advice that says torch.compile again is replaced (audit 19: a compiled nanoGPT, 288 of its
# kernels Triton-fused, told "model = torch.compile(model)")
COMPILED_KERNEL_MIN_RATIO = 0.2


def compiled_code(r: Results) -> bool:
    """Whether the trace's kernels are mostly torch.compile's own."""
    return (r.kernels.compiled_kernel_ratio or 0) >= COMPILED_KERNEL_MIN_RATIO


COMPILED_UNDERUTILIZED_SNIPPET = (
    "# already compiled: give the GPU more work per launch (a larger batch or sequence), and\n"
    "# replay the launches as CUDA graphs (fixed shapes):\n"
    'model = torch.compile(model, mode="reduce-overhead")'
)


# making the step's tensors on the GPU is a lever from this speedup (the replay's
# inputs_on_device), which raises gpu_underutilized on a GPU otherwise busy enough
INPUTS_ON_DEVICE_MIN_SPEEDUP = 1.10


def _inputs_on_device(x: RuleInput) -> WhatIf | None:
    """The replay's tensors-made-on-the-GPU what-if, where it is a lever; None elsewhere."""
    rp = x.r.replay
    w = rp.what_if.get("inputs_on_device") if rp is not None else None
    if w is None or (w.speedup or 0) < INPUTS_ON_DEVICE_MIN_SPEEDUP:
        return None
    return w


def _made_on_host(x: RuleInput, op: str) -> bool:
    """Whether ``op`` made the step's tensors on the CPU: named so (causal/columns.py
    HOST_INPUT_OPS) and, where there is a step model, found by it outside the loader, the
    optimizer and recompute (``gap_host_input_ns``), not merely an op of that name."""
    if re.match(HOST_INPUT_OPS, op) is None:
        return False
    model = x.r.replay.model if x.r.replay is not None else None
    if model is None or "gap_host_input_ns" not in model.host.columns:
        return True
    return bool(model.host.get_column("gap_host_input_ns").sum() > 0)


# The step thread made its tensors on the CPU (causal/columns.py HOST_INPUT_OPS)
HOST_INPUT_ADVICE = (
    "The host makes the step's tensors on the CPU ({op}) while the GPU waits, work that grows "
    "with the batch as the GPU's does: create them on the GPU (torch.randn(..., "
    "device='cuda')), or make them ahead in DataLoader workers (num_workers, "
    "pin_memory=True) so the step thread only receives them."
)
# The launching thread sat in the OS (nsys OSRT_API): reading input, a file, a sleep, a lock
OS_WAIT_ADVICE = (
    "The thread that launches the GPU's work was blocked in the OS call named (input, file "
    "reads, a sleep, a lock's wait): the GPU waits for it, not for more work. Read inputs and "
    "files before the GPU phase or on another thread that prefetches them (double-buffered), "
    "replace sleeps and polling with event waits, and record the phase to optimize without "
    "the program's setup and interactive pauses (nsys --capture-range=cudaProfilerApi or NVTX "
    "ranges around it)."
)
UNTRACED_ADVICE = (
    "The capture holds the GPU's work only, not the host's: record the host side too to see "
    "what the GPU waited for (rocprofv3 --runtime-trace, or --kernel-trace with --hip-trace; "
    "torch.profiler with ProfilerActivity.CPU; nsys --trace=cuda,nvtx,osrt). If the kernels "
    "are mostly collectives, their time is waiting for the slowest rank as much as moving data."
)
DEPENDENCY_WAIT_CAP_REASON = (
    "the GPU waited on work the trace does not hold (an event another stream or process "
    "records): what it waited for, and what would shorten it, is not in the trace"
)
UNSEEN_WAIT_CAP_REASON = (
    "the GPU's queued work waited with nothing recorded ahead of it: what held it, and what "
    "would shorten it, is not in the trace"
)
UNSEEN_WAIT_ADVICE = (
    "The GPU had work queued on its only stream and started it late, with nothing recorded "
    "ahead of it: record steady steps after a warm-up (a first pass loads and initializes "
    "kernels on the device), with no other process on the GPU (nvidia-smi), and see whether "
    "the waits remain."
)
DEPENDENCY_WAIT_ADVICE = (
    "The GPU had work queued that waited for a dependency: a stream wait "
    "(cudaStreamWaitEvent/hipStreamWaitEvent) on an event that another stream, thread or "
    "process records, outside this trace or late. Capture every stream and process taking part "
    "(all ranks, the scheduler's threads) to see who records it, then have it recorded as soon "
    "as its work is done, or drop the wait; a host call blocking on the same stream (a "
    "synchronous copy, .item()) waits with it. A larger batch does not shorten such a wait."
)
DEPENDENCY_WAIT_SNIPPET = (
    "# a wait holds every later launch on this stream until the event is recorded elsewhere:\n"
    "# record it right after the work it guards, on the stream that ran that work\n"
    "done = torch.cuda.Event()\n"
    "done.record(producer_stream)\n"
    "torch.cuda.current_stream().wait_event(done)"
)


def diagnose(
    results: Results, t: Thresholds, framework: Framework = FRAMEWORKS[0]
) -> list[Finding]:
    """Every rule that applies to ``framework`` on one trace's results, each with that
    framework's advice, ranked: ``[0]`` is the biggest lever."""
    window = results.idle.device_window_ns
    found: list[Finding] = []
    for r in RULES:
        if not r.applies(framework):
            continue
        draft = r.check(RuleInput(results, t, window, found, framework))
        if draft is not None:
            found.append(make_finding(r, draft, window, t, framework))
    return ranked(found)


# The host time outside every recorded op, by framework: what runs there and what names it.
OUTSIDE_OPS: Mapping[str, str] = {
    # a PyTorch job recorded by nsys too (audit 8: torch.profiler's advice on an nsys export)
    # (no parentheses: the words go inside the title's own; audit 17)
    "pytorch": "Python between ops, whose lines Python stacks name: torch.profiler's "
    "with_stack=True, nsys profile --python-backtrace=cuda --python-sampling=true",
    "cuda_app": "host code between CUDA calls: nsys profile --sample=cpu names the functions",
}


def _mostly(
    segs: Sequence[IdleSegment], cpu_work_ns: int, min_ratio: float, framework: Framework
) -> str:
    """Where the CPU-work idle went, in words: the host op under most of it, or outside any
    recorded op (Python between ops), where either holds ``min_ratio`` of it."""
    if cpu_work_ns <= 0 or not segs:
        return ""

    def top(name: Callable[[str | None], str | None]) -> tuple[str | None, int]:
        by_op: dict[str | None, int] = {}
        for s in segs:
            by_op[name(s.host_op)] = by_op.get(name(s.host_op), 0) + s.dur_ns
        return max(by_op.items(), key=lambda kv: kv[1])

    op, ns = top(lambda o: o)
    if ns < min_ratio * cpu_work_ns:
        # the user's frame alone, where the library calls under it differ gap by gap
        op, ns = top(lambda o: o.split(CALLEE_SEP)[0] if o else o)
    if ns < min_ratio * cpu_work_ns:
        return ""
    if op is None:
        return f", mostly outside any recorded op ({OUTSIDE_OPS[framework]})"
    if op.endswith(OS_CALL_SUFFIX):
        # the launching thread sat in the OS: input, a file read, a sleep, a lock
        return f", mostly while the host was blocked in {op.removesuffix(OS_CALL_SUFFIX)}{OS_CALL_SUFFIX}"
    return f", mostly while the host ran {op}"
