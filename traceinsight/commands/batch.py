"""``traceinsight batch``: every trace or job under PATHs -> summary tables, reports, index."""

from __future__ import annotations

from pathlib import Path

from traceinsight.errors import EXIT_ANALYSIS_ERROR, EXIT_OK
from traceinsight.options import Options


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
    from traceinsight.batch import run_batch
    from traceinsight.pipeline import graded

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
        ok = len(result.rows) - result.failed
        print(
            f"{len(result.rows)} items: {ok} analyzed ({result.resumed} up to date, skipped), {result.failed} failed, "
            f"in {result.seconds:.1f} s -> {outdir / 'index.html'}"
        )
        for r in result.rows:
            if r["status"] != "ok":
                print(f"  failed: {r['label']}: {r['error']}")
    return EXIT_ANALYSIS_ERROR if result.failed else EXIT_OK
