"""``backfill --replace-where`` on a job writing Iceberg: the day (here, a card)
recomputed from the sources replaces exactly its rows, in one overwrite snapshot;
every other row stays as the live job wrote it."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from iceberg_helpers import scan, summaries, table_of
from polars.testing import assert_frame_equal

import microbatch as mb
from microbatch.tools.restate import Restatement
from sinks.exceptions import SinkError
from tests.engine.test_flush_at_end import as_ms, events, oracle, windowed

SECONDS = [0, 400, 10, 50, 130, 70, 200]  # 10, 50 and 70 late for a moving watermark


def writer(catalog: str) -> mb.DataStreamWriter:
    stream = mb.read_memory(events(SECONDS), max_records_per_batch=1)
    return windowed(stream, "tumbling").write_iceberg("db.out", catalog=catalog)


def test_replace_where_restates_only_the_matching_rows(catalog_uri: str, tmp_path: Path) -> None:
    live = writer(catalog_uri).start(tmp_path / "live", "available-now", flush_at_end=True)
    assert live.await_termination(60)
    before = as_ms(scan(table_of(catalog_uri, "db.out")))
    want = oracle("tumbling", events(SECONDS))
    assert before["total"].sum() < want["total"].sum(), "the live job dropped late rows"

    restate = Restatement.of(writer(catalog_uri), "card = 1")
    staged = restate.staged.start(tmp_path / "restate", "available-now", hold_watermark=True,
                                  flush_at_end=True)
    assert staged.await_termination(60)
    snapshot = restate.commit(restate.rows())

    table = table_of(catalog_uri, "db.out")
    assert table.current_snapshot().snapshot_id == snapshot  # type: ignore[union-attr]
    assert summaries(table)[-1]["microbatch.restate"] == "card = 1"
    after = as_ms(scan(table))
    assert_frame_equal(after.filter(pl.col("card") == 1), want.filter(pl.col("card") == 1))
    assert_frame_equal(after.filter(pl.col("card") != 1), before.filter(pl.col("card") != 1))
    assert restate.table.uri.startswith("db.out (catalog sqlite:///")


def test_a_predicate_iceberg_cannot_parse_is_refused_before_any_commit(
    catalog_uri: str, tmp_path: Path
) -> None:
    live = writer(catalog_uri).start(tmp_path / "live", "available-now", flush_at_end=True)
    assert live.await_termination(60)
    snapshot = table_of(catalog_uri, "db.out").current_snapshot()
    restate = Restatement.of(writer(catalog_uri), "card = = 1")
    with pytest.raises(SinkError, match="is not an Iceberg row filter"):
        restate.commit(pl.DataFrame())
    assert table_of(catalog_uri, "db.out").current_snapshot() == snapshot
