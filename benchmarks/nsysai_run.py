"""Runs the peer nsys-ai's cold cache build on one Nsight Systems export: the step it takes first
on a new .sqlite (every command of it opens a profile through ``open_auto_db``, which builds
``<profile>.nsys-cache`` when none is valid): DuckDB attaches the export and writes its tables to
Parquet. Its README's "Build" column (3.7 GB in 27.4 s) times this step.

    NSYSAI_PYTHON benchmarks/nsysai_run.py EXPORT.sqlite

The cache is written beside EXPORT (nsys_big.py links the export into a fresh directory for
each run, so every build is cold).
"""

import sys

from nsys_ai.parquet_cache import build_cache

print(build_cache(sys.argv[1], env_escape=False))
