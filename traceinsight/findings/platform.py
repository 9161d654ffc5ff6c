"""A CUDA/HIP application's findings in its runtime's words: HIP mirrors CUDA's API names
(``cudaStreamWaitEvent`` is ``hipStreamWaitEvent``), so the rules declare their application
advice once, in CUDA's, and a HIP trace's findings are renamed here (a public rocprofv3 capture
of an MI300X benchmark was told ``cudaDeviceSynchronize``, ``cudaGraphLaunch`` and ``nsys
profile --sample=cpu``: session 53). PyTorch's advice is Python, the same on both."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace

from traceinsight.findings.model import Finding

# (pattern, replacement), in order: HIP's own names first where they differ from CUDA's
HIP_WORDS: tuple[tuple[str, str], ...] = (
    (r"\bcudaHostAlloc", "hipHostMalloc"),
    (r"\bcudaMallocHost\b", "hipHostMalloc"),
    (r"\bcudaFreeHost\b", "hipHostFree"),
    (r"\bcuda(?=[A-Z])", "hip"),
    (r"\bCUDA graph", "HIP graph"),
    (r"\bCUDA calls\b", "HIP calls"),
    (r"\bCUDA events\b", "HIP events"),
    (
        r"nsys profile --sample=cpu names the functions",
        "a CPU sampler (perf, rocprof-sys) names the functions",
    ),
    (r"\(__launch_bounds__, -?maxrregcount\)", "(__launch_bounds__)"),
    (r"-maxrregcount", "__launch_bounds__"),
)
_COMPILED = tuple((re.compile(p), r) for p, r in HIP_WORDS)


def hip_words(text: str) -> str:
    """``text`` with CUDA's API names and tools as HIP's."""
    for pattern, repl in _COMPILED:
        text = pattern.sub(repl, text)
    return text


def in_runtime_words(findings: Sequence[Finding], runtime: str) -> list[Finding]:
    """The findings as ``runtime`` ("cuda" or "hip") names things: titles, advice, snippets."""
    if runtime != "hip":
        return list(findings)
    return [
        replace(
            f,
            title=hip_words(f.title),
            recommendation=hip_words(f.recommendation),
            snippet=hip_words(f.snippet) if f.snippet else f.snippet,
        )
        for f in findings
    ]
