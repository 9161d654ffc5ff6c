"""Predicted vs measured speedups on the third-party loops recorded on the H200
(fixtures/h200/thirdparty) and on the H100 (fixtures/h100/thirdparty: RAFT, the H200s not lent),
by fixtures/generate/thirdparty: for each loop, every finding with a
prediction, the fix it maps to in the recording (FIX_OF) and its measured band (processes A
and B, per sample), their ratio, and the un-profiled step the model starts from against the
measured one. Prints a Markdown table (benchmarks/RESULTS.md)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import traceinsight

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
# where the recordings lie, by device: a loop's truth and traces are in one of them
DIRS = (FIXTURES / "h200" / "thirdparty", FIXTURES / "h100" / "thirdparty")


def here(loop: str) -> Path:
    """The directory holding the loop's truth (the H200's first)."""
    return next((d for d in DIRS if (d / f"{loop}.truth.json").exists()), DIRS[0])


# finding id -> the recorded fix that applies its advice, per loop
FIX_OF = {
    "host_sync": "remove_syncs",
    "sync_input_copy": "non_blocking",
    "pageable_memcpy": "pin_nonblocking",
    "dataloader_stall": "workers",
    "launch_bound": "cudagraph",
    "unfused_optimizer": "fused_optimizer",
    "fp32_compute": "bf16",
    "recompute_overhead": "no_checkpointing",
    "memory_headroom": "batch_4x",
    "small_batch": "batch_4x",
    "inference_train_mode": "eval",
    "inference_autocast_casts": "cast_once",
}


# the recorded "all" of each loop as the findings whose fixes it applied (ID@K: the batch
# multiplier recorded)
APPLIED = {
    "hf_trainer": ["host_sync,dataloader_stall,fp32_compute,small_batch@4"],
    "timm_jpeg": ["dataloader_stall,pageable_memcpy,fp32_compute,host_sync"],
    # the recorded "all" captured the whole step: the finding's whole-step fix
    "launch_bound": ["launch_bound@whole_step,unfused_optimizer,host_sync"],
    "peft_lora": ["memory_headroom@4,recompute_overhead,host_sync"],
    "lightning": ["memory_headroom@4,launch_bound,fp32_compute,unfused_optimizer"],
    "sbert": ["dataloader_stall,fp32_compute,host_sync,pageable_memcpy,memory_headroom@4"],
    # the 2x batch is not raised there (saturation 1.41): priced as asked
    "vit_amp": ["unfused_optimizer,host_sync,pageable_memcpy,memory_headroom@2"],
    # the recorded "all" held 8 workers too: their fix has no replay (the workers' rate)
    "dcgan": ["host_sync,pageable_memcpy,memory_headroom@4,unfused_optimizer"],
    "word_lm": ["host_sync,memory_headroom@4,fp32_compute"],
    # the recorded "all" compiled in the default mode with the 4x batch
    "nanogpt": ["launch_bound,memory_headroom@4"],
    # the 4x batch priced though not raised
    "neural_style": ["dataloader_stall,host_sync,fp32_compute,memory_headroom@4"],
    # the numpy rows and the workers: one stall's two fixes; the 2x batch priced, not raised
    "whisper": ["dataloader_stall,recompute_overhead,host_sync,memory_headroom@2"],
    # session 64: model.eval() and the one-time cast; the Trainer's bf16_full_eval and 4x batch
    "infer_lm": ["inference_train_mode,inference_autocast_casts"],
    "infer_resnet": ["inference_train_mode,inference_autocast_casts"],
    "eval_glue": ["inference_autocast_casts,small_batch@4"],
    # the H100 (fixtures/h100): workers (14, non_blocking: the pinned copies' fix; no loader
    # finding), remove_syncs, bf16, the 2x batch, fused AdamW
    "raft": ["small_batch@2,host_sync,fp32_compute,unfused_optimizer,pageable_memcpy"],
    # the H100: the recorded "all" held 8 workers too, whose fix has no replay (their rate)
    "metrics": ["host_sync,fp32_compute,memory_headroom@4"],
    # the H100: the recorded "all" held TF32, which has no finding there (fp32_compute info)
    "e3nn": ["memory_headroom@4,host_sync,dataloader_stall"],
    # the H100, session 57: print every 50 steps, bf16 weights, default compile, 4x batch
    "moe_lm": ["host_sync,grouped_mm_fallback,fp32_compute,launch_bound,small_batch@4"],
    # the H100, session 58: accuracy every 100 steps, 4 pinned workers, 4x batch, dense
    # embeddings with fused SGD, default compile
    "dlrm": ["host_sync,dataloader_stall,small_batch@4,unfused_optimizer,launch_bound"],
    # the H100, session 61 (held out): 8 workers, bf16, the 2x batch (not raised: asked for)
    "clip": ["dataloader_stall,fp32_compute,small_batch@2"],
    # the H100, session 61 (held out): 8 workers, bf16, the 4x batch, channels_last and the
    # default compile (not launch_bound's priced fix, CUDA graphs: left out)
    "ddpm": ["dataloader_stall,fp32_compute,memory_headroom@4,channels_first_layers"],
    # the H100, session 62 (held out): workers and the batch-indexed Dataset (the loading
    # hidden), the 4x batch (not raised), bf16, logging every 50 steps, the default compile
    "tabular": ["dataloader_stall@hidden,memory_headroom@4,fp32_compute,host_sync"],
    # the H100, session 63 (held out): bf16 with tf32, the 2x batch (raised only as a what-if),
    # 4 workers; dynamic padding, the fifth, has no finding (padding is not in the trace)
    "deberta": ["fp32_compute,memory_headroom@2,dataloader_stall"],
    # the H100, session 65 (held out): SDPA, the default compile (the fusion), fused AdamW
    "gpt2_eager": ["attention_unfused,elementwise_heavy,unfused_optimizer"],
    # the H100, session 66 (held out): the same three fixes on a Llama (RMSNorm, rotary, SiLU)
    "llama_eager": ["attention_unfused,elementwise_heavy,unfused_optimizer"],
}
# the loops whose recorded workers kept pin_memory=False: their band is the unpinned variant's
UNPINNED_WORKERS = ("gnn", "timm_jpeg", "sbert", "wav2vec2")
# the loops whose recorded fixes carry their own names: finding id -> fix
FIX_NAMES = {
    "vit_amp": {
        "launch_bound": "compile",
        "pageable_memcpy": "pin_memory",
        "unfused_optimizer": "fused_adamw",
        "memory_headroom": "batch_2x",
    },
    "dcgan": {
        "launch_bound": "compile",
        "pageable_memcpy": "pin",
        "unfused_optimizer": "fused",
        "dataloader_stall": "workers_8",
    },
    "word_lm": {"launch_bound": "cudagraph"},
    "metrics": {"dataloader_stall": "workers_8", "launch_bound": "compile"},
    # the H100, session 57: bf16 weights are the fp32 fix recorded; launch_bound's advice
    # (fixed shapes, reduce-overhead) was not recorded (the default compile was: no band)
    "moe_lm": {"fp32_compute": "bf16_weights", "grouped_mm_fallback": "bf16_weights"},
    # the H100, session 58: dense embeddings with fused SGD for the optimizer's kernels; the
    # default compile for launch_bound (its advice, fixed shapes then reduce-overhead, was not
    # recorded: the index lists change length every batch)
    # and 2 pinned workers (processes C and D), the loader's stated assumption (twice as fast)
    "dlrm": {
        "unfused_optimizer": "dense_fused",
        "launch_bound": "compile",
        "dataloader_stall": "workers_2",
    },
    # the H100, session 61: the 2x batch is not raised (its row comes from APPLIED's ask)
    "clip": {"dataloader_stall": "workers", "fp32_compute": "bf16"},
    # the H100, session 61: launch_bound's advice (reduce-overhead) was not recorded; the
    # default compile was (0.75-0.91x), which it does not price
    # session 62: reduce-overhead recorded (processes E and F): 0.90-1.14x
    "ddpm": {
        "channels_first_layers": "channels_last",
        "memory_headroom": "batch_4x",
        "launch_bound": "compile_ro",
    },
    # the H100, session 62: 8 pinned workers (the loader's fix at its stated assumption); the
    # default compile for launch_bound (not its priced fix); logging every 50 steps for the syncs
    "tabular": {"launch_bound": "compile", "host_sync": "log_every_50"},
    # the H100, session 63: the Trainer's torch_compile=True (default mode; it also turns TF32
    # on), not launch_bound's priced fix (CUDA graphs)
    "deberta": {
        "fp32_compute": "bf16",
        "memory_headroom": "batch_2x",
        "dataloader_stall": "workers",
        "launch_bound": "compile",
    },
    # the H100, session 65: attn_implementation="sdpa" for the eager attention; the default
    # torch.compile for the elementwise chains (it also padded the vocabulary's GEMMs)
    "gpt2_eager": {
        "attention_unfused": "sdpa",
        "elementwise_heavy": "compile",
        "unfused_optimizer": "fused_adamw",
        "memory_headroom": "batch_2x",
        "small_batch": "batch_2x",
    },
    # the H100, session 66: the same fixes on transformers' Llama (no batch recorded)
    "llama_eager": {
        "attention_unfused": "sdpa",
        "elementwise_heavy": "compile",
        "unfused_optimizer": "fused_adamw",
    },
    # the Trainer's evaluation (session 64): bf16_full_eval casts the model once
    "eval_glue": {
        "inference_autocast_casts": "full_eval",
        "small_batch": "batch_4x",
        "memory_headroom": "batch_4x",
    },
    # the H100: TF32 is the fp32 fix recorded (compile failed in inductor: no launch_bound band)
    "e3nn": {"dataloader_stall": "workers_4", "fp32_compute": "tf32"},
    # reduce-overhead, its advice; the 2x batch it recommends was not recorded: the 4x was
    "nanogpt": {"launch_bound": "compile_ro", "memory_headroom": "batch_4x"},
    "neural_style": {"launch_bound": "compile_ro"},
    # launch_bound's advice: fixed shapes first, then reduce-overhead (session 35)
    "t5_course": {"launch_bound": "pad64_compile_ro"},
    "video_r2p1d": {
        "channels_first_layers": "channels_last",
        "dataloader_stall": "workers_14",
        "memory_headroom": "batch_2x",
    },
    # launch_bound's advice: labels padded to a fixed length, then reduce-overhead (session 38)
    "whisper": {"memory_headroom": "batch_2x", "launch_bound": "pad_compile_ro"},
    # the H100 (fixtures/h100/thirdparty): compile has no band (its processes' baselines ran
    # slowed: the truth's not_recorded), so launch_bound's row says "not measured"
    "raft": {
        "unfused_optimizer": "fused_adamw",
        "launch_bound": "compile_ro",  # its advice: reduce-overhead (CUDA graphs), measured 2.75-2.90x
        "memory_headroom": "batch_2x",
        "small_batch": "batch_2x",
        "dataloader_stall": "workers",
        "sync_input_copy": "workers",
        "pageable_memcpy": "workers",
        "h2d_not_overlapped": "workers",  # the workers fix copies with non_blocking=True
        "host_sync": "remove_syncs",
        "fp32_compute": "bf16",
    },
}


def rows(loop: str) -> list[dict]:
    src = here(loop)
    truth = json.loads((src / f"{loop}.truth.json").read_text())
    a = traceinsight.analyze(src / f"{loop}.before.pt.trace.json.xz")
    band = truth["speedup_band"]
    base = truth["configs"]["baseline"]
    ms = [v["step_ms_window_mean"] for v in base.values() if "step_ms_window_mean" in v]
    measured_step = sum(ms) / len(ms)
    out = []
    for f in a.findings:
        fix = FIX_NAMES.get(loop, {}).get(f.id) or FIX_OF.get(f.id)
        if f.id == "fp32_compute" and loop == "timm_jpeg":
            fix = "bf16_channels_last"
        if f.id == "dataloader_stall" and loop == "hf_trainer":
            fix = "workers"
        if f.id == "launch_bound" and loop == "lightning":
            fix = "compile"  # default torch.compile: what the recording applied
        if f.id == "launch_bound" and loop in ("hf_trainer", "accelerate", "launch_bound"):
            fix = "compile_ro"  # torch.compile mode reduce-overhead (calls 5 and 13)
        if f.id == "memory_headroom" and loop == "sbert":
            fix = "batch_2x"  # the multiplier it recommends, measured (call 19)
        if f.id == "launch_bound" and loop == "sbert":
            fix = "compile_ro_static"  # compile_ro crashed (varying shapes): padded first
        if fix not in band:
            fix = next((k for k in band if k.startswith(fix or "-")), fix)
        mult = f.what_if.multiplier if f.what_if else None
        if mult and fix in band and fix.startswith("batch_") and fix != f"batch_{mult}x":
            # a batch recorded at another multiplier than the finding recommends: the finding
            # against its own (where recorded), and its fix priced at the recorded one
            # (--what-if ID@K) against that, like with like
            k = int(fix.removeprefix("batch_").removesuffix("x"))
            at_k = traceinsight.analyze(
                src / f"{loop}.before.pt.trace.json.xz", what_if=[f"{f.id}@{k}"]
            ).selected.what_if
            m = band[fix]
            out.append(
                {
                    "loop": loop,
                    "finding": f"{f.id}@{k}",
                    "severity": "",
                    "predicted": at_k.speedup if at_k else None,
                    "fix": fix,
                    "measured": (m["low"], m["high"]),
                    "unprofiled_ms": at_k.step_time_ns / 1e6 if at_k else None,
                    "measured_ms": measured_step,
                }
            )
            fix = f"batch_{mult}x"
        m = band.get(fix)
        m = (m["low"], m["high"]) if m else None
        if mult and fix == f"batch_{mult}x":
            # every other batch multiplier recorded (RAFT's 4x beside its 2x, session 43):
            # the finding's fix priced there (--what-if ID@K), like with like
            for k in sorted(int(x[6:-1]) for x in band if re.fullmatch(r"batch_\d+x", x)):
                if k == mult:
                    continue
                at_k = traceinsight.analyze(
                    src / f"{loop}.before.pt.trace.json.xz", what_if=[f"{f.id}@{k}"]
                ).selected.what_if
                mk = band[f"batch_{k}x"]
                out.append(
                    {
                        "loop": loop,
                        "finding": f"{f.id}@{k}",
                        "severity": "",
                        "predicted": at_k.speedup if at_k else None,
                        "fix": f"batch_{k}x",
                        "measured": (mk["low"], mk["high"]),
                        "unprofiled_ms": at_k.step_time_ns / 1e6 if at_k else None,
                        "measured_ms": measured_step,
                    }
                )
        out.append(
            {
                "loop": loop,
                "finding": f.id,
                "severity": f.severity,
                "predicted": f.what_if.speedup if f.what_if else None,
                "fix": fix if m else None,
                "measured": m,
                "unprofiled_ms": f.what_if.step_time_ns / 1e6 if f.what_if else None,
                "measured_ms": measured_step,
            }
        )
    stall = next((f for f in a.findings if f.id == "dataloader_stall"), None)
    unpinned = stall.evidence.get("what_if_unpinned") if stall is not None else None
    if loop in UNPINNED_WORKERS and unpinned is not None and "workers" in band:
        out.append(
            {
                "loop": loop,
                "finding": "dataloader_stall@unpinned",
                "severity": "",
                "predicted": unpinned.speedup,
                "fix": "workers",
                "measured": (band["workers"]["low"], band["workers"]["high"]),
                "unprofiled_ms": unpinned.step_time_ns / 1e6,
                "measured_ms": measured_step,
            }
        )
    all_fixes = a.what_if
    out.append(
        {
            "loop": loop,
            "finding": "all_fixes",
            "severity": "",
            "predicted": all_fixes.speedup if all_fixes else None,
            "fix": "all",
            "measured": (band["all"]["low"], band["all"]["high"]) if "all" in band else None,
            "unprofiled_ms": all_fixes.step_time_ns / 1e6 if all_fixes else None,
            "measured_ms": measured_step,
        }
    )
    return out


def main() -> None:
    loops = sys.argv[1:] or [
        "hf_trainer",
        "timm_jpeg",
        "launch_bound",
        "peft_lora",
        "lightning",
        "accelerate",
        "sbert",
        "vit_amp",
        "wav2vec2",
        "gnn",
        "dcgan",
        "word_lm",
        "nanogpt",
        "neural_style",
        "t5_course",
        "video_r2p1d",
        "whisper",
        "raft",  # the H100
        "metrics",  # the H100, session 44
        "moe_lm",  # the H100, session 57
        "dlrm",  # the H100, session 58
        "clip",  # the H100, session 61
        "ddpm",  # the H100, session 61
        "tabular",  # the H100, session 62
        "deberta",  # the H100, session 63
        "infer_lm",  # the H100, session 64: inference loops
        "infer_resnet",
        "eval_glue",
        "gpt2_eager",  # the H100, session 65: eager attention, GPU-bound
        "llama_eager",  # the H100, session 66: eager attention, GPU-bound
    ]
    print("| loop | finding | severity | predicted | measured fix | measured band | ratio |")
    print("|---|---|---|---|---|---|---|")
    for loop in loops:
        for r in rows(loop):
            m = r["measured"]
            band = f"{m[0]:.2f}-{m[1]:.2f}" if m else "not measured"
            p = r["predicted"]
            mid = (m[0] + m[1]) / 2 if m else None
            ratio = f"{p / mid:.2f}" if p and mid else ""
            print(
                f"| {loop} | {r['finding']} | {r['severity']} | {p:.2f} | {r['fix'] or '-'} | {band} | {ratio} |"
                if p
                else f"| {loop} | {r['finding']} | {r['severity']} | - | {r['fix'] or '-'} | {band} | |"
            )
        src = here(loop)
        for ids in APPLIED.get(loop, ()):
            a = traceinsight.analyze(
                src / f"{loop}.before.pt.trace.json.xz", what_if=ids.split(",")
            )
            w = a.selected.what_if
            b = json.loads((src / f"{loop}.truth.json").read_text())["speedup_band"].get("all")
            band = f"{b['low']:.2f}-{b['high']:.2f}" if b else "not measured"
            ratio = f"{w.speedup / ((b['low'] + b['high']) / 2):.2f}" if b and w else ""
            print(f"| {loop} | --what-if {ids} | | {w.speedup:.2f} | all | {band} | {ratio} |")
        first = rows(loop)[0]
        print(
            f"<!-- {loop}: model's un-profiled step {first['unprofiled_ms']} ms, measured {first['measured_ms']:.2f} ms -->"
        )


if __name__ == "__main__":
    main()
