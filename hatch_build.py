"""Build hook: compile the native scanner (traceinsight/_native/kscan.c) into the package.

Optional by design: without a C compiler (or with TRACEINSIGHT_NO_NATIVE_BUILD=1) the wheel is
pure Python and the typed msgspec path decodes everything (slower, same results).
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

SOURCE = Path("traceinsight") / "_native" / "kscan.c"


def compile_scanner(root: Path) -> Path | None:
    """traceinsight/_kscan<EXT_SUFFIX> built next to the sources (an editable install imports
    it from there); None where it cannot be built."""
    out = root / "traceinsight" / f"_kscan{sysconfig.get_config_var('EXT_SUFFIX') or '.so'}"
    ldshared = sysconfig.get_config_var("LDSHARED") or "cc -shared"
    cmd = [
        *shlex.split(ldshared),
        "-O2",
        "-fPIC",
        f"-I{sysconfig.get_paths()['include']}",
        str(root / SOURCE),
        "-o",
        str(out),
    ]
    try:
        subprocess.run(cmd, check=True, capture_output=True, text=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        detail = getattr(exc, "stderr", "") or str(exc)
        print(f"traceinsight: native scanner not built ({detail.strip()[:300]})", file=sys.stderr)
        return None
    return out


class NativeScannerHook(BuildHookInterface):
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if self.target_name != "wheel" or os.environ.get("TRACEINSIGHT_NO_NATIVE_BUILD") == "1":
            return
        built = compile_scanner(Path(self.root))
        if built is None:
            return
        build_data["pure_python"] = False
        build_data["infer_tag"] = True
        if version != "editable":  # an editable install finds it in the source tree
            build_data["force_include"][str(built)] = f"traceinsight/{built.name}"
