"""Temporal (as-of) joins against the one-shot Polars ``join_asof``.

For random events and dimension versions split at random into batches: the
union of the output equals ``join_asof`` of the events that were not late
and whose time the final watermark reached, against the versions that were
not late (a repeated valid-from: the later arrival wins); every event is
emitted in the first batch whose watermark reaches its time.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from join_helpers import (
    T0,
    TS,
    assert_same_rows,
    batch_watermarks,
    check_late_rows,
    frame,
    ms,
    not_late,
    run_two,
)

import microbatch as mb
from microbatch.testing import JoinStreamTest

EVENTS = {"eid": pl.Int64, "k": pl.Int64, "ts": TS}
DIM = {"did": pl.Int64, "k": pl.Int64, "valid_from": TS}

events = st.lists(
    st.tuples(st.sampled_from([0, 1, None]), st.integers(0, 60).map(lambda s: s * 1000)),
    min_size=8,
    max_size=40,
)
versions = st.lists(
    st.tuples(st.sampled_from([0, 1]), st.integers(0, 60).map(lambda s: s * 1000)),
    min_size=5,
    max_size=25,
)
cuts = st.tuples(*[st.lists(st.integers(1, 39), min_size=2, max_size=10)] * 2)


def build_asof(how: str = "left", delay: str = "5s", dim_delay: str = "2s"):
    def build(ev, dim):
        return ev.with_watermark("ts", delay).join_asof_table(
            dim.with_watermark("valid_from", dim_delay),
            on="k",
            time="ts",
            dim_time="valid_from",
            how=how,
        )

    return build


def run(ev_rows, dim_rows, cuts, tmp: Path, how: str = "left", **kw) -> tuple:
    ev = frame(ev_rows, "eid")
    dim = frame(dim_rows, "did").rename({"ts": "valid_from"})
    test = run_two(build_asof(how), ev, dim, cuts, tmp, left_schema=EVENTS, right_schema=DIM, **kw)
    return test, ev, dim


def oracle(test: JoinStreamTest, ev: pl.DataFrame, dim: pl.DataFrame, how: str) -> pl.DataFrame:
    wm = test.watermark_ms
    kept = not_late(ev, test, "events", "eid")
    kept = kept.filter(ms("ts") <= wm) if wm is not None else kept.head(0)
    dims = (
        not_late(dim, test, "dimension", "did")
        .unique(["k", "valid_from"], keep="last", maintain_order=True)
        .sort("valid_from")
    )
    out = kept.sort("ts").join_asof(
        dims, left_on="ts", right_on="valid_from", by="k", check_sortedness=False
    )
    if how == "inner":
        out = out.filter(pl.col("did").is_not_null())
    return out.select("eid", "k", "ts", "did", "valid_from")


@pytest.mark.parametrize("how", ["left", "inner"])
@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(both=st.tuples(events, versions), cuts=cuts)
def test_asof_join_split_invariance(tmp_path_factory, how, both, cuts):
    test, ev, dim = run(*both, cuts, tmp_path_factory.mktemp("a"), how=how)
    assert_same_rows(test.output, oracle(test, ev, dim, how))
    marks = batch_watermarks(test)
    for batch_id, df in test.sink.batches.items():  # emitted as soon as final, not before
        if df.height:
            assert df.select((ms("ts") <= marks[batch_id]).all()).item()
            before = marks.get(batch_id - 1)
            assert before is None or df.select((ms("ts") > before).all()).item()

    def time_of(row):
        t = row["ts"] if row["join_side"] == "events" else row["valid_from"]
        return None if t is None else int(t.timestamp() * 1000)

    check_late_rows(test, time_of)
    test.close()


def test_events_wait_for_the_dimension_watermark(tmp_path: Path) -> None:
    test = JoinStreamTest(
        build_asof(delay="0s", dim_delay="0s"),
        left_schema=EVENTS,
        right_schema={"k": pl.Int64, "valid_from": TS, "price": pl.Float64},
        checkpoint=tmp_path,
    )
    at = test.at
    test.add_right({"k": [1], "valid_from": [at("00:00:00")], "price": [10.0]})
    test.add_left({"eid": [1], "k": [1], "ts": [at("00:05:00")]})
    assert test.process().height == 0  # the dimension's watermark is still at 0:00
    # a price change valid from 0:04 arrives later: event 1 must see it
    test.add_right({"k": [1], "valid_from": [at("00:04:00")], "price": [12.0]})
    assert test.process().height == 0  # still waiting: the dimension is at 0:04
    test.add_right({"k": [2], "valid_from": [at("00:06:00")], "price": [1.0]})
    test.add_left({"eid": [2], "k": [1], "ts": [at("00:07:00")]})
    out = test.process()  # the watermark reaches 0:06 >= 0:05
    assert out.select("eid", "price").rows() == [(1, 12.0)]
    state = test.progress[-1]["state"]["join-0"]
    assert state["events_waiting"] == 1  # event 2 at 0:07
    assert state["dimension_versions"] == 2  # 0:00 was superseded by 0:04 before 0:06
    test.close()


def test_a_version_stays_while_an_event_may_still_need_it(tmp_path: Path) -> None:
    test = JoinStreamTest(
        build_asof(delay="0s", dim_delay="0s"),
        left_schema=EVENTS,
        right_schema={"k": pl.Int64, "valid_from": TS, "price": pl.Float64},
        checkpoint=tmp_path,
    )
    at = test.at
    test.add_right(
        {
            "k": [1, 1, 2],
            "valid_from": [at("00:00:05"), at("00:00:11"), at("00:00:10")],
            "price": [1.0, 2.0, 0.0],
        }
    )
    test.add_left({"eid": [1], "k": [3], "ts": [at("00:00:10")]}).process()
    assert test.watermark_ms == ms_of(at("00:00:10"))
    # the 0:05 version is superseded at 0:11 > W: an event at 0:10.5 still needs it
    test.add_left({"eid": [2], "k": [1], "ts": [at("00:00:10.5")]})
    test.add_right({"k": [2], "valid_from": [at("00:00:30")], "price": [0.0]})
    test.process()
    test.add_left({"eid": [3], "k": [3], "ts": [at("00:00:40")]}).process()
    got = test.output.filter(pl.col("eid") == 2)
    assert got.select("price").rows() == [(1.0,)]
    test.close()


def ms_of(ts) -> int:
    return int(ts.timestamp() * 1000)


def test_state_is_bounded_over_a_long_run(tmp_path: Path) -> None:
    keys, batches, per_batch_s, events_per_s = 20, 60, 30, 10
    test = JoinStreamTest(
        build_asof(delay="10s", dim_delay="0s"),
        left_schema=EVENTS,
        right_schema=DIM,
        checkpoint=tmp_path,
    )
    sizes = []
    for b in range(batches):
        t0 = b * per_batch_s * 1000
        n = per_batch_s * events_per_s
        i = pl.int_range(b * n, (b + 1) * n, eager=True)
        ev = pl.DataFrame({"eid": i}).with_columns(
            k=pl.col("eid") % keys,
            ts=(
                pl.lit(T0) + pl.duration(milliseconds=t0 + (pl.col("eid") % n) * 100)
            ).dt.cast_time_unit("ms"),
        )
        # every key gets a new version every 10 s of event time
        j = pl.int_range(0, keys * per_batch_s // 10, eager=True)
        dim = pl.DataFrame({"j": j}).select(
            did=pl.col("j") + b * 1_000,
            k=pl.col("j") % keys,
            valid_from=(
                pl.lit(T0) + pl.duration(milliseconds=t0 + (pl.col("j") // keys) * 10_000)
            ).dt.cast_time_unit("ms"),
        )
        test.add_left(ev).add_right(dim).process()
        state = test.progress[-1]["state"]["join-0"]
        sizes.append((state["events_waiting"], state["dimension_versions"]))
    steady = sizes[batches // 2 :]
    # events wait at most a batch span + the delay; a key keeps the version in force
    # at the watermark plus those newer (one per 10 s of the batch span)
    assert max(s[0] for s in steady) <= events_per_s * (per_batch_s + 10)
    assert max(s[1] for s in steady) <= keys * (1 + per_batch_s // 10)
    assert test.output.height >= (batches - 2) * per_batch_s * events_per_s
    assert test.output["did"].null_count() == 0
    test.close()


def test_restart_gives_identical_output(tmp_path: Path) -> None:
    ev_rows = [(i % 3, (i * 7_919) % 200_000) for i in range(60)]
    dim_rows = [(i % 3, (i * 3_001) % 200_000) for i in range(30)]
    cut = [10, 20, 30, 40, 50]
    cuts = (cut, [5, 10, 15, 20, 25])
    a = run(ev_rows, dim_rows, cuts, tmp_path / "a")[0]
    b = run(ev_rows, dim_rows, cuts, tmp_path / "b", restart_every=2)[0]
    assert a.sink.batches.keys() == b.sink.batches.keys()
    for bid, df in a.sink.batches.items():
        assert b.sink.batches[bid].equals(df, null_equal=True), bid
    assert a.output.height > 0
    a.close()
    b.close()


def test_asof_join_needs_watermarks_on_both_inputs() -> None:
    ev = mb.read_memory(schema=EVENTS).with_watermark("ts", "1s")
    dim = mb.read_memory(schema=DIM)
    with pytest.raises(mb.PlanError, match="right input has no watermark"):
        ev.join_asof_table(dim, on="k", time="ts")
    with pytest.raises(mb.PlanError, match="how='full'"):
        ev.join_asof_table(dim.with_watermark("valid_from", "0s"), on="k", time="ts", how="full")
