"""Host ops that ran far below the host's own speed, of two kinds.

CPU copies (``cat``, ``stack``, ``copy_``, ...) of megabytes that took hundreds of milliseconds.
Such an op does no device work and reads memory a core copies at gigabytes a second; at a
hundredth of that its threads did not run: the intra-op thread pool contends with other threads
or processes for the cores. Measured on the H200 (fixtures/h200/thirdparty/README.md, calls
8-10): Lightning's loop compiled with ``mode="reduce-overhead"`` against a warm inductor cache
collated each 6 MB batch in 250 ms, every step (222-257 ms steps; a 6 MB torch.stack timed alone
in such a process 144-242 ms, 0.6-1.3 ms in the processes that ran fast); OMP_NUM_THREADS=1 or
TORCHINDUCTOR_COMPILE_THREADS=1 gave 6.2-6.5 ms steps.

First calls of an op with an input shape the window had not run it with, far slower than its
calls with a shape it had: a per-shape setup on the host (cuDNN attention building an execution
plan, cudnn.benchmark timing convolutions). Measured on the H200 (calls 17-18): under bf16 the
sentence-transformers loop's cuDNN attention took 78 ms on a new sequence length against 0.16 ms
on a known one; padded to one length the loop ran 1.43-1.61x faster over 30 steps, and the slow
calls faded over 300 steps as the lengths repeated. Where every call of an op had a new shape
(each layer of a convolution stack its own length, a new length every step: no known-shape call
to compare with), the call's own host time outside its runtime calls is set against the window's
median known-shape call: wav2vec2's cuDNN convolutions (session 22, call 1) took 2.3-2.8 ms a
call on new lengths, about 100 cudaPeekAtLastError calls each (cuDNN trying its engines), and
0.08-0.16 ms once the process had met those lengths.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import polars as pl

from traceinsight.analyzers.context import (
    Context,
    calls_inside,
    host_ranges,
    launched,
    outermost,
    shaped_ops,
)
from traceinsight.analyzers.replay import ReplayResult
from traceinsight.causal import transforms as tf
from traceinsight.causal.whatif import WhatIf
from traceinsight.model import intervals as iv
from traceinsight.model.classify import (
    API_KINDS,
    BACKWARD_PATTERN,
    DATALOADER_PATTERN,
    HOST_OP_KINDS,
    LAUNCH_API,
)
from traceinsight.model.flops import DTYPE_BYTES

# ATen ops that only move memory, in order (gathers read at random, slower by nature: left out)
COPY_OPS = r"^aten::(cat|stack|copy_|clone|_to_copy|contiguous)$"
MIN_DUR_NS = 1_000_000  # contention costs milliseconds: shorter ops are not read
MIN_BYTES = 1 << 20  # below this ATen copies on one thread (its grain), overheads dominate
# a core copies 5-20 GB/s: ops under a twentieth of the slowest did not get their cores
CONTENDED_MAX_BYTES_PER_NS = 0.25
# what the fix's prediction assumes the ops then run at: low for a core, so the saving is not
# overstated (at 20 GB/s the ops would take a tenth of that: both in the evidence)
HEALTHY_BYTES_PER_NS = 2.0
HEALTHY_MAX_BYTES_PER_NS = 20.0


@dataclass(frozen=True)
class ContendedOp:
    """One op name's contended calls: how many, the bytes each read (median), their time in
    the window and the rate they moved memory at (median)."""

    name: str
    count: int
    bytes_per_call: int
    dur_ns: int
    bytes_per_s: float


# A new shape's call is setup when it took this long and this many times its op's median call
# with a shape already run (and the op ran at least NEW_SHAPE_MIN_REPEATS such calls); new shapes
# in one step only are warm-up (cold_start's), not a pattern
NEW_SHAPE_MIN_NS = 1_000_000
NEW_SHAPE_MIN_FACTOR = 10.0
NEW_SHAPE_MIN_REPEATS = 3
NEW_SHAPE_MIN_STEPS = 2
NEW_SHAPE_COLUMNS = (
    "tid",
    "start_ns",
    "end_ns",
    "dur_ns",
    "name",
    "input_dims",
    "repeat_median_ns",
    "excess_ns",
    "reference",
)


@dataclass(frozen=True)
class NewShapeOp:
    """One op's calls with an input shape new to the window that took far longer than its
    calls with a known shape: how many, their time, the time beyond the known-shape median,
    that median, and how many distinct new shapes. ``reference``: "op" where the median is
    this op's calls with a known shape, "window" where the op ran too few such calls and the
    median is the window's known-shape calls of every op (its excess then counts only the call's time
    outside its runtime calls)."""

    name: str
    count: int
    dur_ns: int
    excess_ns: int
    repeat_median_ns: int
    shapes: int
    reference: str = "op"


@dataclass(frozen=True)
class HostStall:
    """One call of a usually quick op that the thread stalled in."""

    name: str
    dur_ns: int  # outside its runtime calls
    median_ns: int  # the op's median call in the window
    start_ns: int


@dataclass(frozen=True)
class HostOpsResult:
    contended: tuple[ContendedOp, ...] = ()
    contended_ns: int = 0  # the contended ops' time in the window
    contended_in_loader_ns: int = 0  # ... of which inside DataLoader ranges (the loading's)
    window_ns: int = 0
    # the ops at HEALTHY_BYTES_PER_NS, replayed (at HEALTHY_MAX_BYTES_PER_NS: the upper end)
    what_if: WhatIf | None = None
    what_if_upper: WhatIf | None = None
    assumed_bytes_per_s: float = HEALTHY_BYTES_PER_NS * 1e9
    # per-shape setup: the innermost slow new-shape calls, their excess, and the replay with
    # each at its op's known-shape median
    new_shape: tuple[NewShapeOp, ...] = ()
    new_shape_excess_ns: int = 0
    new_shape_steps: int = 0  # steps of the window with such a call
    what_if_new_shape: WhatIf | None = None
    # torch ops recorded, none of them a backward node or an optimizer step: an inference or
    # forward-only window (advice for training does not apply)
    forward_only: bool = False
    # the inference server whose loop the trace records (:data:`SERVING_ENGINES`: its ops'
    # namespace or its Python frames), None elsewhere: its per-step waits are by design
    serving_engine: str | None = None
    # DDP's buffer broadcast at each forward (broadcast_buffers=True): its host ops' time in the
    # window, how many, and the replay without them
    buffer_sync_ns: int = 0
    buffer_sync_calls: int = 0
    what_if_buffer_sync: WhatIf | None = None
    # torch.distributions' argument and sample checks (validate_args): the checks' host time in
    # the window (their ops and the Python between them, to the read-back's end), how many,
    # the device syncs among them, and the replay without them
    distribution_checks_ns: int = 0
    distribution_checks: int = 0
    distribution_check_syncs: int = 0
    what_if_distribution_checks: WhatIf | None = None
    # grouped matmuls (torch._grouped_mm, MoE experts) that synchronize inside: PyTorch's
    # per-group fallback (its grouped GEMM kernel takes bf16 on sm90+; fp32 loops over the
    # groups, reading their offsets back): how many, their host time in the window, the syncs
    # inside, their input dtypes (record_shapes), and the replay without their host time
    grouped_mm_fallback_calls: int = 0
    grouped_mm_fallback_ns: int = 0
    grouped_mm_fallback_syncs: int = 0
    grouped_mm_fallback_dtypes: tuple[str, ...] = ()
    what_if_grouped_mm_fallback: WhatIf | None = None
    # calls of usually quick torch ops that took far longer outside their runtime calls
    # (:func:`_host_stalls`): the thread stalled in them, descheduled or blocked; the largest
    # few, their time outside runtime calls, and the GPU's idle during them
    host_stalls: tuple[HostStall, ...] = ()
    host_stall_ns: int = 0
    host_stall_idle_ns: int = 0
    # an inference (forward-only) window whose model runs in training mode: the dropout calls
    # that drew masks (:data:`TRAIN_MODE_DROPOUT_OPS`), their host time, the kernels they
    # launched and those kernels' time, batch norms computing batch statistics (kernels of
    # :data:`TRAIN_MODE_NORM_KERNELS`), and the replay without the dropout calls
    train_mode_dropouts: int = 0
    train_mode_dropout_ns: int = 0
    train_mode_dropout_kernels: int = 0
    train_mode_dropout_gpu_ns: int = 0
    train_mode_norm_kernels: int = 0
    # ... the GPU time eval mode saves of them (the statistics pass)
    train_mode_norm_saved_ns: int = 0
    what_if_eval_mode: WhatIf | None = None
    # ... whose autocast casts its inputs at every call (:func:`_inference_casts`): how many
    # casts, their host time, the kernels they launched and those kernels' time, and the
    # replay without them (the model cast once)
    inference_casts: int = 0
    inference_cast_ns: int = 0
    inference_cast_kernels: int = 0
    inference_cast_gpu_ns: int = 0
    # the 16-bit type the cast kernels name most ("float16", "bfloat16"; None: neither named)
    inference_cast_dtype: str | None = None
    what_if_cast_once: WhatIf | None = None

    @property
    def new_shape_ratio(self) -> float | None:
        return self.new_shape_excess_ns / self.window_ns if self.window_ns else None

    @property
    def contended_ratio(self) -> float | None:
        return self.contended_ns / self.window_ns if self.window_ns else None


def _parsed(dims_text: str | None, types_text: str | None) -> tuple[list, list] | None:
    """An op's recorded input shapes and types (Kineto's JSON text), None where absent."""
    if not dims_text or not types_text:
        return None
    try:
        dims, types = json.loads(dims_text), json.loads(types_text)
    except ValueError:
        return None
    return (dims, types) if isinstance(dims, list) and isinstance(types, list) else None


def _tensor_bytes(dims: list, types: list) -> int | None:
    """The bytes of the tensors among recorded inputs (None: no tensor with a known type)."""
    total, seen = 0, False
    for d, t in zip(dims, types, strict=False):
        size = DTYPE_BYTES.get(t) if isinstance(t, str) else None
        if size is None or not isinstance(d, list) or not d:
            continue
        n = 1
        for x in d:
            n *= x if isinstance(x, int) else 0
        total, seen = total + n * size, True
    return total if seen else None


def _long_copies(ctx: Context) -> pl.DataFrame:
    """The long copy ops in the window that launched no device work (no runtime or driver call
    on their thread while they ran), outermost only (``stack`` around its ``cat``)."""
    lo, hi = ctx.window_start_ns, ctx.window_end_ns
    ops = ctx.rows(
        ("cpu_op",),
        COPY_OPS,
        where=pl.col("start_ns").is_between(lo, hi) & (pl.col("dur_ns") >= MIN_DUR_NS),
        columns=("name", "start_ns", "end_ns", "dur_ns", "tid"),
    )
    if ops.height == 0:
        return ops
    ops = ops.sort("tid", "start_ns", "end_ns", descending=[False, False, True])
    nested = (pl.col("end_ns") <= pl.col("end_ns").cum_max().shift(1).over("tid")).fill_null(False)
    ops = ops.filter(~nested)
    api = ctx.rows(API_KINDS, columns=("start_ns", "tid")).filter(
        pl.col("tid").is_in(ops.get_column("tid").unique().implode())
    )
    return iv.without_points(ops, api.get_column("tid"), "tid", api.get_column("start_ns"))


def _with_bytes(ctx: Context, ops: pl.DataFrame) -> pl.DataFrame:
    """``ops`` with ``bytes``: their tensor inputs' recorded shapes; a TensorList's tensors are
    not recorded, so the largest first input of the ops nested in it stands for its size (the
    output they write into: ``cat``'s ``narrow`` of its result)."""
    args = ctx.op_args
    if args.height == 0:
        return ops.with_columns(pl.lit(None, pl.Int64).alias("bytes"))
    keys = ops.select("tid", "start_ns", "end_ns")
    lo, hi = int(keys["start_ns"].min()), int(keys["end_ns"].max())
    inside = args.filter(
        pl.col("start_ns").is_between(lo, hi) & pl.col("tid").is_in(keys["tid"].unique().implode())
    ).select("tid", "start_ns", "name", "input_dims", "input_types")
    own = ops.join(inside, on=["tid", "start_ns", "name"], how="left")
    out = []
    for row in own.iter_rows(named=True):  # the few long copies only (MIN_DUR_NS)
        p = _parsed(row["input_dims"], row["input_types"])
        n = _tensor_bytes(*p) if p else None
        if n is None:  # a TensorList: the largest tensor its nested ops read (the output)
            kids = inside.filter(
                # a row without a thread (a damaged trace) matches the others without one
                pl.col("tid").eq_missing(row["tid"])
                & (pl.col("start_ns") > row["start_ns"])
                & (pl.col("start_ns") < row["end_ns"])
            )
            kid = [
                _parsed(d, t) for d, t in zip(kids["input_dims"], kids["input_types"], strict=True)
            ]
            n = max((_tensor_bytes(k[0][:1], k[1][:1]) or 0 for k in kid if k), default=0) or None
        out.append(n)
    return own.drop("input_dims", "input_types").with_columns(
        pl.Series("bytes", out, dtype=pl.Int64)
    )


# of calls (tid, start_ns, end_ns) sorted by thread and start: no other starting inside it
INNERMOST = ~(pl.col("start_ns").shift(-1).over("tid") < pl.col("end_ns")).fill_null(False)


def _new_shape_calls(ctx: Context) -> pl.DataFrame:
    """The innermost calls with an input shape new to the window that spent far longer outside
    their runtime calls than their op's calls with a known shape took (a blocking copy or a
    sync waits inside a runtime call: a wait, not setup); for an op with too few known-shape
    calls, far longer than the window's known-shape calls of every op, and only where the call
    launched device work (see :class:`NewShapeOp`). Columns: NEW_SHAPE_COLUMNS."""
    args = shaped_ops(ctx, ctx.window_start_ns, ctx.window_end_ns)
    if args.height == 0:
        return args
    args = args.with_columns((pl.int_range(pl.len()).over("name", "input_dims") == 0).alias("new"))
    repeats = args.filter(~pl.col("new"))
    if repeats.height < NEW_SHAPE_MIN_REPEATS:
        return args.clear()
    window_median = int(repeats.get_column("dur_ns").median())  # type: ignore[arg-type]
    known = (
        repeats.group_by("name")
        .agg(pl.col("dur_ns").median().alias("_op_median"), pl.len().alias("_repeats"))
        .filter(pl.col("_repeats") >= NEW_SHAPE_MIN_REPEATS)
    )
    new = args.filter(pl.col("new") & (pl.col("dur_ns") >= NEW_SHAPE_MIN_NS)).with_columns(
        (pl.col("start_ns") + pl.col("dur_ns")).alias("end_ns")
    )
    if new.height == 0:
        return args.clear()
    own = pl.col("dur_ns") - pl.col("_api_ns")
    by_op = pl.col("_op_median").is_not_null()
    slow = (
        _with_runtime_inside(ctx, new)
        .join(known, on="name", how="left")
        .with_columns(
            pl.coalesce("_op_median", pl.lit(window_median))
            .cast(pl.Int64)
            .alias("repeat_median_ns"),
            pl.when(by_op).then(pl.lit("op")).otherwise(pl.lit("window")).alias("reference"),
        )
        .filter(
            (own >= NEW_SHAPE_MIN_NS)
            & (own >= NEW_SHAPE_MIN_FACTOR * pl.col("repeat_median_ns"))
            & (by_op | (pl.col("_launches") > 0))
        )
        .with_columns((own - pl.col("repeat_median_ns")).clip(0).alias("excess_ns"))
        .select(NEW_SHAPE_COLUMNS)
        .sort("tid", "start_ns")
    )
    # the innermost only: a slow call with another starting inside it holds that one's setup
    return slow.filter(INNERMOST)


def _with_runtime_inside(ctx: Context, calls: pl.DataFrame) -> pl.DataFrame:
    """``calls`` (tid, start_ns, end_ns) with ``_api_ns``, the time of the outermost runtime
    and driver calls that started inside each on its thread, and ``_launches``, how many of
    them launched device work: cumulative sums over each thread's calls in time order, read at
    the call's two ends."""
    lo, hi = int(calls["start_ns"].min()), int(calls["end_ns"].max())
    api = ctx.rows(
        API_KINDS,
        where=pl.col("tid").is_in(calls.get_column("tid").unique().implode())
        & pl.col("start_ns").is_between(lo, hi),
        columns=("tid", "start_ns", "dur_ns", "name"),
    ).sort("tid", "start_ns")
    # a driver call inside a runtime call is part of its time already
    end = pl.col("start_ns") + pl.col("dur_ns")
    nested = (end <= end.cum_max().shift(1).over("tid")).fill_null(False)
    api = api.filter(~nested).select(
        "tid",
        pl.col("start_ns").alias("_at"),
        pl.col("dur_ns").cum_sum().over("tid").alias("_ns_cum"),
        ctx.name_matches(API_KINDS, LAUNCH_API)
        .cast(pl.Int64)
        .cum_sum()
        .over("tid")
        .alias("_n_cum"),
    )
    cum = ["_ns_cum", "_n_cum"]

    def at(col: str) -> pl.DataFrame:
        # the running sums of the calls that started before ``col``
        return (
            calls.select("tid", "start_ns", pl.col(col).alias("_at"))
            .with_row_index("_i")
            .sort("_at")
            .join_asof(
                api.sort("_at"),
                on="_at",
                by="tid",
                strategy="backward",
                allow_exact_matches=False,
                check_sortedness=False,
            )
            .sort("_i")
            .select(pl.col(c).fill_null(0) for c in cum)
        )

    start, stop = at("start_ns"), at("end_ns")
    return calls.with_columns(
        (stop["_ns_cum"] - start["_ns_cum"]).alias("_api_ns"),
        (stop["_n_cum"] - start["_n_cum"]).alias("_launches"),
    )


def _new_shape_ops(calls: pl.DataFrame) -> tuple[NewShapeOp, ...]:
    by = (
        calls.group_by("name")
        .agg(
            pl.len().alias("n"),
            pl.col("dur_ns").sum().alias("d"),
            pl.col("excess_ns").sum().alias("x"),
            pl.col("repeat_median_ns").first().alias("m"),
            pl.col("input_dims").n_unique().alias("k"),
            pl.col("reference").first(),
        )
        .sort(["x", "name"], descending=[True, False])
    )
    return tuple(
        NewShapeOp(
            r["name"],
            int(r["n"]),
            int(r["d"]),
            int(r["x"]),
            int(r["m"]),
            int(r["k"]),
            r["reference"],
        )
        for r in by.iter_rows(named=True)
    )


# An inference server's loop, by its custom ops' namespace (vllm::unified_attention) or its
# Python frames (vllm/v1/worker/gpu_model_runner.py(...)); it reads each step's sampled tokens
# back by design (audits s59, s60: vLLM decode captures' cudaEventSynchronize waits advised
# to drop .item() calls)
SERVING_ENGINES = {
    "vLLM": r"^vllm::|(^|/)vllm/",
    "SGLang": r"^sgl(ang|_kernel)::|(^|/)sglang/",  # frames as absolute paths too
}


def _serving_engine(ctx: Context) -> str | None:
    for engine, pattern in SERVING_ENGINES.items():
        if ctx.rows(("cpu_op", "python_function"), pattern, columns=("start_ns",)).height:
            return engine
    return None


def _forward_only(ctx: Context) -> bool:
    """Torch ops in the window and none of them autograd's backward or an optimizer step; no
    graph launched either (a captured training step records neither)."""
    kinds: tuple[str, ...] = ("cpu_op",)
    if ctx.rows(kinds, columns=("start_ns",)).height == 0:
        # an nsys export of a PyTorch program records its ops as NVTX ranges (emit_nvtx), the
        # backward's among them (audit 22: an FSDP inference export told to "train in bf16")
        kinds = ("user_annotation",)
        if ctx.rows(kinds, r"^aten::", columns=("start_ns",)).height == 0:
            return False
    if ctx.rows(API_KINDS, tf.GRAPH_LAUNCH_CALL, columns=("start_ns",)).height:
        return False
    backward = ctx.rows(kinds, BACKWARD_PATTERN, columns=("start_ns",)).height
    stepping = ctx.rows(
        ("cpu_op", "user_annotation"), r"^Optimizer\.(step|zero_grad)", columns=("start_ns",)
    ).height
    return backward == 0 and stepping == 0


# DistributedDataParallel's forward, and the host ops of its buffer broadcast inside it
# (broadcast_buffers=True: every forward, rank 0's buffers flattened, broadcast and copied back
# into each module's; a torchvision ResNet's 159 BatchNorm buffers cost 29 ms of a 222 ms step
# in HTA's nccl_data trace: flatten 6.2, unflatten 22.4 ms, the broadcasts' kernels 0.03 ms)
DDP_FORWARD = r"^DistributedDataParallel\.forward$"
BUFFER_SYNC_OPS = r"^(aten::(flatten|unflatten)_dense_tensors|c10d::broadcast_)$"


def _buffer_sync(ctx: Context, replay: ReplayResult | None) -> dict:
    """DDP's buffer broadcast: its ops started inside a ``DistributedDataParallel.forward``
    range of their thread, in the window; the replay with their host time taken out."""
    fwd = ctx.rows(HOST_OP_KINDS, DDP_FORWARD, columns=("start_ns", "end_ns", "tid"))
    if fwd.height == 0:
        return {}
    lo, hi = ctx.window_start_ns, ctx.window_end_ns
    ops = ctx.rows(
        HOST_OP_KINDS,
        BUFFER_SYNC_OPS,
        where=pl.col("start_ns").is_between(lo, hi, closed="left"),
        columns=("start_ns", "end_ns", "tid"),
    )
    if ops.height == 0:
        return {}
    inside = iv.containing(
        ops.rename({"start_ns": "o_s", "end_ns": "o_e", "tid": "o_tid"}),
        fwd,
        inner_start="o_s",
        inner_end="o_s",
        outer_start="start_ns",
        outer_end="end_ns",
        same=("tid", "o_tid"),
    ).unique(subset=["o_s", "o_tid"])
    if inside.height == 0:
        return {}
    cuts = inside.select(
        pl.col("o_tid").alias("tid"),
        pl.col("o_s").alias("start_ns"),
        pl.col("o_e").alias("end_ns"),
        (pl.col("o_e") - pl.col("o_s")).alias("saved_ns"),
    )
    return {
        "buffer_sync_ns": int(cuts.get_column("saved_ns").sum()),
        "buffer_sync_calls": cuts.height,
        "what_if_buffer_sync": replay.predict(tf.host_time_cut(cuts)) if replay else None,
    }


# torch.distributions validates arguments and samples with ``if not torch._is_all_true(valid)``
# (torch >= 2.1): the op then ``is_nonzero``'s read-back, a device sync. The check's mask is
# computed by the top-level ops just before it: comparisons, remainders, ``&``, reductions and
# views (constraints.py: real's ``value == value``, integer_interval's ``(value % 1 == 0) &
# (lower <= value) & (value <= upper)``, independent's ``reshape(...).all(-1)``).
CHECK_CALL = "aten::_is_all_true"
CHECK_READ = "aten::is_nonzero"
CHECK_OPS = (
    r"^aten::(eq|ne|lt|le|gt|ge|isnan|isinf|isfinite|isposinf|isneginf|remainder|fmod|"
    r"bitwise_(and|or|xor|not)|logical_(and|or|xor|not)|__(and|or|xor|invert)__|all|any|"
    r"reshape|view|_reshape_alias|_unsafe_view|expand|unsqueeze|_is_all_true|is_nonzero)$"
)
# the ops a check's mask starts with (a view or reduction before them is the caller's)
CHECK_START_OPS = (
    r"^aten::(eq|ne|lt|le|gt|ge|isnan|isinf|isfinite|isposinf|isneginf|remainder|fmod|"
    r"bitwise_not|logical_not)$"
)


def _distribution_checks(ctx: Context, replay: ReplayResult | None) -> dict:
    """HostOpsResult's torch.distributions check fields: each run of top-level check ops on
    a thread that holds ``_is_all_true`` then ``is_nonzero``, from its first comparison to the
    last such read-back's end (none in the window: {})."""
    lo, hi = ctx.window_start_ns, ctx.window_end_ns
    in_window = pl.col("start_ns").is_between(lo, hi, closed="left")
    calls = ctx.rows(("cpu_op",), f"^{CHECK_CALL}$", where=in_window, columns=("tid", "start_ns"))
    if calls.height == 0:
        return {}
    threads = calls.get_column("tid").unique().implode()
    ops = ctx.rows(
        ("cpu_op",),
        where=in_window & pl.col("tid").is_in(threads),
        columns=("name", "start_ns", "end_ns", "tid"),
    )
    top = outermost(ops).sort("tid", "start_ns")
    check = ctx.name_matches(("cpu_op",), CHECK_OPS)
    starts = ctx.name_matches(("cpu_op",), CHECK_START_OPS)
    top = top.with_columns(
        check.fill_null(False).alias("_check"),
        starts.fill_null(False).alias("_start"),
        (
            (pl.col("name") == CHECK_READ) & (pl.col("name").shift(1).over("tid") == CHECK_CALL)
        ).alias("_read"),
    ).with_columns((~pl.col("_check")).cum_sum().over("tid").alias("_run"))
    spans = (
        top.filter(pl.col("_check"))
        .group_by("tid", "_run")
        .agg(
            # from the mask's first comparison; a mask made without one (a view of a boolean
            # tensor) from the run's first check op
            pl.coalesce(
                pl.col("start_ns").filter(pl.col("_start")).min(), pl.col("start_ns").min()
            ).alias("start_ns"),
            pl.col("end_ns").filter(pl.col("_read")).max().alias("end_ns"),
            pl.col("_read").sum().alias("checks"),
        )
        .filter((pl.col("checks") > 0) & (pl.col("start_ns") < pl.col("end_ns")))
        .select("tid", "start_ns", "end_ns", "checks")
        .sort("tid", "start_ns")
    )
    if spans.height == 0:
        return {}
    syncs = _syncs_inside(ctx, spans)
    return {
        "distribution_checks_ns": int(
            spans.select((pl.col("end_ns") - pl.col("start_ns")).sum()).item()
        ),
        "distribution_checks": int(spans.get_column("checks").sum()),
        "distribution_check_syncs": syncs.height,
        "what_if_distribution_checks": replay.predict(tf.host_spans_removed(spans))
        if replay
        else None,
    }


def _syncs_inside(ctx: Context, spans: pl.DataFrame) -> pl.DataFrame:
    """The device sync calls that start inside ``spans`` (tid, start_ns, end_ns) on the same
    thread: one row per (sync, span), the span's columns beside."""
    return iv.containing(
        ctx.sync_calls.select(pl.col("start_ns").alias("c_s"), pl.col("tid").alias("c_tid")),
        spans,
        inner_start="c_s",
        inner_end="c_s",
        outer_start="start_ns",
        outer_end="end_ns",
        same=("tid", "c_tid"),
    )


GROUPED_MM = "aten::_grouped_mm"

# Dropout that draws a mask: what ``aten::dropout`` calls in training mode (in eval mode it
# returns its input and launches nothing). Audit 18: an inference loop under no_grad with the
# model left in train() ran 18 dropouts a step, 0.55 ms of a 6.9 ms host-bound step.
TRAIN_MODE_DROPOUT_OPS = r"^aten::(native_dropout|_fused_dropout|fused_dropout|bernoulli_)$"
# ... but not inside torch.bernoulli (a Bernoulli distribution's sample: a policy's action)
SAMPLING_OPS = r"^aten::bernoulli$"
# Batch norm in training mode computes its batch's statistics, a pass over the activations that
# eval mode (its running statistics) does not make: ATen's statistics kernels go, and cuDNN's
# fused training forward (statistics and normalization, two reads and a write of the input)
# becomes its inference kernel (a read and a write). A held-out torchvision ResNet-50 in train
# mode under no_grad (session 64, H100): batch_norm_collect_statistics 3.8 ms of a 12.5 ms step;
# model.eval() measured 1.16-1.44x (12.5 -> 8.7 ms).
TRAIN_MODE_NORM_STATS_KERNELS = r"batch_norm_collect_statistics|welford_kernel"
TRAIN_MODE_NORM_FUSED_KERNELS = r"bn_fw_tr_"
EVAL_FUSED_NORM_RATIO = 2 / 3
TRAIN_MODE_NORM_KERNELS = f"{TRAIN_MODE_NORM_STATS_KERNELS}|{TRAIN_MODE_NORM_FUSED_KERNELS}"
# autocast's casts run inside the op that asked for them (its dispatcher-level cached_cast
# calls aten::to within the op's range); a cast in the model's own code is an op of its own.
# The ops autocast casts for (CUDA): its lower-precision list, its fp32 list and its promote
# list (aten/src/ATen/autocast_mode.cpp). Other ops cast inside for their own reasons (a float
# mask converted by multi-head attention, a clamp of integer positions) with or without
# autocast: not counted (session 64: DeBERTa's 60 such casts a step, a bf16 LM's 6).
CAST_OP = r"^aten::to$"
AUTOCAST_OPS = (
    r"^aten::(_convolution|conv[123]d|conv_tbc|conv_transpose[123]d|convolution|prelu|addmm|"
    r"addmv|addr|matmul|einsum|mm|mv|linalg_vecdot|linear|addbmm|baddbmm|bmm|chain_matmul|"
    r"linalg_multi_dot|_thnn_fused_lstm_cell|_thnn_fused_gru_cell|lstm_cell|gru_cell|"
    r"rnn_tanh_cell|rnn_relu_cell|lstm|gru|rnn_tanh|rnn_relu|_scaled_dot_product_\w+|"
    r"scaled_dot_product_attention|acos|asin|cosh|erfinv|exp|expm1|log|log10|log2|log1p|"
    r"reciprocal|rsqrt|sinh|tan|pow|softplus|layer_norm|native_layer_norm|group_norm|"
    r"rms_norm|frobenius_norm|nuclear_norm|cosine_similarity|\w*_loss|nll_loss\w*|kl_div|"
    r"binary_cross_entropy_with_logits|cross_entropy_loss|dist|pdist|cdist|renorm|logsumexp|"
    r"_?upsample_\w+|grid_sampler\w*|prod|cumprod|cumsum|norm|linalg_\w+|softmax|"
    r"log_softmax|_softmax|sum|fft_\w+|addcdiv|addcmul|atan2|bilinear|cross|dot|vdot|"
    r"index_put|scatter_add|tensordot|cat|stack)$"
)


def _kernel_launches(ctx: Context) -> pl.DataFrame:
    """The window's kernels with their launching call's thread and start (read once for the
    inference checks' spans)."""
    return launched(
        ctx.launches,
        ["launch_tid", "launch_start_ns", "dur_ns", "name"],
        where=pl.col("kind") == "kernel",
    )


def _launched_inside(k: pl.DataFrame, spans: pl.DataFrame) -> pl.DataFrame:
    """The kernels of ``k`` (:func:`_kernel_launches`) launched from inside ``spans`` (tid,
    start_ns, end_ns) on the same thread: one row per kernel (its dur_ns and name, and its
    span's tid and start_ns)."""
    if k.height == 0 or spans.height == 0:
        return k.head(0).rename({"launch_tid": "tid", "launch_start_ns": "start_ns"})
    inside = iv.containing(
        k.rename({"launch_tid": "c_tid", "launch_start_ns": "c_s"}).with_row_index("_k"),
        spans,
        inner_start="c_s",
        inner_end="c_s",
        outer_start="start_ns",
        outer_end="end_ns",
        same=("tid", "c_tid"),
    )
    return inside.unique(subset="_k").select("tid", "start_ns", "dur_ns", "name")


def _named_dtype(names: pl.Series) -> str | None:
    """The 16-bit type that kernel ``names`` name most (ATen's copy kernels carry it:
    ``bfloat16_copy_kernel_cuda``, ``...lambda(c10::Half)...``), None where neither is named."""
    low = names.cast(pl.String).str.to_lowercase()
    bf16 = int(low.str.contains("bfloat16").sum())
    fp16 = int(low.str.contains(r"(^|[^b])(half|float16)").sum())
    if bf16 == fp16 == 0:
        return None
    return "bfloat16" if bf16 >= fp16 else "float16"


def _inference_waste(ctx: Context, replay: ReplayResult | None, forward_only: bool) -> dict:
    """HostOpsResult's train-mode and per-call cast fields, for a forward-only window (none
    elsewhere: training needs both)."""
    if not forward_only:
        return {}
    lo, hi = ctx.window_start_ns, ctx.window_end_ns
    in_window = pl.col("start_ns").is_between(lo, hi, closed="left")
    cols = ("tid", "start_ns", "end_ns")
    out: dict = {}
    drop = outermost(ctx.rows(("cpu_op",), TRAIN_MODE_DROPOUT_OPS, where=in_window, columns=cols))
    sampling = ctx.rows(("cpu_op",), SAMPLING_OPS, where=in_window, columns=cols)
    if drop.height and sampling.height:  # torch.bernoulli(p): a draw the user asked for
        drawn = calls_inside(drop, sampling).select(cols)
        drop = drop.join(drawn, on=list(cols), how="anti")
    launches = _kernel_launches(ctx)
    kernels = _launched_inside(launches, drop)
    names = pl.col("name").cast(pl.String)
    norms = ctx.gpu.filter(
        (pl.col("kind") == "kernel") & names.str.contains(TRAIN_MODE_NORM_KERNELS)
    ).select(
        "device",
        "start_ns",
        "dur_ns",
        pl.when(names.str.contains(TRAIN_MODE_NORM_STATS_KERNELS))
        .then(0.0)
        .otherwise(EVAL_FUSED_NORM_RATIO)
        .alias("factor"),
    )
    if kernels.height or norms.height:
        spans = drop.sort("tid", "start_ns") if kernels.height else drop.head(0)
        fixes = ([tf.ops_removed(spans)] if spans.height else []) + (
            [tf.scaled_kernels(norms)] if norms.height else []
        )
        out |= {
            "train_mode_dropouts": spans.height,
            "train_mode_dropout_ns": int(
                spans.select((pl.col("end_ns") - pl.col("start_ns")).sum()).item() or 0
            ),
            "train_mode_dropout_kernels": kernels.height,
            "train_mode_dropout_gpu_ns": int(kernels.get_column("dur_ns").sum())
            if kernels.height
            else 0,
            "train_mode_norm_kernels": norms.height,
            "train_mode_norm_saved_ns": int(
                norms.select((pl.col("dur_ns") * (1.0 - pl.col("factor"))).sum()).item()
            ),
            "what_if_eval_mode": replay.predict(tf.combined(fixes)) if replay else None,
        }
    return out | _inference_casts(ctx, replay, in_window, launches)


def _inference_casts(
    ctx: Context, replay: ReplayResult | None, in_window: pl.Expr, launches: pl.DataFrame
) -> dict:
    """The casts autocast makes inside the window's ops (``aten::to`` inside another torch op
    on its thread, launching a kernel): in inference each call casts the same fp32 weights
    again (autocast's cast cache lives for one autocast region), where a model cast once to
    16 bits casts nothing. Audit 18: 63 casts a step, 1.16 ms of a 6.9 ms host-bound step."""
    cols = ("tid", "start_ns", "end_ns")
    casts = ctx.rows(("cpu_op",), CAST_OP, where=in_window, columns=cols)
    if casts.height == 0:
        return {}
    parents = ctx.rows(("cpu_op",), AUTOCAST_OPS, columns=cols)
    nested = calls_inside(casts, parents).unique(subset=["tid", "start_ns"])
    if nested.height == 0:
        return {}
    spans = outermost(nested.select(cols)).sort("tid", "start_ns")
    kernels = _launched_inside(launches, spans)
    if kernels.height == 0:
        return {}
    # a cast to the type a tensor has returns it: no copy, no kernel
    spans = spans.join(
        kernels.select("tid", "start_ns").unique(), on=["tid", "start_ns"], how="semi"
    )
    return {
        "inference_casts": spans.height,
        "inference_cast_ns": int(
            spans.select((pl.col("end_ns") - pl.col("start_ns")).sum()).item() or 0
        ),
        "inference_cast_kernels": kernels.height,
        "inference_cast_gpu_ns": int(kernels.get_column("dur_ns").sum()),
        "inference_cast_dtype": _named_dtype(kernels.get_column("name")),
        "what_if_cast_once": replay.predict(tf.ops_removed(spans)) if replay else None,
    }


def _grouped_mm_fallback(ctx: Context, replay: ReplayResult | None) -> dict:
    """HostOpsResult's grouped-matmul fallback fields: the outermost ``aten::_grouped_mm``
    calls in the window with a device sync inside on their thread (none: {}). A held-out MoE
    LM (session 57): fp32 experts' 72 calls held 72 of the window's 106 syncs and 25.8 ms of
    host time a 68.8 ms step; in bf16 the op is one kernel and no sync."""
    lo, hi = ctx.window_start_ns, ctx.window_end_ns
    in_window = pl.col("start_ns").is_between(lo, hi, closed="left")
    calls = ctx.rows(
        ("cpu_op",), f"^{GROUPED_MM}$", where=in_window, columns=("tid", "start_ns", "end_ns")
    )
    if calls.height == 0 or ctx.sync_calls.height == 0:
        return {}
    calls = outermost(calls)  # a call recorded inside another counts once
    syncs = _syncs_inside(ctx, calls)
    if syncs.height == 0:
        return {}
    spans = calls.join(
        syncs.select("tid", "start_ns").unique(), on=["tid", "start_ns"], how="semi"
    ).sort("tid", "start_ns")
    args = ctx.op_args
    dtypes: tuple[str, ...] = ()
    if args.height and "input_types" in args.columns:
        # (the first input's type: '["float", "float", "int", "", ""]' -> float)
        first = (
            args.filter(pl.col("name") == GROUPED_MM)
            .get_column("input_types")
            .str.extract(r'^\[\s*"([^"]+)"')
            .drop_nulls()
            .unique()
            .sort()
        )
        dtypes = tuple(first.to_list())
    return {
        "grouped_mm_fallback_calls": spans.height,
        "grouped_mm_fallback_ns": int(
            spans.select((pl.col("end_ns") - pl.col("start_ns")).sum()).item()
        ),
        "grouped_mm_fallback_syncs": syncs.height,
        "grouped_mm_fallback_dtypes": dtypes,
        "what_if_grouped_mm_fallback": replay.predict(tf.host_spans_removed(spans))
        if replay
        else None,
    }


# A call of a torch op at least HOST_STALL_MIN_NS and HOST_STALL_MIN_FACTOR times its op's
# median (over HOST_STALL_MIN_CALLS calls or more in the window), outside its runtime calls, and
# neither the first call of its input shape (setup: new_shape_setup's) nor the loader's: the
# thread stalled in it (audit s61: Megatron TP8's ranks 0 and 6, aten::empty 18.7 ms and
# aten::mm 19.1 ms against a few microseconds, cudaLaunchKernel up to 26 ms; those ranks were
# the job's stragglers, and rank 0 read launch-bound)
HOST_STALL_MIN_NS = 1_000_000
HOST_STALL_MIN_FACTOR = 100
HOST_STALL_MIN_CALLS = 10
# ... of an op whose median call is at most this: usually quick (a convolution's first call of a
# shape searches cuDNN's algorithms on the host for seconds, 1.5 ms its median: setup, which a
# trace without shapes cannot tell from a stall)
HOST_STALL_QUICK_MAX_NS = 50_000
# ops that may wait for the device (a read-back, a copy) where the trace shows no runtime call
# inside them (a CUDA graph's RAFT step: `_local_scalar_dense` 3.3 ms against 0.5 us): no stall
MAY_WAIT_OPS = (
    r"_local_scalar_dense|aten::item$|nonzero|aten::equal$|masked_select|unique|"
    r"aten::to$|_to_copy|copy_|contiguous|clone|cpu$"
)
HOST_STALLS_KEPT = 3


def _host_stalls(ctx: Context, setup: pl.DataFrame) -> dict:
    """HostOpsResult's stall fields: the innermost such calls, outside the DataLoader's
    ranges and ``setup`` (the new-shape calls, :func:`_new_shape_calls`), with the GPU's idle
    (no kernel, copy or set on any stream) during them."""
    in_window = pl.col("start_ns").is_between(ctx.window_start_ns, ctx.window_end_ns)
    # the ops with a call long enough first (few), then all of their calls (the medians)
    long = ctx.rows(
        ("cpu_op",),
        where=in_window & (pl.col("dur_ns") >= HOST_STALL_MIN_NS),
        columns=("name",),
    )
    names = long.get_column("name").unique()
    names = names.filter(~names.cast(pl.String).str.contains(MAY_WAIT_OPS))
    if names.len() == 0:
        return {}
    ops = ctx.rows(
        ("cpu_op",),
        where=in_window & pl.col("name").is_in(names.implode()),
        columns=("tid", "name", "start_ns", "dur_ns"),
    )
    # by op and recorded input shapes where there are any: a copy's time follows its bytes
    # (a batch's channels_last conversion, 7.6 ms, beside a 26 us median of small casts)
    shapes = shaped_ops(ctx, ctx.window_start_ns, ctx.window_end_ns).filter(
        pl.col("name").is_in(names.cast(pl.String).implode())
    )
    ops = ops.join(
        shapes.select("tid", "start_ns", "name", "input_dims").unique(["tid", "start_ns", "name"]),
        on=["tid", "start_ns", "name"],
        how="left",
    )
    median = pl.col("dur_ns").median().over("name", "input_dims")
    calls = pl.len().over("name", "input_dims")
    # (the median over every call of the name, taken before the filter; not a thread's first
    # call of the op: first use sets up)
    first = pl.int_range(pl.len()).over("tid", "name", "input_dims", order_by="start_ns") == 0
    slow = (
        ops.with_columns(median.alias("median_ns"), calls.alias("_calls"), first.alias("_first"))
        .filter(
            (pl.col("dur_ns") >= HOST_STALL_MIN_NS)
            & (pl.col("_calls") >= HOST_STALL_MIN_CALLS)
            & (pl.col("median_ns") <= HOST_STALL_QUICK_MAX_NS)
            & (pl.col("dur_ns") >= HOST_STALL_MIN_FACTOR * pl.col("median_ns"))
            & ~pl.col("_first")
        )
        .with_columns((pl.col("start_ns") + pl.col("dur_ns")).alias("end_ns"))
    )
    if slow.height == 0:
        return {}
    own = pl.col("dur_ns") - pl.col("_api_ns")
    slow = (
        _with_runtime_inside(ctx, slow)
        .filter((own >= HOST_STALL_MIN_NS) & (own >= HOST_STALL_MIN_FACTOR * pl.col("median_ns")))
        .with_columns(own.alias("own_ns"))
        .sort("tid", "start_ns")
    )
    # the innermost only; not a new shape's first call (setup), not the loader's
    slow = slow.filter(INNERMOST)
    if setup.height:
        slow = slow.join(setup.select("tid", "start_ns"), on=["tid", "start_ns"], how="anti")
    loader = host_ranges(ctx, DATALOADER_PATTERN)
    slow = slow.sort("start_ns")
    if slow.height and loader.height:
        inside = iv.overlap_with(slow.select("start_ns", "end_ns"), loader.sort("start_ns"))
        slow = slow.filter(inside < slow.get_column("dur_ns"))
    if slow.height == 0:
        return {}
    # the GPU idle: no activity on any device during the stall, at most the stall's own time
    busy = iv.union(ctx.busy.select("start_ns", "end_ns")) if ctx.busy.height else ctx.busy
    covered = (
        iv.overlap_with(slow.select("start_ns", "end_ns"), busy)
        if busy.height
        else pl.repeat(0, slow.height, dtype=pl.Int64, eager=True)
    )
    uncovered = (slow.get_column("dur_ns") - covered).clip(0)
    stall_ns = int(slow.get_column("own_ns").sum())
    idle = int(slow.select(pl.min_horizontal(uncovered, pl.col("own_ns")).alias("i"))["i"].sum())
    top = slow.sort(["own_ns", "start_ns"], descending=[True, False]).head(HOST_STALLS_KEPT)
    return {
        "host_stalls": tuple(
            HostStall(r["name"], int(r["own_ns"]), int(r["median_ns"]), int(r["start_ns"]))
            for r in top.iter_rows(named=True)
        ),
        "host_stall_ns": stall_ns,
        "host_stall_idle_ns": max(0, idle),
    }


def analyze_host_ops(ctx: Context, replay: ReplayResult | None) -> HostOpsResult:
    # calls with an input shape new to the window, slow: per-shape setup (read once)
    setup = _new_shape_calls(ctx) if ctx.op_args.height else pl.DataFrame()
    forward_only = _forward_only(ctx)
    shaped: dict = {
        **_host_stalls(ctx, setup),
        **_new_shape(ctx, setup, replay),
        "forward_only": forward_only,
        **_inference_waste(ctx, replay, forward_only),
        "serving_engine": _serving_engine(ctx),
        **_buffer_sync(ctx, replay),
        **_distribution_checks(ctx, replay),
        **_grouped_mm_fallback(ctx, replay),
    }
    ops = _long_copies(ctx)
    if ops.height == 0:
        return HostOpsResult(window_ns=ctx.window_ns, **shaped)
    ops = _with_bytes(ctx, ops).filter(pl.col("bytes") >= MIN_BYTES)
    slow = ops.with_columns((pl.col("bytes") / pl.col("dur_ns")).alias("rate")).filter(
        pl.col("rate") < CONTENDED_MAX_BYTES_PER_NS
    )
    if slow.height == 0:
        return HostOpsResult(window_ns=ctx.window_ns, **shaped)
    by_name = (
        slow.group_by("name")
        .agg(
            pl.len().alias("n"),
            pl.col("bytes").median().alias("b"),
            pl.col("dur_ns").sum().alias("d"),
            pl.col("rate").median().alias("r"),
        )
        .sort(["d", "name"], descending=[True, False])
    )
    contended = tuple(
        ContendedOp(r["name"], int(r["n"]), int(r["b"]), int(r["d"]), float(r["r"]) * 1e9)
        for r in by_name.iter_rows(named=True)
    )

    def at(rate: float) -> WhatIf | None:
        if replay is None:
            return None
        cuts = slow.select(
            "tid",
            "start_ns",
            "end_ns",
            (pl.col("dur_ns") - (pl.col("bytes") / rate).cast(pl.Int64)).clip(0).alias("saved_ns"),
        )
        return replay.predict(tf.host_time_cut(cuts))

    return HostOpsResult(
        contended=contended,
        contended_ns=int(slow.get_column("dur_ns").sum()),
        contended_in_loader_ns=_in_loader_ns(ctx, slow),
        window_ns=ctx.window_ns,
        what_if=at(HEALTHY_BYTES_PER_NS),
        what_if_upper=at(HEALTHY_MAX_BYTES_PER_NS),
        **shaped,
    )


def _in_loader_ns(ctx: Context, ops: pl.DataFrame) -> int:
    """The time of ``ops`` (start_ns, dur_ns) inside the DataLoader's ranges."""
    loader = host_ranges(ctx, DATALOADER_PATTERN)
    spans = ops.select("start_ns", (pl.col("start_ns") + pl.col("dur_ns")).alias("end_ns"))
    return int(iv.overlap_with(spans.sort("start_ns"), loader.sort("start_ns")).sum())


def _new_shape(ctx: Context, calls: pl.DataFrame, replay: ReplayResult | None) -> dict:
    """HostOpsResult's per-shape setup fields from the new-shape ``calls`` (none where the
    window's new shapes are slow in fewer than NEW_SHAPE_MIN_STEPS steps: warm-up)."""
    if calls.height == 0 or ctx.steps.height == 0:
        return {}
    starts = ctx.steps.get_column("host_start_ns").sort()
    steps = starts.search_sorted(calls.get_column("start_ns"), side="right").n_unique()
    if steps < NEW_SHAPE_MIN_STEPS:
        return {}
    cuts = calls.select("tid", "start_ns", "end_ns", pl.col("excess_ns").alias("saved_ns"))
    return {
        "new_shape": _new_shape_ops(calls),
        "new_shape_excess_ns": int(calls.get_column("excess_ns").sum()),
        "new_shape_steps": int(steps),
        "what_if_new_shape": replay.predict(tf.host_time_cut(cuts)) if replay else None,
    }
