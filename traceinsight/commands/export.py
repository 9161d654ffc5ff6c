"""``traceinsight export``: the common event table as Parquet."""

from __future__ import annotations

from pathlib import Path

from traceinsight.errors import EXIT_OK


def run(path: Path, *, output: Path, force: bool, max_bytes: int | None, quiet: bool) -> int:
    from traceinsight.api import export_events
    from traceinsight.parsers import load_trace
    from traceinsight.report.files import check_writable

    check_writable(output, force)
    trace = load_trace(path, max_bytes=max_bytes)
    export_events(trace, output)
    if not quiet:
        print(f"wrote {trace.events.height:,} events to {output}")
    return EXIT_OK
