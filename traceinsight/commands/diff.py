"""``traceinsight diff BEFORE AFTER``: what changed, and a CI gate on step time (or throughput)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from traceinsight.errors import EXIT_BAD_INPUT, EXIT_GATE, EXIT_OK
from traceinsight.options import Options


def default_report_path(before: Path, after: Path) -> Path:
    return (
        Path.cwd()
        / f"diff_{before.name.split('.')[0]}_{after.name.split('.')[0]}.traceinsight.html"
    )


def run(
    before: Path,
    after: Path,
    opts: Options,
    *,
    output: Path | None = None,
    html: bool = True,
    json_out: str | None = None,
    quiet: bool = False,
    force: bool = False,
    fail_if_slower: float | None = None,
    allow_different_hardware: bool = False,
) -> int:
    from traceinsight.diff import diff_paths
    from traceinsight.io import check_outputs
    from traceinsight.pipeline import graded
    from traceinsight.runtime import Runtime

    graded(opts)
    report = (output or default_report_path(before, after)) if html else None
    check_outputs(report, json_out, force)
    doc = diff_paths(before, after, opts, Runtime.detect(helpers=True))
    return write_and_gate(doc, report, json_out, quiet, fail_if_slower, allow_different_hardware)


def write_and_gate(
    doc: dict[str, Any],
    report: Path | None,
    json_out: str | None,
    quiet: bool,
    fail_if_slower: float | None,
    allow_different_hardware: bool,
) -> int:
    """A diff document's outputs (HTML, JSON, summary), then the gate's exit code."""
    from traceinsight.io import write_text_atomic
    from traceinsight.report.json_out import emit_json
    from traceinsight.report.terminal import render_diff_summary

    if report is not None:
        from traceinsight.report.diff_html import render_diff_html

        write_text_atomic(report, render_diff_html(doc))
    emit_json(doc, json_out)
    if not quiet and json_out != "-":
        print(render_diff_summary(doc, str(report) if report else None))
    if fail_if_slower is None:
        return EXIT_OK
    if doc["hardware_differs"] and not allow_different_hardware:
        print(
            "traceinsight: not gating on a diff across different hardware ("
            + "; ".join(doc["warnings"])
            + "); pass --allow-different-hardware to gate anyway",
            file=sys.stderr,
        )
        return EXIT_BAD_INPUT
    return gate_exit(doc["gate"], fail_if_slower)


def gate_exit(gate: dict[str, Any], fail_if_slower: float) -> int:
    """EXIT_GATE when the slowdown is over the threshold and not inside the noise interval."""
    slow = gate["slowdown_ratio"]
    what = {"step_time": "step time", "iteration_time": "iteration time"}.get(
        gate["basis"] or "", "time per kernel (throughput)"
    )
    if slow is None or slow * 100 <= fail_if_slower:
        return EXIT_OK
    if gate["significant"] is False:
        lo, hi = gate["interval"]
        print(
            f"traceinsight: {what} {100 * slow:.1f}% slower, but within the noise "
            f"({100 * lo:+.1f}% .. {100 * hi:+.1f}%): not failing",
            file=sys.stderr,
        )
        return EXIT_OK
    print(
        f"traceinsight: {what} {100 * slow:.1f}% slower, over --fail-if-slower {fail_if_slower:g}%",
        file=sys.stderr,
    )
    return EXIT_GATE
