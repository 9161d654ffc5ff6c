"""Names shared across layers, defined once (and cheap to import: the CLI's --help reads them)."""

from __future__ import annotations

from typing import Literal

SCHEMA = "traceinsight/1"  # the JSON document's version (README, "JSON result")
Severity = Literal["high", "medium", "low", "info"]
SEVERITIES: tuple[Severity, ...] = ("high", "medium", "low", "info")  # most severe first
# Steps: ProfilerStep#N (torch.profiler) or train_step#N (traceinsight.capture, NVTX)
DEFAULT_STEP_PATTERN = r"^(ProfilerStep#\d+|train_step#\d+)$"
