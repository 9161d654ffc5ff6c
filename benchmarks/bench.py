"""Wall time and peak memory of ``traceinsight analyze`` vs the peer, medians of N fresh runs.

    python benchmarks/bench.py [--repeat 3] [--scale 10] [--hta] [--hta-repeat N] [--floor]
        [--layouts lines,compact,indent] [--scaled-only] [--idle] [TRACE ...]

Every run is a fresh process timed by ``/usr/bin/time`` (wall seconds, peak RSS). ``--scale K``
builds a K-times longer copy of df_index_resolver under benchmarks/data/ (steps repeated with
shifted timestamps and offset correlation/external/flow ids) in each of ``--layouts``: kineto's
one event per line, compact single-line JSON (what json.dump, trace filters and merging
scripts write) and indented JSON; ``--scaled-only`` times only those. ``--hta`` installs the peer
(PyPI ``traceinsight==0.6.1``, import ``hta``) into its own venv under benchmarks/data/ and runs
load + temporal + idle + overlap + kernel breakdown on the same files (benchmarks/hta_run.py),
in the same rounds as ours (ours, the floor, the peer): the speedup is also given as the median
of each round's pair, which a drift of the machine's speed between rounds does not skew.
"""

from __future__ import annotations

import argparse
import gzip
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "benchmarks" / "data"
SHARED = ROOT.parent / "shared" / "traces"
DF_INDEX = SHARED / "hta" / "df_index_resolver" / "df_index_resolver.json.gz"
DEFAULT = [
    DF_INDEX,
    SHARED / "hta" / "mtia_trace_single_rank" / "mtia_rank_0.json.gz",
    SHARED / "nsys" / "nsys-ai__mfu_2gpu_after.sqlite",
    ROOT / "fixtures" / "h200" / "healthy_bf16.pt.trace.json.xz",
]


def _shifted(events: list, i: int, span: float):
    for e in events:
        e2 = dict(e)
        if isinstance(e2.get("ts"), (int, float)) and e2.get("ph") != "M":
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
        name = e2.get("name")
        if isinstance(name, str) and name.startswith("ProfilerStep#"):
            e2["name"] = f"ProfilerStep#{i * 1000 + int(name[13:] or 0)}"
        yield e2


LAYOUTS = ("lines", "compact", "indent")


def _dump(obj: object, layout: str, depth: int) -> bytes:
    """One value in ``layout``: kineto's one event per line, json.dump's compact single line
    (orjson: no spaces at all), or json.dump(indent=2)'s pretty print at ``depth``."""
    if layout != "indent":
        return orjson.dumps(obj)
    pad = b"\n" + b"  " * depth  # JSON strings hold no raw newline: every newline is layout
    return orjson.dumps(obj, option=orjson.OPT_INDENT_2).replace(b"\n", pad)


def scaled(src: Path, k: int, layout: str = "lines") -> Path:
    """K shifted copies of ``src``'s events, streamed to a gzip file in ``layout`` (see
    :func:`_dump`), holding only the original events in memory."""
    suffix = "" if layout == "lines" else f"_{layout}"
    out = DATA / f"{src.name.split('.')[0]}_x{k}{suffix}.json.gz"
    if out.exists():
        return out
    DATA.mkdir(parents=True, exist_ok=True)
    from traceinsight.parsers.source import read_bytes

    doc = orjson.loads(read_bytes(src)[0])  # gzip (the corpus) or xz (the fixtures)
    events = doc.pop("traceEvents")
    ts = [e["ts"] for e in events if e.get("ph") == "X" and isinstance(e.get("ts"), (int, float))]
    span = max(ts) - min(ts) + 1000
    sep, lead, close = {
        "lines": (b",\n  ", b',\n"traceEvents": [\n  ', b"\n]}\n"),
        "compact": (b",", b',"traceEvents":[', b"]}"),
        "indent": (b",\n    ", b',\n  "traceEvents": [\n    ', b"\n  ]\n}"),
    }[layout]
    tmp = out.with_suffix(".partial")
    with gzip.open(tmp, "wb", compresslevel=1) as fh:
        fh.write(_dump(doc, layout, 0)[:-1].rstrip() + lead)
        first = True
        for i in range(k):
            for e in _shifted(events, i, span):
                fh.write((b"" if first else sep) + _dump(e, layout, 2))
                first = False
        fh.write(close)
    tmp.rename(out)
    return out


def _tree_pss_kib(root: int) -> int:
    """Proportional set size of ``root`` and all its descendants (shared pages, like the parse
    spool mapped by helper processes, are split between them rather than counted twice). Walks
    /proc/PID/task/TID/children, so a sample costs well under a millisecond."""
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        try:
            for task in Path(f"/proc/{pid}/task").iterdir():
                todo.extend(int(c) for c in (task / "children").read_text().split())
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1])
                    break
        except OSError:
            pass
    return total


IDLE = {"wait": False}  # --idle: each run starts only once the machine's cores are idle


def _idle_cores(seconds: float = 1.0) -> float:
    """How many cores were idle over the last ``seconds`` (from /proc/stat)."""

    def snap() -> tuple[int, int]:
        with open("/proc/stat") as fh:
            v = [int(x) for x in fh.readline().split()[1:]]
        return v[3] + v[4], sum(v)

    i0, t0 = snap()
    time.sleep(seconds)
    i1, t1 = snap()
    return (os.cpu_count() or 1) * (i1 - i0) / max(1, t1 - t0)


def _wait_idle() -> None:
    """Other agents share this machine: ours needs both cores, the floor one, so a row taken
    while something else runs compares nothing. Wait (up to 10 min) for a quiet second."""
    deadline = time.monotonic() + 600
    while IDLE["wait"] and time.monotonic() < deadline:
        if _idle_cores() >= 0.92 * (os.cpu_count() or 1):
            return


def timed(cmd: list[str]) -> tuple[float, float]:
    """(wall seconds, peak memory MiB) of one fresh process: the larger of its own peak RSS
    (from the kernel, exact) and the peak PSS summed over it and its helper processes (sampled
    every second; reading smaps costs the machine a little, so not more often)."""
    _wait_idle()
    with tempfile.NamedTemporaryFile("r", suffix=".time") as tf:
        proc = subprocess.Popen(
            ["/usr/bin/time", "-o", tf.name, "-f", "%e %M", *cmd], stdout=subprocess.DEVNULL
        )
        peak_tree = 0
        while True:
            peak_tree = max(peak_tree, _tree_pss_kib(proc.pid))
            try:
                proc.wait(timeout=1.0)
                break
            except subprocess.TimeoutExpired:
                continue
        if proc.returncode:
            raise subprocess.CalledProcessError(proc.returncode, cmd)
        wall, kb = tf.read().split()  # the command's own wall time, as /usr/bin/time measured it
    return float(wall), max(int(kb), peak_tree) / 1024


FLOOR_SCRIPT = """
import sys, time, zlib, msgspec
from typing import Any, Optional
class A(msgspec.Struct, gc=False):
    device: Any = None; stream: Any = None; correlation: Any = None; bytes: Any = None
    ext: Any = msgspec.field(default=None, name="External id")
class E(msgspec.Struct, gc=False):
    ph: Any = None; cat: Any = None; name: Any = None; pid: Any = None; tid: Any = None
    ts: Any = None; dur: Any = None; args: Optional[A] = None
class D(msgspec.Struct):
    traceEvents: list[E] = []
raw = open(sys.argv[1], "rb").read()
t0 = time.perf_counter()
data = zlib.decompress(raw, wbits=47) if raw[:2] == b"\\x1f\\x8b" else raw
t1 = time.perf_counter()
doc = msgspec.json.decode(data, type=D)
t2 = time.perf_counter()
print(t1 - t0, t2 - t1)
"""


ANALYZE = ["-q", "--force", "-o", "/tmp/_bench.html"]


def floor(trace: Path) -> tuple[float, float]:
    """The issue's floor on this machine: (gunzip s, typed decode s) of the whole document in
    one process, every event's declared fields into msgspec structs and nothing else."""
    _wait_idle()
    out = subprocess.run(
        [sys.executable, "-c", FLOOR_SCRIPT, str(trace)], capture_output=True, text=True, check=True
    )
    gz, dec = (float(x) for x in out.stdout.split())
    return gz, dec


def hta_python() -> str:
    venv = DATA / "hta-venv"
    py = venv / "bin" / "python"
    if not py.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(py), "-m", "pip", "install", "-q", "traceinsight==0.6.1"], check=True)
    return str(py)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("traces", nargs="*", type=Path)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--scale", type=int, default=0)
    ap.add_argument("--hta", action="store_true")
    ap.add_argument(
        "--hta-repeat", type=int, default=0, help="runs of the peer per trace (default: --repeat)"
    )
    ap.add_argument(
        "--floor", action="store_true", help="also time gunzip + typed decode (the floor)"
    )
    ap.add_argument(
        "--layouts",
        default=",".join(LAYOUTS),
        help="layouts of the --scale trace, comma-separated (default: all: %(default)s)",
    )
    ap.add_argument(
        "--scaled-only", action="store_true", help="only the --scale traces, not the default set"
    )
    ap.add_argument(
        "--idle", action="store_true", help="start each run only once every core is idle"
    )
    args = ap.parse_args()
    IDLE["wait"] = args.idle
    traces = [] if args.scaled_only else [p for p in (args.traces or DEFAULT) if p.exists()]
    bigs: list[Path] = []
    if args.scale:
        bigs = [scaled(DF_INDEX, args.scale, layout) for layout in args.layouts.split(",")]
        names = {b.resolve() for b in bigs}
        traces = [t for t in traces if t.resolve() not in names] + bigs  # named too: once
    hpy = hta_python() if args.hta else None
    print(
        f"{'trace':34s} {'MB gz':>6s} | {'ours s':>7s} {'ours MiB':>8s} {'no-html':>7s} | {'HTA s':>7s} {'HTA MiB':>8s} {'speedup':>7s}"
    )
    for t in sorted(traces, key=lambda p: p.stat().st_size if p not in bigs else 1 << 62):
        # the target is the full analyze (parse, analyzers, findings, HTML): that is the median;
        # one run without the HTML report shows what rendering costs
        # the floor is timed right after each of our runs: pairs side by side, so the ratio
        # of each pair holds even while other work on the machine comes and goes
        # the peer runs in the same rounds (ours, the floor, the peer), so a slow phase of the
        # machine slows both sides of a round's pair: the speedup is the median of the pairs
        peer = bool(hpy) and t.suffix != ".sqlite"
        hta_n = (args.hta_repeat or args.repeat) if peer else 0
        ours, floors, runs = [], [], []
        with tempfile.TemporaryDirectory() as d:
            if peer:
                shutil.copy(t, Path(d) / t.name)
            for i in range(max(args.repeat, hta_n)):
                if i < args.repeat:
                    ours.append(
                        timed([sys.executable, "-m", "traceinsight", "analyze", str(t), *ANALYZE])
                    )
                    if args.floor and t.suffix != ".sqlite":
                        floors.append(floor(t))
                if i < hta_n:
                    runs.append(timed([str(hpy), str(ROOT / "benchmarks" / "hta_run.py"), d]))
        bare = timed([sys.executable, "-m", "traceinsight", "analyze", str(t), "-q", "--no-html"])
        w = statistics.median(x[0] for x in ours)
        m = statistics.median(x[1] for x in ours)
        hta_cols = ""
        if runs:
            hw = statistics.median(x[0] for x in runs)
            hm = statistics.median(x[1] for x in runs)
            pairs = statistics.median(h[0] / o[0] for h, o in zip(runs, ours, strict=False))
            hta_cols = f"{hw:7.2f} {hm:8.0f} {hw / w:6.1f}x (pairs {pairs:.1f}x)"
        floor_cols = ""
        if floors:
            gz = statistics.median(f[0] for f in floors)
            dec = statistics.median(f[1] for f in floors)
            pair = statistics.median(o[0] / sum(f) for o, f in zip(ours, floors, strict=True))
            floor_cols = (
                f" | floor {gz:.2f}+{dec:.2f}={gz + dec:.2f} s, ours/floor {w / (gz + dec):.2f}"
                f" (median of pairs {pair:.2f})"
            )
            if hta_cols:  # the 20x against the peer, beside the floor
                floor_cols += f"; 20x needs {hw / 20:.2f} s"
        print(
            f"{t.name[:34]:34s} {t.stat().st_size / 1e6:6.1f} | {w:7.2f} {m:8.0f} {bare[0]:7.2f} | {hta_cols}{floor_cols}"
            f"; load {os.getloadavg()[0]:.1f}",  # other work on the machine: how far to trust the row
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
