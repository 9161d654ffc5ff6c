"""Backtraces of host calls: the ``Trace.callchains`` side table (model/schema.py).

nsys attaches call stacks three ways: to CUDA API calls (``--cudabacktrace``:
``CUPTI_ACTIVITY_KIND_RUNTIME.callchainId`` -> ``CUDA_CALLCHAINS``), to OS runtime calls
(``OSRT_API.callchainId`` -> ``OSRT_CALLCHAINS``) and to CPU samples (``COMPOSITE_EVENTS`` ->
``SAMPLING_CALLCHAINS``, same id). Symbols and modules are StringIds. Only samples taken inside a
CUDA API call on their thread are kept as the call's stack (``sampling``); the samples between
the calls of a thread that made CUDA calls are kept too, their innermost
:data:`CPU_SAMPLE_DEPTH_KEPT` frames (``cpu_sample``): the host code the GPU waited on, which
idle names (the other threads' samples are CPU profiling this tool does not use, and can be
millions of frames).
"""

from __future__ import annotations

import polars as pl

from traceinsight.model.schema import CALLCHAIN_SCHEMA, conform_side, empty_callchains
from traceinsight.parsers.nsys.db import Db, Rows
from traceinsight.parsers.nsys.tables import packed_pid

FRAME_SCHEMA = {"id": pl.Int64, "depth": pl.Int32, "symbol_id": pl.Int64, "module_id": pl.Int64}
FRAME_COLS = ["id", "stackDepth", "symbol", "module"]
EVENT_SCHEMA = {"start_ns": pl.Int64, "end_ns": pl.Int64, "gtid": pl.Int64, "ref": pl.Int64}
SOURCES = ("cuda_api", "osrt", "sampling")  # also the order chains' ids are offset in
# frames kept of a sample between CUDA calls, from the innermost: the function and its callers up
# to the user's code (nsys records 5-8 on the audited exports; its default limit is 128)
CPU_SAMPLE_DEPTH_KEPT = 24
# at most this many such samples, every n-th in time where there are more (a long capture at
# nsys's 1 kHz default: a share of each gap's samples stays, the table bounded)
CPU_SAMPLES_KEPT = 100_000


class Pending:
    """The fetches of one export's backtrace tables, queued on the Db's threads."""

    def __init__(self, db: Db) -> None:
        self.parts: dict[str, tuple[Rows, Rows]] = {}
        rt, cc = db.table("CUPTI_ACTIVITY_KIND_RUNTIME"), db.table("CUDA_CALLCHAINS")
        if rt and cc and "callchainId" in db.columns(rt):
            self.parts["cuda_api"] = (
                db.query(
                    ["start", "end", "globalTid", "callchainId", "nameId"],
                    rt,
                    {**EVENT_SCHEMA, "name_id": pl.Int64},
                    "callchainId IS NOT NULL",
                ),
                db.query(FRAME_COLS, cc, FRAME_SCHEMA),
            )
        ot, oc = db.table("OSRT_API"), db.table("OSRT_CALLCHAINS")
        if ot and oc and "callchainId" in db.columns(ot):
            self.parts["osrt"] = (
                db.query(
                    ["start", "end", "globalTid", "callchainId"],
                    ot,
                    EVENT_SCHEMA,
                    "callchainId IS NOT NULL AND callchainId > 0",
                ),
                db.query(FRAME_COLS, oc, FRAME_SCHEMA),
            )
        ct, sc = db.table("COMPOSITE_EVENTS"), db.table("SAMPLING_CALLCHAINS")
        if ct and sc and {"id", "start", "globalTid"} <= db.columns(ct):
            self.parts["sampling"] = (
                db.query(["start", "start", "globalTid", "id"], ct, EVENT_SCHEMA),
                db.query(FRAME_COLS, sc, FRAME_SCHEMA),
            )
        self.offset_ns = db.offset_ns

    def result(self, strings: pl.DataFrame, api_calls: pl.DataFrame) -> pl.DataFrame:
        """The side table, without rank (the caller adds it from ``gpid``). ``api_calls``: the
        CUDA API calls (start_ns, end_ns, gpid, tid) the samples are kept inside of."""
        out = []
        base = 0
        for source in SOURCES:
            if source not in self.parts:
                continue
            events, frames = (p.result() for p in self.parts[source])
            events = events.with_columns(
                pl.col("start_ns") + self.offset_ns, pl.col("end_ns") + self.offset_ns
            ).drop_nulls(["start_ns", "end_ns", "ref"])
            if source == "cuda_api":
                events = events.with_columns(pl.col("ref") + _cuda_offset(events, frames, strings))
            parts = [(source, events)]
            if source == "sampling":
                inside, between = _by_calls(events, api_calls)
                parts = [(source, inside), ("cpu_sample", between)]
            for name, part in parts:
                kept = (
                    frames.filter(pl.col("depth") < CPU_SAMPLE_DEPTH_KEPT)
                    if (name == "cpu_sample")
                    else frames
                )
                rows = _frames_of(part, kept, strings).with_columns(
                    pl.lit(name).alias("source"), (pl.col("chain") + base).alias("chain")
                )
                out.append(rows)
            base += int(frames.get_column("id").max() or 0) + 1
        if not out:
            return empty_callchains().with_columns(pl.lit(None, pl.Int64).alias("gpid"))
        return conform_side(
            pl.concat(out, how="diagonal_relaxed"), {**CALLCHAIN_SCHEMA, "gpid": pl.Int64()}
        )


def _frames_of(events: pl.DataFrame, frames: pl.DataFrame, strings: pl.DataFrame) -> pl.DataFrame:
    """One row per frame of each event's stack, symbols and modules resolved."""
    g = pl.col("gtid")
    ev = events.select(
        "start_ns",
        "end_ns",
        packed_pid(g).alias("pid"),
        (g & 0xFFFFFF).alias("tid"),
        (g // (1 << 24) * (1 << 24)).alias("gpid"),
        pl.col("ref").alias("chain"),
    )
    names = strings.rename({"sid": "_sid"})
    fr = (
        frames.join(names, left_on="symbol_id", right_on="_sid", how="left")
        .rename({"svalue": "symbol"})
        .join(names, left_on="module_id", right_on="_sid", how="left")
        .rename({"svalue": "module"})
        .select(pl.col("id").alias("chain"), "depth", "symbol", "module")
    )
    return ev.join(fr, on="chain", how="inner")


def _cuda_offset(events: pl.DataFrame, frames: pl.DataFrame, strings: pl.DataFrame) -> int:
    """0 or 1: what to add to ``callchainId`` to get the CUDA_CALLCHAINS id. nsys 2022.2 numbers
    the calls' chains from 0 and the table's from 1; decided by which offset puts the call's
    own API name (``cudaMemcpy`` for a ``cudaMemcpy_v3020`` call) on its stack more often."""
    api = strings.select(
        pl.col("sid").alias("name_id"), pl.col("svalue").str.replace(r"_v\d+$", "").alias("api")
    )
    calls = events.select("ref", "name_id").join(api, on="name_id").head(1000)
    syms = frames.join(strings, left_on="symbol_id", right_on="sid", how="left").select(
        "id", pl.col("svalue").alias("symbol")
    )
    hits = []
    for offset in (0, 1):
        matched = (
            calls.with_columns((pl.col("ref") + offset).alias("id"))
            .join(syms, on="id")
            .filter(pl.col("symbol") == pl.col("api"))
            .get_column("ref")
            .n_unique()
        )
        hits.append(matched)
    return 1 if hits[1] > hits[0] else 0


def _by_calls(samples: pl.DataFrame, calls: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The samples that fall inside a CUDA API call on their thread (the latest call started
    at or before the sample, and still running), and those between the calls of a thread that
    made any (at or after its first)."""
    if samples.height == 0 or calls.height == 0:
        return samples.head(0), samples.head(0)
    s = samples.sort("start_ns")
    c = calls.select(
        pl.col("start_ns").alias("call_start"), pl.col("end_ns").alias("call_end"), "gtid"
    ).sort("call_start")
    hit = s.join_asof(
        c, left_on="start_ns", right_on="call_start", by="gtid", check_sortedness=False
    )
    inside = pl.col("start_ns") < pl.col("call_end")
    between = hit.filter(pl.col("call_end").is_not_null() & ~inside)
    if between.height > CPU_SAMPLES_KEPT:
        between = between.gather_every(-(-between.height // CPU_SAMPLES_KEPT))
    return (
        hit.filter(inside).drop("call_start", "call_end"),
        between.drop("call_start", "call_end"),
    )


def api_calls(host: list[pl.DataFrame]) -> pl.DataFrame:
    """The CUDA API calls of the host frames, with their packed thread id (gpid + tid)."""
    calls = [
        f.filter(pl.col("kind").is_in(["runtime", "driver"])).select(
            "start_ns", "end_ns", (pl.col("gpid") + pl.col("tid")).alias("gtid")
        )
        for f in host
        if f.height and {"kind", "gpid", "tid"} <= set(f.columns)
    ]
    return (
        pl.concat(calls)
        if calls
        else pl.DataFrame(schema={"start_ns": pl.Int64, "end_ns": pl.Int64, "gtid": pl.Int64})
    )
