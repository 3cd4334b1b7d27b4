"""Generated card transactions -> the larger payments, as Parquet. Deterministic.

The rows depend only on the parameters (fixed event-time origin, seed), so a
run, a crash and a restart, or several runs split differently all produce
the same output. The crash and CLI tests use it::

    microbatch run jobs/generated_to_parquet.py --checkpoint chk/gen --trigger available-now \\
        --param output=out/gen --param rows=100000 --param max_records_per_batch=10000

Params: ``output`` (required); ``rows`` (log length; default unbounded, which
needs ``rows_per_second``), ``seed`` (default 7), ``rows_per_second``
(default ``none``: every row is available at once), ``max_records_per_batch``
(default none), ``min_amount`` (default 20).
"""

from __future__ import annotations

import polars as pl

import microbatch as mb

START = "2026-01-01T00:00:00+00:00"
"""Fixed event-time origin: the output does not depend on when the job runs."""


def _optional(params: dict[str, str], key: str) -> str | None:
    value = params.get(key, "").strip().lower()
    return None if value in {"", "none"} else value


def build(params: dict[str, str]) -> mb.DataStreamWriter:
    """Generator -> ``amount >= min_amount`` -> event_id, card_id, amount, event_time."""
    rows = _optional(params, "rows")
    rate = _optional(params, "rows_per_second")
    cap = _optional(params, "max_records_per_batch")
    stream = mb.generate(
        rows_per_second=float(rate) if rate else None,
        total_rows=int(rows) if rows else None,
        seed=int(params.get("seed", "7")),
        cards=1_000,
        start=START,
        max_records_per_batch=int(cap) if cap else None,
    )
    return (
        stream.filter(pl.col("amount") >= float(params.get("min_amount", "20")))
        .select("event_id", "card_id", "amount", "event_time")
        .write_parquet(params["output"])
    )
