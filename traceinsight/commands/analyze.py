"""``traceinsight analyze``: a trace or a job in, terminal summary + HTML report (+ JSON) out."""

from __future__ import annotations

from pathlib import Path

from traceinsight.commands.shared import analyze_and_write
from traceinsight.options import Options


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
    return analyze_and_write(
        path,
        opts,
        output=output,
        json_out=json_out,
        html=html,
        quiet=quiet,
        force=force,
        open_browser=open_browser,
        fail_on=fail_on,
        annotate=annotate,
        fmt=fmt,
    )
