"""The HTML diff report: before/after side by side, one self-contained file."""

from __future__ import annotations

from typing import Any

from traceinsight.report.html import environment


def render_diff_html(doc: dict[str, Any]) -> str:
    return environment().get_template("diff.html.j2").render(doc=doc)
