"""The StateStore API: lookup, upsert, delete, pop_expired, evict, types, errors, metrics."""

from __future__ import annotations

import datetime as dt
import decimal
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from statestore_model import make_provider

from statestore import StateStoreError, StateStoreProvider

UTC = dt.UTC
T0 = dt.datetime(2024, 1, 1, tzinfo=UTC)
WINDOW_KEYS = {"window_start": pl.Datetime("ms", "UTC"), "card_id": pl.Int64}
WINDOW_VALUES = {"n": pl.Int64, "amount_sum": pl.Float64}


def windows(tmp_path: Path, **options: object) -> StateStoreProvider:
    return StateStoreProvider(
        tmp_path, WINDOW_KEYS, WINDOW_VALUES, time_column="window_start", **options
    )


def window_rows(minutes: list[int], cards: list[int], n: list[int | None]) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "window_start": [T0 + dt.timedelta(minutes=m) for m in minutes],
            "card_id": cards,
            "n": n,
            "amount_sum": [float(c) for c in cards],
        },
        schema={**WINDOW_KEYS, **WINDOW_VALUES},
    )


def test_lookup_keeps_input_order_and_duplicates(tmp_path: Path) -> None:
    store = make_provider(tmp_path).load(0)
    store.upsert(pl.DataFrame({"k": [1, 2, 3], "v": [10, None, 30]}))
    out = store.lookup(pl.DataFrame({"k": [3, 9, 1, 3, 2], "extra": list("abcde")}))
    assert out.to_dict(as_series=False) == {
        "k": [3, 9, 1, 3, 2],
        "v": [30, None, 10, 30, None],
        "__found": [True, False, True, True, True],
    }


def test_lookup_casts_keys_and_handles_empty_inputs(tmp_path: Path) -> None:
    store = make_provider(tmp_path).load(0)
    empty = store.lookup(pl.DataFrame({"k": []}, schema={"k": pl.Int64}))
    assert empty.schema == pl.Schema({"k": pl.Int64, "v": pl.Int64, "__found": pl.Boolean})
    store.upsert(pl.DataFrame({"k": [5], "v": [1]}))
    out = store.lookup(pl.DataFrame({"k": [5, 6]}, schema={"k": pl.Int32}))
    assert out.schema["k"] == pl.Int64
    assert out["v"].to_list() == [1, None]


def test_upsert_replaces_values_and_is_visible_before_commit(tmp_path: Path) -> None:
    store = windows(tmp_path).load(0)
    store.upsert(window_rows([0, 0, 1], [1, 2, 1], [1, 1, 1]))
    store.upsert(window_rows([0, 2], [1, 7], [5, None]))
    got = store.to_frame().sort("window_start", "card_id")
    assert got["n"].to_list() == [5, 1, 1, None]
    assert store.num_rows == 4


def test_upsert_refuses_duplicate_keys_without_changing_state(tmp_path: Path) -> None:
    store = windows(tmp_path).load(0)
    store.upsert(window_rows([0], [1], [1]))
    with pytest.raises(StateStoreError, match="share their key"):
        store.upsert(window_rows([0, 1, 0], [2, 2, 2], [1, 1, 1]))
    assert store.to_frame()["n"].to_list() == [1]


@pytest.mark.parametrize(
    ("frame", "message"),
    [
        (pl.DataFrame({"k": [1]}), r"lacks column\(s\) \['v'\]"),
        (pl.DataFrame({"k": [1], "v": [1], "w": [1]}), r"columns \['w'\] are not in"),
        (pl.DataFrame({"k": ["x"], "v": [1]}), "cannot cast"),
    ],
)
def test_upsert_refuses_frames_not_matching_the_schema(
    tmp_path: Path, frame: pl.DataFrame, message: str
) -> None:
    store = make_provider(tmp_path).load(0)
    with pytest.raises(StateStoreError, match=message):
        store.upsert(frame)


def test_delete_ignores_absent_and_repeated_keys(tmp_path: Path) -> None:
    store = make_provider(tmp_path).load(0)
    store.upsert(pl.DataFrame({"k": [1, 2, 3], "v": [1, 2, 3]}))
    store.delete(pl.DataFrame({"k": [2, 2, 99]}))
    assert sorted(store.to_frame()["k"].to_list()) == [1, 3]
    store.delete(pl.DataFrame({"k": []}, schema={"k": pl.Int64}))
    assert store.num_rows == 2


def test_pop_expired_returns_closed_windows_in_time_then_key_order(tmp_path: Path) -> None:
    store = windows(tmp_path).load(0)
    store.upsert(window_rows([2, 0, 1, 0, 3], [5, 9, 1, 3, 1], [1, 2, 3, 4, 5]))
    out = store.pop_expired(T0 + dt.timedelta(minutes=1))
    assert out.select("card_id", "n").rows() == [(3, 4), (9, 2), (1, 3)]
    assert store.num_rows == 2
    assert store.pop_expired(T0).height == 0
    as_int = int((T0 + dt.timedelta(minutes=2)).timestamp() * 1000)
    assert store.pop_expired(as_int)["card_id"].to_list() == [5]
    assert store.pop_expired(dt.datetime(2024, 1, 1, 0, 3)).height == 1  # naive means UTC


def test_pop_expired_follows_time_changes_and_skips_null_times(tmp_path: Path) -> None:
    provider = make_provider(tmp_path, values={"expires": pl.Int64}, time_column="expires")
    store = provider.load(0)
    store.upsert(pl.DataFrame({"k": [1, 2, 3], "expires": [10, 10, None]}))
    store.upsert(pl.DataFrame({"k": [1, 3], "expires": [50, 20]}))  # 1 later, 3 gets a time
    store.delete(pl.DataFrame({"k": [2]}))
    store.upsert(pl.DataFrame({"k": [4], "expires": [10]}))  # likely reuses row slot of 2
    assert store.pop_expired(10)["k"].to_list() == [4]
    assert store.pop_expired(30)["k"].to_list() == [3]
    store.upsert(pl.DataFrame({"k": [1], "expires": [None]}))
    assert store.pop_expired(10**9).height == 0
    assert store.num_rows == 1


def test_pop_expired_accepts_dates_and_refuses_bad_thresholds(tmp_path: Path) -> None:
    provider = make_provider(tmp_path, values={"day": pl.Date}, time_column="day")
    store = provider.load(0)
    store.upsert(pl.DataFrame({"k": [1, 2], "day": [dt.date(2024, 1, 1), dt.date(2024, 1, 3)]}))
    assert store.pop_expired(dt.date(2024, 1, 2))["k"].to_list() == [1]
    with pytest.raises(StateStoreError, match="must be an int or a datetime"):
        store.pop_expired("2024-01-05")
    with pytest.raises(StateStoreError, match="needs a time_column"):
        make_provider(tmp_path / "other").load(0).pop_expired(1)


def test_evict_removes_and_returns_matching_rows(tmp_path: Path) -> None:
    store = make_provider(tmp_path).load(0)
    store.upsert(pl.DataFrame({"k": [3, 1, 2, 4], "v": [30, 10, None, 40]}))
    out = store.evict(pl.col("v") > 20)
    assert out.rows() == [(3, 30), (4, 40)]
    assert sorted(store.to_frame()["k"].to_list()) == [1, 2]
    with pytest.raises(StateStoreError, match="predicate failed"):
        store.evict(pl.col("nope") > 1)


def test_all_column_types_round_trip_through_disk(tmp_path: Path) -> None:
    keys = {
        "kf": pl.Float64,
        "kb": pl.Boolean,
        "kd": pl.Date,
        "kbin": pl.Binary,
        "ku": pl.UInt64,
        "kc": pl.Categorical,
    }
    values = {
        "i8": pl.Int8,
        "u64": pl.UInt64,
        "f32": pl.Float32,
        "b": pl.Boolean,
        "dtu": pl.Datetime("us"),
        "dur": pl.Duration("ms"),
        "tm": pl.Time,
        "s": pl.String,
        "dec": pl.Decimal(10, 2),
        "lst": pl.List(pl.Int64),
        "st": pl.Struct({"a": pl.Int64, "b": pl.String}),
        "en": pl.Enum(["x", "y"]),
        "cat": pl.Categorical,
        "arr": pl.Array(pl.Int32, 2),
    }
    frame = pl.DataFrame(
        {
            "kf": [0.0, -2.0, float("nan"), 1.5],
            "kb": [True, True, True, None],
            "kd": [dt.date(2020, 1, 1)] * 4,
            "kbin": [b"a", b"a", b"a", None],
            "ku": [2**64 - 1, 2**64 - 1, 2**64 - 1, 0],
            "kc": ["p", "p", "p", None],
            "i8": [1, None, 3, 4],
            "u64": [2**64 - 1, None, 0, 5],
            "f32": [1.5, None, float("nan"), 0],
            "b": [True, None, False, True],
            "dtu": [dt.datetime(2020, 1, 1, 1, 1, 1, 5), None, dt.datetime(1900, 1, 1), None],
            "dur": [dt.timedelta(seconds=1), None, dt.timedelta(0), dt.timedelta(days=-1)],
            "tm": [dt.time(1, 2, 3), None, dt.time(0), dt.time(23, 59)],
            "s": ["x", None, "", "ü"],
            "dec": [decimal.Decimal("1.25"), None, decimal.Decimal("-3.00"), None],
            "lst": [[1, 2], None, [], [None]],
            "st": [{"a": 1, "b": "q"}, None, {"a": None, "b": None}, {"a": 2, "b": "r"}],
            "en": ["x", None, "y", "x"],
            "cat": ["u", None, "v", "u"],
            "arr": [[1, 2], None, [3, 4], [5, 6]],
        },
        schema={**keys, **values},
    )
    provider = StateStoreProvider(tmp_path, keys, values)
    store = provider.load(0)
    store.upsert(frame)
    probe = frame.select(list(keys)).with_columns(kf=pl.Series([-0.0, -2.0, float("nan"), 1.5]))
    found = store.lookup(probe)
    assert found["__found"].all()  # -0.0 finds 0.0, NaN finds NaN, null finds null
    assert found.drop("__found", "kf").equals(frame.drop("kf"))
    store.commit()
    reloaded = StateStoreProvider(tmp_path, keys, values).load(1)
    assert reloaded.to_frame().schema == frame.schema
    assert reloaded.to_frame().sort("kf").equals(frame.sort("kf"))
    # A changelog mixing deleted keys and upserted rows (two dictionaries per column).
    reloaded.delete(frame.head(1))
    changed = frame.tail(1).with_columns(
        kc=pl.lit("new", dtype=pl.Categorical), cat=pl.lit("w", dtype=pl.Categorical)
    )
    reloaded.upsert(changed)
    reloaded.commit()
    expected = pl.concat([frame.slice(1), changed]).sort("kf", "kc")
    again = StateStoreProvider(tmp_path, keys, values).load(2).to_frame()
    assert again.sort("kf", "kc").equals(expected)


def test_many_rows_with_resizes_and_tombstones_match_polars(tmp_path: Path) -> None:
    """Thousands of random upserts/deletes (forcing resizes, slot reuse, cleanups)."""
    rng = np.random.default_rng(7)
    provider = make_provider(tmp_path, keys={"a": pl.Int64, "b": pl.String})
    store = provider.load(0)
    expected = pl.DataFrame(schema={"a": pl.Int64, "b": pl.String, "v": pl.Int64})
    for step in range(12):
        ids = np.unique(rng.integers(0, 6000, size=3000))
        batch = pl.DataFrame(
            {"a": ids // 7, "b": (ids % 7).astype(str), "v": rng.integers(0, 9, ids.size)}
        )
        store.upsert(batch)
        expected = pl.concat([expected.join(batch, on=["a", "b"], how="anti"), batch])
        gone = pl.DataFrame(
            {"a": rng.integers(0, 900, 1500), "b": rng.integers(0, 7, 1500).astype(str)}
        )
        store.delete(gone)
        expected = expected.join(gone, on=["a", "b"], how="anti")
        if step % 4 == 3:
            store.commit()
    got = store.to_frame()
    assert got.sort("a", "b").equals(expected.sort("a", "b"))
    store.commit()
    again = make_provider(tmp_path, keys={"a": pl.Int64, "b": pl.String}).load(store.version)
    assert again.to_frame().sort("a", "b").equals(expected.sort("a", "b"))


def test_metrics_report_size_and_batch_activity(tmp_path: Path) -> None:
    provider = windows(tmp_path, min_snapshot_bytes=0)
    store = provider.load(0)
    store.upsert(window_rows([0, 0, 1], [1, 2, 3], [1, 1, 1]))
    store.delete(window_rows([0], [2], [0]).select(list(WINDOW_KEYS)))
    store.commit()
    metrics = store.metrics
    assert metrics["rows"] == 2
    assert metrics["bytes"] > 0
    assert metrics["bytes_per_row"] == metrics["bytes"] / 2
    assert (metrics["upserted"], metrics["deleted"]) == (3, 1)
    assert metrics["changelog_bytes"] > 0
    assert metrics["snapshot_written"] is True  # min_snapshot_bytes=0: every commit
    assert metrics["commit_ms"] > 0
    assert {"load_ms", "index_probes", "rows_written", "rows_read"} <= metrics.keys()
    store = provider.load(1)
    assert (store.metrics["upserted"], store.metrics["index_probes"]) == (0, 0)


@pytest.mark.parametrize(
    ("keys", "values", "options", "message"),
    [
        ({}, {"v": pl.Int64}, {}, "key_schema is empty"),
        ({"k": pl.Int64}, {"k": pl.Int64}, {}, "in both key_schema and value_schema"),
        ({"k": pl.Int64}, {"__found": pl.Int64}, {}, "reserved"),
        ({"k": pl.Int64}, {"v": "int"}, {}, "not a Polars data type"),
        ({"k": pl.Int64}, {"v": pl.Int64}, {"time_column": "t"}, "neither a key nor a value"),
        ({"k": pl.Int64}, {"v": pl.String}, {"time_column": "v"}, "must be an integer"),
        ({"k": pl.Int64}, {"v": pl.Int64}, {"retention_versions": 0}, "retention_versions"),
        ({"k": pl.Int64}, {"v": pl.Int64}, {"compression": "gzip"}, "compression"),
    ],
)
def test_provider_refuses_bad_configuration(
    tmp_path: Path, keys: dict, values: dict, options: dict, message: str
) -> None:
    with pytest.raises(StateStoreError, match=message):
        StateStoreProvider(tmp_path, keys, values, **options)


def test_a_replaced_store_refuses_further_use(tmp_path: Path) -> None:
    provider = make_provider(tmp_path)
    old = provider.load(0)
    old.upsert(pl.DataFrame({"k": [1], "v": [1]}))
    fresh = provider.load(0)  # staged changes: rebuilt, the old object is closed
    assert fresh is not old
    assert fresh.num_rows == 0
    with pytest.raises(StateStoreError, match=r"provider.load\(0\) replaced it"):
        old.upsert(pl.DataFrame({"k": [2], "v": [2]}))
    with pytest.raises(StateStoreError, match="must be an int"):
        provider.load(-1)
