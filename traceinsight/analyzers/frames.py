"""Which Python frames are the user's own: a frame's file outside the libraries, the standard
library and site-packages (the sources' locations, the model's caller, idle's named frames)."""

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
