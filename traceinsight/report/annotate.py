"""The annotated trace: the original Chrome-trace events unchanged, plus ``cat: "traceinsight"``
events for Perfetto / chrome://tracing: a "GPU idle by cause" track per device, each finding as
an instant at its largest occurrence, GPU-busy-per-step and queue-depth counters, and flow
arrows from each sync to the idle gap it caused.

Kineto input is streamed: the bytes of the ``traceEvents`` array are copied through in chunks
(gzip or plain, in and out) and the new events go in before its closing bracket, so the
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
from traceinsight.io import atomic_path

CATEGORY = "traceinsight"
PID = 2_000_000_000  # one synthetic process for the tracks (Chrome JSON wants an integer pid)
FINDINGS_TID = 1_000_000
COUNTERS_TID = 1_000_001
CHUNK_BYTES = 8 << 20
TAIL_BYTES = 1 << 20  # what may follow the events' closing bracket (traceName, base time, ...)
KEY = b'"traceEvents"'
QUEUE_SAMPLES = 2000  # queue-depth counter points: enough to see the shape, few for any trace
GZIP_LEVEL = 3  # level 6 spent 3x longer for 8% less on the 10x trace
# Idle cause -> the finding that explains it.
CAUSE_FINDING = {
    "dataloader": "dataloader_stall",
    "host_sync": "host_sync",
    "launch_overhead": "launch_bound",
    "pageable_copy": "pageable_memcpy",
    "communication": "comm_not_overlapped",
    "cpu_work": "gpu_underutilized",
}
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
    with gzip.open(src, "rb") if _is_gzip(src) else open(src, "rb") as f:
        while chunk := f.read(CHUNK_BYTES):
            yield chunk


def _is_gzip(p: Path) -> bool:
    with open(p, "rb") as f:
        return f.read(2) == b"\x1f\x8b"


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
    events = annotation_events(analysis, base)
    body = buf[:close]
    last = body.rstrip()[-1:] or last
    write(body)
    if events:
        write(b"," if last != b"[" else b"")
        write(b",\n".join(orjson.dumps(e) for e in events))
    write(buf[close:])
    return len(events)


def _loads_or_empty(b: bytes) -> dict[str, Any]:
    try:
        obj = orjson.loads(b)
    except orjson.JSONDecodeError:
        return {}
    return obj if isinstance(obj, dict) else {}


def _closing_bracket(tail: bytes) -> int:
    """The ``]`` that closes the events: the last one after which the document's remaining keys
    parse as the end of an object."""
    pos = len(tail)
    while (pos := tail.rfind(b"]", 0, pos)) >= 0:
        try:
            orjson.loads(b'{"traceEvents": []' + tail[pos + 1 :])
            return pos
        except orjson.JSONDecodeError:
            continue
    raise ValueError("the end of the traceEvents array was not found")


def _from_table(analysis: TraceAnalysis, write: Callable[[bytes], Any]) -> int:
    """A Chrome trace of the event table plus the annotation events."""
    assert analysis.trace is not None
    ev = analysis.trace.events
    # Times after a base (Kineto's baseTimeNanoseconds): absolute ns as float microseconds
    # would keep only a quarter of a microsecond.
    base = int(ev.get_column("start_ns").min() or 0)
    gpu = pl.col("device").is_not_null()
    # Kineto's categories and args, so the file reads back as the same table
    rows = ev.select(
        "name",
        pl.col("kind").cast(pl.String).replace(KINETO_CATEGORY).alias("cat"),
        pl.lit("X").alias("ph"),
        ((pl.col("start_ns") - base) / 1000).round(3).alias("ts"),
        (pl.col("dur_ns") / 1000).round(3).alias("dur"),
        pl.when(gpu).then(pl.col("device")).otherwise(pl.col("pid")).cast(pl.Int64).alias("pid"),
        pl.when(gpu).then(pl.col("stream")).otherwise(pl.col("tid")).fill_null(0).alias("tid"),
        pl.struct(
            "device",
            "stream",
            "correlation",
            pl.col("external_id").alias("External id"),
            "bytes",
        ).alias("args"),
    )
    write(b'{"traceEvents": [\n')
    first = True
    for part in rows.iter_slices(200_000):
        lines = part.write_ndjson().rstrip("\n").replace("\n", ",\n")
        write(("" if first else ",\n").encode() + lines.encode())
        first = False
    events = annotation_events(analysis, base)
    if events:
        write(b",\n" if not first else b"")
        write(b",\n".join(orjson.dumps(e) for e in events))
    write(b'\n], "displayTimeUnit": "ms", "baseTimeNanoseconds": %d}\n' % base)
    return len(events)


def _us(ns: int, base: int) -> float:
    return round((ns - base) / 1000, 3)


def annotation_events(analysis: TraceAnalysis, base_ns: int) -> list[dict[str, Any]]:
    """The ``traceinsight`` events: times are ns on the table's clock, written as the trace's
    microseconds after ``base_ns`` (Kineto's baseTimeNanoseconds, else 0)."""
    r = analysis.results
    found = {f.id for f in analysis.findings}
    out: list[dict[str, Any]] = [
        _meta("process_name", PID, 0, "traceinsight"),
        _meta("thread_name", PID, FINDINGS_TID, "findings"),
        _meta("thread_name", PID, COUNTERS_TID, "GPU busy per step"),
    ]
    devices = sorted({int(s["device"]) for s in r.idle.top_segments})
    out += [_meta("thread_name", PID, d, f"GPU {d} idle by cause") for d in devices]
    segs = sorted(r.idle.top_segments, key=lambda s: (s["device"], s["start_ns"]))
    for s in segs:
        fid = CAUSE_FINDING.get(s["cause"])
        out.append(
            {
                "name": s["cause"],
                "cat": CATEGORY,
                "ph": "X",
                "pid": PID,
                "tid": int(s["device"]),
                "ts": _us(s["start_ns"], base_ns),
                "dur": round(s["dur_ns"] / 1000, 3),
                "args": {
                    "finding": fid if fid in found else None,
                    "host_op": s["host_op"],
                    "idle_ns": s["dur_ns"],
                },
            }
        )
    for f in analysis.findings:
        top = f.evidence.get("top_segments") or []
        at = top[0]["start_ns"] if top else r.idle.window_ns and _window_start(analysis)
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
    idle_by_step = {s["step"]: s for s in r.idle.per_step}
    for s in r.steps.per_step:
        busy = s.get("gpu_busy_ns")
        if busy is None or not s["dur_ns"]:
            continue
        out.append(
            {
                "name": "GPU busy per step",
                "cat": CATEGORY,
                "ph": "C",
                "pid": PID,
                "tid": COUNTERS_TID,
                "ts": _us(s["start_ns"], base_ns),
                "args": {
                    "busy_pct": round(100 * busy / s["dur_ns"], 2),
                    "idle_ns": idle_by_step.get(s["step"], {}).get("idle_ns"),
                },
            }
        )
    out += _queue_depth(analysis, base_ns)
    out += _sync_flows(analysis, base_ns)
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
    return int(steps[0]["start_ns"]) if steps else 0


def _sync_flows(analysis: TraceAnalysis, base_ns: int) -> list[dict[str, Any]]:
    """An arrow from the sync call running when each host_sync gap began to that gap."""
    gaps = [s for s in analysis.results.idle.top_segments if s["cause"] == "host_sync"]
    if not gaps or analysis.trace is None:
        return []
    ev = analysis.trace.events
    syncs = (
        ev.filter(
            pl.col("kind").is_in(["runtime", "driver"]) & pl.col("name").str.contains(SYNC_NAMES)
        )
        .select("start_ns", "end_ns", "pid", "tid")
        .sort("start_ns")
    )
    g = pl.DataFrame(
        {"gap_start": [s["start_ns"] for s in gaps], "device": [s["device"] for s in gaps]}
    ).sort("gap_start")
    hit = g.join_asof(syncs, left_on="gap_start", right_on="start_ns", strategy="backward")
    out: list[dict[str, Any]] = []
    for i, row in enumerate(hit.drop_nulls("start_ns").iter_rows(named=True), start=1):
        common = {"name": "sync -> idle", "cat": CATEGORY, "id": i}
        out.append(
            {
                **common,
                "ph": "s",
                "pid": row["pid"],
                "tid": row["tid"],
                "ts": _us(row["start_ns"], base_ns),
            }
        )
        out.append(
            {
                **common,
                "ph": "f",
                "bp": "e",
                "pid": PID,
                "tid": int(row["device"]),
                "ts": _us(row["gap_start"], base_ns),
            }
        )
    return out


def _meta(kind: str, pid: int, tid: int, name: str) -> dict[str, Any]:
    return {
        "name": kind,
        "ph": "M",
        "cat": CATEGORY,
        "pid": pid,
        "tid": tid,
        "args": {"name": name},
    }
