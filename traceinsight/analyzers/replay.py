"""The replay analyzer: the step model of the window's steps (causal/build.py), its replay
error, and the un-profiled step before and after each fix (causal/transforms.py).

:func:`model_inputs` gathers what the model is built from out of the context; the profiler's
cost per recorded event is read off the trace (:func:`profiler_ns_per_event`) and taken out
before any prediction, so every what-if is for the loop as it runs un-profiled.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import polars as pl

from traceinsight.analyzers.context import Context, kernel_names, launched, outermost
from traceinsight.analyzers.frames import user_frames
from traceinsight.analyzers.idle import warmup_calls
from traceinsight.analyzers.optimizer import BACKWARD_PATTERN, optimizer_ranges, zero_grad_ranges
from traceinsight.analyzers.recompute import launched_inside, recompute_ranges
from traceinsight.analyzers.steps import batch_tensors, context_loader_iterator
from traceinsight.causal import transforms as whatif
from traceinsight.causal.build import ModelInputs, build_model, modelled_steps
from traceinsight.causal.columns import TRITON_LAUNCH_PATTERN
from traceinsight.causal.graph import (
    WAIT_NONE,
    Replayed,
    StepModel,
    median_step_ns,
    replay,
    statistic_of,
    steady_step_times_ns,
    step_ns,
    step_times_ns,
)
from traceinsight.causal.whatif import LOADER_BOUND_MIN_SPEEDUP, WhatIf
from traceinsight.model import intervals as iv
from traceinsight.model.classify import (
    API_KINDS,
    DATALOADER_PATTERN,
    HOST_OP_KINDS,
    MODULE_PATTERN,
)
from traceinsight.model.devices import cudnn_sdpa_in_16bit, host_links, spec_of, time_ratios

EMPTY_CACHE_PATTERN = r"empty_cache"
# Host time the profiler adds per event it records (op, annotation, Python frame, runtime
# call): predictions are for the loop without the profiler. Read off the trace itself: ops that
# do no work (views, detach, empty: well under a microsecond un-profiled) take about what
# recording one event costs, so their median duration, within [0.5, 5] us, is the cost per
# event. On the nine H200 before/after pairs (torch 2.11, record_shapes=True) it is 1.5-3.7 us
# and puts the replayed un-profiled "before" step within 3.8% of the measured one at the median
# (a fixed 2 us, the fallback without such ops, gives the same median but ratios of predicted
# to measured speedup 0.79-0.86 where these give 0.87-1.02). nsys records no ops and its API
# tracing cost was not measured: nothing is taken off.
NO_WORK_OPS = (
    r"^aten::(view|t|transpose|as_strided|detach|alias|unsqueeze|squeeze|permute|expand|"
    r"select|slice|reshape|_unsafe_view|_reshape_alias|empty)$"
)
PROFILER_NS_PER_EVENT_DEFAULT = 2_000
PROFILER_NS_PER_EVENT_RANGE = (500, 5_000)
# What the trace cannot tell: the cost per event that puts the estimate on the same process's
# un-profiled step was 1.06-1.91x the no-work op over 15 recordings of five third-party loops,
# varying as much between processes of one loop as between loops (benchmarks/RESULTS.md,
# session 18). Over 79 recordings since, it exceeded 2x on 8: sixteen fresh H100 processes of
# five loops, each measured then profiled, needed 1.16 to over 2.5x, one loop's four processes
# 1.27-2.24x (session 46). The step at 2.5 times the cost is the low end of the un-profiled
# step's range: it holds the own process's step within 10% on 55 of 63 kept recordings and 15 of
# those 16 (54 and 13 at twice the cost).
PROFILER_COST_HIGH_FACTOR = 2.5
# The model's replay of the recorded steps reproduces their median within 0.4% on every input
# with a model (185 fixtures and corpus traces, session 57); one this far off did not capture
# the step (HTA's trimmed trace_compare sample: two launches of a 117.13 ms step recorded,
# replayed in 0.145 ms), and no prediction is taken from it: savings stay the attributed costs.
REPLAY_ERROR_MAX_RATIO = 0.25
# A step waited for its DataLoader batch where its loader calls took this much longer than the
# window's shortest (:func:`loader_paced_steps`)
LOADER_PACED_MIN_NS = 1_000_000
# Compiled code profiled with record_shapes=True: inductor records each Triton launch with its
# arguments' shapes, and most of that cost falls outside the recorded events (the profiler's
# cost by part, call 22: record_shapes added 16.9 ms a step to the compiled ViT against 4.8 ms
# to its eager loop). Part of it is a cause the trace shows: inductor's Python before each
# launch's op, capped in the estimate (causal/transforms.py _compiled_launches_capped); the
# rest it does not. The un-profiled step over the estimate on such traces: 0.69-0.97 over the
# four kept recordings of four third-party loops (vit_amp, Lightning, LoRA, nanoGPT; torch
# 2.11, H200; 0.56-0.82 before the cap, sentence-transformers' and a second ViT's at
# 0.58-0.82 without their traces kept): a range the trace cannot narrow, said with it.
COMPILED_UNPROFILED_RATIO = (0.69, 0.97)
# An engine twice as fast that moves the step by less than this does not bound it; nor does
# any where streams wait for each other over this share of the steps (see step_bound_by)
BOUND_MIN_SPEEDUP = 1.1
CROSS_WAIT_MAX_RATIO = 0.05


# Steps this far apart (max - min over the median) whose spread the loader's waits explain
# (what is left without them at most this share of it) repeat a loader pattern: step_statistic.
# Only workers make such a pattern (each delivers in turn; where they are slower than the step,
# the step waits once a round): a loader in the step's own thread loads every batch alike, so a
# spread among its waits is a one-off (measured: fast neural style with num_workers=0, profiled
# steps 64.7, 63.9 and 87.5 ms, the third's load 23 ms longer; its 40 un-profiled steps
# 38.5-55.0 ms with no such step).
PERIODIC_SPREAD_MIN_RATIO = 0.2
PERIODIC_EXPLAINED_MAX = 0.5

# the transform whose moved waits are reported: host_sync's fix
WAIT_MOVES_OF = "remove_syncs"
WAIT_MOVES_REPORTED = 3


@dataclass(frozen=True)
class WaitMove:
    """Blocking calls that wait longer once a fix removed others: the call, whether it follows
    a host-to-device copy (an input copy's sync), how many such calls, and the waiting added
    per modelled step."""

    call: str
    after_input_copy: bool
    count: int
    added_ns_per_step: int


def wait_moves(
    model: StepModel, before: Replayed, changed: StepModel, after: Replayed
) -> tuple[WaitMove, ...]:
    """The calls still blocking after the change that wait longer than before, grouped by
    name: where the removed waits went (a step waits once for its GPU work, at the first
    blocking call left)."""
    h = changed.host
    still = (pl.col("wait") != WAIT_NONE).alias("_still")
    waited = pl.DataFrame(
        {
            "name": h.get_column("name"),
            "_h2d": (h.get_column("after_copy") == "HtoD").fill_null(False),
            "_before": (before.host_end_ns - before.host_start_ns),
            "_after": (after.host_end_ns - after.host_start_ns),
        }
    ).with_columns(h.select(still).to_series())
    grown = waited.filter(pl.col("_still") & (pl.col("_after") > pl.col("_before") + 1_000))
    if grown.height == 0:
        return ()
    steps = max(1, model.steps.height)
    top = (
        grown.group_by("name", "_h2d")
        .agg(pl.len().alias("n"), (pl.col("_after") - pl.col("_before")).sum().alias("added"))
        .sort(["added", "name"], descending=[True, False])
        .head(WAIT_MOVES_REPORTED)
    )
    return tuple(
        WaitMove(r["name"], r["_h2d"], r["n"], int(r["added"] // steps))
        for r in top.iter_rows(named=True)
    )


@dataclass(frozen=True)
class ReplayResult:
    trace_step_median_ns: float | None
    replayed_step_median_ns: float | None
    replay_error_ratio: float | None
    rounds: int
    converged: bool
    host_nodes: int
    gpu_nodes: int
    blocking_calls: int
    unexplained_gpu_gap_ratio: float | None  # GPU delay no edge explains, share of GPU op time
    # transform -> the un-profiled loop's median step before and after the transform (see
    # :func:`profiler_ns_per_event`)
    what_if: dict[str, WhatIf]
    unprofiled_step_ns: float | None = None  # the model's step without the profiler
    # the same with the profiler's cost per event PROFILER_COST_HIGH_FACTOR times as high: the
    # low end of the range the trace leaves for the un-profiled step (None where nothing was
    # taken out: nsys, or no model)
    unprofiled_step_low_ns: float | None = None
    # where DataLoader workers bound the recorded steps (:func:`loader_interval_ns`): the
    # interval they delivered batches at, the least the un-profiled step can take
    loader_interval_ns: float | None = None
    # how that step is taken over the modelled steps: "median", or "mean" where a loader
    # pattern repeats (step_statistic); every what-if's after-step the same way
    step_statistic: str = "median"
    # engine -> the step's speedup with that engine alone ENGINE_SPEEDUP times faster
    engine_speedups: dict[str, float] = field(default_factory=dict)
    # the engine the step follows (its speedup the largest, at least BOUND_MIN_SPEEDUP): host,
    # kernels or copies; None where no engine moves it (waits, or no model), or where streams
    # wait for each other for over CROSS_WAIT_MAX_RATIO of the steps: the replay keeps those
    # waits as fixed delays, so an engine's speed would not reach the stream waiting for it
    step_bound_by: str | None = None
    cross_stream_wait_ratio: float | None = None  # GPU waits on other streams / modelled steps
    # transforms (and engines) whose replay stopped before settling (causal/graph.py
    # rounds_for: a model too large for a round per blocking call): each round settles one
    # more blocking call of a dependent sequence, so the change has not reached the later ones
    # and the saving is a lower bound; "unprofiled": the step every saving starts from
    unconverged: tuple[str, ...] = ()
    profiler_ns_per_event: int = 0
    # one-time host calls in the modelled steps (first launches, loads, creations) taken at
    # their thread's usual cost in the un-profiled model, and the host time that took out:
    # every prediction is of the warm step (causal/transforms.py warmed)
    warmed_calls: int = 0
    warmed_ns: int = 0
    # transform -> why it could not price this model (data it needs is missing)
    unpriced: dict[str, str] = field(default_factory=dict)
    # tensors a DataLoader batch carries (ModelInputs.batch_tensors): what receiving it from
    # workers costs the step thread, in the loader's what-if (causal/whatif.py receive_ns)
    batch_tensors: float | None = None
    # inductor's Triton launches recorded with their input shapes, per modelled step, and where
    # there are any the un-profiled step over the estimate measured on such traces
    # (COMPILED_UNPROFILED_RATIO): the estimate keeps profiler cost the events do not show
    compiled_launches_per_step: float = 0.0
    compiled_unprofiled_ratio: tuple[float, float] | None = None
    # the profiler's cost per event, over profiler_ns_per_event, of the low end's model:
    # PROFILER_COST_HIGH_FACTOR, or where compiled_unprofiled_ratio is set the factor whose
    # step is its low end (0: no low end)
    profiler_cost_low_factor: float = 0.0
    # the un-profiled step traceinsight.capture measured in the recording's own process just
    # before it recorded (TraceMeta.extra, capture.MEASURED_KEY): reported beside the model's,
    # not fitted to (benchmarks/RESULTS.md, session 47: the profiler's cost per event fitted to
    # land on it changed the first finding on 9 of 30 loops and raised two false alarms); None
    # where the trace does not carry it
    measured_step_ns: int | None = None
    # where host_sync's fix moves the host's waiting (see :func:`wait_moves`)
    wait_moves: tuple[WaitMove, ...] = ()
    # the modelled steps' GPU busy time a step (the profiler's cost moves host work only): the
    # floor of every what-if (:func:`floored`)
    gpu_busy_per_step_ns: float = 0.0
    # the un-profiled model, for analyzers and rules with their own transform (:meth:`predict`)
    model: StepModel | None = field(
        default=None, repr=False, compare=False, metadata={"json": False}
    )
    # the model with the profiler's cost per event PROFILER_COST_HIGH_FACTOR times as high
    model_low: StepModel | None = field(
        default=None, repr=False, compare=False, metadata={"json": False}
    )

    def predict(self, transform: Callable[[StepModel], StepModel | None]) -> WhatIf | None:
        """``transform`` applied to the un-profiled model and replayed, or None where it
        changes nothing (or there is no model)."""
        if self.model is None or self.unprofiled_step_ns is None:
            return None
        changed = transform(self.model)
        if changed is None:
            return None
        after = step_ns(changed, replay(changed), self.step_statistic)
        name, busy = getattr(transform, "name", ""), self.gpu_busy_per_step_ns
        bound = measured_floor_ns(self.unprofiled_step_ns, self.measured_step_ns, busy)
        w = WhatIf.of(
            self.unprofiled_step_ns, floored(name, after, busy, self.model, changed, bound)
        )
        return w.of_transform(transform) if w is not None else None

    def speedup_low(self, w: WhatIf) -> float | None:
        """``w``'s transform replayed from the un-profiled step's low end (per the original
        batch's samples for a larger batch): the speedup where the profiler cost
        PROFILER_COST_HIGH_FACTOR times what the trace shows. None without that model or a transform."""
        low = self.unprofiled_step_low_ns
        if self.model_low is None or low is None or w.transform is None:
            return None
        changed = w.transform(self.model_low)
        if changed is None:
            return None
        after = step_ns(changed, replay(changed), self.step_statistic)
        busy = self.gpu_busy_per_step_ns
        after = floored(w.transform.name, after, busy, self.model_low, changed)
        if after is None or after <= 0:
            return None
        return low / (after / w.multiplier if w.multiplier else after)


# A change that leaves the GPU's work in place (host syncs, copies' calls, the allocator, a
# CUDA graph of the same kernels) cannot make the step shorter than the GPU's busy time a step
# as recorded. The replay holds a wait on another stream as a fixed gap, not as the dependency
# it is: without the floor, DDP's per-gradient all-reduces (serialized with compute by 6,060
# stream waits in HTA's df_index_resolver trace) overlapped compute once the launches' gaps
# went, 177.3 ms predicted against 200.1 ms of GPU busy a step (audit 7), and a TorchRec rank's
# host syncs removed read 60.20 ms against 65.8 ms of GPU work a step (audit 10). A change of
# the GPU's work has no floor from the recording: its own assumptions price that work (a larger
# batch scales every kernel linearly, an upper bound that the replay's overlap of cuDNN's LSTM
# streams offsets: word_lm's 4x batch 3.73x, measured 3.29-3.60x, would read 1.97x floored);
# nor does a change whose point is more overlap between streams.
OVERLAP_TRANSFORMS = ("comm_overlapped", "h2d_overlapped")


def measured_floor_ns(unprofiled: float | None, measured: int | None, busy_ns: float) -> float:
    """Where traceinsight.capture measured the process's step without the profiler faster than
    the model's: the model's step scaled as the GPU's busy time is to the measured step, the
    shortest a change that keeps the GPU's work can make it (0 elsewhere). The process ran at
    ``measured`` and the GPU needs ``busy_ns`` of it: such a change saves at most the rest
    (session 64: a ResNet-50 inference measured 12.64 ms against 12.01 ms of GPU work a step,
    where the model's 18.69 ms host-bound step priced CUDA graphs at 1.53x). Not a fit of the
    profiler's cost to the measured step (session 47): a bound on what the GPU's work allows."""
    if not unprofiled or not measured or measured >= unprofiled or busy_ns <= 0:
        return 0.0
    return unprofiled * min(1.0, busy_ns / measured)


def floored(
    name: str,
    after: float | None,
    busy_ns: float,
    before: StepModel,
    changed: StepModel,
    measured_floor: float = 0.0,
) -> float | None:
    """``after``, the step the what-if ``name`` predicts, no shorter than ``busy_ns`` (the GPU's
    busy time a step in ``before``), nor than ``measured_floor`` (:func:`measured_floor_ns`),
    where ``changed`` keeps the GPU's work (at least as much of it) and no overlap what-if
    (:data:`OVERLAP_TRANSFORMS`) is among the fixes."""
    if after is None or before.gpu.height == 0:
        return after
    if any(part in OVERLAP_TRANSFORMS for part in name.split("+")):
        return after
    work = int(before.gpu.get_column("dur_ns").sum())
    kept = int(changed.gpu.get_column("dur_ns").sum()) if changed.gpu.height else 0
    return max(after, busy_ns, measured_floor) if kept >= work else after


def gpu_busy_per_step_ns(model: StepModel, statistic: str = "median") -> float:
    """The GPU's busy time a modelled step: for each step the union of the ops its host calls
    launched (the busiest device), taken over the steps as the step times are (``statistic``).
    Work launched outside the steps (another process's collective in flight, the window's
    edges) is none of a step's: on a DDP rank it had made the "busy time a step" 72.0 ms where
    the steps took 61.8 ms."""
    g, h = model.gpu, model.host
    if g.height == 0 or h.height == 0:
        return 0.0
    step = h.get_column("step").gather(g.get_column("launch").clip(0, h.height - 1))
    ops = (
        g.select("device", "start_ns", "end_ns", "launch")
        .with_columns(step.alias("_step"))
        .filter((pl.col("launch") >= 0) & (pl.col("_step") >= 0))
    )
    if ops.height == 0:
        return 0.0
    busy = (
        iv.union(ops.select("device", "_step", "start_ns", "end_ns"), by=["device", "_step"])
        .group_by("device", "_step")
        .agg((pl.col("end_ns") - pl.col("start_ns")).sum().alias("ns"))
        .group_by("_step")
        .agg(pl.col("ns").max())
    )
    return statistic_of(busy.get_column("ns"), statistic) or 0.0


def profiler_ns_per_event(ctx: Context) -> int:
    """The profiler's host cost per recorded event on this trace (see :data:`NO_WORK_OPS`)."""
    if ctx.trace_format != "kineto":
        return 0
    lo, hi = ctx.window_start_ns, ctx.window_end_ns
    views = ctx.rows(
        ("cpu_op",), NO_WORK_OPS, where=pl.col("start_ns").is_between(lo, hi), columns=("dur_ns",)
    )
    median = views.get_column("dur_ns").median() if views.height else None
    if median is None:
        return PROFILER_NS_PER_EVENT_DEFAULT
    low, high = PROFILER_NS_PER_EVENT_RANGE
    return int(min(high, max(low, float(median))))


def per_step_sum(step_starts: pl.Series, at: pl.Series, ns: pl.Series, steps: int) -> pl.Series:
    """``ns`` summed over the steps each value's time ``at`` falls in (steps by their starts,
    ``steps`` of them, 0 where none falls), in step order; before the first step: none's."""
    idx = step_starts.sort().search_sorted(at, side="right").cast(pl.Int64) - 1
    return (
        pl.DataFrame({"i": idx, "ns": ns})
        .filter(pl.col("i") >= 0)
        .group_by("i")
        .agg(pl.col("ns").sum())
        .join(pl.DataFrame({"i": range(steps)}, schema={"i": pl.Int64}), on="i", how="right")
        .sort("i")
        .get_column("ns")
        .fill_null(0)
    )


def step_statistic(model: StepModel, d: pl.Series, iterator: str | None = None) -> str:
    """How the prediction's step is taken over the modelled steps: the mean where the steps
    repeat a pattern set by the loader (workers that keep up on some steps only: a long wait
    every few steps, the step times apart by more than :data:`PERIODIC_SPREAD_MIN_RATIO` of
    the median and the loader's waits explaining most of that), since over whole periods the
    mean is the time per step a run takes; else the median, which a one-off step (a
    checkpoint, a collection, a late warm-up) does not move. ``d``: the replayed steps'
    durations; ``iterator``: the DataLoader's (steps.loader_iterator): a single-process one
    makes no period."""
    h = model.host
    if d.len() < 2 or "gap_dataloader_ns" not in h.columns or iterator == "single_process":
        return "median"
    spread = float(d.max() - d.min())
    if spread <= PERIODIC_SPREAD_MIN_RATIO * float(d.median()):
        return "median"
    loader = per_step_sum(
        model.steps.get_column("host_start_ns"),
        h.get_column("start_ns"),
        h.get_column("gap_dataloader_ns"),
        d.len(),
    )
    rest = d.cast(pl.Float64) - loader.cast(pl.Float64)
    return "mean" if float(rest.max() - rest.min()) <= PERIODIC_EXPLAINED_MAX * spread else "median"


def loader_paced_steps(loader: pl.DataFrame, steps: pl.DataFrame) -> int:
    """How many of the modelled ``steps`` (host_start_ns) waited for their batch: their
    DataLoader ranges (``loader``: tid, start_ns, end_ns) took at least
    :data:`LOADER_PACED_MIN_NS` longer than the window's shortest step's (a step that found
    its batch waiting: receiving it, and the profiler's cost of the frames recorded in the
    call, 0.2-0.5 ms on the third-party recordings)."""
    if loader.height == 0 or steps.height == 0:
        return 0
    u = iv.union(loader.select("tid", "start_ns", "end_ns"), by=["tid"])
    per = per_step_sum(
        steps.get_column("host_start_ns"),
        u.get_column("start_ns"),
        u.get_column("end_ns") - u.get_column("start_ns"),
        steps.height,
    )
    return int((per - per.min() >= LOADER_PACED_MIN_NS).sum())


def loader_interval_ns(
    bare: StepModel,
    unprofiled: float | None,
    steps: pl.DataFrame,
    statistic: str,
    iterator: str | None,
    loader: pl.DataFrame,
) -> float | None:
    """Where DataLoader workers bound the recorded steps (the step with their waits beyond
    receiving each batch hidden is at least :data:`LOADER_BOUND_MIN_SPEEDUP` faster), the
    interval they delivered batches at: the recorded steps' ``statistic``. The workers run
    in processes the profiler does not record, so they deliver at that interval without it
    too, and the host time the profiler cost the step thread moves into its wait for the next
    batch: the un-profiled step is no shorter (timm fed by 3 JPEG-decoding workers: recorded
    71-151 ms steps, 98.6 ms a step over the period; un-profiled 53-58 ms steps and a 161-174
    ms one, 96.1 ms a step, where taking the profiler's cost out of every step read 71.4).
    Only where at least half the modelled steps waited for their batch
    (:func:`loader_paced_steps`): a single wait among steps that found their batches waiting
    is a burst of workers in phase, and steps fewer than the workers hold part of its period,
    whose mean is not the interval (torchmetrics' loop with 4 and 8 workers: one wait in 3
    steps, recorded 32.8-49.4 ms a step against 17.7-37.6 measured). None elsewhere: a step
    thread that loads (its loading is on the step's path, slowed by the profiler like the
    rest), or workers that kept up."""
    if iterator != "multi_process" or not unprofiled or steps.height == 0:
        return None
    if 2 * loader_paced_steps(loader, bare.steps) < bare.steps.height:
        return None
    hidden = whatif.dataloader_unpinned(bare)
    if hidden is None:
        return None
    # no faster than the GPU's busy time, as the loader's what-if itself (:func:`floored`)
    busy = gpu_busy_per_step_ns(bare, statistic)
    after = floored(
        "dataloader_unpinned", step_ns(hidden, replay(hidden), statistic), busy, bare, hidden
    )
    if not after or unprofiled / after < LOADER_BOUND_MIN_SPEEDUP:
        return None
    return statistic_of(steps.get_column("dur_ns"), statistic)


def analyze_replay(ctx: Context) -> ReplayResult:
    src = model_inputs(ctx)
    model = build_model(src) if src is not None else None
    st = modelled_steps(ctx.steps)
    trace_median = float(st["dur_ns"].median()) if st.height else None
    measured = measured_step(ctx)
    if src is None or model is None or trace_median is None or trace_median <= 0:
        return ReplayResult(
            trace_median, None, None, 0, True, 0, 0, 0, None, {}, measured_step_ns=measured
        )
    base = replay(model)
    replayed = median_step_ns(model, base)
    error = abs(replayed - trace_median) / trace_median if replayed is not None else None
    if error is None or error > REPLAY_ERROR_MAX_RATIO:
        return ReplayResult(
            trace_median,
            replayed,
            error,
            base.rounds,
            base.converged,
            model.host.height,
            model.gpu.height,
            int((model.host["wait"] != WAIT_NONE).sum()),
            None,
            {},
            measured_step_ns=measured,
        )
    per_event = profiler_ns_per_event(ctx)
    bare = whatif.without_profiler(model, per_event) if per_event else model
    once = first_calls(ctx)
    bare, warmed_calls, warmed_ns = whatif.warmed(bare, once)
    bare_replay = replay(bare) if per_event or warmed_calls else base
    durations = step_times_ns(bare, bare_replay)
    iterator = context_loader_iterator(ctx)
    statistic = step_statistic(bare, durations, iterator)
    unprofiled = statistic_of(steady_step_times_ns(bare, bare_replay), statistic)
    loader = loader_interval_ns(
        bare,
        unprofiled,
        st,
        statistic,
        iterator,
        src.ranges["dataloader"],
    )
    if unprofiled is not None and loader is not None:
        unprofiled = max(unprofiled, loader)
    low, dearer, low_factor = None, None, 0.0
    compiled = _compiled_launches(ctx, st)
    if per_event and unprofiled is not None:

        def at(factor: float) -> tuple[StepModel, float | None]:
            return unprofiled_step_at(model, factor * per_event, once, statistic, loader)

        low_factor = PROFILER_COST_HIGH_FACTOR
        dearer, low = at(low_factor)
        if compiled and low is not None:
            # compiled code recorded with shapes: the low end is the lowest step measured
            # on such recordings, its per-event cost found by doubling, then bisecting
            target = COMPILED_UNPROFILED_RATIO[0] * unprofiled
            low_factor, dearer, low = _factor_for(at, low_factor, dearer, low, target)
    what_if: dict[str, WhatIf] = {}
    engines: dict[str, float] = {}
    # the un-profiled step itself, where its replay stopped before settling: every saving
    # starts from a step the later blocking calls have not reached
    unconverged: list[str] = [] if bare_replay.converged else ["unprofiled"]
    gpu_floor = gpu_busy_per_step_ns(bare, statistic)
    bound = measured_floor_ns(unprofiled, measured, gpu_floor)
    moves: tuple[WaitMove, ...] = ()
    unpriced: dict[str, str] = {}

    def after_of(changed: StepModel, name: str) -> float | None:
        """The changed model's median step; a replay cut short at MAX_ROUNDS is noted."""
        nonlocal moves
        r = replay(changed)
        if not r.converged:
            unconverged.append(name)
        if name == WAIT_MOVES_OF:
            moves = wait_moves(bare, bare_replay, changed, r)
        return floored(name, step_ns(changed, r, statistic), gpu_floor, bare, changed, bound)

    if unprofiled is not None:
        for name, transform in whatif.TRANSFORMS.items():
            changed = transform(bare)  # None: nothing for the transform to change
            if changed is not None and (w := WhatIf.of(unprofiled, after_of(changed, name))):
                what_if[name] = w.of_transform(transform)
            elif changed is None and transform.unpriced and (why := transform.unpriced(bare)):
                unpriced[name] = why
        for engine in whatif.ENGINES:
            changed = whatif.engine_faster(engine)(bare)
            if changed is not None and unprofiled:
                after = after_of(changed, engine)
                engines[engine] = unprofiled / after if after else 1.0
    g = model.gpu
    # the time some stream of a device waited on another's op, each instant once: a sum over
    # ops counts the streams of one graph replay waiting together (the invariant audit s57:
    # 43x the steps on a CUDA-graphed word LM)
    waits = g.filter((pl.col("after_op") >= 0) & (pl.col("gap_ns") > 0)).select(
        "device",
        (pl.col("start_ns") - pl.col("gap_ns")).alias("start_ns"),
        pl.col("start_ns").alias("end_ns"),
    )
    # over the modelled steps' recorded span, the waits' own timeline
    recorded_ns = int(g["end_ns"].max() - model.steps["host_start_ns"].min()) if g.height else 0
    cross = (
        min(1.0, iv.total(iv.union(waits, by=["device"])) / recorded_ns) if recorded_ns else None
    )
    gpu_ns = int(g["dur_ns"].sum()) if g.height else 0
    return ReplayResult(
        trace_step_median_ns=trace_median,
        replayed_step_median_ns=replayed,
        replay_error_ratio=error,
        rounds=base.rounds,
        converged=base.converged,
        host_nodes=model.host.height,
        gpu_nodes=g.height,
        blocking_calls=int((model.host["wait"] != WAIT_NONE).sum()),
        unexplained_gpu_gap_ratio=int(g["gap_ns"].sum()) / gpu_ns if gpu_ns else None,
        what_if=what_if,
        unprofiled_step_ns=unprofiled,
        unprofiled_step_low_ns=low,
        loader_interval_ns=loader,
        step_statistic=statistic,
        profiler_ns_per_event=per_event,
        warmed_calls=warmed_calls,
        warmed_ns=warmed_ns,
        engine_speedups=engines,
        step_bound_by=_bound_by(engines, cross, unconverged),
        cross_stream_wait_ratio=cross,
        unconverged=tuple(unconverged),
        wait_moves=moves,
        gpu_busy_per_step_ns=gpu_floor,
        unpriced=unpriced,
        compiled_launches_per_step=compiled,
        compiled_unprofiled_ratio=COMPILED_UNPROFILED_RATIO if compiled and per_event else None,
        profiler_cost_low_factor=low_factor,
        measured_step_ns=measured,
        model=bare,
        model_low=dearer,
        batch_tensors=src.batch_tensors,
    )


def measured_step(ctx: Context) -> int | None:
    """The un-profiled step (ns) the capture measured before recording, where the trace holds
    it (the parser keeps only a positive integer)."""
    return ctx.source_extra.get("unprofiled_measured_step_ns")


def first_calls(ctx: Context) -> pl.DataFrame:
    """The window's one-time calls the un-profiled step is warmed of (compiles stay: the
    compiled-code range prices them)."""
    return warmup_calls(ctx).filter(pl.col("kind") != "compile")


def unprofiled_steps_at(
    ctx: Context, r: ReplayResult, factors: Sequence[float]
) -> list[float | None]:
    """The un-profiled step (ns) at each of ``factors`` times the trace's no-work op cost per
    event, taken as :func:`analyze_replay` (``r``, its result on ``ctx``) takes it: for studies
    of the profiler's cost (benchmarks/profiler_cost_factor.py). None each where nothing is
    modelled or taken out (no model, nsys)."""
    src = model_inputs(ctx)
    model = build_model(src) if src is not None else None
    per_event = profiler_ns_per_event(ctx)
    if model is None or not per_event:
        return [None] * len(factors)
    once, loader = first_calls(ctx), r.loader_interval_ns
    return [
        unprofiled_step_at(model, f * per_event, once, r.step_statistic, loader)[1] for f in factors
    ]


def unprofiled_step_at(
    model: StepModel,
    ns_per_event: float,
    once: pl.DataFrame,
    statistic: str,
    loader_ns: float | None,
) -> tuple[StepModel, float | None]:
    """The recorded ``model`` with the profiler's cost at ``ns_per_event`` taken out and the
    first calls (``once``, :func:`warmup_calls`) warmed, and its steady step taken by
    ``statistic``, no shorter than the loader's interval (``loader_ns``, where the workers
    bound the steps): the un-profiled step at that cost. :func:`analyze_replay` takes its range
    from it; ``benchmarks/profiler_cost_factor.py`` sweeps the cost with it."""
    m = whatif.warmed(whatif.without_profiler(model, ns_per_event), once)[0]
    step = statistic_of(steady_step_times_ns(m, replay(m)), statistic)
    return m, max(step, loader_ns) if step is not None and loader_ns is not None else step


# the per-event cost factors tried for compiled code's low end: doublings from
# PROFILER_COST_HIGH_FACTOR up to 2 ** LOW_FACTOR_DOUBLINGS times it, then halvings between
LOW_FACTOR_DOUBLINGS = 6
LOW_FACTOR_HALVINGS = 4


def _factor_for(
    at: Callable[[float], tuple[StepModel, float | None]],
    factor: float,
    model: StepModel,
    step: float,
    target: float,
) -> tuple[float, StepModel, float]:
    """The smallest per-event cost factor (from ``factor``, whose model and step are given)
    whose replayed step is at most ``target``, to 1/16 of the last doubling, with its model and
    step; the largest tried where none reaches it (the host's gaps all spent)."""
    if step <= target:
        return factor, model, step
    lo = factor
    for _ in range(LOW_FACTOR_DOUBLINGS):
        m, s = at(2 * factor)
        if s is None:
            break
        factor, model, step = 2 * factor, m, s
        if step <= target:
            break
        lo = factor
    if step > target:
        return factor, model, step
    hi, best = factor, (factor, model, step)
    for _ in range(LOW_FACTOR_HALVINGS):
        mid = (lo + hi) / 2
        m, s = at(mid)
        if s is not None and s <= target:
            hi, best = mid, (mid, m, s)
        else:
            lo = mid
    return best


def _compiled_launches(ctx: Context, steps: pl.DataFrame) -> float:
    """Inductor's Triton launches recorded with their input shapes (record_shapes=True) in the
    modelled steps, per step."""
    if ctx.op_args.height == 0 or steps.height == 0:
        return 0.0
    start = "host_start_ns" if "host_start_ns" in steps.columns else "start_ns"
    end = "host_end_ns" if "host_end_ns" in steps.columns else "end_ns"
    lo, hi = int(steps[start].min()), int(steps[end].max())
    n = ctx.op_args.filter(
        pl.col("start_ns").is_between(lo, hi, closed="left")
        & pl.col("name").str.contains(TRITON_LAUNCH_PATTERN)
        & pl.col("input_dims").str.contains(r"\d")
    ).height
    return n / steps.height


def _bound_by(engines: dict[str, float], cross: float | None, unconverged: list[str]) -> str | None:
    """The engine whose speedup moves the step most (see ReplayResult.step_bound_by)."""
    if not engines or any(e in unconverged for e in engines) or (cross or 0) > CROSS_WAIT_MAX_RATIO:
        return None
    best = max(engines, key=engines.__getitem__)
    return best if engines[best] >= BOUND_MIN_SPEEDUP else None


def model_ranges(ctx: Context) -> pl.DataFrame:
    """What torch.compile(model) captures (tid, start_ns, end_ns): the forward calls of the
    step's model, the outermost ``nn.Module`` frame whose name holds the most time (Python
    stacks; a loss module called beside it is not the model), and every backward op's range.
    Empty without module frames. (A torchmetrics loop: its MetricCollection's update and
    compute, outside the model, stay eager under reduce-overhead.) A second model (a GAN's
    generator beside its discriminator) is left eager too: the saving is then a lower bound."""
    cols = ("tid", "start_ns", "end_ns")
    mods = ctx.rows(("python_function",), MODULE_PATTERN, columns=("name", *cols))
    if mods.height == 0:
        return mods.select(cols)
    top = outermost(mods)
    model = top.filter(pl.col("name") == _most_time(top)).select(cols)
    backward = ctx.rows(HOST_OP_KINDS, BACKWARD_PATTERN, columns=cols).select(cols)
    model = _with_model_caller(ctx, model, backward)
    if _launch_share(ctx, model, backward) < MODEL_FRAMES_MIN_LAUNCH_SHARE:
        return model
    return pl.concat([model, backward])


def _most_time(ranges: pl.DataFrame) -> str:
    """The name whose ranges (name, start_ns, end_ns) hold the most time (ties: the first
    name in order)."""
    return (
        ranges.group_by("name")
        .agg((pl.col("end_ns") - pl.col("start_ns")).sum().alias("_d"))
        .sort("_d", "name", descending=[True, False])
        .item(0, "name")
    )


def _with_model_caller(ctx: Context, model: pl.DataFrame, backward: pl.DataFrame) -> pl.DataFrame:
    """``model`` (tid, start_ns, end_ns) widened to the user's Python function that calls it,
    where that function holds the model's work and not the loop's: none of its calls holds a
    backward op, an optimizer step, a DataLoader's batch or a step boundary. Users compile that
    function (CleanRL's PPO calls its actor and critic, then builds a Categorical, samples,
    scores and takes its entropy, in ``Agent.get_action_and_value``; the module frames alone
    held 6.1 of its 25 ms a step: 1.05x predicted where compiling the function with
    reduce-overhead measured 2.01x on an H200). A loop that calls the model itself, beside its
    loss's backward, keeps the module frames, as does a model called from a library's
    function."""
    cols = ["tid", "start_ns", "end_ns"]
    if ctx.steps.height == 0 or model.height == 0:
        return model
    frames = (
        ctx.rows(("python_function",), columns=("name", *cols))
        .select("name", *cols)
        .sort(cols, descending=[False, False, True])
    )
    frames = frames.with_columns(
        iv.parents(frames, tid="tid", start="start_ns", end="end_ns").alias("_p")
    ).with_row_index("_i")
    called = model.join(frames, on=cols, how="inner").get_column("_p").drop_nulls()
    if called.len() == 0:
        return model
    # the user's own function: a library's (torchdiffeq's Runge-Kutta step calling an ODE's
    # function) is not what the user compiles
    callers = user_frames(frames.filter(pl.col("_i").is_in(called.implode())))
    if callers.height == 0:
        return model
    caller = _most_time(callers)
    # its calls in the window (one cut by the window's edge is the capture's, not the loop's)
    calls = frames.filter(
        (pl.col("name") == caller)
        & (pl.col("start_ns") >= ctx.window_start_ns)
        & (pl.col("end_ns") <= ctx.window_end_ns)
    ).select(cols)
    if calls.height == 0:
        return model
    steps = ctx.steps.select(
        pl.col("host_start_ns").alias("_s"), pl.col("host_end_ns").alias("_e")
    ).sort("_s")
    in_step = calls.sort("start_ns").join_asof(steps, left_on="start_ns", right_on="_s")
    if in_step.filter(pl.col("_e").is_null() | (pl.col("end_ns") > pl.col("_e"))).height:
        return model  # the loop's own frame (it spans steps), or one outside them
    loader = ctx.rows(HOST_OP_KINDS, DATALOADER_PATTERN, columns=cols).select(cols)
    loop_work = pl.concat(
        [backward.select(cols), optimizer_ranges(ctx).select(cols), loader],
        how="vertical_relaxed",
    )
    if loop_work.height and iv.total(iv.intersect(iv.union(calls), iv.union(loop_work))):
        return model
    return pl.concat([calls, model]).unique(maintain_order=True)


# The share of the step's launches outside backward ops that the model's forward frames must
# hold for its backward to be taken as the model's too. A library whose modules run through
# their own __call__ records no nn.Module frame for them (GPyTorch: the frames found were a
# constraint's Softplus, 18 of 4,308 such launches a step); compiling the model then leaves the
# rest of the step's work, and its backward, eager (session 48: model.compile(mode=
# "reduce-overhead") measured 0.98-1.00x where every backward op captured read 1.12x)
MODEL_FRAMES_MIN_LAUNCH_SHARE = 0.25


def _launch_share(ctx: Context, model: pl.DataFrame, backward: pl.DataFrame) -> float:
    """Of the window's GPU ops launched outside ``backward`` ranges (their launch calls, on the
    range's thread), the share launched inside ``model`` ranges (both: tid, start_ns, end_ns);
    1.0 where there are none."""
    keys = ["correlation", "start_ns"]
    k = launched(
        ctx.launches,
        ["launch_start_ns", "launch_tid", *keys],
        pl.col("launch_start_ns").is_between(ctx.window_start_ns, ctx.window_end_ns),
    )
    if k.height == 0:
        return 1.0
    forward = (
        k.join(launched_inside(k, backward).select(keys), on=keys, how="anti")
        if backward.height
        else k
    )
    if forward.height == 0:
        return 1.0
    if model.height == 0:
        return 0.0
    return (
        forward.join(launched_inside(forward, model).select(keys), on=keys, how="semi").height
        / forward.height
    )


def model_inputs(ctx: Context) -> ModelInputs | None:
    """The context's tables the step model is built from (None without steps or GPU work)."""
    if ctx.steps.height == 0 or not ctx.has_gpu:
        return None
    ranges = ctx.rows(HOST_OP_KINDS, DATALOADER_PATTERN)
    return ModelInputs(
        steps=ctx.steps,
        window_start_ns=ctx.window_start_ns,
        window_end_ns=ctx.window_end_ns,
        has_gpu=ctx.has_gpu,
        calls=ctx.rows(API_KINDS),
        launches=ctx.launches,
        ops=ctx.ops,
        python_frames=ctx.rows(("python_function",)),
        ranges={
            "dataloader": ranges,
            "empty_cache": ctx.rows(HOST_OP_KINDS, EMPTY_CACHE_PATTERN),
            "optimizer": optimizer_ranges(ctx),
            "zero_grad": zero_grad_ranges(ctx),
            "recompute": recompute_ranges(ctx),
            "model": model_ranges(ctx),
        },
        # a device the table lacks: its compute capability's lowest ratios (devices.family_of)
        time_ratios={d.id: time_ratios(d) for d in ctx.device_info},
        batch_tensors=batch_tensors(ctx, ranges),
        op_args=ctx.op_args,
        memory_bandwidths={
            d.id: spec.memory_bandwidth_bytes_per_s
            for d in ctx.device_info
            if (spec := spec_of(d)) is not None and spec.memory_bandwidth_bytes_per_s
        },
        host_links=host_links(ctx.device_info, lambda: kernel_names(ctx), ctx.devices),
        cudnn_sdpa_devices=tuple(d.id for d in ctx.device_info if cudnn_sdpa_in_16bit(d)),
    )
