"""What-if transforms on the step model: each returns the model as the fix would leave it (or
None when the trace has nothing for it to change); :func:`~traceinsight.causal.graph.replay`
then says what the step would take. Each transform's assumptions are its docstring
(:attr:`Transform.assumes`, docs/FINDINGS.md), and each declares the columns beyond the graph's
own that it reads (:class:`Transform`; a test runs each on a model holding only those).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import polars as pl

from traceinsight.causal.build import PAGEABLE_COPY, pinned_copy_ns
from traceinsight.causal.columns import SUBGAPS, TENSOR_CORE_ALIGN_ELEMENTS
from traceinsight.causal.graph import WAIT_DEVICE, WAIT_NONE, WAIT_OWN_OP, StepModel
from traceinsight.causal.whatif import DATALOADER_FLOOR_NS
from traceinsight.model.classify import (
    BATCH_NORM_KERNELS,
    FUSED_OPTIMIZER_KERNELS,
    is_channels_first_kernel,
)

# a memory-bound fp32 kernel moves half the bytes in bf16 (the peaks' ratios are the device's:
# the build's fp32_time_ratio and tf32_time_ratio columns, from data/devices.toml)
BF16_MEMORY_RATIO = 0.5
# autocast's casts per matmul/convolution op: a Linear casts its input, weight and bias forward
# and their gradients back (about five casts) over its three matmuls (forward, input gradient,
# weight gradient). Counted 2.05 an op on GPT-2 (accumulated micro-batches recast each weight)
# and 1.13 on BERT (two forwards sharing the cached weight casts).
AUTOCAST_CASTS_PER_OP = 5 / 3
# a cast's host work: autocast's cached_cast -> aten::to -> _to_copy -> empty_strided + copy_
# and its launch, from C++ (no Python): taken as two of the trace's launch calls, the launch
# and the dispatcher's work around it
CAST_HOST_LAUNCHES = 2.0
SYNC_RETURN_NS = 2_000  # a call that no longer waits still costs its API overhead
GRAPH_LAUNCH_NS = 10_000  # one cudaGraphLaunch per step
# kernel-to-kernel gap inside a replayed CUDA graph, measured un-profiled on the H200: 0.25 us
# a node (the launch-bound loop's whole step, 3,625 nodes), 0.44 us (the same with the fused
# optimizer, 507 nodes), ~0.4 us (a chain of tiny kernels; benchmarks/graph_step_cost.py and
# graph_replay_cost.py)
GRAPH_GAP_NS = 400
# A recorded CUDA graph launch un-profiled: the replay() call took 2.9-29.2 us for graphs of
# 50-3,000 nodes (benchmarks/graph_replay_cost.py, H200), where profiled calls of RAFT's
# reduce-overhead graphs took 1.9-8.1 ms and its graphs' first kernels started 0.7 ms after
# the call began: CUPTI's per-node work, done only under the profiler.
GRAPH_LAUNCH_UNPROFILED_MAX_NS = 30_000
GRAPH_LAUNCH_CALL = r"^(cuda|hip|cu)GraphLaunch"
# A GPU op that started this long after everything the model knows let it start waited for
# something the trace does not hold (an event another process or an untraced stream records):
# a graph replays that wait too. The device's own gaps between queued kernels are microseconds;
# the largest such gap in the 60 H200 recordings is 2.3 ms (a graph replay's), SGLang's wait on
# its scheduler's event 463 ms.
UNTRACED_WAIT_MIN_NS = 5_000_000
DISPATCH_CAP_RATIO = 4.0  # op time before a launch beyond 4x the median is not dispatch
MIN_DISPATCH_CAP_NS = 20_000
# AdamW(foreach=False) runs about a dozen elementwise kernels per parameter, each a pass over
# it; the fused kernel reads params, grads and both moments once and writes three of them.
FUSED_OPTIMIZER_GPU_RATIO = 0.25


# A transform touching less than this share of the GPU op time cannot move the step by more,
# so it is not replayed (a replay is the model's cost).
NEGLIGIBLE_RATIO = 0.005


@dataclass(frozen=True)
class Transform:
    """A fix as a change of the model: its name, the function, and the columns it reads beyond
    the graph's own (causal/graph.py ``HOST_GRAPH_COLUMNS``/``GPU_GRAPH_COLUMNS``): what a
    node is (``kind``, ``kernel_class``, ...) or a flag the build sets (causal/build.py
    ``HOST_FLAGS``/``GPU_FLAGS``)."""

    name: str
    apply: Callable[[StepModel], StepModel | None]
    host_reads: frozenset[str] = frozenset()
    gpu_reads: frozenset[str] = frozenset()
    # why it cannot price this model although it has something to change (the data it needs
    # is missing), None where it can; asked only where ``apply`` returned None
    unpriced: Callable[[StepModel], str | None] | None = None

    def __call__(self, model: StepModel) -> StepModel | None:
        return self.apply(model)

    @property
    def assumes(self) -> str:
        """What the prediction assumes: the function's docstring, one paragraph."""
        return " ".join((self.apply.__doc__ or "").split())


def _share(g: pl.DataFrame, which: pl.Expr, col: str) -> float:
    total = g.get_column("dur_ns").sum()
    return float(g.filter(which).get_column(col).sum()) / total if total else 0.0


# a collective's kernel (NCCL, RCCL, DeepEP): what a communication stream runs
_COLLECTIVE = (pl.col("kind") == "kernel") & (
    pl.col("kernel_class").cast(pl.String) == "communication"
)


# collectives whose input the step computes (NCCL's and RCCL's kernel names)
REDUCING_COLLECTIVE = r"(?i)all_?reduce|reduce_?scatter|all_?to_?all|sendrecv|_send"


def _compute_chain(g: pl.DataFrame) -> int:
    """The compute stream: the chain with the most kernel time outside communication (a copy
    or collective stream can be busier)."""
    compute = (pl.col("kind") == "kernel") & ~_COLLECTIVE
    busy = (
        g.group_by("chain")
        .agg(pl.col("dur_ns").filter(compute).sum().alias("_k"), pl.col("dur_ns").sum())
        .sort("_k", "dur_ns", descending=True)
    )
    return int(busy["chain"][0])


def _host_blocks_off(model: StepModel, which: pl.Expr) -> StepModel:
    h = model.host.with_columns(
        pl.when(which).then(pl.lit(WAIT_NONE, pl.Int8)).otherwise(pl.col("wait")).alias("wait"),
        pl.when(which)
        .then(pl.min_horizontal("dur_ns", pl.lit(SYNC_RETURN_NS)))
        .otherwise(pl.col("dur_ns"))
        .alias("dur_ns"),
    )
    return model.with_host(h)


# A device sync that follows the thread's host-to-device copy is that copy's (.to(device)
# without non_blocking=True): the input copies' own fix, not host_sync's.
_INPUT_COPY_SYNC = (pl.col("wait") == WAIT_DEVICE) & (pl.col("after_copy") == "HtoD")


def remove_syncs(model: StepModel) -> StepModel | None:
    """The host syncs the advice removes return at once: device and stream syncs (``.item()``,
    ``print(tensor)``, a tensor-valued ``if``, ``synchronize()``) and blocking device-to-host
    read-backs (``.cpu()``, ``.tolist()``); the value read is assumed not needed by the host
    until later (read every N steps, or one step late). What stays: an input copy's sync
    (``.to(device)`` without ``non_blocking``: its own fix), a pageable host-to-device copy,
    cudaFree's implicit sync (the allocator's), a launch into a full queue. Where the wait
    moves to one of those, the replay finds it there."""
    which = (
        (pl.col("wait") == WAIT_DEVICE)
        & ~pl.col("is_alloc")
        & (pl.col("after_copy") != "HtoD").fill_null(True)
    ) | ((pl.col("wait") == WAIT_OWN_OP) & (pl.col("launched_copy") == "DtoH"))
    return _host_blocks_off(model, which) if model.host.select(which.any()).item() else None


def async_input_copies(model: StepModel) -> StepModel | None:
    """Input copies made asynchronous: batches in pinned memory copied with
    ``non_blocking=True``. The sync each ``.to(device)`` makes after its host-to-device copy
    goes, and a pageable host-to-device copy runs at pinned bandwidth without blocking the
    host (as :func:`pinned_copies`, for input copies only); the copy still runs on its stream
    before the work that reads it."""
    h = model.host
    if h.select(_INPUT_COPY_SYNC.any()).item():
        model = _host_blocks_off(model, _INPUT_COPY_SYNC)
        changed = True
    else:
        changed = False
    pinned = _pinned(model, pl.col("copy_kind") == "HtoD")
    return pinned if pinned is not None else (model if changed else None)


def remove_syncs_at(calls: pl.DataFrame) -> Transform:
    """:func:`remove_syncs` for some calls only (``calls``: tid, start_ns; one call site's
    syncs, say): those that waited for the GPU return at once, the others still wait."""

    def transform(model: StepModel) -> StepModel | None:
        hit = _host_rows_of(model, calls)
        which = (pl.int_range(pl.len()).is_in(hit.implode())) & (pl.col("wait") != WAIT_NONE)
        if not model.host.select(which.any()).item():
            return None
        return _host_blocks_off(model, which)

    return Transform("remove_syncs_at", transform)


def _host_rows_of(model: StepModel, calls: pl.DataFrame) -> pl.Series:
    """The host nodes (row numbers) that are ``calls`` (tid, start_ns: calls of the trace)."""
    keys = calls.select(pl.col("tid").cast(pl.Int64), pl.col("start_ns").cast(pl.Int64)).unique()
    return (
        model.host.select(pl.col("tid").cast(pl.Int64), "start_ns")
        .with_row_index("_n")
        .join(keys, on=["tid", "start_ns"])
        .get_column("_n")
    )


def pinned_copies(model: StepModel) -> StepModel | None:
    """Pageable copies through pinned memory at pinned bandwidth: a host-to-device copy runs
    async and the host goes on; a device-to-host read-back only runs faster, the host still
    waits for it (it needs the data; and the queued work the copy waits behind stays)."""
    return _pinned(model, pl.lit(True))


def _pinned(model: StepModel, which_copies: pl.Expr) -> StepModel | None:
    """:func:`pinned_copies` for the copies ``which_copies`` selects."""
    g = model.gpu
    pageable = (pl.col("kind") == "memcpy") & PAGEABLE_COPY & which_copies
    ops = g.filter(pageable)
    if ops.height == 0:
        return None
    g = g.with_columns(
        pl.when(pageable)
        .then(pinned_copy_ns("pinned_bytes_per_ns"))
        .otherwise(pl.col("dur_ns"))
        .alias("dur_ns")
    )
    # the call stages a pageable copy whether or not it outlasted the DMA: it all goes. A
    # read-back (device to host) is still waited for: the host needs the data (a pinned buffer
    # and non_blocking=True then an event wait), so only its copy gets faster.
    own = ops.filter(pl.col("copy_kind") != "DtoH").get_column("op").cast(pl.Int64).implode()
    which = pl.col("own_op").is_in(own)
    return _host_blocks_off(model.with_gpu(g), which)


def cuda_graphs(model: StepModel) -> StepModel | None:
    """The model's forward and backward captured as CUDA graphs (torch.compile
    mode="reduce-overhead", the recommended fix): inside a step, the host's time in torch ops
    (dispatch, launches) goes, one graph launch at the step's start, graph kernels back to
    back at the graph's gap. What such a capture leaves in place stays: the Python outside any
    op (the user's own host work), data loading, the optimizer step (eager unless compiled
    on its own), and the syncs and read-backs a graph cannot hold (host_sync's fix removes
    those). Allocator calls go: the captured work allocates from the graph's pool."""
    return _graphed(model, optimizer_captured=False)


def cuda_graphs_whole_step(model: StepModel) -> StepModel | None:
    """As :func:`cuda_graphs`, with the whole training step in one ``torch.cuda.graph`` (the
    optimizer's step captured too): a replay runs the step's kernels alone, none of the host's
    work between the captured calls (Python, dispatch, the ops' CPU work), at the graph's node
    gap; the loop's Python before the step's first captured call, the loader and the syncs
    stay. A per-parameter Adam(W) must be made capturable, which adds kernels on 0-dim tensors
    per parameter (priced at the optimizer's shortest kernel each); the fused one adds none.
    launch_bound's other priced fix (its ``evidence.what_if_whole_step``, a larger change than
    the model-only capture its saving rests on)."""
    return _graphed(model, optimizer_captured=True)


def _dispatch(h: pl.DataFrame, among: pl.Expr) -> pl.Expr:
    """The op time before each launch that is the op's dispatch: a few to tens of us a launch;
    far more op time before one launch is CPU work inside the op (cuDNN planning for a new
    shape, CPU math), which neither a graph nor a fusion removes: per call at most
    DISPATCH_CAP_RATIO x the median op time per launch of the launches ``among``."""
    typical = h.filter(among & pl.col("is_launch")).get_column("gap_ops_ns").median()
    cap = max(MIN_DISPATCH_CAP_NS, DISPATCH_CAP_RATIO * float(typical or 0))
    return pl.min_horizontal("gap_ops_ns", pl.lit(int(cap)))


def _graphed(model: StepModel, *, optimizer_captured: bool) -> StepModel | None:
    h = model.host
    # Allocator calls and empty_cache's frees go too: the captured work's memory lives in the
    # graph's private pool, so the caching allocator stops churning (measured: a graphed loop
    # that calls empty_cache every step ran 3.25x faster, fixtures/h200/pairs/graphed.truth.json)
    eager = pl.col("in_dataloader") | (pl.col("wait") != WAIT_NONE)
    if not optimizer_captured:
        eager = eager | pl.col("in_optimizer")
    outside = eager & ~(pl.col("is_alloc") | pl.col("in_empty_cache"))
    captured = (pl.col("step") >= 0) & ~outside
    # torch.compile(model) captures the model's forward and backward, not the loop's other ops
    # (a loss outside the model, metrics, logging): where the trace names the model's calls
    # (Python stacks), only theirs are captured, and only their dispatch goes
    model_only = not optimizer_captured and h.select(pl.col("in_model").any()).item()
    if model_only:
        captured = captured & pl.col("in_model")
    if not h.select((captured & pl.col("is_launch")).any()).item():
        return None
    first = pl.int_range(pl.len()).over("tid", "step") == 0
    dispatch = _dispatch(h, captured)
    if model_only:
        dispatch = pl.min_horizontal(dispatch, "gap_model_ns")
    # the gap's host work a capture keeps: outside any op or beyond the dispatch, or in the
    # ranges it leaves eager
    kept = (
        (pl.col("gap_ns") - dispatch).clip(0)
        + pl.col("gap_dataloader_ns")
        + (0 if optimizer_captured else pl.col("gap_optimizer_ns"))
    )
    if optimizer_captured:
        # The whole step replayed as one graph runs none of its host work: between two
        # captured calls neither the Python nor the ops' own CPU work runs again (a replay is
        # the recorded GPU work alone); only the loader's stays, if its range reaches in. The
        # Python before a step's first captured call, or after an eager call (a wait, the
        # loader), is the loop's own and stays; so does a tensor made on the CPU (a graph
        # replays GPU work only).
        # (not a step's first call: the thread's previous call is in the same step)
        inside = captured & captured.shift(1).over("tid").fill_null(False) & ~first
        on_host = pl.col("gap_dataloader_ns") + pl.col("gap_host_input_ns")
        kept = pl.when(inside).then(on_host).otherwise(kept)
    kept = pl.min_horizontal(kept, "gap_ns")
    is_captured = h.select(captured).to_series()
    h = h.with_columns(
        pl.when((pl.col("step") >= 0) & first)
        .then(pl.lit(GRAPH_LAUNCH_NS) + kept)
        .when(pl.col("step") >= 0)
        .then(kept)
        .otherwise(pl.col("gap_ns"))
        .alias("gap_ns"),
        pl.when(captured).then(0).otherwise(pl.col("dur_ns")).alias("dur_ns"),
        # the op time a capture leaves, for the fixes applied after it (elementwise fusion
        # would otherwise take the captured dispatch off a second time)
        pl.when(captured)
        .then(pl.min_horizontal((pl.col("gap_ops_ns") - dispatch).clip(0), kept))
        .otherwise(pl.col("gap_ops_ns"))
        .alias("gap_ops_ns"),
    )
    graph_op = pl.col("launch").is_in(
        h.with_row_index("_n").filter(captured).get_column("_n").cast(pl.Int64).implode()
    )
    g = model.gpu
    gap = pl.min_horizontal("gap_ns", pl.lit(GRAPH_GAP_NS))
    if optimizer_captured:
        # a per-parameter Adam(W) made capturable launches more kernels, each on a 0-dim
        # tensor: priced at the optimizer's shortest kernel and a node gap each (causal/build.py
        # CAPTURABLE_ADAM_EXTRA_KERNELS; measured: the launch-bound loop's whole-step graph ran
        # 6.2 ms on the GPU, 3,625 nodes, against 2.7 ms of kernels eager)
        opt = g.filter(pl.col("in_optimizer") & (pl.col("kind") == "kernel"))
        shortest = int(opt.get_column("dur_ns").min() or 0) if opt.height else 0
        gap = gap + pl.col("capture_extra_kernels") * (shortest + GRAPH_GAP_NS)
    g = g.with_columns(
        # a graph keeps its waits on other streams (event edges are captured too), and on
        # what the trace does not show
        pl.when(graph_op & (pl.col("after_op") < 0) & (pl.col("gap_ns") < UNTRACED_WAIT_MIN_NS))
        .then(gap)
        .otherwise(pl.col("gap_ns"))
        .alias("gap_ns"),
        pl.when(graph_op).then(0).otherwise(pl.col("latency_ns")).alias("latency_ns"),
    )
    if "alone" in g.columns:
        g = _in_launch_order(h, g, is_captured)
    return StepModel(host=h, gpu=g, steps=model.steps)


def _in_launch_order(h: pl.DataFrame, g: pl.DataFrame, captured: pl.Series) -> pl.DataFrame:
    """Graph ops of streams that never ran beside their device's others in the recording
    (``alone``) start in launch order, one after another, within a run of captured calls on a
    thread: a replay keeps the order the event waits gave them, which the trace does not link.
    (cuDNN's LSTM over 11 streams: 2.60 ms of kernels a step ran in 2.35-2.41 ms as one graph,
    where independent streams replayed in 1.17 ms.) Each op's launch offset becomes the time the
    run's earlier such ops take beyond the host's own kept time before its call."""
    # the candidates first, from the GPU table alone: most models have none (one stream a
    # device), and the runs below cost a pass over every host call (3.7M on a 1 GB export)
    launch = g.get_column("launch")
    ops = (
        g.with_row_index("_i")
        .with_columns(captured.gather(launch.clip(0, max(h.height - 1, 0))).alias("_cap"))
        .filter(pl.col("alone") & (pl.col("launch") >= 0) & pl.col("_cap"))
        .select("_i", "device", "chain", "launch", "launch_key_ns", "dur_ns")
        # a device with one such stream: its own order holds them already
        .filter(pl.col("chain").n_unique().over("device") > 1)
    )
    if ops.height == 0:
        return g
    # the thread's chain as the replay runs it (an autograd burst joins the step thread's)
    tid = pl.col("chain_tid") if "chain_tid" in h.columns else pl.col("tid")
    key = ("tid", "step", "_run")
    runs = (
        h.select(
            pl.int_range(pl.len(), dtype=pl.Int64).alias("launch"),
            tid.alias("tid"),
            "step",
            (pl.col("gap_ns") + pl.col("dur_ns")).alias("_adv"),
            pl.col("gap_ns").alias("_gap"),
            pl.col("dur_ns").alias("_dur"),
            pl.lit(captured).alias("_captured"),
        )
        .with_columns(
            # a captured call continues the run of the call before it on its thread in its step
            (~pl.col("_captured")).cast(pl.Int64).cum_sum().over("tid", "step").alias("_run")
        )
        .with_columns(
            # the call's start after its run's first call's
            (
                pl.col("_adv").cum_sum().over(key)
                - pl.col("_dur")
                - pl.col("_gap").first().over(key)
            ).alias("_rel")
        )
        .select("launch", *key, "_rel")
    )
    ops = ops.join(runs, on="launch", how="inner").sort("launch_key_ns", maintain_order=True)
    cost = pl.col("dur_ns") + GRAPH_GAP_NS
    per = ("device", *key)
    ops = ops.with_columns(
        ((cost.cum_sum().over(per) - cost) - (pl.col("_rel") - pl.col("_rel").first().over(per)))
        .clip(0)
        .alias("_offset")
    )
    offset = (
        g.select(pl.int_range(pl.len(), dtype=pl.UInt32).alias("_i"))
        .join(ops.select("_i", "_offset"), on="_i", how="left", maintain_order="left")
        .get_column("_offset")
    )
    return g.with_columns(
        pl.when(offset.is_not_null())
        .then(offset)
        .otherwise(pl.col("launch_offset_ns"))
        .cast(g.schema["launch_offset_ns"])
        .alias("launch_offset_ns")
    )


def _drop_gap(h: pl.DataFrame, gap_col: str) -> list[pl.Expr]:
    """The gap's ``gap_col`` part gone: the gap less it, the column zeroed and the gap's other
    parts no longer than what is left of it (a later transform, a larger batch, scales them)."""
    left = (pl.col("gap_ns") - pl.col(gap_col)).clip(0)
    others = [c for c in SUBGAPS if c in h.columns and c != gap_col]
    return [
        left.alias("gap_ns"),
        pl.lit(0, h.schema[gap_col]).alias(gap_col),
        *(pl.min_horizontal(c, left).alias(c) for c in others),
    ]


def _drop_host(h: pl.DataFrame, gap_col: str, in_col: str) -> pl.DataFrame:
    """Host work in the ranges gone: the gap's share of them (:func:`_drop_gap`) and the calls
    inside them."""
    return h.with_columns(
        *_drop_gap(h, gap_col),
        pl.when(pl.col(in_col)).then(0).otherwise(pl.col("dur_ns")).alias("dur_ns"),
        pl.when(pl.col(in_col))
        .then(pl.lit(WAIT_NONE, pl.Int8))
        .otherwise(pl.col("wait"))
        .alias("wait"),
    )


def inputs_on_device(model: StepModel) -> StepModel | None:
    """The step's tensors made on the GPU (``torch.randn(..., device='cuda')``) instead of by
    CPU random fills (``gap_host_input_ns``: causal/columns.py HOST_INPUT_OPS): that host time
    goes; the fills' GPU kernels (microseconds) are not added, and the uploads are kept (the
    trace does not tie a copy to the tensor it carries)."""
    h = model.host
    if not h.select((pl.col("gap_host_input_ns") > 0).any()).item():
        return None
    return model.with_host(h.with_columns(_drop_gap(h, "gap_host_input_ns")))


def fused_optimizer(model: StepModel) -> StepModel | None:
    """``fused=True``: the optimizer's host work and launches become one launch, its kernels
    run back to back at :data:`FUSED_OPTIMIZER_GPU_RATIO` of their time. None where the step
    has no optimizer range or is fused already (a fused kernel inside it: audit s63, a fused
    AdamW's step priced 1.16x in the replay's what-ifs)."""
    g = model.gpu
    inside = g.filter(pl.col("in_optimizer"))
    if inside.height == 0:
        return None
    if inside.select(pl.col("name").str.contains(FUSED_OPTIMIZER_KERNELS).any()).item():
        return None
    g = g.with_columns(
        pl.when(pl.col("in_optimizer"))
        .then((pl.col("dur_ns") * FUSED_OPTIMIZER_GPU_RATIO).cast(pl.Int64))
        .otherwise(pl.col("dur_ns"))
        .alias("dur_ns"),
        pl.when(pl.col("in_optimizer")).then(0).otherwise(pl.col("gap_ns")).alias("gap_ns"),
    )
    if "capture_extra_kernels" in g.columns:  # the fused step is capturable as it is
        g = g.with_columns(pl.lit(0, pl.Int32).alias("capture_extra_kernels"))
    h = _drop_host(model.host, "gap_optimizer_ns", "in_optimizer")
    return StepModel(host=h, gpu=g, steps=model.steps)


def grads_set_to_none(model: StepModel) -> StepModel | None:
    """``optimizer.zero_grad(set_to_none=True)`` (PyTorch 2's default): the gradients are
    dropped rather than filled with zeros, so zero_grad's fill kernels, their launches and the
    host work of its range go (setting ``.grad = None`` takes well under a microsecond a
    parameter). The next backward then writes each gradient instead of adding to zeros: that
    saving is not counted."""
    return _range_removed(model, "zero_grad")


def _range_removed(model: StepModel, name: str) -> StepModel | None:
    """The work of the ``name`` ranges (causal/columns.py RANGES) gone: their host work and
    calls, and the GPU ops launched inside them (None: they launched none)."""
    g = model.gpu
    inside = pl.col(f"in_{name}")
    if not g.select(inside.any()).item():
        return None
    g = g.with_columns(
        pl.when(inside).then(0).otherwise(pl.col("dur_ns")).alias("dur_ns"),
        pl.when(inside).then(0).otherwise(pl.col("gap_ns")).alias("gap_ns"),
    )
    h = _drop_host(model.host, f"gap_{name}_ns", f"in_{name}")
    return StepModel(host=h, gpu=g, steps=model.steps)


def dataloader_floor(model: StepModel) -> StepModel | None:
    """The advised loader: batches prefetched by worker processes into pinned memory. The
    pin-memory thread receives each batch from the workers, so each wait in the step thread
    drops to :data:`~traceinsight.causal.whatif.DATALOADER_FLOOR_NS` (a workers-and-pinned
    trace: 0.05 ms a ``__next__``, no op), and its pageable copies become async. What the
    step thread still spends on the loader is what the gap keeps of it, so a transform after
    this one (a larger batch) scales only that: it assumes workers enough for the batch it
    loads (at k times the batch, k times the workers a batch needs now)."""
    h = model.host
    if not h.select((pl.col("gap_dataloader_ns") > 0).any()).item():
        return None
    floor = pl.min_horizontal("gap_dataloader_ns", pl.lit(DATALOADER_FLOOR_NS))
    h = h.with_columns(
        (pl.col("gap_ns") - pl.col("gap_dataloader_ns") + floor).alias("gap_ns"),
        floor.alias("gap_dataloader_ns"),
    )
    pinned = pinned_copies(model.with_host(h))
    return pinned if pinned is not None else model.with_host(h)


def dataloader_unpinned(model: StepModel) -> StepModel | None:
    """Workers without pin_memory: the step thread receives each batch itself (unpickling,
    each tensor rebuilt on its shared-memory storage), so its loader time per step drops to
    ``dataloader_floor_ns`` (causal/whatif.py receive_ns, by the tensors a batch carries), not
    to nothing; its copies stay as they are."""
    h = model.host
    if not h.select((pl.col("gap_dataloader_ns") > 0).any()).item():
        return None
    # the step's loader time, over however many gaps it spans, scaled down to the floor
    total = pl.col("gap_dataloader_ns").sum().over("tid", "step")
    share = (pl.col("dataloader_floor_ns") / total).clip(upper_bound=1.0)
    # (a gap without loader time keeps its 0: no share of a step's 0 total is taken)
    kept = (
        pl.when(pl.col("gap_dataloader_ns") > 0)
        .then((pl.col("gap_dataloader_ns") * share).cast(pl.Int64))
        .otherwise(pl.col("gap_dataloader_ns"))
    )
    return model.with_host(
        h.with_columns(
            (pl.col("gap_ns") - pl.col("gap_dataloader_ns") + kept).alias("gap_ns"),
            kept.alias("gap_dataloader_ns"),  # what a later transform (a larger batch) scales
        )
    )


def recompute_removed(model: StepModel) -> StepModel | None:
    """No activation checkpointing: the forward ops re-run inside backward disappear (host
    work, launches and their kernels)."""
    return _range_removed(model, "recompute")


def bf16_gemms(model: StepModel) -> StepModel | None:
    """The step under bf16 autocast. fp32 math on CUDA cores moves to bf16 tensor cores at the
    ratio of the device's datasheet peaks (fp32 / bf16, from data/devices.toml: 67 / 989.5 on
    an H200, 82.6 / 165 on an RTX 4090), TF32 tensor-core math at TF32 / bf16: real GEMMs reach
    a fraction of either peak, the same fraction assumed (bf16 GEMMs measured 8.7-13x faster
    than fp32 on the H200's BERT and GPT-2 loops). A matmul whose recorded shapes allow loads
    of only g < 8 elements (a 50,257-wide vocabulary: 1; 30,522: 2) takes 8/g that time, at
    most its fp32 time: the kernel is bound by issuing its loads (GPT-2's head measured 1.9-2.6x
    faster than fp32, priced 14.8 / 8 = 1.85x; BERT's 4.7x, priced 3.7x); without recorded
    shapes every matmul is taken as aligned.

    Where convolutions are most of the math, the elementwise and reduction kernels around them
    move half the bytes (a convolution's bf16 output feeds the activation in bf16), the
    optimizer's excepted (it updates fp32 parameters) and batch norm's (bf16 input with fp32
    parameters runs on ATen's own kernels, no faster than cuDNN's fp32 ones). Elsewhere they keep their
    time: autocast runs layer norm, softmax, pow and losses in fp32 and a transformer's
    residual stream stays fp32 (within 3% on the GPT-2 and BERT loops; a ReLU encoder, whose
    FFN activations stay bf16, took 0.54 of that time: there the prediction is 0.81 of the
    measured). Each matmul or convolution op adds :data:`AUTOCAST_CASTS_PER_OP` casts, each a
    kernel as long as the step's median elementwise kernel and host work of
    :data:`CAST_HOST_LAUNCHES` of its median launch calls before the op's first math kernel.
    A device the table lacks: no prediction."""
    g = model.gpu
    known = pl.col("fp32_time_ratio").is_not_null()
    tf32 = pl.col("tf32_math") & pl.col("tf32_time_ratio").is_not_null()
    # TF32 math alone counts too (cuDNN's default for fp32 convolutions)
    if _share(g, (pl.col("fp32_math") & known) | tf32, "dur_ns") < NEGLIGIBLE_RATIO:
        return None
    klass = pl.col("kernel_class").cast(pl.String)
    cast_ns = g.filter(klass == "elementwise").get_column("dur_ns").median() or 0
    h = model.host
    launch_ns = (
        h.filter(pl.col("is_launch") & (pl.col("wait") == WAIT_NONE)).get_column("dur_ns").median()
        or 0
    )
    dispatch_ns = CAST_HOST_LAUNCHES * float(launch_ns)
    casts = pl.col("opens_math_op") & (pl.col("fp32_math") | pl.col("tf32_math"))
    # a kernel that loads g elements at a time where aligned ones load 8 issues 8/g the loads
    unaligned = TENSOR_CORE_ALIGN_ELEMENTS / pl.col("align_16bit").cast(pl.Float64)
    per_class = g.group_by(klass.alias("k")).agg(pl.col("dur_ns").sum())
    by_class = dict(zip(per_class.get_column("k"), per_class.get_column("dur_ns"), strict=True))
    convolutional = by_class.get("conv", 0) > by_class.get("gemm", 0) + by_class.get("attention", 0)
    # the optimizer's kernels update the fp32 parameters and moments whatever autocast does
    # batch norm is kept: autocast hands it bf16 input with fp32 parameters, which only ATen's
    # own kernels take, in no less time than cuDNN's fp32 ones (model/classify.py)
    names = g.get_column("name").unique()  # matched once per distinct name
    batch_norm = names.filter(names.str.to_lowercase().str.contains(BATCH_NORM_KERNELS))
    memory_bound = (
        klass.is_in(["elementwise", "reduction"])
        & pl.lit(convolutional)
        & ~pl.col("in_optimizer")
        & ~pl.col("name").is_in(batch_norm.implode())
    )
    g = g.with_columns(
        (
            pl.when(pl.col("fp32_math") & known)
            .then(pl.col("dur_ns") * (pl.col("fp32_time_ratio") * unaligned).clip(upper_bound=1))
            .when(pl.col("tf32_math") & pl.col("tf32_time_ratio").is_not_null())
            .then(pl.col("dur_ns") * (pl.col("tf32_time_ratio") * unaligned).clip(upper_bound=1))
            .when(memory_bound)
            .then(pl.col("dur_ns") * BF16_MEMORY_RATIO)
            .otherwise(pl.col("dur_ns"))
            + pl.when(casts).then(AUTOCAST_CASTS_PER_OP * float(cast_ns)).otherwise(0.0)
        )
        .cast(pl.Int64)
        .alias("dur_ns")
    )
    launches = g.filter(casts & (pl.col("launch") >= 0)).get_column("launch")
    # where SDPA would take cuDNN's attention in bf16, its graph builds for each step's new
    # shapes (causal/build.py sdpa_plan_ns) hold the host before the attention's first launch
    plans = g.filter((pl.col("sdpa_plan_ns") > 0) & (pl.col("launch") >= 0)).select(
        "launch", "sdpa_plan_ns"
    )
    if (launches.len() and dispatch_ns) or plans.height:
        extra = int(AUTOCAST_CASTS_PER_OP * float(dispatch_ns))
        hit = pl.int_range(pl.len()).is_in(launches.implode())
        plan = pl.repeat(0, h.height, dtype=pl.Int64, eager=True)
        if plans.height:
            per = plans.group_by("launch").agg(pl.col("sdpa_plan_ns").sum())
            plan = plan.scatter(per.get_column("launch"), per.get_column("sdpa_plan_ns"))
        h = h.with_columns(
            (pl.col(c) + pl.when(hit).then(extra).otherwise(0) + plan).alias(c)
            for c in ("gap_ns", "gap_ops_ns")
        )
        return StepModel(host=h, gpu=g, steps=model.steps)
    return model.with_gpu(g)


def channels_last_layers(model: StepModel) -> StepModel | None:
    """The model and its inputs in channels_last: the depthwise layers that ran on ATen's
    channels-first kernels (``conv_depthwise2d_*``: PyTorch's own direct convolutions, which it
    picks for NCHW depthwise layers) and the batch norms that ran on cuDNN's channels-first
    kernels run on cuDNN's NHWC ones, each layer in the time its bytes take at the device's
    memory bandwidth (batch norm at 0.7 of it, as measured; causal/build.py
    ``channels_last_ns``, from the recorded shapes), and cuDNN's layout transposes go, except
    for layers whose channels cuDNN's NHWC kernels cannot load as vectors (kept as they ran). Measured in channels_last: EfficientNet-B0's depthwise layers
    2.4 ms a step (1.95 priced; 21.5 on ATen's), its batch norm 8.3 ms (22.8 in NCHW);
    MobileNetV2's 0.6 and 2.3 ms (4.2 and 5.7). The other convolutions are kept as they ran
    (EfficientNet's took 9.2 ms in channels_last against 5.7: the saving is an upper bound
    there)."""
    g = model.gpu
    hit = pl.col("channels_last_ns").is_not_null()
    if not g.select(hit.any()).item():
        return None
    return model.with_gpu(
        g.with_columns(
            pl.when(hit)
            .then(pl.min_horizontal("channels_last_ns", "dur_ns"))
            .otherwise(pl.col("dur_ns"))
            .alias("dur_ns")
        )
    )


def no_empty_cache(model: StepModel) -> StepModel | None:
    """No ``empty_cache`` and no allocator churn: the caching allocator keeps its blocks, so
    ``cudaFree``/``cudaMalloc`` calls (and the device sync cudaFree implies) go away."""
    h = model.host
    which = pl.col("is_alloc") | pl.col("in_empty_cache")
    if not h.select(which.any()).item():
        return None
    h = h.with_columns(
        (pl.col("gap_ns") - pl.col("gap_empty_cache_ns")).clip(0).alias("gap_ns"),
        pl.when(which).then(0).otherwise(pl.col("dur_ns")).alias("dur_ns"),
        pl.when(which).then(pl.lit(WAIT_NONE, pl.Int8)).otherwise(pl.col("wait")).alias("wait"),
    )
    return model.with_host(h)


# a side stream whose copies take at least this share of its busy time is a copy stream
COPY_STREAM_MIN_RATIO = 0.5


def comm_overlapped(model: StepModel) -> StepModel | None:
    """Side-stream work overlapped with compute (DDP buckets, FSDP prefetch, a copy stream):
    on every stream but the compute one that communicates or copies, the delays no edge
    explains go, so the work starts when launched (work queued before the window at the
    window's start). Where the compute stream waited for side work (``after_op``), it still
    waits, but only for what the compute since its previous such wait could not hide: an
    overlap saves at most the compute time it hides behind. Assumes the engines do not slow
    each other down (measured on the H200 comm pair: 10.71 ms overlapped against 10.46 ms of
    compute alone)."""
    g = model.gpu
    if g.get_column("chain").n_unique() < 2:
        return None
    main = _compute_chain(g)
    # side chains that communicate or copy; compute on a side stream of its own keeps its
    # delays (audit 20: DeepSeek-V3's expert GEMMs on their own stream freed with the
    # all-to-all, 6.27 ms saved of 4.16 ms exposed)
    # a copy stream is one whose time is mostly copies: a compute stream that reads back a few
    # bytes (TorchRec's 8-byte device-to-host copies among its kernels, which waited on a
    # collective launched before the capture: 109 ms a step priced where 32 ms of
    # communication is exposed, session 53) keeps its delays
    copy_time = pl.col("dur_ns").filter(pl.col("kind") == "memcpy").sum().over("chain")
    copies = copy_time >= COPY_STREAM_MIN_RATIO * pl.col("dur_ns").sum().over("chain")
    moving = (pl.col("kernel_class") == "communication").any().over("chain") | copies
    on_side = (pl.col("chain") != main) & moving
    waits = on_side | (pl.col("after_op") >= 0)
    if _share(g, waits, "gap_ns") < NEGLIGIBLE_RATIO:
        return None
    return _side_overlapped(model, main, on_side)


def _side_overlapped(model: StepModel, main: int, on_side: pl.Expr) -> StepModel:
    """:func:`comm_overlapped` for the side work ``on_side`` selects (whole chains)."""
    g = model.gpu
    side_ops = g.filter(on_side)
    side = side_ops.get_column("op").cast(pl.Int64).implode()
    waits_side = (pl.col("chain") == main) & pl.col("after_op").is_in(side)
    # rows are in chain order: a wait opens a segment; the one before it ran since the
    # previous wait, the compute the side work can hide behind
    g = g.with_columns(waits_side.cum_sum().over("chain").alias("_seg"))
    seg_busy = pl.col("dur_ns").sum().over("chain", "_seg")
    hidden = seg_busy.shift(1).over("chain")
    # ... less what ran before a reduction's input was ready: a collective that reduces what
    # the compute made (all-reduce, reduce-scatter, all-to-all, send) and waited for a compute
    # op hides only behind the compute after that op (audit s61: Megatron's tensor-parallel
    # all-reduces each wait for the GEMM before them, and the next op reads their result;
    # 29-70 ms priced of none). A gather of parameters or a copy from the host waits only to
    # keep the streams' order: prefetched, it runs beside that compute. Compute run up to each
    # main op, per main op:
    ran = g.filter(pl.col("chain") == main).select(
        pl.col("op").cast(pl.Int64).alias("_p"),
        pl.col("dur_ns").cum_sum().alias("_ran"),
    )
    reducing = pl.col("name").cast(pl.String).str.contains(REDUCING_COLLECTIVE)
    producer = side_ops.filter((pl.col("after_op") >= 0) & reducing).select(
        pl.col("op").cast(pl.Int64).alias("_s"), pl.col("after_op").alias("_p")
    )
    ready = producer.join(ran, on="_p", how="inner").select("_s", pl.col("_ran").alias("_ready"))
    g = g.with_columns(
        pl.when(waits_side).then(pl.col("after_op")).alias("_s"),
        (pl.col("dur_ns").cum_sum() - pl.col("dur_ns")).over("chain").alias("_before"),
    ).join(ready, on="_s", how="left", maintain_order="left")
    after_input = (pl.col("_before") - pl.col("_ready")).clip(0)
    hidden = pl.min_horizontal(hidden, after_input)
    # (such a reduction keeps its own wait for its input: it starts no sooner)
    fed = pl.col("op").cast(pl.Int64).is_in(ready.get_column("_s").implode())
    g = g.with_columns(
        pl.when(on_side & ~fed)
        .then(0)
        .when(waits_side)
        .then(pl.max_horizontal(pl.col("after_lag_ns"), pl.col("gap_ns") - hidden.fill_null(0)))
        .otherwise(pl.col("gap_ns"))
        .alias("gap_ns"),
        pl.when(on_side & ~pl.col("launched"))
        .then(pl.col("start_ns").min())
        .otherwise(pl.col("start_ns"))
        .alias("start_ns"),
    ).drop("_seg", "_s", "_before", "_ready")
    return model.with_gpu(g)


def h2d_overlapped(model: StepModel) -> StepModel | None:
    """Host-to-device copies prefetched on a side stream from pinned memory (non_blocking):
    copies on the compute stream leave its chain for a copy stream of their own (one more
    chain, in their order, each starting when launched: while the compute runs) and the host
    no longer waits for them; copies already on a side stream start as launched, without
    waiting for compute (as :func:`comm_overlapped`). The copy engine still takes as long as
    the copies do: an overlap hides them behind compute, it cannot save more than that (an
    export bound by 25 GB of copies and 22 ms of kernels gains 2%, not 95%)."""
    g = model.gpu
    copies = pl.col("kind") == "memcpy"
    h2d = copies & (pl.col("copy_kind") == "HtoD")
    if _share(g, copies, "dur_ns") < NEGLIGIBLE_RATIO:
        return None
    main = _compute_chain(g)
    on_main = h2d & (pl.col("chain") == main)
    own = g.filter(on_main).get_column("op").cast(pl.Int64).implode()
    prefetch = int(g.get_column("chain").max()) + 1
    g = g.with_columns(
        pl.when(on_main).then(pl.lit(prefetch)).otherwise(pl.col("chain")).alias("chain"),
        pl.when(on_main).then(0).otherwise(pl.col("gap_ns")).alias("gap_ns"),
    )
    out = _host_blocks_off(model.with_gpu(g), pl.col("own_op").is_in(own))
    # the copy streams: side chains with host-to-device copies and no collective; a
    # collective's stream keeps its waits: overlapping it is comm_overlapped's fix (an HTA
    # trace's pinned side-stream copies, 3.4 ms a step, were priced at the 25 ms the NCCL
    # streams' overlap saves)
    copy_chains = (
        g.group_by("chain")
        .agg(_COLLECTIVE.any().alias("_comm"), h2d.any().alias("_h2d"))
        .filter(~pl.col("_comm") & pl.col("_h2d") & (pl.col("chain") != main))
        .get_column("chain")
    )
    if copy_chains.len():
        return _side_overlapped(out, main, pl.col("chain").is_in(copy_chains.implode()))
    return out


# The kernels a fusing compiler merges: pointwise ops, and the reductions they feed or follow
# (inductor fuses a norm's or softmax's pointwise prologue and epilogue into its reduction). On a
# held-out GPT-2 (eager attention, gelu_new, bf16) torch.compile's default mode measured 2.43x;
# runs of elementwise kernels alone priced 1.44x, with the reductions 1.97x, with the fused ops'
# dispatch gone too 2.04x, each run priced by its first and last kernels 2.63x (inductor also
# padded the GEMMs: gemm_shape_inefficient's fix).
# Inductor's own kernels (triton_*) are already fused: consecutive ones could not be merged.
FUSED_CLASSES: tuple[str, ...] = ("elementwise", "reduction")
COMPILED_KERNELS = r"^triton_"


def elementwise_fused(model: StepModel) -> StepModel | None:
    """Chains of elementwise kernels fused (torch.compile, fused norms): a run of consecutive
    elementwise and reduction kernels on one stream (:data:`FUSED_CLASSES`) becomes one kernel.
    Memory-bound, the fused kernel reads the run's input and writes its output once: it takes
    the mean of the run's first and last kernels, which read that input and wrote that output
    (the longest kernel, often an intermediate the eager ops widen to fp32, overstates it); the
    other launches go, with their host calls and their ops' dispatch. The Python outside any op is kept: for torch.compile the estimate
    assumes the model compiles without graph breaks and keeps the rest of the host's work."""
    g = model.gpu
    ew = (
        pl.col("kernel_class").cast(pl.String).is_in(list(FUSED_CLASSES))
        & ~pl.col("name").cast(pl.String).str.contains(COMPILED_KERNELS).fill_null(False)
    ).alias("_ew")
    # rows are in chain order: a run starts where the chain or the elementwise flag changes
    flags = g.select(pl.col("chain"), ew)
    starts = (
        (flags["chain"] != flags["chain"].shift(1)) | (flags["_ew"] != flags["_ew"].shift(1))
    ).fill_null(True) | ~flags["_ew"]
    run = starts.cum_sum().alias("_run")
    runs = (
        pl.DataFrame({"_run": run, "_ew": flags["_ew"], "dur_ns": g["dur_ns"]})
        .group_by("_run")
        .agg(
            pl.len().alias("_n"),
            ((pl.col("dur_ns").first() + pl.col("dur_ns").last()) // 2).alias("_fused_ns"),
        )
    )
    per_row = pl.DataFrame({"_run": run}).join(runs, on="_run", how="left", maintain_order="left")
    fused = flags["_ew"] & (per_row["_n"] > 1)
    gone = fused & ~starts
    if g.height == 0 or float(g["dur_ns"].filter(gone).sum()) < NEGLIGIBLE_RATIO * float(
        g["dur_ns"].sum()
    ):
        return None
    head = fused & starts
    g = g.with_columns(
        pl.when(head).then(per_row["_fused_ns"]).otherwise(pl.col("dur_ns")).alias("dur_ns")
    )
    return _kernels_gone(model, g, gone)


def _kernels_gone(model: StepModel, g: pl.DataFrame, gone: pl.Series) -> StepModel:
    """``model`` with its GPU table ``g`` less the kernels flagged ``gone`` (their time, wait
    and latency), and each host call whose launches all went, with its op's dispatch: a
    fusion's (one op for the chain, or a compiled graph's one launch). A host call goes only
    where all its launches went: a CUDA graph's launch replays many kernels, and one call can
    launch kernels that stay."""
    launches = pl.DataFrame({"launch": g["launch"], "_gone": gone}).filter(pl.col("launch") >= 0)
    dropped = (
        launches.group_by("launch")
        .agg(pl.col("_gone").all())
        .filter(pl.col("_gone"))
        .get_column("launch")
        .implode()
    )
    g = g.with_columns(
        pl.when(gone).then(0).otherwise(pl.col(c)).alias(c)
        for c in ("dur_ns", "gap_ns", "latency_ns")
    )
    h = model.host
    gone_call = pl.col("node").cast(pl.Int64).is_in(dropped)
    # the dropped launch's op time before it, capped as a graph's capture caps it
    # (:func:`_graphed`); the Python outside any op stays. A held-out GPT-2 whose fused step
    # the eager host then bounded at 56.8 ms: the default compile ran 46.2
    dispatch = _dispatch(h, pl.lit(True))
    h = h.with_columns(
        pl.when(gone_call).then(0).otherwise(pl.col("dur_ns")).alias("dur_ns"),
        pl.when(gone_call)
        .then((pl.col("gap_ns") - dispatch).clip(0))
        .otherwise(pl.col("gap_ns"))
        .alias("gap_ns"),
        # what is left of the op time, for the fixes applied after this one (a dispatch
        # removed once: a CUDA graph's capture had taken it already where it ran first)
        pl.when(gone_call)
        .then((pl.col("gap_ops_ns") - dispatch).clip(0))
        .otherwise(pl.col("gap_ops_ns"))
        .alias("gap_ops_ns"),
    )
    return StepModel(host=h, gpu=g, steps=model.steps)


def combined(steps: list[Transform]) -> Transform:
    """One transform applying each of ``steps`` in turn (None where none of them changes the
    model): fixes made together, each saving counted once."""

    def apply(m: StepModel) -> StepModel | None:
        changed = False
        for step in steps:
            nxt = step(m)
            if nxt is not None:
                m, changed = nxt, True
        return m if changed else None

    return Transform("+".join(s.name for s in steps), apply)


_PAGEABLE = frozenset({"kind", "src_kind", "dst_kind", "bytes", "copy_kind", "pinned_bytes_per_ns"})
_OVERLAP = frozenset({"kind", "kernel_class", "name"})


def _t(
    fn: Callable[[StepModel], StepModel | None],
    host: frozenset[str] | set[str] = frozenset(),
    gpu: frozenset[str] | set[str] = frozenset(),
    unpriced: Callable[[StepModel], str | None] | None = None,
) -> Transform:
    return Transform(fn.__name__, fn, frozenset(host), frozenset(gpu), unpriced)


def _channels_last_unpriced(model: StepModel) -> str | None:
    """ATen's depthwise kernels or cuDNN's channels-first batch norm the build could not price
    (no recorded shapes, or a device whose bandwidth the table lacks)."""
    g = model.gpu
    names = g.get_column("name").unique()  # matched once per distinct name
    hits = names.filter(is_channels_first_kernel(names))
    if hits.len() == 0:
        return None
    changed = (pl.col("kind") == "kernel") & pl.col("name").is_in(hits.implode())
    if _share(g, changed & pl.col("channels_last_ns").is_null(), "dur_ns") < NEGLIGIBLE_RATIO:
        return None
    return (
        "the depthwise and batch norm layers' bytes need their recorded shapes "
        "(record_shapes=True) and the device's memory bandwidth (data/devices.toml): no "
        "prediction for channels_last"
    )


def _bf16_unpriced(model: StepModel) -> str | None:
    """fp32 math on a device whose peaks the table lacks: bf16_gemms cannot price it."""
    unknown = pl.col("fp32_math") & pl.col("fp32_time_ratio").is_null()
    if _share(model.gpu, unknown, "dur_ns") < NEGLIGIBLE_RATIO:
        return None
    return (
        "the device's fp32 and bf16 peaks are not in the spec table (data/devices.toml): "
        "no prediction for moving its fp32 math to bf16"
    )


# Both captures read the same host columns: they differ only in whether the optimizer is kept.
_GRAPH_HOST = frozenset(
    {
        "in_optimizer",
        "in_dataloader",
        "in_empty_cache",
        "is_alloc",
        "is_launch",
        "step",
        "gap_ops_ns",
        "gap_dataloader_ns",
        "gap_optimizer_ns",
        "gap_host_input_ns",
        "in_model",
        "gap_model_ns",
    }
)

TRANSFORMS: dict[str, Transform] = {
    t.name: t
    for t in (
        _t(remove_syncs, host={"is_alloc", "after_copy", "launched_copy"}),
        _t(async_input_copies, host={"after_copy"}, gpu=_PAGEABLE | {"copy_kind"}),
        _t(pinned_copies, gpu=_PAGEABLE),
        _t(cuda_graphs, host=_GRAPH_HOST, gpu={"alone", "device"}),
        _t(
            cuda_graphs_whole_step,
            host=_GRAPH_HOST,
            gpu={"in_optimizer", "kind", "capture_extra_kernels", "alone", "device"},
        ),
        _t(
            fused_optimizer,
            host={"gap_optimizer_ns", "in_optimizer"},
            gpu={"in_optimizer", "name"},  # the kernels' names: fused already or not
        ),
        _t(grads_set_to_none, host={"gap_zero_grad_ns", "in_zero_grad"}, gpu={"in_zero_grad"}),
        _t(inputs_on_device, host={"gap_host_input_ns"}),
        _t(dataloader_floor, host={"gap_dataloader_ns"}, gpu=_PAGEABLE),
        _t(dataloader_unpinned, host={"gap_dataloader_ns", "dataloader_floor_ns", "step"}),
        _t(recompute_removed, host={"gap_recompute_ns", "in_recompute"}, gpu={"in_recompute"}),
        _t(
            channels_last_layers,
            gpu={"channels_last_ns", "name", "kind"},
            unpriced=_channels_last_unpriced,
        ),
        _t(
            bf16_gemms,
            host={"is_launch", "gap_ops_ns"},
            gpu={
                "fp32_math",
                "tf32_math",
                "kernel_class",
                "fp32_time_ratio",
                "tf32_time_ratio",
                "opens_math_op",
                "align_16bit",
                "in_optimizer",
                "name",  # batch norm's kernels keep their time
                "sdpa_plan_ns",
            },
            unpriced=_bf16_unpriced,
        ),
        _t(no_empty_cache, host={"is_alloc", "in_empty_cache", "gap_empty_cache_ns"}),
        _t(comm_overlapped, gpu=_OVERLAP),
        _t(h2d_overlapped, gpu=_OVERLAP | {"copy_kind"}),
        _t(elementwise_fused, host={"is_launch", "gap_ops_ns"}, gpu={"kernel_class", "name"}),
    )
}


def bf16_gemms_known_shapes(model: StepModel) -> StepModel | None:
    """:func:`bf16_gemms` in a run that has met every attention shape before: no cuDNN graph
    builds (causal/build.py ``sdpa_plan_ns``). The other end of the bf16 saving where SDPA
    would take cuDNN's attention and the window met new shapes: how often a run's shapes recur
    the trace cannot tell. None where the model has no such builds."""
    g = model.gpu
    if "sdpa_plan_ns" not in g.columns or not (g.get_column("sdpa_plan_ns") > 0).any():
        return None
    return bf16_gemms(model.with_gpu(g.with_columns(pl.lit(0, pl.Int64).alias("sdpa_plan_ns"))))


# not among TRANSFORMS (no what-if of its own): fp32_compute asks for it where builds are priced
BF16_KNOWN_SHAPES = _t(
    bf16_gemms_known_shapes,
    host=TRANSFORMS["bf16_gemms"].host_reads,
    gpu=TRANSFORMS["bf16_gemms"].gpu_reads,
)


# Which engine bounds the step: each one made ENGINE_SPEEDUP times faster on its own, the rest
# as it is; the step follows the engine it is bound by (the others absorb the change).
ENGINE_SPEEDUP = 2.0


def engine_faster(engine: str) -> Transform:
    """``host`` (host work between calls and the calls' own time; blocked calls still wait for
    what they wait for), ``kernels`` (the SMs) or ``copies`` (copies and memsets: the copy
    engines) running ENGINE_SPEEDUP times faster."""

    def faster(model: StepModel) -> StepModel | None:
        if engine == "host":
            h = model.host
            own = pl.col("wait") == WAIT_NONE
            h = h.with_columns(
                (pl.col("gap_ns") / ENGINE_SPEEDUP).cast(pl.Int64).alias("gap_ns"),
                pl.when(own)
                .then((pl.col("dur_ns") / ENGINE_SPEEDUP).cast(pl.Int64))
                .otherwise(pl.col("dur_ns"))
                .alias("dur_ns"),
            )
            return model.with_host(h)
        which = pl.col("kind") == "kernel" if engine == "kernels" else pl.col("kind") != "kernel"
        g = model.gpu
        if not g.select(which.any()).item():
            return None
        return model.with_gpu(
            g.with_columns(
                pl.when(which)
                .then((pl.col("dur_ns") / ENGINE_SPEEDUP).cast(pl.Int64))
                .otherwise(pl.col("dur_ns"))
                .alias("dur_ns")
            )
        )

    return Transform(f"engine_faster_{engine}", faster, gpu_reads=frozenset({"kind"}))


ENGINES = ("host", "kernels", "copies")


def without_profiler(model: StepModel, ns_per_event: float) -> StepModel:
    """The host as it runs un-profiled: each recorded event (op, annotation, Python frame,
    runtime call) cost the profiler ``ns_per_event`` of host time, taken from the gap it lies
    in (and from a call's own duration for the call, at most half of it). Waits stay: they end
    with the GPU. The sub-gaps the transforms read shrink in proportion.

    ``ns_per_event`` is a mean over kinds of events that cost the profiler unlike amounts (on
    nanoGPT's main thread ~1.3 us a Python frame, ~4.1 us an op, the mean 2.9 as the no-work op
    says): where frames crowd a gap, their share at the mean exceeds the gap, and what the gap
    cannot give was spent by the dearer events elsewhere in the thread's step. So each
    thread's step gives up its events' whole share: a gap's shortfall is taken from the
    thread's other gaps of that step in proportion to what they keep (the DataLoader's wait
    left whole: it ends with the workers, not the host)."""
    h = model.host
    want = (pl.col("recorded_events") - 1) * ns_per_event
    own = (pl.col("gap_ns") - want).clip(0)  # the gap after its own events' share
    keep = pl.when(pl.col("gap_ns") > 0).then(own / pl.col("gap_ns")).otherwise(1.0)
    h = h.with_columns((pl.col(c) * keep).cast(pl.Int64).alias(c) for c in SUBGAPS).with_columns(
        own.cast(pl.Int64).alias("gap_ns"),
        (want - pl.col("gap_ns")).clip(0).alias("_short"),
        pl.when(pl.col("wait") == WAIT_NONE)
        .then(
            pl.col("dur_ns") - pl.min_horizontal(pl.col("dur_ns") // 2, pl.lit(int(ns_per_event)))
        )
        .otherwise(pl.col("dur_ns"))
        .alias("dur_ns"),
    )
    # the shortfall, from what the thread's other gaps of the step keep outside the loader's
    # wait: every such part of a gap shrinks by the same share
    loader = "gap_dataloader_ns" if "gap_dataloader_ns" in h.columns else None
    free = (pl.col("gap_ns") - (pl.col(loader) if loader else 0)).clip(0)
    by = ["tid", "step"] if "step" in h.columns else ["tid"]
    share = (
        (pl.col("_short").sum().over(by) / free.sum().over(by))
        .fill_nan(0.0)
        .fill_null(0.0)
        .clip(0.0, 1.0)
    )
    h = h.with_columns(share.alias("_share"))
    cut = 1.0 - pl.col("_share")
    h = h.with_columns(
        (pl.col("gap_ns") - (free * pl.col("_share"))).cast(pl.Int64).alias("gap_ns"),
        *((pl.col(c) * cut).cast(pl.Int64).alias(c) for c in SUBGAPS if c != loader),
    )
    return _graph_launches_unprofiled(
        model.with_host(_compiled_launches_capped(h.drop("_short", "_share")))
    )


def _graph_launches_unprofiled(model: StepModel) -> StepModel:
    """Recorded CUDA graph launches at their un-profiled cost: each call at most
    :data:`GRAPH_LAUNCH_UNPROFILED_MAX_NS`, and each graph's first kernel on a stream no later
    after the call than a replayed node after the previous one (:data:`GRAPH_GAP_NS`)."""
    h, g = model.host, model.gpu
    graph = pl.col("name").str.contains(GRAPH_LAUNCH_CALL)
    if not h.select(graph.any()).item():
        return model
    rows = h.select(graph.arg_true()).to_series().implode()
    h = h.with_columns(
        pl.when(graph)
        .then(pl.min_horizontal("dur_ns", pl.lit(GRAPH_LAUNCH_UNPROFILED_MAX_NS)))
        .otherwise(pl.col("dur_ns"))
        .alias("dur_ns")
    )
    first = pl.col("launch").is_in(rows) & (
        pl.col("launch") != pl.col("launch").shift(1).over("chain")
    ).fill_null(True)
    g = g.with_columns(
        pl.when(first)
        .then(pl.min_horizontal("gap_ns", pl.lit(GRAPH_GAP_NS)))
        .otherwise(pl.col("gap_ns"))
        .alias("gap_ns")
    )
    return model.with_host(h).with_gpu(g)


def _compiled_launches_capped(h: pl.DataFrame) -> pl.DataFrame:
    """Inductor's Triton launches no dearer than the thread's eager launches: with the profiler
    on, each launch runs Python that runs only then (get_profiler_kwargs, the arguments packed
    for the RecordFunctionFast that records it), before its op starts, so outside every
    recorded op (nanoGPT's compiled loop with stacks: get_profiler_kwargs 10.3 us median a
    launch, the launch's ``run`` 90 us). Un-profiled, the wrapper's line, the autotuner's
    ``run`` and the compiled launcher do no more host work than an eager op's Python and
    dispatch: a compiled launch's time outside recorded ops (``gap_outside_ops_ns``, the
    per-event cost taken out) is capped at the median such time of the modelled steps' eager
    launches, a bound, since an eager op's Python does more than the compiled wrapper's line.
    What recorded ranges hold (a DataLoader wait, recompute, Dynamo's guards, the optimizer)
    stays whole (the review of session 40: capping the whole gap took a 6 ms loader wait)."""
    need = ("compiled_launch", "is_launch", "step", "gap_outside_ops_ns")
    if any(c not in h.columns for c in need) or not h.get_column("compiled_launch").any():
        return h
    eager = (
        pl.col("is_launch")
        & ~pl.col("compiled_launch")
        & (pl.col("wait") == WAIT_NONE)
        & (pl.col("step") >= 0)
    )
    cap = pl.col("gap_outside_ops_ns").filter(eager).median().cast(pl.Int64)
    excess = (
        pl.when(pl.col("compiled_launch"))
        .then((pl.col("gap_outside_ops_ns") - cap).clip(0))
        .otherwise(0)
        .fill_null(0)
    )
    return (
        h.with_columns(excess.alias("_excess"))
        .with_columns(
            (pl.col("gap_ns") - pl.col("_excess")).alias("gap_ns"),
            (pl.col("gap_outside_ops_ns") - pl.col("_excess")).alias("gap_outside_ops_ns"),
        )
        .drop("_excess")
    )


def warmed(model: StepModel, calls: pl.DataFrame) -> tuple[StepModel, int, int]:
    """The host as a warm loop runs it: ``calls`` (tid, start_ns: the one-time calls,
    analyzers/idle.py ``warmup_calls``: a kernel's first launch loading its module, module
    loads, stream and context creations) take what their thread's other calls of their kind
    take (its median launch, or its median other call), so no transform prices a cost the
    next step does not pay again; unchanged where such calls lie in over half the steps (the
    loop's own recurring cost). Returns the model, how many calls, and the host time taken out
    (ns)."""
    h = model.host
    if calls.height == 0 or h.height == 0:
        return model, 0, 0
    hit = _host_rows_of(model, calls)
    if hit.len() == 0:
        return model, 0, 0
    # in most steps they are no first pass but the loop's own (new shapes every step: kernels
    # loaded, plans made each time), a cost the next step pays again
    step_of = h.get_column("step").gather(hit)
    if model.steps.height > 1 and step_of.filter(step_of >= 0).n_unique() > model.steps.height / 2:
        return model, 0, 0
    once = pl.int_range(pl.len()).is_in(hit.implode()) & (pl.col("wait") == WAIT_NONE)
    others = pl.col("dur_ns").filter(~once & (pl.col("wait") == WAIT_NONE)).median()
    # a thread whose only call of the kind is the one-time one: the other threads' usual
    usual = pl.coalesce(others.over("tid", "is_launch"), others.over("is_launch"), 0).cast(pl.Int64)
    after = pl.when(once).then(pl.min_horizontal("dur_ns", usual)).otherwise(pl.col("dur_ns"))
    h2 = h.with_columns(after.alias("dur_ns"))
    saved = h.get_column("dur_ns") - h2.get_column("dur_ns")
    n = int(h.select(once.sum()).item())
    # the work such a call launched could not start before the call returned (the module
    # loaded): the replay holds that as the op's own gap, which goes with the call's time
    g = model.gpu
    if g.height:
        launch = g.get_column("launch")
        by_launch = saved.gather(launch.clip(0, h.height - 1))
        g = g.with_columns(
            pl.when(launch >= 0)
            .then(pl.col("gap_ns") - pl.min_horizontal("gap_ns", by_launch))
            .otherwise(pl.col("gap_ns"))
            .alias("gap_ns")
        )
    return model.with_host(h2).with_gpu(g), n, int(saved.sum())


def gpu_work_scaled(factor: float) -> Transform:
    """A batch (or sequence) ``factor`` times larger: every GPU op of the step takes ``factor``
    times as long (work linear in the batch: an upper bound for small kernels that leave SMs
    idle), except the optimizer's, which runs over the parameters whatever the batch; the
    loader's host work (a batch's samples read, decoded, collated where the step waits for
    them) ``factor`` times as long too, and so the CPU ops that made tensors on the host
    (``gap_host_input_ns``: a batch generated on the CPU); other host work and
    launches per step unchanged."""

    def scaled(model: StepModel) -> StepModel | None:
        if factor == 1.0 or model.gpu.height == 0:
            return None
        g = model.gpu.with_columns(
            pl.when(pl.col("in_optimizer"))
            .then(pl.col("dur_ns"))
            .otherwise((pl.col("dur_ns") * factor).cast(pl.Int64))
            .alias("dur_ns")
        )
        extra = (pl.col("gap_dataloader_ns") * (factor - 1)).cast(pl.Int64)
        made = (pl.col("gap_host_input_ns") * (factor - 1)).cast(pl.Int64)
        h = model.host.with_columns(
            (pl.col("gap_ns") + extra + made).alias("gap_ns"),
            (pl.col("gap_dataloader_ns") + extra).alias("gap_dataloader_ns"),
            (pl.col("gap_host_input_ns") + made).alias("gap_host_input_ns"),
        )
        return StepModel(host=h, gpu=g, steps=model.steps)

    return Transform(
        "gpu_work_scaled",
        scaled,
        gpu_reads=frozenset({"in_optimizer"}),
        host_reads=frozenset({"gap_dataloader_ns", "gap_host_input_ns"}),
    )


def scaled_kernels(keys: pl.DataFrame) -> Transform:
    """A transform: the GPU ops at ``keys`` (device, start_ns, factor) take ``factor`` x their
    time (e.g. unaligned GEMMs at the rate of aligned ones); the rest of the model is kept."""

    def transform(model: StepModel) -> StepModel | None:
        g = _keyed(model.gpu, keys, pl.col("factor").cast(pl.Float64))
        if g is None:
            return None
        g = g.with_columns(
            (pl.col("dur_ns") * pl.col("factor").fill_null(1.0)).cast(pl.Int64).alias("dur_ns")
        ).drop("factor")
        return model.with_gpu(g)

    return Transform("scaled_kernels", transform, gpu_reads=frozenset({"device"}))


def kernels_fused(keys: pl.DataFrame) -> Transform:
    """A transform: the eager kernels at ``keys`` (device, start_ns, dur_ns) replaced by fused
    ones: each takes its ``dur_ns``, and those at 0 go with their launches and, where all of a
    host call's launches go, the call and its op's dispatch (:func:`_kernels_gone`). A fused
    attention kernel replaces the matmuls, scaling, masking, casts and softmax of each call, and
    their ops are no longer dispatched (a Llama's eager attention: 917 fewer ops and 105 fewer
    launches a step under SDPA)."""

    def transform(model: StepModel) -> StepModel | None:
        g = _keyed(model.gpu, keys, pl.col("dur_ns").cast(pl.Int64).alias("_new"))
        if g is None:
            return None
        gone = (g.get_column("_new") == 0).fill_null(False)
        g = g.with_columns(pl.col("_new").fill_null(pl.col("dur_ns")).alias("dur_ns")).drop("_new")
        return _kernels_gone(model, g, gone)

    return Transform(
        "kernels_fused",
        transform,
        host_reads=frozenset({"is_launch", "gap_ops_ns"}),
        gpu_reads=frozenset({"device"}),
    )


def _keyed(g: pl.DataFrame, keys: pl.DataFrame, value: pl.Expr) -> pl.DataFrame | None:
    """The GPU table ``g`` with ``value`` of ``keys`` (device, start_ns, ...) on the GPU ops
    they name (null elsewhere); None where they name none."""
    k = keys.select(
        pl.col("device").cast(g.schema["device"]), pl.col("start_ns").cast(pl.Int64), value
    ).unique(subset=["device", "start_ns"])
    name = k.columns[-1]
    g = g.join(k, on=["device", "start_ns"], how="left", maintain_order="left")
    return None if g.get_column(name).null_count() == g.height else g


def _on_threads(rows: pl.DataFrame, **columns: str) -> pl.DataFrame:
    """``rows``' tid and the ``columns`` (new name: column) as Int64, as the host model's."""
    return rows.select(
        pl.col("tid").cast(pl.Int64),
        *(pl.col(c).cast(pl.Int64).alias(a) for a, c in columns.items()),
    )


def _per_node(rows: int, hit: pl.DataFrame) -> pl.DataFrame:
    """``hit`` (``_n``: a host node's row number, with its values) on each of the host table's
    ``rows`` rows in order, null where a node has none."""
    nodes = pl.DataFrame({"_n": pl.int_range(rows, eager=True).cast(pl.UInt32)})
    return nodes.join(hit, on="_n", how="left").sort("_n")


def host_spans_removed(spans: pl.DataFrame) -> Transform:
    """A transform: the host code inside ``spans`` (tid, start_ns, end_ns: the code the fix
    deletes, such as argument checks) removed. The thread's calls that start inside one take
    no time and wait for nothing (the kernels they launched still run: a check's few
    microseconds), and each gap loses the part of its time in the trace that lies inside a
    span, in proportion (its sub-gaps with it). The rest of the step is kept: what the freed
    host time lets the GPU do, the replay says."""

    def transform(model: StepModel) -> StepModel | None:
        cut = _spans_cut(model.host, spans)
        return None if cut is None else model.with_host(cut[0])

    return Transform("host_spans_removed", transform, host_reads=frozenset(SUBGAPS))


def ops_removed(spans: pl.DataFrame) -> Transform:
    """A transform: the ops in ``spans`` (tid, start_ns, end_ns) no longer run at all, their
    host code as in :func:`host_spans_removed` and the GPU work their calls launched with it
    (``model.eval()``'s dropout, which then returns its input; autocast's per-call weight casts
    once the model is cast). What the rest of the step does is kept as recorded: the ops'
    outputs feed the same work."""

    def transform(model: StepModel) -> StepModel | None:
        cut = _spans_cut(model.host, spans)
        if cut is None:
            return None
        h, inside = cut
        nodes = pl.Series("_inside", inside)
        g = model.gpu
        launch = g.get_column("launch")
        gone = (launch >= 0) & nodes.gather(launch.clip(0, max(len(nodes) - 1, 0))).fill_null(False)
        g = g.with_columns(
            pl.when(gone).then(0).otherwise(pl.col("dur_ns")).alias("dur_ns"),
            pl.when(gone).then(0).otherwise(pl.col("gap_ns")).alias("gap_ns"),
        )
        return StepModel(host=h, gpu=g, steps=model.steps)

    return Transform("ops_removed", transform, host_reads=frozenset(SUBGAPS))


def _spans_cut(h: pl.DataFrame, spans: pl.DataFrame) -> tuple[pl.DataFrame, pl.Series] | None:
    """The host table with the code inside ``spans`` removed (:func:`host_spans_removed`) and
    whether each node's call started inside one; None where no call or gap meets a span."""
    if h.height == 0 or spans.height == 0:
        return None
    s = _on_threads(spans, _ss="start_ns", _se="end_ns").sort("_ss")
    # each node with the last span that began before it (spans are short and hold calls,
    # so a gap overlaps at most the one that began before the gap's call)
    hit = (
        h.select(pl.col("tid").cast(pl.Int64), "start_ns", "gap_from_ns")
        .with_row_index("_n")
        .sort("start_ns")
        .join_asof(
            s,
            left_on="start_ns",
            right_on="_ss",
            by="tid",
            strategy="backward",
            check_sortedness=False,
        )
        .drop_nulls("_ss")
        .with_columns(
            (pl.col("start_ns") <= pl.col("_se")).alias("_inside"),
            (
                (
                    pl.min_horizontal("start_ns", "_se") - pl.max_horizontal("gap_from_ns", "_ss")
                ).clip(0)
                / (pl.col("start_ns") - pl.col("gap_from_ns")).clip(1)
            )
            .clip(0.0, 1.0)
            .alias("_cut"),
        )
        .filter(pl.col("_inside") | (pl.col("_cut") > 0))
        .select("_n", "_inside", "_cut")
    )
    if hit.height == 0:
        return None
    marks = _per_node(h.height, hit)
    inside = marks.get_column("_inside").fill_null(False)
    keep = 1.0 - marks.get_column("_cut").fill_null(0.0)
    out = h.with_columns(
        *((pl.col(c) * pl.lit(keep)).cast(pl.Int64).alias(c) for c in ("gap_ns", *SUBGAPS)),
        pl.when(pl.lit(inside)).then(0).otherwise(pl.col("dur_ns")).alias("dur_ns"),
        pl.when(pl.lit(inside))
        .then(pl.lit(WAIT_NONE, pl.Int8))
        .otherwise(pl.col("wait"))
        .alias("wait"),
    )
    return out, inside


def host_time_cut(cuts: pl.DataFrame) -> Transform:
    """A transform: host work that took ``saved_ns`` too long (``cuts``: tid, start_ns, end_ns,
    saved_ns; an op on thread ``tid``) takes that much less. Its time lies in the gaps of the
    thread's calls inside it and of the first call after it; those gaps shrink in proportion to
    their share of the op (their sub-gaps with them). The rest of the step is kept: what the
    freed host time lets the GPU do, the replay says."""

    def transform(model: StepModel) -> StepModel | None:
        h = model.host
        if h.height == 0 or cuts.height == 0:
            return None
        c = _on_threads(cuts, _cs="start_ns", _ce="end_ns", _saved="saved_ns").with_row_index("_c")
        nodes = (
            h.select(pl.col("tid").cast(pl.Int64), "start_ns", "gap_ns")
            .with_row_index("_n")
            .sort("tid", "start_ns")
            .with_columns(pl.col("start_ns").shift(1).over("tid").alias("_prev"))
        )
        # each call after a cut's start, with the last cut started before it; its gap's part
        # inside the op (the calls inside it, and the first one after it)
        hit = (
            nodes.sort("start_ns")
            .join_asof(
                c.sort("_cs"),
                left_on="start_ns",
                right_on="_cs",
                by="tid",
                strategy="backward",
                check_sortedness=False,
            )
            .drop_nulls("_c")
            .filter(pl.col("_prev").fill_null(pl.col("_cs")) <= pl.col("_ce"))
            .with_columns(
                (
                    pl.min_horizontal("start_ns", "_ce")
                    - pl.max_horizontal(pl.col("start_ns") - pl.col("gap_ns"), "_cs")
                )
                .clip(0)
                .alias("_in")
            )
            .filter(pl.col("_in") > 0)
            .with_columns(
                (pl.col("_saved") * pl.col("_in") / pl.col("_in").sum().over("_c"))
                .cast(pl.Int64)
                .alias("saved_ns")
            )
            .group_by("_n")
            .agg(pl.col("saved_ns").sum())
        )
        if hit.height == 0:
            return None
        saved = _per_node(h.height, hit).get_column("saved_ns").fill_null(0)
        gap_after = (pl.col("gap_ns") - pl.lit(saved)).clip(0)
        keep = pl.when(pl.col("gap_ns") > 0).then(gap_after / pl.col("gap_ns")).otherwise(1.0)
        out = h.with_columns((pl.col(c) * keep).cast(pl.Int64).alias(c) for c in SUBGAPS)
        return model.with_host(out.with_columns(gap_after.cast(pl.Int64).alias("gap_ns")))

    return Transform("host_time_cut", transform, host_reads=frozenset(SUBGAPS))
