"""diff: comparable sides (environment warnings, the hardware gate), the noise model, iterations
of captures without step markers, and throughput. Hand-made traces with hand-computed values,
and real fixture/corpus traces whose facts are read from the raw files."""

from __future__ import annotations

import json
import random
import statistics
from pathlib import Path

import pytest

from tests.builder import Events
from traceinsight.api import analyze_trace
from traceinsight.cli import main
from traceinsight.commands.shared import gate_exit
from traceinsight.diff import (
    change_interval,
    compare,
    diff_paths,
    environment_warnings,
    kernel_iterations,
    nvtx_iterations,
)
from traceinsight.report.format import fmt_ns

from .conftest import analyzed, raw_json

ROOT = Path(__file__).resolve().parents[1]
H200 = ROOT / "fixtures" / "h200"
CORPUS = ROOT.parent / "shared" / "traces"
if not CORPUS.is_dir():
    CORPUS = Path("/work/shared/traces")
ATTN = "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 128, 4>>"
EW = "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>"


def _stepped(step_us: list[float]):
    """One ProfilerStep per entry, each filled by one kernel from its start to 10 us before its end."""
    e, t = Events(), 0.0
    for i, d in enumerate(step_us):
        e.step(i, t, d)
        e.kernel(EW, t + 5, d - 10, launch_us=t + 1, launch_dur_us=2)
        t += d
    return analyze_trace(e.trace())


# --- comparable sides -------------------------------------------------------------------------


def test_environment_warnings_name_both_sides_and_flag_hardware():
    base = {"gpu": "Tesla V100-SXM2-32GB", "device_count": 1, "world_size": 1, "format": "kineto"}
    same = dict(base)
    assert environment_warnings(base, same) == ([], False)
    other = dict(base, gpu="NVIDIA A100-SXM4-80GB", cuda_runtime_version=12040)
    assert environment_warnings(other, base) == (
        ["different GPUs: NVIDIA A100-SXM4-80GB vs Tesla V100-SXM2-32GB"],
        True,
    )  # a version known on one side only says nothing
    sw = dict(base, cuda_runtime_version=11010)
    assert environment_warnings(dict(base, cuda_runtime_version=12040), sw) == (
        ["different CUDA runtimes: 12040 vs 11010"],
        False,  # software, not hardware: the gate still runs
    )


def _device_names(path: Path) -> list[str]:
    return sorted({p["name"] for p in json.loads(raw_json(path))["deviceProperties"]})


def test_diff_across_gpus_warns_and_refuses_to_gate(tmp_path, capsys):
    before = H200 / "healthy_bf16.pt.trace.json.xz"
    after = ROOT / "fixtures" / "corpus" / "h100_gaunernst_bert-small-uncased__1016001.json.gz"
    # the GPU names as the files' deviceProperties say, read independently of the parser
    (gb,), (ga,) = _device_names(before), _device_names(after)
    assert gb != ga
    out = tmp_path / "d.json"
    args = ["diff", str(before), str(after), "--no-html", "-q", "--json", str(out)]
    assert main([*args, "--fail-if-slower", "5"]) == 2
    assert f"different GPUs: {gb} vs {ga}" in capsys.readouterr().err
    doc = json.loads(out.read_text())
    assert f"different GPUs: {gb} vs {ga}" in doc["warnings"]
    assert doc["hardware_differs"] is True
    assert doc["environment"]["before"]["gpu"] == gb and doc["environment"]["after"]["gpu"] == ga
    # two programs too (a bf16 training loop, a BERT inference): both refusals lifted
    gated = [*args, "--force", "--fail-if-slower", "5", "--allow-different-hardware"]
    assert main(gated) == 2 and "different programs" in capsys.readouterr().err
    assert main([*gated, "--allow-different-programs"]) in (0, 3)
    # no gate asked: a diff across hardware is still written, with its warning
    assert main([*args, "--force"]) == 0


# --- noise model ------------------------------------------------------------------------------


def test_interval_bounds_by_hand():
    # every resampled median lies in [99, 101] before and [109, 111] after, so every change
    # lies in [109/101 - 1, 111/99 - 1] = [0.0792, 0.1212]
    lo, hi = change_interval([100, 101, 99, 100, 100], [110, 111, 109, 110, 110])
    assert 109 / 101 - 1 <= lo <= hi <= 111 / 99 - 1
    # overlapping samples: the interval holds 0
    lo, hi = change_interval([100, 120, 80, 100, 110], [105, 85, 125, 100, 95])
    assert lo < 0 < hi
    assert change_interval([100, 101], [110, 111, 112]) is None  # too few steps
    # fixed seed: the same inputs give the same interval
    assert change_interval([1, 2, 3, 4], [2, 3, 4, 5]) == change_interval(
        [1, 2, 3, 4], [2, 3, 4, 5]
    )


def test_gate_trips_only_outside_the_noise():
    before = _stepped([10_000] * 5)
    steady = compare(before, _stepped([11_000] * 5))
    # each step is its ProfilerStep: 10 ms -> 11 ms, +10%
    assert steady["step_time_change"] == pytest.approx(0.10, abs=1e-6)
    assert steady["gate"]["basis"] == "step_time" and steady["gate"]["significant"] is True
    assert gate_exit(steady["gate"], 5) == 3
    assert gate_exit(steady["gate"], 12) == 0
    # the same +10% median, but after's steps spread from 9 to 13 ms: resampled medians range
    # over 9..13 ms against a constant 10 ms, so the interval holds 0 and the gate holds
    noisy = compare(before, _stepped([9_000, 13_000, 10_000, 12_000, 11_000]))
    assert noisy["step_time_change"] == pytest.approx(0.10, abs=1e-6)
    lo, hi = noisy["noise"]["interval"]
    assert lo < 0 < hi and noisy["gate"]["significant"] is False
    assert gate_exit(noisy["gate"], 5) == 0


# --- captures without step markers ------------------------------------------------------------


def _periodic(iteration_us: float, iterations: int, warmup: bool = True):
    """Iterations of kernels A B C B D 100 us apart (a layer kernel B twice per iteration), one
    every ``iteration_us``; a warm-up kernel once before the first."""
    e = Events()
    if warmup:
        e.kernel("warmup_autotune_kernel", 0, 50)
    for i in range(iterations):
        t = 1000 + i * iteration_us
        for j, name in enumerate(["aa_kernel", "bb_kernel", "cc_kernel", "bb_kernel", "dd_kernel"]):
            e.kernel(name, t + 100 * j, 50)
    return e.trace()


def test_iterations_from_the_repeating_kernel_sequence():
    it = kernel_iterations(_periodic(1000, 6).events)
    assert it is not None
    assert it.period_kernels == 5  # A B C B D, not B's layer spacing
    # 6 iterations 1000 us apart: 5 spacings between anchors, the first (warm-up) dropped
    assert it.iterations == 4
    assert it.per_iteration_ns == (1_000_000,) * 4
    # 31 kernels (the warm-up, then 6 x 5); of the 26 compared one period apart only the
    # warm-up differs from its partner
    assert it.match_ratio == pytest.approx(25 / 26)


def test_no_period_in_a_shuffled_sequence():
    rng = random.Random(1)
    e = Events()
    for j in range(200):
        e.kernel(rng.choice(["k_a", "k_b", "k_c", "k_d"]), 10 * j, 5)
    assert kernel_iterations(e.trace().events) is None


def test_no_marker_diff_compares_iterations():
    before = analyze_trace(_periodic(1000, 8))
    after = analyze_trace(_periodic(1100, 8))
    doc = compare(before, after)
    assert doc["iterations"]["before"]["period_kernels"] == 5
    assert doc["step_time_before_ns"] == 1_000_000 and doc["step_time_after_ns"] == 1_100_000
    assert doc["step_time_change"] == pytest.approx(0.10, abs=1e-9)
    assert doc["gate"]["basis"] == "iteration_time"
    assert gate_exit(doc["gate"], 5) == 3


def _unordered(n_attn: int, n_ew: int, window_us: float, seed: int):
    """n_attn + n_ew kernels of 500 us in a shuffled order, spread evenly over ``window_us``
    (first start to last end): no repeating sequence, no steps."""
    names = [ATTN] * n_attn + [EW] * n_ew
    random.Random(seed).shuffle(names)
    gap = (window_us - 500) / (len(names) - 1)
    e = Events()
    for j, name in enumerate(names):
        e.kernel(name, j * gap, 500)
    return analyze_trace(e.trace())


def test_no_marker_no_period_diff_compares_throughput():
    # the case: the same window, 10% fewer kernels (12% fewer attention calls), the same
    # time per call; the capture spans are equal, so a span "step time" would say 0%
    before = _unordered(50, 50, 99_500, seed=3)
    after = _unordered(44, 46, 99_500, seed=4)
    assert before.metrics["window_ns"] == after.metrics["window_ns"] == 99_500_000
    doc = compare(before, after)
    assert doc["iterations"] is None and doc["step_time_change"] is None
    rows = {r["kernel_class"]: r for r in doc["throughput"]["kernel_classes"]}
    assert rows["all"]["calls_per_s_before"] == pytest.approx(100 / 0.0995)
    assert rows["all"]["calls_per_s_change"] == pytest.approx(-0.10)
    assert rows["attention"]["calls_per_s_change"] == pytest.approx(44 / 50 - 1)
    assert rows["attention"]["ns_per_call_change"] == pytest.approx(0.0, abs=1e-12)
    # audit 19: calls per second are not a unit of work; 90 of 100 calls matched by name (44
    # attention + 46 elementwise) is not the same work recorded, so the gate cannot measure
    km = doc["kernel_match"]
    assert (km["calls_before"], km["calls_after"], km["matched_calls"]) == (100, 90, 90)
    assert km["matched_ratio"] == pytest.approx(0.9)
    assert doc["gate"]["basis"] is None and doc["gate"]["slowdown_ratio"] is None
    assert "90% of the larger side's" in doc["gate"]["reason"]
    assert gate_exit(doc["gate"], 5) == 3


# --- real traces ------------------------------------------------------------------------------


def _corpus(rel: str) -> Path:
    p = CORPUS / rel
    if not p.exists():
        pytest.skip(f"{p} not present (the shared real-trace corpus)")
    return p


def test_real_no_marker_pair_gets_iterations():
    # the legacy autograd profiler samples (ResNet-50, 1 V100) have no ProfilerStep at all;
    # num_workers=4 removes the DataLoader stall, which the ProfilerStep samples of the same
    # tb_plugin script show as an 18% shorter step
    k = "kineto-samples/tbplugin_2021-01_resnet50_{}_nw{}_worker0.pt.trace.json.gz"
    doc = diff_paths(_corpus(k.format("autograd", 0)), _corpus(k.format("autograd", 4)))
    # the period is one training iteration: the kernels per ProfilerStep of the profiler-API
    # sample of the same script (counted by the step analyzer there), within 5%
    profiled = diff_paths(
        _corpus(k.format("profiler_api", 0)), _corpus(k.format("profiler_api", 4))
    )
    kps = next(r["before"] for r in profiled["metrics"] if r["metric"] == "kernels_per_step")
    it = doc["iterations"]
    for side in ("before", "after"):
        assert it[side]["period_kernels"] == pytest.approx(kps, rel=0.05)
    assert doc["gate"]["basis"] == "iteration_time"
    assert -0.30 < doc["step_time_change"] < -0.12
    assert doc["gate"]["significant"] is True


def test_job_diff_shows_each_ranks_kernel_changes(tmp_path, capsys):
    before, after = H200 / "ddp_overlap", H200 / "ddp_no_overlap"
    html, out = tmp_path / "d.html", tmp_path / "d.json"
    assert main(["diff", str(before), str(after), "-o", str(html), "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    text, page = capsys.readouterr().out, html.read_text()
    assert [r["rank"] for r in doc["ranks"]] == [0, 1]
    for r in doc["ranks"]:
        k = r["kernels_per_step"]
        # the rank diffs find the kernels the job's top level cannot (it has no kernel table)
        assert k["changed"]
        # counts, with their time per step where there is any
        new = f" ({fmt_ns(k['appeared_ns'])} per step)" if k["appeared_ns"] else ""
        gone = f" ({fmt_ns(k['disappeared_ns'])} per step)" if k["disappeared_ns"] else ""
        line = f"kernels: {k['appeared_count']} appeared{new}, {k['disappeared_count']} disappeared{gone}"
        assert f"rank {r['rank']}:" in text and line in text
        # each kernel line says which list it is in (audit 17: the changed ones had no label)
        c = k["changed"][0]
        assert f"changed: {fmt_ns(c['total_ns'])} -> {fmt_ns(c['total_ns_after'])} per step" in text
        assert f'id="rank-{r["rank"]}"' in page
        assert k["changed"][0]["name"][:60] in page
    total = sum(r["kernels_per_step"]["appeared_count"] for r in doc["ranks"])
    assert "0 appeared, 0 disappeared" not in text.split("rank 0:")[0]  # no empty job-level line
    assert f"{total} / " in page


def test_html_names_what_differs(tmp_path):
    before = H200 / "healthy_bf16.pt.trace.json.xz"
    after = ROOT / "fixtures" / "corpus" / "h100_gaunernst_bert-small-uncased__1016001.json.gz"
    html = tmp_path / "d.html"
    assert main(["diff", str(before), str(after), "-o", str(html), "-q"]) == 0
    page = html.read_text()
    (gb,), (ga,) = _device_names(before), _device_names(after)
    assert "Not like for like" in page and f"different GPUs: {gb} vs {ga}" in page


def test_nvtx_iterations_by_hand():
    # five "train_step N" ranges starting 3 ms apart (each covering 2 ms of it), plus an
    # op-level range that repeats but is not named like an iteration
    e = Events()
    for i in range(5):
        e.annotation(f"train_step {i}", 3000 * i, 2000)
        e.annotation("aten::linear", 3000 * i + 100, 50)
        e.kernel("some_gemm_kernel", 3000 * i + 200, 1500)
    it = compare(analyze_trace(e.trace()), analyze_trace(e.trace()))["iterations"]["before"]
    assert it["method"] == "nvtx" and it["range_name"] == "train_step"
    # 4 start-to-start spacings of 3 ms, the first dropped as warm-up
    assert it["per_iteration_ns"] == [3_000_000] * 3


def test_real_nvtx_and_kernel_period_agree():
    # param/linear_kineto (torch 2.0, no ProfilerStep): the optimizer step's user range and the
    # kernel sequence are two independent ways to the same iteration time
    a = analyzed(_corpus("param/linear_kineto.json.gz"))
    n, k = nvtx_iterations(a.trace.events), kernel_iterations(a.trace.events)
    assert n is not None and k is not None
    assert n.range_name == "Optimizer.step#SGD.step"
    assert n.iterations == k.iterations
    assert n.median_ns == pytest.approx(k.median_ns, rel=0.03)


def test_job_ranks_from_workers_keep_their_cuda_versions():
    """Ranks analyzed in worker processes carry no event table; the versions the trace records
    (the H200 fixtures' top level: cuda_runtime_version and cuda_driver_version 13000) still
    reach the diff's environment through ``source.versions``."""
    from traceinsight.diff import environment

    job = analyzed(H200 / "ddp_straggler")
    assert all(r.trace is None for r in job.ranks)  # analyzed in workers
    env = environment(job)
    assert env["cuda_runtime_version"] == 13000 and env["cuda_driver_version"] == 13000


# --- per-step figures come from the analysis window ---------------------------------------------


def _raw_kernels_in_gpu_steps(path: Path, prefix: str) -> tuple[int, int, float]:
    """From the raw Kineto events: the GPU-side ProfilerStep ranges (their count), and the calls
    and total µs of the kernels named ``prefix...`` lying inside their span."""
    ev = json.loads(raw_json(path))["traceEvents"]
    steps = [
        e
        for e in ev
        if e.get("cat") == "gpu_user_annotation" and e["name"].startswith("ProfilerStep#")
    ]
    lo, hi = min(e["ts"] for e in steps), max(e["ts"] + e["dur"] for e in steps)
    inside = [
        e
        for e in ev
        if e.get("cat") == "kernel"
        and e["name"].startswith(prefix)
        and lo <= e["ts"]
        and e["ts"] + e["dur"] <= hi
    ]
    return len(steps), len(inside), sum(e["dur"] for e in inside)


def test_kernel_changes_per_step_count_the_window_only(tmp_path):
    """h2d_pinned before/after: the capture holds warm-up steps outside the analysed window, and
    their GEMMs were once spread over the window's 3 steps (58.3 -> 74.3 calls, 9.85 -> 12.58 ms
    per step: more than the whole 10.47 ms step). The raw events give 48 calls per step and
    8.10 -> 8.13 ms; the baseline and diff paths share the one kernel table."""
    from traceinsight.commands.baseline import baseline_doc

    gemm = "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT"
    before = H200 / "pairs" / "h2d_pinned.before.pt.trace.json.xz"
    after = H200 / "pairs" / "h2d_pinned.after.pt.trace.json.xz"
    raw = [_raw_kernels_in_gpu_steps(p, gemm) for p in (before, after)]
    ab, aa = analyzed(before), analyzed(after)
    doc = compare(ab, aa)
    row = next(r for r in doc["kernels_per_step"]["changed"] if r["name"] == gemm)
    for (steps, calls, us), count, total_ns in (
        (raw[0], row["count"], row["total_ns"]),
        (raw[1], row["count_after"], row["total_ns_after"]),
    ):
        assert count == calls / steps == 48
        assert total_ns == pytest.approx(us * 1000 / steps, rel=1e-6)
    assert row["total_ns"] == pytest.approx(8.097e6, rel=1e-3)
    assert row["total_ns_after"] == pytest.approx(8.126e6, rel=1e-3)
    assert row["total_ns_after"] < doc["step_time_after_ns"]
    stored = {r["name"]: r for r in baseline_doc(aa, "b")["kernels"]}
    assert stored[gemm]["total_ns"] == row["total_ns_after"]
    # the batch summary's kernels_per_step is the kernel analyzer's: the window's too (150
    # kernels per step over the whole capture)
    steps, calls, _ = _raw_kernels_in_gpu_steps(after, "")
    assert aa.metrics["kernels_per_step"] == calls / steps == 97


# --- a baseline gives the direct diff's verdict -------------------------------------------------


def test_job_baseline_gives_the_direct_diffs_verdict(tmp_path, capsys):
    """ddp_overlap -> ddp_no_overlap is 11.4% slower but inside its bootstrap interval: the
    direct diff does not fail --fail-if-slower 5. Against a saved baseline of ddp_overlap the
    per-step times were lost ("too few steps for a noise estimate", exit 3); the baseline now
    stores them, and the diff against it is the direct diff's document."""
    before, after, bl = H200 / "ddp_overlap", H200 / "ddp_no_overlap", tmp_path / "bl"
    gate = ["--no-html", "-q", "--fail-if-slower", "5"]
    direct, against = tmp_path / "direct.json", tmp_path / "against.json"
    assert main(["diff", str(before), str(after), *gate, "--json", str(direct)]) == 0
    assert main(["baseline", "save", "job", str(before), "--dir", str(bl), "-q"]) == 0
    args = ["diff", "--against", "job", "--dir", str(bl), str(after), *gate]
    assert main([*args, "--json", str(against)]) == 0
    assert "within the within-capture step spread" in capsys.readouterr().err
    d, a = json.loads(direct.read_text()), json.loads(against.read_text())
    assert a.pop("baseline")["name"] == "job"
    assert d["gate"]["significant"] is False and d["noise"]["interval"] is not None
    assert a == d


def test_no_marker_baseline_compares_iterations(tmp_path):
    """Without step markers the direct diff times iterations from the event table, which a
    baseline does not keep: it stores the iterations found, so its diff is on the same basis."""
    from traceinsight.commands.baseline import baseline_doc, compare_with_baseline

    k = "kineto-samples/tbplugin_2021-01_resnet50_autograd_nw{}_worker0.pt.trace.json.gz"
    ab, aa = analyzed(_corpus(k.format(0))), analyzed(_corpus(k.format(4)))
    direct = compare(ab, aa)
    stored = json.loads(json.dumps(baseline_doc(ab, "b"), default=str))  # as saved and loaded
    doc = compare_with_baseline(stored, aa)
    assert direct["gate"]["basis"] == doc["gate"]["basis"] == "iteration_time"
    assert doc["gate"] == direct["gate"] and doc["noise"] == direct["noise"]


# --- a broken side never passes a gate (audit 12) ----------------------------------------------


def _broken_afters(tmp: Path) -> dict[str, Path]:
    """The checkpointing pair's AFTER, damaged three ways: its xz stream cut at 100 kB, its
    kernels and copies removed, no events at all."""
    import lzma

    src = ROOT / "fixtures" / "h200" / "pairs" / "checkpointing.after.pt.trace.json.xz"
    cut = tmp / "cut.pt.trace.json.xz"
    cut.write_bytes(src.read_bytes()[:100_000])
    doc = json.loads(lzma.decompress(src.read_bytes()))
    gpu = {"kernel", "gpu_memcpy", "gpu_memset"}
    no_gpu = tmp / "no_gpu.json"
    no_gpu.write_text(json.dumps({**doc, "traceEvents": [e for e in doc["traceEvents"] if e.get("cat") not in gpu]}))  # fmt: skip
    empty = tmp / "no_events.json"
    empty.write_text(json.dumps({**doc, "traceEvents": []}))
    return {"trace_truncated": cut, "device_activity_missing": no_gpu, "empty_trace": empty}


def test_a_broken_after_fails_the_gate(tmp_path, capsys):
    before = ROOT / "fixtures" / "h200" / "pairs" / "checkpointing.before.pt.trace.json.xz"
    for check, after in _broken_afters(tmp_path).items():
        rc = main(["diff", str(before), str(after), "--fail-if-slower", "5", "--no-html", "-q"])
        err = capsys.readouterr().err
        assert rc == 3, (check, err)
        assert f"AFTER has 1 data-quality error, first: {check}" in err, err
    # and the empty trace fails analyze's gate too
    empty = tmp_path / "no_events.json"
    assert main(["analyze", str(empty), "--fail-on", "high", "--no-html", "-q"]) == 3


def test_nothing_to_compare_does_not_pass_the_gate():
    gate = {"slowdown_ratio": None, "basis": None, "significant": None, "interval": None}
    assert gate_exit(gate, 5) == 3


def test_idle_by_cause_is_per_step_where_both_sides_have_steps():
    # audit 12: a one-step copy of a trace read a 67% drop of every idle cause against the whole
    # capture; per step, each side's total over its own steps
    from traceinsight.diff import _idle_rows

    mb = {"steps": 3, "idle_by_cause_ns": {"cpu_work": 3_000, "launch_overhead": 6_000}}
    ma = {"steps": 1, "idle_by_cause_ns": {"cpu_work": 1_000, "launch_overhead": 2_000}}
    rows = {r["cause"]: r for r in _idle_rows(mb, ma)}
    assert rows["cpu_work"]["before_ns"] == rows["cpu_work"]["after_ns"] == 1_000
    assert rows["launch_overhead"]["delta_ns"] == 0 and rows["cpu_work"]["per"] == "step"
    none = _idle_rows({"steps": 0, "idle_by_cause_ns": {"cpu_work": 5}}, ma)
    assert none[0]["per"] == "window" and none[0]["before_ns"] == 5


def test_the_diff_gives_the_unprofiled_estimates_and_warns_where_they_disagree():
    """Audit 12: the profiled step change was within 10% of the measured speedup on 12 of 32
    pairs, the step model's un-profiled estimates' on 21. timm_jpeg with 12 workers read "2.8%
    slower" profiled (measured 1.76-1.91x faster): the diff gives each side's estimate and warns
    where the two changes point opposite ways."""
    tp = ROOT / "fixtures" / "h200" / "thirdparty"
    before, after = (
        analyzed(tp / f"timm_jpeg.{w}.pt.trace.json.xz") for w in ("before", "workers.after")
    )
    doc = compare(before, after)
    u = doc["unprofiled"]
    rb, ra = (a.results.replay.unprofiled_step_ns for a in (before, after))
    assert (u["before_ns"], u["after_ns"]) == (rb, ra)
    assert u["change"] < 0 < doc["step_time_change"]
    # audit 19: the BEFORE is loader-paced, so its estimate is of its mean step; on the same
    # statistics the profiled steps agree with the estimate, and the warning names the stall
    # step rather than the profiler's cost
    assert u["statistics"] == ["mean", "median"]
    b_steps = [s.dur_ns for s in before.results.steps.per_step]
    a_steps = sorted(s.dur_ns for s in after.results.steps.per_step)
    same = statistics.median(a_steps) / statistics.mean(b_steps) - 1
    assert same < 0
    assert any(
        f"the BEFORE's mean and the AFTER's median step, which the un-profiled estimate "
        f"follows, by {100 * same:+.1f}%"
        in w
        and "a stall step" in w
        for w in doc["warnings"]
    ), doc["warnings"]


def test_diff_what_if_is_shown_for_each_side(tmp_path, capsys):
    """Audit 12: `diff --what-if` was accepted and validated but reached no output."""
    tp = ROOT / "fixtures" / "h200" / "thirdparty"
    before, after = (
        tp / "nanogpt.before.pt.trace.json.xz",
        tp / "nanogpt.compile_ro.after.pt.trace.json.xz",
    )
    out = tmp_path / "d.json"
    assert main(["diff", str(before), str(after), "--no-html", "--what-if", "launch_bound", "--json", str(out)]) == 0  # fmt: skip
    printed = capsys.readouterr().out
    sel = json.loads(out.read_text())["what_if_selected"]
    assert sel["before"]["fixes"] == sel["after"]["fixes"] == ["launch_bound"]
    assert sel["before"]["speedup"] > 1.5 > sel["after"]["speedup"]  # the graphs took it
    assert (
        "  before: What if launch_bound: saves" in printed
        and "  after: What if launch_bound:" in printed
    )


def test_the_diff_gives_the_estimates_other_end_and_flags_one_time_work():
    """Audit 15: the un-profiled change had no range (gnn's workers: -47.8% where the runs
    measured -33..-38%), and an SBERT bf16 AFTER's new shapes read "+414.7%" (measured
    +59..+117%) without a word that they fade. The change at both sides' low ends (each
    replay's unprofiled_step_low_ns) brackets gnn's measurement; a side whose window holds
    new_shape_setup or cold_start is named."""
    tp = ROOT / "fixtures" / "h200" / "thirdparty"
    gnn = [analyzed(tp / f"gnn.{w}.pt.trace.json.xz") for w in ("before", "workers.after")]
    u = compare(*gnn)["unprofiled"]
    lb, la = (a.results.replay.unprofiled_step_low_ns for a in gnn)
    assert u["change_low"] == pytest.approx((la - lb) / lb)
    truth = json.loads((tp / "gnn.truth.json").read_text())["speedup_band"]["workers"]
    measured = (1 / truth["high"] - 1, 1 / truth["low"] - 1)  # -38% .. -33%
    assert u["change"] < measured[0] and measured[1] < u["change_low"]
    sbert = [analyzed(tp / f"sbert.{w}.pt.trace.json.xz") for w in ("before", "bf16.after")]
    doc = compare(*sbert)
    assert any(
        "the AFTER window holds one-time work (new_shape_setup)" in w for w in doc["warnings"]
    )


def test_the_html_headline_says_the_speedup_as_the_terminal_does(tmp_path, capsys):
    """audit 19: the page read "38.8% faster" where the step took 38.8% less time (17.08 ->
    10.46 ms: 1.63x faster, as the terminal says)."""
    before = H200 / "pairs" / "h2d_pinned.before.pt.trace.json.xz"
    after = H200 / "pairs" / "h2d_pinned.after.pt.trace.json.xz"
    html, out = tmp_path / "d.html", tmp_path / "d.json"
    assert main(["diff", str(before), str(after), "-o", str(html), "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    speedup = doc["step_time_before_ns"] / doc["step_time_after_ns"]
    words = f"{speedup:.2f}x faster, {100 * doc['step_time_change']:+.1f}%"
    assert words == "1.63x faster, -38.8%"
    assert f"<strong>{words}</strong>" in html.read_text()
    assert words in capsys.readouterr().out
