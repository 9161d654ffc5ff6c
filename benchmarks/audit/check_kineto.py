#!/usr/bin/env python3
# ruff: noqa
"""Independent fact sheet for a Kineto (PyTorch profiler) Chrome trace.

Plain json/gzip + interval arithmetic; imports nothing from traceinsight. Prints the numbers
the audit compares traceinsight's headline and findings against:
  devices seen on GPU events vs deviceProperties; GPU busy (union of kernel/memcpy/memset)
  over the step window (ProfilerStep span) or the GPU span; steps and their durations;
  the largest idle gaps and what the host did inside them (runtime calls: malloc/free,
  module loading, syncs, launches; the enclosing top-level CPU ops); launch-wait idle
  (gaps that end when a kernel starts within 20 us of its launch call returning, i.e. the
  GPU was waiting for the launch); host syncs and the GPU idle they overlap; DataLoader
  time over idle; top kernels; eager-attention pattern (bmm/baddbmm + softmax on the same
  [B*H,T,T]); memcpy kinds; cold-start calls.
usage: check_kineto.py TRACE [--json OUT]
"""
import gzip
import json
import re
import statistics
import sys
from collections import Counter, defaultdict

GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset", "Kernel", "Memcpy", "Memset"}
SYNC_RE = re.compile(r"(cuda|hip)(Stream|Device|Event)Synchronize|(cuda|hip)Memcpy(WithStream)?$|"
                     r"(cuda|hip)Memcpy(2D)?$|(cuda|hip)StreamWaitEvent|Stream Sync")
ALLOC_RE = re.compile(r"(cuda|hip)(Malloc|Free|MallocAsync|FreeAsync|MallocHost|FreeHost|HostAlloc|HostRegister)\b|cuMemCreate|cuMemMap|hipExtMallocWithFlags")
COLD_RE = re.compile(r"cuModuleLoad|cuLibraryLoad|cuModuleGetFunction|cuLibraryGetKernel|hipModuleLoad|"
                     r"cudaGetDeviceProperties|cudaStreamCreate|hipStreamCreate|cublasCreate|cudnnCreate|"
                     r"hipblasCreate|rocblas_create|cudaFuncGetAttributes|cudaDeviceGetAttribute|"
                     r"hipGetDeviceProperties|cuCtxCreate|cudaSetDevice|hipSetDevice|cudaEventCreate|hipEventCreate|"
                     r"cudaStreamIsCapturing|cuGetProcAddress|cudaGraphInstantiate|hipGraphInstantiate")
LAUNCH_RE = re.compile(r"(cuda|hip)(LaunchKernel|LaunchCooperativeKernel|ExtLaunchKernel|GraphLaunch|ModuleLaunchKernel)|cuLaunchKernel|hipExtModuleLaunchKernel|hipModuleLaunchKernel|cudaLaunchKernelExC")


def load(path):
    op = gzip.open if path.endswith(".gz") else open
    with op(path, "rt", errors="replace") as f:
        d = json.load(f)
    if isinstance(d, list):
        return {"traceEvents": d}
    return d


def union(iv):
    iv = sorted(iv)
    out = []
    for s, e in iv:
        if out and s <= out[-1][1]:
            if e > out[-1][1]:
                out[-1][1] = e
        else:
            out.append([s, e])
    return out


def clip_total(iv, lo, hi):
    t = 0.0
    for s, e in iv:
        s2, e2 = max(s, lo), min(e, hi)
        if e2 > s2:
            t += e2 - s2
    return t


def overlap(a, b):
    """total overlap between two sorted, merged interval lists"""
    i = j = 0
    t = 0.0
    while i < len(a) and j < len(b):
        s = max(a[i][0], b[j][0]); e = min(a[i][1], b[j][1])
        if e > s:
            t += e - s
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return t


def main():
    path = sys.argv[1]
    d = load(path)
    ev = [e for e in d["traceEvents"] if isinstance(e, dict)]
    props = d.get("deviceProperties") or []
    X = [e for e in ev if e.get("ph") == "X" and "ts" in e and "dur" in e]
    for e in X:
        e["ts"] = float(e["ts"]); e["dur"] = float(e["dur"])
    gpu = [e for e in X if e.get("cat") in GPU_CATS]
    kern = [e for e in gpu if e.get("cat") in ("kernel", "Kernel")]
    rt = [e for e in X if e.get("cat") in ("cuda_runtime", "Runtime", "cuda_driver")]
    cpu = [e for e in X if e.get("cat") in ("cpu_op", "Operator", "user_annotation", "python_function")]
    steps = sorted([e for e in X if str(e.get("name", "")).startswith("ProfilerStep#") and e.get("cat") in ("cpu_op", "user_annotation", "Operator")], key=lambda e: e["ts"])
    R = {"path": path, "events": len(ev)}
    R["deviceProperties"] = [(p.get("id"), p.get("name")) for p in props]
    devs = Counter()
    for e in gpu:
        a = e.get("args", {})
        devs[a.get("device", e.get("pid"))] += 1
    R["gpu_event_devices"] = dict(devs)
    R["counts"] = {"kernel": len(kern), "gpu_events": len(gpu), "runtime": len(rt), "launch_calls": sum(1 for e in rt if LAUNCH_RE.search(e["name"])), "steps": len(steps)}
    R["counter_events"] = sum(1 for e in ev if e.get("ph") == "C")
    if not gpu:
        R["verdict_hint"] = "NO GPU EVENTS" + (" but %d launch calls: device activity lost" % R["counts"]["launch_calls"] if R["counts"]["launch_calls"] else "")
        short(R); return R
    busy = union([[e["ts"], e["ts"] + e["dur"]] for e in gpu])
    if steps:
        lo, hi = steps[0]["ts"], max(s["ts"] + s["dur"] for s in steps)
        R["window"] = "ProfilerStep span"
    else:
        lo, hi = busy[0][0], busy[-1][1]
        R["window"] = "GPU span"
    W = hi - lo
    R["window_us"] = W
    R["busy_us"] = clip_total(busy, lo, hi)
    R["busy_ratio"] = R["busy_us"] / W if W else None
    R["kernel_busy_ratio"] = clip_total(union([[e["ts"], e["ts"] + e["dur"]] for e in kern]), lo, hi) / W if W else None
    if steps:
        durs = [s["dur"] for s in steps]
        R["step_durs_ms"] = [round(x / 1e3, 3) for x in durs]
        R["step_median_ms"] = statistics.median(durs) / 1e3
        R["step_cv"] = (statistics.pstdev(durs) / statistics.mean(durs)) if len(durs) > 1 else 0
        R["step_busy"] = [round(clip_total(busy, s["ts"], s["ts"] + s["dur"]) / s["dur"], 3) for s in steps]
    # idle gaps inside the window
    gaps = []
    prev = lo
    for s, e in busy:
        if s > prev and s > lo:
            gaps.append([max(prev, lo), min(s, hi)])
        prev = max(prev, e)
    if prev < hi:
        gaps.append([prev, hi])
    gaps = [g for g in gaps if g[1] > g[0]]
    R["idle_us"] = sum(g[1] - g[0] for g in gaps)
    # launch-wait: a gap ends at a kernel whose launch returned within 20us before it starts
    corr_rt = {}
    for e in rt:
        c = e.get("args", {}).get("correlation")
        if c is not None:
            corr_rt[c] = e
    start_at = defaultdict(list)
    for e in gpu:
        start_at[e["ts"]].append(e)
    launch_wait = 0.0; launch_wait_gaps = 0; lw_small = 0.0
    big = sorted(gaps, key=lambda g: -(g[1] - g[0]))
    for g in gaps:
        nxt = start_at.get(g[1], [])
        for k in nxt:
            r = corr_rt.get(k.get("args", {}).get("correlation"))
            if r is not None and (k["ts"] - (r["ts"] + r["dur"])) < 20 and r["ts"] + r["dur"] > g[0]:
                launch_wait += g[1] - g[0]; launch_wait_gaps += 1
                if g[1] - g[0] < 1000:
                    lw_small += g[1] - g[0]
                break
    R["launch_wait_idle_us"] = launch_wait
    R["launch_wait_gaps"] = launch_wait_gaps
    R["launch_wait_idle_in_gaps_under_1ms_us"] = lw_small
    # host-side content of the largest gaps
    rt_sorted = sorted(rt, key=lambda e: e["ts"])
    cpu_top = sorted(cpu, key=lambda e: e["ts"])
    def inside(evs, s, e):
        return [x for x in evs if x["ts"] < e and x["ts"] + x["dur"] > s]
    top = []
    for g in big[:6]:
        r_in = inside(rt_sorted, g[0], g[1])
        names = Counter(x["name"] for x in r_in)
        alloc = [(x["name"], round(x["dur"], 1)) for x in r_in if ALLOC_RE.search(x["name"])]
        cold = [(x["name"], round(x["dur"], 1)) for x in r_in if COLD_RE.search(x["name"])]
        syncs = [(x["name"], round(x["dur"], 1)) for x in r_in if SYNC_RE.search(x["name"])]
        c_all = inside(cpu_top, g[0], g[1])
        c_in = [x for x in c_all if x.get("cat") != "python_function" and not x["name"].startswith("ProfilerStep")]
        py = [x for x in c_all if x.get("cat") == "python_function" and (min(x["ts"] + x["dur"], g[1]) - max(x["ts"], g[0])) > 0.5 * (g[1] - g[0])]
        py = sorted(py, key=lambda x: x["dur"])[:3]
        # outermost cpu ops covering most of the gap
        cov = sorted(c_in, key=lambda x: -(min(x["ts"] + x["dur"], g[1]) - max(x["ts"], g[0])))[:4]
        nxt = start_at.get(g[1], [])
        top.append({"start_off_ms": round((g[0] - lo) / 1e3, 3), "dur_ms": round((g[1] - g[0]) / 1e3, 3),
                    "runtime": dict(names.most_common(5)), "alloc": alloc[:5], "cold": cold[:5], "syncs": syncs[:4],
                    "host_ops": [(x["name"][:70], round((min(x["ts"] + x["dur"], g[1]) - max(x["ts"], g[0])) / 1e3, 3)) for x in cov],
                    "py_innermost_covering": [x["name"][-70:] for x in py],
                    "launches_in_gap": sum(1 for x in r_in if LAUNCH_RE.search(x["name"])),
                    "next_gpu": (nxt[0]["name"][:60] if nxt else None)})
    R["largest_gaps"] = top
    # syncs
    sync_ev = [e for e in rt if SYNC_RE.search(e["name"])]
    R["sync_calls"] = dict(Counter(e["name"] for e in sync_ev))
    R["sync_blocked_us"] = sum(e["dur"] for e in sync_ev)
    R["sync_overlap_idle_us"] = overlap(union([[e["ts"], e["ts"] + e["dur"]] for e in sync_ev]), union(gaps))
    # allocator / cold calls
    R["alloc_calls"] = {k: [v[0], round(v[1] / 1e3, 3)] for k, v in _agg([e for e in rt if ALLOC_RE.search(e["name"])]).items()}
    R["cold_calls"] = {k: [v[0], round(v[1] / 1e3, 3)] for k, v in _agg([e for e in rt if COLD_RE.search(e["name"])]).items()}
    R["launch_call_us"] = {k: [v[0], round(v[1] / 1e3, 3)] for k, v in _agg([e for e in rt if LAUNCH_RE.search(e["name"])]).items()}
    lr = sorted(rt, key=lambda e: -e["dur"])[:6]
    R["longest_runtime_calls"] = [(e["name"], round(e["dur"] / 1e3, 3), round((e["ts"] - lo) / 1e3, 1)) for e in lr]
    first_launch = {}
    for e in sorted(rt, key=lambda e: e["ts"]):
        if LAUNCH_RE.search(e["name"]):
            first_launch.setdefault(e["name"], e)
    # launches over 1 ms: cold (first-time) launches, lazy module loading
    slow = [e for e in rt if LAUNCH_RE.search(e["name"]) and e["dur"] > 1000]
    R["launch_calls_over_1ms"] = [len(slow), round(sum(e["dur"] for e in slow) / 1e3, 3)]
    dl = [e for e in cpu if "DataLoader" in e["name"] and "__next__" in e["name"]]
    R["dataloader_next"] = {"n": len(dl), "total_ms": sum(e["dur"] for e in dl) / 1e3,
                            "over_idle_ms": overlap(union([[e["ts"], e["ts"] + e["dur"]] for e in dl]), union(gaps)) / 1e3,
                            "names": dict(Counter(e["name"][:80] for e in dl).most_common(3))}
    # kernels
    kt = defaultdict(lambda: [0, 0.0])
    for e in kern:
        kt[e["name"]][0] += 1; kt[e["name"]][1] += e["dur"]
    ktot = sum(v[1] for v in kt.values())
    R["kernel_total_ms"] = ktot / 1e3
    R["top_kernels"] = [(k[:90], v[0], round(v[1] / 1e3, 3), round(v[1] / ktot, 3)) for k, v in sorted(kt.items(), key=lambda x: -x[1][1])[:8]]
    durs = sorted(e["dur"] for e in kern)
    R["kernel_dur_us_p50_max"] = [durs[len(durs) // 2], durs[-1]] if durs else None
    R["kernels_under_10us_ratio"] = sum(1 for x in durs if x < 10) / len(durs) if durs else None
    # memcpy kinds
    mk = Counter(); mb = Counter()
    for e in gpu:
        if e.get("cat") in ("gpu_memcpy", "Memcpy"):
            mk[e["name"]] += 1; mb[e["name"]] += e.get("args", {}).get("bytes", 0) or 0
    R["memcpy"] = {k: [mk[k], mb[k]] for k in mk}
    # eager attention: bmm/baddbmm/matmul with a [.,T,T] output next to softmax on [.,T,T]
    sm = [e for e in cpu if e["name"] in ("aten::softmax", "aten::_softmax", "aten::_safe_softmax")]
    bm = [e for e in cpu if e["name"] in ("aten::bmm", "aten::baddbmm", "aten::matmul")]
    sdpa = [e for e in cpu if "scaled_dot_product" in e["name"] or "flash" in e["name"].lower() or "efficient_attention" in e["name"]]
    R["attention"] = {"softmax_ops": len(sm), "bmm_ops": len(bm), "sdpa_or_flash_ops": len(sdpa),
                      "softmax_shapes": dict(Counter(str(e.get("args", {}).get("Input Dims", [None])[0]) for e in sm).most_common(3)),
                      "bmm_shapes": dict(Counter(str(e.get("args", {}).get("Input Dims")) for e in bm).most_common(4))}
    att_k = [(k, v) for k, v in kt.items() if re.search(r"softmax", k, re.I)]
    R["attention"]["softmax_kernel_ms"] = sum(v[1] for k, v in att_k) / 1e3
    R["fp32_gemm_kernel_share"] = sum(v[1] for k, v in kt.items() if re.search(r"sgemm|_fp32|f32f32|s1688gemm|gemm.*_32x|cutlass_80_simt|volta_scudnn|implicit_convolve_sgemm|f32_f32|xf32|_tf32", k)) / ktot if ktot else None
    if "--full" in sys.argv:
        print(json.dumps(R, indent=1, default=str))
    else:
        short(R)
    return R


def short(R):
    keys = ["deviceProperties", "gpu_event_devices", "counts", "counter_events", "window", "window_us", "busy_ratio", "kernel_busy_ratio",
            "step_durs_ms", "step_median_ms", "step_cv", "step_busy", "idle_us", "launch_wait_idle_in_gaps_under_1ms_us", "launch_wait_gaps",
            "sync_calls", "sync_blocked_us", "sync_overlap_idle_us", "alloc_calls", "cold_calls", "launch_call_us", "longest_runtime_calls", "launch_calls_over_1ms", "dataloader_next",
            "kernel_total_ms", "top_kernels", "kernel_dur_us_p50_max", "kernels_under_10us_ratio", "memcpy", "attention", "fp32_gemm_kernel_share", "verdict_hint"]
    for k in keys:
        if k in R:
            v = R[k]
            if k == "cold_calls":
                v = {a: b for a, b in v.items() if b[1] > 0.05}
            print(k, "=", json.dumps(v, default=str)[:700])
    for g in R.get("largest_gaps", [])[:5]:
        print("  GAP", json.dumps(g, default=str)[:900])


def _agg(evs):
    a = defaultdict(lambda: [0, 0.0])
    for e in evs:
        a[e["name"]][0] += 1; a[e["name"]][1] += e["dur"]
    return a


if __name__ == "__main__":
    R = main()
    if "--json" in sys.argv:
        json.dump(R, open(sys.argv[sys.argv.index("--json") + 1], "w"), indent=1, default=str)
