"""The HTML diff report: before/after side by side, one self-contained file."""

from __future__ import annotations

from typing import Any

from traceinsight.report.evidence import label
from traceinsight.report.format import fmt_bytes, fmt_ns, fmt_pct, fmt_signed
from traceinsight.report.html import environment

# metrics that are shares without the _ratio suffix
_SHARES = ("mfu", "hfu", "occupancy_median")


def is_share(metric: str) -> bool:
    return metric.endswith("_ratio") or metric in _SHARES


def diff_value(metric: str, v: Any) -> str:
    """A metric's value by its name's unit: ns as ms/us, shares as %, bytes in MB/GB, FLOPs
    and TFLOP/s with their unit, counts with separators."""
    if v is None:
        return "n/a"
    if metric.endswith("_ns"):
        return fmt_ns(v)
    if is_share(metric):
        return fmt_pct(v)
    if metric.endswith("_bytes"):
        return fmt_bytes(int(v))
    if metric.endswith("_bytes_per_step"):
        return fmt_bytes(int(v)) + " per step"
    if metric.endswith("tflops"):
        return f"{v:,.1f} TFLOP/s"
    if metric.startswith("flops"):
        return f"{v / 1e9:,.1f} GFLOP"
    if metric.endswith("_cv"):
        return f"{v:.3f}"
    if isinstance(v, float) and not v.is_integer():
        return f"{v:,.1f}"
    return f"{int(v):,}"


def diff_change(r: dict[str, Any]) -> str:
    """The change: shares in percentage points (a relative change of a share reads wrongly),
    the rest relative to before."""
    if is_share(r["metric"]):
        d = r.get("delta")
        return "" if d is None else f"{_signed(100 * d)} pts"
    return "" if r.get("change") is None else f"{_signed(100 * r['change'])}%"


def _signed(x: float) -> str:
    """``x`` to one decimal with its sign, a change that rounds to zero unsigned (audit 19:
    "-0.0 pts")."""
    return fmt_signed(x)


# labels the diff says otherwise than a finding's evidence: a diff does not carry the devices'
# memory type, so a bandwidth share is of the memory's peak, HBM or not (audit 19: "(of HBM)")
DIFF_LABELS = {
    "memory_bound_bandwidth_ratio": "memory-bound kernels' bandwidth (of the memory's peak)",
}


def metric_rows(rows: list[dict[str, Any]], skip: set[str] = frozenset()) -> list[dict[str, str]]:
    """Rows as a reader sees them: a label, before, after, the change; metrics neither side has
    and those ``skip`` names (shown in another table) left out."""
    return [
        {
            "metric": r["metric"],
            "label": DIFF_LABELS.get(r["metric"]) or label(r["metric"]),
            "before": diff_value(r["metric"], r["before"]),
            "after": diff_value(r["metric"], r["after"]),
            "change": diff_change(r),
        }
        for r in rows
        if r["metric"] not in skip and (r["before"] is not None or r["after"] is not None)
    ]


def render_diff_html(doc: dict[str, Any]) -> str:
    memory = metric_rows(doc.get("memory") or [])
    # the allocator's calls per step are memory rows: shown there, not twice
    metrics = metric_rows(doc.get("metrics") or [], skip={r["metric"] for r in memory})
    return (
        environment()
        .get_template("diff.html.j2")
        .render(doc=doc, metric_rows=metrics, memory_rows=memory)
    )
