"""``traceinsight analyze``: a trace or a job in, terminal summary + HTML report (+ JSON) out."""

from __future__ import annotations

import sys
from pathlib import Path

from traceinsight.constants import SEVERITIES
from traceinsight.errors import EXIT_GATE, EXIT_OK, OutputError
from traceinsight.options import Options
from traceinsight.runtime import Runtime, configure_single_trace_process


def default_report_path(trace: Path) -> Path:
    name = trace.name
    for suffix in (".gz", ".json", ".sqlite", ".nsys-rep"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    name = name.removesuffix(".pt.trace")
    return Path.cwd() / f"{name}.traceinsight.html"


def run(
    path: Path,
    opts: Options,
    *,
    output: Path | None = None,
    json_out: str | None = None,
    html: bool = True,
    quiet: bool = False,
    force: bool = False,
    open_browser: bool = False,
    fail_on: str | None = None,
    annotate: Path | None = None,
    fmt: str = "terminal",
) -> int:
    if path.is_file():
        configure_single_trace_process(path.stat().st_size)
    from traceinsight.api import analyze_with
    from traceinsight.io import check_outputs, check_writable, write_text_atomic
    from traceinsight.report import terminal
    from traceinsight.report.json_out import emit_json

    opts.graded()  # a bad --threshold fails before any output is checked or parsed
    # --format markdown: the Markdown summary is the report (-o names it, else stdout), no HTML
    markdown_out = output if fmt == "markdown" else None
    if fmt == "markdown":
        html = False
        if markdown_out is None and json_out == "-":
            raise OutputError("--json - and --format markdown both write to stdout: give -o FILE")
        if markdown_out is not None:
            check_writable(markdown_out, force)
    report = (output or default_report_path(path)) if html else None
    check_outputs(report, json_out, force)
    # The command's own __main__ is import-safe, so a large trace may use helper processes
    # (where the native scanner is not built; threads otherwise).
    if annotate is not None:
        check_writable(annotate, force)
    analysis = analyze_with(path, opts, Runtime.detect(helpers=True))
    doc = analysis.to_json()
    if annotate is not None:
        from traceinsight.commands.annotate import write

        write(analysis, path, annotate)
        doc["annotated_trace"] = str(annotate)
    if report is not None:
        from traceinsight.report.html import render

        write_text_atomic(report, render(doc))
    emit_json(doc, json_out)
    if fmt == "markdown":
        from traceinsight.report import markdown

        text = markdown.render(doc)
        if markdown_out is None:
            sys.stdout.write(text)
        else:
            write_text_atomic(markdown_out, text)
    if not quiet and json_out != "-" and not (fmt == "markdown" and markdown_out is None):
        written = markdown_out or report  # the summary names the report it wrote
        print(terminal.render(doc, str(written) if written else None))
    if report is not None and open_browser:
        import webbrowser

        webbrowser.open(report.resolve().as_uri())
    if fail_on:
        limit = SEVERITIES.index(fail_on)
        hits = [f for f in doc["findings"] if SEVERITIES.index(f["severity"]) <= limit]
        if hits:
            print(
                f"traceinsight: --fail-on {fail_on}: {len(hits)} finding(s), first: {hits[0]['id']}",
                file=sys.stderr,
            )
            return EXIT_GATE
    return EXIT_OK
