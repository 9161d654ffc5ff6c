"""Where in the model the GPU time goes: the region tree of user annotations.

A region is a host range the user (or the framework) named: ``record_function`` and NVTX ranges
(kind ``user_annotation``, NCCL's domain included) and ``nn.Module: ...`` python_function rows
(``with_modules``). Ranges nest per thread into a tree; a region's ``path`` is its ancestors'
names and its own, joined by ``/``; occurrences with one path aggregate.

- ``gpu_ns``: GPU activity (kernels, copies, memsets; clipped to the window) *launched* inside
  the region, on its thread: the launch is what the host range can own; the GPU runs it later.
  Inclusive (a region counts its children's work); ``self_gpu_ns`` only its own.
- ``idle_ns`` / ``idle_by_cause_ns``: the idle analyzer's segments (with its causes) that fall
  inside the region's host time, summed over devices: "while the host was in the optimizer step
  the GPU stood idle for 38 ms, launch overhead".
- ``findings``: ids of the findings whose evidence segments overlap the region's host time
  (attached after the rules ran, :func:`with_findings`).
GPU-side annotation mirrors (``gpu_annotation``) are not regions of their own: they duplicate
the host ranges (Kineto's gpu_user_annotation spans the same record_function).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import polars as pl

from traceinsight.analyzers.context import STEP_MARKER, Context
from traceinsight.analyzers.idle import CAUSES, IdleResult
from traceinsight.model import intervals as iv

MODULE_PATTERN = r"^nn\.Module: "
SEP = "/"
MAX_DEPTH = 64  # deeper nesting is cut there (a runaway recursion), not an error
TOP_REGIONS = 300  # the JSON keeps the regions with the most GPU time (the rest are counted)
_REGION_SCHEMA = {"path": pl.String, "start_ns": pl.Int64, "end_ns": pl.Int64}


@dataclass(frozen=True)
class RegionResult:
    region_count: int  # distinct paths in the window
    occurrence_count: int  # annotation ranges in the window
    attributed_gpu_ns: int  # GPU time launched inside some region
    unattributed_gpu_ns: int  # GPU time launched outside every region (or with no launch)
    regions: tuple[dict[str, Any], ...]  # top TOP_REGIONS by gpu_ns, parents before children
    truncated_count: int = 0
    # the regions' host time (path, start_ns, end_ns; a union per path) for placing findings
    ranges: pl.DataFrame | None = field(
        default=None, repr=False, compare=False, metadata={"json": False}
    )


def _empty(gpu_ns: int = 0) -> RegionResult:
    return RegionResult(0, 0, 0, gpu_ns, (), 0, pl.DataFrame(schema=_REGION_SCHEMA))


def region_rows(ctx: Context) -> pl.DataFrame:
    """The annotation and module ranges that overlap the window (step markers excluded: the
    steps are the window's own division, not a model region)."""
    ann = ctx.rows(("user_annotation",), STEP_MARKER, negate=True)
    mods = ctx.rows(("python_function",), MODULE_PATTERN)
    rows = pl.concat([ann, mods]) if mods.height else ann
    if ctx.steps.height and "name" in ctx.steps.columns:  # a custom --step-range's names
        rows = rows.filter(~pl.col("name").is_in(ctx.steps.get_column("name").unique().implode()))
    return rows.filter(
        (pl.col("end_ns") > ctx.window_start_ns)
        & (pl.col("start_ns") < ctx.window_end_ns)
        & (pl.col("end_ns") >= pl.col("start_ns"))
    ).select("name", "start_ns", "end_ns", pl.col("tid").fill_null(-1))


def nest(rows: pl.DataFrame) -> pl.DataFrame:
    """Each range's id, parent id (innermost range of its thread containing it) and path.

    A sweep per thread: +1 at each start, -1 at each end (ends first at equal times, outer ranges
    first at equal starts) gives each range's depth; its parent is the latest range one level up
    started before it (an as-of join by thread and depth). Paths are built level by level."""
    rows = rows.with_row_index("id").with_columns(pl.col("id").cast(pl.Int64))
    marks = pl.concat(
        [
            rows.select("id", "tid", pl.col("start_ns").alias("t"), pl.lit(1).alias("d"), "end_ns"),
            rows.select("id", "tid", pl.col("end_ns").alias("t"), pl.lit(-1).alias("d"), "end_ns"),
        ]
    ).sort(["tid", "t", "d", "end_ns"], descending=[False, False, False, True])
    starts = (
        marks.with_columns(pl.col("d").cum_sum().over("tid").alias("depth"))
        .with_row_index("seq")
        .filter(pl.col("d") == 1)
        .select("id", "tid", "seq", (pl.col("depth") - 1).clip(0, MAX_DEPTH).alias("depth"))
    )
    parents = (
        starts.filter(pl.col("depth") > 0)
        .with_columns((pl.col("depth") - 1).alias("pdepth"))
        .sort("seq")
        .join_asof(
            starts.select(
                pl.col("seq").alias("pseq"), "tid", pl.col("depth").alias("pdepth"), "id"
            ).sort("pseq"),
            left_on="seq",
            right_on="pseq",
            by=["tid", "pdepth"],
            strategy="backward",
            suffix="_parent",
            check_sortedness=False,  # both sorted by seq overall, so within each group too
        )
        .select("id", pl.col("id_parent").alias("parent"))
    )
    tree = (
        rows.join(starts.select("id", "depth"), on="id")
        .join(parents, on="id", how="left")
        .with_columns(
            pl.when(pl.col("depth") == 0).then(pl.col("name")).alias("path"),
            pl.lit(None, pl.String).alias("parent_path"),
        )
        .with_columns(pl.concat_list("path").alias("chain"))
    )
    # level by level (a few dozen at most, not one per range): a range's path and its chain
    # of ancestor paths extend its parent's (names may hold "/", so no splitting back)
    for depth in range(1, int(tree.get_column("depth").max() or 0) + 1):
        known = tree.filter(pl.col("depth") == depth - 1).select(
            pl.col("id").alias("parent"), pl.col("path").alias("_pp"), pl.col("chain").alias("_pc")
        )
        here = pl.col("depth") == depth
        path = pl.coalesce(pl.col("_pp"), pl.lit("?")) + SEP + pl.col("name")
        tree = (
            tree.join(known, on="parent", how="left")
            .with_columns(
                pl.when(here).then(path).otherwise(pl.col("path")).alias("path"),
                pl.when(here)
                .then(pl.col("_pp"))
                .otherwise(pl.col("parent_path"))
                .alias("parent_path"),
            )
            .with_columns(
                pl.when(here)
                .then(pl.concat_list(pl.col("_pc").fill_null([]), pl.col("path")))
                .otherwise(pl.col("chain"))
                .alias("chain")
            )
            .drop("_pp", "_pc")
        )
    return tree.select(
        "id", "parent", "depth", "name", "path", "parent_path", "chain", "start_ns", "end_ns", "tid"
    )


def _owner(tree: pl.DataFrame, gpu: pl.DataFrame) -> pl.DataFrame:
    """``gpu`` (launch_tid, launch_start_ns, ...) with the id of the innermost range of the
    launching thread open at the launch: at a range's start it opens, at its end its parent
    takes over again (ends before starts at one instant: a range is half open)."""
    marks = (
        pl.concat(
            [
                tree.select(
                    "tid", pl.col("start_ns").alias("t"), pl.lit(1).alias("o"), "depth", "id"
                ),
                tree.select(
                    "tid",
                    pl.col("end_ns").alias("t"),
                    pl.lit(0).alias("o"),
                    -pl.col("depth"),
                    pl.col("parent").alias("id"),
                ),
            ]
        )
        # at one instant: ends before starts, inner ends first, outer starts first, so the
        # last mark standing is the innermost range open just after it
        .sort(["t", "o", "depth"])
        .select("tid", "t", pl.col("id").alias("owner"))
    )
    return (
        gpu.sort("launch_start_ns")
        .join_asof(
            marks,
            left_on="launch_start_ns",
            right_on="t",
            by_left="launch_tid",
            by_right="tid",
            strategy="backward",
            check_sortedness=False,  # both sorted by time overall, so within each thread too
        )
        .drop("t")
    )


def analyze_regions(ctx: Context, idle: IdleResult) -> RegionResult:
    lo, hi = ctx.window_start_ns, ctx.window_end_ns
    gpu = (
        ctx.launches.lazy()
        .filter((pl.col("end_ns") > lo) & (pl.col("start_ns") < hi))
        .select(
            pl.col("launch_tid").fill_null(-1),
            "launch_start_ns",
            pl.col("kernel_class").cast(pl.String).fill_null("other"),
            (pl.min_horizontal("end_ns", pl.lit(hi)) - pl.max_horizontal("start_ns", pl.lit(lo)))
            .clip(0, None)
            .alias("dur_ns"),
        )
        .collect()
    )
    # activity the join has no launch for still counts as GPU time (outside every region)
    total_gpu_ns = int(gpu.get_column("dur_ns").sum() or 0) + _unlaunched_ns(ctx)
    rows = region_rows(ctx)
    if rows.height == 0:
        return _empty(total_gpu_ns)
    tree = nest(rows)
    launched_rows = gpu.filter(pl.col("launch_start_ns").is_not_null())
    owned = _owner(tree, launched_rows).filter(pl.col("owner").is_not_null())
    own = owned.group_by("owner", "kernel_class").agg(pl.col("dur_ns").sum())
    # each range's chain of paths (itself and its ancestors): inclusive time rolls up it
    chains = (
        tree.select(pl.col("id").alias("owner"), "path", pl.col("chain").alias("ancestor"))
        .explode("ancestor")
        .select("owner", "ancestor", (pl.col("ancestor") == pl.col("path")).alias("is_self"))
    )
    by_class = (
        own.join(chains, on="owner")
        .group_by("ancestor", "kernel_class")
        .agg(
            pl.col("dur_ns").sum().alias("gpu_ns"),
            pl.col("dur_ns").filter(pl.col("is_self")).sum().alias("self_gpu_ns"),
        )
        .rename({"ancestor": "path"})
    )
    steps = max(1, ctx.steps.height)
    spans = iv.clip(iv.union(tree.select("path", "start_ns", "end_ns"), by=["path"]), lo, hi).sort(
        "path", "start_ns"
    )
    per_path = (
        tree.group_by("path")
        .agg(
            pl.len().alias("count"),
            pl.col("depth").first(),
            pl.col("name").first(),
            pl.col("parent_path").first(),
            (pl.col("end_ns").clip(None, hi) - pl.col("start_ns").clip(lo, None))
            .sum()
            .alias("host_ns"),
        )
        .join(
            by_class.group_by("path").agg(
                pl.col("gpu_ns").sum(),
                pl.col("self_gpu_ns").sum(),
                pl.struct("kernel_class", "gpu_ns").alias("classes"),
            ),
            on="path",
            how="left",
        )
        .join(_idle_by_path(spans, idle), on="path", how="left")
        .with_columns(
            pl.col("gpu_ns", "self_gpu_ns").fill_null(0),
            (pl.col("count") / steps).alias("count_per_step"),
        )
    )
    ordered = per_path.sort(["gpu_ns", "path"], descending=[True, False])
    top = ordered.head(TOP_REGIONS).sort("path")  # parents before children
    regions = tuple(_region_json(r, steps) for r in top.iter_rows(named=True))
    attributed = int(owned.get_column("dur_ns").sum() or 0)
    return RegionResult(
        region_count=per_path.height,
        occurrence_count=tree.height,
        attributed_gpu_ns=attributed,
        unattributed_gpu_ns=total_gpu_ns - attributed,
        regions=regions,
        truncated_count=max(0, per_path.height - TOP_REGIONS),
        ranges=spans,
    )


def _unlaunched_ns(ctx: Context) -> int:
    """GPU activity in the window that the launch join has no row for (no correlation)."""
    loose = ctx.gpu.filter(pl.col("correlation").is_null())
    return int((loose.get_column("end_ns") - loose.get_column("start_ns")).sum() or 0)


def _idle_by_path(spans: pl.DataFrame, idle: IdleResult) -> pl.DataFrame:
    """Idle by cause inside each path's host time: the overlap of every (device, cause) set of
    segments (disjoint, sorted) with the paths' unions, two sorted searches per set."""
    segs = idle.segments
    names = [f"idle_{c}" for c in CAUSES]
    zero = pl.repeat(0, spans.height, dtype=pl.Int64, eager=True)
    totals = dict.fromkeys(CAUSES, zero)
    if segs is not None and segs.height and spans.height:
        for (_dev, cause), part in (
            segs.sort("start_ns").partition_by(["device", "cause"], as_dict=True).items()
        ):
            cov = iv.overlap_with(
                spans.select("start_ns", "end_ns"), part.select("start_ns", "end_ns")
            )
            totals[str(cause)] = totals[str(cause)] + cov
    out = spans.select("path").with_columns(
        [totals[c].alias(n) for c, n in zip(CAUSES, names, strict=True)]
    )
    return out.group_by("path").agg(pl.col(names).sum())


def _region_json(r: dict[str, Any], steps: int) -> dict[str, Any]:
    by_cause = {c: int(r[f"idle_{c}"] or 0) for c in CAUSES}
    classes = sorted(r["classes"] or [], key=lambda c: -c["gpu_ns"])
    return {
        "path": r["path"],
        "name": r["name"],
        "depth": r["depth"],
        "parent": r["parent_path"],
        "count": r["count"],
        "count_per_step": r["count_per_step"],
        "host_ns": int(r["host_ns"]),
        "gpu_ns": int(r["gpu_ns"]),
        "self_gpu_ns": int(r["self_gpu_ns"]),
        "gpu_ns_per_step": r["gpu_ns"] / steps,
        "idle_ns": sum(by_cause.values()),
        "idle_by_cause_ns": by_cause,
        "kernel_classes_ns": {c["kernel_class"]: int(c["gpu_ns"]) for c in classes},
        "findings": [],
    }


def with_findings(result: RegionResult, findings: Iterable[Any]) -> RegionResult:
    """The regions with the ids of the findings whose evidence segments (``top_segments``:
    start_ns/end_ns) overlap their host time."""
    spans = result.ranges
    if spans is None or spans.height == 0 or not result.regions:
        return result
    hits: dict[str, list[str]] = {}
    for f in findings:
        segs = [
            s
            for s in (f.evidence or {}).get("top_segments") or []
            if isinstance(s, dict) and s.get("start_ns") is not None
        ]
        if not segs:
            continue
        ev = iv.union(
            pl.DataFrame(
                {
                    "start_ns": [int(s["start_ns"]) for s in segs],
                    "end_ns": [int(s["end_ns"]) for s in segs],
                }
            )
        )
        inside = spans.filter(iv.overlap_with(spans.select("start_ns", "end_ns"), ev) > 0)
        for path in inside.get_column("path").unique().to_list():
            hits.setdefault(path, []).append(f.id)
    if not hits:
        return result
    regions = tuple(dict(r, findings=hits.get(r["path"], [])) for r in result.regions)
    return replace(result, regions=regions)
