"""Test job: generated transactions -> a Kafka topic (exactly once), for kill -9 tests.

Params: ``bootstrap``, ``topic``, ``rows`` (required), ``max_records_per_batch``, ``mode``.
"""

from __future__ import annotations

import microbatch as mb


def build(params: dict[str, str]) -> mb.DataStreamWriter:
    tx = mb.generate(
        rows_per_second=None, total_rows=int(params["rows"]), seed=3, cards=500,
        start="2026-01-01T00:00:00+00:00",
        max_records_per_batch=int(params.get("max_records_per_batch", "500")),
    )
    return tx.select("event_id", "card_id", "amount", "event_time").write_kafka(
        params["topic"], bootstrap=params["bootstrap"], key="card_id",
        mode=params.get("mode", "exactly_once"),  # type: ignore[arg-type]
    )
