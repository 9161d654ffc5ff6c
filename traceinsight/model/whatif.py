"""What-if transforms on the step model: each returns the model as the fix would leave it (or
None when the trace has nothing for it to change); :func:`~traceinsight.model.replay.replay`
then says what the step would take. Each transform's assumptions are stated where it is made.
"""

from __future__ import annotations

from collections.abc import Callable

import polars as pl

from traceinsight.model.replay import WAIT_NONE, StepModel

# H200 SXM datasheet (NVIDIA H200 Tensor Core GPU, dense, without sparsity): FP32 67 TFLOP/s on
# CUDA cores, TF32 tensor 494.7, BF16/FP16 tensor 989.5. Real GEMMs reach a fraction of either
# peak, so a fp32 GEMM's time scales by the ratio of the peaks; a memory-bound fp32 kernel moves
# half the bytes in bf16.
FP32_TFLOPS, BF16_TFLOPS = 67.0, 989.5
BF16_MEMORY_RATIO = 0.5
PINNED_H2D_BYTES_PER_NS = 50.0  # PCIe Gen5 x16 pinned DMA, about 50 GB/s measured on H200 hosts
SYNC_RETURN_NS = 2_000  # a call that no longer waits still costs its API overhead
GRAPH_LAUNCH_NS = 10_000  # one cudaGraphLaunch per step
GRAPH_GAP_NS = 1_000  # kernel-to-kernel gap inside a replayed CUDA graph
DATALOADER_FLOOR_NS = 50_000  # fetching a prefetched batch from worker processes
# AdamW(foreach=False) runs about a dozen elementwise kernels per parameter, each a pass over
# it; the fused kernel reads params, grads and both moments once and writes three of them.
FUSED_OPTIMIZER_GPU_RATIO = 0.25


# A transform touching less than this share of the GPU op time cannot move the step by more,
# so it is not replayed (a replay is the model's cost).
NEGLIGIBLE_RATIO = 0.005


def _share(g: pl.DataFrame, which: pl.Expr, col: str) -> float:
    total = g.get_column("dur_ns").sum()
    return float(g.filter(which).get_column(col).sum()) / total if total else 0.0


def _host_blocks_off(model: StepModel, which: pl.Expr) -> StepModel:
    h = model.host.with_columns(
        pl.when(which).then(pl.lit(WAIT_NONE, pl.Int8)).otherwise(pl.col("wait")).alias("wait"),
        pl.when(which)
        .then(pl.min_horizontal("dur_ns", pl.lit(SYNC_RETURN_NS)))
        .otherwise(pl.col("dur_ns"))
        .alias("dur_ns"),
    )
    return model.with_host(h)


def remove_syncs(model: StepModel) -> StepModel | None:
    """Every host call that waited for the GPU (device syncs, blocking read-backs) returns at
    once; the data it read is assumed not needed by the host until later."""
    which = pl.col("wait") != WAIT_NONE
    return _host_blocks_off(model, which) if model.host.select(which.any()).item() else None


def pinned_copies(model: StepModel) -> StepModel | None:
    """Pageable copies from pinned memory: the copy runs async at pinned bandwidth and the host
    goes on (only the host-to-device and device-to-host copies from pageable buffers)."""
    g = model.gpu
    pageable = (pl.col("kind") == "memcpy") & (
        (pl.col("src_kind") == "pageable") | (pl.col("dst_kind") == "pageable")
    )
    ops = g.filter(pageable)
    if ops.height == 0:
        return None
    g = g.with_columns(
        pl.when(pageable)
        .then(
            pl.min_horizontal(
                "dur_ns",
                (pl.col("bytes").fill_null(0) / PINNED_H2D_BYTES_PER_NS).cast(pl.Int64) + 1_000,
            )
        )
        .otherwise(pl.col("dur_ns"))
        .alias("dur_ns")
    )
    own = ops.get_column("op").cast(pl.Int64).implode()
    # the call stages a pageable copy whether or not it outlasted the DMA: it all goes
    which = pl.col("own_op").is_in(own)
    return _host_blocks_off(model.with_gpu(g), which)


def cuda_graphs(model: StepModel) -> StepModel | None:
    """The whole step captured as one CUDA graph: no host work or launch cost inside a step
    (one graph launch at its start) and kernels back to back at the graph's gap. Syncs and
    read-backs inside the step cannot be captured, so they are dropped too."""
    h = model.host
    in_step = pl.col("step") >= 0
    if not h.select((in_step & pl.col("is_launch")).any()).item():
        return None
    first = pl.int_range(pl.len()).over("tid", "step") == 0
    h = h.with_columns(
        pl.when(in_step & first)
        .then(pl.lit(GRAPH_LAUNCH_NS))
        .when(in_step)
        .then(pl.col("gap_dataloader_ns").clip(0))  # loading the next batch stays on the host
        .otherwise(pl.col("gap_ns"))
        .alias("gap_ns"),
        pl.when(in_step).then(0).otherwise(pl.col("dur_ns")).alias("dur_ns"),
        pl.when(in_step).then(pl.lit(WAIT_NONE, pl.Int8)).otherwise(pl.col("wait")).alias("wait"),
    )
    g = model.gpu.with_columns(
        pl.when(pl.col("launch") >= 0)
        .then(pl.min_horizontal("gap_ns", pl.lit(GRAPH_GAP_NS)))
        .otherwise(pl.col("gap_ns"))
        .alias("gap_ns"),
        pl.when(pl.col("launch") >= 0).then(0).otherwise(pl.col("latency_ns")).alias("latency_ns"),
    )
    return StepModel(host=h, gpu=g, steps=model.steps)


def _drop_host(h: pl.DataFrame, gap_col: str, in_col: str) -> pl.DataFrame:
    """Host work in the ranges gone: the gap's share of them and the calls inside them."""
    return h.with_columns(
        (pl.col("gap_ns") - pl.col(gap_col)).clip(0).alias("gap_ns"),
        pl.when(pl.col(in_col)).then(0).otherwise(pl.col("dur_ns")).alias("dur_ns"),
        pl.when(pl.col(in_col))
        .then(pl.lit(WAIT_NONE, pl.Int8))
        .otherwise(pl.col("wait"))
        .alias("wait"),
    )


def fused_optimizer(model: StepModel) -> StepModel | None:
    """``fused=True``: the optimizer's host work and launches become one launch, its kernels
    run back to back at :data:`FUSED_OPTIMIZER_GPU_RATIO` of their time."""
    g = model.gpu
    if not g.select(pl.col("in_optimizer").any()).item():
        return None
    g = g.with_columns(
        pl.when(pl.col("in_optimizer"))
        .then((pl.col("dur_ns") * FUSED_OPTIMIZER_GPU_RATIO).cast(pl.Int64))
        .otherwise(pl.col("dur_ns"))
        .alias("dur_ns"),
        pl.when(pl.col("in_optimizer")).then(0).otherwise(pl.col("gap_ns")).alias("gap_ns"),
    )
    h = _drop_host(model.host, "gap_optimizer_ns", "in_optimizer")
    return StepModel(host=h, gpu=g, steps=model.steps)


def dataloader_floor(model: StepModel) -> StepModel | None:
    """Batches prefetched by worker processes into pinned memory: each wait in the loader
    drops to :data:`DATALOADER_FLOOR_NS`, and its pageable copies become async."""
    h = model.host
    if not h.select((pl.col("gap_dataloader_ns") > 0).any()).item():
        return None
    h = h.with_columns(
        pl.when(pl.col("gap_dataloader_ns") > 0)
        .then(
            pl.col("gap_ns")
            - pl.col("gap_dataloader_ns")
            + pl.min_horizontal("gap_dataloader_ns", pl.lit(DATALOADER_FLOOR_NS))
        )
        .otherwise(pl.col("gap_ns"))
        .alias("gap_ns")
    )
    pinned = pinned_copies(model.with_host(h))
    return pinned if pinned is not None else model.with_host(h)


def recompute_removed(model: StepModel) -> StepModel | None:
    """No activation checkpointing: the forward ops re-run inside backward disappear (host
    work, launches and their kernels)."""
    g = model.gpu
    if not g.select(pl.col("in_recompute").any()).item():
        return None
    g = g.with_columns(
        pl.when(pl.col("in_recompute")).then(0).otherwise(pl.col("dur_ns")).alias("dur_ns"),
        pl.when(pl.col("in_recompute")).then(0).otherwise(pl.col("gap_ns")).alias("gap_ns"),
    )
    h = _drop_host(model.host, "gap_recompute_ns", "in_recompute")
    return StepModel(host=h, gpu=g, steps=model.steps)


def bf16_gemms(model: StepModel) -> StepModel | None:
    """fp32 math on CUDA cores moved to bf16 tensor cores at the datasheet's peak ratio; the
    elementwise and reduction kernels around it move half the bytes."""
    g = model.gpu
    if _share(g, pl.col("fp32_math"), "dur_ns") < NEGLIGIBLE_RATIO:
        return None
    memory_bound = pl.col("kernel_class").cast(pl.String).is_in(["elementwise", "reduction"])
    g = g.with_columns(
        pl.when(pl.col("fp32_math"))
        .then((pl.col("dur_ns") * (FP32_TFLOPS / BF16_TFLOPS)).cast(pl.Int64))
        .when(memory_bound)
        .then((pl.col("dur_ns") * BF16_MEMORY_RATIO).cast(pl.Int64))
        .otherwise(pl.col("dur_ns"))
        .alias("dur_ns")
    )
    return model.with_gpu(g)


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


def comm_overlapped(model: StepModel) -> StepModel | None:
    """Side-stream work overlapped with compute: on every stream but the busiest, the delays
    no edge explains (the waits on the main stream) go, so the work starts when launched.
    Assumes the main stream does not wait for it within the step and the engines do not slow
    each other down."""
    g = model.gpu
    busy = g.group_by("chain").agg(pl.col("dur_ns").sum()).sort("dur_ns", descending=True)
    if busy.height < 2:
        return None
    main = int(busy["chain"][0])
    waits = (pl.col("chain") != main) | (pl.col("after_op") >= 0)
    if _share(g, waits, "gap_ns") < NEGLIGIBLE_RATIO:
        return None
    side = g.filter(pl.col("chain") != main).get_column("op").cast(pl.Int64).implode()
    g = g.with_columns(
        # the side stream runs its work as launched; the main stream no longer waits for it
        pl.when(pl.col("chain") != main)
        .then(0)
        .when(pl.col("after_op").is_in(side))
        .then(pl.col("after_lag_ns"))
        .otherwise(pl.col("gap_ns"))
        .alias("gap_ns"),
    )
    return model.with_gpu(g)


TRANSFORMS: dict[str, Callable[[StepModel], StepModel | None]] = {
    "remove_syncs": remove_syncs,
    "pinned_copies": pinned_copies,
    "cuda_graphs": cuda_graphs,
    "fused_optimizer": fused_optimizer,
    "dataloader_floor": dataloader_floor,
    "recompute_removed": recompute_removed,
    "bf16_gemms": bf16_gemms,
    "no_empty_cache": no_empty_cache,
    "comm_overlapped": comm_overlapped,
}


def scale_host(model: StepModel, factor: float) -> StepModel:
    """Host work and call costs divided by ``factor`` (the profiler's measured host slowdown),
    so a profiled trace predicts the un-profiled loop. Waits stay: they end with the GPU."""
    h = model.host.with_columns(
        (pl.col(c) / factor).cast(pl.Int64).alias(c)
        for c in (
            "gap_ns",
            "dur_ns",
            "gap_dataloader_ns",
            "gap_empty_cache_ns",
            "gap_optimizer_ns",
            "gap_recompute_ns",
        )
    )
    return model.with_host(h)


def scaled_kernels(keys: pl.DataFrame) -> Callable[[StepModel], StepModel | None]:
    """A transform: the GPU ops at ``keys`` (device, start_ns, factor) take ``factor`` x their
    time (e.g. unaligned GEMMs at the rate of aligned ones); the rest of the model is kept."""

    def transform(model: StepModel) -> StepModel | None:
        g = model.gpu
        k = keys.select(
            pl.col("device").cast(g.schema["device"]),
            pl.col("start_ns").cast(pl.Int64),
            pl.col("factor").cast(pl.Float64),
        ).unique(subset=["device", "start_ns"])
        g = g.join(k, on=["device", "start_ns"], how="left", maintain_order="left")
        if g.get_column("factor").null_count() == g.height:
            return None
        g = g.with_columns(
            (pl.col("dur_ns") * pl.col("factor").fill_null(1.0)).cast(pl.Int64).alias("dur_ns")
        ).drop("factor")
        return model.with_gpu(g)

    return transform
