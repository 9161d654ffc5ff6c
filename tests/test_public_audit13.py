"""The thirteenth search of public traces (session 59): what it found, on fixtures relabelled as
the devices it met and on hand-built events (its traces are not kept: the fixtures sit near the
device's transfer cap).

- luatil/torch-profile's small transformer on an RTX 3060 (not in the spec table): fp32 math
  74% of the kernel time, GPU-bound, and fp32_compute LOW, unpriced, with TF32 advised. Relabelled
  as an RTX 3090 (the same family ratios) the same trace read HIGH 1.48x.
- blbadger/threebody's one register-limited kernel on an RTX 3060 (nsys): no occupancy at all.
- TraceLens's B300 MoE test: 12 ``vectorized_gather_kernel`` of 540 us under ``aten::index``
  (expert weights gathered per token), 63% of kernel time, advised "fuse elementwise chains".
"""

from __future__ import annotations

import json
import lzma
from functools import cache
from pathlib import Path

import pytest

import traceinsight
from traceinsight.model.devices import family_of, occupancy_basis, spec_of, tf32_faster, time_ratios
from traceinsight.model.schema import DeviceInfo
from traceinsight.pipeline import analyze_trace

from .builder import Events
from .conftest import FIXTURES

FP32_TRACE = FIXTURES / "h200" / "launch_bound_cudagraph.pt.trace.json.xz"
OCCUPANCY_KEY = "est. achieved occupancy %"


def device(name: str, cc: str, sms: int) -> DeviceInfo:
    return DeviceInfo(id=0, name=name, sm_count=sms, memory_bytes=12 * 10**9, compute_capability=cc)


@cache
def _doc() -> str:
    return lzma.open(FP32_TRACE).read().decode()


def relabelled(tmp: Path, name: str, major: int, minor: int, sms: int, *, kineto_occ: bool) -> Path:
    """The fp32 fixture as if recorded on another device (and without Kineto's occupancy)."""
    doc = json.loads(_doc())
    for p in doc["deviceProperties"]:
        p.update(name=name, computeMajor=major, computeMinor=minor, numSms=sms)
    if not kineto_occ:
        for e in doc["traceEvents"]:
            (e.get("args") or {}).pop(OCCUPANCY_KEY, None)
    out = tmp / f"{name.replace(' ', '_')}_{major}{minor}.json"
    out.write_text(json.dumps(doc))
    return out


def test_a_device_the_table_lacks_is_priced_by_its_familys_lowest_ratios() -> None:
    rtx3060 = device("NVIDIA GeForce RTX 3060", "8.6", 28)
    assert spec_of(rtx3060) is None
    fam = family_of(rtx3060)
    assert fam is not None and fam.bf16 and fam.tf32_faster is False
    # GA102 whitepaper: RTX 3090 FP32 35.6, TF32 35.6, BF16 with FP32 accumulate 71 TFLOP/s
    assert time_ratios(rtx3060) == (0.5, 0.5)
    assert time_ratios(device("NVIDIA GeForce RTX 3090", "8.6", 82)) == pytest.approx(
        (35.6 / 71, 35.6 / 71)
    )
    # the table's row wins over the family; an unknown capability prices nothing
    h200 = device("NVIDIA H200", "9.0", 132)
    assert family_of(h200) is None and time_ratios(h200)[0] == pytest.approx(67 / 989.5)
    assert time_ratios(device("NVIDIA Foo", "9.9", 100)) == (None, None)
    assert tf32_faster(spec_of(h200)) is True
    assert tf32_faster(spec_of(device("NVIDIA GeForce RTX 4090", "8.9", 128))) is False


def test_occupancy_limits_of_a_device_the_table_lacks() -> None:
    limits, sms = occupancy_basis(device("NVIDIA GeForce RTX 3060", "8.6", 28))
    # CUDA C Programming Guide, compute capability 8.6: 48 warps and 16 blocks an SM
    assert (limits.max_warps_per_sm, limits.max_blocks_per_sm, sms) == (48, 16, 28)
    assert occupancy_basis(device("NVIDIA Foo", "9.9", 100)) is None
    assert occupancy_basis(device("NVIDIA GeForce RTX 3060", "8.6", 0)) is None


def test_fp32_on_an_unlisted_geforce_is_priced_as_its_familys_weakest_card(tmp_path) -> None:
    """The same trace as an RTX 3060 (not in the table) and as an RTX 3090 (in it, the
    family's ratios): the same bf16 saving within the ratios' 0.3%, graded alike, and the
    advice bf16 without TF32 (TF32 runs at the fp32 rate on GeForce cards)."""
    unlisted = traceinsight.analyze(
        relabelled(tmp_path, "NVIDIA GeForce RTX 3060", 8, 6, 28, kineto_occ=True)
    )
    listed = traceinsight.analyze(
        relabelled(tmp_path, "NVIDIA GeForce RTX 3090", 8, 6, 82, kineto_occ=True)
    )
    a, b = (next(f for f in x.findings if f.id == "fp32_compute") for x in (unlisted, listed))
    assert a.what_if is not None and b.what_if is not None
    assert a.what_if.speedup == pytest.approx(b.what_if.speedup, rel=0.005)
    assert a.what_if.speedup > 1.1 and a.severity == b.severity != "low"
    assert "TF32 tensor math runs at the fp32 rate" in a.recommendation
    assert "set_float32_matmul_precision" not in (a.snippet or "")
    assert "compute capability 8.6" in a.evidence["peaks_assumed"]
    assert "peaks_assumed" not in b.evidence
    assert "assumes the weakest card of the GPU's family" in a.recommendation
    # a capability the data file does not know: unpriced, as before
    unknown = traceinsight.analyze(relabelled(tmp_path, "NVIDIA Foo", 9, 9, 132, kineto_occ=True))
    f = next(f for f in unknown.findings if f.id == "fp32_compute")
    assert f.what_if is None and f.severity == "low"


def test_occupancy_is_estimated_on_a_device_the_table_lacks(tmp_path) -> None:
    """Without Kineto's own estimate, a device the table lacks with the H200's capability and
    SM count reads the H200's occupancy; with an unknown capability, none."""

    def median(name: str, major: int, minor: int) -> float | None:
        path = relabelled(tmp_path, name, major, minor, 132, kineto_occ=False)
        return traceinsight.analyze(path).results.efficiency.occupancy.median

    h200 = median("NVIDIA H200", 9, 0)
    assert h200 is not None
    assert median("NVIDIA Foo", 9, 0) == pytest.approx(h200)
    assert median("NVIDIA Foo", 9, 9) is None


def test_gathers_are_named_and_advised_as_gathers() -> None:
    """Three 540 us gathers and three 100 us elementwise kernels: elementwise_heavy says
    most of it is gathers (1.62 of 1.92 ms) and advises gathering the smaller operand; the
    same kernels as plain elementwise ones keep the fusion advice."""

    def loop(gather: str) -> traceinsight.TraceAnalysis:
        ev = Events()
        for i in range(3):
            t = i * 1000
            ev.step(i, t, 1000)
            ev.kernel(gather, t + 10, 540, launch_us=t + 5)
            ev.kernel(
                "void at::native::vectorized_elementwise_kernel<4, add>",
                t + 560,
                100,
                launch_us=t + 20,
            )
            ev.kernel("nvjet_sm90_tst_128x64", t + 670, 300, launch_us=t + 30)
        return analyze_trace(ev.trace())

    a = loop("void at::native::vectorized_gather_kernel<16, long>(char*, char*, long*)")
    f = next(f for f in a.findings if f.id == "elementwise_heavy")
    assert f.severity in ("info", "low")  # the rule's cap: an opportunity, not why the GPU starves
    assert f.title.endswith("most of it index gathers (1.62 ms)")
    assert f.evidence["gather_ns"] == 1_620_000
    assert "index the activations, not a weight tensor" in f.recommendation
    plain = loop("void at::native::vectorized_elementwise_kernel<4, mul>")
    g = next(f for f in plain.findings if f.id == "elementwise_heavy")
    assert "gathers" not in g.title and g.evidence["gather_ns"] == 0


def test_a_cuda_graph_trees_recording_frame_is_capture() -> None:
    """torch.compile's CUDA Graph Trees record a graph inside ``record_function`` (its warm-up,
    syncs and pools before the capture calls): a 400 us gap under that frame, with a sync in
    it, is capture (one-time), not a sync's (MI300X xDiT captures: 51.6 ms of such gaps read
    "not explained"). Without the frame the same gap is the sync's."""

    def run(frame: str) -> dict[str, int]:
        ev = Events()
        ev.kernel("void at::native::vectorized_elementwise_kernel<4, add>", 0, 100, launch_us=0)
        ev.op(frame, 90, 520, kind="python_function")
        ev.runtime("cudaDeviceSynchronize", 150, 300)
        ev.kernel("void at::native::vectorized_elementwise_kernel<4, mul>", 500, 100, launch_us=460)
        return analyze_trace(ev.trace()).results.idle.idle_by_cause_ns

    inside = run("torch/_inductor/cudagraph_trees.py(2205): record_function")
    assert inside["capture"] == 400 * 1000 and inside["host_sync"] == 0
    elsewhere = run("torch/_inductor/compile_fx.py(1500): run")
    assert elsewhere["capture"] == 0 and elsewhere["host_sync"] > 0
