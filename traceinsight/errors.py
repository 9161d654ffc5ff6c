"""Library errors and the exit codes the CLI maps them to (documented in the README)."""

from __future__ import annotations

EXIT_OK = 0
EXIT_ANALYSIS_ERROR = 1  # the input was read but the analysis failed
EXIT_BAD_INPUT = 2  # bad usage, unreadable or invalid input
EXIT_GATE = 3  # a performance gate tripped (--fail-on, --fail-if-slower)
EXIT_INTERRUPTED = 130  # Ctrl-C or SIGINT, as a shell reports it; a batch run again resumes
# stdout closed early (``| head``): quiet, with the status a shell gives a tool killed by SIGPIPE
EXIT_BROKEN_PIPE = 141


class TraceInsightError(Exception):
    exit_code = EXIT_ANALYSIS_ERROR

    def __init__(self, message: str, path: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.path = path

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


class InputError(TraceInsightError):
    """The file is unreadable, not a supported trace, or broken beyond salvage."""

    exit_code = EXIT_BAD_INPUT


class AnalysisError(TraceInsightError):
    exit_code = EXIT_ANALYSIS_ERROR


class OutputError(TraceInsightError):
    """An output could not be written (exists without --force, directory missing, ...)."""

    exit_code = EXIT_BAD_INPUT
