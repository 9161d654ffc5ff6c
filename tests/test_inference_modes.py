"""Inference left in training mode, and autocast re-casting fp32 weights at every inference call
(audit 18 D1: a forward-only LM under no_grad + autocast, model.train() left on: 18 dropouts
and 63 casts a step, 48% of its launches, and no finding named either)."""

from __future__ import annotations

import bisect
import re
from pathlib import Path

from traceinsight.pipeline import analyze_trace

from .builder import Events
from .conftest import FIXTURES, _analyzed_once, raw_json

STEP_US = 200.0


def _inference(steps: int = 3, *, backward: bool = False, dropout: bool = True) -> Events:
    """``steps`` forward-only steps (a backward op in each with ``backward``): an autocast cast
    inside aten::linear (10 us, its 2 us copy kernel), an explicit top-level cast of the
    model's own code (8 us: not autocast's), the linear's GEMM and, with ``dropout``, a
    training-mode dropout (aten::native_dropout 8 us inside aten::dropout, a 3 us kernel)."""
    e = Events()
    for i in range(steps):
        t = i * STEP_US
        e.step(i + 1, t, STEP_US - 1)
        e.op("aten::linear", t + 1, 30)
        e.op("aten::to", t + 2, 10)
        e.op("aten::_to_copy", t + 3, 8)
        e.kernel("bfloat16_copy_kernel_cuda", t + 12, 2, launch_us=t + 5, launch_dur_us=3)
        e.op("aten::addmm", t + 15, 15)
        e.kernel("nvjet_gemm", t + 25, 20, launch_us=t + 20, launch_dur_us=3)
        e.op("aten::to", t + 35, 8)
        e.kernel("bfloat16_copy_kernel_cuda", t + 46, 2, launch_us=t + 38, launch_dur_us=3)
        if dropout:
            e.op("aten::dropout", t + 50, 10)
            e.op("aten::native_dropout", t + 51, 8)
            e.kernel("fused_dropout_kernel_vec", t + 60, 3, launch_us=t + 54, launch_dur_us=3)
        # a Bernoulli distribution's sample (torch.bernoulli): a draw the user asked for
        e.op("aten::bernoulli", t + 120, 10)
        e.op("aten::bernoulli_", t + 121, 8)
        e.kernel("bernoulli_tensor_cuda_kernel", t + 130, 3, launch_us=t + 124, launch_dur_us=3)
        if backward:
            e.op("autograd::engine::evaluate_function: AddmmBackward0", t + 70, 20)
            e.kernel("nvjet_gemm", t + 95, 20, launch_us=t + 75, launch_dur_us=3)
    return e


def test_train_mode_and_per_call_casts_are_counted_from_the_ops() -> None:
    """Three steps: one autocast cast a step (inside aten::linear: 10 us, one kernel of 2 us)
    and one dropout (8 us, a 3 us kernel); the explicit top-level cast is the model's own."""
    h = analyze_trace(_inference().trace()).results.host_ops
    assert h.forward_only
    assert (h.inference_casts, h.inference_cast_ns) == (3, 30_000)
    assert (h.inference_cast_kernels, h.inference_cast_gpu_ns) == (3, 6_000)
    assert (h.train_mode_dropouts, h.train_mode_dropout_ns) == (3, 24_000)
    assert (h.train_mode_dropout_kernels, h.train_mode_dropout_gpu_ns) == (3, 9_000)
    assert h.train_mode_norm_kernels == 0


def test_training_windows_and_eval_mode_have_neither() -> None:
    """A window with backward work is training: the casts and dropout belong there."""
    h = analyze_trace(_inference(backward=True).trace()).results.host_ops
    assert not h.forward_only
    assert (h.inference_casts, h.train_mode_dropouts, h.train_mode_dropout_kernels) == (0, 0, 0)
    # eval mode: aten::dropout returns its input (no native_dropout, no kernel)
    a = analyze_trace(_inference(dropout=False).trace())
    assert a.results.host_ops.train_mode_dropout_kernels == 0
    assert "inference_train_mode" not in {f.id for f in a.findings}


def _nested_casts(path: Path) -> tuple[int, int]:
    """From the raw events: ``aten::to`` calls inside one of autocast's ops on their thread
    (the innermost enclosing op), with a kernel launch inside the cast; their count and host
    time (us)."""
    import json

    from traceinsight.analyzers.host_ops import AUTOCAST_OPS

    ev = json.loads(raw_json(path))["traceEvents"]
    ops = sorted(
        (e for e in ev if e.get("ph") == "X" and e.get("cat") == "cpu_op"),
        key=lambda e: (e["tid"], e["ts"], -e["dur"]),
    )
    launches = sorted(
        (e["tid"], e["ts"])
        for e in ev
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and "LaunchKernel" in e["name"]
    )
    parent = re.compile(AUTOCAST_OPS)
    n, dur, stack = 0, 0.0, []
    for e in ops:
        while stack and (
            stack[-1]["tid"] != e["tid"] or stack[-1]["ts"] + stack[-1]["dur"] <= e["ts"]
        ):
            stack.pop()
        if e["name"] == "aten::to" and stack and parent.match(stack[-1]["name"]):
            lo = bisect.bisect_left(launches, (e["tid"], e["ts"]))
            if lo < len(launches) and launches[lo] <= (e["tid"], e["ts"] + e["dur"]):
                n, dur = n + 1, dur + e["dur"]
        stack.append(e)
    return n, round(dur)


def test_a_public_fp16_inference_pass_recasts_at_every_call() -> None:
    """A public Particle Transformer forward (A100, fp16 autocast over fp32 weights, batch 128):
    197 casts inside autocast's ops (linear, layer_norm, baddbmm, bmm, einsum...) launching a
    kernel, 6.16 ms of host time; the advice names float16, the cast kernels' type."""
    path = FIXTURES / "foreign" / "part_a100_fwd_bs128.json.xz"
    n, host_us = _nested_casts(path)
    a = _analyzed_once(path)
    h = a.results.host_ops
    assert (h.inference_casts, round(h.inference_cast_ns / 1e3)) == (n, host_us)
    assert n == 197 and h.inference_cast_dtype == "float16"
    f = next(f for f in a.findings if f.id == "inference_autocast_casts")
    assert "model.to(torch.float16)" in f.recommendation and "fp16_full_eval" in f.recommendation
