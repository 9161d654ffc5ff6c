#!/usr/bin/env python3
# ruff: noqa
"""Print the per-trace verdict table of AUDIT.md from verdicts.json (markdown)."""
import json, os
import sys
if "--compare" not in sys.argv:
    V = json.load(open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "verdicts.json")))["traces"]
    print("| trace | GPU | kind | findings: severity, verdict (class), reason | health / headline | first finding = lever? real lever |")
    print("|---|---|---|---|---|---|")
    for n, t in V.items():
        fs = "<br>".join(f"**{f[0]}** {f[1].upper()}: **{f[2]}**{' (' + f[3] + ')' if f[3] else ''}: {f[4]}" for f in t["findings"]) or "none"
        hs = "<br>".join(f"{h[0]}: **{h[1]}**{' (' + h[2] + ')' if h[2] else ''}: {h[3]}" for h in t.get("health", [])) or "-"
        lv = {True: "yes", False: "no", None: ("healthy" if t.get("healthy") else "n/a")}[t.get("lever")]
        tl = t.get("true_lever", "")
        print(f"| {n} | {t['gpu']} | {t['kind']} | {fs} | {hs} | {lv}{': ' + tl if tl else ''} |")


def compare():
    """Before -> after per trace (verdicts.json vs verdicts_after.json): the judged findings."""
    here = os.path.dirname(os.path.abspath(__file__))
    B = json.load(open(os.path.join(here, "verdicts.json")))["traces"]
    A = json.load(open(os.path.join(here, "verdicts_after.json")))["traces"]
    lv = lambda t: {True: "yes", False: "no", None: ("healthy" if t.get("healthy") else "n/a")}[t.get("lever")]
    short = lambda fs: "<br>".join(f"{f[0]} {f[1].upper()} **{f[2]}**{' (' + f[3] + ')' if f[3] and f[2] == 'wrong' else ''}" for f in fs) or "none"
    print("| trace | before: judged findings | after: judged findings | first = lever, before -> after | what changed |")
    print("|---|---|---|---|---|")
    for n in B:
        b, a = B[n], A[n]
        print(f"| {n} | {short(b['findings'])} | {short(a['findings'])} | {lv(b)} -> {lv(a)} | {a.get('change', '')} |")


if __name__ == "__main__" and "--compare" in __import__("sys").argv:
    compare()
