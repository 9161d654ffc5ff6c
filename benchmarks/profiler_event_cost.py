"""What the PyTorch profiler costs the host per event it records, by kind, on the CUDA device.

    python benchmarks/profiler_event_cost.py [--iters 20000] [--reps 5] [--out FILE]

Three host-bound loops of tiny work, each timed un-profiled and under the profiler the way
traceinsight.capture records (CPU + CUDA, record_shapes=True), with and without
profile_memory, in interleaved repetitions (a slow phase of the machine slows all alike):

* ``views``: ``x.view(...)`` ops only (one recorded op, no launch, no allocation);
* ``inplace``: ``x.add_(1)`` (one op, one kernel launch, no allocation);
* ``alloc``: ``x + 1`` then dropped (one op, one launch, one allocation and one free through
  the caching allocator: two ``[memory]`` events under profile_memory);
* ``runtime``: ``torch.cuda.is_current_stream_capturing()`` (one runtime call,
  cudaStreamIsCapturing, no op): what CUPTI costs a runtime call, against the duration the
  trace records for it (the share inside the call is what the trace shows);
* ``cat1``, ``cat16``: ``torch.cat`` of 1 and of 16 tensors (one op, one launch each): what
  record_shapes costs per input tensor, (cat16's extra - cat1's extra) / 15.

Per event: op = (views profiled - un-profiled) / ops; launch = inplace's extra over an op;
memory event = (alloc with profile_memory - alloc without) / memory events. Why: the step
model takes the profiler's cost out per recorded event (analyzers/replay.py); whether an
allocator event costs what an op costs decides whether profile_memory's events count.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

import torch
from torch.profiler import ProfilerActivity, profile

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def loop(kind: str, n: int, x: torch.Tensor) -> None:
    if kind == "views":
        for _ in range(n):
            x.view(-1)
    elif kind == "inplace":
        for _ in range(n):
            x.add_(1)
    elif kind in ("cat1", "cat16"):
        parts = [x] * (1 if kind == "cat1" else 16)
        for _ in range(n):
            torch.cat(parts)
    elif kind == "runtime":
        for _ in range(n):
            torch.cuda.is_current_stream_capturing()
    else:
        for _ in range(n):
            y = x + 1
            del y


def recorded_call_ns(n: int, x: torch.Tensor) -> float | None:
    """The median duration the trace records for the runtime loop's calls."""
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
        loop("runtime", n, x)
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    p.export_chrome_trace(path)
    with open(path, "rb") as f:
        events = json.load(f)["traceEvents"]  # a plain .json path: written uncompressed
    os.unlink(path)
    durs = [e["dur"] * 1000 for e in events if e.get("name") == "cudaStreamIsCapturing"]
    return statistics.median(durs) if durs else None


def timed(kind: str, n: int, x: torch.Tensor, mode: str) -> tuple[float, int]:
    """Host ns per iteration and the memory events recorded."""
    if DEV == "cuda":
        torch.cuda.synchronize()
    if mode == "off":
        t0 = time.perf_counter_ns()
        loop(kind, n, x)
        dt = time.perf_counter_ns() - t0
        if DEV == "cuda":
            torch.cuda.synchronize()
        return dt / n, 0
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if DEV == "cuda" else [])
    with profile(activities=acts, record_shapes=True, profile_memory=mode == "mem") as p:
        t0 = time.perf_counter_ns()
        loop(kind, n, x)
        dt = time.perf_counter_ns() - t0
        if DEV == "cuda":
            torch.cuda.synchronize()
    mem = sum(1 for e in p.events() if e.name == "[memory]") if mode == "mem" else 0
    return dt / n, mem


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=20000)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    x = torch.zeros(256, device=DEV)
    kinds = ("views", "inplace", "alloc", "cat1", "cat16") + (("runtime",) if DEV == "cuda" else ())
    for kind in kinds:  # warm every path once
        timed(kind, 1000, x, "shapes")
    runs: dict[str, list[float]] = {}
    mems: dict[str, list[float]] = {}
    for _ in range(a.reps):
        for kind in kinds:
            for mode in ("off", "shapes", "mem"):
                ns, mem = timed(kind, a.iters, x, mode)
                runs.setdefault(f"{kind}.{mode}", []).append(ns)
                if mode == "mem":
                    mems.setdefault(kind, []).append(mem / a.iters)
    med = {k: statistics.median(v) for k, v in runs.items()}
    op_ns = med["views.shapes"] - med["views.off"]
    launch_ns = med["inplace.shapes"] - med["inplace.off"] - op_ns
    mem_per_iter = statistics.median(mems["alloc"])
    mem_ns = (med["alloc.mem"] - med["alloc.shapes"]) / mem_per_iter if mem_per_iter else None
    input_ns = (
        (med["cat16.shapes"] - med["cat16.off"]) - (med["cat1.shapes"] - med["cat1.off"])
    ) / 15
    call_ns = None
    if DEV == "cuda":
        call_ns = med["runtime.shapes"] - med["runtime.off"]
    out = {
        "device": torch.cuda.get_device_name() if DEV == "cuda" else "cpu",
        "torch": torch.__version__,
        "iters": a.iters,
        "reps": a.reps,
        "ns_per_iteration": runs,
        "median_ns_per_iteration": med,
        "memory_events_per_iteration": mems,
        "op_event_ns": op_ns,
        "launch_extra_ns": launch_ns,
        "memory_event_ns": mem_ns,
        "memory_event_over_op": mem_ns / op_ns if mem_ns is not None and op_ns else None,
        "input_tensor_ns": input_ns,
        "runtime_call_ns": call_ns,
        "runtime_call_recorded_dur_ns": recorded_call_ns(2000, x) if DEV == "cuda" else None,
    }
    text = json.dumps(out, indent=1)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
