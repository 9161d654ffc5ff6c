"""PyTorch profiler (Kineto) Chrome traces, every era from the 2020 bare array to today.

:mod:`.stream` decodes well-formed traces fast (spool, cutter, helper threads or processes; the
native scanner or the typed decode in :mod:`.decode`); :mod:`.repair` is the whole-document
reference path and salvages damaged files.
This module turns either's columns into the event table and the metadata. Everything after the
decode is vectorized. Format history: ../shared/KINETO_FORMAT.md.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import polars as pl

from traceinsight.constants import DROPPED_EVENTS_PATTERN
from traceinsight.errors import InputError
from traceinsight.model.classify import add_kernel_class, mark_comm_by_launcher
from traceinsight.model.schema import (
    COLUMNS,
    KERNEL_ARGS_SCHEMA,
    MEMORY_SCHEMA,
    OP_ARGS_SCHEMA,
    CopyKindT,
    DeviceInfo,
    KindT,
    MemoryKindT,
    Trace,
    TraceMeta,
    conform_side,
    conform_taking,
    empty_events,
)
from traceinsight.parsers.kineto import decode as typed
from traceinsight.parsers.kineto import repair, stream
from traceinsight.report.format import plural

# Category (any era, lower-cased) -> event kind. Unknown categories are dropped.
CATEGORY_KIND: dict[str, str] = {
    "kernel": "kernel",
    "gpu_memcpy": "memcpy",
    "memcpy": "memcpy",
    "gpu_memset": "memset",
    "memset": "memset",
    "cuda_sync": "gpu_sync",
    "gpu_user_annotation": "gpu_annotation",
    "cuda_runtime": "runtime",
    "runtime": "runtime",
    "cuda_driver": "driver",
    "cpu_op": "cpu_op",
    "operator": "cpu_op",
    "user_annotation": "user_annotation",
    "python_function": "python_function",
    "overhead": "overhead",
    "os_call": "os_call",  # an nsys export's OS calls, as traceinsight's annotated trace writes them
    # other accelerators (MTIA, XPU, PrivateUse1) keep the same shape
    "mtia_ccp_events": "kernel",
    "mtia_runtime": "runtime",
    "xpu_runtime": "runtime",
    "xpu_driver": "driver",
    "privateuse1_runtime": "runtime",
    "privateuse1_driver": "driver",
}
GPU_SIDE = ("kernel", "memcpy", "memset", "gpu_sync", "gpu_annotation")
# Top-level keys only the profiler writes (KINETO_FORMAT.md 1.1): a document with any of them is
# a profiler trace even when it holds no event of a known category (an empty capture).
PROFILER_TOP_KEYS = frozenset(
    {"schemaVersion", "deviceProperties", "baseTimeNanoseconds", "distributedInfo", "traceName"}
)
# Categories Kineto writes that no analyzer reads: with a profiler key, a document holding them
# is a profiler trace, empty for this tool (every capture holds its own "Trace" span, an empty
# one nothing else; other devices' and plugins' events).
KINETO_OWN_CATEGORIES = frozenset(
    {
        "Trace",
        "cuda_profiler_range",
        "cuda_event",
        "collective_comm",
        "glow_runtime",
        "mtia_insight",
        "hpu_op",
        "xpu_sync",
        "xpu_scope_profiler",
    }
)
KINETO_OWN_PREFIXES = ("gcu_",)

_MEM_KIND = {
    "pageable": "pageable",
    "pinned": "pinned",
    "device": "device",
    "managed": "managed",
    "array": "array",
    "host": "host",  # ROCm: no pinned/pageable distinction
    "device static": "device",
    "managed static": "managed",
}
# "Unified": a unified-memory migration, as nsys names them (CUPTI's memcpy activity that Kineto
# records has no such kind, but a converted trace may carry the name)
_COPY_KIND = {
    "HtoD": "HtoD",
    "DtoH": "DtoH",
    "DtoD": "DtoD",
    "HtoH": "HtoH",
    "PtoP": "PtoP",
    "Unified": "unified",
}
_MEMCPY_RE = r"^Memcpy\s+(\w+)(?:\s*\(([^)]*?)\s*->\s*([^)]*?)\))?"

# Bounds that keep base + ts + dur inside int64 nanoseconds (about 292 years).
MAX_US = 2.0e15
MAX_BASE_NS = 4 * 10**18


def _era(top: dict[str, Any], cats: set[str], base: bool, frac: bool, array_era: str) -> str:
    if array_era:
        return array_era
    schema = top.get("schemaVersion")
    parts = [f"schemaVersion {schema}" if schema is not None else "no schemaVersion"]
    # a later name beside the capitalized ones: a Kineto between the two namings (audit 21:
    # cpu_op in a trace with aten::_reshape_alias, torch >= 1.11; session 52: cuda_runtime in
    # a 2022 GPU-only capture, both read "<= 1.9")
    later = cats & {"cpu_op", "cuda_runtime", "cuda_driver", "gpu_memcpy", "gpu_memset", "ac2g"}
    if "Operator" in cats or (cats & {"Kernel", "Runtime", "Memcpy"} and not later):
        parts.append("legacy categories (<= torch 1.9)")
    elif cats & {"Kernel", "Runtime", "Memcpy"}:
        parts.append(
            f"categories Kernel/Memcpy beside {'/'.join(sorted(later))} (a transitional Kineto)"
        )
    if base:
        parts.append("relative ns timestamps (baseTimeNanoseconds, kineto >= 2024-04)")
    elif frac:
        parts.append("fractional absolute us timestamps")
    else:
        parts.append("integer absolute us timestamps")
    return "; ".join(parts)


def _us_to_ns(us: pl.Expr) -> pl.Expr:
    """Microseconds (float) to int64 ns without the precision loss of ``us * 1000``.

    Absolute µs need 16 digits; multiplying first would round to 256 ns steps.
    """
    whole = us.floor()
    return whole.cast(pl.Int64) * 1000 + ((us - whole) * 1000).round().cast(pl.Int64)


def _needs_exact(df: pl.DataFrame, top: dict[str, Any]) -> bool:
    """Absolute (no baseTimeNanoseconds) fractional microseconds beyond float precision."""
    if "baseTimeNanoseconds" in top or df.height == 0:
        return False
    ts = df["ts"].drop_nulls()
    ts = ts.filter(ts.is_finite())
    if ts.len() == 0 or float(ts.max()) * 1000 <= 2**53:
        return False
    return bool((ts - ts.floor() != 0).any())


def parse_kineto(
    path: str | Path, *, max_bytes: int | None = None, parse_helpers: int = 0, threads: int = 1
) -> Trace:
    """``parse_helpers`` helpers decode chunks of a large trace: threads where the native
    scanner is built, else spawned processes (the caller's ``__main__`` must be import-safe);
    0 decodes in this thread only. ``threads`` build the table of a large trace (both from the
    :class:`~traceinsight.runtime.Runtime`)."""
    path = Path(path)
    data = b""
    cut = ""  # how the compressed stream ended early, if it did
    notes: list[str] = []
    fast = stream.decode_path(path, max_bytes, parse_helpers)
    if fast is None:  # streamed layout not recognized: whole document, fast then robust
        data, cut, notes = repair.whole_document(path, max_bytes)
        fast = None if cut else stream.decode(data)
    parsed = fast if fast is not None else repair.robust(data, path, cut)
    df, top, array_era, n_other_ph, warnings, side, mem_rows = parsed
    # the raw frame's columns are freed as the table replaces them: nothing else holds them
    streamed = fast is not None
    del parsed, fast
    warnings = notes + warnings
    exact = None
    # Absolute microseconds with 3 decimals (kineto builds of 2024-03/04) have more digits than a
    # float holds: take ts/dur from their decimal text instead (exact ns).
    needs_exact = _needs_exact(df, top)
    if streamed and needs_exact:
        exact = typed.exact_times(data or repair.whole_document(path, max_bytes)[0])
    del data
    if side.height:  # the side rows find their event by its row in the raw frame
        df = df.with_row_index("_row")
    cat_set = set(df["cat"].drop_nulls().unique().to_list())
    # Kineto's range-profiler mode (profiler metrics): one range per kernel, replayed for its
    # counters, instead of the kernels' activity (audit 24: read as a lost device side)
    ranges = (
        df.filter(pl.col("cat") == "cuda_profiler_range").height
        if ("cuda_profiler_range" in cat_set)
        else 0
    )

    base_raw = top.get("baseTimeNanoseconds")
    base_ns = base_raw if type(base_raw) is int and 0 <= base_raw < MAX_BASE_NS else 0
    frac = bool(df.height) and bool(
        df.select(((pl.col("ts") - pl.col("ts").floor()) != 0).any()).item()
    )

    # Map the few distinct categories in Python, then the column once.
    cat_map = {c: CATEGORY_KIND.get(c.lower()) for c in cat_set}
    kind = pl.col("cat").replace_strict(cat_map, default=None, return_dtype=KindT)
    df = df.with_columns(kind.alias("kind"))
    _refuse_foreign(df, top, n_other_ph=n_other_ph, cats=cat_set, path=path)
    start = _us_to_ns(pl.col("ts")) + base_ns
    dur = _us_to_ns(pl.col("dur"))
    if exact is not None and exact[0].len() == df.height:
        df = df.with_columns(exact[0].alias("_ts_ns"), exact[1].alias("_dur_ns"))
        start = pl.coalesce(pl.col("_ts_ns") + base_ns, start)
        dur = pl.coalesce("_dur_ns", dur)
    else:
        exact = None
    # Times must be finite, non-negative durations, and fit int64 nanoseconds after conversion.
    good_time = (
        pl.col("ts").is_finite()
        & pl.col("dur").is_finite()
        & (pl.col("dur") >= 0)
        & (pl.col("ts").abs() < MAX_US)
        & (pl.col("dur") < MAX_US)
    ).fill_null(False)
    known = pl.col("kind").is_not_null()
    keep = known & good_time & pl.col("name").is_not_null()
    n_bad_time, n_keep = df.select(
        (known & ~good_time).sum().alias("bad"), keep.sum().alias("keep")
    ).row(0)
    if n_keep < df.height:  # a filter keeping every row would copy every column for nothing
        df = df.filter(keep)
    if n_bad_time:
        warnings.append(
            f"skipped {plural(n_bad_time, 'event')} with missing, negative or non-finite ts/dur"
        )

    is_gpu = pl.col("kind").is_in(GPU_SIDE)
    df = df.with_columns(
        start.alias("start_ns"),
        dur.alias("dur_ns"),
        # a device id beyond int32 is garbage: null, the event kept
        pl.when(is_gpu)
        .then(pl.coalesce("a_device", "pid"))
        .cast(pl.Int32, strict=False)
        .alias("device"),
        pl.when(is_gpu).then(pl.coalesce("a_stream", "tid")).alias("stream"),
    ).with_columns((pl.col("start_ns") + pl.col("dur_ns")).alias("end_ns"))
    df = _with_copy_kinds(df)

    meta = TraceMeta(
        source_path=str(path),
        format="kineto",
        format_version=_era(top, cat_set, "baseTimeNanoseconds" in top, frac, array_era),
        warnings=warnings,
    )
    _fill_meta(meta, top, path)
    gpu_ids = df.select(pl.col("device").filter(is_gpu).drop_nulls().unique().sort())
    meta.warnings.extend(reconcile_devices(meta.devices, gpu_ids.to_series().to_list()))
    said = [w for w in warnings if w.startswith((repair.TRUNCATED_NOTE, *repair.STREAM_CUT_NOTES))]
    if cut or said:  # analyzers/health.py makes it an error
        meta.extra["truncated"] = "; ".join(said) or cut
    rank = pl.lit(meta.rank if meta.rank is not None else 0, pl.Int32).alias("rank")
    # the table's columns only: the raw ones (ts, dur, cat, args) are freed here
    df = df.with_columns(rank)
    df = df.select(c for c in (*COLUMNS, "_row") if c in df.columns)
    op_args, kernel_args = _side_args(df, side)
    memory = _memory(mem_rows.with_columns(rank), base_ns)
    del side, mem_rows
    if df.height:
        handed = [df.drop("_row", strict=False)]
        del df  # conform frees each column once it has its sorted copy
        # the scanner's columns are malloc'ed, where freed blocks stay until trimmed: the raw
        # ones dropped above now, each of the table's sources as conform releases it
        typed.trim_native_memory()
        table = conform_taking(
            handed, threads, freed=typed.trim_native_memory, first=typed.SCANNED_AS_IS
        )
    else:
        table = empty_events()
    table = mark_comm_by_launcher(add_kernel_class(table))
    meta.extra["non_duration_events"] = n_other_ph
    if ranges:
        meta.extra["range_profiler_events"] = ranges
    if exact is None and needs_exact:
        meta.warnings.append(
            "absolute timestamps with sub-microsecond digits exceed float precision; "
            "times may be off by up to 0.25 us (kineto#853)"
        )
    typed.trim_native_memory()  # the raw chunks' columns are freed by now
    return Trace(events=table, meta=meta, memory=memory, op_args=op_args, kernel_args=kernel_args)


def _refuse_foreign(
    df: pl.DataFrame, top: dict[str, Any], *, n_other_ph: int, cats: set[str], path: Path
) -> None:
    """InputError for a Chrome-trace document that is not the profiler's: events, none of a
    profiler category, and none of the top-level keys only the profiler writes (a Triton
    server's request trace: an array of ``ph: b/e`` events, ``cat`` the model's name). Every
    Kineto era has one or the other (the 2020 bare array: ``Operator``/``Kernel`` categories).
    A profiler's top-level key excuses only an empty capture: duration events all of other
    categories are another tool's, whatever keys it copied (audit 16: a custom line tracer's
    ``{"schemaVersion": 1, "traceEvents": [9,600 "Line N" events]}`` read "holds no events")."""
    n_events = df.height + n_other_ph
    keys = sorted(PROFILER_TOP_KEYS & set(top))
    own = any(c in KINETO_OWN_CATEGORIES or c.startswith(KINETO_OWN_PREFIXES) for c in cats)
    if (
        n_events == 0
        or (keys and (df.height == 0 or own))
        or df.get_column("kind").is_not_null().any()
    ):
        return
    seen = f" (duration events' categories: {', '.join(sorted(cats)[:5])})" if cats else ""
    has = f" although it has {'/'.join(keys)}" if keys else " and no schemaVersion/deviceProperties"
    raise InputError(
        f"not a PyTorch profiler (Kineto) trace: {plural(n_events, 'Chrome-trace event')}, no duration "
        f"event of a profiler category (cpu_op, kernel, cuda_runtime, ...){seen}{has}",
        str(path),
    )


def reconcile_devices(devices: list[DeviceInfo], gpu_ids: list[int]) -> list[str]:
    """Give the GPU events' device ids missing from ``deviceProperties`` their entry, in place;
    the notes saying so. ROCm traces number devices differently on events and in the list
    (TraceLens' MI300X traces: kernels on device 2 or 9, one entry with id 0). A missing id is
    taken as a listed GPU only where that is unambiguous: every entry describes the same GPU
    (one entry, or a node of identical GPUs), or the missing ids and the unused entries are as
    many (paired in id order)."""
    listed = {d.id for d in devices}
    missing = [i for i in gpu_ids if i not in listed]
    if not missing or not devices:
        return []
    models = {(d.name, d.sm_count, d.memory_bytes, d.compute_capability) for d in devices}
    unused = sorted((d for d in devices if d.id not in set(gpu_ids)), key=lambda d: d.id)
    if len(models) == 1:
        pairs = [(i, devices[0]) for i in missing]
    elif len(unused) == len(missing):
        pairs = list(zip(missing, unused, strict=True))
    else:
        return [
            f"GPU events on device {', '.join(map(str, missing))} not in deviceProperties "
            f"(ids {', '.join(str(d.id) for d in devices)}), which list different GPUs: "
            "left unnamed"
        ]
    devices.extend(
        DeviceInfo(i, d.name, d.sm_count, d.memory_bytes, d.compute_capability) for i, d in pairs
    )
    return [
        f"GPU events on device {i} are not in deviceProperties: taken as its entry {d.id} "
        f"({d.name or 'unnamed'}) (ROCm numbers devices differently on events and in the list)"
        for i, d in pairs
    ]


def _side_args(df: pl.DataFrame, side: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The cpu ops' shapes/FLOPs and the kernels' launch configuration (see model.schema),
    their event's columns taken from the finished rows (times, device, rank)."""
    if side.height == 0:
        return conform_side(side, OP_ARGS_SCHEMA), conform_side(side, KERNEL_ARGS_SCHEMA)
    rows = df.select(
        "_row",
        "kind",
        "name",
        "rank",
        "pid",
        "tid",
        "start_ns",
        "dur_ns",
        "device",
        "correlation",
        "external_id",
    )
    # each side row's event by position: ``_row`` ascends (the raw row index, filtered), so a
    # sorted search finds it; rows whose event was dropped find another row and are left out
    # (a hash join of the side rows against every event cost 4x as much)
    want = side.get_column("row").cast(pl.UInt32)
    at = rows.get_column("_row").search_sorted(want)
    found = (at < rows.height) & (
        rows.get_column("_row").gather(at.clip(0, rows.height - 1)) == want
        if rows.height
        else False
    )
    joined = pl.concat([side.filter(found), rows.drop("_row")[at.filter(found)]], how="horizontal")
    ops = joined.filter(
        (pl.col("kind") == "cpu_op")
        & (
            pl.col("input_dims").is_not_null()
            | pl.col("flops").is_not_null()
            | pl.col("msg_nelems").is_not_null()
        )
    )
    ops = ops.with_columns(_canonical_json(ops.get_column(c)) for c in typed.JSON_TEXT)
    kernel_args = joined.filter(pl.col("kind") == "kernel").with_columns(
        (pl.col("occupancy_pct") / 100).alias("occupancy_ratio")
    )
    return conform_side(ops, OP_ARGS_SCHEMA), conform_side(kernel_args, KERNEL_ARGS_SCHEMA)


def _canonical_json(texts: pl.Series) -> pl.Series:
    """JSON text as Kineto writes it (", " between items): the typed path keeps the file's own
    text, the reference path re-encodes decoded values, and a compact file has none of the
    spaces, so both are rewritten alike, once per distinct value (shapes repeat)."""
    distinct = texts.drop_nulls().unique()
    if distinct.len() == 0:
        return texts
    canon = []
    for t in distinct.to_list():
        try:
            canon.append(json.dumps(json.loads(t), ensure_ascii=False))
        except (ValueError, RecursionError):  # not JSON after all: kept as it is
            canon.append(t)
    return texts.replace_strict(distinct, pl.Series(canon, dtype=pl.String), default=None)


def _memory(raw: pl.DataFrame, base_ns: int) -> pl.DataFrame:
    """The ``[memory]`` instants as the memory side table (Device Type 1 = CUDA: its Device Id
    is the GPU; 0 = CPU; PyTorch's c10::DeviceType numbering otherwise)."""
    if raw.height == 0:
        return conform_side(raw, MEMORY_SCHEMA)
    dtype = pl.col("mem_device_type")
    # the few distinct device types named once (a string built per row cost 3x the rest)
    types = raw.get_column("mem_device_type").drop_nulls().unique().to_list()
    names = {t: "cpu" if t == 0 else "cuda" if t == 1 else f"type {t}" for t in types}
    out = raw.filter(pl.col("ts").is_finite() & (pl.col("ts").abs() < MAX_US)).select(
        "rank",
        pl.when(dtype == 1).then(pl.col("mem_device_id")).alias("device"),
        dtype.replace_strict(names, default=None, return_dtype=pl.String).alias("device_type"),
        (_us_to_ns(pl.col("ts")) + base_ns).alias("start_ns"),
        "pid",
        "tid",
        pl.col("mem_bytes").alias("bytes"),
        pl.col("mem_allocated_bytes").alias("allocated_bytes"),
        pl.col("mem_reserved_bytes").alias("reserved_bytes"),
        pl.col("mem_addr").alias("addr"),
        pl.lit("kineto").alias("source"),
    )
    return conform_side(out, MEMORY_SCHEMA)


def _with_copy_kinds(df: pl.DataFrame) -> pl.DataFrame:
    """Copy direction and memory kinds from the memcpy names ("Memcpy HtoD (Pageable -> Device)"):
    each distinct name is parsed once, and only the memcpy rows are looked up and filled in."""
    rows = (df.get_column("kind") == "memcpy").arg_true()
    types = {"copy_kind": CopyKindT, "src_kind": MemoryKindT, "dst_kind": MemoryKindT}
    out = {c: pl.repeat(None, df.height, dtype=t, eager=True).alias(c) for c, t in types.items()}
    if rows.len():
        names = df.get_column("name").gather(rows).to_frame()
        m = pl.col("_m")
        parsed = (
            names.unique()
            .with_columns(pl.col("name").str.extract_groups(_MEMCPY_RE).alias("_m"))
            .select(
                "name",
                m.struct.field("1")
                .replace_strict(_COPY_KIND, default="other", return_dtype=CopyKindT)
                .alias("copy_kind"),
                m.struct.field("2")
                .str.to_lowercase()
                .replace_strict(_MEM_KIND, default="unknown", return_dtype=MemoryKindT)
                .alias("src_kind"),
                m.struct.field("3")
                .str.to_lowercase()
                .replace_strict(_MEM_KIND, default="unknown", return_dtype=MemoryKindT)
                .alias("dst_kind"),
            )
        )
        per_row = names.join(parsed, on="name", how="left", maintain_order="left")
        out = {c: s.scatter(rows, per_row.get_column(c)) for c, s in out.items()}
    return df.with_columns(*out.values())


def _measured_step(value: Any) -> tuple[int, int] | None:
    """traceinsight.capture's measurement (capture.MEASURED_KEY): the un-profiled step (ns)
    and the steps it was timed over; None where absent or not a positive integer pair (a JSON
    string, as Kineto writes metadata, or an object)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    if not isinstance(value, dict):
        return None
    step, n = value.get("unprofiled_step_ns"), value.get("unprofiled_steps")
    if type(step) is not int or type(n) is not int or step <= 0 or n <= 0:
        return None
    return step, n


def _fill_meta(meta: TraceMeta, top: dict[str, Any], path: Path) -> None:
    dist = top.get("distributedInfo")
    if isinstance(dist, dict):
        rank = dist.get("rank")
        world = dist.get("world_size")
        meta.rank = rank if type(rank) is int else None
        meta.world_size = world if type(world) is int else None
        backend = dist.get("backend")
        meta.backend = backend if isinstance(backend, str) else None
    props = top.get("deviceProperties") or top.get("computeProperties")
    if isinstance(props, list):
        for p in props:
            if not isinstance(p, dict) or type(p.get("id")) is not int:
                continue
            major, minor = p.get("computeMajor"), p.get("computeMinor")
            mem = p.get("totalGlobalMem")
            sms = p.get("numSms")
            meta.devices.append(
                DeviceInfo(
                    id=p["id"],
                    name=p.get("name") if isinstance(p.get("name"), str) else None,
                    sm_count=sms if type(sms) is int else None,
                    memory_bytes=mem if type(mem) is int else None,
                    compute_capability=f"{major}.{minor}"
                    if type(major) is int and type(minor) is int
                    else None,
                )
            )
    for key in (
        "cuda_runtime_version",
        "cuda_driver_version",
        "hip_runtime_version",
        "cupti_version",
    ):
        if key in top and isinstance(top[key], (int, str)):
            meta.extra[key] = top[key]
    if (measured := _measured_step(top.get("traceinsight"))) is not None:
        meta.extra["unprofiled_measured_step_ns"], meta.extra["unprofiled_measured_steps"] = (
            measured
        )
    logged = [m for k in ("ERROR", "WARNING") for m in _lines(top.get(k))]
    if dropped := [m for m in logged if re.search(DROPPED_EVENTS_PATTERN, m)][:5]:
        meta.extra["profiler_dropped"] = dropped


def _lines(v: Any) -> list[str]:
    """A logged level's lines: a list of strings, or one string."""
    if isinstance(v, str):
        return [v]
    return [m for m in v if isinstance(m, str)] if isinstance(v, list) else []
