"""The annotated trace: the original Chrome-trace events unchanged, plus ``cat: "traceinsight"``
events for Perfetto / chrome://tracing: a "GPU idle by cause" track per device (every idle
segment of the window), each finding as an instant at its largest occurrence, GPU-busy-per-step,
queue-depth and allocated-memory counters, and flow arrows from each sync to the idle gap it
caused.

Kineto input is streamed: the bytes of the ``traceEvents`` array are copied through in chunks
(gzip, xz or plain in; gzip or plain out) and the new events go in before its closing bracket, so the
original is never held whole, let alone twice. Nsight input gets a Chrome trace built from the
event table. The parser drops unknown categories, so analyzing the annotated file gives the
original's findings.
"""

from __future__ import annotations

import gzip
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import orjson
import polars as pl

from traceinsight.analysis import TraceAnalysis
from traceinsight.constants import IDLE_CAUSES
from traceinsight.io import atomic_path
from traceinsight.parsers.source import Decompressed

CATEGORY = "traceinsight"
PID = 2_000_000_000  # one synthetic process for the tracks (Chrome JSON wants an integer pid)
FINDINGS_TID = 1_000_000
COUNTERS_TID = 1_000_001
CHUNK_BYTES = 8 << 20
TAIL_BYTES = 1 << 20  # what may follow the events' closing bracket (traceName, base time, ...)
KEY = b'"traceEvents"'
# the events' closing bracket: candidates tried from the end, and how far before the last
# match the metadata after the events may still reach
MAX_CLOSE_TRIES = 512
META_MAX_BYTES = 64 << 10
QUEUE_SAMPLES = 2000  # queue-depth counter points: enough to see the shape, few for any trace
MEMORY_SAMPLES = 4000  # allocated-memory counter points per device (the largest in each bin)
SLICE_ROWS = 200_000  # rows per NDJSON slice of the per-segment tables
MEMORY_TID = 1_000_002
GZIP_LEVEL = 3  # level 6 spent 3x longer for 8% less on the 10x trace
# Idle cause -> the finding that explains it.
CAUSE_FINDING = {c: f for c, f in IDLE_CAUSES.items() if f is not None}
# Event kind -> the Kineto category that parses back to it (nsys input's Chrome trace).
KINETO_CATEGORY = {
    "memcpy": "gpu_memcpy",
    "memset": "gpu_memset",
    "gpu_sync": "cuda_sync",
    "gpu_annotation": "gpu_user_annotation",
    "runtime": "cuda_runtime",
    "driver": "cuda_driver",
}
SYNC_NAMES = r"Synchronize|^(cuda|hip)Memcpy(2D|3D|Peer)?$|^cuMemcpy"


def write_annotated(analysis: TraceAnalysis, src: Path, out: Path) -> int:
    """Write ``src`` with the annotation events to ``out`` (``.gz``: gzip); the number of
    events added."""
    opener = _gzip_writer if out.name.endswith(".gz") else _plain_writer
    with atomic_path(out) as tmp, opener(tmp) as sink:
        if analysis.source["format"] == "kineto":
            return _stream_kineto(analysis, src, sink.write)
        return _from_table(analysis, sink.write)


def _plain_writer(p: Path) -> IO[bytes]:
    return open(p, "wb")  # noqa: SIM115 - closed by the caller's with


def _gzip_writer(p: Path) -> IO[bytes]:
    return gzip.open(p, "wb", compresslevel=GZIP_LEVEL)


def _chunks(src: Path) -> Iterator[bytes]:
    # the analysis has read the whole input already: no size limit to apply again
    yield from Decompressed(src, max_bytes=1 << 62, read_size=CHUNK_BYTES)


def _stream_kineto(analysis: TraceAnalysis, src: Path, write: Callable[[bytes], Any]) -> int:
    chunks = _chunks(src)
    head = b""
    for chunk in chunks:  # up to the events' opening bracket
        head += chunk
        if head.lstrip()[:1] == b"[":  # the old era: the document is the events array
            at, bracket = -1, head.find(b"[")
            break
        at = head.find(KEY)
        bracket = head.find(b"[", at + len(KEY)) if at >= 0 else -1
        if bracket >= 0:
            break
    else:
        raise ValueError("no traceEvents array in the trace")
    array_doc = at < 0
    top = {} if array_doc else _loads_or_empty(head[:at] + b'"_": 0}')
    write(head[: bracket + 1])
    buf, last = head[bracket + 1 :], b"["
    for chunk in chunks:  # the events, all but a tail
        buf += chunk
        if len(buf) > TAIL_BYTES:
            body, buf = buf[:-TAIL_BYTES], buf[-TAIL_BYTES:]
            write(body)
            last = body.rstrip()[-1:] or last
    close = buf.rfind(b"]") if array_doc else _closing_bracket(buf)
    if close < 0:
        raise ValueError("the end of the events array was not found")
    rest = _loads_or_empty(b'{"traceEvents": []' + buf[close + 1 :])
    base = next(
        (
            t["baseTimeNanoseconds"]
            for t in (top, rest)
            if type(t.get("baseTimeNanoseconds")) is int
        ),
        0,
    )
    body = buf[:close]
    last = body.rstrip()[-1:] or last
    write(body)
    n = _write_annotations(analysis, base, write, first=last == b"[")
    write(buf[close:])
    return n


def _loads_or_empty(b: bytes) -> dict[str, Any]:
    try:
        obj = orjson.loads(b)
    except orjson.JSONDecodeError:
        return {}
    return obj if isinstance(obj, dict) else {}


def _closing_bracket(tail: bytes) -> int:
    """The ``]`` that closes the events: the earliest one after which the document's remaining
    keys parse as the end of an object. The last such one is not enough: a list after the
    events (Kineto's logged ``"WARNING": [...]``) parses too, and the annotations would land in
    it. An earlier ``]`` inside the events never parses (the events' braces follow it), so the
    search stops some way before the last match (metadata is small)."""
    pos, found, tried = len(tail), -1, 0
    while (pos := tail.rfind(b"]", 0, pos)) >= 0 and tried < MAX_CLOSE_TRIES:
        if found >= 0 and found - pos > META_MAX_BYTES:
            break
        tried += 1
        try:
            orjson.loads(b'{"traceEvents": []' + tail[pos + 1 :])
            found = pos
        except orjson.JSONDecodeError:
            continue
    if found < 0:
        raise ValueError("the end of the traceEvents array was not found")
    return found


def _from_table(analysis: TraceAnalysis, write: Callable[[bytes], Any]) -> int:
    """A Chrome trace of the event table plus the annotation events."""
    if analysis.trace is None:
        raise ValueError(
            "the analysis no longer holds its event table (a job rank sent back without it)"
        )
    ev = analysis.trace.events
    # Times after a base (Kineto's baseTimeNanoseconds): absolute ns as float microseconds
    # would keep only a quarter of a microsecond.
    base = int(ev.get_column("start_ns").min() or 0)
    gpu = pl.col("device").is_not_null()
    # Kineto's categories and args, so the file reads back as the same table
    head = [
        "name",
        pl.col("kind").cast(pl.String).replace(KINETO_CATEGORY).alias("cat"),
        pl.lit("X").alias("ph"),
        ((pl.col("start_ns") - base) / 1000).round(3).alias("ts"),
        (pl.col("dur_ns") / 1000).round(3).alias("dur"),
        pl.when(gpu).then(pl.col("device")).otherwise(pl.col("pid")).cast(pl.Int64).alias("pid"),
        pl.when(gpu).then(pl.col("stream")).otherwise(pl.col("tid")).fill_null(0).alias("tid"),
    ]
    args = [
        "device",
        "stream",
        "correlation",
        pl.col("external_id").alias("External id"),
        "bytes",
    ]
    # kernels with a launch configuration (an nsys export's grid, block, registers and shared
    # memory) carry it as Kineto's kernel args do, so occupancy reads back the same
    indexed = ev.with_row_index("_row")
    configured = _kernel_configs(analysis, indexed)
    rows = [ev.select(*head, pl.struct(*args).alias("args"))]
    if configured is not None:
        done = configured.get_column("_row").implode()
        rows = [
            indexed.filter(~pl.col("_row").is_in(done)).select(
                *head, pl.struct(*args).alias("args")
            ),
            configured.select(*head, pl.struct(*args, *KERNEL_CONFIG_ARGS).alias("args")),
        ]
    write(b'{"traceEvents": [\n')
    first = True
    for part in (p for r in rows for p in r.iter_slices(200_000)):
        lines = part.write_ndjson().rstrip("\n").replace("\n", ",\n")
        write(("" if first else ",\n").encode() + lines.encode())
        first = False
    n = _write_annotations(analysis, base, write, first=first)
    # the devices as Kineto names them: the spec table's peaks and limits read back the same
    props = orjson.dumps([_device_properties(d) for d in analysis.trace.meta.devices])
    write(
        b'\n], "displayTimeUnit": "ms", "baseTimeNanoseconds": %d, "deviceProperties": %s}\n'
        % (base, props)
    )
    return n


def _device_properties(d: Any) -> dict[str, Any]:
    """A device as a Kineto trace's ``deviceProperties`` entry (parsers/kineto reads it)."""
    out: dict[str, Any] = {"id": d.id}
    if d.name is not None:
        out["name"] = d.name
    if d.sm_count is not None:
        out["numSms"] = d.sm_count
    if d.memory_bytes is not None:
        out["totalGlobalMem"] = d.memory_bytes
    if d.compute_capability and "." in d.compute_capability:
        major, minor = d.compute_capability.split(".", 1)
        if major.isdigit() and minor.isdigit():
            out["computeMajor"], out["computeMinor"] = int(major), int(minor)
    return out


# Kineto's kernel arg names for a launch configuration (parsers/kineto/decode.py reads them)
KERNEL_CONFIG_ARGS = (
    pl.concat_list("grid_x", "grid_y", "grid_z").alias("grid"),
    pl.concat_list("block_x", "block_y", "block_z").alias("block"),
    pl.col("registers_per_thread").alias("registers per thread"),
    pl.col("shared_memory_bytes").alias("shared memory"),
)


def _kernel_configs(analysis: TraceAnalysis, ev: pl.DataFrame) -> pl.DataFrame | None:
    """The kernels of ``ev`` with their launch configuration (the trace's kernel args, by
    device and correlation), in ``ev``'s columns and the configuration's. None where the
    trace has none."""
    ka = analysis.trace.kernel_args.filter(pl.col("grid_x").is_not_null())
    if ka.height == 0:
        return None
    keys = ka.select(
        "device",
        "correlation",
        *(f"{d}_{a}" for d in ("grid", "block") for a in "xyz"),
        "registers_per_thread",
        "shared_memory_bytes",
    ).unique(subset=["device", "correlation"], keep="first")
    kernels = ev.filter(pl.col("kind") == "kernel").join(
        keys, on=["device", "correlation"], how="inner"
    )
    return kernels if kernels.height else None


def _write_annotations(
    analysis: TraceAnalysis, base_ns: int, write: Callable[[bytes], Any], *, first: bool
) -> int:
    """Every annotation event, written as comma-separated JSON after the original events
    (``first``: none came before); the number written. The per-segment tables (idle segments,
    sync flows) go through polars' NDJSON writer in slices, never as Python dicts."""
    n = 0
    for part in annotation_parts(analysis, base_ns):
        if not part:
            continue
        write(b",\n".join(part) if first else b",\n" + b",\n".join(part))
        first = False
        n += len(part)
    return n


def annotation_parts(analysis: TraceAnalysis, base_ns: int) -> Iterator[list[bytes]]:
    """The annotation events as lists of JSON texts: the small ones, then the idle segments and
    the sync flows in slices."""
    yield [orjson.dumps(e) for e in annotation_events(analysis, base_ns)]
    for frame in (_idle_track(analysis, base_ns), *_sync_flows(analysis, base_ns)):
        for part in frame.iter_slices(SLICE_ROWS):
            yield part.write_ndjson().encode().splitlines()


def _us(ns: int, base: int) -> float:
    return round((ns - base) / 1000, 3)


def annotation_events(analysis: TraceAnalysis, base_ns: int) -> list[dict[str, Any]]:
    """The ``traceinsight`` events: times are ns on the table's clock, written as the trace's
    microseconds after ``base_ns`` (Kineto's baseTimeNanoseconds, else 0)."""
    r = analysis.results
    out: list[dict[str, Any]] = [
        _meta("process_name", PID, 0, "traceinsight"),
        _meta("thread_name", PID, FINDINGS_TID, "findings"),
        _meta("thread_name", PID, COUNTERS_TID, "GPU busy per step"),
    ]
    segs = r.idle.segments
    devices = [] if segs is None else sorted(segs.get_column("device").unique().to_list())
    out += [_meta("thread_name", PID, d, f"GPU {d} idle by cause") for d in devices]
    for f in analysis.findings:
        top = f.evidence.get("top_segments") or []
        at = top[0].start_ns if top else r.idle.window_ns and _window_start(analysis)
        out.append(
            {
                "name": f"{f.severity}: {f.id}",
                "cat": CATEGORY,
                "ph": "i",
                "s": "t",
                "pid": PID,
                "tid": FINDINGS_TID,
                "ts": _us(int(at or 0), base_ns),
                "args": {"id": f.id, "title": f.title, "cost_ns": f.cost_ns},
            }
        )
    idle_by_step = {s.step: s for s in r.idle.per_step}
    for s in r.steps.per_step:
        busy = s.gpu_busy_ns
        if busy is None or not s.dur_ns:
            continue
        out.append(
            {
                "name": "GPU busy per step",
                "cat": CATEGORY,
                "ph": "C",
                "pid": PID,
                "tid": COUNTERS_TID,
                "ts": _us(s.start_ns, base_ns),
                "args": {
                    "busy_pct": round(100 * busy / s.dur_ns, 2),
                    "idle_ns": idle.idle_ns if (idle := idle_by_step.get(s.step)) else None,
                },
            }
        )
    out += _queue_depth(analysis, base_ns)
    out += _memory(analysis, base_ns)
    return out


def _idle_track(analysis: TraceAnalysis, base_ns: int) -> pl.DataFrame:
    """Every idle segment of the window as an X event on its device's track, named by cause,
    with the finding that explains it and the host op (for the reported segments)."""
    segs = analysis.results.idle.segments
    if segs is None or segs.height == 0:
        return pl.DataFrame()
    found = {f.id for f in analysis.findings}
    explains = {c: f for c, f in CAUSE_FINDING.items() if f in found}
    return segs.select(
        pl.col("cause").alias("name"),
        pl.lit(CATEGORY).alias("cat"),
        pl.lit("X").alias("ph"),
        pl.lit(PID).alias("pid"),
        pl.col("device").cast(pl.Int64).alias("tid"),
        ((pl.col("start_ns") - base_ns) / 1000).round(3).alias("ts"),
        ((pl.col("end_ns") - pl.col("start_ns")) / 1000).round(3).alias("dur"),
        pl.struct(
            pl.col("cause")
            .replace_strict(explains, default=None, return_dtype=pl.String)
            .alias("finding"),
            "host_op",
            (pl.col("end_ns") - pl.col("start_ns")).alias("idle_ns"),
        ).alias("args"),
    )


def _memory(analysis: TraceAnalysis, base_ns: int) -> list[dict[str, Any]]:
    """Allocated (and reserved) memory per GPU from the trace's memory events: the largest
    value in each of at most MEMORY_SAMPLES bins per device, at the bin's first event."""
    if analysis.trace is None or analysis.trace.memory.height == 0:
        return []
    mem = analysis.trace.memory.filter(
        pl.col("device").is_not_null()
        & pl.col("allocated_bytes").is_not_null()
        & pl.col("start_ns").is_not_null()
    )
    if mem.height == 0:
        return []
    lo, hi = int(mem["start_ns"].min()), int(mem["start_ns"].max())
    width = max(1, (hi - lo) // MEMORY_SAMPLES + 1)
    bins = (
        mem.group_by("device", ((pl.col("start_ns") - lo) // width).alias("bin"))
        .agg(
            pl.col("start_ns").min(),
            pl.col("allocated_bytes").max(),
            pl.col("reserved_bytes").max(),
        )
        .sort("device", "bin")
    )
    devices = bins.get_column("device").unique().sort().to_list()
    out = [_meta("thread_name", PID, MEMORY_TID, "GPU memory")] if devices else []
    for dev, t, alloc, reserved in bins.select(
        "device", "start_ns", "allocated_bytes", "reserved_bytes"
    ).iter_rows():
        args = {"allocated_MiB": round(alloc / (1 << 20), 3)}
        if reserved is not None:
            args["reserved_MiB"] = round(reserved / (1 << 20), 3)
        out.append(
            {
                "name": f"GPU {dev} memory",
                "cat": CATEGORY,
                "ph": "C",
                "pid": PID,
                "tid": MEMORY_TID,
                "ts": _us(t, base_ns),
                "args": args,
            }
        )
    return out


def _queue_depth(analysis: TraceAnalysis, base_ns: int) -> list[dict[str, Any]]:
    """Kernels launched but not yet started (+1 at the launch call's end, -1 at the start),
    sampled as the largest depth in each of at most QUEUE_SAMPLES bins."""
    if analysis.trace is None:
        return []
    ev = analysis.trace.events
    calls = ev.filter(
        pl.col("kind").is_in(["runtime", "driver"]) & pl.col("correlation").is_not_null()
    ).select("rank", "correlation", pl.col("end_ns").alias("t"))
    calls = calls.unique(["rank", "correlation"], keep="first")
    gpu = ev.filter(pl.col("kind").is_in(["kernel", "memcpy", "memset"])).select(
        "rank", "correlation", "start_ns"
    )
    pairs = gpu.join(calls, on=["rank", "correlation"]).filter(pl.col("t") <= pl.col("start_ns"))
    if pairs.height == 0:
        return []
    steps = pl.concat(
        [
            pairs.select(pl.col("t"), pl.lit(1).alias("d")),
            pairs.select(pl.col("start_ns").alias("t"), pl.lit(-1).alias("d")),
        ]
    ).sort("t", "d")  # a start before a launch at the same instant
    lo, hi = int(steps["t"].min()), int(steps["t"].max())
    width = max(1, (hi - lo) // QUEUE_SAMPLES + 1)
    bins = (
        steps.with_columns(pl.col("d").cum_sum().alias("depth"))
        .group_by(((pl.col("t") - lo) // width).alias("bin"))
        .agg(pl.col("t").min(), pl.col("depth").max())
        .sort("bin")
    )
    return [
        {
            "name": "queue depth",
            "cat": CATEGORY,
            "ph": "C",
            "pid": PID,
            "tid": COUNTERS_TID,
            "ts": _us(t, base_ns),
            "args": {"launched_not_started": int(depth)},
        }
        for t, depth in bins.select("t", "depth").iter_rows()
    ]


def _window_start(analysis: TraceAnalysis) -> int:
    steps = analysis.results.steps.per_step
    return int(steps[0].start_ns) if steps else 0


def _sync_flows(analysis: TraceAnalysis, base_ns: int) -> list[pl.DataFrame]:
    """An arrow from the sync call running when each host_sync gap began to that gap: the
    flow's start on the call's thread, its end bound to the gap's idle slice (``bp: e``)."""
    segs = analysis.results.idle.segments
    if segs is None or analysis.trace is None:
        return []
    gaps = segs.filter(pl.col("cause") == "host_sync").select(
        pl.col("start_ns").alias("gap_start"), "device"
    )
    if gaps.height == 0:
        return []
    ev = analysis.trace.events
    syncs = (
        ev.filter(
            pl.col("kind").is_in(["runtime", "driver"]) & pl.col("name").str.contains(SYNC_NAMES)
        )
        .select("start_ns", "end_ns", "pid", "tid")
        .sort("start_ns")
    )
    hit = (
        gaps.sort("gap_start")
        .join_asof(syncs, left_on="gap_start", right_on="start_ns", strategy="backward")
        .filter(pl.col("end_ns") >= pl.col("gap_start"))  # still running when the gap began
        .with_row_index("id", offset=1)
    )
    common = [pl.lit("sync -> idle").alias("name"), pl.lit(CATEGORY).alias("cat"), "id"]
    start = hit.select(
        *common,
        pl.lit("s").alias("ph"),
        pl.col("pid").fill_null(0),
        pl.col("tid").fill_null(0),
        ((pl.col("start_ns") - base_ns) / 1000).round(3).alias("ts"),
    )
    end = hit.select(
        *common,
        pl.lit("f").alias("ph"),
        pl.lit(PID, pl.Int64).alias("pid"),
        pl.col("device").cast(pl.Int64).alias("tid"),
        ((pl.col("gap_start") - base_ns) / 1000).round(3).alias("ts"),
        pl.lit("e").alias("bp"),
    )
    return [start, end]  # apart: "bp" belongs on the ends only


def _meta(kind: str, pid: int, tid: int, name: str) -> dict[str, Any]:
    return {
        "name": kind,
        "ph": "M",
        "cat": CATEGORY,
        "pid": pid,
        "tid": tid,
        "args": {"name": name},
    }
