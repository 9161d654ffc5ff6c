import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner

from traceinsight.cli import cli, main

from .conftest import CORPUS, H200, ROOT, TINY

TRACE = H200 / "dataloader_starved.pt.trace.json.xz"


def test_analyze_writes_report_and_json(tmp_path):
    out, js = tmp_path / "r.html", tmp_path / "r.json"
    rc = main(["analyze", str(TRACE), "-o", str(out), "--json", str(js), "-q"])
    assert rc == 0
    doc = json.loads(js.read_text())
    assert doc["schema"] == "traceinsight/1" and doc["findings"][0]["id"] == "dataloader_stall"
    assert out.read_text().startswith("<!doctype html>")


def test_json_to_stdout_via_runner(tmp_path):
    r = CliRunner().invoke(
        cli, ["analyze", str(TINY / "step_dataloader_sync.json"), "--json", "-", "--no-html"]
    )
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["metrics"]["gpu_busy_ratio"] == pytest.approx(0.49)


def test_existing_output_needs_force(tmp_path, capsys):
    out = tmp_path / "r.html"
    out.write_text("keep me")
    assert main(["analyze", str(TINY / "step_dataloader_sync.json"), "-o", str(out), "-q"]) == 2
    assert out.read_text() == "keep me"
    assert "--force" in capsys.readouterr().err
    assert (
        main(["analyze", str(TINY / "step_dataloader_sync.json"), "-o", str(out), "-q", "--force"])
        == 0
    )


@pytest.mark.parametrize("name", ["benchmark_simple_add_et.json.gz"])
def test_non_trace_exit_2_one_line(name, capsys, tmp_path):
    rc = main(["analyze", str(CORPUS / name), "-o", str(tmp_path / "x.html")])
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert len(err.splitlines()) == 1 and name in err and "Traceback" not in err


def test_missing_file_and_bad_option(capsys):
    assert main(["analyze", "/nonexistent/trace.json", "--no-html"]) == 2
    assert "no such file" in capsys.readouterr().err
    assert main(["analyze", "--bogus"]) == 2
    assert (
        main(
            [
                "analyze",
                str(TINY / "step_dataloader_sync.json"),
                "--no-html",
                "--threshold",
                "nope=1",
            ]
        )
        == 2
    )


def test_fail_on_gate(capsys):
    assert (
        main(
            [
                "analyze",
                str(TINY / "step_dataloader_sync.json"),
                "--no-html",
                "-q",
                "--fail-on",
                "medium",  # its dataloader fix saves 24.8% of the step: medium
            ]
        )
        == 3
    )
    assert (
        main(
            [
                "analyze",
                str(H200 / "healthy_bf16.pt.trace.json.xz"),
                "--no-html",
                "-q",
                "--fail-on",
                "medium",
            ]
        )
        == 0
    )


def test_export_round_trip(tmp_path):
    out = tmp_path / "events.parquet"
    assert main(["export", str(TINY / "step_dataloader_sync.json"), "-o", str(out), "-q"]) == 0
    df = pl.read_parquet(out)
    assert df.filter(pl.col("kind") == "kernel")["dur_ns"].sort().to_list() == [200_000, 280_000]
    assert {
        "start_ns",
        "end_ns",
        "dur_ns",
        "correlation",
        "external_id",
        "kernel_class",
        "src_kind",
    } <= set(df.columns)


def test_every_command_has_help_and_docs():
    readme = (ROOT / "README.md").read_text()  # one line per command
    commands = (ROOT / "docs" / "COMMANDS.md").read_text()  # every option
    runner = CliRunner()
    for name, cmd in cli.commands.items():
        r = runner.invoke(cli, [name, "--help"])
        assert r.exit_code == 0 and cmd.help and len(cmd.help) > 20
        assert f"traceinsight {name}" in readme, f"README does not list `traceinsight {name}`"
        assert f"traceinsight {name}" in commands, (
            f"docs/COMMANDS.md does not document `traceinsight {name}`"
        )
        for param in cmd.params:
            for opt in getattr(param, "opts", []):
                if opt.startswith("--") and opt != "--help":
                    assert opt in commands, f"docs/COMMANDS.md does not document {name} {opt}"


def test_installed_console_script(tmp_path):
    exe = shutil.which("traceinsight") or str(Path(sys.executable).with_name("traceinsight"))
    if not Path(exe).exists():
        pytest.skip("traceinsight console script not installed (pip install -e .)")
    r = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "analyze" in r.stdout
    r = subprocess.run(
        [exe, "analyze", str(TINY / "step_dataloader_sync.json"), "-o", str(tmp_path / "x.html")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    assert re.search(r"GPU busy\s+49\.0%", r.stdout)
    r = subprocess.run(
        [sys.executable, "-m", "traceinsight", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0 and "traceinsight" in r.stdout
    env = dict(os.environ)
    r = subprocess.run(
        [exe, "analyze", str(CORPUS / "benchmark_simple_add_et.json.gz"), "--no-html"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert r.returncode == 2 and "Traceback" not in r.stderr


def test_analyze_keeps_freed_memory_longer_unless_told_otherwise(tmp_path):
    """``analyze`` of one trace sets polars' allocator decay before polars loads
    (benchmarks/RESULTS.md); a value already in the environment is left alone."""
    from traceinsight.runtime import ALLOCATOR_CONF, ALLOCATOR_ENV

    trace = TINY / "step_dataloader_sync.json"
    probe = (
        "import os, sys; from traceinsight.cli import main; "
        f"rc = main(['analyze', {str(trace)!r}, '--no-html', '-q']); "
        f"print(rc, os.environ.get({ALLOCATOR_ENV!r}))"
    )
    env = {k: v for k, v in os.environ.items() if k != ALLOCATOR_ENV}

    def run(env: dict[str, str]) -> list[str]:
        done = subprocess.run(
            [sys.executable, "-c", probe],
            capture_output=True,
            text=True,
            env=env,
            cwd=tmp_path,
            check=True,
        )
        return done.stdout.split()

    # polars puts its own defaults first; jemalloc takes the last value of each option
    rc, conf = run(env)[-2:]
    assert rc == "0" and conf.endswith("," + ALLOCATOR_CONF)
    env[ALLOCATOR_ENV] = "dirty_decay_ms:0"
    conf = run(env)[-1]
    assert conf.endswith(",dirty_decay_ms:0") and ALLOCATOR_CONF not in conf


def test_profile_finds_a_trace_written_outside_out(tmp_path, monkeypatch, capsys):
    """A script that records with its own profiler (here: copies a trace) into ./runs/: not in
    --out and not listed by traceinsight.capture, so the command looks below the working
    directory, says where it found it, and analyzes it (the tiny trace: GPU busy 49.0%)."""
    script = tmp_path / "train.py"
    src = TINY / "step_dataloader_sync.json"
    script.write_text(
        "import pathlib, shutil\npathlib.Path('runs/a').mkdir(parents=True)\n"
        f"shutil.copy({str(src)!r}, 'runs/a/w0.123.pt.trace.json')\n"
    )
    (tmp_path / "old").mkdir()
    stale = tmp_path / "old" / "w0.1.pt.trace.json"  # written before the command: not its trace
    shutil.copy(src, stale)
    os.utime(stale, (1, 1))
    monkeypatch.chdir(tmp_path)
    rc = main(["profile", "--out", str(tmp_path / "traces"), "--", sys.executable, str(script)])
    stdout = capsys.readouterr().out
    assert rc == 0, stdout
    found = tmp_path / "runs" / "a" / "w0.123.pt.trace.json"
    assert f"trace: {found} (found where the script wrote it, outside --out)" in stdout
    assert re.search(r"GPU busy\s+49\.0%", stdout)
    assert (tmp_path / "runs" / "a" / "w0.123.traceinsight.html").exists()


def test_one_trace_pads_glibcs_heap_unless_told_otherwise(monkeypatch):
    """``analyze`` of one trace of 8 MiB or more on disk asks glibc to keep 32 MiB at the top of
    its heap (mallopt M_TOP_PAD = -2), so inflated blocks stop faulting their pages in again
    (the benefit is measured in benchmarks/RESULTS.md); a user's MALLOC_TOP_PAD_ is left to
    glibc."""
    import ctypes

    from traceinsight import runtime

    if not hasattr(os, "confstr") or not os.confstr("CS_GNU_LIBC_VERSION"):
        pytest.skip("not glibc")
    calls: list[tuple[int, int]] = []

    class Libc:
        def mallopt(self, param: int, value: int) -> int:
            calls.append((param, value))
            return 1

    monkeypatch.setattr(ctypes, "CDLL", lambda name: Libc())
    monkeypatch.delenv("MALLOC_TOP_PAD_", raising=False)
    runtime.configure_single_trace_process(7 * 1024 * 1024)  # a small file: no pad
    assert calls == []
    runtime.configure_single_trace_process(8 * 1024 * 1024)
    assert calls == [(-2, 32 * 1024 * 1024)]
    monkeypatch.setenv("MALLOC_TOP_PAD_", "0")
    runtime.configure_single_trace_process(1 << 30)
    assert len(calls) == 1
