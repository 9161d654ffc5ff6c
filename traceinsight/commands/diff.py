"""``traceinsight diff BEFORE AFTER``: what changed, and a CI gate on step time."""

from __future__ import annotations

import sys
from pathlib import Path

from traceinsight.errors import EXIT_GATE, EXIT_OK


def run(
    before: Path,
    after: Path,
    *,
    output: Path | None,
    html: bool,
    json_out: str | None,
    quiet: bool,
    force: bool,
    fail_if_slower: float | None,
) -> int:
    from traceinsight.diff import diff_paths
    from traceinsight.report.files import check_writable, write_text_atomic
    from traceinsight.report.json_out import emit_json
    from traceinsight.report.terminal import render_diff_summary

    report = (output or Path.cwd() / f"diff_{before.name.split('.')[0]}_{after.name.split('.')[0]}.traceinsight.html") if html else None
    if report is not None:
        check_writable(report, force)
    json_path = Path(json_out) if json_out and json_out != "-" else None
    if json_path is not None:
        check_writable(json_path, force)
    doc = diff_paths(before, after)
    if report is not None:
        from traceinsight.report.html import environment

        write_text_atomic(report, environment().get_template("diff.html.j2").render(doc=doc))
    emit_json(doc, json_out)
    if not quiet and json_out != "-":
        print(render_diff_summary(doc, str(report) if report else None))
    ch = doc["step_time_change"]
    if fail_if_slower is not None and ch is not None and ch * 100 > fail_if_slower:
        print(f"traceinsight: step time {100 * ch:.1f}% slower, over --fail-if-slower {fail_if_slower:g}%", file=sys.stderr)
        return EXIT_GATE
    return EXIT_OK
