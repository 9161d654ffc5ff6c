"""The summary as Markdown, to paste into a ticket or a chat (``analyze --format markdown``).

The terminal summary's content in Markdown's terms: the headline as a list, the findings as a
table with each fix's predicted saving, the first finding's advice and snippet, the data-quality
notes. Like every reporter it reads the JSON document only.
"""

from __future__ import annotations

import re
from typing import Any

from traceinsight.report.evidence import finding_evidence, label, no_prediction, plain
from traceinsight.report.format import (
    SELECTED_LISTS,
    SOURCE_NOUNS,
    a_times,
    busy_words,
    fmt_bytes,
    fmt_ms,
    fmt_ns,
    fmt_pct,
    fmt_source,
    idle_causes_words,
    low_end_words,
    mfu_words,
    no_findings_words,
    per_step,
    plural,
    prediction_basis,
    profiled_step_words,
    saved_words,
    saving_text,
    sources_coverage,
)

MAX_FINDINGS = 10  # table rows; the rest are counted under the table
MAX_SOURCES = 3  # call sites of the first finding
MAX_FACTS = 6  # the first finding's evidence, in one line
_ENGINES = {"host": "the host (CPU)", "kernels": "GPU kernels", "copies": "copies"}


def cell(text: Any) -> str:
    """A table cell: one line, pipes escaped (a kernel name or a title may hold either)."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _code(text: str) -> str:
    """Inline code that survives backticks inside (Markdown's longer-fence rule)."""
    fence = "``" if "`" in text else "`"
    return f"{fence} {text} {fence}" if fence == "``" else f"`{text}`"


def _fence(code: str, lang: str = "python") -> list[str]:
    """A fenced block whose fence is longer than any backtick run inside."""
    run = max((len(r) for r in re.findall(r"`+", code)), default=0)
    fence = "`" * max(3, run + 1)
    return [f"{fence}{lang}", code.rstrip("\n"), fence]


def _saving(w: dict[str, Any] | None) -> tuple[str, str, str]:
    """(saving per step, un-profiled step before → after, speedup) of a what-if, or dashes
    without one."""
    if not w:
        return "—", "—", "—"
    before, after = w["step_time_ns"], w["step_time_after_ns"]
    speedup = f"{w['speedup']:.2f}x" if w.get("speedup") else "n/a"
    if w.get("multiplier") and w.get("batch_step_time_after_ns"):
        # a larger batch's own step, and the time per original batch the saving is of
        k = w["multiplier"]
        step = (
            f"{fmt_ms(before)} → {fmt_ms(w['batch_step_time_after_ns'])} at {a_times(k)} batch "
            f"({fmt_ms(after)} per original batch)"
        )
        return saved_words(w), step, f"{speedup} per sample"
    return saved_words(w), f"{fmt_ms(before)} → {fmt_ms(after)}", speedup


def _selected(sel: dict[str, Any], per: str) -> str:
    """``--what-if``: the chosen fixes together, and the ids that did not apply."""
    text = f"What if {' + '.join(_code(f) for f in sel['fixes'])}: "
    if sel.get("step_time_ns") is None:
        text += "no step model to replay."
    else:
        text += saving_text(sel, per, low_words=low_end_words(None)) + "."
    for key, words in SELECTED_LISTS:
        if sel.get(key):
            text += f" {words[0].upper()}{words[1:]}: {', '.join(_code(f) for f in sel[key])}."
    return text


def _headline(doc: dict[str, Any]) -> list[str]:
    src, m = doc["source"], doc["metrics"]
    active = [d for d in src["devices"] if d.get("active", True)]
    devs = ", ".join(d["name"] or f"GPU {d['id']}" for d in active) or "no GPU activity"
    out = [f"- **Trace**: {_code(str(src['path']))} ({src['format']}, {devs})"]
    steps = m.get("steps") or 0
    step_txt = (
        f"{plural(steps, 'step')}; {profiled_step_words(m)}: median {fmt_ns(m['step_time_median_ns'])}"
        if steps and m.get("step_time_median_ns") is not None
        else "no step markers"
    )
    win = src.get("window") or {}
    view = f"; view: {win['selection']}" if win.get("selection") else ""
    out.append(f"- **Window**: {fmt_ns(m['window_ns'])} analyzed ({step_txt}{view})")
    if basis := prediction_basis(doc):
        out.append(f"- {basis}")
    if m.get("gpu_busy_ratio") is not None:
        idle = idle_causes_words(m["idle_by_cause_ns"])
        out.append(
            f"- **GPU busy**: {busy_words(m)}; idle {fmt_pct(m['gpu_idle_ratio'])}"
            + (f" ({idle})" if idle else "")
        )
    else:
        out.append("- **GPU busy**: n/a (no GPU activity)")
    engine = m.get("step_bound_by")
    speedups = ((doc.get("details") or {}).get("replay") or {}).get("engine_speedups") or {}
    if engine and speedups:
        each = ", ".join(f"{k} {v:.2f}x" for k, v in speedups.items())
        out.append(
            f"- **Bound by**: {_ENGINES.get(engine, engine)} (each engine 2x faster: {each})"
        )
    if m.get("mfu") is not None:
        out.append(f"- **MFU**: {mfu_words(m)[4:]}")
    peak = m.get("memory_peak_allocated_bytes")
    if isinstance(peak, dict):  # several devices: the largest
        peak = max((v for v in peak.values() if v is not None), default=None)
    if peak is not None:
        out.append(f"- **Memory**: peak {fmt_bytes(peak)} allocated")
    return out


def _findings_table(findings: list[dict[str, Any]], per: str) -> list[str]:
    rows = [
        f"| # | severity | finding | saving {per} | step (un-profiled) | speedup |",
        "|---:|---|---|---:|---|---:|",
    ]
    for i, f in enumerate(findings[:MAX_FINDINGS], 1):
        saving, step, speedup = _saving(f.get("what_if"))
        rows.append(
            f"| {i} | {f['severity']} | **{cell(f['id'])}**: {cell(plain(f['title']))} "
            f"| {saving} | {step} | {speedup} |"
        )
    if len(findings) > MAX_FINDINGS:
        rows += ["", f"{plural(len(findings) - MAX_FINDINGS, 'more finding')} not shown."]
    return rows


def _first_finding(f: dict[str, Any], per: str) -> list[str]:
    out = [f"### What to change first: {f['id']}", "", f["title"], ""]
    ev = f.get("evidence") or {}
    if ev.get("causal_chain"):
        out += [f"Why: {plain(ev['causal_chain'])}.", ""]
    noun = SOURCE_NOUNS.get(f["id"], ("event", "events"))
    sources = ev.get("sources") or []
    for s in sources[:MAX_SOURCES]:
        out.append(f"- {fmt_source(s, noun)}")
    if len(sources) > MAX_SOURCES:
        out.append(f"- and {plural(len(sources) - MAX_SOURCES, 'more call site')}")
    if sources and (coverage := sources_coverage(f)):
        out.append(f"- ({coverage})")
    if sources:
        out.append("")
    if (w := f.get("what_if")) is not None:
        saving, step, speedup = _saving(w)
        out += [f"Predicted: saves {saving} {per} (un-profiled step {step}, {speedup}).", ""]
    elif why := no_prediction(f):
        out += [why, ""]
    if capped := ev.get("severity_cap_reason"):
        out += [f"Graded {f['severity']}: {capped}.", ""]
    # the cap's reason is said above, not again among the facts
    said = label("severity_cap_reason")
    if facts := [x for x in finding_evidence(f).facts if x[0] != said][:MAX_FACTS]:
        out += ["Evidence: " + "; ".join(f"{k}: {cell(v)}" for k, v in facts) + ".", ""]
    out += [f"**Advice**: {f['recommendation']}", ""]
    if f.get("snippet"):
        out += [*_fence(f["snippet"], f.get("snippet_language") or "python"), ""]
    return out


def _notes(doc: dict[str, Any]) -> list[str]:
    out = []
    for q in doc.get("data_quality") or []:
        affected = f" (affects {', '.join(q['affected'])})" if q.get("affected") else ""
        out.append(f"- **{q['severity']}** {q['check']}: {q['message']}{affected}")
    out += [f"- warning: {w}" for w in doc.get("warnings") or []]
    return ["## Data quality", "", *out, ""] if out else []


def _ranks_table(doc: dict[str, Any]) -> list[str]:
    rows = ["| rank | GPU busy | median step | top finding |", "|---:|---:|---:|---|"]
    for r in doc["ranks"]:
        rm = r["metrics"]
        top = r["findings"][0]["id"] if r["findings"] else "—"
        rows.append(
            f"| {r['rank']} | {fmt_pct(rm.get('gpu_busy_ratio'))} "
            f"| {fmt_ns(rm.get('step_time_median_ns'))} | {cell(top)} |"
        )
    return [*rows, ""]


def render(doc: dict[str, Any]) -> str:
    """The Markdown summary of an analysis document (a single trace's or a job's)."""
    job = doc.get("kind") == "job"
    src = doc["source"]
    name = str(src["path"]).rstrip("/").rsplit("/", 1)[-1]
    out = [f"# traceinsight: {name}", ""]
    if job:
        out += [
            f"Job of {plural(len(src['ranks']), 'rank')} ({src['format']}).",
            "",
            *_ranks_table(doc),
        ]
    else:
        out += [*_headline(doc), ""]
    findings = doc["findings"]
    out += [f"## Findings ({len(findings)})", ""]
    if not findings:
        out += [no_findings_words(doc), ""]
    else:
        out += [*_findings_table(findings, per_step(doc)), ""]
        combined = ((doc.get("details") or {}).get("what_if") or {}).get("all_fixes")
        if combined:
            low = low_end_words((doc.get("details") or {}).get("replay"))
            out += [
                f"All fixes together: {saving_text(combined, per_step(doc), low_words=low)}.",
                "",
            ]
        chosen = ((doc.get("details") or {}).get("what_if") or {}).get("selected")
        if chosen:
            out += [_selected(chosen, per_step(doc)), ""]
        out += _first_finding(findings[0], per_step(doc))
    out += _notes(doc)
    version = doc["tool"]["version"]
    out.append(
        f"<sub>traceinsight {version}; savings are the causal step model's predictions "
        "for the un-profiled loop.</sub>"
    )
    return "\n".join(out) + "\n"
