"""The HTML's memory sections. A trace's: per device, allocated and reserved over the window as
SVG polylines (in the plot's 100 x 100 box), the steps as bands, the peak with the op allocating then and
what the bytes at the peak are (the memory profiler's categories, where the source has them). A
job's: one row per rank (and device) with the rank's memory metrics, and the ranks' memory
findings."""

from __future__ import annotations

from typing import Any

from traceinsight.constants import MEMORY_DEVICE_METRICS
from traceinsight.report.charts import TOP_PX, bytes_axis, nice_top, plot_x, time_axis

MEMORY_FINDINGS = ("memory_growth", "memory_fragmentation", "allocator_churn", "memory_headroom")
# The memory profiler's categories as the report names them (schema.MEMORY_CATEGORIES' order).
CATEGORY_LABELS = {
    "parameter": "parameters",
    "optimizer_state": "optimizer state",
    "input": "inputs",
    "temporary": "temporaries",
    "activation": "activations",
    "gradient": "gradients",
    "autograd_detail": "autograd detail",
    "unknown": "unknown",
}


def peak_categories(dev: dict[str, Any]) -> list[dict[str, Any]]:
    """The categories with bytes live at the peak (their order), each with its share of the
    peak; none where the source has no categories."""
    cats = dev.get("peak_by_category_bytes") or {}
    peak = dev.get("peak_allocated_bytes")
    return [
        {
            "category": c,
            "label": CATEGORY_LABELS.get(c, c),
            "bytes": b,
            "ratio": b / peak if peak else None,
        }
        for c, b in cats.items()
        if b
    ]


def job_memory(doc: dict[str, Any]) -> dict[str, Any]:
    """A job's memory section: one row per rank with memory events (per device where a rank
    has several: its metrics are {device: value} then), and every rank's memory findings."""
    active: dict[int, list[str]] = {}  # each rank's GPUs: a single one names a plain metric's
    for dev in (doc.get("source") or {}).get("devices") or []:
        active.setdefault(dev.get("rank"), []).append(str(dev.get("id")))
    rows = []
    for r in doc.get("ranks") or []:
        m = r.get("metrics") or {}
        per_device = [m.get(k) for k in MEMORY_DEVICE_METRICS if isinstance(m.get(k), dict)]
        devices: list[str | None] = (
            sorted({d for v in per_device for d in v}, key=_device_order) if per_device else [None]
        )
        for dev in devices:
            mine = active.get(r["rank"]) or []
            shown = dev if dev is not None else mine[0] if len(mine) == 1 else None
            row = {k: _on(m.get(k), dev) for k in MEMORY_DEVICE_METRICS}
            if (
                row["memory_peak_allocated_bytes"] is None
                and row["memory_peak_reserved_bytes"] is None
            ):
                continue
            rows.append(
                {
                    "rank": r["rank"],
                    "device": shown,
                    **row,
                    "allocs_per_step": m.get("allocator_device_allocs_per_step"),
                    "frees_per_step": m.get("allocator_device_frees_per_step"),
                }
            )
    findings = [
        {**f, "rank": r["rank"]}
        for r in doc.get("ranks") or []
        for f in r.get("findings") or []
        if f["id"] in MEMORY_FINDINGS
    ]
    return {"rows": rows, "findings": findings}


def _on(v: Any, device: str | None) -> Any:
    """A metric's value on ``device`` (a plain value is the rank's only device's)."""
    if isinstance(v, dict):
        return v.get(device) if device is not None else None
    return v


def _device_order(d: str) -> tuple[int, str]:
    return (int(d), d) if d.isdigit() else (1 << 30, d)


MEMORY_PLOT_PX = 140


def memory_charts(doc: dict[str, Any]) -> list[dict[str, Any]]:
    d = doc.get("details") or {}
    mem = d.get("memory") or {}
    steps = (d.get("steps") or {}).get("per_step") or []
    out = []
    for dev in mem.get("devices") or []:
        tl = dev.get("timeline") or {}
        ts = tl.get("t_ns") or []
        if not ts:
            continue
        t0 = tl["start_ns"]
        span = max([ts[-1], *(s["end_ns"] - t0 for s in steps)] + [1])
        vals = [v for v in tl["allocated_bytes"] + tl["reserved_bytes"] if v is not None]
        # the y axis ends at a round tick at or above the largest value
        top, _ = nice_top(max(vals + [1]))

        peak = None
        if dev.get("peak_ns") is not None and dev.get("peak_allocated_bytes") is not None:
            peak = {
                # in the chart's frame (percent, px): a circle there stays round
                "x": plot_x((dev["peak_ns"] - t0) / span),
                "y": TOP_PX + MEMORY_PLOT_PX * (1 - dev["peak_allocated_bytes"] / top),
                "op": dev.get("peak_op"),
                "root": dev.get("peak_root_op")
                if dev.get("peak_root_op") != dev.get("peak_op")
                else None,
                "bytes": dev["peak_allocated_bytes"],
            }
        bands = [
            {
                "x": 100 * (s["start_ns"] - t0) / span,
                "w": 100 * s["dur_ns"] / span,
                "step": s["step"],
                "odd": i % 2,
            }
            for i, s in enumerate(steps[:500])
        ]
        out.append(
            {
                "dev": dev,
                "allocated": _points(ts, tl["allocated_bytes"], span, top),
                "reserved": _points(ts, tl["reserved_bytes"], span, top),
                "bands": bands,
                "peak": peak,
                "categories": peak_categories(dev),
                "top_bytes": top,
                "span_ns": span,
                "height": MEMORY_PLOT_PX,
                "yticks": bytes_axis(top, MEMORY_PLOT_PX),
                "xticks": time_axis(span),
            }
        )
    return out


def _points(ts: list[int], vs: list[int | None], span: int, top: int) -> str:
    """SVG polyline points in the plot's 0..100 box: x over ``span``, y over ``top``..0 (nulls
    left out)."""
    return " ".join(
        f"{100 * t / span:.3f},{100 - 100 * v / top:.3f}"
        for t, v in zip(ts, vs, strict=True)
        if v is not None
    )
