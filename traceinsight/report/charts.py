"""Chart geometry for the HTML report: axes with ticks in units a reader uses, and the plot area.

Every chart is an ``<svg>`` without a viewBox (so text and markers are never stretched) holding a
nested ``<svg viewBox="0 0 100 100" preserveAspectRatio="none">`` for the data: the data stretch
with the page width, the axes' labels and the markers keep their shape. x positions of ticks are
percentages of the chart's width, y positions pixels.
"""

from __future__ import annotations

import math
from typing import Any

from traceinsight.report.format import fmt_bytes

# the plot area inside the chart: left margin for the y labels (percent), top, and its height
LEFT_PCT = 7.0
RIGHT_PCT = 1.5
TOP_PX = 8
MAX_X_LABELS = 12


def nice_ticks(top: float, target: int = 5) -> list[float]:
    """0, then round steps (1, 2, 2.5 or 5 x 10^k) up to ``top``: at most ``target`` + 1."""
    if not top or top <= 0 or not math.isfinite(top):
        return [0.0]
    raw = top / target
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    n = int(top / step + 1e-9)
    return [i * step for i in range(n + 1)]


def nice_top(top: float, target: int = 4) -> tuple[float, list[float]]:
    """An axis over 0..``top`` ending at the first round tick at or above it, and its ticks."""
    ticks = nice_ticks(top, target)
    if len(ticks) < 2:
        return top or 1.0, ticks
    step = ticks[1]
    end = math.ceil(top / step - 1e-9) * step
    return end, [i * step for i in range(round(end / step) + 1)]


def _ms(ns: float, step_ns: float) -> str:
    """A tick in ms with as many decimals as the tick step needs."""
    ms, step_ms = ns / 1e6, step_ns / 1e6
    digits = 0 if step_ms >= 1 else min(3, math.ceil(-math.log10(step_ms)) + 1)
    return f"{ms:.{digits}f} ms"


def plot_x(frac: float) -> float:
    """A point at ``frac`` (0..1) of the plot's width, as a percentage of the chart's."""
    return LEFT_PCT + (100 - LEFT_PCT - RIGHT_PCT) * frac


def time_axis(span_ns: float, target: int = 8) -> list[dict[str, Any]]:
    """Ticks of a time axis over ``span_ns`` from the window's start, in ms."""
    ticks = nice_ticks(span_ns, target)
    step = ticks[1] if len(ticks) > 1 else span_ns or 1
    return [
        {"x": plot_x(t / span_ns) if span_ns else plot_x(0), "label": _ms(t, step)} for t in ticks
    ]


def y_axis(top: float, height_px: float, fmt: Any, target: int = 4) -> list[dict[str, Any]]:
    """Ticks of a y axis over 0..``top`` drawn ``height_px`` tall below TOP_PX."""
    ticks = nice_ticks(top, target)
    return [
        {"y": TOP_PX + height_px * (1 - t / top) if top else TOP_PX + height_px, "label": fmt(t)}
        for t in ticks
    ]


def step_chart(
    steps: list[dict[str, Any]], outliers: set[int], height_px: int = 120
) -> dict[str, Any]:
    """Step-time bars: y in ms with ticks, x the step numbers (a label every few steps)."""
    shown = steps[:500]
    n = len(shown)
    top, ticks = nice_top(max((s["dur_ns"] for s in shown), default=0) or 1)
    step = ticks[1] if len(ticks) > 1 else top
    bw = 100.0 / max(n, 1)
    bars = [
        {
            "x": i * bw + bw * 0.1,
            "w": bw * 0.8,
            "y": 100 * (1 - s["dur_ns"] / top),
            "h": 100 * s["dur_ns"] / top,
            "step": s["step"],
            "s": s,
            "outlier": s["step"] in outliers,
        }
        for i, s in enumerate(shown)
    ]
    stride = max(1, math.ceil(n / MAX_X_LABELS))
    xticks = [
        {"x": plot_x((i + 0.5) / n), "label": str(s["step"])}
        for i, s in enumerate(shown)
        if i % stride == 0
    ]
    yticks = [{"y": TOP_PX + height_px * (1 - t / top), "label": _ms(t, step)} for t in ticks]
    return {"bars": bars, "xticks": xticks, "yticks": yticks, "height": height_px}


def bytes_axis(top: float, height_px: float) -> list[dict[str, Any]]:
    return y_axis(top, height_px, lambda b: fmt_bytes(int(b)) if b else "0")


# the roofline's viewBox and margins, and its log10 x range (FLOP/byte): the page's script
# (partials/efficiency.html.j2) draws with the same numbers
ROOF_W, ROOF_H, ROOF_L, ROOF_R, ROOF_T, ROOF_B = 640, 360, 56, 12, 12, 40
ROOF_X0, ROOF_X1 = -2, 4


def roofline_chart(roof: dict[str, Any]) -> dict[str, Any] | None:
    """The roofline drawn on the server, so the page shows it without JavaScript (audit 19: an
    empty ``svg#roofline``): log-log grid, the memory and compute roofs, a dot per point with
    its tooltip; the script redraws it with labels. None without peaks or points."""
    peak, bw = roof.get("peak_tflops"), roof.get("bandwidth_bytes_per_s")
    if not peak or not bw or not roof.get("points"):
        return None
    ymax = math.log10(peak) + 0.5
    ymin = ymax - 6

    def x(v: float) -> float:
        return ROOF_L + (math.log10(v) - ROOF_X0) / (ROOF_X1 - ROOF_X0) * (ROOF_W - ROOF_L - ROOF_R)

    def y(v: float) -> float:
        return ROOF_T + (ymax - math.log10(v)) / (ymax - ymin) * (ROOF_H - ROOF_T - ROOF_B)

    lo, hi = 10.0**ROOF_X0, 10.0**ROOF_X1
    knee = peak * 1e12 / bw
    roof_line = [(x(lo), y(bw * lo / 1e12)), (x(knee), y(peak)), (x(hi), y(peak))]
    colors = roof.get("colors") or {}
    dots = [
        {
            "x": x(min(max(p["intensity"], lo), hi)),
            "y": y(max(p["tflops"], 10.0**ymin)),
            "r": 6 if p["kind"] == "class" else 3.5,
            "color": colors.get(p["kernel_class"], "#999"),
            "opacity": 0.9 if p["kind"] == "class" else 0.6,
            "title": f"{p['label']}: {p['tflops']:.2f} TFLOP/s at {p['intensity']:.1f} FLOP/byte",
        }
        for p in sorted(roof["points"], key=lambda p: p["kind"] != "class")
        if p.get("intensity") and p["intensity"] > 0 and p.get("tflops") and p["tflops"] > 0
    ]
    return {
        "width": ROOF_W,
        "height": ROOF_H,
        "left": ROOF_L,
        "right": ROOF_W - ROOF_R,
        "top": ROOF_T,
        "bottom": ROOF_H - ROOF_B,
        "xgrid": [(x(10.0**i), f"1e{i}") for i in range(ROOF_X0, ROOF_X1 + 1)],
        "ygrid": [(y(10.0**j), f"1e{j}") for j in range(math.ceil(ymin), math.floor(ymax) + 1)],
        "roof": " ".join(f"{a:.1f},{b:.1f}" for a, b in roof_line),
        "peak_label": f"peak {peak:.0f} TFLOP/s",
        "peak_y": y(peak),
        "dots": dots,
    }
