"""``traceinsight batch``: every trace or job under PATHs -> summary tables, reports, index."""

from __future__ import annotations

from pathlib import Path

from traceinsight.errors import EXIT_ANALYSIS_ERROR, EXIT_OK
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
        print(
            f"{plural(n, 'item')}: {n - result.failed} analyzed ({result.resumed} up to date, "
            f"skipped), {result.failed} failed, in {result.seconds:.1f} s -> "
            f"{outdir / 'index.html'}"
        )
        for label, error in result.failures():
            print(f"  failed: {label}: {error}")
    return EXIT_ANALYSIS_ERROR if result.failed else EXIT_OK
