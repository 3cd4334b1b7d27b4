"""Test job: Kafka (with a SASL password in its config) -> Delta on S3 (with a
secret access key in its storage options), or the generator -> a webhook with a
bearer token; secrets come from the environment and ``--param storage.KEY=VALUE``
as a user's job would take them (``tests/kafka/test_secrets.py`` greps for them).

Params: ``kind`` (``delta`` or ``webhook``); delta: ``bootstrap``, ``topic``,
``output`` and ``storage.*``; webhook: ``url``.
"""

from __future__ import annotations

import os

import polars as pl

import microbatch as mb

SCHEMA = {"event_id": pl.Int64, "card_id": pl.Int64, "amount": pl.Float64}


def build(params: dict[str, str]) -> mb.DataStreamWriter:
    if params["kind"] == "webhook":
        alerts = mb.generate(rows_per_second=None, total_rows=300, seed=2,
                             start="2026-01-01T00:00:00+00:00").filter(pl.col("amount") > 150)
        return alerts.select("event_id", "card_id", "amount").write_webhook(
            params["url"], key="event_id", token_env="MB_TEST_WEBHOOK_TOKEN",
            headers={"X-Api-Key": os.environ["MB_TEST_WEBHOOK_HEADER"]})
    tx = mb.read_kafka(
        params["topic"], bootstrap=params["bootstrap"], schema=SCHEMA,
        config={"sasl.username": "mb-user", "sasl.password": os.environ["MB_TEST_SASL"]},
    )
    storage = {k.removeprefix("storage."): v for k, v in params.items()
               if k.startswith("storage.")}
    return tx.write_delta(params["output"], storage_options=storage)
