"""Inference left in training mode, and autocast re-casting fp32 weights at every inference call
(audit 18 D1: a forward-only LM under no_grad + autocast, model.train() left on: 18 dropouts
and 63 casts a step, 48% of its launches, and no finding named either)."""

from __future__ import annotations

from traceinsight.pipeline import analyze_trace

from .builder import Events

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
