"""Totals per group of a Delta table, kept exactly right from its Change Data Feed.

Reads the ``input`` table's Change Data Feed (``delta.enableChangeDataFeed``:
appends, UPDATEs, DELETEs, MERGEs) and keeps, in the ``output`` Delta table,
one row per ``group`` value: ``rows``, ``counted`` (non-null ``value``),
``total`` and ``average`` of ``value``. Updates and deletes are retracted, a
group whose rows are all deleted is deleted from the output, and each batch is
one MERGE commit, so the output equals a one-shot ``group_by`` over the input
table as of the last version read::

    microbatch run jobs/cdc_group_totals.py --checkpoint chk/totals --trigger 1m \\
        --param input=lake/accounts --param output=lake/branch_totals \\
        --param group=branch --param value=balance

Params: ``input``, ``output`` (required); ``group`` (default ``g``),
``value`` (default ``amount``), ``max_files_per_batch`` (whole versions up to
about that many files per batch; default: everything available).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

import polars as pl

import microbatch as mb


@dataclass(frozen=True)
class Params:
    """The job's parameters (``--param NAME=VALUE``)."""

    input: Annotated[str, "the source Delta table (Change Data Feed on)"]
    output: Annotated[str, "the totals Delta table"]
    group: Annotated[str, "the column to group by"] = "g"
    value: Annotated[str, "the column to count, sum and average"] = "amount"
    max_files_per_batch: Annotated[int | None, "files per batch (whole versions)"] = None


def build(params: Params) -> mb.DataStreamWriter:
    """Change Data Feed -> retracting group_by -> Delta MERGE (update mode)."""
    value = pl.col(params.value)
    return (
        mb.read_delta(params.input, changes=True,
                      max_files_per_batch=params.max_files_per_batch)
        .group_by(params.group)
        .agg(
            pl.len().alias("rows"),
            value.count().alias("counted"),
            value.sum().alias("total"),
            value.mean().alias("average"),
        )
        .write_delta(params.output, output_mode="update")
    )
