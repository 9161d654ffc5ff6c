"""Before/after comparison of two analyses (traces or jobs).

Metrics side by side, step time, idle time by cause, kernels that appeared, disappeared or changed
most (matched by name and class, normalized per step so captures of different lengths compare),
and findings resolved or introduced; for jobs, the same per matched rank.

A diff is only as good as its two sides are comparable: ``environment`` records the GPU, device
count, world size, CUDA versions and trace format of each and ``warnings`` names what differs.
The change of the median step comes with a bootstrap interval over the steps inside each capture
(``noise``: the within-capture step spread; run-to-run variance between processes is not in it);
captures without step markers get iterations from NVTX ranges or the period of their repeating
kernel sequence, and where there are none, the GPU time of the kernels matched by name where both
sides ran the same kernels (``kernel_match``). ``program`` says whether the two sides look like
the same program. ``gate`` is what ``--fail-if-slower`` reads.
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
    kernels_launched,
    op_signature,
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
# NVTX iterations of one range name whose kernels per iteration differ by this factor or more
# hold different work, or a different program (audit 19: Optimizer.step#SGD.step marked a toy
# MLP's 229 kernels and a ResNet's 344): said in a warning
NVTX_KERNELS_DIFFER = 1.5

# Without steps or comparable iterations, the gate reads the GPU time of the kernel calls matched
# by name, where both sides' kernel multisets (name -> calls, over each capture) share at least
# this share of the larger one: the same work recorded on both sides. Calls per second were
# read before, so more, smaller kernels (a split GEMM, unfused ops) read as faster (audit 19: a
# 30% slower AFTER with every kernel cut in two passed as 35% faster).
KERNEL_MATCH_MIN = 0.95

# Program identity (``program``): the torch op names each side ran, without the compiler's and
# CUDA-graph machinery, as a Jaccard index; where one side is compiled or replays CUDA graphs
# (its eager ops replaced), the share of that side's op names the other side has. Over the
# fixtures' 140 same-program pairs (h100/thirdparty, h200/**: bf16, channels_last, workers,
# torch.compile, CUDA graphs, process-to-process) the lowest is 0.74 (lightning compiled twice);
# over the audit's different-program pairs the highest is 0.55 (two HF inference pipelines,
# ViT and BERT): they differ below 0.65.
OP_IDENTITY_MIN = 0.65
# fewer op names than this on a side (a CUDA-graph replay's few, a toy trace's) move the Jaccard
# index by 10 points or more a name: the kernel names judge instead
OP_IDENTITY_MIN_NAMES = 10
# Where a side has no torch ops (nsys, rocprof), kernel names: their overlap coefficient. bf16
# and torch.compile rename most kernels (a T5 pair compiled with bf16 shares 11% of its kernel
# names), so only sides sharing almost none clearly differ.
KERNEL_IDENTITY_MIN = 0.05


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
    # nvtx: kernels launched from the first counted range's start to the last one's
    kernels_per_iteration: float | None = field(default=None, metadata=OMIT_NONE)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Iterations:
        return cls(**{**d, "per_iteration_ns": tuple(d["per_iteration_ns"])})


@dataclass(frozen=True)
class TimingSample:
    """What a diff reads of one side beyond its document (:func:`timing_sample`)."""

    step_times_ns: tuple[float, ...]
    iterations: Iterations | None
    # the torch op names it ran, without the compiler's machinery (None: not known, a stored
    # baseline from an earlier version or a job's rank analyzed without its events)
    op_names: tuple[str, ...] | None = None
    # compiled or replaying CUDA graphs: its eager ops replaced
    replaced: bool = False

    def to_json(self) -> dict[str, Any]:
        return jsonable(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> TimingSample:
        it, ops = d.get("iterations"), d.get("op_names")
        return cls(
            tuple(d.get("step_times_ns") or ()),
            Iterations.from_json(it) if it else None,
            tuple(ops) if ops is not None else None,
            bool(d.get("replaced")),
        )


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
    # the counted iterations run from the start of the range before the first spacing kept to
    # the last range's start
    starts = (
        r.filter(
            (pl.col("kind") == "user_annotation")
            & (pl.col("base") == best["base"])
            & (pl.col("tid") == best["tid"])
        )
        .get_column("start_ns")
        .sort()
    )
    lo, hi = int(starts[starts.len() - 1 - per.len()]), int(starts[-1])
    return Iterations(
        method="nvtx",
        range_name=best["base"],
        iterations=per.len(),
        per_iteration_ns=tuple(per.to_list()),
        median_ns=float(per.median()),
        kernels_per_iteration=kernels_launched(events, lo, hi) / per.len(),
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


def _kernel_changes(kb: pl.DataFrame, ka: pl.DataFrame, nb: int, na: int) -> dict[str, Any]:
    """Kernels appeared, disappeared and changed most: per step where both sides have steps
    (``nb``, ``na``), else each side's window totals (``per``), as idle_by_cause: a table per step
    beside one over a window has no common unit (audit 19: a window's 3.60 s read "per step")."""
    per = "step" if nb and na else "window"
    if per == "window":
        kb, ka = (
            k.with_columns(pl.col("count") * max(1, n), pl.col("total_ns") * max(1, n))
            for k, n in ((kb, nb), (ka, na))
        )
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
        # their time per step (or in the window), all of them (the lists keep the largest)
        "appeared_ns": float(appeared.get_column("total_ns_after").sum()),
        "disappeared_ns": float(gone.get_column("total_ns").sum()),
        "per": per,
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
    """Kernel calls per second of window and GPU time per call, by kernel class, each side from
    its kernel table (per step) times its steps over its window. Not normalized by work: more,
    smaller kernels read as more calls a second, so the gate does not read it
    (:func:`kernel_match` is what it reads)."""
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


def _calls_by_name(k: pl.DataFrame, steps: int) -> pl.DataFrame:
    """A kernel table (per step) as each name's calls and GPU time over the capture's window."""
    scale = max(1, steps)
    return (
        k.group_by("name")
        .agg(
            (pl.col("count").sum() * scale).alias("calls"),
            (pl.col("total_ns").sum() * scale).alias("ns"),
        )
        .sort("name")  # one order of summing: a baseline's diff is the direct diff's
    )


def kernel_match(
    kb: pl.DataFrame, ka: pl.DataFrame, sides: tuple[dict[str, Any], dict[str, Any]]
) -> dict[str, Any] | None:
    """The kernel calls both sides ran, matched by name: ``matched_ratio`` is the multiset
    intersection (per name, the fewer calls) over the larger side's calls, and ``change`` the
    GPU time of those matched calls, each side at its own time per call, after / before - 1.
    None where a side has no kernel."""
    b, a = (
        _calls_by_name(k, side.get("steps") or 0) for k, side in zip((kb, ka), sides, strict=True)
    )
    nb, na = float(b.get_column("calls").sum() or 0), float(a.get_column("calls").sum() or 0)
    if not nb or not na:
        return None
    m = (
        b.join(a, on="name", how="inner", suffix="_after")
        .filter((pl.col("calls") > 0) & (pl.col("calls_after") > 0))
        .sort("name")
        .select(
            pl.min_horizontal("calls", "calls_after").alias("w"),
            (pl.col("ns") / pl.col("calls")).alias("per_b"),
            (pl.col("ns_after") / pl.col("calls_after")).alias("per_a"),
        )
        .select(
            pl.col("w").sum().alias("matched"),
            (pl.col("w") * pl.col("per_b")).sum().alias("ns_b"),
            (pl.col("w") * pl.col("per_a")).sum().alias("ns_a"),
        )
        .row(0, named=True)
    )
    matched = float(m["matched"] or 0)
    ns_b, ns_a = float(m["ns_b"] or 0), float(m["ns_a"] or 0)
    return {
        "calls_before": nb,
        "calls_after": na,
        "matched_calls": matched,
        "matched_ratio": matched / max(nb, na),
        "matched_ns_before": ns_b,
        "matched_ns_after": ns_a,
        "change": ns_a / ns_b - 1 if ns_b else None,
        "min_ratio": KERNEL_MATCH_MIN,
    }


def program_identity(
    tb: TimingSample, ta: TimingSample, kb: pl.DataFrame, ka: pl.DataFrame
) -> dict[str, Any] | None:
    """Whether the two sides look like one program: ``similarity`` of their torch op names
    (``basis`` ``ops``: Jaccard; ``ops_of_replaced``: where one side alone is compiled or
    replays CUDA graphs, the share of its op names the other has), else of their kernel names
    (``kernel_names``: the overlap coefficient); ``differs`` below ``min``. None where neither
    is known on both sides."""
    if min(len(tb.op_names or ()), len(ta.op_names or ())) >= OP_IDENTITY_MIN_NAMES:
        ob, oa = set(tb.op_names or ()), set(ta.op_names or ())
        if tb.replaced != ta.replaced:
            few = ob if tb.replaced else oa
            basis, sim = "ops_of_replaced", len(ob & oa) / len(few)
        else:
            basis, sim = "ops", len(ob & oa) / len(ob | oa)
        floor = OP_IDENTITY_MIN
    else:
        nb, na = (set(k.get_column("name").unique().to_list()) for k in (kb, ka))
        if not nb or not na:
            return None
        basis, sim, floor = (
            "kernel_names",
            len(nb & na) / min(len(nb), len(na)),
            KERNEL_IDENTITY_MIN,
        )
    return {"basis": basis, "similarity": sim, "min": floor, "differs": sim < floor}


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
    model (a job's slowest rank per step), without step markers the iterations found in its
    event table, and its torch op names (:func:`op_signature`). A baseline stores it, since it
    keeps neither the analysis nor the events."""
    if isinstance(a, TraceAnalysis) and a.trace is not None:
        ops, replaced = op_signature(a.trace.events)
        return TimingSample(_step_sample(a), _iterations(a), ops, replaced)
    return TimingSample(_step_sample(a), _iterations(a))


def _doc_sample(doc: dict[str, Any]) -> TimingSample:
    """A stored document's timing sample where none was stored with it (a baseline saved by an
    earlier version): a trace's per-step times from its details; a job's are not there."""
    return TimingSample(tuple(_doc_steps(doc)), None)


def _gate(doc: dict[str, Any]) -> dict[str, Any]:
    """What --fail-if-slower compares: marker steps where both sides have them, else iterations
    of the same work found on both sides, else the GPU time of the kernel calls matched by name
    where both sides ran the same kernels (:data:`KERNEL_MATCH_MIN`); else nothing, with the
    ``reason`` (a gate that cannot measure does not pass)."""
    gate: dict[str, Any]
    if doc["step_time_change"] is not None:
        basis = "step_time" if doc["iterations"] is None else "iteration_time"
        lo_hi = doc["noise"]["interval"]
        gate = {
            "basis": basis,
            "slowdown_ratio": doc["step_time_change"],
            "interval": lo_hi,
            "significant": None if lo_hi is None else (lo_hi[0] > 0 or lo_hi[1] < 0),
        }
    else:
        km = doc.get("kernel_match")
        same = (
            km is not None and km["matched_ratio"] >= KERNEL_MATCH_MIN and km["change"] is not None
        )
        gate = {
            "basis": "kernel_time" if same else None,
            "slowdown_ratio": km["change"] if same else None,
            "interval": None,
            "significant": None,
        }
        if not same:
            gate["reason"] = (
                "no step time, no iterations of the same work, and no kernels on a side"
                if km is None
                else f"no step time, no iterations of the same work, and the kernel calls "
                f"matched by name are {km['matched_ratio']:.0%} of the larger side's "
                f"({km['calls_before']:,.0f} vs {km['calls_after']:,.0f} calls; "
                f"{KERNEL_MATCH_MIN:.0%} needed): the sides did not record the same work"
            )
    if (c := doc.get("input_copies")) and c.get("step_time_per_byte_change") is not None:
        # the gate reads the step; a batch that grew with the copies makes it unequal work
        gate["batch_ratio"] = c["ratio"]
        gate["per_byte_change"] = c["step_time_per_byte_change"]
    return gate


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
    program = program_identity(tb, ta, kb, ka)
    if program and program["differs"]:
        what = {
            "ops": "of their torch op names",
            "ops_of_replaced": "of the compiled (or CUDA-graph) side's torch op names",
            "kernel_names": "of their kernel names",
        }[program["basis"]]
        warnings.append(
            f"the sides look like different programs: {program['similarity']:.0%} {what} are "
            f"shared ({program['min']:.0%} needed): the diff compares unrelated work, and "
            "--fail-if-slower refuses to gate (exit 2) without --allow-different-programs"
        )
    if iterations is not None and sb and sa:
        kb_it = iterations["before"].get("kernels_per_iteration")
        ka_it = iterations["after"].get("kernels_per_iteration")
        if kb_it and ka_it and max(kb_it, ka_it) >= NVTX_KERNELS_DIFFER * min(kb_it, ka_it):
            warnings.append(
                f"the iterations (the range {iterations['before']['range_name']!r}) hold "
                f"{kb_it:,.0f} vs {ka_it:,.0f} kernels each: they may be different work, so "
                "their times may not compare"
            )
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
            # the steps inside each capture: run-to-run (process-to-process) variance is not in
            # it (audit 19: one LoRA loop in two processes read 1.88x "larger than the noise")
            "scope": "within_capture",
            "resamples": BOOTSTRAP_RESAMPLES,
            "confidence": CONFIDENCE,
            "steps_before": len(xb),
            "steps_after": len(xa),
            "interval": list(interval) if interval else None,
        },
        "iterations": iterations,
        "program": program,
        "program_differs": bool(program and program["differs"]),
        "throughput": throughput(kb, ka, (before["metrics"], after["metrics"])),
        "kernel_match": kernel_match(kb, ka, (before["metrics"], after["metrics"])),
        "metrics": _metric_rows(before["metrics"], after["metrics"]),
        "memory": memory_rows(before["metrics"], after["metrics"]),
        "idle_by_cause": _idle_rows(before["metrics"], after["metrics"]),
        "kernels_per_step": _kernel_changes(
            kb, ka, before["metrics"].get("steps") or 0, after["metrics"].get("steps") or 0
        ),
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
        stats = tuple(u.get("statistics") or ("median", "median"))
        # a loader-paced side's estimate is of its mean step: the profiled steps on the same
        # statistics, so a stall step is not read as the profiler's cost (audit 19: a 107.9 ms
        # DataLoader wait among 19-21 ms steps, -33.3% of the median against +254% estimated)
        same = (
            _profiled_change(before, after, stats)
            if "measured_change" not in u and stats != ("median", "median")
            else None
        )
        if _disagree(profiled, estimated) and same is not None and not _disagree(same, estimated):
            words = " and ".join(
                f"the {side}'s {stat}"
                for side, stat in zip(("BEFORE", "AFTER"), stats, strict=True)
            )
            doc["warnings"].append(
                f"the median step changes by {100 * profiled:+.1f}% but {words} step, which "
                f"the un-profiled estimate follows, by {100 * same:+.1f}% "
                f"({_uneven(before, 'BEFORE')}; {_uneven(after, 'AFTER')}): a stall step "
                "makes the steps uneven, not the profiler's cost; the gate reads the median"
            )
        elif _disagree(profiled, estimated):
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
            # compared on the estimate's own statistics where a side's is the mean
            basis = (
                f"the profiled step time (each side's {'/'.join(stats)}, as the estimate) "
                f"changes by {100 * same:+.1f}%"
                if same is not None
                else f"the profiled step time changes by {100 * profiled:+.1f}%"
            )
            doc["warnings"].append(
                f"{basis} but the un-profiled {what} by {100 * estimated:+.1f}%: the profiler's "
                f"cost differs between the sides; {advice}"
            )
    if (c := doc["input_copies"]) and (change := c["step_time_per_byte_change"]) is not None:
        # a batch (or sequence) grown or shrunk between the sides: the step's time alone reads
        # a loop that quadrupled its batch as slower (e3nn's 4x batch: +19.7% a step, 3.4-4.4x
        # faster a sample measured)
        broken = [side.upper() for side, q in doc["data_quality_errors"].items() if q]
        why = (
            f"the {' and '.join(broken)} has a data-quality error: its copies may be missing "
            "from the record rather than from the step"
            if broken
            else "a batch, sequence or padding changed?"
        )
        doc["warnings"].append(
            f"host-to-device bytes a step changed {c['ratio']:.2f}x ({why}): the steps may hold "
            "unequal work; where the samples a step changed as much, the time a sample changes "
            f"by {100 * change:+.1f}%"
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
    # the step statistic each estimate is of: a loader-paced side's is the mean (replay.py)
    sb, sa = both("step_statistic")
    out["statistics"] = [sb or "median", sa or "median"]
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


def _disagree(profiled: float, estimated: float) -> bool:
    """Opposite directions, one of them by :data:`UNPROFILED_DISAGREE` or more."""
    return (profiled > 0) != (estimated > 0) and max(
        abs(profiled), abs(estimated)
    ) >= UNPROFILED_DISAGREE


def _steps_of(doc: dict[str, Any]) -> dict[str, Any]:
    return (doc.get("details") or {}).get("steps") or {}


def _profiled_change(
    before: dict[str, Any], after: dict[str, Any], stats: Sequence[str]
) -> float | None:
    """The profiled steps' change, each side by the statistic its un-profiled estimate uses."""
    b, a = (
        _steps_of(d).get(f"step_time_{stat}_ns")
        for d, stat in zip((before, after), stats, strict=True)
    )
    return a / b - 1 if a and b else None


def _uneven(doc: dict[str, Any], side: str) -> str:
    """A side's median and longest step, as the uneven-steps warning says them."""
    st = _steps_of(doc)
    longest = max((s["dur_ns"] for s in st.get("per_step") or []), default=None)
    median = st.get("step_time_median_ns")
    if not longest or not median:
        return f"{side}: no steps"
    return f"{side}: median {median / 1e6:.2f} ms, longest {longest / 1e6:.2f} ms"


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
    elif doc["gate"]["basis"] is None and doc["ranks"]:
        # no rank could be gated either: the first rank's reason, not the job level's
        first = doc["ranks"][0]
        if first["gate"].get("reason"):
            doc["gate"]["reason"] = f"rank {first['rank']}: {first['gate']['reason']}"


def diff_paths(
    before: Path, after: Path, opts: Options | None = None, runtime: Runtime | None = None
) -> dict[str, Any]:
    opts = opts or Options()
    runtime = runtime or Runtime.detect(helpers=False)
    return compare(
        analyze_with(Path(before), opts, runtime), analyze_with(Path(after), opts, runtime)
    )
