"""One entry point: ``traceinsight.analyze`` decides what an input is, and every command that
analyzes goes through it (a 2-process nsys export is a 2-rank job everywhere)."""

from __future__ import annotations

import json

import orjson
import pytest

import traceinsight
from traceinsight.cli import main

from .conftest import FIXTURES, H200, TINY

TWO_GPU = FIXTURES / "nsys" / "nsys-ai__mfu_2gpu_after.sqlite.xz"  # 2 processes, one GPU each


def test_analyze_returns_typed_results_for_each_kind_of_input():
    one = traceinsight.analyze(TINY / "step_dataloader_sync.json")
    assert isinstance(one, traceinsight.TraceAnalysis)
    f = one.findings[0]
    assert (
        isinstance(f, traceinsight.Finding)
        and f.id == "dataloader_stall"
        and f.severity == "medium"
    )
    # the hand-computed dataloader idle of fixtures/tiny (test_analyzers_tiny), kept as evidence
    assert f.evidence["attributed_ns"] == 330_000
    assert one.results.idle.window_ns == one.metrics["window_ns"] == 1_000_000
    job = traceinsight.analyze(H200 / "ddp_straggler")
    assert isinstance(job, traceinsight.JobAnalysis)
    assert [r.rank for r in job.ranks] == [0, 1] and all(
        isinstance(r, traceinsight.TraceAnalysis) for r in job.ranks
    )
    export = traceinsight.analyze(TWO_GPU)
    assert isinstance(export, traceinsight.JobAnalysis) and [r.rank for r in export.ranks] == [0, 1]


def test_unknown_threshold_is_refused_before_parsing(tmp_path, capsys):
    rc = main(
        [
            "analyze",
            str(TINY / "step_dataloader_sync.json"),
            "--no-html",
            "-q",
            "--threshold",
            "no_such=1",
        ]
    )
    assert rc == 2 and "unknown threshold(s): no_such" in capsys.readouterr().err
    rc = main(["batch", str(TINY), "-o", str(tmp_path / "b"), "-q", "--threshold", "no_such=1"])
    assert rc == 2


def test_threshold_override_changes_the_grade():
    """The tiny trace's dataloader fix saves 24.8% of its step (test_analyzers_tiny): medium
    by default (high needs 25%), high when high needs 20%, low when medium needs 30%."""
    path = TINY / "step_dataloader_sync.json"
    assert traceinsight.analyze(path).findings[0].severity == "medium"
    graded = traceinsight.analyze(path, thresholds={"high_ratio": 0.2}).findings[0]
    assert graded.severity == "high"
    lower = traceinsight.analyze(path, thresholds={"medium_ratio": 0.3, "high_ratio": 0.4})
    assert lower.findings[0].severity == "low"


def test_batch_treats_a_two_process_export_as_a_two_rank_job(tmp_path):
    out = tmp_path / "out"
    assert main(["batch", str(TWO_GPU), "-o", str(out), "-q", "-j", "1"]) == 0
    (item,) = list((out / "reports").glob("*.json"))
    doc = orjson.loads(item.read_bytes())
    assert doc["row"]["kind"] == "job" and doc["row"]["ranks"] == 2
    assert [r["rank"] for r in doc["result"]["ranks"]] == [0, 1]


def test_diff_of_jobs_has_one_entry_per_matched_rank(tmp_path):
    out = tmp_path / "d.json"
    assert main(["diff", str(TWO_GPU), str(TWO_GPU), "--no-html", "-q", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert [r["rank"] for r in doc["ranks"]] == [0, 1]
    for r in doc["ranks"]:
        assert r["step_time_change"] in (0.0, None)  # the same export on both sides
        assert (
            r["kernels_per_step"]["appeared_count"]
            == 0
            == r["kernels_per_step"]["disappeared_count"]
        )
        assert r["kernels_per_step"]["changed"]  # the rank's own kernels are compared


@pytest.mark.parametrize("command", ["analyze", "batch", "diff", "export", "profile"])
def test_every_analysis_command_takes_the_shared_options(command):
    from traceinsight.cli import cli

    opts = {o for p in cli.commands[command].params for o in getattr(p, "opts", [])}
    assert {"--step-range", "--max-bytes", "--threshold"} <= opts
