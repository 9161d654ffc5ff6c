"""Launch statistics: launch calls per step, CPU launch cost vs GPU kernel time, queue depth."""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from traceinsight.analyzers.context import Context, host_ranges, shaped_ops
from traceinsight.analyzers.optimizer import OPTIMIZER_PATTERN
from traceinsight.causal.graph import chain_ends
from traceinsight.model import intervals as iv
from traceinsight.model.classify import API_KINDS, DATALOADER_PATTERN, LAUNCH_API, names_matching

# A launch call longer than this is not launch overhead: a first launch that loads the module
# (lazy loading: awsgpu_report2's only cudaLaunchKernel, 39.2 ms, with its 35.6 ms kernel inside
# it), or one blocked on a full queue. Its kernel has no measured launch cost and stays out of
# short_kernel_ratio (warm launches take 2-20 us).
LAUNCH_MEASURED_MAX_NS = 1_000_000
# Shapes are compared over the window's first steps (a CUDA graph replays one step's shapes)
SHAPE_STEPS = 8


@dataclass(frozen=True)
class ShapeChange:
    """Torch ops called as often in every compared step whose k-th call's recorded input shapes
    differ from the first step's k-th call (outside data loading): a CUDA graph, torch.compile's
    reduce-overhead mode included, replays fixed shapes, so each new shape is another capture
    (or, with torch 2.11 on a sentence-transformers loop, a crash)."""

    steps: int  # steps compared
    ops: int  # distinct op names whose shapes changed
    op: str  # the one that changed most often
    input_dims: tuple[str, ...]  # its first change: the first step's shapes, then the later


# The steps run different paths where the torch ops whose count per step varies make up at
# least this share of a step's ops (a module skipped at random, a data-dependent branch): one
# CUDA graph replays one path. Measured on the held-out wav2vec2 loop (LayerDrop 0.1 over 12
# layers: 7-22% of a step's ops, 0.0-2.1% on the other nine loops' steps), where
# torch.compile(mode="reduce-overhead") after padding to fixed shapes ran 0.22-0.27x
# (LayerDrop's torch.rand(1).item() broke the graph at every layer and the CUDA graph trees
# re-recorded each new path).
PATH_CHANGE_MIN_RATIO = 0.05
# Torch ops whose output size depends on the data: each reads the GPU for the size (a sync), and
# neither a CUDA graph nor one compiled graph can hold it.
DATA_SIZED_OPS = r"^aten::(nonzero|masked_select|_unique2?|unique_dim|unique_consecutive)$"
# At this many a step (outside data loading and the optimizer) they are the model's own sampling
# or filtering, not a loop's few metric reads: torchvision's Faster R-CNN ran 45 a step (its
# region proposals and box heads, per image and per feature level), the loops of
# fixtures/h200/pairs that select with masks 2 (removed by their own fix).
DATA_SIZED_MIN_PER_STEP = 8
# Recurrent modules: torch.compile does not trace nn.LSTM / GRU / RNN (the
# torch._dynamo.config.allow_rnn default), so reduce-overhead leaves them eager between graph
# breaks (pytorch/examples' word-level LSTM: 0.82-0.83x; the whole step captured by hand with
# torch.cuda.graph 2.32-2.67x).
RNN_OPS = r"^aten::(lstm|gru|rnn_tanh|rnn_relu)$"


@dataclass(frozen=True)
class PathChange:
    """Torch ops whose number of calls differs between the compared steps (outside data
    loading): the step's path varies, so a CUDA graph captured on one step does not replay the
    next. ``ratio``: the calls that differ (each op's most calls in a step less its fewest,
    summed) over a step's calls (the mean); ``op``, one in every step that varies most for its
    count, from ``calls[0]`` to ``calls[1]`` a step."""

    steps: int
    ratio: float
    op: str
    calls: tuple[int, int]


@dataclass(frozen=True)
class DataSizedOps:
    """:data:`DATA_SIZED_OPS` the steps run (outside data loading and the optimizer):
    ``per_step`` calls a step, ``op`` the most called of them."""

    per_step: float
    op: str
    op_per_step: float


@dataclass(frozen=True)
class LaunchResult:
    launch_calls: int
    launch_calls_per_step: float | None
    launch_call_median_ns: float | None
    kernel_median_ns: float | None
    # kernels shorter than their own launch call, among those whose launch call was measured
    # (at most LAUNCH_MEASURED_MAX_NS); None without any
    short_kernel_ratio: float | None
    queue_delay_median_ns: float | None  # kernel start - launch call end
    queue_depth_median: float | None  # kernels launched but not yet started, at each launch
    graph_launches: int
    graph_kernels: int
    shape_change: ShapeChange | None = None  # None: the same shapes each step, or not recorded
    path_change: PathChange | None = None  # None: the same ops each step, or no shapes recorded
    # None: fewer than DATA_SIZED_MIN_PER_STEP a step (or no steps)
    data_sized: DataSizedOps | None = None
    # the recurrent module op the window's steps call most (:data:`RNN_OPS`), None without one
    rnn_op: str | None = None
    # torch.compile's compiled regions (its "Torch-Compiled Region: F/R" ranges) called in the
    # window, and the distinct frames F among them: a step that compiled whole calls one or two
    # a step; many are graph breaks (or recompiles), each piece its own Python call and graph
    compiled_regions: int = 0
    compiled_frames: int = 0
    steps: int = 0  # the window's steps (0: none marked), for the counts a step
    # without steps (no step model): the share of a GPU-time saving the window's end keeps
    # (:func:`gpu_timeline_saving_ratio`); None with steps or without GPU work
    gpu_timeline_saving_ratio: float | None = None


def analyze_launch(ctx: Context) -> LaunchResult:
    lo, hi = ctx.window_start_ns, ctx.window_end_ns
    in_window = pl.col("start_ns").is_between(lo, hi)
    calls = ctx.rows(API_KINDS, LAUNCH_API, where=in_window, columns=("dur_ns",))
    kl = (
        ctx.launches.lazy()
        .filter((pl.col("kind") == "kernel") & pl.col("launch_start_ns").is_not_null() & in_window)
        .select(
            "launch_name",
            "correlation",
            "device",
            "start_ns",
            "dur_ns",
            "launch_start_ns",
            "launch_end_ns",
        )
        .collect()
        .with_columns(
            (pl.col("launch_end_ns") - pl.col("launch_start_ns")).alias("launch_ns"),
            (pl.col("start_ns") - pl.col("launch_end_ns")).alias("queue_ns"),
        )
    )
    names = kl.get_column("launch_name").unique()  # matched once per distinct API name, for both
    graph = names_matching(kl, "GraphLaunch", col="launch_name", names=names)
    steps = ctx.steps.height
    if kl.height == 0:
        return LaunchResult(
            calls.height,
            calls.height / steps if steps else None,
            None,
            None,
            None,
            None,
            None,
            0,
            0,
        )
    shapes, path = _step_changes(ctx)
    direct = names_matching(kl, "GraphLaunch", col="launch_name", negate=True, names=names)
    depth = _queue_depth(direct) if direct.height else None
    return LaunchResult(
        launch_calls=calls.height,
        launch_calls_per_step=calls.height / steps if steps else None,
        launch_call_median_ns=float(calls["dur_ns"].median()) if calls.height else None,
        kernel_median_ns=float(kl["dur_ns"].median()),
        short_kernel_ratio=_short_kernel_ratio(direct),
        queue_delay_median_ns=float(direct["queue_ns"].median()) if direct.height else None,
        queue_depth_median=depth,
        graph_launches=graph["correlation"].n_unique() if graph.height else 0,
        graph_kernels=graph.height,
        shape_change=shapes,
        path_change=path,
        data_sized=_data_sized(ctx),
        rnn_op=_rnn_op(ctx),
        steps=steps,
        gpu_timeline_saving_ratio=None if steps else gpu_timeline_saving_ratio(ctx),
        **_compiled_regions(ctx),
    )


# An op whose launch is not in the trace started this soon after its stream predecessor ended
# was queued behind it (back-to-back kernels start 1.0-1.5 us apart at the median, p90 1.5-2.2
# us, on ten H200 recordings, session 46)
QUEUED_GAP_NS = 2_500
# the GPU-time scale the timeline is replayed at (a saving of half the GPU's work)
TIMELINE_SCALE = 0.5


def gpu_timeline_saving_ratio(ctx: Context) -> float | None:
    """How much sooner the window's GPU work ends, per unit of GPU time saved, with every GPU
    op at :data:`TIMELINE_SCALE` of its time and the host as recorded: each op starts at the
    later of its stream predecessor's (replayed) end and when it became ready. An op whose
    launch call began before its predecessor ended was queued: ready at its launch call's end;
    one launched later waited for the host: ready at its recorded start. 1 where the GPU bounds
    the window (a queue that never drains), 0 where the host does (each kernel starts at its
    launch): what a change that shortens kernels saves where no step model prices it (audit 68:
    a launch-bound T4 window with 14.8% of its time in fp32 math ends 0.0% sooner with that
    math halved). Streams are replayed apart (a wait on another stream is its recorded start).
    None without GPU work in the window."""
    lo, hi = ctx.window_start_ns, ctx.window_end_ns
    ops = (
        ctx.launches.lazy()
        .filter(
            pl.col("kind").is_in(["kernel", "memcpy", "memset"])
            & pl.col("start_ns").is_between(lo, hi)
            & (pl.col("dur_ns") >= 0)
        )
        # one chain a stream, in start order (a stream's id is a small integer)
        .with_columns(
            (pl.col("device").cast(pl.Int64) * (1 << 32) + pl.col("stream").fill_null(-1)).alias(
                "chain"
            ),
            (pl.col("dur_ns") * TIMELINE_SCALE).round().cast(pl.Int64).alias("dur"),
        )
        .collect()
    )
    # in order already where one stream's rows come sorted (no multi-key sort then)
    ops = (
        iv.sort_keys(ops, ["chain", "start_ns"])
        .lazy()
        .with_columns(
            # the stream predecessor's end (sorted by chain: no per-chain window)
            pl.when(pl.col("chain") == pl.col("chain").shift(1))
            .then(pl.col("end_ns").shift(1))
            .alias("_prev_end")
        )
        .with_columns(
            # queued: ready at its launch call's end, or (no launch recorded) whenever its
            # predecessor is done; else at its recorded start
            pl.when(
                pl.when(pl.col("launch_start_ns").is_not_null())
                .then(pl.col("launch_start_ns") < pl.col("_prev_end"))
                .otherwise(pl.col("start_ns") - pl.col("_prev_end") <= QUEUED_GAP_NS)
                .fill_null(False)
            )
            .then(pl.min_horizontal("launch_end_ns", "start_ns").fill_null(pl.lit(-(2**62))))
            .otherwise(pl.col("start_ns"))
            .alias("anchor")
        )
        .select(
            "chain",
            "device",
            "end_ns",
            "dur_ns",
            "dur",
            "anchor",
            pl.lit(0, pl.Int64).alias("gap"),
            (pl.col("anchor") + pl.col("dur")).alias("floor"),
        )
        .collect()
    )
    if ops.height == 0:
        return None
    # the step model's chain recurrence: end_i = max(end_{i-1}, ready_i) + dur_i
    replayed = ops.with_columns(chain_ends(ops, "chain").get_column("end").alias("_end"))
    per_device = replayed.group_by("device").agg(
        (pl.col("end_ns").max() - pl.col("_end").max()).alias("saved_ns"),
        (pl.col("dur_ns") - pl.col("dur")).sum().alias("less_ns"),
    )
    less = float(per_device.get_column("less_ns").sum())
    if less <= 0:
        return None
    return min(1.0, max(0.0, float(per_device.get_column("saved_ns").sum()) / less))


# torch.compile's range around each call of a compiled frame: "Torch-Compiled Region: F/R"
# (F the frame, R its recompile)
COMPILED_REGION = r"^Torch-Compiled Region: \d+/\d+"


def _compiled_regions(ctx: Context) -> dict[str, int]:
    """The window's compiled-region calls and their distinct frames (:data:`COMPILED_REGION`)."""
    lo, hi = ctx.window_start_ns, ctx.window_end_ns
    rows = ctx.rows(
        ("cpu_op", "user_annotation"),
        COMPILED_REGION,
        where=pl.col("start_ns").is_between(lo, hi),
        columns=("name",),
    )
    if rows.height == 0:
        return {}
    frames = rows.get_column("name").str.extract(r": (\d+)/").n_unique()
    return {"compiled_regions": rows.height, "compiled_frames": frames}


def _rnn_op(ctx: Context) -> str | None:
    """The :data:`RNN_OPS` op the window calls most (None: none)."""
    lo, hi = ctx.window_start_ns, ctx.window_end_ns
    ops = ctx.rows(
        ("cpu_op",), RNN_OPS, where=pl.col("start_ns").is_between(lo, hi), columns=("name",)
    )
    return _most_called(ops)[0] if ops.height else None


def _data_sized(ctx: Context) -> DataSizedOps | None:
    """:class:`DataSizedOps` in the window's steps, None under :data:`DATA_SIZED_MIN_PER_STEP`."""
    steps = ctx.steps.height
    if steps == 0:
        return None
    lo, hi = ctx.window_start_ns, ctx.window_end_ns
    ops = ctx.rows(
        ("cpu_op",),
        DATA_SIZED_OPS,
        where=pl.col("start_ns").is_between(lo, hi),
        columns=("name", "start_ns"),
    )
    if ops.height < DATA_SIZED_MIN_PER_STEP * steps:
        return None
    points = ops.select("start_ns", (pl.col("start_ns") + 1).alias("end_ns"))
    outside = pl.Series(
        (iv.overlap_with(points, host_ranges(ctx, DATALOADER_PATTERN).sort("start_ns")) == 0)
        & (iv.overlap_with(points, host_ranges(ctx, OPTIMIZER_PATTERN).sort("start_ns")) == 0)
    )
    ops = ops.filter(outside)
    if ops.height < DATA_SIZED_MIN_PER_STEP * steps:
        return None
    name, calls = _most_called(ops)
    return DataSizedOps(ops.height / steps, name, calls / steps)


def _most_called(ops: pl.DataFrame) -> tuple[str, int]:
    """The name ``ops`` (non-empty) holds most often, and how often (ties: the first name)."""
    top = ops.group_by("name").len().sort(["len", "name"], descending=[True, False]).row(0)
    return str(top[0]), int(top[1])


def _step_changes(ctx: Context) -> tuple[ShapeChange | None, PathChange | None]:
    """Torch ops whose recorded input shapes change between the window's first steps, call by
    call, outside the DataLoader's ranges (a loader may decode any shape it then resizes), and
    whether the steps run the same ops (:class:`PathChange`)."""
    if ctx.op_args.height == 0 or ctx.steps.height < 2:
        return None, None
    steps = ctx.steps.select("step", "host_start_ns", "host_end_ns").sort("host_start_ns")
    steps = steps.head(SHAPE_STEPS)
    lo, hi = int(steps["host_start_ns"].min()), int(steps["host_end_ns"].max())
    args = shaped_ops(ctx, lo, hi).select("start_ns", "name", "input_dims")
    if args.height == 0:
        return None, None
    # the ops that started outside the loader's ranges (a 1 ns span at each start); those in
    # the optimizer's step are left out of the path: gradient accumulation steps the optimizer
    # every few steps, and a graph of the other steps' work still replays
    starts = args.select("start_ns", (pl.col("start_ns") + 1).alias("end_ns"))
    loader = host_ranges(ctx, DATALOADER_PATTERN).sort("start_ns")
    stepping = host_ranges(ctx, OPTIMIZER_PATTERN).sort("start_ns")
    args = args.with_columns((iv.overlap_with(starts, stepping) > 0).alias("_stepping")).filter(
        iv.overlap_with(starts, loader) == 0
    )
    args = args.join_asof(steps, left_on="start_ns", right_on="host_start_ns").filter(
        pl.col("start_ns") < pl.col("host_end_ns")
    )
    n = args.get_column("step").n_unique()
    if n < 2:
        return None, None
    # ops called as often in every step (the same code ran: a sampled or filtered trace drops
    # calls at random, data-dependent code varies the count), the k-th call of one with a
    # shape the k-th call of the first step did not have
    args = args.with_columns(pl.int_range(pl.len()).over("name", "step").alias("_k"))
    counts = args.group_by("name", "step").agg(pl.len().alias("_n"))
    own = args.filter(~pl.col("_stepping"))
    path = _path_change(own.group_by("name", "step").agg(pl.len().alias("_n")), n, own.height)
    stable = (
        counts.group_by("name")
        .agg(pl.col("step").n_unique().alias("_steps"), pl.col("_n").n_unique().alias("_counts"))
        .filter((pl.col("_steps") == n) & (pl.col("_counts") == 1))
        .select("name")
    )
    first = args.filter(pl.col("step") == pl.col("step").min()).select(
        "name", "_k", pl.col("input_dims").alias("_first")
    )
    changed = (
        args.join(stable, on="name")
        .join(first, on=["name", "_k"])
        .filter(pl.col("input_dims") != pl.col("_first"))
    )
    if changed.height == 0:
        return None, path
    op = (
        changed.group_by("name")
        .agg(pl.len().alias("_n"), pl.col("start_ns").min().alias("_at"))
        .sort(["_n", "name"], descending=[True, False])
    )
    name = op.item(0, "name")
    at = changed.filter(pl.col("name") == name).sort("start_ns").row(0, named=True)
    return ShapeChange(
        steps=n,
        ops=op.height,
        op=name,
        input_dims=(at["_first"], at["input_dims"]),
    ), path


def _path_change(counts: pl.DataFrame, steps: int, calls: int) -> PathChange | None:
    """:class:`PathChange` from each op's calls per step (name, step, _n), None under
    PATH_CHANGE_MIN_RATIO. An op missing from a step has 0 calls there."""
    spread = (
        counts.group_by("name")
        .agg(
            pl.col("_n").max().alias("_most"),
            pl.when(pl.col("step").n_unique() == steps)
            .then(pl.col("_n").min())
            .otherwise(0)
            .alias("_fewest"),
        )
        .with_columns((pl.col("_most") - pl.col("_fewest")).alias("_d"))
        .sort(["_d", "name"], descending=[True, False])
    )
    ratio = float(spread.get_column("_d").sum()) / (calls / steps)
    if ratio < PATH_CHANGE_MIN_RATIO:
        return None
    # named by an op of every step whose count changes most for its size (a layer's ops: 12
    # attention calls against 10), not by the most frequent view
    every = spread.filter(pl.col("_fewest") > 0).sort(
        [pl.col("_d") / pl.col("_most"), pl.col("_d"), pl.col("name")],
        descending=[True, True, False],
    )
    top = (every if every.height else spread).row(0, named=True)
    return PathChange(steps, ratio, top["name"], (int(top["_fewest"]), int(top["_most"])))


def _short_kernel_ratio(direct: pl.DataFrame) -> float | None:
    measured = direct.filter(pl.col("launch_ns") <= LAUNCH_MEASURED_MAX_NS)
    if measured.height == 0:
        return None
    return float((measured["dur_ns"] < measured["launch_ns"]).mean())


def _queue_depth(kl: pl.DataFrame) -> float:
    """Median number of kernels waiting in the device queue at each launch (per device).

    depth(t) = #kernels whose launch call ended by t - #kernels started by t.
    """
    depths = []
    for dev in kl["device"].unique().to_list():
        d = kl.filter(pl.col("device") == dev)
        ends = d["launch_end_ns"].sort()
        starts = d["start_ns"].sort()
        t = d["launch_end_ns"]
        depth = ends.search_sorted(t, side="right").cast(pl.Int64) - starts.search_sorted(
            t, side="right"
        ).cast(pl.Int64)
        depths.append(depth.clip(0, None))
    return float(pl.concat(depths).median())
