"""``traceinsight annotate``: the trace with the analysis drawn on it, for Perfetto."""

from __future__ import annotations

from pathlib import Path

from traceinsight.commands.shared import OPEN_HINT, with_event_table, write_annotated_trace
from traceinsight.errors import EXIT_OK
from traceinsight.options import Options
from traceinsight.report.format import plural
from traceinsight.runtime import Runtime, configure_single_trace_process


def run(path: Path, opts: Options, *, output: Path, force: bool, quiet: bool) -> int:
    from traceinsight.api import analyze_with
    from traceinsight.io import check_writable, refuse_replacing_inputs

    refuse_replacing_inputs([output], [path])
    check_writable(output, force)
    if path.is_file():
        configure_single_trace_process(path.stat().st_size)
    runtime = Runtime.detect(helpers=True)
    analysis, src = with_event_table(analyze_with(path, opts, runtime), path, opts, runtime)
    n = write_annotated_trace(analysis, src, output)
    if not quiet:
        print(
            f"wrote {output}: the original events and {plural(n, 'traceinsight event')}; "
            f"{OPEN_HINT}"
        )
    return EXIT_OK
