"""The ``traceinsight`` command: parses options and calls the library, nothing more.

Exit codes (also in the README): 0 ok; 1 analysis error; 2 bad usage or unreadable/invalid
input (or an output that exists without --force, or that would replace an input); 3 a
performance gate tripped (--fail-on); 141 stdout was closed early (``| head``), quietly.
"""

from __future__ import annotations

import functools
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from traceinsight.constants import SEVERITIES
from traceinsight.constants import VERSION as __version__
from traceinsight.errors import (
    EXIT_ANALYSIS_ERROR,
    EXIT_BAD_INPUT,
    EXIT_BROKEN_PIPE,
    EXIT_INTERRUPTED,
    EXIT_OK,
    AnalysisError,
    InputError,
    TraceInsightError,
)
from traceinsight.options import SIZE_HELP, parse_size


@dataclass
class CliState:
    """What :func:`main` needs to know of the parsed command line (click's ``obj``):
    ``verbose``, set by any command's -v."""

    verbose: bool = False


def _set_verbose(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value:
        ctx.ensure_object(CliState).verbose = True


def verbose_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    """-v/--verbose, the same on the group and every command: tracebacks on errors."""
    return click.option(
        "-v",
        "--verbose",
        is_flag=True,
        expose_value=False,
        is_eager=True,
        callback=_set_verbose,
        help="Show details (tracebacks) on errors.",
    )(fn)


class ByteSize(click.ParamType):
    """A size: bytes, or a number with a unit (options.parse_size)."""

    name = "SIZE"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        try:
            return parse_size(str(value))
        except InputError as exc:
            self.fail(str(exc), param, ctx)


def _guard(path: Path | None, fn: Callable[[], int]) -> int:
    """Library errors pass through; anything unexpected becomes a one-line AnalysisError (its
    cause chained: :func:`main` prints the traceback with ``-v``)."""
    try:
        return fn()
    except (TraceInsightError, click.ClickException, KeyboardInterrupt, BrokenPipeError):
        raise
    except MemoryError:
        raise AnalysisError(
            "ran out of memory; try --max-bytes or a smaller capture", str(path) if path else None
        ) from None
    except Exception as exc:
        raise AnalysisError(
            f"internal error {type(exc).__name__}: {exc}", str(path) if path else None
        ) from exc


def _parse_thresholds(values: Sequence[str]) -> dict[str, float]:
    out: dict[str, float] = {}
    for v in values:
        key, sep, num = v.partition("=")
        try:
            out[key.strip()] = float(num)
        except ValueError:
            raise click.BadParameter(
                f"expected KEY=NUMBER, got {v!r}", param_hint="--threshold"
            ) from None
        if not sep:
            raise click.BadParameter(f"expected KEY=NUMBER, got {v!r}", param_hint="--threshold")
    return out


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="traceinsight")
@verbose_option
def cli() -> None:
    """Why does the GPU starve? Offline diagnosis of PyTorch profiler (Kineto) traces and
    Nsight Systems SQLite exports.

    \b
    traceinsight analyze trace.json.gz      terminal summary + one HTML report
    traceinsight analyze TRACE_DIR/          one trace per rank: a job
    traceinsight batch ARCHIVE... -o OUT     many traces -> summary + reports
    traceinsight diff BEFORE AFTER           what changed (--fail-if-slower PCT)
    traceinsight export trace.json.gz -o events.parquet
    traceinsight profile -- python train.py
    """
    # -v (here or on the command) sets CliState.verbose: main() prints tracebacks then


trace_path = click.Path(path_type=Path, dir_okay=True, file_okay=True)


def file_output(help_text: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A command that writes one file: -o/--output (required), --force, -q/--quiet."""

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        fn = click.option("-q", "--quiet", is_flag=True, help="No summary line.")(fn)
        fn = click.option("--force", is_flag=True, help="Overwrite an existing output.")(fn)
        path = click.Path(path_type=Path, dir_okay=False)
        return click.option("-o", "--output", type=path, required=True, help=help_text)(fn)

    return wrap


def _check_step_range(
    _ctx: click.Context, _param: click.Parameter, value: str | None
) -> str | None:
    """A blank --step-range would match every range: refused with the form it takes."""
    if value is not None and (not value.strip() or any(c in value for c in "\n\r\t")):
        raise click.BadParameter(
            f"expected NAME, the literal start of the step ranges' names (e.g. train_step, "
            f"ProfilerStep#), got {value!r}"
        )
    return value


def analysis_options(fn: Callable[..., Any] | None = None, *, with_steps: bool = True) -> Any:
    """The options every analysis takes, gathered into one ``opts`` argument (an
    :class:`~traceinsight.api.Options`) for the command. ``with_steps=False`` leaves out
    ``--steps`` (``profile`` has its own: how many steps to record)."""
    if fn is None:
        return functools.partial(analysis_options, with_steps=with_steps)
    decorators = [
        click.option(
            "--step-range",
            metavar="NAME",
            callback=_check_step_range,
            help="Step ranges are annotations/NVTX ranges whose name starts with NAME, a literal "
            "prefix such as train_step or ProfilerStep# (default: ProfilerStep#N, train_step#N); "
            "a NAME no range starts with is an error.",
        ),
        click.option(
            "--max-bytes",
            type=ByteSize(),
            help=f"Refuse inputs that decompress to more than SIZE ({SIZE_HELP}; default 8G).",
        ),
        click.option(
            "--threshold",
            "thresholds",
            multiple=True,
            metavar="KEY=VALUE",
            help="Override a diagnosis threshold (see docs/FINDINGS.md); repeatable.",
        ),
        click.option(
            "--window",
            metavar="START:END",
            help="Analyze only this part of the capture, from its start: 2s:4s, 1500ms:, 0:250000us "
            "(a bare number is ns); the steps wholly inside it are kept.",
        ),
        click.option(
            "--rank",
            type=click.IntRange(min=0),
            help="Analyze only this rank of a job directory or a multi-process nsys export.",
        ),
        click.option(
            "--device",
            type=click.IntRange(min=0),
            help="Analyze only this GPU's activity (host rows kept).",
        ),
        click.option(
            "--what-if",
            "what_if",
            metavar="ID[,ID...]",
            help="Also replay these findings' fixes together (finding ids, comma-separated; "
            "memory_headroom@K or small_batch@K: the larger batch at K x; launch_bound@whole_step: the "
            "whole step in one CUDA graph; dataloader_stall@unpinned: workers without pin_memory; "
            "dataloader_stall@hidden: the loading hidden entirely): "
            "details.what_if.selected and a summary line.",
        ),
        click.option(
            "--replay/--no-replay",
            default=True,
            show_default=True,
            help="Replay the step in the causal model: each finding's cost is the saving its "
            "fix is predicted to bring (what_if); --no-replay keeps the attributed costs "
            "(faster on very large traces).",
        ),
    ]
    if with_steps:
        decorators.append(
            click.option(
                "--steps",
                "step_window",
                metavar="A..B",
                help="Analyze only steps A to B (ProfilerStep numbers, or NVTX iterations 0..); "
                "A.. and ..B are open.",
            )
        )

    @functools.wraps(fn)
    def wrapper(
        *args: Any,
        step_range: str | None,
        max_bytes: int | None,
        thresholds: tuple[str, ...],
        window: str | None,
        rank: int | None,
        device: int | None,
        replay: bool,
        what_if: str | None,
        step_window: str | None = None,
        **kwargs: Any,
    ) -> Any:
        from traceinsight.errors import InputError
        from traceinsight.options import Options

        try:
            opts = Options(
                _parse_thresholds(thresholds),
                step_range,
                max_bytes,
                steps=step_window,
                window=window,
                rank=rank,
                device=device,
                replay=replay,
                what_if=tuple(x.strip() for x in (what_if or "").split(",") if x.strip()),
            )
        except InputError as exc:  # a bad --steps/--window is a usage error (exit 2)
            raise click.BadParameter(str(exc)) from None
        return fn(*args, opts=opts, **kwargs)

    for d in reversed(decorators):
        wrapper = d(wrapper)
    return wrapper


@cli.command()
@click.argument("path", type=trace_path)
@click.option(
    "-o",
    "--output",
    type=click.Path(path_type=Path, dir_okay=False),
    help="HTML report path (default: ./NAME.traceinsight.html); with --format markdown, the "
    "Markdown summary's path.",
)
@click.option(
    "--json",
    "json_out",
    metavar="FILE|-",
    help="Write the machine-readable result to FILE, or '-' for stdout.",
)
@click.option("--no-html", is_flag=True, help="Do not write the HTML report.")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["terminal", "markdown"]),
    default="terminal",
    show_default=True,
    help="markdown: the summary as Markdown (for a ticket or a chat) to -o FILE, or to stdout; "
    "no HTML report.",
)
@click.option("-q", "--quiet", is_flag=True, help="No terminal summary.")
@verbose_option
@click.option("--force", is_flag=True, help="Overwrite existing outputs.")
@click.option(
    "--open", "open_browser", is_flag=True, help="Open the report in the default browser."
)
@click.option(
    "--fail-on",
    type=click.Choice(list(SEVERITIES)),
    help="Exit 3 if any finding is at least this severe (CI gate).",
)
@click.option(
    "--annotate",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Also write the trace with the analysis drawn on it (.json or .json.gz) for Perfetto.",
)
@click.option(
    "-j",
    "--workers",
    type=click.IntRange(min=1),
    help="A job's ranks: worker processes, or with --scheduler local the LocalCluster's workers "
    "(default: number of cores).",
)
@click.option(
    "--scheduler",
    metavar="ADDRESS|local",
    help="A job's ranks as Dask tasks: a scheduler address (tcp://host:8786; every worker must "
    "read the rank files at the same path) or 'local' for a LocalCluster.",
)
@analysis_options
def analyze(
    path: Path,
    output: Path | None,
    json_out: str | None,
    no_html: bool,
    fmt: str,
    quiet: bool,
    force: bool,
    open_browser: bool,
    fail_on: str | None,
    annotate: Path | None,
    workers: int | None,
    scheduler: str | None,
    opts: Any,
) -> int:
    """Diagnose one trace (a Kineto .json/.json.gz/.json.xz, an nsys .sqlite or .nsys-rep, a rocprofv3
    JSON or rocpd .db) or a job (a directory with one trace per rank)."""
    from dataclasses import replace

    from traceinsight.commands import analyze as cmd

    command = (
        "traceinsight analyze " + " ".join(sys.argv[2:])
        if sys.argv[1:2] == ["analyze"]
        else f"traceinsight analyze {path}"
    )
    opts = replace(opts, command=command)
    return _guard(
        path,
        lambda: cmd.run(
            path,
            opts,
            output=output,
            json_out=json_out,
            html=not no_html,
            quiet=quiet,
            force=force,
            open_browser=open_browser,
            fail_on=fail_on,
            annotate=annotate,
            fmt=fmt,
            workers=workers,
            scheduler=scheduler,
        ),
    )


@cli.command()
@click.argument("path", type=trace_path)
@file_output("Annotated trace to write (.json, or .json.gz for gzip).")
@verbose_option
@analysis_options
def annotate(path: Path, output: Path, force: bool, quiet: bool, opts: Any) -> int:
    """Write TRACE's events unchanged plus the analysis as cat "traceinsight" events (idle by
    cause per GPU, findings, GPU busy per step, sync -> idle arrows) for Perfetto."""
    from traceinsight.commands import annotate as cmd

    return _guard(path, lambda: cmd.run(path, opts, output=output, force=force, quiet=quiet))


@cli.command()
@click.argument("path", type=trace_path)
@file_output(
    "File to write, its format by its suffix: .parquet, .csv, .arrow/.feather (Arrow IPC), "
    ".ndjson/.jsonl."
)
@verbose_option
@analysis_options
def export(path: Path, output: Path, force: bool, quiet: bool, opts: Any) -> int:
    """Write the common event table of PATH (a trace, or a job directory: every rank's rows) as
    Parquet, CSV, Arrow IPC or NDJSON, by the output's suffix (readable by polars, duckdb,
    pandas)."""
    from traceinsight.commands import export as cmd

    return _guard(path, lambda: cmd.run(path, opts, output=output, force=force, quiet=quiet))


@cli.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option(
    "-o",
    "--output",
    "outdir",
    type=click.Path(path_type=Path, file_okay=False),
    required=True,
    help="Output directory (summary.parquet/csv, reports/, index.html).",
)
@click.option(
    "-j",
    "--workers",
    type=click.IntRange(min=1),
    help="Local worker processes (default: number of cores).",
)
@click.option(
    "--scheduler",
    metavar="ADDRESS|local",
    help="Run on Dask: a scheduler address (tcp://host:8786) or 'local' for a LocalCluster.",
)
@click.option("--force", is_flag=True, help="Re-analyze items whose report is up to date.")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar or summary.")
@verbose_option
@analysis_options
def batch(
    paths: tuple[Path, ...],
    outdir: Path,
    workers: int | None,
    scheduler: str | None,
    force: bool,
    quiet: bool,
    opts: Any,
) -> int:
    """Analyze every trace or job under PATHS (directories, .tar/.tar.gz archives, files).

    Resumable: items whose report is newer than the input are skipped. Exit 1 if any item failed
    (each failure is recorded in the summary with its error).
    """
    from traceinsight.commands import batch as cmd

    return _guard(
        None,
        lambda: cmd.run(
            list(paths),
            opts,
            outdir=outdir,
            workers=workers,
            scheduler=scheduler,
            force=force,
            quiet=quiet,
        ),
    )


@cli.command()
@click.argument("before", type=trace_path)
@click.argument("after", type=trace_path, required=False)
@click.option(
    "--against",
    metavar="NAME",
    help="Compare BEFORE (then the one trace given) with the baseline NAME saved by "
    "'traceinsight baseline save'.",
)
@click.option(
    "--dir",
    "baseline_dir",
    type=click.Path(path_type=Path, file_okay=False),
    help="Where baselines are kept (default: .traceinsight/baselines/).",
)
@click.option(
    "-o",
    "--output",
    type=click.Path(path_type=Path, dir_okay=False),
    help="HTML diff report path (default: ./diff_BEFORE_AFTER.traceinsight.html).",
)
@click.option("--no-html", is_flag=True, help="Do not write the HTML diff report.")
@click.option(
    "--json",
    "json_out",
    metavar="FILE|-",
    help="Write the machine-readable diff to FILE or stdout.",
)
@click.option("-q", "--quiet", is_flag=True, help="No terminal summary.")
@click.option("--force", is_flag=True, help="Overwrite existing outputs.")
@click.option(
    "--fail-if-slower",
    type=click.FloatRange(min=0),
    metavar="PCT",
    help="Exit 3 if the median step time (or, without steps, the iteration time, or the GPU time "
    "of the kernels matched by name where both sides ran the same kernels) grew by more than PCT "
    "percent (0 or more) and beyond the within-capture step spread, or if either side has a "
    "data-quality error or nothing can be compared (CI gate). Run-to-run variance is not "
    "measured: set PCT above your loop's spread between runs.",
)
@click.option(
    "--allow-different-hardware",
    is_flag=True,
    help="Let --fail-if-slower gate a diff whose sides ran on different GPUs, device counts or "
    "world sizes (refused with exit 2 otherwise).",
)
@click.option(
    "--allow-different-programs",
    is_flag=True,
    help="Let --fail-if-slower gate a diff whose sides look like different programs (their torch "
    "op or kernel names differ; refused with exit 2 otherwise).",
)
@verbose_option
@analysis_options
def diff(
    before: Path,
    after: Path | None,
    against: str | None,
    baseline_dir: Path | None,
    output: Path | None,
    no_html: bool,
    json_out: str | None,
    quiet: bool,
    force: bool,
    fail_if_slower: float | None,
    allow_different_hardware: bool,
    allow_different_programs: bool,
    opts: Any,
) -> int:
    """Compare two traces (or job directories): metrics, step time, idle causes, kernels, findings.
    With --against NAME, compare one trace with a saved baseline."""
    outputs: dict[str, Any] = {
        "output": output,
        "html": not no_html,
        "json_out": json_out,
        "quiet": quiet,
        "force": force,
        "fail_if_slower": fail_if_slower,
        "allow_different_hardware": allow_different_hardware,
        "allow_different_programs": allow_different_programs,
    }
    if against is not None:
        if after is not None:
            raise click.UsageError("with --against NAME give one trace, not two")
        from traceinsight.commands import baseline

        return _guard(
            before,
            lambda: baseline.against(against, before, opts, directory=baseline_dir, **outputs),
        )
    if after is None:
        raise click.UsageError("give BEFORE and AFTER, or one trace and --against NAME")
    from traceinsight.commands import diff as cmd

    return _guard(
        before,
        lambda: cmd.run(before, after, opts, **outputs),
    )


@cli.group()
@verbose_option
def baseline() -> None:
    """Named baselines for CI: save a trace's result, then 'diff --against NAME TRACE'."""


@baseline.command("save")
@click.argument("name")
@click.argument("path", type=trace_path)
@click.option(
    "--dir",
    "baseline_dir",
    type=click.Path(path_type=Path, file_okay=False),
    help="Where baselines are kept (default: .traceinsight/baselines/).",
)
@click.option("-q", "--quiet", is_flag=True, help="No summary line.")
@click.option("--force", is_flag=True, help="Replace an existing baseline NAME.")
@verbose_option
@analysis_options
def baseline_save(
    name: str, path: Path, baseline_dir: Path | None, quiet: bool, force: bool, opts: Any
) -> int:
    """Analyze PATH and store its result (not the trace) as baseline NAME (an existing one is
    replaced only with --force)."""
    from traceinsight.commands import baseline as cmd

    return _guard(
        path,
        lambda: cmd.save(name, path, opts, directory=baseline_dir, quiet=quiet, force=force),
    )


@cli.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option(
    "--out",
    "out_dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=Path("traces"),
    show_default=True,
    help="Where traces and the report go.",
)
@click.option(
    "--with",
    "tool",
    type=click.Choice(["torch", "nsys"]),
    default="torch",
    show_default=True,
    help="Profile with torch.profiler (the script calls traceinsight.capture.step()) or nsys.",
)
@click.option(
    "--steps",
    type=click.IntRange(min=1),
    default=5,
    show_default=True,
    help="Steps to record (torch).",
)
@click.option("--no-analyze", is_flag=True, help="Only record.")
@verbose_option
@analysis_options(with_steps=False)
@click.argument("command", nargs=-1, type=click.UNPROCESSED, required=True)
def profile(
    out_dir: Path, tool: str, steps: int, no_analyze: bool, command: tuple[str, ...], opts: Any
) -> int:
    """Run COMMAND under the profiler, then analyze the trace it wrote.

    \b
    traceinsight profile -- python train.py --epochs 1
    traceinsight profile --with nsys -- python train.py
    """
    from traceinsight.commands import profile as cmd

    return _guard(
        None,
        lambda: cmd.run(
            list(command), opts, out_dir=out_dir, tool=tool, steps=steps, analyze=not no_analyze
        ),
    )


@cli.command("mcp")
@click.option(
    "--allow",
    "allow",
    multiple=True,
    type=click.Path(path_type=Path, file_okay=False),
    help="A directory whose traces the tools may read (and annotate may write into); "
    "repeatable; default: the current directory. Relative tool paths start at the first.",
)
@click.option(
    "--source-dir",
    "source_dirs",
    multiple=True,
    type=click.Path(path_type=Path, file_okay=False),
    help="Where explain looks for the files named by call sites (inside an --allow directory); "
    "repeatable.",
)
@verbose_option
def mcp_command(allow: tuple[Path, ...], source_dirs: tuple[Path, ...]) -> int:
    """Serve the analyses as Model Context Protocol tools over stdio, for agents and chat
    clients (needs the mcp extra): analyze, explain, what_if, regions, top_kernels, diff,
    annotate."""
    from traceinsight.commands import mcp as cmd

    return _guard(None, lambda: cmd.run(list(allow), list(source_dirs)))


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI and map library errors to exit codes; never lets a traceback escape."""
    args = list(sys.argv[1:] if argv is None else argv)
    state = CliState()
    stdout = sys.stdout
    try:
        rv: Any = cli.main(args=args, prog_name="traceinsight", standalone_mode=False, obj=state)
    except BrokenPipeError:
        return _stdout_gone()
    except SystemExit:
        # click meets a closed stdout (EPIPE) by wrapping sys.stdout and exiting 1
        if sys.stdout is not stdout:
            sys.stdout = stdout
            return _stdout_gone()
        raise
    except click.exceptions.Exit as exc:
        return int(exc.exit_code or 0)
    except click.ClickException as exc:
        exc.show()
        return EXIT_BAD_INPUT
    except click.exceptions.Abort as exc:
        if isinstance(exc.__cause__, KeyboardInterrupt):  # click's wrapping of Ctrl-C
            print("traceinsight: interrupted", file=sys.stderr)
            return EXIT_INTERRUPTED
        print("traceinsight: aborted", file=sys.stderr)
        return EXIT_ANALYSIS_ERROR
    except TraceInsightError as exc:
        if state.verbose and exc.__cause__ is not None:
            traceback.print_exception(exc.__cause__)
        print(f"traceinsight: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("traceinsight: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as exc:  # last resort: one line, details with -v
        if state.verbose:
            traceback.print_exc()
        print(f"traceinsight: internal error {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_ANALYSIS_ERROR
    return rv if isinstance(rv, int) else EXIT_OK


def _stdout_gone() -> int:
    """The reader of stdout went away (``| head``): stop quietly, as Unix tools do. stdout is
    pointed at /dev/null so the interpreter's last flush has nowhere to fail."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # stdout without a descriptor (a test's capture)
        pass
    return EXIT_BROKEN_PIPE


def entry_point() -> None:
    from traceinsight.runtime import exit_now

    code = main()
    try:  # the summary may still sit in the buffer: a reader gone by now is the same case
        sys.stdout.flush()
    except BrokenPipeError:
        code = _stdout_gone() if code == EXIT_OK else code
    exit_now(code)
