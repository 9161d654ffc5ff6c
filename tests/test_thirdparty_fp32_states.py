"""fp32_compute's advice (bf16 autocast) measured where the step had already been fixed once:
word_lm's CUDA-graphed step and T5's padded, reduce-overhead-compiled one (session 43). On the
H200 recordings the finding was HIGH there and unmeasured (1.40x and 1.34x); the H200s were not
lent, so both were recorded again on an H100 (fixtures/h100/thirdparty/fp32_states.json: two
un-profiled processes E and F in opposite orders, a profiled process P) and the predictions here
come from that device's own profiled traces. A miss is a strict expected failure naming its
mechanism, so fixing it turns its test red until the expectation is updated."""

from __future__ import annotations

import json
import lzma
import statistics
from collections import defaultdict
from functools import cache

import orjson
import pytest

import traceinsight

from .conftest import FIXTURES

HERE = FIXTURES / "h100" / "thirdparty"
BF16_TOLERANCE = 0.40  # a device-speed change (tests/test_thirdparty.py MEASURED)


@cache
def truth() -> dict:
    return json.loads((HERE / "fp32_states.json").read_text())


@cache
def analysis(name: str):
    return traceinsight.analyze(HERE / name)


def fp32_finding(name: str):
    return next((f for f in analysis(name).findings if f.id == "fp32_compute"), None)


def band(loop: str, key: str) -> tuple[float, float]:
    b = truth()[loop]["speedup_band"][key]
    return b["low"], b["high"]


def test_the_bands_are_the_processes_own_ratios() -> None:
    """Each band is its processes' step before over after, recomputed from the raw steps."""
    w = truth()["word_lm"]["configs"]
    for lab in ("E", "F", "G", "H"):
        got = (
            w[lab]["cudagraph"]["step_ms_window_mean"]
            / w[lab]["cudagraph_bf16"]["step_ms_window_mean"]
        )
        assert truth()["word_lm"]["speedup_band"]["cudagraph_bf16_from_cudagraph"]["per_process"][
            lab
        ] == pytest.approx(got, abs=1e-4)
    t = truth()["t5_course"]["configs"]
    for lab in ("E", "F"):
        means = {}
        for cfg in ("pad64_compile_ro", "bf16_pad64_compile_ro"):
            steps = t[lab][cfg]["step_ms_host"]
            med = statistics.median(steps)
            kept = [s for s in steps if s <= 4 * med]  # the two shape captures of each window
            assert len(steps) - len(kept) == 2
            means[cfg] = sum(kept) / len(kept)
        got = means["pad64_compile_ro"] / means["bf16_pad64_compile_ro"]
        b = truth()["t5_course"]["speedup_band"]["bf16_pad64_compile_ro_from_pad64_compile_ro"]
        assert b["per_process"][lab] == pytest.approx(got, abs=1e-3)


def test_word_lm_graphed_bf16_within_the_band() -> None:
    """The graphed LSTM step: measured 1.43-1.60x in four processes (2.43-2.57 -> 1.61-1.70 ms
    a step); the H100 trace predicts 1.33x (0.88 of the band's middle), MEDIUM."""
    f = fp32_finding("word_lm.cudagraph.after.pt.trace.json.xz")
    assert f is not None and f.what_if is not None
    lo, hi = band("word_lm", "cudagraph_bf16_from_cudagraph")
    assert lo > 1.4
    assert (1 - BF16_TOLERANCE) * lo <= f.what_if.speedup <= (1 + BF16_TOLERANCE) * hi
    assert f.severity in ("medium", "high")


@pytest.mark.parametrize(
    "name",
    [
        "word_lm.cudagraph_bf16.after.pt.trace.json.xz",
        "t5_course.bf16_pad64_compile_ro.after.pt.trace.json.xz",
    ],
)
def test_the_fixed_cause_is_gone_in_the_profiled_after(name: str) -> None:
    assert fp32_finding(name) is None


def _host_op_ratio() -> float:
    """The median, over host ops and runtime calls recorded the same number of times in both
    T5 traces, of their median duration in the bf16 after over the fp32 before."""
    by: dict[str, dict[str, list[float]]] = {}
    for key, name in (
        ("fp32", "t5_course.pad64_compile_ro.after.pt.trace.json.xz"),
        ("bf16", "t5_course.bf16_pad64_compile_ro.after.pt.trace.json.xz"),
    ):
        d: dict[str, list[float]] = defaultdict(list)
        for e in orjson.loads(lzma.decompress((HERE / name).read_bytes()))["traceEvents"]:
            if e.get("cat") in ("cpu_op", "cuda_runtime"):
                d[e["name"]].append(e["dur"])
        by[key] = d
    same = [
        n for n, v in by["fp32"].items() if len(v) >= 20 and len(by["bf16"].get(n, ())) == len(v)
    ]
    return statistics.median(
        statistics.median(by["bf16"][n]) / statistics.median(by["fp32"][n]) for n in same
    )


def test_t5_host_ran_slower_in_the_bf16_profile() -> None:
    """The mechanism of T5's miss, from the raw events: the same host ops (the eager AdamW's,
    autograd's AccumulateGrad, the graph launches) took a median 1.5x as long in the bf16
    profile as in the fp32 one, where word_lm's took 0.6x: the host's own speed moved between
    the processes' configurations, which no trace of the before can tell."""
    assert 1.4 < _host_op_ratio() < 1.7


@pytest.mark.xfail(
    strict=True,
    reason="T5's compiled step under bf16 becomes host-bound at 14.2-17.6 ms a step un-profiled "
    "where the model, holding the host's work, puts it at 11.1 ms: predicted 1.64x (HIGH) against "
    "1.09-1.11x (window means without the shape captures; host medians 1.13-1.16x, P's 1.21x). "
    "The host ran ~1.5x slower in the bf16 configurations (test above)",
)
def test_t5_compiled_bf16_within_the_band() -> None:
    f = fp32_finding("t5_course.pad64_compile_ro.after.pt.trace.json.xz")
    assert f is not None and f.what_if is not None
    lo, hi = band("t5_course", "bf16_pad64_compile_ro_from_pad64_compile_ro_host_median")
    assert (1 - BF16_TOLERANCE) * lo <= f.what_if.speedup <= (1 + BF16_TOLERANCE) * hi
