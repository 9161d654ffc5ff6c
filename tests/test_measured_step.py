"""The un-profiled step traceinsight.capture writes into a trace (capture.MEASURED_KEY): read
where well-formed, ignored otherwise, and reported beside the model's step without moving a
prediction (benchmarks/RESULTS.md, session 47: fitted to, it made predictions worse)."""

from __future__ import annotations

import json
import lzma
from pathlib import Path

import pytest

import traceinsight
from traceinsight.parsers import load_trace
from traceinsight.report.format import prediction_basis

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "fixtures" / "tiny" / "step_dataloader_sync.json"
THIRDPARTY = ROOT / "fixtures" / "h200" / "thirdparty"


def _with_key(src: Path, out: Path, value: object) -> Path:
    opener = lzma.open if src.suffix == ".xz" else open
    with opener(src, "rb") as fh:
        doc = json.loads(fh.read())
    doc["traceinsight"] = value
    out.write_text(json.dumps(doc))
    return out


@pytest.mark.parametrize(
    "value",
    [
        "not json",
        '{"unprofiled_step_ns": 5}',  # no step count
        {"unprofiled_step_ns": -5, "unprofiled_steps": 3},
        {"unprofiled_step_ns": 2.5e7, "unprofiled_steps": 3},
        {"unprofiled_step_ns": True, "unprofiled_steps": 3},
        {"unprofiled_step_ns": 25_000_000, "unprofiled_steps": 0},
        [25_000_000, 3],
        None,
    ],
)
def test_a_malformed_measurement_is_ignored(tmp_path, value):
    t = load_trace(_with_key(TINY, tmp_path / "t.json", value))
    assert "unprofiled_measured_step_ns" not in t.meta.extra


@pytest.mark.parametrize(
    "value",
    [
        {"unprofiled_step_ns": 25_000_000, "unprofiled_steps": 3},
        '{"unprofiled_step_ns": 25000000, "unprofiled_steps": 3}',  # metadata as a JSON string
    ],
)
def test_a_measurement_is_read(tmp_path, value):
    t = load_trace(_with_key(TINY, tmp_path / "t.json", value))
    assert t.meta.extra["unprofiled_measured_step_ns"] == 25_000_000
    assert t.meta.extra["unprofiled_measured_steps"] == 3


@pytest.mark.parametrize(
    ("loop", "measured_ms", "words"),
    [
        # each recording's own process's un-profiled window just before the capture (truth:
        # profiled.baseline.unprofiled_same_process_step_ms_window_mean)
        ("lightning", 26.8291, "26.83 ms, 0.99x the model's."),
        ("dcgan", 20.3191, "20.32 ms, 2.28x the model's. The process ran at a pace"),
    ],
)
def test_the_measured_step_is_said_and_moves_no_prediction(tmp_path, loop, measured_ms, words):
    src = THIRDPARTY / f"{loop}.before.pt.trace.json.xz"
    truth = json.loads((THIRDPARTY / f"{loop}.truth.json").read_text())
    own = truth["profiled"]["baseline"]["unprofiled_same_process_step_ms_window_mean"]
    assert own == pytest.approx(measured_ms, abs=1e-4)
    value = {"unprofiled_step_ns": round(own * 1e6), "unprofiled_steps": 20}
    a = traceinsight.analyze(src)
    b = traceinsight.analyze(_with_key(src, tmp_path / f"{loop}.pt.trace.json", value))
    assert b.results.replay.measured_step_ns == round(own * 1e6)
    assert a.results.replay.measured_step_ns is None
    assert b.results.replay.unprofiled_step_ns == a.results.replay.unprofiled_step_ns
    speedups = lambda r: [(f.id, f.severity, f.what_if and f.what_if.speedup) for f in r.findings]  # noqa: E731
    assert speedups(b) == speedups(a)
    said = prediction_basis(b.to_json())
    assert words in said and "traceinsight.capture timed the step" in said
    assert "traceinsight.capture" not in prediction_basis(a.to_json())


def test_the_diff_gives_the_measured_change_where_both_sides_carry_it(tmp_path):
    """gnn's loader fix (8 workers): each side injected with its own process's un-profiled
    window (24.91 ms before, 13.86 ms after: -44.4%); the diff reports it beside the model's
    estimate, and only where both sides carry one."""
    sides = {"before": "baseline", "workers.after": "workers"}
    truth = json.loads((THIRDPARTY / "gnn.truth.json").read_text())["profiled"]
    own = {w: truth[cfg]["unprofiled_same_process_step_ms_window_mean"] for w, cfg in sides.items()}
    assert own == pytest.approx({"before": 24.9099, "workers.after": 13.8592})
    got = {
        w: _with_key(
            THIRDPARTY / f"gnn.{w}.pt.trace.json.xz",
            tmp_path / f"gnn.{w}.pt.trace.json",
            {"unprofiled_step_ns": round(ms * 1e6), "unprofiled_steps": 20},
        )
        for w, ms in own.items()
    }
    from traceinsight.diff import compare

    u = compare(traceinsight.analyze(got["before"]), traceinsight.analyze(got["workers.after"]))[
        "unprofiled"
    ]
    assert u["measured_before_ns"] == 24_909_900 and u["measured_after_ns"] == 13_859_200
    assert u["measured_change"] == pytest.approx(13.8592 / 24.9099 - 1)  # -44.4%
    one = compare(
        traceinsight.analyze(got["before"]),
        traceinsight.analyze(THIRDPARTY / "gnn.workers.after.pt.trace.json.xz"),
    )["unprofiled"]
    assert "measured_change" not in one and one["change"] == pytest.approx(u["change"])
