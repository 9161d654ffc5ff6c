"""Does a trace whose ``[memory]`` events are half of its events analyze within +30% of the same
trace without them?

    python benchmarks/memory_bench.py [--scale 4] [--repeat 3]

Builds two copies of df_index_resolver (``--scale`` times longer, steps repeated with shifted
times as bench.py does) under a temp dir: one with every ``[memory]`` instant removed, one with
allocation/free pairs added on the op threads (at each cpu_op's and runtime call's start and end,
one address per pair, the allocator's totals as running sums) until memory events are half of
all events. Times ``traceinsight analyze --no-html --json`` (fresh processes, medians) and
``load_trace`` alone, alternating the two files.
"""

from __future__ import annotations

import argparse
import gzip
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from bench import DF_INDEX, _shifted  # noqa: E402


def build(k: int, out: Path) -> tuple[Path, Path, dict[str, int]]:
    with gzip.open(DF_INDEX) as f:
        doc = orjson.loads(f.read())
    events = doc["traceEvents"]
    timed = [e for e in events if isinstance(e.get("ts"), (int, float)) and e.get("ph") != "M"]
    span = max(e["ts"] + e.get("dur", 0) for e in timed) - min(e["ts"] for e in timed) + 1000
    meta = [e for e in events if e.get("ph") == "M"]
    body = [
        e for i in range(k) for e in _shifted([e for e in events if e.get("ph") != "M"], i, span)
    ]
    plain = [e for e in body if e.get("name") != "[memory]"]
    mem = [e for e in body if e.get("name") == "[memory]"]
    want = len(plain) - len(mem)  # memory events to add so they are half of all events
    extra: list[dict] = []
    addr = 1 << 40
    for e in plain:
        if len(extra) >= want:
            break
        if e.get("cat") not in ("cpu_op", "cuda_runtime") or not e.get("dur"):
            continue
        addr += 4096
        for ts, sign in ((e["ts"] + 0.001, 1), (e["ts"] + max(0.002, e["dur"] - 0.001), -1)):
            extra.append(
                {
                    "ph": "i",
                    "cat": "cpu_instant_event",
                    "s": "t",
                    "name": "[memory]",
                    "pid": e["pid"],
                    "tid": e["tid"],
                    "ts": ts,
                    "args": {
                        "Device Type": 1,
                        "Device Id": 0,
                        "Addr": addr,
                        "Bytes": sign * 1_048_576,
                    },
                }
            )
    allocs = sorted(mem + extra[:want], key=lambda e: e["ts"])
    total = 5_000_000_000
    for e in allocs:
        total += e["args"]["Bytes"]
        e["args"] = {**e["args"], "Total Allocated": total, "Total Reserved": 12_782_141_440}
    with_mem, without = out / "with_memory.json.gz", out / "without_memory.json.gz"
    for path, evs in ((with_mem, meta + plain + allocs), (without, meta + plain)):
        with gzip.open(path, "wb", compresslevel=1) as f:
            f.write(orjson.dumps({**doc, "traceEvents": evs}))
    return with_mem, without, {"events": len(plain), "memory_events": len(allocs)}


def timed(cmd: list[str]) -> float:
    t = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True)
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scale", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="ti-membench-") as tmp:
        with_mem, without, counts = build(a.scale, Path(tmp))
        print(
            f"{counts['events']:,} events; with memory: {counts['memory_events']:,} [memory] events more"
        )
        load = "import sys; from traceinsight.parsers import load_trace; load_trace(sys.argv[1])"
        res: dict[str, dict[str, list[float]]] = {"analyze": {}, "load": {}}
        for _ in range(a.repeat):
            for p in (without, with_mem):
                out = Path(tmp) / "o.json"
                res["analyze"].setdefault(p.name, []).append(
                    timed(
                        [
                            "traceinsight",
                            "analyze",
                            str(p),
                            "--no-html",
                            "-q",
                            "--json",
                            str(out),
                            "--force",
                        ]
                    )
                )
                res["load"].setdefault(p.name, []).append(
                    timed([sys.executable, "-c", load, str(p)])
                )
        for what, by in res.items():
            a0 = statistics.median(by[without.name])
            a1 = statistics.median(by[with_mem.name])
            print(
                f"{what:8s} without {a0:6.2f} s  with {a1:6.2f} s  change {100 * (a1 / a0 - 1):+.0f}%  runs {by}"
            )


if __name__ == "__main__":
    main()
