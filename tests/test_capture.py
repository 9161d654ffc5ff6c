"""A real trace captured on the CPU-only torch goes through the whole pipeline."""

import importlib.util

import pytest

from traceinsight.cli import main

if importlib.util.find_spec("torch") is None:
    pytest.skip("capture tests need torch (pip install torch==2.13.0)", allow_module_level=True)


@pytest.fixture(scope="module")
def torch():  # type: ignore[no-untyped-def]
    """Imported by the worker that runs these tests only: both workers collect every file, and
    torch's import is ~3 s of CPU."""
    import torch

    return torch


def test_capture_then_analyze(tmp_path, torch):
    from traceinsight import capture

    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with capture.capture(out_dir=tmp_path, steps=3, name="cpu_mlp", analyze=True) as c:
        for _ in range(8):
            loss = model(torch.randn(16, 64)).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            c.step()
    assert c.trace_path is not None and c.trace_path.exists()
    assert c.report_path is not None and c.report_path.exists()
    out = tmp_path / "r.json"
    assert main(["analyze", str(c.trace_path), "--no-html", "-q", "--json", str(out)]) == 0
    import json

    doc = json.loads(out.read_text())
    assert doc["metrics"]["steps"] == 3
    assert doc["metrics"]["gpu_busy_ratio"] is None  # CPU-only capture
    assert doc["source"]["event_counts"]["cpu_op"] > 0


def test_profile_command_runs_a_script(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        "import torch\nfrom traceinsight import capture\n"
        "m = torch.nn.Linear(32, 32)\n"
        "for _ in range(10):\n    m(torch.randn(8, 32)).sum().backward()\n    capture.step()\n"
    )
    import sys

    rc = main(
        [
            "profile",
            "--out",
            str(tmp_path / "traces"),
            "--steps",
            "3",
            "--",
            sys.executable,
            str(script),
        ]
    )
    assert rc == 0
    assert list((tmp_path / "traces").glob("*.pt.trace.json.gz"))
    assert list((tmp_path / "traces").glob("*.traceinsight.html"))


def test_profile_redirects_a_scripts_own_capture(tmp_path, monkeypatch, capsys):
    """A script with its own ``capture(out_dir="runs")`` under ``traceinsight profile --out T``:
    the trace is written into T (the capture helper honours the command's directory), the
    command says it redirected it, and analyzes it (3 recorded steps: the script's own steps=3)."""
    script = tmp_path / "train.py"
    script.write_text(
        "import torch\nfrom traceinsight import capture\n"
        "m = torch.nn.Linear(32, 32)\n"
        "with capture.capture(out_dir='runs', steps=3, wait=0, warmup=1) as c:\n"
        "    for _ in range(6):\n        m(torch.randn(8, 32)).sum().backward()\n        c.step()\n"
    )
    import sys

    monkeypatch.chdir(tmp_path)
    out = tmp_path / "traces"
    rc = main(["profile", "--out", str(out), "--no-analyze", "--", sys.executable, str(script)])
    stdout = capsys.readouterr().out
    assert rc == 0, stdout
    (trace,) = out.glob("*.pt.trace.json.gz")
    assert not (tmp_path / "runs").exists()
    said = "the script's capture(out_dir='runs') was redirected to --out"
    assert f"trace: {trace} ({said})" in stdout
    js = tmp_path / "r.json"
    assert main(["analyze", str(trace), "--no-html", "-q", "--json", str(js)]) == 0
    import json

    assert json.loads(js.read_text())["metrics"]["steps"] == 3


def test_capture_times_the_steps_without_the_profiler(tmp_path):
    """The capture times ``measure`` steps after ``wait`` ones without the profiler, from a
    synchronize to a synchronize, and writes their mean into the trace; the analysis reports it.
    The timed steps sleep 20 ms and every other step 80 ms: a window shifted by one step holds
    an 80 ms step (a mean of at least 40 ms), a wrong count divides to 15 or 30 ms."""
    import gzip
    import json
    import time

    import traceinsight
    from traceinsight import capture

    with capture.capture(out_dir=tmp_path, steps=2, wait=1, measure=3, warmup=1, name="t") as c:
        for i in range(8):
            time.sleep(0.020 if 1 <= i <= 3 else 0.080)
            c.step()
    assert c.unprofiled_step_ns is not None
    assert 20_000_000 <= c.unprofiled_step_ns <= 28_000_000
    doc = json.loads(gzip.decompress(c.trace_path.read_bytes()))
    assert doc[capture.MEASURED_KEY] == {
        "unprofiled_step_ns": c.unprofiled_step_ns,
        "unprofiled_steps": 3,
    }
    r = traceinsight.analyze(c.trace_path).results.replay
    assert r is not None and r.measured_step_ns == c.unprofiled_step_ns


def test_no_measurement_without_measured_steps(tmp_path, torch):
    from traceinsight import capture
    from traceinsight.parsers import load_trace

    with capture.capture(out_dir=tmp_path, steps=2, wait=1, measure=0, warmup=1, name="n") as c:
        for _ in range(5):
            torch.randn(8, 8).sum()
            c.step()
    assert c.unprofiled_step_ns is None
    assert "unprofiled_measured_step_ns" not in load_trace(c.trace_path).meta.extra


def test_a_loop_that_ends_inside_the_recording_is_told(tmp_path, capsys, torch):
    """A loop written for wait + warmup + steps iterations (before the capture measured the
    un-profiled step) ends one step into the recording: the capture says how many of its steps
    the trace holds and how many iterations it needs (session 48: the recording harness lost two
    of three steps a trace, silently)."""
    from traceinsight import capture

    with capture.capture(out_dir=tmp_path, steps=3, wait=1, measure=3, warmup=1, name="s") as c:
        for _ in range(1 + 1 + 3):  # wait + warmup + steps
            torch.randn(8, 8).sum()
            c.step()
    assert (c.step_count, c.iterations_needed, c.recorded_steps) == (5, 8, 0)
    err = capsys.readouterr().err
    assert "ended after 5 iterations, so the trace holds 0 of its 3 steps; it needs 8" in err
    with capture.capture(out_dir=tmp_path, steps=3, wait=1, measure=3, warmup=1, name="w") as c:
        for _ in range(7):
            c.step()
    assert c.recorded_steps == 2
    assert "the trace holds 2 of its 3 steps" in capsys.readouterr().err
    with capture.capture(out_dir=tmp_path, steps=3, wait=1, measure=3, warmup=1, name="x") as c:
        for _ in range(8):
            c.step()
    assert c.recorded_steps == 3 and "traceinsight.capture" not in capsys.readouterr().err
