"""What an analysis may be told: the CLI's shared analysis options, one to one (no polars here:
the CLI builds these before anything heavy loads)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from traceinsight.constants import DEFAULT_STEP_PATTERN
from traceinsight.errors import InputError

if TYPE_CHECKING:
    from traceinsight.findings import Thresholds


@dataclass(frozen=True)
class Options:
    """``step_range``: steps are the annotation/NVTX ranges whose name starts with it;
    ``thresholds``: overrides by name (docs/FINDINGS.md); ``max_bytes``: refuse inputs that
    decompress to more; ``command``: recorded in the result."""

    thresholds: Mapping[str, float] = field(default_factory=dict)
    step_range: str | None = None
    max_bytes: int | None = None
    command: str | None = None

    @property
    def step_pattern(self) -> str:
        # a name prefix (its help, the README): literal, so "(" is no regex error
        return "^" + re.escape(self.step_range) if self.step_range else DEFAULT_STEP_PATTERN

    def graded(self) -> Thresholds:
        """The thresholds with the overrides applied; InputError names unknown keys."""
        from traceinsight.findings import thresholds

        try:
            return thresholds(self.thresholds)
        except ValueError as exc:
            raise InputError(str(exc)) from None
