"""Generate an archive of N trace files for ``traceinsight batch``: real traces' variants in
mixed formats, with a planted share of broken files.

    python benchmarks/make_archive.py OUTDIR --items 10000 [--broken-ratio 0.02] [--per-dir 500]
        [--seed 0]

Each good item is a variant of one small real trace (``BASES``: H200 fixtures and corpus traces
as gzipped Kineto JSON, the tiny fixtures and a libkineto test trace as plain Kineto JSON, three
Nsight Systems SQLite exports from the shared corpus), chosen by weight, with its timeline
dilated by a factor in [0.97, 1.03] about its first event and shifted by up to 1 ms (every
event's start and duration: the order and the nesting stay, the step times change). The broken
items (``round(N x ratio)``, at seeded positions) cycle through five kinds: a gzip stream cut
in its first 160 bytes (no complete event to salvage), random bytes, an empty file, valid JSON
that is no trace, an SQLite file that is no Nsight Systems export. Every file's name is neutral
(``NNNNN_<base>.<suffix>``, no rank in it: no directory is taken for a job); OUTDIR/dNNN holds
``per-dir`` items each.

Prints what was planted as one JSON line (counts by format and by broken kind, the broken
files' paths) and writes it to ``OUTDIR/.planted.json`` (a hidden name: batch skips it).
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import shutil
import sqlite3
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from traceinsight.parsers.source import read_bytes

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "traces"
DILATION = 0.03  # the timeline is stretched or shrunk by up to 3%
MAX_SHIFT_NS = 1_000_000
BROKEN_KINDS = ("truncated_gzip", "garbage", "empty", "wrong_json", "non_trace_sqlite")


@dataclass(frozen=True)
class Base:
    path: Path
    fmt: str  # "kineto_gz" | "kineto_json" | "nsys_sqlite": what its variants are written as
    weight: float  # share of the good items drawn from it (relative)


# small traces (0.05-0.35 s of analysis each on one core), so 10,000 items stay within reach
BASES = (
    Base(ROOT / "fixtures/h200/h2d_pageable.pt.trace.json.xz", "kineto_gz", 1.0),
    Base(ROOT / "fixtures/h200/h2d_pinned.pt.trace.json.xz", "kineto_gz", 1.0),
    Base(ROOT / "fixtures/h200/launch_bound_cudagraph.pt.trace.json.xz", "kineto_gz", 1.0),
    Base(ROOT / "fixtures/corpus/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz", "kineto_gz", 2.0),
    Base(ROOT / "fixtures/corpus/torch_compile_triton_trace.json.gz", "kineto_gz", 2.0),
    Base(ROOT / "fixtures/corpus/inference_vllm_decode_full_graph_execution.json.gz", "kineto_gz", 1.0),
    Base(ROOT / "fixtures/tiny/comm_overlap.json", "kineto_json", 2.0),
    Base(ROOT / "fixtures/tiny/repeated_step_names.json", "kineto_json", 2.0),
    Base(ROOT / "fixtures/tiny/step_dataloader_sync.json", "kineto_json", 1.5),
    Base(ROOT / "fixtures/tiny/kineto_2026_shape.json", "kineto_json", 1.0),
    Base(ROOT / "fixtures/corpus/libkineto_test_after_fix_trace.json", "kineto_json", 2.0),
    Base(SHARED / "nsys/nsys-ai__healthy_1pct.sqlite", "nsys_sqlite", 1.0),
    Base(SHARED / "nsys/nsys-ai__mock.sqlite", "nsys_sqlite", 0.5),
    Base(SHARED / "nsys/NVIDIA_Fuser__f6ab0c34_report1.sqlite", "nsys_sqlite", 0.5),
)  # fmt: skip

SUFFIX = {
    "kineto_gz": ".pt.trace.json.gz",
    "kineto_json": ".pt.trace.json",
    "nsys_sqlite": ".sqlite",
}


def _stem(path: Path) -> str:
    """The base's name without its suffixes or a rank (``rank-34`` would make a directory a job)."""
    name = path.name.split(".")[0]
    return name.replace("rank-", "r").replace("rank", "r")


def _events(doc: Any) -> list[dict[str, Any]]:
    return doc["traceEvents"] if isinstance(doc, dict) else doc


def _kineto_variant(doc: Any, t0: float, factor: float, shift_us: float) -> bytes:
    """``doc``'s bytes with every event's ``ts`` moved to ``t0 + (ts - t0) x factor + shift``
    and its ``dur`` scaled (integers stay integers); ``doc`` is left as it was."""
    out = []
    for e in _events(doc):
        ts, dur = e.get("ts"), e.get("dur")
        if isinstance(ts, (int, float)) or isinstance(dur, (int, float)):
            e = dict(e)
            if isinstance(ts, int):
                e["ts"] = round(t0 + (ts - t0) * factor + shift_us)
            elif isinstance(ts, float):
                e["ts"] = round(t0 + (ts - t0) * factor + shift_us, 3)
            if isinstance(dur, int):
                e["dur"] = round(dur * factor)
            elif isinstance(dur, float):
                e["dur"] = round(dur * factor, 3)
        out.append(e)
    return orjson.dumps({**doc, "traceEvents": out} if isinstance(doc, dict) else out)


def _time_columns(con: sqlite3.Connection) -> dict[str, list[str]]:
    """Tables with event times (``start``/``end``/``timestamp`` columns, ns) and those columns."""
    cols: dict[str, list[str]] = {}
    for (table,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'"):
        names = [r[1] for r in con.execute(f'PRAGMA table_info("{table}")')]
        if times := [c for c in names if c in ("start", "end", "timestamp")]:
            cols[table] = times
    return cols


def _nsys_t0(path: Path) -> tuple[int, dict[str, list[str]]]:
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        cols = _time_columns(con)
        starts = [
            con.execute(f'SELECT MIN("{c[0]}") FROM "{t}"').fetchone()[0] for t, c in cols.items()
        ]
        return min((s for s in starts if s is not None), default=0), cols
    finally:
        con.close()


def _nsys_variant(
    src: Path, dest: Path, t0: int, cols: dict[str, list[str]], factor: float, shift_ns: int
) -> None:
    shutil.copyfile(src, dest)
    con = sqlite3.connect(dest, isolation_level=None)
    try:
        con.execute("PRAGMA journal_mode = OFF")
        con.execute("PRAGMA synchronous = OFF")
        con.execute("BEGIN")
        for table, times in cols.items():
            sets = ", ".join(
                f'"{c}" = {t0} + CAST(("{c}" - {t0}) * {factor!r} AS INTEGER) + {shift_ns}'
                for c in times
            )
            con.execute(f'UPDATE "{table}" SET {sets}')
        con.execute("COMMIT")
    finally:
        con.close()


def _non_trace_sqlite(tmp: Path) -> bytes:
    path = tmp / "people.sqlite"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE people (name TEXT, age INTEGER)")
    con.executemany("INSERT INTO people VALUES (?, ?)", [("ada", 36), ("alan", 41)])
    con.commit()
    con.close()
    return path.read_bytes()


WRONG_JSON = (
    b'{"metrics": {"loss": 0.25, "step": 10}}',  # an object without traceEvents
    b"[1, 2, 3]",  # an array of no events
    b'{"traceEvents": [{"foo": 1}, {"bar": 2}]}',  # events of no profiler category
)


def _broken(
    kind: int, n: int, rng: random.Random, gz: bytes, sqlite_bytes: bytes
) -> tuple[str, bytes]:
    """(suffix, bytes) of the ``n``-th broken file of its kind."""
    name = BROKEN_KINDS[kind]
    if name == "truncated_gzip":
        return ".pt.trace.json.gz", gz[: rng.randint(24, 160)]
    if name == "garbage":
        suffix = (".pt.trace.json", ".pt.trace.json.gz", ".sqlite")[n % 3]
        return suffix, rng.randbytes(rng.randint(256, 4096))
    if name == "empty":
        return (".pt.trace.json", ".pt.trace.json.gz", ".sqlite")[n % 3], b""
    if name == "wrong_json":
        return ".json", WRONG_JSON[n % len(WRONG_JSON)]
    return ".sqlite", sqlite_bytes


def make_archive(
    out: Path, items: int, broken_ratio: float = 0.02, per_dir: int = 500, seed: int = 0
) -> dict[str, Any]:
    """Write the archive under ``out`` (see the module docstring); what was planted."""
    rng = random.Random(seed)
    out.mkdir(parents=True, exist_ok=True)
    n_broken = round(items * broken_ratio)
    broken_at = set(rng.sample(range(items), n_broken))
    weights = [b.weight for b in BASES]
    docs: dict[Path, tuple[Any, float]] = {}
    nsys: dict[Path, tuple[int, dict[str, list[str]]]] = {}
    for b in BASES:
        if b.fmt == "nsys_sqlite":
            nsys[b.path] = _nsys_t0(b.path)
        else:
            doc = orjson.loads(read_bytes(b.path)[0])  # gzip, xz (the fixtures) or plain
            ts = [e["ts"] for e in _events(doc) if isinstance(e.get("ts"), (int, float))]
            docs[b.path] = (doc, min(ts))
    gz_bases = [b.path for b in BASES if b.fmt == "kineto_gz"]
    with tempfile.TemporaryDirectory() as tmp:
        sqlite_bytes = _non_trace_sqlite(Path(tmp))
    by_format: dict[str, int] = dict.fromkeys(SUFFIX, 0)
    by_kind: dict[str, int] = dict.fromkeys(BROKEN_KINDS, 0)
    broken: list[dict[str, str]] = []
    for i in range(items):
        d = out / f"d{i // per_dir:03d}"
        if i % per_dir == 0:
            d.mkdir(exist_ok=True)
        if i in broken_at:
            k = len(broken) % len(BROKEN_KINDS)
            src = rng.choice(gz_bases)
            suffix, data = _broken(k, by_kind[BROKEN_KINDS[k]], rng, src.read_bytes(), sqlite_bytes)
            path = d / f"{i:05d}_{_stem(src)}{suffix}"
            path.write_bytes(data)
            by_kind[BROKEN_KINDS[k]] += 1
            broken.append({"path": str(path), "kind": BROKEN_KINDS[k]})
            continue
        base = rng.choices(BASES, weights)[0]
        factor = 1.0 + rng.uniform(-DILATION, DILATION)
        shift_ns = rng.randrange(MAX_SHIFT_NS)
        path = d / f"{i:05d}_{_stem(base.path)}{SUFFIX[base.fmt]}"
        if base.fmt == "nsys_sqlite":
            t0, cols = nsys[base.path]
            _nsys_variant(base.path, path, t0, cols, factor, shift_ns)
        else:
            doc, t0 = docs[base.path]
            # Kineto times are µs (floats) in profiler traces; the tiny fixtures' integers too
            data = _kineto_variant(doc, t0, factor, shift_ns / 1000)
            path.write_bytes(gzip.compress(data, 1) if base.fmt == "kineto_gz" else data)
        by_format[base.fmt] += 1
    planted = {
        "items": items,
        "good": items - n_broken,
        "broken": n_broken,
        "by_format": by_format,
        "broken_by_kind": by_kind,
        "broken_files": broken,
        "seed": seed,
    }
    (out / ".planted.json").write_text(json.dumps(planted, indent=1))
    return planted


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("outdir", type=Path)
    ap.add_argument("--items", type=int, default=1000)
    ap.add_argument("--broken-ratio", type=float, default=0.02)
    ap.add_argument("--per-dir", type=int, default=500)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    t0 = time.perf_counter()
    planted = make_archive(a.outdir, a.items, a.broken_ratio, a.per_dir, a.seed)
    planted["seconds"] = round(time.perf_counter() - t0, 1)
    planted["bytes"] = sum(p.stat().st_size for p in a.outdir.rglob("*") if p.is_file())
    print(json.dumps(planted))
    return 0


if __name__ == "__main__":
    sys.exit(main())
