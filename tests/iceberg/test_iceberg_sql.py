"""Iceberg tables in streaming SQL: ``'connector' = 'iceberg'`` as a source and a sink.

A script reads an Iceberg table appended snapshot by snapshot, counts per card
and tumbling window, and keeps the result in another Iceberg table (update
mode: one row per window and card); the result equals Polars on the whole
source table. Options are checked when the script compiles.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from iceberg_helpers import append_snapshots, new_table, scan, table_of, whole_table

import microbatch as mb
from microbatch.sql.script import compile_script

SCRIPT = """
CREATE TABLE events (
    event_id BIGINT, card_id BIGINT, amount DOUBLE, event_time TIMESTAMP(6),
    WATERMARK FOR event_time AS event_time - INTERVAL '1' HOUR
) WITH ('connector' = 'iceberg', 'table' = 'db.events', 'catalog' = '${catalog}',
        'max_files_per_batch' = '2');
CREATE TABLE per_card WITH ('connector' = 'iceberg', 'table' = 'db.per_card',
                            'catalog' = '${catalog}', 'partition_by' = 'card_id',
                            'output_mode' = 'update');
INSERT INTO per_card
SELECT window_start, window_end, card_id, COUNT(*) AS n, SUM(amount) AS total
FROM TABLE(TUMBLE(TABLE events, DESCRIPTOR(event_time), INTERVAL '1' HOUR))
GROUP BY window_start, window_end, card_id;
"""


def test_a_script_from_iceberg_to_iceberg_equals_polars(catalog_uri: str, tmp_path: Path) -> None:
    source = new_table(catalog_uri)
    append_snapshots(source, [40, 25, 60, 15, 30])
    script = compile_script(SCRIPT, {"catalog": catalog_uri}, file="per_card.sql")
    (query,) = script.queries
    assert query.writer.output_mode == "update"
    started = query.writer.start(checkpoint=tmp_path / "chk", trigger="available-now")
    assert started.await_termination(60)

    events = whole_table(source)
    want = (events.group_by(pl.col("event_time").dt.truncate("1h").alias("window_start"),
                            "card_id")
            .agg(pl.len().alias("n"), pl.col("amount").sum().alias("total"))
            .sort("window_start", "card_id"))
    out = table_of(catalog_uri, "db.per_card")
    got = scan(out).sort("window_start", "card_id").select(want.columns)
    assert got.height == want.height
    assert got.select("window_start", "card_id", "n").equals(
        want.select("window_start", "card_id", "n").cast(  # type: ignore[arg-type]
            dict(got.select("window_start", "card_id", "n").schema)))
    assert (got["total"] - want["total"]).abs().max() < 1e-9  # type: ignore[operator]
    assert [f.name for f in out.spec().fields] == ["card_id"]


@pytest.mark.parametrize(("option", "message"), [
    ("'starting_snapshot' = 'first'", "'earliest', 'latest' or a snapshot id"),
    ("'partition_by' = 'day(ts'", "comma-separated columns or transforms"),
    ("'tabel' = 'db.x'", "did you mean 'table'"),
])
def test_iceberg_options_are_checked_when_the_script_compiles(option: str, message: str) -> None:
    text = ("CREATE TABLE t (a BIGINT) WITH ('connector' = 'iceberg', 'table' = 'db.t', "
            f"'catalog' = 'sqlite:///x.db', {option});\n"
            "CREATE TABLE o WITH ('connector' = 'memory');\nINSERT INTO o SELECT a FROM t;")
    with pytest.raises(mb.SQLError, match=message):
        compile_script(text, file="bad.sql")
