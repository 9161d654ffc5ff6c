"""PyTorch profiler (Kineto) Chrome traces, every era from the 2020 bare array to today.

The JSON is decoded once with orjson; each needed field is pulled into a flat Python list (one
C-level comprehension per field) and handed to polars, after which the event dicts are dropped.
Everything after that is vectorized. Format history: ../shared/KINETO_FORMAT.md.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import orjson
import polars as pl

from traceinsight import resources
from traceinsight.errors import InputError
from traceinsight.model.classify import add_kernel_class, mark_comm_by_launcher
from traceinsight.model.schema import (
    CopyKindT,
    DeviceInfo,
    KindT,
    MemoryKindT,
    Trace,
    TraceMeta,
    conform,
    empty_events,
)
from traceinsight.parsers import kineto_fast as _fast
from traceinsight.parsers.kineto_fast import raw_frame
from traceinsight.parsers.source import Decompressed, padding_note

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
    # other accelerators (MTIA, XPU, PrivateUse1) keep the same shape
    "mtia_ccp_events": "kernel",
    "mtia_runtime": "runtime",
    "xpu_runtime": "runtime",
    "xpu_driver": "driver",
    "privateuse1_runtime": "runtime",
    "privateuse1_driver": "driver",
}
GPU_SIDE = ("kernel", "memcpy", "memset", "gpu_sync", "gpu_annotation")

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
_COPY_KIND = {"HtoD": "HtoD", "DtoH": "DtoH", "DtoD": "DtoD", "HtoH": "HtoH", "PtoP": "PtoP"}
_MEMCPY_RE = r"^Memcpy\s+(\w+)(?:\s*\(([^)]*?)\s*->\s*([^)]*?)\))?"

_EMPTY: dict[str, Any] = {}
# Bounds that keep base + ts + dur inside int64 nanoseconds (about 292 years).
MAX_US = 2.0e15
MAX_BASE_NS = 4 * 10**18
# Memory the whole-document path takes per byte of JSON (orjson's dicts of the compact 10x
# trace: 2.9 GiB for 433 MB); an input it cannot hold is refused before it is read.
WHOLE_DOCUMENT_FACTOR = 8


def _whole_document(path: Path, max_bytes: int | None) -> tuple[bytes, bool, list[str]]:
    """The document in memory, whether the gzip stream ended early, and the padding note:
    whitespace padding is dropped as it streams, and the input is refused once it passes what
    the memory available can parse this way."""
    stream = Decompressed(
        path, max_bytes, squeeze=True, room=resources.available_bytes() // WHOLE_DOCUMENT_FACTOR
    )
    data = b"".join(stream)
    return data, stream.truncated, [padding_note(stream.padding)] if stream.padding else []


def _decode(data: bytes, path: Path, truncated_gzip: bool) -> tuple[Any, list[str]]:
    """orjson first; then the repairs real traces need (bad UTF-8, quotes, NaN, truncation)."""
    warnings: list[str] = []
    try:
        return orjson.loads(data), warnings
    except orjson.JSONDecodeError as exc:
        first_error = str(exc)
    if "depth limit" in first_error:  # no repair applies; the salvage's retries would all fail too
        raise InputError(
            f"JSON nested deeper than 1024 levels, not a profiler trace ({first_error})", str(path)
        )
    if "UTF-8" in first_error or "surrogates" in first_error:
        data = data.decode("utf-8", "replace").encode("utf-8", "replace")
        warnings.append("invalid UTF-8 bytes in names were replaced")
        try:
            return orjson.loads(data), warnings
        except orjson.JSONDecodeError as exc:
            first_error = str(exc)
    if "64-bit" in first_error or "exceeds" in first_error:
        try:  # integers beyond 64 bits: the standard library reads them; they become missing later
            return json.loads(data, parse_constant=lambda _c: None), [
                *warnings,
                "integers beyond 64 bits were ignored",
            ]
        except (ValueError, RecursionError):
            pass
    repaired = _escape_stray_quotes(data)
    if repaired is not data:
        try:
            obj = orjson.loads(repaired)
            return obj, [
                *warnings,
                "unescaped quotes in event names were repaired (pytorch#146900)",
            ]
        except orjson.JSONDecodeError:
            data = repaired
    if truncated_gzip:
        warnings.append("the gzip stream ends early; analyzed the events before the cut")
    salvaged = _salvage(data)
    if salvaged is not None:
        obj, note = salvaged
        warnings.append(note)
        return obj, warnings
    if truncated_gzip:
        raise InputError(
            "the gzip stream ends early and no complete event could be recovered", str(path)
        )
    raise InputError(f"not valid JSON ({first_error})", str(path))


# Kineto writes `"name": "<value>", "<next key>"`; a name with a raw `"` inside (older writers did
# not escape it) breaks the document. Re-escape quotes between `"name": "` and the next known key.
_NAME_VALUE = re.compile(rb'("name": ")(.*?)(", "(?:pid|tid|ts|dur|cat|ph|args|id|s|bp)")')


def _escape_stray_quotes(data: bytes) -> bytes:
    def fix(m: re.Match[bytes]) -> bytes:
        inner = re.sub(rb'(?<!\\)"', rb'\\"', m.group(2))
        return m.group(1) + inner + m.group(3)

    out = _NAME_VALUE.sub(fix, data)
    return data if out == data else out


def _salvage(data: bytes) -> tuple[Any, str] | None:
    """Recover what a crashed or buggy writer left: bare NaN/Infinity, or a cut-off file."""
    text = data
    # Kineto never writes these, but other tools' Chrome traces do.
    fixed = re.sub(rb"(?<=[:\[,\s])(-?Infinity|NaN)(?=[,\]\}\s])", b"null", text)
    try:
        return orjson.loads(fixed), "non-standard NaN/Infinity values were read as missing"
    except orjson.JSONDecodeError:
        pass
    # A truncated file: cut after the last complete event of the traceEvents array and close it.
    start = fixed.find(b"[")
    if start < 0:
        return None
    for cut in _candidate_cuts(fixed):
        head = fixed[:cut]
        for tail in (b"]}", b"]"):
            try:
                obj = orjson.loads(head + tail)
            except orjson.JSONDecodeError:
                continue
            events = (
                obj
                if isinstance(obj, list)
                else obj.get("traceEvents")
                if isinstance(obj, dict)
                else None
            )
            if isinstance(events, list) and events:
                return obj, (
                    f"the file is truncated (damaged after byte {cut:,}); "
                    f"analyzed the {len(events):,} complete events before the damage"
                )
    return None


def _candidate_cuts(data: bytes, tries: int = 64) -> list[int]:
    """Positions just after a '}' that could close the last complete event, latest first."""
    cuts: list[int] = []
    pos = len(data)
    while len(cuts) < tries:
        pos = data.rfind(b"}", 0, pos)
        if pos < 0:
            break
        cuts.append(pos + 1)
    return cuts


def _events_and_top(obj: Any, path: Path) -> tuple[list[Any], dict[str, Any], str]:
    if isinstance(obj, list):
        if obj and not any(type(e) is dict and "ph" in e for e in obj[:1000]):
            raise InputError(
                "not a Kineto trace (a JSON array without trace events; a memory timeline or other export?)",
                str(path),
            )
        return obj, {}, "2020 bare event array"
    if not isinstance(obj, dict):
        raise InputError("not a Kineto trace (JSON is not an object or array of events)", str(path))
    events = obj.get("traceEvents")
    if events is None:
        if "nodes" in obj and "schema" in obj:
            raise InputError(
                "this is a PyTorch Execution Trace, not a Kineto profiler trace; "
                "pass the matching *.pt.trace.json from torch.profiler",
                str(path),
            )
        raise InputError("not a Kineto trace (no 'traceEvents' array)", str(path))
    if not isinstance(events, list):
        raise InputError("not a Kineto trace ('traceEvents' is not an array)", str(path))
    return events, obj, ""


def _era(top: dict[str, Any], cats: set[str], base: bool, frac: bool, array_era: str) -> str:
    if array_era:
        return array_era
    schema = top.get("schemaVersion")
    parts = [f"schemaVersion {schema}" if schema is not None else "no schemaVersion"]
    if cats & {"Kernel", "Operator", "Runtime", "Memcpy"}:
        parts.append("legacy categories (<= torch 1.9)")
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


def _frame_from_dicts(events: list[Any]) -> tuple[pl.DataFrame, int]:
    xs = [e for e in events if type(e) is dict and e.get("ph") == "X"]
    args = [a if type(a) is dict else _EMPTY for a in (e.get("args") for e in xs)]
    df = raw_frame(
        [e.get("cat") for e in xs],
        [e.get("name") for e in xs],
        [e.get("ts") for e in xs],
        [e.get("dur") for e in xs],
        [e.get("pid") for e in xs],
        [e.get("tid") for e in xs],
        [a.get("device") for a in args],
        [a.get("stream") for a in args],
        [a.get("correlation") for a in args],
        [a.get("External id", a.get("external id")) for a in args],
        [a.get("bytes") for a in args],
    )
    return df, len(events) - len(xs)


def _robust(
    data: bytes, path: Path, truncated: bool
) -> tuple[pl.DataFrame, dict[str, Any], str, int, list[str]]:
    """orjson into dicts, with every repair; the path for damaged or unusual files."""
    obj, warnings = _decode(data, path, truncated)
    events, top, array_era = _events_and_top(obj, path)
    del obj
    df, n_other = _frame_from_dicts(events)
    return df, top, array_era, n_other, warnings


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
    path: str | Path, *, max_bytes: int | None = None, parse_helpers: int = 0
) -> Trace:
    """``parse_helpers`` extra processes decode chunks of a large trace (spawned: the caller's
    ``__main__`` must be import-safe); 0 decodes in this process only."""
    path = Path(path)
    data = b""
    truncated = False
    notes: list[str] = []
    fast = _fast.decode_path(path, max_bytes, parse_helpers)
    if fast is None:  # streamed layout not recognized: whole document, fast then robust
        data, truncated, notes = _whole_document(path, max_bytes)
        fast = None if truncated else _fast.decode(data)
    if fast is not None:
        df, top, array_era, n_other_ph, warnings = fast
    else:
        df, top, array_era, n_other_ph, warnings = _robust(data, path, truncated)
    warnings = notes + warnings
    exact = None
    if fast is not None and _needs_exact(df, top):
        exact = _fast.exact_times(data or _whole_document(path, max_bytes)[0])
    del data
    cat_set = set(df["cat"].drop_nulls().unique().to_list())

    base_raw = top.get("baseTimeNanoseconds")
    base_ns = base_raw if type(base_raw) is int and 0 <= base_raw < MAX_BASE_NS else 0
    frac = bool(df.height) and bool(
        df.select(((pl.col("ts") - pl.col("ts").floor()) != 0).any()).item()
    )

    # Map the few distinct categories in Python, then the column once.
    cat_map = {c: CATEGORY_KIND.get(c.lower()) for c in cat_set}
    kind = pl.col("cat").replace_strict(cat_map, default=None, return_dtype=KindT)
    df = df.with_columns(kind.alias("kind"))
    # Absolute microseconds with 3 decimals (kineto builds of 2024-03/04) have more digits than a
    # float holds: take ts/dur from their decimal text instead (exact ns).
    needs_exact = _needs_exact(df, top)
    if exact is not None and exact[0].len() == df.height:
        df = df.with_columns(exact[0].alias("_ts_ns"), exact[1].alias("_dur_ns"))
    else:
        exact = None
        df = df.with_columns(
            pl.lit(None, pl.Int64).alias("_ts_ns"), pl.lit(None, pl.Int64).alias("_dur_ns")
        )
    # Times must be finite, non-negative durations, and fit int64 nanoseconds after conversion.
    good_time = (
        pl.col("ts").is_finite()
        & pl.col("dur").is_finite()
        & (pl.col("dur") >= 0)
        & (pl.col("ts").abs() < MAX_US)
        & (pl.col("dur") < MAX_US)
    ).fill_null(False)
    n_bad_time = df.filter(pl.col("kind").is_not_null() & ~good_time).height
    df = df.filter(pl.col("kind").is_not_null() & good_time & pl.col("name").is_not_null())
    if n_bad_time:
        warnings.append(
            f"{n_bad_time:,} events with missing, negative or non-finite ts/dur were skipped"
        )

    is_gpu = pl.col("kind").is_in(GPU_SIDE)
    start = _us_to_ns(pl.col("ts")) + base_ns
    df = df.with_columns(
        pl.coalesce(pl.col("_ts_ns") + base_ns, start).alias("start_ns"),
        pl.coalesce("_dur_ns", _us_to_ns(pl.col("dur"))).alias("dur_ns"),
        pl.when(is_gpu).then(pl.coalesce("a_device", "pid")).cast(pl.Int32).alias("device"),
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
    if meta.rank is not None:
        df = df.with_columns(pl.lit(meta.rank, pl.Int32).alias("rank"))
    else:
        df = df.with_columns(pl.lit(0, pl.Int32).alias("rank"))
    table = conform(df) if df.height else empty_events()
    table = mark_comm_by_launcher(add_kernel_class(table))
    meta.extra["non_duration_events"] = n_other_ph
    if exact is None and needs_exact:
        meta.warnings.append(
            "absolute timestamps with sub-microsecond digits exceed float precision; "
            "times may be off by up to 0.25 us (kineto#853)"
        )
    return Trace(events=table, meta=meta)


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
