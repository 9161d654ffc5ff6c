"""Contracts: every parser yields the event schema; every analyzer and rule runs on an empty, a
CPU-only and a multi-stream table; the rules and metrics are documented; layers import downward."""

from __future__ import annotations

import re
from pathlib import Path

import polars as pl
import pytest

from traceinsight.analyzers import ANALYZERS, DERIVED, OPTIONAL, Results
from traceinsight.api import analyze_trace
from traceinsight.findings import JOB_RULES, RULES
from traceinsight.model.schema import EVENT_SCHEMA
from traceinsight.parsers import load_trace

from .builder import Events
from .conftest import CORPUS, FIXTURES, H200, ROOT, TINY

PARSER_SAMPLES = [
    TINY / "step_dataloader_sync.json",  # Kineto, hand-made
    H200 / "healthy_bf16.pt.trace.json.xz",  # Kineto, PyTorch 2.11 gzip
    CORPUS / "plugin_2021-01_resnet50_nw0_worker0.pt.trace.json.xz",  # Kineto 2021 era
    CORPUS / "libkineto_test_after_fix_trace.json",  # libkineto's own test trace
    FIXTURES / "nsys" / "nsys-ai__mock.sqlite.xz",  # Nsight Systems export
    FIXTURES / "nsys" / "nsys-ai__mfu_2gpu_after.sqlite.xz",  # two processes in one export
    TINY / "kineto_2026_shape.json",  # Kineto 2026 shape: counters, stream sync rows
    FIXTURES / "foreign" / "zoology_a100_inference.json.gz",  # launches, no device activity
    FIXTURES / "foreign" / "awsgpu_report2.sqlite.xz",  # unified-memory migrations
    FIXTURES / "foreign" / "extrap_concurrent_s16.sqlite.xz",  # Windows export, non-UTF-8 text
]


@pytest.mark.parametrize("path", PARSER_SAMPLES, ids=lambda p: p.name)
def test_every_parser_yields_the_schema(path: Path) -> None:
    ev = load_trace(path).events
    assert dict(ev.schema) == EVENT_SCHEMA
    assert ev.height > 0
    ok = ev.filter(pl.col("end_ns").is_not_null())
    assert (ok["end_ns"] - ok["start_ns"] == ok["dur_ns"]).all()
    assert (ok["dur_ns"] >= 0).all()


def _empty() -> Events:
    return Events()


def _cpu_only() -> Events:
    e = Events()
    e.step(1, 0, 100).step(2, 100, 100)
    e.op("aten::mm", 10, 30).op("aten::add", 150, 20).op(
        "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 100, 40
    )
    return e


def _multi_stream() -> Events:
    """Two steps of 100 us; stream 7 runs a GEMM 10-60 and 110-160, stream 9 an elementwise
    kernel 40-80 and 140-180 (launched 5 us before it starts)."""
    e = Events()
    for i, base in enumerate((0, 100), start=1):
        e.step(i, base, 100)
        e.kernel("ampere_bf16_s16816gemm_bf16_128x128", base + 10, 50, launch_us=base + 2, stream=7)
        e.kernel("vectorized_elementwise_kernel<add>", base + 40, 40, launch_us=base + 35, stream=9)
    return e


def test_the_two_thread_schedule_takes_every_analyzer_after_what_it_reads() -> None:
    """run_analyzers' SCHEDULE: every analyzer once; each derived one after the analyzers it
    reads (so a waiting thread waits on one running or done), and it reads no others: each
    derived analyzer run on a real trace with a table that records what it asks for."""
    from traceinsight.analyzers import DERIVED_READS, SCHEDULE
    from traceinsight.analyzers.context import build_context
    from traceinsight.constants import DEFAULT_STEP_PATTERN

    assert sorted(SCHEDULE) == sorted(set(ANALYZERS) | set(DERIVED) | set(OPTIONAL))
    assert set(DERIVED_READS) == set(DERIVED)
    for name, reads in DERIVED_READS.items():
        assert all(SCHEDULE.index(r) < SCHEDULE.index(name) for r in reads), name
    ctx = build_context(load_trace(H200 / "healthy_bf16.pt.trace.json.xz"), DEFAULT_STEP_PATTERN)
    base = {n: f(ctx) for n, f in {**OPTIONAL, **ANALYZERS}.items()}

    class Recording(dict):  # type: ignore[type-arg]
        def __init__(self) -> None:
            super().__init__(base)
            self.asked: set[str] = set()

        def __getitem__(self, key: str) -> object:
            self.asked.add(key)
            return super().__getitem__(key)

    for name, derived in DERIVED.items():
        seen = Recording()
        derived(ctx, seen)
        assert seen.asked and seen.asked <= set(DERIVED_READS[name]), (name, seen.asked)


@pytest.mark.parametrize(
    "make", [_empty, _cpu_only, _multi_stream], ids=["empty", "cpu_only", "multi_stream"]
)
def test_every_analyzer_and_rule_runs(make) -> None:
    a = analyze_trace(make().trace())
    assert isinstance(a.results, Results)
    assert set(ANALYZERS) | set(DERIVED) | set(OPTIONAL) == {
        f for f in Results.__dataclass_fields__
    }
    doc = a.to_json()
    # the analyzers' results, and the combined what-if of the findings (findings/savings.py)
    assert set(doc["details"]) == set(ANALYZERS) | set(DERIVED) | set(OPTIONAL) | {"what_if"}
    assert all(f.severity in ("high", "medium", "low", "info") for f in a.findings)


def test_multi_stream_busy_is_the_union_of_streams() -> None:
    """Busy per step: [10, 80) = 70 of 100 us (the streams overlap 40-60)."""
    a = analyze_trace(_multi_stream().trace())
    assert a.metrics["window_ns"] == 200_000
    assert a.metrics["gpu_busy_ratio"] == pytest.approx(140 / 200)
    assert a.metrics["steps"] == 2 and a.metrics["step_time_median_ns"] == 100_000


def test_cpu_only_has_no_gpu_metrics() -> None:
    """No GPU: no busy ratio, no idle to blame; the loader's 40 of 200 us is a ratio only (an
    info finding, cost 0: nothing on a GPU waited)."""
    a = analyze_trace(_cpu_only().trace())
    assert a.metrics["gpu_busy_ratio"] is None
    assert a.metrics["dataloader_ratio"] == pytest.approx(40 / 200)
    assert [(f.id, f.severity, f.cost_ns) for f in a.findings] == [("dataloader_stall", "info", 0)]
    assert any("no GPU activity" in w for w in a.warnings)


def test_every_rule_has_a_findings_row_and_unique_thresholds() -> None:
    text = (ROOT / "docs" / "FINDINGS.md").read_text()
    rows = set(re.findall(r"^\| ([a-z0-9_]+)(?: \(jobs\))? \|", text, re.M))
    ids = [r.id for r in [*RULES, *JOB_RULES]]
    assert len(ids) == len(set(ids))
    assert set(ids) <= rows, f"rules without a docs/FINDINGS.md row: {sorted(set(ids) - rows)}"
    names = [k for r in [*RULES, *JOB_RULES] for k in r.thresholds]
    assert len(names) == len(set(names))  # one namespace for --threshold
    for n in names:
        assert f"`{n}`" in text, f"threshold {n} is not documented in docs/FINDINGS.md"


def test_every_metric_has_a_metrics_doc_entry(tiny_analysis) -> None:
    text = (ROOT / "docs" / "METRICS.md").read_text()
    missing = [k for k in tiny_analysis.metrics if f"`{k}`" not in text]
    assert not missing, f"metrics without a docs/METRICS.md entry: {missing}"


# Which of our top-level modules each layer may import (besides its own package).
