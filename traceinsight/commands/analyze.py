"""``traceinsight analyze``: a trace or a job in, terminal summary + HTML report (+ JSON, the
Markdown summary, the annotated trace) out. The work is commands/shared.py's, which ``profile``
runs too after recording."""

from __future__ import annotations

from traceinsight.commands.shared import analyze_and_write as run

__all__ = ["run"]
