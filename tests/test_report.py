import copy
import re

import pytest

from traceinsight.report.html import render_html

from .conftest import CORPUS, H200, TINY, analyzed

SECTIONS = [
    "verdict",
    "findings",
    "timeline",
    "steps",
    "idle",
    "kernels",
    "efficiency",
    "copies",
    "comm",
    "top-kernels",
    "facts",
]
HOSTILE = [
    "<script>alert(1)</script>",
    "</script><img src=x onerror=alert(2)>",
    '"><svg onload=alert(3)>',
]


@pytest.mark.parametrize(
    "path",
    [
        H200 / "dataloader_starved.pt.trace.json.xz",
        H200 / "ddp_overlap" / "rank0.pt.trace.json.xz",
        CORPUS / "plugin_2021-01_resnet50_nw0_worker0.pt.trace.json.xz",
        CORPUS / "rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz",
    ],
)
def test_sections_numbers_offline_and_bounded(path):
    a = analyzed(path)
    html = render_html(a)
    for s in SECTIONS:
        assert f'id="{s}"' in html
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html)
    assert "http://" not in html and "https://" not in html
    assert len(html.encode()) < 3 * 1024 * 1024
    if a.metrics["gpu_busy_ratio"] is not None:
        assert f"{100 * a.metrics['gpu_busy_ratio']:.1f}%" in html
    else:
        assert "No GPU activity" in html


def test_sections_without_data_say_so():
    html = render_html(analyzed(CORPUS / "rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz"))
    assert "No communication kernels" in html and "No memory copies" in html


def test_hostile_names_are_escaped(tmp_path):
    a = analyzed(TINY / "step_dataloader_sync.json")
    doc = copy.deepcopy(a.to_json())
    for i, row in enumerate(doc["details"]["kernels"]["top_kernels"]):
        row["name"] = HOSTILE[i % len(HOSTILE)]
    for seg in doc["details"]["idle"]["top_segments"]:
        seg["host_op"] = HOSTILE[0]
    doc["findings"][0]["title"] = HOSTILE[1]
    doc["source"]["path"] = HOSTILE[2]
    html = render_html(doc)
    for h in HOSTILE:
        assert h not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    # the only scripts are ours: the JSON data block and the app
    assert len(re.findall(r"<script", html)) == 2


def test_compiled_templates_are_reused_and_a_bad_cache_is_ignored(tmp_path):
    import jinja2

    from traceinsight.report.html import environment, templates_dir
    from traceinsight.runtime import template_cache as _BytecodeCache

    def fresh(cache: jinja2.BytecodeCache) -> jinja2.Environment:
        return jinja2.Environment(
            loader=jinja2.FileSystemLoader(str(templates_dir())), bytecode_cache=cache
        )

    cache_dir = tmp_path / "cache"
    cache_dir.mkdir()
    fresh(_BytecodeCache(str(cache_dir))).get_template("report.html.j2")
    files = list(cache_dir.iterdir())
    assert files  # compiled once, stored
    # Another process (a new environment) loads the stored code instead of compiling again.
    env = fresh(_BytecodeCache(str(cache_dir)))
    env.compile = lambda *a, **k: (_ for _ in ()).throw(AssertionError("compiled again"))
    env.get_template("report.html.j2")
    # A truncated cache file and a cache folder that is not a folder both fall back to compiling.
    for f in files:
        f.write_bytes(f.read_bytes()[:20])
    fresh(_BytecodeCache(str(cache_dir))).get_template("report.html.j2")
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    fresh(_BytecodeCache(str(not_a_dir))).get_template("report.html.j2")
    assert type(environment().bytecode_cache).__name__ == "_Cache"


def test_a_what_if_that_lengthens_the_step_saves_nothing():
    # audit 10: host_sync's fix on a V100 TorchRec trace predicted 117.52 -> 119.56 ms (0.98x),
    # which read "saves 0.00 ms"
    from traceinsight.report.format import saved_words

    longer = {"step_time_ns": 117_520_000, "step_time_after_ns": 119_560_000, "speedup": 0.983}
    assert saved_words(longer) == "nothing (2.04 ms slower predicted)"
    same = {"step_time_ns": 100, "step_time_after_ns": 100, "speedup": 1.0}
    assert saved_words(same) == "nothing"
    shorter = {"step_time_ns": 117_520_000, "step_time_after_ns": 112_540_000, "speedup": 1.04}
    assert saved_words(shorter) == "4.98 ms"


def test_kernel_names_in_titles_are_their_functions():
    # audit 11: low_occupancy's title cut a signature at 60 characters, "...gather_keep_from_
    # mask(bo, at 0.0% limited by grid" (an occupancy of 0.024%)
    from traceinsight.report.format import fmt_small_pct, kernel_words

    nms = "void torchvision::ops::(anonymous namespace)::gather_keep_from_mask(bool*, unsigned long long const*, int, int, int)"  # fmt: skip
    assert kernel_words(nms) == "gather_keep_from_mask"
    ew = "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, at::detail::Array<char*, 1> >(int)"  # fmt: skip
    assert kernel_words(ew) == "vectorized_elementwise_kernel"
    assert kernel_words("ampere_sgemm_128x64_nn") == "ampere_sgemm_128x64_nn"
    assert kernel_words("Memcpy HtoD (Pinned -> Device)") == "Memcpy HtoD (Pinned -> Device)"
    assert (fmt_small_pct(0.00024), fmt_small_pct(0.0), fmt_small_pct(0.25)) == (
        "<0.1%",
        "0.0%",
        "25.0%",
    )


def test_an_unnamed_device_is_said_by_its_matched_spec():
    # audit 13: ROCm builds that leave deviceProperties' name empty (an MI300X: gfx 9.4, 304
    # CUs, 192 GiB) read "unknown GPU" though the spec table matched it
    from traceinsight.report.format import fmt_devices

    mi300 = {"id": 2, "name": "", "sm_count": 304, "spec": "MI300X", "active": True}
    assert (
        fmt_devices([mi300])
        == "2: MI300X (unnamed in the trace, matched by its properties) (304 CUs)"
    )
    assert fmt_devices([{**mi300, "spec": None}]) == "2: unknown GPU (304 SMs)"


def test_call_sites_say_how_many_of_the_syncs_they_hold():
    # audit 17: nsys backtraces only some calls; CloverLeaf's listed sites (244 + 13 + 9 + 6 +
    # 1) held 273 of its 1,591 syncs and read as the totals ("at 244 syncs in ...")
    from traceinsight.report.format import sources_coverage

    src = [{"count": c} for c in (244, 13, 9, 6, 1)]
    f = {"id": "host_sync", "evidence": {"host_sync_count": 1591, "sources": src}}
    assert sources_coverage(f) == (
        "the call sites of 273 of the 1,591 syncs: the others have no recorded stack"
    )
    f["evidence"]["host_sync_count"] = 273
    assert sources_coverage(f) is None
    assert sources_coverage({"id": "launch_bound", "evidence": {"sources": src}}) is None


def test_all_fixes_say_where_they_compound():
    # audit 17: a V100's all fixes saved 80.71 ms a step (3.31x) where the single savings added
    # to about 31.5 ms, unexplained: fp16 frees the host-bound step's other engine
    from traceinsight.report.format import combined_fixes_words

    def w(before_ms: int, after_ms: int, t: str | None = None) -> dict:
        return {
            "step_time_ns": before_ms * 1_000_000,
            "step_time_after_ns": after_ms * 1_000_000,
            "transforms": [t] if t else None,
        }

    doc = {
        "findings": [
            {"id": "a", "severity": "high", "evidence": {"transform": "ta"}, "what_if": w(100, 80)},
            {"id": "b", "severity": "low", "evidence": {"transform": "tb"}, "what_if": w(100, 90)},
        ]
    }
    both = {**w(100, 40), "transforms": ["ta", "tb"]}
    assert combined_fixes_words(doc, both).endswith(
        "more than their savings alone added (30.00 ms): each alone is bounded by what the others "
        "leave)"
    )
    # 60 ms saved against 30 ms added: said; 28 ms: nothing
    assert "more than" not in combined_fixes_words(doc, {**w(100, 72), "transforms": ["ta", "tb"]})
