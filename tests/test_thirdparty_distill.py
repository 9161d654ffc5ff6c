"""A held-out distillation loop (session 67, an NVIDIA H100 80GB HBM3; written and its fixes
decided before any recording, fixtures/generate/thirdparty/loop_distill.py): transformers'
``Trainer`` subclassed as Hugging Face's distillation write-up does, ``compute_loss`` running the
student (DistilBERT size) and then the teacher (BERT-base) under ``torch.no_grad()``, at the
write-up's ``per_device_train_batch_size=128`` and ``fp16=True``, SST-2-like sentences padded
per batch. The Trainer's mixed precision autocasts the model it prepared (accelerate wraps the
student's forward); the teacher, called directly, runs its GEMMs in fp32.

The first analysis read ``fp32_compute`` (medium) with the advice to "train in bf16 with
torch.autocast", which the loop already did: 16-bit math beside fp32 math is now read as a
mixed-precision step whose fp32 part was left out, and the advice names that work.

Its measured bands are not kept: the un-profiled processes (fixtures/h100/thirdparty/README.md,
session 67) met cuDNN's fp16 attention building and compiling per new padded length (2.5-3.4 s
for a step that met one) and a host pace that drifted 1.7x within a process; the steps taken
with every length met first were not recorded (the device was not lent again)."""

from __future__ import annotations

import re
from collections import Counter

from .conftest import FIXTURES, _analyzed_once, raw_events

BEFORE = FIXTURES / "h100" / "thirdparty" / "distill.before.pt.trace.json.xz"


def _fp32_compute():
    return next(f for f in _analyzed_once(BEFORE).findings if f.id == "fp32_compute")


def test_the_teachers_fp32_gemms_beside_the_students_fp16_ones_in_the_raw_events() -> None:
    """The GEMM ops' input dtypes: the teacher's (3 steps x 12 layers) fp32, the student's
    (forward and backward) Half; their kernels: cuBLAS's f32f32 FFMA GEMMs and PyTorch's fp32
    memory-efficient attention (101.31 ms in the window) beside nvjet's half GEMMs and
    cuDNN's generated fp16 attention (13.63 ms)."""
    ev = raw_events(BEFORE)
    ops = Counter(
        tuple(e["args"].get("Input type") or ())[:2]
        for e in ev
        if e.get("cat") == "cpu_op" and e["name"] in ("aten::addmm", "aten::mm", "aten::bmm")
    )
    assert ops[("float", "float")] > 0 and ops[("c10::Half", "c10::Half")] > 0
    kernels = [e for e in ev if e.get("cat") == "kernel"]
    fp32_us = sum(
        e["dur"] for e in kernels if re.search(r"f32f32_f32f32|cutlassF_f32|sgemm", e["name"])
    )
    half_us = sum(
        e["dur"] for e in kernels if re.search(r"nvjet_sm90_hsh|sdpa_sm90_flash_\w+_f16", e["name"])
    )
    f = _fp32_compute()
    assert f.evidence["fp32_math_ns"] == round(fp32_us * 1000)
    # the rest of the 16-bit math: cuDNN's and CUTLASS's f16 helpers (0.03 ms)
    assert 0 <= f.evidence["half_math_ns"] - half_us * 1000 < 0.01 * f.evidence["half_math_ns"]
    assert half_us / (fp32_us + half_us) > 0.05


def test_a_mixed_precision_step_is_told_what_its_autocast_left_out() -> None:
    f = _fp32_compute()
    assert "beside 11.8% already in 16-bit: mixed precision leaves this part in fp32" in f.title
    assert "distillation teacher" in f.recommendation
    assert "Train in bf16" not in f.recommendation
    assert "torch.autocast" in f.snippet and "teacher(**inputs)" in f.snippet


def test_a_step_all_in_fp32_keeps_the_plain_advice() -> None:
    """A timm ResNet-50 in fp32 (TF32 convolutions, no 16-bit kernel): no mixed reading."""
    path = FIXTURES / "h200" / "thirdparty" / "timm_jpeg.before.pt.trace.json.xz"
    f = next(f for f in _analyzed_once(path).findings if f.id == "fp32_compute")
    assert f.evidence["half_math_ns"] == 0 and "16-bit" not in f.title
