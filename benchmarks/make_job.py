"""Generate an N-rank job directory from real rank traces, with a planted straggler.

    python benchmarks/make_job.py OUTDIR --ranks 16 [--straggler R] [--factor 2.0]
        [--base fixtures/h200/ddp_overlap] [--max-offset-us 20] [--seed 0] [--repeat K]
        [--threads 2]

Each rank is a copy of a base rank file (the ``--base`` files in turn; default rank 0 of the
balanced H200 DDP recording) with its timeline changed, written as valid gzipped Kineto JSON
with its rank and the world size in ``distributedInfo``:

* every event of rank r is shifted by a per-rank offset (uniform in [0, max-offset), seeded);
* the straggler's time from each GPU step's start (the ``ProfilerStep#N`` GPU annotation) to the
  step's first collective kernel (forward and the first backward bucket) is stretched by
  ``factor``: it reaches that collective ``L = (factor - 1) x that span`` late;
* every other rank waits for it there: its first collective of the step keeps its start and ends
  ``L`` later, and everything after it in the step moves ``L`` later (its GPU kernels keep their
  durations), as NCCL's spin and the stream order make happen; later steps move by the sum.

So each waiting rank's exposed wait per step is ``L`` (less the offsets' difference, at most
max-offset): the straggler should be named with ``wait_caused_ns / (N - 1)`` = the sum of ``L``.
With several bases (``--base fixtures/h200/ddp_overlap``) the ranks also keep their recordings'
own arrival differences: a rank on another base than the straggler's waits L plus or minus
those (on the two DDP ranks, -23% at factor 4), and below factor ~4 the natural waits outweigh
the planted ones.
``--repeat K`` makes each rank K times longer: the base's events K times over, each copy shifted
past the previous one's end with its ids offset and its steps renumbered (``bench.py``'s
``_shifted``, as ``--scale`` does), then planted as above, step by step (the default base at
K = 12: 150 MB of JSON and 467k events per rank). Every waiting rank of a base differs from the
others only by its offset, so their JSON is laid out once with a marker for each timestamp and
each rank is that layout with its own timestamps written in; ``--threads`` compress ranks in
parallel (zlib releases the GIL).
Prints what was planted (one JSON line, and ``planted.json`` beside the rank files, which the
analysis does not read).
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import orjson
import polars as pl
from bench import _shifted

from traceinsight.parsers.source import read_bytes

ROOT = Path(__file__).resolve().parents[1]
GPU_OPS = {"kernel", "gpu_memcpy", "gpu_memset"}  # keep their durations when moved
COLLECTIVE = "nccl"  # collective kernels by name (ncclDevKernel_*, ncclKernel_*)


def _rank_files(folder: Path) -> list[Path]:
    return [
        p for p in folder.iterdir() if p.name.endswith((".pt.trace.json.gz", ".pt.trace.json.xz"))
    ]


def _load(path: Path) -> dict[str, Any]:
    return orjson.loads(read_bytes(path)[0])  # gzip (the corpus) or xz (the fixtures)


def _tiled(doc: dict[str, Any], k: int) -> dict[str, Any]:
    """The recording ``k`` times over (its metadata events once), each copy 1 ms after the
    previous one's last event."""
    if k <= 1:
        return doc
    ev = doc["traceEvents"]
    meta = [e for e in ev if e.get("ph") == "M"]
    rest = [e for e in ev if e.get("ph") != "M"]
    timed = [e for e in rest if isinstance(e.get("ts"), (int, float))]
    lo = min(float(e["ts"]) for e in timed)
    hi = max(float(e["ts"]) + float(e.get("dur") or 0.0) for e in timed)
    span = hi - lo + 1000.0
    return dict(doc, traceEvents=meta + [e for i in range(k) for e in _shifted(rest, i, span)])


def _breakpoints(events: list[dict[str, Any]]) -> dict[int, tuple[float, float | None]]:
    """step -> (GPU step start, its first collective's start or None), in µs."""
    starts = {
        int(e["name"].split("#")[1]): float(e["ts"])
        for e in events
        if e.get("cat") == "gpu_user_annotation"
        and str(e.get("name", "")).startswith("ProfilerStep#")
    }
    coll = sorted(
        float(e["ts"])
        for e in events
        if e.get("cat") == "kernel" and COLLECTIVE in e.get("name", "").lower()
    )
    order = sorted(starts)
    out = {}
    for i, s in enumerate(order):
        end = starts[order[i + 1]] if i + 1 < len(order) else float("inf")
        inside = [c for c in coll if starts[s] <= c < end]
        out[s] = (starts[s], inside[0] if inside else None)
    return out


def _shift(
    x: pl.Series, bp: dict[int, tuple[float, float | None]], late: dict[int, float], stretch: float
) -> pl.Series:
    """The time each instant moves by: the earlier steps' lateness, plus within its step either
    the stretch (the straggler: ``stretch`` > 1) or the step's lateness from its first collective
    on (the others)."""
    steps = sorted(bp)
    done = [sum(late[t] for t in steps[:i]) for i in range(len(steps))]
    table = pl.DataFrame(
        {
            "lo": [bp[s][0] for s in steps],
            "c": [bp[s][1] if bp[s][1] is not None else bp[s][0] for s in steps],
            "late": [late[s] for s in steps],
            "done": done,
        },
        schema={"lo": pl.Float64, "c": pl.Float64, "late": pl.Float64, "done": pl.Float64},
    )
    df = (
        pl.DataFrame({"x": x, "i": pl.int_range(x.len(), eager=True)})
        .sort("x")
        .join_asof(table, left_on="x", right_on="lo", strategy="backward")
    )
    within = (
        (stretch - 1) * (pl.col("x") - pl.col("lo")).clip(0, pl.col("c") - pl.col("lo"))
        if stretch > 1
        else pl.when(pl.col("x") >= pl.col("c")).then(pl.col("late")).otherwise(0.0)
    )
    return df.sort("i").select((pl.col("done") + within).fill_null(0.0))["done"]


def _perturbed(
    doc: dict[str, Any],
    bp: dict[int, tuple[float, float | None]],
    late: dict[int, float],
    stretch: float,
    offset_us: float,
    rank: int,
    world: int,
) -> dict[str, Any]:
    ev = doc["traceEvents"]
    timed = [e for e in ev if "ts" in e]
    ts = pl.Series([float(e["ts"]) for e in timed], dtype=pl.Float64)
    dur = pl.Series([float(e.get("dur") or 0.0) for e in timed], dtype=pl.Float64)
    new_ts = ts + _shift(ts, bp, late, stretch)
    new_end = ts + dur + _shift(ts + dur, bp, late, stretch)
    firsts = {c for _, c in bp.values() if c is not None}
    done = 0.0
    before = {}  # first collective's start -> the lateness of the earlier steps
    for s in sorted(bp):
        if bp[s][1] is not None:
            before[bp[s][1]] = done
        done += late[s]
    out = []
    for e, t0, t1, t, d in zip(
        timed, new_ts.to_list(), new_end.to_list(), ts.to_list(), dur.to_list(), strict=True
    ):
        e = dict(e)
        if stretch <= 1 and e.get("cat") in GPU_OPS:
            if e.get("cat") == "kernel" and t in firsts and COLLECTIVE in e["name"].lower():
                t0 = t + before[t]  # launched on time: it waits for the straggler
            else:
                t1 = t0 + d  # moved, not stretched
        e["ts"] = round(float(t0) + offset_us, 3)
        if "dur" in e:
            e["dur"] = round(float(t1 - t0), 3)
        out.append(e)
    return dict(
        doc,
        traceEvents=[e for e in ev if "ts" not in e] + out,
        distributedInfo=_rank_info(doc, rank, world),
    )


TS_MARK = "@@ts@@"  # stands for each timestamp in a waiting rank's layout


def _layout(doc: dict[str, Any]) -> tuple[dict[str, Any], list[bytes], pl.Series]:
    """A rank's document as JSON around its timestamps: the document without its events, the
    events' JSON in pieces between the timestamps (one more than them), the timestamps in ns."""
    ev = doc["traceEvents"]
    ts_ns = pl.Series([round(float(e["ts"]) * 1e3) for e in ev if "ts" in e], dtype=pl.Int64)
    marked = [dict(e, ts=TS_MARK) if "ts" in e else e for e in ev]
    pieces = orjson.dumps(marked).split(orjson.dumps(TS_MARK))
    if len(pieces) != ts_ns.len() + 1:
        raise SystemExit(f"{TS_MARK!r} occurs in the base's own text")
    return {k: v for k, v in doc.items() if k != "traceEvents"}, pieces, ts_ns


def _write_layout(
    path: Path, head: dict[str, Any], pieces: list[bytes], ts_ns: pl.Series, offset_ns: int
) -> None:
    """The layout with this rank's timestamps (µs with three decimals, exact in ns)."""
    t = ts_ns + offset_ns
    text = ((t // 1000).cast(pl.Utf8) + "." + (t % 1000).cast(pl.Utf8).str.zfill(3)).to_list()
    body = [b""] * (2 * len(pieces) - 1)
    body[0::2] = pieces
    body[1::2] = [x.encode() for x in text]
    _write(path, head, b"".join(body))


def _write(path: Path, head: dict[str, Any], events_json: bytes) -> None:
    """A rank file: the document's other keys as Kineto writes them (``"rank": 3``, with the
    space: HTA finds a file's rank by that pattern), then its events, compact."""
    with gzip.open(path, "wb", compresslevel=1) as f:
        f.write(json.dumps(head)[:-1].encode() + b', "traceEvents": ')
        f.write(events_json)
        f.write(b"}")


def _rank_info(doc: dict[str, Any], rank: int, world: int) -> dict[str, Any]:
    info = dict(doc.get("distributedInfo") or {}, rank=rank, world_size=world)
    if info.get("pg_config"):
        info["pg_config"] = [
            dict(pg, pg_size=world, ranks=list(range(world))) for pg in info["pg_config"]
        ]
    return info


def make_job(
    out: Path,
    ranks: int,
    straggler: int,
    factor: float,
    bases: list[Path],
    max_offset_us: float = 20.0,
    seed: int = 0,
    repeat: int = 1,
    threads: int = 1,
) -> dict[str, Any]:
    files = sorted(p for b in bases for p in (_rank_files(b) if b.is_dir() else [b]))
    if not files:
        raise SystemExit(f"no *.pt.trace.json.gz or .xz under {[str(b) for b in bases]}")
    docs = [_tiled(_load(p), repeat) for p in files]
    bps = [_breakpoints(d["traceEvents"]) for d in docs]
    sb = bps[straggler % len(files)]
    late = {s: ((factor - 1) * (c - lo) if c is not None else 0.0) for s, (lo, c) in sb.items()}
    rng = random.Random(seed)
    offsets = [rng.uniform(0, max_offset_us) for _ in range(ranks)]
    out.mkdir(parents=True, exist_ok=True)

    def perturbed(i: int, stretch: float, offset_us: float, r: int) -> dict[str, Any]:
        bp = {s: bps[i][s] for s in late if s in bps[i]}
        return _perturbed(docs[i], bp, late, stretch, offset_us, r, ranks)

    def name(r: int) -> Path:
        return out / f"rank{r}.pt.trace.json.gz"

    # the straggler as it is; every other rank from its base's waiting layout (offset 0)
    late_doc = perturbed(straggler % len(files), factor, offsets[straggler], straggler)
    events = late_doc.pop("traceEvents")
    _write(name(straggler), late_doc, orjson.dumps(events))
    del late_doc, events
    layouts = {}
    for i in sorted({r % len(files) for r in range(ranks) if r != straggler}):
        layouts[i] = _layout(perturbed(i, 1.0, 0.0, 0))
    docs.clear()  # the layouts hold what the writers need

    def write(r: int) -> None:
        head, pieces, ts_ns = layouts[r % len(files)]
        head = dict(head, distributedInfo=_rank_info(head, r, ranks))
        _write_layout(name(r), head, pieces, ts_ns, round(offsets[r] * 1e3))

    with ThreadPoolExecutor(max(1, threads)) as pool:
        list(pool.map(write, [r for r in range(ranks) if r != straggler]))
    planted = {
        "ranks": ranks,
        "straggler": straggler,
        "factor": factor,
        "repeat": repeat,
        "late_per_step_ns": {str(s): round(v * 1e3) for s, v in late.items()},
        "late_total_ns": round(sum(late.values()) * 1e3),
        "max_offset_ns": round(max_offset_us * 1e3),
        "bases": [str(p.relative_to(ROOT) if p.is_relative_to(ROOT) else p) for p in files],
    }
    (out / "planted.json").write_text(json.dumps(planted, indent=1))
    return planted


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--ranks", type=int, default=16)
    ap.add_argument("--straggler", type=int, default=None, help="default: ranks // 3")
    ap.add_argument("--factor", type=float, default=2.0)
    ap.add_argument("--base", type=Path, action="append", help="a rank file or a directory of them")
    ap.add_argument("--max-offset-us", type=float, default=20.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=1, help="each rank K times the base's steps")
    ap.add_argument("--threads", type=int, default=1, help="ranks compressed in parallel")
    a = ap.parse_args(argv)
    straggler = a.ranks // 3 if a.straggler is None else a.straggler
    if not 0 <= straggler < a.ranks or a.factor <= 1:
        ap.error("--straggler must be a rank of the job and --factor > 1")
    bases = a.base or [ROOT / "fixtures" / "h200" / "ddp_overlap" / "rank0.pt.trace.json.xz"]
    planted = make_job(
        a.out, a.ranks, straggler, a.factor, bases, a.max_offset_us, a.seed, a.repeat, a.threads
    )
    print(json.dumps(planted))
    return 0


if __name__ == "__main__":
    sys.exit(main())
