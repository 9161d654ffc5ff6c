"""Batch throughput with 1 and 2 local workers on the same set of traces (fresh output dirs).

    python benchmarks/batch_scaling.py [COPIES]

COPIES (default 1) repeats the set under different names, for a longer run where worker start-up
(about a second per spawned process) matters less.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path

from bench import ROOT, SHARED

TRACES = sorted((ROOT / "fixtures" / "h200").glob("*.pt.trace.json.xz")) + [
    SHARED / "hta" / "df_index_resolver" / "df_index_resolver.json.gz",
    SHARED / "hta" / "nccl_parser_config" / "nccl_data.json.gz",
]


def main() -> int:
    import subprocess

    with tempfile.TemporaryDirectory() as d:
        src = Path(d) / "in"
        src.mkdir()
        copies = int(sys.argv[1]) if len(sys.argv) > 1 else 1
        for c in range(copies):
            for t in TRACES:
                if t.exists():
                    shutil.copy(t, src / f"c{c}_{t.name}")
        times = {}
        for workers in (1, 2):
            out = Path(d) / f"out{workers}"
            t0 = time.perf_counter()
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "traceinsight",
                    "batch",
                    str(src),
                    "-o",
                    str(out),
                    "-q",
                    "-j",
                    str(workers),
                ],
                check=False,
            )
            times[workers] = time.perf_counter() - t0
        n = len(list(src.iterdir()))
        print(
            f"{n} traces: 1 worker {times[1]:.1f} s, 2 workers {times[2]:.1f} s, speedup {times[1] / times[2]:.2f}x"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
