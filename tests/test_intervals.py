import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st

from traceinsight.model import intervals as iv


def frame(pairs):
    return pl.DataFrame({"start_ns": [a for a, _ in pairs], "end_ns": [b for _, b in pairs]}, schema={"start_ns": pl.Int64, "end_ns": pl.Int64})


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


intervals = st.lists(st.tuples(st.integers(0, 60), st.integers(1, 15)).map(lambda t: (t[0], t[0] + t[1])), max_size=12)


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
