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
from traceinsight.analyzers.idle import CAUSES, IdleResult, IdleSegment
from traceinsight.analyzers.optimizer import optimizer_ranges
from traceinsight.model import intervals as iv
from traceinsight.model.classify import MODULE_PATTERN

SEP = "/"
MAX_DEPTH = 64  # deeper nesting is cut there (a runaway recursion), not an error
TOP_REGIONS = 300  # the JSON keeps the regions with the most GPU time (the rest are counted)
BUSY_REGIONS = 8  # the regions with the most GPU time whose busy time (a union) is computed
_RANGE_SCHEMA = {"path_id": pl.Int64, "start_ns": pl.Int64, "end_ns": pl.Int64}
_PATH_SCHEMA = {"path_id": pl.Int64, "path": pl.String}


@dataclass(frozen=True)
class RegionResult:
    region_count: int  # distinct paths in the window
    occurrence_count: int  # annotation ranges in the window
    attributed_gpu_ns: int  # GPU time launched inside some region
    unattributed_gpu_ns: int  # GPU time launched outside every region (or with no launch)
    regions: tuple[dict[str, Any], ...]  # top TOP_REGIONS by gpu_ns, parents before children
    truncated_count: int = 0
    # the regions' host time (path_id, start_ns, end_ns; disjoint per path) and the path of
    # each id, for placing findings
    ranges: pl.DataFrame | None = field(
        default=None, repr=False, compare=False, metadata={"json": False}
    )
    paths: pl.DataFrame | None = field(
        default=None, repr=False, compare=False, metadata={"json": False}
    )


def _empty(gpu_ns: int = 0) -> RegionResult:
    return RegionResult(
        0,
        0,
        0,
        gpu_ns,
        (),
        0,
        pl.DataFrame(schema=_RANGE_SCHEMA),
        pl.DataFrame(schema=_PATH_SCHEMA),
    )


# torch op names, as emit_nvtx names its NVTX ranges ("aten::mm", "autograd::engine::...")
TORCH_OP_RANGE = r"^(aten|prim|autograd|c10d|c10d_functional|_c10d_functional|profiler|cudnn|mkldnn|quantized|torchvision|inductor|triton)::"


def region_rows(ctx: Context) -> pl.DataFrame:
    """The annotation and module ranges that overlap the window (step markers excluded: the
    steps are the window's own division, not a model region; so are the op ranges
    ``emit_nvtx`` writes into nsys captures: they are Kineto's cpu_ops, not regions, and number
    millions)."""
    ann = ctx.rows(("user_annotation",), f"{STEP_MARKER}|{TORCH_OP_RANGE}", negate=True)
    mods = ctx.rows(("python_function",), MODULE_PATTERN)
    rows = pl.concat([ann, mods]) if mods.height else ann
    closures = _closures(ctx, rows)
    if closures.height:
        cols = ["name", "start_ns", "end_ns", "tid"]
        rows = pl.concat([rows.select(cols), closures.select(cols).cast(rows.select(cols).schema)])
    if ctx.steps.height:  # a custom --step-range's names
        rows = rows.filter(~pl.col("name").is_in(ctx.steps.get_column("name").unique().implode()))
    return rows.filter(
        (pl.col("end_ns") > ctx.window_start_ns)
        & (pl.col("start_ns") < ctx.window_end_ns)
        & (pl.col("end_ns") >= pl.col("start_ns"))
    ).select("name", "start_ns", "end_ns", pl.col("tid").fill_null(-1))


# The part of an optimizer step that ran its closure, as a region of its own
CLOSURE_REGION = "closure (forward and backward)"


def _closures(ctx: Context, rows: pl.DataFrame) -> pl.DataFrame:
    """A region inside each ``Optimizer.step#`` range for the closure it ran before its own
    work (Lightning's forward and backward: audit 11's loop read "the idle is in
    Optimizer.step#AdamW.step: 25.72 ms per step" where 3.8-4.7 ms of each 28-29 ms range
    came after the last backward op)."""
    if not rows.filter(pl.col("name").str.starts_with("Optimizer.step#")).height:
        return rows.clear()
    own = optimizer_ranges(ctx)
    full = rows.filter(pl.col("name").str.starts_with("Optimizer.step#")).select(
        "name", "tid", "start_ns", pl.col("end_ns").alias("_e")
    )
    return (
        full.join(own.rename({"start_ns": "_own"}), on=["name", "tid"], how="inner")
        .filter((pl.col("_own") > pl.col("start_ns")) & (pl.col("_own") <= pl.col("_e")))
        .filter(pl.col("end_ns") == pl.col("_e"))
        .select(
            pl.lit(CLOSURE_REGION).alias("name"),
            "start_ns",
            pl.col("_own").alias("end_ns"),
            "tid",
        )
        .unique()
    )


def nest(rows: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The ranges as a tree: ``ranges`` (id, parent, depth, path_id, start_ns, end_ns, tid) and
    ``paths`` (path_id, parent_id, depth, name, path, chain: the ids of the path and its
    ancestors), one row per distinct path.

    Per thread, in start order (outer first at equal starts), a range's depth is the ranges
    started before it minus those ended by its start (a sorted search); its parent is the
    latest range one level up (a forward fill per level). Path ids are interned level by level
    on integer keys (parent path, name), so millions of ranges build no strings; paths are
    spelled out on the small path table only."""
    rows = rows.sort(["tid", "start_ns", "end_ns"], descending=[False, False, True])
    rows = rows.with_columns(
        pl.int_range(pl.len(), dtype=pl.Int64).alias("id"),
        pl.col("name").cast(pl.Categorical).to_physical().cast(pl.Int64).alias("name_id"),
    )
    depth = []
    for part in rows.select("tid", "start_ns", "end_ns").partition_by("tid", maintain_order=True):
        ends = part.get_column("end_ns").sort()
        ended = ends.search_sorted(part.get_column("start_ns"), side="right").cast(pl.Int64)
        own = (part.get_column("end_ns") == part.get_column("start_ns")).cast(pl.Int64)
        depth.append(pl.int_range(part.height, dtype=pl.Int64, eager=True) - ended + own)
    rows = rows.with_columns(pl.concat(depth).clip(0, MAX_DEPTH).alias("depth"))
    max_depth = int(rows.get_column("depth").max() or 0)
    parent = pl.lit(None, pl.Int64)
    for d in range(1, max_depth + 1):
        latest = pl.when(pl.col("depth") == d - 1).then(pl.col("id")).forward_fill().over("tid")
        parent = pl.when(pl.col("depth") == d).then(latest).otherwise(parent)
    rows = rows.with_columns(parent.alias("parent"))
    path_id = pl.repeat(-1, rows.height, dtype=pl.Int64, eager=True)
    levels = []
    for d in range(max_depth + 1):
        lvl = rows.filter(pl.col("depth") == d).select("id", "parent", "name_id", "name")
        ppid = (
            path_id.gather(lvl.get_column("parent").fill_null(0))
            if d
            else pl.repeat(-1, lvl.height, dtype=pl.Int64, eager=True)
        )
        lvl = lvl.with_columns(ppid.alias("parent_id"))
        keys = (
            lvl.select("parent_id", "name_id", "name")
            .unique(["parent_id", "name_id"], maintain_order=True)
            .with_row_index("path_id", offset=sum(k.height for k in levels))
            .with_columns(pl.col("path_id").cast(pl.Int64), pl.lit(d).alias("depth"))
        )
        lvl = lvl.join(keys.select("parent_id", "name_id", "path_id"), on=["parent_id", "name_id"])
        path_id = path_id.scatter(lvl.get_column("id"), lvl.get_column("path_id"))
        levels.append(keys.drop("name_id"))
    ranges = rows.with_columns(path_id.alias("path_id")).select(
        "id", "parent", "depth", "path_id", "start_ns", "end_ns", "tid"
    )
    return ranges, _spell(pl.concat(levels))


def _spell(paths: pl.DataFrame) -> pl.DataFrame:
    """Each path's string and its chain of ancestor ids, level by level (small table)."""
    paths = paths.with_columns(
        pl.col("name").alias("path"), pl.concat_list("path_id").alias("chain")
    )
    for d in range(1, int(paths.get_column("depth").max() or 0) + 1):
        up = paths.filter(pl.col("depth") == d - 1).select(
            pl.col("path_id").alias("parent_id"),
            pl.col("path").alias("_pp"),
            pl.col("chain").alias("_pc"),
        )
        here = pl.col("depth") == d
        paths = (
            paths.join(up, on="parent_id", how="left")
            .with_columns(
                pl.when(here)
                .then(pl.col("_pp") + SEP + pl.col("name"))
                .otherwise("path")
                .alias("path"),
                pl.when(here)
                .then(pl.concat_list(pl.col("_pc"), pl.col("path_id")))
                .otherwise("chain")
                .alias("chain"),
            )
            .drop("_pp", "_pc")
        )
    return paths


def _owner(tree: pl.DataFrame, gpu: pl.DataFrame) -> pl.DataFrame:
    """``gpu`` (launch_tid, launch_start_ns, ...) with the id of the innermost range of the
    launching thread open at the launch (ranges are half open).

    The latest range of the thread started at or before the launch (an as-of join on the
    ranges' starts, already in order; at equal starts the inner one is later) is open, or one of
    its ancestors is: walk up while the candidate ended by the launch (one gather per level)."""
    starts = tree.select(
        "tid", pl.col("start_ns").alias("t"), pl.col("id").alias("owner")
    ).with_columns(
        pl.col("t").set_sorted() if tree.get_column("tid").n_unique() == 1 else pl.col("t")
    )
    if not starts.get_column("t").is_sorted():
        starts = starts.sort("t", maintain_order=True)
    hit = (
        gpu.sort("launch_start_ns")
        .join_asof(
            starts,
            left_on="launch_start_ns",
            right_on="t",
            by_left="launch_tid",
            by_right="tid",
            strategy="backward",
            check_sortedness=False,  # both sorted by time overall, so within each thread too
        )
        .drop("t")
    )
    ends, parents = tree.get_column("end_ns"), tree.get_column("parent")
    owner = hit.get_column("owner")
    launch = hit.get_column("launch_start_ns")
    for _ in range(int(tree.get_column("depth").max() or 0) + 1):
        closed = owner.is_not_null() & (ends.gather(owner.fill_null(0)) <= launch)
        if not closed.any():
            break
        owner = pl.select(
            pl.when(closed).then(parents.gather(owner.fill_null(0))).otherwise(owner)
        ).to_series()
    return hit.with_columns(owner.alias("owner"))


def analyze_regions(ctx: Context, idle: IdleResult) -> RegionResult:
    lo, hi = ctx.window_start_ns, ctx.window_end_ns
    gpu = (
        ctx.launches.lazy()
        .filter(iv.overlapping(lo, hi))
        .select(
            pl.col("launch_tid").fill_null(-1),
            "launch_start_ns",
            pl.col("kernel_class").cast(pl.String).fill_null("other"),
            pl.max_horizontal("start_ns", pl.lit(lo)).alias("start_ns"),
            pl.min_horizontal("end_ns", pl.lit(hi)).alias("end_ns"),
        )
        .with_columns((pl.col("end_ns") - pl.col("start_ns")).clip(0, None).alias("dur_ns"))
        .collect()
    )
    # activity the join has no launch for still counts as GPU time (outside every region)
    total_gpu_ns = int(gpu.get_column("dur_ns").sum() or 0) + _unlaunched_ns(ctx)
    rows = region_rows(ctx)
    if rows.height == 0:
        return _empty(total_gpu_ns)
    tree, paths = nest(rows)
    launched_rows = gpu.filter(pl.col("launch_start_ns").is_not_null())
    owned = _owner(tree, launched_rows).filter(pl.col("owner").is_not_null())
    owner_path = tree.get_column("path_id").gather(owned.get_column("owner"))
    own = (
        owned.with_columns(owner_path.alias("self_id"))
        .group_by("self_id", "kernel_class")
        .agg(pl.col("dur_ns").sum())
    )
    # inclusive time rolls up each path's chain of ancestors (on the small path table)
    chains = paths.select(
        pl.col("path_id").alias("self_id"), pl.col("chain").alias("path_id")
    ).explode("path_id")
    by_class = (
        own.join(chains, on="self_id")
        .group_by("path_id", "kernel_class")
        .agg(
            pl.col("dur_ns").sum().alias("gpu_ns"),
            pl.col("dur_ns")
            .filter(pl.col("self_id") == pl.col("path_id"))
            .sum()
            .alias("self_gpu_ns"),
        )
    )
    steps = max(1, ctx.steps.height)
    spans = _spans(tree, lo, hi)
    per_path = (
        tree.group_by("path_id")
        .agg(
            pl.len().alias("count"),
            (pl.col("end_ns").clip(None, hi) - pl.col("start_ns").clip(lo, None))
            .sum()
            .alias("host_ns"),
        )
        .join(paths.select("path_id", "parent_id", "depth", "name", "path"), on="path_id")
        .join(
            paths.select(pl.col("path_id").alias("parent_id"), pl.col("path").alias("parent_path")),
            on="parent_id",
            how="left",
        )
        .join(
            by_class.group_by("path_id").agg(
                pl.col("gpu_ns").sum(),
                pl.col("self_gpu_ns").sum(),
                pl.struct("kernel_class", "gpu_ns").alias("classes"),
            ),
            on="path_id",
            how="left",
        )
        .join(_idle_by_path(spans, idle), on="path_id", how="left")
        .with_columns(
            pl.col("gpu_ns", "self_gpu_ns").fill_null(0),
            (pl.col("count") / steps).alias("count_per_step"),
        )
    )
    ordered = per_path.sort(["gpu_ns", "path"], descending=[True, False])
    busy = _busy_ns(owned.with_columns(owner_path.alias("self_id")), chains, ordered)
    top = ordered.head(TOP_REGIONS).sort("path")  # parents before children
    regions = tuple(_region_json(r, steps, busy) for r in top.iter_rows(named=True))
    attributed = int(owned.get_column("dur_ns").sum() or 0)
    return RegionResult(
        region_count=per_path.height,
        occurrence_count=tree.height,
        attributed_gpu_ns=attributed,
        unattributed_gpu_ns=total_gpu_ns - attributed,
        regions=regions,
        truncated_count=max(0, per_path.height - TOP_REGIONS),
        ranges=spans,
        paths=paths.select("path_id", "path"),
    )


def _spans(tree: pl.DataFrame, lo: int, hi: int) -> pl.DataFrame:
    """Each path's host time, disjoint per path, clipped to the window, in start order. On one
    thread a path's ranges never overlap (a range cannot contain its own path), so only
    several threads need the union."""
    cols = tree.select("path_id", "start_ns", "end_ns")
    if tree.get_column("tid").n_unique() > 1:
        cols = iv.union(cols, by=["path_id"])
    return iv.clip(cols, lo, hi).sort("start_ns")


def _unlaunched_ns(ctx: Context) -> int:
    """GPU activity in the window that the launch join has no row for (no correlation)."""
    loose = ctx.gpu.select("start_ns", "end_ns", "correlation").filter(
        pl.col("correlation").is_null()
    )
    return int((loose.get_column("end_ns") - loose.get_column("start_ns")).sum() or 0)


def _idle_by_path(spans: pl.DataFrame, idle: IdleResult) -> pl.DataFrame:
    """Idle by cause inside each path's host time, summed over devices.

    A device's segments are disjoint, so the idle of cause c before instant t is C_c(t) =
    (c-time of the segments up to the one started last at t, that one included) - (the part of
    that one after t, if t is inside it and it is of cause c), and a span's idle is
    C(end) - C(start): one as-of join per device, gathers of the running totals, and sums
    per path (few groups), for millions of spans."""
    names = [f"idle_{c}" for c in CAUSES]
    paths = spans.select("path_id").unique()
    segs = idle.segments
    if segs is None or segs.height == 0 or spans.height == 0:
        return paths.with_columns([pl.lit(0, pl.Int64).alias(n) for n in names])
    points = [
        spans.select("path_id", pl.col("start_ns").alias("t"), pl.lit(-1).alias("sign")),
        spans.select("path_id", pl.col("end_ns").alias("t"), pl.lit(1).alias("sign")).sort("t"),
    ]
    parts = []
    for _dev, part in segs.partition_by("device", as_dict=True).items():
        part = part.sort("start_ns").with_row_index("g")
        length = pl.col("end_ns") - pl.col("start_ns")
        # the causes the device's segments have (a few of the 13: each running total is a
        # pass over hundreds of thousands of segments on a 1 GB export); the others sum to 0
        present = set(part.get_column("cause").unique().to_list())
        causes = [(c, n) for c, n in zip(CAUSES, names, strict=True) if c in present]
        through = part.select(  # c-time of the segments up to and including each
            "g",
            *[
                pl.when(pl.col("cause") == c).then(length).otherwise(0).cum_sum().alias(n)
                for c, n in causes
            ],
        )
        right = part.select(
            pl.col("start_ns").alias("ls").set_sorted(), pl.col("end_ns").alias("le"), "g", "cause"
        )
        hits = pl.concat(
            [
                pt.with_columns(pl.col("t").set_sorted())
                .join_asof(right, left_on="t", right_on="ls", strategy="backward")
                .filter(pl.col("g").is_not_null())
                for pt in points
            ]
        )
        g = hits.get_column("g")
        whole = (
            hits.select(
                "path_id",
                *[(pl.col("sign") * through.get_column(n).gather(g)).alias(n) for _, n in causes],
            )
            .group_by("path_id")
            .agg(pl.col([n for _, n in causes]).sum())
        )
        # an instant inside its segment has only the part up to it: take back the rest
        inside = (pl.col("t") - pl.col("le")) * pl.col("sign")
        partial = (
            hits.filter(pl.col("t") < pl.col("le"))
            .group_by("path_id")
            .agg([inside.filter(pl.col("cause") == c).sum().alias(n) for c, n in causes])
        )
        parts += [whole, partial]
    both = pl.concat(parts, how="diagonal_relaxed")
    both = (
        both.with_columns(pl.lit(0, pl.Int64).alias(n) for n in names if n not in both.columns)
        .group_by("path_id")
        .agg(pl.col(names).sum())
    )
    return paths.join(both, on="path_id", how="left").with_columns(pl.col(names).fill_null(0))


def _busy_ns(owned: pl.DataFrame, chains: pl.DataFrame, ordered: pl.DataFrame) -> dict[int, int]:
    """For the :data:`BUSY_REGIONS` regions with the most GPU time: the time the GPU was busy
    with work launched inside them (the union of its intervals). ``gpu_ns`` sums durations, so
    work on concurrent streams counts once per stream: a DeepSeek step's pipeline range read
    206.71 ms of GPU time in a 129.54 ms step (audit 5). Only the few regions a summary names:
    a union per region over every level of the tree would sort the launches once per level."""
    ids = ordered.head(BUSY_REGIONS).get_column("path_id")
    if ids.len() == 0 or owned.height == 0:
        return {}
    rows = owned.select("self_id", "start_ns", "end_ns").join(
        chains.filter(pl.col("path_id").is_in(ids.implode())), on="self_id"
    )
    merged = iv.union(rows.select("path_id", "start_ns", "end_ns"), by=["path_id"])
    out = merged.group_by("path_id").agg((pl.col("end_ns") - pl.col("start_ns")).sum())
    return dict(out.iter_rows())


def _region_json(r: dict[str, Any], steps: int, busy: dict[int, int]) -> dict[str, Any]:
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
        # the union of that work (BUSY_REGIONS regions only, else null): at most the wall time
        "gpu_busy_ns": busy.get(r["path_id"]),
        "idle_ns": sum(by_cause.values()),
        "idle_by_cause_ns": by_cause,
        "kernel_classes_ns": {c["kernel_class"]: int(c["gpu_ns"]) for c in classes},
        "findings": [],
    }


def with_findings(result: RegionResult, findings: Iterable[Any]) -> RegionResult:
    """The regions with the ids of the findings whose evidence segments (``top_segments``:
    start_ns/end_ns) overlap their host time."""
    spans, paths = result.ranges, result.paths
    if spans is None or paths is None or spans.height == 0 or not result.regions:
        return result
    hits: dict[str, list[str]] = {}
    for f in findings:
        segs = [
            s for s in (f.evidence or {}).get("top_segments") or [] if isinstance(s, IdleSegment)
        ]
        if not segs:
            continue
        # a few segments: one scan of the spans for all of them
        overlaps = pl.any_horizontal(
            [(pl.col("start_ns") < s.end_ns) & (pl.col("end_ns") > s.start_ns) for s in segs]
        )
        ids = spans.filter(overlaps).get_column("path_id").unique()
        for path in paths.filter(pl.col("path_id").is_in(ids.implode())).get_column("path"):
            hits.setdefault(path, []).append(f.id)
    if not hits:
        return result
    regions = tuple(dict(r, findings=hits.get(r["path"], [])) for r in result.regions)
    return replace(result, regions=regions)
