"""What program a trace records, read from the trace itself: a PyTorch program or a plain
CUDA/HIP application (C++, Fortran, MPI codes). The findings' advice follows it (each rule
declares its advice per framework: findings/model.py)."""

from __future__ import annotations

import polars as pl

from traceinsight.constants import FRAMEWORKS, Framework
from traceinsight.model.schema import Trace

__all__ = ["FRAMEWORKS", "Framework", "detect_framework", "runtime_of"]

# ATen ops (cpu_op rows, torch's NVTX ranges under nsys --pytorch or emit_nvtx), the profiler's
# steps, torch.compile/Dynamo regions
_TORCH_RANGE = (
    r"^(aten::|ProfilerStep#|autograd::|torch[._:]|Torch-Compiled Region|## Call CompiledFxGraph)"
)
# ATen's and c10's own CUDA/HIP kernels (nsys and rocprof traces without host ranges)
_TORCH_KERNEL = r"at::native::|at::cuda::|\bc10::|at_cuda_detail::|\bpytorch_"
# libtorch in the backtraces nsys recorded
_TORCH_MODULE = r"(?i)(^|/)(libtorch|libc10|_C\.cpython|libtorch_python)"


def detect_framework(trace: Trace) -> Framework:
    """``pytorch`` when the trace shows PyTorch (a Kineto trace with its schemaVersion: the
    profiler wrote it; ATen op or step ranges, Python frames, ATen kernels, libtorch in the
    backtraces), else ``cuda_app``. A Chrome trace without schemaVersion is judged by its
    content: ``annotate`` writes one from an nsys export of any program."""
    if trace.meta.format == "kineto" and trace.meta.format_version.startswith("schemaVersion"):
        return "pytorch"
    if trace.meta.format == "memory-timeline":  # only torch's memory profiler writes it
        return "pytorch"
    kind, name = pl.col("kind"), pl.col("name")
    hit = (
        kind.eq("python_function")
        | (kind.is_in(["cpu_op", "user_annotation"]) & name.str.contains(_TORCH_RANGE))
        | (kind.eq("kernel") & name.str.contains(_TORCH_KERNEL))
    )
    if _any_row(trace.events, hit):
        return "pytorch"
    chains = trace.callchains
    if chains.height and chains["module"].drop_nulls().str.contains(_TORCH_MODULE).any():
        return "pytorch"
    return "cuda_app"


def runtime_of(trace: Trace) -> str:
    """``hip`` for a ROCm capture (rocprofv3's formats, or HIP runtime calls), else
    ``cuda``: the runtime whose names a CUDA/HIP application's advice uses."""
    if trace.meta.format in ("rocpd", "rocprof-json"):
        return "hip"
    if trace.meta.format.startswith("nsys"):
        return "cuda"  # Nsight Systems records CUDA only: no scan of a large export's rows
    api = pl.col("kind").is_in(["runtime", "driver"])
    hip = api & pl.col("name").str.starts_with("hip")
    return "hip" if _any_row(trace.events, hip) else "cuda"


FIRST_SLICE_ROWS = 65_536


def _any_row(ev: pl.DataFrame, hit: pl.Expr) -> bool:
    """Whether ``hit`` holds on any row, slice by slice (each four times the last): a PyTorch
    trace shows it within its first rows, where matching the regexes over every row of a 1 GB
    nsys export took 0.5 s per rank; a trace without it is read to the end, as in one pass."""
    start, size = 0, FIRST_SLICE_ROWS
    while start < ev.height:
        if ev.slice(start, size).select(hit.fill_null(False).any()).item():
            return True
        start, size = start + size, size * 4
    return False
