"""The HTML reports as a reader sees them, in a real browser: the system's Chromium driven by
playwright (no browser download). A trace's, a job's, a diff's and a batch index are rendered,
loaded, photographed (under tmp_path) and read from the DOM: every chart has axis tick labels,
no two texts overlap in a chart or a table header, no text shows ``None``, escaped JSON, braces
or internal transform names, and no id cell breaks a word."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from traceinsight.causal.transforms import TRANSFORMS
from traceinsight.cli import main
from traceinsight.report.evidence import TRANSFORM_WORDS

from .conftest import H200


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if found := shutil.which(name):
            return found
    return "/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None


CHROMIUM = _chromium()
if CHROMIUM is None:
    pytest.skip(
        "no Chromium found: install Debian's `chromium` (.ci/run does where it can) to run the "
        "browser checks of the HTML reports",
        allow_module_level=True,
    )
sync_api = pytest.importorskip(
    "playwright.sync_api", reason="playwright is not installed (pip install -e '.[test]')"
)

# names a reader must never see: the fixes' function names and the document's paths
INTERNAL = sorted({*TRANSFORMS, *TRANSFORM_WORDS, "all_fixes", "what_if", "details."})

# Run in the page once every <details> is open: what is wrong, one line each.
CHECKS = r"""
() => {
  const problems = [];
  document.querySelectorAll('details').forEach(d => { d.open = true; });
  const shown = el => {
    const r = el.getBoundingClientRect(), s = getComputedStyle(el);
    return r.width > 0 && r.height > 0 && s.visibility !== 'hidden' && s.display !== 'none';
  };
  const box = el => {
    const range = document.createRange(); range.selectNodeContents(el);
    return range.getBoundingClientRect();
  };
  const overlapping = (items, where) => {
    for (let i = 0; i < items.length; i++) for (let j = i + 1; j < items.length; j++) {
      const a = box(items[i]), b = box(items[j]);
      const w = Math.min(a.right, b.right) - Math.max(a.left, b.left);
      const h = Math.min(a.bottom, b.bottom) - Math.max(a.top, b.top);
      if (w > 1 && h > 1) problems.push(`${where}: "${items[i].textContent}" overlaps "${items[j].textContent}"`);
    }
  };
  const charts = [...document.querySelectorAll('svg')].filter(s => !s.parentElement.closest('svg'));
  charts.forEach((svg, n) => {
    const name = svg.getAttribute('aria-label') || svg.id || `chart ${n}`;
    const texts = [...svg.querySelectorAll('text')].filter(t => shown(t) && t.textContent.trim());
    if (!svg.classList.contains('icicle') && texts.length < 2) problems.push(`${name}: no axis tick labels`);
    if (svg.classList.contains('chart') && !svg.querySelector('text.tick')) problems.push(`${name}: no ticks`);
    overlapping(texts, name);
  });
  document.querySelectorAll('table').forEach((t, n) => {
    const heads = [...t.querySelectorAll('th')].filter(shown);
    if (t.rows.length && heads.length > 1 && heads[0].parentElement === heads[1].parentElement) overlapping(heads, `table ${n} header`);
  });
  // ids, causes and numbers: one line, nothing cut
  document.querySelectorAll('td.id, td.num, .fid, td.path-cell').forEach(td => {
    if (!shown(td)) return;
    if (td.scrollWidth > td.clientWidth + 1 && !td.classList.contains('path-cell')) problems.push(`cell breaks or overflows: "${td.textContent}"`);
    // the lines its text runs on (text nodes only: a colour swatch sits a pixel lower)
    const tops = new Set(), walk = document.createTreeWalker(td, NodeFilter.SHOW_TEXT);
    for (let t = walk.nextNode(); t; t = walk.nextNode()) {
      const r = document.createRange(); r.selectNodeContents(t);
      [...r.getClientRects()].forEach(b => { if (b.width > 0) tops.add(Math.round(b.bottom)); });
    }
    const lines = tops;
    if (lines.size > 1) problems.push(`cell wraps onto ${lines.size} lines: "${td.textContent.slice(0, 60)}"`);
  });
  if (document.documentElement.scrollWidth > window.innerWidth + 1) problems.push(`the page is ${document.documentElement.scrollWidth} px wide in a ${window.innerWidth} px window`);
  const body = document.body.cloneNode(true);
  // kernel and op names are the trace's data, not the report's words
  body.querySelectorAll('pre, code, script, style, .name, td.mono').forEach(e => e.remove());
  return {problems, text: document.body.innerText, prose: body.textContent};
}
"""


def _render(out: Path) -> dict[str, Path]:
    """The four kinds of report, written by the commands a user runs."""
    pageable, pinned = (H200 / f"h2d_{k}.pt.trace.json.xz" for k in ("pageable", "pinned"))
    pages = {k: out / f"{k}.html" for k in ("trace", "job", "diff")}
    trace = H200 / "dataloader_starved.pt.trace.json.xz"
    assert main(["analyze", str(trace), "-q", "-o", str(pages["trace"])]) == 0
    assert main(["analyze", str(H200 / "ddp_overlap"), "-q", "-o", str(pages["job"])]) == 0
    assert main(["diff", str(pageable), str(pinned), "-q", "-o", str(pages["diff"])]) == 0
    # a batch of a small directory whose paths are long (the index shortens them in the middle)
    deep = out / "in" / "a_rather_long_experiment_directory" / "run_2026_12_02_seed_1234"
    deep.mkdir(parents=True)
    shutil.copy(pinned, deep / "h2d_pinned_with_a_long_descriptive_name.pt.trace.json.gz")
    main(["batch", str(out / "in"), "-o", str(out / "batch"), "-q", "-j", "1"])
    pages["batch"] = out / "batch" / "index.html"
    return pages


@pytest.fixture(scope="module")
def seen(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    out = tmp_path_factory.mktemp("reports")
    pages = _render(out)
    found: dict[str, dict[str, Any]] = {}
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        for kind, path in pages.items():
            page.goto(path.as_uri())
            found[kind] = page.evaluate(CHECKS)
            found[kind]["errors"] = list(errors)
            found[kind]["shot"] = out / f"{kind}.png"
            page.screenshot(
                path=str(found[kind]["shot"])
            )  # the first screen: 1.7 s less than full pages
            errors.clear()
        browser.close()
    return found


KINDS = ("trace", "job", "diff", "batch")


@pytest.mark.parametrize("kind", KINDS)
def test_layout_axes_and_cells(seen: dict[str, dict[str, Any]], kind: str) -> None:
    r = seen[kind]
    assert r["shot"].stat().st_size > 20_000
    assert not r["errors"], r["errors"]
    assert not r["problems"], "\n".join(r["problems"][:20])


@pytest.mark.parametrize("kind", KINDS)
def test_words_a_reader_sees(seen: dict[str, dict[str, Any]], kind: str) -> None:
    text, prose = seen[kind]["text"], seen[kind]["prose"]
    assert "Traceback" not in text
    assert not re.search(r"\bNone\b", prose)
    assert "\\u003e" not in text and "\\u003c" not in text
    assert "{" not in prose and "}" not in prose
    leaked = [n for n in INTERNAL if n in TRANSFORM_WORDS or n in TRANSFORMS or "_" in n]
    assert not [n for n in leaked if re.search(rf"\b{re.escape(n)}\b", prose)]


def test_every_transform_has_words() -> None:
    assert set(TRANSFORMS) <= set(TRANSFORM_WORDS)


def test_trace_report_shows_evidence_as_tables(seen: dict[str, dict[str, Any]]) -> None:
    text = seen["trace"]["text"]
    # the idle gaps as a table with units, the loader's plan as labelled values
    assert "longest idle gaps" in text and "workers needed" in text
    assert "top_segments" not in text and "loader_plan" not in text
    assert not re.search(r"\b\d{7,}\b", text)  # no raw nanoseconds or bytes


def test_job_rank_table_and_finding_agree(seen: dict[str, dict[str, Any]]) -> None:
    text = seen["job"]["text"]
    assert "transfer overlapped" in text and "comm overlap" not in text
    assert "no prediction:" not in text.lower()


def test_a_larger_batch_reads_as_its_own_step_in_the_html(tmp_path: Path) -> None:
    """Audit 15: the HTML said "the un-profiled step 74.57 ms -> 19.16 ms, 3.89x" for T5's 4x
    batch (the time per original batch read as a step; the 4x batch's own step is 76.63 ms),
    where the terminal said both; every reporter now prints one sentence (report/format.py
    saving_text)."""
    import html as html_lib
    import json

    from traceinsight.report.format import fmt_ns

    trace = H200 / "thirdparty" / "t5_course.before.pt.trace.json.xz"
    out, doc_path = tmp_path / "t5.html", tmp_path / "t5.json"
    assert main(["analyze", str(trace), "-o", str(out), "--json", str(doc_path), "--force"]) == 0
    doc = json.loads(doc_path.read_text())
    w = next(f for f in doc["findings"] if f["id"] == "memory_headroom")["what_if"]
    k = w["multiplier"]
    assert k > 1 and w["batch_step_time_after_ns"] > w["step_time_ns"]  # 76.63 > 74.57 ms
    text = html_lib.unescape(out.read_text())
    own = f"-> {fmt_ns(w['batch_step_time_after_ns'])} at a {k}x batch, "
    assert own + f"{fmt_ns(w['step_time_after_ns'])} per original batch" in text
    assert f"-> {fmt_ns(w['step_time_after_ns'])}," not in text  # never as the step itself
    combined = doc["details"]["what_if"]["all_fixes"]
    assert f"-> {fmt_ns(combined['batch_step_time_after_ns'])} at a {k}x batch" in text


def test_a_mapping_table_says_rank_over_rank_numbers_only():
    """audit 19: a job's "by collective kind" table had "rank" over its "all to all" row."""
    from traceinsight.report.evidence import _mapping_table

    by_kind = _mapping_table("by_kind", {"all_to_all": {"exposed_ns": 1_000_000}}, by_rank=True)
    by_rank = _mapping_table("exposed_by_rank", {"0": {"exposed_ns": 1_000_000}}, by_rank=True)
    assert by_kind is not None and by_kind.columns[0] == ""
    assert by_rank is not None and by_rank.columns[0] == "rank"


def test_the_efficiency_section_leaves_out_what_it_cannot_say(tmp_path):
    """audit 19: "memory-bound bandwidthn/a of HBM" and "roofs.No FLOPs" on a device the spec
    table lacks (an RTX 3080 here, a builder trace naming no known GPU)."""
    from tests.builder import Events
    from traceinsight.api import analyze_trace
    from traceinsight.report.html import render_html

    ev = Events()
    for i in range(3):
        ev.step(i, i * 1000, 1000)
        ev.kernel("vectorized_elementwise_kernel", i * 1000 + 100, 300, launch_us=i * 1000 + 50)
    page = render_html(analyze_trace(ev.trace()).to_json())
    text = re.sub(r"<[^>]+>", "", page)
    assert "n/a of" not in text and "roofs.No" not in text
    assert "Device not in the spec table: no peaks, MFU or roofs. " in text


def test_a_diff_change_that_rounds_to_zero_has_no_sign():
    """audit 19: the diff page read "replay error ... -0.0 pts"."""
    from traceinsight.report.diff_html import diff_change

    share = {"metric": "gpu_busy_ratio", "delta": -0.0004}
    assert diff_change(share) == "0.0 pts"
    assert diff_change({**share, "delta": 0.012}) == "+1.2 pts"
    assert diff_change({"metric": "step_time_median_ns", "change": -0.3881}) == "-38.8%"
