"""Predictions against a tabular loop as the Kaggle notebooks write it
(fixtures/generate/thirdparty/loop_tabular.py: rtdl's default FT-Transformer, 0.95 M parameters,
fed by a pandas Dataset that looks up one row with ``df.iloc`` per sample and makes three tensors
of it, DataLoader defaults, ``.item()`` and TensorBoard scalars every step; fp32, AdamW), held
out: written by a helper in session 62 who did not read the model, recorded on an NVIDIA H100
80GB HBM3 in one call (processes A, P, B) before anyone analyzed it. Measured (A and B): 8 pinned
workers 4.64-6.42x, a batch-indexed tensor Dataset 18.8-27.7x, the 4x batch 0.86-1.08x per
sample, bf16 0.68-1.04x, logging every 50 steps 0.73-1.01x, the default compile 0.69-1.05x, all
six 107-132x per sample. A's baseline (225.7 ms) ran faster than its own later configurations
that leave the host's work alone (311-332 ms) and than P's and B's (336.9, 351.1 ms): the
null fixes' bands reach down to 0.68 from it."""

from __future__ import annotations

import pytest

from .conftest import RecordedLoop, raw_events, within_band

LOOP = RecordedLoop.named("tabular")
TOLERANCE = 0.25
analysis, band, finding = LOOP.analysis, LOOP.band, LOOP.finding


def test_the_loader_comes_first_with_its_range() -> None:
    """93.7% of the window waits in DataLoader.__next__: dataloader_stall HIGH and first. At
    the stated assumption (the loader twice as fast) 2.10x; with the loading hidden, the upper
    bound, 18.2x (dataloader_stall@hidden). 8 workers measured 4.64-6.42x, inside the range;
    the batch-indexed Dataset (the loading gone) 18.8-27.7x, within 25% of the upper bound."""
    f = analysis().findings[0]
    assert (f.id, f.severity) == ("dataloader_stall", "high")
    assert LOOP.largest_single_fix() == "vectorized"
    hidden = f.evidence["what_if_hidden"]
    workers, gone = band("workers"), band("vectorized")
    assert f.what_if.speedup < workers["low"] and workers["high"] < hidden.speedup
    assert within_band(hidden.speedup, gone["low"], gone["high"], TOLERANCE)
    assert LOOP.what_if(["dataloader_stall@hidden"]).speedup == pytest.approx(hidden.speedup)


def test_a_batch_carries_the_collated_tensors_not_each_samples() -> None:
    """__getitem__ makes three tensors of each of 256 rows (768 torch.tensor calls a batch) and
    the collate stacks them into three: a worker sends the three. By hand from the raw events of
    one __next__: 768 aten::lift_fresh of three shapes before its first aten::stack, 3 stacks. Counting
    the 768 priced receiving a batch from workers at 208.7 ms and the loader's fix at 1.09x (LOW)."""
    ev = raw_events(LOOP.before)
    nxt = sorted(
        (e for e in ev if e.get("cat") == "user_annotation" and "DataLoader" in e["name"]),
        key=lambda e: e["ts"],
    )[1]
    inside = [
        e
        for e in ev
        if e.get("cat") == "cpu_op"
        and e["tid"] == nxt["tid"]
        and nxt["ts"] <= e["ts"] <= nxt["ts"] + nxt["dur"]
    ]
    stacks = sorted(e["ts"] for e in inside if e["name"] == "aten::stack")
    fresh = [e["ts"] for e in inside if e["name"] == "aten::lift_fresh"]
    assert len(stacks) == 3 and len(fresh) == 768 and max(fresh) < stacks[0]
    assert {tuple(map(tuple, e["args"]["Input Dims"])) for e in inside if e["name"] == "aten::lift_fresh"} == {((30,),), ((10,),), ((),)}  # fmt: skip
    plan = finding("dataloader_stall").evidence["loader_plan"]
    assert plan.batch_tensors == 3
    # a Dataset that makes the batch's own tensors keeps them: DLRM's 54 of many shapes before
    # its one stack, 55 a batch (4 pinned workers measured 3.46-3.71x against 3.17x priced)
    dlrm = RecordedLoop.named("dlrm").finding("dataloader_stall").evidence["loader_plan"]
    assert dlrm.batch_tensors == 55


def test_no_finding_above_low_for_the_fixes_that_measured_nothing() -> None:
    """bf16, logging every 50 steps, the 4x batch and the default compile measured at most
    1.08x: their findings stay at or below low, each priced within its band."""
    sev = {f.id: f.severity for f in analysis().findings}
    for fid, fix in (("fp32_compute", "bf16"), ("host_sync", "log_every_50")):
        assert sev[fid] == "info"
        b = band(fix)
        assert within_band(finding(fid).what_if.speedup, b["low"], b["high"], TOLERANCE)
    assert sev["launch_bound"] == "low" and band("compile")["high"] < 1.10
    assert "memory_headroom" not in sev and "small_batch" not in sev
    b = band("batch_4x")
    assert within_band(LOOP.what_if(["memory_headroom@4"]).speedup, b["low"], b["high"], TOLERANCE)


@pytest.mark.xfail(
    strict=True,
    reason="the recorded all compiles (default mode) a step the loader no longer bounds: its "
    "fusion of a host-bound step is not modelled (MoE's miss too); 64.2x replayed, 107-132x",
)
def test_the_applied_set_is_priced_within_its_band() -> None:
    w = LOOP.what_if(["dataloader_stall@hidden", "memory_headroom@4", "fp32_compute", "host_sync"])
    b = band("all")
    assert within_band(w.speedup, b["low"], b["high"], TOLERANCE)


def test_the_unprofiled_step_within_the_measured_processes() -> None:
    """The un-profiled estimate (233.1 ms) lies between A's and B's baselines (225.7, 351.1 ms)
    and within 10% of A's; P's own timing just before it profiled, 314.9 ms, is 1.35x it: the
    pandas lookups' pace varied 1.55x between processes, which no trace of one shows."""
    rp = analysis().results.replay
    est = rp.unprofiled_step_ns / 1e6
    a, b = (LOOP.truth["configs"]["baseline"][k]["step_ms_window_mean"] for k in ("A", "B"))
    assert a < est < b and abs(est / a - 1) < 0.10
