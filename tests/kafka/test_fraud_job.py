"""The fraud job end to end on a real broker, checked against one-shot Polars oracles.

Lateness is checked independently of the engine's window code: each input
record is placed in its batch by the offset ranges recorded in
``offsets/N``, and is late exactly when its window's end is at or before the
watermark recorded for that batch (Spark's rule, docs/design.md).
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import polars as pl
import pytest
from kafka_helpers import consume_all

from microbatch.checkpoint import Checkpoint

pytestmark = pytest.mark.kafka

ROOT = Path(__file__).resolve().parents[2]
MINUTE_MS = 60_000
MONEY = pl.Decimal(18, 2)
TOTAL = pl.Decimal(38, 2)
"""The job's money type and the type of its sums (Polars: a sum of decimals has precision 38)."""


def job() -> ModuleType:
    spec = importlib.util.spec_from_file_location("fraud_alerts", ROOT / "jobs" / "fraud_alerts.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_job(fraud: ModuleType, params: dict[str, str], chk: Path) -> None:
    query = fraud.build(params).start(checkpoint=chk, trigger="available-now")
    query.await_termination(120)


def input_rows(bootstrap: str, topic: str) -> pl.DataFrame:
    msgs = consume_all(bootstrap, topic)
    meta = pl.DataFrame({"partition": [m.partition() for m in msgs],
                         "offset": [m.offset() for m in msgs]})
    values = pl.read_ndjson(b"\n".join(m.value() for m in msgs),
                            schema={"event_id": pl.Int64, "card_id": pl.Int64,
                                    "amount": pl.Float64, "event_time": pl.String})
    return pl.concat([meta, values], how="horizontal").with_columns(
        pl.col("event_time").str.to_datetime(time_unit="ms", time_zone="UTC"))


def batch_watermarks(chk: Path, topic: str) -> tuple[pl.DataFrame, int]:
    """Per batch and partition: the offset range and the watermark in force; the final one."""
    log = Checkpoint(chk)
    rows = []
    final = None
    for batch_id in log.offsets.batch_ids():
        entry = log.offsets.get(batch_id)
        assert entry is not None
        final = entry.watermark_ms
        first, last = entry.sources["0"]
        for key, end in last.items():
            start = first.get(key, 0)
            if end > start:
                rows.append({"partition": int(key.rsplit(":", 1)[1]), "start": start, "end": end,
                             "watermark_ms": entry.watermark_ms})
    assert final is not None
    return pl.DataFrame(rows, schema={"partition": pl.Int64, "start": pl.Int64, "end": pl.Int64,
                                      "watermark_ms": pl.Int64}), final


def oracle(rows: pl.DataFrame, batches: pl.DataFrame, final_watermark: int) -> tuple[
        set[int], pl.DataFrame]:
    """(late event ids, expected alerts) from the recorded batches alone."""
    placed = (
        rows.with_columns(pl.col("partition").cast(pl.Int64)).sort("offset")
        .join_asof(batches.sort("start"), left_on="offset", right_on="start", by="partition")
    )
    assert placed.filter(pl.col("offset") >= pl.col("end")).height == 0
    window_start = pl.col("event_time").dt.epoch("ms") // MINUTE_MS * MINUTE_MS
    placed = placed.with_columns(window_start.alias("ws"))
    late = placed.filter(pl.col("watermark_ms").is_not_null()
                         & (pl.col("ws") + MINUTE_MS <= pl.col("watermark_ms")))
    on_time = placed.filter(~pl.col("event_id").is_in(late["event_id"].implode()))
    expected = (
        on_time.group_by("card_id", "ws")
        .agg(pl.len().alias("transactions"),
             pl.col("amount").cast(MONEY).sum().cast(TOTAL).alias("total"))
        .filter((pl.col("transactions") >= 3) & (pl.col("ws") + MINUTE_MS <= final_watermark))
        .select(pl.format("{}-{}", "card_id", "ws").alias("alert_id"), "transactions", "total")
        .sort("alert_id")
    )
    return set(late["event_id"].to_list()), expected


def alerts_frame(df: pl.DataFrame) -> pl.DataFrame:
    """Alerts as the oracle has them; totals are exact decimals (from JSON: text)."""
    return df.select("alert_id", pl.col("transactions").cast(pl.UInt32),
                     pl.col("total_amount").cast(TOTAL).alias("total")).sort("alert_id")


def test_fraud_alerts_match_the_one_shot_rule_and_late_rows_go_to_the_side_output(
    bootstrap: str, new_topic: Callable[..., str], tmp_path: Path
) -> None:
    fraud = job()
    topic, alerts_topic = new_topic(3), new_topic(2)
    fraud.produce_transactions(bootstrap, topic, rows=15_000, cards=300, late_fraction=0.03,
                               events_per_second=50.0)
    params = {"bootstrap": bootstrap, "topic": topic, "alerts_topic": alerts_topic,
              "output": str(tmp_path / "alerts"), "max_records_per_batch": "1500"}
    chk = tmp_path / "chk"
    run_job(fraud, params, chk)

    rows = input_rows(bootstrap, topic)
    assert rows.height == 15_000
    batches, final = batch_watermarks(chk, topic)
    late_ids, expected = oracle(rows, batches, final)
    assert 100 < len(late_ids) < 450  # 3 % of the rows are 1 min .. 1 h late
    assert expected.height > 20

    import microbatch as mb

    late_out = mb.parquet_table(tmp_path / "alerts-late")
    assert late_out.height == len(late_ids)
    assert set(late_out["event_id"].to_list()) == late_ids

    from_kafka = pl.DataFrame([json.loads(m.value()) for m in consume_all(bootstrap, alerts_topic)])
    assert alerts_frame(from_kafka).to_dicts() == expected.with_columns(
        pl.col("transactions").cast(pl.UInt32)).to_dicts()
    from_table = pl.read_delta(str(tmp_path / "alerts"))
    assert alerts_frame(from_table).equals(alerts_frame(from_kafka))

    # a replay of the same log (a new checkpoint, same code) gives the same alerts
    replay = {**params, "output": str(tmp_path / "replay"), "table_format": "parquet",
              "alerts_topic": new_topic(1)}
    run_job(fraud, replay, tmp_path / "chk-replay")
    again = mb.parquet_table(tmp_path / "replay")
    columns = ["alert_id", "window_start", "card_id", "transactions", "total_amount",
               "max_amount"]
    assert again.select(columns).sort("alert_id").equals(
        from_table.select(columns).sort("alert_id"))  # exactly: decimals, no rounding
