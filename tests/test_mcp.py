"""``traceinsight mcp``: every tool called through the MCP SDK's own client over stdio, on the
bundled recordings, held to the library's results on the same file (or to an independent sum
over the raw trace events, or to the recording's truth file); bad inputs come back as one-line
tool errors; ``fixes.predict_fixes`` held to the per-finding and all-fixes replays."""

from __future__ import annotations

import collections
import hashlib
import importlib.util
import json
import os
import re
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

import traceinsight
from traceinsight.diff import compare
from traceinsight.errors import InputError
from traceinsight.fixes import predict_fixes
from traceinsight.mcp_server import Session, Tools, View, Workspace

from .conftest import CORPUS, FIXTURES, H200, ROOT, analyzed, raw_json

# found, not imported: both workers collect every file, and the SDK's import is ~2 s of CPU that
# only the worker running these tests needs (serve imports it)
for _name in ("mcp", "anyio"):
    if importlib.util.find_spec(_name) is None:
        pytest.skip(f"{_name} is not installed (the mcp extra)", allow_module_level=True)

SYNC = H200 / "stack" / "sync_sites.pt.trace.json.xz"  # with_stack=True; truth names its lines
SYNC_REL = "h200/stack/sync_sites.pt.trace.json.xz"  # relative to the first --allow (fixtures/)
VLLM = CORPUS / "inference_vllm_decode_full_graph_execution.json.gz"  # no steps: whole GPU span
MI210 = CORPUS / "mi210_gpu_only_trace_gpu_only_trace.json.gz"  # ROCm, over 25 kernel names
PAIR = H200 / "pairs"
TOOLS = {"analyze", "explain", "what_if", "regions", "top_kernels", "diff", "annotate"}
ANSWER_MAX_BYTES = 8 * 1024  # "sized for a context window": a few KB


def serve(
    calls: list[tuple[str, dict[str, Any]]],
    allow: list[Path],
    errlog: Path,
    source_dirs: tuple[Path, ...] = (),
) -> tuple[list[Any], list[Any]]:
    """Start ``traceinsight mcp`` as a subprocess, list its tools and make ``calls`` through the
    SDK's ClientSession over stdio; the server's stderr goes to ``errlog``."""
    import anyio
    from mcp import ClientSession, StdioServerParameters, stdio_client

    args = ["-m", "traceinsight", "mcp"]
    for a in allow:
        args += ["--allow", str(a)]
    for s in source_dirs:
        args += ["--source-dir", str(s)]
    params = StdioServerParameters(command=sys.executable, args=args, cwd=str(ROOT))

    async def session() -> tuple[list[Any], list[Any]]:
        with errlog.open("w") as err:
            async with stdio_client(params, errlog=err) as (r, w), ClientSession(r, w) as s:
                await s.initialize()
                tools = (await s.list_tools()).tools
                results = [await s.call_tool(name, arguments) for name, arguments in calls]
        return tools, results

    return anyio.run(session)


def text_of(result: Any) -> str:
    assert len(result.content) == 1 and result.content[0].type == "text"
    return result.content[0].text


def ok(result: Any) -> dict[str, Any]:
    text = text_of(result)
    assert not result.is_error, text
    assert len(text.encode()) <= ANSWER_MAX_BYTES, f"answer of {len(text)} bytes"
    return json.loads(text)


def tool_error(result: Any) -> str:
    text = text_of(result)
    assert result.is_error, text
    assert "\n" not in text and "Traceback" not in text
    return text


@pytest.fixture(scope="module")
def sync_analysis():
    return traceinsight.analyze(SYNC)


JOB = H200 / "ddp_straggler"
PINNED_PAIR = (
    PAIR / "h2d_pinned.before.pt.trace.json.xz",
    PAIR / "h2d_pinned.after.pt.trace.json.xz",
)
# The calls of the tests below that ask ``--allow fixtures/`` and nothing else, by name: made in
# one server's session (a server per test started the package and the SDK again each time, and
# analyzed the same recording again: 9 servers, ~15 s of the suite's CPU).
SHARED_CALLS: dict[str, tuple[str, dict[str, Any]]] = {
    "analyze_rel": ("analyze", {"path": SYNC_REL}),
    "analyze_abs": ("analyze", {"path": str(SYNC)}),
    "analyze_top": ("analyze", {"path": SYNC_REL, "top": 2}),
    "explain_bare": ("explain", {"path": SYNC_REL, "finding_id": "host_sync"}),
    "what_if_two": ("what_if", {"path": SYNC_REL, "fixes": ["launch_bound", "host_sync"]}),
    "what_if_unknown": ("what_if", {"path": SYNC_REL, "fixes": ["no_such_finding"]}),
    "what_if_none": ("what_if", {"path": SYNC_REL, "fixes": ["gpu_underutilized"]}),
    "top_vllm": ("top_kernels", {"path": str(VLLM), "n": 5}),
    "top_mi210": ("top_kernels", {"path": str(MI210), "n": 25}),
    "regions": ("regions", {"path": SYNC_REL, "n": 4}),
    "diff": ("diff", {"before": str(PINNED_PAIR[0]), "after": str(PINNED_PAIR[1])}),
    "job": ("analyze", {"path": str(JOB)}),
    "job_explain_no_rank": ("explain", {"path": str(JOB), "finding_id": "launch_bound"}),
    "job_explain_rank": ("explain", {"path": str(JOB), "finding_id": "launch_bound", "rank": 1}),
    "job_what_if_rank": ("what_if", {"path": str(JOB), "fixes": ["launch_bound"], "rank": 1}),
    "job_what_if_file": (
        "what_if",
        {"path": str(JOB / "rank1.pt.trace.json.xz"), "fixes": ["launch_bound"]},
    ),
}


@pytest.fixture(scope="module")
def answers(tmp_path_factory, sync_analysis) -> tuple[list[Any], dict[str, Any]]:
    """One ``traceinsight mcp --allow fixtures/``: its tools, and the answer to each of
    :data:`SHARED_CALLS` (the what-if of every fix is the analysis's own, so asked here)."""
    every = [f.id for f in sync_analysis.findings if "transform" in f.evidence and f.cost_ns > 0]
    calls = {**SHARED_CALLS, "what_if_all": ("what_if", {"path": SYNC_REL, "fixes": every})}
    err = tmp_path_factory.mktemp("mcp") / "err.log"
    tools, results = serve(list(calls.values()), [FIXTURES], err)
    assert "Traceback" not in err.read_text()
    return tools, dict(zip(calls, results, strict=True))


def test_tools_listed_with_schemas(answers):
    tools, _ = answers
    by = {t.name: t for t in tools}
    assert set(by) == TOOLS
    for t in tools:
        assert t.description and t.input_schema["type"] == "object"
    required = {n: set(t.input_schema.get("required", [])) for n, t in by.items()}
    assert required == {
        "analyze": {"path"},
        "explain": {"path", "finding_id"},
        "what_if": {"path", "fixes"},
        "regions": {"path"},
        "top_kernels": {"path"},
        "diff": {"before", "after"},
        "annotate": {"path", "out"},
    }
    fixes = by["what_if"].input_schema["properties"]["fixes"]
    assert fixes["type"] == "array" and fixes["items"] == {"type": "string"}
    assert fixes["minItems"] == 1
    assert by["top_kernels"].input_schema["properties"]["n"]["maximum"] == 25
    assert by["analyze"].annotations.read_only_hint is True
    assert by["annotate"].annotations.read_only_hint is False


def test_analyze_is_the_library_result(answers, sync_analysis):
    """The answer's findings, savings and headline are the library's on the same file; an
    absolute and a relative path are the same input (one analysis, from the cache)."""
    rel, absolute = answers[1]["analyze_rel"], answers[1]["analyze_abs"]
    a = ok(rel)
    assert ok(absolute) == a
    lib = sync_analysis
    assert a["path"] == str(SYNC.resolve()) and a["kind"] == "trace"
    assert [f["id"] for f in a["findings"]] == [f.id for f in lib.findings]
    assert [f["severity"] for f in a["findings"]] == [f.severity for f in lib.findings]
    for row, f in zip(a["findings"], lib.findings, strict=True):
        if f.what_if is None:
            assert row["what_if"] is None and row["why_no_estimate"]
            assert row["attributed_ns"] == f.cost_ns
        else:
            w = row["what_if"]
            assert w["step_time_after_ns"] == f.what_if.step_time_after_ns
            assert w["saving_ns"] == f.what_if.step_time_ns - f.what_if.step_time_after_ns
            assert row["transform"] == f.evidence["transform"]
    # this recording: the launch-bound MLP (3 steps) whose CUDA-graph fix saves the most of
    # its causes (a larger batch, small_batch, saves more: a change of the workload)
    causes = [f["id"] for f in a["findings"] if f["id"] not in ("small_batch", "memory_headroom")]
    assert causes[0] == "launch_bound" and a["headline"]["steps"] == 3
    assert a["headline"]["step_time_median_ns"] == lib.metrics["step_time_median_ns"]
    assert a["bound_by"]["engine"] == lib.metrics["step_bound_by"] == "host"
    assert a["all_fixes"]["step_time_after_ns"] == lib.what_if.step_time_after_ns
    assert a["all_fixes"]["transforms"] == list(lib.what_if.transforms)
    assert a["findings_left_out"] == 0 and a["data_quality"] == []


def test_analyze_top_counts_what_it_leaves_out(answers, sync_analysis):
    a = ok(answers[1]["analyze_top"])
    assert [f["id"] for f in a["findings"]] == [f.id for f in sync_analysis.findings[:2]]
    assert a["findings_left_out"] == len(sync_analysis.findings) - 2 == 4


def test_explain_shows_the_code_of_each_sync_site(tmp_path, sync_analysis, answers):
    """host_sync's call sites carry the user's code: the recording's truth names each sync's
    function and line of code; the file has moved on since, and the excerpt follows the
    function to where it is now (found here by an independent scan of the file)."""
    source = FIXTURES / "generate"
    _, (res,) = serve(
        [("explain", {"path": SYNC_REL, "finding_id": "host_sync"})],
        [FIXTURES],
        tmp_path / "err.log",
        source_dirs=(source,),
    )
    e = ok(res)
    lib = next(f for f in sync_analysis.findings if f.id == "host_sync")
    assert e["recommendation"] == lib.recommendation and e["snippet"] == lib.snippet
    assert e["what_if"]["step_time_after_ns"] == lib.what_if.step_time_after_ns
    assert e["regions"] == ["Optimizer.step#AdamW.step"]  # where the syncs' idle lies
    truth = json.loads((H200 / "stack" / "sync_sites.truth.json").read_text())
    lines = (source / truth["file"]).read_text().splitlines()
    sites = {c["function"]: c for c in e["call_sites"]}
    assert len(e["call_sites"]) == min(5, len(lib.evidence["sources"]))
    for want in truth["sync_sites"]:
        site = sites[want["function"]]
        assert site["line"] == want["def_line"]  # as recorded
        now = next(i for i, t in enumerate(lines, 1) if t.startswith(f"def {want['function']}("))
        src = site["source"]
        assert src["file"] == str((source / truth["file"]).resolve())
        assert src["line_now"] == now != want["def_line"]
        assert any(want["code"] in line for line in src["lines"]), (want, src["lines"])
    # without a --source-dir the file is not beside the trace: no code, and a hint says why
    b = ok(answers[1]["explain_bare"])
    assert all(c["source"] is None for c in b["call_sites"]) and "--source-dir" in b["source_hint"]


def test_what_if_replays_the_chosen_fixes_together(answers, sync_analysis):
    lib = sync_analysis
    chosen = ["launch_bound", "host_sync"]
    assert SHARED_CALLS["what_if_two"][1]["fixes"] == chosen
    got = answers[1]
    two, allfx = got["what_if_two"], got["what_if_all"]
    unknown, none = got["what_if_unknown"], got["what_if_none"]
    w = ok(two)
    rec = predict_fixes(lib, chosen)
    assert w["combined"]["step_time_after_ns"] == rec.step_time_after_ns
    assert w["combined"]["transforms"] == ["cuda_graphs", "remove_syncs"]
    alone = {x["id"]: x["step_time_after_ns"] for x in w["each_alone"]}
    assert alone == {f.id: f.what_if.step_time_after_ns for f in lib.findings if f.id in chosen}
    # every fix chosen is the analysis's own all_fixes replay, to the nanosecond
    assert ok(allfx)["combined"]["step_time_after_ns"] == lib.what_if.step_time_after_ns
    assert "no finding 'no_such_finding'" in tool_error(unknown) and str(SYNC) in text_of(unknown)
    assert "no fix to replay" in tool_error(none)


def test_predict_fixes_matches_each_and_all(sync_analysis):
    """The library function: one fix alone is that finding's what_if; all of them the
    analysis's all_fixes; bad choices raise one-line InputErrors."""
    lib = sync_analysis
    with_transform = [f for f in lib.findings if "transform" in f.evidence]
    assert len(with_transform) == 4
    for f in with_transform:
        r = predict_fixes(lib, [f.id])
        assert (r.step_time_ns, r.step_time_after_ns) == (
            f.what_if.step_time_ns,
            f.what_if.step_time_after_ns,
        )
        assert r.transforms == (f.evidence["transform"],)
    every = predict_fixes(lib, [f.id for f in with_transform if f.cost_ns > 0])
    assert every.step_time_after_ns == lib.what_if.step_time_after_ns
    assert list(every.transforms) == list(lib.what_if.transforms)
    # overlapping fixes are counted once: together they save less than the sum of each alone
    alone = sum(f.what_if.step_time_ns - f.what_if.step_time_after_ns for f in with_transform)
    assert every.step_time_ns - every.step_time_after_ns < alone
    for bad, words in (
        ([], "no fixes chosen"),
        (["x"], "no finding 'x'"),
        (["low_occupancy"], "no fix to replay"),
    ):
        with pytest.raises(InputError, match=words) as exc:
            predict_fixes(lib, bad)
        assert "\n" not in str(exc.value)
    no_model = traceinsight.analyze(SYNC, replay=False)
    with pytest.raises(InputError, match="no fix to replay|no step model"):
        predict_fixes(no_model, ["launch_bound"])


def _raw_kernel_totals(path: Path) -> list[tuple[str, int, int]]:
    """Kernel calls and time by name straight from the trace file (name, count, total ns),
    most time first, as the analyzer orders them."""
    raw = json.loads(raw_json(path))
    events = raw["traceEvents"] if isinstance(raw, dict) else raw
    tot: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
    for e in events:
        if e.get("ph") == "X" and str(e.get("cat", "")).lower() == "kernel":
            tot[e["name"]][0] += 1
            tot[e["name"]][1] += round(e["dur"] * 1000)  # Kineto's us -> ns
    return sorted(((n, c, t) for n, (c, t) in tot.items()), key=lambda r: (-r[2], r[0]))


def test_top_kernels_equal_a_raw_sum(answers):
    """Two traces without step markers (the whole GPU span is analyzed): the top kernels are
    the raw events' sums by name; what is cut is counted."""
    vllm, mi210 = answers[1]["top_vllm"], answers[1]["top_mi210"]
    for res, path, n in ((vllm, VLLM, 5), (mi210, MI210, 25)):
        k = ok(res)
        raw = _raw_kernel_totals(path)
        assert [(r["count"], r["total_ns"]) for r in k["kernels"]] == [
            (c, t) for _, c, t in raw[:n]
        ]
        for r, (name, _, _) in zip(k["kernels"], raw, strict=False):
            assert name.startswith(r["name"].rstrip("…"))
        assert k["kernel_count"] == sum(c for _, c, _ in raw)
        assert k["kernel_ns"] == sum(t for _, _, t in raw)
        assert k["left_out"] == {
            "count": sum(c for _, c, _ in raw[n:]),
            "total_ns": sum(t for _, _, t in raw[n:]),
        }
    assert ok(vllm)["kernel_count"] == 425 and ok(mi210)["kernel_count"] == 562


def test_regions_are_the_region_tree(answers, sync_analysis):
    r = ok(answers[1]["regions"])
    tree = sync_analysis.to_json()["details"]["regions"]
    rows = sorted(tree["regions"], key=lambda x: -x["gpu_ns"])
    assert [x["path"] for x in r["regions"]] == [x["path"] for x in rows[:4]]
    assert [x["gpu_ns"] for x in r["regions"]] == [x["gpu_ns"] for x in rows[:4]]
    assert r["left_out"] == tree["region_count"] - 4 == 11
    assert r["regions"][0]["path"] == "nn.Module: Sequential_0"
    assert r["regions"][1]["findings"] == ["host_sync"]


def test_diff_of_the_pinned_copy_pair(answers):
    """The h2d_pinned pair (pageable -> pinned copy): the answer is traceinsight.diff.compare
    on the same two files; measured un-profiled, the step went 16.95 -> 11.14 ms."""
    before, after = PINNED_PAIR
    d = ok(answers[1]["diff"])
    lib = compare(traceinsight.analyze(before), traceinsight.analyze(after))
    assert d["step_time_before_ns"] == lib["step_time_before_ns"]
    assert d["step_time_after_ns"] == lib["step_time_after_ns"]
    assert [x["id"] for x in d["findings"]["resolved"]] == [
        x["id"] for x in lib["findings"]["resolved"][:5]
    ]
    assert "pageable_memcpy" in {x["id"] for x in d["findings"]["resolved"]}
    truth = json.loads((PAIR / "h2d_pinned.truth.json").read_text())["calibration"][0]
    measured = truth["after_ms"] / truth["before_ms"] - 1  # -34%
    assert d["step_time_change"] < 0 and d["significant"] is True
    assert abs(d["step_time_change"] - measured) < 0.1
    assert d["noise_interval"][1] < 0  # faster beyond the noise


def _digest(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def test_annotate_writes_a_new_file_and_never_the_input(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    trace = work / "sync.pt.trace.json.gz"
    shutil.copyfile(SYNC, trace)
    before = _digest(trace)
    out = work / "sync.annotated.json.gz"
    (work / "taken.json").write_text("{}")
    _, (first, again, onto_input, taken, outside) = serve(
        [
            ("annotate", {"path": "sync.pt.trace.json.gz", "out": "sync.annotated.json.gz"}),
            ("annotate", {"path": str(trace), "out": str(out)}),
            ("annotate", {"path": str(trace), "out": str(trace), "force": True}),
            ("annotate", {"path": str(trace), "out": "taken.json"}),
            ("annotate", {"path": str(trace), "out": str(tmp_path / "escape.json")}),
        ],
        [work],
        tmp_path / "err.log",
    )
    a = ok(first)
    assert a["out"] == str(out.resolve()) and a["bytes"] == out.stat().st_size
    doc = json.loads(raw_json(out))
    ours = [e for e in doc["traceEvents"] if e.get("cat") == "traceinsight"]
    assert len(ours) == a["traceinsight_events"] > 0
    assert "already exists" in tool_error(again)
    assert "is the input" in tool_error(onto_input)
    assert "already exists" in tool_error(taken)
    assert (work / "taken.json").read_text() == "{}"
    assert "outside the allowed directories" in tool_error(outside)
    assert not (tmp_path / "escape.json").exists()
    assert _digest(trace) == before  # the input is never modified


def test_bad_inputs_are_one_line_tool_errors(tmp_path):
    allowed, elsewhere = tmp_path / "allowed", tmp_path / "elsewhere"
    allowed.mkdir()
    elsewhere.mkdir()
    shutil.copyfile(SYNC, elsewhere / "t.pt.trace.json.gz")
    os.symlink(elsewhere / "t.pt.trace.json.gz", allowed / "link.pt.trace.json.gz")
    data = SYNC.read_bytes()
    (allowed / "cut.json.gz").write_bytes(data[:200])  # nothing recoverable
    (allowed / "half.json.gz").write_bytes(data[: len(data) // 2])  # salvaged, with a warning
    (allowed / "notes.json").write_text("not a trace")
    shutil.copyfile(SYNC, allowed / "ok.pt.trace.json.gz")
    errlog = tmp_path / "err.log"
    _, results = serve(
        [
            ("analyze", {"path": str(elsewhere / "t.pt.trace.json.gz")}),
            ("analyze", {"path": "link.pt.trace.json.gz"}),
            ("analyze", {"path": "../elsewhere/t.pt.trace.json.gz"}),
            ("analyze", {"path": "missing.json"}),
            ("analyze", {"path": "cut.json.gz"}),
            ("analyze", {"path": "notes.json"}),
            ("analyze", {"path": "ok.pt.trace.json.gz", "steps": "9..2"}),
            ("explain", {"path": "ok.pt.trace.json.gz", "finding_id": "dataloader_stall"}),
            ("top_kernels", {"path": "ok.pt.trace.json.gz", "n": 0}),
            ("analyze", {"path": "half.json.gz"}),
        ],
        [allowed],
        errlog,
    )
    outside, link, dotdot, missing, cut, notes, steps, finding, n0, half = results
    for r in (outside, link, dotdot):
        assert "outside the allowed directories" in tool_error(r)
    assert "missing.json: no such file" in tool_error(missing)
    assert re.search(r"cut\.json\.gz: .*(gzip|truncated|ends early)", tool_error(cut))
    assert "notes.json: not valid JSON" in tool_error(notes)
    assert "--steps" in tool_error(steps)
    assert "no finding 'dataloader_stall'" in tool_error(finding)
    # the schema's minimum, checked by the SDK, reported on one line
    assert "invalid arguments: n: Input should be greater than or equal to 1" in tool_error(n0)
    h = ok(half)  # a truncated trace is salvaged: analyzed, and the warning says so
    assert any("truncated" in w or "ends early" in w for w in h["warnings"])
    assert "Traceback" not in errlog.read_text()


def test_allow_must_be_a_directory(tmp_path):
    import subprocess

    r = subprocess.run(
        [sys.executable, "-m", "traceinsight", "mcp", "--allow", str(tmp_path / "nope")],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=60,
    )
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1


def test_session_caches_per_input_and_view(tmp_path):
    """A second question about the same file and view costs no analysis; another view, or the
    file changed on disk, is a new one."""
    trace = tmp_path / "t.pt.trace.json.gz"
    shutil.copyfile(SYNC, trace)
    session = Session(Workspace.of([tmp_path]))
    tools = Tools(session)
    tools.analyze("t.pt.trace.json.gz", View(), 10)
    tools.explain(str(trace), "launch_bound", View())
    tools.top_kernels("t.pt.trace.json.gz", 3, View())
    assert session.analyses_run == 1
    tools.analyze("t.pt.trace.json.gz", View(steps="4..5"), 10)
    assert session.analyses_run == 2
    os.utime(trace, ns=(trace.stat().st_atime_ns, trace.stat().st_mtime_ns + 10**9))
    tools.analyze("t.pt.trace.json.gz", View(), 10)
    assert session.analyses_run == 3


def test_job_directory_and_its_ranks(answers):
    """A directory of rank traces is a job: the straggler is the library's; one rank's
    questions need rank=N, and a rank's what-if needs the rank's own file (its step model)."""
    job = JOB
    a, no_rank, one, wi_rank, wi_file = (
        answers[1][k]
        for k in ("job", "job_explain_no_rank", "job_explain_rank", "job_what_if_rank")
        + ("job_what_if_file",)
    )
    lib = analyzed(job)
    j = ok(a)
    assert j["kind"] == "job" and [r["rank"] for r in j["ranks"]] == [0, 1]
    assert j["headline"]["straggler_rank"] == lib.cross.straggler_rank == 1
    assert [f["id"] for f in j["findings"]] == [f.id for f in lib.findings][:10]
    assert "pass rank" in tool_error(no_rank)
    rank1 = next(r for r in lib.ranks if r.rank == 1)
    e = ok(one)
    f = next(f for f in rank1.findings if f.id == "launch_bound")
    assert (
        e["title"] == f.title and e["what_if"]["step_time_after_ns"] == f.what_if.step_time_after_ns
    )
    assert "rank1.pt.trace.json.xz: this rank's step model was not kept" in tool_error(wi_rank)
    w = ok(wi_file)["combined"]
    alone = analyzed(job / "rank1.pt.trace.json.xz")
    assert w["step_time_after_ns"] == predict_fixes(alone, ["launch_bound"]).step_time_after_ns


def test_session_sees_a_rank_file_rewritten(tmp_path):
    """A job directory's analysis is stale when one rank's file changes, though the
    directory's own mtime does not."""
    job = tmp_path / "job"
    shutil.copytree(H200 / "ddp_straggler", job)
    session = Session(Workspace.of([tmp_path]))
    tools = Tools(session)
    tools.analyze("job", View(), 10)
    tools.analyze(str(job), View(), 10)
    assert session.analyses_run == 1
    dir_mtime = job.stat().st_mtime_ns
    rank1 = job / "rank1.pt.trace.json.xz"
    os.utime(rank1, ns=(rank1.stat().st_atime_ns, rank1.stat().st_mtime_ns + 10**9))
    assert job.stat().st_mtime_ns == dir_mtime
    tools.analyze("job", View(), 10)
    assert session.analyses_run == 2
