from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "fixtures"
TINY = FIXTURES / "tiny"
H200 = FIXTURES / "h200"
CORPUS = FIXTURES / "corpus"
SHARED = Path(os.environ.get("TRACEINSIGHT_SHARED", ROOT.parent / "shared")) / "traces"


def shared_or_skip() -> Path:
    if not SHARED.is_dir():
        pytest.skip(
            f"corpus not present at {SHARED} (set TRACEINSIGHT_SHARED); corpus-wide test skipped"
        )
    return SHARED


@pytest.fixture(scope="session")
def tiny_analysis():
    from traceinsight import analyze

    return analyze(TINY / "step_dataloader_sync.json")
