"""The packed (window, key) group_by gives exactly the plain group_by's groups."""

from __future__ import annotations

import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st

from microbatch.operators.packed_group_by import group_by_window_and_key

SLIDE = 60_000
AGGS = [pl.len().alias("n"), pl.col("v").sum().alias("total"), pl.col("v").first().alias("f")]


@settings(max_examples=80, deadline=None)
@given(
    rows=st.lists(
        st.tuples(
            st.integers(-3, 3).map(lambda i: i * SLIDE),
            st.one_of(st.none(), st.integers(-(2**40), 2**40), st.integers(-5, 5)),
            st.floats(-1e6, 1e6, allow_nan=False),
        ),
        max_size=40,
    ),
    dtype=st.sampled_from([pl.Int64, pl.Int32, pl.UInt32, pl.Int8, pl.String]),
)
def test_same_groups_as_the_plain_group_by(rows: list, dtype: type[pl.DataType]) -> None:
    frame = pl.DataFrame(rows, schema={"ws": pl.Int64, "k": pl.Int64, "v": pl.Float64},
                         orient="row")
    frame = frame.with_columns(pl.col("k").cast(dtype, strict=False))
    want = frame.group_by(["ws", "k"]).agg(AGGS).sort("ws", "k", nulls_last=True)
    got = group_by_window_and_key(frame, "ws", ["k"], SLIDE, AGGS).sort("ws", "k",
                                                                        nulls_last=True)
    assert got.schema == want.schema
    assert got.equals(want), f"packed:\n{got}\nplain:\n{want}"


def test_wide_ranges_fall_back() -> None:
    frame = pl.DataFrame({"ws": [0, 10**12 * SLIDE], "k": [-(2**62), 2**62], "v": [1.0, 2.0]})
    got = group_by_window_and_key(frame, "ws", ["k"], SLIDE, AGGS).sort("ws")
    assert got["k"].to_list() == [-(2**62), 2**62]
    assert got["ws"].to_list() == [0, 10**12 * SLIDE]
