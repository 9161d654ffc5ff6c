"""The terminal summary: trace facts, GPU busy, idle by cause, findings."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from traceinsight.constants import HEADLINE_METRICS
from traceinsight.report.evidence import label
from traceinsight.report.format import (
    FRAMEWORK_WORDS,
    LOW_END_WORDS,
    MFU_COVERAGE_MIN_RATIO,
    SELECTED_LISTS,
    SOURCE_NOUNS,
    busy_words,
    combined_fixes_words,
    fmt_bytes,
    fmt_devices,
    fmt_metric,
    fmt_ns,
    fmt_pct,
    fmt_signed,
    fmt_source,
    idle_causes_words,
    kernel_words,
    low_end_words,
    memory_peak_words,
    mfu_words,
    no_findings_words,
    per_step,
    plural,
    prediction_basis,
    profiled_step_words,
    saving_text,
    sources_coverage,
)

SEV_MARK = {"high": "HIGH", "medium": "MED ", "low": "LOW ", "info": "INFO"}


def render_summary(
    doc: dict[str, Any], report_path: str | None = None, max_findings: int = 8
) -> str:
    """Plain text for a terminal; ``doc`` is the JSON result (one shape for every output)."""
    src, m = doc["source"], doc["metrics"]
    lines = [f"traceinsight {doc['tool']['version']}: {src['path']}"]
    lines.append(f"  format    {src['format']} ({src['format_version']})")
    if program := FRAMEWORK_WORDS.get(src.get("framework") or ""):
        lines.append(f"  program   {program}")
    lines.append(f"  devices   {fmt_devices(src['devices'])}")
    world = f" of {src['world_size']}" if src.get("world_size") else ""
    lines.append(
        f"  ranks     {', '.join(map(str, src['ranks']))}{world}"
        + (f" ({src['backend']})" if src.get("backend") else "")
    )
    steps = m.get("steps") or 0
    step_txt = (
        f"{plural(steps, 'step')}; {profiled_step_words(m)}: median {fmt_ns(m['step_time_median_ns'])}, "
        f"CV {m['step_time_cv']:.2f}"
        if steps and m.get("step_time_cv") is not None
        else "no step markers"
    )
    lines.append(
        f"  window    {fmt_ns(m['window_ns'])} analyzed ({step_txt}); capture span {fmt_ns(src['capture_span_ns'])}"
    )
    win = src.get("window")
    if win:  # which part of the run: the selection and where it lies in the capture
        view = win["selection"] + "".join(
            f", {k} {win[k]}" for k in ("rank", "device") if win.get(k) is not None
        )
        lines.append(f"  view      {view}: from {fmt_ns(win['offset_ns'])} after the capture start")
    if basis := prediction_basis(doc):
        lines.append(f"  {basis}")
    counts = ", ".join(f"{k} {v:,}" for k, v in src["event_counts"].items() if v)
    lines.append(f"  events    {counts or 'none'}")
    if m.get("gpu_busy_ratio") is not None:
        idle_txt = idle_causes_words(m["idle_by_cause_ns"])
        lines.append(
            f"  GPU busy  {busy_words(m)}; idle {fmt_pct(m['gpu_idle_ratio'])}"
            + (f": {idle_txt}" if idle_txt else "")
        )
    else:
        lines.append("  GPU busy  n/a (no GPU activity)")
    lines += _bound_line(doc)
    lines += _efficiency_line(m, src.get("devices") or [])
    lines += _region_lines(doc)
    lines += _memory_line(m)
    return "\n".join(lines + _tail(doc, report_path, max_findings))


_ENGINE_NAMES = {"host": "the host (CPU)", "kernels": "GPU kernels", "copies": "copies"}


def _bound_line(doc: dict[str, Any]) -> list[str]:
    """Which engine the step model says the step follows, with each engine's what-if."""
    engine = doc["metrics"].get("step_bound_by")
    speedups = ((doc.get("details") or {}).get("replay") or {}).get("engine_speedups") or {}
    if engine is None or not speedups:
        return []
    each = ", ".join(f"{k} {v:.2f}x" for k, v in speedups.items())
    return [f"  bound by  {_ENGINE_NAMES[engine]} (each engine 2x faster alone: {each})"]


def _memory_value(key: str, v: Any) -> str:
    if v is not None and "_bytes" in key:  # growth_bytes_per_step too
        return ("-" if v < 0 else "") + fmt_bytes(abs(int(v)))
    return fmt_metric(key, v)


def _worst(v: Any) -> Any:
    """A per-device metric's largest value (a dict for several devices)."""
    if isinstance(v, dict):
        vals = [x for x in v.values() if x is not None]
        return max(vals) if vals else None
    return v


def _memory_line(m: dict[str, Any], label: str = "") -> list[str]:
    """One line: the peaks against the device, growth per step, allocator calls per step."""
    peak = _worst(m.get("memory_peak_allocated_bytes"))
    reserved = _worst(m.get("memory_peak_reserved_bytes"))
    if peak is None and reserved is None:
        return []
    total = _worst(m.get("device_memory_bytes"))
    text = f"  memory    {label}peak {fmt_bytes(peak)} allocated, {fmt_bytes(reserved)} reserved"
    if total:
        text += f" of {fmt_bytes(total)} ({fmt_pct(_worst(m.get('memory_headroom_ratio')))} unused)"
    growth = _worst(m.get("memory_growth_bytes_per_step"))
    if growth is not None and abs(growth) >= 1 << 20:
        text += f"; {'+' if growth > 0 else '-'}{fmt_bytes(abs(int(growth)))} per step"
    allocs = m.get("allocator_device_allocs_per_step")
    if allocs:
        text += f"; {allocs:.1f} cudaMalloc per step"
    return [text]


def _efficiency_line(m: dict[str, Any], devices: Sequence[dict[str, Any]] = ()) -> list[str]:
    """MFU/HFU, GEMM TFLOP/s, bandwidth and occupancy where the trace gives any of them; the
    bandwidth of the devices' peak HBM or DRAM bandwidth, by their spec's memory type."""
    parts = []
    if m.get("mfu") is not None:
        parts.append(mfu_words(m))
    if m.get("flops_per_step") is not None:
        # without step markers the window is the one "step" (audit 6: "TFLOP per step" beside
        # "no step markers")
        per = "per step" if m.get("steps") else "in the window"
        parts.append(f"{m['flops_per_step'] / 1e12:.3g} TFLOP {per}")
    if m.get("gemm_tflops") is not None:
        # to the HTML's precision (audit 19: "2 TFLOP/s" here, "2.5" on the page)
        cover = m.get("math_flops_coverage_ratio")
        known = (
            f" where FLOPs are known ({fmt_pct(cover)} of the time)"
            if cover is not None and cover < MFU_COVERAGE_MIN_RATIO
            else ""
        )
        parts.append(f"GEMM/attention {m['gemm_tflops']:.1f} TFLOP/s{known}")
    if m.get("memory_bound_bandwidth_ratio") is not None:
        share = fmt_pct(m["memory_bound_bandwidth_ratio"])
        parts.append(f"elementwise at {share} {memory_peak_words(devices)}")
    if m.get("occupancy_median") is not None:
        parts.append(f"occupancy {fmt_pct(m['occupancy_median'])}")
    # nsys GPU_METRICS: the hardware's own counters, beside the FLOPs-based figures
    counters = [
        f"{label} {fmt_pct(m[key])}"
        for key, label in (
            ("sm_active_ratio", "SM active"),
            ("tensor_active_ratio", "tensor active"),
            ("dram_bandwidth_ratio", "DRAM"),
        )
        if m.get(key) is not None
    ]
    if counters:
        parts.append(f"sampled {', '.join(counters)}")
    return [f"  compute   {'; '.join(parts)}"] if parts else []


IDLE_HOLDER_RATIO = 0.8  # a child holding this much of its parent's idle is named instead
# a region with less than this share of the GPU time is not where "most GPU time" is
TOP_REGION_MIN_RATIO = 0.5


def _region_lines(doc: dict[str, Any]) -> list[str]:
    """The region with the most GPU time and the innermost one holding the most idle time."""
    regs = ((doc.get("details") or {}).get("regions") or {}).get("regions") or []
    if not regs:
        return []
    steps = max(1, doc["metrics"].get("steps") or 1)
    per = " per step" if doc["metrics"].get("steps") else " in the window"
    top = max(regs, key=lambda r: r["gpu_ns"])
    det = (doc.get("details") or {}).get("regions") or {}
    total = (det.get("attributed_gpu_ns") or 0) + (det.get("unattributed_gpu_ns") or 0)
    # no region with GPU time (a window inside a loader stall): nothing to name
    out = (
        [
            f"  regions   {_held_by(top['path'], top['gpu_ns'], total, 'GPU time', 'most GPU time in')}"
            f": {_gpu_time(top, steps, per)}"
        ]
        if top.get("gpu_ns_per_step")
        else []
    )
    # from the root with the most idle inside, down while one child holds most of it:
    # "Optimizer.step" says more than the step-wide range around it
    kids: dict[str | None, list[dict[str, Any]]] = {}
    for r in regs:
        kids.setdefault(r.get("parent"), []).append(r)
    idle = max(kids.get(None) or regs, key=lambda r: r["idle_ns"])
    while kids.get(idle["path"]):
        child = max(kids[idle["path"]], key=lambda r: r["idle_ns"])
        if child["idle_ns"] < IDLE_HOLDER_RATIO * idle["idle_ns"]:
            break
        idle = child
    if idle["idle_ns"]:
        cause = max(idle["idle_by_cause_ns"].items(), key=lambda kv: kv[1])[0]
        label = "            " if out else "  regions   "
        all_idle = ((doc.get("details") or {}).get("idle") or {}).get("idle_ns") or 0
        where = _held_by(idle["path"], idle["idle_ns"], all_idle, "idle", "the idle is in")
        out.append(f"{label}{where}: {fmt_ns(idle['idle_ns'] / steps)}{per} (mostly {cause})")
    return out


# work on concurrent streams: a region's summed kernel time above its busy time by this much
# is said as both
CONCURRENT_MIN_RATIO = 1.05


def _gpu_time(region: dict[str, Any], steps: int, per: str) -> str:
    """A region's GPU time: its summed durations, or, where work on concurrent streams makes
    that sum exceed the time the GPU was busy with it, the busy time and the sum."""
    busy = region.get("gpu_busy_ns")
    if busy and region["gpu_ns"] > CONCURRENT_MIN_RATIO * busy:
        return (
            f"{fmt_ns(busy / steps)}{per} busy ({fmt_ns(region['gpu_ns_per_step'])} of work on "
            "concurrent streams)"
        )
    return f"{fmt_ns(region['gpu_ns_per_step'])}{per}"


def _held_by(path: str, part: float, whole: float, what: str, held: str) -> str:
    """``held path`` where the region holds at least TOP_REGION_MIN_RATIO of ``whole``; else
    most of ``what`` lies outside named regions (a Trainer's loop names only its optimizer
    step), and the region is the one holding the most."""
    if whole and part < TOP_REGION_MIN_RATIO * whole:
        return (
            f"most {what} outside named regions ({fmt_pct(1 - part / whole)}); the most in one: "
            f"{path}"
        )
    return f"{held} {path}"


def _selected_line(sel: dict[str, Any], per: str, low: str = LOW_END_WORDS) -> str:
    """--what-if in words: the chosen fixes together, and the ids that did not apply."""
    text = f"What if {' + '.join(sel['fixes'])}: "
    text += (
        saving_text(sel, per, low_words=low)
        if sel.get("step_time_ns") is not None
        else "no step model to replay"
    )
    for key, words in SELECTED_LISTS:
        if sel.get(key):
            text += f" ({words}: {', '.join(sel[key])})"
    return text


def _tail(doc: dict[str, Any], report_path: str | None, max_findings: int) -> list[str]:
    """Findings (non-info first), warnings and the report path: the end of every summary."""
    findings = doc["findings"]
    per = per_step(doc)
    low = low_end_words((doc.get("details") or {}).get("replay"))

    def _saving(w: dict[str, Any], per: str) -> str:
        return saving_text(w, per, low_words=low)

    shown = [f for f in findings if f["severity"] != "info"] or findings[:1]
    lines = [""]
    failed = [q["check"] for q in doc.get("data_quality", []) if q["severity"] == "error"]
    if not findings and failed:
        lines.append(
            f"No findings, but the trace failed {', '.join(failed)} (below): not a clean bill."
        )
    elif not findings:
        lines.append(no_findings_words(doc))
    else:
        lines.append(f"Findings ({len(findings)}, {min(len(shown), max_findings)} shown):")
        for f in shown[:max_findings]:
            lines.append(f"  [{SEV_MARK[f['severity']]}] {f['id']}: {f['title']}")
            noun = SOURCE_NOUNS.get(f["id"], ("event", "events"))
            sources = f["evidence"].get("sources", [])[:3]
            lines.extend(
                f"         {fmt_source(s, noun)}"
                + (f"; fixing it here {_saving(s['what_if'], per)}" if s.get("what_if") else "")
                for s in sources
            )
            if coverage := sources_coverage(f):
                lines.append(f"         ({coverage})")
            if (w := f.get("what_if")) is not None:
                graded = (
                    ", graded on the range's low end"
                    if f["evidence"].get("graded_on_range")
                    else ""
                )
                if (up := f["evidence"].get("loader_unverified_speedup")) is not None:
                    # the loader's plan prices the waits it sees; the workers' own rate is not
                    # in the trace (findings/savings.py loader_unverified)
                    graded += f"; up to {up:.2f}x where the workers bound the un-profiled step"
                lines.append(f"         fix: {_saving(w, per)}{graded}")
                # the finding's other priced fixes (replayed with --what-if ID@NAME)
                for key, v in f["evidence"].items():
                    if (
                        key.startswith("what_if_")
                        and isinstance(v, dict)
                        and v.get("speedup")
                        # not the headline again (evidence.priced_by)
                        and v.get("step_time_after_ns") != w.get("step_time_after_ns")
                    ):
                        name = f"{f['id']}@{key[len('what_if_') :]}"
                        lines.append(f"         or, {label(key)} ({name}): {_saving(v, per)}")
            if why := f["evidence"].get("severity_cap_reason"):
                # a grade below its saving's says why (audit 17: LOW beside "2.68x predicted")
                lines.append(f"         graded {f['severity']}: {why}")
            lines.append(f"         -> {f['recommendation']}")
        combined = (doc.get("details") or {}).get("what_if", {}).get("all_fixes")
        if combined:
            which = combined_fixes_words(doc, combined)
            lines.append(f"All fixes together{which}: {_saving(combined, per)}")
        chosen = (doc.get("details") or {}).get("what_if", {}).get("selected")
        if chosen:
            lines.append(_selected_line(chosen, per, low))
    for q in doc.get("data_quality", []):
        affected = f" (affects {', '.join(q['affected'])})" if q["affected"] else ""
        lines.append(f"data quality {q['severity']}: {q['check']}: {q['message']}{affected}")
    lines.extend(f"warning: {w}" for w in doc.get("warnings", []))
    if report_path:
        lines.append(f"\nReport: {report_path}")
    return lines


def render_job_summary(
    doc: dict[str, Any], report_path: str | None = None, max_findings: int = 8
) -> str:
    src, m = doc["source"], doc["metrics"]
    lines = [
        f"traceinsight {doc['tool']['version']}: job {src['path']} "
        f"({plural(len(src['ranks']), 'rank')}, {src['format']})"
    ]
    lines.append(
        f"  {'rank':>4}  {'GPU busy':>8}  {'median step':>11}  {'waiting':>9}  {'transfer':>9}  top finding"
    )
    for r in doc["ranks"]:
        rm = r["metrics"]
        split = r.get("comm_split") or {}
        top = r["findings"][0]["id"] if r["findings"] else "-"
        lines.append(
            f"  {r['rank']:>4}  {fmt_pct(rm['gpu_busy_ratio']):>8}  {fmt_ns(rm['step_time_median_ns']):>11}"
            f"  {fmt_ns(split.get('exposed_wait_ns')):>9}  {fmt_ns(split.get('transfer_ns')):>9}  {top}"
        )
    # the rank whose allocated peak is highest stands for the job's memory
    mem_ranks = [r for r in doc["ranks"] if _worst(r["metrics"].get("memory_peak_allocated_bytes"))]
    if mem_ranks:
        r = max(mem_ranks, key=lambda r: _worst(r["metrics"]["memory_peak_allocated_bytes"]))
        lines += _memory_line(r["metrics"], f"rank {r['rank']}: ")
    if m.get("step_skew_mean_ns") is not None:
        lines.append(
            f"  step-time skew across ranks: {fmt_ns(m['step_skew_mean_ns'])} per step on average"
        )
    if m.get("straggler_rank") is not None:
        late = m.get("straggler_ranks") or [m["straggler_rank"]]
        who = f"rank {late[0]}" if len(late) == 1 else f"ranks {', '.join(map(str, late))}"
        lines.append(
            f"  straggler: {who} (others wait {fmt_ns(m['straggler_wait_ns'])} in collectives, "
            f"{fmt_pct(m.get('straggler_wait_ratio'))} of the job's step time)"
        )
    return "\n".join(lines + _tail(doc, report_path, max_findings))


DIFF_METRICS = (*HEADLINE_METRICS, "kernels_per_step", "gpu_busy_ratio_mean", "step_skew_mean_ns")


def _signed_pct(x: float) -> str:
    return f"{fmt_signed(100 * x)}%"


# kernels listed per kind of change in a diff's summary (the JSON and HTML keep more)
DIFF_KERNELS_SHOWN = 3


def _kernel_lines(k: dict[str, Any], indent: str = "  ") -> list[str]:
    """The kernels that made the difference: those gone and new (audit 15: a channels_last
    diff listed only changed kernels, the largest 6.57 ms, where 47.36 ms a step of kernels
    disappeared), then the largest changes; names by their function (kernel_words)."""
    gone_ns, new_ns = k.get("disappeared_ns"), k.get("appeared_ns")
    # without steps on both sides the figures are each window's totals (audit 19)
    per = "in the window" if k.get("per") == "window" else "per step"
    lines = [
        f"{indent}kernels: {k['appeared_count']} appeared"
        + (f" ({fmt_ns(new_ns)} {per})" if new_ns else "")
        + f", {k['disappeared_count']} disappeared"
        + (f" ({fmt_ns(gone_ns)} {per})" if gone_ns else "")
    ]
    for row in k["disappeared"][:DIFF_KERNELS_SHOWN]:
        lines.append(
            f"{indent}  gone: {fmt_ns(row['total_ns'])} {per}  {kernel_words(row['name'], 70)}"
        )
    for row in k["appeared"][:DIFF_KERNELS_SHOWN]:
        lines.append(
            f"{indent}  new:  {fmt_ns(row['total_ns_after'])} {per}  {kernel_words(row['name'], 70)}"
        )
    for row in k["changed"][:5]:
        lines.append(
            f"{indent}  changed: {fmt_ns(row['total_ns'])} -> {fmt_ns(row['total_ns_after'])} {per}  "
            f"{kernel_words(row['name'], 70)}"
        )
    return lines


def _unchanged(change: float | None) -> bool:
    """A change that shows as 0.0%: said "unchanged", not "1.00x faster"."""
    return change is not None and abs(change) < 0.0005


def _timing_lines(doc: dict[str, Any]) -> list[str]:
    """Step (or iteration) time with its noise interval, or throughput where neither exists."""
    lines = []
    ch = doc["step_time_change"]
    if ch is not None:
        what = "iteration time" if doc.get("iterations") else "step time"
        before, after = doc["step_time_before_ns"], doc["step_time_after_ns"]
        # the speedup and the change in time, said alike both ways (audit 15: "58.7% faster"
        # was the time cut of a 2.42x speedup, "322% slower" the time's rise)
        if _unchanged(ch):
            word = "unchanged"
        elif before and after:
            ratio = after / before if ch > 0 else before / after
            word = f"{ratio:.2f}x {'slower' if ch > 0 else 'faster'}, {_signed_pct(ch)}"
        else:
            word = _signed_pct(ch)
        line = f"  {what} {fmt_ns(before)} -> {fmt_ns(after)} ({word})"
        lo_hi = doc["noise"]["interval"]
        if lo_hi is not None:
            lo, hi = lo_hi
            beyond = lo > 0 or hi < 0
            # the steps inside each capture only: two processes of the same code differ more
            # (audit 19: one LoRA loop, 1.88x between processes, read "larger than the noise")
            line += (
                f"; {100 * doc['noise']['confidence']:.0f}% interval {_signed_pct(lo)} .. {_signed_pct(hi)}: "
                + (
                    "beyond the within-capture step spread"
                    if beyond
                    else "within the within-capture step spread"
                )
                + " (run-to-run variance not included)"
            )
        else:
            line += "; too few steps for a spread estimate"
        lines.append(line)
        if u := doc.get("unprofiled"):
            low = (
                f"; {_signed_pct(u['change_low'])} {LOW_END_WORDS}"
                if u.get("change_low") is not None and abs(u["change_low"] - u["change"]) >= 0.01
                else ""
            )
            lines.append(
                f"  un-profiled step (the step model's estimate) {fmt_ns(u['before_ns'])} -> "
                f"{fmt_ns(u['after_ns'])} ({_signed_pct(u['change'])}{low})"
            )
            if u.get("measured_change") is not None:
                lines.append(
                    f"  un-profiled step (measured by traceinsight.capture) "
                    f"{fmt_ns(u['measured_before_ns'])} -> {fmt_ns(u['measured_after_ns'])} "
                    f"({_signed_pct(u['measured_change'])})"
                )
        if doc.get("iterations"):
            ib, ia = doc["iterations"]["before"], doc["iterations"]["after"]
            how = (
                f"the range {ib['range_name']!r}"
                if ib["method"] == "nvtx"
                else f"the repeating kernel sequence ({ib['period_kernels']} / {ia['period_kernels']} kernels)"
            )
            lines.append(f"  (no step markers: iterations from {how})")
    km, th = doc.get("kernel_match"), doc.get("throughput")
    if km and ch is None:
        change = km["change"]
        verdict = (
            f"GPU time of the matched calls {fmt_ns(km['matched_ns_before'])} -> "
            f"{fmt_ns(km['matched_ns_after'])} ("
            + ("unchanged" if _unchanged(change) else _signed_pct(change))
            + ")"
            if km["matched_ratio"] >= km["min_ratio"] and change is not None
            else f"under {km['min_ratio']:.0%}: not the same work, no time to compare"
        )
        lines.append(
            f"  no comparable step time: kernel calls matched by name {km['matched_ratio']:.1%} "
            f"({km['calls_before']:,.0f} vs {km['calls_after']:,.0f} calls); {verdict}"
        )
    if th and ch is None:
        lines.append("  kernel calls per second of window and time per call (not work-normalized)")
        for r in th["kernel_classes"][:6]:
            cps, npc = r["calls_per_s_change"], r["ns_per_call_change"]
            lines.append(
                f"    {r['kernel_class']:12s} {r['calls_per_s_before']:10.0f} -> {r['calls_per_s_after']:10.0f} calls/s"
                + (f" ({_signed_pct(cps)})" if cps is not None else "")
                + (f", time per call {_signed_pct(npc)}" if npc is not None else "")
            )
    return lines


def render_diff_summary(doc: dict[str, Any], report_path: str | None = None) -> str:
    lines = [
        f"traceinsight {doc['tool']['version']}: diff",
        f"  before  {doc['before']}",
        f"  after   {doc['after']}",
    ]
    for w in doc.get("warnings", []):
        lines.append(f"  warning: {w}")
    for side, errors in (doc.get("data_quality_errors") or {}).items():
        for q in errors:
            lines.append(f"  error: {side.upper()}: {q['check']}: {q['message']}")
    lines += _timing_lines(doc)
    for side, sel in (doc.get("what_if_selected") or {}).items():
        lines.append(f"  {side}: {_selected_line(sel, 'per step')}")
    lines.append("")
    lines.append(f"  {'metric':32s} {'before':>12s} {'after':>12s}")
    for row in doc["metrics"]:
        if row["metric"] in DIFF_METRICS:
            lines.append(
                f"  {row['metric']:32s} {fmt_metric(row['metric'], row['before']):>12s} {fmt_metric(row['metric'], row['after']):>12s}"
            )
    for row in doc.get("memory") or []:
        b, a = (_memory_value(row["metric"], row[k]) for k in ("before", "after"))
        lines.append(f"  {row['metric']:32s} {b:>12s} {a:>12s}")
    if doc["idle_by_cause"]:
        per = " per step" if doc["idle_by_cause"][0].get("per") == "step" else ""
        lines.append(
            f"  idle by cause{per}: "
            + ", ".join(
                f"{r['cause']} {fmt_ns(r['before_ns'])} -> {fmt_ns(r['after_ns'])}"
                for r in doc["idle_by_cause"]
            )
        )
    if doc.get("ranks"):
        # a job's top level has no kernel table: each matched rank's kernel changes
        for r in doc["ranks"]:
            ch = r["step_time_change"]
            head = f"  rank {r['rank']}:" + (
                f" step time {_signed_pct(ch)}" if ch is not None else ""
            )
            lines.append(head)
            lines += _kernel_lines(r["kernels_per_step"], indent="    ")
    else:
        lines += _kernel_lines(doc["kernels_per_step"])
    f = doc["findings"]
    if f["resolved"]:
        lines.append("  resolved: " + ", ".join(x["id"] for x in f["resolved"]))
    if f["introduced"]:
        lines.append("  introduced: " + ", ".join(x["id"] for x in f["introduced"]))
    if report_path:
        lines.append(f"\nReport: {report_path}")
    return "\n".join(lines)


def render(doc: dict[str, Any], report_path: str | None = None) -> str:
    """The summary of any analysis document: a job's or a single trace's."""
    return (
        render_job_summary(doc, report_path)
        if doc.get("kind") == "job"
        else render_summary(doc, report_path)
    )
