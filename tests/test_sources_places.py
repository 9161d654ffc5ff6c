"""The innermost NVTX place around each call (sources on nsys exports without backtraces):
the place started last at or before the call on its thread, else the nearest ancestor of it
that holds the call. Checked by hand and against a brute force of that rule."""

from __future__ import annotations

import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st

from traceinsight.analyzers.sources import MAX_NESTING, _innermost


def _places(rows: list[tuple[int, int, int]]) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "u_s": [s for _, s, _ in rows],
            "u_e": [e for _, _, e in rows],
            "u_tid": [t for t, _, _ in rows],
            "location": [f"p{i}" for i in range(len(rows))],
        },
        schema={"u_s": pl.Int64, "u_e": pl.Int64, "u_tid": pl.Int64, "location": pl.String},
    )


def _targets(rows: list[tuple[int, int, int]]) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "target": list(range(len(rows))),
            "start_ns": [s for _, s, _ in rows],
            "end_ns": [e for _, _, e in rows],
            "tid": [t for t, _, _ in rows],
        },
        schema={"target": pl.UInt32, "start_ns": pl.Int64, "end_ns": pl.Int64, "tid": pl.Int64},
    )


def _located(targets: pl.DataFrame, places: pl.DataFrame) -> dict[int, str]:
    out = _innermost(targets, places)
    return dict(out.select("target", "location").iter_rows())


def _brute(targets: list[tuple[int, int, int]], places: list[tuple[int, int, int]]) -> dict:
    order = sorted(range(len(places)), key=lambda i: (places[i][0], places[i][1], -places[i][2]))
    p = [places[i] for i in order]
    name = [f"p{i}" for i in order]
    parent = [
        max(
            (
                j
                for j in range(i)
                if p[j][0] == p[i][0] and p[j][1] <= p[i][1] and p[j][2] >= p[i][2]
            ),
            default=None,
        )
        for i in range(len(p))
    ]
    out = {}
    for k, (tid, start, end) in enumerate(targets):
        at = max((j for j in range(len(p)) if p[j][0] == tid and p[j][1] <= start), default=None)
        for _ in range(MAX_NESTING):
            if at is None or p[at][2] >= end:
                break
            at = parent[at]
        if at is not None:
            out[k] = name[at]
    return out


def test_a_call_after_a_sibling_is_in_their_parent() -> None:
    places = [(1, 0, 100), (1, 10, 20), (1, 30, 60), (1, 35, 40), (2, 0, 50)]
    targets = [
        (1, 12, 15),  # inside p1
        (1, 22, 25),  # after p1 ended: p0
        (1, 41, 45),  # after p3 (inside p2): p2
        (1, 37, 39),  # inside p3
        (2, 10, 60),  # outlasts p4: nothing holds it
        (3, 10, 20),  # a thread without places
    ]
    assert _located(_targets(targets), _places(places)) == {0: "p1", 1: "p0", 2: "p2", 3: "p3"}


span = st.tuples(st.integers(0, 2), st.integers(0, 60), st.integers(0, 30)).map(
    lambda t: (t[0], t[1], t[1] + t[2])
)


@settings(max_examples=300, deadline=None)
@given(st.lists(span, max_size=25), st.lists(span, min_size=1, max_size=25))
def test_the_innermost_place_follows_its_rule(places, targets):
    """Partial overlaps, equal starts and nesting in any order: the as-of join and the lookups
    up the nesting agree with the rule applied one call at a time."""
    got = _located(_targets(targets), _places(places)) if places else {}
    assert got == _brute(targets, places)
