"""Channels-last pricing data (session 38, 2026-12-05; the figures behind causal/build.py NHWC_BATCH_NORM_BANDWIDTH_RATIO): BatchNorm2d/3d and the R(2+1)D-18 Conv3d
layers in NCHW vs channels_last(_3d), fp32 and bf16 (input bf16 under autocast, as a bf16 conv
hands it on; parameters fp32), training mode, forward and backward timed apart with CUDA events
(L2 flushed before each timed region; warm-up, then the median of REPS), plus one small
torch.profiler trace (record_shapes) per (kind, layout, dtype) with every shape in it, each
region labelled, for kernel names and times.

    python benchmarks/nhwc_bandwidth.py --out $OUT/nhwc      (TINY=1 or no CUDA: smoke)

Writes OUT/nhwc_bench.json and OUT/nhwc_traces.tar (gzipped Kineto traces).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import tarfile
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

CUDA = torch.cuda.is_available()
TINY = not CUDA or os.environ.get("TINY") == "1"
DEV = "cuda" if CUDA else "cpu"
PEAK_BW = 4800e9  # traceinsight/data/devices.toml H200-SXM memory_bandwidth_gb_s
BN2D = [
    (64, 64, 112, 112),
    (64, 256, 56, 56),
    (64, 512, 28, 28),
    (64, 1024, 14, 14),
    (64, 2048, 7, 7),
    (128, 32, 112, 112),
    (128, 96, 56, 56),
    (128, 144, 56, 56),
    (128, 192, 28, 28),
    (128, 384, 14, 14),
    (128, 960, 7, 7),
]
VIDEO_INPUT = (24, 3, 16, 112, 112)  # loop_video_r2p1d.py: batch 24, 16 frames, 112 crops
WARM, REPS = (1, 3) if TINY else (3, 25)
PROF_REPS = 1 if TINY else 3


def elem(dt: torch.dtype) -> int:
    return torch.empty((), dtype=dt).element_size()


class Timer:
    def __init__(self) -> None:
        self.flush = torch.empty(
            (8 << 20) if TINY else (512 << 20), dtype=torch.uint8, device=DEV
        )

    def do_flush(self) -> None:
        self.flush.fill_(1)

    def mark(self):
        if CUDA:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return time.perf_counter()

    @staticmethod
    def ms(a, b) -> float:
        if CUDA:
            return a.elapsed_time(b)
        return (b - a) * 1e3


def sync() -> None:
    if CUDA:
        torch.cuda.synchronize()


def fmt(cl: bool, nd: int):
    if not cl:
        return torch.contiguous_format
    return torch.channels_last if nd == 4 else torch.channels_last_3d


def video_layers() -> tuple[list[dict], list[dict]]:
    """The R(2+1)D-18's BatchNorm3d inputs and Conv3d layers at the loop's input (distinct
    shapes, with their counts)."""
    try:
        from torchvision.models.video import r2plus1d_18

        m = r2plus1d_18(num_classes=400).to(DEV)
    except ImportError:  # the smoke test's machine: a stand-in of the same kinds
        if not TINY:
            raise
        m = nn.Sequential(
            nn.Conv3d(3, 45, (1, 7, 7), (1, 2, 2), (0, 3, 3), bias=False),
            nn.BatchNorm3d(45),
            nn.Conv3d(45, 64, (3, 1, 1), 1, (1, 0, 0), bias=False),
            nn.BatchNorm3d(64),
        ).to(DEV)
    shape = (2, 3, 4, 28, 28) if TINY else VIDEO_INPUT
    bns: dict[tuple, int] = {}
    convs: dict[tuple, int] = {}

    def hook(mod, inp, out):
        x = inp[0]
        if isinstance(mod, nn.BatchNorm3d):
            k = tuple(x.shape)
            bns[k] = bns.get(k, 0) + 1
        elif isinstance(mod, nn.Conv3d):
            k = (
                tuple(x.shape),
                mod.out_channels,
                tuple(mod.kernel_size),
                tuple(mod.stride),
                tuple(mod.padding),
                tuple(out.shape),
            )
            convs[k] = convs.get(k, 0) + 1

    hs = [mod.register_forward_hook(hook) for mod in m.modules()]
    with torch.no_grad():
        m(torch.zeros(shape, device=DEV))
    for h in hs:
        h.remove()
    del m
    bn_list = [{"shape": list(k), "count": v} for k, v in bns.items()]
    conv_list = [
        {
            "in_shape": list(k[0]),
            "out_channels": k[1],
            "kernel": list(k[2]),
            "stride": list(k[3]),
            "padding": list(k[4]),
            "out_shape": list(k[5]),
            "count": v,
            "first": k[0][1] == 3,  # the stem's first conv: its input needs no grad
        }
        for k, v in convs.items()
    ]
    return bn_list, conv_list


def bn_bytes(shape, dt: torch.dtype) -> dict[str, float]:
    """Bytes as the model counts them (model/flops.py memory_cost over cudnn_batch_norm's
    recorded inputs: x, weight, bias, running mean, running var (fp32) read, an output the size
    of x written; the backward's: x, dy, weight, running mean/var, saved mean/invstd, reserve
    read, dx written) and BATCH_NORM_PASSES (3/2 forward, 5/3 backward); plain in+out too."""
    n = 1
    for s in shape:
        n *= s
    c = shape[1]
    xb = n * elem(dt)
    fwd_model = (2 * xb + 4 * c * 4) * 1.5
    bwd_model = (3 * xb + 5 * c * 4) * 5 / 3
    return {
        "x_bytes": xb,
        "fwd_model_bytes": fwd_model,
        "bwd_model_bytes": bwd_model,
        "fwd_plain_bytes": 2 * xb,  # read x, write y
        "bwd_plain_bytes": 3 * xb,  # read x, dy, write dx
    }


def make_bn(shape, dt, cl):
    nd = len(shape)
    bn = (nn.BatchNorm2d if nd == 4 else nn.BatchNorm3d)(shape[1]).to(DEV)
    bn = bn.to(memory_format=fmt(cl, nd))
    x = torch.randn(shape, device=DEV, dtype=dt).contiguous(memory_format=fmt(cl, nd))
    x.requires_grad_(True)
    g = torch.randn_like(x)
    return bn, x, g


def autocast(dt):
    return torch.autocast(DEV, dtype=torch.bfloat16, enabled=dt == torch.bfloat16)


def time_bn(timer: Timer, shape, dt, cl) -> dict:
    bn, x, g = make_bn(shape, dt, cl)
    fw, bw = [], []
    for i in range(WARM + REPS):
        timer.do_flush()
        a = timer.mark()
        with autocast(dt):
            y = bn(x)
        b = timer.mark()
        timer.do_flush()
        c = timer.mark()
        y.backward(g)
        d = timer.mark()
        sync()
        if i >= WARM:
            fw.append(Timer.ms(a, b))
            bw.append(Timer.ms(c, d))
        x.grad = None
        bn.zero_grad(set_to_none=True)
        del y
    out = {
        "out_format_ok": True,
        "fwd_ms_median": statistics.median(fw),
        "bwd_ms_median": statistics.median(bw),
        "fwd_ms_min": min(fw),
        "bwd_ms_min": min(bw),
    }
    del bn, x, g
    return out


def make_conv(c, dt, cl):
    shape = c["in_shape"]
    conv = nn.Conv3d(
        shape[1],
        c["out_channels"],
        c["kernel"],
        stride=c["stride"],
        padding=c["padding"],
        bias=False,
    ).to(DEV)
    conv = conv.to(memory_format=fmt(cl, 5))
    x = torch.randn(shape, device=DEV, dtype=dt).contiguous(memory_format=fmt(cl, 5))
    x.requires_grad_(not c["first"])
    with autocast(dt):
        y = conv(x)
    g = torch.randn_like(y)
    del y
    return conv, x, g


def time_conv(timer: Timer, c, dt, cl) -> dict:
    conv, x, g = make_conv(c, dt, cl)
    fw, bw = [], []
    fmt_out = None
    for i in range(WARM + REPS):
        timer.do_flush()
        a = timer.mark()
        with autocast(dt):
            y = conv(x)
        b = timer.mark()
        timer.do_flush()
        cc = timer.mark()
        y.backward(g)
        d = timer.mark()
        sync()
        if fmt_out is None:
            fmt_out = {
                "y_channels_last": y.is_contiguous(memory_format=fmt(True, 5)),
                "y_contiguous": y.is_contiguous(),
                "y_dtype": str(y.dtype),
            }
        if i >= WARM:
            fw.append(Timer.ms(a, b))
            bw.append(Timer.ms(cc, d))
        x.grad = None
        conv.zero_grad(set_to_none=True)
        del y
    del conv, x, g
    return {
        "fwd_ms_median": statistics.median(fw),
        "bwd_ms_median": statistics.median(bw),
        "fwd_ms_min": min(fw),
        "bwd_ms_min": min(bw),
        **(fmt_out or {}),
    }


def profile(timer: Timer, kind: str, items: list, dt, cl, tmp: Path, tag: str) -> str:
    """One trace for every shape of a kind in one layout and dtype; regions labelled
    'KIND|i|fwd' and 'KIND|i|bwd' (i: the index in the JSON's list)."""
    from torch.profiler import ProfilerActivity, record_function
    from torch.profiler import profile as tprof

    made = []
    for it in items:
        if kind == "conv3d":
            made.append(make_conv(it, dt, cl))
        else:
            made.append(make_bn(it["shape"], dt, cl))
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if CUDA else [])
    # warm (cudnn.benchmark's choice made) before the capture
    for mod, x, g in made:
        with autocast(dt):
            y = mod(x)
        y.backward(g)
    sync()
    with tprof(activities=acts, record_shapes=True) as p:
        for _ in range(PROF_REPS):
            for i, (mod, x, g) in enumerate(made):
                x.grad = None
                mod.zero_grad(set_to_none=True)
                timer.do_flush()
                with record_function(f"{kind}|{i}|fwd"), autocast(dt):
                    y = mod(x)
                timer.do_flush()
                with record_function(f"{kind}|{i}|bwd"):
                    y.backward(g)
                sync()
    path = tmp / f"{tag}.pt.trace.json"
    p.export_chrome_trace(str(path))
    gz = tmp / f"{tag}.pt.trace.json.gz"
    gz.write_bytes(gzip.compress(path.read_bytes(), 9))
    path.unlink()
    del made
    return gz.name


def copy_bw(timer: Timer) -> float | None:
    """Achieved device-to-device copy bandwidth (read + write bytes / time), 2 GiB."""
    if TINY:
        return None
    a = torch.empty(1 << 30, dtype=torch.float16, device=DEV)
    b = torch.empty_like(a)
    ts = []
    for i in range(8):
        s = timer.mark()
        b.copy_(a)
        e = timer.mark()
        sync()
        if i >= 2:
            ts.append(Timer.ms(s, e))
    del a, b
    return 2 * (2 << 30) / (statistics.median(ts) / 1e3)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--skip-conv", action="store_true")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.backends.cudnn.benchmark = True  # as the R(2+1)D loop (references' train.py) sets it
    t0 = time.perf_counter()
    timer = Timer()
    res: dict = {
        "torch": torch.__version__,
        "cudnn": torch.backends.cudnn.version() if CUDA else None,
        "gpu": torch.cuda.get_device_name() if CUDA else "cpu",
        "peak_bw_bytes_s": PEAK_BW,
        "tiny": TINY,
        "method": "per shape, dtype, layout: a BatchNorm (training) / Conv3d (no bias) module "
        "and input in that memory format; bf16 = input bf16, parameters fp32, under "
        f"torch.autocast(bf16); {WARM} warm-up reps then the median of {REPS}; each rep: L2 "
        "flushed (512 MiB fill), event, forward, event, flush, event, backward(dy), event",
    }
    res["copy_bw_bytes_s"] = copy_bw(timer)
    bn3d, conv3d = video_layers()
    bn2d = [{"shape": list(s if not TINY else (2, s[1] // 8 or 1, 8, 8)), "count": 1} for s in BN2D]
    res["bn2d"], res["bn3d"], res["conv3d"] = bn2d, bn3d, conv3d
    dts = {"fp32": torch.float32, "bf16": torch.bfloat16}
    for kind, items in (("bn2d", bn2d), ("bn3d", bn3d)):
        for it in items:
            it["bytes"] = {n: bn_bytes(it["shape"], dt) for n, dt in dts.items()}
            it["timing"] = {}
            for dn, dt in dts.items():
                for cl in (False, True):
                    key = f"{dn}_{'cl' if cl else 'nchw'}"
                    r = time_bn(timer, it["shape"], dt, cl)
                    for p in ("fwd", "bwd"):
                        ms = r[f"{p}_ms_median"]
                        r[f"{p}_plain_frac_peak"] = it["bytes"][dn][f"{p}_plain_bytes"] / (
                            ms / 1e3
                        ) / PEAK_BW
                        r[f"{p}_model_frac_peak"] = it["bytes"][dn][f"{p}_model_bytes"] / (
                            ms / 1e3
                        ) / PEAK_BW
                    it["timing"][key] = r
            print(kind, it["shape"], {k: (round(v["fwd_ms_median"], 4), round(v["bwd_ms_median"], 4)) for k, v in it["timing"].items()}, flush=True)
        (out / "nhwc_bench.json").write_text(json.dumps(res, indent=1))
    if not a.skip_conv:
        for it in conv3d:
            it["timing"] = {}
            for dn, dt in dts.items():
                for cl in (False, True):
                    it["timing"][f"{dn}_{'cl' if cl else 'nchw'}"] = time_conv(timer, it, dt, cl)
            print("conv3d", it["in_shape"], it["out_channels"], it["kernel"], it["stride"], {k: (round(v["fwd_ms_median"], 3), round(v["bwd_ms_median"], 3)) for k, v in it["timing"].items()}, flush=True)
            (out / "nhwc_bench.json").write_text(json.dumps(res, indent=1))
    res["timing_s"] = time.perf_counter() - t0
    # traces
    tmp = Path(tempfile.mkdtemp())
    names = []
    for kind, items in (("bn2d", bn2d), ("bn3d", bn3d), ("conv3d", conv3d)):
        if kind == "conv3d" and a.skip_conv:
            continue
        for dn, dt in dts.items():
            for cl in (False, True):
                tag = f"{kind}.{dn}.{'cl' if cl else 'nchw'}"
                try:
                    names.append(profile(timer, kind, items, dt, cl, tmp, tag))
                except Exception as exc:  # keep the timings
                    res.setdefault("profile_errors", {})[tag] = repr(exc)
    with tarfile.open(out / "nhwc_traces.tar", "w") as tf:
        for n in names:
            tf.add(tmp / n, arcname=n)
    res["traces"] = names
    res["total_s"] = time.perf_counter() - t0
    (out / "nhwc_bench.json").write_text(json.dumps(res, indent=1))
    print(f"done in {res['total_s']:.1f} s; traces {sum((tmp / n).stat().st_size for n in names)} B", flush=True)


if __name__ == "__main__":
    main()
