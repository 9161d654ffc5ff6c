"""``traceinsight export``: the common event table as Parquet."""

from __future__ import annotations

from pathlib import Path

from traceinsight.errors import EXIT_OK
from traceinsight.options import Options


def run(path: Path, opts: Options, *, output: Path, force: bool, quiet: bool) -> int:
    from traceinsight.api import export_events, load_events, view_events
    from traceinsight.io import check_writable

    check_writable(output, force)
    trace = view_events(load_events(path, opts), opts)
    export_events(trace, output)
    if not quiet:
        print(f"wrote {trace.events.height:,} events to {output}")
    return EXIT_OK
