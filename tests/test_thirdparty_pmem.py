"""What profile_memory's events cost the host, measured (fixtures/h200/thirdparty/pmem, session
44: ``run_loop.py --mode pmem`` on the H200, one process a loop). The step model takes the
profiler's cost per recorded op and Python frame out of the host (causal/transforms.py
without_profiler), not per memory event. Were a memory event to cost what an op does, counting
them would bring 34 rather than 31 of 58 estimates within 10% of their process
(benchmarks/unprofiled_estimates.py): these measurements say it does not, so they stay out."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent.parent / "fixtures" / "h200" / "thirdparty" / "pmem"
# loops with at least this many memory events a step: below it the difference is the host's
# drift between segments (word_lm: 102 a step)
MIN_EVENTS = 500


def _runs() -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(HERE.glob("*.M.json"))]


def test_a_memory_event_costs_a_fraction_of_an_op() -> None:
    """Each loop ran recorded with shapes, without and with profile_memory, twice in turn in
    one process (host ms a step, medians of 6 steps each); each pair's difference over the
    memory events a step (from the segment's exported trace). Over the nine loops with 886-4,558
    memory events a step: 0.08 us an event (standard error 0.77), against their traces' no-work
    ops, 1.5-3.7 us, which the per-event cost is read from."""
    per_event, no_work = [], []
    for run in _runs():
        c = run["configs"]["baseline"]
        m, k = c["pcost_median_ms"], c["pmem_counts"]
        events = k["shapes_memory"]["memory_per_step"]
        again = k["shapes_memory_again"]["memory_per_step"]
        assert k["shapes"]["memory_per_step"] == 0 and again == pytest.approx(events, rel=0.01)
        if events < MIN_EVENTS:
            continue
        for with_, without in (
            ("shapes_memory", "shapes"),
            ("shapes_memory_again", "shapes_again"),
        ):
            per_event.append(1000 * (m[with_] - m[without]) / events)
        no_work.extend(k[x]["no_work_op_median_us"] for x in k)
    assert len(per_event) == 18
    mean = statistics.fmean(per_event)
    se = statistics.stdev(per_event) / len(per_event) ** 0.5
    assert mean == pytest.approx(0.08, abs=0.01) and se == pytest.approx(0.77, abs=0.01)
    # the mean's upper end at two standard errors (1.6 us) is below the no-work ops' median
    assert mean + 2 * se < statistics.median(no_work), (mean, se, no_work)
    assert 1.5 < min(no_work) < 2.0 and 3.0 < max(no_work) < 4.0, no_work
