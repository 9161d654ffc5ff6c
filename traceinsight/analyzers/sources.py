"""Source attribution: which line of the user's code caused each sync, blocking copy,
DataLoader wait and launch.

With ``with_stack=True`` Kineto records ``python_function`` ranges nested on the host thread
(``train.py(259): step``; a frame carries its function's first line). For each costly host event
the *location* is the innermost enclosing frame that is the user's (not torch, another library,
the standard library or site-packages), and the *trigger* is the call right beneath it
(``<built-in method item of Tensor object>`` -> ``item``), else the outermost op beneath it
(``aten::is_nonzero`` for a tensor-valued ``if``). Nesting is by interval containment per
thread, so no ``Python id``/``Python parent id`` args are needed.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import polars as pl

from traceinsight.analyzers.context import (
    API_KINDS,
    BLOCKING_COPY_API,
    DATALOADER_PATTERN,
    HOST_OP_KINDS,
    LAUNCH_API,
    SYNC_API,
    Context,
)
from traceinsight.model import intervals as iv

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
    }
)
NON_USER = LIBRARIES | frozenset(sys.stdlib_module_names)
TOP_SOURCES = 10
STACK_HINT = (
    "record with with_stack=True (torch.profiler.profile(with_stack=True), or "
    "traceinsight.capture.capture(with_stack=True)) to see which line of your code causes each one"
)


@dataclass(frozen=True)
class SourcesResult:
    stacks_recorded: bool  # python_function frames present (with_stack=True)
    # by category (host_sync, blocking_copy, dataloader, launch): location, file, line,
    # function, trigger, count, cost_ns; most costly first
    by_category: dict[str, tuple[dict[str, Any], ...]]


CATEGORIES = ("host_sync", "blocking_copy", "dataloader", "launch")


def analyze_sources(ctx: Context) -> SourcesResult:
    frames = ctx.rows(("python_function",))
    if frames.height == 0:
        return SourcesResult(False, {c: () for c in CATEGORIES})
    lo, hi = ctx.window_start_ns, ctx.window_end_ns
    in_window = (pl.col("end_ns") > lo) & (pl.col("start_ns") < hi)
    syncs = ctx.sync_calls.filter(in_window)
    targets = pl.concat(
        [
            syncs.filter(pl.col("name").str.contains(SYNC_API)).with_columns(
                pl.lit("host_sync").alias("category")
            ),
            syncs.filter(pl.col("name").str.contains(BLOCKING_COPY_API)).with_columns(
                pl.lit("blocking_copy").alias("category")
            ),
            ctx.rows(HOST_OP_KINDS, DATALOADER_PATTERN)
            .filter(in_window)
            .with_columns(pl.lit("dataloader").alias("category")),
            ctx.rows(API_KINDS, LAUNCH_API)
            .filter(in_window)
            .with_columns(pl.lit("launch").alias("category")),
        ],
        how="diagonal_relaxed",
    ).select("category", "name", "start_ns", "end_ns", "dur_ns", "tid")
    targets = targets.with_row_index("target")
    located = _locate(targets, frames, ctx.ops)
    by_category = {}
    for cat in CATEGORIES:
        rows = (
            located.filter(pl.col("category") == cat)
            .group_by("location", "file", "line", "function", "trigger")
            .agg(pl.len().alias("count"), pl.col("dur_ns").sum().alias("cost_ns"))
            .sort(["cost_ns", "location", "trigger"], descending=[True, False, False])
            .head(TOP_SOURCES)
        )
        by_category[cat] = tuple(rows.iter_rows(named=True))
    return SourcesResult(True, by_category)


def _user_frames(frames: pl.DataFrame) -> pl.DataFrame:
    """The frames of files outside the libraries, with file, line and function parsed; decided
    once per distinct name."""
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


def _trigger_name() -> pl.Expr:
    """The method or function a frame calls: ``item`` of ``<built-in method item of ...>``,
    ``synchronize`` of ``torch/cuda/__init__.py(..): synchronize``, ``Linear`` of a module."""
    n = pl.col("t_name")
    return pl.coalesce(
        n.str.extract(r"^<built-in (?:method|function) (\w+)"),
        n.str.extract(r"\(\d+\): (.+)$"),
        n.str.extract(r"^nn\.Module: (\w+?)(?:_\d+)?$"),
        n,
    )


def _locate(targets: pl.DataFrame, frames: pl.DataFrame, ops: pl.DataFrame) -> pl.DataFrame:
    """Each target with its innermost user frame (location) and trigger; targets with no user
    frame around them are left out."""
    cols = ["target", "start_ns", "end_ns", "tid"]
    user = _user_frames(frames).select(
        pl.col("start_ns").alias("u_s"),
        pl.col("end_ns").alias("u_e"),
        pl.col("tid").alias("u_tid"),
        pl.col("name").alias("location"),
        "file",
        "line",
        pl.col("func").alias("function"),
    )
    inner = iv.containing(
        targets.select(cols),
        user,
        inner_start="start_ns",
        inner_end="end_ns",
        outer_start="u_s",
        outer_end="u_e",
        same=("u_tid", "tid"),
    )
    loc = inner.sort("target", "u_s").unique("target", keep="last").drop("u_tid", "u_e")
    if loc.height == 0:
        return (
            targets.head(0)
            .with_columns(
                pl.lit(None, pl.String).alias(c)
                for c in ("location", "file", "function", "trigger")
            )
            .with_columns(pl.lit(None, pl.Int64).alias("line"))
        )
    beneath = loc.select(cols + ["u_s"])

    def below(rows: pl.DataFrame, name: str) -> pl.DataFrame:
        """The outermost of ``rows`` that starts inside the user frame and holds the target."""
        hits = iv.containing(
            beneath,
            rows.select(
                pl.col("start_ns").alias("t_s"),
                pl.col("end_ns").alias("t_e"),
                pl.col("tid").alias("t_tid"),
                pl.col("name").alias("t_name"),
            ),
            inner_start="start_ns",
            inner_end="end_ns",
            outer_start="t_s",
            outer_end="t_e",
            same=("t_tid", "tid"),
        ).filter(pl.col("t_s") > pl.col("u_s"))
        return (
            hits.sort("target", "t_s", pl.col("t_e"), descending=[False, False, True])
            .unique("target", keep="first")
            .select("target", _trigger_name().alias(name))
        )

    call = below(frames, "_call")
    op = below(ops, "_op").with_columns(pl.col("_op").str.replace(r"^aten::", ""))
    return (
        targets.join(loc.select("target", "location", "file", "line", "function"), on="target")
        .join(call, on="target", how="left")
        .join(op, on="target", how="left")
        .with_columns(pl.coalesce("_call", "_op", "name").alias("trigger"))
        .drop("_call", "_op")
    )


def user_frames(frames: pl.DataFrame) -> pl.DataFrame:
    """The ``python_function`` rows of the user's own files (see :func:`_user_frames`)."""
    return _user_frames(frames)
