"""Device specifications: dense peak TFLOP/s per dtype, memory bandwidth and per-SM limits, from
the data file ``traceinsight/data/devices.toml`` (each row names its datasheet), matched to a
trace's device by name, memory size, SM count and compute capability.
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import polars as pl

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10 reads it with the tomli backport
    import tomli as tomllib

DATA = Path(__file__).resolve().parent.parent / "data" / "devices.toml"
TENSOR_DTYPES = ("bf16", "fp16")  # MFU's peak: the dense 16-bit tensor-core rate


@dataclass(frozen=True)
class ArchLimits:
    """Per-SM (per-CU) resources an occupancy estimate divides among a kernel's blocks."""

    warp_size: int
    registers_per_sm: int
    register_unit: int
    max_registers_per_thread: int
    shared_memory_per_sm_bytes: int
    max_warps_per_sm: int
    max_blocks_per_sm: int
    max_threads_per_sm: int


# Pinned host-to-device copies over each architecture's PCIe generation (x16): about 0.8 of the
# link's raw rate (3.0: 15.8 GB/s, 4.0: 31.5, 5.0: 63), as measured on hosts of each (50 GB/s on
# the H200's); a device row's host_link_gb_s overrides it
HOST_LINK_GB_S_BY_ARCH = {
    "sm70": 12.0,  # V100: PCIe 3.0
    "sm75": 12.0,  # T4, RTX 20: PCIe 3.0
    "sm80": 25.0,  # A100: PCIe 4.0
    "sm86": 25.0,  # A10, RTX 30, RTX A-series: PCIe 4.0
    "sm89": 25.0,  # L4, L40S, RTX 40: PCIe 4.0
    "sm90": 50.0,  # H100, H200: PCIe 5.0
    "sm100": 50.0,  # B200: PCIe 5.0
    "sm120": 50.0,  # RTX 50, RTX PRO Blackwell: PCIe 5.0
    "cdna2": 25.0,  # MI250: PCIe 4.0
    "cdna3": 50.0,  # MI300: PCIe 5.0
    "cdna4": 50.0,  # MI350: PCIe 5.0
}


@dataclass(frozen=True)
class DeviceSpec:
    id: str
    sm_count: int | None
    memory_bandwidth_bytes_per_s: float
    peak_tflops: dict[str, float]
    limits: ArchLimits
    source: str = ""  # the datasheet the row names
    # a pinned host-to-device copy's rate over the link to the host (HOST_LINK_GB_S_BY_ARCH)
    host_link_bytes_per_s: float | None = None
    memory_type: str | None = None  # "HBM3e", "GDDR6", ...: the datasheet's device memory

    @property
    def tensor_peak_tflops(self) -> float | None:
        """The dense bf16 (else fp16) tensor peak: MFU's denominator."""
        for d in TENSOR_DTYPES:
            if d in self.peak_tflops:
                return self.peak_tflops[d]
        return None

    def has(self, dtype: str) -> bool:
        return dtype in self.peak_tflops

    def to_json(self) -> dict[str, Any]:
        return {
            "spec": self.id,
            "peak_tflops": dict(self.peak_tflops),
            "memory_bandwidth_bytes_per_s": self.memory_bandwidth_bytes_per_s,
            "memory_type": self.memory_type,
        }


@cache
def _text() -> tuple[str, dict[str, Any]]:
    """The data file, as text (its rows' datasheet comments) and parsed: read once."""
    text = DATA.read_text()
    return text, tomllib.loads(text)


@cache
def _table() -> tuple[list[dict[str, Any]], dict[str, ArchLimits]]:
    text, doc = _text()
    arch = {k: ArchLimits(**v) for k, v in doc["arch"].items()}
    # the datasheet comment on each [[device]] line, in order
    notes = [m.group(1).strip() for m in re.finditer(r"^\[\[device\]\]\s*#(.*)$", text, re.M)]
    rows = [
        dict(r, _source=notes[i] if i < len(notes) else "") for i, r in enumerate(doc["device"])
    ]
    return rows, arch


def _matches(
    row: dict[str, Any], name: str, memory_bytes: int | None, sm: int | None, cc: str | None
) -> bool:
    if not re.search(row["name"], name, re.I):
        return False
    gb = memory_bytes / 1e9 if memory_bytes else None
    if "memory_gb_min" in row and (gb is None or gb < row["memory_gb_min"]):
        return False
    if "memory_gb_max" in row and (gb is None or gb > row["memory_gb_max"]):
        return False
    # a row that names an SM count only matches a trace that disagrees when it says another
    if "sm_count" in row and sm is not None and sm != row["sm_count"]:
        return False
    return not ("compute_capability" in row and cc != row["compute_capability"])


@cache
def lookup(
    name: str | None,
    memory_bytes: int | None = None,
    sm_count: int | None = None,
    compute_capability: str | None = None,
) -> DeviceSpec | None:
    """The spec of the device with these properties, None where no row matches."""
    rows, arch = _table()
    for row in rows:
        if _matches(row, name or "", memory_bytes, sm_count, compute_capability):
            return DeviceSpec(
                id=row["id"],
                sm_count=row.get("sm_count", sm_count),
                memory_bandwidth_bytes_per_s=float(row["memory_bandwidth_gb_s"]) * 1e9,
                peak_tflops={k: float(v) for k, v in row["peak_tflops"].items()},
                limits=arch[row["arch"]],
                source=row["_source"],
                host_link_bytes_per_s=(
                    float(row.get("host_link_gb_s", HOST_LINK_GB_S_BY_ARCH.get(row["arch"], 0)))
                    * 1e9
                    or None
                ),
                memory_type=row.get("memory_type"),
            )
    return None


# A device the table lacks still has an architecture: its compute capability, or else the
# newest one its kernels were built for (cuBLAS and cuDNN name theirs: volta_sgemm_*,
# sm80_xmma_*), which sets its PCIe generation (audit 23: a Quadro RTX 6000 and a 2021 trace's
# unnamed V100 priced at PCIe 4.0's 25 GB/s, twice their link)
ARCH_OF_CAPABILITY = {
    "7.0": "sm70",
    "7.5": "sm75",
    "8.0": "sm80",
    "8.6": "sm86",
    "8.9": "sm89",
    "8.7": "sm87",
    "9.0": "sm90",
    "10.0": "sm100",
    "10.3": "sm100",  # B300: sm_100's limits
    "10.1": "sm110",  # Thor before CUDA 13 renamed it
    "11.0": "sm110",
    "12.0": "sm120",
    "12.1": "sm120",  # GB10: sm_120's limits
}
# SoCs whose GPU shares the host's memory (Jetson Orin and Thor, GB10): no PCIe rate applies
INTEGRATED_CAPABILITIES = frozenset({"8.7", "10.1", "11.0", "12.1"})
KERNEL_ARCH_PATTERNS = (
    (r"^(volta|sm70)_", "sm70"),
    (r"^(turing|sm75)_", "sm75"),
    (r"^(ampere|sm80)_", "sm80"),
    (r"^sm86_", "sm86"),
    (r"^sm89_", "sm89"),
    (r"^sm90a?_", "sm90"),
    (r"^sm100a?_", "sm100"),
    (r"^sm120a?_", "sm120"),
)


def arch_of_kernels(names: Iterable[str]) -> str | None:
    """The newest architecture the kernel names were built for (None: none names one)."""
    s = names if isinstance(names, pl.Series) else pl.Series(list(names), dtype=pl.String)
    named = [arch for pattern, arch in KERNEL_ARCH_PATTERNS if s.str.contains(pattern).any()]
    return named[-1] if named else None


def host_links(
    devices: Any,
    kernel_names: Callable[[], Iterable[str]] | None = None,
    active: Iterable[int] = (),
) -> dict[int, float]:
    """Each device's host link (bytes/s, pinned host-to-device): the spec table's, else its
    architecture's PCIe generation (:data:`ARCH_OF_CAPABILITY`, else the kernels' names,
    ``kernel_names`` called only where a device needs it); absent where neither is known.
    ``active``: devices with activity, those the trace describes nowhere included."""
    out: dict[int, float] = {}
    guessed: list[str | None] = []
    # (id, compute capability, spec) of each device, those with activity only (no properties)
    known = [(d.id, d.compute_capability, spec_of(d)) for d in devices]
    described = {i for i, _, _ in known}
    for i, capability, spec in [*known, *((i, None, None) for i in active if i not in described)]:
        if spec is not None and spec.host_link_bytes_per_s:
            out[i] = spec.host_link_bytes_per_s
            continue
        if str(capability or "") in INTEGRATED_CAPABILITIES:
            continue  # no PCIe link: the GPU shares the host's memory
        arch = ARCH_OF_CAPABILITY.get(str(capability or ""))
        if arch is None and kernel_names is not None:
            if not guessed:
                guessed.append(arch_of_kernels(kernel_names()))
            arch = guessed[0]
        if arch in HOST_LINK_GB_S_BY_ARCH:
            out[i] = HOST_LINK_GB_S_BY_ARCH[arch] * 1e9
    return out


def spec_of(device: Any) -> DeviceSpec | None:
    """The spec of a :class:`~traceinsight.model.schema.DeviceInfo` (None if unknown)."""
    if device is None:
        return None
    return lookup(device.name, device.memory_bytes, device.sm_count, device.compute_capability)


@dataclass(frozen=True)
class Family:
    """What a device the table lacks is priced by: its compute capability's lowest datasheet
    ratios (``[family."8.6"]`` in the data file), the smallest gain 16-bit tensor math gives
    any card of the family."""

    capability: str
    fp32_over_tensor: float  # fp32 peak / dense 16-bit tensor peak (fp32 accumulation)
    tf32_over_tensor: float | None  # None: no TF32 tensor math
    bf16: bool  # the 16-bit tensor math is bf16 (else fp16 only)
    source: str

    @property
    def tf32_faster(self) -> bool | None:
        """Whether TF32 runs faster than fp32 on every card of the family."""
        if self.tf32_over_tensor is None:
            return None
        return self.tf32_over_tensor * FASTER_MIN_RATIO > self.fp32_over_tensor


# A peak counts as faster than another where this share of it still exceeds the other (TF32 at
# the fp32 rate on GeForce cards does not)
FASTER_MIN_RATIO = 0.95


@cache
def _families() -> dict[str, Family]:
    doc = _text()[1]
    return {
        cc: Family(
            cc,
            float(v["fp32_over_tensor"]),
            float(v["tf32_over_tensor"]) if "tf32_over_tensor" in v else None,
            bool(v["bf16"]),
            str(v["source"]),
        )
        for cc, v in doc.get("family", {}).items()
    }


def family_of(device: Any) -> Family | None:
    """The family a device the table lacks is priced by (None: the table has the device, or
    its compute capability is unknown or not in the data file)."""
    if device is None or spec_of(device) is not None or not device.compute_capability:
        return None
    return _families().get(str(device.compute_capability))


def time_ratios(device: Any) -> tuple[float | None, float | None]:
    """(fp32, TF32) time over the 16-bit tensor time of the same math on ``device``: from its
    spec, else its family's lowest ratios (:func:`family_of`); None each where unknown."""
    spec = spec_of(device)
    if spec is not None:
        return tensor_time_ratio(spec, "fp32"), tensor_time_ratio(spec, "tf32")
    fam = family_of(device)
    return (fam.fp32_over_tensor, fam.tf32_over_tensor) if fam else (None, None)


def tf32_faster(spec: DeviceSpec | None) -> bool | None:
    """Whether the device's TF32 tensor peak beats its fp32 peak (GeForce cards: equal)."""
    if spec is None or not spec.has("tf32") or not spec.has("fp32"):
        return None
    return spec.peak_tflops["tf32"] * FASTER_MIN_RATIO > spec.peak_tflops["fp32"]


# NVIDIA compute capabilities where PyTorch's scaled_dot_product_attention was seen to take
# cuDNN's attention for 16-bit inputs (H100, H200 with torch 2.11: a held-out Conformer's, a T5's
# and a sentence-transformers loop's efficient-backend fp32 attention ran cuDNN's in bf16);
# Blackwell's choice was not measured
CUDNN_SDPA_CAPABILITIES = ("9.0",)
_AMD_NAME = re.compile(r"AMD|Instinct|Radeon|\bMI\d{3}", re.I)


def cudnn_sdpa_in_16bit(device: Any) -> bool:
    """Whether SDPA on ``device`` runs cuDNN's attention once its inputs are bf16/fp16."""
    if device is None or str(device.compute_capability or "") not in CUDNN_SDPA_CAPABILITIES:
        return False
    return not _AMD_NAME.search(device.name or "")


def occupancy_basis(device: Any) -> tuple[ArchLimits, int] | None:
    """The per-SM limits and SM count an occupancy estimate needs: the spec's, else the
    architecture's by compute capability with the trace's own SM count (None: neither)."""
    spec = spec_of(device)
    if spec is not None:
        return spec.limits, spec.sm_count or 1
    if device is None or not device.sm_count:
        return None
    arch = ARCH_OF_CAPABILITY.get(str(device.compute_capability or ""))
    limits = _table()[1].get(arch) if arch else None
    return (limits, int(device.sm_count)) if limits else None


def fp32_to_bf16_time_ratio(spec: DeviceSpec | None) -> float | None:
    """How much faster 16-bit tensor-core math is than fp32 CUDA-core math on this device
    (fp32 peak / bf16 peak; fp16 where the device has no bf16): the bf16 what-if's scale for a
    fp32 GEMM's time. None where the table lacks either figure."""
    return tensor_time_ratio(spec, "fp32")


def tensor_time_ratio(spec: DeviceSpec | None, dtype: str) -> float | None:
    """``dtype``'s peak over the device's 16-bit tensor peak: the time the same math takes on
    the tensor cores in bf16 (fp16), relative to ``dtype`` (None where the table lacks either)."""
    if spec is None or dtype not in spec.peak_tflops:
        return None
    tensor = spec.tensor_peak_tflops
    return spec.peak_tflops[dtype] / tensor if tensor else None


def occupancy_estimate(
    limits: ArchLimits,
    threads_per_block: int,
    registers_per_thread: int,
    shared_memory_bytes: int,
) -> tuple[float, str]:
    """Theoretical occupancy (active warps / max warps per SM) of one launch configuration,
    and the resource that limits it: ``registers``, ``shared_memory``, ``block_size`` (too few
    threads per block for the block-count limit) or ``warps`` (full)."""
    warps = max(1, math.ceil(threads_per_block / limits.warp_size))
    by = {"warps": limits.max_warps_per_sm // warps, "block_size": limits.max_blocks_per_sm}
    if registers_per_thread > 0:
        unit = limits.register_unit
        per_warp = math.ceil(registers_per_thread * limits.warp_size / unit) * unit
        by["registers"] = limits.registers_per_sm // (per_warp * warps)
    if shared_memory_bytes > 0:
        by["shared_memory"] = limits.shared_memory_per_sm_bytes // shared_memory_bytes
    limit = min(by, key=lambda k: (by[k], k != "warps"))
    blocks = max(0, by[limit])
    return min(1.0, blocks * warps / limits.max_warps_per_sm), limit
