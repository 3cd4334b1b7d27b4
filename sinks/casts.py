"""Casting a batch's columns to the types a table format stores, keeping values.

The table sinks (Delta, Iceberg) each decide the target type of a column;
:func:`cast_columns` applies those decisions in one ``with_columns`` and
guards the two casts that could change a value: a ``UInt64`` above 2**63-1
(refused, since a signed long cannot hold it) and a zoned datetime (converted
to UTC, keeping the instant, never relabelling the wall clock).
"""

from __future__ import annotations

from collections.abc import Mapping

import polars as pl

from sinks.exceptions import SinkError

__all__ = ["cast_columns"]

_INT64_MAX = 2**63 - 1


def cast_columns(
    df: pl.DataFrame, casts: Mapping[str, pl.DataType], *, where: str, fmt: str
) -> pl.DataFrame:
    """``df`` with each column of ``casts`` cast to its type (``df`` itself when
    there are none). ``where`` starts the error message (``"Delta table /t: batch
    3"``), ``fmt`` names the format whose long cannot hold a value."""
    if not casts:
        return df
    exprs = []
    for name, target in casts.items():
        dtype = df.schema[name]
        if dtype == pl.UInt64 and df.select((pl.col(name) > _INT64_MAX).any()).item():
            raise SinkError(
                f"{where} column {name!r} (UInt64) holds values above 2**63-1, which "
                f"{fmt}'s long cannot hold; cast it to a decimal or string"
            )
        if isinstance(dtype, pl.Datetime) and dtype.time_zone not in (None, "UTC"):
            # a cast would relabel the wall clock; converting keeps the instant
            exprs.append(pl.col(name).dt.convert_time_zone("UTC").cast(target))
        else:
            exprs.append(pl.col(name).cast(target))
    return df.with_columns(exprs)
