"""Interval algebra on polars frames of [start_ns, end_ns) intervals, vectorized.

Every function takes and returns frames with int64 ``start_ns``/``end_ns`` columns, optionally
partitioned by ``by`` columns (device, rank, ...). A union is a set of disjoint, sorted intervals.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import polars as pl

from traceinsight.native import ArrowTable, int64_streams
from traceinsight.native import kreplay as _kreplay  # None: overlap_with in polars alone

S, E = "start_ns", "end_ns"
MAX_SORTED_RUNS = 64  # overlap_with: beyond this many sorted runs, one sort is cheaper


def in_order(df: pl.DataFrame, keys: Sequence[str]) -> bool:
    """Whether ``df`` is already sorted by ``keys`` (ascending, nulls first): one vectorized
    pass, much cheaper than the sorts it saves (unions come out in this order)."""
    if df.height < 2:
        return True
    ok: pl.Expr = pl.lit(True)
    for col in reversed(keys):
        k, prev = pl.col(col), pl.col(col).shift(1)
        greater = (k > prev).fill_null(False) | (prev.is_null() & k.is_not_null())
        ok = greater | (k.eq_missing(prev) & ok)
    return bool(df.select(ok.slice(1).all()).item())


def sort_keys(df: pl.DataFrame, keys: Sequence[str]) -> pl.DataFrame:
    """``df`` sorted by ``keys`` (ascending, nulls first), as one stable sort per key from the
    last: polars' multi-key sort encodes every row first and takes 2-3x longer."""
    if in_order(df, keys):
        return df
    out = df
    for i, col in enumerate(reversed(keys)):
        out = out.sort(col, maintain_order=i > 0)
    return out


def union(df: pl.DataFrame | pl.LazyFrame, by: Sequence[str] = ()) -> pl.DataFrame:
    """Merge overlapping or touching intervals (per group)."""
    by = list(by)
    rows = df.lazy().select([*by, S, E]).filter(pl.col(E) > pl.col(S)).collect()
    # A merged interval starts where the start exceeds the furthest end reached so far (in its
    # group) and ends at that reach on the row before the next one starts.
    reach = pl.col(E).cum_max()
    prev = pl.col("_reach").shift(1)
    if by:
        reach, prev = reach.over(by), prev.over(by)
    rows = sort_keys(rows, [*by, S]).with_columns(reach.alias("_reach"))
    rows = rows.with_columns((pl.col(S) > prev).fill_null(True).alias("_new"))
    starts = rows.filter(pl.col("_new")).select([*by, S])
    ends = rows.filter(pl.col("_new").shift(-1).fill_null(True)).get_column("_reach").alias(E)
    return starts.with_columns(ends)


def overlapping(lo: int, hi: int) -> pl.Expr:
    """Intervals (start_ns, end_ns) that overlap [lo, hi): a host range that began before a
    window and runs into it counts (it starts before the work it launches)."""
    return (pl.col(E) > lo) & (pl.col(S) < hi)


def total(df: pl.DataFrame) -> int:
    """Total length of a union (assumes disjoint intervals)."""
    if df.height == 0:
        return 0
    return int((df[E] - df[S]).sum())


def clip(df: pl.DataFrame, lo: int, hi: int, *, keep_points: pl.Expr | None = None) -> pl.DataFrame:
    """Clip intervals to [lo, hi) and drop the empty ones; with ``keep_points``, keep the
    zero-length rows inside [lo, hi] where it holds (kernels under a microsecond in traces
    timed in whole microseconds: real launches, which counts need and unions ignore)."""
    if keep_points is not None:
        # (a point at hi too: a window ending with its last kernel ends where that one does)
        point = (pl.col(E) == pl.col(S)) & pl.col(S).is_between(lo, hi) & keep_points
        inside = (pl.col(E) > pl.col(S)) & overlapping(lo, hi)
        return df.filter(inside | point).with_columns(
            pl.col(S).clip(lo, hi), pl.col(E).clip(lo, hi)
        )
    return df.with_columns(pl.col(S).clip(lo, hi), pl.col(E).clip(lo, hi)).filter(
        pl.col(E) > pl.col(S)
    )


def gaps(
    u: pl.DataFrame, lo: int | None = None, hi: int | None = None, by: Sequence[str] = ()
) -> pl.DataFrame:
    """The complement of a union inside its own extent (or [lo, hi) when given), per group."""
    by = list(by)
    prev_end = pl.col(E).shift(1)
    if by:
        prev_end = prev_end.over(by)
    inner = (
        sort_keys(u, [*by, S])
        .with_columns(prev_end.alias("_prev_end"))
        .filter(pl.col("_prev_end").is_not_null() & (pl.col(S) > pl.col("_prev_end")))
        .select([*by, pl.col("_prev_end").alias(S), pl.col(S).alias(E)])
    )
    parts = [inner]
    if lo is not None and u.height:
        first = u.group_by(by).agg(pl.col(S).min()) if by else u.select(pl.col(S).min())
        parts.append(
            first.filter(pl.col(S) > lo).select(
                [*by, pl.lit(lo, pl.Int64).alias(S), pl.col(S).alias(E)]
            )
        )
    if hi is not None and u.height:
        last = u.group_by(by).agg(pl.col(E).max()) if by else u.select(pl.col(E).max())
        parts.append(
            last.filter(pl.col(E) < hi).select(
                [*by, pl.col(E).alias(S), pl.lit(hi, pl.Int64).alias(E)]
            )
        )
    if lo is not None and hi is not None and u.height == 0 and not by and hi > lo:
        parts.append(pl.DataFrame({S: [lo], E: [hi]}, schema={S: pl.Int64, E: pl.Int64}))
    out = pl.concat([p.select([*by, S, E]).cast({S: pl.Int64, E: pl.Int64}) for p in parts])
    return sort_keys(out, [*by, S])


def intersect(a: pl.DataFrame, b: pl.DataFrame, by: Sequence[str] = ()) -> pl.DataFrame:
    """Intersection of two unions (each disjoint and sorted), per group.

    Sweep over the sorted boundary points of both sets: a point is inside the result while the
    coverage count from both sets is 2.
    """
    by = list(by)
    pts = pl.concat(
        [
            a.select([*by, pl.col(S).alias("t"), pl.lit(1, pl.Int32).alias("d")]),
            a.select([*by, pl.col(E).alias("t"), pl.lit(-1, pl.Int32).alias("d")]),
            b.select([*by, pl.col(S).alias("t"), pl.lit(1, pl.Int32).alias("d")]),
            b.select([*by, pl.col(E).alias("t"), pl.lit(-1, pl.Int32).alias("d")]),
        ]
    )
    if pts.height == 0:
        return pl.DataFrame(schema={**{c: a.schema[c] for c in by}, S: pl.Int64, E: pl.Int64})
    # Ends sort before starts at the same instant so touching intervals do not intersect.
    pts = sort_keys(pts, [*by, "t", "d"])
    cov = pl.col("d").cum_sum()
    nxt = pl.col("t").shift(-1)
    if by:
        cov = cov.over(by)
        nxt = nxt.over(by)
    return (
        pts.with_columns(cov.alias("_cov"), nxt.alias("_next"))
        .filter(
            (pl.col("_cov") == 2) & pl.col("_next").is_not_null() & (pl.col("_next") > pl.col("t"))
        )
        .select([*by, pl.col("t").alias(S), pl.col("_next").alias(E)])
        .pipe(lambda d: union(d, by))
    )


def _edges(df: pl.DataFrame, by: list[str], col: str, da: int, db: int) -> pl.DataFrame:
    """One sweep point per row at ``col``: coverage of a changes by ``da``, of b by ``db``."""
    return df.select(
        [
            *by,
            pl.col(col).alias("t"),
            pl.lit(da, pl.Int32).alias("da"),
            pl.lit(db, pl.Int32).alias("db"),
        ]
    )


def subtract(a: pl.DataFrame, b: pl.DataFrame, by: Sequence[str] = ()) -> pl.DataFrame:
    """a minus b, both unions, per group."""
    by = list(by)
    pts = pl.concat(
        [
            _edges(a, by, S, 1, 0),
            _edges(a, by, E, -1, 0),
            _edges(b, by, S, 0, 1),
            _edges(b, by, E, 0, -1),
        ]
    )
    if pts.height == 0:
        return pl.DataFrame(schema={**{c: a.schema[c] for c in by}, S: pl.Int64, E: pl.Int64})
    pts = sort_keys(
        pts.group_by([*by, "t"]).agg(pl.col("da").sum(), pl.col("db").sum()), [*by, "t"]
    )
    ca, cb, nxt = pl.col("da").cum_sum(), pl.col("db").cum_sum(), pl.col("t").shift(-1)
    if by:
        ca, cb, nxt = ca.over(by), cb.over(by), nxt.over(by)
    return (
        pts.with_columns(ca.alias("_a"), cb.alias("_b"), nxt.alias("_next"))
        .filter((pl.col("_a") > 0) & (pl.col("_b") <= 0) & pl.col("_next").is_not_null())
        .select([*by, pl.col("t").alias(S), pl.col("_next").alias(E)])
        .pipe(lambda d: union(d, by))
    )


def overlap_with(points: pl.DataFrame, u: pl.DataFrame) -> pl.Series:
    """For each interval in ``points`` (any), the length covered by union ``u`` (sorted, disjoint).

    Prefix sums of the union's lengths plus, per end point, the last union interval starting at
    or before it (a backward as-of join: a merge of two sorted columns, 5x cheaper than a binary
    search per point on a million gaps): O(n + m) for sorted points.
    """
    if u.height == 0 or points.height == 0:
        return pl.repeat(0, points.height, dtype=pl.Int64, eager=True).alias("overlap_ns")
    if _kreplay is not None:  # the same arithmetic in one pass (kreplay.c): 10-20x less CPU
        out = _kreplay.overlap(int64_streams(points[S], points[E]), int64_streams(u[S], u[E]))
        if out is not None:  # None: a null somewhere, decided below
            return pl.DataFrame(ArrowTable(out)).get_column("overlap_ns")
    length = u[E] - u[S]
    # per union interval: its bounds and the covered length of all intervals before it
    right = pl.DataFrame({"ls": u[S], "le": u[E], "full": length.cum_sum() - length}).with_columns(
        pl.col("ls").set_sorted()
    )

    def covered_until(t: pl.Series) -> pl.Series:
        ordered = t.is_sorted()
        if ordered:
            left = pl.DataFrame({"t": t}).with_columns(pl.col("t").set_sorted())
        else:
            left = pl.DataFrame({"t": t}).with_row_index("_i").sort("t")
        hit = left.join_asof(right, left_on="t", right_on="ls", strategy="backward")
        if not ordered:
            hit = hit.sort("_i")
        return hit.select(
            (
                pl.col("full") + (pl.min_horizontal("t", "le") - pl.col("ls")).clip(0, None)
            ).fill_null(0)
        ).to_series()

    def covered(t: pl.Series) -> pl.Series:
        # Points sorted within a few runs (gaps per device, one device after another) go run by
        # run: each is already in order, where sorting millions of points was most of the cost.
        if t.null_count() == 0 and not t.flags["SORTED_ASC"]:
            breaks = (t.diff() < 0).arg_true()
            if 0 < breaks.len() <= MAX_SORTED_RUNS:
                bounds = [0, *breaks.to_list(), t.len()]
                return pl.concat(
                    [covered_until(t.slice(a, b - a)) for a, b in itertools.pairwise(bounds)]
                )
        return covered_until(t)

    return (covered(points[E]) - covered(points[S])).alias("overlap_ns")


def without_points(ranges: pl.DataFrame, points: pl.Series, by: str, at: pl.Series) -> pl.DataFrame:
    """The rows of ``ranges`` (``by``, start_ns, end_ns, ...) with no point inside them on the
    same ``by`` value: ``at`` (point times) with ``points`` (their ``by`` values). One as-of
    join: the first point at or after each range's start, none before its end (a torch op that
    launched nothing: no launch or API call on its thread while it ran)."""
    first = pl.DataFrame({by: points.cast(ranges.schema[by]), "_at": at}).drop_nulls().sort("_at")
    hit = ranges.sort("start_ns").join_asof(
        first,
        left_on="start_ns",
        right_on="_at",
        by=by,
        strategy="forward",
        check_sortedness=False,  # both sorted by time: within each group too
    )
    return hit.filter(pl.col("_at").is_null() | (pl.col("_at") > pl.col("end_ns"))).drop("_at")


def in_time_order(df: pl.DataFrame, col: str) -> pl.DataFrame:
    """``df`` sorted by ``col``, flagged so as-of joins take it as it is; no sort when it is
    already in order (per-device gaps and launches usually are)."""
    return (
        df.with_columns(pl.col(col).set_sorted())
        if df.get_column(col).is_sorted()
        else df.sort(col)
    )


def overlap_by(a: pl.DataFrame, b: pl.DataFrame, by: str) -> dict[object, int]:
    """For each group of ``a`` (a union per ``by`` value), the length of its intersection with
    ``b``'s union of the same group: ``total(intersect(a, b, [by]))`` per group, by as-of joins
    of ``a``'s bounds into ``b`` instead of the sort of both sets' points an intersection needs
    (a few thousand copies or collectives against millions of compute intervals)."""
    out: dict[object, int] = {}
    for (key,), part in a.partition_by(by, as_dict=True, maintain_order=True).items():
        other = b.filter(pl.col(by).eq_missing(key))
        out[key] = int(overlap_with(part, other).sum()) if other.height else 0
    return out


def parents(df: pl.DataFrame, *, tid: str, start: str, end: str) -> pl.Series:
    """Each row's parent (``parent``: its row index, null if none): the last row before it with
    the same ``tid`` whose [start, end] holds it. ``df`` in (tid, start ascending, end
    descending) order. One stack sweep in C where ``_kreplay`` is built (kreplay.c ``parents``),
    else the containing pairs, the last listed kept."""
    if _kreplay is not None and df.height:
        out = _kreplay.parents(int64_streams(*(df.get_column(c) for c in (tid, start, end))))
        if out is not None:  # None: a null, or not in that order
            parent = pl.DataFrame(ArrowTable(out)).get_column("parent")
            return parent.set(parent < 0, None)  # type: ignore[arg-type]
    rows = df.select(
        pl.int_range(df.height, dtype=pl.Int64).alias("_i"),
        pl.col(tid).alias("_t"),
        pl.col(start).alias("_s"),
        pl.col(end).alias("_e"),
    )
    pairs = containing(
        rows,
        rows.select(
            pl.col("_i").alias("_o"),
            pl.col("_t").alias("_ot"),
            pl.col("_s").alias("_os"),
            pl.col("_e").alias("_oe"),
        ),
        inner_start="_s",
        inner_end="_e",
        outer_start="_os",
        outer_end="_oe",
        same=("_ot", "_t"),
    ).filter(pl.col("_o") < pl.col("_i"))
    last = pairs.group_by("_i").agg(pl.col("_o").max())
    return (
        rows.select("_i")
        .join(last, on="_i", how="left", maintain_order="left")
        .get_column("_o")
        .alias("parent")
    )


def _holds_a_start(starts: pl.Series, lo: pl.Series, hi: pl.Series) -> pl.Series:
    """Whether each range [lo, hi] holds one of ``starts`` (sorted, no nulls, at least one):
    the first start at or after lo is at most hi. Ranges in start order (a table's host ops)
    find it by a merge (an as-of join), a third of a binary search per range's time on 4M
    ranges; others by the search."""
    if lo.null_count() == 0 and lo.is_sorted():
        nxt = (
            lo.to_frame("_lo")
            .join_asof(starts.to_frame("_s"), left_on="_lo", right_on="_s", strategy="forward")
            .get_column("_s")
        )
        return nxt.is_not_null() & (nxt <= hi)
    first = starts.search_sorted(lo, side="left")
    return (first < starts.len()) & (starts.gather(first.clip(0, starts.len() - 1)) <= hi)


def containing(
    inner: pl.DataFrame,
    outer: pl.DataFrame,
    *,
    inner_start: str,
    inner_end: str,
    outer_start: str,
    outer_end: str,
    same: tuple[str, str] | None = None,
) -> pl.DataFrame:
    """Pairs (inner row, outer row) where the outer range contains the inner one.

    Only the two inequalities go to the join (an interval join whose output is the containing
    pairs, bounded by nesting depth); an equality such as "same thread" (``same``: the outer
    column, then the inner one) is applied afterwards, because inside ``join_where`` it becomes
    a hash join that pairs every row of a busy thread with every other before filtering.
    """
    starts = inner.get_column(inner_start).drop_nulls().sort()
    if starts.len() == 0:
        return inner.head(0).join(outer.head(0), how="cross")
    # Only outer rows that hold some inner start go to the join (its sorts dominate: a few
    # thousand sync calls against millions of host ops is the common shape). A sorted search
    # finds, for each outer row, the first inner start at or after its own start.
    holds = _holds_a_start(starts, outer.get_column(outer_start), outer.get_column(outer_end))
    reach = pl.lit(holds)
    if same is not None:
        reach = reach & pl.col(same[0]).is_in(inner.get_column(same[1]).unique().implode())
    outer = outer.filter(reach)
    pairs = inner.join_where(
        outer, pl.col(outer_start) <= pl.col(inner_start), pl.col(outer_end) >= pl.col(inner_end)
    )
    if same is not None:
        pairs = pairs.filter(pl.col(same[0]) == pl.col(same[1]))
    return pairs
