"""``jobs/fraud_alerts.py --param output_format=iceberg``: the alert table on Apache Iceberg.

The same contract as ``test_fraud_alerts_job`` (its simulation of the watermark
per batch is the oracle), with the alert and late tables written by the
Iceberg sink: the job is SIGKILLed at each of the sink's fault points and at
random moments, restarted, and then the alert table -- read back by PyIceberg
through the catalog and by DuckDB's ``iceberg_scan`` from the catalog's
metadata file and from the table's own directory -- holds each window once, equal to the recompute.
"""

from __future__ import annotations

import random
from pathlib import Path

import polars as pl
import pytest

from sinks.iceberg_catalog import load_iceberg_table, resolve_catalog
from tests.iceberg.iceberg_helpers import duckdb_scan
from tests.jobs.test_fraud_alerts_job import (
    FILES,
    MINUTE_MS,
    PER_BATCH,
    job,
    run,
    simulate,
)
from tests.jobs.test_fraud_alerts_job import alert_rows as alerts

pytestmark = [pytest.mark.slow, pytest.mark.crash]


def test_alerts_on_iceberg_under_kills_equal_the_recompute(tmp_path: Path) -> None:
    fraud = job()
    data = fraud.generated_transactions(rows=6_000, cards=150, events_per_second=50.0,
                                        late_fraction=0.03, late_by=("1m", "2h"), seed=5)
    fraud.write_files(tmp_path / "in", data, files=FILES)
    late_ids, want = simulate(data)
    assert want.height > 20
    assert late_ids

    lake = tmp_path / "lake"
    params = {"input": str(tmp_path / "in"), "max_files_per_batch": str(PER_BATCH),
              "output_format": "iceberg", "output": str(lake / "fraud_alerts")}
    chk = tmp_path / "chk"
    kills = 0
    for i, point in enumerate(["sink.before_data", "sink.before_commit", "sink.after_commit",
                               "after_sink"]):
        kills += run(params, chk, fault=f"{point}@{2 * i + 1}") == -9
    kills += run(params, chk, kill_after=random.Random(3).uniform(2.0, 4.0)) == -9
    assert run(params, chk) == 0
    assert kills >= 4

    expected = want.select(
        "alert_id", "card_id", "ws", pl.lit(MINUTE_MS).alias("len_ms"), "transactions",
        "total_amount", "max_amount", pl.col("first_event_time").dt.epoch("ms"),
        pl.col("last_event_time").dt.epoch("ms"),
    ).sort("alert_id")
    catalog = resolve_catalog(f"sqlite:///{lake}/iceberg.db")
    table = load_iceberg_table(catalog, "default.fraud_alerts")
    assert table is not None
    assert table.metadata.location == (lake / "fraud_alerts").as_uri()
    got = alerts(pl.from_arrow(table.scan().to_arrow()))  # type: ignore[arg-type]
    assert got["alert_id"].n_unique() == got.height  # each window once
    assert got.equals(expected.cast(dict(got.schema)))  # type: ignore[arg-type]
    assert alerts(duckdb_scan(table)).equals(got)
    assert alerts(duckdb_scan(lake / "fraud_alerts")).equals(got)  # the directory alone

    late = load_iceberg_table(catalog, "default.fraud_alerts_late")
    assert late is not None
    late_rows = pl.from_arrow(late.scan().to_arrow())
    assert isinstance(late_rows, pl.DataFrame)
    assert sorted(late_rows["event_id"].to_list()) == sorted(late_ids)
