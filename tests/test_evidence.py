"""Evidence: source attribution (stack fixture vs its truth), trace-health checks on broken variants
of real traces, and the annotated Perfetto trace."""

from __future__ import annotations

import gzip
import json
import random
import shutil
import subprocess
from pathlib import Path
from typing import Any

import orjson
import polars as pl
import pytest

from traceinsight import api
from traceinsight.analyzers.context import build_context
from traceinsight.analyzers.health import analyze_health
from traceinsight.model.schema import Trace
from traceinsight.parsers import load_trace
from traceinsight.report.annotate import CATEGORY, write_annotated

from .conftest import analyzed, raw_json, unpacked_db

ROOT = Path(__file__).resolve().parents[1]
STACK = ROOT / "fixtures/h200/stack/sync_sites.pt.trace.json.xz"
HEALTHY = ROOT / "fixtures/h200/healthy_bf16.pt.trace.json.xz"
GRAPHS = ROOT / "fixtures/h200/launch_bound_cudagraph.pt.trace.json.xz"


def _raw(path: Path) -> dict[str, Any]:
    return orjson.loads(raw_json(path))


def _write(tmp: Path, doc: Any, name: str = "variant.json") -> Path:
    out = tmp / name
    out.write_bytes(orjson.dumps(doc))
    return out


def _checks(path: Path) -> dict[str, dict[str, Any]]:
    h = analyze_health(build_context(load_trace(path)))
    return {c["check"]: c for c in h.checks}


# --- source attribution -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def stack() -> api.TraceAnalysis:
    a = analyzed(STACK)
    assert isinstance(a, api.TraceAnalysis)
    return a


def test_sync_sources_name_the_functions_and_triggers_of_the_truth(stack: Any) -> None:
    truth = json.loads(STACK.with_name("sync_sites.truth.json").read_text())
    steps = len(truth["profiled"]["recorded_step_ms"])  # the recorder's active steps
    (sync,) = [f for f in stack.findings if f.id == "host_sync"]
    got = {(s.function, s.line, s.trigger): s.count for s in sync.evidence["sources"]}
    # Expected from the truth: each site's function and def line (what a with_stack frame names),
    # the trigger its call makes (.item() -> item, .cpu() -> cpu, a tensor-valued if ->
    # aten::is_nonzero, which has no Python frame of its own), count_per_step x steps.
    trigger = {".item()": "item", ".cpu()": "cpu", "if torch.isnan(": "is_nonzero"}
    want: dict[tuple[str, int, str], int] = {}
    for site in truth["sync_sites"]:
        key = (site["function"], site["def_line"], trigger[site["call"]])
        want[key] = want.get(key, 0) + site["count_per_step"] * steps
    assert got == want
    assert sum(got.values()) == truth["syncs_per_step"] * steps == stack.metrics["host_sync_count"]
    # Costs are the blocked time of those very calls: their sum is the sync analyzer's.
    assert sum(s.cost_ns for s in sync.evidence["sources"]) == stack.metrics["host_sync_blocked_ns"]
    costs = [s.cost_ns for s in sync.evidence["sources"]]
    assert costs == sorted(costs, reverse=True)
    assert all(s.file == truth["file"] for s in sync.evidence["sources"])


def test_launch_sources_stay_in_the_users_file(stack: Any) -> None:
    launch = stack.results.sources.by_category["launch"]
    # Every launch of the profiled loop happens under train_loop_step (def line from the truth's
    # caller record: the function holding lines 1095/1096 starts at 1089 in record_pairs.py).
    assert launch and all(s.file == "record_pairs.py" for s in launch)
    assert {s.function for s in launch} <= {"train_loop_step", "log_metrics", "should_stop"}


def test_terminal_names_the_line_and_the_call(stack: Any) -> None:
    from traceinsight.report import terminal

    doc = stack.to_json()
    # The causal model grades this loop's syncs info (0.19 ms of a launch-bound step recorded
    # with_stack, whose profiled host is slow): the summary lists findings above info, so the
    # rendering is checked with the sync finding shown.
    for f in doc["findings"]:
        if f["id"] == "host_sync":
            f["severity"] = "low"
    text = terminal.render(doc)
    assert "syncs in log_metrics() (record_pairs.py:1033) via .item()" in text
    assert "syncs in should_stop() (record_pairs.py:1042) via .is_nonzero()" in text


def test_without_stacks_one_warning_says_how_to_record_them() -> None:
    t = load_trace(STACK)
    bare = Trace(t.events.filter(pl.col("kind") != "python_function"), t.meta)
    a = api.analyze_trace(bare)
    sync = next(f for f in a.findings if f.id == "host_sync")
    assert sync.evidence["sources"] == []
    hints = [w for w in a.warnings if "with_stack=True" in w]
    assert len(hints) == 1
    with_stacks = analyzed(STACK)
    assert not [w for w in with_stacks.warnings if "with_stack=True" in w]


def test_library_frames_are_not_the_users_location() -> None:
    from tests.builder import Events

    e = Events()
    e.op("train.py(10): step", 0, 100, kind="python_function")
    e.op("mylib/util.py(5): helper", 10, 80, kind="python_function")  # user code: not a library
    e.op("torch/_tensor.py(40): item", 20, 60, kind="python_function")
    e.op("<built-in method _local of Tensor object at 0x1>", 25, 50, kind="python_function")
    e.op("logging/__init__.py(1): info", 92, 5, kind="python_function")  # stdlib
    e.runtime("cudaStreamSynchronize", 30, 40)
    e.runtime("cudaDeviceSynchronize", 93, 2)
    e.step(1, 0, 100)
    e.kernel("k", 1, 1, launch_us=0.5, launch_dur_us=0.2)  # the window: the step, on the GPU
    e.kernel("k", 95, 4, launch_us=94, launch_dur_us=0.2)
    ctx = build_context(e.trace())
    from traceinsight.analyzers.sources import analyze_sources

    rows = analyze_sources(ctx).by_category["host_sync"]
    got = {(r.location, r.trigger, r.count, r.cost_ns) for r in rows}
    # the first sync: innermost user frame mylib/util.py:helper, the call beneath it torch's item;
    # the second: inside logging (stdlib), so the user frame is train.py:step, trigger info
    assert got == {
        ("mylib/util.py(5): helper", "item", 1, 40_000),
        ("train.py(10): step", "info", 1, 2_000),
    }


# --- trace health -------------------------------------------------------------------------------


@pytest.mark.parametrize("path", [HEALTHY, GRAPHS, STACK])
def test_healthy_traces_pass_every_check(path: Path) -> None:
    assert _checks(path) == {}


def test_graph_kernels_removed(tmp_path: Path) -> None:
    doc = _raw(GRAPHS)
    ev = doc["traceEvents"]
    graph = {e["args"]["correlation"] for e in ev if e.get("name") == "cudaGraphLaunch"}
    doc["traceEvents"] = [
        e
        for e in ev
        if not (e.get("cat") == "kernel" and e.get("args", {}).get("correlation") in graph)
    ]
    p = _write(tmp_path, doc)
    checks = _checks(p)
    assert set(checks) == {"graph_kernels_missing"}
    c = checks["graph_kernels_missing"]
    assert c["count"] == len(graph) == 4 and c["severity"] == "error"
    a = api.analyze(p)
    dq = {q["check"]: q for q in a.to_json()["data_quality"]}
    assert set(dq) == {"graph_kernels_missing"} and dq["graph_kernels_missing"]["affected"]
    for f in a.findings:  # an error downgrades every finding resting on it to info
        if f.id in dq["graph_kernels_missing"]["affected"]:
            assert f.severity == "info" and "data_quality" in f.tags
            assert f.evidence["data_quality"] == ["graph_kernels_missing"]
    # one graph's kernels kept: a warning, counting the three others
    keep = min(graph)
    doc["traceEvents"] = [
        e
        for e in ev
        if not (e.get("cat") == "kernel" and e.get("args", {}).get("correlation") in graph - {keep})
    ]
    c = _checks(_write(tmp_path, doc, "partial.json"))["graph_kernels_missing"]
    assert c["count"] == 3 and c["severity"] == "warning"


def test_correlation_ids_duplicated(tmp_path: Path) -> None:
    doc = _raw(HEALTHY)
    launches = [e for e in doc["traceEvents"] if e.get("name") == "cudaLaunchKernel"]
    a, b = launches[10], launches[-10]  # two launches far apart, as in two merged traces
    b["args"]["correlation"] = a["args"]["correlation"]
    c = _checks(_write(tmp_path, doc))
    assert set(c) == {"correlation_collision"} and c["correlation_collision"]["count"] == 1


def test_one_duration_overflowed(tmp_path: Path) -> None:
    doc = _raw(HEALTHY)
    kernels = [e for e in doc["traceEvents"] if e.get("cat") == "kernel"]
    kernels[5]["dur"] = 2**32 - 1  # a 32-bit overflow: 71 minutes in a trace of milliseconds
    p = _write(tmp_path, doc)
    c = _checks(p)
    assert set(c) == {"duration_invalid"} and c["duration_invalid"]["count"] == 1
    assert c["duration_invalid"]["severity"] == "error"


def test_negative_duration_on_a_hand_made_table() -> None:
    from tests.builder import Events

    e = Events()
    e.step(1, 0, 100)
    for i in range(10):
        e.kernel("k", 10 + 5 * i, 2, launch_us=5 + 5 * i, launch_dur_us=1)
    e.kernel("bad", 80, -3, launch_us=70, launch_dur_us=1)  # end before start
    c = {x["check"]: x for x in analyze_health(build_context(e.trace())).checks}
    assert set(c) == {"duration_invalid"} and c["duration_invalid"]["count"] == 1
    assert c["duration_invalid"]["message"].startswith("1 event with a negative duration and 0")


def test_kernel_moved_inside_another_on_its_stream(tmp_path: Path) -> None:
    doc = _raw(HEALTHY)
    kernels = sorted(
        (e for e in doc["traceEvents"] if e.get("cat") == "kernel"), key=lambda e: e["ts"]
    )
    long_k = max(kernels[:-1], key=lambda e: e["dur"])
    short = next(
        e
        for e in kernels
        if e["args"]["stream"] == long_k["args"]["stream"]
        and e is not long_k
        and e["dur"] < long_k["dur"] / 4
    )
    short["ts"] = long_k["ts"] + long_k["dur"] / 4  # a clock shift puts it inside
    c = _checks(_write(tmp_path, doc))
    assert set(c) == {"stream_overlap"} and c["stream_overlap"]["count"] == 1


def test_work_queued_before_the_recording_without_steps(tmp_path: Path) -> None:
    # Kineto records the GPU work still queued from warm-up, without its launches; the step
    # aligner keeps it out of the window. Without step annotations the window is the GPU span.
    doc = _raw(HEALTHY)
    ev = [e for e in doc["traceEvents"] if not e.get("name", "").startswith("ProfilerStep#")]
    doc["traceEvents"] = ev
    # expected (an independent count over the raw events): GPU rows whose correlation has no
    # runtime/driver call, starting before the first GPU row whose call was recorded
    calls = {
        e["args"]["correlation"]
        for e in ev
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})
    }
    gpu = [e for e in ev if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    first = min(e["ts"] for e in gpu if e["args"].get("correlation") in calls)
    want = sum(1 for e in gpu if e["args"].get("correlation") not in calls and e["ts"] < first)
    c = _checks(_write(tmp_path, doc))
    assert set(c) == {"launched_before_recording"}
    assert c["launched_before_recording"]["count"] == want > 0


def test_shuffled_events_change_nothing(tmp_path: Path) -> None:
    doc = _raw(HEALTHY)
    random.Random(21).shuffle(doc["traceEvents"])
    p = _write(tmp_path, doc)
    assert _checks(p) == {}
    a, b = analyzed(HEALTHY), api.analyze(p)
    assert a.metrics == b.metrics
    assert [f.to_json() for f in a.findings] == [f.to_json() for f in b.findings]


# --- annotated trace ----------------------------------------------------------------------------


def _strict(data: bytes) -> Any:
    def no_constant(c: str) -> None:
        raise ValueError(f"non-JSON constant {c}")

    return json.loads(data, parse_constant=no_constant)


def _perfetto_fields(events: list[dict[str, Any]]) -> None:
    for e in events:
        assert {"ph", "pid", "tid"} <= set(e), e
        if e["ph"] != "M":
            assert isinstance(e["ts"], (int, float)), e
        if e["ph"] == "X":
            assert isinstance(e["dur"], (int, float)) and e["dur"] >= 0, e
        if e["ph"] in ("s", "f"):
            assert "id" in e, e
        if e["ph"] == "f":
            assert e["bp"] == "e", e


@pytest.mark.parametrize("name", ["ann.json", "ann.json.gz"])
def test_annotated_trace_keeps_the_original_and_adds_valid_events(
    stack: Any, tmp_path: Path, name: str
) -> None:
    out = tmp_path / name
    n = write_annotated(stack, STACK, out)
    raw = out.read_bytes()
    doc = _strict(gzip.decompress(raw) if name.endswith(".gz") else raw)
    orig = _strict(raw_json(STACK))
    k = len(orig["traceEvents"])
    assert doc["traceEvents"][:k] == orig["traceEvents"]  # unchanged, in order
    assert {x: v for x, v in doc.items() if x != "traceEvents"} == {
        x: v for x, v in orig.items() if x != "traceEvents"
    }
    ours = doc["traceEvents"][k:]
    assert len(ours) == n and all(e["cat"] == CATEGORY for e in ours)
    _perfetto_fields(ours)
    phases = {e["ph"] for e in ours}
    assert {"X", "i", "C", "s", "f", "M"} <= phases
    # one instant per finding; idle X events are the analysis' largest gaps, in the trace's time
    assert sorted(e["args"]["id"] for e in ours if e["ph"] == "i") == sorted(
        f.id for f in stack.findings
    )
    steps = [e for e in orig["traceEvents"] if e.get("name", "").startswith("ProfilerStep#")]
    first, last = min(e["ts"] for e in steps), max(e["ts"] + e["dur"] for e in steps)
    idle = [e for e in ours if e["ph"] == "X"]
    # every segment of the window, not only the reported ones: their idle sums to the analysis'
    segs = stack.results.idle.segments
    assert (
        len(idle)
        == segs.height
        == stack.results.idle.segment_count
        > len(stack.results.idle.top_segments)
    )
    assert sum(e["args"]["idle_ns"] for e in idle) == sum(
        stack.results.idle.idle_by_cause_ns.values()
    )
    assert all(first - 1 <= e["ts"] and e["ts"] + e["dur"] <= last + 1 for e in idle)
    # a flow from a sync call to each host_sync gap it was running into
    flows = [e for e in ours if e["ph"] in ("s", "f")]
    host_sync_gaps = segs.filter(pl.col("cause") == "host_sync").height
    assert (
        0 < len(flows) // 2 <= host_sync_gaps and len({e["id"] for e in flows}) == len(flows) // 2
    )
    # the same findings from the annotated file: the parser skips its category
    again = api.analyze(out)
    assert again.metrics == stack.metrics
    assert [f.to_json() for f in again.findings] == [f.to_json() for f in stack.findings]


@pytest.mark.parametrize("name", ["nsys-ai__mock.sqlite", "Mordred__report1.sqlite"])
def test_annotated_nsys_trace_from_the_table(tmp_path: Path, name: str) -> None:
    src = ROOT / "fixtures/nsys" / (name + ".xz")
    a = analyzed(src)
    assert isinstance(a, api.TraceAnalysis) and a.trace is not None
    out = tmp_path / "nsys.json"
    n = write_annotated(a, src, out)
    doc = _strict(out.read_bytes())
    assert len(doc["traceEvents"]) == a.trace.events.height + n
    _perfetto_fields(doc["traceEvents"])
    # Kineto's categories and a base time: it reads back as the same table, to the nanosecond
    again = api.analyze(out)
    assert again.metrics == a.metrics
    assert [f.to_json() for f in again.findings] == [f.to_json() for f in a.findings]


def test_cli_annotate_and_report_link(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from traceinsight.cli import cli

    ann = tmp_path / "a.json.gz"
    html = tmp_path / "r.html"
    r = CliRunner().invoke(
        cli, ["analyze", str(STACK), "-o", str(html), "--annotate", str(ann), "-q"]
    )
    assert r.exit_code == 0, r.output
    page = html.read_text()
    assert str(ann) in page and "ui.perfetto.dev" in page
    assert "every check passed" in page  # the data-quality row of a healthy trace
    r = CliRunner().invoke(cli, ["annotate", str(STACK), "-o", str(tmp_path / "b.json")])
    assert r.exit_code == 0 and "traceinsight events" in r.output


def test_queue_depth_counter_on_a_hand_made_table() -> None:
    from tests.builder import Events
    from traceinsight.report.annotate import annotation_events

    e = Events()
    e.step(1, 0, 100)
    # launches end at 1, 3, 5 us; kernels start at 10, 20, 30: depth 1, 2, 3, then 2, 1, 0
    e.kernel("a", 10, 5, launch_us=0, launch_dur_us=1)
    e.kernel("b", 20, 5, launch_us=2, launch_dur_us=1)
    e.kernel("c", 30, 5, launch_us=4, launch_dur_us=1)
    a = api.analyze_trace(e.trace())
    q = [x for x in annotation_events(a, 0) if x["name"] == "queue depth"]
    assert max(x["args"]["launched_not_started"] for x in q) == 3
    assert min(x["ts"] for x in q) == 1.0  # the first launch call's end, in us


def test_annotated_array_document(stack: Any, tmp_path: Path) -> None:
    # The old Kineto era: the document is the events array itself.
    src = _write(tmp_path, _raw(STACK)["traceEvents"], "array.json")
    a = api.analyze(src)
    out = tmp_path / "array.ann.json"
    n = write_annotated(a, src, out)
    doc = _strict(out.read_bytes())
    assert isinstance(doc, list) and len(doc) == len(_strict(src.read_bytes())) + n
    assert [f.id for f in api.analyze(out).findings] == [f.id for f in a.findings]


def test_graph_kernels_recorded_under_their_launch_are_counted() -> None:
    # The independent count: kernels in the raw file whose correlation is a cudaGraphLaunch's.
    ev = _raw(GRAPHS)["traceEvents"]
    graph = {e["args"]["correlation"] for e in ev if e.get("name") == "cudaGraphLaunch"}
    kernels = [e for e in ev if e.get("cat") == "kernel"]
    in_graphs = sum(1 for e in kernels if e["args"].get("correlation") in graph)
    a = analyzed(GRAPHS)
    assert a.results.launch.graph_launches == len(graph) == 4
    assert a.results.launch.graph_kernels == in_graphs == 704
    assert a.source["event_counts"]["kernel"] == len(kernels)
    assert a.to_json()["data_quality"] == []


def test_rank_clock_skew(tmp_path: Path) -> None:
    src = ROOT / "fixtures/h200/ddp_overlap"
    job = analyzed(src)
    assert isinstance(job, api.JobAnalysis) and job.to_json()["data_quality"] == []
    # rank 1's clock 200 ms ahead: about six of the fixture's 34 ms steps
    for r, shift_us in ((0, 0), (1, 200_000)):
        doc = _raw(src / f"rank{r}.pt.trace.json.xz")
        for e in doc["traceEvents"]:
            if isinstance(e.get("ts"), (int, float)):
                e["ts"] += shift_us
        (tmp_path / f"rank{r}.pt.trace.json.gz").write_bytes(gzip.compress(orjson.dumps(doc)))
    skewed = api.analyze(tmp_path)
    assert isinstance(skewed, api.JobAnalysis)
    assert skewed.ranks[0].metrics["step_time_median_ns"] < 200e6 / 4
    (q,) = skewed.to_json()["data_quality"]
    assert q["check"] == "rank_clock_skew"
    # expected: the shift plus the ranks' own offset in the original (median over steps)
    import statistics

    s0, s1 = ({s.step: s.start_ns for s in r.results.steps.per_step} for r in job.ranks)
    natural = statistics.median(s1[k] - s0[k] for k in s0.keys() & s1.keys())
    # 1 ms: the upper-middle median of a few steps vs statistics.median; ignoring the natural
    # offset (2.2 ms here) fails it
    assert abs(q["skew_ns"] - abs(200e6 + natural)) < 1e6


def test_memory_counter_track(tmp_path: Path) -> None:
    src = ROOT / "fixtures/h200/memory/mem_leak.pt.trace.json.xz"
    a = analyzed(src)
    out = tmp_path / "mem.json"
    write_annotated(a, src, out)
    doc = _strict(out.read_bytes())
    mem = [
        e for e in doc["traceEvents"] if e.get("cat") == CATEGORY and e["name"] == "GPU 0 memory"
    ]
    _perfetto_fields(mem)
    # the raw file's own totals: the largest allocated on the GPU (Device Type 1 = CUDA)
    raw = [
        e["args"]
        for e in _raw(src)["traceEvents"]
        if e.get("name") == "[memory]" and e["args"].get("Device Type") == 1
    ]
    peak = max(m["Total Allocated"] for m in raw)
    assert 1 < len(mem) <= 4000
    assert max(e["args"]["allocated_MiB"] for e in mem) == round(peak / (1 << 20), 3)
    assert max(e["args"]["reserved_MiB"] for e in mem) == round(
        max(m["Total Reserved"] for m in raw) / (1 << 20), 3
    )
    # the counters are skipped on the way back in: the same findings and memory table
    again = api.analyze(out)
    assert [f.to_json() for f in again.findings] == [f.to_json() for f in a.findings]
    assert again.trace is not None and a.trace is not None
    assert again.trace.memory.equals(a.trace.memory)


def test_annotated_rank_of_a_multi_process_nsys_export(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from traceinsight.cli import cli, main

    src = unpacked_db(ROOT / "fixtures/nsys/nsys-ai__mfu_2gpu_after.sqlite")
    assert main(["annotate", str(src), "-o", str(tmp_path / "job.json")]) == 2
    out = tmp_path / "rank1.json"
    r = CliRunner().invoke(cli, ["annotate", str(src), "--rank", "1", "-o", str(out)])
    assert r.exit_code == 0, r.output
    doc = _strict(out.read_bytes())
    _perfetto_fields(doc["traceEvents"])
    a = api.analyze(src, rank=1)
    again = api.analyze(out)
    assert isinstance(a, api.TraceAnalysis) and isinstance(again, api.TraceAnalysis)
    assert again.metrics == a.metrics
    assert [f.to_json() for f in again.findings] == [f.to_json() for f in a.findings]
    ours = [e for e in doc["traceEvents"] if e.get("cat") == CATEGORY]
    assert sum(e["args"]["idle_ns"] for e in ours if e["ph"] == "X") == a.results.idle.idle_ns


def test_annotations_go_into_the_events_not_a_list_after_them(tmp_path: Path) -> None:
    """Found by the fuzz pass: with a list after the events (libkineto writes its logged
    ``"WARNING": [...]`` there) the annotations went into that list."""
    doc = _raw(HEALTHY)
    doc["WARNING"] = ["Dropped 3 activity records [sic]"]
    doc["ERROR"] = []
    src = _write(tmp_path, doc, "logged.json")
    a = api.analyze(src)
    out = tmp_path / "logged.ann.json"
    n = write_annotated(a, src, out)
    got = _strict(out.read_bytes())
    assert got["WARNING"] == doc["WARNING"] and got["ERROR"] == []
    assert len(got["traceEvents"]) == len(doc["traceEvents"]) + n
    again = api.analyze(out)
    assert [f.to_json() for f in again.findings] == [f.to_json() for f in a.findings]
    assert again.to_json()["data_quality"] == a.to_json()["data_quality"] != []


@pytest.mark.skipif(shutil.which("node") is None, reason="no node (V8, Chromium's JSON parser)")
def test_annotated_trace_in_chromiums_json_parser(stack: Any, tmp_path: Path) -> None:
    out = tmp_path / "v8.json"
    n = write_annotated(stack, STACK, out)
    script = (
        "const d = JSON.parse(require('fs').readFileSync(process.argv[1], 'utf8'));"
        "const o = d.traceEvents.filter(e => e.cat === 'traceinsight');"
        "const bad = o.filter(e => !('ph' in e && 'pid' in e && 'tid' in e)"
        " || (e.ph !== 'M' && typeof e.ts !== 'number')"
        " || (e.ph === 'X' && typeof e.dur !== 'number')"
        " || ((e.ph === 's' || e.ph === 'f') && !('id' in e)) || (e.ph === 'f' && e.bp !== 'e'));"
        "console.log(o.length, bad.length);"
    )
    r = subprocess.run(["node", "-e", script, str(out)], capture_output=True, text=True, check=True)
    assert r.stdout.split() == [str(n), "0"]
