"""Efficiency from the trace alone: FLOPs and bytes per kernel (from the launching op's recorded
shapes), MFU/HFU against the device's dense tensor peak, achieved TFLOP/s per kernel class, the
roofline points, GEMM shapes that miss the tensor-core alignment, and occupancy.

A kernel's FLOPs are those of the op whose External id it carries: Kineto gives a kernel the id
of the innermost op on the stack when it was launched, so ``aten::linear -> aten::addmm ->
kernel`` counts the addmm once and the linear never. An op with kernels of several classes
gives its FLOPs to its math kernels (GEMM/conv/attention) by their time, its bytes to all.
A DERIVED analyzer: it reads the steps (the median step) and the replay (the what-if).

The result is one small record per section, each from its own function over the window's
kernel table: the device's roofs, the FLOPs per step, compute (MFU, achieved rates), the
roofline points, occupancy, the unaligned GEMMs (analyzers/gemm_shapes.py), the GPU counters
(analyzers/gpu_counters.py) and eager attention (analyzers/attention.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import polars as pl

from traceinsight.analyzers.attention import EagerAttention, eager_attention
from traceinsight.analyzers.context import Context, join_beside
from traceinsight.analyzers.gemm_shapes import UnalignedGemms, unaligned_gemms
from traceinsight.analyzers.gpu_counters import GpuCounters, gpu_counters
from traceinsight.analyzers.recompute import launched_inside, recomputed_forward
from traceinsight.analyzers.replay import ReplayResult
from traceinsight.analyzers.steps import StepResult
from traceinsight.model import intervals as iv
from traceinsight.model.classify import coded_names
from traceinsight.model.devices import (
    ArchLimits,
    DeviceSpec,
    Family,
    family_of,
    occupancy_basis,
    occupancy_estimate,
    spec_of,
    tf32_faster,
)
from traceinsight.model.flops import op_costs
from traceinsight.model.schema import DeviceInfo

MATH_CLASSES = ("gemm", "conv", "attention")
MEMORY_CLASSES = ("elementwise", "reduction")
# the roofline's work: FLOPs, else an elementwise/reduction op's elements (1 FLOP each)
WORK = pl.coalesce("flops", "memory_flops")
LOW_OCCUPANCY = 0.25  # below this (of the SM's warps) latency is poorly hidden
WARP_LANES = 32  # NVIDIA's warp, where the device's limits are unknown
OCCUPANCY_KNOWN_MIN_RATIO = 0.5  # of compute kernel time, for the time-weighted median
TOP = 15


@dataclass(frozen=True)
class DeviceRoofs:
    """The spec table's row for the window's devices (model/devices.py); None where unknown."""

    spec: str | None
    peak_tflops: dict[str, float] | None  # one device's, by dtype
    tensor_peak_tflops: float | None  # dense bf16/fp16 tensor peak x devices: MFU's peak
    memory_bandwidth_bytes_per_s: float | None  # x devices
    has_bf16: bool | None  # the device runs bf16 tensor math (V100 does not)
    has_tf32: bool | None
    tf32_faster: bool | None = None  # TF32 beats fp32's peak (GeForce cards: the same rate)
    # a device the table lacks, priced by its compute capability's lowest ratios: their source
    priced_by: str | None = None


@dataclass(frozen=True)
class StepFlops:
    """FLOPs per step, the median over the GPU-aligned steps (without steps: the window)."""

    source: str | None = None  # "shapes" (record_shapes formulas), "with_flops", None
    per_step: float | None = None  # executed, recompute included
    recompute_per_step: float | None = None
    model_per_step: float | None = None  # executed less the recomputed forward
    gemm_per_step: float | None = None  # mm/addmm/bmm/linear/matmul/einsum ops
    attention_per_step: float | None = None
    conv_per_step: float | None = None


@dataclass(frozen=True)
class Compute:
    step_time_ns: float | None  # the trace's median step (else the window)
    mfu: float | None  # model FLOPs per step / (step time x tensor peak)
    hfu: float | None  # executed FLOPs per step / (step time x tensor peak)
    achieved_tflops: dict[str, float]  # per kernel class: its FLOPs over its kernels' own time
    gemm_tflops: float | None  # GEMM + conv + attention kernels
    math_flops_coverage_ratio: float | None  # math kernel time with FLOPs known
    memory_bound_bandwidth_ratio: float | None  # elementwise/reduction bytes/time vs HBM


@dataclass(frozen=True)
class ClassPoint:
    """A kernel class's roofline point: FLOPs and bytes over its kernels' own time."""

    kernel_class: str | None
    count: int
    time_ns: int
    flops: float | None
    bytes: float | None
    achieved_tflops: float | None
    bandwidth_bytes_per_s: float | None
    roofline_tflops: float | None  # elementwise/reduction work counted 1 FLOP per element
    arithmetic_intensity: float | None  # work per byte
    # the time of the class's kernels whose FLOPs are known: achieved_tflops' denominator
    # (audit 23: a B200 GEMM row at 300.5 TFLOP/s over 0.78 of its 6.25 ms)
    flops_time_ns: int = 0


@dataclass(frozen=True)
class KernelPoint:
    """One of the costliest kernels (by name and class) as a roofline point."""

    name: str
    kernel_class: str | None
    count: int
    time_ns: int
    flops: float
    bytes: float
    work: float
    occupancy: float | None  # mean over its launches
    achieved_tflops: float | None
    roofline_tflops: float | None
    arithmetic_intensity: float | None
    bandwidth_bytes_per_s: float | None


@dataclass(frozen=True)
class Roofline:
    classes: tuple[ClassPoint, ...] = ()  # by time, largest first
    top_kernels: tuple[KernelPoint, ...] = ()


@dataclass(frozen=True)
class LowOccupancyKernel:
    """Kernels of one name below :data:`LOW_OCCUPANCY`: the time-weighted occupancy, the most
    common limiting resource, the median launch configuration."""

    name: str
    kernel_class: str | None
    count: int
    time_ns: int
    occupancy: float
    limiter: str | None
    grid_blocks: float | None
    block_threads: float | None
    registers_per_thread: float | None
    shared_memory_bytes: float | None
    # the share of each warp's lanes its blocks fill (16-thread blocks: 0.5), time-weighted;
    # None where the block size is unknown. Occupancy counts warps, so a partial warp's idle
    # lanes are lost on top of it (the kernel is listed where the two together fall below
    # LOW_OCCUPANCY)
    lane_use: float | None = None


@dataclass(frozen=True)
class Occupancy:
    median: float | None = None  # time-weighted, Kineto's estimate or ours
    source: str | None = None  # "kineto" | "estimated" | None
    low_kernels: tuple[LowOccupancyKernel, ...] = ()
    low_ns: int = 0
    low_time_ratio: float | None = None  # of kernel time


@dataclass(frozen=True)
class EfficiencyResult:
    device: DeviceRoofs
    flops: StepFlops
    compute: Compute
    roofline: Roofline
    occupancy: Occupancy
    unaligned_gemms: UnalignedGemms
    counters: GpuCounters  # nsys GPU_METRICS samples in the window
    kernel_ns: int
    warnings: tuple[str, ...] = ()
    # softmax over a T x T score matrix between batched matmuls, no fused kernel (None: none)
    attention: EagerAttention | None = None


def _window_devices(ctx: Context) -> list[DeviceInfo | None]:
    """The window's devices' properties, in order (None where the trace describes one not)."""
    known = {d.id: d for d in ctx.device_info}
    return [known.get(d) for d in ctx.devices or tuple(known)]


def _spec(ctx: Context) -> DeviceSpec | None:
    """The spec of the window's first device the table has."""
    return next((s for d in _window_devices(ctx) if (s := spec_of(d)) is not None), None)


def _family(ctx: Context) -> Family | None:
    """The family the window's first device the table lacks is priced by."""
    return next((f for d in _window_devices(ctx) if (f := family_of(d)) is not None), None)


def _occupancy_basis(ctx: Context) -> tuple[ArchLimits, int] | None:
    """The first window device's SM limits and count (:func:`occupancy_basis`)."""
    return next((b for d in _window_devices(ctx) if (b := occupancy_basis(d)) is not None), None)


# cuBLAS/cuDNN kernel names carry the architecture they were built for: without the device's
# properties, Volta and Turing (fp16 tensor cores only) are told from Ampere and later.
_PRE_AMPERE_KERNELS = r"^(volta|turing)_"
_AMPERE_ON_KERNELS = r"^(ampere|sm8\d|sm9\d|sm1\d\d)_"


def _tensor_dtypes(ctx: Context, spec: DeviceSpec | None) -> tuple[bool | None, bool | None]:
    """(has bf16 tensor math, has TF32): from the spec table; else from an NVIDIA compute
    capability (bf16 and TF32 came with 8.0); else from the kernels' architecture names."""
    if spec is not None:
        return spec.has("bf16"), spec.has("tf32")
    majors = [
        int(d.compute_capability.split(".")[0])
        for d in ctx.device_info
        if d.compute_capability and d.compute_capability.split(".")[0].isdigit()
    ]
    if majors:
        modern = min(majors) >= 8
        return modern, modern
    kernels = ctx.launches.lazy().filter(pl.col("kind") == "kernel").select("name").collect()
    names = kernels.get_column("name").unique()
    if names.str.contains(_PRE_AMPERE_KERNELS).any():
        return False, False
    if names.str.contains(_AMPERE_ON_KERNELS).any():
        return True, True
    return None, None


def _kernels(ctx: Context) -> pl.DataFrame:
    """Kernels in the window with their op's costs: flops, bytes, formula, dtype, GEMM sizes."""
    lo, hi = ctx.window_start_ns, ctx.window_end_ns
    k = ctx.launches.lazy().filter(
        (pl.col("kind") == "kernel") & (pl.col("start_ns") >= lo) & (pl.col("start_ns") < hi)
    )
    cols = ["name", "start_ns", "end_ns", "dur_ns", "device", "rank", "correlation", "kernel_class"]
    k = (
        k.select(
            *cols,
            pl.coalesce("external_id", "launch_external_id").alias("external_id"),
            "launch_start_ns",
            "launch_tid",
        )
        .with_columns(pl.col("kernel_class").cast(pl.String))
        .collect()
    )
    oa = ctx.op_args
    if oa.height == 0 or k.height == 0:
        return k.with_columns(
            pl.lit(None, pl.Float64).alias("flops"),
            pl.lit(None, pl.Float64).alias("bytes"),
            pl.lit(None, pl.Float64).alias("memory_flops"),
            pl.lit(None, pl.String).alias("formula"),
            pl.lit(None, pl.String).alias("dtype"),
            pl.lit(None, pl.String).alias("op"),
            pl.lit(None, pl.Int64).alias("gemm_m"),
            pl.lit(None, pl.Int64).alias("gemm_n"),
            pl.lit(None, pl.Int64).alias("gemm_k"),
        )
    k = _linked(k, oa)
    # only the ops that launched a kernel in the window need a formula
    ids = k.get_column("external_id").drop_nulls().unique().implode()
    ops = oa.filter(pl.col("external_id").is_in(ids)).unique(
        subset=["rank", "external_id"], keep="first", maintain_order=True
    )
    key = ["name", "input_dims", "input_types", "concrete_inputs"]
    costs = op_costs(ops.select(key).unique())
    ops = ops.join(costs.rename({"flops": "formula_flops"}), on=key, how="left", nulls_equal=True)
    ops = ops.select(
        "rank",
        "external_id",
        pl.col("name").alias("op"),
        # the profiler's own estimate (with_flops=True) wins over our formula
        pl.coalesce(pl.col("flops").cast(pl.Float64), "formula_flops").alias("op_flops"),
        pl.col("flops").is_not_null().alias("kineto_flops"),
        pl.col("bytes").alias("op_bytes"),
        pl.col("memory_flops").alias("op_memory_flops"),
        "formula",
        "dtype",
        "gemm_m",
        "gemm_n",
        "gemm_k",
    )
    k = join_beside(k, ops, ["rank", "external_id"])  # ops: one row per (rank, external_id)
    # split the op's FLOPs over its math kernels (or all, when none is math) by time
    math = pl.col("kernel_class").is_in(MATH_CLASSES)
    grp = ["rank", "external_id"]
    has_math = math.any().over(grp)
    takes = pl.when(has_math).then(math).otherwise(True)
    share_f = pl.when(takes).then(pl.col("dur_ns")).otherwise(0) / pl.when(takes).then(
        pl.col("dur_ns")
    ).otherwise(0).sum().over(grp).clip(1)
    share_b = pl.col("dur_ns") / pl.col("dur_ns").sum().over(grp).clip(1)
    n_over = pl.len().over(grp)
    return k.with_columns(
        (pl.col("op_flops") * pl.when(n_over == 1).then(1.0).otherwise(share_f)).alias("flops"),
        (pl.col("op_bytes") * pl.when(n_over == 1).then(1.0).otherwise(share_b)).alias("bytes"),
        (pl.col("op_memory_flops") * pl.when(n_over == 1).then(1.0).otherwise(share_b)).alias(
            "memory_flops"
        ),
    ).drop("op_flops", "op_bytes", "op_memory_flops")


def _linked(k: pl.DataFrame, oa: pl.DataFrame) -> pl.DataFrame:
    """``k``'s kernels with the external id of the op that launched them: the id they carry
    where that op encloses their launch call, else the innermost op with recorded arguments
    enclosing the call on its thread. A trace whose ids are shifted (a public A100 Switch
    Transformer: none of 484 kernels' ids named an op around its launch, 91 an aten::view,
    393 no op) read "GEMM/attention 28 TFLOP/s" (above the fp32 peak, 19.5) and FLOPs for 2.3%
    of the math time, where all 121 sgemm kernels ran inside a shaped aten::addmm or bmm."""
    ops = (
        oa.select(
            "rank",
            "external_id",
            pl.col("tid").alias("_tid"),
            pl.col("start_ns").alias("_s"),
            (pl.col("start_ns") + pl.col("dur_ns")).alias("_e"),
        )
        .filter(pl.col("external_id").is_not_null())
        .unique(subset=["rank", "external_id"], keep="first", maintain_order=True)
    )
    at = pl.col("launch_start_ns")
    k = k.with_row_index("_k").join(ops, on=["rank", "external_id"], how="left")
    own = at.is_null() | (
        pl.col("_s").is_not_null()
        & (pl.col("_s") <= at)
        & (at <= pl.col("_e"))
        & (
            pl.col("_tid").is_null()
            | pl.col("launch_tid").is_null()
            | (pl.col("_tid") == pl.col("launch_tid"))
        )
    )
    k = k.with_columns(own.alias("_own")).drop("_tid", "_s", "_e")
    lost = k.filter(~pl.col("_own"))
    if lost.height == 0:
        return k.sort("_k").drop("_k", "_own")
    # the innermost op enclosing the call on its thread: of those that started before it and
    # still ran, the latest to start (not merely the latest to start: an aten::addmm's child
    # aten::empty had ended before the launch, and the kernel went unlinked; audit 14's H100
    # tutorial read 3.6x too few GEMM FLOPs)
    calls = lost.select("_k", "rank", "launch_tid", "launch_start_ns").drop_nulls()
    around = (
        iv.containing(
            calls.with_columns(pl.col("launch_start_ns").alias("_at_end")),
            ops.rename({"external_id": "_around", "rank": "_orank"}),
            inner_start="launch_start_ns",
            inner_end="_at_end",
            outer_start="_s",
            outer_end="_e",
            same=("_tid", "launch_tid"),
        )
        .filter(pl.col("_orank") == pl.col("rank"))
        .sort("_k", "_s")
        .group_by("_k", maintain_order=True)
        .agg(pl.col("_around").last())
    )
    k = k.join(around, on="_k", how="left")
    return (
        k.with_columns(
            pl.when(pl.col("_own"))
            .then(pl.col("external_id"))
            .otherwise(pl.col("_around"))
            .alias("external_id")
        )
        .sort("_k")
        .drop("_k", "_own", "_around")
    )


def _recomputed(ctx: Context, k: pl.DataFrame) -> pl.Series:
    """Whether each kernel was launched inside a recomputed forward op (the recompute
    analyzer's definition)."""
    lo, hi = ctx.window_start_ns, ctx.window_end_ns
    nested = recomputed_forward(ctx, pl.col("start_ns").is_between(lo, hi))
    flag = pl.repeat(False, k.height, dtype=pl.Boolean, eager=True).alias("recomputed")
    if nested is None or nested.height == 0 or k.height == 0:
        return flag
    ki = k.with_row_index("_i").filter(pl.col("launch_start_ns").is_not_null())
    inside = launched_inside(ki.select("_i", "launch_start_ns", "launch_tid"), nested)
    hit = inside.get_column("_i").unique()
    return pl.int_range(k.height, eager=True).is_in(hit.implode()).alias("recomputed")


def _occupancy(ctx: Context, k: pl.DataFrame, basis: tuple[ArchLimits, int] | None) -> pl.DataFrame:
    """Each kernel's occupancy (Kineto's estimated achieved occupancy, else ours from the launch
    configuration and the SM limits) and the resource that limits it."""
    ka = ctx.kernel_args
    none = k.with_columns(
        pl.lit(None, pl.Float64).alias("lane_use"),
        pl.lit(None, pl.Float64).alias("occupancy"),
        pl.lit(None, pl.String).alias("limiter"),
        pl.lit(None, pl.Int64).alias("grid_blocks"),
        pl.lit(None, pl.Int64).alias("block_threads"),
        pl.lit(None, pl.Int64).alias("registers_per_thread"),
        pl.lit(None, pl.Int64).alias("shared_memory_bytes"),
    )
    # nothing to read (no Kineto estimate) and nothing to estimate with (no SM limits): no join
    kineto_known = ka.height > ka.get_column("occupancy_ratio").null_count()
    if ka.height == 0 or k.height == 0 or (basis is None and not kineto_known):
        return none
    # by launch and start: the kernels of one CUDA graph launch share its correlation (a
    # compiled step's GEMMs read as the graph's first kernel, one block of 32 threads)
    ka = ka.select(
        "rank",
        "device",
        "correlation",
        "start_ns",
        (pl.col("grid_x") * pl.col("grid_y").fill_null(1) * pl.col("grid_z").fill_null(1)).alias(
            "grid_blocks"
        ),
        (pl.col("block_x") * pl.col("block_y").fill_null(1) * pl.col("block_z").fill_null(1)).alias(
            "block_threads"
        ),
        "registers_per_thread",
        "shared_memory_bytes",
        pl.col("occupancy_ratio").alias("kineto_occupancy"),
    ).unique(subset=["rank", "device", "correlation", "start_ns"], keep="first")
    k = join_beside(k, ka, ["rank", "device", "correlation", "start_ns"])
    est = pl.lit(None, pl.Float64)
    limiter = pl.lit(None, pl.String)
    if basis is not None:
        limits, sms = basis
        cfg = (
            k.select("grid_blocks", "block_threads", "registers_per_thread", "shared_memory_bytes")
            .drop_nulls(["grid_blocks", "block_threads"])
            .unique()
        )
        rows = []
        # one estimate per distinct launch configuration (a few hundred), not per kernel
        for g, t, r, s in cfg.iter_rows():
            occ, lim = occupancy_estimate(limits, int(t), int(r or 0), int(s or 0))
            warps = -(-int(t) // limits.warp_size)
            grid_occ = g * warps / (sms * limits.max_warps_per_sm)
            if grid_occ < occ:
                occ, lim = grid_occ, "grid"
            if not r and not (lim == "grid" and occ < LOW_OCCUPANCY):
                # without the registers a launch uses (ROCm's Kineto records none) the block
                # size bounds occupancy only from above: a GEMM limited by its registers read
                # 100% (audit 5, three MI300 traces' "occupancy 100.0%"). A grid too small to
                # fill the device is low whatever the registers; anything else is unknown.
                continue
            rows.append((g, t, r, s, occ, lim))
        est_df = pl.DataFrame(
            rows,
            schema={
                "grid_blocks": pl.Int64,
                "block_threads": pl.Int64,
                "registers_per_thread": pl.Int64,
                "shared_memory_bytes": pl.Int64,
                "_est": pl.Float64,
                "limiter": pl.String,
            },
            orient="row",
        )
        k = join_beside(  # est_df: one row per distinct configuration
            k,
            est_df,
            ["grid_blocks", "block_threads", "registers_per_thread", "shared_memory_bytes"],
            nulls_equal=True,
        )
        est, limiter = pl.col("_est"), pl.col("limiter")
    # Kineto writes 0 where its occupancy query fails (cluster launches: nvjet, cuDNN's
    # generated kernels, cudaLaunchKernelExC's; 74% of an H800 DeepSeek step's compute read 0)
    # as well as for a grid of a few blocks: ours where we have one, else unknown
    occ = pl.when(pl.col("kineto_occupancy") > 0).then("kineto_occupancy")
    # a block of t threads fills ceil(t / W) warps, their last one in part (audit s60: a
    # public Rodinia export's 4 x 4 blocks ran 16 of 32 lanes, 4.0x slower than 16 x 16)
    lanes = basis[0].warp_size if basis is not None else WARP_LANES
    warps = (pl.col("block_threads") / lanes).ceil()
    k = k.with_columns(
        pl.coalesce(occ, est).clip(0.0, 1.0).alias("occupancy"),
        limiter.alias("limiter"),
        pl.when(pl.col("block_threads") > 0)
        .then(pl.col("block_threads") / (warps * lanes))
        .alias("lane_use"),
    )
    return k.drop([c for c in ("_est", "kineto_occupancy") if c in k.columns])


def _weighted_median(values: pl.Series, weights: pl.Series) -> float | None:
    df = pl.DataFrame({"v": values, "w": weights}).drop_nulls().filter(pl.col("w") > 0).sort("v")
    if df.height == 0:
        return None
    cum = df.get_column("w").cum_sum()
    half = cum[-1] / 2
    return float(df.get_column("v")[int(cum.search_sorted(half, side="left"))])


def _per_step(ctx: Context, k: pl.DataFrame) -> pl.DataFrame:
    """FLOPs per step (executed, recomputed, by formula) over the GPU-aligned steps; one row for
    the whole window without steps."""
    flops = pl.col("flops").fill_null(0)
    aggs = [
        flops.sum().alias("flops"),
        flops.filter(pl.col("recomputed")).sum().alias("recompute_flops"),
        flops.filter(pl.col("formula") == "gemm").sum().alias("gemm_flops"),
        flops.filter(pl.col("formula") == "attention").sum().alias("attention_flops"),
        flops.filter(pl.col("formula") == "conv").sum().alias("conv_flops"),
    ]
    if ctx.steps.height == 0:
        return k.select(aggs).with_columns(pl.lit(float(ctx.window_ns)).alias("step_ns"))
    steps = ctx.steps.select("step", "start_ns", "end_ns").sort("start_ns")
    tagged = (
        k.sort("start_ns")
        .join_asof(
            steps.rename({"start_ns": "s_s", "end_ns": "s_e"}), left_on="start_ns", right_on="s_s"
        )
        .filter(pl.col("start_ns") < pl.col("s_e"))
    )
    per = tagged.group_by("step").agg(aggs)
    return steps.join(per, on="step", how="left").select(
        pl.col("flops", "recompute_flops", "gemm_flops", "attention_flops", "conv_flops").fill_null(
            0
        ),
        (pl.col("end_ns") - pl.col("start_ns")).cast(pl.Float64).alias("step_ns"),
    )


def _device(ctx: Context, spec: DeviceSpec | None) -> DeviceRoofs:
    n_dev = max(1, len(ctx.devices))
    has_bf16, has_tf32 = _tensor_dtypes(ctx, spec)
    fam = _family(ctx) if spec is None else None
    return DeviceRoofs(
        spec=spec.id if spec else None,
        peak_tflops=dict(spec.peak_tflops) if spec else None,
        tensor_peak_tflops=spec.tensor_peak_tflops * n_dev
        if spec and spec.tensor_peak_tflops
        else None,
        memory_bandwidth_bytes_per_s=spec.memory_bandwidth_bytes_per_s * n_dev if spec else None,
        has_bf16=has_bf16,
        has_tf32=has_tf32,
        tf32_faster=tf32_faster(spec) if spec is not None else fam.tf32_faster if fam else None,
        priced_by=fam.source if fam else None,
    )


def _step_flops(ctx: Context, k: pl.DataFrame) -> StepFlops:
    """The medians of :func:`_per_step` (``k`` has FLOPs)."""
    per = _per_step(ctx, k)

    def med(col: str) -> float | None:
        return float(per.get_column(col).median()) if per.height else None

    executed, recomputed = med("flops"), med("recompute_flops")
    return StepFlops(
        source="with_flops" if k.get_column("kineto_flops").any() else "shapes",
        per_step=executed,
        recompute_per_step=recomputed,
        model_per_step=executed - recomputed
        if executed is not None and recomputed is not None
        else None,
        gemm_per_step=med("gemm_flops"),
        attention_per_step=med("attention_flops"),
        conv_per_step=med("conv_flops"),
    )


def _roofline(k: pl.DataFrame) -> Roofline:
    """Per class and for the :data:`TOP` kernels by time: FLOPs and bytes over the kernels' own
    time (the roofline's points)."""
    if k.height == 0:
        return Roofline()
    by = (
        k.group_by("kernel_class")
        .agg(
            pl.col("dur_ns").sum().alias("time_ns"),
            pl.col("flops").sum().alias("flops"),
            pl.col("bytes").sum().alias("bytes"),
            pl.col("dur_ns").filter(pl.col("flops").is_not_null()).sum().alias("flops_time_ns"),
            pl.col("dur_ns").filter(pl.col("bytes").is_not_null()).sum().alias("bytes_time_ns"),
            WORK.sum().alias("work"),
            pl.col("dur_ns").filter(WORK.is_not_null()).sum().alias("work_time_ns"),
            pl.len().alias("count"),
        )
        .sort(["time_ns", "kernel_class"], descending=[True, False])
    )
    # a loop over kernel classes (a dozen); a sum over no known value is 0: None here
    classes = tuple(
        ClassPoint(
            kernel_class=r["kernel_class"],
            count=r["count"],
            time_ns=int(r["time_ns"]),
            flops=r["flops"] or None,
            bytes=r["bytes"] or None,
            achieved_tflops=r["flops"] / r["flops_time_ns"] / 1e3
            if r["flops"] and r["flops_time_ns"]
            else None,
            flops_time_ns=int(r["flops_time_ns"] or 0),
            bandwidth_bytes_per_s=r["bytes"] / r["bytes_time_ns"] * 1e9
            if r["bytes"] and r["bytes_time_ns"]
            else None,
            roofline_tflops=r["work"] / r["work_time_ns"] / 1e3
            if r["work"] and r["work_time_ns"]
            else None,
            arithmetic_intensity=r["work"] / r["bytes"] if r["work"] and r["bytes"] else None,
        )
        for r in by.iter_rows(named=True)
    )
    top = (
        coded_names(k)
        .group_by("name", "kernel_class")
        .agg(
            pl.len().alias("count"),
            pl.col("dur_ns").sum().alias("time_ns"),
            pl.col("flops").sum().alias("flops"),
            pl.col("bytes").sum().alias("bytes"),
            WORK.sum().alias("work"),
            pl.col("occupancy").mean().alias("occupancy"),
        )
        .with_columns(pl.col("name").cast(pl.String))
        .sort(["time_ns", "name", "kernel_class"], descending=[True, False, False])
        .head(TOP)
        .with_columns(
            pl.when(pl.col("flops") > 0)
            .then(pl.col("flops") / pl.col("time_ns") / 1e3)
            .alias("achieved_tflops"),
            pl.when(pl.col("work") > 0)
            .then(pl.col("work") / pl.col("time_ns") / 1e3)
            .alias("roofline_tflops"),
            pl.when((pl.col("work") > 0) & (pl.col("bytes") > 0))
            .then(pl.col("work") / pl.col("bytes"))
            .alias("arithmetic_intensity"),
            pl.when(pl.col("bytes") > 0)
            .then(pl.col("bytes") / pl.col("time_ns") * 1e9)
            .alias("bandwidth_bytes_per_s"),
        )
    )
    return Roofline(
        classes=classes,
        top_kernels=tuple(KernelPoint(**r) for r in top.iter_rows(named=True)),
    )


def _compute(
    k: pl.DataFrame,
    device: DeviceRoofs,
    flops: StepFlops,
    roofline: Roofline,
    step_ns: float | None,
) -> Compute:
    """MFU/HFU over the trace's step, the achieved rates of math kernels, and how close the
    memory-bound kernels come to the HBM bandwidth."""
    peak, bw = device.tensor_peak_tflops, device.memory_bandwidth_bytes_per_s
    mfu = hfu = None
    if peak and step_ns and flops.per_step is not None and flops.model_per_step is not None:
        hfu = flops.per_step / (step_ns * 1e-9 * peak * 1e12)
        mfu = flops.model_per_step / (step_ns * 1e-9 * peak * 1e12)
    math_k = k.filter(pl.col("kernel_class").is_in(MATH_CLASSES)) if k.height else k
    math_with = math_k.filter(pl.col("flops").is_not_null())
    math_ns = int(math_k.get_column("dur_ns").sum()) if math_k.height else 0
    with_ns = int(math_with.get_column("dur_ns").sum()) if math_with.height else 0
    mem = (
        k.filter(pl.col("kernel_class").is_in(MEMORY_CLASSES) & pl.col("bytes").is_not_null())
        if k.height
        else k
    )
    if bw and mem.height:
        # a kernel whose bytes would take less than its time at the HBM peak read them from
        # cache (small tensors that stay in L2) or the estimate took the wrong tensors: those
        # bytes are no HBM traffic (a compiled T5 step read "100% of HBM", capped)
        mem = mem.filter(pl.col("bytes") <= pl.col("dur_ns") * 1e-9 * bw)
    mem_ns = int(mem.get_column("dur_ns").sum()) if mem.height else 0
    return Compute(
        step_time_ns=step_ns,
        mfu=mfu,
        hfu=hfu,
        achieved_tflops={
            c.kernel_class: c.achieved_tflops
            for c in roofline.classes
            if c.achieved_tflops is not None
        },
        gemm_tflops=float(math_with["flops"].sum()) / with_ns / 1e3 if with_ns else None,
        math_flops_coverage_ratio=with_ns / math_ns
        if math_ns and flops.source is not None
        else None,
        memory_bound_bandwidth_ratio=float(mem["bytes"].sum()) / (mem_ns * 1e-9) / bw
        if bw and mem_ns
        else None,
    )


def _occupancy_section(ctx: Context, k: pl.DataFrame, kernel_ns: int) -> Occupancy:
    """The time-weighted median occupancy and the low-occupancy kernels."""
    if k.height == 0:
        return Occupancy()
    # NCCL kernels hold a few SMs by design: their occupancy says nothing about the compute
    compute = k.filter(pl.col("kernel_class") != "communication")
    known = compute.filter(pl.col("occupancy").is_not_null())
    # a median of the kernels whose occupancy is known only where they are most of the time:
    # without registers only the grid-limited (low) ones are known, and their median read
    # 0.1% on an MI300 TimeSformer step
    if known["dur_ns"].sum() < OCCUPANCY_KNOWN_MIN_RATIO * max(1, compute["dur_ns"].sum()):
        known = known.clear()
    source = None
    if known.height:
        source = "kineto" if ctx.kernel_args["occupancy_ratio"].drop_nulls().len() else "estimated"
    basis = _occupancy_basis(ctx)
    low, low_ns = _low_occupancy(k, basis[1] if basis is not None else None)
    return Occupancy(
        median=_weighted_median(known["occupancy"], known["dur_ns"]) if known.height else None,
        source=source,
        low_kernels=low,
        low_ns=low_ns,
        low_time_ratio=low_ns / kernel_ns if kernel_ns and low else None,
    )


# the fewest threads a block of a library's tensor-core GEMM or attention kernel runs (4 warps)
TENSOR_CORE_BLOCK_THREADS = 128


def _low_occupancy(
    k: pl.DataFrame, sms: int | None = None
) -> tuple[tuple[LowOccupancyKernel, ...], int]:
    """Kernels (by name) that run below :data:`LOW_OCCUPANCY`, with their limiting resource.
    GEMM/conv/attention kernels count only where their grid reaches fewer than that share of
    the ``sms`` SMs in blocks smaller than a tensor-core kernel's: per SM they trade occupancy
    for registers and shared memory by design (one or two large blocks per SM), but SMs
    without a block do nothing whatever the design (audit s61: an OpenMP-offload matmul, named like a GEMM, ran in one
    32-thread block on an H100's 114 SMs, 90-97% of the run; with 131,072 blocks 10.7 ms)."""
    if k.get_column("occupancy").drop_nulls().len() == 0:
        return (), 0
    math = pl.col("kernel_class").is_in(MATH_CLASSES)
    # (a library's tensor-core kernel runs 4 warps a block or more: a small model's GEMMs in
    # a few such blocks are its batch's lever, which the batch rules price)
    small_grid = pl.col("grid_blocks") < LOW_OCCUPANCY * sms if sms else pl.col("grid_blocks") <= 1
    # (0 blocks or threads: a launch the trace did not record, rocprofv3's MI300 attention)
    recorded = (pl.col("grid_blocks") > 0) & (pl.col("block_threads") > 0)
    starved = (
        recorded & small_grid & (pl.col("block_threads") < TENSOR_CORE_BLOCK_THREADS)
    ).fill_null(False)
    low = k.filter(
        pl.col("occupancy").is_not_null()
        & (pl.col("occupancy") * pl.col("lane_use").fill_null(1.0) < LOW_OCCUPANCY)
        & (pl.col("kernel_class") != "communication")
        & (~math | starved)
    )
    if low.height == 0:
        return (), 0
    rows = (
        coded_names(low)
        .group_by("name", "kernel_class")
        .agg(
            pl.len().alias("count"),
            pl.col("dur_ns").sum().alias("time_ns"),
            ((pl.col("occupancy") * pl.col("dur_ns")).sum() / pl.col("dur_ns").sum().clip(1)).alias(
                "occupancy"
            ),
            pl.col("limiter").drop_nulls().mode().sort().first().alias("limiter"),
            pl.col("grid_blocks").median().alias("grid_blocks"),
            pl.col("block_threads").median().alias("block_threads"),
            pl.col("registers_per_thread").median().alias("registers_per_thread"),
            pl.col("shared_memory_bytes").median().alias("shared_memory_bytes"),
            (
                (pl.col("lane_use") * pl.col("dur_ns")).sum()
                / pl.col("dur_ns").filter(pl.col("lane_use").is_not_null()).sum()
            )
            .fill_nan(None)
            .alias("lane_use"),
        )
        .with_columns(pl.col("name").cast(pl.String))
        .sort(["time_ns", "name", "kernel_class"], descending=[True, False, False])
        .head(TOP)
    )
    kernels = tuple(LowOccupancyKernel(**r) for r in rows.iter_rows(named=True))
    return kernels, int(low.get_column("dur_ns").sum())


def _warnings(ctx: Context, spec: DeviceSpec | None) -> tuple[str, ...]:
    if spec is not None or not ctx.has_gpu:
        return ()
    names = sorted(
        {d.name for d in ctx.device_info if ctx.devices and d.id in ctx.devices and d.name}
    )
    what = (
        f"device {', '.join(repr(n) for n in names)} is not in the spec table"
        if names
        # (audits s57, s58: "does not name its device ... looked up by name" read as a
        # contradiction)
        else "the trace does not name its device (no deviceProperties), so the spec table, "
        "which is keyed by device name, has no entry for it"
    )
    return (
        f"{what} (traceinsight/data/devices.toml): MFU, HFU and the roofline's roofs are not "
        "computed",
    )


def analyze_efficiency(
    ctx: Context,
    steps: StepResult,
    replay: ReplayResult | Callable[[], ReplayResult | None] | None,
) -> EfficiencyResult:
    """``replay``: the replay's result, or a function that waits for it (called only for the
    what-ifs, so the rest runs while the replay does)."""
    spec = _spec(ctx)
    k = _kernels(ctx)
    has_flops = k.height > 0 and k.get_column("flops").drop_nulls().len() > 0
    # which kernels recompute the forward matters only where there are FLOPs to split
    k = k.with_columns(_recomputed(ctx, k) if has_flops else pl.lit(False).alias("recomputed"))
    # a device the table lacks: its architecture's limits and its own SM count
    k = _occupancy(ctx, k, _occupancy_basis(ctx))
    kernel_ns = int(k.get_column("dur_ns").sum()) if k.height else 0
    device = _device(ctx, spec)
    flops = _step_flops(ctx, k) if has_flops else StepFlops()
    # the trace's own median step (without steps: the window, over which the FLOPs were summed)
    step_ns = steps.step_time_median_ns or (float(ctx.window_ns) or None)
    roofline = _roofline(k)
    rp = (replay() if callable(replay) else replay) if has_flops or ctx.op_args.height else None
    attention, eager_ops = eager_attention(ctx, k, spec, rp, step_ns, steps.steps)
    unaligned = UnalignedGemms()
    if has_flops:
        # eager attention's matmuls are attention's (its own finding), not GEMMs to pad
        gemms = k.join(eager_ops, on=["rank", "external_id"], how="anti") if eager_ops.height else k
        unaligned = unaligned_gemms(gemms, rp, spec, kernel_ns)
    return EfficiencyResult(
        device=device,
        flops=flops,
        compute=_compute(k, device, flops, roofline, step_ns),
        roofline=roofline,
        occupancy=_occupancy_section(ctx, k, kernel_ns),
        unaligned_gemms=unaligned,
        counters=gpu_counters(ctx, k),
        kernel_ns=kernel_ns,
        warnings=_warnings(ctx, spec),
        attention=attention,
    )
