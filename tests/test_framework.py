"""Advice follows what the trace records: a PyTorch program gets PyTorch advice, a plain CUDA/HIP
application (C++, MPI codes under Nsight Systems) CUDA-level advice with C++ snippets and no
"per step" where it has no steps. And --device on a job: per rank, the ranks without that GPU
left out in one warning line."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from traceinsight.api import analyze
from traceinsight.cli import main
from traceinsight.constants import FRAMEWORKS
from traceinsight.errors import InputError
from traceinsight.findings import JOB_RULES, RULES
from traceinsight.model.framework import detect_framework
from traceinsight.parsers import load_trace
from traceinsight.report import markdown

from .conftest import FIXTURES, H200, analyzed, shared_or_skip, unpacked_db

# what no advice for an application may say: PyTorch's API, and steps it does not have
TORCH_WORDS = re.compile(r"\.item\(\)|DataLoader|torch|per step", re.IGNORECASE)

# CUDA/HIP applications in fixtures/ (always present) and in the corpus (../shared)
APP_FIXTURES = [
    FIXTURES / "nsys" / "Mordred__report1.sqlite.xz",  # a GPU database engine (C++)
    FIXTURES / "foreign" / "awsgpu_report2.sqlite.xz",  # a unified-memory softmax (CUDA C++)
    FIXTURES / "foreign" / "extrap_concurrent_s16.sqlite.xz",
]
APP_CORPUS = [
    "pipit__perlmutter-cloverleaf-cuda.sqlite",  # CloverLeaf (C++/CUDA) on an A100
    "pipit__saxpy-mpi-cuda_nsys_perlmutter0.sqlite",  # an MPI + CUDA saxpy
]


def _corpus(name: str) -> Path:
    return shared_or_skip() / "nsys" / name


def _assert_application_advice(path: Path) -> None:
    a = analyzed(path)
    assert a.source["framework"] == "cuda_app"
    assert a.findings, f"{path.name}: the check needs findings to look at"
    for f in a.findings:
        for text in (f.recommendation, f.snippet, f.title):
            assert not TORCH_WORDS.search(text), f"{path.name} {f.id}: {text!r}"
        assert f.snippet_language == "cpp"
    md = markdown.render(a.to_json())
    assert "```python" not in md and "per step" not in md


@pytest.mark.parametrize("path", APP_FIXTURES, ids=lambda p: p.name)
def test_application_fixtures_get_cuda_advice(path):
    _assert_application_advice(path)


@pytest.mark.parametrize("name", APP_CORPUS)
def test_application_corpus_gets_cuda_advice(name):
    _assert_application_advice(_corpus(name))


def test_cloverleaf_host_sync_names_streams_and_events():
    # CloverLeaf syncs with cudaDeviceSynchronize after its kernels: the advice is the CUDA one
    a = analyzed(_corpus(APP_CORPUS[0]))
    sync = next(f for f in a.findings if f.id == "host_sync")
    assert "cudaStreamWaitEvent" in sync.recommendation and "cudaEventRecord" in sync.snippet
    assert "(over the window)" in sync.title  # no steps: nothing is per step
    copy = next(f for f in a.findings if f.id == "pageable_memcpy")
    assert "cudaHostAlloc" in copy.recommendation and "cudaMemcpyAsync" in copy.snippet


@pytest.mark.parametrize(
    ("path", "framework"),
    [
        (FIXTURES / "nsys" / "nsys-ai__mfu_2gpu_after.sqlite.xz", "pytorch"),  # aten:: NVTX ranges
        (FIXTURES / "nsys" / "nsys-ai__mock.sqlite.xz", "pytorch"),  # ATen kernels only
        (H200 / "h2d_pageable.pt.trace.json.xz", "pytorch"),  # Kineto: the PyTorch profiler
        (FIXTURES / "nsys" / "Mordred__report1.sqlite.xz", "cuda_app"),
    ],
    ids=lambda x: x.name if isinstance(x, Path) else x,
)
def test_framework_is_read_off_the_trace(path, framework):
    assert detect_framework(load_trace(path)) == framework


def test_pytorch_trace_keeps_its_advice():
    a = analyzed(H200 / "h2d_pageable.pt.trace.json.xz")
    assert a.source["framework"] == "pytorch"
    f = next(f for f in a.findings if f.id == "pageable_memcpy")
    rule = next(r for r in RULES if r.id == "pageable_memcpy")
    assert (f.recommendation, f.snippet) == (rule.recommendation, rule.snippet)
    assert "pin_memory" in f.recommendation and f.snippet_language == "python"


def test_pytorch_nsys_export_keeps_its_advice():
    a = analyzed(FIXTURES / "nsys" / "nsys-ai__mfu_2gpu_after.sqlite.xz")
    assert a.source["framework"] == "pytorch"
    assert any("torch" in f.recommendation + f.snippet for f in a.findings)


@pytest.mark.parametrize("rule", [*RULES, *JOB_RULES], ids=lambda r: r.id)
def test_every_rule_declares_advice_for_every_framework(rule):
    # a rule either declares each other framework's advice or says it does not apply (None):
    # falling back to the PyTorch text would give an application PyTorch advice
    for framework in FRAMEWORKS[1:]:
        assert framework in rule.advice, f"{rule.id}: no advice for {framework}"
        adv = rule.advice[framework]
        if adv is not None:
            assert adv.recommendation and adv.snippet
            assert not TORCH_WORDS.search(adv.recommendation + adv.snippet), rule.id


# --- --device on a job: per rank ------------------------------------------------------------

DDP = H200 / "ddp_overlap"  # rank 0 on GPU 0, rank 1 on GPU 1


def test_device_on_a_job_keeps_the_ranks_on_that_gpu():
    job = analyze(DDP, device=1)
    assert [r.rank for r in job.ranks] == [1]
    assert [d["id"] for d in job.ranks[0].source["devices"]] == [1]
    assert (
        job.warnings.count("--device 1: rank without GPU activity on it left out (rank 0: [0])")
        == 1
    )
    assert job.to_json()["source"]["framework"] == "pytorch"


def test_device_on_a_multi_process_export_is_per_rank_too():
    job = analyze(FIXTURES / "nsys" / "nsys-ai__mfu_2gpu_after.sqlite.xz", device=1)
    assert [r.rank for r in job.ranks] == [1]
    assert any(w.startswith("--device 1: rank without GPU activity") for w in job.warnings)


def test_device_no_rank_has_is_refused_with_each_ranks_devices(capsys):
    with pytest.raises(InputError, match=r"devices by rank: rank 0: \[0\]; rank 1: \[1\]"):
        analyze(DDP, device=5)
    assert main(["analyze", str(DDP), "--device", "5", "--no-html"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no rank has GPU activity on it" in err[0]


def test_rank_left_out_by_device_says_why():
    with pytest.raises(InputError, match=r"--rank 0: the job has ranks \[1\] \(--device 1: rank"):
        analyze(DDP, device=1, rank=0)
    assert analyze(DDP, device=1, rank=1).source["devices"][0]["id"] == 1


def test_an_applications_savings_are_per_iteration_or_over_the_window():
    """A C++ application's report says what a saving is counted over: per iteration where it
    has iterations, over the window where it has none; never "per step"."""
    import copy

    from traceinsight.report.html import render_html

    doc = analyzed(FIXTURES / "nsys" / "Mordred__report1.sqlite.xz").to_json()
    assert doc["source"]["framework"] == "cuda_app" and not doc["metrics"]["steps"]
    doc["findings"][0]["what_if"] = {
        "step_time_ns": 10_000,
        "step_time_after_ns": 5_000,
        "speedup": 2.0,
    }
    for steps, words in ((0, "over the window"), (3, "per iteration")):
        d = copy.deepcopy(doc)
        d["metrics"]["steps"] = steps
        saves = re.findall(r"[Ff]ix saves [^<]*", render_html(d))
        assert saves and all(words in x and "per step" not in x for x in saves), saves


def test_an_os_call_that_held_the_launching_thread_is_named():
    """Audit 8: Mordred's 5.91 s of GPU idle read "mostly outside any recorded op (host code
    between CUDA calls)" where its OSRT_API table has the CUDA thread in getc (waiting for
    keyboard input) for 4.65 s and in read for 1.24 s; other threads' long waits (poll,
    sem_timedwait: 79 s) name nothing. From the export: the launching thread's getc calls."""
    import sqlite3

    path = unpacked_db(FIXTURES / "nsys" / "Mordred__report1.sqlite.xz")
    con = sqlite3.connect(path)
    (getc_ns,) = con.execute(
        "SELECT max(o.end - o.start) FROM OSRT_API o JOIN StringIds s ON s.id = o.nameId "
        "WHERE s.value = 'getc' AND o.globalTid IN (SELECT DISTINCT r.globalTid FROM "
        "CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds n ON n.id = r.nameId "
        "WHERE n.value LIKE 'cudaLaunchKernel%')"
    ).fetchone()
    a = analyzed(path)
    f = next(f for f in a.findings if f.id == "gpu_underutilized")
    assert getc_ns >= 0.5 * f.evidence["cpu_work_idle_ns"]  # 4.65 of 5.91 s
    assert f.title.endswith("mostly while the host was blocked in getc (an OS call)")
    assert f.recommendation.startswith("The thread that launches the GPU's work was blocked")
    assert (
        a.source["event_counts"]["os_call"]
        == con.execute("SELECT count(*) FROM OSRT_API WHERE end - start >= 1000000").fetchone()[0]
    )


def test_the_words_for_host_time_outside_ops_nest_no_parentheses():
    """audit 17: an nsys title read "... outside any recorded op (Python between ops: ...
    (torch.profiler's with_stack=True; ...))": the words go inside the title's parentheses."""
    from traceinsight.analyzers.idle import IdleSegment
    from traceinsight.findings.rules import OUTSIDE_OPS, _mostly

    for framework, words in OUTSIDE_OPS.items():
        assert "(" not in words and ")" not in words, framework
        where = _mostly([IdleSegment(0, 0, 10, 10, 0, "cpu_work", None)], 10, 0.5, framework)
        assert where == f", mostly outside any recorded op ({words})"
