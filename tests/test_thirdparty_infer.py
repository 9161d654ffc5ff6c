"""Predictions against inference loops as users write them (session 64, an NVIDIA H100 80GB HBM3,
recorded before analysis; fixtures/generate/thirdparty/loop_infer_modes.py, loop_eval_glue.py):
``torch.no_grad()`` + bf16 autocast over fp32 weights with ``model.eval()`` forgotten, around
``torch.nn.TransformerEncoder`` (audit 18's LM) and torchvision's ResNet-50; and run_glue.py's
evaluation through the Trainer after a ``--bf16`` fine-tuning (DeBERTa-v3-base, its default
eval batch of 8). Fixes: eval (``model.eval()``), cast_once (``model.to(torch.bfloat16)``, no
autocast), the Trainer's ``bf16_full_eval=True``, a 4x eval batch. Bands over four processes
(A, B; C, D with 40 warm-up and 100 timed steps). torchvision's Swin-T was recorded too and
left out: its four processes' baselines moved 14.3-22.9 ms, its bands wider than any fix."""

from __future__ import annotations

from .conftest import RecordedLoop, _analyzed_once, raw_events, within_band

TOLERANCE = 0.25
LM = RecordedLoop.named("infer_lm")
RESNET = RecordedLoop.named("infer_resnet")
GLUE = RecordedLoop.named("eval_glue")
INFERENCE = ("inference_train_mode", "inference_autocast_casts")


def test_per_call_casts_priced_within_the_cast_once_band() -> None:
    """The LM casts 63 tensors a step inside its ops (each Linear's weight and bias, the
    activations around autocast's fp32 layer norms): 1.13x against casting the model once,
    1.27-1.53x (0.81 of the middle)."""
    f = LM.finding("inference_autocast_casts")
    assert f.severity == "medium" and f.evidence["casts"] == 189  # 3 steps
    b = LM.band("cast_once")
    assert within_band(f.what_if.speedup, b["low"], b["high"], TOLERANCE)


def test_train_mode_dropout_priced_and_shown_low() -> None:
    """18 dropouts a step draw masks (aten::native_dropout, 18 fused_dropout kernels a step in
    the raw events); model.eval() measured 1.02-1.12x, priced 1.08x: low, the floor a wrong
    output keeps it at."""
    kernels = [
        e for e in raw_events(LM.before) if e.get("cat") == "kernel" and "dropout" in e["name"]
    ]
    f = LM.finding("inference_train_mode")
    assert f.evidence["dropout_kernels"] == len(kernels) == 54
    assert f.severity == "low"
    b = LM.band("eval")
    assert within_band(f.what_if.speedup, b["low"], b["high"], TOLERANCE)


def test_the_fixed_loops_have_neither_finding() -> None:
    """Profiled after model.eval() and the one-time cast: no dropout kernel, no cast inside an
    op (the 18 casts left are multi-head attention's own, of its float mask: not autocast's)."""
    for loop in (LM, RESNET):
        after = _analyzed_once(
            loop.before.with_name(loop.before.name.replace("before", "all.after"))
        )
        assert not {f.id for f in after.findings} & set(INFERENCE)


def test_batch_norm_statistics_found_and_the_miss_said() -> None:
    """ResNet-50 in train mode: 53 batch norms a step compute batch statistics
    (batch_norm_collect_statistics: 11.40 ms over the 3 steps in the raw events). eval
    measured 1.16-1.44x; the model prices it 1.00x from its un-profiled step (18.69 ms, where
    traceinsight.capture measured 12.64 ms: the step is the GPU's un-profiled, the host's in
    the model) and 1.13x from its low end. A miss with its mechanism (issue 37 item 2), shown
    low (the floor)."""
    stats = [
        e
        for e in raw_events(RESNET.before)
        if e.get("cat") == "kernel" and "batch_norm_collect_statistics" in e["name"]
    ]
    f = RESNET.finding("inference_train_mode")
    assert f.evidence["batch_norm_training_kernels"] == 159 == len(stats)
    assert round(f.evidence["batch_norm_statistics_time_ns"] / 1e3) == round(
        sum(e["dur"] for e in stats)
    )
    assert f.severity == "low" and f.what_if.speedup < 1.01
    b = RESNET.band("eval")
    assert within_band(f.what_if.speedup_low, b["low"], b["high"], TOLERANCE)
    rp = RESNET.analysis().results.replay
    assert rp.measured_step_ns / rp.unprofiled_step_ns < 0.7


def test_casts_that_measured_nothing_stay_low() -> None:
    """ResNet-50's casts (56 a step, 0.15 ms of GPU time in a GPU-heavy step): one-time cast
    measured 1.00-1.02x, priced 1.10x, low."""
    f = RESNET.finding("inference_autocast_casts")
    b = RESNET.band("cast_once")
    assert b["high"] < 1.10 and f.severity == "low"
    assert within_band(f.what_if.speedup, b["low"], b["high"], TOLERANCE)


def test_trainer_evaluation_casts_and_batch() -> None:
    """run_glue's evaluation (DeBERTa, bf16=True): 246 casts a step; bf16_full_eval measured
    0.95-1.27x, priced 1.13x (it keeps autocast on: the casts around the fp32 norms remain,
    so the measured fix is part of the priced one). The 4x eval batch 3.71x against
    1.99-4.30x per sample; both together 4.14x against 3.47-4.08x."""
    f = GLUE.finding("inference_autocast_casts")
    assert f.severity == "medium" and "bf16=False" in f.recommendation
    b = GLUE.band("full_eval")
    assert within_band(f.what_if.speedup, b["low"], b["high"], TOLERANCE)
    s = GLUE.finding("small_batch")
    b = GLUE.band("batch_4x")
    assert s.what_if.multiplier == 4
    assert within_band(s.what_if.speedup, b["low"], b["high"], TOLERANCE)
    w = GLUE.what_if(["inference_autocast_casts", "small_batch@4"])
    b = GLUE.band("all")
    assert within_band(w.speedup, b["low"], b["high"], TOLERANCE)
