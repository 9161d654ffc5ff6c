"""Host ops that ran far below the host's own speed: CPU copies (``cat``, ``stack``, ``copy_``,
...) of megabytes that took hundreds of milliseconds. Such an op does no device work and reads
memory a core copies at gigabytes a second; at a hundredth of that its threads did not run: the
intra-op thread pool contends with other threads or processes for the cores.

Measured on the H200 (fixtures/h200/thirdparty/README.md, calls 8-10): Lightning's loop
compiled with ``mode="reduce-overhead"`` against a warm inductor cache collated each 6 MB batch
in 250 ms, every step (222-257 ms steps; a 6 MB torch.stack timed alone in such a process 144-242
ms, 0.6-1.3 ms in the processes that ran fast); OMP_NUM_THREADS=1 or
TORCHINDUCTOR_COMPILE_THREADS=1 gave 6.2-6.5 ms steps.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import polars as pl

from traceinsight.analyzers.context import Context
from traceinsight.analyzers.replay import ReplayResult
from traceinsight.causal import transforms as tf
from traceinsight.causal.whatif import WhatIf
from traceinsight.model.classify import API_KINDS
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


@dataclass(frozen=True)
class HostOpsResult:
    contended: tuple[ContendedOp, ...] = ()
    contended_ns: int = 0  # the contended ops' time in the window
    window_ns: int = 0
    # the ops at HEALTHY_BYTES_PER_NS, replayed (at HEALTHY_MAX_BYTES_PER_NS: the upper end)
    what_if: WhatIf | None = None
    what_if_upper: WhatIf | None = None
    assumed_bytes_per_s: float = HEALTHY_BYTES_PER_NS * 1e9

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
    api = (
        ctx.rows(API_KINDS, columns=("start_ns", "tid"))
        .filter(pl.col("tid").is_in(ops.get_column("tid").unique().implode()))
        .select(pl.col("tid"), pl.col("start_ns").alias("_api_ns"))
        .sort("_api_ns")
    )
    ops = ops.sort("start_ns").join_asof(
        api,
        left_on="start_ns",
        right_on="_api_ns",
        by="tid",
        strategy="forward",
        check_sortedness=False,  # both sorted by time: within each thread too
    )
    return ops.filter(pl.col("_api_ns").is_null() | (pl.col("_api_ns") > pl.col("end_ns"))).drop(
        "_api_ns"
    )


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
                (pl.col("tid") == row["tid"])
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


def analyze_host_ops(ctx: Context, replay: ReplayResult | None) -> HostOpsResult:
    ops = _long_copies(ctx)
    if ops.height == 0:
        return HostOpsResult(window_ns=ctx.window_ns)
    ops = _with_bytes(ctx, ops).filter(pl.col("bytes") >= MIN_BYTES)
    slow = ops.with_columns((pl.col("bytes") / pl.col("dur_ns")).alias("rate")).filter(
        pl.col("rate") < CONTENDED_MAX_BYTES_PER_NS
    )
    if slow.height == 0:
        return HostOpsResult(window_ns=ctx.window_ns)
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
            "end_ns",
            (pl.col("dur_ns") - (pl.col("bytes") / rate).cast(pl.Int64)).clip(0).alias("saved_ns"),
        )
        return replay.predict(tf.host_time_cut(cuts))

    return HostOpsResult(
        contended,
        int(slow.get_column("dur_ns").sum()),
        ctx.window_ns,
        at(HEALTHY_BYTES_PER_NS),
        at(HEALTHY_MAX_BYTES_PER_NS),
    )
