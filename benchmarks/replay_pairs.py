"""Predicted speedup of each pair's finding against the H200 before/after pairs.

For each pair in fixtures/h200/pairs: ``analyze`` of the profiled "before" trace, exactly as a
user runs it; the finding that names the pair's cause, its ``what_if`` (the causal model's
replay of the un-profiled loop before and after the fix, analyzers/replay.py) against the
speedup measured with CUDA events outside the profiler (``*.truth.json``), and the finding's
rank. Prints one Markdown row per pair: python benchmarks/replay_pairs.py [--holdout]
(``--holdout``: the pairs recorded at held-out sizes, fixtures/h200/holdout; ``--cnn``: four of
them on a conv net, fixtures/h200/cnn).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from traceinsight import analyze

H200 = Path(__file__).resolve().parent.parent / "fixtures" / "h200"
PAIRS = H200 / "pairs"
HOLDOUT = H200 / "holdout"  # the same pairs at sizes the pairs were not recorded at
CNN = H200 / "cnn"  # four causes again in a conv net (pair names cnn_*)
# pair -> the finding that names its cause (the stand-in "communication" is side-stream copies)
FINDING_OF = {
    "syncs": "host_sync",
    "dataloader": "dataloader_stall",
    "h2d_pinned": "pageable_memcpy",
    "cudagraph": "launch_bound",
    "fused_adamw": "unfused_optimizer",
    "bf16": "fp32_compute",
    "checkpointing": "recompute_overhead",
    "empty_cache": "allocator_churn",
    "comm_overlap": "h2d_not_overlapped",
}
# the tolerance on the predicted/measured speedup: device-speed changes are looser
TOLERANCE = {"bf16": 0.40, "cudagraph": 0.40}
DEFAULT_TOLERANCE = 0.25


def predict(pair: str, folder: Path = PAIRS) -> dict[str, float | str | int | None]:
    truth = json.loads((folder / f"{pair}.truth.json").read_text())
    a = analyze(folder / f"{pair}.before.pt.trace.json.xz")
    ids = [f.id for f in a.findings]
    fid = FINDING_OF[pair.removeprefix("cnn_")]
    finding = next((f for f in a.findings if f.id == fid), None)
    w = finding.what_if if finding is not None else None
    return {
        "pair": pair,
        "finding": fid,
        "rank": ids.index(fid) + 1 if finding is not None else None,
        "first": ids[0] if ids else None,
        "profiled_step_ms": (a.metrics["step_time_median_ns"] or 0) / 1e6,
        "replayed_before_ms": w.step_time_ns / 1e6 if w else None,
        "predicted_after_ms": w.step_time_after_ns / 1e6 if w else None,
        "step_statistic": a.results.replay.step_statistic,
        "measured_before_ms": truth["before"]["median_ms"],
        "predicted": w.speedup if w else None,
        "measured": truth["speedup"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--holdout", action="store_true", help="the held-out recordings")
    ap.add_argument("--cnn", action="store_true", help="the conv-net recordings")
    args = ap.parse_args()
    folder = HOLDOUT if args.holdout else CNN if args.cnn else PAIRS
    names = sorted(p.name.removesuffix(".truth.json") for p in folder.glob("*.truth.json"))
    print(
        "| pair | finding (rank; first) | profiled step ms | predicted un-profiled before ms "
        "| measured before ms | predicted | measured | ratio |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for pair in [n for n in names if n.removeprefix("cnn_") in FINDING_OF]:
        r = predict(pair, folder)
        if r["predicted"] is None:
            print(f"| {pair} | {r['finding']} (not found; first {r['first']}) | | | | | | |")
            continue
        ratio = r["predicted"] / r["measured"]
        ok = abs(ratio - 1) <= TOLERANCE.get(pair.removeprefix("cnn_"), DEFAULT_TOLERANCE)
        print(
            f"| {pair} | {r['finding']} ({r['rank']}; {r['first']}) | {r['profiled_step_ms']:.2f} "
            f"| {r['replayed_before_ms']:.2f} | {r['measured_before_ms']:.2f} "
            f"| {r['predicted']:.3f} | {r['measured']:.3f} | {ratio:.2f}{'' if ok else ' (outside)'} |"
        )


if __name__ == "__main__":
    main()
