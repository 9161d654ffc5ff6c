#!/usr/bin/env python3
# ruff: noqa
"""Independent fact sheet for an Nsight Systems SQLite export (plain sqlite3; no traceinsight code).

GPU busy = union of CUPTI kernel/memcpy/memset intervals over the GPU span; memcpy by copyKind
(1 HtoD, 2 DtoH, 8 DtoD, 10 PtoP, 11/12 unified-memory migrations are NOT in CUPTI_ACTIVITY_KIND_MEMCPY
as 11/12 on all versions: printed raw) and srcKind (pageable=0 / pinned=1 per ENUM_CUDA_MEM_KIND);
runtime calls by name (syncs, malloc/free, module loading); largest idle gaps and the runtime calls in them.
usage: check_nsys.py FILE.sqlite
"""
import sqlite3
import sys
from collections import Counter


def union(iv):
    iv = sorted(iv); out = []
    for s, e in iv:
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out


def main(path):
    c = sqlite3.connect(path)
    c.text_factory = lambda b: b.decode("utf-8", "replace")
    tabs = {r[0] for r in c.execute("select name from sqlite_master where type in ('table','view')")}
    print("tables:", len(tabs))
    for t in ("TARGET_INFO_GPU", "TARGET_INFO_CUDA_GPU"):
        if t in tabs:
            cols = [r[1] for r in c.execute(f"pragma table_info({t})")]
            print(t, c.execute(f"select * from {t}").fetchall()[:4], cols)
    iv = []; kd = {}
    strs = {}
    if "StringIds" in tabs:
        strs = dict(c.execute("select id, value from StringIds"))
    if "CUPTI_ACTIVITY_KIND_KERNEL" in tabs:
        rows = c.execute("select start, end, deviceId, coalesce(shortName, demangledName) from CUPTI_ACTIVITY_KIND_KERNEL").fetchall()
        for s, e, d, n in rows:
            iv.append([s, e]); nm = strs.get(n, n)
            kd.setdefault(nm, [0, 0]); kd[nm][0] += 1; kd[nm][1] += e - s
        print("kernels:", len(rows), "devices:", Counter(r[2] for r in rows))
        durs = sorted(r[1] - r[0] for r in rows)
        if durs:
            print("kernel dur ns p50/max:", durs[len(durs) // 2], durs[-1], "under 10us:", sum(1 for x in durs if x < 10000) / len(durs))
        print("top kernels:", sorted(((k[:60], v[0], round(v[1] / 1e6, 3)) for k, v in kd.items()), key=lambda x: -x[2])[:6])
    if "CUPTI_ACTIVITY_KIND_MEMCPY" in tabs:
        rows = c.execute("select start, end, copyKind, srcKind, dstKind, bytes from CUPTI_ACTIVITY_KIND_MEMCPY").fetchall()
        for s, e, *_ in rows:
            iv.append([s, e])
        agg = Counter(); byt = Counter(); tim = Counter()
        for s, e, ck, sk, dk, b in rows:
            agg[(ck, sk, dk)] += 1; byt[(ck, sk, dk)] += b; tim[(ck, sk, dk)] += e - s
        print("memcpy (copyKind, srcKind, dstKind): count, bytes, ms:", {str(k): (agg[k], byt[k], round(tim[k] / 1e6, 3)) for k in agg})
    if "CUPTI_ACTIVITY_KIND_MEMSET" in tabs:
        rows = c.execute("select start, end from CUPTI_ACTIVITY_KIND_MEMSET").fetchall()
        iv += [list(r) for r in rows]
        print("memsets:", len(rows))
    for t in ("CUDA_UM_CPU_PAGE_FAULT_EVENTS", "CUDA_UM_GPU_PAGE_FAULT_EVENTS", "CUPTI_ACTIVITY_KIND_UNIFIED_MEMORY_COUNTER"):
        if t in tabs:
            print(t, c.execute(f"select count(*) from {t}").fetchone())
    if iv:
        u = union(iv); lo, hi = u[0][0], u[-1][1]; busy = sum(e - s for s, e in u)
        print(f"GPU span {lo}..{hi} = {(hi - lo) / 1e6:.3f} ms, busy {busy / 1e6:.3f} ms, ratio {busy / (hi - lo):.4f}")
        gaps = sorted(([u[i][1], u[i + 1][0]] for i in range(len(u) - 1)), key=lambda g: g[0] - g[1])[:5]
    else:
        print("NO GPU ACTIVITY"); gaps = []
    if "CUPTI_ACTIVITY_KIND_RUNTIME" in tabs:
        rt = c.execute("select start, end, nameId from CUPTI_ACTIVITY_KIND_RUNTIME").fetchall()
        names = Counter(); tot = Counter()
        for s, e, n in rt:
            nm = strs.get(n, str(n)); names[nm] += 1; tot[nm] += e - s
        print("runtime calls:", len(rt), {k: (names[k], round(tot[k] / 1e6, 3)) for k, _ in tot.most_common(10)})
        for g in gaps:
            inside = Counter(strs.get(n, n) for s, e, n in rt if s < g[1] and e > g[0])
            print(f"  gap at +{(g[0] - lo) / 1e6:.3f} ms, {(g[1] - g[0]) / 1e6:.3f} ms; runtime inside: {dict(inside)}")
    if "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION" in tabs:
        print("sync activities:", c.execute("select count(*), sum(end-start) from CUPTI_ACTIVITY_KIND_SYNCHRONIZATION").fetchone())
    for t in ("NVTX_EVENTS",):
        if t in tabs:
            print("NVTX ranges:", c.execute(f"select count(*) from {t}").fetchone())
    if "OSRT_API" in tabs:
        print("OSRT calls:", c.execute("select count(*) from OSRT_API").fetchone())


if __name__ == "__main__":
    main(sys.argv[1])
