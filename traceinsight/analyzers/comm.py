"""Communication/computation overlap per device: |comm ∩ compute| / |comm| over interval unions,
and the same split by collective kind (what the advice depends on)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from traceinsight.analyzers.context import Context, calls_inside, launched
from traceinsight.model import intervals as iv
from traceinsight.model.classify import BACKWARD_PATTERN, HOST_OP_KINDS, names_matching

# Collective kinds, matched on lower-case names with everything but letters removed
# (ncclDevKernel_AllReduce_Sum_f32 -> ...allreduce..., nccl:_all_gather_base -> ...allgather...).
# First match wins: all-to-all before send/recv, reduce-scatter before reduce.
COLLECTIVE_KINDS: tuple[tuple[str, str], ...] = (
    ("all_to_all", "alltoall|epinternode|epintranode"),  # DeepEP's dispatch and combine
    ("all_reduce", "allreduce"),
    ("reduce_scatter", "reducescatter"),
    ("all_gather", "allgather"),
    ("send_recv", "sendrecv|send|recv"),
    ("broadcast", "broadcast|bcast"),
    ("reduce", "reduce"),
)
# NCCL runs all-to-all as grouped send/recv (ncclDevKernel_SendRecv) and newer versions launch
# ncclDevKernel_Generic: for those kernels the host op that launched them (nccl:all_to_all,
# nccl:send) names the collective.
HOST_DECIDES = ("send_recv", "other")
NCCL_HOST_OP = r"^nccl:|^nccl[A-Z]"

# A collective's message moves in at most its bus bytes over this bandwidth plus a latency per
# collective and per rank of its group: a 100 Gb/s link, slower than NVLink, xGMI, PCIe 4 x16
# and the InfiniBand of GPU clusters. What a collective kernel takes beyond that is its rank
# waiting for the others to reach it (an MI300X DDP rank's 5.75 MB all-reduces took 6.7-6.9 ms
# over 8 ranks: 1.5 GB/s, where RCCL moves such buffers at 100 GB/s and more).
COMM_FLOOR_BYTES_PER_S = 12.5e9
COMM_LATENCY_NS = 100_000
COMM_LATENCY_PER_RANK_NS = 5_000
# bytes each rank moves per byte of its input message ("In msg nelems"), p ranks (the bus
# bytes of NCCL's tests): a ring all-reduce sends and receives 2(p-1)/p of it, an all-gather's
# input is its own chunk of the (p-1) it receives, a reduce-scatter's the whole buffer
_BUS_FACTOR: dict[str, Callable[[pl.Expr], pl.Expr]] = {
    "all_reduce": lambda p: 2 * (p - 1) / p,
    "all_gather": lambda p: p - 1,
    "reduce_scatter": lambda p: (p - 1) / p,
    "all_to_all": lambda p: (p - 1) / p,
}
# Kineto's dtype names (record_param_comms' "dtype") -> bytes
COMM_DTYPE_BYTES = {
    "Double": 8,
    "Float": 4,
    "Half": 2,
    "BFloat16": 2,
    "Long": 8,
    "Int": 4,
    "Short": 2,
    "Char": 1,
    "Byte": 1,
    "Bool": 1,
    "ComplexFloat": 8,
    "ComplexDouble": 16,
    "Float8_e4m3fn": 1,
    "Float8_e5m2": 1,
    "Float8_e4m3fnuz": 1,
    "Float8_e5m2fnuz": 1,
}


def collective_kind(name: pl.Expr) -> pl.Expr:
    """The collective kind a name says (``other`` when none)."""
    norm = name.str.to_lowercase().str.replace_all("[^a-z]", "")
    out: pl.Expr = pl.lit("other")
    for kind, pattern in reversed(COLLECTIVE_KINDS):
        out = pl.when(norm.str.contains(pattern)).then(pl.lit(kind)).otherwise(out)
    return out


def kinds_of(df: pl.DataFrame, col: str, alias: str) -> pl.DataFrame:
    """``df`` with :func:`collective_kind` of ``col`` as ``alias``, the patterns run once per
    distinct name (a job's tens of thousands of kernels repeat a handful of names)."""
    names = df.select(pl.col(col).unique())
    kinds = names.with_columns(collective_kind(pl.col(col)).alias(alias))
    rows = df.drop(alias, strict=False)  # replaced, as with_columns would
    return rows.join(kinds, on=col, how="left", nulls_equal=True, maintain_order="left").select(
        df.columns + ([] if alias in df.columns else [alias])
    )


def with_kinds(
    comm: pl.DataFrame,
    events: pl.DataFrame,
    kernel_args: pl.DataFrame | None = None,
    ranges: pl.DataFrame | None = None,
) -> pl.DataFrame:
    """``comm`` (kernels with ``correlation``) with a ``kind`` column: from the kernel name, or
    where the name is ambiguous (``ncclDevKernel_Generic``, SendRecv) from the kernel's own
    ``Collective name`` (Kineto's kernel args, in ``kernel_args``), then from the outermost host
    range around its launch that names a collective, else from the launching host op (runtime
    call -> op on external id). ``ranges``: the host ranges that name a collective
    (:data:`COMM_RANGE`: name, start_ns, end_ns, tid), where the caller has them (a Context's
    rows: else found in ``events``)."""
    comm = kinds_of(comm, "name", "kind")
    if kernel_args is not None and kernel_args.get_column("collective").drop_nulls().len():
        named = (
            kernel_args.filter(pl.col("collective").is_not_null())
            .select("device", "start_ns", collective_kind(pl.col("collective")).alias("_named"))
            .unique(["device", "start_ns"])
        )
        comm = (
            comm.join(named, on=["device", "start_ns"], how="left")
            .with_columns(
                pl.when(pl.col("kind").is_in(HOST_DECIDES) & (pl.col("_named") != "other"))
                .then(pl.col("_named"))
                .otherwise(pl.col("kind"))
                .alias("kind")
            )
            .drop("_named")
        )
    comm = _kind_of_enclosing_range(comm, events, ranges)
    ambiguous = comm.filter(
        pl.col("kind").is_in(HOST_DECIDES) & pl.col("correlation").is_not_null()
    )
    if ambiguous.height == 0:
        return comm
    cols = events.select("kind", "name", "external_id", "correlation")
    calls = _launch_ids(events, ambiguous.get_column("correlation"))
    ops = names_matching(
        cols.filter(
            pl.col("kind").is_in(["cpu_op", "user_annotation"])
            & pl.col("external_id").is_not_null()
        ),
        NCCL_HOST_OP,
    )
    ops = kinds_of(ops.select("external_id", "name"), "name", "host_kind").drop("name")
    host = (
        calls.join(ops.unique("external_id"), on="external_id")
        .filter(pl.col("host_kind") != "other")
        .unique("correlation")
        .select("correlation", "host_kind")
    )
    # Unlinked kernels (sampled traces drop launches): SendRecv kernels in a trace whose
    # collective ops include all-to-all but no send/recv are its all-to-alls.
    p2p = set(ops.get_column("host_kind").unique().to_list()) & {"all_to_all", "send_recv"}
    fallback = pl.lit("all_to_all") if p2p == {"all_to_all"} else pl.lit(None, pl.String)
    return (
        comm.join(host, on="correlation", how="left")
        .with_columns(
            pl.when(pl.col("kind").is_in(HOST_DECIDES) & pl.col("host_kind").is_not_null())
            .then(pl.col("host_kind"))
            .when((pl.col("kind") == "send_recv") & pl.col("host_kind").is_null())
            .then(fallback.fill_null(pl.col("kind")))
            .otherwise(pl.col("kind"))
            .alias("kind")
        )
        .drop("host_kind")
    )


@dataclass(frozen=True)
class CommResult:
    comm_kernel_count: int
    comm_ns: int  # union of communication kernels, summed over devices
    exposed_comm_ns: int  # communication not hidden behind compute
    comm_compute_overlap_ratio: float | None  # null when there is no communication
    exposed_comm_ratio: float | None  # exposed communication / analysis window
    comm_time_ratio: float | None  # communication union / window
    per_device: tuple[dict[str, Any], ...]
    top_collectives: tuple[dict[str, Any], ...]
    # collective kind -> {count, comm_ns, exposed_ns} (unions per kind and device, summed)
    by_kind: dict[str, dict[str, int]] = field(default_factory=dict)
    # the collectives whose message the trace records (Kineto's record_param_comms args) among
    # groups of 2 ranks or more: their kernels' time summed, what moving their bus bytes takes
    # at most (:data:`COMM_FLOOR_BYTES_PER_S`, latencies), and the time beyond that in each:
    # at least that much of them is this rank waiting for the others
    sized_comm_ns: int = 0
    transfer_bound_ns: int = 0
    peer_wait_ns: int = 0
    # where the sizes came from: "sizes" (the messages), or "repeats" where the trace records
    # none: a collective repeated many times with NCCL's low-latency protocol, each call over
    # the fastest tenth of its calls taken as waiting (:func:`_repeat_wait`)
    peer_wait_source: str | None = None
    # share of the communication kernels' time launched inside backward (autograd) ops: data
    # parallel's gradient reduction; near 0 in a forward-only (inference, tensor-parallel) run
    backward_comm_ratio: float | None = None
    # launched inside or after the first backward op of its step (a manual all-reduce after
    # backward is gradient reduction too, not a forward's tensor parallelism)
    after_backward_comm_ratio: float | None = None
    # the compute kernels' union (summed over devices): what communication can hide behind
    compute_ns: int = 0

    @property
    def hideable_ns(self) -> int:
        """The compute not yet under communication: the most an overlap can hide of it."""
        return max(0, self.compute_ns - (self.comm_ns - self.exposed_comm_ns))


def analyze_comm(ctx: Context) -> CommResult:
    k = ctx.gpu.filter(pl.col("kind") == "kernel")
    comm = k.filter(pl.col("kernel_class") == "communication")
    if comm.height == 0:
        return CommResult(0, 0, 0, None, None, None, (), ())
    cu = iv.union(comm, by=["device"])
    pu = ctx.compute_busy
    overlapped = iv.overlap_by(cu, pu, "device")
    per_device = []
    tot_c = tot_b = 0
    for dev in sorted(cu["device"].unique().to_list()):
        c = iv.total(cu.filter(pl.col("device") == dev))
        b = overlapped.get(dev, 0)
        tot_c += c
        tot_b += b
        per_device.append(
            {
                "device": dev,
                "comm_ns": c,
                "overlapped_ns": b,
                "exposed_ns": c - b,
                "overlap_ratio": b / c if c else None,
            }
        )
    window = max(1, ctx.window_ns) * max(1, len(ctx.devices))
    ranges = ctx.rows(HOST_OP_KINDS, COMM_RANGE, columns=("name", "start_ns", "end_ns", "tid"))
    kinds = with_kinds(comm, ctx.events, ctx.kernel_args, ranges)
    top = (
        comm.group_by("name")
        .agg(pl.len().alias("count"), pl.col("dur_ns").sum().alias("total_ns"))
        .sort(["total_ns", "name"], descending=[True, False])
        .head(10)
    )
    in_backward, after_backward = _backward_ratios(ctx)
    return CommResult(
        comm_kernel_count=comm.height,
        comm_ns=tot_c,
        exposed_comm_ns=tot_c - tot_b,
        comm_compute_overlap_ratio=tot_b / tot_c if tot_c else None,
        exposed_comm_ratio=(tot_c - tot_b) / window,
        comm_time_ratio=tot_c / window,
        per_device=tuple(per_device),
        top_collectives=tuple(top.iter_rows(named=True)),
        by_kind=_by_kind(kinds, pu),
        backward_comm_ratio=in_backward,
        after_backward_comm_ratio=after_backward,
        compute_ns=iv.total(pu),
        **(_peer_wait(kinds, ctx) or _repeat_wait(kinds)),
    )


def _messages(comm: pl.DataFrame, ctx: Context) -> pl.DataFrame:
    """``comm`` with each kernel's message (``msg_nelems``, ``msg_dtype``, ``group_size``): its
    own args where it carries them, else its launch's record_param_comms op's (by the launch's
    external id); null where neither records one."""
    cols = ["msg_nelems", "msg_dtype", "group_size"]
    own = (
        ctx.kernel_args.filter(pl.col("msg_nelems").is_not_null())
        .select("device", "start_ns", *cols)
        .unique(["device", "start_ns"])
    )
    out = comm.join(own, on=["device", "start_ns"], how="left")
    ops = ctx.comm_messages.filter(pl.col("external_id").is_not_null())
    missing = out.filter(pl.col("msg_nelems").is_null() & pl.col("correlation").is_not_null())
    if ops.height == 0 or missing.height == 0:
        return out
    calls = _launch_ids(ctx.events, missing.get_column("correlation"))
    by_launch = (
        calls.join(ops.select("external_id", *cols).unique("external_id"), on="external_id")
        .unique("correlation")
        .select("correlation", *[pl.col(c).alias(f"_{c}") for c in cols])
    )
    return (
        out.join(by_launch, on="correlation", how="left")
        .with_columns(pl.coalesce(c, f"_{c}").alias(c) for c in cols)
        .drop([f"_{c}" for c in cols])
    )


# a host range of an all-to-all (c10d::alltoall_base_, an all_to_all_single, a model's own
# "AllToAll4D"), its name lower-cased
ALL_TO_ALL_RANGE = r"(?i)all_?to_?all"
# the host ranges that say which collective runs inside them: an all-to-all's, NCCL's own
# (Kineto's nccl:all_reduce, nsys's ncclAllReduce) and c10d's ops
COMM_RANGE = f"{ALL_TO_ALL_RANGE}|{NCCL_HOST_OP}|^c10d::"


def _kind_of_enclosing_range(
    comm: pl.DataFrame, events: pl.DataFrame, ranges: pl.DataFrame | None
) -> pl.DataFrame:
    """A SendRecv or unnamed kernel launched inside a host range of a known collective is that
    collective: the outermost such range on the launching thread (the user's call: a
    ``c10d::alltoall_base_`` around NCCL's ``ncclSend``/``ncclRecv`` is the all-to-all). NCCL
    runs an all-to-all as grouped sends and receives to every peer (audit 22: an FSDP job's
    Ulysses sequence parallelism read as pipeline parallelism's point-to-point); in a 2023
    TorchRec job whose launches link to no op, DDP's gradient all-reduce ran SendRecv kernels
    inside ``nccl:all_reduce``, 126.6 ms read as all-to-all (session 53)."""
    sr = comm.filter(pl.col("kind").is_in(HOST_DECIDES) & pl.col("correlation").is_not_null())
    if sr.height == 0:
        return comm
    if ranges is None:
        # lazily, so the filters copy only the columns used, not the whole table's
        host = (
            events.lazy()
            .filter(pl.col("kind").is_in(HOST_OP_KINDS))
            .select("name", "start_ns", "end_ns", "tid")
            .collect()
        )
        ranges = names_matching(host, COMM_RANGE)
    ranges = kinds_of(ranges.select("name", "start_ns", "end_ns", "tid"), "name", "_kind")
    ranges = ranges.filter(pl.col("_kind") != "other").select("start_ns", "end_ns", "tid", "_kind")
    if ranges.height == 0:
        return comm
    calls = (
        events.lazy()
        .filter(
            pl.col("kind").is_in(["runtime", "driver"])
            & pl.col("correlation").is_in(sr.get_column("correlation").unique().implode())
        )
        .select("correlation", "start_ns", "end_ns", "tid")
        .collect()
    )
    inside = (
        calls_inside(calls, ranges).sort("c_s").group_by("correlation").agg(pl.col("_kind").first())
    )
    if inside.height == 0:
        return comm
    return (
        comm.join(inside, on="correlation", how="left")
        .with_columns(
            pl.when(pl.col("kind").is_in(HOST_DECIDES) & pl.col("_kind").is_not_null())
            .then(pl.col("_kind"))
            .otherwise(pl.col("kind"))
            .alias("kind")
        )
        .drop("_kind")
    )


def _launch_ids(events: pl.DataFrame, correlations: pl.Series) -> pl.DataFrame:
    """(correlation, external_id) of the runtime/driver calls that launched ``correlations``:
    the external id names the host op around the launch."""
    return (
        events.lazy()
        .filter(
            pl.col("kind").is_in(["runtime", "driver"])
            & pl.col("correlation").is_in(correlations.unique().implode())
            & pl.col("external_id").is_not_null()
        )
        .select("correlation", "external_id")
        .collect()
    )


def _peer_wait(kinds: pl.DataFrame, ctx: Context) -> dict:
    """The sized collectives' time, the most moving their messages takes and the time beyond it
    (CommResult's ``sized_comm_ns``, ``transfer_bound_ns``, ``peer_wait_ns``)."""
    sized = _messages(kinds, ctx).filter(
        pl.col("msg_nelems").is_not_null() & (pl.col("group_size") >= 2)
    )
    if sized.height == 0:
        return {}
    p = pl.col("group_size").cast(pl.Float64)
    factor: pl.Expr = pl.lit(1.0)
    for kind, f in _BUS_FACTOR.items():
        factor = pl.when(pl.col("kind") == kind).then(f(p)).otherwise(factor)
    elem = pl.col("msg_dtype").replace_strict(
        COMM_DTYPE_BYTES, default=None, return_dtype=pl.Float64
    )
    bound = (
        pl.col("msg_nelems") * elem * factor / COMM_FLOOR_BYTES_PER_S * 1e9
        + COMM_LATENCY_NS
        + COMM_LATENCY_PER_RANK_NS * p
    )
    return _split_at(sized.filter(elem.is_not_null()), bound, "sizes")


def _split_at(calls: pl.DataFrame, bound: pl.Expr, source: str) -> dict:
    """CommResult's ``sized_comm_ns``, ``transfer_bound_ns`` and ``peer_wait_ns`` of ``calls``
    (their time, its part up to ``bound`` a call and the rest), ``peer_wait_source``."""
    if calls.height == 0:
        return {}
    got = calls.select(
        pl.col("dur_ns").sum().alias("sized_comm_ns"),
        pl.min_horizontal(bound, pl.col("dur_ns")).sum().alias("transfer_bound_ns"),
        (pl.col("dur_ns") - bound).clip(lower_bound=0).sum().alias("peer_wait_ns"),
    )
    return {k: int(v or 0) for k, v in got.row(0, named=True).items()} | {
        "peer_wait_source": source
    }


# NCCL's low-latency protocol (LL, not LL128), which it picks for small messages: a call's moving
# takes tens of microseconds, so the spread of a repeated one's calls is waiting, not size
LOW_LATENCY_PROTOCOL = r"_LL(?:\b|_|\()"
# calls of one collective kernel enough for its fastest tenth to be its transfer
REPEAT_WAIT_MIN_CALLS = 10
REPEAT_FLOOR_QUANTILE = 0.1


def _repeat_wait(kinds: pl.DataFrame) -> dict:
    """Where the trace records no message sizes: each collective kernel run at least
    :data:`REPEAT_WAIT_MIN_CALLS` times with a low-latency protocol (same name: the same
    operation, dtype and protocol, so messages of a like small size), its calls' time beyond
    the fastest tenth of them (:data:`REPEAT_FLOOR_QUANTILE`) taken as waiting for the other
    ranks: a lower bound where even the fastest waited. Audit s61: Megatron TP8 ranks on
    A100s (an older torch, no sizes), 81 identical f16 all-reduces of 582 us at the fastest,
    3.1 ms at the median, 37.5 ms at the most: 404 of their 452 ms beyond the fastest, where
    the job's cross-rank analysis charged the rank 422 ms of waiting. Empty where none."""
    ll = kinds.filter(pl.col("name").cast(pl.String).str.contains(LOW_LATENCY_PROTOCOL))
    if ll.height == 0:
        return {}
    per = (
        ll.group_by("name")
        .agg(
            pl.len().alias("calls"),
            pl.col("dur_ns").sum().alias("total"),
            pl.col("dur_ns").quantile(REPEAT_FLOOR_QUANTILE, "lower").alias("floor"),
        )
        .filter(pl.col("calls") >= REPEAT_WAIT_MIN_CALLS)
    )
    if per.height == 0:
        return {}
    return _split_at(ll.join(per.select("name", "floor"), on="name"), pl.col("floor"), "repeats")


def _backward_ratios(ctx: Context) -> tuple[float | None, float | None]:
    """Communication kernel time launched inside a backward op, and launched once a backward
    op began in the same step (the whole window where there are no steps), each over all of
    it; None without communication or host ops (nsys: the phase is unknown)."""
    comm = launched(
        ctx.launches,
        ["launch_tid", "launch_start_ns", "dur_ns"],
        (pl.col("kind") == "kernel") & (pl.col("kernel_class") == "communication"),
    )
    total = int(comm.get_column("dur_ns").sum()) if comm.height else 0
    if total == 0 or ctx.rows(HOST_OP_KINDS).height == 0:
        return None, None
    bw = ctx.rows(HOST_OP_KINDS, BACKWARD_PATTERN)
    if bw.height == 0:
        return 0.0, 0.0
    inside = iv.containing(
        comm.rename({"launch_tid": "tid", "launch_start_ns": "t"}).with_columns(
            (pl.col("t") + 1).alias("t_end")
        ),
        bw.select(
            pl.col("start_ns").alias("b_s"),
            pl.col("end_ns").alias("b_e"),
            pl.col("tid").alias("b_tid"),
        ),
        inner_start="t",
        inner_end="t_end",
        outer_start="b_s",
        outer_end="b_e",
        same=("b_tid", "tid"),
    ).unique(subset=["tid", "t"])
    # the latest backward start and the latest step start before each launch
    starts = ctx.steps.get_column("host_start_ns").sort() if ctx.steps.height else None
    t = (
        comm.select(pl.col("launch_start_ns").alias("t"), "dur_ns")
        .sort("t")
        .join_asof(
            bw.select(pl.col("start_ns").alias("t"), pl.col("start_ns").alias("bw")).sort("t"),
            on="t",
            strategy="backward",
        )
    )
    after = pl.col("bw").is_not_null()
    if starts is not None:
        step = pl.DataFrame({"t": starts, "step_start": starts})
        t = t.join_asof(step, on="t", strategy="backward")
        after &= pl.col("step_start").is_null() | (pl.col("bw") >= pl.col("step_start"))
    return (
        float(inside.get_column("dur_ns").sum()) / total,
        float(t.filter(after).get_column("dur_ns").sum()) / total,
    )


def _by_kind(comm: pl.DataFrame, compute: pl.DataFrame) -> dict[str, dict[str, int]]:
    """Per kind: kernel count, union time and the part of it not hidden behind compute."""
    counts = dict(comm.group_by("kind").len().iter_rows())
    cu = iv.union(comm, by=["device", "kind"])
    parts = []
    for (dev,), part in cu.partition_by("device", as_dict=True, maintain_order=True).items():
        busy = compute.filter(pl.col("device").eq_missing(dev))
        parts.append(part.with_columns(iv.overlap_with(part, busy).alias("hidden_ns")))
    per = (
        pl.concat(parts)
        .with_columns((pl.col("end_ns") - pl.col("start_ns")).alias("comm_ns"))
        .group_by("kind")
        .agg(
            pl.col("comm_ns").sum(),
            (pl.col("comm_ns") - pl.col("hidden_ns")).sum().alias("exposed_ns"),
        )
        .sort("kind")
    )
    return {
        str(kind): {"count": int(counts.get(kind, 0)), "comm_ns": int(c), "exposed_ns": int(e)}
        for kind, c, e in per.iter_rows()
    }
