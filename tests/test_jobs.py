"""Multi-rank jobs, batch mode (local and Dask), archives, and diff."""

import io
import json
import shutil
import statistics
import tarfile
from pathlib import Path

import polars as pl
import pytest

from traceinsight.cli import main
from traceinsight.inputs import rank_from_name
from traceinsight.jobs import analyze_job
from traceinsight.runtime import Runtime

from .conftest import CORPUS, FIXTURES, H200, SHARED, TINY

STRAGGLE_MS = 30.0  # the generator's injected host delay on rank 1 before every backward


def test_straggler_rank_and_wait():
    job = analyze_job(H200 / "ddp_straggler")
    c = job.cross
    assert c.straggler_rank == 1 and c.straggler_last_ratio == 1.0
    assert c.straggler_steps == (3, 4, 5, 6)
    steps = len(c.straggler_steps)
    # Rank 0 waits at least the injected delay every step, and at most its whole step time.
    truth = json.loads((H200 / "ddp_straggler" / "rank1.truth.json").read_text())
    assert STRAGGLE_MS * 1e6 * steps <= c.wait_caused_ns <= sum(truth["step_time_ms"][:steps]) * 1e6
    assert c.wait_by_rank_ns["1"] == 0
    f = job.findings[0]
    assert f.id == "straggler" and f.evidence["rank"] == 1 and f.severity == "high"


def test_no_straggler_when_balanced():
    job = analyze_job(H200 / "ddp_overlap")
    assert job.cross.straggler_rank is None
    assert "straggler" not in [f.id for f in job.findings]
    doc = job.to_json()
    assert doc["source"]["ranks"] == [0, 1] and len(doc["step_table"]) == 4


def test_ranks_from_file_names_and_fallback(tmp_path):
    assert rank_from_name("rank-12.Apr_03.pt.trace.json.gz") == 12
    assert rank_from_name("worker3.123.pt.trace.json") == 3
    assert rank_from_name("trace.json") is None
    # traces without distributedInfo: names decide; without rank names: sorted order + warning
    for i, name in enumerate(["b.json", "a.json"]):
        doc = json.loads((TINY / "comm_overlap.json").read_text())
        doc.pop("distributedInfo")
        (tmp_path / name).write_text(json.dumps(doc))
        del i
    job = analyze_job(tmp_path, runtime=Runtime(workers=1))
    assert [r.rank for r in job.ranks] == [0, 1]
    assert [Path(r.source["path"]).name for r in job.ranks] == ["a.json", "b.json"]
    assert any("sorted file order" in w for w in job.warnings)


def test_hta_trace_filter_two_ranks():
    if not (SHARED / "hta" / "trace_filter").is_dir():
        pytest.skip("corpus absent")
    job = analyze_job(SHARED / "hta" / "trace_filter")
    assert [r.rank for r in job.ranks] == [0, 1]  # from distributedInfo
    assert job.cross.matched_collectives > 0
    # rank 1's Shampoo: 209.09 ms of its optimizer step's host time over 26.5 kernels
    # (audit 17: "7.89 ms of host time a kernel is its own work" did not read)
    opt = next(f for f in job.findings if f.id == "unfused_optimizer")
    assert opt.title.endswith("; its 7.89 ms of host time per kernel is its own work, not launches")
    # audit 19: "Shampoo runs foreach" gave torch.optim's word to another optimizer, and the
    # advice said what its prediction assumes where it has none
    assert opt.title.startswith("[rank 1] Shampoo runs multi-tensor kernels: 26.5 kernels")
    assert opt.what_if is None and "the prediction assumes" not in opt.recommendation


def test_analyze_dir_cli(tmp_path, capsys):
    out = tmp_path / "job.json"
    assert (
        main(
            [
                "analyze",
                str(H200 / "ddp_straggler"),
                "-o",
                str(tmp_path / "job.html"),
                "--json",
                str(out),
                "-q",
            ]
        )
        == 0
    )
    doc = json.loads(out.read_text())
    assert doc["kind"] == "job" and doc["metrics"]["straggler_rank"] == 1
    assert doc["findings"][0]["evidence"]["rank"] == 1
    html = (tmp_path / "job.html").read_text()
    assert 'id="ranks"' in html and "straggler" in html and "https://" not in html


def test_nsys_export_with_two_processes_is_a_job(tmp_path):
    out = tmp_path / "j.json"
    assert (
        main(
            [
                "analyze",
                str(FIXTURES / "nsys" / "nsys-ai__mfu_2gpu_after.sqlite.xz"),
                "--no-html",
                "-q",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    doc = json.loads(out.read_text())
    assert doc["kind"] == "job" and doc["source"]["ranks"] == [0, 1]


def _make_tree(root: Path) -> None:
    root.mkdir()
    shutil.copy(H200 / "h2d_pinned.pt.trace.json.xz", root / "pinned.pt.trace.json.gz")
    shutil.copytree(
        H200 / "ddp_overlap", root / "job", ignore=shutil.ignore_patterns("*.truth.json")
    )
    (root / "broken.json").write_text('{"traceEvents": [')
    with tarfile.open(root / "archive.tar.gz", "w:gz") as tar:
        tar.add(CORPUS / "torch_compile_triton_trace.json.gz", arcname="deep/dir/compiled.json.gz")
        tar.add(CORPUS / "benchmark_simple_add_et.json.gz", arcname="not_a_trace.json.gz")
        data = (TINY / "step_dataloader_sync.json").read_bytes()
        evil = tarfile.TarInfo("../../../escape.json")  # path traversal attempt
        evil.size = len(data)
        tar.addfile(evil, io.BytesIO(data))
        link = tarfile.TarInfo("link.json")
        link.type = tarfile.SYMTYPE
        link.linkname = "/etc/passwd"
        tar.addfile(link)


def test_batch_local_resume_and_failures(tmp_path, capsys):
    src = tmp_path / "in"
    _make_tree(src)
    out = tmp_path / "out"
    rc = main(["batch", str(src), "-o", str(out), "-j", "2"])
    assert rc == 1  # some items failed, the rest were analyzed
    df = pl.read_parquet(out / "summary.parquet")
    status = dict(
        zip((lbl.removeprefix(f"{src}/") for lbl in df["label"]), df["status"], strict=True)
    )
    assert status["pinned.pt.trace.json.gz"] == "ok"
    assert status["job"] == "ok"
    assert status["broken.json"] == "error"  # no complete event to salvage
    assert status["archive.tar.gz!deep/dir/compiled.json.gz"] == "ok"
    assert status["archive.tar.gz!not_a_trace.json.gz"] == "error"
    assert status["archive.tar.gz!../../../escape.json"] == "ok"  # analyzed from a safe name
    assert not (tmp_path / "escape.json").exists() and not list(tmp_path.parent.glob("escape.json"))
    assert "link.json" not in " ".join(df["label"].to_list())
    job = df.filter(pl.col("label").str.ends_with("/job")).row(0, named=True)
    assert job["kind"] == "job" and job["ranks"] == 2
    assert (out / "summary.csv").read_text().startswith("label,")
    index = (out / "index.html").read_text()
    for r in df.filter(pl.col("status") == "ok")["report"].to_list():
        assert (out / r).exists() and r in index
    # resume: nothing re-analyzed, same summary
    capsys.readouterr()
    assert main(["batch", str(src), "-o", str(out)]) == 1
    assert "4 up to date (skipped)" in capsys.readouterr().out
    df2 = pl.read_parquet(out / "summary.parquet")
    assert df2.equals(df)


def test_batch_on_dask_local_cluster_equals_local(tmp_path):
    pytest.importorskip("dask.distributed", reason="pip install 'traceinsight-analyzer[dask]'")
    src = tmp_path / "in"
    src.mkdir()
    for name in ("h2d_pinned", "h2d_pageable", "launch_bound_cudagraph"):
        shutil.copy(H200 / f"{name}.pt.trace.json.xz", src)
    (src / "bad.json").write_text("nope")
    assert main(["batch", str(src), "-o", str(tmp_path / "local"), "-q", "-j", "1"]) == 1
    assert (
        main(
            [
                "batch",
                str(src),
                "-o",
                str(tmp_path / "dask"),
                "-q",
                "-j",
                "2",
                "--scheduler",
                "local",
            ]
        )
        == 1
    )
    a = pl.read_parquet(tmp_path / "local" / "summary.parquet")
    b = pl.read_parquet(tmp_path / "dask" / "summary.parquet")
    assert a.height == 4 and a.equals(b)


# one job (the straggler's: the cross-rank analysis has the most to agree on); a LocalCluster
# costs seconds to start on the 2-core machine
@pytest.mark.parametrize("job", ["ddp_straggler"])
def test_job_on_dask_local_cluster_equals_local_processes(job, tmp_path):
    """One code path, two executors: the ranks' summaries from local processes or from Dask
    tasks give the same job document (no timing field in it) and name the same straggler."""
    pytest.importorskip("dask.distributed", reason="pip install 'traceinsight-analyzer[dask]'")
    from traceinsight import analyze
    from traceinsight.jobs import rank_summaries
    from traceinsight.options import Options

    two = Runtime(threads=2, workers=2)
    local = analyze(H200 / job, runtime=two).to_json()
    out = tmp_path / "job.json"
    argv = ["analyze", str(H200 / job), "--scheduler", "local", "-j", "2", "--no-html", "-q"]
    assert main([*argv, "--json", str(out)]) == 0
    on_dask = json.loads(out.read_bytes())
    assert on_dask["metrics"]["straggler_rank"] == (1 if job == "ddp_straggler" else None)
    on_dask["command"] = local["command"]  # the CLI records its own command line
    assert on_dask == json.loads(json.dumps(local))
    # what a task sends back: no event table, the cross-rank tables compact
    s = rank_summaries(H200 / job, Options(), Runtime(threads=1, workers=1))[0]
    assert s.analysis is not None and s.analysis.trace is None
    assert s.payload is not None and s.payload.collectives.height < 200


def test_summary_holds_compute_only_where_collectives_ran():
    """A rank's summary carries its compute union only inside its collectives' spans (where
    every wait lies) and no idle gaps: the cross-rank figures equal those from the whole union
    of the rank's compute kernels, rebuilt here from its events."""
    from dataclasses import replace

    from traceinsight.analyzers.cross_rank import analyze_cross_rank
    from traceinsight.jobs import rank_summaries
    from traceinsight.model import intervals as iv
    from traceinsight.options import Options
    from traceinsight.parsers import load_trace

    job = H200 / "ddp_straggler"
    sent = rank_summaries(job, Options(), Runtime(threads=1, workers=1))
    whole = []
    for s in sent:
        assert s.analysis is not None and s.analysis.results.idle.segments is None
        p = s.payload
        assert p is not None
        ev = load_trace(s.path).events
        gpu = ev.filter(pl.col("kind") == "kernel")["device"].min()
        compute = ev.filter(
            (pl.col("kind") == "kernel")
            & (pl.col("device") == gpu)
            & (pl.col("kernel_class") != "communication")
        )
        full = iv.clip(iv.union(compute), p.window_start_ns, p.window_end_ns)
        spans = iv.union(p.collectives)
        assert iv.total(p.compute_busy) == iv.total(iv.intersect(full, spans)) > 0
        assert p.compute_busy.height < full.height
        whole.append(replace(p, compute_busy=full))
    sent_cross = analyze_cross_rank([s.payload for s in sent])
    whole_cross = analyze_cross_rank(whole)
    # rank 0 waits 187 ms for the straggler, 56 ms of it behind its own compute
    split = sent_cross.comm_split["0"]["all_reduce"]
    assert split["exposed_wait_ns"] < split["wait_ns"]
    for name in ("comm_split", "wait_caused_ns", "exposed_wait_by_rank_ns", "charged_by_rank_ns"):
        assert getattr(sent_cross, name) == getattr(whole_cross, name)


def test_local_cluster_workers_start_without_the_profiler(monkeypatch):
    """The LocalCluster's workers start with Dask's profiler off (it keeps a call tree of each
    second's samples for an hour, and grew a worker past a rank's own analysis on a long job)
    and polars on their share of the cores, as pool workers do. (The cluster itself is not
    started: the configuration it would be built under is read.)"""
    distributed = pytest.importorskip("dask.distributed", reason="pip install dask[distributed]")
    import dask

    from traceinsight.runtime import cores_available, dask_client

    class Built(Exception):
        pass

    seen = []

    def cluster(**kwargs):
        profile = dask.config.get("distributed.worker.profile.enabled")
        seen.append((profile, kwargs["n_workers"], kwargs["env"]))
        raise Built

    monkeypatch.setattr(distributed, "LocalCluster", cluster)
    with pytest.raises(Built), dask_client("local", 3):
        pass
    share = str(max(1, cores_available() // 3))
    assert seen == [(False, 3, {"POLARS_MAX_THREADS": share})]
    assert dask.config.get("distributed.worker.profile.enabled") is True  # only for the cluster


def test_peak_rss_is_the_process_own():
    """A spawned process's peak is its own, not its parent's size at the fork (ru_maxrss on
    Linux carries that): a small child of a parent holding 300 MB reads well under it."""
    import subprocess
    import sys

    from traceinsight.runtime import peak_rss_bytes

    held = bytearray(300 * 2**20)
    held[::4096] = b"\x01" * len(held[::4096])  # touched: resident
    code = "from traceinsight.runtime import peak_rss_bytes; print(peak_rss_bytes())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert 0 < int(out.stdout) < 150 * 2**20 < peak_rss_bytes()
    del held


def test_diff_and_gate(tmp_path, capsys):
    names = ("dataloader_starved", "dataloader_workers")
    before, after = (H200 / f"{n}.pt.trace.json.xz" for n in names)
    out = tmp_path / "d.json"
    assert (
        main(
            [
                "diff",
                str(before),
                str(after),
                "-o",
                str(tmp_path / "d.html"),
                "--json",
                str(out),
                "-q",
                "--fail-if-slower",
                "5",
            ]
        )
        == 0
    )
    doc = json.loads(out.read_text())
    # The change in median step time, from the CUDA-event step times in the truth files (first
    # three recorded steps; the fourth holds the profiler's export): 20.62 / 50.58 ms - 1 = -59.2%.
    # Within 2 points: the step times themselves are matched within 3%.
    truths = [json.loads((H200 / f"{n}.truth.json").read_text()) for n in names]
    med = [statistics.median(t["step_time_ms"][:3]) for t in truths]
    assert doc["step_time_change"] == pytest.approx(med[1] / med[0] - 1, abs=0.02)
    assert [f["id"] for f in doc["findings"]["resolved"]] == ["dataloader_stall"]
    idle = {r["cause"]: r for r in doc["idle_by_cause"]}
    assert idle["dataloader"]["after_ns"] == 0
    # before: the time in next(loader), measured with perf_counter in the loop (truth file),
    # per step (the diff's idle is per step where both sides have steps)
    steps = truths[0]["per_step"]
    in_next_ns = sum(s["next_ns"] for s in steps) / len(steps)
    assert idle["dataloader"]["per"] == "step"
    assert idle["dataloader"]["before_ns"] == pytest.approx(in_next_ns, rel=0.05)
    assert (tmp_path / "d.html").read_text().count("dataloader_stall") >= 1
    assert main(["diff", str(after), str(before), "--no-html", "-q", "--fail-if-slower", "5"]) == 3
    # graphs replace eager launches: kernels appear and disappear, matched by name and class
    assert (
        main(
            [
                "diff",
                str(H200 / "launch_bound_eager.pt.trace.json.xz"),
                str(H200 / "launch_bound_compiled.pt.trace.json.xz"),
                "--no-html",
                "-q",
                "--json",
                str(out),
                "--force",
            ]
        )
        == 0
    )
    k = json.loads(out.read_text())["kernels_per_step"]
    assert k["appeared_count"] > 0 and k["disappeared_count"] > 0
    assert any(r["name"].startswith("triton_") for r in k["appeared"])


def _section(html: str, sid: str) -> str:
    part = html[html.index(f'<section id="{sid}">') :]
    return part[: part.index("</section>")]


def test_job_report_has_each_ranks_memory(tmp_path):
    """Two memory recordings as the ranks of one job: the job's Memory section shows each
    rank's numbers as its own analysis has them, and the memory findings of either rank."""
    import re

    import traceinsight
    from traceinsight.report.format import fmt_bytes, fmt_pct, fmt_signed_bytes

    job = tmp_path / "job"
    job.mkdir()
    names = ("mem_healthy", "mem_leak")
    for r, name in enumerate(names):
        shutil.copy(H200 / "memory" / f"{name}.pt.trace.json.xz", job / f"rank{r}.pt.trace.json.xz")
    html_path = tmp_path / "job.html"
    assert main(["analyze", str(job), "-o", str(html_path), "-q", "--no-replay"]) == 0
    html = html_path.read_text()
    section = _section(html, "memory")
    assert "No memory events" not in section and "https://" not in html
    rows = re.findall(r"<tr><td>(\d+)</td>(.*?)</tr>", section)
    assert [int(r) for r, _ in rows] == [0, 1]
    alone = [
        traceinsight.analyze(H200 / "memory" / f"{name}.pt.trace.json.xz", replay=False)
        for name in names
    ]
    for (rank, cells), a in zip(rows, alone, strict=True):
        m = a.metrics
        shown = re.findall(r"<td[^>]*>([^<]*)</td>", "<td>" + cells)
        assert shown == [
            "0",  # the rank's GPU
            fmt_bytes(m["memory_peak_allocated_bytes"]),
            fmt_bytes(m["memory_peak_reserved_bytes"]),
            fmt_bytes(m["device_memory_bytes"]),
            fmt_pct(m["memory_headroom_ratio"]),
            fmt_pct(m["memory_fragmentation_ratio"]),
            fmt_signed_bytes(m["memory_growth_bytes_per_step"]),
            f"{m['allocator_device_allocs_per_step']:.1f}",
            f"{m['allocator_device_frees_per_step']:.1f}",
        ], rank
    # the numbers themselves: the leak's peak and its growth as torch measured it
    truth = json.loads((H200 / "memory" / "mem_leak.truth.json").read_text())
    assert truth["leaked_bytes_per_step"] == 8 * 2**20
    assert "748.6 MB" in rows[1][1] and "+8.4 MB" in rows[1][1] and "0 B" in rows[0][1]
    # the ranks' memory findings, each with its rank, as each rank's own analysis finds them
    listed = re.findall(
        r"<li>rank (\d+): <span class=\"sev (\w+)\">\w+</span> <b>(\w+)</b>", section
    )
    want = [
        (str(r), f.severity, f.id)
        for r, a in enumerate(alone)
        for f in a.findings
        if f.id in ("memory_growth", "memory_fragmentation", "allocator_churn", "memory_headroom")
    ]
    assert listed == want and ("1", "medium", "memory_growth") in listed
    # the rows reach the page's data through |tojson too
    data = json.loads(re.search(r'id="ti-data">(.*?)</script>', html, re.S).group(1))
    assert [r["memory_peak_allocated_bytes"] for r in data["memory"]] == [706083328, 748550656]


def test_job_report_without_memory_events_says_how_to_record(tmp_path):
    for name in ("rank0.json", "rank1.json"):
        shutil.copy(TINY / "comm_overlap.json", tmp_path / name)
    job = analyze_job(tmp_path, runtime=Runtime(workers=1))
    from traceinsight.report.html import render_job_html

    section = _section(render_job_html(job.to_json()), "memory")
    assert "No memory events (record with" in section and "profile_memory=True" in section
    assert "<table" not in section
