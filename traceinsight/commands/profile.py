"""``traceinsight profile -- CMD``: record a trace of CMD, then analyze it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

from traceinsight.capture import ENV_DIR, ENV_STEPS
from traceinsight.errors import EXIT_OK, AnalysisError, InputError
from traceinsight.options import Options


def run(command: list[str], opts: Options, *, out_dir: Path, tool: str, steps: int, analyze: bool) -> int:
    if not command:
        raise InputError("no command to profile; usage: traceinsight profile -- python train.py")
    out_dir.mkdir(parents=True, exist_ok=True)
    started = time.time()
    if tool == "nsys":
        nsys = shutil.which("nsys")
        if nsys is None:
            raise InputError("nsys is not on PATH; install Nsight Systems or use --with torch")
        stem = out_dir / f"nsys_{int(started)}"
        argv = [nsys, "profile", "-t", "cuda,nvtx,osrt", "--export", "sqlite", "-o", str(stem), "--force-overwrite", "true", *command]
        rc = subprocess.call(argv)
        trace = stem.with_suffix(".sqlite")
    else:
        env = dict(os.environ, **{ENV_DIR: str(out_dir.resolve()), ENV_STEPS: str(steps)})
        rc = subprocess.call(command, env=env)
        candidates = [p for p in out_dir.glob("*.pt.trace.json*") if p.stat().st_mtime >= started - 1]
        trace = max(candidates, key=lambda p: p.stat().st_mtime) if candidates else out_dir / "(none)"
    if rc != 0:
        print(f"traceinsight: the profiled command exited with status {rc}", file=sys.stderr)
    if not trace.exists():
        raise AnalysisError(
            "no trace was written; the script must call traceinsight.capture.step() once per iteration "
            f"(and run at least {steps + 3} iterations)",
            str(out_dir),
        )
    print(f"trace: {trace}")
    if not analyze:
        return EXIT_OK
    from traceinsight.commands import analyze as analyze_cmd

    return analyze_cmd.run(
        trace,
        replace(opts, command="traceinsight profile -- " + " ".join(command)),
        output=trace.with_name(trace.name.split(".pt.trace")[0].removesuffix(".sqlite") + ".traceinsight.html"),
        force=True,
    )
