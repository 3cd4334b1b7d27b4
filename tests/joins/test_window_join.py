"""Window joins against one-shot Polars: ``join_window`` on raw rows, and ``join``
of two windowed aggregations, under random batch splits of both inputs."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from join_helpers import (
    LEFT,
    RIGHT,
    assert_same_rows,
    batch_watermarks,
    check_late_rows,
    frame,
    ms,
    run_two,
)
from oracles import windows_of

import microbatch as mb
from microbatch.plan.windows import WindowSpec
from microbatch.testing import JoinStreamTest

rows = st.lists(
    st.tuples(st.sampled_from([0, 1, 2]), st.integers(0, 300).map(lambda s: s * 1000)),
    max_size=40,
)
cuts = st.tuples(*[st.lists(st.integers(1, 39), max_size=6)] * 2)


def with_windows(df: pl.DataFrame, spec: WindowSpec) -> pl.DataFrame:
    """One row per (row, window it falls in), windows as the engine types them."""
    out = windows_of(spec, df, time="ts", keys=[], aggs=[], by_row=True)

    def to_ts(column: str) -> pl.Expr:
        return (
            pl.from_epoch(column, time_unit="ms").dt.cast_time_unit("ms")
            .dt.replace_time_zone("UTC")
        )

    return out.with_columns(
        to_ts("ws").alias("window_start"), to_ts("we").alias("window_end")
    ).drop("ws", "we")


def kept_assignments(
    df: pl.DataFrame, test: JoinStreamTest, side: str, id_col: str, spec: WindowSpec
) -> pl.DataFrame:
    """Window assignments of ``df`` minus those the engine sent to the late output."""
    assigned = with_windows(df, spec)
    late = test.late_rows
    if late.height == 0 or id_col not in late.columns:
        return assigned
    window = [id_col, "window_start", "window_end"]
    late = late.filter(pl.col("join_side") == side).select(window)
    return assigned.join(late, on=window, how="anti")


@pytest.mark.parametrize("how", ["inner", "full"])
@pytest.mark.parametrize(
    "spec",
    [mb.window("ts", "1m"), mb.window("ts", "1m", slide="30s"),
     mb.cumulate_window("ts", "1m", "30s")],
    ids=["tumbling", "hopping", "cumulating"],
)
@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(both=st.tuples(rows, rows), cuts=cuts)
def test_join_window_split_invariance(tmp_path_factory, how, spec, both, cuts) -> None:

    def build(left, right):
        return left.with_watermark("ts", "20s").join_window(
            right.with_watermark("ts", "20s"), on="k", window=spec, how=how
        )

    lf, rf = frame(both[0], "lid"), frame(both[1], "rid")
    test = run_two(build, lf, rf, cuts, tmp_path_factory.mktemp("w"))
    kl = kept_assignments(lf, test, "left", "lid", spec)
    kr = kept_assignments(rf, test, "right", "rid", spec)
    on = ["window_start", "window_end", "k"]
    want = kl.join(kr, on=on, how="inner", coalesce=True)
    if how == "full":
        wm = test.watermark_ms if test.watermark_ms is not None else -(2**62)
        alone_l = kl.join(want, on=[*on, "lid"], how="anti").filter(ms("window_end") <= wm)
        alone_r = kr.join(want, on=[*on, "rid"], how="anti").filter(ms("window_end") <= wm)
        want = pl.concat([want, alone_l, alone_r.rename({"ts": "ts_right"})], how="diagonal")
    cols = ["window_start", "window_end", "k", "lid", "ts", "rid", "ts_right"]
    assert test.output.width == 0 or test.output.columns == cols
    assert_same_rows(test.output, want.select(cols))
    # a row is late only when its window was closed by its batch's watermark
    check_late_rows(test, lambda row: ms_of(row["window_end"]))
    test.close()


def ms_of(ts) -> int:
    return int(ts.timestamp() * 1000)


def agg(stream: mb.Stream, name: str) -> mb.Stream:
    return (
        stream.with_watermark("ts", "20s")
        .group_by(mb.window("ts", "1m"), "k")
        .agg(pl.len().alias(name))
    )


@pytest.mark.parametrize("how", ["inner", "left", "full"])
@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(both=st.tuples(rows, rows), cuts=cuts)
def test_join_of_windowed_aggregations_split_invariance(tmp_path_factory, how, both, cuts) -> None:
    def build(left, right):
        return agg(left, "clicks").join(
            agg(right, "buys"), on=["window_start", "window_end", "k"], how=how
        )

    lf, rf = frame(both[0], "lid"), frame(both[1], "rid")
    test = run_two(build, lf, rf, cuts, tmp_path_factory.mktemp("a"))
    late = test.late_rows
    late_l = late["lid"].drop_nulls() if "lid" in late.columns else pl.Series([], dtype=pl.Int64)
    late_r = late["rid"].drop_nulls() if "rid" in late.columns else pl.Series([], dtype=pl.Int64)
    wm = test.watermark_ms if test.watermark_ms is not None else -(2**62)

    def oracle(df: pl.DataFrame, id_col: str, late_ids: pl.Series, name: str) -> pl.DataFrame:
        return (
            with_windows(
                df.filter(~pl.col(id_col).is_in(late_ids.implode())), mb.window("ts", "1m")
            )
            .group_by("window_start", "window_end", "k")
            .agg(pl.len().cast(pl.UInt32).alias(name))
            .filter(ms("window_end") <= wm)
        )

    on = ["window_start", "window_end", "k"]
    want = oracle(lf, "lid", late_l, "clicks").join(
        oracle(rf, "rid", late_r, "buys"), on=on, how=how, coalesce=True
    )
    got = test.output
    if got.width:
        got = got.with_columns(pl.col("clicks", "buys").cast(pl.UInt32))
    assert_same_rows(got, want.select(*on, "clicks", "buys"))
    marks = batch_watermarks(test)
    for batch_id, df in test.sink.batches.items():  # a window leaves once, when closed
        if df.height:
            assert df.select((ms("window_end") <= marks[batch_id]).all()).item()
    test.close()


def test_windowed_join_example(tmp_path: Path) -> None:
    test = JoinStreamTest(
        lambda left, right: left.with_watermark("ts", "0s").join_window(
            right.with_watermark("ts", "0s"), on="k", window=mb.window("ts", "1m"), how="left"
        ),
        left_schema=LEFT,
        right_schema=RIGHT,
        checkpoint=tmp_path,
    )
    at = test.at
    test.add_left({"lid": [1, 2], "k": [1, 2], "ts": [at("00:00:10"), at("00:00:20")]})
    out = test.add_right({"rid": [7], "k": [1], "ts": [at("00:00:50")]}).process()
    assert out[["lid", "rid"]].rows() == [(1, 7)]
    # the next minute closes [0, 1m): left 2 had no partner in it
    test.add_left({"lid": [3], "k": [3], "ts": [at("00:01:30")]})
    out = test.add_right({"rid": [8], "k": [3], "ts": [at("00:01:30")]}).process()
    assert sorted(out[["lid", "rid"]].rows(), key=str) == [(2, None), (3, 8)]
    assert out.columns[:3] == ["window_start", "window_end", "k"]
    # state is released as windows close
    assert test.progress[-1]["state"]["join-0"]["left_rows"] <= 1
    test.close()


def test_window_join_refuses_session_windows() -> None:
    left = mb.read_memory(schema=LEFT).with_watermark("ts", "1s")
    right = mb.read_memory(schema=RIGHT).with_watermark("ts", "1s")
    with pytest.raises(mb.PlanError, match="session windows"):
        left.join_window(right, on="k", window=mb.session_window("ts", "1m"))  # type: ignore[arg-type]
    a = left.group_by(mb.window("ts", "1m"), "k").agg(pl.len())
    b = right.group_by(mb.window("ts", "5m"), "k").agg(pl.len())
    with pytest.raises(mb.PlanError, match="different windows"):
        a.join(b, on=["window_start", "k"])
    c = right.group_by(mb.window("ts", "1m"), "k").agg(pl.len())
    with pytest.raises(mb.PlanError, match="must include 'window_start'"):
        a.join(c, on="k")
