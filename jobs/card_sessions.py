"""Card sessions into a Delta table that always equals the sessionization so far.

Generated card transactions (deterministic: fixed origin and seed), grouped
per card into session windows (a session ends after ``gap`` without a
transaction), MERGEd into the ``output`` Delta table in ``update`` mode: one
row per session with ``window_start``, ``window_end``, ``card_id``,
``transactions``, ``total_amount`` (exact decimal cents). A batch that extends a session (its end
moves) or merges two sessions deletes the rows it replaces in the same MERGE
commit, so the table never keeps a stale session::

    microbatch run jobs/card_sessions.py --checkpoint chk/sessions --trigger available-now \\
        --param output=lake/card_sessions --param rows=20000 --param max_records_per_batch=500

``--param mode=changelog`` appends the changes instead (``_change_type``:
``insert``, ``update_preimage``/``update_postimage``, ``delete``), the feed a
downstream table applies in order. The crash tests kill this job with SIGKILL
at random moments and compare the table with one-shot Polars sessions.

Params: ``output`` (required); ``rows`` (default 20000), ``seed`` (7),
``cards`` (50), ``event_rate`` (events per second of event time, 20),
``gap`` ("10s"), ``watermark`` ("5s", at least ``max_delay``), ``max_delay``
("5s"), ``max_records_per_batch`` (none), ``mode`` (update).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

import polars as pl

import microbatch as mb

START = "2026-01-01T00:00:00+00:00"
"""Fixed event-time origin: the output does not depend on when the job runs."""
MONEY = pl.Decimal(18, 2)
"""Amounts summed as exact cents: any batch split gives the same totals."""


@dataclass(frozen=True)
class Params:
    """The job's parameters (``--param NAME=VALUE``)."""

    output: Annotated[str, "the sessions Delta table"]
    rows: Annotated[int, "log length"] = 20_000
    seed: Annotated[int, "generator seed"] = 7
    cards: Annotated[int, "distinct cards"] = 50
    event_rate: Annotated[float, "events per second of event time"] = 20.0
    gap: Annotated[str, "inactivity that ends a session"] = "10s"
    watermark: Annotated[str, "watermark delay (at least max_delay: no row is late)"] = "5s"
    max_delay: Annotated[str, "how far behind its nominal time an event may be"] = "5s"
    max_records_per_batch: Annotated[int | None, "rows per batch (none: no cap)"] = None
    mode: Annotated[Literal["update", "changelog"], "MERGE the sessions or append changes"] = (
        "update"
    )


def transactions(params: Params) -> mb.Stream:
    """The generated transactions: every row available at once, disordered."""
    return mb.generate(
        rows_per_second=None,
        total_rows=params.rows,
        seed=params.seed,
        cards=params.cards,
        event_rate=params.event_rate,
        max_delay=params.max_delay,
        start=START,
        max_records_per_batch=params.max_records_per_batch,
    )


def build(params: Params) -> mb.DataStreamWriter:
    """Transactions -> sessions per card -> Delta (MERGE, or the change rows)."""
    sessions = (
        transactions(params)
        .with_columns(pl.col("amount").cast(MONEY))
        .with_watermark("event_time", params.watermark)
        .group_by(mb.session_window("event_time", params.gap), "card_id")
        .agg(
            pl.len().alias("transactions"),
            pl.col("amount").sum().alias("total_amount"),
        )
    )
    return sessions.write_delta(params.output, output_mode=params.mode)
