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


def test_ddp_buffer_broadcast_on_htas_ddp_resnet():
    """Audit 7: HTA's nccl_data trace (a torchvision ResNet under DDP, broadcast_buffers on)
    flattens, broadcasts and copies back its BatchNorm buffers in each forward. Summed from
    the raw events: the top-level aten::flatten/unflatten_dense_tensors and c10d::broadcast_
    inside DistributedDataParallel.forward, 29.38 ms a step over the 3 steps."""
    import gzip
    import json

    path = shared_or_skip() / "hta" / "nccl_parser_config" / "nccl_data.json.gz"
    with gzip.open(path) as f:
        ev = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    fwd = [
        e
        for e in ev
        if e["name"] == "DistributedDataParallel.forward" and e["cat"] == "user_annotation"
    ]
    names = ("aten::flatten_dense_tensors", "aten::unflatten_dense_tensors", "c10d::broadcast_")
    us = sum(
        e["dur"]
        for e in ev
        if e["name"] in names
        and any(f["tid"] == e["tid"] and f["ts"] <= e["ts"] < f["ts"] + f["dur"] for f in fwd)
    )
    a = analyzed(path)
    f = next(f for f in a.findings if f.id == "ddp_buffer_broadcast")
    assert f.evidence["buffer_sync_ns"] == pytest.approx(us * 1e3, abs=20)
    assert f.evidence["steps"] == len(fwd) == 3
    assert f"take {us / 3 / 1e3:.2f} ms a step of host time" in f.title
    assert f.severity in ("medium", "high") and f.what_if.speedup > 1.10


def test_a_subset_of_a_jobs_ranks_is_said():
    """Audit 12: HTA's trace_filter job is 2 rank files whose traces record world_size 128; it
    read as a 2-rank job without a word."""
    import gzip
    import json

    d = shared_or_skip() / "hta" / "trace_filter"
    sizes = set()
    for f in sorted(d.glob("*.json.gz")):
        with gzip.open(f) as fh:
            sizes.add(json.load(fh)["distributedInfo"]["world_size"])
    assert sizes == {128}
    doc = analyzed(d).to_json()
    assert (doc["source"]["world_size"], doc["source"]["recorded_world_size"]) == (2, 128)
    assert any(w.startswith("2 of the job's 128 ranks are here") for w in doc["warnings"])
