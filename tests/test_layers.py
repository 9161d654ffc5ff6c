"""The layers: one table (``LAYERS``) says what each part of the package may import; every
module of the package is in it, every import of ours (``import traceinsight.x``,
``from traceinsight.x import y``, ``from traceinsight import x``, relative imports, also
inside functions) follows it, it has no cycle, and docs/ARCHITECTURE.md's "Layers" table is
the same table. Imports under ``if TYPE_CHECKING:`` are for annotations only and not counted.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from .conftest import ROOT

PKG = ROOT / "traceinsight"
# layer -> the layers it may import (besides its own modules), bottom up. A key is a module or
# package under traceinsight/; a module belongs to the longest key it is or lies under.
LAYERS: dict[str, set[str]] = {
    "constants": set(),
    "errors": set(),
    "records": set(),
    "runtime": {"errors"},  # dask_client's unreachable scheduler
    "inputs": set(),
    "native": set(),
    "io": {"errors", "inputs"},
    "resources": {"errors"},
    "options": {"constants", "errors"},
    "report.format": set(),
    "parsers.source": {"errors", "resources"},
    "model": {"constants", "errors", "native"},
    "causal": {"model", "native", "records"},
    "parsers": {
        "model",
        "constants",
        "errors",
        "native",
        "resources",
        "runtime",
        "report.format",
        "parsers.source",
    },
    "analyzers": {"model", "causal", "constants", "records", "report.format"},
    "findings": {"analyzers", "causal", "constants", "records", "report.format"},
    "analysis": {"analyzers", "findings", "causal", "model", "constants", "records"},
    "pipeline": {
        "analysis",
        "analyzers",
        "causal",
        "findings",
        "model",
        "options",
        "runtime",
        "errors",
    },
    "jobs": {
        "pipeline",
        "analysis",
        "analyzers",
        "findings",
        "inputs",
        "model",
        "options",
        "parsers",
        "runtime",
        "errors",
    },
    "api": {
        "jobs",
        "inputs",
        "pipeline",
        "analysis",
        "model",
        "options",
        "parsers",
        "runtime",
        "errors",
        "io",
    },
    "diff": {"api", "analysis", "constants", "options", "records", "runtime"},
    "report": {"report.format", "constants", "runtime", "io"},
    "report.annotate": {"analysis", "io", "constants", "parsers.source"},
    "batch": {"api", "inputs", "report", "constants", "errors", "io", "options", "runtime"},
    "capture": {"api", "io", "report"},
    "commands.shared": {
        "api",
        "pipeline",
        "analysis",
        "report",
        "report.annotate",
        "report.format",
        "constants",
        "errors",
        "io",
        "options",
        "runtime",
    },
    "fixes": {"analysis", "findings", "errors"},
    "mcp_server": {
        "traceinsight",
        "analysis",
        "commands.shared",
        "constants",
        "diff",
        "errors",
        "fixes",
    },
    "commands": {
        "commands.shared",
        "api",
        "pipeline",
        "analysis",
        "diff",
        "batch",
        "capture",
        "mcp_server",
        "errors",
        "io",
        "options",
        "report.format",
        "runtime",
    },
    "cli": {"commands", "constants", "errors", "options", "runtime"},
    "__main__": {"cli"},
    "traceinsight": {"constants"},  # the facade: the rest loads on first use (__getattr__)
}
# the C extensions' modules
COMPILED = {"_kscan": "native", "_kreplay": "native", "_ksqlite": "native", "_kbtree": "native"}


def modules() -> dict[str, Path]:
    """Every module of the package by dotted name, without the ``traceinsight.`` prefix (the
    package itself is ``traceinsight``)."""
    out = {}
    for f in sorted(PKG.rglob("*.py")):
        parts = list(f.relative_to(PKG).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts) or "traceinsight"] = f
    return out


MODULES = modules()


def layer_of(name: str) -> str:
    """The layer of a module (dotted, no prefix): the longest key it is or lies under."""
    if name in COMPILED:
        return COMPILED[name]
    hits = [k for k in LAYERS if name == k or name.startswith(k + ".")]
    if not hits:
        raise KeyError(name)
    return max(hits, key=len)


def imported(name: str, path: Path) -> set[str]:
    """Our modules ``path`` imports at run time, dotted without the prefix; the package itself
    is ``traceinsight`` (``from traceinsight import __version__``)."""
    tree = ast.parse(path.read_text())
    typing_only = {
        id(n)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for stmt in node.body
        for n in ast.walk(stmt)
    }
    package = ("traceinsight." + name if name != "traceinsight" else name).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    out = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            targets = [f"{base}.{a.name}" for a in node.names]
            # ``from traceinsight.x import y``: y is a module of ours or a name in x
            targets = [t if _ours(t) in MODULES or _ours(t) in COMPILED else base for t in targets]
        else:
            continue
        out.update(_ours(t) for t in targets if t.split(".")[0] == "traceinsight")
    return out


def _ours(dotted: str) -> str:
    return dotted.removeprefix("traceinsight.") if dotted != "traceinsight" else dotted


def test_every_module_is_in_a_layer() -> None:
    missing = []
    for name in MODULES:
        try:
            layer_of(name)
        except KeyError:
            missing.append(name)
    assert not missing, f"modules in no layer of LAYERS: {missing}"


@pytest.mark.parametrize("name", sorted(MODULES))
def test_imports_follow_the_layers(name: str) -> None:
    own = layer_of(name)
    for target in imported(name, MODULES[name]):
        layer = layer_of(target)
        assert layer == own or layer in LAYERS[own], (
            f"{MODULES[name].relative_to(ROOT)} ({own}) imports {target} ({layer})"
        )


def test_the_layers_have_no_cycle() -> None:
    done: set[str] = set()

    def visit(layer: str, path: tuple[str, ...]) -> None:
        assert layer not in path, f"layer cycle: {' -> '.join((*path, layer))}"
        if layer in done:
            return
        for below in LAYERS[layer]:
            visit(below, (*path, layer))
        done.add(layer)

    for layer in LAYERS:
        visit(layer, ())


def test_every_import_form_is_seen(tmp_path: Path) -> None:
    """The resolver on each form, so a form it missed cannot pass unseen."""
    f = tmp_path / "m.py"
    f.write_text(
        "import traceinsight.model.schema\n"
        "from traceinsight.causal import graph\n"
        "from traceinsight.analyzers.replay import ReplayResult\n"
        "from traceinsight import api, __version__\n"
        "from . import intervals\n"
        "from .classify import KERNEL_RULES\n"
        "def f():\n    from traceinsight.jobs import analyze_job\n"
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from traceinsight.analysis import TraceAnalysis\n"
    )
    got = imported("model.flops", f)
    assert got == {
        "model.schema",
        "causal.graph",
        "analyzers.replay",
        "api",
        "traceinsight",
        "model.intervals",
        "model.classify",
        "jobs",
    }


def documented_layers() -> dict[str, set[str]]:
    """docs/ARCHITECTURE.md's "Layers" table: | `layer` | `a`, `b` (or nothing) | ..."""
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    section = text.split("\n## Layers", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([\w.]+)` \| ([^|]*) \|", section, re.M)
    return {layer: set(re.findall(r"`([\w.]+)`", deps)) for layer, deps in rows}


def test_the_document_is_the_same_table() -> None:
    assert documented_layers() == LAYERS
