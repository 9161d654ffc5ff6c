"""Regenerate tests/data/kernel_names.tsv from the real-trace corpus (run once, by hand).

Every distinct kernel name of every corpus trace and H200 fixture, classified by the current
rule table; kept: up to 3 names per (GPU generation, rule, fp32) and every name whose class
differs from the `cls` column (the committed list was made with `cls` from the table of
commit 3790b52, so it holds every name that table classed differently). The expected classes were then reviewed by hand.
Usage: PYTHONPATH=. python tests/data/make_kernel_names.py ../shared/traces
"""

import glob
import sys
from pathlib import Path

import polars as pl

from traceinsight.api import load_events
from traceinsight.model.classify import KERNEL_RULES, classify_names, is_fp32_math

CORPUS = sys.argv[1].rstrip("/")
ROOT = Path(__file__).resolve().parents[2]

rows = []
files = [
    f
    for f in glob.glob(CORPUS + "/**/*", recursive=True)
    if (".json" in f or f.endswith(".sqlite"))
    and "execution_trace" not in f
    and "memory" not in f
    and "gpu_metrics" not in f
]
files += glob.glob(str(ROOT) + "/fixtures/h200/**/*.json.gz", recursive=True)
for f in sorted(files):
    try:
        t = load_events(f)
    except Exception as e:
        print("ERR", f, type(e).__name__, file=sys.stderr)
        continue
    k = t.events.filter(pl.col("kind") == "kernel")
    if k.height == 0:
        continue
    dev = ";".join(sorted({d.name or "" for d in t.meta.devices}))
    g = k.group_by("name").agg(pl.len().alias("n"), pl.col("dur_ns").sum().alias("ns"))
    g = g.with_columns(
        cls=classify_names(g["name"]).cast(pl.String),
        src=pl.lit(f.replace(CORPUS + "/", "").replace(str(ROOT) + "/", "")),
        dev=pl.lit(dev),
    )
    rows.append(g)
df = pl.concat(rows)

# --- curation


def gen(d):
    d = d or ""
    for k, v in [
        ("V100", "volta"),
        ("GP100", "pascal"),
        ("2080", "turing"),
        ("RTX 6000", "turing"),
        ("A100", "ampere"),
        ("3080", "ampere"),
        ("4070", "ada"),
        ("H100", "hopper"),
        ("H200", "hopper"),
        ("B200", "blackwell"),
        ("MI", "cdna"),
        ("AMD Radeon", "cdna"),
    ]:
        if k in d:
            return v
    return None


df = df.with_columns(gen=pl.col("dev").map_elements(gen, return_dtype=pl.String))
# traces without device properties: the 2021 plugin samples are the V100 ResNet runs (same kernels as worker0.* which names Tesla V100)
df = df.with_columns(
    gen=pl.when(pl.col("gen").is_null() & pl.col("src").str.contains("resnet50"))
    .then(pl.lit("volta"))
    .otherwise("gen")
)
df = df.with_columns(
    pl.col("gen").fill_null("unknown")
)  # no device properties (e.g. the DLRM ranks)
df = df.with_columns(new=classify_names(df["name"]).cast(pl.String), fp32=is_fp32_math(df["name"]))
# the rule that fires: first matching row
lower = df["name"].str.to_lowercase()
rule = pl.Series([None] * df.height, dtype=pl.String)
for r in reversed(KERNEL_RULES):
    rule = pl.select(
        pl.when(lower.str.contains(r.pattern)).then(pl.lit(r.rule)).otherwise(rule)
    ).to_series()
df = df.with_columns(rule=rule.fill_null("none"))
df = df.sort("ns", descending=True).unique(["name"], keep="first", maintain_order=True)
changed = df.filter(pl.col("new") != pl.col("cls"))
pick = df.group_by("gen", "rule", "fp32", maintain_order=True).head(3)
out = (
    pl.concat([pick.select(df.columns), changed])
    .unique("name", maintain_order=True)
    .sort("gen", "rule", "name")
)
out = out.select(
    "name",
    pl.col("new").alias("expected_class"),
    (pl.col("fp32") & pl.col("new").is_in(["gemm", "conv", "attention"]))
    .cast(pl.Int8)
    .alias("fp32_math"),
    "rule",
    pl.col("src").alias("source"),
    pl.col("gen").alias("generation"),
)
print(out.height, out.group_by("generation").len().sort("generation"))
out.write_csv(Path(__file__).with_name("kernel_names.tsv"), separator="\t")
