"""Wall time and peak memory of ``traceinsight analyze`` on real traces (medians of N runs).

    python benchmarks/bench.py [--repeat 3] [--scale 10] [TRACE ...]

Each run is a fresh process (``python -m traceinsight analyze ... --no-html``, plus one run with
HTML) so peak RSS is the whole pipeline's. ``--scale K`` builds a K-times longer copy of
df_index_resolver (steps repeated with shifted timestamps and offset correlation/external ids)
under benchmarks/data/ first. Prints a table; record results in benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import gzip
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "traces"
DEFAULT = [
    SHARED / "hta" / "df_index_resolver" / "df_index_resolver.json.gz",
    SHARED / "hta" / "mtia_trace_single_rank" / "mtia_rank_0.json.gz",
    SHARED / "nsys" / "nsys-ai__mfu_2gpu_after.sqlite",
    ROOT / "fixtures" / "h200" / "healthy_bf16.pt.trace.json.gz",
]


def scaled(src: Path, k: int) -> Path:
    out = ROOT / "benchmarks" / "data" / f"{src.name.split('.')[0]}_x{k}.json.gz"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    doc = orjson.loads(gzip.decompress(src.read_bytes()))
    events = doc["traceEvents"]
    ts = [e["ts"] for e in events if e.get("ph") == "X" and isinstance(e.get("ts"), (int, float))]
    span = max(ts) - min(ts) + 1000
    big = []
    for i in range(k):
        for e in events:
            e2 = dict(e)
            if isinstance(e2.get("ts"), (int, float)):
                e2["ts"] = e2["ts"] + i * span
            args = e2.get("args")
            if isinstance(args, dict):
                args = dict(args)
                for key in ("correlation", "External id", "external id"):
                    if isinstance(args.get(key), int) and args[key] > 0:
                        args[key] = args[key] + i * 10_000_000
                e2["args"] = args
            if e2.get("ph") in ("s", "f") and isinstance(e2.get("id"), int):
                e2["id"] = e2["id"] + i * 10_000_000
            if isinstance(e2.get("name"), str) and e2["name"].startswith("ProfilerStep#"):
                e2["name"] = f"ProfilerStep#{i}_{e2['name'][13:]}"
            big.append(e2)
    doc["traceEvents"] = big
    out.write_bytes(gzip.compress(orjson.dumps(doc), compresslevel=1))
    return out


def run_once(trace: Path, html: bool) -> tuple[float, float]:
    cmd = [sys.executable, "-m", "traceinsight", "analyze", str(trace), "-q", "--force"]
    cmd += ["-o", "/tmp/_bench.html"] if html else ["--no-html"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True)
    wall = time.perf_counter() - t0
    peak_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return wall, max(peak_kb, before) / 1024  # MiB (max over children so far: run small->large)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("traces", nargs="*", type=Path)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--scale", type=int, default=0, help="also build and run a K-times longer df_index_resolver")
    args = ap.parse_args()
    traces = [p for p in (args.traces or DEFAULT) if p.exists()]
    if args.scale:
        traces.append(scaled(DEFAULT[0], args.scale))
    print(f"{'trace':48s} {'size MB':>8s} {'wall s (no html)':>17s} {'wall s (html)':>14s} {'peak MiB':>9s}")
    for t in sorted(traces, key=lambda p: p.stat().st_size):
        walls = [run_once(t, False)[0] for _ in range(args.repeat)]
        w_html, peak = run_once(t, True)
        size = t.stat().st_size / 1e6
        print(f"{t.name[:48]:48s} {size:8.1f} {statistics.median(walls):17.2f} {w_html:14.2f} {peak:9.0f}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("POLARS_MAX_THREADS", "2")
    raise SystemExit(main())
