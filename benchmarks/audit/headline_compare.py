#!/usr/bin/env python3
# ruff: noqa
"""Compare traceinsight's headline (window, GPU busy, steps, step median, bound-by) with the
independent Kineto fact sheets (check/NAME.facts.json from check_kineto.py).
usage: headline_compare.py /work/foreign_traces"""
import glob, json, os, sys
T = sys.argv[1] if len(sys.argv) > 1 else "/work/foreign_traces"
print("| trace | ti window ms | our window ms | ti busy | our busy | ti steps | our steps | ti step ms | our step ms | ti bound-by |")
print("|---|---|---|---|---|---|---|---|---|---|")
for f in sorted(glob.glob(f"{T}/out/*.json")):
    n = os.path.basename(f)[:-5]
    d = json.load(open(f)); m = d["metrics"]
    fx = f"{T}/check/{n}.facts.json"
    c = json.load(open(fx)) if os.path.exists(fx) else {}
    def r(x, k=1e6):
        return "-" if x is None else f"{x / k:.2f}"
    bb = m.get("step_bound_by")
    if isinstance(bb, dict):
        bb = bb.get("label") or bb.get("bound_by") or json.dumps(bb)[:40]
    print(f"| {n} | {r(m.get('window_ns'))} | {r(c.get('window_us'), 1e3)} | {m.get('gpu_busy_ratio') and round(m['gpu_busy_ratio'], 4)} | {c.get('busy_ratio') and round(c['busy_ratio'], 4)} | {m.get('steps')} | {c.get('counts', {}).get('steps')} | {r(m.get('step_time_median_ns'))} | {c.get('step_median_ms') and round(c['step_median_ms'], 2)} | {bb} |")
