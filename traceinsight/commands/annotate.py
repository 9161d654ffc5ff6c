"""``traceinsight annotate``: the trace with the analysis drawn on it, for Perfetto."""

from __future__ import annotations

from pathlib import Path

from traceinsight.errors import EXIT_OK, InputError
from traceinsight.options import Options
from traceinsight.runtime import Runtime, configure_single_trace_process

OPEN_HINT = "open it in https://ui.perfetto.dev (works offline once loaded) or chrome://tracing"


def write(analysis: object, path: Path, output: Path) -> int:
    """Write the annotated trace of one analysis; InputError for a job (one file per rank)."""
    from traceinsight.analysis import TraceAnalysis
    from traceinsight.report.annotate import write_annotated

    if not isinstance(analysis, TraceAnalysis):
        ranks = getattr(analysis, "ranks", ())
        raise InputError(
            f"annotate writes one rank's trace and this input holds {len(ranks)} ranks: "
            "pass --rank N (or one rank's file)",
            str(path),
        )
    try:
        return write_annotated(analysis, path, output)
    except ValueError as e:  # the document's layout is not one the streaming copy knows
        raise InputError(str(e), str(path)) from e


def run(path: Path, opts: Options, *, output: Path, force: bool, quiet: bool) -> int:
    from traceinsight.api import analyze_with
    from traceinsight.io import check_writable

    check_writable(output, force)
    if path.is_file():
        configure_single_trace_process(path.stat().st_size)
    analysis = analyze_with(path, opts, Runtime.detect(helpers=True))
    n = write(analysis, path, output)
    if not quiet:
        print(f"wrote {output}: the original events and {n} traceinsight events; {OPEN_HINT}")
    return EXIT_OK
