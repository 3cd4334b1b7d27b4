"""transform_with_state, map_groups_with_state and TTL: oracles under random
splits and restarts, timers (event and processing time, on an idle query),
TTL on every keyed operator, schema evolution and the errors users see."""

from __future__ import annotations

import itertools
import time
from datetime import UTC, datetime
from pathlib import Path

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import microbatch as mb
from microbatch.exceptions import IncompatibleCheckpointError, PlanError, TransformError
from microbatch.observability.status import status_document
from microbatch.testing import StreamTest

T0 = datetime(2026, 1, 1, tzinfo=UTC)
MIN = 60_000


def running_count(inp: mb.StateInput) -> mb.StateOutput:
    """Per key: the count so far after each batch (one output row per key touched)."""
    counts = (inp.rows.group_by("k", maintain_order=True).agg(pl.len().alias("new"))
              .join(inp.state, on="k", how="left", nulls_equal=True)
              .select("k", (pl.col("new") + pl.col("n").fill_null(0)).alias("n")))
    return mb.StateOutput(rows=counts, upserts=counts)


def counting(stream: mb.Stream, **options: object) -> mb.Stream:
    return stream.group_by("k").transform_with_state(
        running_count, state_schema={"n": pl.Int64}, output_schema={"k": pl.Int64, "n": pl.Int64},
        **options)  # type: ignore[arg-type]


# ------------------------------------------------------------ the oracle


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(keys=st.lists(st.one_of(st.none(), st.integers(0, 6)), min_size=1, max_size=60),
       cuts=st.lists(st.integers(1, 59), max_size=6), restart=st.integers(-1, 6))
def test_running_count_equals_the_one_shot_count(tmp_path_factory: pytest.TempPathFactory,
                                                 keys: list[int | None], cuts: list[int],
                                                 restart: int) -> None:
    """The last count emitted per key is its total, every emitted count is a
    running count at a batch boundary, and fn runs once per batch (not per key)."""
    calls: list[int] = []

    def fn(inp: mb.StateInput) -> mb.StateOutput:
        calls.append(inp.batch_id)
        return running_count(inp)

    t = StreamTest(lambda s: s.group_by("k").transform_with_state(
        fn, state_schema={"n": pl.Int64}), schema={"k": pl.Int64},
        checkpoint=tmp_path_factory.mktemp("c"))
    data = pl.DataFrame({"k": keys}, schema={"k": pl.Int64})
    bounds = [0, *sorted({c for c in cuts if c < len(keys)}), len(keys)]
    boundaries = []
    for i, (lo, hi) in enumerate(itertools.pairwise(bounds)):
        t.add(data.slice(lo, hi - lo)).process()
        boundaries.append(hi)
        if i == restart:
            t.restart()
    out = t.output
    final = out.group_by("k", maintain_order=True).last()
    want = data.group_by("k").agg(pl.len().cast(pl.Int64).alias("n"))
    assert final.sort("k", nulls_last=True).equals(want.sort("k", nulls_last=True))
    prefix_counts = {
        (k, n) for b in boundaries
        for k, n in data.head(b).group_by("k").agg(pl.len().cast(pl.Int64)).rows()}
    assert set(out.rows()) <= prefix_counts
    assert len(calls) == len(set(calls)) == len(boundaries)  # once per batch with rows
    t.close()


def test_map_groups_with_state_is_one_call_per_key_with_the_same_result(tmp_path: Path) -> None:
    seen: list[tuple[object, ...]] = []

    def total(key: tuple[object, ...], rows: pl.DataFrame, state: dict[str, object] | None
              ) -> tuple[pl.DataFrame, dict[str, object] | None]:
        seen.append(key)
        new = int((state or {"total": 0})["total"]) + int(rows["v"].sum())  # type: ignore[call-overload]
        out = pl.DataFrame({"k": [key[0]], "total": [new]})
        return out, (None if new > 100 else {"total": new})  # None deletes the state

    t = StreamTest(lambda s: s.group_by("k").map_groups_with_state(
        total, state_schema={"total": pl.Int64}), schema={"k": pl.Int64, "v": pl.Int64},
        checkpoint=tmp_path)
    t.add({"k": [1, 2, 1], "v": [5, 7, 1]}).process()
    t.add({"k": [1, 2], "v": [100, 3]}).process()
    t.add({"k": [1], "v": [2]}).process()
    assert t.output.rows() == [(1, 6), (2, 7), (1, 106), (2, 10), (1, 2)]
    assert seen == [(1,), (2,), (1,), (2,), (1,)]
    t.close()


# ------------------------------------------------------------ timers


def beats(inp: mb.StateInput) -> mb.StateOutput:
    """Remember the latest heartbeat; a timer 5 min later says "offline" unless a
    newer heartbeat moved it (event or processing time, as the rows ask)."""
    kind = "processing" if "processing" in inp.rows.columns else "event"
    latest = inp.rows.group_by("k", maintain_order=True).agg(
        pl.col("ts").max().dt.epoch("ms").alias("last"))
    if kind == "processing":
        latest = latest.with_columns(pl.lit(inp.timestamp_ms).alias("last"))
    merged = pl.concat([inp.state, latest]).group_by("k", maintain_order=True).agg(
        pl.col("last").max())
    fired = inp.timers.join(merged, on="k").filter(pl.col("timer_ms") == pl.col("last") + 5 * MIN)
    return mb.StateOutput(
        rows=fired.select("k", pl.col("timer_ms").alias("offline_at"), "timer_kind"),
        upserts=merged,
        timers=latest.select("k", (pl.col("last") + 5 * MIN).alias("timer_ms"),
                             pl.lit(kind).alias("timer_kind")),
    )


def test_event_time_timers_fire_when_the_watermark_passes_them_across_a_restart(
        tmp_path: Path) -> None:
    t = StreamTest(lambda s: s.with_watermark("ts", "0s").group_by("k").transform_with_state(
        beats, state_schema={"last": pl.Int64}), schema={"k": pl.Int64,
                                                         "ts": pl.Datetime("ms", "UTC")},
        checkpoint=tmp_path)
    t.add({"k": [1, 2], "ts": [t.at("00:00:00"), t.at("00:01:00")]}).process()
    t.add({"k": [2], "ts": [t.at("00:04:00")]}).process()
    t.restart()
    assert t.add({"k": [3], "ts": [t.at("00:05:00.001")]}).process().rows() == [
        (1, int(t.at("00:05:00").timestamp() * 1000), "event")]  # 2 was heard at 00:04
    # k=3's timer (00:10:00.001) fires with a newer row of k=3 in the same batch:
    # fn sees both and, by its rule, the newer heartbeat wins
    got = t.add({"k": [3], "ts": [t.at("00:20:00")]}).process()
    assert got.rows() == [(2, int(t.at("00:09:00").timestamp() * 1000), "event")]
    got = t.add({"k": [4], "ts": [t.at("00:30:00")]}).process()
    assert got.rows() == [(3, int(t.at("00:25:00").timestamp() * 1000), "event")]
    assert t.progress[-1]["state"]["transform-0"]["timers_fired"] == 1
    t.close()


def test_processing_time_timers_fire_on_an_idle_query_by_the_recorded_clock(
        tmp_path: Path) -> None:
    t = StreamTest(lambda s: s.group_by("k").transform_with_state(
        beats, state_schema={"last": pl.Int64}), schema={"k": pl.Int64, "processing": pl.Int64,
                                                         "ts": pl.Datetime("ms", "UTC")},
        checkpoint=tmp_path)
    t.add({"k": [1], "processing": [1], "ts": [t.at("00:00:00")]}).process()
    batches = len(t.progress)
    assert t.advance_clock(299).process().is_empty()
    assert len(t.progress) == batches  # nothing due: no batch
    fired = t.advance_clock(1).process()  # 5 min after the batch that heard k=1
    assert fired.rows() == [(1, int(t.at("00:05:00").timestamp() * 1000), "processing")]
    assert t.progress[-1]["input_rows"] == 0  # a no-data batch fired it
    assert t.progress[-1]["state"]["transform-0"]["timers_fired"] == 1
    t.close()


def test_an_idle_running_query_fires_a_processing_time_timer(tmp_path: Path) -> None:
    def remind(inp: mb.StateInput) -> mb.StateOutput:
        return mb.StateOutput(
            rows=inp.timers.select("k", pl.lit("reminder").alias("what")),
            timers=inp.rows.select("k", pl.lit(inp.timestamp_ms + 300).alias("timer_ms"),
                                   pl.lit("processing").alias("timer_kind")))

    src = mb.read_memory(schema={"k": pl.Int64})
    query = (src.group_by("k").transform_with_state(remind, state_schema={"x": pl.Int64})
             .write_memory("tws_idle").start(tmp_path, trigger="50ms"))
    try:
        src.add({"k": [7]})
        deadline = time.monotonic() + 30

        def fired() -> list[dict[str, object]]:
            return [p for p in query.recent_progress if p["state"]["transform-0"]["timers_fired"]]

        while not fired() and time.monotonic() < deadline:
            time.sleep(0.02)
        [batch] = fired()
        assert batch["input_rows"] == 0  # no row arrived: the trigger ran a no-data batch
        assert mb.table("tws_idle").rows() == [(7, "reminder")]
    finally:
        query.stop()


def test_a_timer_due_before_the_ttl_sees_the_state_it_outlived() -> None:
    """Event-time TTL and timers keep time order: the watermark jumps past the
    state's expiry (00:01:00, 1 min after its row) and both keys' timers at once;
    the timer at 00:00:30 fired while the state lived and sees it, the one at
    00:01:30 fired after it expired and does not. Neither writes it again: both
    count as expired."""
    def fn(inp: mb.StateInput) -> mb.StateOutput:
        rows = inp.timers.join(inp.state, on="k", how="left").select(
            "k", "timer_ms", pl.col("n").alias("state_n"))
        new = inp.rows.group_by("k").agg(pl.len().alias("n"))
        at = inp.rows.group_by("k").agg(pl.col("at").first().alias("timer_ms"))
        return mb.StateOutput(rows=rows, upserts=new, timers=at)

    t = StreamTest(lambda s: s.with_watermark("ts", "0s").group_by("k").transform_with_state(
        fn, state_schema={"n": pl.UInt32}, ttl="1m", ttl_time="event", time_column="ts"),
        schema={"k": pl.Int64, "ts": pl.Datetime("ms", "UTC"), "at": pl.Int64})
    ms = int(t.at("00:00:00").timestamp() * 1000)
    t.add({"k": [1, 2], "ts": [t.at("00:00:00")] * 2, "at": [ms + 30_000, ms + 90_000]}).process()
    got = t.add({"k": [9], "ts": [t.at("00:10:00")], "at": [None]}).process()
    assert sorted(got.rows()) == [(1, ms + 30_000, 1), (2, ms + 90_000, None)]
    assert t.progress[-1]["state"]["transform-0"]["expired_rows"] == 2
    t.close()


# ------------------------------------------------------------ TTL


def test_group_by_ttl_forgets_idle_keys_and_counts_them(tmp_path: Path) -> None:
    t = StreamTest(lambda s: s.group_by("k", ttl="10s").agg(pl.len().alias("n")),
                   schema={"k": pl.Int64}, output_mode="update", checkpoint=tmp_path)
    t.add({"k": [1, 1, 2]}).process()
    t.advance_clock(5)
    t.add({"k": [2]}).process()  # refreshes 2, not 1
    t.advance_clock(6)  # 11 s after 1's update, 6 s after 2's
    assert t.add({"k": [1, 2]}).process().sort("k").rows() == [(1, 1), (2, 3)]
    agg = t.progress[-1]["state"]["agg-0"]
    assert (agg["expired_rows"], agg["eviction"]) == (1, "ttl")
    assert t.progress[-1]["state_expired_rows"] == 1
    t.restart()  # the expiry times survive a restart
    t.advance_clock(11)
    t.process()  # an idle query: the TTL makes a no-data batch
    assert t.progress[-1]["input_rows"] == 0
    assert t.progress[-1]["state"]["agg-0"]["expired_rows"] == 2
    assert t.progress[-1]["state_rows"] == 0
    t.close()


def test_drop_duplicates_ttl_needs_no_watermark_and_forgets_after_ttl() -> None:
    t = StreamTest(lambda s: s.drop_duplicates("id", ttl="1m"), schema={"id": pl.String})
    assert t.add({"id": ["a", "b", "a"]}).process()["id"].to_list() == ["a", "b"]
    t.advance_clock(30)
    assert t.add({"id": ["a", "c"]}).process()["id"].to_list() == ["c"]
    t.advance_clock(31)  # a and b kept 61 s ago, c 31 s ago
    assert t.add({"id": ["a", "b", "c"]}).process()["id"].to_list() == ["a", "b"]
    assert t.progress[-1]["state"]["dedupe-0"]["expired_rows"] == 2
    t.close()
    with pytest.raises(PlanError, match="exactly one bound"):
        mb.read_memory(schema={"id": pl.String}).drop_duplicates("id")


@pytest.mark.parametrize("ttl", [None, "3s"])
def test_ever_new_keys_with_ttl_keep_state_bounded_and_status_shows_it(
        tmp_path: Path, ttl: str | None) -> None:
    """A long stream of ever-new keys (request ids): with ttl the state holds only
    the keys of the last few seconds, and status shows expiry, no alarm; without
    it the state grows and status names the operator and suggests ttl."""
    t = StreamTest(lambda s: s.group_by("request_id", ttl=ttl).agg(pl.len().alias("n")),
                   schema={"request_id": pl.Int64}, output_mode="update", checkpoint=tmp_path)
    per_batch = 500
    for b in range(40):
        t.add({"request_id": range(b * per_batch, (b + 1) * per_batch)}).process()
        t.advance_clock(1)
    sizes = [p["state_rows"] for p in t.progress]
    doc = status_document(tmp_path, last=10)
    codes = [a["code"] for a in doc["alarms"]]
    if ttl is None:
        assert sizes[-1] == 40 * per_batch
        [alarm] = [a for a in doc["alarms"] if a["code"] == "state_growing"]
        assert "agg-0" in alarm["message"]
        assert 'group_by(..., ttl="1d")' in alarm["message"]
    else:
        assert max(sizes) <= 4 * per_batch  # keys of the last 3 s (+ the batch's own)
        assert sum(p["state_expired_rows"] for p in t.progress) == 40 * per_batch - sizes[-1]
        assert doc["state_operators"]["agg-0"]["eviction"] == "ttl"
        assert doc["recent_state_expired_rows"] == 10 * per_batch
        assert "state_growing" not in codes
    t.close()


# ------------------------------------------------------------ event-time order


def test_event_time_order_releases_rows_once_in_event_time_order() -> None:
    seen: list[list[int]] = []

    def fn(inp: mb.StateInput) -> mb.StateOutput:
        seen.append(inp.rows["v"].to_list())
        return mb.StateOutput()

    t = StreamTest(lambda s: s.with_watermark("ts", "10s").group_by("k").transform_with_state(
        fn, state_schema={"x": pl.Int64}, time_column="ts", event_time_order=True),
        schema={"k": pl.Int64, "ts": pl.Datetime("ms", "UTC"), "v": pl.Int64})
    t.add({"k": [1, 1, 1], "ts": [t.at("00:00:05"), t.at("00:00:01"), t.at("00:00:03")],
           "v": [5, 1, 3]}).process()
    t.add({"k": [1, 1], "ts": [t.at("00:00:02"), t.at("00:00:30")], "v": [2, 30]}).process()
    t.add({"k": [1], "ts": [t.at("00:00:31")], "v": [31]}).process()
    assert [v for v in seen if v] == [[1, 2, 3, 5]]  # released when the watermark passed 5
    assert t.progress[-1]["state"]["transform-0"]["waiting_rows"] == 2
    t.close()


# ------------------------------------------------------------ schema and errors


def test_an_added_state_column_is_accepted_other_changes_are_refused(tmp_path: Path) -> None:
    def keep(inp: mb.StateInput) -> mb.StateOutput:
        return mb.StateOutput(rows=inp.state, upserts=inp.rows.group_by("k").agg(
            pl.len().cast(pl.Int64).alias("n")).join(inp.state.drop("n"), on="k", how="left"))

    def build(schema: dict[str, pl.DataType]) -> StreamTest:
        return StreamTest(lambda s: s.group_by("k").transform_with_state(
            keep, state_schema=schema), schema={"k": pl.Int64}, checkpoint=tmp_path)

    t = build({"n": pl.Int64()})
    t.add({"k": [1, 2]}).process()
    t.close()
    t = build({"n": pl.Int64(), "note": pl.String()})
    # a new memory source on the old checkpoint: its first two rows count as read
    assert t.add({"k": [0, 0, 1]}).process().rows() == [(1, 1, None)]  # the new column is null
    t.close()
    with pytest.raises(IncompatibleCheckpointError, match=r"column n: Int64 -> Float64 retyped"):
        build({"n": pl.Float64(), "note": pl.String()})
    with pytest.raises(IncompatibleCheckpointError, match=r"column 'note' removed"):
        build({"n": pl.Int64()})


@pytest.mark.parametrize(("answer", "message"), [
    (lambda inp: 42, "returned int; it must return a StateOutput"),
    (lambda inp: 1 / 0, "failed in batch 0: ZeroDivisionError"),
    (lambda inp: mb.StateOutput(upserts=inp.rows.select("k")),
     r"upserts lacks column\(s\) \['n'\]"),
    (lambda inp: mb.StateOutput(upserts=inp.rows.select("k", n=pl.lit("x"))),
     "does not fit the declared types"),
    (lambda inp: mb.StateOutput(upserts=inp.rows.select("k", n=pl.lit(1))),
     "keys that appear more than once"),
    (lambda inp: mb.StateOutput(timers=inp.rows.select("k", timer_ms=pl.lit(1),
                                                       timer_kind=pl.lit("wall"))),
     "timer_kind must be 'event' or 'processing'"),
    (lambda inp: mb.StateOutput(rows=inp.rows.select("k")), "lacks column"),
])
def test_a_function_that_misbehaves_gets_a_clear_error(answer: object, message: str) -> None:
    t = StreamTest(lambda s: s.group_by("k").transform_with_state(
        answer, state_schema={"n": pl.Int64}, output_schema={"k": pl.Int64, "n": pl.Int64}),
        schema={"k": pl.Int64})
    with pytest.raises(TransformError, match=message):
        t.add({"k": [1, 1]}).process()
    t.close()


def test_plan_errors_name_the_fix() -> None:
    src = mb.read_memory(schema={"k": pl.Int64, "ts": pl.Datetime("ms", "UTC")})
    with pytest.raises(PlanError, match="with_watermark"):
        src.group_by("k").transform_with_state(running_count, state_schema={"n": pl.Int64},
                                               time_column="ts", event_time_order=True)
    with pytest.raises(PlanError, match="clash"):
        src.group_by("k").transform_with_state(running_count, state_schema={"k": pl.Int64})
    with pytest.raises(PlanError, match="drop the window"):
        src.with_watermark("ts", "1s").group_by(mb.window("ts", "1m")).transform_with_state(
            running_count, state_schema={"n": pl.Int64})
    with pytest.raises(PlanError, match="ttl"):
        src.with_watermark("ts", "1s").group_by(mb.window("ts", "1m"), ttl="1h")
