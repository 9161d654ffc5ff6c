"""The region breakdown and the views (--steps/--window/--device), on a hand-made trace whose
numbers are computed by hand below, and the baseline round trip through the CLI."""

import json

import pytest

from traceinsight.api import analyze_trace
from traceinsight.cli import main
from traceinsight.errors import InputError
from traceinsight.options import Options, parse_window

from .builder import Events
from .conftest import TINY

US = 1000


def _model() -> Events:
    """Two steps. Step 1: forward [0,400) holding attn [50,200) (a 100 us gemm launched at 60),
    a 40 us elementwise kernel launched at 250 in forward; optimizer [500,900) launches a 40 us
    kernel at 850; a 50 us kernel launched at 940 lies outside every region; a range on
    thread 2 spans the step and owns nothing. Step 2: forward [1000,1400), a 100 us gemm at 1100."""
    e = Events()
    e.step(1, 0, 1000).step(2, 1000, 1000)
    e.annotation("forward", 0, 400).annotation("attn", 50, 150)
    e.kernel("ampere_sgemm_128x64_nn", 100, 100, launch_us=60)
    e.kernel("vectorized_elementwise_kernel", 260, 40, launch_us=250)
    e.annotation("optimizer", 500, 400)
    e.kernel("vectorized_elementwise_kernel", 860, 40, launch_us=850)
    e.kernel("vectorized_elementwise_kernel", 950, 50, launch_us=940)
    e.annotation("other_thread", 0, 1000, tid=2)
    e.annotation("forward", 1000, 400)
    e.kernel("ampere_sgemm_128x64_nn", 1100, 100, launch_us=1010)
    return e


def _regions(a):
    return {r["path"]: r for r in a.results.regions.regions}


def test_region_tree_gpu_time_and_idle():
    a = analyze_trace(_model().trace())
    res = a.results.regions
    r = _regions(a)
    assert set(r) == {"forward", "forward/attn", "optimizer", "other_thread"}
    assert res.attributed_gpu_ns == 280 * US and res.unattributed_gpu_ns == 50 * US
    fwd, attn = r["forward"], r["forward/attn"]
    assert (fwd["count"], fwd["count_per_step"]) == (2, 1.0)
    assert (
        fwd["gpu_ns"] == 240 * US and fwd["self_gpu_ns"] == 140 * US
    )  # 100+40+100, attn's 100 out
    assert fwd["kernel_classes_ns"] == {"gemm": 200 * US, "elementwise": 40 * US}
    assert attn["gpu_ns"] == attn["self_gpu_ns"] == 100 * US and attn["depth"] == 1
    assert r["optimizer"]["gpu_ns"] == 40 * US
    assert r["other_thread"]["gpu_ns"] == 0  # launches on thread 1 are not its work
    # GPU idle: [0,100) [200,260) [300,860) [900,950) [1000,1100) [1200,2000)
    # forward's host time [0,400)+[1000,1400) holds 100+60+100+100+200 us of it
    assert fwd["idle_ns"] == 560 * US
    assert attn["idle_ns"] == 50 * US  # [50,100)
    assert r["optimizer"]["idle_ns"] == 360 * US  # [500,860)
    assert r["other_thread"]["idle_ns"] == 770 * US  # all of step 1's idle
    for reg in r.values():  # the causes are the idle analyzer's and add up
        assert sum(reg["idle_by_cause_ns"].values()) == reg["idle_ns"]
    assert fwd["idle_by_cause_ns"]["launch_overhead"] > 0
    # launch_bound's evidence segments ([0,100), [200,260), ...) lie in forward, not optimizer
    assert "launch_bound" in {f.id for f in a.findings}
    assert "launch_bound" in fwd["findings"] and "launch_bound" not in r["optimizer"]["findings"]
    assert json.dumps(a.to_json()["details"]["regions"])  # no tables in the document


def test_steps_view_selects_one_step():
    a = analyze_trace(_model().trace(), Options(steps="2..2"))
    assert a.metrics["steps"] == 1 and a.metrics["window_ns"] == 1000 * US
    assert a.source["window"]["offset_ns"] == 1000 * US
    assert a.source["window"]["selection"] == "steps 2..2"
    r = _regions(a)
    assert set(r) == {"forward"}  # only the step-2 forward overlaps [1000, 2000)
    assert r["forward"]["gpu_ns"] == 100 * US and r["forward"]["idle_ns"] == 300 * US
    with pytest.raises(InputError, match=r"steps 1\.\.2"):
        analyze_trace(_model().trace(), Options(steps="5..9"))


def test_window_view_and_parsing():
    assert parse_window("1ms:1.5ms") == (1_000_000, 1_500_000)
    assert parse_window("250us:") == (250_000, None)
    with pytest.raises(InputError):
        Options(window="5ms:1ms")
    with pytest.raises(InputError):
        Options(window="abc")
    a = analyze_trace(_model().trace(), Options(window="0ms:1ms"))
    assert a.metrics["steps"] == 1 and a.metrics["window_ns"] == 1000 * US
    assert _regions(a)["optimizer"]["gpu_ns"] == 40 * US
    assert "forward" in _regions(a) and _regions(a)["forward"]["count"] == 1


def test_device_view_keeps_one_gpu():
    e = _model()
    e.kernel("ampere_sgemm_128x64_nn", 100, 300, launch_us=70, device=1)
    both = analyze_trace(e.trace())
    only0 = analyze_trace(e.trace(), Options(device=0))
    assert _regions(both)["forward/attn"]["gpu_ns"] == 400 * US
    assert _regions(only0)["forward/attn"]["gpu_ns"] == 100 * US
    with pytest.raises(InputError, match="devices"):
        analyze_trace(e.trace(), Options(device=3))


def test_nested_nvtx_paths_on_the_same_start():
    """Ranges starting together nest outer first; a range that ends as the next begins is its
    sibling, not its parent."""
    e = Events()
    e.step(1, 0, 100).annotation("layer", 0, 100).annotation("attn", 0, 50)
    e.annotation("mlp", 50, 50)
    e.kernel("ampere_sgemm_128x64_nn", 60, 10, launch_us=50)  # launched as mlp opens
    r = _regions(analyze_trace(e.trace()))
    assert set(r) == {"layer", "layer/attn", "layer/mlp"}
    assert r["layer/mlp"]["gpu_ns"] == 10 * US and r["layer/attn"]["gpu_ns"] == 0


def test_baseline_save_and_diff_against(tmp_path, capsys):
    trace = TINY / "step_dataloader_sync.json"
    bl = tmp_path / "bl"
    assert main(["baseline", "save", "main", str(trace), "--dir", str(bl), "-q"]) == 0
    stored = json.loads((bl / "main.json").read_text())
    assert stored["kind"] == "baseline" and stored["result"]["schema"]
    assert stored["kernels"]  # the kernel table travels with it
    out = tmp_path / "d.json"
    args = ["diff", "--against", "main", "--dir", str(bl), str(trace), "--no-html", "-q"]
    assert main([*args, "--json", str(out), "--fail-if-slower", "5"]) == 0
    doc = json.loads(out.read_text())
    assert doc["gate"]["slowdown_ratio"] == 0.0 and doc["baseline"]["name"] == "main"
    assert doc["kernels_per_step"]  # compared against the stored table
    # a slower stored "after": halve the baseline's step time, the gate trips (exit 3)
    m = stored["result"]["metrics"]
    m["step_time_median_ns"] //= 2
    (bl / "fast.json").write_text(json.dumps(stored))
    assert (
        main(
            [
                "diff",
                "--against",
                "fast",
                "--dir",
                str(bl),
                str(trace),
                "--no-html",
                "-q",
                "--fail-if-slower",
                "5",
            ]
        )
        == 3
    )
    assert main(["diff", "--against", "nope", "--dir", str(bl), str(trace), "--no-html"]) == 2


def test_names_with_the_separator_roll_up_by_parent():
    """A range named "enc/dec" (NVTX names may hold "/") holding "mm": mm's 10 us roll up
    into enc/dec, found by its parent, not by splitting the path."""
    e = Events()
    e.step(1, 0, 100).annotation("enc/dec", 0, 100).annotation("mm", 10, 20)
    e.kernel("ampere_sgemm_128x64_nn", 40, 10, launch_us=15)
    r = _regions(analyze_trace(e.trace()))
    assert r["enc/dec/mm"]["parent"] == "enc/dec" and r["enc/dec"]["parent"] is None
    assert r["enc/dec"]["gpu_ns"] == 10 * US and r["enc/dec"]["self_gpu_ns"] == 0


def test_html_has_the_region_table_and_icicle():
    from traceinsight.report.html import render_html
    from traceinsight.report.regions_view import icicle

    a = analyze_trace(_model().trace())
    html = render_html(a)
    section = html[
        html.index('id="regions"') : html.index("</section>", html.index('id="regions"'))
    ]
    assert 'id="region-table"' in section and "forward/attn" in section
    boxes = {b["r"]["path"]: b for b in icicle(a.to_json()["details"]["regions"])}
    # widths are shares of the window's GPU time (330 us): forward 240, attn 100 inside it
    assert boxes["forward"]["w"] == pytest.approx(240 / 330)
    assert (
        boxes["forward/attn"]["x"] == boxes["forward"]["x"] and boxes["forward/attn"]["depth"] == 1
    )
    assert boxes["optimizer"]["x"] == pytest.approx(240 / 330)  # beside forward, after it
    assert "other_thread" not in boxes  # no GPU time: no box
    assert section.count("<rect") == 3


def test_summary_names_the_regions():
    from traceinsight.report.terminal import render_summary

    text = render_summary(analyze_trace(_model().trace()).to_json())
    assert "most GPU time in forward: 120.0 us per step" in text
    # 770 us over 2 steps, 46% of the window's 1.67 ms of idle: the rest lies outside every
    # named region, so the region is "the most in one", not where the idle is
    assert (
        "most idle outside named regions (53.9%); the most in one: other_thread: 385.0 us per step"
        in text
    )
    assert "view      all steps" in text
    # without thread 2's range and the second forward, optimizer holds the most idle (360 us
    # vs forward's 260); its "update" [520, 900) holds 340 of it (>= 80%): named instead
    e = _model()
    e.rows = [
        r
        for r in e.rows
        if r["name"] != "other_thread" and not (r["name"] == "forward" and r["start_ns"])
    ]
    e.annotation("update", 520, 380)
    text = render_summary(analyze_trace(e.trace()).to_json())
    assert "the most in one: optimizer/update: 170.0 us per step" in text
    # one forward left: 140 of the window's 330 us of GPU time in a named region
    assert "most GPU time outside named regions (57.6%); the most in one: forward: 70.0 us" in text
    e.rows[-1]["start_ns"] = 600 * US  # now [600, 900): 260 of 360 us, under 80%
    text = render_summary(analyze_trace(e.trace()).to_json())
    assert "the most in one: optimizer: 180.0 us per step" in text


def test_ranges_ending_together_hand_back_to_the_grandparent():
    """inner and mid end together at 50; a launch at 50 belongs to outer (half-open ranges)."""
    e = Events()
    e.step(1, 0, 100).annotation("outer", 0, 100).annotation("mid", 10, 40)
    e.annotation("inner", 20, 30)
    e.kernel("ampere_sgemm_128x64_nn", 60, 10, launch_us=50)
    r = _regions(analyze_trace(e.trace()))
    assert r["outer"]["self_gpu_ns"] == 10 * US and r["outer/mid"]["gpu_ns"] == 0


def test_idle_of_a_range_ending_after_a_gap():
    """A range on its own thread over [250, 950): it holds [250,260) of one gap, all of
    [300,860) and all of [900,950) (ending as that gap does): 10+560+50 = 620 us."""
    e = _model()
    e.annotation("probe", 250, 700, tid=3)
    r = _regions(analyze_trace(e.trace()))
    assert r["probe"]["idle_ns"] == 620 * US
    assert sum(r["probe"]["idle_by_cause_ns"].values()) == 620 * US


def test_emit_nvtx_op_ranges_are_not_regions():
    """nsys captures under emit_nvtx name an NVTX range per torch op ("aten::mm"): those are
    Kineto's cpu_ops, not model regions; a user's range around them stays one."""
    e = Events()
    e.step(1, 0, 1000)
    e.annotation("my_block", 100, 500)
    e.annotation("aten::mm", 150, 100)
    e.annotation("autograd::engine::evaluate_function: MmBackward0", 300, 100)
    e.kernel("ampere_bf16_s16816gemm_bf16_128x128", 200, 50, launch_us=160)
    r = _regions(analyze_trace(e.trace()))
    assert set(r) == {"my_block"} and r["my_block"]["gpu_ns"] == 50 * US


def test_concurrent_streams_are_said_as_busy_time():
    """Audit 5: DeepSeek's pipeline range read "206.71 ms per step" of GPU time in a 129.54 ms
    step: summed durations of compute and all-to-all kernels running side by side. Here
    forward launches a 100 us gemm at 60 (runs [100,200)) and a 90 us kernel on another stream
    at 70 (runs [110,200)): 190 us of work, 100 us busy; the 40 us kernel at [260,300) adds
    40 to both."""
    from traceinsight.report.terminal import render_summary

    e = Events()
    e.step(1, 0, 1000)
    e.annotation("forward", 0, 400)
    e.kernel("ampere_sgemm_128x64_nn", 100, 100, launch_us=60)
    e.kernel("ncclDevKernel_AllToAll", 110, 90, launch_us=70, stream=9)
    e.kernel("vectorized_elementwise_kernel", 260, 40, launch_us=250)
    a = analyze_trace(e.trace())
    fwd = _regions(a)["forward"]
    assert fwd["gpu_ns"] == 230 * US and fwd["gpu_busy_ns"] == 140 * US
    text = render_summary(a.to_json())
    assert (
        "most GPU time in forward: 140.0 us per step busy (230.0 us of work on concurrent" in text
    )
    # one stream: the sum is the busy time, said once
    assert _regions(analyze_trace(_model().trace()))["forward"]["gpu_busy_ns"] == 240 * US


def test_a_capture_without_gpu_activity_says_so_in_its_window():
    """audit s57: a CPU-only SqueezeNet trace's window read "whole GPU span"."""
    ev = Events().op("aten::conv2d", 0, 400).op("aten::relu", 450, 50)
    a = analyze_trace(ev.trace())
    assert a.source["window"]["selection"] == "whole capture (no GPU activity)"
    with_gpu = Events().op("aten::relu", 0, 50).kernel("relu_kernel", 60, 20)
    assert analyze_trace(with_gpu.trace()).source["window"]["selection"] == "whole GPU span"
