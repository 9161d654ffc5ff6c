"""``traceinsight diff BEFORE AFTER``: what changed, and a CI gate on step time (or iteration
time, or the GPU time of the kernels matched by name)."""

from __future__ import annotations

from pathlib import Path

from traceinsight.commands.shared import write_and_gate
from traceinsight.options import Options


def default_report_path(before: Path, after: Path) -> Path:
    return (
        Path.cwd()
        / f"diff_{before.name.split('.')[0]}_{after.name.split('.')[0]}.traceinsight.html"
    )


def run(
    before: Path,
    after: Path,
    opts: Options,
    *,
    output: Path | None = None,
    html: bool = True,
    json_out: str | None = None,
    quiet: bool = False,
    force: bool = False,
    fail_if_slower: float | None = None,
    allow_different_hardware: bool = False,
    allow_different_programs: bool = False,
) -> int:
    from traceinsight.diff import diff_paths
    from traceinsight.io import check_outputs, refuse_replacing_inputs
    from traceinsight.pipeline import graded
    from traceinsight.runtime import Runtime

    report = (output or default_report_path(before, after)) if html else None
    refuse_replacing_inputs([report, json_out], [before, after])
    graded(opts)
    check_outputs(report, json_out, force)
    doc = diff_paths(before, after, opts, Runtime.detect(helpers=True))
    return write_and_gate(
        doc,
        report,
        json_out,
        quiet,
        fail_if_slower,
        allow_different_hardware,
        allow_different_programs,
    )
