#!/usr/bin/env python3
"""Print the per-trace verdict table of AUDIT.md from verdicts.json (markdown)."""
import json, os
V = json.load(open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "verdicts.json")))["traces"]
print("| trace | GPU | kind | findings: severity, verdict (class), reason | health / headline | first finding = lever? real lever |")
print("|---|---|---|---|---|---|")
for n, t in V.items():
    fs = "<br>".join(f"**{f[0]}** {f[1].upper()}: **{f[2]}**{' (' + f[3] + ')' if f[3] else ''}: {f[4]}" for f in t["findings"]) or "none"
    hs = "<br>".join(f"{h[0]}: **{h[1]}**{' (' + h[2] + ')' if h[2] else ''}: {h[3]}" for h in t.get("health", [])) or "-"
    lv = {True: "yes", False: "no", None: ("healthy" if t.get("healthy") else "n/a")}[t.get("lever")]
    tl = t.get("true_lever", "")
    print(f"| {n} | {t['gpu']} | {t['kind']} | {fs} | {hs} | {lv}{': ' + tl if tl else ''} |")
