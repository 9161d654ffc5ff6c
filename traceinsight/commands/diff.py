"""``traceinsight diff BEFORE AFTER``: what changed, and a CI gate on step time."""

from __future__ import annotations

import sys
from pathlib import Path

from traceinsight.errors import EXIT_GATE, EXIT_OK
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
) -> int:
    from traceinsight.diff import diff_paths
    from traceinsight.io import check_writable, write_text_atomic
    from traceinsight.report.json_out import emit_json
    from traceinsight.report.terminal import render_diff_summary
    from traceinsight.runtime import Runtime

    opts.graded()
    report = (output or default_report_path(before, after)) if html else None
    if report is not None:
        check_writable(report, force)
    json_path = Path(json_out) if json_out and json_out != "-" else None
    if json_path is not None:
        check_writable(json_path, force)
    doc = diff_paths(before, after, opts, Runtime.detect(helpers=True))
    if report is not None:
        from traceinsight.report.diff_html import render_diff_html

        write_text_atomic(report, render_diff_html(doc))
    emit_json(doc, json_out)
    if not quiet and json_out != "-":
        print(render_diff_summary(doc, str(report) if report else None))
    ch = doc["step_time_change"]
    if fail_if_slower is not None and ch is not None and ch * 100 > fail_if_slower:
        print(
            f"traceinsight: step time {100 * ch:.1f}% slower, over --fail-if-slower {fail_if_slower:g}%",
            file=sys.stderr,
        )
        return EXIT_GATE
    return EXIT_OK
