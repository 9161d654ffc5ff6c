"""The streamed msgspec path must give exactly the result of the reference orjson path."""

import pytest

import traceinsight.parsers.kineto_fast as fast
from traceinsight.api import analyze_path

from .conftest import CORPUS, H200, TINY

CASES = [
    H200 / "healthy_bf16.pt.trace.json.gz",
    H200 / "ddp_straggler" / "rank1.pt.trace.json.gz",
    H200 / "h2d_pageable.pt.trace.json.gz",
    CORPUS / "plugin_2021-01_resnet50_nw0_worker0.pt.trace.json.gz",  # bare array era
    CORPUS / "libkineto_test_after_fix_trace.json",
    CORPUS / "inference_vllm_decode_full_graph_execution.json.gz",
    TINY / "step_dataloader_sync.json",
]


def _doc(path, monkeypatch, *, use_fast: bool, chunk: int = fast.CHUNK_BYTES):
    monkeypatch.setattr(fast, "CHUNK_BYTES", chunk)
    if not use_fast:
        monkeypatch.setattr(fast, "decode", lambda data: None)
    doc = analyze_path(path).to_json()
    monkeypatch.undo()
    return doc


@pytest.mark.parametrize("path", CASES, ids=lambda p: p.name)
def test_fast_path_json_identical(path, monkeypatch):
    reference = _doc(path, monkeypatch, use_fast=False)
    assert _doc(path, monkeypatch, use_fast=True) == reference
    # small chunks: many cut points inside the events array
    assert _doc(path, monkeypatch, use_fast=True, chunk=64 * 1024) == reference


def test_fast_path_is_taken_for_kineto_output(monkeypatch):
    from traceinsight.parsers.source import read_bytes

    data, _ = read_bytes(H200 / "healthy_bf16.pt.trace.json.gz")
    assert fast.decode(data) is not None
    assert fast.decode(b'{"traceEvents": [{"ph": "X", "args": [1]}]}') is None  # bad args: robust path
    assert fast.decode(b"[1, 2]") is None
