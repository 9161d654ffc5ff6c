"""What an analysis may be told: the CLI's shared analysis options, one to one (no polars here:
the CLI builds these before anything heavy loads)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from traceinsight.constants import DEFAULT_STEP_PATTERN
from traceinsight.errors import InputError

_UNIT_NS = {"ns": 1, "us": 1_000, "ms": 1_000_000, "s": 1_000_000_000}
_TIME = re.compile(r"^\s*(\d+(?:\.\d*)?)\s*(ns|us|ms|s)?\s*$")


def parse_time_ns(text: str, what: str) -> int:
    """``2000ms``, ``1.5s``, ``250us``, ``12345ns`` (a bare number is ns) as int ns."""
    m = _TIME.match(text)
    if not m:
        raise InputError(f"{what}: expected a time like 1500ms, 2s or 120000ns, got {text!r}")
    return round(float(m.group(1)) * _UNIT_NS[m.group(2) or "ns"])


# Sizes: K/M/G/T and KiB.. are powers of 1024 (the default limit is 8 GiB, as a file manager's
# 8G); KB/MB/GB/TB powers of 1000, as disk makers write them.
_SIZE_UNITS = {
    "": 1,
    "b": 1,
    **{u: 1024 ** (i + 1) for i, u in enumerate("kmgt")},
    **{u + "ib": 1024 ** (i + 1) for i, u in enumerate("kmgt")},
    **{u + "b": 1000 ** (i + 1) for i, u in enumerate("kmgt")},
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?)\s*([a-z]*)\s*$", re.IGNORECASE)
SIZE_HELP = (
    "bytes, or with a unit: K, M, G, T and KiB, MiB, GiB, TiB are powers of 1024; "
    "KB, MB, GB, TB powers of 1000"
)


def parse_size(text: str) -> int:
    """``8G`` (8 GiB), ``500MB`` (500e6), ``1.5GiB``, ``1000`` (bytes) as int bytes, at least 1."""
    m = _SIZE.match(text)
    scale = _SIZE_UNITS.get(m.group(2).lower()) if m else None
    if m is None or scale is None:
        raise InputError(f"expected a size like 8G, 500MB or 1000000 ({SIZE_HELP}), got {text!r}")
    n = round(float(m.group(1)) * scale)
    if n < 1:
        raise InputError(f"expected a size of at least 1 byte, got {text!r}")
    return n


def parse_steps(text: str) -> tuple[int | None, int | None]:
    """``A..B`` (inclusive; either side may be left out) or one step ``N``."""
    a, sep, b = text.partition("..")
    try:
        lo = int(a) if a.strip() else None
        hi = (int(b) if b.strip() else None) if sep else lo
    except ValueError:
        raise InputError(f"--steps: expected A..B (step numbers), got {text!r}") from None
    if lo is not None and hi is not None and hi < lo:
        raise InputError(f"--steps: {text!r} is empty (B < A)")
    return lo, hi


def parse_window(text: str) -> tuple[int, int | None]:
    """``START:END`` relative to the capture start (``END`` may be left out: to the end)."""
    a, sep, b = text.partition(":")
    if not sep:
        raise InputError(f"--window: expected START:END (e.g. 2s:4s), got {text!r}")
    lo = parse_time_ns(a, "--window") if a.strip() else 0
    hi = parse_time_ns(b, "--window") if b.strip() else None
    if hi is not None and hi <= lo:
        raise InputError(f"--window: {text!r} is empty (END <= START)")
    return lo, hi


@dataclass(frozen=True)
class Options:
    """``step_range``: steps are the annotation/NVTX ranges whose name starts with it;
    ``thresholds``: overrides by name (docs/FINDINGS.md); ``max_bytes``: refuse inputs that
    decompress to more; ``command``: recorded in the result. The view: ``steps`` (``A..B``,
    step numbers), ``window`` (``START:END`` from the capture start), ``rank``, ``device``."""

    thresholds: Mapping[str, float] = field(default_factory=dict)
    step_range: str | None = None
    max_bytes: int | None = None
    command: str | None = None
    steps: str | None = None
    window: str | None = None
    rank: int | None = None
    device: int | None = None
    # the causal step model: replay, what-if predictions and the findings' costs as savings
    # (False: the findings keep the time their rules attribute; see findings/savings.py)
    replay: bool = True
    # finding ids whose fixes are replayed together (details.what_if.selected)
    what_if: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        self.view()  # bad --steps/--window fail before any parsing (exit 2)

    def view(self) -> View:
        return View(
            parse_steps(self.steps) if self.steps else None,
            parse_window(self.window) if self.window else None,
        )

    @property
    def step_pattern(self) -> str:
        # a name prefix (its help, docs/COMMANDS.md): literal, so "(" is no regex error
        return "^" + re.escape(self.step_range) if self.step_range else DEFAULT_STEP_PATTERN


@dataclass(frozen=True)
class View:
    """The part of the run to analyze: steps A..B (inclusive, None = open) and/or a window
    (start, end) in ns from the capture start (end None = to the end)."""

    steps: tuple[int | None, int | None] | None = None
    window: tuple[int, int | None] | None = None

    def describe(self) -> str:
        parts = []
        if self.steps:
            a, b = self.steps
            parts.append(f"steps {'' if a is None else a}..{'' if b is None else b}")
        if self.window:
            a, b = self.window
            parts.append(f"window {a / 1e6:g}ms:{'' if b is None else f'{b / 1e6:g}ms'}")
        return ", ".join(parts)
