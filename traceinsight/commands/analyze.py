"""``traceinsight analyze``: one trace in, terminal summary + HTML report (+ JSON) out."""

from __future__ import annotations

import sys
from pathlib import Path

from traceinsight.errors import EXIT_GATE, EXIT_OK, InputError

SEVERITY_ORDER = ("high", "medium", "low", "info")


def default_report_path(trace: Path) -> Path:
    name = trace.name
    for suffix in (".gz", ".json", ".sqlite", ".nsys-rep"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    name = name.removesuffix(".pt.trace")
    return Path.cwd() / f"{name}.traceinsight.html"


def run(
    path: Path,
    *,
    output: Path | None,
    json_out: str | None,
    html: bool,
    quiet: bool,
    force: bool,
    open_browser: bool,
    fail_on: str | None,
    step_range: str | None,
    max_bytes: int | None,
    thresholds: dict[str, float],
    command: str,
) -> int:
    from traceinsight.api import analyze_path
    from traceinsight.diagnosis import Thresholds
    from traceinsight.report.files import check_writable
    from traceinsight.report.json_out import dumps, write_json
    from traceinsight.report.terminal import render_summary

    try:
        th = Thresholds.from_overrides(thresholds)
    except ValueError as exc:
        raise InputError(str(exc)) from None
    report = (output or default_report_path(path)) if html else None
    if report is not None:
        check_writable(report, force)
    json_path = Path(json_out) if json_out and json_out != "-" else None
    if json_path is not None:
        check_writable(json_path, force)

    step_pattern = f"^{step_range}" if step_range else None
    analysis = analyze_path(path, thresholds=th, step_pattern=step_pattern, max_bytes=max_bytes, command=command)
    doc = analysis.to_json()
    if report is not None:
        from traceinsight.report.html import write_html

        write_html(analysis, report, force=True)
    if json_out == "-":
        sys.stdout.buffer.write(dumps(doc) + b"\n")
    elif json_path is not None:
        write_json(doc, json_path)
    if not quiet and json_out != "-":
        print(render_summary(doc, str(report) if report else None))
    if report is not None and open_browser:
        import webbrowser

        webbrowser.open(report.resolve().as_uri())
    if fail_on:
        limit = SEVERITY_ORDER.index(fail_on)
        hits = [f for f in analysis.findings if SEVERITY_ORDER.index(f.severity) <= limit]
        if hits:
            print(f"traceinsight: --fail-on {fail_on}: {len(hits)} finding(s), first: {hits[0].id}", file=sys.stderr)
            return EXIT_GATE
    return EXIT_OK
