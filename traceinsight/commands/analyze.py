"""``traceinsight analyze``: one trace in, terminal summary + HTML report (+ JSON) out."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from traceinsight.errors import EXIT_GATE, EXIT_OK, InputError

SEVERITY_ORDER = ("high", "medium", "low", "info")
# polars' allocator (jemalloc) hands freed memory back to the OS within half a second, so each
# phase of a large analysis faults fresh pages in again. For one trace, kept 10 s: on the 1 GB
# nsys export 25% fewer page faults and 0.5 s less wall. Blocks from 1 MiB (not 8) come from the
# arena all threads share, so a column freed by one thread is reused by the next: 0.3 GB less
# peak there, 0.1 GB on the 10x trace (benchmarks/RESULTS.md). Not for a directory of ranks,
# nor in `batch`: worker processes holding on to freed memory made two-worker batches 10%
# slower. Set before polars loads (it appends this to its own defaults, and jemalloc takes the
# last value); a user's own setting wins.
ALLOCATOR_ENV = "_RJEM_MALLOC_CONF"
ALLOCATOR_CONF = "dirty_decay_ms:10000,muzzy_decay_ms:10000,oversize_threshold:1048576"


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
    if path.is_file() and "polars" not in sys.modules:
        os.environ.setdefault(ALLOCATOR_ENV, ALLOCATOR_CONF)
    from traceinsight.diagnosis import Thresholds
    from traceinsight.report.files import check_writable
    from traceinsight.report.json_out import emit_json

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

    # --step-range is a name prefix (its help, the README): literal, so "(" is no regex error
    step_pattern = "^" + re.escape(step_range) if step_range else None
    findings, doc, render, summary = _analyze_any(path, th, thresholds, step_pattern, max_bytes, command)
    if report is not None:
        from traceinsight.report.files import write_text_atomic

        write_text_atomic(report, render(doc))
    emit_json(doc, json_out)
    if not quiet and json_out != "-":
        print(summary(doc, str(report) if report else None))
    if report is not None and open_browser:
        import webbrowser

        webbrowser.open(report.resolve().as_uri())
    if fail_on:
        limit = SEVERITY_ORDER.index(fail_on)
        hits = [f for f in findings if SEVERITY_ORDER.index(f["severity"]) <= limit]
        if hits:
            print(f"traceinsight: --fail-on {fail_on}: {len(hits)} finding(s), first: {hits[0]['id']}", file=sys.stderr)
            return EXIT_GATE
    return EXIT_OK


def _analyze_any(
    path: Path,
    th: Any,
    overrides: dict[str, float],
    step_pattern: str | None,
    max_bytes: int | None,
    command: str,
) -> tuple[list[dict[str, Any]], dict[str, Any], Callable[[dict[str, Any]], str], Callable[..., str]]:
    """A trace file, a job directory, or a file holding several ranks -> (findings, doc, html, text)."""
    from traceinsight.report import html, terminal

    if path.is_dir():
        from traceinsight.jobs import analyze_job

        doc = analyze_job(path, max_bytes=max_bytes, thresholds=overrides).to_json()
        doc["command"] = command
        return doc["findings"], doc, html.render_job_html, terminal.render_job_summary
    from traceinsight.api import analyze_trace
    from traceinsight.parsers import load_trace
    from traceinsight.parsers.kineto_fast import default_helpers

    # The command's own __main__ is import-safe, so a large trace may use helper processes.
    trace = load_trace(path, max_bytes=max_bytes, parse_helpers=default_helpers())
    if trace.events["rank"].n_unique() > 1:
        from traceinsight.jobs import analyze_trace_ranks

        doc = analyze_trace_ranks(trace, overrides, step_pattern).to_json()
        doc["command"] = command
        return doc["findings"], doc, html.render_job_html, terminal.render_job_summary
    analysis = analyze_trace(trace, thresholds=th, step_pattern=step_pattern, command=command)
    doc = analysis.to_json()
    return doc["findings"], doc, html.render_html, terminal.render_summary
