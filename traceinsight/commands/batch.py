"""``traceinsight batch``: every trace or job under PATHs -> summary tables, reports, index."""

from __future__ import annotations

from pathlib import Path

from traceinsight.errors import EXIT_ANALYSIS_ERROR, EXIT_OK, InputError
from traceinsight.options import Options
from traceinsight.report.format import plural


def run(
    paths: list[Path],
    opts: Options,
    *,
    outdir: Path,
    workers: int | None,
    scheduler: str | None,
    force: bool,
    quiet: bool,
) -> int:
    from traceinsight.batch import OUTPUT_FILES, run_batch
    from traceinsight.io import refuse_replacing_inputs
    from traceinsight.pipeline import graded

    if paths and not any(p.exists() for p in paths):
        # nothing to analyze at all: bad input, as for analyze (audit 12: exit 1 and an index
        # page for one missing path); a missing path among others is a failed item
        raise InputError("no such file or directory", str(paths[0]))
    refuse_replacing_inputs([outdir / name for name in OUTPUT_FILES], paths)
    graded(opts)
    result = run_batch(
        paths,
        outdir,
        workers=workers,
        scheduler=scheduler,
        force=force,
        progress=not quiet,
        opts=opts,
    )
    if not quiet:
        n = result.summary.height
        # a degraded item was analyzed, its trace broken (truncated, device activity lost): it
        # is listed, and fails the run as a failed one does
        degraded = result.degraded
        failed = result.failed - degraded
        print(
            f"{plural(n, 'item')}: {n - result.failed - result.resumed} analyzed, "
            f"{result.resumed} up to date (skipped), {failed} failed"
            + (f", {degraded} degraded (a data-quality error)" if degraded else "")
            + f", in {result.seconds:.1f} s -> {outdir / 'index.html'}"
        )
        for label, status, error in result.failures():
            print(f"  {'failed' if status == 'error' else status}: {label}: {error}")
    return EXIT_ANALYSIS_ERROR if result.failed else EXIT_OK
