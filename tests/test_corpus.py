"""Every Kineto trace in ../shared/traces analyzes (exit 0); the non-traces are refused (exit 2)."""

from pathlib import Path

import pytest

from traceinsight.cli import main

from .conftest import SHARED, analyzed, shared_or_skip

NOT_TRACES = {
    "benchmark_simple_add_et.json.gz",
    "gpu_metrics_expected.json",
}


def kineto_files() -> list[Path]:
    if not SHARED.is_dir():
        return []
    return sorted(
        p
        for p in SHARED.rglob("*")
        if p.is_file() and (".json" in p.name or p.name.endswith(".raw.gz"))
    )


@pytest.mark.parametrize(
    "path", kineto_files() or [None], ids=lambda p: p.name if p else "corpus-absent"
)
def test_corpus_trace(path, tmp_path, capsys):
    shared_or_skip()
    rc = main(["analyze", str(path), "--no-html", "-q", "--json", str(tmp_path / "o.json")])
    err = capsys.readouterr().err
    if path.name in NOT_TRACES - {"gpu_metrics_expected.json"}:
        assert rc == 2 and len(err.strip().splitlines()) == 1
    else:
        assert rc == 0, err


def test_a_fix_the_replay_cannot_price_is_at_most_low():
    """A 2021 ResNet-50 trace without device properties: fp32_compute's bf16 transform needs the
    device's peaks, so there is no prediction; its attributed fp32 math time is only an upper
    bound on the saving, and the finding stays at most low (it read HIGH on that bound)."""
    name = "tbplugin_2021-01_resnet50_profiler_api_nw4_worker0.pt.trace.json.gz"
    path = shared_or_skip() / "kineto-samples" / name
    f = next(f for f in analyzed(path).findings if f.id == "fp32_compute")
    assert f.what_if is None and "spec table" in f.evidence["why_no_estimate"]
    assert f.severity in ("low", "info")
