"""The wheel carries the templates, and an installed (not checked-out) package finds them."""

import subprocess
import sys
import zipfile

import pytest

from .conftest import ROOT, TINY


def test_wheel_contains_templates_and_renders(tmp_path):
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if r.returncode != 0 and "hatchling" in (r.stderr + r.stdout):
        pytest.skip("hatchling not importable for a no-isolation build")
    assert r.returncode == 0, r.stderr[-2000:]
    wheel = next(tmp_path.glob("traceinsight_analyzer-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert "traceinsight/report_templates/report.html.j2" in names
    assert any(n.startswith("traceinsight/report_templates/partials/") for n in names)
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    code = (
        "import traceinsight.report.html as h, sys;"
        "from traceinsight import analyze;"
        "assert str(h.templates_dir()).startswith(sys.argv[1]), h.templates_dir();"
        "print(len(h.render_html(analyze(sys.argv[2]))))"
    )
    # -I: ignore the checkout and PYTHONPATH; the extracted wheel is the only traceinsight.
    r = subprocess.run(
        [
            sys.executable,
            "-I",
            "-c",
            f"import sys; sys.path.insert(0, {str(site)!r}); " + code,
            str(site),
            str(TINY / "step_dataloader_sync.json"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert int(r.stdout.strip()) > 10_000
