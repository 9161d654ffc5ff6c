"""The step model built from a trace's tables: host calls per thread and GPU ops per stream,
their edges (launches, stream order, blocking calls and what they wait for, the autograd
thread's bursts joining the step thread's chain, cross-stream waits read off the times) and
the columns the transforms read (:data:`HOST_FLAGS`, :data:`GPU_FLAGS`).

:class:`ModelInputs` is what it reads: plain tables, gathered from the analysis context by the
replay analyzer (analyzers/replay.py), so the causal package depends on nothing above the model.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import polars as pl

from traceinsight.causal.columns import (
    CPU_ONLY_OP_MIN_NS,
    HOST_INPUT_OPS,
    RANGES,
    TENSOR_CORE_ALIGN_ELEMENTS,
    TRITON_LAUNCH_PATTERN,
)
from traceinsight.causal.graph import (
    NEG_NS,
    WAIT_DEVICE,
    WAIT_NONE,
    WAIT_OWN_OP,
    WAIT_QUEUE,
    StepModel,
    step_thread,
)
from traceinsight.causal.whatif import receive_ns
from traceinsight.model import intervals as iv
from traceinsight.model.classify import (
    ALLOCATOR_API,
    BLOCKING_COPY_API,
    IMPLICIT_SYNC_API,
    LAUNCH_API,
    LAYOUT_KERNELS,
    SYNC_API,
    is_channels_first_kernel,
    is_fp32_math,
    is_tf32_math,
    name_matches,
)
from traceinsight.model.flops import json_list, op_costs
from traceinsight.model.schema import empty_op_args

# A call counts as having waited only when it ended at or after what it waits for (within this).
WAITED_SLACK_NS = 2_000
OWN_COPY_SLACK_RATIO = 0.01  # ... or, for a copy call and its own copy, this share of the wait
# A call on a helper thread after this much idle time waited for the step's thread (the
# autograd engine's thread between backward() calls): it follows that thread's clock.
FOLLOW_GAP_NS = 50_000
DEFAULT_LAUNCH_LATENCY_NS = 3_000  # launch start -> earliest GPU start when the trace gives none
# The most steps the model replays (see modelled_steps): the median of 8 consecutive steps
# is the trace's median within 1% on the corpus traces with steps and the H200 fixtures.
MODEL_STEPS = 8
# A launch's latency is a few us (H200 fixtures: 3-10 us profiled); more than this after the
# launch, an op started late because it was queued, which stream order explains.
MAX_LAUNCH_LATENCY_NS = 50_000
CROSS_STREAM_LAG_NS = 5_000  # an op this soon after another stream's op ended waited for it
# ... or, after a long wait, this share of it (at most the cap): a profiled event wait returns
# 2-6 us after the op it waits for (a 7.5 ms wait on the H200 comm pair: 4.8-5.1 us); a wait
# that ends within 1% of its length after another stream's op is that op's
CROSS_STREAM_LAG_RATIO = 0.01
CROSS_STREAM_LAG_MAX_NS = 50_000
# A stream whose ops overlapped the device's other streams' for at most this share of its time
# never ran beside them (timestamps jitter by a few hundred ns); past this many streams on a
# trace, each is taken as running beside the others (a comparison per stream)
ALONE_OVERLAP_MAX_RATIO = 0.02
ALONE_CHAINS_MAX = 64
# A call that does not wait for anything yet takes this long was blocked (a full launch queue
# when a GPU op ended inside it): profiled launches take 5-20 us on the H200 fixtures.
QUEUE_BLOCK_NS = 100_000
# A per-parameter (foreach=False) Adam or AdamW step captured in a CUDA graph must be
# capturable=True, which moves the bias corrections and step size from Python floats onto the
# device: per parameter the step count's increment, two powers, two subtractions, the step size,
# its negation, a square root and the denominator's extra math, each a kernel on a 0-dim tensor.
# Counted on the H200 launch-bound recording (torch 2.11): 22 kernels a parameter captured
# against 8 eager (3,124 against 1,136 for 142 parameters); the fused and foreach forms add a
# few launches per step, not per parameter.
CAPTURABLE_ADAM_EXTRA_KERNELS = 14
# one per parameter in a per-parameter Adam(W) step (its last update, param.addcdiv_)
_ADAM_PARAM_KERNEL = "addcdiv"
_ADAM_STEP = r"#(Adam|AdamW)\.step"
_MULTI_TENSOR_KERNEL = r"multi_tensor|fused|foreach"
# The torch ops that run a matmul, a convolution, attention or a cuDNN RNN: autocast casts
# their fp32 operands to 16 bits. Nested forms (aten::linear -> aten::addmm) resolve to the
# innermost, the latest-started op around a launch.
# The ops whose recorded shapes give the bytes of a layer channels_last changes
# (``channels_last_ns``; the kernels: model/classify.py): a convolution's forward
# (aten::_convolution, around ATen's _conv_depthwise2d) and backward, batch norm's forward and
# backward
CHANNELS_LAST_OPS = (
    r"^aten::(_convolution|convolution|convolution_backward|cudnn_batch_norm"
    r"|cudnn_batch_norm_backward)$"
)
# Training batch norm passes over its input twice, the statistics before the normalization:
# the forward reads x twice and writes y (3 tensors where its op's shapes give 2), the
# backward reads x and dy twice and writes dx (5 where they give 3)
BATCH_NORM_PASSES = {"aten::cudnn_batch_norm": 3 / 2, "aten::cudnn_batch_norm_backward": 5 / 3}
# cuDNN's NHWC batch norm moves those bytes at this share of the device's peak bandwidth
# (measured on the H200: forward and backward together, 21 shapes of BatchNorm2d and 3d with
# channels a multiple of 4, median 0.69, 0.37-0.86, lower under ~40 MB; a 2 GiB copy: 0.88)
NHWC_BATCH_NORM_BANDWIDTH_RATIO = 0.7
# Channels that are a multiple of this many elements (fp32; 16-bit: twice) let cuDNN's NHWC
# kernels load vectors; other counts run its scalar batch norm at 0.2-0.3 of peak, slower
# than NCHW (C=230: 1968 against 844 us), and pad the convolutions' tensors
# (nhwcAddPaddingKernel, 3.18 ms a step on R(2+1)D-18's 45-, 230- and 921-channel layers)
# where channels-first ran cuDNN's transposes
NHWC_CHANNEL_ALIGN = 4
_CONV_FORWARD = r"^aten::(_convolution|convolution)$"
MATH_OP_PATTERN = (
    r"^aten::(mm|addmm|bmm|baddbmm|addbmm|addmv|mv|matmul|linear|_cudnn_rnn|_cudnn_rnn_backward"
    r"|cudnn_convolution|cudnn_convolution_transpose|convolution_backward|_convolution"
    r"|_efficient_attention_forward|_efficient_attention_backward|_flash_attention_forward"
    r"|_flash_attention_backward|_scaled_dot_product_\w+)$"
)
# The matmuls whose 16-bit form needs every leading dimension a multiple of 8 elements (16
# bytes) for cuBLAS's fastest tensor-core kernels; otherwise it runs kernels that load 2 or 4
# elements at a time, or one (GPT-2's 50,257-wide head on the H200: cutlass_75 s1688 align1,
# 1.9-2.6x faster than fp32, not the peaks' 14.8x; BERT's 30,522: s16816 align2, 4.7x)
_MATMUL_ARGS = r"^aten::(mm|addmm|bmm|baddbmm|addbmm|matmul|linear)$"


@dataclass(frozen=True)
class ModelInputs:
    """What the step model is built from (tables of the analysis window; see analyzers/context.py
    for their columns): the window's steps, its bounds, the runtime/driver calls, the GPU ops
    joined to their launches, the host ops and annotations, the Python frames, and the host
    ranges of :data:`RANGES` (tid, start_ns, end_ns) by name."""

    steps: pl.DataFrame
    window_start_ns: int
    window_end_ns: int
    has_gpu: bool
    calls: pl.DataFrame
    launches: pl.DataFrame
    ops: pl.DataFrame
    python_frames: pl.DataFrame
    ranges: Mapping[str, pl.DataFrame]
    # device -> (fp32 peak, TF32 peak) over its 16-bit tensor peak, from the device spec table
    # (None where the table lacks the device or a figure): the bf16 transform's time scales
    time_ratios: Mapping[int, tuple[float | None, float | None]] = field(default_factory=dict)
    # tensors a DataLoader batch carries (analyzers/steps.py batch_tensors; None: no loader):
    # what receiving one batch from workers costs the step thread (whatif.receive_ns)
    batch_tensors: float | None = None
    # the host ops' recorded arguments (model/schema.py OP_ARGS_SCHEMA; empty without
    # record_shapes): the matmuls' shapes, for the bf16 transform's alignment
    op_args: pl.DataFrame = field(default_factory=empty_op_args)
    # device -> its memory bandwidth (bytes/s, the device spec table): channels_last's
    # depthwise kernels are priced at it
    memory_bandwidths: Mapping[int, float] = field(default_factory=dict)
    # device -> a pinned host-to-device copy's rate over its host link (bytes/s, the device
    # spec table): the pinned-copy what-ifs' rate where the trace has no pinned copies of its own
    host_links: Mapping[int, float] = field(default_factory=dict)
    # devices whose SDPA runs cuDNN's attention in 16 bits (model/devices.py
    # cudnn_sdpa_in_16bit): the bf16 transform adds its graph builds per new shape
    cudnn_sdpa_devices: tuple[int, ...] = ()

    @property
    def loader_receive_ns(self) -> int:
        return receive_ns(self.batch_tensors)

    def __post_init__(self) -> None:
        if set(self.ranges) != set(RANGES):
            raise ValueError(f"ModelInputs.ranges needs {RANGES}, got {sorted(self.ranges)}")


def _coverage(ranges: pl.DataFrame, t: pl.Series) -> pl.DataFrame:
    """For each time ``t``: ``before`` (the ranges' union time before it) and ``inside``."""
    return _covered(iv.union(ranges.select("start_ns", "end_ns")) if ranges.height else None, t)


def _covered(u: pl.DataFrame | None, t: pl.Series) -> pl.DataFrame:
    """:func:`_coverage` on a union already made (start_ns, end_ns; None: nothing)."""
    if u is None or u.height == 0:
        return pl.DataFrame(
            {
                "before": pl.repeat(0, t.len(), dtype=pl.Int64, eager=True),
                "inside": pl.repeat(False, t.len(), eager=True),
            }
        )
    u = (
        u.sort("start_ns")
        .with_columns((pl.col("end_ns") - pl.col("start_ns")).alias("_len"))
        .with_columns((pl.col("_len").cum_sum() - pl.col("_len")).alias("_cum"))
    )
    return (
        pl.DataFrame({"t": t.cast(pl.Int64)})
        .with_row_index("_i")
        .sort("t")
        .join_asof(u, left_on="t", right_on="start_ns")
        .sort("_i")
        .select(
            (pl.col("_cum") + (pl.col("t") - pl.col("start_ns")).clip(0, pl.col("_len")))
            .fill_null(0)
            .alias("before"),
            (pl.col("t") < pl.col("end_ns")).fill_null(False).alias("inside"),
        )
    )


# More steps than this: the first is warm-up (the allocator's cache filling, optimizer state
# created) and left out of the steady ones.
WARMUP_DROP_MIN_STEPS = 4
# A last step that launched no GPU work and took under this share of a working step's host time
# is a marker the profiler opened just before it stopped, not a step.
STUB_MAX_RATIO = 0.1


def without_trailing_stubs(steps: pl.DataFrame) -> pl.DataFrame:
    """The steps in time order, less the last ones that launched no GPU work while earlier ones
    did and took under :data:`STUB_MAX_RATIO` of a working step's host time (the profiler's
    marker opened just before it stopped)."""
    key = "host_start_ns" if "host_start_ns" in steps.columns else "start_ns"
    steps = steps.sort(key)
    if "launches" in steps.columns and steps.height > 1:
        worked = steps.get_column("launches") > 0
        if worked.any():
            host_ns = steps.get_column("host_end_ns") - steps.get_column("host_start_ns")
            typical = float(host_ns.filter(worked).median() or 0)
            stub = ~worked & (host_ns < STUB_MAX_RATIO * typical)
            # the trailing run of stubs (a step with no launch recorded but the host busy in
            # it, where launches lack correlation ids, is a step)
            keep = steps.height - int(stub.reverse().cum_min().sum())
            steps = steps.slice(0, keep)
    return steps


def steady_steps(steps: pl.DataFrame) -> pl.DataFrame:
    """The window's steady steps, the one notion every per-step number uses (the memory
    analyzer's, the step model's): all but the first where there are
    :data:`WARMUP_DROP_MIN_STEPS` or more (the first carries warm-up), else all; never the
    last steps where they launched no GPU work while earlier ones did and were short
    (:data:`STUB_MAX_RATIO`: the profiler stopped just after opening a step, a marker with
    nothing in it, which a median of few steps would halve)."""
    steps = without_trailing_stubs(steps)
    if steps.height < WARMUP_DROP_MIN_STEPS:
        return steps
    return steps.slice(1)


def modelled_steps(steps: pl.DataFrame) -> pl.DataFrame:
    """The steps the model replays: the steady steps (:func:`steady_steps`), at most
    :data:`MODEL_STEPS` consecutive ones from their middle (the replay's rounds grow with the
    blocking calls it holds, so a long capture costs no more than a short one)."""
    st = steady_steps(steps)
    if st.height <= MODEL_STEPS:
        return st
    key = "host_start_ns" if "host_start_ns" in st.columns else "start_ns"
    return st.sort(key).slice((st.height - MODEL_STEPS) // 2, MODEL_STEPS)


def build_model(src: ModelInputs) -> StepModel | None:
    """The nodes and edges of the window's steps (None without steps or GPU work)."""
    if src.steps.height == 0 or not src.has_gpu:
        return None
    st = modelled_steps(src.steps)
    if st.height < src.steps.height:  # a sample of the steps: just their span
        lo = int(st["host_start_ns"].min())
        hi = int(max(st["end_ns"].max(), st["host_end_ns"].max()))
    else:
        lo = int(min(st["host_start_ns"].min(), src.window_start_ns))
        hi = src.window_end_ns
    # Host nodes: the outermost runtime/driver call per thread (a driver call inside a runtime
    # call is part of it).
    host = (
        src.calls.filter(iv.overlapping(lo, hi) & pl.col("tid").is_not_null())
        .select("name", "start_ns", "end_ns", "tid")
        .sort("tid", "start_ns")
        .with_columns(pl.col("end_ns").cum_max().shift(1).over("tid").alias("_prev_max"))
        .filter(pl.col("_prev_max").is_null() | (pl.col("start_ns") >= pl.col("_prev_max")))
        .with_columns(
            (pl.col("start_ns") - pl.col("end_ns").shift(1).over("tid"))
            .fill_null(0)
            .clip(0)
            .alias("gap_ns"),
            (pl.col("end_ns").shift(1).over("tid"))
            .fill_null(pl.col("start_ns"))
            .alias("_gap_from"),
        )
        .drop("_prev_max")
        .with_row_index("node")
    )
    if host.height == 0:
        return None
    gpu = (
        src.launches.lazy()
        .filter(iv.overlapping(lo, hi))
        .select(
            "kind",
            "name",
            "start_ns",
            "end_ns",
            "dur_ns",
            "device",
            "stream",
            "kernel_class",
            "copy_kind",
            "src_kind",
            "dst_kind",
            "bytes",
            "launch_name",
            "launch_start_ns",
            "launch_end_ns",
            "launch_tid",
        )
        .collect()
        .with_columns(
            pl.struct(pl.col("device").fill_null(-1), pl.col("stream").fill_null(-1))
            .rank("dense")
            .cast(pl.Int64)
            .alias("chain")
        )
        .sort("chain", "start_ns")
    )
    # launch -> GPU op: the outer host node holding the launching call (asof on its thread)
    nodes = host.select(
        pl.col("node").cast(pl.Int64).alias("launch"),
        pl.col("tid").alias("launch_tid"),
        pl.col("start_ns").alias("_node_start"),
        pl.col("end_ns").alias("_node_end"),
    ).sort("_node_start")
    gpu = (
        gpu.with_row_index("_row")
        .sort("launch_start_ns")
        .join_asof(
            nodes,
            left_on="launch_start_ns",
            right_on="_node_start",
            by="launch_tid",
            strategy="backward",
            check_sortedness=False,
        )
        .with_columns(
            pl.when(
                pl.col("launch_start_ns").is_not_null()
                & (pl.col("launch_start_ns") <= pl.col("_node_end"))
            )
            .then(pl.col("launch"))
            .otherwise(-1)
            .alias("launch")
        )
        .sort("_row")
        .drop("_row")
    )
    since = pl.col("start_ns") - pl.col("launch_start_ns")
    prev_end = pl.col("end_ns").shift(1).over("chain")
    launch_bound = gpu.filter((pl.col("launch") >= 0) & (pl.col("start_ns") > prev_end + 2_000))
    lat = launch_bound.select(since.quantile(0.25)).item() if launch_bound.height else None
    # ops that waited long after their launch were queued behind others, not slow to launch
    latency_ns = (
        min(int(lat), MAX_LAUNCH_LATENCY_NS)
        if lat is not None and lat > 0
        else DEFAULT_LAUNCH_LATENCY_NS
    )
    bound = pl.col("launch") >= 0
    gpu = gpu.with_columns(
        pl.when(bound)
        .then(pl.col("launch_start_ns") - pl.col("_node_start"))
        .otherwise(0)
        .alias("launch_offset_ns"),
        pl.when(bound).then(since.clip(0, latency_ns)).otherwise(0).alias("latency_ns"),
        pl.col("launch_start_ns").is_not_null().alias("launched"),
        pl.coalesce("launch_start_ns", "start_ns").alias("launch_key_ns"),
    ).with_columns(
        pl.when(bound)
        .then(
            pl.col("start_ns")
            - pl.max_horizontal(
                prev_end.fill_null(NEG_NS),  # a chain's first op: its delay after the launch
                pl.col("launch_start_ns") + pl.col("latency_ns"),
            )
        )
        .otherwise(0)  # no launch: pinned at its own start (floor), so no gap on top
        .clip(0)
        .alias("gap_ns")
    )
    gpu = gpu.with_columns(pl.col("gap_ns").fill_null(0))
    gpu = _cross_stream_edges(gpu.drop("_node_start", "_node_end").with_row_index("op"))
    main_tid = step_thread(st)
    # each thread's first call in the window: its gap runs from the window's start (the step
    # thread's work before it, a first DataLoader wait; a helper thread idle since then, as
    # the autograd thread waits for backward(), follows the step thread like its later calls)
    first = pl.int_range(pl.len()).over("tid") == 0
    host = host.with_columns(
        pl.when(first).then((pl.col("start_ns") - lo).clip(0)).otherwise("gap_ns").alias("gap_ns"),
        pl.when(first).then(pl.lit(lo)).otherwise("_gap_from").alias("_gap_from"),
    )
    host = _follows(_queue_waits(_waits(host, gpu), gpu), main_tid)
    host = _joins(src, host, main_tid)
    host, gpu = _flags(src, host, gpu)
    host = host.with_columns(_recorded_events(src, host), _compiled_launches(src, host))
    steps = st.select("tid", "host_start_ns", "host_end_ns")
    return StepModel(host=host, gpu=gpu, steps=steps)


def _follows(host: pl.DataFrame, main_tid: int) -> pl.DataFrame:
    """``follows_main``: a call on another thread that waited for the step thread: idle for
    over :data:`FOLLOW_GAP_NS` while the step thread made calls (the autograd engine's thread
    starting a ``backward()``). Gaps inside its own burst, where the step thread made none,
    are the helper's own work and stay in its chain."""
    main_ends = host.filter(pl.col("tid") == main_tid).get_column("end_ns").sort()
    start = host.get_column("start_ns")
    during = main_ends.search_sorted(start) - main_ends.search_sorted(start - host["gap_ns"])
    return host.with_columns(
        (
            (pl.col("tid") != main_tid)
            & (pl.col("gap_ns") > FOLLOW_GAP_NS)
            & (during.cast(pl.Int64) > 0)
        ).alias("follows_main")
    )


def _joins(src: ModelInputs, host: pl.DataFrame, main_tid: int) -> pl.DataFrame:
    """The step thread blocked on another thread: a gap of the step thread that holds a burst
    of another thread's calls, the first of them woken up by the step thread
    (``follows_main``: the autograd engine running ``backward()``), while the step thread
    recorded nothing. The burst joins the step thread's chain (``chain_tid``): the step
    thread resumes when the burst ends, so a faster backward moves the step (as a fixed gap
    it would not). Each call's gap becomes the time since the one before it in that chain."""
    host = host.with_columns(pl.col("tid").alias("chain_tid"))
    helpers = host.filter(pl.col("tid") != main_tid)
    if helpers.height == 0 or not helpers.get_column("follows_main").any():
        return host
    mains = (
        host.filter(pl.col("tid") == main_tid)
        .select("node", "start_ns", (pl.col("start_ns") - pl.col("gap_ns")).alias("_from"))
        .sort("_from")
    )
    inside = (
        helpers.select("node", "tid", "start_ns", "end_ns", "follows_main")
        .sort("start_ns")
        .join_asof(
            mains.select(pl.col("node").alias("_main"), "_from", pl.col("start_ns").alias("_to")),
            left_on="start_ns",
            right_on="_from",
        )
        .filter(pl.col("end_ns") <= pl.col("_to"))
    )
    bursts = inside.group_by("_main", "tid").agg(
        pl.col("follows_main").sort_by("start_ns").first().alias("_woke"),
        pl.col("start_ns").min().alias("b_start"),
        pl.col("end_ns").max().alias("b_end"),
        pl.len().alias("_calls"),
    )
    # one woken thread per gap: of several (the autograd engine's burst and a DataLoader's
    # pin-memory thread's call or two), the one with the most calls (then the longest); and
    # the step thread recorded nothing while it ran
    bursts = (
        bursts.filter(pl.col("_woke"))
        .sort("_main", "_calls", pl.col("b_end") - pl.col("b_start"), "tid", descending=True)
        .unique("_main", keep="first", maintain_order=True)
    )
    own = src.ops.filter(pl.col("tid") == main_tid).get_column("start_ns").sort()
    busy = own.search_sorted(bursts.get_column("b_end")) - own.search_sorted(
        bursts.get_column("b_start"), side="right"
    )
    bursts = bursts.filter(busy.cast(pl.Int64) == 0)
    if bursts.height == 0:
        return host
    merged = inside.join(bursts.select("_main", "tid"), on=["_main", "tid"]).get_column("node")
    in_burst = pl.col("node").is_in(merged.implode()) | (pl.col("tid") == main_tid)
    chained = (
        host.with_columns(
            pl.when(in_burst).then(pl.lit(main_tid)).otherwise(pl.col("tid")).alias("chain_tid")
        )
        .sort("chain_tid", "start_ns")
        .with_columns(
            pl.when(in_burst)
            .then(
                (pl.col("start_ns") - pl.col("end_ns").shift(1).over("chain_tid"))
                .fill_null(pl.col("gap_ns"))
                .clip(0)
            )
            .otherwise(pl.col("gap_ns"))
            .alias("gap_ns"),
            # a merged call follows the chain it is in, not the step thread's clock
            (pl.col("follows_main") & ~in_burst).alias("follows_main"),
        )
        .with_columns((pl.col("start_ns") - pl.col("gap_ns")).alias("_gap_from"))
    )
    return chained.sort("node")


def _starts_within(
    points: pl.DataFrame, spans: pl.DataFrame, lo: pl.Expr, hi: pl.Expr
) -> pl.Series:
    """Per row of ``spans`` (tid, ...), how many of ``points`` (tid, start_ns) started on its
    thread in [``lo``, ``hi``): per thread (a few), two sorted searches."""
    counts = pl.Series("n", [0] * spans.height, dtype=pl.Int64)
    parts = []
    bounds = spans.select("tid", lo.alias("_lo"), hi.alias("_hi")).with_row_index("_i")
    for (tid,), rows in bounds.group_by("tid"):
        # eq_missing: a mutated trace's null thread id matches its own rows, without a warning
        starts = points.filter(pl.col("tid").eq_missing(tid)).get_column("start_ns").sort()
        n = starts.search_sorted(rows.get_column("_hi")) - starts.search_sorted(
            rows.get_column("_lo")
        )
        parts.append(pl.DataFrame({"_i": rows.get_column("_i"), "n": n.cast(pl.Int64)}))
    if parts:
        counts = pl.concat(parts).sort("_i").get_column("n").clip(0)
    return counts


def _in_gaps(events: pl.DataFrame, host: pl.DataFrame) -> pl.Series:
    """Per host node, how many of ``events`` (tid, start_ns) started on its thread in its gap."""
    start = pl.col("start_ns")
    return _starts_within(events, host, start - pl.col("gap_ns"), start)


def _recorded_events(src: ModelInputs, host: pl.DataFrame) -> pl.Series:
    """Per host node, the events the profiler recorded on its thread in its gap (ops,
    annotations, Python frames) plus the call itself: what the profiler's per-event cost
    scales with (see :func:`~traceinsight.causal.transforms.without_profiler`)."""
    ops = pl.concat(
        [
            src.ops.select("tid", "start_ns"),
            src.python_frames.select("tid", "start_ns"),
        ]
    )
    return (_in_gaps(ops, host) + 1).alias("recorded_events")


def _compiled_launches(src: ModelInputs, host: pl.DataFrame) -> pl.Series:
    """Per host node, whether its gap holds an inductor Triton launch's op (the launch the
    call makes): see :func:`~traceinsight.causal.transforms.without_profiler`."""
    if "name" not in src.ops.columns:
        return pl.Series("compiled_launch", [False] * host.height, dtype=pl.Boolean)
    triton = src.ops.filter(pl.col("name").str.contains(TRITON_LAUNCH_PATTERN))
    return (_in_gaps(triton.select("tid", "start_ns"), host) > 0).alias("compiled_launch")


def _cross_stream_edges(gpu: pl.DataFrame) -> pl.DataFrame:
    """An op that started, later than its stream and launch allow, within
    :data:`CROSS_STREAM_LAG_NS` (or the share of its wait, see there) of another stream's op
    ending waited for that op (an event wait the table does not link): ``after_op`` is that op
    (-1: none), ``after_lag_ns`` the time from its end. The trace's event records and waits
    carry no stream here, so the edge is read off the times. The replay keeps the wait as the
    op's gap (a fixed delay: iterating edges that alternate between streams would take one
    round per alternation); the overlap transform removes it."""
    ends = gpu.select(
        pl.col("op").cast(pl.Int64).alias("after_op"),
        pl.col("chain").alias("_a_chain"),
        pl.col("end_ns").alias("_a_end"),
    ).sort("_a_end")
    j = (
        gpu.select("op", "start_ns")
        .sort("start_ns")
        .join_asof(ends, left_on="start_ns", right_on="_a_end")
        .sort("op")
    )
    lag = pl.col("start_ns") - pl.col("_a_end")
    within = pl.max_horizontal(
        pl.lit(CROSS_STREAM_LAG_NS),
        pl.min_horizontal(
            pl.lit(CROSS_STREAM_LAG_MAX_NS),
            (pl.col("gap_ns") * CROSS_STREAM_LAG_RATIO).cast(pl.Int64),
        ),
    )
    cross = (
        (pl.col("launch") >= 0)  # an op without a launch is pinned at its start anyway
        & (pl.col("_a_chain") != pl.col("chain"))
        & (pl.col("gap_ns") > CROSS_STREAM_LAG_NS)
        & (lag <= within)
    ).fill_null(False)
    return (
        gpu.with_columns(j.get_column("after_op"), j.get_column("_a_chain"), j.get_column("_a_end"))
        .with_columns(
            pl.when(cross).then(pl.col("after_op")).otherwise(-1).alias("after_op"),
            pl.when(cross).then(lag).otherwise(0).alias("after_lag_ns"),
        )
        .drop("_a_chain", "_a_end")
    )


def _waits(host: pl.DataFrame, gpu: pl.DataFrame) -> pl.DataFrame:
    """Which calls blocked on the GPU, on what, and their return latency (``dur_ns``)."""
    order = gpu.select(pl.arg_sort_by("launch_key_ns", maintain_order=True)).to_series()
    keys = gpu.get_column("launch_key_ns").gather(order)
    drained = pl.concat(
        [pl.Series([NEG_NS], dtype=pl.Int64), gpu.get_column("end_ns").gather(order).cum_max()]
    )
    drain = drained.gather(keys.search_sorted(host.get_column("start_ns"), side="left"))
    # a blocking copy waits for its own copy: the one GPU op its call launched
    copies = (
        gpu.filter(
            (pl.col("kind") == "memcpy")
            & (pl.col("launch") >= 0)
            & (
                (pl.col("src_kind") == "pageable")
                | (pl.col("dst_kind") == "pageable")
                | name_matches(gpu, BLOCKING_COPY_API, "launch_name")
            )
        )
        .group_by("launch")
        .agg(
            pl.col("op").last().cast(pl.Int64).alias("own_op"),
            pl.col("end_ns").last().alias("_own_end"),
        )
        .rename({"launch": "node"})
        .with_columns(pl.col("node").cast(pl.UInt32))
    )
    # the copy each call launched (its direction): a sync right after a host-to-device copy is
    # that copy's (``.to(device)`` without non_blocking), after a device-to-host one a read-back
    launched_copy = (
        gpu.filter((pl.col("kind") == "memcpy") & (pl.col("launch") >= 0))
        .group_by("launch")
        .agg(pl.col("copy_kind").first().alias("launched_copy"))
        .rename({"launch": "node"})
        .with_columns(pl.col("node").cast(pl.UInt32))
    )
    host = (
        host.join(copies, on="node", how="left")
        .join(launched_copy, on="node", how="left")
        .sort("node")
        .with_columns(
            drain.alias("_drain"),
            pl.col("launched_copy").shift(1).over("tid").alias("after_copy"),
        )
    )
    is_sync = name_matches(host, f"{SYNC_API}|{IMPLICIT_SYNC_API}")
    target = (
        pl.when(pl.col("own_op").is_not_null())
        .then(pl.col("_own_end"))
        .when(is_sync)
        .then(pl.col("_drain"))
        .otherwise(NEG_NS)
    )
    host = host.with_columns(target.alias("_target"))
    # a pageable copy's call stages the data chunk by chunk and returns with the last chunk
    # submitted, a little before the DMA ends (20 us of a 9.2 ms copy on the H200 fixture)
    slack = (
        pl.when(pl.col("own_op").is_not_null())
        .then(
            pl.max_horizontal(
                pl.lit(WAITED_SLACK_NS),
                ((pl.col("_target") - pl.col("start_ns")) * OWN_COPY_SLACK_RATIO).cast(pl.Int64),
            )
        )
        .otherwise(WAITED_SLACK_NS)
    )
    waited = (pl.col("_target") > pl.col("start_ns")) & (
        pl.col("end_ns") + slack >= pl.col("_target")
    )
    wait = (
        pl.when(waited & pl.col("own_op").is_not_null())
        .then(WAIT_OWN_OP)
        .when(waited)
        .then(WAIT_DEVICE)
        .otherwise(WAIT_NONE)
        .cast(pl.Int8)
    )
    return host.with_columns(
        wait.alias("wait"),
        pl.col("own_op").fill_null(-1),
        pl.when(waited)
        .then((pl.col("end_ns") - pl.max_horizontal("start_ns", "_target")).clip(0))
        .otherwise(pl.col("end_ns") - pl.col("start_ns"))
        .alias("dur_ns"),
        name_matches(host, LAUNCH_API).alias("is_launch"),
        name_matches(host, ALLOCATOR_API).alias("is_alloc"),
    ).drop("_drain", "_target", "_own_end")


def _queue_waits(host: pl.DataFrame, gpu: pl.DataFrame) -> pl.DataFrame:
    """Calls blocked behind queued GPU work: a call that does not otherwise wait, took over
    :data:`QUEUE_BLOCK_NS` and returned just after a GPU op ended inside it was waiting for
    that op (a launch into a full queue in a GPU-bound loop; a copy that staged behind the
    stream's work without waiting for its own DMA).
    ``queue_op``: that op (-1: none); the call returns when it ends, so a faster GPU frees
    the host sooner (as a fixed duration it would not)."""
    ends = gpu.select(
        pl.col("op").cast(pl.Int64).alias("queue_op"), pl.col("end_ns").alias("_q_end")
    ).sort("_q_end")
    cand = (
        host.filter((pl.col("wait") == WAIT_NONE) & (pl.col("dur_ns") > QUEUE_BLOCK_NS))
        .select("node", "start_ns", "end_ns")
        .sort("end_ns")
        .join_asof(ends, left_on="end_ns", right_on="_q_end")
        .filter(pl.col("_q_end") > pl.col("start_ns"))
        .select("node", "queue_op", (pl.col("end_ns") - pl.col("_q_end")).alias("_lat"))
    )
    host = host.join(cand, on="node", how="left").sort("node")
    queued = pl.col("queue_op").is_not_null()
    return host.with_columns(
        pl.when(queued).then(pl.lit(WAIT_QUEUE, pl.Int8)).otherwise(pl.col("wait")).alias("wait"),
        pl.when(queued).then(pl.col("_lat")).otherwise(pl.col("dur_ns")).alias("dur_ns"),
        pl.col("queue_op").fill_null(-1),
    ).drop("_lat")


def _flags(
    src: ModelInputs, host: pl.DataFrame, gpu: pl.DataFrame
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """What the transforms need to know of each node: the host work of each gap that falls in
    data loading / empty_cache / optimizer / recompute ranges, and which ops those launched."""
    h_cols, g_cols = [], []
    bound = gpu.get_column("launch") >= 0
    for name, rows in src.ranges.items():
        # the loader's wait may end in the pin-memory thread's call that _joins chained into
        # the step thread's wait: that gap lies in the step thread's __next__ (audit 18: a T4
        # loop's 58.22 ms of waits read 5.68 ms, its loader fix 1.008x)
        gap, inside = _thread_coverage(rows, host, chained=name == "dataloader")
        h_cols.append(gap.alias(f"gap_{name}_ns"))
        h_cols.append(inside.alias(f"in_{name}"))
        g_cols.append(
            (bound & _coverage(rows, gpu.get_column("launch_key_ns"))["inside"]).alias(f"in_{name}")
        )
    # the host time of each gap inside the thread's own torch ops and annotations (dispatch,
    # launches: what a CUDA graph replaces); the rest is Python outside any op
    launches = host.filter(pl.col("is_launch"))
    dispatching = without_cpu_only_ops(
        src.ops, launches.get_column("tid"), launches.get_column("start_ns")
    )
    h_cols.append(_thread_coverage(dispatching, host)[0].alias("gap_ops_ns"))
    inputs = cpu_only_ops(
        src.ops, launches.get_column("tid"), launches.get_column("start_ns"), HOST_INPUT_OPS
    )
    ranged = pl.concat([r.select("tid", "start_ns", "end_ns") for r in src.ranges.values()])
    if inputs.height and ranged.height:
        # a batch collated inside __next__ is the loader's (gap_dataloader_ns), a randn in the
        # optimizer or a recompute theirs: the batch does not scale them
        inputs = iv.subtract(iv.union(inputs, by=["tid"]), iv.union(ranged, by=["tid"]), by=["tid"])
    h_cols.append(_thread_coverage(inputs, host)[0].alias("gap_host_input_ns"))
    recorded = _thread_coverage(_leaf_ops(src.ops, host), host)[0]
    h_cols.append((host.get_column("gap_ns") - recorded).clip(0).alias("gap_outside_ops_ns"))
    steps = src.steps.get_column("host_start_ns").sort()
    step = steps.search_sorted(host.get_column("start_ns"), side="right").cast(pl.Int64) - 1
    h_cols.append(step.alias("step"))
    h_cols.append(_loader_floor(src, steps, step))
    # where each gap began in the trace: a thread's first call is anchored there
    host = host.with_columns(h_cols).rename({"_gap_from": "gap_from_ns"})
    # matched once per distinct kernel name (a few hundred), not per op
    names = gpu.get_column("name").unique()

    def kernels_named(test: Callable[[pl.Series], pl.Series]) -> pl.Expr:
        hits = names.filter(test(names)) if names.len() else names
        return pl.col("name").is_in(hits.implode()) & (pl.col("kind") == "kernel")

    # TF32 in math kernels only: a conversion kernel may name tf32 too
    math = pl.col("kernel_class").cast(pl.String).is_in(["gemm", "conv", "attention"])
    gpu = gpu.with_columns(g_cols).with_columns(
        kernels_named(is_fp32_math).alias("fp32_math"),
        (kernels_named(is_tf32_math) & math).alias("tf32_math"),
    )
    ratios = pl.DataFrame(
        {
            "device": list(src.time_ratios),
            "fp32_time_ratio": [r[0] for r in src.time_ratios.values()],
            "tf32_time_ratio": [r[1] for r in src.time_ratios.values()],
        },
        schema={
            "device": gpu.schema["device"],
            "fp32_time_ratio": pl.Float64,
            "tf32_time_ratio": pl.Float64,
        },
    )
    gpu = gpu.join(ratios, on="device", how="left", maintain_order="left")
    gpu = gpu.with_columns(pinned_rate(gpu, src.host_links).alias("pinned_bytes_per_ns"))
    first, align = _math_ops(src, host, gpu)
    return host, gpu.with_columns(
        _capture_extra(src, gpu, bound).alias("capture_extra_kernels"),
        _alone(gpu),
        first.alias("opens_math_op"),
        align.alias("align_16bit"),
        _channels_last_ns(src, host, gpu).alias("channels_last_ns"),
        _sdpa_plans_ns(src, host, gpu).alias("sdpa_plan_ns"),
    )


# SDPA's efficient backend (the one fp32 inputs with a mask run): its forward and backward ops
SDPA_EFFICIENT_OPS = {
    "aten::_scaled_dot_product_efficient_attention": "forward",
    "aten::_scaled_dot_product_efficient_attention_backward": "backward",
}
# cuDNN's attention builds its execution graph on the host at the first call with a new shape:
# 47-82 ms a forward and 50-87 ms a backward on an H100 and an H200 (torch 2.11; held-out
# Conformer RNN-T, T5 and sentence-transformers loops in bf16, against 0.1-0.2 ms a call with
# a known shape); the lowest of each is taken
CUDNN_SDPA_PLAN_NS = {"forward": 47_000_000, "backward": 50_000_000}


def _sdpa_plans_ns(src: ModelInputs, host: pl.DataFrame, gpu: pl.DataFrame) -> pl.Series:
    """Per GPU op: the host time cuDNN's attention would spend building graphs before it, were
    the step in 16 bits (:data:`CUDNN_SDPA_PLAN_NS` on the first kernel of the first efficient
    SDPA forward, and backward, of each step whose attention meets a shape no other step of the
    window has; 0 elsewhere). Only on devices whose SDPA takes cuDNN's attention in 16 bits
    (``src.cudnn_sdpa_devices``), with recorded shapes (``record_shapes``) and at least two
    steps. Whether the run had met a shape before the window the trace cannot tell: one that
    recurs in it is taken as met, one seen once as new."""
    zero = pl.repeat(0, gpu.height, dtype=pl.Int64, eager=True)
    args = src.op_args
    if not src.cudnn_sdpa_devices or args.height == 0 or gpu.height == 0 or host.height == 0:
        return zero
    calls = args.filter(pl.col("name").is_in(list(SDPA_EFFICIENT_OPS))).select(
        "tid",
        "start_ns",
        pl.col("name").replace_strict(SDPA_EFFICIENT_OPS).alias("pass"),
        pl.col("input_dims").alias("shape"),
    )
    if calls.height == 0:
        return zero
    starts = src.steps.get_column("host_start_ns").sort()
    step = starts.search_sorted(calls.get_column("start_ns"), side="right").cast(pl.Int64) - 1
    calls = calls.with_columns(step.alias("step")).filter(pl.col("step") >= 0)
    if calls.get_column("step").n_unique() < 2:  # one step: no shape is seen to recur or not
        return zero
    # a shape in one step only is new to the run; one that recurs in the window was met
    # before it too (a fixed-shape loop builds nothing): a step meeting a new shape builds
    firsts = calls.group_by("pass", "shape").agg(
        pl.col("step").min(), pl.col("step").n_unique().alias("_steps")
    )
    new_steps = firsts.filter(pl.col("_steps") == 1).select("pass", "step").unique()
    first_calls = (
        calls.join(new_steps, on=["pass", "step"])
        .sort("start_ns")
        .unique(["pass", "step"], keep="first")
        .with_columns(
            pl.col("pass").replace_strict(CUDNN_SDPA_PLAN_NS, return_dtype=pl.Int64).alias("_ns")
        )
    )
    ops = src.ops.filter(pl.col("name").is_in(list(SDPA_EFFICIENT_OPS))).select(
        "tid", "start_ns", "end_ns"
    )
    on_device = pl.col("device").is_in(list(src.cudnn_sdpa_devices))
    kern = (
        gpu.select(pl.int_range(pl.len()).alias("_i"), "launch", "launch_key_ns", "kind", "device")
        .filter((pl.col("launch") >= 0) & (pl.col("kind") == "kernel") & on_device)
        .drop("kind", "device")
    )
    if kern.height == 0 or ops.height == 0:
        return zero
    kern = kern.with_columns(host.get_column("tid").gather(kern.get_column("launch")).alias("tid"))
    opened = _open_op(kern, ops).sort("launch_key_ns").unique("start_ns", keep="first")
    hits = opened.join(first_calls.select("tid", "start_ns", "_ns"), on=["tid", "start_ns"])
    return zero.scatter(hits.get_column("_i"), hits.get_column("_ns"))


# A pinned copy large enough to run at the link's rate (smaller ones are latency-bound), and
# how many the trace must hold to measure that rate itself
PINNED_RATE_MIN_BYTES = 1 << 20
PINNED_RATE_MIN_COPIES = 3
# the rate where neither the trace nor the spec table tells it: PCIe 4.0's
PINNED_RATE_DEFAULT_BYTES_PER_NS = 25.0
# a pinned copy's fixed cost beside its bytes at the link's rate
PINNED_LATENCY_NS = 1_000
# a copy to or from pageable memory
PAGEABLE_COPY = (pl.col("src_kind") == "pageable") | (pl.col("dst_kind") == "pageable")


def pinned_copy_ns(rate: str) -> pl.Expr:
    """A copy's time from pinned memory: its bytes at the ``rate`` column (bytes/ns) plus
    :data:`PINNED_LATENCY_NS`, no longer than it took (the replay's transform and the copies'
    analyzer price pinning alike)."""
    return pl.min_horizontal(
        "dur_ns",
        (pl.col("bytes").fill_null(0) / pl.col(rate)).cast(pl.Int64) + PINNED_LATENCY_NS,
    )


def pinned_rate(gpu: pl.DataFrame, links: Mapping[int, float]) -> pl.Series:
    """Per GPU op (``gpu``: device, kind, copy_kind, src_kind, bytes, dur_ns; ``links``: the
    spec table's host link per device, bytes/s): the rate (bytes/ns) a pinned host-to-device
    copy runs at on its device: the
    median of the trace's own pinned uploads of a MiB or more where it holds
    :data:`PINNED_RATE_MIN_COPIES` (this host's link, measured), else the device's host link
    from the spec table, else PCIe 4.0's (audit 14: every GPU at the H200's 50 GB/s priced an
    A100's 154 MB pageable copies at 9.55x, where its PCIe 4.0 link moves about 25)."""
    own = (
        gpu.filter(
            (pl.col("kind") == "memcpy")
            & (pl.col("copy_kind") == "HtoD")
            & (pl.col("src_kind") == "pinned")
            & (pl.col("bytes") >= PINNED_RATE_MIN_BYTES)
            & (pl.col("dur_ns") > 0)
        )
        .group_by("device")
        .agg(
            (pl.col("bytes") / pl.col("dur_ns")).median().alias("_own"),
            pl.len().alias("_n"),
        )
        .filter(pl.col("_n") >= PINNED_RATE_MIN_COPIES)
        .select("device", "_own")
    )
    table = pl.DataFrame(
        {"device": list(links), "_spec": [v / 1e9 for v in links.values()]},
        schema={"device": gpu.schema["device"], "_spec": pl.Float64},
    )
    return (
        gpu.select("device")
        .join(own, on="device", how="left", maintain_order="left")
        .join(table, on="device", how="left", maintain_order="left")
        .select(
            pl.coalesce("_own", "_spec", pl.lit(PINNED_RATE_DEFAULT_BYTES_PER_NS)).alias("rate")
        )
        .get_column("rate")
    )


def _channels_last_ns(src: ModelInputs, host: pl.DataFrame, gpu: pl.DataFrame) -> pl.Series:
    """Per GPU op: the time it would take with the model and its inputs in channels_last, for
    the kernels that format changes (null elsewhere, and where the shapes or the device's
    bandwidth are unknown): ATen's channels-first depthwise kernels (model/classify.py
    :data:`~traceinsight.model.classify.ATEN_DEPTHWISE_PATTERN`) and cuDNN's channels-first
    batch norm (model/classify.py :func:`~traceinsight.model.classify.is_channels_first_kernel`) become cuDNN's NHWC kernels, each layer in the
    time the bytes its op moves take at the device's memory bandwidth (model/flops.py, from the
    recorded shapes, batch norm's two passes counted: :data:`BATCH_NORM_PASSES`; shared among
    the op's kernels by their time); cuDNN's layout transposes (:data:`LAYOUT_KERNELS`) go (0)."""
    out = pl.repeat(None, gpu.height, dtype=pl.Int64, eager=True).alias("channels_last_ns")
    args = src.op_args
    if gpu.height == 0 or host.height == 0 or args.height == 0 or not src.memory_bandwidths:
        return out
    # matched once per distinct kernel name, not per op
    names = gpu.get_column("name").unique()
    priced_names = names.filter(is_channels_first_kernel(names))
    layout_names = names.filter(names.str.to_lowercase().str.contains(LAYOUT_KERNELS))
    if priced_names.len() == 0 and layout_names.len() == 0:
        return out
    priced = pl.col("name").is_in(priced_names.implode())
    layout = pl.col("name").is_in(layout_names.implode())
    kernel = pl.col("kind") == "kernel"
    kern = gpu.select(
        pl.int_range(pl.len()).alias("_i"),
        "launch",
        "launch_key_ns",
        "dur_ns",
        "device",
        (kernel & priced).alias("_p"),
        (kernel & layout).alias("_l"),
    )
    gone = kern.filter("_l").select("_i", pl.lit(0, pl.Int64).alias("_ns"))
    kern = kern.filter((pl.col("_p") | pl.col("_l")) & (pl.col("launch") >= 0))
    if kern.height == 0 and gone.height == 0:
        return out
    kern = kern.with_columns(host.get_column("tid").gather(kern.get_column("launch")).alias("tid"))
    ops = args.filter(
        pl.col("name").str.contains(CHANNELS_LAST_OPS) & pl.col("input_dims").str.contains(r"\d")
    )
    parts = [gone]
    if kern.height and ops.height:
        key = ["name", "input_dims", "input_types", "concrete_inputs"]
        distinct = ops.select(key).unique()
        costs = (
            op_costs(distinct)
            .select(*key, "bytes")
            .join(_misaligned(distinct), on=key, how="left", nulls_equal=True)
        )
        passes = pl.col("name").replace_strict(
            BATCH_NORM_PASSES, default=1.0, return_dtype=pl.Float64
        )
        # batch norm at cuDNN's NHWC share of the bandwidth; ATen's depthwise layers as cuDNN's
        # NHWC depthwise kernels at the peak (EfficientNet-B0's: 2.4 ms measured, 1.95 priced)
        attained = (
            pl.when(pl.col("name").is_in(list(BATCH_NORM_PASSES)))
            .then(NHWC_BATCH_NORM_BANDWIDTH_RATIO)
            .otherwise(1.0)
        )
        spans = (
            ops.join(costs, on=key, how="left", nulls_equal=True)
            .select(
                "tid",
                "start_ns",
                (pl.col("start_ns") + pl.col("dur_ns")).alias("end_ns"),
                (pl.col("bytes") * passes / attained).alias("bytes"),
                pl.col("_misaligned").fill_null(False),
            )
            .with_row_index("_op")
        )
        bw = pl.DataFrame(
            {"device": list(src.memory_bandwidths), "_bw": list(src.memory_bandwidths.values())},
            schema={"device": gpu.schema["device"], "_bw": pl.Float64},
        )
        opened = _open_op(kern, spans)
        # a layer whose channels cuDNN's NHWC kernels cannot load as vectors keeps its time:
        # its batch norm runs no faster, its convolution pads instead of transposing
        kept = opened.filter(pl.col("_misaligned")).select("_i", pl.col("dur_ns").alias("_ns"))
        priced = opened.filter(pl.col("_p") & ~pl.col("_misaligned"))
        share = pl.col("dur_ns") / pl.col("dur_ns").sum().over("_op")
        parts.append(kept)
        parts.append(
            priced.filter(pl.col("bytes").is_not_null())
            .join(bw, on="device", how="inner")
            .select(
                "_i", (pl.col("bytes") / pl.col("_bw") * 1e9 * share).cast(pl.Int64).alias("_ns")
            )
        )
    # a kernel priced twice (a layout kernel matched to its op: its op's verdict wins)
    priced_all = pl.concat(parts).unique("_i", keep="last", maintain_order=True)
    return (
        pl.DataFrame({"_i": pl.int_range(gpu.height, eager=True)})
        .join(priced_all, on="_i", how="left", maintain_order="left")
        .get_column("_ns")
        .alias("channels_last_ns")
    )


def _misaligned(ops: pl.DataFrame) -> pl.DataFrame:
    """Per distinct op (name and recorded shapes): ``_misaligned``, whether a channel count of
    its layer is not a multiple of :data:`NHWC_CHANNEL_ALIGN` elements (twice that in 16 bits):
    dim 1 of each activation (the tensors of 4 or more dims with the first one's batch size;
    a backward's gradient holds the output channels) and a forward convolution's weight's
    output channels. Read once per distinct shape (shapes repeat)."""
    out = []
    for name, dims_text, types_text in ops.select("name", "input_dims", "input_types").iter_rows():
        dims, types = json_list(dims_text), json_list(types_text)
        tensors = [d for d in dims if isinstance(d, list) and len(d) >= 4]
        if not tensors:
            out.append(None)
            continue
        wide = any(isinstance(t, str) and ("Half" in t or "BFloat16" in t) for t in types[:1])
        align = NHWC_CHANNEL_ALIGN * (2 if wide else 1)
        batch = tensors[0][0]
        channels = [t[1] for t in tensors if t[0] == batch]
        if (
            re.match(_CONV_FORWARD, name or "")
            and len(dims) > 1
            and isinstance(dims[1], list)
            and dims[1]
        ):
            channels.append(dims[1][0])
        out.append(any(isinstance(c, int) and c % align for c in channels))
    return ops.select("name", "input_dims", "input_types", "concrete_inputs").with_columns(
        pl.Series("_misaligned", out, dtype=pl.Boolean)
    )


def _math_ops(
    src: ModelInputs, host: pl.DataFrame, gpu: pl.DataFrame
) -> tuple[pl.Series, pl.Series]:
    """Per GPU op: whether it is the first math kernel (fp32 or TF32) launched by its torch
    matmul/convolution op (:data:`MATH_OP_PATTERN`; where autocast's casts of that op's
    operands would run), and the alignment in elements (1, 2, 4 or 8) its matmul's recorded
    shapes allow 16-bit tensor-core kernels (8 where no shapes were recorded: the bf16
    transform then assumes aligned shapes)."""
    none = pl.Series([False] * gpu.height, dtype=pl.Boolean)
    aligned = pl.repeat(TENSOR_CORE_ALIGN_ELEMENTS, gpu.height, dtype=pl.Int8, eager=True)
    math = pl.col("fp32_math") | pl.col("tf32_math")
    if gpu.height == 0 or host.height == 0 or "name" not in src.ops.columns:
        return none, aligned
    ops = src.ops.filter(pl.col("name").str.contains(MATH_OP_PATTERN))
    if ops.height == 0:
        return none, aligned
    is_math = (math & (pl.col("launch") >= 0)).alias("_m")
    kern = (
        gpu.select(pl.int_range(pl.len()).alias("_i"), "launch", "launch_key_ns", is_math)
        .filter("_m")
        .sort("launch_key_ns")
    )
    kern = kern.with_columns(host.get_column("tid").gather(kern.get_column("launch")).alias("tid"))
    if kern.height == 0:
        return none, aligned
    spans = ops.select("tid", "start_ns", "end_ns", "name").with_row_index("_op")
    kern = _open_op(kern, spans)
    first = kern.sort("launch_key_ns").unique("_op", keep="first").get_column("_i")
    at = pl.int_range(gpu.height, eager=True)
    by_row = _matmul_alignment(src, kern)
    align = (
        pl.DataFrame({"_i": at})
        .join(by_row, on="_i", how="left", maintain_order="left")
        .get_column("align")
        .fill_null(TENSOR_CORE_ALIGN_ELEMENTS)
        .cast(pl.Int8)
    )
    return at.is_in(first.implode()), align


def _open_op(kern: pl.DataFrame, spans: pl.DataFrame) -> pl.DataFrame:
    """``kern`` (GPU ops: ``tid`` of the launching thread, ``launch_key_ns``) joined to the
    latest-started of ``spans`` (host ops: tid, start_ns, end_ns, ...) on that thread, kept
    where it was still running at the launch: the op that launched the kernel."""
    return (
        kern.sort("launch_key_ns")
        .join_asof(
            spans.sort("start_ns"),
            left_on="launch_key_ns",
            right_on="start_ns",
            by="tid",
            strategy="backward",
            check_sortedness=False,  # both sorted by time overall, so within each thread too
        )
        .filter(pl.col("end_ns") >= pl.col("launch_key_ns"))
    )


def _matmul_alignment(src: ModelInputs, kern: pl.DataFrame) -> pl.DataFrame:
    """``_i`` (rows of ``kern``) and ``align``: the largest power of two, at most
    :data:`TENSOR_CORE_ALIGN_ELEMENTS`, dividing both K and N of the matmul op's recorded
    shapes (model/flops.py ``gemm_cost``: the row-major leading dimensions; M, the batch's
    rows, never matters), for the ops below 8."""
    empty = pl.DataFrame(schema={"_i": kern.schema["_i"], "align": pl.Int64})
    args = src.op_args
    if args.height == 0 or kern.height == 0:
        return empty
    shaped = args.filter(
        pl.col("name").str.contains(_MATMUL_ARGS) & pl.col("input_dims").str.contains(r"\d")
    )
    if shaped.height == 0:
        return empty
    key = ["name", "input_dims", "input_types", "concrete_inputs"]
    shapes = op_costs(shaped.select(key).unique()).select(*key, "gemm_n", "gemm_k")
    # the lowest set bit of a dimension: the largest power of two dividing it
    align = pl.min_horizontal(
        *(
            pl.col(d).and_(-pl.col(d)).clip(upper_bound=TENSOR_CORE_ALIGN_ELEMENTS)
            for d in ("gemm_k", "gemm_n")
        )
    )
    bad = (
        shaped.join(shapes, on=key, how="inner", nulls_equal=True)
        .select("tid", "start_ns", align.alias("align"))
        .filter(pl.col("align") < TENSOR_CORE_ALIGN_ELEMENTS)
    )
    # ops recorded at the same instant on a thread (a composite and its child) join twice
    return (
        kern.join(bad, on=["tid", "start_ns"], how="inner")
        .group_by("_i")
        .agg(pl.col("align").min())
    )


def _alone(gpu: pl.DataFrame) -> pl.Series:
    """Per GPU op: its stream never ran beside its device's other streams in the recording
    (their ops overlapped its ops for at most :data:`ALONE_OVERLAP_MAX_RATIO` of its time), so
    nothing shows that it can: a CUDA graph's replay keeps its ops in launch order with theirs.
    cuDNN's LSTM spreads its kernels over 11 streams ordered by event waits the trace does not
    link; recorded launch-bound, each kernel started at its launch."""
    chains = gpu.select("device", "chain").unique()
    if chains.height < 2 or chains.height > ALONE_CHAINS_MAX:
        return pl.repeat(chains.height < 2, gpu.height, eager=True).alias("alone")
    spans = gpu.select("device", "chain", "start_ns", "end_ns")
    # a stream of collectives is the one a step can overlap by design: its not running beside
    # the compute is comm_not_overlapped's finding, not an order (its transform overlaps them)
    comm = set(
        gpu.filter(pl.col("kernel_class").cast(pl.String) == "communication")
        .get_column("chain")
        .unique()
        .to_list()
    )
    rows = []
    for device, chain in chains.iter_rows():
        if chain in comm:
            rows.append((chain, False))
            continue
        mine = spans.filter(pl.col("chain") == chain).select("start_ns", "end_ns")
        others = iv.union(
            spans.filter((pl.col("device") == device) & (pl.col("chain") != chain)).select(
                "start_ns", "end_ns"
            )
        )
        busy = int((mine["end_ns"] - mine["start_ns"]).sum())
        beside = int(iv.overlap_with(mine.sort("start_ns"), others).sum())
        rows.append((chain, beside <= ALONE_OVERLAP_MAX_RATIO * busy))
    alone = pl.DataFrame(
        rows, schema={"chain": gpu.schema["chain"], "alone": pl.Boolean}, orient="row"
    )
    return gpu.select("chain").join(alone, on="chain", how="left", maintain_order="left")["alone"]


def _loader_floor(src: ModelInputs, step_starts: pl.Series, step: pl.Series) -> pl.Series:
    """Per host node: the receiving cost of the batches its step takes from the loader (one
    per DataLoader range starting in the step, at least one)."""
    dl = src.ranges["dataloader"]
    if dl.height == 0:
        return pl.repeat(src.loader_receive_ns, step.len(), dtype=pl.Int64, eager=True).alias(
            "dataloader_floor_ns"
        )
    starts = iv.union(dl.select("tid", "start_ns", "end_ns"), by=["tid"]).get_column("start_ns")
    per_step = (
        (step_starts.search_sorted(starts, side="right").cast(pl.Int64) - 1)
        .alias("step")
        .value_counts(name="batches")
    )
    return (
        pl.DataFrame({"step": step})
        .join(per_step, on="step", how="left", maintain_order="left")
        .select(
            (pl.col("batches").fill_null(1).clip(1) * src.loader_receive_ns)
            .cast(pl.Int64)
            .alias("dataloader_floor_ns")
        )
        .to_series()
    )


def _capture_extra(src: ModelInputs, gpu: pl.DataFrame, bound: pl.Series) -> pl.Series:
    """Per GPU op: the kernels a capturable per-parameter Adam(W) adds beside it in a captured
    step (:data:`CAPTURABLE_ADAM_EXTRA_KERNELS` on each parameter's last kernel, else 0)."""
    none = pl.repeat(0, gpu.height, dtype=pl.Int32, eager=True)
    ranges = src.ranges["optimizer"]
    if "name" not in ranges.columns or gpu.height == 0:
        return none
    adam = ranges.filter(pl.col("name").str.contains(_ADAM_STEP))
    if adam.height == 0:
        return none
    inside = bound & _coverage(adam, gpu.get_column("launch_key_ns"))["inside"]
    names = gpu.get_column("name").filter(inside & (gpu.get_column("kind") == "kernel"))
    if names.len() == 0 or names.str.contains(_MULTI_TENSOR_KERNEL).any():
        return none
    marker = inside & gpu.get_column("name").str.contains(_ADAM_PARAM_KERNEL, literal=True)
    return (marker.cast(pl.Int32) * CAPTURABLE_ADAM_EXTRA_KERNELS).alias("capture_extra_kernels")


def _leaf_ops(ops: pl.DataFrame, host: pl.DataFrame) -> pl.DataFrame:
    """The ops and annotations (tid, start_ns, end_ns) holding at most one host call of their
    thread: an op and its launch, a wait, Dynamo's guards; not the ranges around many calls (a
    compiled graph's, a module's, the optimizer step's), whose Python between the calls inside
    is no op's work (``gap_outside_ops_ns``)."""
    spans = ops.select("tid", "start_ns", "end_ns")
    held = _starts_within(host, spans, pl.col("start_ns"), pl.col("end_ns"))
    return spans.filter(held <= 1)


def cpu_only_ops(
    ops: pl.DataFrame,
    launch_tids: pl.Series,
    launch_starts_ns: pl.Series,
    named: str | None = None,
) -> pl.DataFrame:
    """The torch ops (tid, start_ns, end_ns) that ran for
    :data:`~traceinsight.causal.columns.CPU_ONLY_OP_MIN_NS` or longer with no launch call
    starting on their thread while they ran: CPU computation; with ``named``, only those whose
    name matches it (:data:`~traceinsight.causal.columns.HOST_INPUT_OPS`: tensors made on the
    CPU)."""
    keep = (pl.col("kind") == "cpu_op") & (
        (pl.col("end_ns") - pl.col("start_ns")) >= CPU_ONLY_OP_MIN_NS
    )
    if named is not None:
        keep = keep & pl.col("name").str.contains(named)
    long = ops.filter(keep).select("tid", "start_ns", "end_ns")
    if long.height == 0:
        return long
    return iv.without_points(long, launch_tids, "tid", launch_starts_ns).select(
        "tid", "start_ns", "end_ns"
    )


def without_cpu_only_ops(
    ops: pl.DataFrame, launch_tids: pl.Series, launch_starts_ns: pl.Series
) -> pl.DataFrame:
    """``ops`` (kind, tid, start_ns, end_ns) as ranges per thread (tid, start_ns, end_ns), less
    the torch ops that launched nothing (no launch call starting on their thread while they
    ran) for :data:`~traceinsight.causal.columns.CPU_ONLY_OP_MIN_NS` or longer: CPU
    computation, neither dispatch (the idle's launch overhead) nor what a capture removes (the
    step model's ``gap_ops_ns``)."""
    ranges = ops.select("tid", "start_ns", "end_ns")
    cpu = cpu_only_ops(ops, launch_tids, launch_starts_ns) if ranges.height else ranges
    if cpu.height == 0:
        return ranges
    return iv.subtract(iv.union(ranges, by=["tid"]), iv.union(cpu, by=["tid"]), by=["tid"])


def _thread_coverage(
    ranges: pl.DataFrame, host: pl.DataFrame, *, chained: bool = False
) -> tuple[pl.Series, pl.Series]:
    """Per host node: the time of its gap inside ``ranges`` of its own thread, and whether
    the call itself is inside one (a range on another thread, e.g. the autograd thread's
    recompute while the step thread waits, is not this thread's work). ``chained``: a call
    that _joins put in another thread's chain (``chain_tid``) counts that thread's ranges too,
    whose wait its gap now carries."""
    gap, inside = _coverage_on(ranges, host, "tid")
    if not chained or "chain_tid" not in host.columns:
        return gap, inside
    moved = host.get_column("chain_tid") != host.get_column("tid")
    if not moved.any():
        return gap, inside
    chain_gap, chain_inside = _coverage_on(ranges, host, "chain_tid")
    zero = pl.Series([0] * host.height, dtype=pl.Int64)
    return (
        pl.max_horizontal(gap, chain_gap.zip_with(moved, zero)),
        inside | (chain_inside & moved),
    )


def _coverage_on(
    ranges: pl.DataFrame, host: pl.DataFrame, thread: str
) -> tuple[pl.Series, pl.Series]:
    """:func:`_thread_coverage` against the ranges of the thread named in column ``thread``."""
    gap = pl.Series([0] * host.height, dtype=pl.Int64)
    inside = pl.Series([False] * host.height, dtype=pl.Boolean)
    if ranges.height == 0:
        return gap, inside
    # one union per thread, each looked up at the calls' starts and their gaps' starts at once
    unions = iv.union(ranges.select("tid", "start_ns", "end_ns"), by=["tid"])
    gaps, ins = [], []
    for (tid,), rows in host.with_row_index("_i").group_by(thread):  # a few threads
        own = unions.filter(pl.col("tid") == tid).select("start_ns", "end_ns")
        both = _covered(own, pl.concat([rows.get_column("start_ns"), rows.get_column("_gap_from")]))
        at, since = both.head(rows.height), both.tail(rows.height)
        idx = rows.get_column("_i")
        gaps.append(pl.DataFrame({"_i": idx, "v": at["before"] - since["before"]}))
        ins.append(pl.DataFrame({"_i": idx, "v": at["inside"]}))
    gap = pl.concat(gaps).sort("_i").get_column("v").clip(0)
    inside = pl.concat(ins).sort("_i").get_column("v")
    return gap, inside
