"""Every Kineto trace in ../shared/traces analyzes (exit 0); the non-traces are refused (exit 2)."""

from pathlib import Path

import pytest

from traceinsight.cli import main

from .conftest import SHARED, shared_or_skip

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
