"""Audit 19's report defects (the HTML pages and the terminal read as a user): each test renders
the page or the summary a user sees and asserts on its text.

D6 the job page's "exposed comm" column, D8 nsys advice, D9 the device's memory type and tensor
dtype, D12 the job page's wording, D13 the roofline and the kernel shares without JavaScript,
D14/D15 negative zeros, signs and units.
"""

from __future__ import annotations

import copy
import html as html_lib
import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

import traceinsight
from traceinsight.api import analyze_trace
from traceinsight.cli import main
from traceinsight.jobs import analyze_job
from traceinsight.model.devices import _table, lookup
from traceinsight.model.schema import DeviceInfo, Trace
from traceinsight.report.format import (
    a_times,
    fmt_ms,
    fmt_ns,
    fmt_num,
    fmt_pct,
    fmt_signed,
    fmt_signed_ns,
    memory_peak_words,
    tensor_peak_dtypes,
)
from traceinsight.report.html import (
    median_step_label,
    render_html,
    render_job_html,
    top_findings,
)
from traceinsight.report.terminal import render_summary
from traceinsight.runtime import Runtime

from .conftest import FIXTURES, H200, TINY
from .test_efficiency import _tiny

BF16 = '"c10::BFloat16"'
T4 = DeviceInfo(0, "Tesla T4", 40, 15637086208, "7.5")
H200_DEVICE = DeviceInfo(0, "NVIDIA H200", 132, 150109880320, "9.0")


def _text(page: str) -> str:
    """The page's visible text, roughly: scripts and styles out, tags out, entities decoded."""
    page = re.sub(r"<(script|style)\b.*?</\1>", "", page, flags=re.S)
    return html_lib.unescape(re.sub(r"<[^>]+>", "", page))


def _section(page: str, sid: str) -> str:
    part = page[page.index(f'<section id="{sid}">') :]
    return part[: part.index("</section>")]


def _trace(device: DeviceInfo, add_us: float = 100) -> Trace:
    """test_efficiency's one-step trace (a bf16 GEMM with its recorded shapes, a memory-bound
    add moving 6 MiB in ``add_us``: 63 GB/s at 100 us, 19.7% of a T4's 320 GB/s, 1.3% of an
    H200's 4.8 TB/s) on ``device``."""
    t = _tiny(add_us)
    t.meta.devices = [device]
    return t


@pytest.fixture(scope="module")
def t4_doc() -> dict[str, Any]:
    return analyze_trace(_trace(T4)).to_json()


@pytest.fixture(scope="module")
def h200_doc() -> dict[str, Any]:
    return analyze_trace(_trace(H200_DEVICE)).to_json()


# --- D9: the device's memory type and tensor-peak dtype ------------------------------------------

HBM = {"HBM2", "HBM2e", "HBM3", "HBM3e"}
GDDR = {"GDDR6", "GDDR6X", "GDDR7"}


def test_every_spec_row_names_its_memory_type() -> None:
    """devices.toml: each row's memory as its datasheet names it, read into the spec and the
    JSON's ``source.devices[i].memory_type``."""
    rows, _ = _table()
    assert rows and all(r.get("memory_type") in HBM | GDDR for r in rows), [
        r["id"] for r in rows if r.get("memory_type") not in HBM | GDDR
    ]
    gddr = {r["id"] for r in rows if r["memory_type"] in GDDR}
    assert gddr == {
        "T4",
        "A10",
        "A10G",
        "A40",
        "L4",
        "L40S",
        "RTX-5090",
        "RTX-4090",
        "RTX-3090",
        "RTX-3080",
        "RTX-A6000",
    }
    # a name of the table matches its card, not the Ti beside it (82 and 84 SMs, other clocks)
    assert lookup("NVIDIA GeForce RTX 3090").sm_count == 82
    assert lookup("NVIDIA GeForce RTX 3090 Ti") is None
    assert lookup("Tesla T4").memory_type == "GDDR6"
    assert lookup("NVIDIA GeForce RTX 4090").to_json()["memory_type"] == "GDDR6X"
    assert lookup("NVIDIA H200", 150109880320, 132, "9.0").to_json()["memory_type"] == "HBM3e"
    assert lookup("NVIDIA A100-SXM4-80GB", 85e9, 108, "8.0").memory_type == "HBM2e"
    assert lookup("AMD Instinct MI300X").memory_type == "HBM3"


def test_a_t4_page_says_dram_and_fp16(t4_doc: dict[str, Any]) -> None:
    """audit 19: "dense bf16/fp16 tensor peak 65 TFLOP/s" and "39.3% of HBM" on a T4 (GDDR6,
    no bf16)."""
    dev = t4_doc["source"]["devices"][0]
    assert dev["spec"] == "T4" and dev["memory_type"] == "GDDR6"
    ratio = t4_doc["metrics"]["memory_bound_bandwidth_ratio"]
    assert ratio == pytest.approx(3 * 2 * 1024**2 / 100e-6 / 320e9)
    text = _text(_section(render_html(t4_doc), "efficiency"))
    assert "dense fp16 tensor peak 65 TFLOP/s" in text and "bf16/fp16" not in text
    assert f"{fmt_pct(ratio)} of peak DRAM bandwidth" in text
    assert "HBM" not in text
    summary = render_summary(t4_doc)
    assert f"elementwise at {fmt_pct(ratio)} of peak DRAM bandwidth" in summary
    assert "HBM" not in summary


def test_an_h200_page_says_hbm_and_bf16(h200_doc: dict[str, Any]) -> None:
    ratio = h200_doc["metrics"]["memory_bound_bandwidth_ratio"]
    assert ratio == pytest.approx(3 * 2 * 1024**2 / 100e-6 / 4.8e12)
    text = _text(_section(render_html(h200_doc), "efficiency"))
    assert "dense bf16/fp16 tensor peak 990 TFLOP/s" in text
    assert f"{fmt_pct(ratio)} of peak HBM bandwidth" in text
    assert f"elementwise at {fmt_pct(ratio)} of peak HBM bandwidth" in render_summary(h200_doc)


def test_memory_and_dtype_words() -> None:
    """Devices of mixed or unknown memory say the generic word; a device without bf16 its
    fp16 alone."""
    hbm = {"spec": "H200-SXM", "memory_type": "HBM3e"}
    gddr = {"spec": "L4", "memory_type": "GDDR6"}
    assert memory_peak_words([hbm, hbm]) == "of peak HBM bandwidth"
    assert memory_peak_words([hbm, gddr]) == "of peak DRAM bandwidth"
    assert memory_peak_words([{"spec": None, "memory_type": None}]) == "of peak DRAM bandwidth"
    # an idle device does not decide it
    assert memory_peak_words([hbm, {**gddr, "active": False}]) == "of peak HBM bandwidth"
    assert tensor_peak_dtypes({"fp32": 8.1, "fp16": 65.0}) == "fp16"
    assert tensor_peak_dtypes({"bf16": 989.5, "fp16": 989.5}) == "bf16/fp16"


def test_no_value_no_unit() -> None:
    """audit 19: "memory-bound bandwidthn/a of HBM" and "roofs.No FLOPs" (an unknown device)."""
    doc = traceinsight.analyze(
        FIXTURES / "nsys" / "nsys-ai__mock.sqlite.xz", replay=False
    ).to_json()
    # its RTX 3080 as a device the spec table lacks (the table has it since audit 20)
    dev = doc["details"]["efficiency"]["device"]
    doc["details"]["efficiency"]["device"] = dict.fromkeys(dev)
    doc["metrics"]["memory_bound_bandwidth_ratio"] = None
    text = _text(_section(render_html(doc), "efficiency"))
    assert "n/a of" not in text and "roofs.No" not in text
    assert "roofs. No FLOPs" in text


# --- D8: an Nsight Systems trace gets Nsight advice ----------------------------------------------


def test_nsys_pages_give_no_pytorch_recording_advice() -> None:
    """audit 19 (clover): "No FLOPs: record with record_shapes=True (Kineto)" and a Memory
    section leading with torch.profiler on a CUDA C++ nsys export."""
    doc = traceinsight.analyze(
        FIXTURES / "nsys" / "nsys-ai__mock.sqlite.xz", replay=False
    ).to_json()
    assert doc["source"]["format"] == "nsys-sqlite"
    assert doc["details"]["efficiency"]["flops"].get("source") is None
    page = render_html(doc)
    eff, mem = _text(_section(page, "efficiency")), _text(_section(page, "memory"))
    assert "record_shapes" not in eff and "Kineto" not in eff
    assert "No FLOPs: an Nsight Systems export does not record them" in eff and "ncu" in eff
    assert "torch.profiler" not in mem and "profile_memory" not in mem
    assert "nsys profile --cuda-memory-usage=true" in mem
    # a Kineto trace keeps its own advice
    kineto = copy.deepcopy(doc)
    kineto["source"]["format"] = "kineto"
    page = render_html(kineto)
    assert "record_shapes=True" in _text(_section(page, "efficiency"))
    assert "profile_memory=True" in _text(_section(page, "memory"))


# --- D6, D12: the job page -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def job_doc(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    d = tmp_path_factory.mktemp("job")
    for name in ("rank0.json", "rank1.json"):
        shutil.copy(TINY / "comm_overlap.json", d / name)
    return analyze_job(d, runtime=Runtime(workers=1)).to_json()


def test_job_exposed_comm_column_says_it_holds_the_waiting(job_doc: dict[str, Any]) -> None:
    """audit 19: the ranks table's "exposed comm" was exposed transfer + waiting, beside a
    communication finding reporting the transfer alone."""
    ranks = _section(render_job_html(job_doc), "ranks")
    head = re.search(r'<th class="num" title="([^"]*)">exposed comm incl\. waiting</th>', ranks)
    assert head is not None, ranks[:2000]
    title = html_lib.unescape(head.group(1))
    assert "waiting" in title and "share of its window" in title
    assert ">exposed comm</th>" not in ranks
    # the cells are still the metric
    for r in job_doc["ranks"]:
        assert fmt_pct(r["metrics"]["exposed_comm_ratio"]) in ranks


def test_job_cost_line_says_summed_over_the_ranks(job_doc: dict[str, Any]) -> None:
    """audit 19: gpu_underutilized's "Cost: 745.13 ms (30.2% of the window)" was both ranks'
    idle summed over both windows."""
    f = job_doc["findings"][0]
    assert f["what_if"] is None and len(f["evidence"]["cost_by_rank_ns"]) == 2
    assert f["cost_ns"] == sum(f["evidence"]["cost_by_rank_ns"].values())
    text = _text(_section(render_job_html(job_doc), "findings"))
    want = (
        f"Cost: {fmt_ns(f['cost_ns'])} summed over the ranks' windows "
        f"({fmt_pct(f['cost_ratio'])} of those windows summed)."
    )
    assert want in text and "of the window)" not in text
    # one rank's finding says so
    one = copy.deepcopy(job_doc)
    one["findings"][0]["evidence"]["cost_by_rank_ns"] = {"1": f["cost_ns"]}
    text = _text(_section(render_job_html(one), "findings"))
    assert f"Cost: {fmt_ns(f['cost_ns'])} on rank 1 alone" in text


def test_two_ranks_split_one_to_one_have_no_majority(job_doc: dict[str, Any]) -> None:
    """audit 19: "Ranks whose top finding differs from the majority: rank 1" with 2 ranks
    split 1:1."""
    split = copy.deepcopy(job_doc)
    other = dict(split["ranks"][1]["findings"][0], id="small_batch")
    split["ranks"][1]["findings"] = [other]
    split["details"]["cross_rank"]["differing_diagnosis"] = {"1": "small_batch"}
    text = _text(_section(render_job_html(split), "ranks"))
    assert "majority" not in text
    assert "The ranks' top findings differ" in text
    assert "comm_not_overlapped on rank 0; small_batch on rank 1" in text
    # three ranks, two alike: a majority, and the old sentence
    three = copy.deepcopy(split)
    three["ranks"].append(copy.deepcopy(job_doc["ranks"][0]) | {"rank": 2})
    assert top_findings(three)["split"] is False
    text = _text(_section(render_job_html(three), "ranks"))
    assert "Ranks whose top finding differs from the majority: rank 1 (small_batch)." in text
    # all alike: nothing said
    assert "differ" not in _text(_section(render_job_html(job_doc), "ranks"))


def test_job_median_step_is_labelled_by_what_it_is(job_doc: dict[str, Any]) -> None:
    """audit 19: the KPI "median step" over 2 ranks was the slower rank's median
    (analysis.py step_time_median_ns: the upper middle)."""
    doc = copy.deepcopy(job_doc)
    for r, ms in zip(doc["ranks"], (615.12e6, 619.27e6), strict=True):
        r["metrics"]["step_time_median_ns"] = ms
    doc["metrics"]["step_time_median_ns"] = 619.27e6
    assert median_step_label(doc) == "median step (slower middle rank)"
    verdict = _text(_section(render_job_html(doc), "verdict"))
    assert "619.27 ms" in verdict and "median step (slower middle rank)" in verdict
    doc["ranks"].append(copy.deepcopy(doc["ranks"][0]) | {"rank": 2})
    assert median_step_label(doc) == "median step (middle rank)"
    assert median_step_label(job_doc) == "median step"  # no steps on either rank


# --- D13: without JavaScript -----------------------------------------------------------------------


def test_roofline_and_kernel_shares_show_without_javascript(h200_doc: dict[str, Any]) -> None:
    """audit 19: ``svg#roofline`` was empty without JavaScript, and the kernel classes' share
    of kernel time only a CSS bar."""
    page = render_html(h200_doc)
    no_js = re.sub(r"<script\b.*?</script>", "", page, flags=re.S)
    svg = re.search(r'<svg id="roofline".*?</svg>', no_js, re.S)
    assert svg is not None
    points = [
        r
        for r in h200_doc["details"]["efficiency"]["roofline"]["classes"]
        if r.get("arithmetic_intensity") and r.get("roofline_tflops")
    ]
    assert points
    assert svg.group(0).count("<circle") >= len(points) and "<polyline" in svg.group(0)
    assert "peak 990 TFLOP/s" in svg.group(0)
    for p in points:
        title = f"{p['kernel_class']}: {p['roofline_tflops']:.2f} TFLOP/s at "
        assert title + f"{p['arithmetic_intensity']:.1f} FLOP/byte" in svg.group(0)
    table = re.search(r"<noscript>(.*?)</noscript>", no_js, re.S)
    assert table is not None
    cells = _text(table.group(1))
    for p in points:
        assert (
            f"{p['roofline_tflops']:.2f}" in cells and f"{p['arithmetic_intensity']:.1f}" in cells
        )
    # the page's script clears the drawing before drawing it again (no doubled dots)
    assert "while (svg.firstChild) svg.removeChild(svg.firstChild);" in page
    kernels = _section(no_js, "kernels")
    for c in h200_doc["details"]["kernels"]["by_class"]:
        row = re.search(rf"</span>{c['kernel_class']}</td>.*?</tr>", kernels, re.S)
        assert row is not None and f">{fmt_pct(c['time_ratio'])}</span>" in row.group(0)


# --- D14, D15: formatting -------------------------------------------------------------------------


def test_no_negative_zero() -> None:
    """audit 19: "replay error ... -0.0 pts"; every helper leaves a value that rounds to zero
    unsigned, and keeps the sign of one that does not."""
    assert fmt_pct(-1e-5) == "0.0%" and fmt_pct(-0.01) == "-1.0%"
    assert fmt_ns(-0.4) == "0 ns" and fmt_ns(-3) == "-3 ns"
    assert fmt_ms(-1_000) == "0.00 ms" and fmt_ms(-20_000) == "-0.02 ms"
    assert fmt_num(-0.01) == "0"
    assert fmt_signed(-0.04) == "0.0" and fmt_signed(0.04) == "0.0"
    assert fmt_signed(0.6) == "+0.6" and fmt_signed(-38.8) == "-38.8"
    assert fmt_signed_ns(184_100) == "+184.1 us" and fmt_signed_ns(-67_500) == "-67.5 us"
    assert fmt_signed_ns(0.2) == "0 ns" and fmt_signed_ns(-0.2) == "0 ns"


def test_diff_idle_change_has_its_sign(tmp_path: Path) -> None:
    """audit 19: the diff's "profiler 50.2 us | 234.3 us | 184.1 us" had no "+"."""
    pages = H200 / "pairs"
    out, js = tmp_path / "diff.html", tmp_path / "diff.json"
    before, after = (pages / f"h2d_pinned.{k}.pt.trace.json.xz" for k in ("before", "after"))
    assert main(["diff", str(before), str(after), "-q", "-o", str(out), "--json", str(js)]) == 0
    doc = json.loads(js.read_text())
    idle = _section(out.read_text(), "idle")
    rows = doc["idle_by_cause"]
    assert any(r["delta_ns"] > 1_000 for r in rows)
    for r in rows:
        cells = re.search(rf"</span>{r['cause']}</td>(.*?)</tr>", idle, re.S)
        assert cells is not None
        last = re.findall(r'<td class="num">([^<]*)</td>', cells.group(1))[-1]
        assert last == fmt_signed_ns(r["delta_ns"])
        if r["delta_ns"] >= 1:
            assert last.startswith("+"), last
    assert "-0.0" not in _text(out.read_text())
    # the bandwidth row does not say HBM: a diff does not carry the devices' memory
    assert "(of HBM)" not in _text(out.read_text())


def test_reference_rate_column_has_its_unit(h200_doc: dict[str, Any]) -> None:
    """audit 19: the unaligned GEMMs' column "aligned similar" (133, 300) had no unit, and
    its 133 was the roofline's, not an aligned GEMM's."""
    doc = copy.deepcopy(h200_doc)
    gemm = {
        "m": 65,
        "n": 384,
        "k": 16384,
        "dtype": "bf16",
        "count": 6,
        "time_ns": 112961,
        "achieved_tflops": 21.7,
        "saving_ns": 94507,
    }
    doc["details"]["efficiency"]["unaligned_gemms"] = {
        "gemms": [
            dict(gemm, reference_tflops=132.97, reference="roofline"),
            dict(gemm, m=16384, n=65, reference_tflops=300.2, reference="aligned GEMMs"),
        ]
    }
    eff = _section(render_html(doc), "efficiency")
    table = eff[eff.index("GEMMs off the tensor-core alignment") :]
    assert ">reference TFLOP/s</th>" in table and ">aligned similar</th>" not in table
    text = _text(table)
    assert "133 (roofline)" in text and "300 (aligned similar)" in text


def test_title_durations_read_in_seconds_from_one_second() -> None:
    """Audit 17 D8: a title read "7345.86 ms idle in DataLoader.__next__" where the header of
    the same report said "dataloader 7.35 s"."""
    assert fmt_ms(7_345_860_000) == "7.35 s"
    assert fmt_ms(999_994_999) == "999.99 ms" and fmt_ms(999_995_000) == "1.00 s"
    assert fmt_ms(1_000_000_000) == "1.00 s" and fmt_ms(-2_500_000_000) == "-2.50 s"


def test_the_article_follows_the_number() -> None:
    assert [a_times(k) for k in (2, 4, 8, 11, 16, 18, 64, 80)] == [
        "a 2x",
        "a 4x",
        "an 8x",
        "an 11x",
        "a 16x",
        "an 18x",
        "a 64x",
        "an 80x",
    ]


def test_memory_titles_use_the_reports_bytes() -> None:
    """Audit 19: memory_headroom's "a 8x batch fits (about 541 MiB)" beside the memory
    section's decimal "GB"/"MB". The predicted peak is the base allocation plus eight steps'
    activations: 285,391,872 + 8 x 35,183,616 = 566,860,800 B, "566.9 MB"."""
    doc = traceinsight.analyze(H200 / "memory" / "mem_small_batch.pt.trace.json.xz").to_json()
    (f,) = [f for f in doc["findings"] if f["id"] == "memory_headroom"]
    ev = f["evidence"]
    assert ev["base_allocated_bytes"] + 8 * ev["activation_bytes_per_step"] == 566_860_800
    assert ev["predicted_peak_allocated_bytes"] == 566_860_800
    assert "an 8x batch fits (about 566.9 MB)" in f["title"] and "MiB" not in f["title"]
