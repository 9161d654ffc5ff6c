"""Where an ``analyze`` run's memory peaks: RSS sampled every few ms beside phase markers.

    python benchmarks/memory_timeline.py TRACE [--no-html] [--every-ms 2] [--csv OUT]

Runs ``traceinsight analyze TRACE`` in this process (the command's own path: allocator settings,
parse helpers, analyzers on two threads, HTML) with the parse's and the analysis' stages
wrapped, and a thread reading /proc/self/statm. Prints each stage's RSS at entry and exit and
its highest sample, the peak (VmHWM, the kernel's own) and the stage that was running then.
Stages nest (the parse holds the decode and the table's conform; the analyzers run inside
``run_analyzers`` two at a time), so the innermost stage running at the peak is named.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import threading
import time
from pathlib import Path

PAGE = os.sysconf("SC_PAGE_SIZE")
MARKS: list[tuple[float, str, str]] = []  # (t, "+"/"-", stage)
SAMPLES: list[tuple[float, int]] = []  # (t, rss bytes)
T0 = time.perf_counter()


def _rss() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * PAGE


def _sampler(stop: threading.Event, every_s: float) -> None:
    while not stop.is_set():
        SAMPLES.append((time.perf_counter() - T0, _rss()))
        time.sleep(every_s)


def _mark(sign: str, name: str) -> None:
    MARKS.append((time.perf_counter() - T0, sign, name))
    SAMPLES.append((MARKS[-1][0], _rss()))


def _wrapped(fn, name: str):
    @functools.wraps(fn)
    def inner(*a, **k):
        _mark("+", name)
        try:
            return fn(*a, **k)
        finally:
            _mark("-", name)

    return inner


def _patch(module: object, attr: str, name: str) -> None:
    setattr(module, attr, _wrapped(getattr(module, attr), name))


def _instrument() -> None:
    import traceinsight.analysis as analysis
    import traceinsight.analyzers as analyzers
    import traceinsight.api as api
    import traceinsight.parsers.kineto as kineto
    import traceinsight.pipeline as pipeline
    import traceinsight.report.html as html
    from traceinsight.parsers.kineto import stream

    _patch(api, "load_trace", "parse")
    _patch(stream, "decode_path", "parse.decode")
    _patch(stream, "_finish", "parse.decode.finish")
    for attr in ("conform", "conform_taking"):  # the name differs between versions
        if hasattr(kineto, attr):
            _patch(kineto, attr, "parse.conform")
    _patch(kineto, "_side_args", "parse.side_args")
    _patch(kineto, "_with_copy_kinds", "parse.copy_kinds")
    _patch(kineto, "mark_comm_by_launcher", "parse.comm_by_launcher")
    _patch(kineto, "add_kernel_class", "parse.kernel_class")
    _patch(pipeline, "build_context", "context")
    _patch(pipeline, "run_analyzers", "analyzers")
    for table in (analyzers.ANALYZERS, analyzers.OPTIONAL, analyzers.DERIVED):
        for key, fn in list(table.items()):
            table[key] = _wrapped(fn, f"analyzers.{key}")
    _patch(analysis.TraceAnalysis, "to_json", "to_json")
    _patch(html, "render", "html")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("trace", type=Path)
    ap.add_argument("--no-html", action="store_true")
    ap.add_argument("--every-ms", type=float, default=2.0)
    ap.add_argument("--csv", type=Path, help="write the samples and marks here")
    args = ap.parse_args()
    from traceinsight.runtime import configure_single_trace_process

    # as the command does, before polars loads (its allocator reads the setting once)
    configure_single_trace_process(args.trace.stat().st_size)
    _mark("+", "import")
    import traceinsight.cli as cli

    _instrument()
    _mark("-", "import")
    stop = threading.Event()
    th = threading.Thread(target=_sampler, args=(stop, args.every_ms / 1000), daemon=True)
    th.start()
    out = ["--no-html"] if args.no_html else ["-o", "/tmp/_memory_timeline.html"]
    sys.argv = ["traceinsight", "analyze", str(args.trace), "-q", "--force", *out]
    t_run = time.perf_counter()
    code = cli.main()  # not entry_point: it ends the process at once
    if code:
        return code
    wall = time.perf_counter() - t_run
    stop.set()
    th.join()
    with open("/proc/self/status") as fh:
        hwm = next(int(x.split()[1]) * 1024 for x in fh if x.startswith("VmHWM:"))
    _report(hwm, wall)
    if args.csv:
        with open(args.csv, "w") as fh:
            fh.write("t_s,rss_mb,mark\n")
            rows = [(t, f"{r / 1e6:.1f}", "") for t, r in SAMPLES]
            rows += [(t, "", f"{s}{n}") for t, s, n in MARKS]
            for t, r, m in sorted(rows):
                fh.write(f"{t:.4f},{r},{m}\n")
    return 0


def _report(hwm: int, wall: float) -> None:
    samples = sorted(SAMPLES)
    spans: dict[str, list[float]] = {}
    opened: dict[str, float] = {}
    for t, sign, name in MARKS:
        if sign == "+":
            opened[name] = t
        elif name in opened:
            spans.setdefault(name, []).extend((opened.pop(name), t))

    def rss_at(t: float) -> int:
        best = min(samples, key=lambda s: abs(s[0] - t))
        return best[1]

    print(
        f"{'stage':32s} {'start s':>8s} {'end s':>8s} {'in MB':>7s} {'out MB':>7s} {'max MB':>7s}"
    )
    for name, ts in sorted(spans.items(), key=lambda kv: kv[1][0]):
        for lo, hi in zip(ts[::2], ts[1::2], strict=True):
            inside = [r for t, r in samples if lo <= t <= hi] or [rss_at(lo)]
            print(
                f"{name:32s} {lo:8.3f} {hi:8.3f} {rss_at(lo) / 1e6:7.0f} {rss_at(hi) / 1e6:7.0f}"
                f" {max(inside) / 1e6:7.0f}"
            )
    t_peak, r_peak = max(samples, key=lambda s: s[1])
    running = [
        n
        for n, ts in spans.items()
        for lo, hi in zip(ts[::2], ts[1::2], strict=True)
        if lo <= t_peak <= hi
    ]
    print(
        f"peak: VmHWM {hwm / 1e6:.0f} MB; highest sample {r_peak / 1e6:.0f} MB at {t_peak:.3f} s "
        f"in {', '.join(sorted(running, key=len)) or '-'}; analyze wall {wall:.2f} s"
    )


if __name__ == "__main__":
    raise SystemExit(main())
