"""A finding's evidence as a reader sees it: facts in words and small tables, never raw JSON.

The JSON document keeps the evidence as the rules wrote it (docs/SCHEMA.md); here each value is
read by its key's unit suffix (docs/ARCHITECTURE.md, "Names"), lists of records become tables,
nested records small label/value tables, and None or empty values are left out. Internal names
(transforms, document paths) are said in words. The HTML and Markdown reporters both use it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from traceinsight.report.format import (
    SOURCE_NOUNS,
    fmt_bytes,
    fmt_ns,
    fmt_pct,
    fmt_source,
)

MAX_ROWS = 8  # rows of an evidence table; the rest are counted under it
MAX_ITEMS = 8  # items of a list said in a sentence
NAME_CHARS = 72  # a kernel or op name in a table cell; the full name is its tooltip

# The fixes the causal model replays (causal/transforms.py TRANSFORMS and the built ones), in
# words: a reader never sees the function names (tests/test_html_render.py checks every one).
TRANSFORM_WORDS = {
    "remove_syncs": "the host syncs removed",
    "remove_syncs_at": "these call sites' syncs removed",
    "host_spans_removed": "the checks' host work removed",
    "async_input_copies": "input copies made asynchronous",
    "pinned_copies": "copies from pinned memory",
    "cuda_graphs": "CUDA graphs",
    "cuda_graphs_whole_step": "CUDA graphs over the whole step",
    "fused_optimizer": "a fused optimizer",
    "grads_set_to_none": "gradients set to None, not zeroed",
    "inputs_on_device": "the step's tensors made on the GPU",
    "dataloader_floor": "data loading hidden behind compute",
    "dataloader_unpinned": "data loading in workers, batches received in the step thread",
    "recompute_removed": "no activation recompute",
    "bf16_gemms": "16-bit math (bf16, or fp16 where the GPU lacks it) instead of fp32",
    "channels_last_layers": "the model and its inputs in channels_last",
    "no_empty_cache": "no empty_cache or allocator churn",
    "comm_overlapped": "communication overlapped with compute",
    "h2d_overlapped": "host-to-device copies overlapped with compute",
    "elementwise_fused": "elementwise kernels fused",
    "engine_faster_host": "the host twice as fast",
    "engine_faster_kernels": "the kernels twice as fast",
    "engine_faster_copies": "the copies twice as fast",
    "gpu_work_scaled": "a larger batch",
    "scaled_kernels": "the kernels sped up",
}
# document paths and field names that rules' sentences may cite, in words
_DOC_WORDS = {
    "details.what_if.all_fixes": "all fixes together",
    "what_if": "prediction",
}
_INTERNAL = re.compile(
    r"\b("
    + "|".join(re.escape(k) for k in sorted({**TRANSFORM_WORDS, **_DOC_WORDS}, key=len)[::-1])
    + r")\b"
)

# Keys another part of the finding's card already says (the chain, the call sites, why there
# is no prediction, the fix's name, the downgrade) or that only a program reads.
SHOWN_ELSEWHERE = frozenset(
    {"causal_chain", "sources", "why_no_estimate", "unpriced_because", "transform", "data_quality"}
)
# columns of evidence records that are absolute clock values or internal indices
_SKIP_COLUMNS = frozenset({"start_ns", "end_ns", "k"})
# columns holding a name (kernel, op, host op): shortened, the full name in the tooltip
NAME_COLUMNS = frozenset({"name", "op", "host_op", "kernel", "call", "path"})

LABELS = {
    "idle_ns": "GPU idle",
    # the rule's own rough share, not the saving: the replay's what-if prices the fix (audit 17:
    # "6.77 ms" beside "saves 8.49 ms", the fused kernels' launches gone as well)
    "attributed_ns": "time the rule attributes to the cause (a rough share, not a saving)",
    "dataloader_ns": "waiting for data",
    "dataloader_ratio": "data loading share of step time",
    "per_step_dataloader_ns": "waiting for data, per step",
    "top_segments": "longest idle gaps",
    "loader_plan": "data loader arithmetic",
    "iterator": "loader",
    "batch_interval_ns": "time between batches",
    "compute_step_ns": "step without data loading",
    "batch_tensors": "tensors a batch carries",
    "receive_ns": "receiving a batch from workers in the step thread (pin_memory=False)",
    "loader_bound_ns": "the DataLoader workers' interval bounds the step (the saving moves into the wait for the next batch)",
    "what_if_unpinned": "workers without pin_memory: the step thread receives each batch",
    "what_if_hidden": "the loading hidden entirely, the upper bound (enough workers on free "
    "cores, or the per-sample work moved out of __getitem__ and the collate)",
    "loading_per_batch_ns": "loading per batch",
    "workers_needed": "workers needed",
    "workers_factor": "workers factor",
    "assumed_speedup": "speedup at the assumed loader",
    "upper_bound_speedup": "speedup with loading fully hidden",
    "kernels_per_step": "kernels per step",
    "launch_calls_per_step": "launch calls per step",
    "launch_call_median_ns": "launch call, median",
    "kernel_median_ns": "kernel, median",
    "short_kernel_ratio": "kernels shorter than their launch",
    "queue_depth_median": "kernels queued ahead, median",
    "what_if_whole_step": "the whole step in one CUDA graph, with its optimizer step where it has one",
    "shape_change": "input shapes that change between steps",
    "path_change": "ops whose count changes between steps",
    "severity_cap": "graded at most",
    "severity_cap_reason": "why it is graded no higher",
    "priced_by": "the replay's transform the saving rests on, where the advice names it instead of the rule's own",
    "rnn_op": "the recurrent module op the steps run (torch.compile leaves it eager)",
    "severity_floor": "graded at least (a check worth making first)",
    "loader_headroom_needed": "times the rate the DataLoader workers were shown to keep up with that the prediction needs (graded low at most: the un-profiled step alone needs over 2)",
    "loader_shown_interval_ns": "the step the DataLoader workers were shown to keep up with (the profiled step; their own rate is not in the trace)",
    "loader_unverified_speedup": "the most the workers could bound the un-profiled step by (the interval they kept up with over it)",
    "contended_in_loader_ns": "loading in contended CPU copies",
    "what_if_upper": "at the upper end of what the trace allows",
    "what_if_lower_bound": "the prediction is a lower bound",
    "what_if_unsettled": "the step it starts from did not settle in the replay",
    "graded_on_range": "severity from what both ends of the un-profiled range assure",
    "gpu_timeline_saving_ratio": "of a GPU-time saving, the share the window's GPU timeline keeps (no step model)",
    "graded_on_gpu_timeline": "severity from what the window's GPU timeline keeps of the saving",
    "gpu_busy_ratio": "GPU busy",
    "unexplained_idle_ns": "idle with no named cause",
    "cpu_work_idle_ns": "idle while the host computed",
    "top_host_ops_during_idle": "host ops during idle gaps",
    "h2d_bytes": "host-to-device bytes",
    "h2d_pageable_bytes": "from pageable memory",
    "h2d_pageable_bytes_ratio": "share from pageable memory",
    "host_blocking_copy_ns": "host time in the copy calls (waits for earlier GPU work included)",
    "host_blocking_copy_own_ns": "of that, beyond waiting for earlier GPU work (staging and transfer)",
    "host_blocking_copy_count": "blocking copies",
    "top_blocked_ns": "blocked in the 10 longest calls",
    "own_ns_by_kind": "beyond waiting for earlier GPU work, by direction",
    "top_copies": "copies that blocked the host longest",
    "blocked_ns_by_kind": "host blocked, by copy direction",
    "copy_kind": "direction",
    "api": "API call",
    "bytes": "size",
    "copy_ns": "copy",
    "blocked_ns": "host blocked",
    "offset_ns": "at (into the window)",
    "dur_ns": "duration",
    "host_op": "host op during the gap",
    "elementwise_kernel_time_ratio": "elementwise share of kernel time",
    "elementwise_kernel_count_ratio": "elementwise share of kernels",
    "elementwise_eager_count": "eager elementwise kernels",
    "elementwise_triton_count": "Triton-fused kernels",
    "elementwise_ns": "elementwise kernel time",
    "host_sync_count": "host syncs",
    "syncs_per_step": "syncs per step",
    "host_sync_blocked_ns": "host blocked in syncs",
    "by_op": "syncs by op",
    "profiler_syncs_excluded": "profiler syncs left out",
    "input_copy_sync_count": "syncs after an input copy",
    "wait_moves_to": "where the wait moves once the sync is gone",
    "added_ns_per_step": "added per step",
    "after_input_copy": "after an input copy",
    "comm_ns": "communication time",
    "exposed_comm_ns": "exposed communication",
    "comm_compute_overlap_ratio": "share overlapping compute",
    "exposed_comm_ratio": "exposed share of the window",
    "per_device": "per GPU",
    "overlapped_ns": "overlapped",
    "exposed_ns": "exposed",
    "overlap_ratio": "overlap",
    "top_collectives": "collective kernels",
    "total_ns": "total",
    "by_kind": "by collective kind",
    "most_exposed_kind": "most exposed kind",
    "comm_time_ratio": "communication share of the window",
    "backward_comm_ratio": "share launched in backward",
    "comm_wait_ns": "waiting for peers (charged to the straggler)",
    "sized_comm_ns": "collectives whose message the trace records (their kernels' time)",
    "transfer_bound_ns": "the most moving their messages takes (bus bytes at 12.5 GB/s, plus latency)",
    "peer_wait_ns": "their time beyond that: this rank waiting for the others, at least",
    "peer_wait_ratio": "share of the recorded collectives' time spent waiting for other ranks",
    "host_ns_per_kernel": "optimizer host time per kernel",
    "saving_shared_with": "the finding whose fix also removes these (pin_memory=True makes the copies async; a fused causal attention builds no mask): the two savings are not additive",
    "exposed_wait_ns": "waiting for peers, not hidden",
    "worst_rank": "worst rank",
    "ranks": "ranks with it",
    "cost_by_rank_ns": "cost by rank",
    "worst_rank_severity": "severity on the worst rank",
    "rank": "rank",
    "steps": "steps",
    "wait_caused_ns": "waiting caused on the others",
    "charged_by_rank_ns": "waiting charged, by waiting rank",
    "wait_by_kind_ns": "waiting by rank and collective kind",
    "clock_offset_by_rank_ns": "clock offset from the collectives' ends, by rank",
    "wait_by_rank_ns": "waiting for peers, by rank",
    "exposed_wait_by_rank_ns": "waiting not hidden, by rank",
    "caused_ratio": "share of the waiting it caused",
    "last_ratio": "collectives it arrived last at",
    "matched_collectives": "collectives matched",
    "worst_collectives": "longest waits",
    "last_rank": "last rank",
    "wait_ns": "waiting",
    "job_step_ns": "job step time",
    "step_time_median_ns": "median step",
    "step": "step",
    "kind": "kind",
    "count": "count",
    "device": "GPU",
    "cause": "cause",
    "name": "name",
    "op": "op",
    "fp32_gemm_time_ratio": "fp32 share of math time",
    "fp32_math_ns": "fp32 math time",
    "math_ns": "GEMM/conv/attention time",
    "top_fp32_kernels": "fp32 kernels",
    "low_occupancy_time_ratio": "share of kernel time at low occupancy",
    "low_occupancy_ns": "low-occupancy kernel time",
    "occupancy_median": "occupancy, median",
    "occupancy": "occupancy",
    "kernels": "kernels",
    "optimizer": "optimizer",
    "mode": "mode",
    "gpu_ns_per_step": "GPU time per step",
    "host_ns_per_step": "host time per step",
    "kernel_class": "class",
    "time_ns": "time",
    "limiter": "limited by",
    "step_time_ns": "un-profiled step",
    "step_time_after_ns": "after the fix",
    "speedup": "speedup",
    "window_ns": "analysis window",
    "gpu_idle_ratio": "GPU idle",
    "kernel_busy_ratio": "kernels running",
    "copy_busy_ratio": "copies running",
    "step_time_cv": "step time CV",
    "replay_error_ratio": "replay error",
    "h2d_overlap_ratio": "host-to-device copy time overlapping compute",
    "memory_bound_bandwidth_ratio": "memory-bound kernels' bandwidth (of the peak)",
    "gemm_tflops": "GEMM/attention TFLOP/s",
    "flops_per_step": "FLOPs per step",
}
_WORDS = {
    "h2d": "host-to-device",
    "d2h": "device-to-host",
    "gpu": "GPU",
    "cpu": "CPU",
    "dataloader": "data loader",
    "comm": "communication",
    "fp32": "fp32",
    "bf16": "bf16",
    "mfu": "MFU",
    "hfu": "HFU",
    "cv": "CV",
    "flops": "FLOPs",
    "gemm": "GEMM",
    "tflops": "TFLOP/s",
    "ns": "",
    "ratio": "share",
}


def plain(text: str) -> str:
    """A rule's sentence with internal names (transforms, document paths) said in words."""
    return _INTERNAL.sub(lambda m: TRANSFORM_WORDS.get(m[1]) or _DOC_WORDS[m[1]], text)


def transform_words(name: str | None) -> str:
    """A transform (or ``a+b`` combined) in words; an unknown one with its underscores gone."""
    if not name:
        return ""
    return " + ".join(TRANSFORM_WORDS.get(p, p.replace("_", " ")) for p in name.split("+"))


def label(key: str) -> str:
    """A key's human label: the table above, else its words without the unit suffix."""
    if key in LABELS:
        return LABELS[key]
    words = [_WORDS.get(w, w) for w in str(key).split("_")]
    return " ".join(w for w in words if w) or str(key)


def _number(v: float) -> str:
    if isinstance(v, int):
        return f"{v:,}"
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"


def value_text(key: str, v: Any) -> str | None:
    """A scalar (or a list of scalars) by its key's unit; None where there is nothing to say."""
    if v is None or v == "" or (isinstance(v, (list, tuple, dict)) and not v):
        return None
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, (int, float)):
        if key.endswith("_ns") or "_ns_" in key or key.endswith("_ns_per_step"):
            return fmt_ns(v)
        if key.endswith("_ratio") or key in ("occupancy", "occupancy_median"):
            return fmt_pct(v)
        if key.endswith("_bytes") or key == "bytes" or "_bytes_" in key:
            return fmt_bytes(int(v))
        if key == "speedup" or key.endswith("_speedup"):
            return f"{v:.2f}×"
        return _number(v)
    if isinstance(v, str):
        return plain(v)
    if isinstance(v, (list, tuple)) and all(not isinstance(x, (dict, list)) for x in v):
        return _list_text(key, list(v))
    return None


def _list_text(key: str, items: list[Any]) -> str:
    """A list of scalars in a sentence: repeated strings counted, the rest after MAX_ITEMS
    counted too."""
    if all(isinstance(x, str) for x in items):
        counts: dict[str, int] = {}
        for x in items:
            counts[x] = counts.get(x, 0) + 1
        parts = [plain(x) + (f" ({n}×)" if n > 1 else "") for x, n in counts.items()]
    else:
        parts = [value_text(key, x) or "" for x in items]
    shown = parts[:MAX_ITEMS]
    more = len(parts) - len(shown)
    return ", ".join(shown) + (f" and {more} more" if more > 0 else "")


def what_if_text(w: dict[str, Any]) -> str:
    """A prediction record in words: the un-profiled step before and after, the speedup."""
    text = f"un-profiled step {fmt_ns(w['step_time_ns'])} → {fmt_ns(w['step_time_after_ns'])}"
    if w.get("speedup"):
        text += f", {w['speedup']:.2f}× predicted"
    return text


def _is_what_if(v: Any) -> bool:
    return isinstance(v, dict) and "step_time_ns" in v and "step_time_after_ns" in v


@dataclass(frozen=True)
class Cell:
    text: str
    title: str = ""  # the full text where the cell shows a shortened one
    name: bool = False  # a kernel/op name: monospace, may wrap anywhere


@dataclass(frozen=True)
class Table:
    caption: str
    columns: tuple[str, ...]
    numeric: tuple[bool, ...]  # right-aligned columns
    rows: tuple[tuple[Cell, ...], ...]
    more: int = 0  # rows left out


@dataclass(frozen=True)
class Evidence:
    facts: tuple[tuple[str, str], ...]  # label, value: one line each
    tables: tuple[Table, ...]

    def __bool__(self) -> bool:
        return bool(self.facts or self.tables)


def _cell(key: str, v: Any, unit_key: str | None = None) -> Cell:
    if _is_what_if(v):
        return Cell(what_if_text(v))
    text = value_text(unit_key or key, v)
    if text is None:
        if isinstance(v, dict):  # a record inside a record: its fields in one line
            parts = [(label(k), value_text(k, x)) for k, x in v.items()]
            text = "; ".join(f"{lab} {t}" for lab, t in parts if t is not None)
        else:
            text = ""
    if key in NAME_COLUMNS and len(text) > NAME_CHARS:
        return Cell(text[: NAME_CHARS - 1] + "…", title=text, name=True)
    return Cell(text, name=key in NAME_COLUMNS)


# columns whose meaning a table's key changes (audit 19: a larger batch's gains read "un-profiled
# step | after the fix", the second the larger batch's own step)
COLUMN_LABELS_BY_KEY = {
    "gain_by_multiplier": {
        "step_time_ns": "un-profiled step now",
        "step_time_after_ns": "step at that batch",
        "throughput_gain": "throughput gain per sample",
    }
}


def _records_table(key: str, rows: list[dict[str, Any]]) -> Table | None:
    """A list of records: one row each, the columns every record has a value in at least once."""
    cols: list[str] = []
    for r in rows:
        cols += [k for k in r if k not in cols and k not in _SKIP_COLUMNS]
    cols = [c for c in cols if any(value_text(c, r.get(c)) is not None for r in rows)]
    if not cols:
        return None
    shown = rows[:MAX_ROWS]
    numeric = tuple(
        all(isinstance(r.get(c), (int, float)) and not isinstance(r.get(c), bool) for r in shown)
        for c in cols
    )
    body = tuple(tuple(_cell(c, r.get(c)) for c in cols) for r in shown)
    named = COLUMN_LABELS_BY_KEY.get(key, {})
    heads = tuple(named.get(c) or label(c) for c in cols)
    return Table(label(key), heads, numeric, body, len(rows) - len(shown))


def _key_label(parent: str, k: str, by_rank: bool = False) -> str:
    """A mapping's key: ranks (in a job's finding) or GPUs by number, else the key's words."""
    if str(k).isdigit():
        if "rank" in parent or by_rank:
            return f"rank {k}"
        if "device" in parent:
            return f"GPU {k}"
    return label(k)


def _mapping_table(key: str, m: dict[str, Any], by_rank: bool = False) -> Table | None:
    """A mapping: label/value rows for scalars (a record, or values by rank or kind); a mapping
    of mappings one row per key, a column per inner key."""
    items = [(k, v) for k, v in m.items() if v is not None]
    if not items:
        return None
    if all(isinstance(v, dict) and not _is_what_if(v) for _, v in items):
        inner: list[str] = []
        for _, v in items:
            inner += [k for k in v if k not in inner]
        # inner keys without a unit of their own take the outer key's (wait_by_kind_ns)
        cols = tuple(label(c) for c in inner)
        numeric = tuple(True for _ in inner)
        rows = tuple(
            (
                Cell(_key_label(key, k, by_rank)),
                *(_cell(c, v.get(c), None if _has_unit(c) else key) for c in inner),
            )
            for k, v in items[:MAX_ROWS]
        )
        # "rank" over rank numbers only (audit 19: over a job's "all to all" row)
        ranks = all(str(k).lstrip("-").isdigit() for k, _ in items)
        first = "rank" if ("rank" in key or by_rank) and ranks else ""
        return Table(
            label(key), (first, *cols), (False, *numeric), rows, max(0, len(items) - MAX_ROWS)
        )
    rows = tuple(
        (Cell(_key_label(key, k, by_rank)), _cell(k if _has_unit(k) else key, v))
        for k, v in items[:MAX_ROWS]
        if not (isinstance(v, (list, tuple, dict)) and not v)
    )
    return Table(label(key), ("", ""), (False, True), rows, max(0, len(items) - MAX_ROWS))


def _has_unit(k: str) -> bool:
    return str(k).endswith(("_ns", "_ratio", "_bytes", "_count", "_per_step", "speedup"))


def finding_evidence(f: dict[str, Any]) -> Evidence:
    """The evidence of a finding for a reader: scalars as label/value facts, lists of records
    and mappings as small tables, what SHOWN_ELSEWHERE lists left to the card."""
    facts: list[tuple[str, str]] = []
    tables: list[Table] = []
    evidence = f.get("evidence") or {}
    # a job's finding: mappings keyed by number are by rank
    by_rank = "ranks" in evidence or "rank" in evidence
    for key, v in evidence.items():
        if key in SHOWN_ELSEWHERE:
            continue
        if _is_what_if(v):
            facts.append((label(key), what_if_text(v)))
        elif isinstance(v, dict):
            if (t := _mapping_table(key, v, by_rank)) is not None and t.rows:
                tables.append(t)
        elif isinstance(v, (list, tuple)) and v and all(isinstance(x, dict) for x in v):
            if (t := _records_table(key, list(v))) is not None:
                tables.append(t)
        elif (text := value_text(key, v)) is not None:
            facts.append((label(key), text))
    return Evidence(tuple(facts), tuple(tables))


def source_lines(f: dict[str, Any], limit: int = 5) -> list[str]:
    """The finding's call sites in words: ``4 syncs in step() (train.py:259) via .item(),
    1.20 ms``; a file without a line or a native module without a file say only what they have."""
    noun = SOURCE_NOUNS.get(f["id"], ("call", "calls"))
    return [fmt_source(s, noun) for s in ((f.get("evidence") or {}).get("sources") or [])[:limit]]


def no_prediction(f: dict[str, Any]) -> str | None:
    """Why a finding has no predicted saving, as a sentence; None where it has one, and where
    the rule said nothing (the line is then left out rather than ending in a colon)."""
    if f.get("what_if"):
        return None
    why = ((f.get("evidence") or {}).get("why_no_estimate") or "").strip().rstrip(".")
    if not why:
        return None
    return f"No predicted saving: {plain(why)}."


def facts_line(ev: Evidence, limit: int = 6) -> str:
    """The first few facts in one line (Markdown)."""
    return "; ".join(f"{k}: {v}" for k, v in ev.facts[:limit])
