"""Interval joins against the one-shot Polars join + interval filter.

Split invariance: random rows on both inputs (with disorder, ties on the
interval bounds, null keys and late rows), split at random into batches: the
union of the output equals the one-shot join of the rows that were not late;
an outer join's unmatched row appears exactly once, only once the watermark
of its batch passed its time + the interval, and exactly for the rows the
final watermark allows.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from join_helpers import (
    LEFT,
    RIGHT,
    T0,
    assert_same_rows,
    batch_watermarks,
    check_late_rows,
    frame,
    interval_oracle,
    ms,
    not_late,
    run_two,
)

import microbatch as mb
from microbatch.engine.faults import InjectedFault
from microbatch.testing import JoinStreamTest

rows = st.lists(
    st.tuples(st.sampled_from([0, 1, None]), st.integers(0, 60).map(lambda s: s * 1000)),
    min_size=5,
    max_size=40,
)
cuts = st.tuples(*[st.lists(st.integers(1, 39), min_size=2, max_size=10)] * 2)

INTERVALS = {"around": (-10_000, 5_000), "equal": (0, 0), "before": (-8_000, -3_000)}


def build_interval(how: str, lower_ms: int, upper_ms: int, delay: str = "5s"):
    def build(left, right):
        return left.with_watermark("ts", delay).join_interval(
            right.with_watermark("ts", delay),
            on="k",
            left_time="ts",
            right_time="ts",
            lower=f"{lower_ms}ms" if lower_ms >= 0 else f"-{-lower_ms}ms",
            upper=f"{upper_ms}ms" if upper_ms >= 0 else f"-{-upper_ms}ms",
            how=how,
        )

    return build


def expected(
    test: JoinStreamTest, left: pl.DataFrame, right: pl.DataFrame, how: str, bounds: tuple[int, int]
) -> pl.DataFrame:
    """Oracle: inner pairs of the rows that were not late, plus the unmatched rows
    whose eviction the final watermark allows (outer joins)."""
    lo, up = bounds
    kept_l = not_late(left, test, "left", "lid")
    kept_r = not_late(right, test, "right", "rid")
    inner = interval_oracle(kept_l, kept_r, lower_ms=lo, upper_ms=up)
    wm = test.watermark_ms
    parts = [inner]
    if how in ("left", "full"):
        alone = kept_l.filter(~pl.col("lid").is_in(inner["lid"].implode()))
        parts.append(alone.filter(ms("ts") + up <= wm) if wm is not None else alone.head(0))
    if how in ("right", "full"):
        alone = kept_r.filter(~pl.col("rid").is_in(inner["rid"].implode()))
        alone = alone.filter(ms("ts") - lo <= wm) if wm is not None else alone.head(0)
        parts.append(alone.rename({"ts": "ts_right"}))
    return pl.concat(parts, how="diagonal").select("lid", "k", "ts", "rid", "ts_right")


def check_unmatched_timing(test: JoinStreamTest, lo: int, up: int) -> None:
    """An unmatched row left only in a batch whose watermark allowed it."""
    marks = batch_watermarks(test)
    for batch_id, df in test.sink.batches.items():
        if not df.height:
            continue
        wm = marks[batch_id]
        lonely_l = df.filter(pl.col("rid").is_null())
        lonely_r = df.filter(pl.col("lid").is_null())
        assert lonely_l.height == 0 or (
            wm is not None and lonely_l.select((ms("ts") + up <= wm).all()).item()
        )
        assert lonely_r.height == 0 or (
            wm is not None and lonely_r.select((ms("ts_right") - lo <= wm).all()).item()
        )


@pytest.mark.parametrize("how", ["inner", "left", "right", "full"])
@pytest.mark.parametrize("interval", list(INTERVALS), ids=list(INTERVALS))
@settings(
    max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(both=st.tuples(rows, rows), cuts=cuts)
def test_interval_join_split_invariance(tmp_path_factory, how, interval, both, cuts) -> None:
    lo, up = INTERVALS[interval]
    lf, rf = frame(both[0], "lid"), frame(both[1], "rid")
    test = run_two(build_interval(how, lo, up), lf, rf, cuts, tmp_path_factory.mktemp("j"))
    assert_same_rows(test.output, expected(test, lf, rf, how, (lo, up)))
    check_unmatched_timing(test, lo, up)
    check_late_rows(test, lambda row: None if row["ts"] is None else ms_of(row["ts"]))
    test.close()


def ms_of(ts) -> int:
    return int(ts.timestamp() * 1000)


def test_pairs_within_a_batch_and_across_batches(tmp_path: Path) -> None:
    test = JoinStreamTest(
        build_interval("full", -30_000, 10_000, delay="20s"),
        left_schema=LEFT,
        right_schema=RIGHT,
        checkpoint=tmp_path,
    )
    at = test.at
    test.add_left({"lid": [1, 2], "k": [1, 2], "ts": [at("00:01:00"), at("00:01:00")]})
    test.add_right({"rid": [1], "k": [1], "ts": [at("00:00:40")]})  # in [0:30, 1:10]
    assert test.process()[["lid", "rid"]].rows() == [(1, 1)]
    # right at 1:10 (upper bound, inclusive) matches left 1 stored earlier
    out = test.add_right({"rid": [2], "k": [1], "ts": [at("00:01:10")]}).process()
    assert out[["lid", "rid"]].rows() == [(1, 2)]
    # watermark: min(left 1:00, right 1:10) - 20s = 0:40 -> nothing can be emitted unmatched yet
    assert test.watermark_ms == ms_of(at("00:00:40"))
    # moving it to 1:20 evicts left 2 (1:00 + 10s <= 1:20): unmatched, emitted once
    test.add_left({"lid": [3], "k": [3], "ts": [at("00:01:40")]})
    out = test.add_right({"rid": [3], "k": [3], "ts": [at("00:01:40")]}).process()
    assert out.filter(pl.col("rid").is_null())["lid"].to_list() == [2]
    assert out.filter(pl.col("lid") == 3)["rid"].to_list() == [3]
    assert test.output.filter(pl.col("lid") == 2).height == 1
    state = test.progress[-1]["state"]["join-0"]
    assert state["left_rows"] == 1  # left 3 (1:40 + 10s > 1:20)
    assert state["right_rows"] == 2  # right 2 (1:10 - (-30s) > 1:20) and right 3
    test.close()


def test_rows_stay_exactly_until_no_match_can_come(tmp_path: Path) -> None:
    """The eviction bounds are tight and inclusive: a left row stays while
    ``l.t + upper > W``, a right row while ``r.t - lower > W``."""
    test = JoinStreamTest(
        build_interval("inner", -10_000, 5_000, delay="0s"),
        left_schema=LEFT,
        right_schema=RIGHT,
        checkpoint=tmp_path,
    )
    at = test.at
    test.add_left({"lid": [1, 2], "k": [1, 9], "ts": [at("00:00:10"), at("00:00:14")]})
    test.add_right({"rid": [1, 2], "k": [2, 9], "ts": [at("00:00:24"), at("00:00:14")]})
    test.process()
    assert test.watermark_ms == ms_of(at("00:00:14"))  # left 1 (0:10 + 5s) is still needed
    out = test.add_right({"rid": [3], "k": [1], "ts": [at("00:00:15")]}).process()
    assert out[["lid", "rid"]].rows() == [(1, 3)]  # 0:15 = 0:10 + upper: inclusive
    # right 1 at 0:24 stays while 0:24 + 10s > W; a left row at 0:34 still matches it
    test.add_left({"lid": [3], "k": [9], "ts": [at("00:00:33")]})
    test.add_right({"rid": [4], "k": [9], "ts": [at("00:00:40")]})
    test.process()
    assert test.watermark_ms == ms_of(at("00:00:33"))
    out = test.add_left({"lid": [4], "k": [2], "ts": [at("00:00:34")]}).process()
    assert out[["lid", "rid"]].rows() == [(4, 1)]  # 0:24 = 0:34 + lower: inclusive
    test.close()


def test_late_rows_go_to_the_late_output_with_their_side(tmp_path: Path) -> None:
    test = JoinStreamTest(
        build_interval("inner", -30_000, 10_000, delay="0s"),
        left_schema=LEFT,
        right_schema=RIGHT,
        checkpoint=tmp_path,
    )
    at = test.at
    test.add_left({"lid": [1], "k": [1], "ts": [at("00:05:00")]})
    test.add_right({"rid": [1], "k": [1], "ts": [at("00:05:00")]}).process()
    test.add_left({"lid": [2, 3], "k": [1, 1], "ts": [at("00:05:00"), None]})
    test.add_right({"rid": [2], "k": [1], "ts": [at("00:04:59")]}).process()
    late = test.late_rows.sort("join_side", "lid", "rid", nulls_last=True)
    assert late["join_side"].to_list() == ["left", "left", "right"]
    assert late["late_reason"][0].startswith("left time ")
    assert "is null" in late["late_reason"][1]
    assert sum(p["late_rows"] for p in test.progress) == 3
    test.close()


def test_state_is_bounded_over_a_long_run(tmp_path: Path) -> None:
    """Rows leave state once the watermark passes them: the state plateaus at
    about rate x (interval + delay + batch span + disorder) per side."""
    rate_per_s, batch_s, keys, batches = 20, 10, 50, 60
    delay_s, lower_s, upper_s, disorder_s = 20, -60, 30, 10
    test = JoinStreamTest(
        build_interval("full", lower_s * 1000, upper_s * 1000, delay=f"{delay_s}s"),
        left_schema=LEFT,
        right_schema=RIGHT,
        checkpoint=tmp_path,
    )
    n = rate_per_s * batch_s
    sizes = []
    for b in range(batches):
        i = pl.int_range(b * n, (b + 1) * n, eager=True)
        t = i * (1000 // rate_per_s) - (i * 7919 % (disorder_s * 1000))
        base = pl.DataFrame({"i": i, "t": t}).with_columns(
            k=pl.col("i") % keys, ts=pl.lit(T0) + pl.duration(milliseconds=pl.col("t"))
        )
        test.add_left(base.select(lid="i", k="k", ts=pl.col("ts").dt.cast_time_unit("ms")))
        test.add_right(base.select(rid="i", k="k", ts=pl.col("ts").dt.cast_time_unit("ms")))
        test.process()
        state = test.progress[-1]["state"]["join-0"]
        sizes.append((state["left_rows"], state["right_rows"], state["left_keys"]))
    span = batch_s + disorder_s + delay_s
    left_ceiling = rate_per_s * (span + upper_s)
    right_ceiling = rate_per_s * (span - lower_s)
    steady = sizes[batches // 2 :]
    assert max(s[0] for s in steady) <= left_ceiling, steady
    assert max(s[1] for s in steady) <= right_ceiling, steady
    assert max(s[2] for s in steady) <= keys
    # a plateau, not a slow climb: the second half's sizes stay within a batch of each other
    assert max(s[0] for s in steady) - min(s[0] for s in steady) <= n
    assert test.output.height > batches * n  # joined plenty along the way
    test.close()


def test_restart_between_batches_gives_identical_output(tmp_path: Path) -> None:
    lf = frame([(i % 3, (i * 7_919) % 200_000) for i in range(60)], "lid")
    rf = frame([(i % 4, (i * 4_099) % 200_000) for i in range(60)], "rid")
    cut = [10, 20, 30, 40, 50]
    build = build_interval("full", -30_000, 10_000)
    straight = run_two(build, lf, rf, (cut, cut), tmp_path / "a")
    restarted = run_two(build, lf, rf, (cut, cut), tmp_path / "b", restart_every=2)
    assert straight.sink.batches.keys() == restarted.sink.batches.keys()
    for bid, df in straight.sink.batches.items():
        assert restarted.sink.batches[bid].equals(df, null_equal=True), bid
    assert straight.output.height > 0
    straight.close()
    restarted.close()


@pytest.mark.parametrize("point", ["after_execute", "after_sink", "after_state_commit"])
def test_crash_mid_batch_then_restart_gives_identical_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, point: str
) -> None:
    lf = frame([(i % 3, (i * 7_919) % 200_000) for i in range(60)], "lid")
    rf = frame([(i % 4, (i * 4_099) % 200_000) for i in range(60)], "rid")
    build = build_interval("full", -30_000, 10_000)
    straight = run_two(build, lf, rf, ([20, 40], [20, 40]), tmp_path / "a")
    test = JoinStreamTest(build, left_schema=LEFT, right_schema=RIGHT, checkpoint=tmp_path / "b")
    for lo, hi in [(0, 20), (20, 40), (40, 60)]:
        test.add_left(lf.slice(lo, hi - lo)).add_right(rf.slice(lo, hi - lo))
        if lo == 20:
            batch = test.execution.next_batch_id
            monkeypatch.setenv("MICROBATCH_FAULT", f"{point}@{batch}")
            monkeypatch.setenv("MICROBATCH_FAULT_ACTION", "raise")
            with pytest.raises(InjectedFault):
                test.process()
            monkeypatch.delenv("MICROBATCH_FAULT")
            test.restart()
        test.process()
    assert straight.sink.batches.keys() == test.sink.batches.keys()
    for bid, df in straight.sink.batches.items():
        assert test.sink.batches[bid].equals(df, null_equal=True), bid
    straight.close()
    test.close()


def test_guardrails_refuse_unbounded_joins() -> None:
    left = mb.read_memory(schema=LEFT).with_watermark("ts", "10s")
    right = mb.read_memory(schema=RIGHT)
    with pytest.raises(mb.PlanError, match="right input has no watermark"):
        left.join_interval(right, on="k", left_time="ts", lower="-1m", upper="0s")
    marked = right.with_watermark("ts", "10s")
    with pytest.raises(mb.PlanError, match="without an upper bound"):
        left.join_interval(marked, on="k", left_time="ts", lower="-1m")
    with pytest.raises(mb.PlanError, match="without a lower bound"):
        left.join_interval(marked, on="k", left_time="ts", upper="1m")
    with pytest.raises(mb.PlanError, match=r"lower .* is after upper"):
        left.join_interval(marked, on="k", left_time="ts", lower="1m", upper="-1m")
    with pytest.raises(mb.PlanError, match="same source object"):
        left.join_interval(left, on="k", left_time="ts", lower="-1m", upper="0s")
    with pytest.raises(mb.PlanError, match="how='cross'"):
        left.join_interval(marked, on="k", left_time="ts", lower="-1m", upper="0s", how="cross")


def test_aggregation_below_a_join_needs_append_mode() -> None:
    def agg(s):
        return s.with_watermark("ts", "10s").group_by(mb.window("ts", "1m"), "k").agg(pl.len())

    left, right = mb.read_memory(schema=LEFT), mb.read_memory(schema=RIGHT)
    joined = agg(left).join(agg(right), on=["window_start", "k"])
    with pytest.raises(mb.PlanError, match="only in append mode"):
        joined.write_memory("x", output_mode="update").start()
    with pytest.raises(mb.PlanError, match="not a windowed aggregation"):
        left.with_watermark("ts", "1s").join(right.with_watermark("ts", "1s"), on="k")


def test_explain_shows_the_join() -> None:
    left = mb.read_memory(schema=LEFT).with_watermark("ts", "10s")
    right = mb.read_memory(schema=RIGHT).with_watermark("ts", "10s")
    plan = left.join_interval(right, on="k", left_time="ts", lower="-1m", upper="5s").explain()
    assert "IntervalJoin[inner](on=['k'], ts in [ts -60000ms, ts +5000ms])" in plan
    assert plan.count("Source[memory]") == 2


def test_join_keys_of_different_types_are_refused(tmp_path: Path) -> None:
    test = JoinStreamTest(
        build_interval("inner", -1_000, 0),
        left_schema=LEFT,
        right_schema={**RIGHT, "k": pl.Int32},
        checkpoint=tmp_path,
    )
    test.add_left({"lid": [1], "k": [1], "ts": [test.at("00:00:01")]})
    test.add_right({"rid": [1], "k": [1], "ts": [test.at("00:00:01")]})
    with pytest.raises(mb.PlanError, match="different types"):
        test.process()
    test.close()


def test_null_keys_never_match_but_outer_joins_emit_them(tmp_path: Path) -> None:
    test = JoinStreamTest(
        build_interval("full", -10_000, 10_000, delay="0s"),
        left_schema=LEFT,
        right_schema=RIGHT,
        checkpoint=tmp_path,
    )
    at = test.at
    test.add_left({"lid": [1, 2], "k": [None, None], "ts": [at("00:00:01"), at("00:00:02")]})
    test.add_right({"rid": [1, 2], "k": [None, None], "ts": [at("00:00:01"), at("00:00:02")]})
    assert test.process().height == 0
    test.add_left({"lid": [3], "k": [1], "ts": [at("00:01:00")]})
    out = test.add_right({"rid": [3], "k": [1], "ts": [at("00:01:00")]}).process()
    assert sorted(out[["lid", "rid"]].rows(), key=str) == [
        (1, None),
        (2, None),
        (3, 3),
        (None, 1),
        (None, 2),
    ]
    test.close()


def test_an_input_without_schema_joins_once_it_shows_columns(tmp_path: Path) -> None:
    test = JoinStreamTest(
        build_interval("left", -60_000, 0, delay="0s"),
        left_schema=LEFT,
        right_schema=None,
        checkpoint=tmp_path,
    )
    at = test.at
    assert test.add_left({"lid": [1], "k": [1], "ts": [at("00:00:30")]}).process().height == 0
    test.restart()
    right = pl.DataFrame({"rid": [1], "k": [1], "ts": [at("00:00:10")]}, schema=RIGHT)
    out = test.add_right(right).process()
    assert out[["lid", "rid"]].rows() == [(1, 1)]  # the left row waited in state
    test.close()


def test_several_keys_strings_and_partitioned_inputs(tmp_path: Path) -> None:
    """Two join keys (one a string), partitioned inputs (per-partition
    watermarks), many batches: equal to the one-shot join of the rows not late."""
    schema = {"id": pl.Int64, "k": pl.Int64, "s": pl.String, "p": pl.Int32, "ts": pl.Datetime("ms")}
    test = JoinStreamTest(
        lambda left, right: left.with_watermark("ts", "10s").join_interval(
            right.with_watermark("ts", "10s"),
            on=["k", "s"],
            left_time="ts",
            lower="-20s",
            upper="20s",
            how="full",
        ),
        left_schema=schema,
        right_schema=schema,
        checkpoint=tmp_path,
        left_partition_column="p",
        right_partition_column="p",
    )
    n = 400

    def side(seed: int) -> pl.DataFrame:
        i = pl.int_range(0, n, eager=True)
        return pl.DataFrame({"id": i}).select(
            "id",
            k=(pl.col("id") * seed) % 3,
            s=((pl.col("id") * (seed + 1)) % 2).cast(pl.String),
            p=(pl.col("id") % 2).cast(pl.Int32),
            ts=pl.lit(datetime(2026, 1, 1)).dt.cast_time_unit("ms")
            + pl.duration(milliseconds=pl.col("id") * 1_000 - (pl.col("id") * seed % 60) * 1_000),
        )

    left, right = side(7), side(11)
    for lo in range(0, n, 50):
        test.add_left(left.slice(lo, 50)).add_right(right.slice(lo, 50)).process()
    late = test.late_rows
    assert late.height > 0  # 60 s of disorder against a 10 s delay
    kept_l = left.filter(
        ~pl.col("id").is_in(late.filter(pl.col("join_side") == "left")["id"].implode())
    )
    kept_r = right.filter(
        ~pl.col("id").is_in(late.filter(pl.col("join_side") == "right")["id"].implode())
    )
    inner = kept_l.join(kept_r, on=["k", "s"], coalesce=True).filter(
        (ms("ts_right") >= ms("ts") - 20_000) & (ms("ts_right") <= ms("ts") + 20_000)
    )
    got = test.output.filter(pl.col("id").is_not_null() & pl.col("id_right").is_not_null())
    assert_same_rows(got, inner.select(got.columns))
    assert "__mb_partition" not in test.output.columns
    test.close()
