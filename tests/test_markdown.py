"""``analyze --format markdown``: the summary parsed back by a Markdown parser (markdown-it-py,
CommonMark with GFM tables): the findings table intact, cell by cell, the first finding's
advice and snippet, the data-quality notes; to stdout or to -o FILE."""

from __future__ import annotations

import copy
import shutil
from pathlib import Path
from typing import Any

import pytest

import traceinsight
from traceinsight.cli import main
from traceinsight.report.format import fmt_ms
from traceinsight.report.markdown import MAX_FINDINGS, render

from .conftest import H200, analyzed

markdown_it = pytest.importorskip("markdown_it", reason="markdown-it-py (the test extra)")

SYNC = H200 / "stack" / "sync_sites.pt.trace.json.xz"
HEADER = ["#", "severity", "finding", "saving per step", "step (un-profiled)", "speedup"]


def parse(text: str) -> list[Any]:
    return markdown_it.MarkdownIt("commonmark").enable("table").parse(text)


def tables(tokens: list[Any]) -> list[list[list[str]]]:
    """Every table as rows of cell texts (the header row first)."""
    out: list[list[list[str]]] = []
    row: list[str] | None = None
    for t in tokens:
        if t.type == "table_open":
            out.append([])
        elif t.type == "tr_open":
            row = []
        elif t.type == "inline" and row is not None:
            row.append(t.content)
        elif t.type == "tr_close":
            out[-1].append(row or [])
            row = None
    return out


def headings(tokens: list[Any]) -> list[str]:
    return [tokens[i + 1].content for i, t in enumerate(tokens) if t.type == "heading_open"]


@pytest.fixture(scope="module")
def sync_doc() -> dict[str, Any]:
    return analyzed(SYNC).to_json()


def test_findings_table_and_first_finding(sync_doc):
    tokens = parse(render(sync_doc))
    findings = sync_doc["findings"]
    assert headings(tokens) == [
        "traceinsight: sync_sites.pt.trace.json.xz",
        f"Findings ({len(findings)})",
        f"What to change first: {findings[0]['id']}",
    ]
    (table,) = tables(tokens)
    assert table[0] == HEADER
    assert len(table) - 1 == len(findings) == 6
    for i, (row, f) in enumerate(zip(table[1:], findings, strict=True), 1):
        assert len(row) == 6 and row[0] == str(i) and row[1] == f["severity"]
        assert row[2] == f"**{f['id']}**: {f['title']}"
        w = f["what_if"]
        if w is None:
            assert row[3:] == ["—", "—", "—"]
        else:
            assert row[3] == fmt_ms(w["step_time_ns"] - w["step_time_after_ns"])
            per_sample = " per sample" if w.get("multiplier") else ""
            assert row[5] == f"{w['speedup']:.2f}x{per_sample}"
    # launch_bound's CUDA-graph fix: 2.85 -> 1.36 ms un-profiled, 2.10x (the model's calls
    # captured; log_metrics and should_stop stay eager)
    row = next(r for r in table[1:] if r[2].startswith("**launch_bound**"))
    assert row[3:] == ["1.49 ms", "2.85 ms → 1.36 ms", "2.10x"]
    fences = [t for t in tokens if t.type == "fence"]
    assert len(fences) == 1 and fences[0].info == "python"
    assert fences[0].content.rstrip("\n") == findings[0]["snippet"].rstrip("\n")
    text = "".join(t.content for t in tokens if t.type == "inline")
    assert findings[0]["recommendation"] in text
    # with small_batch's 4x batch: 2.85 -> 0.30 ms per original batch (1.20 ms per 4x step;
    # the elementwise chains fused with their reductions and their ops' dispatch, session 65)
    assert "All fixes together: saves 2.55 ms per original batch (un-profiled step 2.85 ms" in text
    assert "at a 4x batch, 0.30 ms per original batch" in text
    # a first finding with call sites (launch_bound, put first) shows them, from the stacks
    doc = copy.deepcopy(sync_doc)
    doc["findings"].sort(key=lambda f: f["id"] != "launch_bound")
    text = "".join(t.content for t in parse(render(doc)) if t.type == "inline")
    assert "in train_loop_step() (record_pairs.py:1089)" in text


def test_cells_stay_cells(sync_doc):
    """A title with pipes, backticks and a newline does not break its row; a snippet with a
    fence inside stays one code block."""
    doc = copy.deepcopy(sync_doc)
    doc["findings"][0]["title"] = "a | b `c`\nd"
    doc["findings"][0]["snippet"] = "x = 1\n```\ny = 2"
    tokens = parse(render(doc))
    (table,) = tables(tokens)
    assert all(len(r) == 6 for r in table)
    assert table[1][2] == f"**{doc['findings'][0]['id']}**: a | b `c` d"
    (fence,) = [t for t in tokens if t.type == "fence"]
    assert fence.content == "x = 1\n```\ny = 2\n"


def test_many_findings_are_counted(sync_doc):
    doc = copy.deepcopy(sync_doc)
    doc["findings"] = doc["findings"] * 3
    n = len(doc["findings"])
    text = render(doc)
    (table,) = tables(parse(text))
    assert len(table) - 1 == MAX_FINDINGS
    assert f"{n - MAX_FINDINGS} more findings not shown." in text


def test_data_quality_notes_and_warnings(tmp_path):
    """A recording cut in half is salvaged: its warning is a note of the summary, beside the
    data-quality checks (one added to the real document: this recording passes them all)."""
    cut = tmp_path / "cut.json.gz"
    data = (H200 / "h2d_pageable.pt.trace.json.xz").read_bytes()
    cut.write_bytes(data[: len(data) // 2])
    doc = analyzed(cut).to_json()
    truncated = [w for w in doc["warnings"] if "truncated" in w]
    assert truncated and [c["check"] for c in doc["data_quality"]] == ["trace_truncated"]
    doc["data_quality"].append(
        {"severity": "warning", "check": "clock", "message": "m", "affected": ["host_sync"]}
    )
    tokens = parse(render(doc))
    assert "Data quality" in headings(tokens)
    items = [t.content for t in tokens if t.type == "inline"]
    assert "**warning** clock: m (affects host_sync)" in items
    assert any(i.startswith("**error** trace_truncated:") for i in items)
    assert f"warning: {truncated[0]}" in items


def test_job_summary_has_a_rank_table():
    doc = analyzed(H200 / "ddp_straggler").to_json()
    (ranks, findings) = tables(parse(render(doc)))
    assert ranks[0] == ["rank", "GPU busy", "median step", "top finding"]
    assert [r[0] for r in ranks[1:]] == ["0", "1"]
    assert [r[3] for r in ranks[1:]] == [
        r["findings"][0]["id"] if r["findings"] else "—" for r in doc["ranks"]
    ]
    assert findings[1][2].startswith("**straggler**")


def test_cli_markdown_to_stdout_and_to_a_file(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    trace = tmp_path / "t.pt.trace.json.gz"
    shutil.copyfile(SYNC, trace)
    assert main(["analyze", str(trace), "--format", "markdown"]) == 0
    out = capsys.readouterr().out
    want = render(analyzed(trace).to_json())
    assert out == want
    assert not list(tmp_path.glob("*.html"))  # the Markdown is the report: no HTML
    md = tmp_path / "summary.md"
    assert main(["analyze", str(trace), "--format", "markdown", "-o", str(md), "-q"]) == 0
    assert md.read_text() == want and capsys.readouterr().out == ""
    # never overwritten without --force; stdout taken twice is refused
    assert main(["analyze", str(trace), "--format", "markdown", "-o", str(md)]) == 2
    assert "--force" in capsys.readouterr().err
    assert main(["analyze", str(trace), "--format", "markdown", "--json", "-"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "stdout" in err
    # the terminal format is unchanged: the HTML report as before
    assert main(["analyze", str(trace), "-q"]) == 0
    assert (tmp_path / "t.traceinsight.html").exists()


def test_markdown_is_read_from_the_document_only(sync_doc, tmp_path: Path):
    """A stored document (the --json output) renders the same as the live one."""
    import json

    stored = json.loads(json.dumps(sync_doc, default=str))
    assert render(stored) == render(sync_doc)


def test_the_chosen_fixes_line() -> None:
    """``--what-if`` in the Markdown summary as in the terminal's: the chosen fixes' replay (the
    document's own numbers), the ids not raised, and a larger batch priced although its rule
    did not fire (the held-out DeepLabV3: the GPU 66% busy, no batch finding)."""
    path = H200 / "thirdparty" / "segmentation.before.pt.trace.json.xz"
    doc = traceinsight.analyze(
        path, what_if=["unfused_optimizer", "memory_headroom@2", "small_batch@2"]
    ).to_json()
    sel = doc["details"]["what_if"]["selected"]
    line = next(x for x in render(doc).splitlines() if x.startswith("What if"))
    assert f"{sel['speedup']:.2f}x" in line and fmt_ms(sel["step_time_after_ns"]) in line
    assert "Not raised here: `small_batch@2`." in line
    assert "Priced although not raised here: `memory_headroom@2`." in line
