"""One module per input format; each returns the same :class:`~traceinsight.model.Trace`."""

from __future__ import annotations

from pathlib import Path

from traceinsight.errors import InputError
from traceinsight.model.schema import Trace
from traceinsight.parsers.source import SQLITE_MAGIC, head_bytes, sniff, sqlite_names, unpacked

# the process rocprof v1/v2 names for the host's HIP calls in its Chrome trace
LEGACY_ROCPROF_JSON = b'"CPU HIP API"'
# torch.autograd.profiler's export before Kineto (PyTorch < 1.8): every event in the process
# "CPU functions" (or "CUDA functions"), none of a profiler category
LEGACY_AUTOGRAD_JSON = (b'"pid": "CPU functions"', b'"pid":"CPU functions"')
LEGACY_AUTOGRAD_MESSAGE = (
    "a torch.autograd.profiler export from before PyTorch 1.8 (the process 'CPU functions'), "
    "which holds none of the PyTorch profiler's categories: record with torch.profiler.profile "
    "and export_chrome_trace (PyTorch 1.8 or later)"
)
# rocprofiler-compute (Omniperf)'s database: counters per kernel dispatch, no timeline
ROCPROF_COMPUTE_TABLE = "compute_dispatch"
ROCPROF_COMPUTE_MESSAGE = (
    "a rocprofiler-compute (Omniperf) counter database (tables compute_*), not a trace: it "
    "holds counters per kernel, no timeline; record with rocprofv3 (--runtime-trace "
    "--output-format rocpd, or json) or torch.profiler"
)


# a gzip- or xz-packed SQLite export (report.sqlite.xz): unpacked to a temporary file to be read
PACKED_SQLITE = "packed-sqlite"


def detect_format(path: Path) -> str:
    """'kineto', 'nsys-sqlite', 'nsys-rep', 'rocprof-json', 'rocpd' or 'packed-sqlite', from the
    content (suffix only for .nsys-rep). A rocmProfileData (RPD) database is 'rocpd' too: its
    parser refuses it."""
    if not path.exists():
        raise InputError("no such file", str(path))
    if path.is_dir():
        raise InputError("is a directory, expected a trace file", str(path))
    kind = sniff(path)
    if kind == "sqlite":
        from traceinsight.parsers.rocprof import flavour

        names = sqlite_names(path)
        if ROCPROF_COMPUTE_TABLE in names:
            raise InputError(ROCPROF_COMPUTE_MESSAGE, str(path))
        return "rocpd" if flavour(names) else "nsys-sqlite"
    if path.suffix == ".nsys-rep" or path.suffix == ".qdrep":
        return "nsys-rep"
    if kind == "empty":
        raise InputError("empty file (0 bytes)", str(path))
    if kind == "lfs-pointer":
        raise InputError(_lfs_message(path), str(path))
    if kind in ("zip", "parquet", "binary"):
        raise InputError(_binary_message(path, kind), str(path))
    from traceinsight.parsers.rocprof import looks_like_rocprof_json
    from traceinsight.parsers.rocprof.rocpd import LEGACY_MESSAGE

    head = head_bytes(path)
    if kind in ("gzip", "xz") and head.startswith(SQLITE_MAGIC):
        return PACKED_SQLITE  # an export archived packed: which profiler's, once unpacked
    if looks_like_rocprof_json(head):
        return "rocprof-json"
    if LEGACY_ROCPROF_JSON in head:
        # rocprof v1/v2's Chrome trace: its own process names and ns fields in every event's
        # args, none of Kineto's categories (a ROCm blog's --hip-trace results.json)
        raise InputError(LEGACY_MESSAGE.format(what="a --hip-trace Chrome trace"), str(path))
    if any(m in head for m in LEGACY_AUTOGRAD_JSON):
        raise InputError(LEGACY_AUTOGRAD_MESSAGE, str(path))
    return "kineto"


def load_trace(
    path: str | Path, *, max_bytes: int | None = None, parse_helpers: int = 0, threads: int = 1
) -> Trace:
    """Parse any supported trace file into the common event table (``parse_helpers``: helper
    threads or processes for a large Kineto trace, see :func:`~traceinsight.parsers.kineto.parse_kineto`;
    ``threads``: threads for building a large table; both from the :class:`Runtime`)."""
    p = Path(path)
    fmt = detect_format(p)
    if fmt == PACKED_SQLITE:
        with unpacked(p, max_bytes) as db:
            try:
                trace = load_trace(db, max_bytes=max_bytes, threads=threads)
            except InputError as exc:  # the message names the input, not the temporary file
                raise InputError(exc.message, str(p)) from None
        trace.meta.source_path = str(p)
        return trace
    if fmt == "kineto":
        from traceinsight.parsers.memory_timeline import is_memory_timeline, parse_memory_timeline

        if is_memory_timeline(p, max_bytes):  # export_memory_timeline: JSON, but no events
            return parse_memory_timeline(p, max_bytes)
        from traceinsight.parsers.kineto import parse_kineto

        return parse_kineto(p, max_bytes=max_bytes, parse_helpers=parse_helpers, threads=threads)
    if fmt == "rocprof-json":
        from traceinsight.parsers.rocprof import parse_rocprof_json

        return parse_rocprof_json(p, max_bytes=max_bytes, threads=threads)
    if fmt == "rocpd":
        from traceinsight.parsers.rocprof import parse_rocpd

        return parse_rocpd(p, threads=threads)
    if fmt == "nsys-sqlite":
        from traceinsight.parsers.nsys import parse_nsys

        return parse_nsys(p, threads=threads)
    from traceinsight.parsers.nsys import parse_nsys_rep

    return parse_nsys_rep(p, threads=threads)


READS = (
    "this tool reads PyTorch profiler (Kineto) traces (.json, .json.gz, .json.xz), Nsight "
    "Systems exports (.sqlite, .sqlite.xz, .nsys-rep) and rocprofv3 outputs"
)


def _binary_message(path: Path, kind: str) -> str:
    """What a binary input that is no trace this tool reads most likely is (public inputs
    refused as "not valid JSON": JAX's XPlane protobufs, an nsys-jax zip of Parquet files)."""
    if kind == "zip":
        return f"a zip archive, not a trace file: unpack it and give the trace inside ({READS})"
    if kind == "parquet":
        what = "a Parquet file"
    elif path.name.endswith((".xplane.pb", ".pb")):
        what = "a protobuf file (a JAX/TensorFlow XPlane profile: open it in TensorBoard or xprof)"
    else:
        what = "a binary file"
    return f"{what}, not a trace this tool reads: {READS}"


def _lfs_message(path: Path) -> str:
    """What the pointer stands for, from its ``size`` line."""
    size = None
    for line in head_bytes(path, 512).decode("ascii", "replace").splitlines():
        if line.startswith("size ") and line[5:].strip().isdigit():
            size = int(line[5:])
    what = f" of {size / 1e6:,.1f} MB" if size is not None else ""
    return (
        f"a Git LFS pointer, not the trace: the object{what} was not downloaded "
        "(run 'git lfs pull' in its repository)"
    )
