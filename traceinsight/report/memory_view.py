"""The HTML's memory section: per device, allocated and reserved over the window as SVG
polylines (in a 100 x 40 box), the steps as bands and the peak with the op allocating then."""

from __future__ import annotations

from typing import Any

MEMORY_FINDINGS = ("memory_growth", "memory_fragmentation", "allocator_churn", "memory_headroom")


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
        top = max(vals + [1])

        peak = None
        if dev.get("peak_ns") is not None and dev.get("peak_allocated_bytes") is not None:
            peak = {
                "x": 100 * (dev["peak_ns"] - t0) / span,
                "y": 38 - 36 * dev["peak_allocated_bytes"] / top,
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
                "top_bytes": top,
                "span_ns": span,
            }
        )
    return out


def _points(ts: list[int], vs: list[int | None], span: int, top: int) -> str:
    """SVG polyline points: x in 0..100 over ``span``, y in 2..38 over 0..``top`` (nulls left out)."""
    return " ".join(
        f"{100 * t / span:.3f},{38 - 36 * v / top:.3f}"
        for t, v in zip(ts, vs, strict=True)
        if v is not None
    )
