"""Partials on the streaming engine are exact: counts and integer sums equal Polars',
float sums equal ``math.fsum`` of each group's values (the correctly rounded exact
sum) bit for bit, whatever the order of the rows; no exact form, no result."""

from __future__ import annotations

import math
from itertools import pairwise

import determinism_queries as queries
import numpy as np
import polars as pl
import pytest
from determinism_queries import bits
from hypothesis import given, settings
from hypothesis import strategies as st
from oracles import tumbling_or_hopping

import microbatch as mb
from microbatch.operators import window_agg
from microbatch.operators.exact_partials import exact_window_merge, exact_window_partials
from microbatch.operators.window_agg import EXPIRE, WS, WindowAggregate, split_late_windows
from microbatch.plan.aggregates import AggSpec, parse_aggregations
from microbatch.plan.windows import WindowSpec

MINUTE = 60_000
AGGS = parse_aggregations((
    pl.len().alias("n"), pl.col("x").sum().alias("sx"), pl.col("x").mean().alias("mx"),
    pl.col("i").sum().alias("si"), pl.col("i").min().alias("lo"), pl.col("i").count().alias("ci"),
))
magnitudes = st.one_of(
    st.floats(-1e4, 1e4, allow_nan=False).map(lambda v: round(v, 2)),  # cents
    st.tuples(st.floats(1e-5, 1e11), st.sampled_from([1.0, -1.0])).map(lambda p: p[0] * p[1]),
    st.sampled_from([0.0, -0.0, 1e-5, -3e-5, 2.0**36]),
)
rows = st.lists(
    st.tuples(
        st.integers(0, 5 * MINUTE),
        st.one_of(st.none(), st.integers(-3, 3), st.integers(2**40, 2**40 + 2)),
        st.one_of(st.none(), magnitudes),
        st.one_of(st.none(), st.integers(-(2**40), 2**40)),
    ),
    min_size=1, max_size=60,
)


def _frame(data: list[tuple[object, ...]]) -> pl.DataFrame:
    return pl.DataFrame(data, schema={"ts": pl.Int64, "k": pl.Int64, "x": pl.Float64,
                                      "i": pl.Int64}, orient="row").with_columns(
        pl.col("ts").cast(pl.Datetime("ms")))


def _partials(df: pl.DataFrame, spec: WindowSpec, wm: int | None, keys: list[str],
              aggs: list[AggSpec] = AGGS) -> pl.DataFrame | None:
    live, _ = split_late_windows(df, spec, wm)
    return exact_window_partials(df, live, window_column=WS, spec=spec, keys=keys, aggs=aggs)


def _oracle(df: pl.DataFrame, size: int, slide: int, wm: int | None) -> pl.DataFrame:
    """Each (window, key)'s partials from the live (row, window) pairs, ``math.fsum``
    for the float sums."""
    pairs = tumbling_or_hopping(df, time="ts", keys=["k"], size_ms=size, slide_ms=slide,
                                aggs=[], by_row=True)
    if wm is not None:
        pairs = pairs.filter(pl.col("we") > wm)
    grouped = pairs.group_by("ws", "k").agg(
        pl.len().cast(pl.Int64).alias("__p_n"), pl.col("x").drop_nulls().alias("xs"),
        pl.col("i").sum().alias("__p_si"), pl.col("i").min().alias("__p_lo"),
        pl.col("i").count().cast(pl.Int64).alias("__p_ci"),
        pl.col("x").count().cast(pl.Int64).alias("__p_mx_cnt"),
    )
    sums = pl.Series([math.fsum(v) for v in grouped["xs"].to_list()], dtype=pl.Float64)
    return grouped.drop("xs").with_columns(sums.alias("__p_sx"), sums.alias("__p_mx_sum"))


@settings(max_examples=60, deadline=None)
@given(data=rows, slide=st.sampled_from([MINUTE, MINUTE // 2]),
       wm=st.one_of(st.none(), st.integers(0, 3 * MINUTE)), seed=st.integers(0, 2**32 - 1))
def test_equal_to_exact_sums_in_any_row_order(
    data: list[tuple[object, ...]], slide: int, wm: int | None, seed: int
) -> None:
    df = _frame(data)
    spec = mb.window("ts", "1m", slide=f"{slide // 1000}s")
    got = _partials(df, spec, wm, ["k"])
    assert got is not None
    want = _oracle(df, MINUTE, slide, wm).rename({"ws": WS})
    order = [WS, "k"]
    got, want = got.sort(order, nulls_last=True), want.select(got.columns).sort(
        order, nulls_last=True)
    assert got.schema == want.schema
    assert bits(got).equals(bits(want)), f"streaming:\n{got}\noracle:\n{want}"
    shuffled = pl.concat([df.sample(fraction=1.0, shuffle=True, seed=seed).slice(i, 7)
                          for i in range(0, df.height, 7)], rechunk=False)
    again = _partials(shuffled, spec, wm, ["k"])
    assert again is not None
    assert bits(again.sort(order, nulls_last=True)).equals(bits(got))


def test_string_keys_group_on_two_columns() -> None:
    df = _frame([(0, 1, 0.1, 1), (1, 1, 0.2, 2), (MINUTE, 2, 0.3, 3)]).with_columns(
        pl.col("k").cast(pl.String))
    got = _partials(df, mb.window("ts", "1m"), None, ["k"])
    assert got is not None
    assert got.sort(WS)["__p_sx"].to_list() == [math.fsum([0.1, 0.2]), 0.3]


@pytest.mark.parametrize(("values", "agg"), [
    ([1.0, float("nan")], pl.col("x").sum().alias("s")),
    ([1.0, float("inf")], pl.col("x").mean().alias("m")),
    ([1e-300, 1e300], pl.col("x").sum().alias("s")),  # more than Int128's bits apart
    ([1.0, 2.0], pl.col("x").first().alias("f")),  # ordered: no exact form
    ([1.0, 2.0], pl.col("x").max().alias("m")),  # -0.0 vs 0.0 depends on the order
])
def test_no_exact_form_returns_none(values: list[float], agg: pl.Expr) -> None:
    df = _frame([(0, 1, v, 1) for v in values])
    assert _partials(df, mb.window("ts", "1m"), None, ["k"], parse_aggregations((agg,))) is None


def test_float32_sums_are_left_to_the_in_memory_engine() -> None:
    df = _frame([(0, 1, 0.5, 1)]).with_columns(pl.col("x").cast(pl.Float32))
    aggs = parse_aggregations((pl.col("x").sum().alias("s"),))
    assert _partials(df, mb.window("ts", "1m"), None, ["k"], aggs) is None


@settings(max_examples=40, deadline=None)
@given(pairs=st.sets(st.tuples(st.integers(0, 4).map(lambda i: i * MINUTE),
                               st.one_of(st.integers(-5, 5), st.integers(2**61, 2**61 + 3))),
                     min_size=2, max_size=30),
       dtype=st.sampled_from([pl.Int64, pl.Int16, pl.UInt32]), seed=st.integers(0, 99))
def test_closed_windows_are_emitted_by_end_then_key(
    pairs: set[tuple[int, int]], dtype: type[pl.DataType], seed: int
) -> None:
    op = WindowAggregate(operator_id="w", window=mb.window("ts", "1m"), keys=["k"],
                         aggs=AGGS[:1], output_mode="append")
    op.row_schema = pl.Schema({"k": dtype, EXPIRE: pl.Int64})
    rows = pl.DataFrame(sorted(pairs), schema={EXPIRE: pl.Int64, "k": pl.Int64}, orient="row")
    rows = rows.with_columns(pl.col("k").cast(dtype, strict=False)).drop_nulls().unique(
        [EXPIRE, "k"]).sample(fraction=1.0, shuffle=True, seed=seed)
    assert op._in_emit_order(rows).equals(rows.sort(EXPIRE, "k"))


def test_merge_of_partial_rows_is_their_exact_sum() -> None:
    """The combine at window close: each (window, key)'s partial rows (two batches
    here) merged into one, the float sums equal to ``math.fsum`` of the partials."""
    rng = np.random.default_rng(5)
    n = 20_000
    df = pl.DataFrame({"ts": rng.integers(0, 3 * MINUTE, n), "k": rng.integers(0, 300, n),
                       "x": np.round(rng.lognormal(3, 2, n), 2), "i": rng.integers(0, 9, n)})
    df = df.with_columns(pl.col("ts").cast(pl.Datetime("ms")))
    spec = mb.window("ts", "1m")
    halves = [_partials(df.slice(0, n // 2), spec, None, ["k"]),
              _partials(df.slice(n // 2), spec, None, ["k"])]
    rows = pl.concat([h for h in halves if h is not None]).with_columns(
        (pl.col(WS) + MINUTE).alias(EXPIRE))
    merged = exact_window_merge(rows, window_column=WS, spec=spec, keys=["k"], aggs=AGGS,
                                constant=[EXPIRE])
    assert merged is not None
    want = rows.group_by(WS, "k").agg(
        pl.col("__p_n", "__p_si", "__p_ci", "__p_mx_cnt").sum(), pl.col("__p_lo").min(),
        pl.col(EXPIRE).first(), pl.col("__p_sx"))
    want = want.with_columns(pl.Series([math.fsum(v) for v in want["__p_sx"].to_list()]).alias(
        "__p_sx"))
    got = merged.sort(WS, "k").select(want.columns)
    assert got.height == 3 * 300
    assert bits(got.drop("__p_sx")).equals(bits(want.sort(WS, "k").drop("__p_sx")))
    assert bits(got.select("__p_sx")).equals(bits(want.sort(WS, "k").select("__p_sx")))


def test_a_query_on_the_exact_path_replays_bit_identically(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """End to end (hopping windows, sum and mean): every batch's partials and every
    combine on the exact path give the same bits run after run, and the values of
    the in-memory path up to the last bits."""
    folded = queries.run("hopping")
    monkeypatch.setattr(window_agg, "EXACT_MIN_ROWS", 0)
    calls: list[int] = []
    real = window_agg.exact_window_merge

    def counted(*args: object, **kwargs: object) -> pl.DataFrame | None:
        out = real(*args, **kwargs)  # type: ignore[arg-type]
        calls.append(out is not None)
        return out

    monkeypatch.setattr(window_agg, "exact_window_merge", counted)
    first, second = queries.run("hopping"), queries.run("hopping")
    assert sum(calls) >= 2  # the combine took the exact path
    assert bits(first).equals(bits(second))
    assert first.height == folded.height > 1_000
    assert first.drop("total", "mean").equals(folded.drop("total", "mean"))
    for col in ("total", "mean"):
        rel = ((first[col] - folded[col]).abs() / folded[col].abs().clip(lower_bound=1.0)).max()
        assert rel < 1e-12, col


# ------------------------------------------------------------ map-side combine


def _combined(op: WindowAggregate, df: pl.DataFrame, cuts: list[int], wm: int | None
              ) -> tuple[pl.DataFrame, pl.DataFrame | None] | None:
    """``df`` cut at ``cuts`` into slices, each pre-aggregated as a map worker does
    (``combine_slice``), merged as a reduce does (``take_partials``): what the
    operator would take in place of computing the batch's partials."""
    from microbatch.operators.base import OperatorContext

    ctx = OperatorContext(batch_id=3, watermark_ms=wm, timestamp_ms=0)
    bounds = [0, *sorted(set(cuts)), df.height]
    parts, lates = [], []
    for lo, hi in pairwise(bounds):
        got = op.combine_slice(df.slice(lo, hi - lo), ctx)
        if got is None:
            return None
        parts.append((got[0], got[2]))
        lates.append(got[1])
    if not op.take_partials(df.schema, parts, lates):
        return None
    taken, op._pending = op._pending, None
    return taken


@settings(max_examples=60, deadline=None)
@given(data=rows, cuts=st.lists(st.integers(0, 60), max_size=4),
       wm=st.one_of(st.none(), st.integers(0, 4).map(lambda i: i * MINUTE)),
       slide=st.sampled_from([MINUTE, MINUTE // 2]))
def test_slices_partials_merged_are_the_batchs_bit_for_bit(
    data: list[tuple[object, ...]], cuts: list[int], wm: int | None, slide: int
) -> None:
    """Append buffer (float sums exact): any cut of a batch into slices, each
    pre-aggregated, merges into exactly the partials of the whole batch, and the
    slices' late rows are the batch's late rows in order."""
    df = _frame(data)
    cuts = [c for c in cuts if c < df.height]
    op = WindowAggregate(operator_id="agg-0", window=WindowSpec("ts", MINUTE, slide),
                         keys=["k"], aggs=AGGS, output_mode="append")
    live, late = split_late_windows(df, op.window, wm)
    want = op._partials(df, live)
    got = _combined(op, df, cuts, wm)
    if exact_window_partials(df, live, window_column=WS, spec=op.window, keys=["k"],
                             aggs=AGGS) is None:
        assert got is None  # no exact form over the whole batch: the rows travel
        return
    assert got is not None
    merged, got_late = got
    key = [WS, "k"]
    assert merged.schema == want.schema
    assert bits(merged).sort(key, nulls_last=True).equals(bits(want).sort(key, nulls_last=True))
    assert got_late is not None
    assert got_late.equals(late)


@settings(max_examples=40, deadline=None)
@given(data=rows, cuts=st.lists(st.integers(0, 60), max_size=4))
def test_keyed_integer_partials_merge_in_first_appearance_order(
    data: list[tuple[object, ...]], cuts: list[int]
) -> None:
    """A keyed store (update mode): integer partials merged from slices equal the
    batch's ``group_by(maintain_order=True)``, rows and group order alike; a float
    sum there (summed in row order) is never pre-aggregated."""
    df = _frame(data)
    cuts = [c for c in cuts if c < df.height]
    ints = parse_aggregations((pl.len().alias("n"), pl.col("i").sum().alias("si"),
                               pl.col("i").min().alias("lo"), pl.col("i").max().alias("hi"),
                               pl.col("x").count().alias("cx")))
    op = WindowAggregate(operator_id="agg-0", window=None, keys=["k"], aggs=ints,
                         output_mode="update")
    want = df.group_by(["k"], maintain_order=True).agg(
        [e for a in ints for e in a.partials(df.schema)])
    got = _combined(op, df, cuts, None)
    assert got is not None
    assert got[0].equals(want)
    assert got[1] is None
    floats = WindowAggregate(operator_id="agg-1", window=None, keys=["k"],
                             aggs=parse_aggregations((pl.col("x").sum().alias("sx"),)),
                             output_mode="update")
    assert floats.combine_plan(df.schema) is None
