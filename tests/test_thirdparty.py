"""Predictions against third-party training loops measured on the H200: the
transformers Trainer on a small Llama, a timm ResNet-50 fed by torchvision transforms with 3
workers, a launch-bound MobileNetV3 with an eager per-parameter AdamW, and PEFT LoRA with
gradient checkpointing (fixtures/h200/thirdparty, recorded by fixtures/generate/thirdparty).
Every fix was measured un-profiled in two processes: the band is their spread, per sample
where the batch changes. What holds is asserted; the misses are strict expected failures
that name their mechanism (benchmarks/RESULTS.md), so fixing one turns its test red until
the expectation is updated."""

from __future__ import annotations

import json
import math
import re
from functools import cache

import polars as pl
import pytest

import traceinsight
from traceinsight.analyzers.replay import PROFILER_COST_HIGH_FACTOR
from traceinsight.causal import transforms
from traceinsight.causal.whatif import WhatIf
from traceinsight.constants import SEVERITIES
from traceinsight.errors import InputError
from traceinsight.options import Options
from traceinsight.pipeline import graded, selected_fixes
from traceinsight.report.format import prediction_basis

from .conftest import H200, within_band
from .conftest import raw_events as raw_events_at

HERE = H200 / "thirdparty"
TOLERANCE = 0.25  # a prediction within 25% of the measured band


@cache
def analysis(name: str):
    return traceinsight.analyze(HERE / name)


def chosen(name: str, ids: list[str]):
    """``analyze(HERE / name, what_if=ids).selected`` from the one cached analysis: the chosen
    set is a function of the analysis (``pipeline.selected_fixes``, what ``--what-if`` runs after
    ``graded``'s checks); tests/test_replay.py holds the ``what_if=`` path itself."""
    graded(Options(what_if=tuple(ids)))
    a = analysis(name)
    return selected_fixes(a.results, a.findings, tuple(ids))


def raw_events(name: str) -> list[dict]:
    return raw_events_at(HERE / name)


def band(loop: str, fix: str) -> tuple[float, float]:
    b = json.loads((HERE / f"{loop}.truth.json").read_text())["speedup_band"][fix]
    return b["low"], b["high"]


def finding(loop: str, fid: str, which: str = "before"):
    a = analysis(f"{loop}.{which}.pt.trace.json.xz")
    return next(f for f in a.findings if f.id == fid)


def within(predicted: float, lo: float, hi: float) -> bool:
    return within_band(predicted, lo, hi, TOLERANCE)


# loops whose replays need more rounds than an install without the C replay takes
# (causal/graph.py REPLAY_WORK_MAX_POLARS): there they stop sooner and say so
MANY_BLOCKING_CALLS = ("node",)


def needs_settled_replays(loop: str) -> None:
    from traceinsight.causal import graph

    if loop in MANY_BLOCKING_CALLS and graph._kreplay is None:
        pytest.skip(f"{loop}: its replays settle in the C replay's budget only")


HOLDS = [
    ("hf_trainer", "dataloader_stall", "workers"),  # 1.18 against 1.00-1.27
    ("timm_jpeg", "dataloader_stall", "workers"),  # 1.76 against 1.76-1.91 (3 -> 12 workers)
    ("timm_jpeg", "dataloader_stall", "workers_6"),  # 1.76 against 1.74-1.90 (3 -> 6 workers)
    ("launch_bound", "unfused_optimizer", "fused_optimizer"),  # 1.63 against 1.31-2.67
    ("timm_jpeg", "fp32_compute", "bf16_channels_last"),  # 1.00 against 0.85-1.13
    ("timm_jpeg", "pageable_memcpy", "pin_nonblocking"),  # 1.11 against 0.96-1.07
    ("peft_lora", "recompute_overhead", "no_checkpointing"),  # 1.27 against 1.49-2.23
    # the per-step syncs (Trainer's NaN filter and logging, .item() logging): the wait moves
    # to the input copies' and the optimizer's blocking calls, as measured (0.69-1.26)
    ("hf_trainer", "host_sync", "remove_syncs"),
    ("timm_jpeg", "host_sync", "remove_syncs"),
    ("launch_bound", "host_sync", "remove_syncs"),
    ("peft_lora", "host_sync", "remove_syncs"),
    # Lightning: the optimizer's own part of optimizer.step(closure), the closure left out
    ("lightning", "unfused_optimizer", "fused_optimizer"),  # 1.10 against 0.80-1.26
    ("lightning", "fp32_compute", "bf16_mixed"),  # 0.95 against 0.73-1.02
    # accelerate: one process measured each (A); 0.87, 1.02, 0.95
    ("accelerate", "host_sync", "remove_syncs"),
    ("accelerate", "unfused_optimizer", "fused_optimizer"),
    ("accelerate", "pageable_memcpy", "pin_nonblocking"),
    # the first findings' own fixes, measured in a later pair of processes (C, D: call 5)
    ("accelerate", "launch_bound", "compile_ro"),  # 1.69 against 1.52-1.72
    # 1.74 against 2.12-2.69: below the band (test_compiling_the_trainer says why)
    ("hf_trainer", "launch_bound", "compile_ro"),
    ("launch_bound", "small_batch", "batch_4x"),  # 4.00 against 3.46-4.72 per sample
    # the model under torch.compile reduce-overhead, the optimizer eager (G, H: call 13)
    ("launch_bound", "launch_bound", "compile_ro"),  # 1.54 against 1.49-2.36
    # sentence-transformers, held out (calls 14-16): recorded after the model's last change
    ("sbert", "dataloader_stall", "workers"),  # 1.28 against 1.47-1.51
    ("sbert", "launch_bound", "compile_ro_static"),  # 1.58 against 1.16-1.47 (padded to 128)
    ("sbert", "pageable_memcpy", "pin_nonblocking"),  # 1.00 against 1.03-1.21
    ("sbert", "host_sync", "remove_syncs"),  # 1.00 against 0.89-1.03
    ("sbert", "memory_headroom", "batch_2x"),  # 1.51 against 1.53-1.58 (its recommended 2x)
    # timm's ViT recipe (fp16 + GradScaler), held out (calls 20, 21): four processes A-D
    ("vit_amp", "launch_bound", "compile"),  # 1.15 against 1.19-1.22
    ("vit_amp", "pageable_memcpy", "pin_memory"),  # 1.09 against 1.07-1.26
    ("vit_amp", "unfused_optimizer", "fused_adamw"),  # 1.06 against 1.03-1.14
    ("vit_amp", "host_sync", "remove_syncs"),  # 1.05 against 0.91-1.12
    # PyTorch Geometric's GIN example, held out (session 24): recorded after the model's last change
    ("gnn", "pageable_memcpy", "pin_nonblocking"),  # 1.00 against 0.86-0.90
    ("gnn", "host_sync", "remove_syncs"),  # 1.00 against 0.75-1.02
    # torchdiffeq's neural ODE demo, held out (session 26): recorded before the model changed
    ("node", "small_batch", "batch_4x"),  # 3.97 against 2.53-3.31 per sample
    ("node", "host_sync", "remove_syncs"),  # 1.01 against 0.80-0.94
    # torchvision's Faster R-CNN the reference way, images of one size, held out (session 26)
    ("detection_fixed", "host_sync", "remove_syncs"),  # 1.07 against 1.04-1.06
    # torchvision's DeepLabV3 the segmentation reference's way, held out (session 26)
    ("segmentation", "launch_bound", "compile_ro"),  # 1.11 against 1.26-1.35 (C, D)
    ("segmentation", "host_sync", "remove_syncs"),  # 1.00 against 1.02-1.10
    ("segmentation", "fp32_compute", "bf16"),  # 1.17 against 1.14-1.17 (TF32 math)
    ("segmentation", "fp32_compute", "bf16_channels_last"),  # its advice: 1.12-1.41
    # pytorch/examples' DCGAN (--dataset fake, 2 workers) and word-level LSTM, held out
    # (session 27): recorded before any analysis
    ("dcgan", "host_sync", "remove_syncs"),  # 1.00 against 0.78-0.87
    ("dcgan", "pageable_memcpy", "pin"),  # 1.04 against 0.80-0.90
    ("dcgan", "unfused_optimizer", "fused"),  # 1.04 against 0.95-0.98
    ("word_lm", "launch_bound", "cudagraph"),  # 2.50 against 2.32-2.67 (its advice here)
    ("word_lm", "host_sync", "remove_syncs"),  # 1.01 against 1.01-1.06
    ("word_lm", "fp32_compute", "bf16"),  # 1.00 against 0.78-0.82
    ("word_lm", "memory_headroom", "batch_4x"),  # 3.84 against 3.29-3.60 (4x recommended)
    # timm's ConvNeXt-Tiny the train.py way, fp32, held out (session 28)
    ("convnext", "fp32_compute", "bf16"),  # 2.88 against 3.72-3.85
    # transformers' Trainer pre-training a BERT-base as run_mlm.py does, held out (session 28)
    ("bert_mlm", "host_sync", "remove_syncs"),  # 1.09 against 1.05-1.06
    ("bert_mlm", "dataloader_stall", "workers"),  # 1.07 against 1.03
    # transformers' Trainer on a GPT-2 with 8 micro-batches a step, held out (session 27)
    ("gpt2_accum", "launch_bound", "compile"),  # 1.21 against 1.37-1.85 (default mode; G, H)
    ("gpt2_accum", "memory_headroom", "micro_2x"),  # 1.23 against 1.15-1.23
    ("gpt2_accum", "fp32_compute", "bf16"),  # 1.09 against 1.17-1.24 (autocast's casts priced)
    ("gpt2_accum", "host_sync", "remove_syncs"),  # 1.10 against 1.09-1.11
    ("gpt2_accum", "dataloader_stall", "workers"),  # 1.00 against 0.95-0.98
    # the Trainer fine-tuning a ViT-Base as run_image_classification.py does, the transforms in
    # the step thread, held out (session 30): recorded before any analysis
    ("hf_images", "dataloader_stall", "workers"),  # 1.79 against 1.95-1.98 (4 workers)
    ("hf_images", "dataloader_stall", "workers_1"),  # its advice, 1 worker: 1.58-1.73
    # timm's EfficientNet-B0 the train.py way, held out (session 30)
    ("efficientnet", "dataloader_stall", "pin_memory"),  # 1.19 against 1.27-1.31
    ("efficientnet", "pageable_memcpy", "pin_nonblocking"),  # 1.17 against 1.28-1.36
    ("efficientnet", "channels_first_layers", "channels_last"),  # 1.30 against 1.31-1.41
    # torchvision's MobileNetV2 the classification reference's way (session 30, call 4): the
    # depthwise finding checked on a loop it was not built on; host-bound, so info
    ("mobilenet", "channels_first_layers", "channels_last"),  # 1.00 against 1.06-1.10
    # timm's MobileNetV3-Large in the EfficientNet loop (session 30, call 5): held out likewise
    ("mobilenetv3", "channels_first_layers", "channels_last"),  # 1.37 against 1.17-1.29
    ("mobilenetv3", "dataloader_stall", "pin_nonblocking"),  # 1.21 against 1.28-1.58
    ("mobilenetv3", "pageable_memcpy", "pin_nonblocking"),  # 1.19 against 1.28-1.58
    # nanoGPT's train.py with its Shakespeare config, --compile=False, held out (session 31):
    # recorded before any analysis
    ("nanogpt", "launch_bound", "compile_ro"),  # 2.99 against 2.28-2.45
    # the HF course's T5 seq2seq loop and torchvision's R(2+1)D-18 video reference, held out
    # (session 34): recorded before any analysis
    ("t5_course", "memory_headroom", "batch_4x"),  # 3.89 against 3.32-4.61 per sample
    ("t5_course", "unfused_optimizer", "fused"),  # 1.02 against 1.01-1.24
    ("t5_course", "dataloader_stall", "workers"),  # 1.01 against 0.92-0.97
    ("video_r2p1d", "channels_first_layers", "channels_last"),  # 1.70 against 1.45-1.47
    ("video_r2p1d", "host_sync", "remove_syncs"),  # 1.01 against 1.01
    # the Fine-Tune Whisper blog's Seq2SeqTrainer loop, held out (session 35): recorded before
    # any analysis
    ("whisper", "dataloader_stall", "workers"),  # 2.71 against 2.17-3.17
    ("whisper", "recompute_overhead", "no_checkpointing"),  # 1.08 against 1.01-1.63
]


@pytest.mark.parametrize("loop, fid, fix", HOLDS, ids=[f"{a}-{b}" for a, b, _ in HOLDS])
def test_prediction_within_the_measured_band(loop: str, fid: str, fix: str) -> None:
    needs_settled_replays(loop)
    lo, hi = band(loop, fix)
    w = finding(loop, fid).what_if
    assert w is not None and within(w.speedup, lo, hi), (w.speedup if w else None, lo, hi)


# the loops whose recorded workers fix kept pin_memory=False (the Trainer pins by default): the
# step thread receives each batch, the finding's dataloader_stall@unpinned (1.78 against
# 1.49-1.61, 1.49 against 1.76-1.91, 1.23 against 1.47-1.51, 1.01 against 1.02-1.21)
UNPINNED_WORKERS = ["gnn", "timm_jpeg", "sbert", "wav2vec2"]


@pytest.mark.parametrize("loop", UNPINNED_WORKERS)
def test_workers_without_pin_memory_within_the_measured_band(loop: str) -> None:
    lo, hi = band(loop, "workers")
    f = finding(loop, "dataloader_stall")
    w = f.evidence["what_if_unpinned"]
    assert w is not None and within(w.speedup, lo, hi), (w.speedup if w else None, lo, hi)
    # the variant keeps the receiving and the copies: never above the advised loader's
    assert w.speedup <= f.what_if.speedup


# each loop's recorded "all" as the findings whose fixes it applied (--what-if of that set, issue
# 37 item 6): all_fixes also prices what the recording left out (CUDA graphs, compile's fusion:
# on the ViT 2.25x against its applied set's 1.54x, measured 1.46-1.78x)
APPLIED_SET = {
    "hf_trainer": "host_sync,dataloader_stall,fp32_compute,small_batch@4",
    "timm_jpeg": "dataloader_stall,pageable_memcpy,fp32_compute,host_sync",
    "vit_amp": "unfused_optimizer,host_sync,pageable_memcpy,memory_headroom@2",
}


@pytest.mark.parametrize("loop", list(APPLIED_SET))
def test_the_applied_set_within_the_measured_band(loop: str) -> None:
    lo, hi = band(loop, "all")
    w = chosen(f"{loop}.before.pt.trace.json.xz", APPLIED_SET[loop].split(",")).what_if
    assert w is not None and within(w.speedup, lo, hi), (w.speedup, lo, hi)


# finding -> the recorded fix its advice makes, where the loop measured it
MEASURED = {
    "hf_trainer": {
        "host_sync": "remove_syncs",
        "fp32_compute": "bf16",
        "dataloader_stall": "workers",
        "launch_bound": "compile_ro",
        "small_batch": "batch_4x",
    },
    "timm_jpeg": {
        "host_sync": "remove_syncs",
        "pageable_memcpy": "pin_nonblocking",
        "fp32_compute": "bf16_channels_last",
        "dataloader_stall": "workers",
    },
    "launch_bound": {
        "host_sync": "remove_syncs",
        "unfused_optimizer": "fused_optimizer",
        "small_batch": "batch_4x",
        "launch_bound": "compile_ro",
    },
    "peft_lora": {"host_sync": "remove_syncs", "recompute_overhead": "no_checkpointing"},
    "lightning": {"unfused_optimizer": "fused_optimizer", "fp32_compute": "bf16_mixed"},
    "sbert": {
        "host_sync": "remove_syncs",
        "pageable_memcpy": "pin_nonblocking",
        "fp32_compute": "bf16",  # measured 0.48-0.63: a slowdown (info here)
        "dataloader_stall": "workers",
        "launch_bound": "compile_ro_static",
        "memory_headroom": "batch_2x",
    },
    "accelerate": {
        "host_sync": "remove_syncs",
        "unfused_optimizer": "fused_optimizer",
        "pageable_memcpy": "pin_nonblocking",
        "launch_bound": "compile_ro",
    },
    "vit_amp": {
        "host_sync": "remove_syncs",
        "pageable_memcpy": "pin_memory",
        "unfused_optimizer": "fused_adamw",
        "launch_bound": "compile",
    },
    "gnn": {
        "host_sync": "remove_syncs",
        "pageable_memcpy": "pin_nonblocking",
        "dataloader_stall": "workers",
        "memory_headroom": "batch_4x",
    },
    "node": {
        "host_sync": "remove_syncs",
        "small_batch": "batch_4x",
        "launch_bound": "compile_ro",  # 0.19-0.25: the solver's path varies (graded low)
        "elementwise_heavy": "compile",  # 0.71-0.78
    },
    "detection_fixed": {
        "host_sync": "remove_syncs",
        "fp32_compute": "bf16",  # 0.84-0.90
        "launch_bound": "compile",  # 0.07 (recompiles; 0.82 on the steady steps' median)
        "memory_headroom": "batch_2x",
    },
    "segmentation": {
        "host_sync": "remove_syncs",
        "launch_bound": "compile_ro",
        "fp32_compute": "bf16_channels_last",
    },
    "dcgan": {
        "host_sync": "remove_syncs",
        "pageable_memcpy": "pin",
        "unfused_optimizer": "fused",
        "launch_bound": "compile",  # 0.79-0.95: the workers bound the step
        "memory_headroom": "batch_4x",  # 0.83-0.93 per sample: the workers bound the step
        "dataloader_stall": "workers_8",
    },
    "gpt2_accum": {
        "launch_bound": "compile",
        "host_sync": "remove_syncs",
        "fp32_compute": "bf16",
        "memory_headroom": "micro_2x",
        "dataloader_stall": "workers",  # 0.95-0.98
    },
    "convnext": {
        "fp32_compute": "bf16",
        "memory_headroom": "batch_2x",  # 1.02 per sample
        "launch_bound": "compile",  # 1.05
    },
    "bert_mlm": {
        "fp32_compute": "bf16",
        "host_sync": "remove_syncs",  # 1.05-1.06
        "dataloader_stall": "workers",  # 1.03
        "memory_headroom": "batch_4x",  # 1.17-1.21 per sample
    },
    "word_lm": {
        "host_sync": "remove_syncs",
        "fp32_compute": "bf16",
        "launch_bound": "cudagraph",  # its advice where the model runs an LSTM
        "memory_headroom": "batch_4x",
    },
    "hf_images": {
        "dataloader_stall": "workers",
        "fp32_compute": "bf16",  # 0.82-0.99
        "host_sync": "remove_syncs",  # 1.03-1.05
        "memory_headroom": "batch_4x",
        "launch_bound": "compile",  # 0.89-1.39 (B's compile waited in its window)
    },
    "efficientnet": {
        "dataloader_stall": "pin_memory",  # its headline: the receiving, pin_memory=True
        "pageable_memcpy": "pin_nonblocking",
        "fp32_compute": "bf16",  # 0.97-0.99
        "memory_headroom": "batch_2x",  # 1.05-1.08 per sample
        "launch_bound": "compile",
        "channels_first_layers": "channels_last",
    },
    "mobilenetv3": {
        "channels_first_layers": "channels_last",
        "dataloader_stall": "pin_nonblocking",
        "pageable_memcpy": "pin_nonblocking",
        "fp32_compute": "bf16",  # 0.99-1.04
        "memory_headroom": "batch_2x",  # 1.04-1.14 per sample
    },
    "mobilenet": {
        "channels_first_layers": "channels_last",  # 1.06-1.10
        "fp32_compute": "bf16",  # 0.84-0.95
        "memory_headroom": "batch_4x",  # 1.58-1.68 per sample (it recommends 2x)
    },
    "nanogpt": {
        "launch_bound": "compile_ro",  # 2.28-2.45 (its advice: reduce-overhead's CUDA graphs)
        "memory_headroom": "batch_4x",  # 1.87-2.13 per sample
    },
    "t5_course": {
        "memory_headroom": "batch_4x",
        "unfused_optimizer": "fused",  # 1.01-1.24
        "dataloader_stall": "workers",  # 0.92-0.97
        "host_sync": "remove_syncs",  # 0.96-1.03
        "fp32_compute": "bf16",  # 0.21-0.33: cuDNN attention's per-shape setup
    },
    "video_r2p1d": {
        "channels_first_layers": "channels_last",
        "fp32_compute": "bf16",  # 1.23-1.26 (a device-speed change: within 40%)
        "host_sync": "remove_syncs",  # 1.01
        "dataloader_stall": "workers_14",  # 1.01
        "memory_headroom": "batch_2x",  # 1.03-1.04 per sample
    },
    "whisper": {
        "dataloader_stall": "workers",
        "recompute_overhead": "no_checkpointing",  # 1.01-1.63
        "host_sync": "remove_syncs",  # 0.72-1.45
        "memory_headroom": "batch_2x",  # 0.86-1.35 per sample
    },
    "neural_style": {
        "launch_bound": "compile_ro",  # 0.35-1.16 over four processes (1.13 predicted)
        "dataloader_stall": "workers",
        "host_sync": "remove_syncs",  # 1.02-1.12
        "fp32_compute": "bf16",  # 1.05-1.08
        "memory_headroom": "batch_2x",  # 1.15-1.16 per sample (recommended 2x)
        "pageable_memcpy": "workers",  # the workers' fix pins the batches
    },
}


@pytest.mark.parametrize("loop", sorted(MEASURED))
def test_no_finding_above_low_for_a_fix_measured_below_1_10(loop: str) -> None:
    needs_settled_replays(loop)
    a = analysis(f"{loop}.before.pt.trace.json.xz")
    for f in a.findings:
        fix = MEASURED[loop].get(f.id)
        if fix is not None and band(loop, fix)[1] < 1.10:
            assert f.severity in ("low", "info"), (f.id, f.severity, band(loop, fix))


@pytest.mark.parametrize(
    "loop, fix, gone",
    [
        ("launch_bound", "cudagraph", "launch_bound"),
        ("launch_bound", "fused_optimizer", "unfused_optimizer"),
        ("neural_style", "workers", "dataloader_stall"),
        ("peft_lora", "no_checkpointing", "recompute_overhead"),
        ("timm_jpeg", "workers", "dataloader_stall"),
        ("sbert", "compile_ro_static", "launch_bound"),
        ("hf_images", "workers", "dataloader_stall"),
        ("efficientnet", "pin_nonblocking", "dataloader_stall"),
        ("efficientnet", "pin_nonblocking", "pageable_memcpy"),
        ("efficientnet", "pin_channels_last", "channels_first_layers"),
        ("nanogpt", "compile_ro", "launch_bound"),
        ("video_r2p1d", "channels_last", "channels_first_layers"),
        ("whisper", "workers", "dataloader_stall"),
    ],
)
def test_the_fixed_cause_is_gone_in_the_profiled_after(loop: str, fix: str, gone: str) -> None:
    before = {f.id for f in analysis(f"{loop}.before.pt.trace.json.xz").findings}
    after = {f.id: f for f in analysis(f"{loop}.{fix}.after.pt.trace.json.xz").findings}
    assert gone in before
    assert gone not in after or after[gone].severity == "info"


LEVER_WITHIN = 0.10  # issue 37: the first finding is the largest measured lever, within 10%
# recorded configurations that apply several findings' fixes at once: no single lever (a
# finding whose own advice is the pair, as fp32_compute's bf16 + channels_last on DeepLabV3's
# TF32 math, is listed as its fix instead)
COMBINED = {
    "efficientnet": ("pin_channels_last",),
    "video_r2p1d": ("bf16_channels_last",),
    # session 38: launch_bound's advice with the workers (each two fixes at once)
    "whisper": ("workers_pad", "workers_pad_compile_ro"),
}


@pytest.mark.parametrize(
    "loop, fid, fix, largest",
    [
        ("timm_jpeg", "dataloader_stall", "workers", "workers"),
        # the Trainer with accumulation: default torch.compile (G, H), reduce-overhead failed
        ("gpt2_accum", "launch_bound", "compile", "compile"),
        # the batch lever: it recommends 8x (measured 8.56-9.50); 16x measured larger (call 21)
        ("peft_lora", "memory_headroom", "batch_16x", "batch_16x"),
        ("lightning", "memory_headroom", "batch_4x", "batch_4x"),
        ("hf_trainer", "launch_bound", "compile_ro", "compile_ro"),  # 2.12-2.69; batch_4x 1.77
        ("accelerate", "launch_bound", "compile_ro", "compile_ro"),  # 1.52-1.72; all 1.28
        # its advice, torch.compile reduce-overhead: 1.64 in one process (E, session 22), the
        # largest (the default mode 1.12-1.22, the 2x batch 1.05-1.26)
        ("vit_amp", "launch_bound", "compile_ro", "compile_ro"),
        ("node", "small_batch", "batch_4x", "batch_4x"),  # 2.53-3.31; nothing else above 1
        ("detection_fixed", "memory_headroom", "batch_2x", "batch_2x"),  # 1.25-1.28
        # bf16 + channels_last 1.12-1.41, compile_ro (launch_bound's advice) 1.26-1.35: within 10%
        ("segmentation", "launch_bound", "compile_ro", "bf16_channels_last"),
        # bf16 2.35-2.79 (default torch.compile 2.00-2.08)
        ("bert_mlm", "fp32_compute", "bf16", "bf16"),
        ("convnext", "fp32_compute", "bf16", "bf16"),  # 3.72-3.85 (compile 1.05)
        ("hf_images", "dataloader_stall", "workers", "workers"),  # 1.95-1.98 (batch_4x 1.30-1.41)
        # channels_last 1.31-1.41 against the default torch.compile's 1.39-1.45 (a lever no
        # finding prices: test_the_held_out_efficientnet_loop)
        ("efficientnet", "channels_first_layers", "channels_last", "compile"),
        ("mobilenet", "memory_headroom", "batch_4x", "batch_4x"),  # 1.58-1.68 (channels_last 1.10)
        # 2.19 against 2.18-2.44 (the 4x batch 1.28-1.38; test_the_held_out_neural_style_loop)
        ("neural_style", "dataloader_stall", "workers", "workers"),
        ("t5_course", "memory_headroom", "batch_4x", "batch_4x"),  # 3.32-4.61 (fused 1.01-1.24)
        # channels_last 1.45-1.47 against bf16's 1.23-1.26 (both 1.89-1.92)
        ("video_r2p1d", "channels_first_layers", "channels_last", "channels_last"),
        # workers 2.17-3.17 against the numpy rows' 1.71-2.87 (the same stall's other fix)
        ("whisper", "dataloader_stall", "workers", "workers"),
        # (the launch-bound loop: a miss, test_the_largest_lever_on_the_launch_bound_loop)
    ],
)
def test_the_first_finding_is_the_largest_measured_lever(
    loop: str, fid: str, fix: str, largest: str
) -> None:
    needs_settled_replays(loop)
    a = analysis(f"{loop}.before.pt.trace.json.xz")
    assert a.findings[0].id == fid
    bands = json.loads((HERE / f"{loop}.truth.json").read_text())["speedup_band"]
    best = max(
        (k for k in bands if k not in ("all", "baseline", *COMBINED.get(loop, ()))),
        key=lambda k: bands[k]["high"],
    )
    assert best == largest
    assert bands[fix]["high"] >= (1 - LEVER_WITHIN) * bands[best]["high"], (bands[fix], best)


# ---- the misses, each with its mechanism (benchmarks/RESULTS.md) ---------------------------


def test_the_largest_lever_on_the_launch_bound_loop() -> None:
    """A miss in the ranking, with its mechanism. Measured in the same two processes (E, F:
    baselines 37.8 ms), the whole step as one CUDA graph ran in 6.44-6.52 ms (5.80-5.87x) and
    the 4x batch 4.27-4.36x per sample (it took 0.85-1.16x the step in C and D: still launch-
    bound, as small_batch says: the GPU's 2.8 ms a step, x4, stays under the host's time). The
    finding that ranks first is small_batch (4.00x, right for its own fix); launch_bound ranks
    lower because its saving rests on the recommended model-only capture (torch.compile
    reduce-overhead: 1.54x, the optimizer eager and the loop's Python kept; measured 1.49-2.36x
    in processes G and H). Its other priced fix, the whole step in one graph (a replay runs the
    kernels alone), is 5.54x, 6.29 ms after against the 6.44-6.52 measured: ranked by it,
    launch_bound would come first."""
    cfg = json.loads((HERE / "launch_bound.truth.json").read_text())["configs"]
    per = {
        fix: [cfg["baseline"][p]["per_sample_ms"] / cfg[fix][p]["per_sample_ms"] for p in "EF"]
        for fix in ("cudagraph", "batch_4x")
    }
    assert min(per["cudagraph"]) > 1.3 * max(per["batch_4x"])  # the whole-step graph is larger
    grew = [cfg["batch_4x"][p]["step_ms_window_mean"] / cfg["baseline"][p]["step_ms_window_mean"]
            for p in "CDEF"]  # fmt: skip
    assert all(0.8 < g < 1.2 for g in grew), grew
    a = analysis("launch_bound.before.pt.trace.json.xz")
    assert a.findings[0].id == "small_batch"
    small = a.findings[0].what_if
    assert small.multiplier == 4 and within(
        small.speedup, min(per["batch_4x"]), max(per["batch_4x"])
    )
    f = finding("launch_bound", "launch_bound")
    whole = f.evidence["what_if_whole_step"]
    assert f.what_if.speedup < small.speedup < whole.speedup
    measured_after_ms = [cfg["cudagraph"][p]["step_ms_window_mean"] for p in "EF"]
    assert whole.step_time_after_ns / 1e6 == pytest.approx(min(measured_after_ms), rel=0.10)


def test_the_compiled_loops_profiled_after() -> None:
    """Profiled after compile_ro (call 6): on accelerate launch_bound falls to low (1.04x, from
    1.69x HIGH), as on the launch-bound loop (1.07x from 1.54x HIGH; the per-parameter optimizer,
    eager, is its second finding); on the Trainer it falls from 1.74x HIGH to a 1.12x remainder (the eager
    optimizer and the Trainer's own host work), and the loader the compiled step now waits for
    comes first (its un-profiled step 14.3 ms against 15.7 measured in that process)."""
    for name in ("accelerate", "launch_bound"):  # the launch-bound loop: call 13
        after = {f.id: f for f in analysis(f"{name}.compile_ro.after.pt.trace.json.xz").findings}
        assert after["launch_bound"].severity in ("low", "info")
        assert after["launch_bound"].what_if.speedup < 1.10
    # what the compiled model leaves on the launch-bound loop: its eager per-parameter AdamW
    left = analysis("launch_bound.compile_ro.after.pt.trace.json.xz").findings
    assert "unfused_optimizer" in [f.id for f in left[:2]]
    hf = analysis("hf_trainer.compile_ro.after.pt.trace.json.xz")
    assert hf.findings[0].id == "dataloader_stall"
    left = next(f for f in hf.findings if f.id == "launch_bound").what_if
    before = finding("hf_trainer", "launch_bound").what_if
    assert left.speedup < 1.15 < 1.5 < before.speedup


def test_compiling_the_trainer() -> None:
    """TrainingArguments(torch_compile=True, torch_compile_mode="reduce-overhead") measured
    2.12-2.69x (11.4-16.0 ms a step); launch_bound predicts 1.74x (24.0 ms after): within 25%
    of the band, under it. The step it starts from (41.8 ms) keeps the profiler's cost the
    estimate does not take out (8.0-11.1 ms over the same processes' baselines), and the step
    after keeps as much (8.1-12.6 ms over the compiled steps): that cost sits in the host work
    the graphs do not replace (the Python collator, the optimizer, the Trainer's own), so it
    is a constant in both and the ratio comes out low. With torch_compile=True and tf32 unset
    the Trainer also turns TF32 on (found in session 28: on BERT-base MLM tf32=True alone
    measured 1.71-1.77x of compile's 2.00-2.08x, on GPT-2 1.11-1.15x of 1.37-1.85x); its share
    here was not measured."""
    truth = json.loads((HERE / "hf_trainer.truth.json").read_text())["configs"]
    w = finding("hf_trainer", "launch_bound").what_if
    lo, hi = band("hf_trainer", "compile_ro")
    assert within(w.speedup, lo, hi) and w.speedup < lo
    for p in ("C", "D"):  # the processes that ran the compiled loop, each with its baseline
        before_ms = truth["baseline"][p]["step_ms_window_mean"]
        after_ms = truth["compile_ro"][p]["step_ms_window_mean"]
        left_before = w.step_time_ns / 1e6 - before_ms
        left_after = w.step_time_after_ns / 1e6 - after_ms
        assert left_before > 5 and left_after == pytest.approx(left_before, rel=0.2), p


def test_cuda_graphs_on_the_launch_bound_loop() -> None:
    """The recorded fix captured the whole step, optimizer included: 3.88-5.87x over four
    processes. The finding's saving rests on the recommended model-only capture (torch.compile
    reduce-overhead: the optimizer eager, 1.54x; measured 1.49-2.36x); its evidence prices the
    whole step's capture as its other fix (5.54x), within the band."""
    lo, hi = band("launch_bound", "cudagraph")
    f = finding("launch_bound", "launch_bound")
    whole = f.evidence["what_if_whole_step"]
    assert f.what_if.speedup < whole.speedup
    assert lo <= whole.speedup <= hi, (whole.speedup, lo, hi)


def test_compiling_the_lightning_loop() -> None:
    """Default torch.compile measured 1.40-1.41x (15.2-16.5 ms a step). The launch_bound
    what-if's step after the fix is that step; its speedup (1.79x) is over the band by the
    step it starts from (27.2 ms against 21.3-23.3 measured in A and B, 26.8 in its own
    process: CUPTI's cost on the host, see test_unprofiled_step_estimate_against_the_measured_one;
    29.0 while the loader's one long step was taken for a period)."""
    base = json.loads((HERE / "lightning.truth.json").read_text())["configs"]
    after_ms = [v["step_ms_window_mean"] for v in base["compile"].values()]
    w = finding("lightning", "launch_bound").what_if
    assert min(after_ms) * (1 - TOLERANCE) <= w.step_time_after_ns / 1e6 <= max(after_ms)
    lo, hi = band("lightning", "compile")
    assert w.speedup > (1 + TOLERANCE) * hi
    # the baselines of the processes that ran the compile (A, B)
    before_ms = [base["baseline"][p]["step_ms_window_mean"] for p in base["compile"]]
    assert w.step_time_ns / 1e6 > 1.15 * max(before_ms)


# The applied set of each recorded "all" as --what-if ids (ID@K: the batch multiplier recorded)
APPLIED = {
    "peft_lora": "memory_headroom@4,recompute_overhead,host_sync",  # 5.09 against 5.94-7.12
    # no memory events: the batch lever is small_batch (4.42 against 3.35-4.14; 2.88 while the
    # larger batch scaled the loading the advised workers had taken off the step thread)
    "hf_trainer": "host_sync,dataloader_stall,fp32_compute,small_batch@4",
    # 3.68 against 3.57-3.79 (3.30 from the mean step): the 4x batch with the loader's host
    # work x4, then the rest
    "lightning": "memory_headroom@4,launch_bound,fp32_compute,unfused_optimizer",
    # 2.12 against 2.72-3.68 (1.93 while the first step kept the profiler's cost): once the
    # loader keeps up the step is GPU-bound, and channels_last also drops the layout kernels
    "timm_jpeg": "dataloader_stall,pageable_memcpy,fp32_compute,host_sync",
    # (sbert: a miss, test_the_applied_set_of_the_sbert_loop)
    # 1.54 against 1.46-1.78 (held out); its 2x batch is not raised (saturation 1.41) but priced
    # as asked; bf16 in place of fp16 + GradScaler has no finding (measured 0.86-1.13)
    "vit_amp": "unfused_optimizer,host_sync,pageable_memcpy,memory_headroom@2",
    # 4.04 against 3.22-3.33 (held out: session 26)
    "node": "small_batch@4,host_sync",
    # 1.85 against 1.35-1.53 (held out: session 26); its 8 workers have no finding (the 4 keep
    # up: dataloader_stall prices pin_memory, measured with 8 workers 0.99-1.03)
    "detection_fixed": "host_sync,memory_headroom@2,fp32_compute",
    # 3.14 against 2.62-2.65 (held out: session 27; 4.59 before the bf16 transform priced
    # misaligned matmuls and autocast's casts)
    "gpt2_accum": "fp32_compute,memory_headroom@4,host_sync,dataloader_stall",
    # (hf_images: its 4x batch is no finding, test_the_held_out_hf_images_loop)
    # 1.82 against 1.20-1.57 (held out: session 30; the recorded all also ran bf16, 0.99-1.04
    # alone, and the 2x batch, 1.04-1.14, neither a finding)
    "mobilenetv3": "channels_first_layers,dataloader_stall,pageable_memcpy",
}


@pytest.mark.parametrize("loop", sorted(APPLIED))
def test_what_if_of_the_applied_set_within_the_measured_all(loop: str) -> None:
    needs_settled_replays(loop)
    lo, hi = band(loop, "all")
    sel = chosen(f"{loop}.before.pt.trace.json.xz", APPLIED[loop].split(","))
    w = sel.what_if
    assert sel.not_raised == () and w is not None and within(w.speedup, lo, hi)
    ks = [int(k) for i in APPLIED[loop].split(",") if (k := i.partition("@")[2]).isdigit()]
    assert w.multiplier == (ks[0] if ks else None)
    assert sel.priced_not_raised == ()


def test_the_applied_set_of_the_sbert_loop() -> None:
    """A miss, with its mechanism: the applied set (the loader, bf16, the syncs, pinned copies,
    the 4x batch) prices 1.27x against 2.21-2.82x measured for all together. bf16 alone measured
    0.46-0.63x: under bf16 SDPA takes cuDNN's attention, which builds a graph per new shape
    (the bf16 after: ``aten::_cudnn_attention_forward`` 78 ms on its first calls of a shape).
    Since session 59 the bf16 transform prices those builds in every step that met a new shape,
    3 of 3 in the fp32 window: 0.30x (0.93x before, and the set 4.67x); the run's sentence
    lengths recur more often than three steps show (its bf16 after built in 2 of 3 steps), so
    the builds are an upper end. With bf16's measured band in place of its price the set
    brackets the measured all. (Until session 30 it priced 2.64x, within by a cancellation: the
    larger batch scaled the loading that the advised workers had taken off the step thread.)"""
    ids = "dataloader_stall,fp32_compute,host_sync,pageable_memcpy,memory_headroom@4"
    w = chosen("sbert.before.pt.trace.json.xz", ids.split(",")).what_if
    lo, hi = band("sbert", "all")
    assert w.speedup < lo / (1 + TOLERANCE)
    f = finding("sbert", "fp32_compute")
    bf16 = f.what_if.speedup
    assert 0.25 < bf16 < 0.35
    # the range the trace leaves (builds in every step that met a new shape, to none) holds
    # bf16's measured band
    assert (
        bf16
        < band("sbert", "bf16")[0]
        < band("sbert", "bf16")[1]
        < f.evidence["speedup_known_shapes"]
    )
    b_lo, b_hi = band("sbert", "bf16")
    assert w.speedup / bf16 * b_lo <= hi and w.speedup / bf16 * b_hi >= lo


def test_the_applied_set_of_the_launch_bound_loop_names_its_capture() -> None:
    """The launch-bound loop's recorded "all" captured the whole step in one CUDA graph with the
    fused optimizer and no syncs (14.45-18.55x). ``launch_bound@whole_step`` picks the finding's
    other priced fix (its evidence's ``what_if_whole_step``) over the model-only capture: 17.67x
    (1.97 ms a step after) against 4.78x, within the band. The recorded graph ran 507 nodes
    with 1.52 ms of kernels in 1.74 ms (benchmarks/graph_step_cost.py, call 13): a replay runs
    the kernels at a 0.4 us node gap and none of the host's op work (session 18's 7.41x kept
    the ops' CPU time inside the graph and a 1 us gap)."""
    path = "launch_bound.before.pt.trace.json.xz"
    ids = ["launch_bound@whole_step", "unfused_optimizer", "host_sync"]
    w = chosen(path, ids).what_if
    model_only = chosen(path, [i.split("@")[0] for i in ids])
    assert w.transforms == ("cuda_graphs_whole_step", "fused_optimizer", "remove_syncs")
    assert model_only.what_if.speedup < 0.5 * w.speedup
    lo, hi = band("launch_bound", "all")
    assert within(w.speedup, lo, hi), (w.speedup, lo, hi)
    # the fused step adds no capturable kernels: the order of the fixes does not matter
    other = chosen(path, ids[::-1]).what_if
    assert other.step_time_after_ns == w.step_time_after_ns
    with pytest.raises(InputError, match="prices no fix named 'whole'.*whole_step"):
        chosen(path, ["launch_bound@whole"])


def test_the_whole_step_graph_with_a_per_parameter_optimizer() -> None:
    """The recorded ``cudagraph`` fix kept AdamW(foreach=False), made capturable: 3,625 kernels
    a step in its profiled trace against 1,637 eager (the optimizer's 8 a parameter became 22:
    the bias corrections and step size on the device), 5.3 ms of kernels against 2.7, and one
    replay took 6.20 ms on the GPU un-profiled (graph_step_cost.py, call 13). The whole-step
    what-if prices those kernels (causal/build.py CAPTURABLE_ADAM_EXTRA_KERNELS): 6.29 ms after
    against 6.30 ms in that process and 6.44-6.52 ms in processes E and F."""

    def per_step(name: str) -> int:
        raw = raw_events(name)
        steps = sum(1 for e in raw if e.get("cat") == "user_annotation"
                    and e["name"].startswith("ProfilerStep#"))  # fmt: skip
        return sum(1 for e in raw if e.get("cat") == "kernel") // steps

    eager = per_step("launch_bound.before.pt.trace.json.xz")
    graphed = per_step("launch_bound.cudagraph.after.pt.trace.json.xz")
    assert (eager, graphed) == (1637, 3625)
    assert graphed - eager == 142 * 14  # 142 parameters, 14 more kernels each
    whole = finding("launch_bound", "launch_bound").evidence["what_if_whole_step"]
    assert whole.step_time_after_ns / 1e6 == pytest.approx(6.30, rel=0.10)


def test_the_batch_lever_without_memory_events() -> None:
    """The Trainer's trace has no memory events: small_batch proposes the batch where the GPU's
    busy time fills the step (2x here), says the fit is unknown, and at the recorded 4x
    replays 2.18 against 1.69-1.77 measured per sample (the loader's per-batch host work
    grows with the batch: 3.8 without that)."""
    f = finding("hf_trainer", "small_batch")
    assert f.evidence["fits"] is None and "memory events" in f.evidence["fit_unknown_because"]
    assert f.what_if.multiplier == 2
    lo, hi = band("hf_trainer", "batch_4x")
    at4 = chosen("hf_trainer.before.pt.trace.json.xz", ["small_batch@4"]).what_if
    assert within(at4.speedup, lo, hi), (at4.speedup, lo, hi)
    # with memory events the lever is memory_headroom's, never both
    ids = [f.id for f in analysis("peft_lora.before.pt.trace.json.xz").findings]
    assert "memory_headroom" in ids and "small_batch" not in ids
    # both say what the prediction takes as given (an exact GP's N x N kernel matrix broke it:
    # 6.12x predicted at 8x the points, 1.65-1.72x measured, benchmarks/RESULTS.md session 48)
    headroom = finding("peft_lora", "memory_headroom")
    for g in (f, headroom):
        assert g.evidence["assumes"].startswith("the GPU's work grows linearly with the batch")


def test_a_model_the_frames_do_not_hold_leaves_its_backward_eager() -> None:
    """What torch.compile(model) captures is the model's forward frames and their backward.
    Where the frames found hold little of the step's forward launches, the backward is not
    taken as the model's either. torchdiffeq's solver runs the ODE function (_PerturbFunc,
    6% of the 3,170 launches outside backward ops, counted from the runtime launch calls by
    a script of its own):
    compile_ro measured 0.19-0.25x, and launch_bound read 2.01x from every backward op
    captured, now 1.06x (GPyTorch, session 48: 1.12x, measured 0.98-1.00x)."""
    from traceinsight.analyzers.context import build_context
    from traceinsight.analyzers.optimizer import BACKWARD_PATTERN
    from traceinsight.analyzers.replay import (
        MODEL_FRAMES_MIN_LAUNCH_SHARE,
        _launch_share,
        model_ranges,
    )
    from traceinsight.model.classify import HOST_OP_KINDS
    from traceinsight.parsers import load_trace

    ctx = build_context(load_trace(HERE / "node.before.pt.trace.json.xz"))
    ranges = model_ranges(ctx)
    cols = ("tid", "start_ns", "end_ns")
    backward = ctx.rows(HOST_OP_KINDS, BACKWARD_PATTERN, columns=cols).select(cols)
    assert backward.height > 0 and ranges.join(backward, on=list(cols)).height == 0
    share = _launch_share(ctx, ranges, backward)
    assert share < MODEL_FRAMES_MIN_LAUNCH_SHARE and share == pytest.approx(200 / 3170, abs=0.01)
    f = finding("node", "launch_bound")
    assert f.severity == "low" and f.what_if.speedup < 1.10
    # a model the frames hold keeps its backward: e3nn's SimpleNetwork holds 99% of them
    e3nn = build_context(
        load_trace(HERE.parent.parent / "h100" / "thirdparty" / "e3nn.before.pt.trace.json.xz")
    )
    e3nn_ranges = model_ranges(e3nn)
    e3nn_backward = e3nn.rows(HOST_OP_KINDS, BACKWARD_PATTERN, columns=cols).select(cols)
    assert e3nn_ranges.join(e3nn_backward, on=list(cols)).height == e3nn_backward.height


def test_lightning_closure_is_not_the_optimizers() -> None:
    """Lightning runs forward and backward inside optimizer.step(closure): the optimizer's
    own part starts where the closure's backward ends. Against the raw events: each
    Optimizer.step range from the end of the last autograd-engine op that started inside it
    (on any thread) to the range's end."""
    ev = [e for e in raw_events("lightning.before.pt.trace.json.xz") if e.get("ph") == "X"]
    steps = [e for e in ev if e["name"].startswith("Optimizer.step#")]
    bw = [e for e in ev if e["name"].startswith("autograd::engine::evaluate_function")]
    own_us = []
    for o in steps:
        inside = [b["ts"] + b["dur"] for b in bw if o["ts"] <= b["ts"] <= o["ts"] + o["dur"]]
        own_us.append(o["ts"] + o["dur"] - max([o["ts"], *inside]))
    opt = analysis("lightning.before.pt.trace.json.xz").results.optimizer
    assert 1_000 < sum(own_us) / len(own_us) < 10_000  # a few ms, not the 28 ms of the range
    # the analyzer's window holds the steps whose range starts inside it: compare per step
    assert opt.host_ns_per_step == pytest.approx(1000 * sum(own_us) / len(own_us), rel=0.25)
    assert opt.kernels_per_step < 20  # 12 foreach kernels, not the closure's 88


def test_the_loader_plan() -> None:
    """timm with 3 workers: the loader delivers one batch per step as run (98.6 ms over the
    recorded period), the step with its waits hidden takes 39.0 ms, so 2.53x the workers keep
    up. Measured: 6 workers (2x) ran 49.0-51.5 ms a step, the 49.3 ms that twice the rate
    gives; 12 (4x) 44.6-45.6 ms, near the hidden step (they share the host's 16 cores with the
    step thread). The Trainer loads in the step's thread (num_workers=0): its loading per batch
    is the wait, one worker hides it (4 workers measured 1.00-1.27)."""
    timm = finding("timm_jpeg", "dataloader_stall").evidence["loader_plan"]
    assert timm.iterator == "multi_process" and timm.workers_needed is None
    assert 2.0 < timm.workers_factor < 3.0  # twice the workers not quite enough, 4x more than
    cfg = json.loads((HERE / "timm_jpeg.truth.json").read_text())["configs"]
    six = [cfg["workers_6"][p]["step_ms_window_mean"] for p in "CD"]
    assert all(m == pytest.approx(timm.batch_interval_ns / 2e6, rel=0.05) for m in six), six
    lo, hi = band("timm_jpeg", "workers_6")
    assert within(timm.assumed_speedup, lo, hi)
    assert timm.assumed_speedup <= timm.upper_bound_speedup
    hf = finding("hf_trainer", "dataloader_stall").evidence["loader_plan"]
    assert hf.iterator == "single_process" and hf.workers_needed == 1
    assert hf.loading_per_batch_ns == hf.batch_interval_ns - hf.compute_step_ns


def test_a_periodic_loader_step_is_taken_over_whole_periods() -> None:
    """timm's steps (3 workers): two fast, one with the loader's long wait. The predictions
    start from the mean over the modelled steps (the run's time per step), where a steady
    loop keeps the median. Lightning's loader (num_workers=0) took 11.3 ms in one step's
    ``__next__`` against 2.8-4.4 ms in the others (raw events), which explains its spread, but
    a loader in the step's own thread makes no period (every batch loaded alike): the median,
    27.2 ms against 26.8 in its process (the mean, as first taken, 29.0)."""
    assert analysis("timm_jpeg.before.pt.trace.json.xz").results.replay.step_statistic == "mean"
    for loop in ("launch_bound", "peft_lora", "lightning"):
        rp = analysis(f"{loop}.before.pt.trace.json.xz").results.replay
        assert rp.step_statistic == "median", loop


def test_larger_batch_on_the_lora_loop() -> None:
    """The recorded fix is a 4x batch (2 -> 8): the headroom finding's replayed gain at 4x
    (GPU work x4, the loader's host work x4, other host work per step held) is 4.0 against
    3.20-3.28 measured per sample; it recommends 8x (6.8x predicted), which was not recorded.
    Lightning (the step thread loads its batches): 2.76 against 2.76-3.69."""
    lo, hi = band("peft_lora", "batch_4x")
    f = finding("peft_lora", "memory_headroom")
    gains = {g.multiplier: g.throughput_gain for g in f.evidence["gain_by_multiplier"]}
    assert within(gains[4], lo, hi), (gains, lo, hi)
    lo, hi = band("lightning", "batch_4x")
    f = finding("lightning", "memory_headroom")
    gains = {g.multiplier: g.throughput_gain for g in f.evidence["gain_by_multiplier"]}
    assert within(gains[4], lo, hi), (gains, lo, hi)


def test_unprofiled_step_estimate_against_the_measured_one() -> None:
    """The profiler's cost, read off the trace (the median no-work op per recorded event),
    against two measurements of the un-profiled step: the same process's 8 steps right before
    the capture (what the trace's own process ran at), and the fresh processes (A/B, and C/D
    where a later call added a fix: 10-51% apart from each other). Measured here so a better estimate shows."""
    same, fresh = {}, {}
    for loop in MEASURED:
        truth = json.loads((HERE / f"{loop}.truth.json").read_text())
        base = truth["configs"]["baseline"]
        ms = [v["step_ms_window_mean"] for v in base.values() if "step_ms_window_mean" in v]
        own = truth["profiled"]["baseline"]["unprofiled_same_process_step_ms_window_mean"]
        est = analysis(f"{loop}.before.pt.trace.json.xz").results.replay.unprofiled_step_ns / 1e6
        same[loop], fresh[loop] = est / own, est / (sum(ms) / len(ms))
    # against the trace's own process: LoRA 1.02, Lightning 1.08, the launch-bound loop 1.13
    assert all(0.95 < same[x] < 1.15 for x in ("peft_lora", "lightning", "launch_bound")), same
    # the HF stacks keep a third more than the estimate takes out: accelerate 1.41, Trainer 1.34
    assert all(1.25 < same[x] < 1.5 for x in ("accelerate", "hf_trainer")), same
    # data-bound: the workers' interval as recorded (98.6 ms a step over the period) against
    # 96.1 in its process (1.03; 0.74 while the profiler's cost was taken out of every step
    # instead of moving into the wait for the workers); the fresh processes' 80.3-93.0: 1.13
    assert 0.95 < same["timm_jpeg"] < 1.1 and 1.0 < fresh["timm_jpeg"] < 1.2
    host_bound = ("hf_trainer", "launch_bound", "peft_lora", "lightning", "accelerate")
    # 1.08-1.42 over every fresh process; 1.17-1.58 over A and B alone (C and D, call 5, ran
    # the launch-bound, Trainer and accelerate baselines at 23.5-37.6 ms, A and B at 19.3-32.2)
    assert all(1.0 < fresh[x] < 1.65 for x in host_bound), fresh


# the profiled recordings of host-bound loops with their process's own un-profiled steps
SAME_PROCESS = [
    ("launch_bound", "baseline", "before"),
    ("launch_bound", "fused_optimizer", "fused_optimizer.after"),
    ("hf_trainer", "baseline", "before"),
    ("peft_lora", "baseline", "before"),
    ("peft_lora", "no_checkpointing", "no_checkpointing.after"),
    ("lightning", "baseline", "before"),
    ("accelerate", "baseline", "before"),
    ("node", "baseline", "before"),  # 55.17 ms in 37.63-65.38 (with_stack: Python frames)
]


@pytest.mark.parametrize(("loop", "cfg", "which"), SAME_PROCESS)
def test_the_unprofiled_step_range_holds_the_measured_one(loop: str, cfg: str, which: str) -> None:
    needs_settled_replays(loop)
    """What the trace cannot tell, as a range: the profiler's cost per recorded event was
    1.06-1.91x the trace's no-work op over 15 recordings of these loops, by process
    (benchmarks/RESULTS.md, session 18), so the un-profiled step lies between the estimate at
    that cost and at twice it. Left out: the whole-step CUDA graph's trace (8.8 ms for 6.7: the
    profiler's cost there is not per host event) and the data-bound timm loop (3 steps)."""
    truth = json.loads((HERE / f"{loop}.truth.json").read_text())["profiled"][cfg]
    own_ns = 1e6 * truth["unprofiled_same_process_step_ms_window_mean"]
    r = analysis(f"{loop}.{which}.pt.trace.json.xz").results.replay
    assert r.unprofiled_step_low_ns <= own_ns <= r.unprofiled_step_ns


def test_step_time_variance_follows_its_cause() -> None:
    """timm with 3 workers: the loader keeps up on some steps only, so the steps vary with the
    DataLoader wait: the variance names that cause and ranks right after dataloader_stall.
    Session 53: graded low, a symptom whose saving the loader's fix counts (a public T4 loop
    had read the loader HIGH, 2.00x, and its variance HIGH, 1.36x, for the same waits)."""
    a = analysis("timm_jpeg.before.pt.trace.json.xz")
    ids = [f.id for f in a.findings]
    var = next(f for f in a.findings if f.id == "step_time_variance")
    assert var.evidence["caused_by"] == "dataloader"
    assert ids.index("step_time_variance") == ids.index("dataloader_stall") + 1
    assert next(f for f in a.findings if f.id == "dataloader_stall").severity == "high"
    assert var.severity == "low"
    assert var.evidence["severity_cap_reason"].startswith("a symptom of dataloader_stall")


def test_what_if_multiplier_only_for_a_larger_batch() -> None:
    path = "peft_lora.before.pt.trace.json.xz"
    with pytest.raises(InputError, match="not a larger batch"):
        chosen(path, ["host_sync@4"])
    with pytest.raises(InputError, match="whole number"):
        chosen(path, ["memory_headroom@x"])
    at2 = chosen(path, ["memory_headroom@2"]).what_if
    gains = {
        g.multiplier: g.throughput_gain
        for g in finding("peft_lora", "memory_headroom").evidence["gain_by_multiplier"]
    }
    assert at2.multiplier == 2 and at2.speedup == pytest.approx(gains[2], rel=0.01)


def test_host_thread_contention_on_a_warm_inductor_cache() -> None:
    """Lightning's loop under torch.compile(mode="reduce-overhead") in a process that found the
    inductor cache warm: every step 222-257 ms, the collate's torch.stack of 32 3x128x128 fp32
    images taking 250 ms of it (truth ``contention``). Against the raw events: the stack's bytes
    are the largest tensor the ops inside it read (its output, 96x128x128 fp32: 6 MiB), its
    rate under 0.25 GB/s.
    The finding is first and HIGH; its prediction (19x at 2 GB/s, 24x at 20) is under the
    measured 34-41x of OMP_NUM_THREADS=1 / TORCHINDUCTOR_COMPILE_THREADS=1: the step after it
    is the rest of the profiled step less the profiler's cost the estimate takes out, and the
    profiled after (OMP_NUM_THREADS=1) shows the same over-estimate: its own un-profiled
    estimate 14.0 ms against 10.2 ms measured in its process (test_unprofiled_step_estimate;
    15.9 ms before its CUDA graph launches were priced at their un-profiled cost)."""
    name = "lightning.compile_ro_warm.after.pt.trace.json.xz"
    ev = [e for e in raw_events(name) if e.get("ph") == "X"]
    stacks = [e for e in ev if e["name"] == "aten::stack" and e["dur"] > 1000]
    for s in stacks:  # a TensorList's shapes are not recorded: the ops inside name the output
        inside = [
            e["args"]["Input Dims"][0]
            for e in ev
            if e["tid"] == s["tid"] and s["ts"] < e["ts"] < s["ts"] + s["dur"] and e["args"]
        ]
        assert max(inside, key=lambda d: math.prod(d) if d else 0) == [96, 128, 128]
        assert 96 * 128 * 128 * 4 / (s["dur"] * 1e3) < 0.25  # bytes per ns
    h = analysis(name).results.host_ops
    (op,) = h.contended
    assert (op.name, op.count, op.bytes_per_call) == ("aten::stack", 3, 96 * 128 * 128 * 4)
    assert op.dur_ns == pytest.approx(1000 * sum(s["dur"] for s in stacks), abs=10)
    f = analysis(name).findings[0]
    assert (f.id, f.severity) == ("host_thread_contention", "high")
    truth = json.loads((HERE / "lightning.truth.json").read_text())["contention"]
    lo = truth["band_fix"]["low"]
    assert 10 < f.what_if.speedup < h.what_if_upper.speedup < (1 - TOLERANCE) * lo
    # the step the fix leaves, as the profiled after's own estimate has it (within 25%)
    fixed = analysis("lightning.compile_ro_warm_omp1.after.pt.trace.json.xz")
    after_est = fixed.results.replay.unprofiled_step_ns
    assert f.what_if.step_time_after_ns == pytest.approx(after_est, rel=TOLERANCE)
    own = truth["runs"]["warm_omp_1_profiled"]["call11.N2"]["step_ms_window_mean"]
    assert after_est / 1e6 > 1.3 * own
    # the fixed cause gone in the profiled after; none on the loop's eager trace
    assert "host_thread_contention" not in [x.id for x in fixed.findings]
    assert fixed.results.host_ops.contended == ()
    assert analysis("lightning.before.pt.trace.json.xz").results.host_ops.contended == ()


@pytest.mark.parametrize(
    ("loop", "fid", "fix", "holds"),
    [
        ("lightning", "launch_bound", "compile", True),  # 1.34-1.78 against 1.40-1.41
        ("accelerate", "launch_bound", "compile_ro", True),  # 1.17-1.69 against 1.52-1.72
        ("hf_trainer", "small_batch", "batch_4x", True),  # 1.34-1.72 against 1.69-1.77
        # below the band at both ends: graphs leave the host work the profiler inflated, so a
        # lower un-profiled step leaves less for them to take (test_compiling_the_trainer)
        ("hf_trainer", "launch_bound", "compile_ro", False),  # 1.24-1.74 against 2.12-2.69
    ],
)
def test_the_speedup_range_the_profilers_cost_leaves(
    loop: str, fid: str, fix: str, holds: bool
) -> None:
    """A replayed fix's ``speedup_low``: the same fix from the un-profiled step's low end (the
    profiler's cost per event twice what the trace shows). Where the point misses because the
    step it starts from keeps profiler cost (Lightning's compile: 1.78 against 1.40-1.41), the
    range holds the measurement."""
    w = finding(loop, fid).what_if
    lo, hi = band(loop, fix)
    low, high = sorted((w.speedup_low, w.speedup))
    assert (low <= hi and high >= lo) is holds, (low, high, lo, hi)


def test_the_held_out_sentence_transformers_loop() -> None:
    """A seventh loop recorded after this session's model changes, not tuned to (calls 14-16):
    sentence-transformers' MultipleNegativesRankingLoss on a MiniLM-sized BERT, a plain loop with
    a tokenizing collate in the main process. What holds is in HOLDS and APPLIED; here the rest.
    The batch: memory_headroom recommends 2x (1.51x against 1.53-1.58x per sample, call 19; the
    power of two under its saturation point, 2.81), and at 4x replays 1.69x against 1.97-2.36x. bf16
    measured a slowdown (0.48-0.63x: the median step 54 ms against 48-53, and 6 of 30 steps at
    172-381 ms, why not known): fp32_compute stays info. The
    ranking misses: launch_bound comes first (1.58x; its fix padded to static shapes measured
    1.16-1.47x) where the batch measured larger (2x: 1.53-1.58x, 4x: 1.97-2.36x):
    memory_headroom's rounding down to 2x puts it second (1.51x), at 4x it would come first."""
    a = analysis("sbert.before.pt.trace.json.xz")
    ids = [f.id for f in a.findings]
    assert ids[:2] == ["launch_bound", "memory_headroom"]
    head = finding("sbert", "memory_headroom")
    assert head.evidence["multiplier"] == 2 and head.severity == "high"
    lo, hi = band("sbert", "batch_4x")
    at4 = chosen("sbert.before.pt.trace.json.xz", ["memory_headroom@4"]).what_if
    assert within(at4.speedup, lo, hi) and at4.speedup > a.findings[0].what_if.speedup
    fp32 = finding("sbert", "fp32_compute")
    assert fp32.severity == "info" and band("sbert", "bf16")[1] < 1.0


def test_shapes_that_change_between_steps() -> None:
    """The sentence-transformers loop pads each batch to its longest text, so its ops' shapes
    change from step to step; torch.compile(mode="reduce-overhead") killed every process that
    ran it (SIGSEGV, call 15) and ran 1.16-1.47x once the batches were padded to 128 tokens
    (call 16). launch_bound names the change (an op's two recorded shapes, read back here from
    the raw events of two different steps) and advises the padding first; the padded loop's
    profiled after and the static loops have none."""
    truth = json.loads((HERE / "sbert.truth.json").read_text())
    assert all("SIGSEGV" in v["error"] for v in truth["configs"]["compile_ro"].values())
    f = finding("sbert", "launch_bound")
    change = f.evidence["shape_change"]
    assert change.steps == 3 and change.ops > 10 and len(set(change.input_dims)) == 2
    assert f.recommendation.startswith("Inputs change shape between steps")
    assert 'padding="max_length"' in f.snippet
    events = raw_events("sbert.before.pt.trace.json.xz")
    steps = [e for e in events if e.get("cat") == "user_annotation"
             and e["name"].startswith("ProfilerStep#")]  # fmt: skip
    seen: dict[str, set[str]] = {}
    for e in events:
        if e.get("cat") != "cpu_op" or e["name"] != change.op:
            continue
        dims = json.dumps((e.get("args") or {}).get("Input Dims"), separators=(", ", ": "))
        for s in steps:
            if s["ts"] <= e["ts"] < s["ts"] + s["dur"]:
                seen.setdefault(dims, set()).add(s["name"])
    assert all(d in seen for d in change.input_dims)
    assert seen[change.input_dims[0]] != seen[change.input_dims[1]]
    for name in (
        "sbert.compile_ro_static.after",
        # (the GNN's batches are graphs of another size each, the detector's targets another
        # number of boxes each, the T5 loop's batches and the Whisper loop's labels padded to
        # their longest each: their shapes change too)
        *(
            f"{lp}.before"
            for lp in MEASURED
            if lp not in ("sbert", "gnn", "detection_fixed", "t5_course", "whisper")
        ),
    ):
        a = analysis(f"{name}.pt.trace.json.xz")
        lb = next((x for x in a.findings if x.id == "launch_bound"), None)
        assert lb is None or lb.evidence["shape_change"] is None, name


def test_new_shapes_cost_setup_in_bf16() -> None:
    """bf16 made the held-out sentence-transformers loop slower (0.46-0.63x). Its profiled after
    (call 17) says why: under autocast the attention runs cuDNN's kernels, and the first call with
    each new sequence length builds an execution plan on the host (78 ms forward, 62 ms backward,
    against 0.16 and 0.10 ms with a known length: read back here from the raw events).
    new_shape_setup names it, LOW: new shapes fade as the run meets its lengths again (300 steps
    in one process, call 18: 9 steps over 150 ms in the first 50, at most 1 in each of the last
    150), so the window's rate is the upper end: the 3-step trace predicts 2.85x for fixed
    shapes where padding to 128 tokens measured 1.43-1.61x over 30 steps (G, H). The fp32 trace,
    whose attention needs no plan, has no such calls."""
    truth = json.loads((HERE / "sbert.truth.json").read_text())
    f = finding("sbert", "new_shape_setup", "bf16.after")
    assert f.severity == "low"
    top = f.evidence["ops"][0]
    assert top.name == "aten::_cudnn_attention_forward" and top.count == 2
    assert f.evidence["steps_with_new_shapes"] == 2
    raw = raw_events("sbert.bf16.after.pt.trace.json.xz")
    calls = sorted(
        (e for e in raw if e.get("cat") == "cpu_op" and e["name"] == top.name),
        key=lambda e: e["ts"],
    )
    seen: set[str] = set()
    new, known = [], []
    for e in calls:
        dims = json.dumps(e["args"].get("Input Dims"))
        (known if dims in seen else new).append(e["dur"])
        seen.add(dims)
    slow = [d for d in new if d > 10_000]  # us
    assert len(slow) == top.count and sum(slow) == pytest.approx(top.dur_ns / 1e3, rel=0.01)
    assert max(known) < 1_000
    cfg = truth["configs"]
    fixed = [cfg["bf16"][p]["step_ms_window_mean"] / cfg["bf16_static"][p]["step_ms_window_mean"]
             for p in "GH"]  # fmt: skip
    assert min(fixed) > 1.4 and max(fixed) < 1.65
    assert f.what_if.speedup > max(fixed)  # the upper end
    fades = [b["steps_over_150_ms"] for b in truth["bf16_long"]["by_50_steps"]]
    assert fades[0] >= 5 and max(fades[3:]) <= 1
    assert all(
        x.id != "new_shape_setup" for x in analysis("sbert.before.pt.trace.json.xz").findings
    )


def test_the_loader_stall_names_its_contended_copies() -> None:
    """On the warm-cache Lightning trace the loader stalls because its collate's copies do not
    get the cores: dataloader_stall says so and advises the contention's fix first, not 27
    workers (more threads for the same cores). The contended time inside the DataLoader's
    ranges, summed here from the raw events (the copies over 1 ms inside ``enumerate(DataLoader)``
    ranges), is what the finding reads; the fixed after (OMP_NUM_THREADS=1) keeps the plain
    loader advice."""
    name = "lightning.compile_ro_warm.after.pt.trace.json.xz"
    f = finding("lightning", "dataloader_stall", "compile_ro_warm.after")
    raw = raw_events(name)
    loaders = [e for e in raw if e.get("cat") == "user_annotation"
               and e["name"].startswith("enumerate(DataLoader)")]  # fmt: skip
    stacks = [e for e in raw if e.get("cat") == "cpu_op" and e["name"] == "aten::stack"
              and e["dur"] > 1_000]  # fmt: skip
    inside_us = sum(
        s["dur"] for s in stacks if any(d["ts"] <= s["ts"] < d["ts"] + d["dur"] for d in loaders)
    )
    assert inside_us > 700_000  # 3 stacks of ~254 ms
    assert f.evidence["contended_in_loader_ns"] == pytest.approx(inside_us * 1e3, rel=0.01)
    assert "did not get the cores (host_thread_contention)" in f.title
    assert f.recommendation.startswith("Most of the loading time is CPU copies")
    fixed = finding("lightning", "dataloader_stall", "compile_ro_warm_omp1.after")
    assert fixed.evidence["contended_in_loader_ns"] == 0
    assert fixed.recommendation.startswith("Load batches in parallel")


def test_the_held_out_vit_amp_loop() -> None:
    """An eighth loop, held out (calls 20 and 21): timm's ViT-S/16 the way its train.py runs it
    without the prefetcher: fp16 autocast with a GradScaler, unscale_ + clip_grad_norm_, foreach
    AdamW, 4 workers without pinned memory, ``loss.item()`` every step. Its predictions are what
    session 19's model said (HOLDS; all fixes 1.70 against 1.46-1.78). Left to say here:

    - the batch graded low: the GPU is busy 27.2 ms of the 38.5 ms un-profiled step
      (saturation 1.41, under 2); replayed at 2x the batch gains 1.24 against 1.05-1.26
      measured. Until session 27 the recommended multiplier was the power of two under the
      saturation, 1, and the lever went unraised; a 2x batch is now recommended where the
      saturation lies between 1x and 2x, graded low at most (past the saturation its gain rests
      on the GPU work scaling no worse than linearly: test_the_next_doubling_of_the_batch).
    - the un-profiled step: 38.5 ms against 34.0-41.6 in the four fresh processes (the
      profiled process's own 8 steps: 33.4)."""
    a = analysis("vit_amp.before.pt.trace.json.xz")
    mem, rp = a.results.memory, a.results.replay
    assert mem.recommended_multiplier == 2 and 1.3 < mem.saturation_multiplier < 1.5
    head = finding("vit_amp", "memory_headroom")
    assert head.severity == "low" and head.what_if.multiplier == 2
    p = rp.predict(transforms.gpu_work_scaled(2.0))
    at2 = WhatIf.larger_batch(p.step_time_ns, p.step_time_after_ns, 2, p.transform)
    assert within(at2.speedup, *band("vit_amp", "batch_2x")), at2.speedup
    assert head.what_if.speedup == pytest.approx(at2.speedup)
    # --what-if prices it as asked: the rule for a trace with memory events, within the fit
    path = "vit_amp.before.pt.trace.json.xz"
    asked = chosen(path, ["memory_headroom@2"])
    assert asked.priced_not_raised == ()
    assert asked.what_if.speedup == pytest.approx(at2.speedup)
    for other in ("small_batch@2", f"memory_headroom@{2 * mem.fit_multiplier}"):
        sel = chosen(path, [other])
        assert sel.not_raised == (other,) and sel.priced_not_raised == ()
    truth = json.loads((HERE / "vit_amp.truth.json").read_text())["configs"]["baseline"]
    fresh = [truth[x]["step_ms_window_mean"] for x in "ABCD"]
    assert min(fresh) <= rp.unprofiled_step_ns / 1e6 <= max(fresh), fresh


def _outer_runtime_ns_inside(events: list[dict], call: dict) -> float:
    """The runtime and driver calls' time (us) on ``call``'s thread inside it, nested ones
    once (a driver call inside a runtime call is part of its time)."""
    a, b = call["ts"], call["ts"] + call["dur"]
    inside = sorted(
        (e for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver")
         and e["tid"] == call["tid"] and a <= e["ts"] < b),
        key=lambda e: e["ts"],
    )  # fmt: skip
    total, reach = 0.0, -math.inf
    for e in inside:
        if e["ts"] + e["dur"] > reach:
            total += e["dur"]
            reach = e["ts"] + e["dur"]
    return total


def test_the_held_out_wav2vec2_loop() -> None:
    """A ninth loop, held out (session 22, call 1): torchaudio's wav2vec2 base with a CTC head,
    fp32, batch 8 utterances of 2-6 s padded to the batch's longest (a new length nearly every
    step), 2 workers resampling 48 kHz clips, blocking input copies, ``loss.item()`` each step.

    cuDNN builds an execution plan per input shape and keeps it for the process; every
    configuration of call 1 drew the same lengths, so only the first fp32 batch-8
    configuration of each process met them new, as a real run does (truth ``shape_cache``).
    That is the loop's largest lever, measured as the same configuration on new against known
    lengths: 1.20-1.50x; and in call 2 (lengths salted per configuration) as padding to 6 s:
    1.22-1.30x. Every convolution layer has its own length, so almost no call of the
    convolutions has a known shape in the window: new_shape_setup sets their time outside
    runtime calls against the window's median known-shape call and names them (LOW, capped:
    shapes fade as a run meets them again), 1.55x, the upper end. launch_bound's advice, padding
    then torch.compile reduce-overhead, measured 0.23-0.27x (call 2): LayerDrop skips layers at
    random, so the steps run different ops (path_change: 11 or 12 attention backward calls a
    step, raw events below) and the graph breaks and re-records; it is graded low and says so.
    With the path fixed too (LayerDrop off, padded, session 23: processes F, H), reduce-overhead
    measured 1.04-1.08x: the fixed-shape step runs at 54-58 ms un-profiled with the GPU busy
    most of it, so low is the grade on either path (the 1.5x the finding prices starts from the
    un-profiled estimate, 93.8 ms here: benchmarks/RESULTS.md, the misses). The fixes measured on lengths known on both sides (process B):
    remove_syncs 1.07, pin_memory 1.07, workers 1.02; none is raised above low, nor
    fp32_compute (bf16 measured 0.23-0.30x: cuDNN attention's per-shape plans, as on the
    sentence-transformers loop)."""
    truth = json.loads((HERE / "wav2vec2.truth.json").read_text())
    cfg, prof = truth["configs"], truth["profiled"]

    def ms(c: str, p: str) -> float:
        if p == "P":
            return prof[c]["unprofiled_same_process_step_ms_window_mean"]
        return cfg[c][p]["step_ms_window_mean"]

    fixed = [ms("baseline", p) / ms("baseline", "B") for p in "AP"] + [
        ms("fused_adam", "B") / ms("fused_adam", p) for p in "AP"
    ]
    lo, hi = min(fixed), max(fixed)
    assert lo > 1.15 and hi < 1.55, fixed
    a = analysis("wav2vec2.before.pt.trace.json.xz")
    f = finding("wav2vec2", "new_shape_setup")
    # every step of the window met new shapes (3 of 3): medium at most, the fix measured >= 1.15x
    assert (
        f.severity == "medium" and f.evidence["steps_with_new_shapes"] == f.evidence["steps"] == 3
    )
    assert within(f.what_if.speedup, lo, hi) and f.what_if.speedup > hi  # the upper end
    # call 2, lengths new in every configuration: padding to one length measured directly
    assert within(f.what_if.speedup, *band("wav2vec2", "fixed_len"))
    # launch_bound's advised change, padding then reduce-overhead, measured 0.23-0.27x: the
    # steps run different paths (LayerDrop), which no single CUDA graph replays
    lb = finding("wav2vec2", "launch_bound")
    path = lb.evidence["path_change"]
    assert band("wav2vec2", "compile_ro_fixed")[1] < 1.0
    assert band("wav2vec2", "compile_ro_nodrop")[1] < 1.10  # the path fixed first
    assert (
        lb.severity == "low" and lb.evidence["severity_cap"] == "low" and lb.what_if.speedup > 1.5
    )
    assert path.op == "aten::_efficient_attention_backward" and path.calls == (11, 12)
    assert lb.recommendation.startswith("The steps run different ops")
    # the GPU's idle during the per-shape setup is new_shape_setup's (gpu_underutilized, medium
    # before session 34, counts it as explained)
    assert [x.id for x in a.findings if x.severity in ("high", "medium")] == ["new_shape_setup"]
    ops = {o.name: o for o in f.evidence["ops"]}
    conv = ops["aten::cudnn_convolution"]
    assert conv.reference == "window" and conv.count >= 20 and conv.shapes == conv.count
    # read back from the raw events: the flagged calls' time outside their runtime calls
    events = raw_events("wav2vec2.before.pt.trace.json.xz")
    own = [
        c["dur"] - _outer_runtime_ns_inside(events, c)
        for c in events
        if c.get("cat") == "cpu_op" and c["name"] == conv.name
    ]
    slow = [x for x in own if x * 1e3 >= 10 * conv.repeat_median_ns and x >= 1_000]
    assert len(slow) == conv.count
    assert sum(slow) * 1e3 - conv.count * conv.repeat_median_ns == pytest.approx(
        conv.excess_ns, rel=0.01
    )
    steps = [e for e in events if e.get("cat") == "user_annotation"
             and e["name"].startswith("ProfilerStep#")]  # fmt: skip
    per_step = sorted(
        sum(1 for e in events if e.get("cat") == "cpu_op" and e["name"] == path.op
            and st["ts"] <= e["ts"] < st["ts"] + st["dur"])
        for st in steps
    )  # fmt: skip
    assert (per_step[0], per_step[-1]) == path.calls
    # fixes measured below 1.10x on known lengths both sides: nothing above low
    for fid, fix in (("host_sync", "remove_syncs"), ("pageable_memcpy", "pin_memory"),
                     ("dataloader_stall", "workers")):  # fmt: skip
        assert ms("baseline", "B") / ms(fix, "B") < 1.10
        got = next((x for x in a.findings if x.id == fid), None)
        assert got is None or SEVERITIES.index(got.severity) >= SEVERITIES.index("low"), fid
    fp32 = finding("wav2vec2", "fp32_compute")
    assert fp32.severity in ("low", "info") and band("wav2vec2", "bf16")[1] < 1.0


# compiled (default mode) after traces recorded with record_shapes, and their truths' entries
COMPILED_AFTERS = [
    ("vit_amp", "compile", "compile"),  # call 20
    ("lightning", "compile", "compile_call22"),
    ("peft_lora", "compile", "compile"),
    ("nanogpt", "compile", "compile"),  # session 31, with stacks and memory too
]


@pytest.mark.parametrize(("loop", "which", "cfg"), COMPILED_AFTERS)
def test_compiled_code_profiled_with_shapes(loop: str, which: str, cfg: str) -> None:
    """torch.compile'd code profiled with record_shapes=True: inductor records every Triton
    launch with its arguments' shapes, and much of that cost falls outside the recorded events.
    The part the trace shows, the Python inductor runs before each launch's op outside any op,
    is capped at an eager launch's (causal/transforms.py _compiled_launches_capped: the
    same process's un-profiled step over the estimate from 0.56-0.82 to 0.70-0.97 on these
    four); the rest
    is a range (0.95-1.15 on the eager loops but the HF stacks'). Where the eager low end
    (PROFILER_COST_HIGH_FACTOR times the per-event cost) does not reach it, the range's low end is the lowest ratio measured
    (analyzers/replay.py COMPILED_UNPROFILED_RATIO), the per-event cost found that puts the
    replayed step on it, and every fix's speedup_low from it."""
    truth = json.loads((HERE / f"{loop}.truth.json").read_text())["profiled"][cfg]
    own_ms = truth["unprofiled_same_process_step_ms_window_mean"]
    r = analysis(f"{loop}.{which}.after.pt.trace.json.xz").results.replay
    lo, hi = r.compiled_unprofiled_ratio
    assert r.compiled_launches_per_step > 50
    assert lo <= own_ms / (r.unprofiled_step_ns / 1e6) <= hi, (own_ms, r.unprofiled_step_ns)
    twice = analysis(f"{loop}.{which}.after.pt.trace.json.xz").results.replay.model_low
    assert r.profiler_cost_low_factor >= PROFILER_COST_HIGH_FACTOR and twice is not None
    assert r.unprofiled_step_low_ns <= 1e6 * own_ms <= r.unprofiled_step_ns
    assert r.unprofiled_step_low_ns <= lo * r.unprofiled_step_ns
    if r.profiler_cost_low_factor > PROFILER_COST_HIGH_FACTOR:
        # the search went past the eager low end: the smallest per-event cost found (to 1/16 of a doubling) whose step is at most that
        assert 0.9 * lo * r.unprofiled_step_ns <= r.unprofiled_step_low_ns
    # eager, and graph replays (reduce-overhead: no Triton launch is recorded): no such note
    for name in (
        f"{loop}.before",
        "sbert.compile_ro_static.after",
        "launch_bound.compile_ro.after",
    ):
        other = analysis(f"{name}.pt.trace.json.xz").results.replay
        assert other.compiled_launches_per_step == 0 and other.compiled_unprofiled_ratio is None


def test_launch_advice_on_compiled_code_is_the_graphs() -> None:
    """Session 54: a default-mode compiled training step (65% of its kernels Triton) read
    launch_bound with the eager advice, "torch.compile ..., use fused kernels". On a compiled
    step the launches left are the compiled code's: the advice is the graphs (reduce-overhead,
    or the step by hand), with the share of Triton kernels; the eager steps keep theirs."""
    for loop, which, _ in COMPILED_AFTERS:
        a = analysis(f"{loop}.{which}.after.pt.trace.json.xz")
        ratio = a.results.kernels.compiled_kernel_ratio
        f = next((f for f in a.findings if f.id == "launch_bound"), None)
        if f is None:
            continue
        assert ratio >= 0.2 and f.recommendation.startswith("The step is already compiled (")
        assert f"({100 * ratio:.1f}% of its kernels are torch.compile's" in f.recommendation
        assert 'mode="reduce-overhead")  # was the default mode' in f.snippet
        before = finding(loop, "launch_bound")
        assert before.recommendation.startswith("Cut per-kernel CPU cost: torch.compile")


@pytest.mark.parametrize(("loop", "which", "cfg"), COMPILED_AFTERS)
def test_compiled_code_graded_on_the_range(loop: str, which: str, cfg: str) -> None:
    """Where every measured step lay below the estimate (compiled code recorded with shapes),
    the point is an upper end: a priced finding's severity is the smaller saving of the range's
    two ends (speedup and speedup_low), and a finding graded on attributed time keeps only the
    share the profiler's unseen cost cannot hold (1 - low end / profiled step). Recomputed here
    from the JSON's numbers with the documented grading (0.25 / 0.10 / 0.03)."""

    def grade(share: float) -> str:
        return next(
            s
            for s, lo in (("high", 0.25), ("medium", 0.10), ("low", 0.03), ("info", -math.inf))
            if share >= lo
        )

    doc = analysis(f"{loop}.{which}.after.pt.trace.json.xz").to_json()
    rp = doc["details"]["replay"]
    hidden = 1 - rp["unprofiled_step_low_ns"] / rp["trace_step_median_ns"]
    for f in doc["findings"]:
        w = f["what_if"]
        if w is not None and w.get("speedup_low"):
            share = min(f["cost_ratio"], 1 - 1 / w["speedup_low"])
            cap = f["evidence"].get("severity_cap")  # a reason the rule gives lowers it further
            want = max(grade(share), cap, key=SEVERITIES.index) if cap else grade(share)
            assert f["severity"] == want, (f["id"], share, cap)
        elif w is None:
            assert SEVERITIES.index(f["severity"]) >= SEVERITIES.index(
                grade(max(0, f["cost_ratio"] - hidden))
            )
    by_id = {f["id"]: f for f in doc["findings"]}
    if loop == "vit_amp":
        # launch_bound 1.42x from the estimate (37.61 ms), 1.09x from the low end (25.92 ms),
        # where the same process's own un-profiled step lay (26.45 ms): low, not high
        assert by_id["launch_bound"]["severity"] == "low"
        assert by_id["launch_bound"]["evidence"]["graded_on_range"] is True
        # 1.16x at the low end, but the GPU's work fills the step short of the 2x batch (1.96x)
        mh = by_id["memory_headroom"]
        assert mh["severity"] == "low"
        assert "x batch, short of 2x" in mh["evidence"]["severity_cap_reason"]
        assert SEVERITIES.index(by_id["gpu_underutilized"]["severity"]) >= SEVERITIES.index("low")
    # an eager trace's point is the middle of its range: graded on it, as before
    eager = analysis(f"{loop}.before.pt.trace.json.xz").to_json()
    assert not any(f["evidence"].get("graded_on_range") for f in eager["findings"])


def test_the_compiled_vits_launch_bound_measured() -> None:
    """Whether the compiled ViT's launch_bound is a lever (the loop compiled with
    mode="reduce-overhead" against the default mode, each in the same process): process E
    (session 22) 44.09 against 30.12 ms, 1.46x; process G (session 23) 39.75 against 29.59,
    1.34x. The finding on the compiled after prices 1.42x at the point and 1.09x at the range's
    low end: the point 0.97-1.06 of the measurements (1.60x, 0.84-0.91, before inductor's
    launch Python was capped). The point's un-profiled estimate (37.61 ms; 43.45 before) lies
    among the four fresh processes' compiled steps (A, B, E, G: 31.70-44.09 ms), not at the
    low end (25.92), where session 20's profiled process ran (26.45). Graded on the low end
    the finding is low, which understates it in processes like E and G: the range holds all
    three, the grade the one whose step was the fastest."""
    cfg = json.loads((HERE / "vit_amp.truth.json").read_text())["configs"]
    f = finding("vit_amp", "launch_bound", "compile.after")
    w = f.what_if
    rp = analysis("vit_amp.compile.after.pt.trace.json.xz").results.replay
    for p, lo, hi in (("E", 1.4, 1.5), ("G", 1.3, 1.4)):
        own = cfg["compile"][p]["step_ms_window_mean"]
        measured = own / cfg["compile_ro"][p]["step_ms_window_mean"]
        assert lo < measured < hi
        assert w.speedup_low <= measured and within(w.speedup, measured, measured)
        assert 0.9 < w.speedup / measured < 1.1
    fresh = [v["step_ms_window_mean"] for v in cfg["compile"].values()]
    assert min(fresh) < rp.unprofiled_step_ns / 1e6 < max(fresh)
    assert rp.unprofiled_step_low_ns / 1e6 < min(fresh)
    assert f.severity == "low" and f.evidence["graded_on_range"]


def test_record_shapes_costs_compiled_code_more() -> None:
    """The mechanism, measured by part in one process each (call 22, round X): on the compiled
    ViT record_shapes added 16.9 ms a step to the CPU+CUDA profiler's 13.2 (40.2 un-profiled);
    on its eager loop 4.8 to 33.7. Against the raw events of the compiled after: a Triton
    launch is recorded at 13 us (its cuLaunchKernel 5 us inside), while the no-work ops the
    per-event cost is read from are mostly the compiled graph's ``as_strided`` calls at 0.4 us."""
    cost = json.loads((HERE / "vit_amp.truth.json").read_text())["profiler_cost_compiled"]
    extra = {
        cfg: cost[cfg]["median_step_ms_host"]["cpu_cuda_shapes"]
        - cost[cfg]["median_step_ms_host"]["cpu_cuda"]
        for cfg in ("baseline", "compile")
    }
    assert extra["compile"] > 3 * extra["baseline"] > 0, extra
    ops = [
        e for e in raw_events("vit_amp.compile.after.pt.trace.json.xz") if e.get("cat") == "cpu_op"
    ]

    def median_us(pred) -> float:
        d = sorted(e["dur"] for e in ops if pred(e["name"]))
        return d[len(d) // 2]

    assert median_us(lambda n: n.startswith("triton_")) > 10
    assert median_us(lambda n: n == "aten::as_strided") < 0.5
    # the summary says it with the estimate
    basis = prediction_basis(analysis("vit_amp.compile.after.pt.trace.json.xz").to_json())
    assert "record_shapes=True, 366 Triton launches a step" in basis
    assert "0.69-0.97x the estimate" in basis and "upper ends" in basis
    assert "record_shapes" not in prediction_basis(
        analysis("vit_amp.before.pt.trace.json.xz").to_json()
    )


def test_the_next_doubling_of_the_batch() -> None:
    """Why the recommended multiplier is the largest power of two under the saturation point
    (the GPU's busy time still inside today's step) and not the next one, where the GPU fills
    the step: measured in call 21 (processes K and L), the next doubling replayed from the
    un-profiled estimate overshoots where that estimate keeps profiler cost (accelerate's 2x:
    1.71 against 1.16-1.29; Lightning's 8x: 2.90 against 2.08-2.27); from the range's low end
    (the profiler's cost twice what the trace shows) both hold. On the LoRA loop, whose estimate
    is its process's own step, 8x and 16x replay under the measured (6.97 and 8.63 against
    8.56-9.50 and 11.17-11.33, superlinear: the batch of 2 leaves the GEMMs inefficient) and
    within 25%. Choosing the next doubling where it adds 10% (sbert's 4x: 1.69, measured 1.97-
    2.36) would have put the batch first on the Trainer and accelerate, whose largest measured
    levers are their compiles."""

    def at(loop: str, k: int) -> tuple[float, float]:
        rp = analysis(f"{loop}.before.pt.trace.json.xz").results.replay
        p = rp.predict(transforms.gpu_work_scaled(float(k)))
        w = WhatIf.larger_batch(p.step_time_ns, p.step_time_after_ns, k, p.transform)
        return w.speedup, rp.speedup_low(w)

    for loop, k, fix in (("accelerate", 2, "batch_2x"), ("lightning", 8, "batch_8x")):
        point, low = at(loop, k)
        lo, hi = band(loop, fix)
        assert point > (1 + TOLERANCE) * hi and within(low, lo, hi), (loop, point, low, lo, hi)
        rec = analysis(f"{loop}.before.pt.trace.json.xz").results.memory
        assert (rec.recommended_multiplier or 1) < k or rec.saturation_multiplier is None
    for k in (8, 16):
        point, _ = at("peft_lora", k)
        lo, hi = band("peft_lora", f"batch_{k}x")
        assert within(point, lo, hi) and point < lo, (k, point, lo, hi)


@pytest.mark.parametrize(
    "ids", ["small_batch@99999999999999", "memory_headroom@65", "small_batch@1"]
)
def test_a_batch_multiplier_out_of_range_is_refused(ids: str) -> None:
    """A multiplier past the largest predicted (64) overflowed the replay's int64 durations
    (an internal error) or priced a step of 0 ms; the one line names it, raised or not, and
    before any parsing (a file that does not exist is not reached)."""
    for loop in ("launch_bound", "accelerate", "vit_amp"):  # raised, not raised; memory events
        rule = "memory_headroom" if loop == "vit_amp" else "small_batch"
        ask = ids.replace("small_batch", rule).replace("memory_headroom", rule)
        with pytest.raises(InputError, match=r"multiplier must be 2 to 64"):
            traceinsight.analyze(HERE / "no_such.pt.trace.json.xz", what_if=[ask])
    with pytest.raises(InputError, match=r"multiplier must be a whole number"):
        traceinsight.analyze(HERE / "no_such.pt.trace.json.xz", what_if=["small_batch@x2"])


def test_wav2vec2_bf16_at_one_shape_as_a_chosen_set() -> None:
    """bf16 at one input shape (session 23, processes F, H): 1.48-1.55x over the baseline,
    where bf16 alone (new shapes every step: cuDNN's bf16 plans per shape) measured 0.23-0.30x.
    The chosen set of the two findings whose fixes it applies, new_shape_setup (padding) and
    fp32_compute (bf16), replays to 1.63x: within the tolerance of the measured pair. The split
    between them is not the measured one: the model gives the shapes most of it (1.55x alone,
    its upper end; measured 1.06-1.30) and bf16 on top 1.05x where it measured 1.39-1.42x, since
    its un-profiled host after padding (about 60 ms) stays above the GPU's 52 ms a step (fp32
    GEMMs 38.5 of it, summed from the raw kernels below), where the measured padded step ran
    at 53.5-54.3 ms and bf16's at 38.2 (benchmarks/RESULTS.md, session 23)."""
    path = HERE / "wav2vec2.before.pt.trace.json.xz"
    sel = chosen(path.name, ["new_shape_setup", "fp32_compute"]).what_if
    lo, hi = band("wav2vec2", "bf16_fixed")
    assert lo > 1.45 and within(sel.speedup, lo, hi), (sel.speedup, lo, hi)
    assert band("wav2vec2", "bf16")[1] < 0.35  # bf16 alone, at new shapes
    raw = raw_events(path.name)
    kernel_ms = sum(e["dur"] for e in raw if e.get("cat") == "kernel") / 1e3 / 3
    gemm_ms = sum(e["dur"] for e in raw if e.get("cat") == "kernel" and "gemm_f32f32" in e["name"])
    assert 50 < kernel_ms < 54 and sel.step_time_after_ns / 1e6 > kernel_ms
    assert gemm_ms / 1e3 / 3 > 15  # the sm80 fp32 GEMMs alone


def test_fp32_advice_puts_fixed_shapes_first_where_shapes_vary() -> None:
    """bf16 alone measured 0.23-0.30x on the wav2vec2 loop (cuDNN's bf16 plans for each new
    shape) and 1.48-1.55x with the inputs padded: where per-shape setup runs in several steps
    (new_shape_setup), fp32_compute's advice says to fix the shapes first and names the op;
    on a loop whose shapes repeat (the fp32 Lightning loop) the advice is the plain one."""
    f = finding("wav2vec2", "fp32_compute")
    top = analysis("wav2vec2.before.pt.trace.json.xz").results.host_ops.new_shape[0]
    assert f.recommendation.startswith("The inputs change shape from step to step")
    assert top.name in f.recommendation and "--what-if new_shape_setup,fp32_compute" in (
        f.recommendation
    )
    assert band("wav2vec2", "bf16")[1] < 1.0 < band("wav2vec2", "bf16_fixed")[0]
    lightning = finding("lightning", "fp32_compute")
    assert lightning.recommendation.startswith("Train in bf16")


def _loader_next(name: str) -> list[tuple[float, int, int, int]]:
    """Each ``DataLoader.__next__`` range of a fixture, from the raw events: (ms, the ops
    recorded inside it on its thread, its aten::set_ calls: a tensor rebuilt from a worker's
    shared memory, its aten::item calls)."""
    xs = [e for e in raw_events(name) if e.get("ph") == "X"]
    out = []
    for n in (e for e in xs if "enumerate(DataLoader)" in e["name"]):
        a, b = n["ts"], n["ts"] + n["dur"]
        kids = [e for e in xs if e.get("tid") == n["tid"] and a <= e["ts"] < b and e is not n]
        count = [sum(e["name"] == x for e in kids) for x in ("aten::set_", "aten::item")]
        out.append((n["dur"] / 1e3, len(kids), *count))
    return out


def test_the_held_out_gnn_loop() -> None:
    """A tenth loop, held out (session 24, one call): PyTorch Geometric's GIN example (5 GINConv
    layers, global_add_pool, Adam, batches of 128 graphs of about 18 nodes, a new node count each
    batch, collated in the step thread, float(loss) each step). Measured un-profiled in two
    processes: 4 workers 1.49-1.61x, the 4x batch 2.00-2.30x per sample, all four 3.91-4.11x,
    pinned copies 0.86-0.90x, no syncs 0.75-1.02x, torch.compile(dynamic=True) 0.94-1.05x.

    What holds: the un-profiled step (26.30 ms against 24.91 in the profiled process: 1.06);
    no finding above low for the fixes that measured under 1.10 (host_sync, pageable_memcpy
    info); the input-shape change named. The workers measured were 4 without pin_memory, where
    the step thread receives each batch itself: 3.6-4.6 ms a ``__next__`` in the workers'
    trace, 11 tensors rebuilt on the workers' shared memory (11 aten::set_). The model counts
    the 11 from the before's collate (7 torch.tensor, 4 cat) and prices that variant
    (dataloader_stall@unpinned) at 0.5 ms + 0.27 ms a tensor (benchmarks/loader_receive_cost.py):
    1.78x against 1.49-1.61x; the headline is the advised loader, whose pin-memory thread
    receives the batches (test_the_gnn_loop_past_its_first_epoch: 0.05 ms a ``__next__``).
    The batch's band is not the steady loop's: this recording's window fell in the dataset's
    first epoch, where PyG's InMemoryDataset cuts each graph out of its store (771 aten::item a
    batch of 128 in the before, 3 in the 4x batch's after, whose steps ran cached): the 4x
    measured 1.45x per sample past the first epochs (test_the_gnn_loop_past_its_first_epoch)."""
    a = analysis("gnn.before.pt.trace.json.xz")
    truth = json.loads((HERE / "gnn.truth.json").read_text())
    own = truth["profiled"]["baseline"]["unprofiled_same_process_step_ms_window_mean"]
    est = a.results.replay.unprofiled_step_ns / 1e6
    assert 0.95 < est / own < 1.10, (est, own)
    lo, hi = band("gnn", "workers")
    f = a.findings[0]
    assert f.id == "dataloader_stall" and f.severity == "high"
    plan = f.evidence["loader_plan"]
    assert plan.iterator == "single_process" and plan.batch_tensors == 11
    unpinned = f.evidence["what_if_unpinned"]
    assert within(unpinned.speedup, lo, hi), (unpinned.speedup, lo, hi)
    assert f.what_if.speedup > unpinned.speedup  # the advised loader receives off the step thread
    after_ms = [truth["configs"]["workers"][p]["step_ms_window_mean"] for p in "AB"]
    assert 0.9 * min(after_ms) < unpinned.step_time_after_ns / 1e6 < 1.15 * max(after_ms)
    # the receiving, read back from the raw events: the workers' after against the before
    before, workers = (
        _loader_next("gnn.before.pt.trace.json.xz"),
        _loader_next("gnn.workers.after.pt.trace.json.xz"),
    )
    assert all(ops > 5000 for _, ops, _, _ in before)  # the collate, in the step thread
    assert all(3.0 < ms < 5.0 and ops < 30 and sets == 11 for ms, ops, sets, _ in workers), workers
    # the dataset's cache: each graph cut out of the store in the before's window, not in the 4x's
    big = _loader_next("gnn.batch_4x.after.pt.trace.json.xz")
    assert all(items > 5 * 128 for *_, items in before) and all(items < 10 for *_, items in big)
    assert "memory_headroom" not in {x.id for x in a.findings}
    at4 = chosen("gnn.before.pt.trace.json.xz", ["memory_headroom@4"]).what_if
    assert at4.speedup < 0.8 * band("gnn", "batch_4x")[0]  # against the cold-cache band
    lb = finding("gnn", "launch_bound")
    assert lb.evidence["shape_change"] is not None


def test_the_gnn_loop_past_its_first_epoch() -> None:
    """The GIN loop again, unchanged, recorded past its dataset's first epochs (session 25, two
    calls, fixtures/h200/thirdparty/gnn_steady: 80 warm-up steps, so every graph comes from
    InMemoryDataset's cache). In call 1 (one machine): baseline 17.70-17.83 ms a step, 4 workers
    without pin_memory 11.66-13.48 (1.31-1.53x), the 4x batch 48.88-49.28 ms a step (1.45x per
    sample). Call 2 (another machine, baseline 11.3-12.8 ms) profiled the workers with
    pin_memory=True: the step thread takes each batch in 0.05 ms, no op, where without it the
    step thread rebuilds every tensor (11 aten::set_, 3.6-5.3 ms a batch): so the advised
    loader's floor, and the unpinned variant priced apart.

    The 4x batch's step is predicted within 5% (46.86 ms against 48.88-49.28); its per-sample
    speedup (1.85x against 1.45x) misses by the un-profiled step the prediction starts from:
    21.70 ms against 17.70-17.83 measured, inside the range the trace leaves (15.74-21.70: the
    profiler's cost per op here is between the no-work op's and twice it; issue 37 item 2)."""
    name = "gnn_steady/gnn.steady.before.pt.trace.json.xz"
    truth = json.loads((HERE / "gnn_steady" / "gnn_steady.truth.json").read_text())
    call1 = truth["calls"]["call1"]
    measured = {c: [call1[p][c]["step_ms_window_mean"] for p in "AB"] for c in call1["A"]}
    # the dataset's cache: no graph cut out of the store in the window
    assert all(items < 10 and ops < 2000 for _, ops, _, items in _loader_next(name))
    a = analysis(name)
    rp = a.results.replay
    est, low = rp.unprofiled_step_ns / 1e6, rp.unprofiled_step_low_ns / 1e6
    assert low < min(measured["baseline"]) and max(measured["baseline"]) < est
    f = next(x for x in a.findings if x.id == "dataloader_stall")
    assert f.evidence["loader_plan"].batch_tensors == 11
    workers = [b / w for b, w in zip(measured["baseline"], measured["workers"], strict=True)]
    assert within(f.evidence["what_if_unpinned"].speedup, min(workers), max(workers)), workers
    at4 = chosen(name, ["memory_headroom@4"]).what_if
    big = 4 * at4.step_time_after_ns / 1e6  # the 4x batch's step
    assert 0.9 * min(measured["batch_4x"]) < big < 1.1 * max(measured["batch_4x"]), big
    # with pin_memory the pin-memory thread receives: nothing left in the step thread
    pinned = _loader_next("gnn_steady/gnn.steady.workers_pinned.after.pt.trace.json.xz")
    assert len(pinned) == 3 and all(ms < 0.2 and sets == 0 for ms, _, sets, _ in pinned), pinned


PINNED = HERE / "pinned"


def _pinned_call(loop: str) -> dict[str, list[float]]:
    """fixtures/h200/thirdparty/pinned: one device call (session 25), per loop processes A and B
    (baseline, workers, workers + pin_memory, B in reverse) and P (the profiled baseline):
    each configuration's window-mean step ms in A and B."""
    runs = [json.loads((PINNED / f"{loop}.{p}.json").read_text())["configs"] for p in "AB"]
    return {c: [r[c]["step_ms_window_mean"] for r in runs] for c in ("baseline", "workers", "all")}


@pytest.mark.parametrize(
    "loop, headline_holds",
    [("gnn", False), ("sbert", True), ("timm_jpeg", True)],
)
def test_the_advised_loader_measured_with_its_profiled_before(
    loop: str, headline_holds: bool
) -> None:
    """The advised loader (workers with pin_memory=True, non-blocking copies) and workers alone,
    measured in the same call as the profiled before they are predicted from (a third machine;
    speedups move with the host, so a band is only compared with a trace of its own call).

    The step after each fix is predicted within 25% on all three (gnn 7.72 ms against 7.90-9.67
    pinned, 11.17 against 9.45-11.51 unpinned; sbert 28.7 against 23.3-26.6 and 30.3 against
    25.6-35.9; timm 38.0 against 34.3-34.4 and 43.3 against 45.0-46.9), and so is workers alone
    (@unpinned: 1.90 against 1.63-1.64, 1.26 against 1.01-1.38, 1.30 against 1.47-1.75). The
    headline holds on sbert (1.33 against 1.37-1.51); on gnn (2.75 against 1.94-1.96) it misses
    by the step it starts from, not the step after: gnn's un-profiled estimate 21.24 ms against
    15.47-18.71 (the profiler's cost per op on this host-heavy loop, issue 37 item 2). On timm
    (1.77 against 2.01-2.29) it holds since the estimate starts from the workers' interval as
    recorded, 63.2 ms (53.9 while the profiler's cost was taken out of every step, not moved
    into the wait for the next batch), against 69.2-78.8 in A and B and 59.1 in P's own two
    whole periods (its 8 un-profiled steps, 55.7 ms a step, hold 2.7 periods of three)."""
    m = _pinned_call(loop)
    a = analysis(f"pinned/{loop}.before.pt.trace.json.xz")
    f = next(x for x in a.findings if x.id == "dataloader_stall")
    own_p = json.loads((PINNED / f"{loop}.P.json").read_text())["configs"]["baseline"]
    for w, fix in ((f.what_if, "all"), (f.evidence["what_if_unpinned"], "workers")):
        after = w.step_time_after_ns / 1e6
        assert 0.75 * min(m[fix]) <= after <= 1.25 * max(m[fix]), (fix, after, m[fix])
    speedup = {
        c: [b / x for b, x in zip(m["baseline"], m[c], strict=True)] for c in ("workers", "all")
    }
    unpinned = f.evidence["what_if_unpinned"].speedup
    assert within(unpinned, min(speedup["workers"]), max(speedup["workers"])), unpinned
    holds = within(f.what_if.speedup, min(speedup["all"]), max(speedup["all"]))
    assert holds == headline_holds
    assert f.what_if.speedup > unpinned  # pinning takes the receiving off the step thread
    est = a.results.replay.unprofiled_step_ns / 1e6
    if loop == "timm_jpeg":  # the estimate holds against its own process's whole periods
        periods = own_p["step_ms_host"][1:7]  # two of three steps each, a long wait ending each
        assert [ms > 80 for ms in periods] == [False, False, True] * 2, periods
        assert est == pytest.approx(sum(periods) / len(periods), rel=0.10)


def test_workers_that_bound_the_step_take_the_other_fixes_savings() -> None:
    """timm with 3 workers, recorded again with bf16 + channels_last and no per-step syncs
    measured in the same call (session 25, fixtures/h200/thirdparty/loader_bound): 0.71-1.05x
    and 0.88-0.98x per sample. The workers deliver a batch every step-as-run whatever the rest
    takes, so the replay's 1.24x for bf16 (fp32_compute, MEDIUM before) and its syncs' saving
    move into the wait for the next batch: each such fix is priced at the loader's interval
    (1.00x, graded info, ``evidence.loader_bound_ns``), and all fixes, the loader's among them,
    keep every saving (the original recording: 3.34x against 2.72-3.68x)."""
    d = HERE / "loader_bound"
    runs = [json.loads((d / f"timm_jpeg.{p}.json").read_text())["configs"] for p in "AB"]
    band_of = {
        c: [r["baseline"]["per_sample_ms"] / r[c]["per_sample_ms"] for r in runs]
        for c in ("bf16_channels_last", "remove_syncs")
    }
    assert max(max(b) for b in band_of.values()) < 1.10
    a = analysis("loader_bound/timm_jpeg.before.pt.trace.json.xz")
    by_id = {f.id: f for f in a.findings}
    stall = by_id["dataloader_stall"]
    assert a.findings[0] is stall and stall.evidence["loader_plan"].iterator == "multi_process"
    for fid, fix in (("fp32_compute", "bf16_channels_last"), ("host_sync", "remove_syncs")):
        f = by_id[fid]
        assert f.severity in ("low", "info"), (fid, f.severity)
        assert f.evidence["loader_bound_ns"] == stall.what_if.step_time_ns
        assert within(f.what_if.speedup, min(band_of[fix]), max(band_of[fix])), f.what_if.speedup
    # nor do their other priced fixes save (launch_bound's whole-step graph on the first
    # recording read 1.07x beside its bounded 1.00x)
    for rec in (a, analysis("timm_jpeg.before.pt.trace.json.xz")):
        bounded = [f for f in rec.findings if "loader_bound_ns" in f.evidence]
        others = [
            v for f in bounded for k, v in f.evidence.items() if k.startswith("what_if_") and v
        ]
        assert bounded and all(w.speedup == 1.0 for w in others), others
        assert any(f.id == "launch_bound" and f.evidence["what_if_whole_step"] for f in bounded)
    # the variance the waits cause is the loader's own: not bounded, right after its cause
    ids = list(by_id)
    assert ids.index("step_time_variance") == ids.index("dataloader_stall") + 1
    # with the loader's fix, the others save again
    assert a.what_if.speedup > stall.what_if.speedup * 1.2


def test_receiving_is_not_waiting() -> None:
    """Where workers load and the step thread's loader time is receiving their batches (the ViT
    fed by 4 workers: 1.4 ms a step for 2 tensors, the model's 1.04; the PyG loop's workers
    after: 3.6-4.6 ms for 11 tensors), the title says so and names pin_memory, not more workers
    (the ViT's pin_memory measured 1.07-1.26x, its prediction 1.13); nor do those workers
    bound the step. Where they wait (timm, 3 workers), the title says how many more would keep
    up and that the other fixes save nothing until then."""
    for name in ("vit_amp.before.pt.trace.json.xz", "gnn.workers.after.pt.trace.json.xz"):
        f = next(x for x in analysis(name).findings if x.id == "dataloader_stall")
        assert "mostly receiving each batch" in f.title and "pin_memory=True" in f.title, f.title
        # the step thread held, not the GPU starved (audit 17)
        assert f.title.startswith(
            "The input pipeline holds the step thread, receiving batches: the GPU idles "
        ), f.title
        assert "current workers" not in f.title
        assert all("loader_bound_ns" not in x.evidence for x in analysis(name).findings)
    lo, hi = band("vit_amp", "pin_memory")
    assert within(finding("vit_amp", "dataloader_stall").what_if.speedup, lo, hi)
    timm = finding("timm_jpeg", "dataloader_stall")
    assert "current workers would keep up" in timm.title and "save nothing" in timm.title


def test_the_held_out_neural_ode_loop() -> None:
    """torchdiffeq's demo (examples/ode_demo.py: dopri5 over 10 points, batches of 20, RMSprop,
    loss.item() each step), held out (session 26, one call: A, B, P). Its adaptive solver reads
    the GPU at every step it takes (rk_common.py: ``while next_t > t1``, the ``assert``s): 434
    blocking calls in the three recorded steps, each replay round settles one more of them, and
    the un-profiled replay stopped at MAX_ROUNDS (64) reading 100.30 ms against 51.68-58.53
    measured: its host_sync (HIGH, 1.54x) was the cut-short replay's, not a saving (removing the
    loop's own sync measured 0.80-0.94). Replays now take as many rounds as the model has
    blocking calls (causal/graph.py rounds_for): 65.38 ms, host_sync info. What holds is in
    HOLDS, MEASURED, APPLIED and SAME_PROCESS; here the mechanism and the rest."""
    from traceinsight.causal import graph

    needs_settled_replays("node")

    a = analysis("node.before.pt.trace.json.xz")
    r = a.results.replay
    bare = r.model
    blocking = int((bare.host.get_column("wait") != graph.WAIT_NONE).sum())
    # 430 waits for the device and 27 blocking copies
    assert blocking == 457 and graph.rounds_for(bare) == blocking + 2
    # from the trace's times (as the polars loop starts them) each round settles one more
    graph.WARM_START = False
    try:
        cut, cold = graph.replay(bare, graph.MAX_ROUNDS), graph.replay(bare)
    finally:
        graph.WARM_START = True
    assert not cut.converged and cold.converged and cold.rounds > 400
    # the C loop's warm start settles all of them at once: within MAX_ROUNDS, in two
    settled = graph.replay(bare, graph.MAX_ROUNDS)
    assert settled.converged and settled.rounds == 2 and r.unconverged == ()
    assert graph.step_ns(bare, settled, "median") == pytest.approx(
        graph.step_ns(bare, cold, "median"), abs=10_000
    )
    steps_ms = [graph.step_ns(bare, x, "median") / 1e6 for x in (cut, settled)]
    assert steps_ms[0] > 1.5 * steps_ms[1], steps_ms  # 100.30 against 65.38
    assert r.unprofiled_step_ns / 1e6 == pytest.approx(steps_ms[1])
    # the blocking calls are the library's, inside the loop's one odeint call (398 of 434: the
    # location is the innermost frame of the user's code, torchdiffeq being a library), then the
    # batch's gathers (33) and the loop's own loss.item() (3)
    sync = finding("node", "host_sync")
    assert sync.severity == "info" and band("node", "remove_syncs")[1] < 1.0
    sites = [(s.file, s.trigger, s.count) for s in sync.evidence["sources"]]
    assert sites == [
        ("loop_node.py", "odeint", 398),
        ("loop_node.py", "index", 33),
        ("loop_node.py", "item", 3),
    ], sites
    # the costliest is a call into the library, and the advice says the loop's .item() is not it
    assert [s.library_call for s in sync.evidence["sources"]] == [True, None, None]
    assert sync.recommendation.startswith("Most of these syncs (398 of 434) are inside odeint()")
    # the solver takes another path each step (how many steps it needs): a CUDA graph replays
    # one, so launch_bound is graded low; reduce-overhead measured 0.19-0.25x
    lb = finding("node", "launch_bound")
    assert (
        lb.severity == "low" and lb.evidence["path_change"] and band("node", "compile_ro")[1] < 0.3
    )
    # the 4x batch's miss (3.97 against 2.53-3.31): the solver's error norm over four times
    # the trajectories takes more function evaluations (45.8 against 41.6 in the measured
    # steps), which a trace of the smaller batch cannot show
    cfg = json.loads((HERE / "node.truth.json").read_text())["configs"]
    nfe = {
        c: cfg[c]["A"]["details"]["nfe_forward_mean_last_half"] for c in ("baseline", "batch_4x")
    }
    assert nfe["batch_4x"] > 1.05 * nfe["baseline"], nfe
    w = finding("node", "small_batch").what_if
    assert w.multiplier == 4 and w.speedup > band("node", "batch_4x")[1]


def test_the_held_out_detection_loop() -> None:
    """torchvision's Faster R-CNN (MobileNetV3-Large FPN) as its detection reference trains it
    with its defaults (4 workers, SGD, fp32, losses.item() each step), on 512 x 512 images, held
    out (session 26: A, B, P; compile in a later process C). What holds is in HOLDS, MEASURED and
    the first-finding test; here the mechanisms and the misses."""
    a = analysis("detection_fixed.before.pt.trace.json.xz")
    # the model samples and filters with ops sized by the data (45 a step, nonzero most): no
    # graph holds them, so launch_bound's 1.84x (HIGH before) is out of reach and graded low;
    # torch.compile, its advice, recompiled and measured 0.07x (0.82x on the steady steps)
    lb = finding("detection_fixed", "launch_bound")
    sized = lb.evidence["data_sized"]
    assert lb.severity == "low" and lb.what_if.speedup > 1.8
    assert sized.op == "aten::nonzero" and sized.per_step == pytest.approx(45.0)
    assert band("detection_fixed", "compile")[1] < 0.1
    # the miss (1.61 against 1.25-1.28 per sample): the model's own host work grows with the
    # images (a Python loop per image in its transform, anchor matching and box sampling: the
    # profiled 2x batch ran 10,467 ops a step against 7,443), while the what-if holds the host
    # work per step: its 2x step 1.24x the step, measured 1.56-1.60x
    head = a.findings[0]
    assert head.id == "memory_headroom" and head.what_if.multiplier == 2
    lo, hi = band("detection_fixed", "batch_2x")
    assert not within(head.what_if.speedup, lo, hi) and head.what_if.speedup > hi
    grown = head.what_if.batch_step_time_after_ns / head.what_if.step_time_ns
    cfg = json.loads((HERE / "detection_fixed.truth.json").read_text())["configs"]
    measured = [cfg["batch_2x"][p]["step_ms_window_mean"] / cfg["baseline"][p]["step_ms_window_mean"]
                for p in "AB"]  # fmt: skip
    assert grown < 1.3 and all(1.5 < m < 1.65 for m in measured), (grown, measured)
    # the un-profiled step, a miss: 123.10 ms (97.90 at twice the per-event cost) against
    # 80.94 in the same process; the same process's later captures (remove_syncs, bf16) came
    # within 4% (their windows' no-work ops 2.58-2.71 us against this one's 3.68)
    r = a.results.replay
    own = json.loads((HERE / "detection_fixed.truth.json").read_text())["profiled"]["baseline"]
    own_ns = 1e6 * own["unprofiled_same_process_step_ms_window_mean"]
    assert r.unprofiled_step_low_ns > own_ns


def test_the_held_out_segmentation_loop() -> None:
    """torchvision's DeepLabV3 (ResNet-50, aux head) as its segmentation reference trains it
    (4 workers, SGD, fp32, 480 x 480 crops, loss.item() each step), held out (session 26: A, B, P;
    compile_ro in processes C, D). GPU-bound (66% busy). What holds is in HOLDS, MEASURED and the
    first-finding test. As first analyzed no finding named bf16 (measured 1.14-1.17 alone,
    1.12-1.41 with channels_last, the largest lever): cuDNN runs the convolutions in TF32 (its
    default), so only 15% of the math time was fp32 on CUDA cores, under fp32_compute's 20%,
    while the bf16 transform, which prices the TF32 math too, replayed 1.20x. fp32_compute now
    counts TF32 math where the device has bf16, and advises bf16 with channels_last there.
    Since session 34 the bf16 replay keeps batch norm's time (autocast moves it to ATen's own
    kernels, no faster: measured on R(2+1)D-18): 1.08x against bf16's 1.14-1.17, graded low,
    and launch_bound (1.11x) comes first: its fix measured 1.26-1.35x, within 10% of the
    largest lever."""
    a = analysis("segmentation.before.pt.trace.json.xz")
    f = finding("segmentation", "fp32_compute")
    k = a.results.kernels
    assert f.severity == "low" and within(f.what_if.speedup, *band("segmentation", "bf16"))
    assert k.fp32_gemm_time_ratio < 0.2 < k.fp32_gemm_time_ratio + k.tf32_gemm_time_ratio
    assert f.title.startswith("Matrix math runs in TF32 and fp32")
    assert "channels_last" in f.recommendation and "channels_last" in f.snippet
    # launch_bound first: 1.11 against compile_ro 1.26-1.35, within 10% of bf16 + channels_last
    assert a.findings[0].id == "launch_bound"
    # the 2x batch, not raised (the GPU 66% busy) but priced as asked: 1.17 against 1.14-1.25
    at2 = chosen("segmentation.before.pt.trace.json.xz", ["memory_headroom@2"]).what_if
    assert within(at2.speedup, *band("segmentation", "batch_2x"))
    # the un-profiled step: 58.25 ms against 54.05-59.47 (A, B) and 61.72 in its process (0.94)
    own = json.loads((HERE / "segmentation.truth.json").read_text())["profiled"]["baseline"]
    est = a.results.replay.unprofiled_step_ns / 1e6
    assert est == pytest.approx(own["unprofiled_same_process_step_ms_window_mean"], rel=0.10)


def test_the_held_out_dcgan_loop() -> None:
    """pytorch/examples' DCGAN with its defaults (``--dataset fake``: FakeData through ToTensor,
    2 workers, batch 64, Adam for each network, five ``.item()`` reads a step for the print),
    held out (session 27: A, B, P; the loader alone in C, D). As first analyzed, launch_bound
    (2.20x) and memory_headroom (1.92x) read HIGH from an un-profiled step of 11.56 ms (8.93
    since each thread's step gives up its events' whole share, session 32), which ran
    20.3 ms in its process and 22.7-29.0 ms in the others: the 2 workers deliver a batch every
    24-31 ms (the loader alone, C and D), so the step waits for them without the profiler, and
    the 4x batch measured 0.83-0.93x per sample, torch.compile 0.79-0.95x. The profiled step
    (24.84 ms) never waited for them: its time in ``__next__`` is receiving the batches (file
    descriptors passed by the workers), so the trace shows only that the workers keep up with
    the profiled step. A prediction that needs more than twice that rate (the loader what-if's
    own assumption) is graded low at most, and dataloader_stall says to check the workers first
    (8 measured 1.13-1.89x)."""
    a = analysis("dcgan.before.pt.trace.json.xz")
    r = a.results.replay
    own = json.loads((HERE / "dcgan.truth.json").read_text())["profiled"]["baseline"]
    own_ms = own["unprofiled_same_process_step_ms_window_mean"]
    est_ms, shown_ms = r.unprofiled_step_ns / 1e6, r.trace_step_median_ns / 1e6
    # the step the model starts from is the workers-keep-up end of a range holding the measured
    assert est_ms < 0.6 * own_ms < own_ms < shown_ms, (est_ms, own_ms, shown_ms)
    cfg = json.loads((HERE / "dcgan.truth.json").read_text())["configs"]
    loader_ms = [cfg["loader_only"][p]["step_ms_window_mean"] for p in "CD"]
    assert all(0.9 * shown_ms < m < 1.3 * shown_ms for m in loader_ms), loader_ms
    by = {f.id: f for f in a.findings}
    for fid, fix in (("launch_bound", "compile"), ("memory_headroom", "batch_4x")):
        f = by[fid]
        assert f.severity == "low" and band("dcgan", fix)[1] < 1.0
        assert f.evidence["loader_headroom_needed"] > 4.0  # 6.23 and 5.29
        assert f.evidence["loader_shown_interval_ns"] == r.trace_step_median_ns
    dl = by["dataloader_stall"]
    assert dl.severity == "low" and "their rate is not in the trace" in dl.title
    assert dl.evidence["loader_unverified_speedup"] == pytest.approx(shown_ms / est_ms)
    assert dl.recommendation.startswith("Check that the DataLoader keeps up")
    assert band("dcgan", "workers_8")[1] > 1.8  # the largest lever
    assert "kept up with the profiled step only" in prediction_basis(a.to_json())
    from traceinsight.report.terminal import render_summary

    assert "up to 2.78x where the workers bound the un-profiled step" in render_summary(a.to_json())
    # every fix the loop measured below 1.10 is at most low (MEASURED); the applied set, workers
    # and batch included, within the tolerance: 2.82 against 2.82-2.91
    w = chosen(
        "dcgan.before.pt.trace.json.xz",
        ["host_sync", "pageable_memcpy", "memory_headroom@4", "unfused_optimizer"],
    ).what_if
    assert within(w.speedup, *band("dcgan", "all")), w.speedup


def test_the_held_out_word_lm_loop() -> None:
    """pytorch/examples' word-level language model with its defaults (2-layer LSTM of 200,
    batch 20, bptt 35, clipping, the hand-written SGD update, ``loss.item()`` each step) on a
    synthetic Wikitext-2-sized corpus, held out (session 27: A, B, P; the whole step as one CUDA
    graph and compile_ro in C, D). Host-bound (the GPU 23% busy)."""
    a = analysis("word_lm.before.pt.trace.json.xz")
    own = json.loads((HERE / "word_lm.truth.json").read_text())["profiled"]["baseline"]
    est = a.results.replay.unprofiled_step_ns / 1e6
    # the un-profiled step: 5.79 ms against 6.27 in its process (0.92), 5.57-6.28 in A-D
    assert est == pytest.approx(own["unprofiled_same_process_step_ms_window_mean"], rel=0.10)
    lb = finding("word_lm", "launch_bound")
    assert lb.severity == "high"
    # torch.compile leaves nn.LSTM eager: reduce-overhead measured 0.82-0.83x; the advice, and
    # the saving, is the whole step captured by hand: 2.23x against 2.32-2.67x (the step after within 5% of
    # the graph's, the step before 0.92 of its process's)
    assert lb.evidence["rnn_op"] == "aten::lstm" and band("word_lm", "compile_ro")[1] < 0.9
    assert "torch.cuda.graph" in lb.recommendation and "allow_rnn" in lb.recommendation
    assert "torch.compile(model" not in lb.snippet
    assert lb.evidence["transform"] == lb.evidence["priced_by"] == "cuda_graphs_whole_step"
    lo, hi = band("word_lm", "cudagraph")
    assert within(lb.what_if.speedup, lo, hi) and 0.9 * lo < lb.what_if.speedup < hi
    # As first analyzed the whole step priced 5.54x (1.17 ms). cuDNN runs the LSTM's kernels
    # on 11 streams ordered by event waits the trace does not link, and in the launch-bound
    # recording each started at its launch, so the replay without launches overlapped them:
    # 2.60 ms of GPU work a step (the graph ran 2.35-2.41 ms) replayed into 1.17 ms. A stream
    # that never ran beside the others in the recording (``alone``) now keeps launch order
    # with them in a graph's replay (causal/transforms.py _in_launch_order)
    g = a.results.replay.model.gpu
    streams = g.filter(pl.col("kind") == "kernel").get_column("stream").n_unique()
    gpu_ms = g.get_column("dur_ns").sum() / a.results.replay.model.steps.height / 1e6
    assert streams >= 10 and g.get_column("alone").all()
    cfg = json.loads((HERE / "word_lm.truth.json").read_text())["configs"]["cudagraph"]
    graph_ms = [cfg[p]["step_ms_window_mean"] for p in "CD"]
    assert all(0.85 * gpu_ms < m < gpu_ms for m in graph_ms), (gpu_ms, graph_ms)
    assert lb.what_if.step_time_after_ns / 1e6 == pytest.approx(gpu_ms, rel=0.05)
    # the profiled after: launch_bound gone (the graph's one launch a step)
    after = {f.id: f for f in analysis("word_lm.cudagraph.after.pt.trace.json.xz").findings}
    assert "launch_bound" not in after or after["launch_bound"].severity in ("low", "info")
    # the 4x batch measured largest (3.29-3.60x per sample). As first analyzed memory_headroom
    # recommended 2x (1.97x: the GPU's busy time scaled linearly would fill the step at 2.49x)
    # and came second, a ranking miss; the replay of 4x gains 1.70x over 2x's even at the
    # estimate's low end (3.35 against 1.97; 8x 1.18x over 4x's), so 4x is recommended
    head = a.findings[0]
    assert head.id == "memory_headroom" and head.what_if.multiplier == 4
    assert a.results.memory.saturation_multiplier < 4
    lo, hi = band("word_lm", "batch_4x")
    assert within(head.what_if.speedup, lo, hi) and head.what_if.speedup > hi
    assert a.findings[1].id == "launch_bound"
    # the applied set (syncs, 4x batch, bf16) misses: 4.02 against 3.09-3.12: bf16 alone
    # measured 0.78-0.82x (autocast's casts on a host-bound step), which the bf16 transform,
    # scaling the GEMMs only, prices at 1.00x
    applied = chosen(
        "word_lm.before.pt.trace.json.xz", ["host_sync", "memory_headroom@4", "fp32_compute"]
    ).what_if
    assert applied.speedup > (1 + TOLERANCE) * band("word_lm", "all")[1]


def test_the_held_out_gpt2_accumulation_loop() -> None:
    """transformers' Trainer on a GPT-2 (6 layers of 512, GPT-2's vocabulary) with its defaults
    and gradient accumulation: 4 sequences of 512 tokens a micro-batch, 8 micro-batches a step
    (session 27: A, B, P; compile_ro in C, D). As first analyzed the micro-batch lever had no
    finding: the GPU's busy time would fill the step at 1.38x the batch, under the 2x the
    recommendation rounded down to, while 2x measured 1.15-1.23x and 4x 1.27-1.36x, the largest
    lever then measured. A 2x batch is now recommended where the saturation lies between 1x
    and 2x, graded low at most. launch_bound comes first (1.21x): its advice's reduce-overhead
    failed with accumulation, default torch.compile measured 1.37-1.85x (G, H), the largest
    lever (HOLDS and the first-finding test)."""
    a = analysis("gpt2_accum.before.pt.trace.json.xz")
    assert a.findings[0].id == "launch_bound"
    head = finding("gpt2_accum", "memory_headroom")
    assert head.severity == "low" and head.what_if.multiplier == 2
    assert 1.0 < head.evidence["saturation_multiplier"] < 2.0
    assert head.what_if.speedup > a.findings[0].what_if.speedup
    assert "accumulate fewer micro-batches" in head.recommendation
    at4 = chosen("gpt2_accum.before.pt.trace.json.xz", ["memory_headroom@4"]).what_if
    assert within(at4.speedup, *band("gpt2_accum", "micro_4x")), at4.speedup
    # the un-profiled step: 183.42 ms against 164.63 in its process (1.11), 166.7-176.7 in A, B
    own = json.loads((HERE / "gpt2_accum.truth.json").read_text())["profiled"]["baseline"]
    est = a.results.replay.unprofiled_step_ns / 1e6
    assert est == pytest.approx(own["unprofiled_same_process_step_ms_window_mean"], rel=0.12)
    # default torch.compile through the Trainer (1.37-1.85x, G, H) also turned TF32 on (tf32
    # unset): tf32=True alone measured 1.11-1.15x (T1, T2: session 28, call 6), so compile's
    # own part is about 1.2-1.6x, against launch_bound's 1.21x
    assert band("gpt2_accum", "tf32")[1] < band("gpt2_accum", "compile")[0]
    # launch_bound's advice, reduce-overhead through the Trainer, failed with accumulation in
    # both processes (a graph's output overwritten by a later run), and again with
    # torch.compiler.cudagraph_mark_step_begin() before each micro-batch (E, F)
    cfg = json.loads((HERE / "gpt2_accum.truth.json").read_text())["configs"]
    for fix, procs in (("compile_ro", "CD"), ("compile_ro_marked", "EF")):
        assert all("overwritten by a subsequent run" in cfg[fix][p]["error"] for p in procs)
    # the applied set (bf16, 4x micro-batches, no syncs, workers): 3.22 against 2.62-2.65
    # (1.22). As first analyzed 4.59 (1.73): each fix alone held, but with the 4x batch the
    # GPU bounds the step, and there the bf16 transform was too fast. In the profiled bf16
    # step (P) the GEMMs took 26.1 ms a step against 93.1 in fp32 (3.6x, the peaks' ratio
    # 14.8x): the head's three matmuls over the 50,257-word vocabulary, off the 16-byte
    # alignment, ran cuBLAS's align-1 kernels (1.9-2.6x), the aligned ones 8.7-13x; autocast's
    # casts added 712 kernels (5.7 ms) a profiled step and the other kernels kept their time
    # (GELU's pow runs in fp32), where the transform had halved them
    applied = chosen(
        "gpt2_accum.before.pt.trace.json.xz",
        ["fp32_compute", "memory_headroom@4", "host_sync", "dataloader_stall"],
    ).what_if
    assert within(applied.speedup, *band("gpt2_accum", "all")), applied.speedup
    g = a.results.replay.model.gpu
    # GPT-2's head: 50,257 words, odd, so its matmuls' bf16 kernels load one element at a time
    head = g.filter(pl.col("align_16bit") < 8)
    assert head.height and set(head.get_column("align_16bit")) == {1}
    # the matmul ops autocast would cast operands for: mm and addmm on the step and autograd
    # threads, each counted once at its first kernel
    assert g.get_column("opens_math_op").sum() < g.get_column("fp32_math").sum()


def test_the_dcgan_loop_with_8_workers() -> None:
    """DCGAN's profiled after with 8 workers (call 3, another process): the un-profiled
    estimate 7.08 ms against 10.20 measured in that process (the workers still near the
    step's pace: 8 of them deliver at about a quarter of 2's 24-31 ms), and the workers kept up
    with a profiled step 2.57x the estimate: the same rule grades every fix low, and says so."""
    a = analysis("dcgan.workers_8.after.pt.trace.json.xz")
    later = json.loads((HERE / "dcgan.truth.json").read_text())["profiled_later"]["workers_8"]
    est = a.results.replay.unprofiled_step_ns / 1e6
    assert (
        est
        < later["unprofiled_same_process_step_ms_window_mean"]
        < a.results.replay.trace_step_median_ns / 1e6
    )
    assert all(f.severity in ("low", "info") for f in a.findings if f.what_if is not None)
    dl = next(f for f in a.findings if f.id == "dataloader_stall")
    assert dl.evidence["loader_unverified_speedup"] > 2.0


def test_the_held_out_bert_mlm_loop() -> None:
    """transformers' Trainer pre-training a BERT-base as a masked LM the way run_mlm.py does
    (8 blocks of 512 tokens, the collator masking in the main process, fp32), recorded before
    any analysis of it (session 28: A, B, P). GPU-bound in fp32 (the GPU's 75.8 ms of a 92 ms
    step); bf16 measured 2.35-2.79x, the largest lever, and fp32_compute comes first, HIGH.
    Its point, 1.59x, misses low: in bf16 the step becomes host-bound, and the host the
    estimate leaves (53.8 ms a step, replayed with the GPU free) is about half again what
    the measured bf16 steps allow (30.8-38.4 ms): the HF stacks' profiled host keeps more than
    the per-event cost takes out, as on the Trainer and accelerate loops (1.34-1.41,
    test_unprofiled_step_estimate_against_the_measured_one). The range's other end, the
    profiler's cost twice the trace's, is 2.25x."""
    a = analysis("bert_mlm.before.pt.trace.json.xz")
    f = a.findings[0]
    assert f.id == "fp32_compute" and f.severity == "high"
    lo, hi = band("bert_mlm", "bf16")
    assert f.what_if.speedup < (1 - TOLERANCE) * lo
    assert within(f.what_if.speedup_low, lo, hi), f.what_if.speedup_low
    # the un-profiled step: 92.19 ms against 93.22 in its process (GPU-bound: the hidden host
    # does not show in it)
    own = json.loads((HERE / "bert_mlm.truth.json").read_text())["profiled"]["baseline"]
    est = a.results.replay.unprofiled_step_ns / 1e6
    assert est == pytest.approx(own["unprofiled_same_process_step_ms_window_mean"], rel=0.05)
    # BERT's head over 30,522 word pieces (2 mod 8): its matmuls' bf16 kernels load 2
    # elements at a time, and ran cutlass s16816 align2 kernels in the profiled after
    g = a.results.replay.model.gpu
    assert set(g.filter(pl.col("align_16bit") < 8).get_column("align_16bit")) == {2}
    after = raw_events("bert_mlm.bf16.after.pt.trace.json.xz")
    assert any("align2" in e["name"] for e in after if e.get("cat") == "kernel")
    # autocast's casts in the profiled after, counted from the raw events: a cast kernel per
    # aten::_to_copy, 427 a step against the transform's 5/3 of its 246 math ops a step
    to_copy = sum(1 for e in after if e.get("cat") == "cpu_op" and e["name"] == "aten::_to_copy")
    opens = int(g.get_column("opens_math_op").sum()) / a.results.replay.model.steps.height
    assert to_copy / 3 == pytest.approx(433, abs=10) and opens == pytest.approx(246, abs=2)
    # the profiled after: fp32_compute gone
    assert "fp32_compute" not in {
        x.id for x in analysis("bert_mlm.bf16.after.pt.trace.json.xz").findings
    }
    # default torch.compile measured 2.00-2.08x, but through the Trainer it is not compile
    # alone: TrainingArguments(torch_compile=True) with tf32 unset turns TF32 on for cuBLAS and
    # cuDNN, and tf32=True alone measured 1.71-1.77x (T1, T2: call 6): compile's own part is
    # about 1.17x. fp32_compute's advice names TF32 as the least step; launch_bound info 1.03x
    assert band("bert_mlm", "compile")[0] > 1.9
    tf32 = band("bert_mlm", "tf32")
    assert 1.7 < tf32[0] <= tf32[1] < 1.8 < band("bert_mlm", "bf16")[0]
    assert "TF32" in f.recommendation or "float32_matmul_precision" in f.snippet
    assert finding("bert_mlm", "launch_bound").severity == "info"
    # the applied set, the 4x batch priced though not raised (its 2x gains under 5%, the GPU
    # busy): 4.49 against 5.88-6.08 per sample, within the tolerance from below, for the
    # same reason as bf16 alone
    sel = chosen(
        "bert_mlm.before.pt.trace.json.xz",
        ["fp32_compute", "host_sync", "dataloader_stall", "memory_headroom@4"],
    )
    assert sel.priced_not_raised == ("memory_headroom@4",)
    lo, hi = band("bert_mlm", "all")
    assert within(sel.what_if.speedup, lo, hi) and sel.what_if.speedup < lo


def test_the_doubling_past_the_recommended_batch() -> None:
    """The word-level LSTM's 8x batch (session 28, processes C2 and D2): 4.41-4.68x per
    sample, 1.30x over 4x's in the same processes. Replayed, 4.28x (0.97 of the band's low end,
    from an un-profiled step 0.92 of its process's; 4.56x, in the band, before session 32); its low
    end gains 1.18x over 4x's, under the 1.25 a doubling needs to be recommended, so the
    recommendation stays 4x (the conservative side: a quarter more throughput measured)."""
    a = analysis("word_lm.before.pt.trace.json.xz")
    at8 = chosen("word_lm.before.pt.trace.json.xz", ["memory_headroom@8"]).what_if
    lo, hi = band("word_lm", "batch_8x")
    assert within(at8.speedup, lo, hi) and 0.95 * lo < at8.speedup < hi, (at8.speedup, lo, hi)
    assert a.results.memory.recommended_multiplier == 4
    # the first finding is the batch, the largest measured lever (8x), named at 4x: 3.84x
    # against 8x's 4.41-4.68 (the whole-step graph 2.32-2.67 comes second)
    bands = json.loads((HERE / "word_lm.truth.json").read_text())["speedup_band"]
    best = max(
        (k for k in bands if k not in ("all", "baseline", *COMBINED)),
        key=lambda k: bands[k]["high"],
    )
    assert best == "batch_8x" and a.findings[0].id == "memory_headroom"


def test_the_held_out_convnext_loop() -> None:
    """timm's ConvNeXt-Tiny trained the way train.py trains it (batch 128, AdamW, label
    smoothing, 8 workers, fp32 with torch's TF32 defaults), recorded before any analysis of it
    (session 28: A, B, P). GPU-bound; bf16 measured 3.72-3.85x, the largest lever (channels_last
    1.00, the 2x batch 1.02 per sample, default torch.compile 1.05). As first analyzed
    fp32_compute priced 2.13x (1.99x with this session's autocast casts): cuDNN's weight gradient
    of the 7x7 depthwise convolutions, ``wgrad2d_grouped_direct_kernel<false, true, int,
    float, ...>``, 31.4 ms of the 185 ms step, was not counted as fp32 math (the float
    template pattern allowed only numbers before ``float``), so bf16 left it as it was; its
    bf16 run replaced it (the depthwise backward 77 -> 7 ms a step). Now 2.88x, within."""
    a = analysis("convnext.before.pt.trace.json.xz")
    f = a.findings[0]
    assert f.id == "fp32_compute" and f.severity == "high"
    lo, hi = band("convnext", "bf16")
    assert within(f.what_if.speedup, lo, hi) and f.what_if.speedup < lo
    kernels = [
        e for e in raw_events("convnext.before.pt.trace.json.xz") if e.get("cat") == "kernel"
    ]
    grouped = [
        e for e in kernels if "wgrad2d_grouped_direct_kernel<false, true, int, float" in e["name"]
    ]
    assert sum(e["dur"] for e in grouped) / 3 / 1000 == pytest.approx(31.4, abs=0.1)
    g = a.results.replay.model.gpu
    assert g.filter(pl.col("name").str.contains("wgrad2d_grouped_direct"))["fp32_math"].all()
    # the un-profiled step: GPU-bound, 185.54 ms against 184.24 in its process
    own = json.loads((HERE / "convnext.truth.json").read_text())["profiled"]["baseline"]
    est = a.results.replay.unprofiled_step_ns / 1e6
    assert est == pytest.approx(own["unprofiled_same_process_step_ms_window_mean"], rel=0.02)
    # a miss, the applied set (bf16 and the 2x batch; channels_last is bf16's advice here):
    # 2.93 against 4.16-4.26 (0.70). The bf16 point is low for the same reason: the depthwise
    # layers' TF32 weight gradient (34.9 ms a step) is priced at TF32 / bf16 (1/2) while bf16
    # ran the whole depthwise backward on cuDNN's NHWC kernels at an eleventh of its fp32 time
    applied = chosen("convnext.before.pt.trace.json.xz", ["fp32_compute", "memory_headroom@2"])
    assert applied.what_if.speedup < (1 - TOLERANCE) * band("convnext", "all")[0]
    # the profiled after: no fp32 math left above info
    after = {x.id: x for x in analysis("convnext.bf16.after.pt.trace.json.xz").findings}
    assert "fp32_compute" not in after or after["fp32_compute"].severity == "info"


def test_the_held_out_hf_images_loop() -> None:
    """The Trainer fine-tuning a ViT-Base/16 as run_image_classification.py does (batch 8, fp32,
    ``dataloader_num_workers=0``: PIL decodes and the transforms run in the step thread),
    recorded before any analysis of it (session 30: A, B, P; C, D, Q). Loader-bound: 4 workers
    measured 1.95-1.98x, 1 worker (what the finding says hides the loading) 1.58-1.73x, the
    first finding 1.79x. bf16 (0.82-0.99), the syncs (1.03-1.05) and TF32 (0.98-1.02) raise
    nothing above info. The applied set, as first analyzed, priced 2.08x against the 7.61-8.49x
    measured for all four fixes together: the advised loader left the step thread's loading
    column as it was, so the larger batch then scaled the loading it had just removed (30 ms a
    batch, x4). The loader what-if now leaves in that column what the step thread keeps, and the
    set prices 6.41x (0.84 of the band's low end)."""
    a = analysis("hf_images.before.pt.trace.json.xz")
    f = a.findings[0]
    assert f.id == "dataloader_stall" and f.severity == "high"
    # 2: a worker makes the batch and sends its tensors (session 58); one did not keep up
    # (1.58-1.73x against 4's 1.95-1.98x)
    assert "num_workers=2 would hide" in f.title
    # the step thread's loading, summed from the raw events: the loader's __next__ ranges
    steps = [
        e
        for e in raw_events("hf_images.before.pt.trace.json.xz")
        if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#")
    ]
    nexts = [
        e
        for e in raw_events("hf_images.before.pt.trace.json.xz")
        if e.get("cat") == "user_annotation"
        and "DataLoader" in e["name"]
        and "__next__" in e["name"]
    ]
    assert len(steps) == 3 and len(nexts) >= 3
    assert sum(e["dur"] for e in nexts) / 1000 / 3 > 25  # ms a step, of an 82 ms profiled step
    lo, hi = band("hf_images", "all")
    applied = chosen(
        "hf_images.before.pt.trace.json.xz",
        ["dataloader_stall", "memory_headroom@4", "fp32_compute", "host_sync"],
    )
    assert within(applied.what_if.speedup, lo, hi), (applied.what_if.speedup, lo, hi)
    assert applied.what_if.speedup > 3 * f.what_if.speedup
    # the 4x batch alone: 1.15 against 1.30-1.41 per sample (the loading scales with the batch)
    four = chosen("hf_images.before.pt.trace.json.xz", ["memory_headroom@4"])
    assert within(four.what_if.speedup, *band("hf_images", "batch_4x"))
    # no memory_headroom finding: it recommends 2x (the GPU's time saturates at 2.37x the
    # batch), priced 1.11x; the 4x it was not asked for is a lever of 1.30-1.41x unraised
    assert four.priced_not_raised == ("memory_headroom@4",)
    assert "memory_headroom" not in {x.id for x in a.findings}
    # the un-profiled step: 68.90 ms against 69.82 in its process
    own = json.loads((HERE / "hf_images.truth.json").read_text())["profiled"]["baseline"]
    est = a.results.replay.unprofiled_step_ns / 1e6
    assert est == pytest.approx(own["unprofiled_same_process_step_ms_host_median"], rel=0.05)


def test_the_held_out_efficientnet_loop() -> None:
    """timm's EfficientNet-B0 trained as train.py does with its defaults (batch 128, SGD, label
    smoothing, 4 workers, pageable batches copied blocking, fp32), recorded before any analysis
    of it (session 30: A, B, P; pinned batches in C, D, Q after the first analysis). As first
    analyzed, fp32_compute came first (MEDIUM, 1.23x) where bf16 measured 0.97-0.99x: ATen's own
    depthwise kernels (``conv_depthwise2d_*<float>``, 21.5 ms of the 60.5 ms of kernels a step)
    were fp32 math to the bf16 transform, while bf16 runs the same kernels on BFloat16 in the
    same time (21.9 ms a step in the bf16 trace, call 2). Now they are not fp32 math, and the
    loader's receiving and the pageable copies come first, each within its measured fix
    (pin_memory 1.27-1.31, with non_blocking 1.28-1.36).

    channels_last measured 1.31-1.41x, a lever no finding priced at first: in channels_last
    cuDNN's NHWC depthwise kernels took 2.4 ms a step where ATen's took 21.5, its NHWC batch
    norm 8.3 ms where the NCHW one took 22.8, and its layout transposes (0.6 ms) went.
    ``channels_first_layers`` now comes first, its fix priced by the ``channels_last_layers``
    transform: each such layer's bytes (from the recorded shapes) at the H200's memory
    bandwidth (depthwise 1.95 ms; batch norm, its two passes counted, 5.75: optimistic, while
    the other convolutions, which took 5.7 -> 9.2 ms there, are kept): 1.30x, MEDIUM. The first findings' fixes
    together (pinned non-blocking batches and channels_last, call 4: E, F) price 1.64x against
    1.59-1.61x. The default torch.compile (1.39-1.45x) stays unpriced."""
    a = analysis("efficientnet.before.pt.trace.json.xz")
    ids = [f.id for f in a.findings]
    assert ids[:3] == ["channels_first_layers", "dataloader_stall", "pageable_memcpy"]
    dwf = a.findings[0]
    assert dwf.severity == "medium"
    assert dwf.evidence["aten_depthwise_count"] == 144  # 48 a step: 16 layers x 3 kernels
    g = a.results.replay.model.gpu.filter(pl.col("channels_last_ns").is_not_null())
    dw = g.filter(pl.col("name").str.contains("conv_depthwise2d"))
    assert dw.height == 144 and dw["channels_last_ns"].sum() / 3 / 1e6 == pytest.approx(
        1.95, abs=0.01
    )
    layout = g.filter(pl.col("name").str.contains("(?i)nchwtonhwc|nhwctonchw"))
    assert layout.height == 150 and layout["channels_last_ns"].sum() == 0
    applied = chosen(
        "efficientnet.before.pt.trace.json.xz",
        ["dataloader_stall", "pageable_memcpy", "channels_first_layers"],
    )
    assert within(applied.what_if.speedup, *band("efficientnet", "pin_channels_last"))
    kernels = [
        e for e in raw_events("efficientnet.before.pt.trace.json.xz") if e.get("cat") == "kernel"
    ]
    dw = [e for e in kernels if "conv_depthwise2d" in e["name"]]
    assert sum(e["dur"] for e in dw) / 3 / 1000 == pytest.approx(21.5, abs=0.1)
    g = a.results.replay.model.gpu
    assert not g.filter(pl.col("name").str.contains("conv_depthwise2d"))["fp32_math"].any()
    fp32 = {f.id: f for f in a.findings}.get("fp32_compute")
    assert fp32 is None or fp32.severity in ("low", "info")
    # the un-profiled step: 90.68 ms against 90.59 in its process
    own = json.loads((HERE / "efficientnet.truth.json").read_text())["profiled"]["baseline"]
    est = a.results.replay.unprofiled_step_ns / 1e6
    assert est == pytest.approx(own["unprofiled_same_process_step_ms_host_median"], rel=0.02)
    # the missed levers, measured
    assert band("efficientnet", "channels_last")[0] > 1.3
    assert band("efficientnet", "compile")[0] > 1.35


def test_the_held_out_mobilenet_loop() -> None:
    """torchvision's MobileNetV2 the classification reference's way (batch 32 a GPU, SGD, 16
    workers, pinned non-blocking batches, three reads a step, fp32), recorded in session 30 to
    check channels_first_layers on a loop it was not built on (call 4: A, B, P). Host-bound
    (the GPU 40% busy): ATen's depthwise kernels are 30.5% of its kernel time, but the saving
    hides behind the host, priced 1.00x (info) where channels_last measured 1.06-1.10x. bf16
    measured 0.84-0.95x: no finding. The 4x batch measured 1.58-1.68x per sample, the largest
    lever; memory_headroom comes first (2x recommended, 1.83x; 4x prices 2.24x: a miss). Its
    mechanism is the un-profiled step the predictions start from: 33.20 ms against 23.27 ms
    in the same process (1.43: the profiler's cost on this host-bound loop's 1,000 runtime
    calls a step is above what the trace's no-work ops show), so the host's share the batch
    amortizes is overstated."""
    a = analysis("mobilenet.before.pt.trace.json.xz")
    assert a.findings[0].id == "memory_headroom"
    f = finding("mobilenet", "channels_first_layers")
    # 1.07x since the backward wait joins the autograd burst (session 38; 1.00x before): low,
    # within the band
    assert f.severity in ("info", "low") and f.evidence["aten_depthwise_time_ratio"] > 0.3
    assert within(f.what_if.speedup, *band("mobilenet", "channels_last"))
    four = chosen("mobilenet.before.pt.trace.json.xz", ["memory_headroom@4"])
    # 2.24x before the backward wait joined its autograd burst (session 38): 2.00x, within
    assert within(four.what_if.speedup, *band("mobilenet", "batch_4x"))
    # the applied set (bf16 has no finding): 4.08 against 2.20-2.21, the same mechanism
    applied = chosen(
        "mobilenet.before.pt.trace.json.xz", ["memory_headroom@4", "channels_first_layers"]
    )
    assert applied.what_if.speedup > (1 + TOLERANCE) * band("mobilenet", "all")[1]
    own = json.loads((HERE / "mobilenet.truth.json").read_text())["profiled"]["baseline"]
    est = a.results.replay.unprofiled_step_ns / 1e6
    # 33.20 ms before the join, 29.74 with it: still 1.28 of the process's step
    assert est > 1.25 * own["unprofiled_same_process_step_ms_host_median"]
    assert "fp32_compute" not in {x.id for x in a.findings if x.severity != "info"}


def test_channels_last_on_a_net_without_depthwise_layers() -> None:
    """The channels_last transform on a loop it was not built on, with no ATen depthwise
    kernels: torchvision's DeepLabV3 ResNet-50 (session 26) measured channels_last alone
    1.11-1.14x. Its cuDNN channels-first batch norm (5.34 ms a step) priced at the memory
    bandwidth, its two passes counted (3.26 ms), and its layout transposes (3.14 ms) gone: 1.07x,
    within. Since session 34 channels_first_layers reads the transposes and the batch norm too
    (20.6% of kernel time): raised, graded low by that saving."""
    a = analysis("segmentation.before.pt.trace.json.xz")
    w = a.results.replay.what_if["channels_last_layers"]
    assert within(w.speedup, *band("segmentation", "channels_last")), w.speedup
    f = finding("segmentation", "channels_first_layers")
    assert f.severity == "low" and f.what_if.speedup == w.speedup
    k = a.results.kernels
    steps = a.results.steps.steps
    assert abs(k.nchw_batch_norm_ns / steps / 1e6 - 5.34) < 0.01
    assert abs(k.layout_transpose_ns / steps / 1e6 - 3.14) < 0.01


def test_the_held_out_mobilenetv3_loop() -> None:
    """timm's MobileNetV3-Large in the EfficientNet loop (train.py's defaults: batch 128, SGD, 4
    workers, pageable batches copied blocking, fp32), recorded in session 30 after
    channels_first_layers was built, to check it on a net it was not built on (call 5: A, B,
    P). It comes first, HIGH, 1.37x against channels_last's 1.17-1.29x (1.65x in the profiled
    process P): within. Its batch norm, priced with its two passes at the memory bandwidth
    (3.75 ms), took 5.81 ms in channels_last, its depthwise layers 1.46 ms (priced 1.21).
    A miss in the ranking: the pinned non-blocking batches measured 1.28-1.58x, the largest
    lever, priced 1.21x and 1.19x by the loader's and the copies' findings."""
    a = analysis("mobilenetv3.before.pt.trace.json.xz")
    f = a.findings[0]
    assert f.id == "channels_first_layers" and f.severity == "high"
    assert within(f.what_if.speedup, *band("mobilenetv3", "channels_last"))
    assert (
        band("mobilenetv3", "pin_nonblocking")[1]
        > (1 + LEVER_WITHIN) * band("mobilenetv3", "channels_last")[1]
    )
    own = json.loads((HERE / "mobilenetv3.truth.json").read_text())["profiled"]["baseline"]
    est = a.results.replay.unprofiled_step_ns / 1e6
    assert est == pytest.approx(own["unprofiled_same_process_step_ms_host_median"], rel=0.10)


def test_channels_last_from_the_pinned_after() -> None:
    """A miss, with its mechanism. From the kept pinned after (process Q: GPU-bound, 94% busy),
    channels_first_layers prices channels_last at 1.79x (HIGH; 1.87x before its NHWC batch
    norm was priced at the 0.7 of peak bandwidth it measured); from the pinned state it
    measured 1.30x in process R (66.0 -> 52.8 ms) and 1.17-1.26x between processes (C, D
    against E, F). R's profiled pin_channels_last after shows the step host-bound there
    (un-profiled 53.8 ms against 52.8 measured: right): the GPU's 31 ms is hidden behind the
    host. Q's trace hid the host behind the GPU (its profiled step 67.1 ms against 64.7
    un-profiled: the profiler cost that process little), and the model, taking the per-event
    cost out of the host, leaves it about 35 ms where the step after runs 53 (channels_last
    also adds about 390 runtime calls a step: cuDNN's NHWC workspace memsets and attribute
    queries). The same configuration profiled in R reads 84.3 ms un-profiled against 66.0: the
    profiler's cost per process, issue 37 item 2."""
    f = finding("efficientnet", "channels_first_layers", "pin_nonblocking.after")
    assert f.severity == "high" and f.what_if.speedup > 1.75
    truth = json.loads((HERE / "efficientnet.truth.json").read_text())["profiled"]
    before = truth["pin_nonblocking"]["unprofiled_same_process_step_ms_host_median"]
    after_own = truth["pin_channels_last"]["unprofiled_same_process_step_ms_host_median"]
    assert f.what_if.step_time_after_ns / 1e6 < 0.75 * after_own
    a = analysis("efficientnet.pin_channels_last.after.pt.trace.json.xz")
    assert a.results.replay.step_bound_by == "host"
    est = a.results.replay.unprofiled_step_ns / 1e6
    assert est == pytest.approx(after_own, rel=0.05)
    assert f.what_if.step_time_ns / 1e6 == pytest.approx(before, rel=0.05)


def test_channels_last_prices_a_depthwise_layer_by_hand() -> None:
    """EfficientNet-B0's first depthwise layer, forward: ``aten::_convolution`` on a
    [128, 32, 112, 112] fp32 input with a [32, 1, 3, 3] weight, stride 1 (same padding): it
    moves its input, weight and output, (2 x 51,380,224 + 288) x 4 = 411,042,944 bytes, at the
    H200's 4.8 TB/s (data/devices.toml): 85,634 ns for its one kernel in channels_last, where
    ATen's channels-first kernel took 504 us."""
    g = analysis("efficientnet.before.pt.trace.json.xz").results.replay.model.gpu
    first = (
        g.filter(pl.col("name").str.contains("conv_depthwise2d_forward"))
        .sort("start_ns")
        .row(0, named=True)
    )
    nbytes = (2 * 128 * 32 * 112 * 112 + 32 * 9) * 4
    assert first["channels_last_ns"] == int(nbytes / 4.8e12 * 1e9)
    assert first["dur_ns"] > 5 * first["channels_last_ns"]


def test_channels_last_prices_batch_norm_at_its_measured_bandwidth_by_hand() -> None:
    """R(2+1)D-18's batch norms, forward (device measurement, session 38: cuDNN's NHWC batch
    norm moves its bytes at 0.69 of the H200's peak, median of 21 shapes): a [24, 64, 16, 56,
    56] fp32 layer reads x twice and writes y, 3 x 77,070,336 x 4 = 924,844,032 bytes at 0.7 x
    4.8 TB/s, 275.25 us (NCHW: 618 us). The stem's 45-channel layer keeps its time (channels
    not a multiple of 4: cuDNN's scalar NHWC kernel measured 690 us against 608 in NCHW), and
    so do the layout transposes of the convolutions whose channels are 45, 230 or 921 (cuDNN
    pads them in NHWC instead: 3.18 ms a step measured)."""
    g = analysis("video_r2p1d.before.pt.trace.json.xz").results.replay.model.gpu
    bn = g.filter(pl.col("name").str.contains("bn_fw_tr")).sort("start_ns")
    stem, first64 = bn.row(0, named=True), bn.row(1, named=True)
    assert stem["channels_last_ns"] == stem["dur_ns"]
    assert first64["channels_last_ns"] == pytest.approx(
        3 * 77_070_336 * 4 / (0.7 * 4.8e12) * 1e9, abs=1
    )
    layout = g.filter(pl.col("name").str.to_lowercase().str.contains("nchwtonhwc|nhwctonchw"))
    kept = layout.filter(pl.col("channels_last_ns") > 0)
    assert kept.height and (kept["channels_last_ns"] == kept["dur_ns"]).all()
    assert 0.1 < kept["dur_ns"].sum() / layout["dur_ns"].sum() < 0.3  # 12.16 of 65.03 ms


def test_channels_last_without_recorded_shapes_is_unpriced() -> None:
    """Without ``record_shapes`` the layers' bytes are unknown: the transform says why it
    cannot price them (and the finding is then graded low at most, savings.py UNPRICED_CAP),
    rather than pricing channels_last at nothing."""
    from dataclasses import replace

    from traceinsight.analyzers.context import build_context
    from traceinsight.analyzers.replay import model_inputs
    from traceinsight.causal import transforms
    from traceinsight.causal.build import build_model
    from traceinsight.model.schema import empty_op_args
    from traceinsight.parsers import load_trace

    ctx = build_context(
        load_trace(HERE / "efficientnet.before.pt.trace.json.xz"), Options().step_pattern, 1
    )
    src = model_inputs(ctx)
    assert src is not None
    t = transforms.TRANSFORMS["channels_last_layers"]
    shaped = build_model(src)
    assert t(shaped) is not None and t.unpriced(shaped) is None
    bare = build_model(replace(src, op_args=empty_op_args()))
    assert bare.gpu["channels_last_ns"].drop_nulls().len() == 0 and t(bare) is None
    assert "record_shapes=True" in (t.unpriced(bare) or "")


def test_the_held_out_nanogpt_loop() -> None:
    """Karpathy's nanoGPT trained as its train.py trains config/train_shakespeare_char.py
    (10.7M parameters, batch 64 x 256, bf16 autocast, fused AdamW, get_batch in the step thread
    with pinned non-blocking copies, loss.item() every 10 iterations) with --compile=False,
    recorded before any analysis (session 31: A, P on one machine, B on another, 20-40% slower
    on every configuration). Host-bound: 16.03 / 19.92 ms a step, 47.51 ms profiled with stacks.

    As first analyzed the un-profiled estimate was 23.79 ms (P's own process 16.60): with
    stacks the profiler records 5,600 Python frames and 4,300 ops a step; a fit of the host's
    gaps to their events gives ~1.3 us a frame and ~4.2 us an op (main thread) where the no-work
    op reads 2.9 us, the mean, so the per-event cost clipped at nothing in 68 gaps where frames
    crowd (19.3 ms over 3 steps) was spent by the ops elsewhere in the thread's step. Each
    thread's step now gives up its events' whole share (causal/transforms.py without_profiler):
    18.14 ms, inside A/B. From it memory_headroom@4 prices 2.31x against 1.87-2.13x (3.01 as
    first analyzed, a miss) and the applied set (the graphs and the 4x batch) 2.38x against the
    measured all's 2.39-2.66x (which compiled in the default mode).

    launch_bound (HIGH; its advice CUDA graphs through reduce-overhead) against compile_ro's
    2.28-2.45x, the largest lever, comes first since session 44: 2.00x, where the graphs
    took the loop's ops outside the model (the loss, the optimizer's zero_grad) as captured
    and priced 1.90x, second to the 2x batch (1.99x; the 4x measured 1.87-2.13x per sample,
    0.87 of the largest). It still keeps the Python between the model's captured calls, which
    dynamo traces away (the whole step captured, which runs none of it, prices 2.33x). The
    default torch.compile measured 1.26-1.31x (unpriced)."""
    truth = json.loads((HERE / "nanogpt.truth.json").read_text())
    a = analysis("nanogpt.before.pt.trace.json.xz")
    est = a.results.replay.unprofiled_step_ns / 1e6
    base = [truth["configs"]["baseline"][p]["step_ms_window_mean"] for p in "AB"]
    own = truth["profiled"]["baseline"]["unprofiled_same_process_step_ms_window_mean"]
    assert min(base) < est < max(base) and est == pytest.approx(own, rel=0.10), (est, own)
    first, second = a.findings[:2]
    assert (first.id, second.id) == ("launch_bound", "memory_headroom")
    assert first.severity == second.severity == "high"
    assert second.what_if.multiplier == 2
    lb = first.what_if.speedup
    assert within(lb, *band("nanogpt", "compile_ro")) and lb < band("nanogpt", "compile_ro")[0]
    whole = first.evidence["what_if_whole_step"].speedup
    assert band("nanogpt", "compile_ro")[0] < whole < band("nanogpt", "compile_ro")[1]
    # the batch's lever is not within 10% of the graphs': the graphs' finding must come first
    assert band("nanogpt", "batch_4x")[1] < (1 - LEVER_WITHIN) * band("nanogpt", "compile_ro")[1]
    # gpu_underutilized's idle between a step's launches is launch_bound's (audits 6, 7, 9)
    above_low = {f.id for f in a.findings if f.severity not in ("low", "info")}
    assert above_low == {"launch_bound", "memory_headroom"}
    sel = chosen("nanogpt.before.pt.trace.json.xz", ["launch_bound", "memory_headroom@4"])
    assert within(sel.what_if.speedup, *band("nanogpt", "all"))
    at4 = chosen("nanogpt.before.pt.trace.json.xz", ["memory_headroom@4"]).what_if
    assert within(at4.speedup, *band("nanogpt", "batch_4x"))
    measured_4x = [truth["configs"]["batch_4x"][p]["step_ms_window_mean"] for p in "AB"]
    big = 4 * at4.step_time_after_ns / 1e6
    assert 0.95 * min(measured_4x) < big < 1.05 * min(measured_4x), (big, measured_4x)
    # the after under CUDA graphs: the launches gone (info), its step estimated as measured,
    # and its GPU, 28% busy under the profiler, busy 6.08 ms of the 6.52 ms un-profiled step:
    # no gpu_underutilized (the profiler's own host cost starved it; HIGH before)
    after = analysis("nanogpt.compile_ro.after.pt.trace.json.xz")
    assert {f.id: f.severity for f in after.findings}.get("launch_bound") in (None, "info")
    assert "gpu_underutilized" not in {f.id for f in after.findings}
    assert after.results.idle.gpu_busy_ratio < 0.3
    est_after = after.results.replay.unprofiled_step_ns / 1e6
    ro = [truth["configs"]["compile_ro"][p]["step_ms_window_mean"] for p in "AB"]
    assert 0.9 * min(ro) < est_after < 1.1 * max(ro), (est_after, ro)


def test_nanogpts_own_default_the_compiled_loop() -> None:
    """nanoGPT as its config runs by default, ``compile=True`` (the same recording, session 31,
    P's profiled compile: record_shapes, stacks, memory), analyzed as the loop a user starts
    from. Measured from it, per process: reduce-overhead 1.95x (A) and 1.75x (B), the 4x batch
    per sample 2.12x and 1.83x (the recorded all: compile + 4x), so both are levers above 1.5x
    and both findings read HIGH (the batch the larger in the processes' mean, 1.98x against
    1.85x: within 10%, so either may come first).

    Compiled code recorded with its shapes: the estimate, 30.74 ms from a profiled 66.27 (40.27
    before inductor's launch Python was capped: the time before each of the 176 Triton launches
    a step outside any op, at most the eager launches' median), is the upper end; its low end
    14.64 (the profiler's cost per event at twice the no-work op's) lies between A/B's 12.77 and
    15.25 ms, and P's own 22.73 (after its first capture's CUPTI residue) inside the range.
    launch_bound's range (1.84-4.27x) starts at the measured 1.75-1.95x; memory_headroom's
    (2.32-4.00x) at the measured 1.83-2.12x (it missed by 1.5x from the uncapped estimate's
    range, 3.16-4.00x). The 4x step it replays is the estimated host again (host-bound at both
    sizes, so the gain is the multiplier), between the 4x step's 24.13 / 33.29 ms."""
    truth = json.loads((HERE / "nanogpt.truth.json").read_text())
    cfg = truth["configs"]
    step = {c: [cfg[c][p]["step_ms_window_mean"] for p in "AB"] for c in cfg}
    ro = [c / r for c, r in zip(step["compile"], step["compile_ro"], strict=True)]
    batch = [4 * c / a for c, a in zip(step["compile"], step["all"], strict=True)]
    assert min(ro) > 1.5 and min(batch) > 1.5 and 0.9 < sum(ro) / sum(batch) < 1.0
    a = analysis("nanogpt.compile.after.pt.trace.json.xz")
    r = a.results.replay
    assert r.compiled_launches_per_step == 176 and r.compiled_unprofiled_ratio is not None
    own = truth["profiled"]["compile"]["unprofiled_same_process_step_ms_window_mean"]
    low_ms, est_ms = r.unprofiled_step_low_ns / 1e6, r.unprofiled_step_ns / 1e6
    assert min(step["compile"]) < low_ms < max(step["compile"]) < own < est_ms, (low_ms, est_ms)
    by = {f.id: f for f in a.findings[:2]}
    assert set(by) == {"launch_bound", "memory_headroom"}
    assert all(f.severity == "high" for f in by.values())
    lb = by["launch_bound"].what_if
    assert within(lb.speedup_low, min(ro), max(ro)) and lb.speedup > max(ro), (lb, ro)
    mh = by["memory_headroom"].what_if
    assert mh.multiplier == 4 and within(mh.speedup_low, min(batch), max(batch)), (mh, batch)
    big_ms = 4 * mh.step_time_after_ns / 1e6
    assert big_ms == pytest.approx(est_ms, rel=0.01)
    assert min(step["all"]) < big_ms < max(step["all"])


def test_the_held_out_neural_style_loop() -> None:
    """pytorch/examples' fast neural style trained with its defaults (a TransformerNet against a
    frozen VGG16's features, batch 4 of 256 x 256 crops read by ImageFolder with no workers,
    fp32, two ``.item()`` reads a step), recorded before any analysis (session 32: A, P, B;
    then compile_ro and batch_2x in C, D). The step thread decodes every batch: 30-52 ms of
    each 64-87 ms profiled step in ``__next__``.

    As first analyzed, its three profiled steps (64.7, 63.9, 87.5 ms; the third's ToTensor ops
    10-30x slower, a one-off) read as a loader period: the estimate took their mean, 61.95 ms,
    and step_time_variance read MEDIUM. A loader in the step's own thread makes no period
    (analyzers/replay.py step_statistic) and one slow step cannot say it recurs (capped low):
    54.62 ms against 50.99 in its process (A/B 44.96-46.46). The first finding, dataloader_stall
    (HIGH, 2.19x), is the largest lever, workers measured 2.18-2.44x; the 4x batch priced though
    not raised 1.17x (1.28-1.38), the 2x 1.12x (1.15-1.16), bf16 0.98x (1.05-1.08), the syncs
    1.00x (1.02-1.12); the applied set 7.02x against all's 5.53-5.74x.

    launch_bound MEDIUM 1.13x against reduce-overhead on the trained network in four processes:
    1.00 (C), 0.35 (D, recompiling in its window), 1.05 (E), 1.16 (F); on both networks (the
    frozen VGG16 too: what the what-if captures) 0.95 (E) and 0.42 (F, its graphs still being
    recorded for 20 steps; 1.07 after). So the capture's scope is not what it misses: the step
    thread's host, slower in the model than un-profiled (the estimate 1.07 of its process's
    step, 1.18-1.21 of A/B's), leaves the compute phase host-bound in the replay where it runs
    about even with the GPU, so the graphs save 7.1 ms a step in the model and 2-3 measured
    (issue 37 item 2). The workers' after missed by the same: its un-profiled estimate was
    30.06 ms against 20.74 in its process (1.45), the backward() wait kept whole where the
    pin-memory thread called inside it; 26.33 (1.27) with it joined."""
    truth = json.loads((HERE / "neural_style.truth.json").read_text())
    a = analysis("neural_style.before.pt.trace.json.xz")
    r = a.results.replay
    assert a.results.steps.loader_iterator == "single_process" and r.step_statistic == "median"
    own = truth["profiled"]["baseline"]["unprofiled_same_process_step_ms_window_mean"]
    assert r.unprofiled_step_ns / 1e6 == pytest.approx(own, rel=0.10)
    steps = [s.dur_ns / 1e6 for s in a.results.steps.per_step]
    assert sorted(steps)[-1] > 1.3 * sorted(steps)[1]  # the one slow step
    by = {f.id: f for f in a.findings}
    sv = by["step_time_variance"]
    assert sv.severity == "low" and sv.evidence["single_slow_step"]
    assert sv.evidence["caused_by"] == "dataloader"
    dl = a.findings[0]
    assert dl.id == "dataloader_stall" and dl.severity == "high"
    assert (
        band("neural_style", "workers")[0] < dl.what_if.speedup < band("neural_style", "workers")[1]
    )
    for ids, fix in (
        (["memory_headroom@4"], "batch_4x"),
        (["memory_headroom@2"], "batch_2x"),
        (["fp32_compute"], "bf16"),
        (["host_sync"], "remove_syncs"),
        (["dataloader_stall", "host_sync", "fp32_compute", "memory_headroom@4"], "all"),
    ):
        w = chosen("neural_style.before.pt.trace.json.xz", ids).what_if
        assert within(w.speedup, *band("neural_style", fix)), (ids, w.speedup)
    lb = by["launch_bound"]
    lo, hi = band("neural_style", "compile_ro")
    assert lb.severity == "medium" and within(lb.what_if.speedup, lo, hi) and hi > 1.1
    after = analysis("neural_style.workers.after.pt.trace.json.xz")
    assert "dataloader_stall" not in {f.id for f in after.findings}
    after_own = truth["profiled"]["workers"]["unprofiled_same_process_step_ms_window_mean"]
    # session 38: the step thread's backward() wait joins the autograd thread's burst though
    # the pin-memory thread calls inside it (causal/build.py _joins): 30.06 -> 26.33 ms, 1.27
    # of its process's step, and the range's low end (the profiler's cost per event doubled)
    # 19.89 ms brackets it
    r = after.results.replay
    assert r.unprofiled_step_ns / 1e6 == pytest.approx(1.27 * after_own, rel=0.03)
    assert r.unprofiled_step_low_ns / 1e6 < after_own < r.unprofiled_step_ns / 1e6


def test_the_held_out_video_loop() -> None:
    """torchvision's R(2+1)D-18 the video_classification reference's way (session 34, held out:
    batch 24 of 16 x 112 x 112 clips, 10 workers, fp32, cudnn.benchmark): GPU-bound, 101.5 ms a
    step. Before session 34 fp32_compute came first, HIGH 2.08x, from "fp32 math" that was 63 ms
    of cuDNN's nchwToNhwc/nhwcToNchw layout transposes (3 steps); bf16 alone measured 1.23-1.26x,
    channels_last alone 1.45-1.47x. Now the transposes (21.7 ms a step) and cuDNN's NCHW batch
    norm (30.4 ms) raise channels_first_layers, first, 1.70x; fp32_compute prices the TF32 math
    alone, 1.58x (within 40%: a device-speed change). Both read back from the raw events."""
    a = analysis("video_r2p1d.before.pt.trace.json.xz")
    assert [f.id for f in a.findings[:2]] == ["channels_first_layers", "fp32_compute"]
    events = raw_events("video_r2p1d.before.pt.trace.json.xz")
    kernels = [e for e in events if e.get("cat") == "kernel"]
    layout = sum(e["dur"] for e in kernels if re.search(r"nchwToNhwc|nhwcToNchw", e["name"]))
    bn = sum(e["dur"] for e in kernels if re.search(r"cudnn::bn_(fw|bw)_\w*1C11", e["name"]))
    k = a.results.kernels
    assert k.layout_transpose_ns == pytest.approx(layout * 1e3, rel=1e-3)
    assert k.nchw_batch_norm_ns == pytest.approx(bn * 1e3, rel=1e-3)
    assert k.fp32_math_ns < 0.1 * layout * 1e3  # the transposes are no fp32 math
    cf = a.findings[0]
    assert cf.severity == "high" and within(
        cf.what_if.speedup, *band("video_r2p1d", "channels_last")
    )
    fp = a.findings[1]
    lo, hi = band("video_r2p1d", "bf16")
    assert hi < fp.what_if.speedup <= 1.40 * hi
    # both fixes at once: the selected set against bf16 + channels_last measured (C, D)
    both = chosen("video_r2p1d.before.pt.trace.json.xz", ["channels_first_layers", "fp32_compute"])
    assert within(both.what_if.speedup, *band("video_r2p1d", "bf16_channels_last")), both.what_if
    # the bf16 after keeps the transposes (17.8 ms a step): channels_last from there measured
    # 1.50-1.53x in C and D (bf16 -> bf16 + channels_last, each in its own process)
    cfg = json.loads((HERE / "video_r2p1d.truth.json").read_text())["configs"]
    ratios = [
        cfg["bf16"][p]["step_ms_window_mean"] / cfg["bf16_channels_last"][p]["step_ms_window_mean"]
        for p in "CD"
    ]
    after = finding("video_r2p1d", "channels_first_layers", "bf16.after")
    assert after.severity == "medium" and within(after.what_if.speedup, min(ratios), max(ratios))


def test_the_held_out_t5_loop() -> None:
    """The HF course's T5 custom loop (session 34, held out: batch 8 padded per batch by
    DataCollatorForSeq2Seq, fp32, no workers): host-bound, GPU 9.9% busy. memory_headroom comes
    first, 3.89x for a 4x batch against 3.32-4.61x per sample; no finding above low for the
    workers, the syncs or the fused optimizer (0.92-1.24). bf16 alone ran 3-4x SLOWER: cuDNN
    attention's backward set up for every new shape pair (74 ms each); in its profiled after
    new_shape_setup (3 of 3 steps) is medium, 2.84x, against fixed shapes (pad_to_multiple_of=64)
    2.84-3.71x and another attention backend 2.62-3.77x, each against bf16 in its own process."""
    a = analysis("t5_course.before.pt.trace.json.xz")
    assert a.findings[0].id == "memory_headroom" and a.findings[0].what_if.multiplier == 4
    f = finding("t5_course", "new_shape_setup", "bf16.after")
    assert (
        f.severity == "medium" and f.evidence["steps_with_new_shapes"] == f.evidence["steps"] == 3
    )
    cfg = json.loads((HERE / "t5_course.truth.json").read_text())["configs"]
    for fix in ("bf16_pad64", "bf16_no_cudnn_attn"):
        r = [
            cfg["bf16"][p]["step_ms_window_mean"] / cfg[fix][p]["step_ms_window_mean"] for p in "CD"
        ]
        assert within(f.what_if.speedup, min(r), max(r)), (fix, r)
    # the setup's host time explains the GPU's idle: gpu_underutilized low, not high (info
    # since the idle between launches is launch_bound's; none since session 38, where the other
    # findings leave under 1% of the idle unexplained)
    after = analysis("t5_course.bf16.after.pt.trace.json.xz")
    g = [f for f in after.findings if f.id == "gpu_underutilized"]
    assert all(f.severity in ("low", "info") for f in g)


def test_the_t5_loops_launch_bound_advice_measured():
    """launch_bound on the T5 loop (HIGH, 3.76x: pad first, then reduce-overhead), measured in
    session 35 (processes E, F and the profiled Q; compiling took 150 s): padded to multiples
    of 64 and under torch.compile mode reduce-overhead the step ran 18.35 (Q) and 22.21 ms (F,
    the new shape it captured inside the window dropped), the default mode 25.19 ms (E). The
    model's step after, 19.84 ms, lies between: right. The speedup's miss (2.15-2.60 against
    E's baseline, 47.67 ms) is the step it starts from: 74.57 ms estimated, 62.78 in the
    profiled process of session 34, 60.59-72.92 in its four processes: this call's host ran
    faster (item 2). In the profiled after launch_bound is low (the eager optimizer's
    launches), the estimate 18.57 ms against Q's 18.35."""
    lb = finding("t5_course", "launch_bound")
    assert lb.severity == "high"
    t = json.loads((HERE / "t5_course.truth.json").read_text())
    cfg, prof = t["configs"], t["profiled"]
    measured = [
        cfg["pad64_compile_ro"]["F"]["step_ms_window_mean"],
        prof["pad64_compile_ro"]["unprofiled_same_process_step_ms_window_mean"],
    ]
    after_ms = lb.what_if.step_time_after_ns / 1e6
    assert min(measured) * 0.9 <= after_ms <= max(measured) * 1.1, (after_ms, measured)
    # the speedup: the low end holds the band, the point does not (the baseline's miss)
    lo, hi = band("t5_course", "pad64_compile_ro")
    assert not within(lb.what_if.speedup, lo, 2.60) and lb.what_if.speedup > 2.60
    a = analysis("t5_course.pad64_compile_ro.after.pt.trace.json.xz")
    after = next(f for f in a.findings if f.id == "launch_bound")
    assert after.severity in ("low", "info") and after.what_if.speedup < 1.10
    own = prof["pad64_compile_ro"]["unprofiled_same_process_step_ms_window_mean"]
    assert abs(a.results.replay.unprofiled_step_ns / 1e6 / own - 1) <= 0.10


APPLIED_WHISPER = "dataloader_stall,recompute_overhead,host_sync,memory_headroom@2"


def test_the_held_out_whisper_loop():
    """The Fine-Tune Whisper blog's Seq2SeqTrainer loop (session 35, held out: whisper-small's
    shape, 16 utterances of 80 x 3000 log-mel features read back as Python lists and padded by
    the feature extractor in the main process, fp16, gradient checkpointing). Data-bound: the
    first finding, dataloader_stall, 2.71x for workers against 2.17-3.17 (the numpy rows, the
    stall's other fix, 1.71-2.87); activation checkpointing low (1.08 against 1.01-1.63: the
    GPU's work hides behind the loading), HIGH from the workers after (1.36x against
    1.25-2.10). The loader's waits summed from the raw events: the main-process iterator's
    __next__ ranges of the profiled steps."""
    a = analysis("whisper.before.pt.trace.json.xz")
    f = a.findings[0]
    assert f.id == "dataloader_stall" and f.severity == "high"
    events = raw_events("whisper.before.pt.trace.json.xz")
    nexts = [
        e
        for e in events
        if e.get("ph") == "X" and "_SingleProcessDataLoaderIter.__next__" in e.get("name", "")
    ]
    assert len(nexts) == 3
    wait_ms = sum(e["dur"] for e in nexts) / 1e3
    assert abs(f.evidence["idle_ns"] / 1e6 - wait_ms) <= 0.05 * wait_ms, (f.evidence, wait_ms)
    rc = next(f for f in a.findings if f.id == "recompute_overhead")
    assert rc.severity == "low"
    # the recorded all (workers, numpy rows, no checkpointing, no syncs, the 2x batch): 5.88x
    # against 3.08-6.43; the 2x batch priced as asked, not raised (the loading grows with it)
    sel = chosen("whisper.before.pt.trace.json.xz", APPLIED_WHISPER.split(","))
    assert within(sel.what_if.speedup, *band("whisper", "all")) and sel.what_if.multiplier == 2
    assert sel.priced_not_raised == ("memory_headroom@2",)
    # from the workers after, activation checkpointing reads HIGH (the step host-bound now, a
    # third of its forward recomputed): 1.36x against 1.25-2.10 measured from workers (call 4)
    r = finding("whisper", "recompute_overhead", "workers.after")
    assert r.severity == "high"
    assert within(r.what_if.speedup, *band("whisper", "workers_no_checkpointing_from_workers"))


def test_the_compiled_whisper_loops_syncs() -> None:
    """Whisper compiled with workers (session 39): host_sync MEDIUM on its profiled after
    (four tensor ifs a step, aten::is_nonzero) predicts 1.21x; removing them measured 1.03-1.13x
    against workers_pad_compile_ro in the same processes (G, H), the host medians 1.13-1.16x:
    within the tolerance, and the band's top is above 1.10 (no false alarm by the band)."""
    f = finding("whisper", "host_sync", "workers_pad_compile_ro.after")
    lo, hi = band("whisper", "workers_pad_compile_ro_nosync_from_workers_pad_compile_ro")
    assert (lo, hi) == pytest.approx((1.034, 1.125), abs=0.005)
    assert f.severity == "medium" and within(f.what_if.speedup, lo, hi)
    assert f.what_if.speedup / ((lo + hi) / 2) == pytest.approx(1.12, abs=0.02)


def test_host_work_between_launches_is_said_by_launch_bound_not_a_second_finding() -> None:
    """PEFT LoRA: of 37.01 ms of GPU idle with the host at longer work than dispatch
    (cpu_work), 36.77 ms lie between two launches of one step (the forward's Python, the
    optimizer's; audits 6, 7, 9). launch_bound's whole-step capture replays the step without
    it: its title says so, and gpu_underutilized no longer restates it as a HIGH of its own
    (it did before, with a larger batch for advice)."""
    a = analysis("peft_lora.before.pt.trace.json.xz")
    idle = a.results.idle
    assert idle.idle_by_cause_ns["cpu_work"] / 1e6 == pytest.approx(37.01, abs=0.01)
    assert idle.cpu_work_between_launches_ns / 1e6 == pytest.approx(36.77, abs=0.01)
    lb = next(f for f in a.findings if f.id == "launch_bound")
    assert "36.77 ms more while the host ran other work between them" in lb.title
    gu = [f for f in a.findings if f.id == "gpu_underutilized"]
    assert all(f.severity in ("low", "info") for f in gu)


def test_a_pageable_uploads_call_counts_whole_where_its_stream_was_idle() -> None:
    """Audit 11: PEFT LoRA's three pageable host-to-device copies (1.12 us each on the GPU)
    read "0.00 ms blocked": only the call's time after the copy began counted, the rule for a
    read-back's wait. Their cudaMemcpyAsync calls (31.03, 17.21 and 23.63 us from the raw
    events) stage the data on a stream with nothing queued: all of it is the copy's."""
    name = "peft_lora.before.pt.trace.json.xz"
    ev = raw_events(name)
    calls = {e["args"]["correlation"]: e for e in ev if e.get("cat") == "cuda_runtime"}
    ups = [
        calls[e["args"]["correlation"]]["dur"]
        for e in ev
        if e.get("cat") == "gpu_memcpy" and "HtoD" in e["name"] and "Pageable" in e["name"]
    ]
    f = finding("peft_lora", "pageable_memcpy")
    assert f.evidence["own_ns_by_kind"]["HtoD"] == pytest.approx(sum(ups) * 1e3, abs=3)
    assert "0.07 ms blocked" in f.title


@pytest.mark.parametrize("loop", ["whisper", "hf_trainer"])
def test_loader_advice_does_not_ask_for_pinning_pinned_batches(loop: str) -> None:
    """Audit 11: the Trainer loops (dataloader_pin_memory=True by default) were advised
    pin_memory=True; most of their host-to-device bytes come from pinned memory (raw events;
    Whisper's 15.36 MB batches pinned, a few small pageable copies beside them)."""
    ev = raw_events(f"{loop}.before.pt.trace.json.xz")
    up = [e for e in ev if e.get("cat") == "gpu_memcpy" and "HtoD" in e["name"]]
    pinned = sum(e["args"]["bytes"] for e in up if "Pinned ->" in e["name"])
    assert pinned > 0 and pinned >= sum(
        e["args"]["bytes"] for e in up if "Pageable ->" in e["name"]
    )
    f = finding(loop, "dataloader_stall")
    assert "pin_memory=True" not in f.recommendation
    assert "already arrive pinned" in f.recommendation


def test_a_one_block_kernel_is_serial_by_design() -> None:
    """Audit 11: torchvision's NMS mask gather runs one block of 64 threads (grid [1, 1, 1] in
    the raw events), 17.6% of detection's kernel time: its title said "at 0.0% limited by
    grid" (cut mid-signature), where the lever is less serial work, not occupancy."""
    ks = [
        e
        for e in raw_events("detection_fixed.before.pt.trace.json.xz")
        if e.get("cat") == "kernel" and "gather_keep_from_mask" in e["name"]
    ]
    assert ks and all(e["args"]["grid"] == [1, 1, 1] for e in ks)
    f = finding("detection_fixed", "low_occupancy")
    assert (
        "the largest, gather_keep_from_mask, at <0.1%, a single block: serial by design" in f.title
    )
    # and the advice is not a larger grid (audit 13)
    assert f.recommendation.startswith("The largest such kernel runs a single block")


def test_a_one_block_kernel_of_a_cuda_application_may_be_data_parallel() -> None:
    """Audit s58: a public A100 export's vector add over 2^29 floats launched add<<<1, 256>>>
    by mistake, 1.06 s a launch (its bytes take ~4 ms at the memory's rate), read "a single
    block: serial by design" with advice to filter boxes. A CUDA application's author picks
    the grid: the same one-block kernel is said to run on one SM and advised a grid that covers
    the data, serial work named as the other case; a PyTorch program's stays serial (above)."""
    from traceinsight.findings.efficiency_rules import low_occupancy
    from traceinsight.findings.model import Thresholds
    from traceinsight.findings.rules import RULES, RuleInput

    a = analysis("detection_fixed.before.pt.trace.json.xz")
    top = a.results.efficiency.occupancy.low_kernels[0]
    assert top.grid_blocks == 1 and top.block_threads == 64
    t, window = Thresholds.defaults(RULES), a.results.idle.device_window_ns
    d = low_occupancy(RuleInput(a.results, t, window, (), "cuda_app"))
    per = top.time_ns / top.count / 1e6
    assert f"a single block of 64 threads ({per:.2f} ms a launch): all of it on one SM" in d.title
    app = d.advice["cuda_app"]
    assert "launch enough blocks to cover the data" in app.recommendation
    assert "serial by design" in app.recommendation
    assert "(n + threads - 1) / threads" in app.snippet
    assert "serial by design" in low_occupancy(RuleInput(a.results, t, window, ())).title


def test_an_optimizer_steps_closure_is_a_region_of_its_own() -> None:
    """Audit 11: Lightning runs forward and backward inside optimizer.step(closure); the
    regions line read "the idle is in Optimizer.step#AdamW.step: 25.72 ms per step" where
    3.8-4.7 ms of each 28-29 ms range came after its last backward op. The closure is a region
    inside it, from the range's start to the end of the last autograd op started inside it (the
    raw events), and holds most of the range's idle."""
    ev = raw_events("lightning.before.pt.trace.json.xz")
    opt = [
        e
        for e in ev
        if e.get("cat") == "user_annotation" and e["name"].startswith("Optimizer.step#")
    ]
    bw = [e for e in ev if e["name"].startswith("autograd::engine::evaluate_function")]
    spans = []
    for o in opt:
        inside = [b["ts"] + b["dur"] for b in bw if o["ts"] <= b["ts"] < o["ts"] + o["dur"]]
        spans.append(max(inside) - o["ts"])
    a = analysis("lightning.before.pt.trace.json.xz")
    regions = {r["path"]: r for r in a.results.regions.regions}
    closure = regions["Optimizer.step#AdamW.step/closure (forward and backward)"]
    whole = regions["Optimizer.step#AdamW.step"]
    assert closure["count"] == len(opt) == 3
    assert closure["host_ns"] == pytest.approx(sum(spans) * 1e3, abs=3 * 1e3)
    assert closure["idle_ns"] > 0.8 * whole["idle_ns"]
    from traceinsight.report.terminal import render

    assert "the idle is in Optimizer.step#AdamW.step/closure (forward and backward)" in render(
        a.to_json()
    )


def test_new_shape_setup_names_each_op_holding_its_share() -> None:
    """Audit 11: wav2vec2's "aten::convolution_backward took 2.48 ms on 23 first calls ...
    27.9% of the window" was convolution_backward's and cudnn_convolution's excess together
    (50.3 and 48.8 ms): each op holding a quarter of it is named."""
    f = finding("wav2vec2", "new_shape_setup")
    ops = f.evidence["ops"]
    held = [o for o in ops if o.excess_ns >= 0.25 * f.evidence["excess_ns"]]
    assert [o.name for o in held] == ["aten::convolution_backward", "aten::cudnn_convolution"]
    assert sum(o.excess_ns for o in ops) == f.evidence["excess_ns"]
    # a call's time said as such, each op's total beside it (audit 15: "2.48 ms on 23 first
    # calls" read as the total of 57.07 ms)
    assert (
        "convolution_backward took 2.48 ms a call on 23 first calls with a new shape (57.07 ms)"
        in f.title
    )
    assert (
        "; aten::cudnn_convolution 2.44 ms a call on 21 first calls (51.26 ms); setup beyond the "
        "usual calls: 27.9% of the window" in f.title
    )


def test_a_larger_batch_among_the_chosen_fixes_says_its_own_step() -> None:
    """Audit 12: "--what-if small_batch@4,..." printed "un-profiled step 41.77 ms -> 9.36 ms",
    the time per original batch's samples read as the step (a 4x batch's own step is ~37 ms);
    the selection's JSON dropped the multiplier all_fixes keeps."""
    from traceinsight.report.format import saving_text as _saving

    sel = chosen(
        "hf_trainer.before.pt.trace.json.xz",
        ["small_batch@4", "fp32_compute", "host_sync", "dataloader_stall"],
    ).to_json()
    assert sel["multiplier"] == 4
    per_batch = sel["batch_step_time_after_ns"] / 4
    assert sel["step_time_after_ns"] == pytest.approx(per_batch, abs=1)
    words = _saving(sel)
    assert f"at a 4x batch, {sel['step_time_after_ns'] / 1e6:.2f} ms per original batch" in words


def test_pinned_copies_at_the_devices_host_link() -> None:
    """Audit 14: the pinned-copy what-ifs ran every GPU's uploads at the H200 host's 50 GB/s
    (an A100 copy benchmark's 154 MB pageable copies priced 9.55x, where PCIe 4.0 moves about
    25 GB/s). The rate is the trace's own pinned uploads' where it has some, else the device's
    host link (data/devices.toml, by PCIe generation), else PCIe 4.0's: EfficientNet's
    pageable batches (no pinned upload of its own) at the H200's 50 GB/s, and as an A100's."""
    from dataclasses import replace

    from traceinsight.analyzers.context import build_context
    from traceinsight.analyzers.replay import model_inputs
    from traceinsight.causal import transforms
    from traceinsight.causal.build import PINNED_RATE_DEFAULT_BYTES_PER_NS, build_model
    from traceinsight.model.devices import lookup
    from traceinsight.parsers import load_trace

    assert lookup("NVIDIA H200", 150_000_000_000).host_link_bytes_per_s == 50e9
    assert lookup("NVIDIA A100-SXM4-80GB", 85_000_000_000).host_link_bytes_per_s == 25e9
    assert lookup("Tesla V100-SXM2-16GB", 17_000_000_000).host_link_bytes_per_s == 12e9
    ctx = build_context(
        load_trace(HERE / "efficientnet.before.pt.trace.json.xz"), Options().step_pattern, 1
    )
    src = model_inputs(ctx)
    assert src is not None and dict(src.host_links) == {0: 50e9}
    pageable = (pl.col("kind") == "memcpy") & (pl.col("src_kind") == "pageable")
    for links, rate in (
        ({0: 50e9}, 50.0),
        ({0: 25e9}, 25.0),
        ({}, PINNED_RATE_DEFAULT_BYTES_PER_NS),
    ):
        m = build_model(replace(src, host_links=links))
        assert (m.gpu.filter(pageable)["pinned_bytes_per_ns"] == rate).all()
        after = transforms.pinned_copies(m).gpu.filter(pageable)
        before = m.gpu.filter(pageable)
        want = (before["bytes"] / rate).cast(pl.Int64) + 1_000
        expected = pl.DataFrame({"d": before["dur_ns"], "w": want}).select(
            pl.min_horizontal("d", "w")
        )
        assert after["dur_ns"].to_list() == expected.to_series().to_list()


def test_compiled_code_is_not_told_to_compile():
    """Audit 19: a compiled nanoGPT (half its kernels Inductor's triton_*) was told
    "model = torch.compile(model)" by gpu_underutilized and low_occupancy. Compiled code gets
    reduce-overhead (CUDA graphs) for the idle and max-autotune for Inductor's own
    low-occupancy kernels; an eager loop keeps the plain advice. (Since session 56 the
    compiled nanoGPT's idle is explained: its model's Python before each step's first kernel is
    launch_bound's; the compiled ViT still raises gpu_underutilized.)"""
    a = analysis("nanogpt.compile.after.pt.trace.json.xz")
    assert a.results.kernels.compiled_kernel_ratio >= 0.2
    by_id = {f.id: f for f in a.findings}
    assert "torch.compile(model)" not in (by_id["low_occupancy"].snippet or "")
    assert "max-autotune" in by_id["low_occupancy"].recommendation
    vit = analysis("vit_amp.compile.after.pt.trace.json.xz")
    assert vit.results.kernels.compiled_kernel_ratio >= 0.2
    under = next(f for f in vit.findings if f.id == "gpu_underutilized")
    assert "torch.compile(model)" not in (under.snippet or "")
    assert 'mode="reduce-overhead"' in under.snippet
    eager = analysis("nanogpt.before.pt.trace.json.xz")
    assert eager.results.kernels.compiled_kernel_ratio == 0


def test_launch_gaps_the_unprofiled_step_does_not_have_say_so():
    """Audit 20: a GH200 loop's launch_bound said the CPU starves the GPU beside a header that
    said the kernels bound the step (host 2x faster: 1.00x). nanoGPT under reduce-overhead is
    the same: its profiled launch gaps are the profiler's, and the title says what a graph
    saves there. Where the host moves the step (sync_item_print's loop), no such words."""
    a = analysis("nanogpt.compile_ro.after.pt.trace.json.xz")
    rp = a.results.replay
    assert rp.step_bound_by == "kernels" and rp.engine_speedups["host"] < 1.02
    f = next(f for f in a.findings if f.id == "launch_bound")
    assert f.title.endswith(
        "without the profiler the kernels bound the step: a graph saves the gaps between them, not host time)"
    )
    other = traceinsight.analyze(H200 / "sync_item_print.pt.trace.json.xz")
    g = next(f for f in other.findings if f.id == "launch_bound")
    assert other.results.replay.engine_speedups["host"] >= 1.02
    assert "without the profiler" not in g.title


def test_workers_that_bound_the_recorded_steps_set_the_unprofiled_one() -> None:
    """timm with 3 workers waits for them in the recorded steps: the un-profiled step is the
    interval they delivered at, the raw ProfilerStep ranges' mean (73.71, 70.96 and 151.25 ms:
    98.64), not that less the profiler's cost (71.4); measured 96.06 in its process. Where the
    workers kept up (12 of them, the after) or the step thread loads (gnn), there is none."""
    steps = [
        e["dur"]
        for e in raw_events("timm_jpeg.before.pt.trace.json.xz")
        if e.get("ph") == "X"
        and e["name"].startswith("ProfilerStep#")
        and e.get("cat") != "gpu_user_annotation"
    ]
    a = analysis("timm_jpeg.before.pt.trace.json.xz")
    r = a.results.replay
    assert len(steps) == 3 and r.step_statistic == "mean"
    assert r.loader_interval_ns == pytest.approx(1000 * sum(steps) / 3, rel=0.005)
    assert r.unprofiled_step_ns == r.loader_interval_ns
    own = json.loads((HERE / "timm_jpeg.truth.json").read_text())["profiled"]["baseline"]
    assert r.unprofiled_step_ns / 1e6 == pytest.approx(
        own["unprofiled_same_process_step_ms_window_mean"], rel=0.05
    )
    assert "the interval the DataLoader's workers delivered batches at" in prediction_basis(
        a.to_json()
    )
    for name in ("timm_jpeg.workers.after.pt.trace.json.xz", "gnn.before.pt.trace.json.xz"):
        assert analysis(name).results.replay.loader_interval_ns is None


def test_stacks_without_module_frames_are_not_told_to_record_stacks():
    """A trace recorded with Python stacks whose work is not called through torch.nn modules
    (word_lm's CUDA-graph after: the graph's replay, no nn.Module frame) prices every op as
    captured and says why, without advising with_stack=True, which it already used (session
    56's audit: a T4 script of hand-written kernels)."""
    a = analysis("word_lm.cudagraph.after.pt.trace.json.xz")
    assert a.results.sources.stacks_recorded
    f = next(f for f in a.findings if f.id == "launch_bound")
    assert "Python stacks hold no nn.Module frame" in f.evidence["captured"]
    assert "with_stack" not in f.evidence["captured"]
