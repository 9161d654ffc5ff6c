"""Named baselines for CI: ``baseline save NAME TRACE`` stores the result document (not the
trace) with its kernel tables; ``diff --against NAME TRACE`` compares a trace with it and gates
like ``diff`` (``--fail-if-slower``, exit 3)."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from traceinsight.errors import EXIT_OK, InputError, OutputError
from traceinsight.options import Options

DEFAULT_DIR = Path(".traceinsight") / "baselines"
BASELINE_KIND = "baseline"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def baseline_path(name: str, directory: Path | None) -> Path:
    if not _NAME.match(name) or ".." in name:
        raise InputError(f"baseline name {name!r}: letters, digits, '.', '_' and '-' only")
    return (directory or DEFAULT_DIR) / f"{name}.json"


def baseline_doc(analysis: Any, name: str) -> dict[str, Any]:
    """The stored document: the result JSON, and what ``diff`` compares beyond the document
    (the kernel table per step, the timing sample: per-step times, iterations), for a job also
    each rank's, so that a diff against it gives the direct diff's verdict."""
    from traceinsight.analysis import JobAnalysis
    from traceinsight.diff import environment, timing_sample

    doc: dict[str, Any] = {
        "kind": BASELINE_KIND,
        "name": name,
        "saved_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "environment": environment(analysis),
        "result": analysis.to_json(),
        "timing": timing_sample(analysis).to_json(),
    }
    if isinstance(analysis, JobAnalysis):
        doc["kernels"] = []
        doc["ranks"] = [
            {
                "rank": r.rank,
                "result": r.to_json(),
                "kernels": r.kernel_table().to_dicts(),
                "timing": timing_sample(r).to_json(),
                "environment": environment(r),
            }
            for r in analysis.ranks
        ]
    else:
        doc["kernels"] = analysis.kernel_table().to_dicts()
    return doc


def save(
    name: str,
    trace: Path,
    opts: Options,
    *,
    directory: Path | None,
    quiet: bool,
    force: bool = False,
) -> int:
    from traceinsight.api import analyze_with
    from traceinsight.io import refuse_replacing_inputs, write_text_atomic
    from traceinsight.runtime import Runtime

    out = baseline_path(name, directory)
    refuse_replacing_inputs([out], [trace])
    if out.exists() and not force:  # a baseline CI gates on is replaced only when asked
        raise OutputError(f"baseline {name!r} already exists; pass --force to replace it", str(out))
    analysis = analyze_with(trace, opts, Runtime.detect(helpers=True))
    out.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out, json.dumps(baseline_doc(analysis, name), default=str))
    if not quiet:
        print(f"traceinsight: baseline {name!r} saved to {out} (from {trace})")
    return EXIT_OK


def load(name: str, directory: Path | None) -> dict[str, Any]:
    path = baseline_path(name, directory)
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise InputError(f"no baseline {name!r} (looked for {path})") from None
    except (OSError, ValueError) as exc:
        raise InputError(f"baseline {name!r} is unreadable: {exc}", str(path)) from None
    if not isinstance(doc, dict) or doc.get("kind") != BASELINE_KIND or "result" not in doc:
        raise InputError(f"{path} is not a traceinsight baseline", str(path))
    return doc


def compare_with_baseline(base: dict[str, Any], analysis: Any) -> dict[str, Any]:
    """The diff of the stored document (before) and a fresh analysis (after): for a job also
    rank by rank, each side as the direct ``diff`` sees it."""
    import polars as pl

    from traceinsight.analysis import KERNEL_TABLE_SCHEMA, JobAnalysis
    from traceinsight.diff import (
        TimingSample,
        compare_docs,
        environment_warnings,
        gate_on_worst_rank,
        kernels_per_step,
    )

    def one(stored: dict[str, Any], a: Any) -> dict[str, Any]:
        doc = compare_docs(
            stored["result"],
            a.to_json(),
            pl.DataFrame(stored.get("kernels") or [], schema=KERNEL_TABLE_SCHEMA),
            kernels_per_step(a),
            (None, a),
            (TimingSample.from_json(stored["timing"]) if stored.get("timing") else None, None),
        )
        eb, ea = stored.get("environment"), doc["environment"]["after"]
        if eb and ea:  # the stored side's hardware, checked as diff checks two traces
            doc["environment"]["before"] = eb
            env, doc["hardware_differs"] = environment_warnings(eb, ea)
            doc["warnings"] = [*env, *doc["warnings"]]  # the diff's own after the hardware's
        return doc

    doc = one(base, analysis)
    doc["baseline"] = {"name": base.get("name"), "saved_at": base.get("saved_at")}
    if base.get("ranks") and isinstance(analysis, JobAnalysis):
        after = {r.rank: r for r in analysis.ranks}
        doc["ranks"] = [
            {"rank": b["rank"], **one(b, after[b["rank"]])}
            for b in base["ranks"]
            if b["rank"] in after
        ]
        gate_on_worst_rank(doc)
    return doc


def against(
    name: str,
    trace: Path,
    opts: Options,
    *,
    directory: Path | None,
    output: Path | None,
    html: bool,
    json_out: str | None,
    quiet: bool,
    force: bool,
    fail_if_slower: float | None,
    allow_different_hardware: bool,
    allow_different_programs: bool = False,
) -> int:
    from traceinsight.api import analyze_with
    from traceinsight.commands.shared import write_and_gate
    from traceinsight.io import check_outputs, refuse_replacing_inputs
    from traceinsight.pipeline import graded
    from traceinsight.runtime import Runtime

    report = (
        (output or Path.cwd() / f"diff_{name}_{trace.name.split('.')[0]}.traceinsight.html")
        if html
        else None
    )
    refuse_replacing_inputs([report, json_out], [trace, baseline_path(name, directory)])
    graded(opts)
    base = load(name, directory)
    check_outputs(report, json_out, force)
    doc = compare_with_baseline(base, analyze_with(trace, opts, Runtime.detect(helpers=True)))
    return write_and_gate(
        doc,
        report,
        json_out,
        quiet,
        fail_if_slower,
        allow_different_hardware,
        allow_different_programs,
    )
