"""Record a trace the right way: a profiler schedule, step marks and NVTX ranges.

Needs the ``capture`` extra (torch, and optionally the ``nvtx`` package); analysis never does.

    from traceinsight import capture
    with capture.capture(out_dir="traces", steps=5) as c:
        for batch in loader:
            train_step(batch)
            c.step()
    print(c.trace_path)

``traceinsight profile -- python train.py`` sets ``TRACEINSIGHT_CAPTURE_DIR``; a script then only
calls the module-level :func:`step` once per iteration and the capture starts by itself. A script
that makes its own :func:`capture` writes into that directory too, whatever ``out_dir`` it names
(it says so on stderr), and every trace written is listed in ``TRACEINSIGHT_CAPTURE_MANIFEST``:
that is how the command finds them.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import re
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ENV_DIR = "TRACEINSIGHT_CAPTURE_DIR"
ENV_MANIFEST = "TRACEINSIGHT_CAPTURE_MANIFEST"  # a file: one JSON line per trace written
ENV_STEPS = "TRACEINSIGHT_CAPTURE_STEPS"
ENV_WAIT = "TRACEINSIGHT_CAPTURE_WAIT"
ENV_WARMUP = "TRACEINSIGHT_CAPTURE_WARMUP"
ENV_MEASURE = "TRACEINSIGHT_CAPTURE_MEASURE"

# Defaults chosen so that compilation, autotuning and allocator warm-up stay out of the window:
# the first step is skipped, three are timed without the profiler, two more warm the profiler
# up, five are recorded.
DEFAULT_WAIT = 1
DEFAULT_MEASURE = 3
DEFAULT_WARMUP = 2
DEFAULT_STEPS = 5
# The top-level key of the trace that holds the un-profiled step measured just before the
# profiler started (parsers/kineto: TraceMeta.extra["unprofiled_measured_step_ns"]). The
# profiler's cost belongs to the process as much as to the loop (benchmarks/RESULTS.md,
# sessions 46-47): no trace can tell it, so the capture measures it.
MEASURED_KEY = "traceinsight"


class CaptureError(RuntimeError):
    """The capture could not be set up (torch missing, bad arguments)."""


def _import_torch() -> Any:
    try:
        import torch
        import torch.profiler  # noqa: F401
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise CaptureError(
            "capturing needs PyTorch: pip install 'traceinsight-analyzer[capture]'"
        ) from exc
    return torch


class _Nvtx:
    """NVTX ranges through the ``nvtx`` package, else torch's binding, else nothing."""

    def __init__(self, torch: Any) -> None:
        self._push: Any = None
        self._pop: Any = None
        try:
            import nvtx  # type: ignore[import-not-found]

            self._push = lambda msg: nvtx.push_range(msg, domain="traceinsight")
            self._pop = lambda: nvtx.pop_range(domain="traceinsight")
        except ImportError:
            if torch.cuda.is_available():
                self._push = torch.cuda.nvtx.range_push
                self._pop = torch.cuda.nvtx.range_pop

    def push(self, msg: str) -> None:
        if self._push is not None:
            self._push(msg)

    def pop(self) -> None:
        if self._pop is not None:
            self._pop()


@dataclass
class Capture:
    """One profiling session over a loop; use :func:`capture` to make one."""

    out_dir: Path
    steps: int = DEFAULT_STEPS
    wait: int = DEFAULT_WAIT
    warmup: int = DEFAULT_WARMUP
    measure: int = DEFAULT_MEASURE
    name: str | None = None
    record_shapes: bool = True
    profile_memory: bool = False
    with_stack: bool = False
    cuda: bool | None = None
    analyze: bool = False
    report_path: Path | None = None
    trace_path: Path | None = None
    step_count: int = 0
    requested_dir: Path | None = None  # the out_dir asked for, where an override replaced it
    # the un-profiled step (ns): the wall time of ``measure`` steps after ``wait`` ones, from a
    # synchronize to a synchronize, over their count; None until measured
    unprofiled_step_ns: int | None = None
    _measure_start_ns: int = field(default=0, repr=False)
    _use_cuda: bool = field(default=False, repr=False)
    _prof: Any = field(default=None, repr=False)
    _nvtx: Any = field(default=None, repr=False)
    _torch: Any = field(default=None, repr=False)
    _range_open: bool = field(default=False, repr=False)

    def start(self) -> Capture:
        if self.steps < 1 or self.wait < 0 or self.warmup < 0 or self.measure < 0:
            raise CaptureError("steps must be >= 1, wait, measure and warmup >= 0")
        torch = _import_torch()
        self._torch = torch
        override = os.environ.get(ENV_DIR)
        if override and Path(override).resolve() != self.out_dir.resolve():
            # Under `traceinsight profile` the trace goes where the command looks for it.
            self.requested_dir, self.out_dir = self.out_dir, Path(override)
            print(
                f"traceinsight.capture: writing to {self.out_dir} ({ENV_DIR}), not {self.requested_dir}",
                file=sys.stderr,
            )
        from torch.profiler import ProfilerActivity, profile, schedule

        use_cuda = torch.cuda.is_available() if self.cuda is None else self.cuda
        self._use_cuda = bool(use_cuda)
        activities = [ProfilerActivity.CPU]
        if use_cuda:
            activities.append(ProfilerActivity.CUDA)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self._nvtx = _Nvtx(torch)
        self._prof = profile(
            activities=activities,
            # the measured steps are the profiler's "wait" too: it records nothing in them
            schedule=schedule(
                wait=self.wait + self.measure, warmup=self.warmup, active=self.steps, repeat=1
            ),
            on_trace_ready=self._write_trace,
            record_shapes=self.record_shapes,
            profile_memory=self.profile_memory,
            with_stack=self.with_stack,
        )
        self._prof.__enter__()
        self._open_range()
        if self.wait == 0:
            self._mark_measure()
        return self

    def _now_ns(self) -> int:
        """The host clock once the GPU has finished what was queued (a window's edges)."""
        if self._use_cuda:
            self._torch.cuda.synchronize()
        return time.perf_counter_ns()

    def _mark_measure(self) -> None:
        """At the un-profiled window's edges: its start after ``wait`` steps, its end after
        ``measure`` more, written into the trace as it starts recording (metadata added later,
        when the trace is written, does not reach the file)."""
        if self.measure == 0:
            return
        if self.step_count == self.wait:
            self._measure_start_ns = self._now_ns()
        elif self.step_count == self.wait + self.measure:
            self.unprofiled_step_ns = (self._now_ns() - self._measure_start_ns) // self.measure

    def _open_range(self) -> None:
        self._nvtx.push(f"train_step#{self.step_count}")
        self._range_open = True

    def _close_range(self) -> None:
        if self._range_open:
            self._nvtx.pop()
            self._range_open = False

    def _write_trace(self, prof: Any) -> None:
        stem = self.name or f"{_safe(socket.gethostname())}_{os.getpid()}"
        rank = os.environ.get("RANK")
        if rank is not None and self.name is None:
            stem = f"rank{rank}_{stem}"
        path = self.out_dir / f"{stem}.{time.time_ns()}.pt.trace.json.gz"
        prof.export_chrome_trace(str(path))
        self.trace_path = path
        manifest = os.environ.get(ENV_MANIFEST)
        if manifest:
            asked = str(self.requested_dir) if self.requested_dir else None
            line = {"trace": str(path.resolve()), "requested_dir": asked}
            with open(manifest, "a", encoding="utf-8") as fh:
                fh.write(json.dumps(line) + "\n")

    def step(self) -> None:
        """Mark the end of one iteration."""
        if self._prof is None:
            return
        self._close_range()
        self.step_count += 1
        self._mark_measure()
        self._prof.step()
        if self.step_count == self.wait + self.measure and self.unprofiled_step_ns is not None:
            # a profiler that cannot take metadata loses the number, never the training run
            with contextlib.suppress(AttributeError, RuntimeError):
                self._prof.add_metadata_json(
                    MEASURED_KEY,
                    json.dumps(
                        {
                            "unprofiled_step_ns": self.unprofiled_step_ns,
                            "unprofiled_steps": self.measure,
                        }
                    ),
                )
        self._open_range()

    @property
    def iterations_needed(self) -> int:
        """The loop's iterations for a whole trace: ``wait + measure + warmup + steps``."""
        return self.wait + self.measure + self.warmup + self.steps

    @property
    def recorded_steps(self) -> int:
        """The steps the profiler recorded whole (``steps`` once the loop ran long enough)."""
        return max(0, min(self.steps, self.step_count - self.wait - self.measure - self.warmup))

    def stop(self) -> None:
        if self._prof is None:
            return
        self._close_range()
        prof, self._prof = self._prof, None
        prof.__exit__(None, None, None)
        if self.step_count < self.iterations_needed:
            # a loop written for fewer iterations (before the measured steps were added, session
            # 47) ends inside the recording: the trace is cut short and nothing else says so
            print(
                f"traceinsight.capture: the loop ended after {self.step_count} iterations, so "
                f"the trace holds {self.recorded_steps} of its {self.steps} steps; it needs "
                f"{self.iterations_needed} (wait {self.wait} + measure {self.measure} + warmup "
                f"{self.warmup} + steps {self.steps}): run more, or pass measure=0",
                file=sys.stderr,
            )
        if self.analyze and self.trace_path is not None:
            self.report_path = _analyze(self.trace_path, self.report_path)

    def __enter__(self) -> Capture:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", text)


def _analyze(trace_path: Path, report_path: Path | None) -> Path:
    from traceinsight.api import analyze
    from traceinsight.io import write_text_atomic
    from traceinsight.report import report_name
    from traceinsight.report.html import render

    report = report_path or trace_path.with_name(report_name(trace_path))  # as profile names it
    result = analyze(trace_path)
    write_text_atomic(report, render(result.to_json()))
    return report


def capture(
    out_dir: str | os.PathLike[str] = "traces",
    steps: int = DEFAULT_STEPS,
    *,
    wait: int = DEFAULT_WAIT,
    warmup: int = DEFAULT_WARMUP,
    measure: int = DEFAULT_MEASURE,
    name: str | None = None,
    record_shapes: bool = True,
    profile_memory: bool = False,
    with_stack: bool = False,
    cuda: bool | None = None,
    analyze: bool = False,
    report_path: str | os.PathLike[str] | None = None,
) -> Capture:
    """Start a capture; use as ``with capture(...) as c:`` and call ``c.step()`` per iteration.

    The profiler skips ``wait`` steps, times ``measure`` steps without itself (the un-profiled
    step, written into the trace: the analysis reports it beside its own estimate), warms up
    for ``warmup`` and records ``steps`` iterations;
    each iteration is also an NVTX range ``train_step#N`` so the same loop profiles well under
    ``nsys profile``. With ``analyze=True`` the HTML diagnosis is written next to the trace.
    """
    c = Capture(
        out_dir=Path(out_dir),
        steps=steps,
        wait=wait,
        warmup=warmup,
        measure=measure,
        name=name,
        record_shapes=record_shapes,
        profile_memory=profile_memory,
        with_stack=with_stack,
        cuda=cuda,
        analyze=analyze,
        report_path=Path(report_path) if report_path else None,
    )
    return c.start()


_GLOBAL: Capture | None = None


def step() -> None:
    """Per-iteration hook for scripts run by ``traceinsight profile``.

    Outside ``traceinsight profile`` (no ``TRACEINSIGHT_CAPTURE_DIR``) it does nothing, so a
    script can keep the call in production.
    """
    global _GLOBAL
    if _GLOBAL is None:
        out = os.environ.get(ENV_DIR)
        if not out:
            return
        _GLOBAL = capture(
            out,
            steps=int(os.environ.get(ENV_STEPS, DEFAULT_STEPS)),
            wait=int(os.environ.get(ENV_WAIT, DEFAULT_WAIT)),
            warmup=int(os.environ.get(ENV_WARMUP, DEFAULT_WARMUP)),
            measure=int(os.environ.get(ENV_MEASURE, DEFAULT_MEASURE)),
        )
        atexit.register(_finish_global)
        return  # this call opens the first step; the next one ends it
    _GLOBAL.step()


def _finish_global() -> None:
    global _GLOBAL
    if _GLOBAL is not None:
        with contextlib.suppress(Exception):
            _GLOBAL.stop()
        _GLOBAL = None
