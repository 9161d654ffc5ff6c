"""Number formatting shared by every reporter and by finding titles: one place, one style."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any


def no_findings_words(doc: Mapping[str, Any]) -> str:
    """The line where there are no findings: a capture without GPU activity has nothing to
    diagnose, which is not a healthy run (audit 23: two nsys exports of NVTX and OS calls only
    read "nothing measurable stands out")."""
    devices = (doc.get("source") or {}).get("devices") or []
    m = doc.get("metrics") or {}
    active = any(d.get("active", True) for d in devices)
    if (doc.get("source") or {}).get("format") == "memory-timeline":
        # torch's export_memory_timeline: the allocator's timeline alone, by design
        return (
            "No findings: a memory timeline holds the allocator's memory only (above); record "
            "a trace of the same steps to diagnose their time."
        )
    if not active and m.get("gpu_busy_ratio") is None:
        return "No findings: the trace records no GPU activity, so there is nothing to diagnose."
    return "No findings: nothing measurable stands out."


def ranked_idle_causes(idle_by_cause_ns: dict[str, int]) -> list[tuple[str, int]]:
    """The idle causes that cost time, costliest first (ties keep the table's order)."""
    return sorted(((k, v) for k, v in idle_by_cause_ns.items() if v), key=lambda kv: -kv[1])


IDLE_CAUSES_SHOWN = 5  # in a summary line; the rest summed, so the line adds up to the idle


# Copies at least this share of the window: the busy figure is split into kernels and copies
# (audit 21: an OpenMP offload read "GPU busy 99.7%" where 95.8% of the window was copies).
BUSY_SPLIT_MIN_COPY_RATIO = 0.05


def busy_words(m: Mapping[str, Any]) -> str:
    """The GPU's busy share, split into kernels and copies where copies are a notable part:
    "99.7% (kernels 3.9%, copies 95.8%)"; the two overlap where copies run beside kernels.
    Exposed communication is named where it is as notable: collective kernels waiting for
    other ranks count as busy (audit 22: a DDP rank "99.5% busy", 62.4% of it exposed
    all-reduce)."""
    busy = fmt_pct(m.get("gpu_busy_ratio"))
    kern, copy = m.get("kernel_busy_ratio"), m.get("copy_busy_ratio")
    comm = m.get("exposed_comm_ratio")
    parts = []
    if kern is not None and copy is not None and copy >= BUSY_SPLIT_MIN_COPY_RATIO:
        parts += [f"kernels {fmt_pct(kern)}", f"copies {fmt_pct(copy)}"]
    if comm is not None and comm >= BUSY_SPLIT_MIN_COPY_RATIO:
        parts.append(f"exposed communication {fmt_pct(comm)}")
    return f"{busy} ({', '.join(parts)})" if parts else busy


def idle_causes_words(idle_by_cause_ns: dict[str, int]) -> str:
    """The costliest idle causes for a summary line, and the rest as one sum (audit 17: the
    Markdown dropped the smallest causes the terminal showed, and no longer added up)."""
    causes = ranked_idle_causes(idle_by_cause_ns)
    words = [f"{k} {fmt_ns(v)}" for k, v in causes[:IDLE_CAUSES_SHOWN]]
    if rest := causes[IDLE_CAUSES_SHOWN:]:
        words.append(f"{len(rest)} more {fmt_ns(sum(v for _, v in rest))}")
    return ", ".join(words)


def _device_name(d: dict[str, Any]) -> str:
    """A device's recorded name; where the trace leaves it empty, the spec table's row its other
    properties matched (audit 13: ROCm builds that name an MI300X "" read "unknown GPU")."""
    if d.get("name"):
        return str(d["name"])
    if d.get("spec"):
        return f"{d['spec']} (unnamed in the trace, matched by its properties)"
    return "unknown GPU"


def _units(d: dict[str, Any]) -> str:
    """What the device's compute units are called: AMD's compute units, NVIDIA's SMs."""
    text = f"{d.get('name') or ''} {d.get('spec') or ''}".lower()
    amd = any(
        k in text
        for k in ("mi300", "mi250", "mi210", "mi100", "mi325", "mi355", "instinct", "radeon", "amd")
    )
    return "CUs" if amd else "SMs"


def fmt_devices(devices: list[dict[str, Any]]) -> str:
    """The devices with GPU activity (what ``--device`` selects from); where none had any, the
    ids the trace's metadata names, said as such."""
    active = [d for d in devices if d.get("active", True)]
    if active:
        return ", ".join(
            f"{d['id']}: {_device_name(d)}"
            + (f" ({d['sm_count']} {_units(d)})" if d.get("sm_count") else "")
            for d in active
        )
    named = ", ".join(str(d["id"]) for d in devices)
    return "none with GPU activity" + (f" (the metadata names {named})" if named else "")


def memory_peak_words(devices: Sequence[dict[str, Any]]) -> str:
    """What a memory-bound bandwidth share is of, by the spec table's ``memory_type`` of the
    devices with GPU activity: "of peak HBM bandwidth" where every one has HBM, else "of peak
    DRAM bandwidth" (audit 19: "39.3% of HBM" on a T4, whose memory is GDDR6)."""
    active = [d for d in devices if d.get("active", True) and d.get("spec")]
    types = {str(d.get("memory_type") or "") for d in active}
    hbm = bool(types) and all(t.upper().startswith("HBM") for t in types)
    return "of peak HBM bandwidth" if hbm else "of peak DRAM bandwidth"


def tensor_peak_dtypes(peak_tflops: dict[str, float] | None) -> str:
    """The 16-bit dtypes the dense tensor peak is of (model/devices.py TENSOR_DTYPES: bf16, else
    fp16): "bf16/fp16" where the spec lists both, "fp16" on a device without bf16 (audit 19:
    "bf16/fp16 tensor peak 65 TFLOP/s" on a T4)."""
    have = [d for d in ("bf16", "fp16") if d in (peak_tflops or {})]
    return "/".join(have) or "bf16/fp16"


# What the reports call a step, by the trace's framework (source.framework): a PyTorch
# trace's profiler steps; an application's iterations (its NVTX ranges matched as steps).
STEP_NOUNS: dict[str, str] = {"pytorch": "step", "cuda_app": "iteration"}


# The program the trace records (source.framework), in words where its advice is not the
# default (PyTorch's): the summary says why the advice is CUDA's.
FRAMEWORK_WORDS: dict[str, str] = {
    "cuda_app": "CUDA/HIP application (no PyTorch seen: CUDA-level advice)",
}


def per_step(doc: dict[str, Any]) -> str:
    """``per step`` (``per iteration`` for an application) where the trace has steps, else
    ``over the window``: a trace without steps has nothing to count per."""
    steps = (doc.get("metrics") or {}).get("steps", 1)  # a job's ranks have theirs
    noun = STEP_NOUNS.get((doc.get("source") or {}).get("framework") or "pytorch", "step")
    return f"per {noun}" if steps else "over the window"


# MFU from FLOPs known for less than this share of the math kernels' time is a lower bound
MFU_COVERAGE_MIN_RATIO = 0.5
# ... and from less than this share, unknown
MFU_COVERAGE_UNKNOWN_RATIO = 0.05


def mfu_words(m: dict[str, Any]) -> str:
    """MFU and HFU as the metrics give them; where the FLOPs are known for few of the math
    kernels (a graph's replayed kernels, custom ops: no shapes), a lower bound saying so
    (audit 9: "MFU 0.0%" on a vLLM trace 99.8% busy in MoE matmuls, FLOPs for 0.2% of them)."""
    cover = m.get("math_flops_coverage_ratio")
    text = f"MFU {fmt_pct(m['mfu'])} (HFU {fmt_pct(m.get('hfu'))})"
    if cover is not None and cover < MFU_COVERAGE_UNKNOWN_RATIO:
        # a bound from so few kernels says nothing (a vLLM graph trace: "MFU at least 0.0%")
        return f"MFU unknown (FLOPs known for {fmt_pct(cover)} of the math kernels' time)"
    if cover is not None and cover < MFU_COVERAGE_MIN_RATIO:
        return (
            f"MFU at least {fmt_pct(m['mfu'])} (HFU {fmt_pct(m.get('hfu'))}; FLOPs known for "
            f"{fmt_pct(cover)} of the math kernels' time)"
        )
    return text


def saving_per_step_ns(w: dict[str, Any]) -> int:
    """A what-if's saving per step: its un-profiled step before less after (never below 0)."""
    return max(0, w["step_time_ns"] - w["step_time_after_ns"])


def saved_words(w: dict[str, Any], fmt: Callable[[int], str] | None = None) -> str:
    """What a what-if saves per step in words: the time, or "nothing" where the model predicts
    the step no shorter (audit 10: host_sync's fix read "saves 0.00 ms ... 0.98x predicted" on a
    V100 trace, its wait moving to the next blocking call)."""
    saved = saving_per_step_ns(w)
    if saved > 0:
        return (fmt or fmt_ms)(saved)
    longer = w["step_time_after_ns"] - w["step_time_ns"]
    # a step predicted longer says by how much (audit 12: fp32 -> bf16 on the DCGAN loop,
    # 8.93 -> 9.52 ms, read "saves nothing")
    return f"nothing ({(fmt or fmt_ms)(longer)} slower predicted)" if longer > 0 else "nothing"


# what a what-if's ``speedup_low`` assumes (analyzers/replay.py ReplayResult.speedup_low): the
# un-profiled model with the profiler's cost per event at its largest, whose host work is
# lighter, so a fix of the GPU's work can save more before the host bounds the step
LOW_END_WORDS = "if the profiler cost 2.5 times what its no-work ops show, leaving less host work"
LOW_END_COMPILED_WORDS = (
    "at the un-profiled step's low end (compiled code's profiler cost as measured on such "
    "recordings)"
)


def low_end_words(replay: dict[str, Any] | None) -> str:
    """The words for a what-if's other end (``speedup_low``) on this trace."""
    return (
        LOW_END_COMPILED_WORDS if (replay or {}).get("compiled_unprofiled_ratio") else LOW_END_WORDS
    )


def saving_text(
    w: dict[str, Any],
    per: str = "per step",
    fmt: Callable[[int], str] | None = None,
    low_words: str = LOW_END_WORDS,
) -> str:
    """A what-if in words, the one sentence every reporter prints: the saving, the un-profiled
    step before and after the fix, the speedup and, where it moves it, the other end of the
    range the profiler's unknown cost leaves. A larger batch's own step and the time per
    original batch its saving and speedup are of (audits 12 and 15: "un-profiled step 74.57 ms
    -> 19.16 ms" read as a step, where the 4x batch's is 76.63 ms)."""
    f = fmt or fmt_ms
    before, after = w["step_time_ns"], w["step_time_after_ns"]
    speedup = f"{w['speedup']:.2f}x" if w.get("speedup") else "n/a"
    low = w.get("speedup_low")
    other = (
        f"; {low:.2f}x {low_words}"
        if low and w.get("speedup") and abs(low / w["speedup"] - 1) > 0.05
        else ""
    )
    if assumed := w.get("speedup_loader_assumed"):
        # all fixes hide the loading; the loader fix's own assumption is the other end (audit
        # 19: 4.82 ms beside the loader fix's 11.22)
        other += (
            f"; that hides the data loading entirely: {assumed:.2f}x with the loader only "
            "twice as fast"
        )
    if w.get("multiplier") and w.get("batch_step_time_after_ns"):
        k = w["multiplier"]
        return (
            f"saves {saved_words(w, f)} per original batch (un-profiled step {f(before)} -> "
            f"{f(w['batch_step_time_after_ns'])} at {a_times(k)} batch, {f(after)} per original "
            f"batch: {speedup} per sample predicted{other})"
        )
    saved = saved_words(w, f)
    per = "" if saved.startswith("nothing") else f" {per}"
    return (
        f"saves {saved}{per} (un-profiled step {f(before)} -> {f(after)}, "
        f"{speedup} predicted{other})"
    )


# the loader's fixes (findings/savings.py LOADER_TRANSFORMS): beside a larger batch they assume
# the loader delivers that many times the samples
_LOADER_TRANSFORM_NAMES = ("dataloader_floor", "dataloader_unpinned")


def combined_fixes_words(doc: dict[str, Any], w: dict[str, Any]) -> str:
    """The findings whose fixes a combined what-if (all fixes) replayed, those not shown among
    the non-info findings named as such, and what a loader fix beside a larger batch assumes
    (audit 15: "All fixes together ... 4.89x" on a V100 trace, mostly from an info finding's
    fp16 fix nobody saw)."""
    names = set(w.get("transforms") or ())
    ids = [
        f["id"]
        for f in doc.get("findings", [])
        if (f.get("evidence") or {}).get("transform") in names
    ]
    if not ids:
        return ""
    hidden = [
        f["id"] for f in doc.get("findings", []) if f["id"] in ids and f["severity"] == "info"
    ]
    text = ", ".join(ids)
    if hidden:
        text += f"; {', '.join(hidden)} {'is' if len(hidden) == 1 else 'are'} info, not shown"
    k = w.get("multiplier")
    if k and names & set(_LOADER_TRANSFORM_NAMES):
        text += f"; assumes the loader keeps up with the {k}x batch ({k}x its rate)"
    # the fixes compound where each alone is bounded by what the others leave (audit 17: a
    # V100's all fixes saved 80.71 ms a step where the single savings added to 31.5)
    alone = [
        saving_per_step_ns(f["what_if"])
        for f in doc.get("findings", [])
        if f["id"] in ids and f.get("what_if") and not f["what_if"].get("multiplier")
    ]
    if not k and alone and saving_per_step_ns(w) > COMPOUND_MIN_RATIO * sum(alone):
        text += (
            f"; more than their savings alone added ({fmt_ms(sum(alone))}): each alone is "
            "bounded by what the others leave"
        )
    out = set(w.get("left_out") or ())
    if dropped := [
        f["id"]
        for f in doc.get("findings", [])
        if (f.get("evidence") or {}).get("transform") in out
    ]:
        text += f"; without {', '.join(dropped)}, whose fix with the others replays slower"
    return f" ({text})"


# all fixes together say they compound where they save this many times the single savings' sum
COMPOUND_MIN_RATIO = 1.25


def saving_share(w: dict[str, Any]) -> float | None:
    """A what-if's saving per step as a share of its un-profiled step (None for an empty step)."""
    return saving_per_step_ns(w) / w["step_time_ns"] if w["step_time_ns"] > 0 else None


# one-time calls taken out of the step (causal/transforms.py warmed) are named beside the
# profiler's cost where they are at least this share of the profiled step
WARMED_SAY_MIN_RATIO = 0.01


# the measured un-profiled step within this share of the model's: the two agree
MEASURED_AGREE_RATIO = 0.10


def measured_words(measured: int | None, unprofiled: float) -> str:
    """What the capture measured of the un-profiled step, beside the model's (empty where the
    trace does not carry it: analyzers/replay.py measured_step)."""
    if not measured or unprofiled <= 0:
        return ""
    r = measured / unprofiled
    said = (
        f" traceinsight.capture timed the step without the profiler in the same process just "
        f"before recording: {fmt_ns(measured)}"
    )
    if abs(r - 1) <= MEASURED_AGREE_RATIO:
        return said + f", {r:.2f}x the model's."
    return said + (
        f", {r:.2f}x the model's. The process ran at a pace the recorded events do not show "
        "(what the profiler costs, and what loader workers and other processes take of the "
        "host, vary between processes): the predictions are priced on the model's step and "
        "may differ on the step you run."
    )


def profiled_step_words(m: dict[str, Any]) -> str:
    """What the header's profiled step is: to the end of its GPU work where the trace has GPU
    activity (the steps' ends moved there), else the step range as recorded (audit 68: a trace
    with launch calls and no device activity read "to the end of its GPU work")."""
    if m.get("gpu_busy_ratio") is None:
        return "profiled step (its step range: no GPU activity)"
    return "profiled step (to the end of its GPU work)"


def prediction_basis(doc: dict[str, Any]) -> str | None:
    """The one sentence every reporter puts near its headline: what a predicted saving or
    speedup applies to (None without a step model)."""
    replay = (doc.get("details") or {}).get("replay") or {}
    unprofiled = replay.get("unprofiled_step_ns")
    if unprofiled is None:
        return None
    profiled = doc["metrics"].get("step_time_median_ns")
    how = (
        "the mean over the steps, whose loader waits repeat,"
        if replay.get("step_statistic") == "mean"
        else f"the profiled step to the end of its GPU work, median {fmt_ns(profiled)},"
    )
    low = replay.get("unprofiled_step_low_ns")
    ratio = replay.get("compiled_unprofiled_ratio")
    loader = replay.get("loader_interval_ns")
    measured = measured_words(replay.get("measured_step_ns"), unprofiled)
    if loader is not None and loader >= unprofiled:
        # analyzers/replay.py loader_interval_ns: the workers set the step, as recorded
        return (
            f"Predicted savings and speedups are {per_step(doc)} and apply to the un-profiled "
            f"step, {fmt_ns(unprofiled)}: the interval the DataLoader's workers delivered "
            "batches at, as recorded (the step waited for them); the profiler does not run in "
            "their processes, so the host time it cost the step moves into that wait." + measured
        )
    # the profiler's cost per event varies between processes: the trace cannot pin the step
    # closer than this (analyzers/replay.py PROFILER_COST_HIGH_FACTOR); on compiled code with
    # recorded shapes, the lowest measured on such recordings (COMPILED_UNPROFILED_RATIO)
    if low is None or low >= 0.98 * unprofiled:
        span = ""
    elif ratio:
        span = (
            f"; as low as {fmt_ns(low)}: compiled code recorded with its input shapes "
            f"(record_shapes=True, {replay.get('compiled_launches_per_step', 0):,.0f} Triton "
            "launches a step) costs the profiler more than its events show, and on such "
            f"recordings the un-profiled step measured {ratio[0]:.2f}-{ratio[1]:.2f}x the estimate"
        )
    else:
        span = (
            f"; as low as {fmt_ns(low)} where the profiler cost this process 2.5 times what the "
            "trace's no-work ops show"
        )
    less = "less the profiler's own cost"
    warmed, calls = replay.get("warmed_ns") or 0, replay.get("warmed_calls") or 0
    if profiled and warmed >= WARMED_SAY_MIN_RATIO * profiled:
        # a cold first launch is no profiler cost (audit 17: 6.53 of a toy's 6.94 ms taken out)
        what = plural(calls, "first launch or load", "first launches or loads")
        less += f" and the one-time work the steps held, {fmt_ns(warmed)} in {what}"
    text = (
        f"Predicted savings and speedups are {per_step(doc)} and apply to the un-profiled step, "
        f"{fmt_ns(unprofiled)} ({how} {less}{span})." + measured
    )
    unverified = next(
        (
            f["evidence"]
            for f in doc.get("findings", [])
            if "loader_unverified_speedup" in (f.get("evidence") or {})
        ),
        None,
    )
    if unverified is not None:
        # findings/rules.py loader_unverified: the workers' rate is not in the trace
        text += (
            " The DataLoader's workers kept up with the profiled step only: where they cannot "
            "keep up without the profiler, the step is longer, up to "
            f"{fmt_ns(unverified['loader_shown_interval_ns'])}, and the other fixes save less "
            "(dataloader_stall)."
        )
    if ratio:
        text += (
            " Its predictions are upper ends, and severities what both ends assure; without "
            "record_shapes the profiler costs compiled "
            "code less than half as much (a compiled ViT: 13.2 against 30.1 ms a step)."
        )
    return text


# --what-if's ids that did not apply as chosen, each list's key and its words (the reporters')
SELECTED_LISTS = (
    ("not_raised", "not raised here"),
    ("priced_not_raised", "priced although not raised here"),
    ("no_fix", "no fix to replay"),
)


def a_times(k: float | int | str) -> str:
    """ "a 4x", "an 8x": the article as the number is read ("an 8x batch", audit 21)."""
    text = f"{k}x"
    return ("an " if text.startswith("8") or text.startswith(("11x", "18x")) else "a ") + text


def plural(n: float, noun: str, many: str | None = None) -> str:
    """A count and its noun: ``1 step``, ``2 steps``, ``1,024 events``; ``many`` where adding
    an s is wrong (``copy``/``copies``). A float is shown rounded and agrees with what shows."""
    text = f"{n:,}" if isinstance(n, int) else f"{n:,.0f}"
    return f"{text} {noun if text in ('1', '-1') else many or noun + 's'}"


def _rounds_to_zero(number: str) -> bool:
    """Whether a formatted number shows no nonzero digit ("-0.0", "0 ns")."""
    return not any(c in "123456789" for c in number)


def unsigned_zero(text: str) -> str:
    """A formatted number that rounds to zero without its minus sign (audit 19: "-0.0" read as
    a loss): "-0.0%" is "0.0%", "-0 ns" "0 ns"; any other text as it is."""
    if text.startswith("-") and _rounds_to_zero(text.split(" ")[0]):
        return text[1:]
    return text


def fmt_ns(ns: float | int | None) -> str:
    """A duration in the largest unit that keeps it above 1 (s, ms, us, ns)."""
    if ns is None:
        return "n/a"
    ns = float(ns)
    if abs(ns) >= 1e9:
        return f"{ns / 1e9:.2f} s"
    if abs(ns) >= 1e6:
        return f"{ns / 1e6:.2f} ms"
    if abs(ns) >= 1e3:
        return f"{ns / 1e3:.1f} us"
    return unsigned_zero(f"{ns:.0f} ns")


def fmt_signed_ns(ns: float | int | None) -> str:
    """A change in time with its sign: "+184.1 us", "-67.5 us"; one that rounds to zero
    unsigned ("0 ns")."""
    if ns is None:
        return "n/a"
    text = fmt_ns(ns)
    return "+" + text if ns > 0 and not _rounds_to_zero(text) else text


def fmt_signed(x: float, digits: int = 1) -> str:
    """``x`` with its sign to ``digits`` decimals ("+0.6", "-38.8"); one that rounds to zero
    unsigned ("0.0", not "-0.0": audit 19)."""
    text = f"{x:+.{digits}f}"
    return text[1:] if float(text) == 0 else text


def fmt_ms(ns: float | int | None) -> str:
    """A duration in milliseconds, in seconds from one second on: finding titles compare in
    one unit within the step's scale, and a multi-second wait reads as the header says it
    ("7.35 s", not "7345.86 ms": audit 17)."""
    if ns is None:
        return "n/a"
    if abs(ns) >= 999_995_000:  # what rounds to 1000.00 ms reads "1.00 s"
        return f"{ns / 1e9:.2f} s"
    return unsigned_zero(f"{ns / 1e6:.2f} ms")


def fmt_pct(x: float | None) -> str:
    return "n/a" if x is None else unsigned_zero(f"{100 * x:.1f}%")


def fmt_small_pct(x: float | None) -> str:
    """:func:`fmt_pct`, with a positive share under 0.05% said as such (not "0.0%")."""
    return "<0.1%" if x is not None and 0 < x < 0.0005 else fmt_pct(x)


def kernel_words(name: str, n: int = 60) -> str:
    """A kernel's name for a title: its function, without the return type, namespaces,
    template and parameter lists (a C++ signature cut at a fixed length read
    "gather_keep_from_mask(bo"); the name as it is where it has no such parts."""
    base = name.removeprefix("void ").strip()
    cut = len(base)
    for i, ch in enumerate(base):  # the first '<' or '(' right after an identifier
        if ch in "<(" and i and (base[i - 1].isalnum() or base[i - 1] == "_"):
            cut = i
            break
    head = base[:cut].rsplit("::", 1)[-1] or base[:cut]
    return head if len(head) <= n else head[: n - 1] + "…"


def fmt_num(x: float | None) -> str:
    """A count or a mean of counts: whole numbers without a decimal ("483", not "483.0")."""
    if x is None:
        return "n/a"
    return unsigned_zero(f"{x:.0f}" if abs(x - round(x)) < 0.05 else f"{x:.1f}")


def fmt_bytes(n: int | None) -> str:
    if n is None:
        return "n/a"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def fmt_signed_bytes(n: float | None) -> str:
    """A change in bytes: "+8.4 MB", "-1.0 KB", "0 B"."""
    if n is None:
        return "n/a"
    n = int(n)
    return ("+" if n > 0 else "-" if n < 0 else "") + fmt_bytes(abs(n))


def fmt_metric(key: str, v: Any) -> str:
    """A metric by its name's unit suffix (docs/ARCHITECTURE.md, "Names")."""
    if v is None:
        return "n/a"
    if key.endswith("_ns"):
        return fmt_ns(v)
    if key.endswith(("_ratio", "_mean")):
        return fmt_pct(v)
    if key.endswith("_bytes"):
        return fmt_bytes(v)
    return f"{v:,.1f}" if isinstance(v, float) else f"{v:,}"


# what a finding's sources count: (one, many)
SOURCE_NOUNS = {
    "host_sync": ("sync", "syncs"),
    "dataloader_stall": ("DataLoader wait", "DataLoader waits"),
    "launch_bound": ("launch", "launches"),
    "pageable_memcpy": ("blocking copy", "blocking copies"),
}


def sources_coverage(finding: dict[str, Any]) -> str | None:
    """Where a finding's call sites hold fewer of its events than it counts, how many (audit
    17: nsys backtraces only some calls; CloverLeaf's sites held 273 of its 1,591 syncs,
    unsaid); None where they hold all, or the finding counts none."""
    ev = finding.get("evidence") or {}
    total = ev.get("host_sync_count") if finding.get("id") == "host_sync" else None
    sources = ev.get("sources") or []
    located = sum(s.get("count") or 0 for s in sources)
    if not total or not located or located >= total:
        return None
    if len(sources) >= SOURCES_KEPT:  # the list was cut: the rest may have stacks too
        return f"the {len(sources)} costliest call sites hold {located:,} of the {total:,} syncs"
    return (
        f"the call sites of {located:,} of the {total:,} syncs: the others have no recorded stack"
    )


# the call sites an analysis keeps per category (analyzers/sources.py cuts its list to them)
SOURCES_KEPT = 10


def fmt_source(src: dict[str, Any], noun: tuple[str, str]) -> str:
    """One attributed source: ``4 syncs in step() (train.py:259) via .item(), 1.20 ms in the
    calls`` (``noun``: the thing counted, one and many; the time is the host's in those calls,
    not the GPU's idle the finding's title gives)."""
    t = src["trigger"]
    # a Python method call, else a module or API name; native and NVTX sources call functions
    via = (f".{t}()" if t[:1].islower() else t) if src.get("line") is not None else f"{t}()"
    # a Python frame has file and line, a native one its module, an NVTX range neither
    where = ":".join(str(x) for x in (src.get("file"), src.get("line")) if x is not None)
    return (
        f"{plural(src['count'], *noun)} in {src['function']}()"
        + (f" ({where})" if where else "")
        + f" via {via}, {fmt_ms(src['cost_ns'])} in the calls"
    )
