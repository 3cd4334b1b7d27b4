"""Operators over a changelog input (rows carrying ``_change_type``).

A windowless ``group_by(...).agg(len, count, sum, mean)`` over the changes
of a keyed table retracts: for random edits (inserts, updates, deletes) of a
table cut into random batches (hypothesis), its result equals a one-shot
Polars ``group_by`` over the table's final state, groups that became empty
absent; in ``update`` mode into the memory table (deletes applied), in
``changelog`` mode applied by the independent oracle of ``change_oracle``.
A ``filter`` relabels updates that cross it; windows, sessions, dedupe,
interval joins, ``min``/``max``/``first``/``last``, ``ttl`` and ``append``
are refused when the query is built.
"""

from __future__ import annotations

import itertools
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from change_oracle import SCHEMA, apply_changes, change_batches, cuts, operations, oracle
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import microbatch as mb
from microbatch.testing import StreamTest

AGGS = [
    pl.len().alias("n"),
    pl.col("w").count().alias("w_count"),
    pl.col("v").sum().alias("total"),
    pl.col("v").mean().alias("avg"),
    pl.col("w").mean().alias("w_avg"),
]
OUT = ["g", "n", "w_count", "total", "avg", "w_avg"]


def with_w(s: Any) -> Any:
    """``w``: ``v`` where positive, else null (so ``count`` and ``mean`` see nulls)."""
    return s.with_columns(w=pl.when(pl.col("v") > 0).then(pl.col("v")))


def query(src: mb.Stream) -> mb.Stream:
    return with_w(src).group_by("g").agg(*AGGS)


def one_shot(batches: list[pl.DataFrame]) -> pl.DataFrame:
    """The one-shot Polars group_by over the source table's final state."""
    table = with_w(oracle(batches))
    return (
        table.group_by("g")
        .agg(
            pl.len().cast(pl.Int64).alias("n"),
            pl.col("w").count().cast(pl.Int64).alias("w_count"),
            pl.col("v").sum().alias("total"),
            pl.col("v").mean().alias("avg"),
            pl.col("w").mean().alias("w_avg"),
        )
        .sort("g")
        .select(OUT)
    )


def same(got: pl.DataFrame, want: pl.DataFrame) -> None:
    got = got.select(OUT).sort("g")
    assert got["g"].to_list() == want["g"].to_list()
    assert got.select("n", "w_count", "total").equals(want.select("n", "w_count", "total"))
    for col in ("avg", "w_avg"):
        for a, b in zip(got[col].to_list(), want[col].to_list(), strict=True):
            assert (a is None) == (b is None), (col, a, b)
            if a is not None:
                assert a == pytest.approx(b, rel=1e-12, abs=1e-12), (col, a, b)


def run(batches: list[pl.DataFrame], tmp: Path, mode: str) -> list[pl.DataFrame]:
    test = StreamTest(query, schema=SCHEMA, output_mode=mode, checkpoint=tmp)  # type: ignore[arg-type]
    out = []
    for frame in batches:
        out.append(test.add(frame).process())
    test.close()
    return out


# ------------------------------------------------------------ group_by retracts


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=operations, cut_at=cuts)
def test_changelog_mode_applied_equals_one_shot_over_final_table(
    tmp_path_factory, ops, cut_at
) -> None:
    batches = change_batches(ops, cut_at)
    changes = run(batches, tmp_path_factory.mktemp("c"), "changelog")
    table: dict[tuple[Any, ...], dict[str, Any]] = {}
    for frame in changes:
        if frame.width:
            apply_changes(table, frame, ("g",))
    got = pl.DataFrame(list(table.values()), schema=one_shot(batches).schema)
    same(got, one_shot(batches))


@settings(max_examples=25, deadline=None)
@given(ops=operations, per_batch=st.integers(1, 7))
def test_update_mode_memory_table_equals_one_shot_for_any_row_split(ops, per_batch) -> None:
    """Batches of ``per_batch`` rows: a preimage and its postimage may land in
    different batches, so a key can empty and come back between them."""
    rows = pl.concat(change_batches(ops, []))
    assume(rows.height > 0)  # no input: the query writes no table at all
    name = f"cl_inputs_{abs(hash((tuple(ops), per_batch)))}"
    q = (
        query(mb.read_memory(rows, max_records_per_batch=per_batch))
        .write_memory(name, output_mode="update")
        .start(trigger="available-now")
    )
    assert q.await_termination()
    same(mb.table(name), one_shot([rows]))


def test_a_group_whose_rows_are_all_deleted_is_deleted(tmp_path: Path) -> None:
    test = StreamTest(query, schema=SCHEMA, output_mode="update", checkpoint=tmp_path)
    row = {"g": "a", "k": 1, "v": 3, "note": "x"}
    first = test.add([{**row, "_change_type": "insert"},
                      {**row, "k": 2, "_change_type": "insert"}]).process()
    assert first.select("g", "n", "total", "_change_type").rows() == [("a", 2, 6, "insert")]
    second = test.add([{**row, "_change_type": "update_preimage"},
                       {**row, "v": 5, "_change_type": "update_postimage"}]).process()
    assert second.select("g", "n", "total", "_change_type").rows() == [
        ("a", 2, 6, "update_preimage"), ("a", 2, 8, "update_postimage")]
    third = test.add([{**row, "v": 5, "_change_type": "delete"},
                      {**row, "k": 2, "_change_type": "delete"}]).process()
    assert third.select("g", "n", "total", "avg", "_change_type").rows() == [
        ("a", 2, 8, 4.0, "delete")]
    # the key left the state: it comes back as a new group
    fourth = test.add([{**row, "v": 7, "_change_type": "insert"}]).process()
    assert fourth.select("g", "n", "total", "_change_type").rows() == [("a", 1, 7, "insert")]
    test.restart()
    fifth = test.add([{**row, "v": 7, "_change_type": "delete"}]).process()
    assert fifth.select("g", "n", "_change_type").rows() == [("a", 1, "delete")]
    test.close()


def test_complete_mode_holds_only_live_groups(tmp_path: Path) -> None:
    test = StreamTest(query, schema=SCHEMA, output_mode="complete", checkpoint=tmp_path)
    row = {"g": "a", "k": 1, "v": 3, "note": "x"}
    test.add([{**row, "_change_type": "insert"},
              {**row, "g": "b", "_change_type": "insert"}]).process()
    out = test.add([{**row, "_change_type": "delete"}]).process()
    assert out.select("g", "n").rows() == [("b", 1)]
    test.close()


def test_decimal_sums_retract_exactly(tmp_path: Path) -> None:
    schema = {"g": pl.String, "amount": pl.Decimal(18, 2), "_change_type": pl.String}
    test = StreamTest(
        lambda s: s.group_by("g").agg(pl.col("amount").sum().alias("total")),
        schema=schema, output_mode="update", checkpoint=tmp_path,
    )
    from decimal import Decimal

    big, small = Decimal("1000000000000000.01"), Decimal("0.10")
    test.add(pl.DataFrame({"g": ["a", "a"], "amount": [big, small],
                           "_change_type": ["insert", "insert"]}, schema=schema)).process()
    out = test.add(pl.DataFrame({"g": ["a"], "amount": [big], "_change_type": ["delete"]},
                                schema=schema)).process()
    assert out.filter(pl.col("_change_type") == "update_postimage")["total"].to_list() == [small]
    test.close()


def test_an_unknown_change_type_is_refused_naming_it(tmp_path: Path) -> None:
    test = StreamTest(query, schema=SCHEMA, output_mode="update", checkpoint=tmp_path)
    with pytest.raises(mb.ChangelogInputError, match=r"upsert.*one of \['insert'"):
        test.add([{"g": "a", "k": 1, "v": 1, "note": "", "_change_type": "upsert"}]).process()
    test.close()


# ------------------------------------------------------------ filter relabels


def test_a_filter_relabels_updates_that_cross_it(tmp_path: Path) -> None:
    test = StreamTest(lambda s: s.filter(pl.col("v") > 10), schema=SCHEMA,
                      output_mode="changelog", checkpoint=tmp_path)
    def r(k: int, v: int, ct: str) -> dict[str, Any]:
        return {"g": "a", "k": k, "v": v, "note": "", "_change_type": ct}
    out = test.add([
        r(1, 5, "update_preimage"), r(1, 50, "update_postimage"),    # enters: insert
        r(2, 60, "update_preimage"), r(2, 6, "update_postimage"),    # leaves: delete
        r(3, 70, "update_preimage"), r(3, 80, "update_postimage"),   # stays: update
        r(4, 1, "update_preimage"), r(4, 2, "update_postimage"),     # outside: nothing
        r(5, 90, "insert"), r(6, 3, "delete"), r(7, 99, "delete"),
    ]).process()
    assert out.select("k", "v", "_change_type").rows() == [
        (1, 50, "insert"), (2, 60, "delete"), (3, 70, "update_preimage"),
        (3, 80, "update_postimage"), (5, 90, "insert"), (7, 99, "delete"),
    ]
    test.close()


def test_a_filter_on_the_change_type_selects_changes_without_relabelling(
    tmp_path: Path,
) -> None:
    test = StreamTest(lambda s: s.filter(pl.col("_change_type") != "update_preimage"),
                      schema=SCHEMA, output_mode="changelog", checkpoint=tmp_path)
    row = {"g": "a", "k": 1, "v": 1, "note": ""}
    out = test.add([{**row, "_change_type": "update_preimage"},
                    {**row, "v": 2, "_change_type": "update_postimage"}]).process()
    assert out.select("v", "_change_type").rows() == [(2, "update_postimage")]
    test.close()


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=operations, cut_at=cuts, bound=st.integers(-5, 5))
def test_filtered_changes_applied_equal_the_filtered_table(
    tmp_path_factory, ops, cut_at, bound
) -> None:
    """The filter's output, applied in order, is the source table filtered, and a
    group_by after it still equals the one-shot result over that table."""
    batches = change_batches(ops, cut_at)
    test = StreamTest(lambda s: s.filter(pl.col("v") > bound), schema=SCHEMA,
                      output_mode="changelog", checkpoint=tmp_path_factory.mktemp("f"))
    table: dict[tuple[Any, ...], dict[str, Any]] = {}
    for frame in batches:
        out = test.add(frame).process()
        if out.width:
            apply_changes(table, out)
    test.close()
    want = oracle(batches).filter(pl.col("v") > bound)
    got = pl.DataFrame(list(table.values()), schema=want.schema).sort("g", "k")
    assert got.equals(want)


# ------------------------------------------------------------ refusals

CL = {"g": pl.String, "v": pl.Int64, "ts": pl.Datetime("ms"), "_change_type": pl.String}


def changes() -> mb.Stream:
    return mb.read_memory(schema=CL)


@pytest.mark.parametrize(
    ("build", "what"),
    [
        (lambda s: s.with_watermark("ts", "1s").group_by(mb.window("ts", "1m"), "g")
         .agg(pl.len()), r"group_by\(a window"),
        (lambda s: s.with_watermark("ts", "1s").group_by(mb.session_window("ts", "1m"), "g")
         .agg(pl.len()), r"group_by\(a session window"),
        (lambda s: s.with_watermark("ts", "1s").drop_duplicates("g", within="1m"),
         "drop_duplicates"),
        (lambda s: s.drop_duplicates("g", ttl="1m"), "drop_duplicates"),
        (lambda s: s.with_watermark("ts", "1s").join_interval(
            mb.read_memory(schema={"g": pl.String, "t2": pl.Datetime("ms")})
            .with_watermark("t2", "1s"),
            on="g", left_time="ts", right_time="t2", lower="-1m", upper="1m"),
         r"interval or window join \(this stream\)"),
        (lambda s: mb.read_memory(schema={"g": pl.String, "t2": pl.Datetime("ms")})
         .with_watermark("t2", "1s").join_interval(
            s.with_watermark("ts", "1s"),
            on="g", left_time="t2", right_time="ts", lower="-1m", upper="1m"),
         r"interval or window join \(the other stream\)"),
    ],
)
def test_event_time_operators_refuse_a_changelog(build, what) -> None:
    with pytest.raises(mb.ChangelogInputError, match=what) as err:
        build(changes())
    message = str(err.value)
    assert "need an insert-only stream" in message
    assert '.filter(pl.col("_change_type") == "insert").drop("_change_type")' in message
    assert "windowless group_by" in message


@pytest.mark.parametrize("kind", ["min", "max", "first", "last"])
def test_min_max_first_last_are_refused_naming_alternatives(kind) -> None:
    with pytest.raises(mb.ChangelogInputError, match=f"{kind}\\('v'\\).*cannot be retracted") as e:
        changes().group_by("g").agg(getattr(pl.col("v"), kind)())
    assert "transform_with_state" in str(e.value)
    assert "pl.len(), count, sum, mean" in str(e.value)


def test_ttl_and_unsigned_sums_are_refused() -> None:
    with pytest.raises(mb.ChangelogInputError, match="ttl"):
        changes().group_by("g", ttl="1d").agg(pl.len())
    with pytest.raises(mb.ChangelogInputError, match=r"cast\(pl.Int64\)"):
        changes().with_columns(pl.col("v").cast(pl.UInt32)).group_by("g").agg(pl.col("v").sum())


def test_append_mode_is_refused_for_a_changelog_group_by() -> None:
    with pytest.raises(mb.PlanError, match="output_mode='append' cannot emit a group_by"):
        changes().group_by("g").agg(pl.len()).write_memory("cl_append")


def test_insert_only_fix_makes_windows_work() -> None:
    """The fix the refusal names builds: an insert-only stream takes windows."""
    stream = (
        changes().filter(pl.col("_change_type") == "insert").drop("_change_type")
        .with_watermark("ts", "1s").group_by(mb.window("ts", "1m"), "g").agg(pl.len())
    )
    assert "_change_type" not in stream.schema


def test_steps_pass_changes_through() -> None:
    stream = changes().with_columns(v2=pl.col("v") * 2).select("g", "v2", "_change_type")
    assert stream.schema["_change_type"] == pl.String
    assert list(itertools.islice(stream.schema, 2)) == ["g", "v2"]


def test_an_upsert_topic_is_refused_under_a_group_by() -> None:
    """No preimages: the old row of a changed key could not be taken back."""
    topic = mb.read_kafka("t", bootstrap="127.0.0.1:1", format="upsert",
                          schema={"g": pl.String, "v": pl.Int64}, key_columns=["g"])
    with pytest.raises(mb.ChangelogInputError, match=r"no update_preimage.*debezium-json"):
        topic.group_by("g").agg(pl.len())
    topic.filter(pl.col("v") > 0)  # stateless steps are fine


def test_an_aggregation_of_a_windowless_aggregations_updates_is_refused_when_built() -> None:
    """A windowless group_by emits updates (a key's new value, again and again); a
    second aggregation over them counted every update as a row (found by Nexmark q4:
    sum of per-key maxima 27 instead of 20, 5 keys instead of 3). Refused at build;
    a windowed first aggregation (final rows) may still be aggregated again."""
    rows = pl.DataFrame({"k": [1, 1, 2, 1, 2, 3], "v": [1, 5, 2, 7, 9, 4],
                         "ts": [datetime(2026, 1, 1, tzinfo=UTC)] * 6})
    per_key = mb.read_memory(rows, schema=rows.schema).group_by("k").agg(
        pl.col("v").max().alias("m"))
    with pytest.raises(mb.ChangelogInputError, match=r"windowless group_by\(k\)"):
        per_key.with_columns(g=pl.lit(1)).group_by("g").agg(pl.col("m").sum())
    windowed = (mb.read_memory(rows, schema=rows.schema).with_watermark("ts", "1s")
                .group_by(mb.window("ts", "1m"), "k").agg(pl.col("v").max().alias("m")))
    windowed.group_by("window_start").agg(pl.col("m").sum())  # accepted
