"""Predicted speedup of each what-if transform against the H200 before/after pairs.

For each pair in fixtures/h200/pairs: the profiled "before" trace's model, host work divided by
the pair's measured profiler host slowdown (predictions are for the un-profiled loop; a factor
below 1 is not a slowdown and is left out), replayed unchanged and after the pair's transform.
Prints one Markdown row per pair: python benchmarks/replay_pairs.py
"""

from __future__ import annotations

import json
from pathlib import Path

from traceinsight.analyzers.context import build_context
from traceinsight.analyzers.replay import build_model
from traceinsight.api import load_events
from traceinsight.model import whatif
from traceinsight.model.replay import median_step_ns, replay

PAIRS = Path(__file__).resolve().parent.parent / "fixtures" / "h200" / "pairs"
# pair -> the transform its fix corresponds to
TRANSFORM_OF = {
    "syncs": "remove_syncs",
    "dataloader": "dataloader_floor",
    "h2d_pinned": "pinned_copies",
    "cudagraph": "cuda_graphs",
    "fused_adamw": "fused_optimizer",
    "bf16": "bf16_gemms",
    "checkpointing": "recompute_removed",
    "empty_cache": "no_empty_cache",
    "comm_overlap": "comm_overlapped",
}
# the tolerance on the predicted/measured speedup: device-speed changes are looser
TOLERANCE = {"bf16": 0.40, "cudagraph": 0.40}
DEFAULT_TOLERANCE = 0.25


def predict(pair: str) -> dict[str, float | str | None]:
    truth = json.loads((PAIRS / f"{pair}.truth.json").read_text())
    trace = load_events(PAIRS / f"{pair}.before.pt.trace.json.gz")
    model = build_model(build_context(trace))
    assert model is not None
    factor = max(1.0, float(truth["profiler_host_slowdown"]))
    model = whatif.scale_host(model, factor)
    before = median_step_ns(model, replay(model))
    changed = whatif.TRANSFORMS[TRANSFORM_OF[pair]](model)
    after = median_step_ns(changed, replay(changed)) if changed is not None else before
    assert before is not None and after is not None
    return {
        "pair": pair,
        "transform": TRANSFORM_OF[pair],
        "host_slowdown": factor,
        "replayed_before_ms": before / 1e6,
        "measured_before_ms": truth["before"]["median_ms"],
        "predicted": before / after,
        "measured": truth["speedup"],
    }


def main() -> None:
    print(
        "| pair | transform | host ÷ | replayed before ms | measured before ms | predicted | measured | ratio |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for pair in TRANSFORM_OF:
        r = predict(pair)
        ratio = r["predicted"] / r["measured"]
        ok = abs(ratio - 1) <= TOLERANCE.get(pair, DEFAULT_TOLERANCE)
        print(
            f"| {pair} | {r['transform']} | {r['host_slowdown']:.3f} | {r['replayed_before_ms']:.2f} "
            f"| {r['measured_before_ms']:.2f} | {r['predicted']:.3f} | {r['measured']:.3f} "
            f"| {ratio:.2f}{'' if ok else ' (outside)'} |"
        )


if __name__ == "__main__":
    main()
