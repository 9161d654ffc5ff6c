"""What every analyzer needs, computed once per trace: window, steps, launches, host categories.

Pure functions over the event table; the :class:`Context` is frozen and shared read-only.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

import polars as pl

from traceinsight.causal.build import without_trailing_stubs
from traceinsight.constants import ABSURD_SPAN_FACTOR, DEFAULT_STEP_PATTERN
from traceinsight.model import intervals as iv
from traceinsight.model.classify import (
    API_KINDS,
    BLOCKING_COPY_API,
    CAPTURE_BEGIN_API,
    CAPTURE_END_API,
    HOST_OP_KINDS,
    SYNC_API,
    names_matching,
)
from traceinsight.model.schema import (
    GPU_ACTIVITY_KINDS,
    DeviceInfo,
    Trace,
    empty_callchains,
    empty_gpu_metrics,
    empty_kernel_args,
    empty_memory,
    empty_op_args,
)

STEP_MARKER = r"^(ProfilerStep#|train_step#)"
CLOSING_SLACK_NS = 1_000  # the profiler's flush may start just before the step range closes
# The first step's first work, queued and started this much later with nothing recorded ahead,
# waited on work before the recording: far above a launch's latency (microseconds; a WDDM
# driver batches launches for up to about a millisecond).
UNRECORDED_WAIT_MIN_NS = 1_000_000
# ... and that wait is at least this share of the step's lead-in before that work ran
UNRECORDED_LEAD_MIN_RATIO = 0.5
# What analyzers read of host rows: a subset of millions of host rows copies every column it
# keeps, into fresh pages (the first rank's copy cost 0.3 s of page faults with all columns).
HOST_COLUMNS = ("kind", "name", "start_ns", "end_ns", "dur_ns", "tid")

T = TypeVar("T")


class HostIndex:
    """Subsets of the host rows by kind and by name pattern, each worked out on first use and
    shared by every analyzer. A memo, not state: two threads racing for one subset compute
    the same table twice, never a different one.

    The host rows of a few base kind sets are kept (:data:`HOST_OP_KINDS`, :data:`API_KINDS`,
    and any set that is not part of one); every other subset is kept as a mask over its base
    (a bit a row) and filtered out for each caller. Rows kept for every kind and pattern were
    186 MB of the 10x trace's analysis (memory of one big trace: benchmarks/RESULTS.md)."""

    def __init__(
        self,
        events: pl.DataFrame,
        seed: dict[tuple[str, ...], pl.DataFrame],
        names: dict[tuple[str, ...], pl.Series] | None = None,
    ) -> None:
        self._events = events
        self._bases = {_kinds_key(k): v for k, v in seed.items()}
        # a base's distinct names (null left out), where the caller has them
        self._names = {_kinds_key(k): v.drop_nulls() for k, v in (names or {}).items()}
        self._masks: dict[tuple[tuple[str, ...], str | None, bool], pl.Series] = {}
        self._name_codes: dict[tuple[str, ...], pl.Series] = {}
        self._derived: dict[str, Any] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._lock = threading.Lock()

    def derived(self, key: str, make: Callable[[], T]) -> T:
        """``make()`` once per trace for every analyzer that asks under ``key``: a thread asking
        while another computes it waits for that result (the idle attribution and the replay
        both read the window's one-time calls: 0.5 s a rank on a 1 GB nsys export)."""
        with self._lock:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:
            if key not in self._derived:
                self._derived[key] = make()
            return self._derived[key]  # type: ignore[no-any-return]

    def rows(
        self,
        kinds: tuple[str, ...],
        pattern: str | None = None,
        *,
        negate: bool = False,
        where: pl.Expr | None = None,
        columns: tuple[str, ...] | None = None,
    ) -> pl.DataFrame:
        """Events of ``kinds`` (whole trace), those whose name matches ``pattern`` (or not, with
        ``negate``); each base's distinct names are matched once per pattern
        (:func:`names_matching`'s rule: null never matches). ``where``: only the rows it
        keeps; ``columns``: only these of :data:`HOST_COLUMNS` (both cut before the copy)."""
        want = _kinds_key(kinds)
        base_kinds, base = self._base(want)
        mask = (
            None
            if pattern is None and want == base_kinds
            else self._mask(base_kinds, base, want, pattern, negate)
        )
        if where is None and columns is None:
            return base if mask is None else base.filter(mask)
        rows = (
            base.lazy()
            if mask is None
            else base.with_columns(mask.alias("_keep")).lazy().filter("_keep")
        )
        if where is not None:
            rows = rows.filter(where)
        return rows.select(columns or HOST_COLUMNS).collect()

    def _base(self, want: tuple[str, ...]) -> tuple[tuple[str, ...], pl.DataFrame]:
        """The smallest kept kind set holding ``want`` and its rows (made on first use)."""
        bases = [*self._bases, *BASE_KINDS, want]  # kinds of no base: a base of their own
        base_kinds = next(k for k in bases if set(want) <= set(k))
        base = self._bases.get(base_kinds)
        if base is None:
            base = self._bases[base_kinds] = host_rows(self._events, base_kinds)
        return base_kinds, base

    def _distinct(self, base_kinds: tuple[str, ...], base: pl.DataFrame) -> pl.Series:
        names = self._names.get(base_kinds)
        if names is None:
            names = self._names[base_kinds] = base.get_column("name").drop_nulls().unique()
        return names

    def name_matches(self, kinds: tuple[str, ...], pattern: str) -> pl.Expr:
        """``pl.col("name").str.contains(pattern)`` for rows of ``kinds`` (null where the name
        is), the regex run once per distinct name of their base instead of once per row (a
        rank of a 1 GB nsys export: 0.9M launch calls, 4.4M NVTX ranges)."""
        base_kinds, base = self._base(_kinds_key(kinds))
        names = self._distinct(base_kinds, base)
        return pl.col("name").is_in(names.filter(names.str.contains(pattern)).implode())

    def _mask(
        self,
        base_kinds: tuple[str, ...],
        base: pl.DataFrame,
        want: tuple[str, ...],
        pattern: str | None,
        negate: bool,
    ) -> pl.Series:
        """Which rows of ``base`` are of the kinds ``want`` and match ``pattern`` (memo)."""
        key = (want, pattern, negate)
        mask = self._masks.get(key)  # several analyzers ask for the same rows
        if mask is None:
            keep = pl.lit(True) if want == base_kinds else pl.col("kind").is_in(list(want))
            if pattern is not None:
                # the names as integer codes, hashed once per base: each pattern's membership
                # test then compares integers, not millions of strings (0.03 s a mask on an
                # nsys rank's 4.4M host ops, thirty-odd masks a rank)
                names = self._distinct(base_kinds, base)
                hits = pl.int_range(names.len(), dtype=pl.UInt32, eager=True).filter(
                    names.str.contains(pattern)
                )
                member = pl.col("_code").is_in(hits.implode())
                keep &= pl.col("_code").is_not_null() & (~member if negate else member)
                frame = base.select("kind", self._codes(base_kinds, base, names))
            else:
                frame = base.select("kind")
            mask = self._masks[key] = frame.select(keep.alias("keep")).to_series()
        return mask

    def _codes(
        self, base_kinds: tuple[str, ...], base: pl.DataFrame, names: pl.Series
    ) -> pl.Series:
        """Each row's name as its index in the base's distinct ``names`` (null for a null
        name), ``_code`` (memo)."""
        codes = self._name_codes.get(base_kinds)
        if codes is None:
            # an enum of the distinct names: its codes are their indexes (half a join's time)
            codes = self._name_codes[base_kinds] = (
                base.get_column("name")
                .cast(pl.Enum(names))
                .to_physical()
                .cast(pl.UInt32)
                .alias("_code")
            )
        return codes


# the kind sets whose rows are kept whole (sorted: see _kinds_key)
BASE_KINDS = (tuple(sorted(HOST_OP_KINDS)), tuple(sorted(API_KINDS)))


def _kinds_key(kinds: tuple[str, ...]) -> tuple[str, ...]:
    """A kind set's memo key: the rows are in table order whatever order the kinds come in."""
    return tuple(sorted(set(kinds)))


@dataclass(frozen=True)
class Context:
    """What every analyzer reads, computed once per trace (all tables read-only)."""

    events: pl.DataFrame
    window_start_ns: int
    window_end_ns: int
    steps: pl.DataFrame  # step, start_ns, end_ns, dur_ns (GPU-aligned), host_start_ns, host_end_ns
    gpu: pl.DataFrame  # GPU activity rows (kernel/memcpy/memset) inside the window
    launches: pl.DataFrame  # GPU activity joined to its launching call (see launch_join)
    devices: tuple[int, ...]
    host: HostIndex = field(repr=False, compare=False)
    ops: pl.DataFrame  # host ops and annotations, step markers excluded (whole trace)
    sync_calls: pl.DataFrame  # blocking sync / blocking copy API calls (whole trace)
    busy: pl.DataFrame  # per-device union of GPU activity in the window (device, start_ns, end_ns)
    compute_busy: pl.DataFrame  # per-device union of the non-communication kernels in the window
    capture_start_ns: int = 0  # the first event's start: --window counts from here
    # the GPUs with activity anywhere in the trace: a window none of them worked in is idle
    # on them all (devices: those active inside the window)
    trace_devices: tuple[int, ...] = ()
    source_format: str = ""  # TraceMeta.format: "kineto" | "nsys-sqlite"
    # TraceMeta.extra: what the parser saw of the file itself (dropped events, row order)
    source_extra: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    # the trace's side tables (whole trace; see model.schema) and its devices' properties
    memory: pl.DataFrame = field(default_factory=empty_memory, repr=False, compare=False)
    # ops with recorded shapes or FLOPs (none: the trace recorded no shapes)
    op_args: pl.DataFrame = field(default_factory=empty_op_args, repr=False, compare=False)
    # record_param_comms ops with their collective's message (op_args' schema)
    comm_messages: pl.DataFrame = field(default_factory=empty_op_args, repr=False, compare=False)
    kernel_args: pl.DataFrame = field(default_factory=empty_kernel_args, repr=False, compare=False)
    callchains: pl.DataFrame = field(default_factory=empty_callchains, repr=False, compare=False)
    gpu_metrics: pl.DataFrame = field(default_factory=empty_gpu_metrics, repr=False, compare=False)
    device_info: tuple[DeviceInfo, ...] = ()
    trace_format: str = ""  # "kineto" | "nsys-sqlite": which profiler recorded it

    @property
    def window_ns(self) -> int:
        return max(0, self.window_end_ns - self.window_start_ns)

    @property
    def has_gpu(self) -> bool:
        return self.gpu.height > 0

    def rows(
        self,
        kinds: tuple[str, ...],
        pattern: str | None = None,
        *,
        negate: bool = False,
        where: pl.Expr | None = None,
        columns: tuple[str, ...] | None = None,
    ) -> pl.DataFrame:
        return self.host.rows(kinds, pattern, negate=negate, where=where, columns=columns)

    def name_matches(self, kinds: tuple[str, ...], pattern: str) -> pl.Expr:
        """:meth:`HostIndex.name_matches`: a name pattern as an expression over those rows."""
        return self.host.name_matches(kinds, pattern)


def kernel_names(ctx: Context) -> pl.Series:
    """The window's distinct kernel names."""
    k = ctx.gpu.filter(pl.col("kind") == "kernel").get_column("name").unique().drop_nulls()
    return k.cast(pl.String)


def _gpu_unions(gpu: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    compute = gpu.filter((pl.col("kind") == "kernel") & (pl.col("kernel_class") != "communication"))
    return iv.union(gpu, by=["device"]), iv.union(compute, by=["device"])


def _host_subsets(host: HostIndex) -> tuple[pl.DataFrame, pl.DataFrame]:
    syncs = host.rows(API_KINDS, f"{SYNC_API}|{BLOCKING_COPY_API}")
    return host.rows(HOST_OP_KINDS, STEP_MARKER, negate=True), outermost(syncs)


def capture_spans(calls: pl.DataFrame, by: list[str]) -> pl.DataFrame:
    """Graph captures in ``calls`` (API calls: name, start_ns, end_ns and the ``by`` columns
    naming a thread): each begin-capture call to the end of its thread's next end-capture call
    (null where none follows), as ``by``, start_ns, end_ns."""
    begins = names_matching(calls, CAPTURE_BEGIN_API).select(*by, "start_ns")
    ends = names_matching(calls, CAPTURE_END_API).select(*by, pl.col("end_ns"))
    return (
        begins.sort("start_ns")
        .join_asof(
            ends.sort("end_ns"),
            left_on="start_ns",
            right_on="end_ns",
            by=by,
            strategy="forward",
            check_sortedness=False,
            coalesce=False,
        )
        .select(*by, "start_ns", "end_ns")
    )


def outermost(calls: pl.DataFrame) -> pl.DataFrame:
    """The calls not inside another of them on the same thread: nsys records some API calls
    twice, nested (``cudaMemcpy`` around ``cudaMemcpy_v3020``), and one wait is one sync."""
    if calls.height < 2:
        return calls
    ordered = calls.with_row_index("_i").sort(
        ["tid", "start_ns", "end_ns"], descending=[False, False, True]
    )
    inside = (pl.col("end_ns") <= pl.col("end_ns").cum_max().shift(1).over("tid")).fill_null(False)
    return ordered.filter(~inside).sort("_i").drop("_i")


def activity_devices(events: pl.DataFrame) -> tuple[int, ...]:
    """The devices with GPU activity (kernels, copies, memsets) in ``events``, in order: what a
    trace's ``source.devices`` lists as active and ``--device`` selects from (the metadata may
    name more, every GPU the process could see)."""
    gpu = events.lazy().filter(pl.col("kind").is_in(GPU_ACTIVITY_KINDS)).select("device")
    return tuple(sorted(int(d) for d in gpu.collect().get_column("device").drop_nulls().unique()))


def launched(
    launches: pl.DataFrame, columns: list[str | pl.Expr], where: pl.Expr | None = None
) -> pl.DataFrame:
    """The rows of ``launches`` with a known launching call (and matching ``where``), in
    ``columns`` only: lazily, so the filter copies just those columns, not all of them."""
    keep = pl.col("launch_start_ns").is_not_null()
    return launches.lazy().filter(keep if where is None else keep & where).select(columns).collect()


def join_beside(
    left: pl.DataFrame, right: pl.DataFrame, on: list[str], *, nulls_equal: bool = False
) -> pl.DataFrame:
    """``left`` joined (left join, its row order) to ``right``, whose ``on`` keys are unique:
    each row's match found by the keys alone and ``right``'s other columns gathered beside
    ``left``'s own, which a join of the whole frames would copy (a wide table of every kernel,
    joined three times, held two copies of itself)."""
    at = (
        left.select(on)
        .join(
            right.select(on).with_row_index("_at"),
            on=on,
            how="left",
            maintain_order="left",
            nulls_equal=nulls_equal,
        )
        .get_column("_at")
    )
    return left.hstack(right.drop(on).select(pl.all().gather(at)))


def host_rows(events: pl.DataFrame, kinds: tuple[str, ...]) -> pl.DataFrame:
    """Events of the host ``kinds``, in the :data:`HOST_COLUMNS`."""
    return events.select(HOST_COLUMNS).filter(pl.col("kind").is_in(list(kinds)))


def find_steps(
    host: pl.DataFrame, pattern: str = DEFAULT_STEP_PATTERN, names: pl.Series | None = None
) -> pl.DataFrame:
    """Step ranges: every host op or annotation in ``host`` whose name ``pattern`` matches, in
    time order. A loop that names each iteration alike (NVTX ``train_step``, ``ncclGroupStart``)
    has one step per occurrence, so names never merge; steps keep the names' trailing numbers
    (ProfilerStep#N) where each has a distinct one, else they are numbered 0.. in time order.
    ``names``: ``host``'s distinct names, where the caller has them."""
    steps = (
        names_matching(host, pattern, names=names)
        .sort("start_ns", "end_ns")
        .select(
            pl.col("name"),
            pl.col("name").str.extract(r"(\d+)$").cast(pl.Int64, strict=False).alias("step"),
            "start_ns",
            "end_ns",
            "tid",
        )
    )
    numbers = steps.get_column("step")
    if numbers.null_count() or numbers.n_unique() < steps.height:
        steps = steps.with_columns(pl.int_range(pl.len(), dtype=pl.Int64).alias("step"))
    return steps


# The last step's stretch with nothing recorded, beyond what the steps before it end with, is
# the capture's, not the loop's, from this share of their median step: the profiler stopping
# (a 2021 Kineto ResNet-50 sample: the last step 206.5 ms, 85 ms of it empty before the
# profiler's closing sync, against 118-127 ms steps ending 0.01 ms after their last event)
UNTRACED_TAIL_MIN_RATIO = 0.1
TAIL_STEPS = 4  # the steps before the last whose ends say how a step ends


def without_untraced_tail(steps: pl.DataFrame, ev: pl.DataFrame) -> pl.DataFrame:
    """``steps`` (host ranges, in time order) with the last one ending where its recorded
    events do (plus the typical empty end of the :data:`TAIL_STEPS` before it), where its
    empty end is longer than theirs by :data:`UNTRACED_TAIL_MIN_RATIO` of their median step.
    Events are any but the step markers (``steps``' names), their GPU mirrors and the
    profiler's own."""
    if steps.height < 3:
        return steps
    last = steps.tail(TAIL_STEPS + 1).select(
        pl.int_range(pl.len()).alias("_i"),
        pl.col("start_ns").alias("_s"),
        pl.col("end_ns").alias("_e"),
    )
    lo = int(last.get_column("_s").min())
    inner = (
        ev.lazy()
        .filter(
            (pl.col("start_ns") >= lo)
            & ~pl.col("kind").is_in(("gpu_annotation", "overhead"))
            # the step markers themselves (a lookup of their names, no regex over every event)
            & ~pl.col("name").is_in(steps.get_column("name").unique().implode())
        )
        .select("start_ns", "end_ns")
        .sort("start_ns")
        .collect()
        .join_asof(last, left_on="start_ns", right_on="_s")
        .filter(pl.col("start_ns") < pl.col("_e"))
        .group_by("_i")
        .agg(pl.col("end_ns").max().alias("_last"))
    )
    ends = last.join(inner, on="_i", how="left").sort("_i")
    tail = (pl.col("_e") - pl.col("_last").clip(upper_bound=pl.col("_e"))).clip(lower_bound=0)
    ends = ends.with_columns(tail.alias("_tail"), (pl.col("_e") - pl.col("_s")).alias("_dur"))
    before, final = ends.head(ends.height - 1), ends.tail(1).row(0, named=True)
    typical = before.get_column("_tail").median()
    step_ns = before.get_column("_dur").median()
    if final["_last"] is None or typical is None or step_ns is None:
        return steps
    if final["_tail"] - typical < UNTRACED_TAIL_MIN_RATIO * step_ns:
        return steps
    end = int(final["_last"] + typical)
    return steps.with_columns(
        pl.when(pl.int_range(pl.len()) == steps.height - 1)
        .then(pl.lit(end))
        .otherwise(pl.col("end_ns"))
        .alias("end_ns")
    )


def pair_key(frames: list[pl.DataFrame], small: str, big: str) -> pl.Expr | None:
    """One int64 standing for the pair (``small``, ``big``) across ``frames``, where the values
    allow it (``small`` a few bits, ``big`` within 2**42 of its minimum: rank+correlation,
    device+timestamp); None otherwise. Hashing it is twice as fast as hashing two columns."""
    both = pl.concat([f.select(small, big) for f in frames], how="vertical_relaxed")
    bounds = both.select(
        pl.col(small).min().alias("s_lo"),
        pl.col(small).max().alias("s_hi"),
        pl.col(big).min().alias("b_lo"),
        pl.col(big).max().alias("b_hi"),
    ).row(0)
    s_lo, s_hi, b_lo, b_hi = bounds
    if None in bounds or s_lo < 0 or s_hi >= 1 << 20 or b_hi - b_lo >= 1 << 42:
        return None
    return pl.col(small).cast(pl.Int64) * (1 << 42) + (pl.col(big) - b_lo)


def _sorted_lookup(keys: pl.Series, wanted: pl.Series) -> pl.Series:
    """The row of the first of ``keys`` (sorted, no nulls, at least one) equal to each of
    ``wanted`` (no nulls), null where none is: a binary search, no hashing."""
    first = keys.search_sorted(wanted, side="left")
    found = keys.gather(first.clip(0, keys.len() - 1)) == wanted
    return first.to_frame("at").select(pl.when(found).then("at")).to_series()


def launch_join(events: pl.DataFrame, gpu_all: pl.DataFrame | None = None) -> pl.DataFrame:
    """Each GPU activity with its launching runtime/driver call (correlation within pid/rank).

    Graph launches map many kernels to one call; that is kept (a many-to-one join).
    ``gpu_all``: the GPU activity rows of ``events``, where the caller has them: the result
    then holds their columns themselves rather than copies (0.1 GB of the 2 GB trace).
    """
    if gpu_all is None:
        gpu_all = events.filter(pl.col("kind").is_in(GPU_ACTIVITY_KINDS))
    gpu = gpu_all
    if gpu.get_column("correlation").null_count():
        gpu = gpu.filter(pl.col("correlation").is_not_null())
    calls = events.select(
        "kind",
        "rank",
        "correlation",
        pl.col("name").alias("launch_name"),
        pl.col("start_ns").alias("launch_start_ns"),
        pl.col("end_ns").alias("launch_end_ns"),
        pl.col("tid").alias("launch_tid"),
        pl.col("pid").alias("launch_pid"),
        pl.col("external_id").alias("launch_external_id"),
    )
    calls = calls.filter(
        pl.col("kind").is_in(API_KINDS) & pl.col("correlation").is_not_null()
    ).drop("kind")
    # The first call per (rank, correlation); unique pairs (the usual case, checked by a cheap
    # count) need no filtering.
    key = pair_key([gpu, calls], "rank", "correlation")
    if key is None:
        calls = calls.filter(
            pl.col("correlation").is_first_distinct().over("rank")
        )  # 4x cheaper than unique()
        return gpu.join(calls, on=["rank", "correlation"], how="left", maintain_order="left")
    calls = calls.with_columns(key.alias("_pair")).drop("rank", "correlation")
    wanted = gpu.select(key.alias("_pair")).to_series()
    pairs = calls.get_column("_pair")
    if calls.height and pairs.null_count() == 0 == wanted.null_count() and pairs.is_sorted():
        # calls in start order whose ids rise with it (CUPTI numbers calls as they are made):
        # each activity's call by binary search, the first of equal keys being the first
        # call (a rank of the 1 GB export: 0.05 s, where the hash join of its 1.2M GPU rows to
        # 1.7M calls took 0.15 s)
        return gpu.hstack(
            calls.drop("_pair").select(pl.all().gather(_sorted_lookup(pairs, wanted)))
        )
    if pairs.n_unique() < calls.height:
        calls = calls.filter(pl.col("_pair").is_first_distinct())
    # the join on the key alone gives each row its call's row (pairs are unique among the
    # calls: one match at most); the calls' columns are gathered by it beside the GPU rows'
    # own columns, which a join of the whole frames would copy
    at = (
        gpu.select(key.alias("_pair"))
        .join(
            calls.select("_pair").with_row_index("_call"),
            on="_pair",
            how="left",
            maintain_order="left",
        )
        .get_column("_call")
    )
    return gpu.hstack(calls.drop("_pair").select(pl.all().gather(at)))


Span = tuple[int | None, int | None]


def build_context(
    trace: Trace,
    step_pattern: str = DEFAULT_STEP_PATTERN,
    threads: int = 1,
    *,
    steps_sel: Span | None = None,
    window_sel: Span | None = None,
) -> Context:
    """The window, the steps and the shared tables; with two threads the GPU unions and the
    host subsets are computed side by side (polars releases the GIL).

    ``steps_sel``: only the steps numbered A..B (inclusive, None open); ``window_sel``: only
    [START, END) ns from the capture start, and the steps lying wholly inside it. ValueError
    when the selection holds nothing."""
    ev = trace.events
    host_ops = host_rows(ev, HOST_OP_KINDS)
    gpu_all = ev.filter(pl.col("kind").is_in(GPU_ACTIVITY_KINDS))
    # the host ops' distinct names once, for the steps and every analyzer's patterns (hashing
    # millions of emit_nvtx range names costs 0.15 s a time)
    host_names = host_ops.get_column("name").unique()
    steps = find_steps(host_ops, step_pattern, host_names)
    if steps.height and ev.height:
        # an overflowed step duration (HTA's Triton example: a 13.34 s ProfilerStep around
        # events that fit in 1.8 ms, flagged duration_invalid) is no step
        first, last = ev.select(
            pl.col("start_ns").min().alias("first"), pl.col("start_ns").max().alias("last")
        ).row(0)
        long = pl.col("end_ns") - pl.col("start_ns")
        steps = steps.filter(long <= ABSURD_SPAN_FACTOR * max(1, last - first))
    launches = launch_join(ev, gpu_all)
    capture_lo = int(ev["start_ns"].min()) if ev.height else 0
    if steps.height:
        steps = without_untraced_tail(steps, ev)
        # aligned over all steps first: a step's GPU end depends on its neighbours
        steps = _device_aligned_steps(steps, launches)
        # a step the alignment left no time (its start moved to its end: HTA's trace_compare
        # sample, whose first step's work the trimmed trace does not tie to its launches) holds
        # nothing: counted, it halved a median of two and met small_batch's two steps (audit s57)
        steps = steps.filter(pl.col("end_ns") > pl.col("start_ns"))
        # the profiler's trailing marker is no step (audit 7: a 0.049 ms ProfilerStep with no
        # GPU work halved an MI250 trace's median of two, 9.29 ms -> 4.67 ms)
        steps = without_trailing_stubs(steps)
        steps = _select_steps(steps, steps_sel, window_sel, capture_lo)
    if steps.height:
        lo = int(steps["start_ns"].min())
        hi = int(steps["end_ns"].max())
    elif gpu_all.height:
        lo = int(gpu_all["start_ns"].min())
        hi = int(gpu_all["end_ns"].max())
    elif ev.height:
        lo = int(ev["start_ns"].min())
        hi = int(ev["end_ns"].max())
    else:
        lo = hi = 0
    if window_sel is not None:
        lo = max(lo, capture_lo + (window_sel[0] or 0))
        hi = hi if window_sel[1] is None else min(hi, capture_lo + window_sel[1])
        if hi <= lo:
            raise ValueError("the --window holds none of the trace's activity")
    steps = steps.with_columns((pl.col("end_ns") - pl.col("start_ns")).alias("dur_ns"))
    # zero-length kernels kept: a whole-microsecond trace's shortest, real launches (audit s63:
    # 639 of 8,868 left out of the counts); zero-length copies not (a rate divides by length)
    kernels = pl.col("kind") == "kernel"
    gpu = iv.clip(gpu_all, lo, hi, keep_points=kernels) if gpu_all.height else gpu_all
    devices = activity_devices(gpu)
    host = HostIndex(ev, {HOST_OP_KINDS: host_ops}, {HOST_OP_KINDS: host_names})
    if threads > 1:
        with ThreadPoolExecutor(max_workers=2) as pool:
            unions = pool.submit(_gpu_unions, gpu)
            ops, sync_calls = _host_subsets(host)
            busy, compute_busy = unions.result()
    else:
        busy, compute_busy = _gpu_unions(gpu)
        ops, sync_calls = _host_subsets(host)
    # record_param_comms' messages ride in op_args; the analyzers read op_args as the ops with
    # shapes (none recorded: no shape-priced fix), so the messages go apart
    message = pl.col("msg_nelems").is_not_null()
    plain = pl.col("input_dims").is_not_null() | pl.col("flops").is_not_null()
    has_messages = trace.op_args.height > 0 and bool(trace.op_args.select(message.any()).item())
    shaped = trace.op_args.filter(plain) if has_messages else trace.op_args
    messages = trace.op_args.filter(message) if has_messages else trace.op_args.clear()
    return Context(
        events=ev,
        window_start_ns=lo,
        window_end_ns=hi,
        steps=steps,
        gpu=gpu,
        launches=launches,
        devices=devices,
        host=host,
        ops=ops,
        sync_calls=sync_calls,
        busy=busy,
        compute_busy=compute_busy,
        capture_start_ns=capture_lo,
        trace_devices=activity_devices(gpu_all),
        memory=trace.memory,
        op_args=shaped,
        comm_messages=messages,
        kernel_args=trace.kernel_args,
        callchains=trace.callchains,
        gpu_metrics=trace.gpu_metrics,
        source_format=trace.meta.format,
        source_extra=trace.meta.extra,
        device_info=tuple(trace.meta.devices),
        trace_format=trace.meta.format,
    )


def _select_steps(
    steps: pl.DataFrame, steps_sel: Span | None, window_sel: Span | None, capture_lo: int
) -> pl.DataFrame:
    """The steps a --steps / --window selection keeps; ValueError names what there is."""
    keep = pl.lit(True)
    if steps_sel is not None:
        a, b = steps_sel
        if a is not None:
            keep &= pl.col("step") >= a
        if b is not None:
            keep &= pl.col("step") <= b
    if window_sel is not None:
        a, b = window_sel
        keep &= pl.col("start_ns") >= capture_lo + (a or 0)
        if b is not None:
            keep &= pl.col("end_ns") <= capture_lo + b
    out = steps.filter(keep)
    if steps_sel is not None and out.height == 0:
        nums = steps.get_column("step")
        raise ValueError(
            f"no steps in the selection; the trace has steps {nums.min()}..{nums.max()}"
        )
    return out


def _device_aligned_steps(steps: pl.DataFrame, launches: pl.DataFrame) -> pl.DataFrame:
    """Stretch each step to the GPU work launched inside it (TensorBoard plugin convention);
    ``launches``: the GPU activities launched inside it.

    end_i = max(host end_i, end of GPU work launched during host step i);
    start_i = max(host start_i, end_{i-1}). The GPU runs behind the host, so host ranges alone
    would cut every step's work in two and dump the backlog into the last step.
    """
    host = (
        steps.sort("start_ns")
        .with_row_index("_i")
        .with_columns(
            pl.col("start_ns").alias("host_start_ns"), pl.col("end_ns").alias("host_end_ns")
        )
    )
    work = launched(
        launches,
        [
            "launch_start_ns",
            "launch_end_ns",
            "start_ns",
            "end_ns",
            "device",
            "stream",
            (pl.col("kind") == "memcpy").alias("memcpy"),
        ],
    ).sort("launch_start_ns")
    if work.height:
        tagged = work.join_asof(
            host.select("_i", pl.col("start_ns").alias("h_s"), pl.col("end_ns").alias("h_e")),
            left_on="launch_start_ns",
            right_on="h_s",
            strategy="backward",
        ).filter(pl.col("launch_start_ns") < pl.col("h_e"))
        firsts = _first_waits(tagged)
        gpu_end = tagged.group_by("_i").agg(
            pl.col("end_ns").max().alias("_gpu_end"),
            pl.col("start_ns").min().alias("_gpu_start"),
            pl.len().cast(pl.Int64).alias("launches"),
        )
        host = host.join(gpu_end, on="_i", how="left").with_columns(pl.col("launches").fill_null(0))
    else:
        firsts = None
        host = host.with_columns(
            pl.lit(None, pl.Int64).alias("_gpu_end"),
            pl.lit(None, pl.Int64).alias("_gpu_start"),
            pl.lit(0, pl.Int64).alias("launches"),
        )
    host = host.with_columns(pl.max_horizontal("end_ns", "_gpu_end").alias("end_ns"))
    # Enforce monotone ends, then starts no earlier than the previous end.
    host = host.with_columns(pl.col("end_ns").cum_max())
    host = host.with_columns(
        pl.max_horizontal("start_ns", pl.col("end_ns").shift(1)).alias("start_ns")
    )
    # Work queued before the first recorded step (warm-up backlog) still runs when it begins:
    # the first step starts once that backlog drains, or it would absorb the previous steps.
    first_start = int(host["start_ns"][0])
    backlog = launches.filter(
        (pl.col("launch_start_ns").is_null() | (pl.col("launch_start_ns") < first_start))
        & (pl.col("end_ns") > first_start)
    )
    first_end = int(host["end_ns"][0])
    start = first_start
    if backlog.height:
        start = min(int(backlog["end_ns"].max()), first_end)
    # No earlier recorded step's kernels overlap the first step's host work. Where the GPU runs
    # on into each next host step (by the later steps' median lag), the first step aligned to
    # its GPU end also holds the host time every later step overlaps with the previous step's
    # kernels (the pipeline filling): an outlier of the capture, not of the loop. The first
    # starts that lag after its host start, and lasts at least its own GPU work's span.
    lag = (
        (pl.col("end_ns").shift(1) - pl.col("host_start_ns")).clip(lower_bound=0).slice(1).median()
    )
    typical = host.select(lag).item() if host.height > 1 else None
    g0 = host["_gpu_start"][0]
    if typical and g0 is not None:
        start = max(start, min(first_start + int(typical), int(g0)))
    if firsts is not None and not backlog.height:
        start = max(start, min(_unrecorded_until(firsts, first_start, launches), first_end))
    if start != first_start:
        host = host.with_columns(
            pl.when(pl.int_range(pl.len()) == 0)
            .then(pl.lit(start))
            .otherwise(pl.col("start_ns"))
            .alias("start_ns")
        )
    return host.drop("_i", "_gpu_end", "_gpu_start")


def _first_waits(tagged: pl.DataFrame) -> pl.DataFrame:
    """Per host step (``_i``), its first-started work launched inside it: when that started,
    how long after it was queued (``waited_ns``: its launch returned, or a host-synchronous
    copy's call had staged its bytes, about the copy's own time) and whether its launch call
    was as slow as a module load (``slow_call``)."""
    first = (
        tagged.sort("_i", "start_ns", "launch_start_ns").group_by("_i", maintain_order=True).first()
    )
    end = pl.col("launch_end_ns")
    # the call outlasted its copy's start: it waited for its copy
    synchronous = pl.col("memcpy") & (end > pl.col("start_ns"))
    queued = (
        pl.when(synchronous)
        .then(pl.col("launch_start_ns") + pl.col("end_ns") - pl.col("start_ns"))
        .otherwise(end)
    )
    # a launch that returned before its work ran, as slow as a lazy module load
    slow = ~synchronous & ((end - pl.col("launch_start_ns")) >= UNRECORDED_WAIT_MIN_NS)
    return first.select(
        "_i",
        "start_ns",
        "device",
        "stream",
        (pl.col("start_ns") - queued).alias("waited_ns"),
        slow.alias("slow_call"),
    )


def _unrecorded_until(firsts: pl.DataFrame, first_start: int, launches: pl.DataFrame) -> int:
    """When the stream was free for the first step's first work, where nothing recorded was
    ahead of it: queued but started later than a launch's latency, it waited on work the
    recording began too late to show (audit 16: a V100 ResNet's first upload called 8.6 ms
    into the step, run at 45.0 ms; the later steps' copies wait 0.1 ms). Where that wait is most
    of the step's lead-in, the later steps' first work starts promptly (a wait every step is the
    device's, such as another tenant's) and the launch was no slow first one (a lazily loaded
    module: a cold start, idle.py's warmup), it is the previous step's, not this one's idle: the
    step starts when its first work ran, as the pipeline-fill rule starts it (the host's shorter
    lead-in goes with it; the GPU's state under the wait is unknown). ``first_start`` otherwise."""
    row = firsts.filter(pl.col("_i") == 0)
    if row.height == 0:  # no work launched inside the first step
        return first_start
    r = row.row(0, named=True)
    waited, start = r["waited_ns"], r["start_ns"]
    if waited is None or r["slow_call"] or waited <= UNRECORDED_WAIT_MIN_NS:
        return first_start
    # most of the lead-in: a host's own long lead-in stays the step's (HTA's backward-thread
    # sample: 331 ms of host work, then its kernel queued 64 ms; a 2021 ResNet's first step:
    # 46 ms in its loader, then a 5.5 ms wait)
    if waited < UNRECORDED_LEAD_MIN_RATIO * (start - first_start):
        return first_start
    later = firsts.filter(pl.col("_i") > 0)
    if later.height and (later.get_column("waited_ns").median() or 0) > UNRECORDED_WAIT_MIN_NS:
        # a later step's wait on its stream's recorded work (the previous step's kernels, the
        # GPU behind the host) is no wait on unrecorded work (audit 18: the same V100 worker's
        # next span, its later uploads queued 6-10 ms behind the previous step's kernels)
        net = _net_of_recorded(later, launches).drop_nulls()
        if not net.len() or (net.median() or 0) > UNRECORDED_WAIT_MIN_NS:
            return first_start
    return int(start)


def _net_of_recorded(firsts: pl.DataFrame, launches: pl.DataFrame) -> pl.Series:
    """Each of ``firsts``' waits (start_ns, waited_ns on device and stream) less the part its
    stream spent on recorded work queued ahead of it: what it waited for that the trace does
    not show."""
    keys = ["device", "stream"]
    ahead = (
        launches.lazy()
        .select(*keys, "start_ns", "end_ns")
        .drop_nulls()
        .sort("start_ns")
        .with_columns(pl.col("end_ns").cum_max().over(keys).alias("_busy"))
        .select(*keys, "start_ns", "_busy")
        .collect()
    )
    rows = firsts.drop_nulls(["device", "stream", "waited_ns"]).sort("start_ns")
    got = rows.join_asof(  # both sorted by start_ns
        ahead,
        on="start_ns",
        by=keys,
        strategy="backward",
        allow_exact_matches=False,
        check_sortedness=False,
    )
    queued = pl.col("start_ns") - pl.col("waited_ns")
    return got.select(
        (pl.col("start_ns") - pl.max_horizontal(queued, pl.col("_busy").fill_null(queued)))
        .clip(lower_bound=0)
        .alias("net")
    ).to_series()


def host_ranges(
    ctx: Context,
    pattern: str | None,
    kinds: tuple[str, ...] = HOST_OP_KINDS,
    tids: pl.Series | None = None,
) -> pl.DataFrame:
    """Union of host ranges whose name matches ``pattern`` (regex; None: any), on ``tids``
    only where given, clipped to the window."""
    where = None if tids is None else pl.col("tid").is_in(tids.implode())
    rows = ctx.rows(kinds, pattern, where=where, columns=("start_ns", "end_ns"))
    return (
        iv.clip(iv.union(rows), ctx.window_start_ns, ctx.window_end_ns) if rows.height else _empty()
    )


def _empty() -> pl.DataFrame:
    return pl.DataFrame(schema={"start_ns": pl.Int64, "end_ns": pl.Int64})


# cudnn.benchmark's algorithm search times each candidate with CUDA events inside the
# convolution op the first time a shape is seen: event syncs there are its one-time tuning,
# not the loop's syncs (audit 24: a 2021 ResNet-50's 357 cudaEventSynchronize calls in its
# first iteration's cudnn_convolution ops read as 131 ms of host_sync, "remove .item()")
AUTOTUNE_SYNC_API = r"^(cuda|hip)EventSynchronize"
CUDNN_CONV_OPS = r"cudnn_convolution|CudnnConvolution|miopen_convolution|MiopenConvolution"


def autotune_syncs(ctx: Context) -> pl.DataFrame:
    """Event syncs inside cuDNN/MIOpen convolution ops on their thread (name, start_ns,
    end_ns, dur_ns, tid): cudnn.benchmark timing its candidate algorithms. Worked out once per
    trace (the syncs, the sources and the one-time calls each leave them out)."""
    return ctx.host.derived("autotune_syncs", lambda: _autotune_syncs(ctx))


def _autotune_syncs(ctx: Context) -> pl.DataFrame:
    cols = ["name", "start_ns", "end_ns", "dur_ns", "tid"]
    syncs = ctx.rows(API_KINDS, AUTOTUNE_SYNC_API, columns=tuple(cols))
    if syncs.height == 0:
        return syncs.select(cols)
    convs = ctx.rows(HOST_OP_KINDS, CUDNN_CONV_OPS, columns=("start_ns", "end_ns", "tid"))
    if convs.height == 0:
        return syncs.head(0).select(cols)
    return calls_inside(syncs, convs).select(cols).unique(["tid", "start_ns"])


def calls_inside(calls: pl.DataFrame, ranges: pl.DataFrame) -> pl.DataFrame:
    """Pairs of a call (``calls``: start_ns, end_ns, tid, ...) and a range on its thread that
    holds it (``ranges``: start_ns, end_ns, tid, ...), the range's span and thread as c_s, c_e,
    c_tid (its other columns as they are)."""
    return iv.containing(
        calls,
        ranges.select(
            pl.col("start_ns").alias("c_s"),
            pl.col("end_ns").alias("c_e"),
            pl.col("tid").alias("c_tid"),
            pl.exclude("start_ns", "end_ns", "tid"),
        ),
        inner_start="start_ns",
        inner_end="end_ns",
        outer_start="c_s",
        outer_end="c_e",
        same=("c_tid", "tid"),
    )


def closing_profiler_sync(ctx: Context) -> pl.Expr | None:
    """The profiler's own ``cudaDeviceSynchronize`` when the window closes (its flush): it
    starts once the host has left the last step, and outlasts the last step's host end. The
    host position, not the GPU-aligned step: when the GPU lags the host by more than a step,
    the last GPU-aligned step starts after the flush began. Not the user's; None when there
    are no steps."""
    if ctx.steps.height == 0:
        return None
    last_host_end = int(ctx.steps["host_end_ns"].max())
    return pl.col("name").str.contains("DeviceSynchronize") & (
        pl.col("start_ns") >= last_host_end - CLOSING_SLACK_NS
    )


def shaped_ops(ctx: Context, lo: int, hi: int) -> pl.DataFrame:
    """The torch ops (``aten::``) that started in [lo, hi) with a tensor's shape among their
    recorded inputs (scalars and None record as ``[]``): tid, start_ns, dur_ns, name,
    input_dims, in time order (empty without recorded shapes)."""
    return (
        ctx.op_args.lazy()
        .filter(
            pl.col("start_ns").is_between(lo, hi, closed="left")
            & pl.col("name").str.starts_with("aten::")
            & pl.col("input_dims").str.contains(r"\d")
        )
        .select("tid", "start_ns", "dur_ns", "name", "input_dims")
        .sort("start_ns")
        .collect()
    )
