"""The CLI's safety and its words: an output never replaces an input, a baseline is replaced
only when asked, a closed stdout ends quietly, malformed options are usage errors naming the
form they take, and the library runs from a plain script without a ``__main__`` guard."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner

from traceinsight.cli import cli, main
from traceinsight.errors import EXIT_BAD_INPUT, EXIT_BROKEN_PIPE

from .conftest import H200, ROOT, TINY

SMALL = H200 / "h2d_pinned.pt.trace.json.xz"  # 12 KB, 403 events
JOB = H200 / "ddp_overlap"  # rank0/rank1 .pt.trace.json.gz
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}  # this checkout's package, whatever is installed


def one_line_error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    p = tmp_path / "in.json.gz"
    shutil.copy(SMALL, p)
    return p


# 1. an output never replaces an input, --force or not


@pytest.mark.parametrize("link", ["same", "symlink", "hardlink"])
def test_annotate_never_writes_over_its_input(trace, link, capsys):
    src = trace
    if link == "symlink":
        src = trace.with_name("link.json.gz")
        src.symlink_to(trace)
    elif link == "hardlink":
        src = trace.with_name("hard.json.gz")
        os.link(trace, src)
    before = trace.read_bytes()
    assert main(["annotate", str(src), "-o", str(trace), "--force", "-q"]) == EXIT_BAD_INPUT
    err = one_line_error(capsys)
    assert "is the input" in err and "never replaces an input" in err
    assert trace.read_bytes() == before


def test_every_writing_command_refuses_its_input(trace, tmp_path, capsys):
    t = str(trace)
    job = tmp_path / "job"
    shutil.copytree(JOB, job)
    rank1 = job / "rank1.pt.trace.json.xz"
    cases = [
        ["analyze", t, "-o", t, "--force"],
        ["analyze", t, "--no-html", "--json", t, "--force"],
        ["analyze", t, "--no-html", "--annotate", t, "--force"],
        ["analyze", t, "--format", "markdown", "-o", t, "--force"],
        ["analyze", str(job), "--no-html", "--json", str(rank1), "--force"],  # a job's rank file
        ["export", t, "-o", t, "--force"],
        ["diff", t, str(SMALL), "-o", t, "--force"],
        ["diff", str(SMALL), t, "--no-html", "--json", t, "--force"],
        ["baseline", "save", "in", t, "--dir", str(tmp_path), "--force"],  # DIR/in.json
    ]
    (tmp_path / "in.json").write_bytes(SMALL.read_bytes())
    cases[-1][3] = str(tmp_path / "in.json")
    for argv in cases:
        assert main(argv) == EXIT_BAD_INPUT, argv
        assert "never replaces an input" in one_line_error(capsys), argv
    assert trace.read_bytes() == SMALL.read_bytes()
    # diff --against: the stored baseline is an input too
    base_dir = tmp_path / "b"
    assert main(["baseline", "save", "ref", t, "--dir", str(base_dir), "-q"]) == 0
    stored = base_dir / "ref.json"
    argv = ["diff", "--against", "ref", "--dir", str(base_dir), t, "--no-html"]
    assert main([*argv, "--json", str(stored), "--force"]) == EXIT_BAD_INPUT
    assert "never replaces an input" in one_line_error(capsys)
    # batch: its summary files are outputs
    out = tmp_path / "out"
    out.mkdir()
    summary = out / "summary.csv"
    summary.write_text("keep")
    assert main(["batch", str(summary), "-o", str(out), "--force", "-q"]) == EXIT_BAD_INPUT
    assert "never replaces an input" in one_line_error(capsys)
    assert summary.read_text() == "keep"


# 2. baseline save refuses to replace a baseline without --force


def test_baseline_save_twice_needs_force(trace, tmp_path, capsys):
    argv = ["baseline", "save", "main", str(trace), "--dir", str(tmp_path), "-q"]
    assert main(argv) == 0
    stored = tmp_path / "main.json"
    first = stored.read_text()
    assert main(argv) == EXIT_BAD_INPUT
    err = one_line_error(capsys)
    assert str(stored) in err and "--force" in err and "already exists" in err
    assert stored.read_text() == first
    assert main([*argv, "--force"]) == 0


# 3. a closed stdout ends quietly with 141


@pytest.mark.parametrize(
    "argv",
    [
        ["analyze", str(SMALL), "--no-html"],
        ["analyze", str(H200 / "healthy_bf16.pt.trace.json.xz"), "--no-html", "--json", "-"],
        ["diff", str(SMALL), str(SMALL), "--no-html"],
    ],
)
def test_stdout_closed_early_is_quiet(argv, tmp_path):
    """The reader closes its end before the command writes (``| head`` that already has its
    line): every write meets EPIPE, deterministically."""
    r, w = os.pipe()
    os.close(r)  # the reader is gone before anything is written
    try:
        done = subprocess.run(
            [sys.executable, "-m", "traceinsight", *argv],
            stdout=w,
            stderr=subprocess.PIPE,
            text=True,
            env=ENV,
            cwd=tmp_path,
            timeout=300,
        )
    finally:
        os.close(w)
    assert done.returncode == EXIT_BROKEN_PIPE, done.stderr
    assert done.stderr == ""


def test_reader_that_reads_a_line_then_closes(tmp_path):
    """``analyze --json - | head -1``: a reader that takes one line and closes; the rest of
    the document (97 KB, past the pipe's buffer) meets EPIPE."""
    argv = ["analyze", str(H200 / "healthy_bf16.pt.trace.json.xz"), "--no-html", "--json", "-"]
    p = subprocess.Popen(
        [sys.executable, "-m", "traceinsight", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=ENV,
        cwd=tmp_path,
    )
    assert p.stdout is not None and p.stderr is not None
    assert p.stdout.readline().strip() == b"{"
    p.stdout.close()
    err = p.stderr.read().decode()
    assert p.wait(timeout=300) == EXIT_BROKEN_PIPE and err == "", err


# 4. annotate DIR --rank N


def test_annotate_one_rank_of_a_job(tmp_path, capsys):
    out = tmp_path / "r1.json.gz"
    assert main(["annotate", str(JOB), "--rank", "1", "-o", str(out), "-q"]) == 0
    js = tmp_path / "r1.json"
    assert main(["analyze", str(out), "--no-html", "-q", "--json", str(js)]) == 0
    import json

    assert json.loads(js.read_text())["source"]["ranks"] == [1]
    assert main(["annotate", str(JOB), "-o", str(tmp_path / "x.json"), "-q"]) == EXIT_BAD_INPUT
    assert "pass --rank N" in one_line_error(capsys)


# 5. --max-bytes takes sizes


@pytest.mark.parametrize(
    ("text", "n"),
    [("1G", 1 << 30), ("1GiB", 1 << 30), ("1GB", 10**9), ("500M", 500 << 20), ("1000", 1000)],
)
def test_max_bytes_takes_units(text, n):
    from traceinsight.options import parse_size

    assert parse_size(text) == n


def test_max_bytes_in_the_cli(trace, capsys):
    argv = ["analyze", str(trace), "--no-html", "-q"]
    assert main([*argv, "--max-bytes", "1G"]) == 0
    assert main([*argv, "--max-bytes", "1000"]) == EXIT_BAD_INPUT
    err = one_line_error(capsys)
    assert "more than 1000 bytes" in err and "0.0 GB" not in err
    assert main([*argv, "--max-bytes", "8X"]) == EXIT_BAD_INPUT
    assert "expected a size like 8G" in capsys.readouterr().err
    help_text = CliRunner().invoke(cli, ["analyze", "--help"]).output
    assert "powers of 1024" in help_text and "powers of 1000" in help_text


# 6. --step-range


def test_step_range_that_names_nothing_is_a_usage_error(trace, capsys):
    argv = ["analyze", str(trace), "--no-html", "-q"]
    assert main([*argv, "--step-range", "nosuch"]) == EXIT_BAD_INPUT
    err = one_line_error(capsys)
    assert "--step-range 'nosuch'" in err and "expected NAME" in err
    assert main([*argv, "--step-range", " "]) == EXIT_BAD_INPUT
    assert "expected NAME" in capsys.readouterr().err
    assert main([*argv, "--step-range", "ProfilerStep"]) == 0


# 7. export's format follows the suffix


def test_export_format_by_suffix(tmp_path, capsys):
    src = str(TINY / "step_dataloader_sync.json")
    csv = tmp_path / "ev.csv"
    assert main(["export", src, "-o", str(csv), "-q"]) == 0
    assert not csv.read_bytes().startswith(b"PAR1")
    df = pl.read_csv(csv)
    assert df.filter(pl.col("kind") == "kernel")["dur_ns"].sort().to_list() == [200_000, 280_000]
    arrow = tmp_path / "ev.arrow"
    assert main(["export", src, "-o", str(arrow), "-q"]) == 0
    assert pl.read_ipc(arrow).height == df.height
    bad = tmp_path / "ev.xlsx"
    assert main(["export", src, "-o", str(bad)]) == EXIT_BAD_INPUT
    assert "unknown suffix '.xlsx'" in one_line_error(capsys) and not bad.exists()


# 8. a directory of traces that is no job


def test_analyze_a_collection_suggests_batch(tmp_path, capsys):
    (tmp_path / "a").mkdir()
    shutil.copy(SMALL, tmp_path / "a" / "x.pt.trace.json.gz")
    assert main(["analyze", str(tmp_path), "--no-html"]) == EXIT_BAD_INPUT
    assert f"traceinsight batch {tmp_path}" in one_line_error(capsys)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["analyze", str(empty), "--no-html"]) == EXIT_BAD_INPUT
    assert "batch" not in one_line_error(capsys)


# 9. --threshold names the valid ones


def test_unknown_threshold_lists_the_valid_names(trace, capsys):
    argv = ["analyze", str(trace), "--no-html", "--threshold", "nosuch=1"]
    assert main(argv) == EXIT_BAD_INPUT
    err = one_line_error(capsys)
    assert "nosuch" in err and "valid names:" in err and "step_cv" in err


# 10. -v on every command


def test_every_command_takes_verbose():
    import click

    def walk(group: click.Group, prefix: str) -> list[tuple[str, click.Command]]:
        out = []
        for name, cmd in group.commands.items():
            out.append((prefix + name, cmd))
            if isinstance(cmd, click.Group):
                out += walk(cmd, prefix + name + " ")
        return out

    for name, cmd in walk(cli, ""):
        opts = {o for p in cmd.params for o in getattr(p, "opts", [])}
        assert {"-v", "--verbose"} <= opts, name
    import traceinsight.cli as cli_module

    assert not hasattr(cli_module, "_VERBOSE")


def test_verbose_shows_the_traceback_on_any_command(trace, tmp_path, capsys, monkeypatch):
    """-v placed on the command (export here, not only analyze) prints the cause's traceback."""
    from traceinsight import api

    def boom(*_a: object, **_k: object) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(api, "load_events", boom)
    out = str(tmp_path / "e.parquet")
    assert main(["export", str(trace), "-o", out]) == 1
    assert "Traceback" not in capsys.readouterr().err
    assert main(["export", str(trace), "-o", out, "-v"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and "RuntimeError: boom" in err


# 11. counts agree with their nouns


def test_plural():
    from traceinsight.report.format import SOURCE_NOUNS, fmt_source, plural

    assert plural(1, "step") == "1 step" and plural(2, "step") == "2 steps"
    assert plural(1024, "event") == "1,024 events" and plural(0, "rank") == "0 ranks"
    assert plural(1.0, "step") == "1 step"
    assert plural(3, "copy", "copies") == "3 copies"
    src = {"trigger": "item", "line": 3, "file": "t.py", "function": "f", "count": 1, "cost_ns": 1}
    assert fmt_source(src, SOURCE_NOUNS["host_sync"]).startswith("1 sync in f()")


def test_one_step_is_one_step(tmp_path, capsys):
    src = str(TINY / "step_dataloader_sync.json")
    assert main(["analyze", src, "--no-html", "--steps", "1"]) == 0
    out = capsys.readouterr().out
    assert "1 step;" in out and "1 steps" not in out
    md = tmp_path / "s.md"
    assert main(["analyze", src, "--format", "markdown", "-o", str(md), "--steps", "1", "-q"]) == 0
    assert "1 step;" in md.read_text() and "1 steps" not in md.read_text()
    html = tmp_path / "s.html"
    assert main(["analyze", src, "-o", str(html), "--steps", "1", "-q"]) == 0
    assert "(1 step)" in html.read_text() and "1 steps" not in html.read_text()


# 12. profile and capture name their reports alike


def test_profile_and_capture_name_reports_alike(tmp_path, monkeypatch, capsys):
    from traceinsight import capture

    name = "w0.123.pt.trace.json.gz"
    by_capture = tmp_path / "cap" / name
    by_capture.parent.mkdir()
    shutil.copy(SMALL, by_capture)
    report = capture._analyze(by_capture, None)
    script = tmp_path / "train.py"
    script.write_text(
        f"import pathlib, shutil\npathlib.Path('runs').mkdir()\n"
        f"shutil.copy({str(SMALL)!r}, 'runs/{name}')\n"
    )
    monkeypatch.chdir(tmp_path)
    rc = main(["profile", "--out", str(tmp_path / "traces"), "--", sys.executable, str(script)])
    assert rc == 0, capsys.readouterr()
    by_profile = tmp_path / "runs" / "w0.123.traceinsight.html"
    assert by_profile.exists() and report.name == by_profile.name


# 13. the library from a plain script, without a __main__ guard


def test_plain_script_without_main_guard_analyzes_a_job(tmp_path):
    """The job's ranks go to spawned worker processes; spawn re-runs an unguarded main script
    in each child unless told not to (then: BrokenProcessPool, the script twice)."""
    script = tmp_path / "plain.py"
    script.write_text(
        "import traceinsight\n"
        "print('script ran')\n"
        "runtime = traceinsight.Runtime(threads=1, workers=2)\n"
        f"job = traceinsight.analyze({str(JOB)!r}, runtime=runtime)\n"
        "print(type(job).__name__, len(job.ranks))\n"
    )
    done = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        env=ENV,
        cwd=tmp_path,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines() == ["script ran", "JobAnalysis 2"]
