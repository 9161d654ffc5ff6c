"""The profiler's cost per event each recording needs (issue 37 item 2): for every third-party
recording with a same-process un-profiled measurement (as ``unprofiled_estimates.py`` finds them),
or for the traces named with their measured steps, the un-profiled step at the profiler's cost
per event swept over multiples of the trace's no-work op (``analyzers/replay.py``
``profiler_ns_per_event``), and the multiple whose step lands on the measured one.

    python benchmarks/profiler_cost_factor.py                 # every kept recording with truth
    python benchmarks/profiler_cost_factor.py TRACE:MS ...    # traces and their measured steps

A recording whose step does not move with the cost (bound by the GPU, its loader or its waits)
has no such multiple ("-"). Session 46's table in benchmarks/RESULTS.md came from this sweep:
0.87-2.32x over 28 recordings without Python stacks, 0.87-1.38x with them.
"""

from __future__ import annotations

import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

FACTORS = (0.8, 1.0, 1.2, 1.4, 1.6, 2.0, 2.5)


def sweep(trace: str) -> tuple[int, bool, list[float | None]]:
    """The no-work op's cost, whether Python frames were recorded, and the step (ms) at each of
    :data:`FACTORS`."""
    from traceinsight.analyzers.context import build_context
    from traceinsight.analyzers.replay import (
        analyze_replay,
        model_inputs,
        profiler_ns_per_event,
        unprofiled_steps_at,
    )
    from traceinsight.parsers import load_trace

    ctx = build_context(load_trace(trace))
    src = model_inputs(ctx)
    steps = unprofiled_steps_at(ctx, analyze_replay(ctx), FACTORS)
    frames = src is not None and src.python_frames.height > 0
    return profiler_ns_per_event(ctx), frames, [s / 1e6 if s else None for s in steps]


def landing(steps: list[float | None], measured: float) -> float | None:
    """The multiple whose step is ``measured``, interpolated between the two swept around it."""
    pts = [(f, s) for f, s in zip(FACTORS, steps, strict=True) if s is not None]
    for (fa, sa), (fb, sb) in zip(pts, pts[1:], strict=False):
        if sa != sb and (sa - measured) * (sb - measured) <= 0:
            return fa + (measured - sa) * (fb - fa) / (sb - sa)
    return None


def main(argv: list[str]) -> int:
    if argv:
        rows = [(Path(a.rsplit(":", 1)[0]), float(a.rsplit(":", 1)[1])) for a in argv]
    else:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from unprofiled_estimates import recordings

        rows = [(path, own) for path, own, _ in recordings()]
    with ProcessPoolExecutor(2) as pool:
        found = list(pool.map(sweep, [str(p) for p, _ in rows]))
    head = " | ".join(f"{f}x ms" for f in FACTORS)
    print(f"| recording | no-work op us | frames | measured ms | {head} | multiple |")
    print("|---" * (len(FACTORS) + 5) + "|")
    needed: dict[bool, list[float]] = {False: [], True: []}
    for (path, own), (per_event, frames, steps) in zip(rows, found, strict=True):
        hit = landing(steps, own)
        if hit is not None:
            needed[frames].append(hit)
        cells = " | ".join(f"{s:.2f}" if s else "-" for s in steps)
        name = path.name.removesuffix(".pt.trace.json.xz")
        print(
            f"| {name} | {per_event / 1e3:.2f} | {'yes' if frames else 'no'} | {own:.2f} "
            f"| {cells} | {f'{hit:.2f}' if hit is not None else '-'} |"
        )
    for frames, xs in needed.items():
        if xs:
            xs.sort()
            print(
                f"\n{'with' if frames else 'without'} Python frames: {len(xs)} recordings, the "
                f"multiple {xs[len(xs) // 2]:.2f} at the median ({xs[0]:.2f}-{xs[-1]:.2f})"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
