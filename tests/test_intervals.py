import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st

from traceinsight.model import intervals as iv


def frame(pairs):
    return pl.DataFrame(
        {"start_ns": [a for a, _ in pairs], "end_ns": [b for _, b in pairs]},
        schema={"start_ns": pl.Int64, "end_ns": pl.Int64},
    )


def cover(pairs):
    pts = set()
    for a, b in pairs:
        pts.update(range(a, b))
    return pts


def as_points(df):
    return cover(list(zip(df["start_ns"].to_list(), df["end_ns"].to_list(), strict=True)))


def test_union_gaps_intersect_subtract_by_hand():
    u = iv.union(frame([(0, 10), (5, 12), (20, 25), (30, 40)]))
    assert u.rows() == [(0, 12), (20, 25), (30, 40)]
    b = iv.union(frame([(8, 21), (22, 35)]))
    assert iv.intersect(u, b).rows() == [(8, 12), (20, 21), (22, 25), (30, 35)]
    assert iv.subtract(u, b).rows() == [(0, 8), (21, 22), (35, 40)]
    assert iv.gaps(u, 0, 50).rows() == [(12, 20), (25, 30), (40, 50)]
    assert iv.overlap_with(frame([(8, 21), (22, 35)]), u).to_list() == [5, 8]
    assert iv.total(u) == 27


def test_union_touching_and_grouped():
    df = frame([(0, 5), (5, 9), (1, 2)]).with_columns(pl.Series("device", [0, 0, 1]))
    u = iv.union(df, by=["device"])
    assert u.sort("device").rows() == [(0, 0, 9), (1, 1, 2)]


intervals = st.lists(
    st.tuples(st.integers(0, 60), st.integers(1, 15)).map(lambda t: (t[0], t[0] + t[1])),
    max_size=12,
)


@settings(max_examples=200, deadline=None)
@given(intervals, intervals)
def test_algebra_matches_brute_force(a, b):
    ua, ub = iv.union(frame(a)), iv.union(frame(b))
    assert as_points(ua) == cover(a)
    assert as_points(iv.intersect(ua, ub)) == cover(a) & cover(b)
    assert as_points(iv.subtract(ua, ub)) == cover(a) - cover(b)
    if a:
        assert as_points(iv.gaps(ua, 0, 80)) == set(range(0, 80)) - cover(a)
    if b and a:
        got = iv.overlap_with(frame(b), ua).to_list()
        assert got == [len(cover([p]) & cover(a)) for p in b]


tagged = st.lists(st.tuples(st.integers(0, 2), st.integers(0, 60), st.integers(0, 15)), max_size=20)


def tagged_frame(rows, tag="device"):
    return pl.DataFrame(
        {
            tag: [g for g, _, _ in rows],
            "start_ns": [s for _, s, _ in rows],
            "end_ns": [s + d for _, s, d in rows],
        },
        schema={tag: pl.Int32, "start_ns": pl.Int64, "end_ns": pl.Int64},
    )


@settings(max_examples=200, deadline=None)
@given(tagged)
def test_grouped_union_matches_per_group_brute_force(rows):
    u = iv.union(tagged_frame(rows), by=["device"])
    assert u.rows() == sorted(u.rows())  # ordered by group, then start
    for g in range(3):
        mine = u.filter(pl.col("device") == g)
        spans = [(s, s + d) for dev, s, d in rows if dev == g]
        assert as_points(mine) == cover(spans)
        # disjoint and not touching: a union has no two intervals that should have merged
        ends = mine["end_ns"].to_list()
        assert all(a < b for a, b in zip(ends, mine["start_ns"].to_list()[1:], strict=False))


@settings(max_examples=200, deadline=None)
@given(tagged, tagged)
def test_containing_matches_brute_force(inner_rows, outer_rows):
    inner = tagged_frame(inner_rows, "tid").with_row_index("i")
    outer = (
        tagged_frame(outer_rows, "o_tid")
        .rename({"start_ns": "o_s", "end_ns": "o_e"})
        .with_row_index("o")
    )
    got = iv.containing(
        inner,
        outer,
        inner_start="start_ns",
        inner_end="end_ns",
        outer_start="o_s",
        outer_end="o_e",
        same=("o_tid", "tid"),
    )
    want = {
        (i, o)
        for i, (t, s, d) in enumerate(inner_rows)
        for o, (ot, os_, od) in enumerate(outer_rows)
        if t == ot and os_ <= s and os_ + od >= s + d
    }
    assert set(zip(got["i"].to_list(), got["o"].to_list(), strict=True)) == want


@settings(max_examples=200, deadline=None)
@given(tagged, intervals)
def test_overlap_with_points_in_sorted_runs_matches_brute_force(rows, b):
    """Gaps of several devices, one device after another: each device's points are in order
    but the whole column is not (the run-by-run path); plus the same points shuffled."""
    points = iv.gaps(iv.union(tagged_frame(rows), by=["device"]), 0, 80, by=["device"])
    u = iv.union(frame(b))
    want = [
        len(cover([(s, e)]) & cover(b))
        for s, e in zip(points["start_ns"], points["end_ns"], strict=True)
    ]
    shuffled = points.sample(fraction=1.0, shuffle=True, seed=3) if points.height else points
    want_shuffled = [
        len(cover([(s, e)]) & cover(b))
        for s, e in zip(shuffled["start_ns"], shuffled["end_ns"], strict=True)
    ]
    for _ in overlap_paths():
        assert iv.overlap_with(points, u).to_list() == want
        assert iv.overlap_with(shuffled, u).to_list() == want_shuffled


def overlap_paths():
    """Run the caller's loop body with the C sweep (kreplay.c, where built), then polars."""
    native = iv._kreplay
    try:
        for path in ([native] if native is not None else []) + [None]:
            iv._kreplay = path
            yield path
    finally:
        iv._kreplay = native


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(-5, 90), st.integers(-5, 90)), max_size=40),
    intervals,
)
def test_overlap_with_any_points_is_the_same_on_both_paths(pairs, b):
    """Points in any order, empty and backwards ones (end before start) included: the C sweep
    gives the polars arithmetic exactly (the union's coverage up to the end less up to the
    start)."""
    points = frame(pairs)
    u = iv.union(frame(b))
    got = [iv.overlap_with(points, u).to_list() for _ in overlap_paths()]
    assert all(g == got[-1] for g in got)
    want = [len(cover([(s, e)]) & cover(b)) for s, e in pairs if e >= s]
    assert [g for g, (s, e) in zip(got[-1], pairs, strict=True) if e >= s] == want


def test_overlap_with_nulls_is_left_to_polars():
    points = frame([(1, 5), (2, 8)]).with_columns(pl.Series("end_ns", [5, None], dtype=pl.Int64))
    u = iv.union(frame([(0, 3), (4, 10)]))
    got = [iv.overlap_with(points, u).to_list() for _ in overlap_paths()]
    assert all(g == got[-1] for g in got) and got[-1][0] == 3


@settings(max_examples=300, deadline=None)
@given(tagged)
def test_parents_are_the_last_listed_range_holding_each(rows):
    """Nesting (sources' NVTX places): for rows in (tid, start, end descending) order, each
    row's parent is the last row before it on its thread whose closed range holds it; the C
    stack sweep and the containing join agree with brute force, duplicates and partial overlaps
    included."""
    df = tagged_frame(rows, tag="tid").sort(
        "tid", "start_ns", "end_ns", descending=[False, False, True], maintain_order=True
    )
    t, s, e = (df.get_column(c).to_list() for c in ("tid", "start_ns", "end_ns"))
    want = [
        max(
            (j for j in range(i) if t[j] == t[i] and s[j] <= s[i] and e[j] >= e[i]),
            default=None,
        )
        for i in range(df.height)
    ]
    for _ in overlap_paths():
        assert iv.parents(df, tid="tid", start="start_ns", end="end_ns").to_list() == want


def test_parents_out_of_order_are_left_to_the_join():
    df = frame([(0, 10), (2, 5), (1, 8)]).with_columns(pl.lit(1).alias("tid"))  # starts 0, 2, 1
    got = [
        iv.parents(df, tid="tid", start="start_ns", end="end_ns").to_list() for _ in overlap_paths()
    ]
    assert all(g == [None, 0, 0] for g in got)


def test_overlap_with_many_runs_sorts_once():
    # more runs than MAX_SORTED_RUNS: the sort path, same answer
    n = iv.MAX_SORTED_RUNS + 5
    points = frame([(10 * (n - i), 10 * (n - i) + 4) for i in range(n)])
    u = iv.union(frame([(0, 10 * n + 10)]))
    for _ in overlap_paths():
        assert iv.overlap_with(points, u).to_list() == [4] * n


@settings(max_examples=200, deadline=None)
@given(tagged, tagged)
def test_overlap_by_equals_the_grouped_intersection(a_rows, b_rows):
    a, b = (
        iv.union(tagged_frame(a_rows), by=["device"]),
        iv.union(tagged_frame(b_rows), by=["device"]),
    )
    both = iv.intersect(a, b, by=["device"])
    want = {g: iv.total(both.filter(pl.col("device") == g)) for g in a["device"].unique().to_list()}
    assert iv.overlap_by(a, b, "device") == want


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from([None, 0, 1, 2]), st.sampled_from([None, 0, 1])), max_size=7)
)
def test_in_order_and_sort_keys_match_a_stable_sort(rows):
    df = pl.DataFrame(
        {"a": [r[0] for r in rows], "b": [r[1] for r in rows], "i": list(range(len(rows)))},
        schema={"a": pl.Int64, "b": pl.Int64, "i": pl.Int64},
    )
    for keys in (["a"], ["a", "b"], ["b", "a"]):
        want = df.sort(keys, nulls_last=False, maintain_order=True)
        assert iv.in_order(df, keys) == df.equals(want)
        assert iv.sort_keys(df, keys).equals(want)
