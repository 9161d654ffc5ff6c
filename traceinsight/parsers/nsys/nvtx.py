"""NVTX ranges: names (inline or registered strings), emit_nvtx decorations, NCCL's domain."""

from __future__ import annotations

import polars as pl

from traceinsight.parsers.nsys.db import Db, Rows
from traceinsight.parsers.nsys.tables import HOST_COLS, HOST_SCHEMA, keep_rows, pick

NVTX_RANGE_TYPES = (59, 60)  # PushPopRange, StartEndRange
NVTX_DOMAIN_CREATE = 75
# SQL transport only (see nvtx_query): a registered string's id rides in the text column
# behind this marker; decode() turns it into the real ``text_id`` column.
REGISTERED = "\x01"


def nvtx_query(db: Db, strings: pl.DataFrame) -> Rows | None:
    """The NVTX ranges and domain names, or None when the export has no NVTX table."""
    nt = db.table("NVTX_EVENTS")
    if not nt:
        return None
    cols = db.columns(nt)
    dom = pick(cols, "domainId")
    text_id = pick(cols, "textId")
    ranges_and_domains = ("eventType", (*NVTX_RANGE_TYPES, NVTX_DOMAIN_CREATE))
    # Through SQL, in as few columns as possible: each integer column costs ADBC about as much
    # as SQLite's whole row step. A registered string's id rides in the text column
    # (REGISTERED + id; the text is NULL on those rows) and the event type in the domain column
    # (DomainCreate rows get -1 - domainId): 20% less time on the NVTX scan than four columns.
    # The page reader reads the raw columns for about what one costs (decode takes either).
    packed_text = f"char({ord(REGISTERED)}) || {text_id}" if text_id != "NULL" else "NULL"
    return db.query(
        [
            *HOST_COLS,
            f"ifnull(text, {packed_text})",
            f"CASE eventType WHEN {NVTX_DOMAIN_CREATE} THEN -1 - ifnull({dom}, 0) ELSE {dom} END",
        ],
        nt,
        {**HOST_SCHEMA, "name": pl.String, "packed_domain": pl.Int64},
        keep_in=ranges_and_domains,
        # the page reader's names come stripped (once per distinct text); SQL's are not
        to_events=lambda df: nvtx_rows(
            decode(df), strings, stripped="packed_domain" not in df.columns
        ),
        text_map={"name": stripped_names},
        plain=(
            [*HOST_COLS, "text", text_id, "eventType", dom],
            {
                **HOST_SCHEMA,
                "name": pl.String,
                "text_id": pl.Int64,
                "event_type": pl.Int64,
                "domain_id": pl.Int64,
            },
        ),
    )


# torch.autograd.profiler.emit_nvtx decorates each op's range: "aten::mul, seq = 7, op_id = 12,
# sizes = [[8, 4]], input_op_ids = [...]". The op is the part before; keeping the counters would
# make every range's name unique (millions of distinct names) and unlike Kineto's.
EMIT_NVTX_DECORATION = r", (?:seq|op_id|sizes|input_op_ids|stashed seq) = "


# str.find gives a byte offset before polars 2.2 and a character offset from it (a fresh
# install took 2.2 and cut "ünïcode op" to "ünïcode "): asked once which it is
_FIND_IN_CHARS = pl.select(pl.lit("\u00fc,").str.find(",")).item() == 1


def strip_emit_nvtx(name: pl.Expr) -> pl.Expr:
    """``name`` up to its first emit_nvtx decoration, cut where the search says: by characters
    or, where it gives a byte offset, by bytes (at an ASCII comma: still valid UTF-8); half the
    cost of a regex replace that rewrites every one of millions of names."""
    cut = name.str.find(EMIT_NVTX_DECORATION).fill_null(1 << 32)
    if _FIND_IN_CHARS:
        return name.str.head(cut)
    return name.cast(pl.Binary).bin.head(cut).cast(pl.String)


def stripped_names(names: pl.Series) -> pl.Series:
    """:func:`strip_emit_nvtx` of a column of names."""
    return names.to_frame().select(strip_emit_nvtx(pl.col(names.name))).to_series()


def decode(df: pl.DataFrame) -> pl.DataFrame:
    """Either fetch's columns as ``name``, ``text_id`` (the StringIds id of a registered
    string, where the row has no text of its own), ``domain_id`` and ``domain_create`` (the row
    is a DomainCreate event naming its domain; its id 0 where the export left it NULL)."""
    if "packed_domain" not in df.columns:  # the page reader's raw columns
        create = (pl.col("event_type") == NVTX_DOMAIN_CREATE).fill_null(False)
        return df.with_columns(
            pl.when(create).then(pl.col("domain_id").fill_null(0)).otherwise(pl.col("domain_id")),
            create.alias("domain_create"),
            pl.when(pl.col("name").is_null()).then(pl.col("text_id")),
        ).drop("event_type")
    # SQL's packing undone. Only the few marked rows' names are touched: rebuilding a column
    # of millions of names cost 0.3 s per 4M ranges.
    packed = pl.col("packed_domain")
    df = df.with_columns(
        pl.when(packed < 0).then(-1 - packed).otherwise(packed).alias("domain_id"),
        (packed < 0).fill_null(False).alias("domain_create"),
        pl.lit(None, pl.Int64).alias("text_id"),
    ).drop("packed_domain")
    name = df.get_column("name")
    marked = name.str.starts_with(REGISTERED).fill_null(False).arg_true()
    if marked.len() == 0:
        return df
    ids = name.gather(marked).str.slice(1).cast(pl.Int64, strict=False)
    # A text of its own that merely starts with the marker (no id after it) stays as it is.
    hit = marked.filter(ids.is_not_null())
    if hit.len() == 0:
        return df
    return df.with_columns(
        name.scatter(hit, None), df.get_column("text_id").scatter(hit, ids.drop_nulls())
    )


def registered_names(
    df: pl.DataFrame, strings: pl.DataFrame, *, stripped: bool = False
) -> pl.DataFrame:
    """``name`` from StringIds where the row carries a ``text_id`` (looked up only for those;
    ``stripped``: those stripped as the other names were)."""
    need = df.get_column("text_id").is_not_null().arg_true()
    if need.len() == 0:
        return df.drop("text_id")
    ids = df.get_column("text_id").gather(need).alias("sid").to_frame()
    found = ids.join(strings, on="sid", how="left", maintain_order="left").get_column("svalue")
    if stripped:
        found = stripped_names(found)
    return df.with_columns(df.get_column("name").scatter(need, found)).drop("text_id")


def nvtx_rows(df: pl.DataFrame, strings: pl.DataFrame, *, stripped: bool = False) -> pl.DataFrame:
    """The ranges as event rows; ``stripped``: their names are already (:func:`stripped_names`)."""
    df = registered_names(df, strings, stripped=stripped)
    df = keep_rows(df, pl.col("name").is_not_null()).with_columns(
        pl.lit("user_annotation").alias("kind")
    )
    if not stripped:
        df = df.with_columns(strip_emit_nvtx(pl.col("name")))
    return pyprof_names(df)


# DLProf / apex.pyprof mark ranges with a Python dict's repr: "{'traceMarker': ['net.py:41',
# ...], 'funcStack': '/<module>/Net::forward/conv2d'}" for the calling frames, or "{'mod':
# 'torch.nn.functional', 'op': 'conv2d', 'args': [...]}" for the op.
PYPROF_PREFIX = "{'"
_FUNC_STACK = r"'funcStack': '([^']*)'"
_INNERMOST = r"([^/]+)/*$"
_MOD = r"'mod': '([^']*)'"
_OP = r"'op': '([^']*)'"
_TRACE_MARKER = r"'traceMarker': \[\s*'([^']*)'"


def pyprof_names(df: pl.DataFrame) -> pl.DataFrame:
    """DLProf/pyprof payloads named by what they mark: the innermost frame of ``funcStack``,
    else ``mod.op``, else ``op``, else the first ``traceMarker`` (file:line); a payload with none
    of them stays as written. Only the payload rows are touched (they are few)."""
    name = df.get_column("name")
    rows = name.str.starts_with(PYPROF_PREFIX).fill_null(False).arg_true()
    if rows.len() == 0:
        return df
    text = pl.col("name")
    mod, op = text.str.extract(_MOD), text.str.extract(_OP)
    parsed = (
        name.gather(rows)
        .to_frame()
        .select(
            pl.coalesce(
                text.str.extract(_FUNC_STACK).str.extract(_INNERMOST),
                pl.when(mod.is_not_null() & op.is_not_null()).then(pl.format("{}.{}", mod, op)),
                op,
                text.str.extract(_TRACE_MARKER),
                text,
            )
        )
        .to_series()
    )
    return df.with_columns(name.scatter(rows, parsed))


def nccl_domain(nvtx: pl.DataFrame) -> pl.DataFrame:
    """The NVTX ranges, those of NCCL's own domain (NCCL >= 2.8.3) named ``nccl:<range>`` so
    collectives are recognized. Domain-creation rows name the domains."""
    domains = nvtx.filter(
        pl.col("domain_create")
    )  # a handful of rows: only those have their names compared
    nccl = (
        domains.filter(pl.col("name").str.to_uppercase() == "NCCL").get_column("domain_id").unique()
    )
    df = keep_rows(nvtx, ~pl.col("domain_create")).drop("domain_create")
    if nccl.len() == 0:
        return df.drop("domain_id")
    return df.with_columns(
        pl.when(pl.col("domain_id").is_in(nccl.implode()))
        .then(pl.format("nccl:{}", pl.col("name")))
        .otherwise(pl.col("name"))
        .alias("name")
    ).drop("domain_id")
