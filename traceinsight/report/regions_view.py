"""The region breakdown for the HTML report: the table's rows and an icicle layout of GPU time
by region (boxes in a 0..1 width per row, parents above children), from the JSON document."""

from __future__ import annotations

from typing import Any

MAX_ROWS = 60  # table rows (the JSON has up to 300 regions)
MAX_DEPTH = 8  # icicle rows
MIN_WIDTH_RATIO = 0.002  # boxes narrower than this share of the GPU time are left out


def region_rows(regions: dict[str, Any]) -> list[dict[str, Any]]:
    """Regions by GPU time, with their top idle cause (what the table shows)."""
    rows = sorted(regions.get("regions") or [], key=lambda r: (-r["gpu_ns"], r["path"]))
    out = []
    for r in rows[:MAX_ROWS]:
        causes = sorted(((v, c) for c, v in r["idle_by_cause_ns"].items() if v), reverse=True)
        out.append(dict(r, top_cause=causes[0][1] if causes else None))
    return out


def icicle(regions: dict[str, Any]) -> list[dict[str, Any]]:
    """Boxes (x, w in 0..1 of the window's GPU time; depth; the region) laid out top-down:
    each region's children side by side inside it, largest first."""
    items = regions.get("regions") or []
    total = (regions.get("attributed_gpu_ns") or 0) + (regions.get("unattributed_gpu_ns") or 0)
    if not items or total <= 0:
        return []
    children: dict[str | None, list[dict[str, Any]]] = {}
    for r in items:
        children.setdefault(r.get("parent"), []).append(r)
    boxes: list[dict[str, Any]] = []

    def place(parent: str | None, x: float, depth: int) -> None:
        if depth >= MAX_DEPTH:
            return
        for r in sorted(children.get(parent, []), key=lambda r: (-r["gpu_ns"], r["path"])):
            w = r["gpu_ns"] / total
            if w < MIN_WIDTH_RATIO:
                continue  # sorted: the rest are narrower still
            boxes.append({"x": x, "w": w, "depth": depth, "r": r})
            place(r["path"], x, depth + 1)
            x += w

    place(None, 0.0, 0)
    return boxes
