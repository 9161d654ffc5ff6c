"""Analyse benchmarks/nhwc_bandwidth.py's output (python benchmarks/nhwc_bandwidth_report.py OUT/nhwc): per region (shape, fwd/bwd) the GPU kernel time from the
profiler traces (kernels and memsets launched inside the labelled region, median over the reps),
the bytes as traceinsight counts them (model/flops.py op_cost on the recorded cudnn/native batch
norm op x BATCH_NORM_PASSES), the achieved fraction of the H200's peak bandwidth, and the
model's NHWC price (bytes*passes/peak) against the measured NHWC time."""
import bisect
import gzip
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from traceinsight.causal.build import BATCH_NORM_PASSES  # noqa: E402
from traceinsight.model.flops import op_cost  # noqa: E402

D = Path("/work/extra_dev")
PEAK = 4800e9
res = json.loads((D / "device_out/call_nhwc/nhwc/nhwc_bench.json").read_text())


def regions(path):
    with gzip.open(path) as fh:
        ev = json.load(fh)["traceEvents"]
    ann = [e for e in ev if e.get("cat") == "user_annotation" and "|" in e.get("name", "")]
    ann.sort(key=lambda e: e["ts"])
    starts = [e["ts"] for e in ann]
    launch = {}
    for e in ev:
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {}):
            launch[e["args"]["correlation"]] = e["ts"]

    def region_of(ts):
        i = bisect.bisect_right(starts, ts) - 1
        if i >= 0 and ts <= ann[i]["ts"] + ann[i]["dur"]:
            return i
        return None

    per = defaultdict(lambda: defaultdict(float))  # annotation index -> kernel name -> us
    for e in ev:
        if e.get("cat") in ("kernel", "gpu_memset", "gpu_memcpy"):
            lt = launch.get(e["args"].get("correlation"))
            if lt is None:
                continue
            i = region_of(lt)
            if i is not None:
                per[i][e["name"]] += e["dur"]
    # ops: batch norm op names and shapes inside each region (host ops by ts)
    ops = defaultdict(list)
    for e in ev:
        if e.get("cat") == "cpu_op" and ("batch_norm" in e["name"] or "conv" in e["name"]):
            i = region_of(e["ts"])
            if i is not None:
                a = e["args"]
                ops[i].append((e["name"], json.dumps(a.get("Input Dims")), json.dumps(a.get("Input type")), json.dumps(a.get("Concrete Inputs"))))
    out = defaultdict(list)  # (kind, idx, phase) -> list of (total_us, kernels, ops)
    for i, a in enumerate(ann):
        kind, idx, phase = a["name"].split("|")
        out[(kind, int(idx), phase)].append((sum(per[i].values()), dict(per[i]), ops[i]))
    return out


def model_bytes(oplist):
    """bytes*passes of the batch norm ops (the model's count) in a region."""
    tot, names = 0.0, []
    for name, dims, types, conc in oplist:
        if name in ("aten::cudnn_batch_norm", "aten::cudnn_batch_norm_backward",
                    "aten::native_batch_norm", "aten::native_batch_norm_backward"):
            c = op_cost(name, dims, types, conc)
            if c.bytes:
                tot += c.bytes * BATCH_NORM_PASSES.get(name, 1.0)
                names.append(name)
    return tot, names


rows = []
for kind in ("bn2d", "bn3d"):
    items = res[kind]
    for dn in ("fp32", "bf16"):
        for lay in ("nchw", "cl"):
            reg = regions(D / f"nhwc_traces/{kind}.{dn}.{lay}.pt.trace.json.gz")
            for idx, it in enumerate(items):
                for phase in ("fwd", "bwd"):
                    reps = reg[(kind, idx, phase)]
                    us = statistics.median(r[0] for r in reps)
                    mb, names = model_bytes(reps[0][2])
                    # kernel names, summed over reps / n
                    kn = defaultdict(float)
                    for r in reps:
                        for k, v in r[1].items():
                            kn[k] += v / len(reps)
                    b = it["bytes"][dn]
                    ev_ms = it["timing"][f"{dn}_{lay}"][f"{phase}_ms_median"]
                    rows.append({
                        "kind": kind, "shape": it["shape"], "count": it.get("count", 1),
                        "dtype": dn, "layout": lay, "phase": phase,
                        "kernel_us": us, "event_us": ev_ms * 1e3,
                        "op": names[0] if names else None,
                        "model_bytes": mb,
                        "plain_bytes": b[f"{phase}_plain_bytes"],
                        "model_frac_peak": mb / (us * 1e-6) / PEAK if us else None,
                        "plain_frac_peak": b[f"{phase}_plain_bytes"] / (us * 1e-6) / PEAK if us else None,
                        "model_price_us": mb / PEAK * 1e6,
                        "kernels": {k[:90]: round(v, 1) for k, v in sorted(kn.items(), key=lambda x: -x[1])},
                    })
conv_rows = []
for dn in ("fp32", "bf16"):
    for lay in ("nchw", "cl"):
        reg = regions(D / f"nhwc_traces/conv3d.{dn}.{lay}.pt.trace.json.gz")
        for idx, it in enumerate(res["conv3d"]):
            for phase in ("fwd", "bwd"):
                reps = reg[("conv3d", idx, phase)]
                kn = defaultdict(float)
                for r in reps:
                    for k, v in r[1].items():
                        kn[k] += v / len(reps)
                pad = sum(v for k, v in kn.items() if "pad" in k.lower())
                lay_t = sum(v for k, v in kn.items() if "nchwtonhwc" in k.lower() or "nhwctonchw" in k.lower())
                conv_rows.append({
                    "in_shape": it["in_shape"], "out_channels": it["out_channels"],
                    "kernel": it["kernel"], "stride": it["stride"], "count": it["count"],
                    "dtype": dn, "layout": lay, "phase": phase,
                    "kernel_us": statistics.median(r[0] for r in reps),
                    "event_us": it["timing"][f"{dn}_{lay}"][f"{phase}_ms_median"] * 1e3,
                    "padding_us": pad, "transpose_us": lay_t,
                    "kernels": {k[:100]: round(v, 1) for k, v in sorted(kn.items(), key=lambda x: -x[1])},
                })
(D / "nhwc_analysis.json").write_text(json.dumps({"bn": rows, "conv3d": conv_rows, "copy_bw_bytes_s": res["copy_bw_bytes_s"], "cudnn": res["cudnn"], "torch": res["torch"]}, indent=1))
print("copy bw", res["copy_bw_bytes_s"] / 1e9, "GB/s =", res["copy_bw_bytes_s"] / PEAK, "of peak; cudnn", res["cudnn"], res["torch"])
