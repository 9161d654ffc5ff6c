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

# The hardware's words, whatever the framework: AMD's matrix cores and vector ALUs where NVIDIA
# has tensor cores and CUDA cores (session 54: an MI300X trace read "GEMMs with dimensions off the
# tensor-core alignment"; PyTorch's advice is Python and keeps its words otherwise)
HIP_HARDWARE_WORDS: tuple[tuple[str, str], ...] = (
    (r"\btensor-core", "matrix-core"),
    (r"\btensor cores\b", "matrix cores"),
    (r"\bCUDA cores\b", "vector ALUs"),
)
_HARDWARE = tuple((re.compile(p), r) for p, r in HIP_HARDWARE_WORDS)


def hip_words(text: str, api: bool = True) -> str:
    """``text`` with NVIDIA's hardware words as AMD's and, with ``api``, CUDA's API names and
    tools as HIP's."""
    for pattern, repl in (*_COMPILED, *_HARDWARE) if api else _HARDWARE:
        text = pattern.sub(repl, text)
    return text


def in_runtime_words(findings: Sequence[Finding], runtime: str, api: bool = True) -> list[Finding]:
    """The findings as ``runtime`` ("cuda" or "hip") names things: titles, advice, snippets
    (``api``: the runtime's calls too, an application's; PyTorch's advice is Python)."""
    if runtime != "hip":
        return list(findings)
    return [
        replace(
            f,
            title=hip_words(f.title, api),
            recommendation=hip_words(f.recommendation, api),
            snippet=hip_words(f.snippet, api) if f.snippet else f.snippet,
        )
        for f in findings
    ]


def names_hardware(findings: Sequence[Finding]) -> bool:
    """Whether any finding's text names NVIDIA's hardware words (the runtime is then looked up)."""
    return any(
        p.search(t)
        for f in findings
        for t in (f.title, f.recommendation, f.snippet or "")
        for p, _ in _HARDWARE
    )
