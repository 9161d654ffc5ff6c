"""Which frames are the user's own: a Python frame's file outside the libraries, the standard
library and site-packages (the sources' locations, the model's caller, idle's named frames); a
native frame (nsys backtraces and CPU samples) outside the CUDA stack, the runtimes and anything
installed."""

from __future__ import annotations

import sys

import polars as pl

FRAME = r"^(?<file>.+?)\((?<line>\d+)\): (?<func>.+)$"
# Top-level packages that are libraries. Kineto strips the sys.path entry from a frame's file,
# site-packages included (``torch/_tensor.py``, ``vllm/...``), so an installed package looks like
# the user's own unless it is named here.
LIBRARIES = frozenset(
    {
        "torch",
        "torchvision",
        "torchaudio",
        "torchrec",
        "functorch",
        "triton",
        "numpy",
        "transformers",
        "accelerate",
        "deepspeed",
        "lightning",
        "pytorch_lightning",
        "fbgemm_gpu",
        "apex",
        "traceinsight",
        "tqdm",
        "_pytest",
        "pytest",
        "vllm",
        "sglang",
        "flashinfer",
        "flash_attn",
        "xformers",
        "diffusers",
        "peft",
        "trl",
        "timm",
        "einops",
        "bitsandbytes",
        "safetensors",
        "datasets",
        "tokenizers",
        "huggingface_hub",
        "torchtune",
        "fairscale",
        "megatron",
        "transformer_engine",
        "thunder",
        # scientific and domain stacks whose own control flow syncs (torchdiffeq's adaptive
        # solver read the GPU 145 times a step inside one odeint call of the user's loop)
        "torchdiffeq",
        "torch_geometric",
        "sentence_transformers",
        "torchmetrics",
        "gpytorch",
        "botorch",
        "e3nn",
        "dgl",
        "kornia",
        "monai",
        "detectron2",
        "mmcv",
        "mmdet",
        "mmengine",
        "ultralytics",
        "pytorch3d",
        "torchdata",
        "torchtext",
        "webdataset",
        "torchao",
        "torch_tensorrt",
        "composer",
        "colossalai",
        "scipy",
        "sklearn",
        "pandas",
        "PIL",
        "cv2",
        "numba",
        "opt_einsum",
    }
)
NON_USER = LIBRARIES | frozenset(sys.stdlib_module_names)


def user_frames(frames: pl.DataFrame) -> pl.DataFrame:
    """The ``python_function`` rows of the user's own files (outside the libraries), with file,
    line and function parsed; decided once per distinct name."""
    names = frames.select(pl.col("name").unique()).with_columns(
        pl.col("name").str.extract_groups(FRAME).alias("_f")
    )
    names = names.unnest("_f").with_columns(
        pl.col("file").str.extract(r"^([^/\\.]+)").alias("_top"),
        pl.col("line").cast(pl.Int64),
    )
    user = names.filter(
        pl.col("file").is_not_null()
        & ~pl.col("file").str.starts_with("<")
        & ~pl.col("file").str.contains(r"site-packages|dist-packages")
        & ~pl.col("_top").is_in(list(NON_USER))
    ).drop("_top")
    return frames.join(user, on="name", how="inner")


# Native frames that are not the user's: the CUDA stack, torch, the interpreter, the C
# runtime, the profiler's injection libraries (by module file name), and anything installed
# (site-packages), plus the entry stubs and the CUDA runtime's inline templates (cudaMalloc<T>,
# compiled into the user's binary from cuda_runtime.h) by symbol.
NATIVE_LIBRARY = (
    r"^(libcuda|libcudart|libcupti|libnvidia|libnvToolsExt|libnvtx|libToolsInjection|libcublas"
    r"|libcudnn|libnccl|libnvrtc|libnvJitLink|libcufft|libcurand|libcusparse|libcusolver|libtorch"
    r"|libc10|libshm|libgomp|libomp|libiomp|libpython|python\d|libc[-.]|libpthread|libstdc\+\+"
    r"|libgcc|ld-linux|ld-\d|libm[-.]|libdl[-.]|librt[-.]|libz[-.]|libmpi|libfabric|libuc[pst]"
    r"|libhip|libamdhip|librocm|libroctracer|\[)"
)
INSTALLED = r"site-packages|dist-packages|[Nn]sight|/nsys"
UNRESOLVED = r"^0x[0-9a-fA-F]+$|^\[|^$"
# By function name: entry stubs, runtimes' internals (``__cudart1050``: a static cudart),
# header-only libraries compiled into the user's binary, and the CUDA/NCCL API itself.
NON_USER_FUNCTION = (
    r"^(_start|_init|__.*|(thrust|cub|std|__gnu_cxx|at|c10|torch|cutlass|cute)::.*"
    r"|(cuda|cu[A-Z]|nccl)\w*)$"
)


def function_name(name: pl.Expr) -> pl.Expr:
    """A native symbol's function, qualified, without return type, arguments or template
    arguments: ``cudaError cudaMalloc<double>(double**, unsigned long)`` -> ``cudaMalloc``,
    ``_IO_fopen@@GLIBC_2`` -> ``_IO_fopen``."""
    bare = name.str.replace(r"@.*$", "")
    for _ in range(4):  # nested arguments and template arguments, innermost first
        bare = bare.str.replace_all(r"\([^()]*\)", "").str.replace_all(r"<[^<>]*>", "")
    # what is left of a symbol nsys cut short (unbalanced), and method qualifiers
    bare = bare.str.replace(r"[<(].*$", "").str.replace_all(
        r"(\s+(const|volatile|noexcept)|[>&\s])+$", ""
    )
    return bare.str.extract(r"(\S+)$")


def native_frames(chains: pl.DataFrame) -> pl.DataFrame:
    """The frames of native stacks (``Trace.callchains``: chain, depth, symbol, module) with
    their module's ``file``, ``function`` (:func:`function_name`), ``unresolved`` and ``user``
    (the user's own code), decided once per distinct (symbol, module)."""
    distinct = chains.select("symbol", "module").unique()
    base = pl.col("module").str.extract(r"([^/\\]+)$")
    distinct = distinct.with_columns(
        base.alias("file"),
        function_name(pl.col("symbol")).alias("function"),
        pl.col("symbol").fill_null("").str.contains(UNRESOLVED).alias("unresolved"),
    ).with_columns(
        (
            ~pl.col("unresolved")
            & ~pl.col("function").fill_null("").str.contains(NON_USER_FUNCTION)
            & ~base.fill_null("[").str.contains(NATIVE_LIBRARY)
            & ~pl.col("module").fill_null("").str.contains(INSTALLED)
        ).alias("user"),
    )
    return chains.select("chain", "depth", "symbol", "module").join(
        distinct, on=["symbol", "module"], how="left", nulls_equal=True
    )


def innermost_user(frames: pl.DataFrame) -> pl.DataFrame:
    """Per chain of :func:`native_frames`' rows: its innermost user frame (``u_depth``,
    ``file``, ``function``) and the resolved frame nearest beneath it (``callee``: the call it
    made; None where none is resolved). Chains without a user frame are left out."""
    inner = (
        frames.filter(pl.col("user"))
        .group_by("chain")
        .agg(pl.all().sort_by("depth").first())
        .select("chain", pl.col("depth").alias("u_depth"), "file", "function")
    )
    beneath = (
        frames.filter(~pl.col("unresolved"))
        .join(inner.select("chain", "u_depth"), on="chain")
        .filter(pl.col("depth") < pl.col("u_depth"))
        .group_by("chain")
        .agg(pl.col("function").sort_by("depth").last().alias("callee"))
    )
    return inner.join(beneath, on="chain", how="left")
