from __future__ import annotations

import gc
import gzip
import json
import lzma
import os
import sys
from collections import OrderedDict
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import orjson
import pytest

# Where the environment says not to write bytecode (PYTHONDONTWRITEBYTECODE, as on the dev and CI
# machines), every process of the suite compiled the project again: each worker's assertion
# rewriting of the test files (~6 s of CPU each) and the package's modules in each worker and in
# every subprocess the tests start (the CLI, Dask's and the pools' workers, ~0.2 s each). The
# suite writes it to the ignored __pycache__ folders. (A PYTHONPYCACHEPREFIX instead would also
# ignore the installed packages' bytecode and compile those again: 20 s against 12 s cold.)
if sys.dont_write_bytecode:
    sys.dont_write_bytecode = False
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

# Each pytest-xdist worker (two on two cores) gives polars one thread: the workers already fill
# the cores, and a pool per worker only adds hand-offs (measured: the same analyses in 15-25% less
# CPU). Set before polars is imported; a developer's own setting wins.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("POLARS_MAX_THREADS", "1")
    # and each worker owns one core: an analysis detects one (Runtime.detect), so a job's ranks
    # are analyzed in the worker, not by processes spawned beside the other worker's (each
    # paying the imports); the tests of the process pools ask for their workers explicitly
    _cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    _n = int(os.environ["PYTEST_XDIST_WORKER"].removeprefix("gw") or 0)
    if len(_cores) >= 2:
        os.sched_setaffinity(0, {_cores[_n % len(_cores)]})

import traceinsight.api  # noqa: E402  (after polars' thread setting above)
import traceinsight.diff  # noqa: E402
import traceinsight.jobs  # noqa: E402

# The tests hold millions of small Python objects (fixtures' raw events decoded once per worker,
# parsed JSON results): at the default thresholds the cyclic collector ran ~22,000 times per
# worker and scanned them all in each full pass, 16-20 s of CPU per worker (session 49). The
# imports' objects are frozen out of its passes and it runs after 100,000 allocations, not 700.
gc.freeze()
gc.set_threshold(100_000, 50, 100)


def _exit_without_freeing() -> None:  # pragma: no cover - runs at the worker's exit
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


# A worker's last act: its reports are sent by then (pytest-xdist reads no exit code). Freeing
# the millions of objects the tests held (raw events, shared analyses) one by one kept the run
# waiting ~5 s for the last worker's process to end (session 50). Registered first, it runs
# after every other exit handler (LIFO: the pools', Dask's, logging's still run).
if os.environ.get("PYTEST_XDIST_WORKER"):
    import atexit

    atexit.register(_exit_without_freeing)

# The files that take longest (seconds of test time on the 2-core machine, session 50), run
# first: pytest-xdist's loadfile hands whole files to the workers in collection order, and a
# long file handed out last leaves the other worker idle (the suite's 4-minute budget; a worker
# sat idle ~9 s at the end with only the 15 longest listed)
LONG_FILES = (
    "test_thirdparty.py",
    "test_replay.py",
    "test_native_scan.py",
    "test_corpus.py",
    "test_jobs.py",
    "test_native_replay.py",
    "test_hostile.py",
    "test_mcp.py",
    "test_evidence.py",
    "test_multirank.py",
    "test_diff.py",
    "test_layouts.py",
    "test_analyzers_tiny.py",
    "test_audit23.py",
    "test_cli_safety.py",
    "test_fuzz_new_inputs.py",
    "test_memory.py",
    "test_intervals.py",
    "test_capture.py",
    "test_fast_path.py",
    "test_nsys.py",
    "test_html_render.py",
    "test_thirdparty_raft.py",
    "test_foreign_verdicts.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The long files first, each file's tests in their own order (a stable sort)."""
    rank = {name: i for i, name in enumerate(LONG_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(LONG_FILES)))


ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "fixtures"
TINY = FIXTURES / "tiny"
H200 = FIXTURES / "h200"
CORPUS = FIXTURES / "corpus"
SHARED = Path(os.environ.get("TRACEINSIGHT_SHARED", ROOT.parent / "shared")) / "traces"


def require_native(module: object | None, name: str) -> None:
    """A C extension's tests: it must be built (hatch_build.py builds it wherever a C compiler
    is), unless the environment turned it off; then the module is skipped."""
    if module is not None:
        return
    if (
        os.environ.get("TRACEINSIGHT_NO_NATIVE_BUILD") == "1"
        or os.environ.get("TRACEINSIGHT_NO_NATIVE") == "1"
    ):
        pytest.skip(f"{name} turned off by the environment", allow_module_level=True)
    raise AssertionError(f"{name} is not built: reinstall with a C compiler (pip install -e .)")


_UNPACKED: dict[Path, Path] = {}


def unpacked_db(path: Path) -> Path:
    """A packed fixture database (``X.sqlite.xz``: SQLite exports shrink 7-13x under xz, so the
    fixtures keep them so) unpacked once per test process, for tests that read its rows with
    sqlite3 or change a copy; analyses read the packed file itself."""
    import atexit
    import lzma
    import shutil
    import tempfile

    path = Path(path)
    if path.suffix != ".xz":
        path = path.with_name(path.name + ".xz")
    if path not in _UNPACKED:
        tmp = Path(tempfile.mkdtemp(prefix="ti-db-"))
        atexit.register(shutil.rmtree, tmp, True)
        out = tmp / path.name.removesuffix(".xz")
        out.write_bytes(lzma.decompress(path.read_bytes()))
        _UNPACKED[path] = out
    return _UNPACKED[path]


def raw_json(path: Path) -> bytes:
    """A trace file's JSON bytes, decompressed by the standard library alone (gzip or xz by
    content): what tests sum raw events over, independent of the parser."""
    data = path.read_bytes()
    if data[:2] == b"\x1f\x8b":
        return gzip.decompress(data)
    if data[:6] == b"\xfd7zXZ\x00":
        return lzma.decompress(data)
    return data


def shared_or_skip() -> Path:
    if not SHARED.is_dir():
        pytest.skip(
            f"corpus not present at {SHARED} (set TRACEINSIGHT_SHARED); corpus-wide test skipped"
        )
    return SHARED


@pytest.fixture(scope="session")
def tiny_analysis():
    from traceinsight import analyze

    return analyze(TINY / "step_dataloader_sync.json")


# an analysis held costs about 5 MB per MB of gzipped trace; inputs above this are not held
CACHED_INPUT_MAX_BYTES = 16 << 20


@cache
def _analyzed(path: str, opts: tuple[tuple[str, object], ...]):
    from traceinsight import analyze

    return analyze(Path(path), **dict(opts))


def analyzed(path: str | Path, **opts: object):
    """``traceinsight.analyze(path, **opts)``, once per test process for inputs up to
    :data:`CACHED_INPUT_MAX_BYTES` (a job directory: always): tests that read the same
    analysis share it (158 default analyses in one worker's run, 66 s of duplicates before)."""
    p = Path(path)
    key = tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in opts.items()))
    if p.is_file() and p.stat().st_size > CACHED_INPUT_MAX_BYTES:
        from traceinsight import analyze

        return analyze(p, **opts)
    return _analyzed(str(p), key)


# Every analysis of a file (traceinsight.api.analyze_with: analyze, the commands, diff's two
# sides) is shared by the tests of one worker process that ask for the same file, unchanged on
# disk, with the same options and runtime: 130 repeats cost 83 s of the suite's analyses
# (session 48). Not shared where a test may change what an analysis reads or does (it takes
# `monkeypatch`, or is marked `fresh_analysis`: concurrency and determinism tests), nor a job's
# directory, nor an input over CACHED_INPUT_MAX_BYTES. Held per worker, the newest of them up
# to SHARED_ANALYSES_MAX analyses or SHARED_INPUT_BYTES_MAX of their inputs on disk (about 8
# bytes held per byte of an xz fixture: ~0.5 GB a worker; 24 held evicted 18 s of analyses that
# were asked for again, session 49). A test must not change an analysis it is given.
SHARED_ANALYSES_MAX = 128
SHARED_INPUT_BYTES_MAX = 64 << 20
_shared: OrderedDict[tuple[object, ...], object] = OrderedDict()
_shared_bytes: dict[tuple[object, ...], int] = {}
_sharing = {"on": False}


def _hold(key: tuple[object, ...], n_bytes: int, out: object) -> object:
    """``out`` held under ``key``, the oldest let go while over either bound."""
    _shared[key], _shared_bytes[key] = out, n_bytes
    while len(_shared) > 1 and (
        len(_shared) > SHARED_ANALYSES_MAX or sum(_shared_bytes.values()) > SHARED_INPUT_BYTES_MAX
    ):
        old, _ = _shared.popitem(last=False)
        del _shared_bytes[old]
    return out


def _shared_or_made(what: str, path: Path, opts: object, runtime: object, make):  # type: ignore[no-untyped-def]
    """``make()``'s result for ``what`` of ``path`` (unchanged on disk) with these options and
    runtime, held for the next test that asks (see above), or made afresh where not shared."""
    if not _sharing["on"] or not path.is_file():
        return make()
    st = path.stat()
    if st.st_size > CACHED_INPUT_MAX_BYTES:
        return make()
    key = (
        what,
        str(path.resolve()),
        st.st_ino,
        st.st_size,
        st.st_mtime_ns,
        repr(opts),
        repr(runtime),
    )
    if key in _shared:
        _shared.move_to_end(key)
        return _shared[key]
    return _hold(key, st.st_size, make())


def _shared_analyze_with(path, opts, runtime):  # type: ignore[no-untyped-def]
    return _shared_or_made(
        "analysis", path, opts, runtime, lambda: _analyze_with(path, opts, runtime)
    )


_analyze_with = traceinsight.api.analyze_with
for _module in (traceinsight.api, traceinsight.diff):
    _module.analyze_with = _shared_analyze_with  # type: ignore[attr-defined]


def _shared_summarize_rank(path, opts, runtime):  # type: ignore[no-untyped-def]
    """A job's rank summary (traceinsight.jobs.summarize_rank: one rank file's analysis and
    cross-rank tables) shared as the analyses above are: the job tests analyze the same few
    rank directories again and again (8% of the suite's CPU, session 50)."""
    return _shared_or_made(
        "rank", Path(path), opts, runtime, lambda: _summarize_rank(path, opts, runtime)
    )


# Named as the function it stands for: a process pool or a Dask task pickles it by that name
# and so runs the package's own in the child (where no conftest is loaded).
_summarize_rank = traceinsight.jobs.summarize_rank
_shared_summarize_rank.__module__ = _summarize_rank.__module__
_shared_summarize_rank.__qualname__ = _summarize_rank.__qualname__
traceinsight.jobs.summarize_rank = _shared_summarize_rank  # type: ignore[assignment]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "fresh_analysis: every analysis in the test runs afresh (tests/conftest.py)"
    )


@pytest.fixture(autouse=True)
def _share_analyses(request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    _sharing["on"] = (
        "monkeypatch" not in request.fixturenames
        and request.node.get_closest_marker("fresh_analysis") is None
    )
    yield
    _sharing["on"] = False


@cache
def raw_events(path: Path) -> list[dict]:
    """A fixture's raw Chrome-trace events, decoded once per test process (read only)."""
    return orjson.loads(raw_json(path))["traceEvents"]


@cache
def recorded_truth(path: Path) -> dict:
    """A recorded loop's truth (fixtures/generate/thirdparty/make_truth.py), read once."""
    return json.loads(path.read_text())


@dataclass(frozen=True)
class RecordedLoop:
    """A third-party loop recorded on the device: its kept before trace, analyzed once, and its
    truth's measured bands (fixtures/generate/thirdparty/make_truth.py)."""

    before: Path
    truth_path: Path

    @classmethod
    def named(cls, loop: str, device: str = "h100") -> RecordedLoop:
        here = FIXTURES / device / "thirdparty"
        return cls(here / f"{loop}.before.pt.trace.json.xz", here / f"{loop}.truth.json")

    @property
    def truth(self) -> dict:
        return recorded_truth(self.truth_path)

    def analysis(self) -> Any:
        return _analyzed_once(self.before)

    def band(self, fix: str) -> dict:
        return self.truth["speedup_band"][fix]

    def finding(self, fid: str) -> Any:
        return next(f for f in self.analysis().findings if f.id == fid)

    def what_if(self, ids: list[str]) -> Any:
        """``--what-if IDS`` on the analysis already made (pipeline.selected_fixes), not a
        second analysis of the trace."""
        from traceinsight.pipeline import selected_fixes

        a = self.analysis()
        return selected_fixes(a.results, list(a.findings), tuple(ids)).what_if

    def largest_single_fix(self) -> str:
        """The single fix (not the baseline, not all) whose band reaches highest."""
        singles = {k: v["high"] for k, v in self.truth["speedup_band"].items()}
        # "NAME~2": a configuration run again in the same process, not a fix
        fixes = (k for k in singles if k not in ("baseline", "all") and "~" not in k)
        return max(fixes, key=singles.get)


@cache
def _analyzed_once(path: Path) -> Any:
    return traceinsight.api.analyze(path)


# issue 37: a fix's predicted speedup within 25% of its measured band
BAND_TOLERANCE = 0.25


def within_band(predicted: float, lo: float, hi: float, tolerance: float = BAND_TOLERANCE) -> bool:
    return (1 - tolerance) * lo <= predicted <= (1 + tolerance) * hi
