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

from dataclasses import dataclass
from typing import Annotated

import polars as pl

import microbatch as mb

START = "2026-01-01T00:00:00+00:00"
"""Fixed event-time origin: the output does not depend on when the job runs."""


@dataclass(frozen=True)
class Params:
    """The job's parameters (``--param NAME=VALUE``)."""

    output: Annotated[str, "Parquet output directory"]
    rows: Annotated[int | None, "log length (none: unbounded, needs rows_per_second)"] = None
    seed: Annotated[int, "generator seed"] = 7
    rows_per_second: Annotated[float | None, "rate (none: every row at once)"] = None
    max_records_per_batch: Annotated[int | None, "rows per batch (none: no cap)"] = None
    min_amount: Annotated[float, "smallest amount kept"] = 20.0


def build(params: Params) -> mb.DataStreamWriter:
    """Generator -> ``amount >= min_amount`` -> event_id, card_id, amount, event_time."""
    stream = mb.generate(
        rows_per_second=params.rows_per_second,
        total_rows=params.rows,
        seed=params.seed,
        cards=1_000,
        start=START,
        max_records_per_batch=params.max_records_per_batch,
    )
    return (
        stream.filter(pl.col("amount") >= params.min_amount)
        .select("event_id", "card_id", "amount", "event_time")
        .write_parquet(params.output)
    )
