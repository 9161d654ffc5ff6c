"""``traceinsight export``: the common event table as Parquet."""

from __future__ import annotations

from pathlib import Path

from traceinsight.errors import EXIT_OK
from traceinsight.options import Options


def run(path: Path, opts: Options, *, output: Path, force: bool, quiet: bool) -> int:
    from traceinsight.api import export_events, load_events, side_paths, view_events
    from traceinsight.io import check_writable

    check_writable(output, force)
    for side in side_paths(output).values():
        check_writable(side, force)
    trace = view_events(load_events(path, opts), opts)
    sides = export_events(trace, output)
    if not quiet:
        print(f"wrote {trace.events.height:,} events to {output}")
        for side in sides:
            print(f"wrote {side}")
    return EXIT_OK
