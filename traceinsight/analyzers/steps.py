"""Step statistics: step times, variance, outliers, and what share each phase takes."""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from traceinsight.analyzers.context import Context, host_ranges
from traceinsight.model import intervals as iv
from traceinsight.model.classify import API_KINDS, DATALOADER_PATTERN, HOST_OP_KINDS, LAUNCH_API

# A step is an outlier when it is this much slower than the median (and beyond 3 robust sigmas).
OUTLIER_FACTOR = 1.25


@dataclass(frozen=True)
class StepTime:
    """One step: its span (from the previous step's end, GPU-aligned), the host's time in the
    data loader, forward, backward and the optimizer inside it, the GPU's busy time, and its
    start's offset from the window's."""

    step: int
    start_ns: int
    end_ns: int
    dur_ns: int
    dataloader_ns: int
    forward_ns: int | None
    backward_ns: int | None
    optimizer_ns: int | None
    gpu_busy_ns: int | None
    offset_ns: int


@dataclass(frozen=True)
class StepResult:
    steps: int
    step_time_mean_ns: float | None
    step_time_median_ns: float | None
    step_time_p90_ns: float | None
    step_time_cv: float | None
    dataloader_ns: int
    dataloader_ratio: float | None
    outlier_steps: tuple[int, ...]
    per_step: tuple[StepTime, ...]
    # the DataLoader's iterator as the trace names it: "multi_process" (num_workers > 0),
    # "single_process" (num_workers=0, loading in the step's own thread) or None
    loader_iterator: str | None = None
    # batches the loader delivers in a step (median over the steps): several where a step
    # accumulates gradients over micro-batches or iterates a dataset; None without a loader
    loader_calls_per_step: float | None = None
    # where workers hand their batches to a pin-memory thread: the longest time, over the
    # window's steps, from the step thread's request for a batch (a DataLoader call's end) to
    # the next batch reaching the pin-memory thread, where each step's request was followed by
    # exactly one (:func:`loader_arrival_lag_ns`); None elsewhere
    loader_arrival_lag_ns: int | None = None


def context_loader_iterator(ctx: Context) -> str | None:
    """The window's DataLoader iterator kind (:func:`loader_iterator` of its ranges' names)."""
    return loader_iterator(ctx.rows(HOST_OP_KINDS, DATALOADER_PATTERN).get_column("name"))


def loader_iterator(names: pl.Series) -> str | None:
    """The iterator kind the DataLoader ranges name (see :attr:`StepResult.loader_iterator`)."""
    if names.str.contains("_MultiProcessingDataLoaderIter").any():
        return "multi_process"
    if names.str.contains("_SingleProcessDataLoaderIter").any():
        return "single_process"
    return None


# The ops that make one tensor of a batch inside DataLoader.__next__, counted where not inside
# another of them: collated in the step's thread (default_collate's stack, torch.tensor of
# numbers, PyG's cat; pin_memory copies each tensor once more, so the larger count), or
# received from workers (each tensor rebuilt on its shared-memory storage by one set_).
COLLATED_TENSOR_OPS = ("aten::stack", "aten::cat", "aten::lift_fresh")
PINNED_TENSOR_OPS = ("aten::pin_memory",)
RECEIVED_TENSOR_OPS = ("aten::set_",)


def batch_tensors(ctx: Context, loader: pl.DataFrame) -> float | None:
    """Tensors a batch carries, by the ops inside the DataLoader's ranges ``loader`` (name,
    tid, start_ns, end_ns) in the window: received ones where workers load, else the collated
    (or pinned) ones; None without a loader, or where the step thread's loading records none."""
    iterator = loader_iterator(loader.get_column("name"))
    if iterator is None:
        return None
    lo, hi = ctx.window_start_ns, ctx.window_end_ns
    ranges = iv.union(loader.select("tid", "start_ns", "end_ns"), by=["tid"]).filter(
        pl.col("start_ns").is_between(lo, hi, "left")
    )
    if ranges.height == 0:
        return None
    names = (
        RECEIVED_TENSOR_OPS
        if iterator == "multi_process"
        else (*COLLATED_TENSOR_OPS, *PINNED_TENSOR_OPS)
    )
    ops = (
        ctx.ops.filter(pl.col("name").is_in(names) & pl.col("start_ns").is_between(lo, hi, "left"))
        .select("tid", "name", "start_ns", "end_ns")
        .sort("tid", "start_ns")
        .join_asof(
            ranges.sort("tid", "start_ns").select(
                "tid", pl.col("start_ns").alias("_r_start"), pl.col("end_ns").alias("_r_end")
            ),
            left_on="start_ns",
            right_on="_r_start",
            by="tid",
            check_sortedness=False,  # sorted within each tid, as by= needs
        )
        .filter(pl.col("end_ns") <= pl.col("_r_end"))
    )
    # outermost only: stack calls cat, pin_memory copies
    nested = (pl.col("end_ns") <= pl.col("end_ns").cum_max().shift(1).over("tid")).fill_null(False)
    ops = ops.filter(~nested)
    if iterator == "single_process":
        ops = _without_samples_own(ctx, ops)
    counts = ops.group_by("name").len()
    n = dict(zip(counts.get_column("name"), counts.get_column("len"), strict=True))
    if iterator == "multi_process":
        return sum(n.get(x, 0) for x in RECEIVED_TENSOR_OPS) / ranges.height
    made = sum(n.get(x, 0) for x in COLLATED_TENSOR_OPS)
    pinned = sum(n.get(x, 0) for x in PINNED_TENSOR_OPS)
    # none recorded (a synthetic trace, a collate of Python objects): not known
    return max(made, pinned) / ranges.height or None


# a torch.tensor is a sample's own where its range's tensors made before the first stack or cat
# have no more shapes than there are stacks and cats and this many tensors of each shape or more
PER_SAMPLE_MIN = 8


def _without_samples_own(ctx: Context, ops: pl.DataFrame) -> pl.DataFrame:
    """The outermost loader ops ``ops`` (tid, name, start_ns, end_ns, _r_start) less the
    tensors each sample made in ``__getitem__``: a worker makes those and sends only what the
    collate stacks of them. Such tensors come before the collate's first stack or cat, in few
    shapes repeated for every sample (a pandas Dataset's three of each of 256 rows: [30], [10],
    [] 256 times, 3 stacks); a Dataset that makes the batch's own tensors (DLRM's 54 of 20-odd
    shapes, 1 stack) keeps them. Without recorded shapes nothing is taken out."""
    collate = pl.col("name").is_in(("aten::stack", "aten::cat"))
    first = pl.col("start_ns").filter(collate).min().over("tid", "_r_start")
    before = (pl.col("name") == "aten::lift_fresh") & (pl.col("start_ns") < first)
    if ctx.op_args.height == 0 or not ops.select(before.any()).item():
        return ops
    dims = ctx.op_args.filter(pl.col("name") == "aten::lift_fresh").select(
        "tid", "start_ns", "name", "input_dims"
    )
    marked = ops.join(dims, on=["tid", "start_ns", "name"], how="left").with_columns(
        before.fill_null(False).alias("_cand")
    )
    per_range = (
        marked.group_by("tid", "_r_start")
        .agg(
            pl.col("_cand").sum().alias("n"),
            pl.col("input_dims").filter(pl.col("_cand")).n_unique().alias("shapes"),
            pl.col("input_dims").filter(pl.col("_cand")).null_count().alias("unknown"),
            collate.sum().alias("stacks"),
        )
        .with_columns(
            (
                (pl.col("n") > 0)
                & (pl.col("unknown") == 0)
                & (pl.col("shapes") <= pl.col("stacks"))
                & (pl.col("n") >= PER_SAMPLE_MIN * pl.col("shapes"))
            ).alias("_samples")
        )
        .select("tid", "_r_start", "_samples")
    )
    return (
        marked.join(per_range, on=["tid", "_r_start"], how="left")
        .filter(~(pl.col("_cand") & pl.col("_samples").fill_null(False)))
        .drop("_cand", "_samples", "input_dims")
    )


def _forward_ns(spans: pl.DataFrame, bw_rows: pl.DataFrame, dl: pl.DataFrame) -> pl.Series:
    if bw_rows.height == 0:
        return pl.Series([None] * spans.height, dtype=pl.Int64)
    first_bw = (
        spans.select("step", "start_ns", "end_ns")
        .join_where(
            bw_rows.select(pl.col("start_ns").alias("b")),
            pl.col("b") >= pl.col("start_ns"),
            pl.col("b") < pl.col("end_ns"),
        )
        .group_by("step")
        .agg(pl.col("b").min())
    )
    dl_end = (
        spans.select("step", "start_ns", "end_ns")
        .join_where(
            dl.select(pl.col("end_ns").alias("d")),
            pl.col("d") > pl.col("start_ns"),
            pl.col("d") <= pl.col("end_ns"),
        )
        .group_by("step")
        .agg(pl.col("d").max())
        if dl.height
        else pl.DataFrame(schema={"step": pl.Int64, "d": pl.Int64})
    )
    out = (
        spans.select("step", "start_ns")
        .join(first_bw, on="step", how="left")
        .join(dl_end, on="step", how="left", maintain_order="left")
    )
    return out.select(
        (pl.col("b") - pl.max_horizontal("start_ns", pl.col("d").fill_null(0))).clip(0, None)
    ).to_series()


def analyze_steps(ctx: Context) -> StepResult:
    st = ctx.steps
    dl = host_ranges(ctx, DATALOADER_PATTERN)
    iterator = context_loader_iterator(ctx)
    if st.height == 0:
        dl_ns = iv.total(dl)
        return StepResult(
            0,
            None,
            None,
            None,
            None,
            dl_ns,
            dl_ns / ctx.window_ns if ctx.window_ns and dl_ns else None,
            (),
            (),
            iterator,
        )
    spans = st.select("step", "start_ns", "end_ns", "dur_ns")
    # Host-side phases are measured on the host's own step ranges: with a GPU-bound loop the host
    # runs a step ahead of the GPU-aligned windows.
    host = st.select(
        "step", pl.col("host_start_ns").alias("start_ns"), pl.col("host_end_ns").alias("end_ns")
    )
    dl_per = iv.overlap_with(host, dl) if dl.height else pl.Series([0] * st.height)
    opt = host_ranges(ctx, r"^Optimizer\.step#", ("gpu_annotation",))
    gpu_opt = opt.height > 0  # the GPU mirror of the annotation measures GPU-side optimizer time
    if opt.height == 0:
        opt = host_ranges(ctx, r"^Optimizer\.step#")
    opt_per = (
        iv.overlap_with(spans if gpu_opt else host, opt)
        if opt.height
        else pl.Series([0] * st.height)
    )
    # Backward: autograd node ranges (host); forward: from the end of data loading to the first
    # backward node of the step. Both need the autograd profiler's op names, so null otherwise.
    bw_rows = ctx.rows(("cpu_op",), "^autograd::engine::evaluate_function")
    # not clipped to the GPU-aligned window: each host step bounds its own (audit 22: a DDP
    # rank's host ran 30 ms ahead of the GPU, and its steps read 0, 1.75 and 9.22 ms of
    # backward where each held 8.3-9.2 ms)
    bw = iv.union(bw_rows) if bw_rows.height else None
    bw_per = (
        iv.overlap_with(host, bw)
        if bw is not None
        else pl.Series([None] * st.height, dtype=pl.Int64)
    )
    fw_per = _forward_ns(host, bw_rows, dl)
    busy = ctx.busy.select("start_ns", "end_ns") if ctx.has_gpu else None
    busy_per = (
        iv.overlap_with(spans, iv.union(busy)) if busy is not None else pl.Series([0] * st.height)
    )
    calls = _loader_calls_per_step(ctx, host)
    spans = spans.with_columns(
        dl_per.alias("dataloader_ns"),
        fw_per.alias("forward_ns"),
        bw_per.alias("backward_ns"),
        opt_per.alias("optimizer_ns"),
        busy_per.alias("gpu_busy_ns"),
    )
    d = spans["dur_ns"].cast(pl.Float64)
    median = float(d.median())
    mad = float((d - median).abs().median())
    threshold = max(OUTLIER_FACTOR * median, median + 3 * 1.4826 * mad)
    outliers = spans.filter(pl.col("dur_ns") > threshold)["step"].to_list()
    mean = float(d.mean())
    std = float(d.std()) if st.height > 1 else 0.0
    total = int(spans["dur_ns"].sum())
    dl_total = int(spans["dataloader_ns"].sum())
    # a pin-memory thread only with workers
    pin = pin_thread_view(ctx) if iterator == "multi_process" else None
    return StepResult(
        steps=st.height,
        step_time_mean_ns=mean,
        step_time_median_ns=median,
        step_time_p90_ns=float(d.quantile(0.9, "nearest")),
        step_time_cv=std / mean if mean else None,
        dataloader_ns=dl_total,
        dataloader_ratio=dl_total / total if total else None,
        outlier_steps=tuple(int(s) for s in outliers if s is not None),
        per_step=tuple(
            StepTime(**row)
            for row in spans.with_columns(
                (pl.col("start_ns") - ctx.window_start_ns).alias("offset_ns")
            ).iter_rows(named=True)
        ),
        loader_iterator=iterator,
        loader_calls_per_step=calls,
        loader_arrival_lag_ns=loader_arrival_lag_ns(pin),
    )


# the runtime call that pinning a batch's tensor makes first (Tensor.pin_memory's is_pinned
# check), on a thread that launches nothing: DataLoader's pin-memory thread
PIN_CHECK_CALL = r"^(cuda|hip)PointerGetAttributes$"
# calls of the pin-memory thread this far apart belong to different batches
ARRIVAL_GAP_NS = 1_000_000


def pin_thread_view(ctx: Context) -> tuple[pl.DataFrame, pl.Series] | None:
    """The pin-memory thread's runtime calls (name, start_ns, end_ns, by start) and the step
    thread's batch requests (its outermost DataLoader calls' ends, sorted); None where no
    single pin-memory thread or fewer than two requests are recorded."""
    loader = ctx.rows(HOST_OP_KINDS, DATALOADER_PATTERN, columns=("tid", "start_ns", "end_ns"))
    calls = ctx.rows(API_KINDS, columns=("tid", "name", "start_ns", "end_ns"))
    if loader.height < 2 or calls.height == 0:
        return None
    step_tids = loader.get_column("tid").unique().implode()
    threads = (
        calls.filter(~pl.col("tid").is_in(step_tids))
        .group_by("tid")
        .agg(
            pl.col("name").str.contains(PIN_CHECK_CALL).any().alias("pins"),
            pl.col("name").str.contains(LAUNCH_API).any().alias("launches"),
        )
        .filter(pl.col("pins") & ~pl.col("launches"))
    )
    if threads.height != 1:
        return None
    pin = calls.filter(pl.col("tid") == threads.item(0, "tid")).sort("start_ns")
    # the outermost calls' ends: a name pattern may match a call and a range inside it
    requests = (
        iv.union(loader.select("tid", "start_ns", "end_ns"), by=["tid"]).get_column("end_ns").sort()
    )
    if requests.len() < 2:  # zero-length calls hold no request
        return None
    return pin, requests


def loader_arrival_lag_ns(found: tuple[pl.DataFrame, pl.Series] | None) -> int | None:
    """Where DataLoader workers hand their batches to a pin-memory thread (pin_memory=True):
    the profiler records that thread's runtime calls, so each batch's arrival from the workers
    is in the trace (the first call of a burst of its calls, bursts ARRIVAL_GAP_NS apart),
    though the workers' processes are not. Each DataLoader call of the step thread asks the
    workers for one more batch as it returns. Where every step's request was followed by
    exactly one arrival before the next request, the longest time from a request to its
    arrival: a worker given a batch to load delivered it that soon (a torchvision ResNet fed
    tensors: 4.3-4.7 ms, one arrival a step). Workers that load slower than the step asks
    deliver on their own clock, not after each request (the same loop decoding images: bursts
    2.2-29.1 ms after a request, more of them than steps): None, as where no pin-memory thread
    was recorded (``found``: :func:`pin_thread_view`)."""
    if found is None:
        return None
    pin, requests = found
    arrivals = pin.filter(
        (pl.col("start_ns") - pl.col("end_ns").shift(1)).fill_null(ARRIVAL_GAP_NS) >= ARRIVAL_GAP_NS
    ).get_column("start_ns")
    if arrivals.len() == 0:
        return None
    after = arrivals.search_sorted(requests, side="right").cast(pl.Int64)
    # arrivals before each request's next one (the last request: up to the window's end)
    got = after.shift(-1).fill_null(arrivals.len()) - after
    if not (got == 1).all():
        return None
    lags = arrivals.gather(after) - requests
    return int(lags.max())


# a loader call this much shorter than the median one is no batch (the StopIteration that ends
# an epoch, a sampler's bookkeeping)
LOADER_CALL_MIN_RATIO = 0.1


def _loader_calls_per_step(ctx: Context, host: pl.DataFrame) -> float | None:
    """The median over the steps (their host ranges ``host``) of the DataLoader calls that
    start in each: an HF pipeline's step held 5 batches of about 124 ms, and "625 ms per batch"
    was the step's (audit 6)."""
    rows = ctx.rows(HOST_OP_KINDS, DATALOADER_PATTERN, columns=("tid", "start_ns", "end_ns"))
    if rows.height == 0:
        return None
    # outermost calls only (a name pattern may match a call and a range inside it)
    rows = rows.sort("tid", "start_ns")
    nested = (pl.col("end_ns") <= pl.col("end_ns").cum_max().shift(1).over("tid")).fill_null(False)
    rows = rows.filter(~nested).with_columns((pl.col("end_ns") - pl.col("start_ns")).alias("d"))
    rows = rows.filter(pl.col("d") >= LOADER_CALL_MIN_RATIO * pl.col("d").median())
    starts = host.get_column("start_ns").sort()
    i = starts.search_sorted(rows.get_column("start_ns"), side="right").cast(pl.Int64) - 1
    ends = host.sort("start_ns").get_column("end_ns")
    inside = (i >= 0) & (rows.get_column("start_ns") < ends.gather(i.clip(0)))
    per = (
        pl.DataFrame({"i": i.filter(inside)})
        .group_by("i")
        .len()
        .join(pl.DataFrame({"i": range(host.height)}, schema={"i": pl.Int64}), on="i", how="right")
        .get_column("len")
        .fill_null(0)
    )
    return float(per.median()) if per.len() else None
