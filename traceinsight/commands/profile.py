"""``traceinsight profile -- CMD``: record a trace of CMD, then analyze it."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from traceinsight.capture import (
    DEFAULT_MEASURE,
    DEFAULT_WAIT,
    DEFAULT_WARMUP,
    ENV_DIR,
    ENV_MANIFEST,
    ENV_STEPS,
)
from traceinsight.errors import EXIT_OK, AnalysisError, InputError
from traceinsight.options import Options


def run(
    command: list[str], opts: Options, *, out_dir: Path, tool: str, steps: int, analyze: bool
) -> int:
    if not command:
        raise InputError("no command to profile; usage: traceinsight profile -- python train.py")
    out_dir.mkdir(parents=True, exist_ok=True)
    started = time.time()
    if tool == "nsys":
        nsys = shutil.which("nsys")
        if nsys is None:
            raise InputError("nsys is not on PATH; install Nsight Systems or use --with torch")
        stem = out_dir / f"nsys_{int(started)}"
        argv = [
            nsys,
            "profile",
            "-t",
            "cuda,nvtx,osrt",
            "--export",
            "sqlite",
            "-o",
            str(stem),
            "--force-overwrite",
            "true",
            *command,
        ]
        rc = subprocess.call(argv)
        trace, how = stem.with_suffix(".sqlite"), "written by nsys profile"
    else:
        fd, manifest = tempfile.mkstemp(prefix="traceinsight-capture-", suffix=".jsonl")
        os.close(fd)
        env = dict(
            os.environ,
            **{ENV_DIR: str(out_dir.resolve()), ENV_STEPS: str(steps), ENV_MANIFEST: manifest},
        )
        try:
            rc = subprocess.call(command, env=env)
            trace, how = _find_trace(Path(manifest), out_dir, started)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(manifest)
    if rc != 0:
        print(f"traceinsight: the profiled command exited with status {rc}", file=sys.stderr)
    if not trace.exists():
        raise AnalysisError(
            "no trace was written; the script must call traceinsight.capture.step() once per iteration "
            f"(and run at least {steps + DEFAULT_WAIT + DEFAULT_MEASURE + DEFAULT_WARMUP} iterations) or record with traceinsight.capture.capture()",
            str(out_dir),
        )
    print(f"trace: {trace} ({how})")
    if not analyze:
        return EXIT_OK
    from traceinsight.commands.shared import analyze_and_write, default_report_path

    return analyze_and_write(
        trace,
        replace(opts, command="traceinsight profile -- " + " ".join(command)),
        output=trace.with_name(default_report_path(trace).name),  # beside the trace
        force=True,
    )


TRACE_GLOB = "*.pt.trace.json*"
SEARCH_DEPTH = 3  # directories below the working directory searched for a trace written elsewhere
SEARCH_LIMIT = 20_000  # directory entries looked at, at most


def _find_trace(manifest: Path, out_dir: Path, started: float) -> tuple[Path, str]:
    """The trace the command wrote and how it was found: listed by traceinsight.capture (which
    writes into --out even where the script named another out_dir), else the newest trace in
    --out, else the newest new trace under the working directory (a script's own profiler)."""
    listed = [json.loads(line) for line in manifest.read_text().splitlines() if line.strip()]
    listed = [e for e in listed if Path(e["trace"]).exists()]
    if listed:
        last = listed[-1]
        asked = last.get("requested_dir")
        how = (
            f"the script's capture(out_dir={asked!r}) was redirected to --out"
            if asked
            else "written by traceinsight.capture"
        )
        return Path(last["trace"]), how
    fresh = [p for p in out_dir.glob(TRACE_GLOB) if p.stat().st_mtime >= started - 1]
    if fresh:
        return max(fresh, key=lambda p: p.stat().st_mtime), "found in --out"
    elsewhere = _new_traces_below(Path.cwd(), started - 1)
    if elsewhere:
        return max(
            elsewhere, key=lambda p: p.stat().st_mtime
        ), "found where the script wrote it, outside --out"
    return out_dir / "(none)", ""


def _new_traces_below(root: Path, since: float) -> list[Path]:
    """Trace files modified since ``since`` up to :data:`SEARCH_DEPTH` levels below ``root``,
    hidden directories skipped; bounded so a huge working directory cannot stall the command."""
    found: list[Path] = []
    seen = 0
    for top, dirs, files in os.walk(root):
        depth = len(Path(top).relative_to(root).parts)
        dirs[:] = [] if depth >= SEARCH_DEPTH else [d for d in dirs if not d.startswith(".")]
        seen += len(files) + len(dirs)
        for name in files:
            p = Path(top, name)
            if p.match(TRACE_GLOB) and p.stat().st_mtime >= since:
                found.append(p)
        if seen > SEARCH_LIMIT:
            break
    return found
