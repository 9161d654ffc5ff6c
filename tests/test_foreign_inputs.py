"""Inputs and trace health found wrong by the audit of 29 foreign traces (benchmarks/audit/AUDIT.md): ROCm device
ids, lost device activity, truncation, the duration estimate of bursty traces, unified-memory
migrations, the short-kernel ratio, Kineto as written in 2026, non-UTF-8 nsys text, DLProf NVTX
payloads, and non-profiler Chrome traces. Expected values come from the raw events (plain
json/gzip/sqlite3 here) or by hand."""

from __future__ import annotations

import gzip
import json
import lzma
import shutil
import sqlite3
from collections import Counter
from pathlib import Path

import polars as pl
import pytest

from tests.builder import Events
from tests.conftest import FIXTURES, H200, TINY, shared_or_skip, unpacked_db
from traceinsight import Options
from traceinsight.analyzers.context import build_context
from traceinsight.analyzers.health import analyze_health
from traceinsight.analyzers.idle import FAULT_STREAM_MIN_BYTES_PER_MS
from traceinsight.api import load_events
from traceinsight.cli import main
from traceinsight.errors import EXIT_BAD_INPUT, EXIT_GATE, EXIT_OK, InputError
from traceinsight.model.schema import DeviceInfo
from traceinsight.parsers import load_trace
from traceinsight.parsers.kineto import reconcile_devices
from traceinsight.parsers.nsys.db import Db
from traceinsight.parsers.nsys.nvtx import pyprof_names
from traceinsight.parsers.nsys.tables import event_rows

from .conftest import analyzed

FOREIGN = FIXTURES / "foreign"
ZOOLOGY = FOREIGN / "zoology_a100_inference.json.gz"
AWSGPU = unpacked_db(FOREIGN / "awsgpu_report2.sqlite")
EXTRAP = unpacked_db(FOREIGN / "extrap_concurrent_s16.sqlite")
KINETO_2026 = TINY / "kineto_2026_shape.json"


def _gz_json(path: Path) -> object:
    with gzip.open(path) as fh:
        return json.load(fh)


def _checks(analysis: object) -> dict[str, dict]:
    return {c["check"]: c for c in analysis.data_quality}  # type: ignore[attr-defined]


def _run(args: list[str]) -> int:
    return main(["analyze", *args, "--no-html", "-q"])


# ---- class 3: ROCm device ids ---------------------------------------------------------------


def test_one_device_entry_names_the_one_event_device():
    mi300 = DeviceInfo(0, "AMD Instinct MI300X VF", 304, 205571227648, "9.4")
    devices = [mi300]
    notes = reconcile_devices(devices, [2])
    assert [d.id for d in devices] == [0, 2]
    assert devices[1] == DeviceInfo(2, "AMD Instinct MI300X VF", 304, 205571227648, "9.4")
    assert len(notes) == 1 and "device 2" in notes[0] and "entry 0" in notes[0]
    assert reconcile_devices(devices, [2]) == []  # listed now: nothing more to do


def test_several_entries_map_only_when_unambiguous():
    a100, h100 = ("NVIDIA A100", 108, 80 << 30, "8.0"), ("NVIDIA H100", 132, 80 << 30, "9.0")
    same = [DeviceInfo(i, *a100) for i in range(4)]
    reconcile_devices(same, [9])  # a node of identical GPUs: any of them
    assert same[-1] == DeviceInfo(9, *a100)
    mixed = [DeviceInfo(0, *a100), DeviceInfo(1, *h100)]
    reconcile_devices(mixed, [1, 5])  # one unused entry (0), one missing id (5): paired
    assert mixed[-1] == DeviceInfo(5, *a100)
    ambiguous = [DeviceInfo(0, *a100), DeviceInfo(1, *h100)]
    notes = reconcile_devices(ambiguous, [5, 6, 7])
    assert len(ambiguous) == 2 and "left unnamed" in notes[0]


def _kineto_doc(props: list[dict], kernel_devices: list[int]) -> dict:
    ev = [
        {
            "ph": "X",
            "cat": "user_annotation",
            "name": "ProfilerStep#1",
            "pid": 1,
            "tid": 1,
            "ts": 0,
            "dur": 100,
        },
    ]
    for i, dev in enumerate(kernel_devices):
        ev += [
            {
                "ph": "X",
                "cat": "cuda_runtime",
                "name": "hipLaunchKernel",
                "pid": 1,
                "tid": 1,
                "ts": 1 + 10 * i,
                "dur": 2,
                "args": {"correlation": i + 1},
            },
            {
                "ph": "X",
                "cat": "kernel",
                "name": "Cijk_Alik_Bljk_BBS_BH_MT128x128x64",
                "pid": dev,
                "tid": 0,
                "ts": 4 + 10 * i,
                "dur": 5,
                "args": {"device": dev, "stream": 0, "correlation": i + 1},
            },
        ]
    return {"schemaVersion": 1, "deviceProperties": props, "traceEvents": ev}


def test_rocm_kernels_on_device_2_get_the_single_entry(tmp_path):
    props = [
        {
            "id": 0,
            "name": "AMD Instinct MI300X",
            "totalGlobalMem": 205822885888,
            "computeMajor": 9,
            "computeMinor": 4,
            "numSms": 304,
        }
    ]
    path = tmp_path / "rocm.json"
    path.write_text(json.dumps(_kineto_doc(props, [2, 2])))
    a = analyzed(path)
    devices = {d["id"]: d for d in a.source["devices"]}
    assert list(devices) == [2]
    assert devices[2]["name"] == "AMD Instinct MI300X" and devices[2]["sm_count"] == 304
    assert devices[2]["spec"] == "MI300X"  # matched in the spec table: MFU/roofline possible


@pytest.mark.parametrize(
    ("name", "device"),
    [
        ("inference_sglang_decode_sglang_Qwen3-8B_decode.json.gz", 9),
        ("torch_compile_triton_trace.json.gz", 2),
    ],
)
def test_corpus_rocm_traces_name_their_device(name, device):
    path = shared_or_skip() / "tracelens" / name
    raw = _gz_json(path)
    (entry,) = raw["deviceProperties"]
    on_events = {e["args"]["device"] for e in raw["traceEvents"] if e.get("cat") == "kernel"}
    assert on_events == {device} and entry["id"] != device
    info = {d.id: d for d in load_trace(path).meta.devices}
    assert info[device].name == entry["name"]
    assert info[device].memory_bytes == entry["totalGlobalMem"]


# ---- class 6: health ------------------------------------------------------------------------


def test_launches_without_device_activity_are_lost_activity_not_a_cpu_job(capsys):
    raw = _gz_json(ZOOLOGY)["traceEvents"]
    launch_names = {"cudaLaunchKernel", "cuLaunchKernel", "cudaMemcpyAsync", "cudaMemsetAsync"}
    launches = sum(
        1
        for e in raw
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and e.get("name") in launch_names
    )
    flows = sum(1 for e in raw if e.get("ph") == "s" and e.get("cat") == "ac2g")
    gpu = sum(1 for e in raw if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"))
    assert (launches, flows, gpu) == (268, 268, 0)  # every launch has its flow, no GPU event
    a = analyzed(ZOOLOGY)
    lost = _checks(a)["device_activity_missing"]
    assert lost["severity"] == "error" and lost["count"] == launches
    assert not any("GPU metrics are not applicable" in w for w in a.warnings)
    assert _run([str(ZOOLOGY), "--fail-on", "info"]) == EXIT_GATE
    err = capsys.readouterr().err
    assert "data-quality error" in err and "device_activity_missing" in err
    assert _run([str(ZOOLOGY)]) == EXIT_OK  # without a gate it is a report, not a failure
    assert main(["analyze", str(ZOOLOGY), "--no-html"]) == EXIT_OK
    out = capsys.readouterr().out
    assert "No findings, but the trace failed device_activity_missing" in out
    assert "nothing measurable stands out" not in out


def test_copies_without_kernels_while_modules_load_is_lost_activity():
    ev = Events()
    ev.runtime("cuModuleLoadData", 0, 5000)
    ev.memcpy("HtoD", 6000, 100, nbytes=1 << 20, src="pinned", dst="device")
    ev.memcpy("DtoH", 6200, 100, nbytes=1 << 20, src="device", dst="pinned")
    ctx = build_context(ev.trace(), None, 1)
    (c,) = [c for c in analyze_health(ctx).checks if c["check"] == "device_activity_missing"]
    assert c["severity"] == "error" and c["count"] == 1 and "2 copies/memsets" in c["message"]
    healthy = Events().kernel("k", 10, 5, launch_us=1)
    healthy.memcpy("HtoD", 20, 1, nbytes=4, src="pinned", dst="device")
    checks = analyze_health(build_context(healthy.trace(), None, 1)).checks
    assert not [c for c in checks if c["check"] == "device_activity_missing"]


def test_a_cpu_only_trace_is_not_lost_activity():
    ev = Events().op("aten::mm", 0, 50).op("aten::add", 60, 10)
    checks = analyze_health(build_context(ev.trace(), None, 1)).checks
    assert [c["check"] for c in checks] == []


def test_gpu_ops_without_cuda_activity_are_lost_activity():
    """Session 56's audit: a public audio CNN recorded with activities=[CPU] (its
    aten::cudnn_convolution and 22 CUDA allocator events) read "no GPU activity, nothing to
    diagnose" with no data-quality note. A torch op that runs only on a GPU, or the profiler's
    GPU allocator events, without any CUDA call: the GPU's side was not recorded."""
    import dataclasses

    from traceinsight.model.schema import MEMORY_SCHEMA, conform_side

    trace = Events().op("aten::cudnn_convolution", 0, 50).op("aten::add", 60, 10).trace()
    ctx = build_context(trace, None, 1)
    (c,) = [c for c in analyze_health(ctx).checks if c["check"] == "device_activity_missing"]
    assert c["severity"] == "error" and "aten::cudnn_convolution" in c["message"]
    assert "ProfilerActivity.CUDA" in c["message"]
    # CUDA allocator events alone show it too; CPU ones do not
    alloc = {"rank": [0], "device": [0], "start_ns": [5_000], "bytes": [1 << 20]}
    for device_type, lost in (("cuda", True), ("cpu", False)):
        memory = conform_side(
            pl.DataFrame({**alloc, "device_type": [device_type], "source": ["kineto"]}),
            MEMORY_SCHEMA,
        )
        plain = dataclasses.replace(Events().op("aten::mm", 0, 50).trace(), memory=memory)
        checks = analyze_health(build_context(plain, None, 1)).checks
        assert bool([c for c in checks if c["check"] == "device_activity_missing"]) is lost


def test_truncated_gzip_is_an_error_that_fails_the_gate(tmp_path, capsys):
    whole = H200 / "healthy_bf16.pt.trace.json.xz"
    cut = tmp_path / "cut.pt.trace.json.gz"
    data = whole.read_bytes()
    cut.write_bytes(data[: len(data) // 50])  # the first 2% of the gzip
    a = analyzed(cut)
    assert a.findings == [] or all(f.severity in ("low", "info") for f in a.findings)
    trunc = _checks(a)["trace_truncated"]
    assert trunc["severity"] == "error" and "truncated" in trunc["message"]
    assert _run([str(cut), "--fail-on", "info"]) == EXIT_GATE
    assert "trace_truncated" in capsys.readouterr().err
    assert _run([str(whole), "--fail-on", "medium"]) == EXIT_OK  # the whole file: no error


def test_bursty_trace_has_no_invalid_durations():
    """SGLang's shape: a 523 ms prefill annotation and a 493 ms blocking copy, then a burst of
    short decode events. The 1%..99% span of the old estimate was the burst (~0.5 ms here):
    10x that flagged the prefill. The span of starts is 990 ms: nothing is 10x longer."""
    ev = Events()
    ev.annotation("prefill", 0, 523_000)
    ev.runtime("hipMemcpyWithStream", 100, 493_000)
    for i in range(2000):  # decode burst: 2000 events of 0.2 us within 0.5 ms
        ev.op("aten::add", 989_500 + i * 0.25, 0.2)
    checks = analyze_health(build_context(ev.trace(), None, 1)).checks
    assert "duration_invalid" not in [c["check"] for c in checks]
    # an overflowed duration in the same trace is still caught: 10x the 989.99 ms of starts
    ev.op("aten::mul", 500, 10 * 989_999.75 + 1)
    (bad,) = [
        c
        for c in analyze_health(build_context(ev.trace(), None, 1)).checks
        if c["check"] == "duration_invalid"
    ]
    assert bad["count"] == 1 and bad["severity"] == "error"


def test_sglang_prefill_decode_real_trace_has_no_invalid_durations():
    path = Path("/work/foreign_traces/tl_sglang_qwen3_prefilldecode.json.gz")
    if not path.exists():
        pytest.skip("the audit's foreign traces are not on this machine")
    raw = _gz_json(path)["traceEvents"]
    xs = [e for e in raw if e.get("ph") == "X" and isinstance(e.get("dur"), (int, float))]
    starts = [e["ts"] for e in xs]
    longest = max(e["dur"] for e in xs)
    assert longest < 10 * (max(starts) - min(starts))  # no event 10x the capture
    assert "duration_invalid" not in _checks(analyzed(path))


def test_unified_memory_migrations_are_not_host_to_device_copies():
    con = sqlite3.connect(AWSGPU)
    kinds = dict(
        (k, (n, b))
        for k, n, b in con.execute(
            "SELECT copyKind, count(*), sum(bytes) FROM CUPTI_ACTIVITY_KIND_MEMCPY GROUP BY 1"
        )
    )
    assert kinds == {11: (834, 268_500_992), 12: (1536, 268_435_456)}  # all unified memory
    a = analyzed(AWSGPU)
    assert a.metrics["h2d_bytes"] == 0
    (row,) = a.results.copies.by_kind
    assert (row["copy_kind"], row["src_kind"], row["dst_kind"]) == ("unified", "managed", "managed")
    assert (row["count"], row["bytes"]) == (834 + 1536, 268_500_992 + 268_435_456)
    assert "launched_before_recording" not in _checks(a)


def _idle_between_migrations(
    path: Path, min_bytes_per_ms: int = 0, from_ns: int = 0
) -> tuple[int, int]:
    """(idle between two unified migrations, all idle) in ns, from the raw tables: the union of
    kernels, copies and memsets in time order, each gap's neighbours' kinds; with
    ``min_bytes_per_ms``, only the gaps whose preceding migrations' bytes (those ending where
    the gap starts) per ms of gap reach it; with ``from_ns``, the migrations' gaps beginning
    at or after it."""
    con = sqlite3.connect(path)
    rows = [
        (a, b, False, 0)
        for a, b in con.execute("SELECT start, end FROM CUPTI_ACTIVITY_KIND_KERNEL")
    ]
    rows += [
        (a, b, k in (11, 12, 13), n)
        for a, b, k, n in con.execute(
            "SELECT start, end, copyKind, bytes FROM CUPTI_ACTIVITY_KIND_MEMCPY"
        )
    ]
    if con.execute(
        "SELECT name FROM sqlite_master WHERE name = 'CUPTI_ACTIVITY_KIND_MEMSET'"
    ).fetchall():
        rows += [
            (a, b, False, 0)
            for a, b in con.execute("SELECT start, end FROM CUPTI_ACTIVITY_KIND_MEMSET")
        ]
    rows.sort()
    ended: Counter[int] = Counter()  # migrated bytes by end time
    for _, b, unified, n in rows:
        ended[b] += n if unified else 0
    between = total = 0
    end, last_unified = rows[0][1], rows[0][2]
    for a, b, unified, _ in rows[1:]:
        if a > end:
            total += a - end
            paced = ended[end] * 1_000_000 >= (a - end) * min_bytes_per_ms
            between += (a - end) if (last_unified and unified and paced and end >= from_ns) else 0
        if b > end:
            end, last_unified = b, unified
    return between, total


def test_idle_between_unified_migrations_is_its_own_cause_and_finding():
    """A unified-memory softmax (nsys, T4; session 35's audit): 2,370 page migrations around
    one kernel, the GPU idle 940 ms of a 1.04 s window, read as gpu_underutilized HIGH with no
    cause. 625.25 ms of it lies between two migrations (the host faulting through managed
    memory): unified_memory, HIGH and first; the 315 ms before the kernel's launch stays
    cpu_work."""
    between, total = _idle_between_migrations(AWSGPU)
    a = analyzed(AWSGPU)
    causes = a.metrics["idle_by_cause_ns"]
    assert causes["unified_memory"] == between and abs(between - 625_250_000) < 10_000
    assert sum(causes.values()) == total
    f = a.findings[0]
    assert (f.id, f.severity) == ("unified_memory", "high")
    assert "cudaMemPrefetchAsync" in f.recommendation  # a CUDA app's advice
    # most of it after the kernel (audit s58): the host reads the results a page at a time,
    # so the advice leads with the prefetch to the host
    con = sqlite3.connect(AWSGPU)
    (last,) = con.execute("SELECT max(end) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()
    after, _ = _idle_between_migrations(AWSGPU, from_ns=last)
    assert f.evidence["after_last_kernel_ns"] == after and after > 0.5 * between
    assert f"{after / 1e6:.2f} ms of it after the last kernel" in f.title
    assert f.recommendation.startswith("Most of it comes after the GPU's last kernel")
    assert "cudaCpuDeviceId" in f.snippet


def test_unified_memory_on_the_icon_export():
    """ICON-C's fault streams: all but one gap between migrations at 110-3,000 MB/s; the one
    12.99 ms gap after 60 KB (4.7 MB/s) is the host's other work."""
    path = shared_or_skip() / "nsys" / "ISC25-ICON-C__gpu.sqlite"
    paced, _ = _idle_between_migrations(path, FAULT_STREAM_MIN_BYTES_PER_MS)
    between, _ = _idle_between_migrations(path)
    assert abs(between - paced - 12_986_000) < 1_000
    a = analyzed(path)
    assert a.metrics["idle_by_cause_ns"]["unified_memory"] == paced
    assert a.findings[0].id == "unified_memory"


def test_idle_between_migrations_of_a_host_at_other_work_is_not_unified_memory(tmp_path):
    """A CLUE clustering on a T4 (nsys, audit s57): 242 ms of its 303 ms idle lies between two
    unified-memory migrations, read as unified_memory HIGH and first, "prefetch" advised to a
    program that already prefetches. The migrations take 7.4 ms; in 20 gaps of 1-99 ms the
    host went through the pages before each at 2.6-2.8 MB/s, its CPU samples in snprintf: the
    host printing results. Those gaps are host work (cpu_work), the first finding
    gpu_underutilized naming that code by nsys's CPU samples (the longest gap, 98.83 ms: 96 of
    the 101 samples in it in snprintf under CLUEAlgo::verboseResults); what stays
    unified_memory is the fault streams' pace (7.21 ms), below the finding's 5% of the window."""
    path = tmp_path / "myclue_report3.sqlite"
    path.write_bytes(
        lzma.decompress((FIXTURES / "foreign" / "myclue_report3.sqlite.xz").read_bytes())
    )
    paced, total = _idle_between_migrations(path, FAULT_STREAM_MIN_BYTES_PER_MS)
    between, _ = _idle_between_migrations(path)
    assert round(between / 1e6, 2) == 241.86 and round(paced / 1e6, 2) == 8.65
    a = analyzed(path)
    causes = a.metrics["idle_by_cause_ns"]
    # (a paced gap under the warm-up's one-time calls is warmup: they are checked first)
    assert paced - causes["warmup"] <= causes["unified_memory"] <= paced
    assert sum(causes.values()) == total
    assert causes["cpu_work"] > 0.8 * (between - paced)
    assert "unified_memory" not in {f.id for f in a.findings}
    f = a.findings[0]
    assert (f.id, f.severity) == ("gpu_underutilized", "high")
    # the host code by nsys's own CPU samples in the gaps (nothing recorded covers them)
    assert f.title.endswith(
        "mostly while the host ran CLUEAlgo::verboseResults > __snprintf (CPU samples)"
    )
    top = a.results.idle.top_segments[0]
    assert (top.cause, round(top.dur_ns / 1e6, 2)) == ("cpu_work", 98.83)
    assert top.host_op == "CLUEAlgo::verboseResults > __snprintf (CPU samples)"
    # the longest gap between GPU work in the raw tables, and the samples nsys took in it
    con = sqlite3.connect(path)
    work = sorted(
        row
        for table in ("KERNEL", "MEMCPY", "MEMSET")
        for row in con.execute(f"SELECT start, end FROM CUPTI_ACTIVITY_KIND_{table}")
    )
    end, gaps = work[0][1], []
    for a, b in work[1:]:
        gaps += [(a - end, end, a)] if a > end else []
        end = max(end, b)
    dur, lo, hi = max(gaps)
    assert dur == top.dur_ns
    stacks = con.execute(
        "SELECT e.id, group_concat(s.value, ' | ') FROM COMPOSITE_EVENTS e "
        "JOIN SAMPLING_CALLCHAINS c ON c.id = e.id JOIN StringIds s ON s.id = c.symbol "
        "WHERE e.start >= ? AND e.start < ? GROUP BY e.id",
        (lo, hi),
    ).fetchall()
    printing = [i for i, st in stacks if "verboseResults" in st and "snprintf" in st]
    assert len(stacks) >= 50 and len(printing) > 0.9 * len(stacks)


def test_one_kernel_under_its_cold_launch_has_no_short_kernel_ratio():
    con = sqlite3.connect(AWSGPU)
    ((k_start, k_dur, corr),) = con.execute(
        "SELECT start, end - start, correlationId FROM CUPTI_ACTIVITY_KIND_KERNEL"
    ).fetchall()
    ((l_start, l_dur),) = con.execute(
        "SELECT start, end - start FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE correlationId = ?",
        (corr,),
    ).fetchall()
    assert (k_dur, l_dur) == (35_629_661, 39_156_325)  # 35.6 ms kernel, 39.2 ms launch call
    # the call spent 39.2 ms before the kernel started (lazy module loading), 1.85 us before
    # it returned: its duration is no launch cost the kernel can be compared with
    assert k_start - l_start == 39_154_472 and l_start + l_dur - k_start == 1_853
    a = analyzed(AWSGPU)
    assert a.metrics["short_kernel_ratio"] is None  # no launch measured: no ratio (was 1.0)


def test_short_kernel_ratio_counts_measured_launches_only():
    ev = Events().step(1, 0, 3000)
    ev.kernel("tiny", 10, 2, launch_us=5, launch_dur_us=6)  # 2 us kernel, 6 us launch: short
    ev.kernel("big", 40, 50, launch_us=20, launch_dur_us=5)  # longer than its launch
    ev.kernel("cold", 2000, 300, launch_us=100, launch_dur_us=2500)  # 2.5 ms cold launch
    a = analyze_trace_of(ev)
    assert a.metrics["short_kernel_ratio"] == pytest.approx(1 / 2)


def analyze_trace_of(ev: Events):
    from traceinsight.pipeline import analyze_trace

    return analyze_trace(ev.trace(), Options())


# ---- class 8: Kineto as written in 2026 -----------------------------------------------------


def test_kineto_2026_shape_reads_on_purpose():
    raw = json.loads(KINETO_2026.read_text())
    assert "WARNING" not in raw and "ERROR" not in raw
    by_ph = Counter(e["ph"] for e in raw["traceEvents"])
    counters = [e for e in raw["traceEvents"] if e["ph"] == "C"]
    assert {e["cat"] for e in counters} == {"hardware_counters", "mtia_counters"}
    assert all(isinstance(e["pid"], str) for e in counters)
    xs = [e for e in raw["traceEvents"] if e["ph"] == "X"]
    trace = load_events(KINETO_2026)
    ev = trace.events
    assert ev.height == len(xs) == by_ph["X"]  # one row per duration event, none from counters
    memory = sum(1 for e in raw["traceEvents"] if e.get("name") == "[memory]")
    assert trace.memory.height == memory == 1
    assert trace.meta.extra["non_duration_events"] == sum(by_ph.values()) - by_ph["X"] - memory
    assert not ev.filter(pl.col("name").str.contains("throughput|mtia_dma")).height
    kinds = Counter(ev.get_column("kind").cast(pl.String).to_list())
    assert kinds == {"runtime": 3, "cpu_op": 2, "kernel": 2, "user_annotation": 1, "gpu_sync": 1}
    sync = ev.filter(pl.col("kind") == "gpu_sync").row(0, named=True)
    assert (sync["name"], sync["device"], sync["stream"]) == ("Stream Sync", 0, 7)
    nccl = ev.filter(pl.col("name").str.starts_with("ncclDevKernel")).row(0, named=True)
    assert nccl["kernel_class"] == "communication" and nccl["stream"] == 17
    assert trace.kernel_args.filter(pl.col("collective") == "allreduce").height == 1
    a = analyzed(KINETO_2026)
    # busy by hand: kernels [130, 330) and [360, 660) us in the step [100, 1100): 500 of 1000 us
    assert a.metrics["gpu_busy_ratio"] == pytest.approx(0.5)
    host_ops = ev.filter(pl.col("kind").is_in(["cpu_op", "user_annotation", "runtime"]))
    assert "Stream Sync" not in host_ops.get_column("name").to_list()
    assert a.source["devices"][0]["name"] == "NVIDIA H200"
    assert a.data_quality == []
    assert _run([str(KINETO_2026)]) == EXIT_OK


def test_corpus_counter_events_make_no_rows():
    """tb_plugin's GPU-metrics sample: 78 counter events (``ph: C``, GPU utilization and SM
    efficiency) beside the 2021-era duration events; counters are samples, not events."""
    path = shared_or_skip() / "kineto-samples" / "gpu_metrics_expected.json"
    raw = json.loads(path.read_text())["traceEvents"]
    counters = [e for e in raw if e["ph"] == "C"]
    profiler_cats = {"Operator", "Runtime", "Kernel", "Memcpy"}  # its 'Trace' span is no event
    xs = [e for e in raw if e["ph"] == "X" and e.get("cat") in profiler_cats]
    assert (len(counters), len(xs)) == (78, 253)
    ev = load_trace(path).events
    assert ev.height == len(xs)
    counter_names = {e["name"] for e in counters}
    assert not ev.filter(pl.col("name").is_in(list(counter_names))).height


# ---- class 9: non-UTF-8 text in an nsys export ------------------------------------------------


def test_windows_export_with_cp1252_metadata_reads():
    con = sqlite3.connect(EXTRAP)
    con.text_factory = bytes
    (user,) = con.execute(
        "SELECT value FROM EXPORT_META_DATA WHERE name = 'EXPORT_USER'"
    ).fetchone()
    with pytest.raises(UnicodeDecodeError):
        user.decode("utf-8")  # the fixture keeps the non-UTF-8 byte that crashed the parser
    kernels = con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
    a = analyzed(EXTRAP)
    assert a.source["event_counts"]["kernel"] == kernels == 12
    assert a.source["devices"][0]["name"] == "GeForce GTX 1060 with Max-Q Design"
    assert _run([str(EXTRAP)]) == EXIT_OK


def test_pinned_host_allocations_are_named_with_their_own_advice():
    """Audit 8: the benchmark harness's setup between tests (cudaHostAlloc 115.9 ms and
    cudaFreeHost 60.0 ms over the two allocator gaps) read "20 cudaMalloc/cudaFree calls take
    30.10 ms ... leave the GPU idle 238.51 ms" with cudaMallocAsync's pool for advice. The
    pinned calls in the window (the GPU's span: no steps), summed from the export itself."""
    con = sqlite3.connect(EXTRAP)
    lo, hi = con.execute(
        "SELECT min(s), max(e) FROM (SELECT start s, end e FROM CUPTI_ACTIVITY_KIND_KERNEL "
        "UNION ALL SELECT start, end FROM CUPTI_ACTIVITY_KIND_MEMCPY "
        "UNION ALL SELECT start, end FROM CUPTI_ACTIVITY_KIND_MEMSET)"
    ).fetchone()
    n, ns = con.execute(
        "SELECT count(*), sum(r.end - r.start) FROM CUPTI_ACTIVITY_KIND_RUNTIME r "
        "JOIN StringIds s ON s.id = r.nameId WHERE (s.value LIKE 'cudaHostAlloc%' OR "
        "s.value LIKE 'cudaFreeHost%') AND r.end > ? AND r.start < ?",
        (lo, hi),
    ).fetchone()
    assert (n, ns) == (20, 175_921_823)
    f = next(f for f in analyzed(EXTRAP).findings if f.id == "allocator_churn")
    assert f.evidence["window_pinned_host_calls"] == n
    assert f.evidence["window_pinned_host_ns"] == ns
    assert f.title.startswith("20 pinned host alloc/free calls (175.92 ms of host time)")
    assert "cudaMallocAsync" not in f.recommendation and "once" in f.recommendation


def test_sqlite3_fallback_decodes_text_with_replacement(tmp_path):
    path = tmp_path / "t.sqlite"
    shutil.copy(EXTRAP, path)
    db = Db(path, event_rows)
    try:
        df = db._fetch_sqlite3(
            "SELECT name, value FROM EXPORT_META_DATA", {"name": pl.String, "value": pl.String}
        )
    finally:
        db.close()
    value = dict(df.iter_rows())["EXPORT_USER"]
    assert value == "user \ufffd"


# ---- class 11: DLProf/pyprof NVTX payloads ---------------------------------------------------


def test_pyprof_payloads_are_named_by_what_they_mark():
    names = [
        "{'traceMarker': ['net.py:34', 'conv.py:435'], 'funcStack': "
        "'/<module>/Net::forward/Conv2d::forward/conv2d'}",
        "{'mod': 'Tensor', 'op': 'uniform_', 'args': [{'name': '', 'type': 'tensor'}]}",
        "{'op': 'relu', 'args': []}",
        "{'traceMarker': ['net.py:41']}",
        "{'something': 1}",
        "aten::conv2d",
    ]
    out = pyprof_names(pl.DataFrame({"name": names})).get_column("name").to_list()
    assert out == [
        "conv2d",
        "Tensor.uniform_",
        "relu",
        "net.py:41",
        "{'something': 1}",
        "aten::conv2d",
    ]


# ---- class 12: format detection -------------------------------------------------------------


def test_a_non_profiler_chrome_trace_is_refused(tmp_path, capsys):
    """A Triton server request trace's shape: an array of async b/e events, cat = the model."""
    doc = [
        {"cat": "resnet50", "name": str(i), "id": str(i), "ph": ph, "ts": 10.0 * i + d, "pid": 0}
        for i in range(1, 4)
        for ph, d in (("b", 0), ("e", 5))
    ]
    path = tmp_path / "chrome_trace.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(InputError, match="not a PyTorch profiler"):
        load_trace(path)
    assert _run([str(path)]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(path) in err and "Traceback" not in err


def test_another_tools_trace_with_a_profiler_key_is_refused(tmp_path, capsys):
    """Audit 16: a custom line tracer's document (99change/Triton_insrt) carries
    ``schemaVersion`` beside 9,600 "Line N" duration events; it read "the trace holds no events"
    with exit 0. A profiler key excuses only an empty capture."""
    doc = {
        "schemaVersion": 1,
        "traceEvents": [
            {
                "ph": "X",
                "cat": f"Line {i % 3}",
                "name": f"l{i}",
                "ts": i,
                "dur": 1,
                "pid": 1,
                "tid": 1,
            }
            for i in range(40)
        ],
    }
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(InputError, match="40 Chrome-trace events.*although it has schemaVersion"):
        load_trace(path)
    assert _run([str(path)]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(path) in err and "Traceback" not in err
    # Kineto's own span ("Trace", in every capture) or another device's events beside the key:
    # the profiler's, an empty capture for this tool, still loaded
    for cat in ("Trace", "hpu_op", "gcu_op"):
        span = {"ph": "X", "cat": cat, "name": "PyTorch Profiler (0)", "ts": 1, "dur": 9, "pid": 1}
        path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": [span]}))
        assert load_trace(path).events.height == 0


def test_profiler_documents_without_known_events_still_load(tmp_path):
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps({"schemaVersion": 1, "traceEvents": []}))
    assert load_trace(empty).events.height == 0
    only_meta = tmp_path / "meta.json"
    only_meta.write_text(
        json.dumps(
            {
                "schemaVersion": 1,
                "deviceProperties": [],
                "traceEvents": [
                    {
                        "ph": "M",
                        "name": "process_name",
                        "pid": 1,
                        "tid": 0,
                        "args": {"name": "python"},
                    }
                ],
            }
        )
    )
    assert load_trace(only_meta).events.height == 0
    bare_2020 = tmp_path / "bare.json"  # the 2020 bare array: legacy categories
    bare_2020.write_text(
        json.dumps(
            [
                {
                    "ph": "X",
                    "cat": "Operator",
                    "name": "aten::mm",
                    "pid": 1,
                    "tid": 1,
                    "ts": 0,
                    "dur": 5,
                },
                {
                    "ph": "X",
                    "cat": "Kernel",
                    "name": "volta_sgemm",
                    "pid": 0,
                    "tid": "stream 7",
                    "ts": 2,
                    "dur": 3,
                    "args": {"device": 0, "stream": 7, "correlation": 1},
                },
            ]
        )
    )
    assert load_trace(bare_2020).events.height == 2


def test_triton_server_trace_is_refused_when_present():
    path = Path("/work/foreign_traces/tritonserver_chrome_trace.json")
    if not path.exists():
        pytest.skip("the audit's foreign traces are not on this machine")
    raw = json.loads(path.read_text())
    assert {(e["ph"], e["cat"]) for e in raw} == {("b", "resnet50"), ("e", "resnet50")}
    assert _run([str(path)]) == EXIT_BAD_INPUT
