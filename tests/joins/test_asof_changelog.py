"""Temporal joins against a changelog dimension (rows with ``_change_type``).

The oracle is one-shot Polars over the whole input, written from the rule in
docs/semantics.md ("Joins", changelog dimension), not from the operator: drop
preimages and the dimension rows the engine reported late; a change's time is
its ``valid_from`` (a delete's: its ``_commit_timestamp`` when the dimension has
one); of two changes of a key with the same time the later wins; each event
that was not late and that the final watermark reached takes its key's last
change at or before its time (``join_asof`` backward), and a ``delete`` there
means no value (nulls, or no row for ``how="inner"``).
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from join_helpers import (
    T0,
    TS,
    assert_same_rows,
    check_late_rows,
    frame,
    ms,
    not_late,
    run_two,
)

import microbatch as mb
from microbatch.testing import JoinStreamTest

EVENTS = {"eid": pl.Int64, "k": pl.Int64, "ts": TS}
DIM = {"rid": pl.Int64, "k": pl.Int64, "did": pl.Int64, "valid_from": TS, "_change_type": pl.String}
DIM_COMMIT = {**DIM, "_commit_timestamp": TS}
DIM_VALUES = ["rid", "did", "valid_from"]

events = st.lists(
    st.tuples(st.sampled_from([0, 1, None]), st.integers(0, 60).map(lambda s: s * 1000)),
    min_size=8,
    max_size=40,
)
edits = st.lists(
    st.tuples(
        st.sampled_from([0, 1]),
        st.integers(0, 60).map(lambda s: s * 1000),
        st.sampled_from(["upsert", "upsert", "delete"]),
    ),
    min_size=4,
    max_size=25,
)
cuts = st.tuples(*[st.lists(st.integers(1, 39), min_size=2, max_size=10)] * 2)


def changelog(ops: list[tuple[int, int, str]], *, commit: bool) -> pl.DataFrame:
    """Valid change rows for ``ops`` (key, change time ms, action), one ``rid`` each.

    ``did`` is the version's value (the edit's number). Without ``commit`` a row's
    ``valid_from`` is its change time (as a Kafka record time); with ``commit`` every
    row has ``_commit_timestamp`` = its change time (+0.5 s for a version, so that the
    two columns differ), a version's ``valid_from`` is its change time and a delete's
    is the deleted row's (its image), as a Delta CDF of a user column.
    """
    table: dict[int, dict[str, Any]] = {}
    rows: list[dict[str, Any]] = []

    def at(t: int) -> Any:
        return T0 + timedelta(milliseconds=t)

    for i, (k, t, action) in enumerate(ops):
        old = table.get(k)
        new = {"k": k, "did": i, "valid_from": at(t)}
        if commit:
            new["_commit_timestamp"] = at(t + 500)
        if action == "delete":
            if old is None:
                continue
            gone = {**old, "_change_type": "delete"}
            if commit:
                gone["_commit_timestamp"] = at(t)
            else:
                gone["valid_from"] = at(t)
            rows.append(gone)
            del table[k]
            continue
        if old is not None:
            rows.append({**old, "_change_type": "update_preimage"})
        rows.append({**new, "_change_type": "insert" if old is None else "update_postimage"})
        table[k] = new
    schema = DIM_COMMIT if commit else DIM
    return pl.DataFrame(
        [{**r, "rid": n} for n, r in enumerate(rows)], schema=schema
    ).select(list(schema))


def build(how: str = "left", delay: str = "5s", dim_delay: str = "2s"):
    def make(ev, dim):
        return ev.with_watermark("ts", delay).join_asof_table(
            dim.with_watermark("valid_from", dim_delay),
            on="k",
            time="ts",
            dim_time="valid_from",
            how=how,
        )

    return make


def effective_time(dim: pl.DataFrame) -> pl.Expr:
    """When a change takes effect: its valid_from; a delete's commit time if known."""
    if "_commit_timestamp" not in dim.columns:
        return pl.col("valid_from")
    deleted = pl.col("_change_type") == "delete"
    return pl.when(deleted).then(pl.col("_commit_timestamp")).otherwise(pl.col("valid_from"))


def oracle(test: JoinStreamTest, ev: pl.DataFrame, dim: pl.DataFrame, how: str) -> pl.DataFrame:
    wm = test.watermark_ms
    kept = not_late(ev, test, "events", "eid")
    kept = kept.filter(ms("ts") <= wm) if wm is not None else kept.head(0)
    changes = (
        not_late(dim, test, "dimension", "rid")
        .filter(pl.col("_change_type") != "update_preimage")
        .with_columns(effective_time(dim).alias("t_eff"))
        .unique(["k", "t_eff"], keep="last", maintain_order=True)
        .sort("t_eff")
    )
    out = kept.sort("ts").join_asof(
        changes, left_on="ts", right_on="t_eff", by="k", check_sortedness=False
    )
    values = [c for c in dim.columns if c not in ("k", "_change_type")]
    live = pl.col("_change_type").fill_null("") != "delete"
    out = out.with_columns(pl.when(live).then(pl.col(c)).alias(c) for c in values)
    if how == "inner":
        out = out.filter(pl.col("rid").is_not_null())
    return out.select("eid", "k", "ts", *values)


@pytest.mark.parametrize("how", ["left", "inner"])
@pytest.mark.parametrize("commit", [False, True], ids=["own-time", "commit-time"])
@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(inputs=st.tuples(events, edits), cuts=cuts)
def test_changelog_dimension_split_invariance(tmp_path_factory, how, commit, inputs, cuts):
    ev_rows, ops = inputs
    ev = frame(ev_rows, "eid")
    dim = changelog(ops, commit=commit)
    schema = DIM_COMMIT if commit else DIM
    test = run_two(
        build(how), ev, dim, cuts, tmp_path_factory.mktemp("c"),
        left_schema=EVENTS, right_schema=schema,
    )
    want = oracle(test, ev, dim, how)
    assert "_change_type" not in test.output.columns
    assert_same_rows(test.output, want)

    def time_of(row: dict[str, Any]) -> int | None:
        if row["join_side"] == "events":
            t = row["ts"]
        elif commit and row["_change_type"] == "delete":
            t = row["_commit_timestamp"]
        else:
            t = row["valid_from"]
        return None if t is None else int(t.timestamp() * 1000)

    check_late_rows(test, time_of)
    assert "update_preimage" not in set(test.late_rows.get_column("_change_type", default=[]))
    test.close()


def dim_test(tmp_path: Path, *, how: str = "left") -> JoinStreamTest:
    return JoinStreamTest(
        build(how, delay="0s", dim_delay="0s"),
        left_schema=EVENTS,
        right_schema={"k": pl.Int64, "valid_from": TS, "price": pl.Float64,
                      "_change_type": pl.String},
        checkpoint=tmp_path,
    )


def changes(test: JoinStreamTest, rows: list[tuple[int, str, float, str]]) -> dict[str, list]:
    return {
        "k": [r[0] for r in rows],
        "valid_from": [test.at(r[1]) for r in rows],
        "price": [r[2] for r in rows],
        "_change_type": [r[3] for r in rows],
    }


def test_an_event_before_a_delete_keeps_the_value_it_had(tmp_path: Path) -> None:
    test = dim_test(tmp_path)
    test.add_right(changes(test, [
        (1, "00:00:00", 10.0, "insert"),
        (1, "00:00:00", 10.0, "update_preimage"),
        (1, "00:02:00", 12.0, "update_postimage"),
        (1, "00:04:00", 12.0, "delete"),
        (2, "00:00:00", 5.0, "insert"),
    ]))
    test.add_left({"eid": [1, 2, 3, 4], "k": [1, 1, 1, 2],
                   "ts": [test.at(t) for t in ("00:01:00", "00:03:00", "00:05:00", "00:05:00")]})
    test.process()
    test.add_right(changes(test, [(3, "00:09:00", 0.0, "insert")]))
    test.add_left({"eid": [5], "k": [3], "ts": [test.at("00:09:00")]})
    test.process()
    out = test.output.sort("eid")
    assert out.columns == ["eid", "k", "ts", "valid_from", "price"]
    assert out.select("eid", "price").rows() == [
        (1, 10.0), (2, 12.0), (3, None), (4, 5.0), (5, 0.0)
    ]
    # the tombstone's columns never leak: event 3 has no valid_from either
    assert out.filter(pl.col("eid") == 3)["valid_from"].to_list() == [None]
    test.close()


def test_inner_drops_events_after_a_delete_and_a_reinsert_revives_the_key(tmp_path: Path) -> None:
    test = dim_test(tmp_path, how="inner")
    test.add_right(changes(test, [
        (1, "00:00:00", 1.0, "insert"),
        (1, "00:01:00", 1.0, "delete"),
        (1, "00:03:00", 3.0, "insert"),
        (9, "00:10:00", 0.0, "insert"),
    ]))
    test.add_left({"eid": [1, 2, 3], "k": [1, 1, 1],
                   "ts": [test.at(t) for t in ("00:00:30", "00:02:00", "00:04:00")]})
    test.process()
    test.add_left({"eid": [4], "k": [9], "ts": [test.at("00:10:00")]}).process()
    assert test.output.sort("eid").select("eid", "price").rows() == [(1, 1.0), (3, 3.0), (4, 0.0)]
    test.close()


def test_a_deleted_key_leaves_the_state(tmp_path: Path) -> None:
    keys = 50
    test = dim_test(tmp_path)
    k = list(range(keys))
    test.add_right({"k": k, "valid_from": [test.at("00:00:00")] * keys,
                    "price": [1.0] * keys, "_change_type": ["insert"] * keys})
    test.add_left({"eid": [0], "k": [0], "ts": [test.at("00:00:01")]}).process()
    state = test.progress[-1]["state"]["join-0"]
    assert (state["dimension_keys"], state["dimension_versions"]) == (keys, keys)
    # every key but 0 deleted at 0:01; a heartbeat of key 0 moves the watermark on
    test.add_right({"k": k[1:], "valid_from": [test.at("00:01:00")] * (keys - 1),
                    "price": [1.0] * (keys - 1), "_change_type": ["delete"] * (keys - 1)})
    test.process()
    test.add_right(changes(test, [(0, "00:02:00", 2.0, "update_postimage")]))
    test.add_left({"eid": [1, 2], "k": [7, 0], "ts": [test.at("00:01:30")] * 2}).process()
    test.add_left({"eid": [3], "k": [0], "ts": [test.at("00:03:00")]}).process()
    state = test.progress[-1]["state"]["join-0"]
    assert state["dimension_keys"] == 1  # deleted keys are gone, index rows included
    assert state["dimension_versions"] <= 2  # key 0's versions in force at W and after
    out = test.output.sort("eid")
    assert out.select("eid", "price").rows() == [(0, 1.0), (1, None), (2, 1.0)]
    test.close()


def test_restart_on_a_changelog_dimension_gives_identical_output(tmp_path: Path) -> None:
    ops = [(i % 3, (i * 7_919) % 120_000, "delete" if i % 4 == 3 else "upsert")
           for i in range(40)]
    dim = changelog(ops, commit=True)
    ev = frame([(i % 3, (i * 3_001) % 120_000) for i in range(60)], "eid")
    split = ([10, 20, 30, 40, 50], [8, 16, 24, 32, 40, 48])
    runs = [
        run_two(build(), ev, dim, split, tmp_path / name, left_schema=EVENTS,
                right_schema=DIM_COMMIT, restart_every=every)
        for name, every in (("a", 0), ("b", 2))
    ]
    a, b = runs
    assert a.sink.batches.keys() == b.sink.batches.keys()
    for bid, df in a.sink.batches.items():
        assert b.sink.batches[bid].equals(df, null_equal=True), bid
    assert a.output["did"].null_count() > 0  # some events met a delete
    assert a.output["did"].null_count() < a.output.height
    for test in runs:
        test.close()


def test_events_that_are_a_changelog_are_refused_when_built() -> None:
    cdc = mb.read_memory(schema={**EVENTS, "_change_type": pl.String}).with_watermark("ts", "1s")
    dim = mb.read_memory(schema=DIM).with_watermark("valid_from", "0s")
    with pytest.raises(mb.PlanError, match=r"events .* are a changelog.*'insert'"):
        cdc.join_asof_table(dim, on="k", time="ts")
    # also when the dimension's schema is known only when a batch runs
    unknown = mb.read_memory().with_watermark("valid_from", "0s")
    with pytest.raises(mb.PlanError, match="are a changelog"):
        cdc.join_asof_table(unknown, on="k", time="ts")


def test_a_changelog_dimension_is_not_in_the_output_schema() -> None:
    ev = mb.read_memory(schema=EVENTS).with_watermark("ts", "1s")
    dim = mb.read_memory(schema=DIM_COMMIT).with_watermark("_commit_timestamp", "0s")
    joined = ev.join_asof_table(dim, on="k", time="ts", dim_time="_commit_timestamp")
    assert joined.schema.names() == ["eid", "k", "ts", "rid", "did", "valid_from",
                                     "_commit_timestamp"]


def test_an_unknown_change_type_is_refused(tmp_path: Path) -> None:
    test = dim_test(tmp_path)
    test.add_right(changes(test, [(1, "00:00:00", 1.0, "upsert")]))
    with pytest.raises(mb.SourceError, match=r"\['upsert'\].*must be one of"):
        test.process()
    test.close()


def test_join_static_refuses_a_stream() -> None:
    ev = mb.read_memory(schema=EVENTS)
    dim = mb.read_memory(schema=DIM)
    with pytest.raises(mb.PlanError, match=r"join_asof_table.*_commit_timestamp"):
        ev.join_static(dim, on="k")  # type: ignore[arg-type]
