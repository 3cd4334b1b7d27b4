"""The fraud job end to end on a real broker, checked against one-shot Polars oracles.

Lateness is checked independently of the engine's window code: each input
record is placed in its batch by the offset ranges recorded in ``offsets/N``,
and is late exactly when its window's end plus the allowed lateness (1 h) is
at or before the watermark recorded for that batch (docs/semantics.md).
The alert table (MERGEd by alert id) then equals the one-shot result over the
rows that were not late; the alerts topic carries each alert once, as it fired.
"""

from __future__ import annotations

import importlib.util
import json
import sys
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
LATENESS_MS = 3_600_000
MONEY = pl.Decimal(18, 2)
TOTAL = pl.Decimal(38, 2)
"""The job's money type and the type of its sums (Polars: a sum of decimals has precision 38)."""


def job() -> ModuleType:
    spec = importlib.util.spec_from_file_location("fraud_alerts", ROOT / "jobs" / "fraud_alerts.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # a job's dataclass Params needs its module registered
    spec.loader.exec_module(module)
    return module


def run_job(fraud: ModuleType, params: dict[str, str], chk: Path) -> None:
    from microbatch.cli.jobfile import job_params_parse

    declared = job_params_parse(fraud.Params, params, Path(fraud.__file__))
    query = fraud.build(declared).start(checkpoint=chk, trigger="available-now")
    assert query.await_termination(300)


def input_rows(bootstrap: str, topic: str) -> pl.DataFrame:
    msgs = consume_all(bootstrap, topic)
    meta = pl.DataFrame({"partition": [m.partition() for m in msgs],
                         "offset": [m.offset() for m in msgs]})
    values = pl.read_ndjson(b"\n".join(m.value() for m in msgs),
                            schema={"event_id": pl.Int64, "card_id": pl.Int64,
                                    "amount": pl.String, "event_time": pl.String})
    return pl.concat([meta, values], how="horizontal").with_columns(
        pl.col("amount").cast(MONEY),
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


def oracle(rows: pl.DataFrame, batches: pl.DataFrame) -> tuple[set[int], pl.DataFrame]:
    """(late event ids, expected alert table) from the recorded batches alone."""
    placed = (
        rows.with_columns(pl.col("partition").cast(pl.Int64)).sort("offset")
        .join_asof(batches.sort("start"), left_on="offset", right_on="start", by="partition")
    )
    assert placed.filter(pl.col("offset") >= pl.col("end")).height == 0
    window_start = pl.col("event_time").dt.epoch("ms") // MINUTE_MS * MINUTE_MS
    placed = placed.with_columns(window_start.alias("ws"))
    late = placed.filter(pl.col("watermark_ms").is_not_null()
                         & (pl.col("ws") + MINUTE_MS + LATENESS_MS <= pl.col("watermark_ms")))
    on_time = placed.filter(~pl.col("event_id").is_in(late["event_id"].implode()))
    expected = (
        on_time.group_by("card_id", "ws")
        .agg(pl.len().alias("transactions"),
             pl.col("amount").cast(MONEY).sum().cast(TOTAL).alias("total"))
        .filter(pl.col("transactions") >= 3)
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
                               events_per_second=50.0, late_by=("1m", "2h"))
    params = {"bootstrap": bootstrap, "topic": topic, "alerts_topic": alerts_topic,
              "output": str(tmp_path / "alerts"), "max_records_per_batch": "1500"}
    chk = tmp_path / "chk"
    run_job(fraud, params, chk)

    rows = input_rows(bootstrap, topic)
    assert rows.height == 15_000
    batches, _ = batch_watermarks(chk, topic)
    late_ids, expected = oracle(rows, batches)
    assert 20 < len(late_ids) < 450  # 3 % of the rows are 1 min .. 2 h late
    assert expected.height > 20

    late_out = pl.read_delta(str(tmp_path / "alerts-late"))
    assert late_out.height == len(late_ids)
    assert set(late_out["event_id"].to_list()) == late_ids

    # the table: one row per alert, MERGEd to the window's final values
    from_table = pl.read_delta(str(tmp_path / "alerts"))
    assert from_table["alert_id"].n_unique() == from_table.height
    assert alerts_frame(from_table).to_dicts() == expected.with_columns(
        pl.col("transactions").cast(pl.UInt32)).to_dicts()
    # the topic: every alert once, as it fired (at least 3, at most the final count)
    from_kafka = pl.DataFrame([json.loads(m.value()) for m in consume_all(bootstrap, alerts_topic)])
    assert from_kafka["alert_id"].n_unique() == from_kafka.height
    assert set(from_kafka["alert_id"].to_list()) == set(expected["alert_id"].to_list())
    assert (from_kafka["revision"] == 0).all()
    fired = from_kafka.join(expected, on="alert_id")
    assert (fired["transactions"] >= 3).all()
    assert (fired["transactions"] <= fired["transactions_right"]).all()

    # a replay of the same log (a new checkpoint, same code) gives the same alerts, exactly
    replay = {**params, "output": str(tmp_path / "replay"),
              "late_output": str(tmp_path / "replay-late"), "alerts_topic": new_topic(1)}
    run_job(fraud, replay, tmp_path / "chk-replay")
    again = pl.read_delta(str(tmp_path / "replay"))
    columns = ["alert_id", "window_start", "card_id", "transactions", "total_amount",
               "max_amount", "revision"]
    assert again.select(columns).sort("alert_id").equals(
        from_table.select(columns).sort("alert_id"))  # exactly: decimals, no rounding
