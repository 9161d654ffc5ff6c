"""GEMM shapes that miss the tensor cores' alignment: 16-bit GEMMs with M, N or K not a
multiple of 8 (or of 64 where that measurably costs), each against the FLOP rate of aligned
GEMMs of similar size in the same trace, else against the device's roofline; their what-if
replayed with the unaligned kernels at the expected time. A section of the efficiency analyzer
(analyzers/efficiency.py), which hands it the window's kernels with their op's costs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import polars as pl

from traceinsight.analyzers.replay import ReplayResult
from traceinsight.causal import transforms as whatif
from traceinsight.causal.whatif import WhatIf
from traceinsight.model.devices import DeviceSpec

SIXTEEN_BIT = ("bf16", "fp16")
# aligned GEMMs of "similar size": FLOPs within this factor of the unaligned one's
SIMILAR_FLOPS_FACTOR = 4.0
# a 64-aligned shape is the reference for one aligned to 8 only where it is this much faster
MISALIGNED_64_SLOWDOWN = 1.5
# Padding is the fix only where it adds little work: a shape whose dimensions padded to the
# alignment it misses would do more than this many times its FLOPs is small, not misaligned
# (TimeSformer's temporal attention, 37,632 batched 8x8x64 GEMMs, read "64-unaligned: padding
# saves 16.40 ms", where padding to 64 multiplies the work 64-fold; a GEMV's M of 1, 8-fold)
PAD_WORK_MAX_RATIO = 1.25
# A GEMM measured against the roofline (no aligned GEMM in the trace to compare with) is
# expected at this share of the attainable rate (min(peak, intensity x bandwidth)): cuBLAS
# reaches 60-80% of the tensor peak on large aligned shapes; half is the stated assumption.
GEMM_ROOFLINE_EFFICIENCY = 0.5
# A GEMM's output tile in BLAS kernels (cuBLAS, hipBLASLt): 128x128 or larger on tensor and
# matrix cores, so a grid counted at this size is the most tiles the GEMM can spread over.
OUTPUT_TILE = 128
# the kernel columns read (efficiency's kernel table has them)
KERNEL_COLUMNS = (
    "formula",
    "dtype",
    "gemm_m",
    "gemm_n",
    "gemm_k",
    "flops",
    "bytes",
    "dur_ns",
    "op",
    "device",
    "start_ns",
)


@dataclass(frozen=True)
class UnalignedGemm:
    """One unaligned GEMM shape: its kernels' time against the reference rate."""

    m: int
    n: int
    k: int
    dtype: str
    op: str | None
    alignment: str  # "8": some dimension not a multiple of 8; "64": of 64 only
    count: int
    time_ns: int
    flops: float
    achieved_tflops: float | None
    reference_tflops: float
    reference: str  # "aligned GEMMs" | "roofline"
    reference_shapes: tuple[tuple[int, int, int], ...]  # up to 5 aligned (m, n, k)
    aligned_estimate_ns: int
    saving_ns: int


@dataclass(frozen=True)
class UnalignedGemms:
    gemms: tuple[UnalignedGemm, ...] = ()  # by time, largest first
    time_ns: int = 0
    saving_ns: int = 0  # measured - (FLOPs at the reference rate)
    time_ratio: float | None = None  # of kernel time
    what_if: WhatIf | None = None  # replayed, where the replay ran


def _roofline_rate(
    spec: DeviceSpec | None, dtype: str | None, flops: float, nbytes: float | None
) -> float | None:
    """FLOP/ns a GEMM of this intensity can expect on the device (None: unknown)."""
    peak = spec.peak_tflops.get(dtype or "") if spec is not None else None
    if not peak or not flops:
        return None
    attainable = peak * 1e3  # FLOP/ns
    if nbytes:
        attainable = min(attainable, flops / nbytes * spec.memory_bandwidth_bytes_per_s / 1e9)
    return attainable * GEMM_ROOFLINE_EFFICIENCY


def _grid_limited(s: dict[str, Any], spec: DeviceSpec | None) -> bool:
    """Fewer output tiles (:data:`OUTPUT_TILE` square) than the device has SMs: the GEMM cannot
    fill the device, so the roofline says nothing of its alignment, and padding adds no tile
    (session 54: an MI300X ViT's 788-row GEMMs, 42-168 tiles on 304 CUs, ran 109-178 TFLOP/s,
    faster as N and K grew at the same misalignment: the size, not the alignment)."""
    if spec is None or not spec.sm_count:
        return False
    tiles = -(-s["gemm_m"] // OUTPUT_TILE) * -(-s["gemm_n"] // OUTPUT_TILE)
    return tiles < spec.sm_count


def _judged(
    s: dict[str, Any], rows: list[dict[str, Any]], spec: DeviceSpec | None
) -> UnalignedGemm | None:
    """Shape ``s`` against the aligned shapes among ``rows`` (or the roofline); None where it
    has no reference or is not measurably slower than it."""
    lo, hi = s["flops_each"] / SIMILAR_FLOPS_FACTOR, s["flops_each"] * SIMILAR_FLOPS_FACTOR
    ref = [
        r
        for r in rows
        if not r["off64"] and r["dtype"] == s["dtype"] and lo <= r["flops_each"] <= hi
    ]
    if ref:
        rate = sum(r["flops"] for r in ref) / max(1, sum(r["time_ns"] for r in ref))  # FLOP/ns
        reference = "aligned GEMMs"
    elif not s["off8"]:
        # aligned to 8: only a measured 64-aligned GEMM of its size tells alignment from a small
        # grid (audit 17: a B200's 888x640x2880, 35 output tiles on 148 SMs, read "off the
        # tensor-core alignment" against half the roofline, padding 888 to 896 no remedy)
        return None
    elif _grid_limited(s, spec):
        return None
    elif (rate := _roofline_rate(spec, s["dtype"], s["flops"], s["bytes"])) is not None:
        reference = "roofline"
        # a GEMM doing no more work bounds what this one can take from below: a small GEMM's
        # time is launch and latency, not FLOPs (session 54: an MI300X ViT's 788x768x768 at
        # 8.53 us a kernel read "padding saves 0.73 ms" against half the roofline, 1.42 us,
        # where its 4x768x768 took 7.50 us: 0.05 ms at most)
        floor = min(
            (
                r["time_ns"] / r["count"]
                for r in rows
                if r is not s and r["flops_each"] <= s["flops_each"]
            ),
            default=0.0,
        )
        if floor > 0:
            rate = min(rate, s["flops_each"] / floor)
    else:
        return None
    expected = s["flops"] / rate
    if not s["off8"] and s["time_ns"] < MISALIGNED_64_SLOWDOWN * expected:
        return None  # aligned to 8 and not measurably slower than the 64-aligned ones
    saving = max(0.0, s["time_ns"] - expected)
    if saving <= 0:
        return None
    return UnalignedGemm(
        m=s["gemm_m"],
        n=s["gemm_n"],
        k=s["gemm_k"],
        dtype=s["dtype"],
        op=s["op"],
        alignment="8" if s["off8"] else "64",
        count=s["count"],
        time_ns=int(s["time_ns"]),
        flops=s["flops"],
        achieved_tflops=s["flops"] / s["time_ns"] / 1e3 if s["time_ns"] else None,
        reference_tflops=rate / 1e3,
        reference=reference,
        reference_shapes=tuple((r["gemm_m"], r["gemm_n"], r["gemm_k"]) for r in ref[:5]),
        aligned_estimate_ns=int(expected),
        saving_ns=int(saving),
    )


def unaligned_gemms(
    k: pl.DataFrame,
    replay: ReplayResult | None,
    spec: DeviceSpec | None = None,
    kernel_ns: int = 0,
) -> UnalignedGemms:
    """The unaligned 16-bit GEMMs among kernels ``k`` (:data:`KERNEL_COLUMNS`), each against
    aligned GEMMs of similar size in the same trace; where the trace has none (every GEMM
    unaligned), against the device's roofline for its arithmetic intensity at
    :data:`GEMM_ROOFLINE_EFFICIENCY` (``reference`` says which). ``kernel_ns``: all kernels'
    time, for the time ratio."""
    g = k.filter(
        (pl.col("formula") == "gemm")
        & pl.col("dtype").is_in(SIXTEEN_BIT)
        & pl.col("gemm_m").is_not_null()
        & (pl.col("flops") > 0)
    )
    if g.height == 0:
        return UnalignedGemms()
    dims = [pl.col("gemm_m"), pl.col("gemm_n"), pl.col("gemm_k")]

    def padded(to: int) -> pl.Expr:  # the work padded to multiples of ``to``, over the work
        out = pl.lit(1.0)
        for d in dims:
            out = out * (((d + to - 1) // to) * to) / d
        return out

    g = g.with_columns(
        pl.any_horizontal([d % 8 != 0 for d in dims]).alias("off8"),
        pl.any_horizontal([d % 64 != 0 for d in dims]).alias("off64"),
        (padded(8) <= PAD_WORK_MAX_RATIO).alias("pad8"),
        (padded(64) <= PAD_WORK_MAX_RATIO).alias("pad64"),
    )
    shapes = (
        g.group_by("gemm_m", "gemm_n", "gemm_k", "dtype", "off8", "off64", "pad8", "pad64")
        .agg(
            pl.len().alias("count"),
            pl.col("dur_ns").sum().alias("time_ns"),
            pl.col("flops").sum().alias("flops"),
            pl.col("bytes").sum().alias("bytes"),
            pl.col("op").first(),
        )
        .with_columns((pl.col("flops") / pl.col("count")).alias("flops_each"))
        .sort(
            ["time_ns", "gemm_m", "gemm_n", "gemm_k", "dtype"],
            descending=[True, False, False, False, False],
        )
    )
    rows = shapes.to_dicts()
    # a loop over distinct GEMM shapes (tens), not over kernels
    paddable = [s for s in rows if s["off64"] and (s["pad8"] if s["off8"] else s["pad64"])]
    out = tuple(u for s in paddable if (u := _judged(s, rows, spec)) is not None)
    if not out:
        return UnalignedGemms()
    total = sum(u.time_ns for u in out)
    what_if = None
    if replay is not None:
        factors = pl.DataFrame(
            {
                "gemm_m": [u.m for u in out],
                "gemm_n": [u.n for u in out],
                "gemm_k": [u.k for u in out],
                "factor": [u.aligned_estimate_ns / max(1, u.time_ns) for u in out],
            }
        )
        keys = g.join(factors, on=["gemm_m", "gemm_n", "gemm_k"]).select(
            "device", "start_ns", "factor"
        )
        what_if = replay.predict(whatif.scaled_kernels(keys))
    return UnalignedGemms(
        gemms=out,
        time_ns=int(total),
        saving_ns=int(sum(u.saving_ns for u in out)),
        time_ratio=total / kernel_ns if kernel_ns else None,
        what_if=what_if,
    )
