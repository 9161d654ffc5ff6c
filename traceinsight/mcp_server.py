"""``traceinsight mcp``: the analyses as Model Context Protocol tools, for agents and chat.

An assistant holding a trace asks what to change; each tool answers with a compact JSON
document sized for a context window (a few KB: top-N lists whose ``left_out`` says how many
rows were cut). The answers are views of the library's own results: ``analyze`` reads the
analysis document (``TraceAnalysis.to_json``), ``what_if`` replays the chosen fixes together
(:func:`traceinsight.fixes.predict_fixes`), ``diff`` is :func:`traceinsight.diff.compare`,
``annotate`` the annotate command's writer.

The server reads only files inside the directories it was started with (``--allow``; every path
is resolved, symlinks included, before the check), never writes to an input, and writes only
``annotate``'s output, inside those directories too. Analyses are kept per input (its size and
mtime) and options for the session. Every failure reaches the client as a tool error of one
line naming the file; never a traceback.

The answer builders below need no SDK; :func:`build_server` and :func:`serve` import ``mcp``
(the optional extra ``traceinsight-analyzer[mcp]``). No ``from __future__ import annotations``
here: the SDK reads the tool functions' annotations (their JSON schemas) at runtime, and the
aliases they use are local to :func:`build_server`.
"""

import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import traceinsight
from traceinsight.analysis import JobAnalysis, TraceAnalysis
from traceinsight.errors import InputError, OutputError, TraceInsightError

if TYPE_CHECKING:
    from mcp.server.mcpserver import MCPServer

Analysis = TraceAnalysis | JobAnalysis

CACHE_ENTRIES = 8  # analyses kept per session (each holds its event table)
TOP_FINDINGS = 10
TOP_LIST = 5  # rows of any list inside a finding's evidence, call sites, diff rows
MAX_NAME = 160  # characters of a kernel name (C++ template names run to thousands)
SOURCE_LINES = 8  # lines of user code shown from a call site's line
SOURCE_MAX_BYTES = 4 << 20  # a "source file" larger than this is not read
MAX_KERNELS = 25  # the kernels analyzer keeps this many (analyzers/kernels.py TOP_KERNELS)

INSTRUCTIONS = (
    "traceinsight diagnoses PyTorch profiler (Kineto .json/.json.gz/.json.xz) traces and Nsight Systems "
    ".sqlite exports: why the GPU idles and what to change. Start with analyze(path): ranked "
    "findings, each with the step time its fix is predicted to save. Then explain(path, "
    "finding_id) for the evidence, call sites and the code change; what_if(path, fixes) for "
    "several fixes replayed together; regions, top_kernels, diff(before, after), annotate(path, "
    "out) for a Perfetto trace. Times are ns, ratios 0..1."
)


@dataclass(frozen=True)
class Workspace:
    """What the server may touch: the allow-listed directories (resolved) and where to look
    for the user's source files named by call sites."""

    roots: tuple[Path, ...]
    source_dirs: tuple[Path, ...] = ()

    @classmethod
    def of(cls, allow: Sequence[Path], source_dirs: Sequence[Path] = ()) -> "Workspace":
        roots = []
        for d in allow or [Path.cwd()]:
            p = Path(d).expanduser()
            if not p.is_dir():
                raise InputError("--allow: not a directory", str(d))
            roots.append(p.resolve())
        ws = cls(tuple(roots))
        srcs = []
        for d in source_dirs:  # like --allow, from the working directory
            p = Path(d).expanduser()
            if not p.is_dir():
                raise InputError("--source-dir: not a directory", str(d))
            if not ws.inside(p.resolve()):
                raise InputError(
                    f"--source-dir: outside the allowed directories ({ws.allowed()})", str(d)
                )
            srcs.append(p.resolve())
        return cls(tuple(roots), tuple(srcs))

    def inside(self, p: Path) -> bool:
        return any(p == r or p.is_relative_to(r) for r in self.roots)

    def resolve(self, path: str, *, what: str = "path") -> Path:
        """An existing input, resolved (relative paths from the first allowed directory) and
        inside the allow-list; InputError otherwise, before anything is opened."""
        if not path or "\x00" in path:
            raise InputError(f"{what}: empty or invalid path", path or None)
        p = Path(path).expanduser()
        p = p if p.is_absolute() else self.roots[0] / p
        try:
            real = p.resolve(strict=True)
        except FileNotFoundError:
            raise InputError("no such file or directory", path) from None
        except (OSError, RuntimeError) as exc:  # a symlink loop, a permission
            raise InputError(f"cannot resolve: {exc.__class__.__name__}", path) from None
        if not self.inside(real):
            raise InputError(f"outside the allowed directories ({self.allowed()})", path)
        return real

    def output(self, path: str, inputs: Sequence[Path], force: bool) -> Path:
        """A new file to write, inside the allow-list and never one of ``inputs``."""
        if not path or "\x00" in path:
            raise OutputError("empty or invalid path", path or None)
        p = Path(path).expanduser()
        p = p if p.is_absolute() else self.roots[0] / p
        try:
            parent = p.parent.resolve(strict=True)
        except (OSError, RuntimeError):
            raise OutputError(f"directory {p.parent} does not exist", path) from None
        out = parent / p.name
        real = out.resolve() if out.is_symlink() else out  # a link is judged by its target
        if not self.inside(real):
            raise OutputError(f"outside the allowed directories ({self.allowed()})", path)
        if real in inputs or (real.exists() and any(real.samefile(i) for i in inputs)):
            raise OutputError("is the input; inputs are never modified", path)
        if real.exists() and not force:
            raise OutputError("already exists; pass force=true to overwrite", path)
        if real.is_dir():
            raise OutputError("is a directory", path)
        return out

    def allowed(self) -> str:
        return ", ".join(str(r) for r in self.roots)


@dataclass(frozen=True)
class View:
    """The analysis options a tool call may pass (the CLI's --steps/--window/--rank)."""

    steps: str | None = None
    window: str | None = None
    rank: int | None = None


@dataclass
class Session:
    """The session's analyses by (input, its size and mtime, view): a second question about the
    same trace costs no parse. One analysis at a time (they use every core anyway)."""

    workspace: Workspace
    _cache: OrderedDict[tuple[Any, ...], tuple[Analysis, dict[str, Any]]] = field(
        default_factory=OrderedDict
    )
    _lock: threading.Lock = field(default_factory=threading.Lock)
    analyses_run: int = 0  # how many analyses ran (the rest came from the cache)

    def analysis(self, path: Path, view: View) -> tuple[Analysis, dict[str, Any]]:
        key = (str(path), _stamp(path), view)
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                return hit
            # the public entry point, as a script would call it
            a = traceinsight.analyze(path, steps=view.steps, window=view.window, rank=view.rank)
            self.analyses_run += 1
            entry = (a, a.to_json())
            self._cache[key] = entry
            while len(self._cache) > CACHE_ENTRIES:
                self._cache.popitem(last=False)
            return entry


def _stamp(path: Path) -> tuple[Any, ...]:
    """What says an input changed: a file's size and mtime; a job directory's, each file's
    (rewriting a rank's trace leaves the directory's own mtime as it was)."""
    if path.is_dir():
        files = sorted(c for c in path.iterdir() if c.is_file())
        return tuple((c.name, c.stat().st_size, c.stat().st_mtime_ns) for c in files)
    st = path.stat()
    return (st.st_size, st.st_mtime_ns)


# ---- answer builders: a JSON-able dict from an analysis (its document) ----------------------


def _r(x: Any, digits: int = 4) -> Any:
    """Floats rounded to what a reader uses (ratios to 4 places): answers stay short."""
    if isinstance(x, float):
        return round(x, digits)
    if isinstance(x, dict):
        return {k: _r(v, digits) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_r(v, digits) for v in x]
    return x


def _name(s: str | None) -> str | None:
    return s if s is None or len(s) <= MAX_NAME else s[: MAX_NAME - 1] + "…"


def _top(rows: Sequence[Any], n: int) -> tuple[list[Any], int]:
    return list(rows[:n]), max(0, len(rows) - n)


def _saving(w: dict[str, Any] | None) -> dict[str, Any] | None:
    if not w:
        return None
    out = {
        "step_time_ns": w["step_time_ns"],
        "step_time_after_ns": w["step_time_after_ns"],
        "saving_ns": max(0, w["step_time_ns"] - w["step_time_after_ns"]),
        "speedup": _r(w.get("speedup"), 3),
    }
    if "transforms" in w:
        out["transforms"] = w["transforms"]
    return out


def _finding_row(f: dict[str, Any]) -> dict[str, Any]:
    ev = f["evidence"]
    row = {
        "id": f["id"],
        "severity": f["severity"],
        "title": f["title"],
        "what_if": _saving(f.get("what_if")),
    }
    if ev.get("why_no_estimate"):
        row["why_no_estimate"] = ev["why_no_estimate"]
        row["attributed_ns"] = f["cost_ns"]
    if ev.get("transform"):
        row["transform"] = ev["transform"]
    return row


def _headline(doc: dict[str, Any]) -> dict[str, Any]:
    m, src = doc["metrics"], doc["source"]
    idle = sorted(
        ((k, v) for k, v in (m.get("idle_by_cause_ns") or {}).items() if v), key=lambda kv: -kv[1]
    )
    out = {
        "devices": [d.get("name") or f"GPU {d['id']}" for d in src["devices"]],
        "steps": m.get("steps"),
        "step_time_median_ns": m.get("step_time_median_ns"),
        "window_ns": m.get("window_ns"),
        "gpu_busy_ratio": m.get("gpu_busy_ratio"),
        "gpu_idle_ratio": m.get("gpu_idle_ratio"),
        "idle_by_cause_ns": dict(idle[:4]),
        "mfu": m.get("mfu"),
        "memory_peak_allocated_bytes": m.get("memory_peak_allocated_bytes"),
    }
    return _r({k: v for k, v in out.items() if v is not None})


def analyze_answer(doc: dict[str, Any], top: int = TOP_FINDINGS) -> dict[str, Any]:
    """Headline, what bounds the step, findings with their predicted savings, data quality."""
    src = doc["source"]
    shown, left = _top(doc["findings"], top)
    out: dict[str, Any] = {
        "path": src["path"],
        "kind": doc.get("kind", "trace"),
        "format": src.get("format"),
    }
    if doc.get("kind") == "job":
        m = doc["metrics"]
        ranks = [
            {
                "rank": r["rank"],
                "gpu_busy_ratio": _r(r["metrics"].get("gpu_busy_ratio")),
                "step_time_median_ns": r["metrics"].get("step_time_median_ns"),
                "top_finding": r["findings"][0]["id"] if r["findings"] else None,
            }
            for r in doc["ranks"]
        ]
        out["ranks"], out["ranks_left_out"] = _top(ranks, 16)
        out["headline"] = _r(
            {
                k: m.get(k)
                for k in ("step_time_median_ns", "gpu_busy_ratio_mean", "straggler_rank")
                if m.get(k) is not None
            }
        )
        out["hint"] = "pass rank=N to analyze one rank (explain, what_if, regions need one)"
    else:
        win = src.get("window") or {}
        out["view"] = win.get("selection")
        out["headline"] = _headline(doc)
        engine = doc["metrics"].get("step_bound_by")
        speedups = ((doc.get("details") or {}).get("replay") or {}).get("engine_speedups")
        out["bound_by"] = (
            {"engine": engine, "engine_2x_speedups": _r(speedups, 3)} if engine else None
        )
        out["all_fixes"] = _saving(
            ((doc.get("details") or {}).get("what_if") or {}).get("all_fixes")
        )
    out["findings"] = [_finding_row(f) for f in shown]
    out["findings_left_out"] = left
    out["data_quality"] = [
        {k: q.get(k) for k in ("severity", "check", "message", "affected")}
        for q in doc.get("data_quality") or []
    ]
    out["warnings"] = list(doc.get("warnings") or [])
    return out


def _trim(v: Any, n: int = TOP_LIST) -> Any:
    """Evidence with every list cut to ``n`` rows (the cut counted beside it by the caller)."""
    if isinstance(v, list):
        return [_trim(x, n) for x in v[:n]]
    if isinstance(v, dict):
        return {k: _trim(x, n) for k, x in v.items()}
    if isinstance(v, str):
        return _name(v) if len(v) > 2 * MAX_NAME else v
    return v


def _def_line(lines: list[str], function: str, near: int) -> int | None:
    """Where ``def function`` is: at ``near`` (or within the decorators after it), else the one
    definition of that name in the file; None where there is none or several."""
    pat = re.compile(rf"^\s*(async\s+)?def\s+{re.escape(function)}\s*\(")
    for i in range(max(1, near), min(len(lines), near + 3) + 1):
        if pat.match(lines[i - 1]):
            return i
    hits = [i for i, text in enumerate(lines, 1) if pat.match(text)]
    return hits[0] if len(hits) == 1 else None


def source_excerpt(
    ws: Workspace, trace: Path, file: str | None, line: int | None, function: str | None
) -> dict[str, Any] | None:
    """The user's code at a call site: up to SOURCE_LINES lines of ``file`` (found beside the
    trace or in a --source-dir, inside the allow-list; nothing outside is read), None where it
    is not there. Kineto's Python frames give a function's first line, so where the recorded
    line does not start ``def function`` the file changed since the recording: the excerpt is
    taken where that function is now (``line_now``), or left out if it cannot be found."""
    if not file or not line or line < 1 or file.startswith("<"):
        return None
    rel = Path(file)
    bases = [trace.parent, *ws.source_dirs]
    for cand in [rel] if rel.is_absolute() else [b / rel for b in bases]:
        try:
            real = cand.resolve(strict=True)
        except (OSError, RuntimeError):
            continue
        if not ws.inside(real) or not real.is_file() or real.stat().st_size > SOURCE_MAX_BYTES:
            continue
        try:
            lines = real.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            continue
        at = line
        python = real.suffix == ".py" and bool(function) and function.isidentifier()
        if python:
            found = _def_line(lines, function or "", line)
            if found is None:
                return {
                    "file": str(real),
                    "line": line,
                    "lines": None,
                    "note": (
                        f"def {function} is not at line {line} nor once elsewhere in the file: it "
                        "changed since the recording"
                    ),
                }
            at = found
        if at > len(lines):
            return None
        end = min(len(lines), at + SOURCE_LINES - 1)
        out: dict[str, Any] = {"file": str(real), "line": line}
        if at != line:
            out["line_now"] = at  # the file changed since the recording
        out["lines"] = [f"{i}: {lines[i - 1].rstrip()}" for i in range(at, end + 1)]
        return out
    return None


def explain_answer(
    doc: dict[str, Any], finding_id: str, ws: Workspace, trace: Path
) -> dict[str, Any]:
    """One finding in full: evidence (lists cut), call sites with their code, the advice and
    the snippet, its what-if, the regions it lies in."""
    found = [f for f in doc["findings"] if f["id"] == finding_id]
    if not found:
        known = ", ".join(f["id"] for f in doc["findings"]) or "none"
        raise InputError(f"no finding {finding_id!r} (findings: {known})", doc["source"]["path"])
    f = found[0]
    ev = dict(f["evidence"])
    sources = ev.pop("sources", None) or []
    left = {
        k: len(v) - TOP_LIST for k, v in ev.items() if isinstance(v, list) and len(v) > TOP_LIST
    }
    sites, sites_left = _top(sources, TOP_LIST)
    call_sites = []
    for s in sites:
        site = {
            k: s.get(k)
            for k in ("location", "function", "file", "line", "trigger", "count", "cost_ns")
        }
        if s.get("what_if"):
            site["what_if"] = _saving(s["what_if"])
        site["source"] = source_excerpt(ws, trace, s.get("file"), s.get("line"), s.get("function"))
        call_sites.append(site)
    regions = ((doc.get("details") or {}).get("regions") or {}).get("regions") or []
    inside = [r["path"] for r in regions if finding_id in (r.get("findings") or [])]
    out = {
        "id": f["id"],
        "severity": f["severity"],
        "title": f["title"],
        "what_if": _saving(f.get("what_if")),
        "evidence": _r(_trim(ev)),
        "evidence_left_out": left,
        "call_sites": call_sites,
        "call_sites_left_out": sites_left,
        "regions": inside[:TOP_LIST],
        "recommendation": f["recommendation"],
        "snippet": f.get("snippet") or None,
        "snippet_language": f.get("snippet_language") or "python",
        "tags": f.get("tags") or [],
    }
    if sites and all(c["source"] is None for c in call_sites):
        out["source_hint"] = (
            "the call sites' files are not beside the trace nor in a --source-dir of the server"
        )
    return out


def regions_answer(doc: dict[str, Any], n: int) -> dict[str, Any]:
    """The region tree's rows with the most GPU time: time per step, idle by cause, findings."""
    reg = (doc.get("details") or {}).get("regions") or {}
    rows = sorted(reg.get("regions") or [], key=lambda r: -r["gpu_ns"])
    shown, left = _top(rows, n)
    out_rows = []
    for r in shown:
        causes = sorted(
            ((k, v) for k, v in r["idle_by_cause_ns"].items() if v), key=lambda kv: -kv[1]
        )
        out_rows.append(
            {
                "path": _name(r["path"]),
                "count_per_step": _r(r.get("count_per_step")),
                "gpu_ns": r["gpu_ns"],
                "gpu_ns_per_step": _r(r.get("gpu_ns_per_step"), 1),
                "idle_ns": r["idle_ns"],
                "idle_by_cause_ns": dict(causes[:3]),
                "findings": r.get("findings") or [],
            }
        )
    return {
        "path": doc["source"]["path"],
        "region_count": reg.get("region_count", 0),
        "attributed_gpu_ns": reg.get("attributed_gpu_ns"),
        "unattributed_gpu_ns": reg.get("unattributed_gpu_ns"),
        "regions": out_rows,
        "left_out": left,
    }


def top_kernels_answer(doc: dict[str, Any], n: int) -> dict[str, Any]:
    """The kernels with the most GPU time in the analysis window (by name), and by class."""
    k = (doc.get("details") or {}).get("kernels") or {}
    rows = list(k.get("top_kernels") or [])
    shown, _ = _top(rows, n)
    shown_count = sum(r["count"] for r in shown)
    shown_ns = sum(r["total_ns"] for r in shown)
    return {
        "path": doc["source"]["path"],
        "kernel_count": k.get("kernel_count", 0),
        "kernel_ns": k.get("kernel_ns", 0),
        "kernels": [
            {
                "name": _name(r["name"]),
                "kernel_class": r["kernel_class"],
                "count": r["count"],
                "total_ns": r["total_ns"],
                "median_ns": _r(r["median_ns"], 1),
                "time_ratio": _r(r["time_ratio"]),
            }
            for r in shown
        ],
        # the rest of the window's kernels: calls and time not in the rows above
        "left_out": {
            "count": k.get("kernel_count", 0) - shown_count,
            "total_ns": k.get("kernel_ns", 0) - shown_ns,
        },
        "by_class": [
            {"kernel_class": c["kernel_class"], "count": c["count"], "total_ns": c["total_ns"]}
            for c in k.get("by_class") or []
        ],
    }


def what_if_answer(analysis: Analysis, doc: dict[str, Any], fixes: Sequence[str]) -> dict[str, Any]:
    """The chosen fixes replayed together, beside each alone and all of them."""
    from traceinsight.fixes import predict_fixes

    combined = predict_fixes(analysis, fixes)
    by_id = {f["id"]: f for f in doc["findings"]}
    return {
        "path": doc["source"]["path"],
        "combined": _r(combined.to_json()),
        "each_alone": [
            {
                "id": fid,
                "transform": by_id[fid]["evidence"].get("transform"),
                **(_saving(by_id[fid].get("what_if")) or {}),
            }
            for fid in combined.fixes
        ],
        "all_fixes": _saving(((doc.get("details") or {}).get("what_if") or {}).get("all_fixes")),
    }


def diff_answer(d: dict[str, Any]) -> dict[str, Any]:
    """A diff document cut to what answers "did it get faster, and why"."""
    from traceinsight.constants import HEADLINE_METRICS

    k = d["kernels_per_step"]
    changed, changed_left = _top(k["changed"], TOP_LIST)
    f = d["findings"]
    resolved, resolved_left = _top(f["resolved"], TOP_LIST)
    introduced, introduced_left = _top(f["introduced"], TOP_LIST)
    gate = d.get("gate") or {}
    return _r(
        {
            "before": d["before"],
            "after": d["after"],
            "step_time_before_ns": d["step_time_before_ns"],
            "step_time_after_ns": d["step_time_after_ns"],
            "step_time_change": d["step_time_change"],
            "noise_interval": d["noise"]["interval"],
            "significant": gate.get("significant"),
            "basis": gate.get("basis"),
            "warnings": d["warnings"],
            "hardware_differs": d["hardware_differs"],
            "program_differs": d.get("program_differs"),
            "metrics": [r for r in d["metrics"] if r["metric"] in HEADLINE_METRICS],
            "idle_by_cause": [r for r in d["idle_by_cause"] if r["before_ns"] or r["after_ns"]],
            "kernels": {
                "per": k.get("per"),
                "appeared_count": k["appeared_count"],
                "disappeared_count": k["disappeared_count"],
                "changed": [
                    {
                        "name": _name(r["name"]),
                        "total_ns": r["total_ns"],
                        "total_ns_after": r["total_ns_after"],
                    }
                    for r in changed
                ],
                "changed_left_out": changed_left,
            },
            "findings": {
                "resolved": [{"id": x["id"], "title": x.get("title")} for x in resolved],
                "resolved_left_out": resolved_left,
                "introduced": [{"id": x["id"], "title": x.get("title")} for x in introduced],
                "introduced_left_out": introduced_left,
            },
        }
    )


# ---- the tools ------------------------------------------------------------------------------


class Tools:
    """The tool functions over one session: paths checked, analyses cached, errors as one
    line (:class:`TraceInsightError` from the library, anything else named as internal)."""

    def __init__(self, session: Session) -> None:
        self.s = session
        self.ws = session.workspace

    def _one(self, path: str, view: View) -> tuple[Path, Analysis, dict[str, Any]]:
        p = self.ws.resolve(path)
        a, doc = self.s.analysis(p, view)
        return p, a, doc

    def _single(
        self, path: str, view: View, what: str
    ) -> tuple[Path, TraceAnalysis, dict[str, Any]]:
        p, a, doc = self._one(path, view)
        if isinstance(a, JobAnalysis):
            ranks = [r.rank for r in a.ranks]
            raise InputError(
                f"{what} needs one rank and this is a job of ranks {ranks}: pass rank", str(p)
            )
        return p, a, doc

    def analyze(self, path: str, view: View, top: int) -> dict[str, Any]:
        _, _, doc = self._one(path, view)
        return analyze_answer(doc, top)

    def explain(self, path: str, finding_id: str, view: View) -> dict[str, Any]:
        p, _, doc = self._single(path, view, "explain")
        return explain_answer(doc, finding_id, self.ws, p)

    def what_if(self, path: str, fixes: Sequence[str], view: View) -> dict[str, Any]:
        _, a, doc = self._single(path, view, "what_if")
        return what_if_answer(a, doc, fixes)

    def regions(self, path: str, n: int, view: View) -> dict[str, Any]:
        _, _, doc = self._single(path, view, "regions")
        return regions_answer(doc, n)

    def top_kernels(self, path: str, n: int, view: View) -> dict[str, Any]:
        _, _, doc = self._single(path, view, "top_kernels")
        return top_kernels_answer(doc, n)

    def diff(self, before: str, after: str, view: View) -> dict[str, Any]:
        from traceinsight.diff import compare

        _, ab, _ = self._one(before, view)
        _, aa, _ = self._one(after, view)
        return diff_answer(compare(ab, aa))

    def annotate(self, path: str, out: str, force: bool, view: View) -> dict[str, Any]:
        from traceinsight.commands.shared import OPEN_HINT
        from traceinsight.commands.shared import write_annotated_trace as write

        p = self.ws.resolve(path)
        target = self.ws.output(out, [p], force)
        _, a, _ = self._single(path, view, "annotate")
        n = write(a, p, target)
        return {
            "path": str(p),
            "out": str(target),
            "traceinsight_events": n,
            "bytes": target.stat().st_size,
            "open": OPEN_HINT,
        }


def dumps(answer: dict[str, Any]) -> str:
    """Compact JSON (no indent): an answer is read by a model, whose context is the budget."""
    import orjson

    return orjson.dumps(answer, option=orjson.OPT_NON_STR_KEYS, default=str).decode()


def one_line(exc: BaseException, path: str | None) -> str:
    """The message a client sees for a failure: the library's own line, else a named one."""
    if isinstance(exc, TraceInsightError):
        msg = str(exc)
    elif isinstance(exc, MemoryError):
        msg = f"{path}: ran out of memory; try a smaller capture or a window"
    else:
        msg = f"{path}: internal error {type(exc).__name__}: {exc}"
    return " ".join(msg.split())  # one line whatever the exception held


# ---- the MCP server (needs the mcp extra) ---------------------------------------------------


def build_server(ws: Workspace, session: Session | None = None) -> "MCPServer":
    """The MCP server with the seven tools over ``ws`` (one session's cache)."""
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError
    from mcp.types import ToolAnnotations
    from pydantic import Field, ValidationError

    from traceinsight import __version__

    class OneLineErrors(MCPServer):
        """Arguments the schema rejects come back as one line too (pydantic's own message
        spans several)."""

        async def call_tool(self, name: str, arguments: dict[str, Any], context: Any = None) -> Any:
            try:
                return await super().call_tool(name, arguments, context)
            except ToolError as exc:
                if not isinstance(exc.__cause__, ValidationError):
                    raise
                why = "; ".join(
                    f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}"
                    for e in exc.__cause__.errors()
                )
                raise ToolError(f"Error executing tool {name}: invalid arguments: {why}") from None

    tools = Tools(session or Session(ws))
    server = OneLineErrors(
        name="traceinsight", version=__version__, instructions=INSTRUCTIONS, log_level="WARNING"
    )
    read_only = ToolAnnotations(read_only_hint=True, idempotent_hint=True, open_world_hint=False)

    def answer(path: str | None, fn: Callable[[], dict[str, Any]]) -> str:
        try:
            return dumps(fn())
        except Exception as exc:  # every failure is one line to the client, never a traceback
            raise ToolError(one_line(exc, path)) from None

    Path_ = Annotated[
        str,
        Field(
            description="A trace (.json/.json.gz/.json.xz Kineto, .sqlite nsys export) or a job directory; "
            "relative paths are from the server's first allowed directory"
        ),
    ]
    Steps = Annotated[
        str | None, Field(description="Only steps A..B (ProfilerStep numbers); 'A..', '..B', 'N'")
    ]
    Window = Annotated[
        str | None,
        Field(description="Only [START, END) from the capture start: '2s:4s', '1500ms:'"),
    ]
    Rank = Annotated[
        int | None, Field(ge=0, description="One rank of a job directory or multi-process export")
    ]

    @server.tool(annotations=read_only, structured_output=False)
    def analyze(
        path: Path_,
        steps: Steps = None,
        window: Window = None,
        rank: Rank = None,
        top: Annotated[int, Field(ge=1, le=50, description="Findings to list")] = TOP_FINDINGS,
    ) -> str:
        """Diagnose a trace: the headline (step time, GPU busy, idle by cause), which engine
        bounds the step, the ranked findings with the step time each fix is predicted to save
        (what_if, un-profiled), all fixes together, data-quality notes and warnings."""
        return answer(path, lambda: tools.analyze(path, View(steps, window, rank), top))

    @server.tool(annotations=read_only, structured_output=False)
    def explain(
        path: Path_,
        finding_id: Annotated[str, Field(description="A finding id from analyze, e.g. host_sync")],
        steps: Steps = None,
        window: Window = None,
        rank: Rank = None,
    ) -> str:
        """One finding in full: its evidence, the call sites in the user's code (with the
        source lines where the file is readable), the advice and a code snippet, its what-if,
        and the regions it lies in."""
        return answer(path, lambda: tools.explain(path, finding_id, View(steps, window, rank)))

    @server.tool(annotations=read_only, structured_output=False)
    def what_if(
        path: Path_,
        fixes: Annotated[
            list[str], Field(min_length=1, description="Finding ids whose fixes to apply together")
        ],
        steps: Steps = None,
        window: Window = None,
        rank: Rank = None,
    ) -> str:
        """Replay the step with the chosen findings' fixes applied together (one replay of the
        causal step model): the step time before and after, the speedup, beside each fix alone
        and all fixes."""
        return answer(path, lambda: tools.what_if(path, fixes, View(steps, window, rank)))

    @server.tool(annotations=read_only, structured_output=False)
    def regions(
        path: Path_,
        n: Annotated[int, Field(ge=1, le=100, description="Regions to list")] = 15,
        steps: Steps = None,
        window: Window = None,
        rank: Rank = None,
    ) -> str:
        """The annotated regions (record_function, NVTX, nn.Module ranges) with the most GPU
        time: time per step, GPU idle inside each by cause, the findings placed there."""
        return answer(path, lambda: tools.regions(path, n, View(steps, window, rank)))

    @server.tool(annotations=read_only, structured_output=False)
    def top_kernels(
        path: Path_,
        n: Annotated[int, Field(ge=1, le=MAX_KERNELS, description="Kernels to list")] = 10,
        steps: Steps = None,
        window: Window = None,
        rank: Rank = None,
    ) -> str:
        """The GPU kernels with the most time in the analyzed window (by name: calls, total,
        median, share of kernel time), and kernel time by class."""
        return answer(path, lambda: tools.top_kernels(path, n, View(steps, window, rank)))

    @server.tool(annotations=read_only, structured_output=False)
    def diff(
        before: Annotated[str, Field(description="The trace before the change")],
        after: Annotated[str, Field(description="The trace after the change")],
        steps: Steps = None,
        window: Window = None,
        rank: Rank = None,
    ) -> str:
        """Compare two traces: step time with its noise interval, headline metrics, idle by
        cause, kernels that appeared, disappeared or changed, findings resolved and introduced."""
        return answer(before, lambda: tools.diff(before, after, View(steps, window, rank)))

    @server.tool(
        annotations=ToolAnnotations(
            read_only_hint=False, destructive_hint=False, open_world_hint=False
        ),
        structured_output=False,
    )
    def annotate(
        path: Path_,
        out: Annotated[
            str,
            Field(
                description="The annotated trace to write (.json or .json.gz), inside an allowed directory"
            ),
        ],
        force: Annotated[bool, Field(description="Overwrite OUT if it exists")] = False,
        steps: Steps = None,
        window: Window = None,
        rank: Rank = None,
    ) -> str:
        """Write the trace with the analysis drawn on it (idle by cause, findings, sync arrows)
        as a new file for Perfetto; the input is never modified."""
        return answer(path, lambda: tools.annotate(path, out, force, View(steps, window, rank)))

    return server


def serve(ws: Workspace) -> None:
    """Serve the tools over stdio until the client closes the connection."""
    import anyio

    anyio.run(build_server(ws).run_stdio_async)
