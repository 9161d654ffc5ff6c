import shutil

import polars as pl
import pytest

from traceinsight.errors import InputError
from traceinsight.model.schema import EVENT_SCHEMA
from traceinsight.parsers import load_trace

from .conftest import CORPUS, H200, TINY, raw_json, shared_or_skip


def test_tiny_trace_columns_exact():
    t = load_trace(TINY / "step_dataloader_sync.json")
    ev = t.events
    assert dict(ev.schema) == EVENT_SCHEMA
    k = ev.filter(pl.col("kind") == "kernel").sort("start_ns")
    assert k["start_ns"].to_list() == [1_000_330_000, 1_000_720_000]
    assert k["dur_ns"].to_list() == [200_000, 280_000]
    assert k["device"].to_list() == [0, 0] and k["stream"].to_list() == [7, 7]
    assert k["kernel_class"].cast(pl.String).to_list() == ["elementwise", "gemm"]
    m = ev.filter(pl.col("kind") == "memcpy").row(0, named=True)
    assert (m["copy_kind"], m["src_kind"], m["dst_kind"], m["bytes"]) == (
        "DtoH",
        "device",
        "pinned",
        4,
    )
    assert t.meta.devices[0].name == "Tiny GPU" and t.meta.rank == 0 and t.meta.backend == "nccl"


def test_relative_ns_timestamps_are_exact():
    t = load_trace(CORPUS / "libkineto_test_after_fix_trace.json")
    k = t.events.filter(pl.col("kind") == "kernel").row(0, named=True)
    # ts 88511388202.785 us relative to baseTimeNanoseconds; dur 0.02 us = 20 ns
    assert k["dur_ns"] == 20
    assert "relative ns" in t.meta.format_version
    assert t.events.filter(pl.col("kind") == "gpu_sync").height == 2


def test_2020_bare_array_with_string_tids():
    t = load_trace(CORPUS / "plugin_2021-01_resnet50_nw0_worker0.pt.trace.json.xz")
    assert t.meta.format_version == "2020 bare event array"
    k = t.events.filter(pl.col("kind") == "kernel")
    assert k.height == 9538 and k["stream"].unique().to_list() == [7]
    h2d = t.events.filter(pl.col("copy_kind") == "HtoD")
    assert set(h2d["src_kind"].cast(pl.String).to_list()) == {"pageable"}


def test_gzip_detected_by_content_not_suffix(tmp_path):
    src = H200 / "h2d_pinned.pt.trace.json.xz"
    dst = tmp_path / "renamed.json"  # gzip bytes behind a .json name
    shutil.copy(src, dst)
    assert load_trace(dst).events.height == load_trace(src).events.height
    plain = tmp_path / "plain.json.gz"  # plain JSON behind a .gz name
    plain.write_bytes(raw_json(src))
    assert load_trace(plain).events.height == load_trace(src).events.height


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("benchmark_simple_add_et.json.gz", "Execution Trace"),
    ],
)
def test_non_traces_refused(name, message):
    with pytest.raises(InputError, match=message):
        load_trace(CORPUS / name)


def test_graph_launch_many_kernels_one_correlation():
    from traceinsight.analyzers.context import launch_join

    t = load_trace(CORPUS / "inference_vllm_decode_full_graph_execution.json.gz")
    lj = launch_join(t.events).filter(pl.col("launch_name").str.contains("GraphLaunch"))
    assert lj["correlation"].n_unique() == 1 and lj.height >= 400


def test_rocm_gpu_only_trace():
    """Counts from the raw events: 562 X events of cat kernel, no cpu_op."""
    t = load_trace(CORPUS / "mi210_gpu_only_trace_gpu_only_trace.json.gz")
    assert t.events.filter(pl.col("kind") == "cpu_op").height == 0
    assert t.events.filter(pl.col("kind") == "kernel").height == 562


def test_rocm_host_memory_kind():
    """ROCm names both ends of a copy without pinned/pageable: ``Memcpy HtoD (Host -> Device)``.
    The MI250 ROCm 6.2 trace has two; each must read as HtoD from "host" memory (not pageable,
    not pinned) to "device", with device and duration as in the raw events read here by json."""
    import json
    from decimal import Decimal

    path = shared_or_skip() / "hta" / "amd_trace" / "mi250_minitoy_train_ROCm6_2_kineto.json.gz"
    events = json.loads(raw_json(path))["traceEvents"]
    raw = [e for e in events if e.get("cat") == "gpu_memcpy"]
    assert [e["name"] for e in raw] == ["Memcpy HtoD (Host -> Device)"] * 2
    want = sorted((e["args"]["device"], int(Decimal(str(e["dur"])) * 1000)) for e in raw)
    copies = load_trace(path).events.filter(pl.col("kind") == "memcpy").sort("start_ns")
    kinds = copies.select(pl.col("copy_kind", "src_kind", "dst_kind").cast(pl.String)).rows()
    assert kinds == [("HtoD", "host", "device")] * 2
    assert sorted(copies.select("device", "dur_ns").rows()) == want == [(2, 15720), (2, 22441)]


def test_absolute_fractional_us_keeps_exact_ns(tmp_path):
    """kineto#853 builds: 19 significant digits; a float would round to 256 ns steps."""
    from decimal import Decimal

    stamps = ["1712195495519689.047", "1712195495519695.812", "1712195495519698.687"]
    body = ",\n".join(
        f'  {{"ph": "X", "cat": "cpu_op", "name": "op{i}", "pid": 1, "tid": 1, "ts": {ts}, "dur": 63.813}}'
        for i, ts in enumerate(stamps)
    )
    p = tmp_path / "t.json"
    p.write_text('{"schemaVersion": 1, "traceEvents": [\n' + body + "\n]}")
    t = load_trace(p)
    assert t.events["start_ns"].to_list() == [int(Decimal(s) * 1000) for s in stamps]
    assert t.events["dur_ns"].to_list() == [63813] * 3
    assert not t.meta.warnings


def test_repeated_step_names_are_each_a_step(tmp_path, capsys):
    """Three ranges all named ``train_step`` are three steps, numbered in time order. Hand-computed
    from fixtures/tiny/repeated_step_names.json (µs): hosts 1000-1100, 1200-1300, 1400-1500, their
    kernels end at 1130, 1280, 1550; a step ends at the later of its host end and its kernels' end
    and starts no earlier than the previous step's end: 1000-1130, 1200-1300, 1400-1550."""
    import json

    from traceinsight.cli import main

    out = tmp_path / "o.json"
    trace = TINY / "repeated_step_names.json"
    args = ["analyze", str(trace), "--no-html", "-q", "--json", str(out)]
    assert main([*args, "--step-range", "train_step"]) == 0
    doc = json.loads(out.read_text())
    per_step = doc["details"]["steps"]["per_step"]
    assert [(s["step"], s["start_ns"], s["dur_ns"]) for s in per_step] == [
        (0, 1_000_000, 130_000),
        (1, 1_200_000, 100_000),
        (2, 1_400_000, 150_000),
    ]
    assert doc["metrics"]["steps"] == 3
    # NAME is a literal prefix (docs/COMMANDS.md): "train.step" matches no name, "(" is no regex error;
    # a NAME that matches nothing is a usage error, not an analysis without steps
    for literal in ("train.step", "train_step("):
        assert main([*args, "--force", "--step-range", literal]) == 2
        assert f"--step-range {literal!r}: no annotation" in capsys.readouterr().err
    # the default pattern wants a number (train_step#N): no steps, the GPU span is the window
    assert main([*args, "--force"]) == 0
    assert json.loads(out.read_text())["metrics"]["steps"] == 0


def test_shared_text_keeps_every_value_and_null():
    """The names every span's frame gets (each distinct string's bytes once): the same values,
    nulls included; a column that is not text is left as it is."""
    from traceinsight.parsers.kineto.decode import shared_text

    names = pl.Series("name", ["aten::mm", None, "x" * 40, "aten::mm", "", "x" * 40])
    out = shared_text(names)
    assert out.dtype == pl.String and out.name == "name"
    assert out.to_list() == names.to_list()
    ids = pl.Series("pid", [1, None])
    assert shared_text(ids) is ids


# What a file that is no trace this tool reads is, by the shape of the public files (audit s57):
# a pre-1.8 torch.autograd.profiler export (luxmea's profiler_trace.json), a Chakra execution
# trace (mlcommons/chakra's tests), a rocprofiler-compute database (ROCm/roc-optiq's sample)
@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            '[{"name": "aten::slice", "ph": "X", "ts": 136.73, "dur": 184.65, "tid": 1, '
            '"pid": "CPU functions", "args": {}}]',
            "torch.autograd.profiler export from before PyTorch 1.8",
        ),
        (
            '{"workload_graph": [{"Id": 216, "Name": "aten::flatten_dense_tensors(0)", '
            '"NodeType": 4, "runtime": 318, "data_deps": [], "is_cpu_op": true}]}',
            "Chakra execution trace",
        ),
    ],
)
def test_other_tools_files_named(tmp_path, text, message):
    path = tmp_path / "trace.json"
    path.write_text(text)
    with pytest.raises(InputError, match=message):
        load_trace(path)


def test_a_rocprofiler_compute_database_is_named(tmp_path):
    import sqlite3

    path = tmp_path / "rocprof_compute.db"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE compute_dispatch (dispatch_id INTEGER, kernel_id INTEGER)")
    con.execute("CREATE TABLE compute_kernel (kernel_id INTEGER, kernel_name TEXT)")
    con.commit()
    con.close()
    with pytest.raises(InputError, match="rocprofiler-compute .* not a trace"):
        load_trace(path)
