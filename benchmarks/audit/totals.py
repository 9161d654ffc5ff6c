#!/usr/bin/env python3
# ruff: noqa
"""Totals of the audit verdicts (verdicts.json) and a drift check against a run's outputs.

usage: totals.py [/work/foreign_traces] [OUT=TRACES/out] [--verdicts verdicts_after.json]
For every trace: are the audited high/medium findings (id, severity) still what traceinsight
outputs in OUT/out/NAME.json? A re-run after fixes shows which verdicts need re-judging
(findings gone, new findings above low, severity changes), so the 'after' counts can be made.
"""
import json, os, sys
from collections import Counter
VF = "verdicts.json"
if "--verdicts" in sys.argv:
    i = sys.argv.index("--verdicts"); VF = sys.argv[i + 1]; del sys.argv[i:i + 2]
T = sys.argv[1] if len(sys.argv) > 1 else "/work/foreign_traces"
OUT = sys.argv[2] if len(sys.argv) > 2 else os.path.join(T, "out")
V = json.load(open(os.path.join(os.path.dirname(os.path.abspath(__file__)), VF)))["traces"]
hm = Counter(); lever = Counter(); classes = Counter(); crashes = 0; health = Counter()
for name, t in V.items():
    for fid, sev, verdict, cls, why in t["findings"]:
        if sev in ("high", "medium"):
            hm[verdict] += 1
            if verdict == "wrong":
                for c in (cls or "").split(","):
                    classes[c.strip()] += 1
    for h in t.get("health", []):
        health[h[1]] += 1
        if h[0] == "crash" and h[1] == "wrong":
            crashes += 1
        if h[1] == "wrong" and h[2]:
            classes[h[2] + " (health)"] += 1
    if t.get("lever") is not None:
        lever[t["lever"]] += 1
print(f"traces: {len(V)}")
print(f"high/medium findings: {sum(hm.values())}: right {hm['right']}, wrong {hm['wrong']}, unsure {hm['unsure']}")
print(f"first finding = the largest lever: {lever[True]} of {lever[True] + lever[False]} traces with a lever")
print(f"crashes: {crashes}; health/headline verdicts: {dict(health)}")
print("wrong by class:", dict(sorted(classes.items())))
# drift against the current outputs
drift = []
for name, t in V.items():
    p = os.path.join(OUT, name + ".json")
    if not os.path.exists(p) or os.path.getsize(p) == 0:
        continue
    cur = json.load(open(p))["findings"]
    cur_hm = {(f["id"], f["severity"]) for f in cur if f["severity"] in ("high", "medium")}
    aud_hm = {(f[0], f[1]) for f in t["findings"] if f[1] in ("high", "medium")}
    first = cur[0]["id"] if cur else None
    aud_first = t["findings"][0][0] if t["findings"] else None
    if cur_hm != aud_hm or first != aud_first:
        drift.append((name, sorted(aud_hm - cur_hm), sorted(cur_hm - aud_hm), aud_first, first))
# healthy traces: nothing above low in the current outputs
bad = []
for name, t in V.items():
    p = os.path.join(OUT, name + ".json")
    if t.get("healthy") and os.path.exists(p) and os.path.getsize(p):
        above = [f["id"] for f in json.load(open(p))["findings"] if f["severity"] in ("high", "medium")]
        if above:
            bad.append((name, above))
n_healthy = sum(1 for t in V.values() if t.get("healthy"))
print(f"healthy traces with a finding above low: {len(bad)} of {n_healthy}", bad or "")
print("drift vs current outputs (name, audited-but-gone, new, audited first, current first):")
for d in drift:
    print("  ", d)
if not drift:
    print("   none: the verdicts describe the current outputs")
