"""``traceinsight export``: the common event table as Parquet, CSV, Arrow IPC or NDJSON (by the
output's suffix)."""

from __future__ import annotations

from pathlib import Path

from traceinsight.errors import EXIT_OK
from traceinsight.options import Options
from traceinsight.report.format import plural


def run(path: Path, opts: Options, *, output: Path, force: bool, quiet: bool) -> int:
    from traceinsight.api import (
        export_events,
        export_format,
        load_events,
        side_paths,
        view_events,
    )
    from traceinsight.io import check_writable, refuse_replacing_inputs

    sides = list(side_paths(output).values())
    refuse_replacing_inputs([output, *sides], [path])
    export_format(output)  # an unknown suffix is refused before anything is read
    check_writable(output, force)
    for side in sides:
        check_writable(side, force)
    trace = view_events(load_events(path, opts), opts)
    written = export_events(trace, output)
    if not quiet:
        print(f"wrote {plural(trace.events.height, 'event')} to {output}")
        for side in written:
            print(f"wrote {side}")
    return EXIT_OK
