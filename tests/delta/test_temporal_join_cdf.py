"""A dimension Delta table updated in place, joined with a stream (issue 28).

- ``join_asof_table`` over the table's Change Data Feed
  (``read_delta(dim, changes=True)``, ``dim_time="_commit_timestamp"``): a job
  run again after each UPDATE, DELETE, MERGE and append of the dimension, events
  timed around each commit's timestamp (read from the Delta log), output to
  Delta. Oracle: deltalake's own ``load_cdf`` of the dimension (not our source)
  and a one-shot Polars ``join_asof``: each event takes its product's last change
  at or before its time, a delete meaning no value.
- ``join_static`` with the dimension's path: a batch after an UPDATE, DELETE or
  MERGE joins the table as it is then (oracle: ``pl.read_delta`` of the version
  current at that run).
"""

from __future__ import annotations

import random
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import polars as pl
import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

import microbatch as mb

pytestmark = pytest.mark.delta

CDF = {"delta.enableChangeDataFeed": "true"}
MS_UTC = pl.Datetime("ms", "UTC")


def products(ids: list[int], prices: list[float]) -> pa.Table:
    return pl.DataFrame(
        {"product": ids, "price": prices}, schema={"product": pl.Int64, "price": pl.Float64}
    ).to_arrow()


def merge(path: Path) -> None:
    """One MERGE commit: update product 0, delete product 4, insert product 5."""
    source = pl.DataFrame(
        {"product": [0, 4, 5], "price": [99.0, 0.0, 55.0], "op": ["u", "d", "i"]}
    ).to_arrow()
    (
        DeltaTable(str(path))
        .merge(source, "t.product = s.product", source_alias="s", target_alias="t")
        .when_matched_update(updates={"price": "s.price"}, predicate="s.op = 'u'")
        .when_matched_delete(predicate="s.op = 'd'")
        .when_not_matched_insert(updates={"product": "s.product", "price": "s.price"})
        .execute()
    )


EDITS = [
    ("WRITE", lambda p: write_deltalake(str(p), products([0, 1, 2, 3, 4], [10, 11, 12, 13, 14]),
                                        configuration=CDF)),
    ("UPDATE", lambda p: DeltaTable(str(p)).update(updates={"price": "price * 2"},
                                                   predicate="product < 2")),
    ("DELETE", lambda p: DeltaTable(str(p)).delete("product = 3")),
    ("MERGE", merge),
    ("WRITE", lambda p: write_deltalake(str(p), products([3], [33.0]), mode="append")),
]
"""The dimension's history, one commit per run: a deleted product comes back at the end."""


def commit_time(path: Path, version: int) -> int:
    """The commit's timestamp (epoch ms), as the Delta log records it."""
    (entry,) = [h for h in DeltaTable(str(path)).history() if h["version"] == version]
    return int(entry["timestamp"])


def event_times(rng: random.Random, after: int, commit: int) -> list[int]:
    """Times just around ``commit`` (before, at, after) and spread since ``after``."""
    spread = [rng.randint(after + 1, commit) for _ in range(6)] if commit > after else []
    return sorted({commit - 1, commit, commit + 1, commit + 20, *spread} - {after})


def at_ms(ms: list[int]) -> list[datetime]:
    return [datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=t) for t in ms]


def write_events(path: Path, first_id: int, times: list[int], rng: random.Random,
                 every_product_at: int | None = None) -> int:
    """Events at ``times`` for random products, and one per product at
    ``every_product_at`` (so every commit's changes are seen after it, whatever
    the commits' wall-clock spacing did to the random draws)."""
    products = [rng.randint(0, 6) for _ in times]  # 6 never exists
    if every_product_at is not None:
        products += list(range(7))
        times = times + [every_product_at] * 7
    frame = pl.DataFrame(
        {
            "eid": list(range(first_id, first_id + len(times))),
            "product": products,
            "ts": at_ms(times),
        },
        schema={"eid": pl.Int64, "product": pl.Int64, "ts": MS_UTC},
    )
    write_deltalake(str(path), frame.to_arrow(), mode="append")
    return first_id + len(times)


def normalized(frame: pl.DataFrame) -> pl.DataFrame:
    """Every datetime as ms UTC (Delta stores microseconds), sorted by event id."""
    return frame.with_columns(
        pl.col(c).cast(MS_UTC) for c, t in frame.schema.items() if isinstance(t, pl.Datetime)
    ).sort("eid")


def cdf_oracle(dim: Path, events: pl.DataFrame, watermark_ms: int) -> pl.DataFrame:
    """For each event the watermark reached: its product's last change at or before
    its time (deltalake's ``load_cdf``), null values when that change is a delete."""
    reader = DeltaTable(str(dim)).load_cdf(starting_version=0)
    feed = pl.from_arrow(pa.RecordBatchReader.from_stream(reader).read_all())
    assert isinstance(feed, pl.DataFrame)
    changes = feed.select(
        "product", "price", pl.col("_change_type").cast(pl.String),
        pl.col("_commit_version").cast(pl.Int64),
        pl.col("_commit_timestamp").dt.replace_time_zone("UTC").cast(MS_UTC),
    ).filter(pl.col("_change_type") != "update_preimage")
    # no commit of this history changes a product twice: the order within one is moot
    assert changes.select("product", "_commit_version").is_unique().all()
    changes = changes.sort("_commit_timestamp")
    values = ["price", "_commit_version", "_commit_timestamp"]
    out = (
        events.filter(pl.col("ts").dt.epoch("ms") <= watermark_ms)
        .sort("ts")
        .join_asof(changes.with_columns(pl.col("_commit_timestamp").alias("t")),
                   left_on="ts", right_on="t", by="product", check_sortedness=False)
    )
    live = pl.col("_change_type").fill_null("") != "delete"
    return out.select("eid", "product", "ts", *[pl.when(live).then(pl.col(c)).alias(c)
                                                 for c in values])


def test_temporal_join_with_a_cdf_dimension_updated_in_place(tmp_path: Path) -> None:
    dim, events, out, chk = (tmp_path / n for n in ("dim", "events", "out", "chk"))
    rng = random.Random(28)
    next_id, last = 0, 0
    for version, (operation, edit) in enumerate(EDITS):
        if version:
            time.sleep(0.05)  # commits at least 50 ms apart: events fit between them
        edit(dim)
        history = {h["version"]: h["operation"] for h in DeltaTable(str(dim)).history()}
        assert history[version] == operation
        commit = commit_time(dim, version)
        assert commit > last + 20  # the previous run's latest event is before this commit
        times = event_times(rng, last + 20 if version else commit - 200, commit)
        next_id = write_events(events, next_id, times, rng, every_product_at=commit + 20)
        last = commit
        joined = (
            mb.read_delta(events)
            .with_watermark("ts", "0s")
            .join_asof_table(
                mb.read_delta(dim, changes=True).with_watermark("_commit_timestamp", "0s"),
                on="product",
                time="ts",
                dim_time="_commit_timestamp",
            )
        )
        query = joined.write_delta(out).start(checkpoint=chk, trigger="available-now")
        assert query.await_termination(120)
    got = normalized(pl.read_delta(str(out)))
    assert got.columns == ["eid", "product", "ts", "price", "_commit_version",
                           "_commit_timestamp"]
    want = normalized(cdf_oracle(dim, normalized(pl.read_delta(str(events))), last))
    assert got.height == want.height > 30
    assert got.equals(want, null_equal=True), f"engine:\n{got}\noracle:\n{want}"
    # the history was exercised: values before and after each kind of commit
    assert got.filter(pl.col("product") == 3)["price"].null_count() > 0  # deleted, then back
    assert set(got["_commit_version"].drop_nulls()) >= {0, 1, 3}
    # events after the last commit wait for the dimension's watermark
    assert pl.read_delta(str(events)).height > got.height


def test_join_static_sees_updates_deletes_and_merges_of_the_table(tmp_path: Path) -> None:
    dim, events, out, chk = (tmp_path / n for n in ("dim", "events", "out", "chk"))
    write_deltalake(
        str(dim), products([0, 1, 2, 3, 4], [10, 11, 12, 13, 14]),
        configuration={**CDF, "delta.enableDeletionVectors": "true"},
    )
    rng = random.Random(7)
    edits = [lambda p: None, *[edit for _, edit in EDITS[1:]]]
    expected = []
    next_id = 0
    for edit in edits:
        edit(dim)
        first = next_id
        next_id = write_events(events, next_id, list(range(next_id, next_id + 8)), rng)
        query = (
            mb.read_delta(events)
            .join_static(str(dim), on="product", how="left")
            .write_delta(out)
            .start(checkpoint=chk, trigger="available-now")
        )
        assert query.await_termination(120)
        batch = pl.read_delta(str(events)).filter(pl.col("eid") >= first)
        expected.append(batch.join(pl.read_delta(str(dim)), on="product", how="left"))
    got = normalized(pl.read_delta(str(out)))
    want = normalized(pl.concat(expected))
    assert got.columns == ["eid", "product", "ts", "price"]
    assert got.equals(want.select(got.columns), null_equal=True), f"{got}\n{want}"
    last = got.filter(pl.col("eid") >= first)
    assert last.filter(pl.col("product") == 4)["price"].null_count() == last.filter(
        pl.col("product") == 4).height  # deleted by the MERGE
    assert (last.filter(pl.col("product") == 0)["price"] == 99.0).all()  # updated by it
