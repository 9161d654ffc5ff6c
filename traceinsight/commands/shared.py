"""What several commands share: analyzing a trace and writing its outputs (``analyze``,
``profile``), the annotated trace (``analyze --annotate``, ``annotate``), and writing a diff
document's outputs with its gate (``diff``, ``diff --against``). Commands import this module,
never each other.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from traceinsight.constants import SEVERITIES
from traceinsight.errors import EXIT_BAD_INPUT, EXIT_GATE, EXIT_OK, InputError, OutputError
from traceinsight.options import Options
from traceinsight.report.format import plural
from traceinsight.runtime import Runtime, configure_single_trace_process

OPEN_HINT = "open it in https://ui.perfetto.dev (works offline once loaded) or chrome://tracing"


def default_report_path(trace: Path) -> Path:
    from traceinsight.report import report_name

    return Path.cwd() / report_name(trace)


def analyze_and_write(
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
    workers: int | None = None,
    scheduler: str | None = None,
) -> int:
    """Analyze ``path`` and write what was asked (HTML, JSON, the annotated trace, the summary);
    the exit code, with ``fail_on``'s gate (``analyze`` and ``profile``)."""
    if path.is_file():
        configure_single_trace_process(path.stat().st_size)
    from traceinsight.api import analyze_with
    from traceinsight.io import (
        check_outputs,
        check_writable,
        refuse_replacing_inputs,
        write_text_atomic,
    )
    from traceinsight.pipeline import graded
    from traceinsight.report import terminal
    from traceinsight.report.json_out import emit_json

    report_or_default = (output or default_report_path(path)) if html else output
    refuse_replacing_inputs((report_or_default, json_out, annotate), [path])
    graded(opts)  # a bad --threshold fails before any output is checked or parsed
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
    runtime = Runtime.detect(helpers=True)
    if workers:
        runtime = replace(runtime, workers=workers)
    if scheduler:
        runtime = replace(runtime, scheduler=scheduler)
    analysis = analyze_with(path, opts, runtime)
    doc = analysis.to_json()
    if annotate is not None:
        write_annotated_trace(*with_event_table(analysis, path, opts, runtime), annotate)
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
        # a data-quality error (lost device activity, a truncated file, ...) fails any gate:
        # the findings, or their absence, cannot be trusted
        from traceinsight.analysis import quality_errors

        errors = quality_errors(doc)
        if errors:
            print(
                f"traceinsight: --fail-on {fail_on}: {plural(len(errors), 'data-quality error')}, "
                f"first: {errors[0]['check']}: {errors[0]['message']}",
                file=sys.stderr,
            )
            return EXIT_GATE
        limit = SEVERITIES.index(fail_on)
        hits = [f for f in doc["findings"] if SEVERITIES.index(f["severity"]) <= limit]
        if hits:
            print(
                f"traceinsight: --fail-on {fail_on}: {plural(len(hits), 'finding')}, "
                f"first: {hits[0]['id']}",
                file=sys.stderr,
            )
            return EXIT_GATE
    return EXIT_OK


def with_event_table(
    analysis: Any, path: Path, opts: Options, runtime: Runtime
) -> tuple[Any, Path]:
    """The analysis the annotated trace is drawn from, and the file it copies: a job's rank
    (``DIR --rank N``) was analyzed in a worker that kept no event table, so its own file is
    analyzed again here, alone; anything else as it is."""
    from dataclasses import replace

    from traceinsight.analysis import TraceAnalysis

    if not isinstance(analysis, TraceAnalysis) or analysis.trace is not None or not path.is_dir():
        return analysis, path
    from traceinsight.api import analyze_with

    rank_file = Path(analysis.source["path"])
    return analyze_with(rank_file, replace(opts, rank=None), runtime), rank_file


def write_annotated_trace(analysis: object, path: Path, output: Path) -> int:
    """Write the annotated trace of one analysis; InputError for a job (one file per rank)."""
    from traceinsight.analysis import TraceAnalysis
    from traceinsight.report.annotate import write_annotated

    if not isinstance(analysis, TraceAnalysis):
        ranks = getattr(analysis, "ranks", ())
        raise InputError(
            f"annotate writes one rank's trace and this input holds {plural(len(ranks), 'rank')}: "
            "pass --rank N (or one rank's file)",
            str(path),
        )
    try:
        return write_annotated(analysis, path, output)
    except ValueError as e:  # the document's layout is not one the streaming copy knows
        raise InputError(str(e), str(path)) from e


def write_and_gate(
    doc: dict[str, Any],
    report: Path | None,
    json_out: str | None,
    quiet: bool,
    fail_if_slower: float | None,
    allow_different_hardware: bool,
    allow_different_programs: bool = False,
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
    broken = [
        (side, q)
        for side in ("before", "after")
        for q in (doc.get("data_quality_errors") or {}).get(side, [])
    ]
    if broken:
        # a broken side's numbers cannot be trusted either way: the gate fails
        side, q = broken[0]
        print(
            f"traceinsight: --fail-if-slower: {side.upper()} has "
            f"{plural(len([b for b in broken if b[0] == side]), 'data-quality error')}, "
            f"first: {q['check']}: {q['message']}",
            file=sys.stderr,
        )
        return EXIT_GATE
    if doc["hardware_differs"] and not allow_different_hardware:
        print(
            "traceinsight: not gating on a diff across different hardware ("
            + "; ".join(doc["warnings"])
            + "); pass --allow-different-hardware to gate anyway",
            file=sys.stderr,
        )
        return EXIT_BAD_INPUT
    differs = [doc] + [r for r in doc.get("ranks") or [] if r.get("program_differs")]
    if any(d.get("program_differs") for d in differs) and not allow_different_programs:
        p = next(d["program"] for d in differs if d.get("program_differs"))
        print(
            "traceinsight: not gating on a diff of what look like different programs "
            f"({p['similarity']:.0%} of their {_PROGRAM_BASIS[p['basis']]} shared, "
            f"{p['min']:.0%} needed); pass --allow-different-programs to gate anyway",
            file=sys.stderr,
        )
        return EXIT_BAD_INPUT
    return gate_exit(doc["gate"], fail_if_slower)


_PROGRAM_BASIS = {
    "ops": "torch op names",
    "ops_of_replaced": "compiled side's torch op names",
    "kernel_names": "kernel names",
}


def gate_exit(gate: dict[str, Any], fail_if_slower: float) -> int:
    """EXIT_GATE when the slowdown is over the threshold and not inside the noise interval."""
    slow = gate["slowdown_ratio"]
    what = {
        "step_time": "step time",
        "iteration_time": "iteration time",
        "kernel_time": "GPU time of the kernels matched by name",
    }.get(gate["basis"] or "", "time")
    if slow is None:
        # nothing to compare (no steps, iterations of the same work or matching kernels): a
        # gate that cannot measure does not pass
        why = gate.get("reason") or "no step time, iteration time or matched kernels to compare"
        print(f"traceinsight: --fail-if-slower: cannot gate: {why}", file=sys.stderr)
        return EXIT_GATE
    if slow * 100 <= fail_if_slower:
        return EXIT_OK
    if gate["significant"] is False:
        lo, hi = gate["interval"]
        print(
            f"traceinsight: {what} {100 * slow:.1f}% slower, but within the within-capture "
            f"step spread ({100 * lo:+.1f}% .. {100 * hi:+.1f}%): not failing",
            file=sys.stderr,
        )
        return EXIT_OK
    # a batch the copies say grew or shrank: the step holds other work (audit 19: e3nn's 3.84x
    # batch failed at +19.7% a step, -68.8% a sample, said only in the summary)
    batch = (
        f"; host-to-device bytes a step changed {gate['batch_ratio']:.2f}x, so where the "
        f"batch did too, the time a sample changes by {100 * gate['per_byte_change']:+.1f}%"
        if gate.get("per_byte_change") is not None
        else ""
    )
    print(
        f"traceinsight: {what} {100 * slow:.1f}% slower, over --fail-if-slower "
        f"{fail_if_slower:g}%{batch}",
        file=sys.stderr,
    )
    return EXIT_GATE
