"""traceinsight: why the GPU starves, from PyTorch profiler and Nsight Systems traces.

Library first: ``traceinsight.api.analyze_path(path)`` returns an :class:`~traceinsight.api.Analysis`;
the ``traceinsight`` command is a thin skin over it. Imports stay lazy so ``--help`` is fast.
"""

__version__ = "0.1.0"
