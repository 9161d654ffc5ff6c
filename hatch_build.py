"""Build hook: compile the C extensions (traceinsight/_native/) into the package: the native
scanner of Kineto events (kscan.c), the step model's replay loop (kreplay.c) and the reader of
SQLite rows for Nsight Systems exports (ksqlite.c, where SQLite's header and library are;
kbtree.c reads the tables' B-tree pages itself, without SQLite).

Optional by design: without a C compiler (or with TRACEINSIGHT_NO_NATIVE_BUILD=1) the wheel is
pure Python: the typed msgspec path decodes everything, polars runs the replay and ADBC (or
sqlite3) reads the exports (slower, same results).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

NATIVE = Path("traceinsight") / "_native"
EXTENSIONS = {
    "_kscan": "kscan.c",
    "_kreplay": "kreplay.c",
    "_ksqlite": "ksqlite.c",
    "_kbtree": "kbtree.c",
}  # module -> source
LIBRARIES = {"_ksqlite": ["-lsqlite3"]}  # the system's SQLite (Python's sqlite3 links it too)


def compile_extension(root: Path, module: str) -> Path | None:
    """traceinsight/<module><EXT_SUFFIX> built next to the sources (an editable install imports
    it from there); None where it cannot be built."""
    out = root / "traceinsight" / f"{module}{sysconfig.get_config_var('EXT_SUFFIX') or '.so'}"
    ldshared = sysconfig.get_config_var("LDSHARED") or "cc -shared"
    cmd = [
        *shlex.split(ldshared),
        "-O2",
        "-fPIC",
        f"-I{sysconfig.get_paths()['include']}",
        f"-I{root / NATIVE}",
        str(root / NATIVE / EXTENSIONS[module]),
        "-o",
        str(out),
        *LIBRARIES.get(module, []),
    ]
    try:
        subprocess.run(cmd, check=True, capture_output=True, text=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        detail = getattr(exc, "stderr", "") or str(exc)
        print(f"traceinsight: {module} not built ({detail.strip()[:300]})", file=sys.stderr)
        return None
    return out


class NativeExtensionsHook(BuildHookInterface):
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if self.target_name != "wheel" or os.environ.get("TRACEINSIGHT_NO_NATIVE_BUILD") == "1":
            return
        built = [b for m in EXTENSIONS if (b := compile_extension(Path(self.root), m))]
        if not built:
            return
        build_data["pure_python"] = False
        build_data["infer_tag"] = True
        if version != "editable":  # an editable install finds them in the source tree
            for b in built:
                build_data["force_include"][str(b)] = f"traceinsight/{b.name}"
