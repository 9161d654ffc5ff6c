"""Before/after comparison of two analyses (traces or jobs).

Metrics side by side, step time, idle time by cause, kernels that appeared, disappeared or changed
most (matched by name and class, normalized per step so captures of different lengths compare),
and findings resolved or introduced; for jobs, the same per matched rank.

A diff is only as good as its two sides are comparable: ``environment`` records the GPU, device
count, world size, CUDA versions and trace format of each and ``warnings`` names what differs.
The change of the median step comes with a bootstrap interval (``noise``); captures without step
markers get iterations from the period of their repeating kernel sequence, and where there is
none, work-normalized throughput per kernel class (``throughput``). ``gate`` is what
``--fail-if-slower`` reads.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from traceinsight.analysis import (
    KERNEL_TABLE_SCHEMA,
    SCHEMA,
    JobAnalysis,
    TraceAnalysis,
    quality_errors,
    tool_json,
)
from traceinsight.api import analyze_with
from traceinsight.constants import MEMORY_DEVICE_METRICS, MEMORY_STEP_METRICS
from traceinsight.options import Options
from traceinsight.records import OMIT_NONE, jsonable
from traceinsight.runtime import Runtime

TOP_KERNEL_CHANGES = 15
Analysis = TraceAnalysis | JobAnalysis

# What must match for a diff to say something about the code rather than the machine:
# (environment key, warning wording). The first three are hardware (--allow-different-hardware).
COMPARED = (
    ("gpu", "different GPUs"),
    ("device_count", "different device counts"),
    ("world_size", "different world sizes"),
    ("torch_version", "different torch versions"),
    ("cuda_runtime_version", "different CUDA runtimes"),
    ("cuda_driver_version", "different CUDA drivers"),
    ("hip_runtime_version", "different HIP runtimes"),
    ("format", "different trace formats"),
    ("format_version", "different trace format versions"),
)
HARDWARE = ("gpu", "device_count", "world_size")
VERSION_KEYS = (
    "torch_version",
    "cuda_runtime_version",
    "cuda_driver_version",
    "hip_runtime_version",
)

# Noise model: a percentile bootstrap over steps, fixed seed so a diff is reproducible.
BOOTSTRAP_RESAMPLES = 1000
CONFIDENCE = 0.95
BOOTSTRAP_SEED = 0
MIN_STEPS_FOR_NOISE = 3

# Iteration finder: a candidate period (in kernels) counts when this share of kernels equals the
# kernel one period later (0.7: a warm-up iteration with extra kernels shifts the rest), over at least this many repeats; candidates come from the spacing of
# the rarest repeating kernel names (an optimizer or loss kernel runs once per iteration).
PERIOD_MATCH_RATIO = 0.7
PERIOD_MIN_REPEATS = 3
PERIOD_CANDIDATE_NAMES = 20
ANCHOR_REGULAR_RATIO = 0.8
# two periods are the same work within this share of kernels (a cuDNN algorithm choice may differ)
PERIOD_SAME_WORK_RATIO = 0.02
# NVTX / user ranges whose name says they are one iteration (tried before the kernel period)
NVTX_ITERATION_PATTERN = (
    r"(?i)(^|[^a-z])(train_?|training_?)?(step|iter|iteration|batch|microbatch)([^a-z]|$)"
)


def _versions(a: TraceAnalysis) -> dict[str, Any]:
    # source.versions: what the trace records (Kineto's top level; it carries no torch version)
    recorded = a.source.get("versions") or {}
    return {k: recorded.get(k) for k in VERSION_KEYS}


def environment(a: Analysis) -> dict[str, Any]:
    """What each side ran on: GPU model(s), device count, world size, versions, trace format."""
    src = a.source
    names = sorted({d["name"] for d in src["devices"] if d.get("name")})
    first = a.ranks[0] if isinstance(a, JobAnalysis) and a.ranks else a
    versions = _versions(first) if isinstance(first, TraceAnalysis) else dict.fromkeys(VERSION_KEYS)
    return {
        "gpu": ", ".join(names) or None,
        "device_count": len(src["devices"]) or None,
        "world_size": src.get("world_size") or len(src.get("ranks") or []) or None,
        **versions,
        "format": src.get("format"),
        "format_version": src.get("format_version"),
    }


def environment_warnings(eb: dict[str, Any], ea: dict[str, Any]) -> tuple[list[str], bool]:
    """One warning per compared fact known on both sides that differs; whether hardware differs."""
    warnings, hardware = [], False
    for key, words in COMPARED:
        b, a = eb.get(key), ea.get(key)
        if b is not None and a is not None and b != a:
            warnings.append(f"{words}: {b} vs {a}")
            hardware = hardware or key in HARDWARE
    return warnings, hardware


def _medians(values: Sequence[float], rng: random.Random) -> pl.Series:
    """The median of each of BOOTSTRAP_RESAMPLES resamples (with replacement) of ``values``."""
    n = len(values)
    idx = rng.choices(range(n), k=n * BOOTSTRAP_RESAMPLES)
    return (
        pl.DataFrame(
            {
                "r": pl.int_range(0, n * BOOTSTRAP_RESAMPLES, eager=True) // n,
                "v": pl.Series(values, dtype=pl.Float64).gather(idx),
            }
        )
        .group_by("r")
        .agg(pl.col("v").median())
        .sort("r")
        .get_column("v")
    )


def change_interval(before: Sequence[float], after: Sequence[float]) -> tuple[float, float] | None:
    """Percentile-bootstrap interval (CONFIDENCE) of median(after) / median(before) - 1, or None
    with fewer than MIN_STEPS_FOR_NOISE steps on a side."""
    if min(len(before), len(after)) < MIN_STEPS_FOR_NOISE:
        return None
    rng = random.Random(BOOTSTRAP_SEED)
    mb, ma = _medians(before, rng), _medians(after, rng)
    ch = (ma / mb - 1).filter(mb > 0)
    tail = (1 - CONFIDENCE) / 2
    lo, hi = ch.quantile(tail, "linear"), ch.quantile(1 - tail, "linear")
    return (float(lo), float(hi)) if lo is not None and hi is not None else None


@dataclass(frozen=True)
class Iterations:
    """Iterations of a capture without step markers, from NVTX ranges or the kernel period."""

    method: str  # "nvtx" | "kernel_period"
    range_name: str | None = field(default=None, metadata=OMIT_NONE)  # nvtx: the range's name
    period_kernels: int | None = None  # kernel_period: kernels per iteration
    match_ratio: float | None = None  # kernel_period: shifted equality at that period
    iterations: int = 0
    per_iteration_ns: tuple[int, ...] = ()
    median_ns: float = 0.0

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Iterations:
        return cls(**{**d, "per_iteration_ns": tuple(d["per_iteration_ns"])})


@dataclass(frozen=True)
class TimingSample:
    """What a diff reads of one side beyond its document (:func:`timing_sample`)."""

    step_times_ns: tuple[float, ...]
    iterations: Iterations | None

    def to_json(self) -> dict[str, Any]:
        return jsonable(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> TimingSample:
        it = d.get("iterations")
        return cls(tuple(d.get("step_times_ns") or ()), Iterations.from_json(it) if it else None)


def nvtx_iterations(events: pl.DataFrame) -> Iterations | None:
    """Iterations from NVTX / user ranges named like one (``train_step``, ``iteration 3``,
    ``Optimizer.step#SGD.step``): the name with the most total time among those with more than
    PERIOD_MIN_REPEATS ranges on one thread that never overlap. An iteration is the time from one
    range's start to the next one's (a range covering only part of the iteration, like the
    optimizer step, still marks each one); the first is dropped as warm-up where more than
    PERIOD_MIN_REPEATS remain."""
    r = events.filter(
        pl.col("kind").is_in(["user_annotation", "gpu_annotation"])
        & pl.col("name").str.contains(NVTX_ITERATION_PATTERN)
    )
    if r.height < PERIOD_MIN_REPEATS:
        return None
    # numbered ranges ("step 12", "iteration#3") are one name without their number
    r = r.with_columns(pl.col("name").str.replace_all(r"[\s#_:-]*\d+$", "").alias("base"))
    per_name = (
        r.filter(pl.col("kind") == "user_annotation")
        .sort("start_ns")
        .group_by("base", "tid")
        .agg(
            pl.len().alias("count"),
            pl.col("dur_ns").sum().alias("total_ns"),
            pl.col("start_ns").diff().drop_nulls().alias("spacing_ns"),
            # ranges that never overlap: each starts at or after the previous one's end
            (pl.col("start_ns").slice(1) >= pl.col("end_ns").slice(0, pl.len() - 1))
            .all()
            .alias("disjoint"),
        )
        .filter((pl.col("count") > PERIOD_MIN_REPEATS) & pl.col("disjoint"))
        .sort(["total_ns", "base"], descending=[True, False])
    )
    if per_name.height == 0:
        return None
    best = per_name.row(0, named=True)
    per = pl.Series(best["spacing_ns"], dtype=pl.Int64)
    if per.len() > PERIOD_MIN_REPEATS:
        per = per.slice(1)
    return Iterations(
        method="nvtx",
        range_name=best["base"],
        iterations=per.len(),
        per_iteration_ns=tuple(per.to_list()),
        median_ns=float(per.median()),
    )


def kernel_iterations(events: pl.DataFrame) -> Iterations | None:
    """Iterations of a capture without step markers: the period (in kernels) of its repeating
    kernel sequence on its busiest device, and the time of each full period. None when no
    candidate period repeats PERIOD_MIN_REPEATS times with PERIOD_MATCH_RATIO shifted equality."""
    k = events.filter(pl.col("kind") == "kernel")
    if k.height < 2 * PERIOD_MIN_REPEATS:
        return None
    busiest = k.group_by("device").len().sort(["len", "device"], descending=[True, False])
    k = (
        k.filter(pl.col("device").eq_missing(busiest["device"][0]))
        .sort("start_ns", maintain_order=True)
        .select(pl.col("name").rank("dense").alias("id"), "start_ns")
        .with_row_index("pos")
    )
    n = k.height
    # spacing of each name's occurrences; the rarest repeating names space out whole iterations
    gaps = (
        k.with_columns((pl.col("pos") - pl.col("pos").shift(1).over("id")).alias("gap"))
        .group_by("id")
        .agg(
            pl.len().alias("count"),
            pl.col("gap").median().alias("gap"),
            # share of gaps within 5% of the median: an anchor must mark every iteration
            ((pl.col("gap") - pl.col("gap").median()).abs() <= 0.05 * pl.col("gap").median())
            .filter(pl.col("gap").is_not_null())
            .mean()
            .alias("regular_ratio"),
        )
        .filter(pl.col("count") >= PERIOD_MIN_REPEATS)
        .sort(["count", "id"])
        .head(PERIOD_CANDIDATE_NAMES)
    )
    gaps = gaps.filter(
        pl.col("gap").is_not_null()
        & (pl.col("gap") >= 1)
        & (n // pl.col("gap") >= PERIOD_MIN_REPEATS)
        & (pl.col("regular_ratio") >= ANCHOR_REGULAR_RATIO)
    ).sort(["gap", "regular_ratio", "id"], descending=[True, True, False])
    ids = k["id"]
    ratios: dict[int, float] = {}
    for anchor, gap in gaps.select("id", "gap").iter_rows():
        # at most PERIOD_CANDIDATE_NAMES candidates, one vectorized pass each; longest first, so a
        # step made of repeated layers is found as the step, not the layer
        p = int(gap)
        if p not in ratios:
            ratios[p] = float((ids.head(n - p) == ids.slice(p)).mean())
        if ratios[p] >= PERIOD_MATCH_RATIO:
            # iterations start at the anchor's occurrences: robust to a warm-up iteration that
            # launched extra kernels, which would shift fixed-size slices
            starts = k.filter(pl.col("id") == anchor)["start_ns"]
            per = starts.diff().drop_nulls()
            if per.len() > PERIOD_MIN_REPEATS:
                per = per.slice(
                    1
                )  # the first holds the warm-up (cuDNN autotuning, allocator growth)
            return Iterations(
                method="kernel_period",
                period_kernels=p,
                match_ratio=ratios[p],
                iterations=per.len(),
                per_iteration_ns=tuple(per.to_list()),
                median_ns=float(per.median()),
            )
    return None


def kernels_per_step(a: Analysis) -> pl.DataFrame:
    """A trace's kernels per step; a job's top level has none (its ranks are diffed one by one)."""
    return (
        a.kernel_table()
        if isinstance(a, TraceAnalysis)
        else pl.DataFrame(schema=KERNEL_TABLE_SCHEMA)
    )


def _metric_rows(mb: dict[str, Any], ma: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for key in mb:
        vb, va = mb.get(key), ma.get(key)
        if (
            isinstance(vb, (int, float))
            and isinstance(va, (int, float))
            and not isinstance(vb, bool)
        ):
            rows.append(
                {
                    "metric": key,
                    "before": vb,
                    "after": va,
                    "delta": va - vb,
                    "change": (va - vb) / vb if vb else None,
                }
            )
    return rows


MEMORY_METRICS = MEMORY_DEVICE_METRICS + MEMORY_STEP_METRICS


def memory_rows(mb: dict[str, Any], ma: dict[str, Any]) -> list[dict[str, Any]]:
    """The memory metrics side by side, one row per metric (and device, where a side has
    several: ``metric[device]``), nulls kept; none when neither side has memory events."""
    rows = []
    for key in MEMORY_METRICS:
        vb, va = mb.get(key), ma.get(key)
        if isinstance(vb, dict) or isinstance(va, dict):
            db = vb if isinstance(vb, dict) else {}
            da = va if isinstance(va, dict) else {}
            pairs = [(f"{key}[{d}]", db.get(d), da.get(d)) for d in sorted(set(db) | set(da))]
        else:
            pairs = [(key, vb, va)]
        for name, b, a in pairs:
            both = isinstance(b, (int, float)) and isinstance(a, (int, float))
            rows.append(
                {
                    "metric": name,
                    "before": b,
                    "after": a,
                    "delta": a - b if both else None,
                    "change": (a - b) / b if both and b else None,
                }
            )
    return rows if any(r["before"] is not None or r["after"] is not None for r in rows) else []


def _idle_rows(mb: dict[str, Any], ma: dict[str, Any]) -> list[dict[str, Any]]:
    """Idle by cause on each side: per step where both have steps (the window's totals of two
    captures of different lengths are not comparable: audit 12, a one-step AFTER read as a 67%
    drop of every cause), else over each window (``per``: "step" or "window")."""
    ib, ia = mb.get("idle_by_cause_ns") or {}, ma.get("idle_by_cause_ns") or {}
    nb, na = mb.get("steps") or 0, ma.get("steps") or 0
    per = "step" if nb and na else "window"
    rows = []
    for cause in sorted(set(ib) | set(ia)):
        b, a = ib.get(cause, 0), ia.get(cause, 0)
        if per == "step":
            b, a = round(b / nb), round(a / na)
        if b or a:
            rows.append(
                {"cause": cause, "before_ns": b, "after_ns": a, "delta_ns": a - b, "per": per}
            )
    return rows


def _kernel_changes(kb: pl.DataFrame, ka: pl.DataFrame) -> dict[str, Any]:
    k = (
        kb.join(ka, on=["name", "kernel_class"], how="full", suffix="_after", coalesce=True)
        .with_columns(
            pl.col("total_ns").fill_null(0.0),
            pl.col("total_ns_after").fill_null(0.0),
            pl.col("count").fill_null(0.0),
            pl.col("count_after").fill_null(0.0),
        )
        .with_columns((pl.col("total_ns_after") - pl.col("total_ns")).alias("delta_ns"))
    )
    appeared = k.filter((pl.col("count") == 0) & (pl.col("count_after") > 0)).sort(
        ["total_ns_after", "name"], descending=[True, False]
    )
    gone = k.filter((pl.col("count") > 0) & (pl.col("count_after") == 0)).sort(
        ["total_ns", "name"], descending=[True, False]
    )
    changed = k.filter((pl.col("count") > 0) & (pl.col("count_after") > 0)).sort(
        [pl.col("delta_ns").abs(), pl.col("name")], descending=[True, False]
    )
    return {
        "appeared": appeared.head(TOP_KERNEL_CHANGES).to_dicts(),
        "disappeared": gone.head(TOP_KERNEL_CHANGES).to_dicts(),
        "changed": changed.head(TOP_KERNEL_CHANGES).to_dicts(),
        "appeared_count": appeared.height,
        "disappeared_count": gone.height,
        # their time per step, all of them (the lists keep the largest)
        "appeared_ns": float(appeared.get_column("total_ns_after").sum()),
        "disappeared_ns": float(gone.get_column("total_ns").sum()),
    }


def _finding_changes(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> dict[str, Any]:
    fb = {f["id"]: f for f in before if f["severity"] != "info"}
    fa = {f["id"]: f for f in after if f["severity"] != "info"}
    return {
        "resolved": [
            {"id": i, "title": fb[i]["title"], "severity": fb[i]["severity"]}
            for i in fb
            if i not in fa
        ],
        "introduced": [
            {"id": i, "title": fa[i]["title"], "severity": fa[i]["severity"]}
            for i in fa
            if i not in fb
        ],
        "remaining": [
            {"id": i, "before": fb[i]["severity"], "after": fa[i]["severity"]}
            for i in fb
            if i in fa
        ],
    }


def throughput(
    kb: pl.DataFrame, ka: pl.DataFrame, sides: tuple[dict[str, Any], dict[str, Any]]
) -> dict[str, Any] | None:
    """Work-normalized throughput per kernel class: calls per second of window and GPU time per
    call, each side from its kernel table (per step) times its steps over its window."""
    rows = []
    for k, side in zip((kb, ka), sides, strict=True):
        window_ns = side.get("window_ns")
        if not window_ns:
            return None
        scale = max(1, side["steps"] or 1)
        per = k.group_by("kernel_class").agg(
            (pl.col("count").sum() * scale).alias("calls"),
            (pl.col("total_ns").sum() * scale).alias("ns"),
        )
        total = pl.DataFrame(
            {"kernel_class": ["all"], "calls": [per["calls"].sum()], "ns": [per["ns"].sum()]},
            schema=per.schema,
        )
        rows.append(
            pl.concat([total, per]).with_columns(
                (pl.col("calls") / (window_ns / 1e9)).alias("calls_per_s"),
                (pl.col("ns") / pl.col("calls")).alias("ns_per_call"),
            )
        )
    t = (
        rows[0]
        .join(rows[1], on="kernel_class", how="full", coalesce=True, suffix="_after")
        .select(
            "kernel_class",
            pl.col("calls_per_s").fill_null(0.0).alias("calls_per_s_before"),
            pl.col("calls_per_s_after").fill_null(0.0),
            pl.col("ns_per_call").alias("ns_per_call_before"),
            pl.col("ns_per_call_after"),
        )
        .with_columns(
            (pl.col("calls_per_s_after") / pl.col("calls_per_s_before") - 1).alias(
                "calls_per_s_change"
            ),
            (pl.col("ns_per_call_after") / pl.col("ns_per_call_before") - 1).alias(
                "ns_per_call_change"
            ),
        )
        .sort(
            [pl.col("kernel_class") != "all", "calls_per_s_before", "kernel_class"],
            descending=[False, True, False],
        )
    )
    # a class absent on one side has no time per call and no finite change: null in JSON
    fam = [
        {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in r.items()}
        for r in t.to_dicts()
    ]
    return {
        "window_before_ns": sides[0]["window_ns"],
        "window_after_ns": sides[1]["window_ns"],
        "kernel_classes": fam,
        "kernels_per_s_change": fam[0]["calls_per_s_change"] if fam else None,
    }


def _step_sample(a: Analysis) -> tuple[float, ...]:
    """Per-step times for the noise model: a trace's steps; a job's slowest rank per step."""
    if isinstance(a, TraceAnalysis):
        return tuple(float(s.dur_ns) for s in a.results.steps.per_step)
    return tuple(float(max(s["times"])) for s in a.step_table(limit=10_000))


def _doc_steps(doc: dict[str, Any]) -> list[float]:
    steps = (doc.get("details") or {}).get("steps") or {}
    return [float(s["dur_ns"]) for s in steps.get("per_step") or []]


def _iterations(a: Analysis) -> Iterations | None:
    if isinstance(a, TraceAnalysis) and a.trace is not None and not a.metrics.get("steps"):
        return nvtx_iterations(a.trace.events) or kernel_iterations(a.trace.events)
    return None


def timing_sample(a: Analysis) -> TimingSample:
    """What a diff reads of one side beyond its document: the per-step times of the noise
    model (a job's slowest rank per step) and, without step markers, the iterations found in
    its event table. A baseline stores it, since it keeps neither the analysis nor the events."""
    return TimingSample(_step_sample(a), _iterations(a))


def _doc_sample(doc: dict[str, Any]) -> TimingSample:
    """A stored document's timing sample where none was stored with it (a baseline saved by an
    earlier version): a trace's per-step times from its details; a job's are not there."""
    return TimingSample(tuple(_doc_steps(doc)), None)


def _gate(doc: dict[str, Any]) -> dict[str, Any]:
    """What --fail-if-slower compares: marker steps where both sides have them, else iterations
    of the same length (in kernels) found on both sides, else kernel throughput."""
    if doc["step_time_change"] is not None:
        basis = "step_time" if doc["iterations"] is None else "iteration_time"
        lo_hi = doc["noise"]["interval"]
        return {
            "basis": basis,
            "slowdown_ratio": doc["step_time_change"],
            "interval": lo_hi,
            "significant": None if lo_hi is None else (lo_hi[0] > 0 or lo_hi[1] < 0),
        }
    th = doc["throughput"]
    change = th["kernels_per_s_change"] if th else None
    return {
        "basis": "throughput" if change is not None else None,
        # time per unit of work: fewer kernels per second is slower
        "slowdown_ratio": (1 / (1 + change) - 1) if change is not None and change > -1 else None,
        "interval": None,
        "significant": None,
    }


def compare_docs(
    before: dict[str, Any],
    after: dict[str, Any],
    kb: pl.DataFrame,
    ka: pl.DataFrame,
    analyses: tuple[Analysis | None, Analysis | None] = (None, None),
    samples: tuple[TimingSample | None, TimingSample | None] = (None, None),
) -> dict[str, Any]:
    """The diff of two analysis documents and their kernel tables. Each side's timing sample
    (:func:`timing_sample`) is the one given, else its analysis's, else its document's; its
    environment comes from its analysis where given."""
    ab, aa = analyses
    tb, ta = (
        given or (timing_sample(a) if a is not None else _doc_sample(doc))
        for given, a, doc in zip(samples, analyses, (before, after), strict=True)
    )
    sb, sa = (
        before["metrics"].get("step_time_median_ns"),
        after["metrics"].get("step_time_median_ns"),
    )
    xb, xa = tb.step_times_ns, ta.step_times_ns
    iterations = None
    if not (sb and sa):
        ib, ia = tb.iterations, ta.iterations
        sb = sa = None
        if ib and ia:
            iterations = {"before": jsonable(ib), "after": jsonable(ia)}
            # an iteration is comparable work only when both repeat (about) the same kernels, or
            # both sides' iterations are the same named range
            pb, pa = ib.period_kernels, ia.period_kernels
            same = (
                ib.range_name == ia.range_name
                if pb is None or pa is None
                else abs(pa - pb) <= PERIOD_SAME_WORK_RATIO * pb
            )
            if same:
                sb, sa = ib.median_ns, ia.median_ns
                xb, xa = ib.per_iteration_ns, ia.per_iteration_ns
    eb = environment(ab) if ab is not None else None
    ea = environment(aa) if aa is not None else None
    warnings, hardware = environment_warnings(eb, ea) if eb and ea else ([], False)
    interval = change_interval(xb, xa) if sb and sa else None
    doc = {
        "schema": SCHEMA,
        "kind": "diff",
        "tool": tool_json(),
        "before": before["source"]["path"],
        "after": after["source"]["path"],
        "environment": {"before": eb, "after": ea},
        "warnings": warnings,
        "hardware_differs": hardware,
        "step_time_before_ns": sb,
        "step_time_after_ns": sa,
        "step_time_change": (sa - sb) / sb if sb and sa is not None else None,
        "noise": {
            "method": "bootstrap of the median step",
            "resamples": BOOTSTRAP_RESAMPLES,
            "confidence": CONFIDENCE,
            "steps_before": len(xb),
            "steps_after": len(xa),
            "interval": list(interval) if interval else None,
        },
        "iterations": iterations,
        "throughput": throughput(kb, ka, (before["metrics"], after["metrics"])),
        "metrics": _metric_rows(before["metrics"], after["metrics"]),
        "memory": memory_rows(before["metrics"], after["metrics"]),
        "idle_by_cause": _idle_rows(before["metrics"], after["metrics"]),
        "kernels_per_step": _kernel_changes(kb, ka),
        "findings": _finding_changes(before["findings"], after["findings"]),
        # each side's data-quality errors (a truncated file, lost device activity, no events):
        # a diff with one cannot pass a gate (audit 12: a truncated AFTER passed)
        "data_quality_errors": {
            "before": quality_errors(before),
            "after": quality_errors(after),
        },
        "unprofiled": _unprofiled(before, after),
        "input_copies": input_copies(before["metrics"], after["metrics"], sb, sa),
        # --what-if: each side's chosen fixes replayed (audit 12: accepted, never shown)
        "what_if_selected": {
            side: sel
            for side, d in (("before", before), ("after", after))
            if (sel := ((d.get("details") or {}).get("what_if") or {}).get("selected"))
        },
    }
    if (u := doc["unprofiled"]) and doc["step_time_change"] is not None:
        # the measured change where both sides carry it, else the model's estimate
        profiled, estimated = doc["step_time_change"], u.get("measured_change", u["change"])
        if (profiled > 0) != (estimated > 0) and max(
            abs(profiled), abs(estimated)
        ) >= UNPROFILED_DISAGREE:
            # the profiler's own cost differs between the sides (a compiled AFTER records
            # more events a step; audit 12: the profiled change was within 10% of the
            # measured band on 12 of 32 pairs, the un-profiled estimates' on 21)
            what, advice = (
                (
                    "step measured by the capture",
                    "and the gate reads the profiled steps; the measured change is what the "
                    "runs without the profiler see",
                )
                if "measured_change" in u
                else ("estimate", "time both without the profiler before acting on the gate")
            )
            doc["warnings"].append(
                f"the profiled step time changes by {100 * profiled:+.1f}% but the un-profiled "
                f"{what} by {100 * estimated:+.1f}%: the profiler's cost differs between the "
                f"sides; {advice}"
            )
    if (c := doc["input_copies"]) and (change := c["step_time_per_byte_change"]) is not None:
        # a batch (or sequence) grown or shrunk between the sides: the step's time alone reads
        # a loop that quadrupled its batch as slower (e3nn's 4x batch: +19.7% a step, 3.4-4.4x
        # faster a sample measured)
        doc["warnings"].append(
            f"host-to-device bytes a step changed {c['ratio']:.2f}x (a batch, sequence or "
            "padding changed?): the steps may hold unequal work; where the samples a step "
            f"changed as much, the time a sample changes by {100 * change:+.1f}%"
        )
    for side, d in (("BEFORE", before), ("AFTER", after)):
        passing = [
            f["id"]
            for f in d.get("findings", [])
            if f["id"] in TRANSIENT_FINDINGS and f["severity"] != "info"
        ]
        if passing:
            # one-time work inside the window: the side's step is longer than the run's
            # settled step (audit 15: an SBERT bf16 AFTER's new shapes read "+414.7%" where
            # the runs measured +59..+117%)
            doc["warnings"].append(
                f"the {side} window holds one-time work ({', '.join(passing)}): its step falls "
                "as the run settles; compare steps recorded after a warm-up"
            )
    doc["gate"] = _gate(doc)
    return doc


# host-to-device bytes a step changed by at least this factor either way: the batch may have
INPUT_BYTES_CHANGE_MIN = 1.5


def input_copies(
    mb: dict[str, Any], ma: dict[str, Any], sb: float | None, sa: float | None
) -> dict[str, Any] | None:
    """Each side's host-to-device bytes a step and their ratio; where it is at least
    :data:`INPUT_BYTES_CHANGE_MIN` either way, the time per byte's change (the time per sample's
    where the batch moved with the copies), else None there. None without steps or copies on
    either side (data made on the GPU has no copies to count)."""
    per = [
        m.get("h2d_bytes") / m["steps"] if m.get("steps") and m.get("h2d_bytes") else None
        for m in (mb, ma)
    ]
    if per[0] is None or per[1] is None:
        return None
    ratio = per[1] / per[0]
    moved = max(ratio, 1 / ratio) >= INPUT_BYTES_CHANGE_MIN
    return {
        "h2d_bytes_per_step_before": per[0],
        "h2d_bytes_per_step_after": per[1],
        "ratio": ratio,
        "step_time_per_byte_change": (sa / ratio) / sb - 1 if moved and sb and sa else None,
    }


# findings whose cost is one-time or fades as a run goes on
TRANSIENT_FINDINGS = ("new_shape_setup", "cold_start")
# the profiled and the un-profiled changes disagree in direction, one of them by this much
UNPROFILED_DISAGREE = 0.05


def _unprofiled(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any] | None:
    """Each side's un-profiled step as the step model estimates it, and its change (None
    where either side has no step model)."""

    def both(key: str) -> tuple[Any, Any]:
        b, a = (((d.get("details") or {}).get("replay") or {}).get(key) for d in (before, after))
        return b, a

    ub, ua = both("unprofiled_step_ns")
    if not ub or not ua:
        return None
    out = {"before_ns": ub, "after_ns": ua, "change": (ua - ub) / ub}
    lb, la = both("unprofiled_step_low_ns")
    if lb and la:
        # the same change at both sides' low ends (the profiler's cost per event PROFILER_COST_HIGH_FACTOR times the trace's)
        out["change_low"] = (la - lb) / lb
    mb, ma = both("measured_step_ns")
    if mb and ma:
        # both recorded by traceinsight.capture: the step each process ran without the
        # profiler, measured (what the disagreement warning below asks for)
        out["measured_before_ns"], out["measured_after_ns"] = mb, ma
        out["measured_change"] = (ma - mb) / mb
    return out


def _ranks(a: Analysis) -> dict[int, TraceAnalysis]:
    return {r.rank: r for r in a.ranks} if isinstance(a, JobAnalysis) else {a.rank: a}


def compare(before: Analysis, after: Analysis) -> dict[str, Any]:
    """The diff of two analyses; where either is a job, ``ranks`` has one diff per rank both
    sides have (matched by rank number)."""
    # a single trace diffed against a job is also its own rank 0: document and kernel table
    # once per analysis, not once per comparison it takes part in
    docs: dict[int, dict[str, Any]] = {}
    tables: dict[int, pl.DataFrame] = {}

    def doc_of(a: Analysis) -> dict[str, Any]:
        return docs[id(a)] if id(a) in docs else docs.setdefault(id(a), a.to_json())

    def kernels_of(a: Analysis) -> pl.DataFrame:
        return tables[id(a)] if id(a) in tables else tables.setdefault(id(a), kernels_per_step(a))

    doc = compare_docs(
        doc_of(before), doc_of(after), kernels_of(before), kernels_of(after), (before, after)
    )
    if isinstance(before, JobAnalysis) or isinstance(after, JobAnalysis):
        rb, ra = _ranks(before), _ranks(after)
        doc["ranks"] = [
            {
                "rank": r,
                **compare_docs(
                    doc_of(rb[r]),
                    doc_of(ra[r]),
                    kernels_of(rb[r]),
                    kernels_of(ra[r]),
                    (rb[r], ra[r]),
                ),
            }
            for r in sorted(set(rb) & set(ra))
        ]
        gate_on_worst_rank(doc)
    return doc


def gate_on_worst_rank(doc: dict[str, Any]) -> None:
    """With no job-level step time, the gate is the rank that slowed down most."""
    gated = [r for r in doc["ranks"] if r["gate"]["slowdown_ratio"] is not None]
    if doc["gate"]["basis"] is None and gated:
        worst = max(gated, key=lambda r: r["gate"]["slowdown_ratio"])
        doc["gate"] = dict(worst["gate"], rank=worst["rank"])


def diff_paths(
    before: Path, after: Path, opts: Options | None = None, runtime: Runtime | None = None
) -> dict[str, Any]:
    opts = opts or Options()
    runtime = runtime or Runtime.detect(helpers=False)
    return compare(
        analyze_with(Path(before), opts, runtime), analyze_with(Path(after), opts, runtime)
    )
