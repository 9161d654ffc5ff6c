"""The un-profiled step each profiled third-party recording predicts from, against the step its
own process ran un-profiled just before the capture (issue 37 item 2: within 10%).

    python benchmarks/unprofiled_estimates.py

For every ``*.truth.json`` under fixtures/h200/thirdparty and fixtures/h100/thirdparty (RAFT,
recorded on an H100: the H200s were not lent) and each profiled configuration whose
trace is kept (``LOOP.before`` for the baseline, ``LOOP.CONFIG.after`` for the others): the
estimate (``details.replay.unprofiled_step_ns``) and its low end, the same process's un-profiled
window mean, the fresh processes' range (A/B, ...) and estimate / own. Prints a count within 10%.
"""

from __future__ import annotations

import json
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
# the H200's loops, PPO profiled with stacks (session 56), the H100's
DIRS = (
    FIXTURES / "h200" / "thirdparty",
    FIXTURES / "h200" / "thirdparty" / "stack",
    FIXTURES / "h100" / "thirdparty",
)


def estimate(trace: str) -> tuple[float | None, float | None, float | None, float | None]:
    import traceinsight

    a = traceinsight.analyze(trace)
    r = a.results.replay
    ms = lambda ns: ns / 1e6 if ns else None  # noqa: E731
    high = r.unprofiled_step_ns  # the estimate: the range's upper end
    # where DataLoader workers kept up with the profiled step only, the summary's stated upper
    # end: the profiled step, up to which they may bound the un-profiled one (their rate is
    # not in the trace: findings/savings.py loader_unverified)
    shown = next(
        (
            f.evidence["loader_shown_interval_ns"]
            for f in a.findings
            if "loader_shown_interval_ns" in (f.evidence or {})
        ),
        None,
    )
    return ms(r.unprofiled_step_ns), ms(r.unprofiled_step_low_ns), ms(high), ms(shown)


def recordings() -> list[tuple[Path, float, tuple[float, float] | None]]:
    out = []
    for t in [t for d in DIRS for t in sorted(d.glob("*.truth.json"))]:
        src = t.parent
        truth = json.loads(t.read_text())
        # the kept trace of each profiled configuration, by the truth's own record (Lightning's
        # compile.after is the profiled compile_call22, not the earlier compile that recompiled
        # in its window)
        kept = {
            c: v["file"] if isinstance(v, dict) else v
            for c, v in (truth.get("kept_traces") or {}).items()
        }
        for cfg, p in (truth.get("profiled") or {}).items():
            own = (
                p.get("unprofiled_same_process_step_ms_window_mean")
                if isinstance(p, dict)
                else None
            )
            which = "before" if cfg == "baseline" else f"{cfg}.after"
            path = src / kept.get(cfg, f"{truth['loop']}.{which}.pt.trace.json.xz")
            if kept and cfg not in kept:
                path = src / "-"  # its trace was not kept (another configuration's file)
            if own is None or not path.exists():
                continue
            runs = truth["configs"].get(cfg.split("_call")[0], {}).values()
            # fresh processes of the same iteration only (PPO's profiled process runs 1/8 of one)
            size = p.get("samples_per_step") if isinstance(p, dict) else None
            ms = [
                v["step_ms_window_mean"]
                for v in runs
                if "step_ms_window_mean" in v
                and (size is None or v.get("samples_per_step") in (None, size))
            ]
            out.append((path, own, (min(ms), max(ms)) if ms else None))
    return out


def main() -> None:
    rows = recordings()
    with ProcessPoolExecutor(2) as pool:
        found = list(pool.map(estimate, [str(p) for p, _, _ in rows]))
    within = fair = ranged = loader_ranged = 0
    print(
        "| recording | estimate ms | range ms | own process ms | fresh ms | estimate / own "
        "| estimate / measured range |"
    )
    print("|---|---|---|---|---|---|---|")
    for (path, own, fresh), (est, low, high, shown) in zip(rows, found, strict=True):
        name = path.name.removesuffix(".pt.trace.json.xz")
        if est is None:
            print(f"| {name} | - | - | {own:.2f} | - | - | - |")
            continue
        within += abs(est / own - 1) <= 0.10
        # the measured range: the own process's step and the fresh processes' window means
        # (processes of one loop differ by up to 1.7x); the estimate over its nearer end
        lo_m, hi_m = min([own, *(fresh or ())]), max([own, *(fresh or ())])
        near = est / lo_m if est < lo_m else est / hi_m if est > hi_m else 1.0
        fair += abs(near - 1) <= 0.10
        # the range the trace leaves: the profiler's cost per event from the no-work op's to
        # twice it (its low end), where own falls within 10% of it
        ranged += (low or est) / 1.1 <= own <= 1.1 * (high or est)
        # the same with the workers' stated upper end (the summary's "up to")
        top = max(high or est, shown or 0)
        loader_ranged += (low or est) / 1.1 <= own <= 1.1 * top
        fr = f"{fresh[0]:.2f}-{fresh[1]:.2f}" if fresh else "-"
        rg = f"{low:.2f}-{high:.2f}" if low else "-"
        rg += f" (workers: up to {shown:.2f})" if shown else ""
        print(f"| {name} | {est:.2f} | {rg} | {own:.2f} | {fr} | {est / own:.2f} | {near:.2f} |")
    print(f"\nwithin 10% of the own process's step: {within} of {len(rows)}")
    print(f"within 10% of the measured range (own and fresh processes): {fair} of {len(rows)}")
    print(f"the own process's step within 10% of the estimate's range: {ranged} of {len(rows)}")
    print(
        "the same, the range up to the profiled step where the DataLoader's workers kept up "
        f"with it only (their rate not in the trace): {loader_ranged} of {len(rows)}"
    )


if __name__ == "__main__":
    main()
