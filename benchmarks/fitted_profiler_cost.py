"""The third-party prediction table with the profiler's cost per event fitted to each recording's
own measured un-profiled step (session 47: tried, not adopted).

    python benchmarks/fitted_profiler_cost.py trace|fitted [LOOP ...]

``trace``: the cost the trace's no-work op shows (as the analysis runs); ``fitted``: each loop's
"before" recording at the multiple of it whose estimate lands on the step its own process ran
un-profiled just before the capture (``profiler_cost_factor.landing`` over its sweep, 0.8-2.5x;
outside it the trace's own). Prints each prediction against its measured band (``thirdparty_
predictions.rows``) and how many lie within ±25% of it (0.75 x low to 1.25 x high).
"""

from __future__ import annotations

import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

LOOPS = [
    "hf_trainer", "timm_jpeg", "launch_bound", "peft_lora", "lightning", "accelerate", "sbert",
    "vit_amp", "wav2vec2", "gnn", "dcgan", "word_lm", "nanogpt", "neural_style", "t5_course",
    "video_r2p1d", "whisper", "raft", "metrics",
]  # fmt: skip


def rows_at(args: tuple[str, float | None]) -> tuple[str, float | None, list[dict]]:
    """``thirdparty_predictions.rows(loop)`` with the per-event cost times ``factor`` (the
    worker's original function kept: a pool reuses its processes)."""
    loop, factor = args
    import thirdparty_predictions as tp

    import traceinsight.analyzers.replay as rp

    orig = rp.__dict__.setdefault("_trace_ns_per_event", rp.profiler_ns_per_event)
    f = 1.0 if factor is None else factor
    rp.profiler_ns_per_event = lambda ctx: int(orig(ctx) * f)
    return loop, factor, tp.rows(loop)


def main(argv: list[str]) -> int:
    import profiler_cost_factor as pcf
    from unprofiled_estimates import recordings

    mode, loops = (argv[0] if argv else "trace"), (argv[1:] or LOOPS)
    factors: dict[str, float | None] = {}
    if mode == "fitted":
        befores = {
            p.name.split(".")[0]: (p, own)
            for p, own, _ in recordings()
            if p.name.endswith(".before.pt.trace.json.xz")
        }
        todo = [lp for lp in loops if lp in befores]
        with ProcessPoolExecutor(2) as pool:
            swept = list(pool.map(pcf.sweep, [str(befores[lp][0]) for lp in todo]))
        factors = {lp: pcf.landing(s[2], befores[lp][1]) for lp, s in zip(todo, swept, strict=True)}
    with ProcessPoolExecutor(2) as pool:
        done = list(pool.map(rows_at, [(lp, factors.get(lp)) for lp in loops]))
    n = k = 0
    for loop, factor, rows in done:
        for r in rows:
            if r["predicted"] is None or r["measured"] is None:
                continue
            lo, hi = r["measured"]
            ok = 0.75 * lo <= r["predicted"] <= 1.25 * hi
            n, k = n + 1, k + ok
            f = "-" if factor is None else f"{factor:.2f}"
            print(
                f"{loop:13s} x{f:5s} {r['finding']:28s} {r['predicted']:.2f} "
                f"[{lo:.2f}-{hi:.2f}] {'' if ok else 'MISS'}"
            )
    print(f"within ±25% of the band: {k} of {n}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
