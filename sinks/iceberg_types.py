"""Polars frames as the Iceberg sink writes them: the type mapping, in one place.

Iceberg has fewer types than Polars and Arrow. Every batch goes through
:func:`iceberg_frame` first, which casts deterministically (the same Polars
type always becomes the same Iceberg type, so a table created from one batch
accepts the next):

==============================  =====================================
Polars                          Iceberg
==============================  =====================================
Boolean                         boolean
Int8, Int16, Int32, UInt8,      int
UInt16
Int64, UInt32                   long
UInt64                          long (values above 2**63-1 refused)
Float32 / Float64               float / double
Decimal(p, s)                   decimal(p, s)
String, Categorical, Enum       string
Binary                          binary
Date                            date
Datetime (any unit, no zone)    timestamp (microseconds; ns truncated)
Datetime (any unit, a zone)     timestamptz (converted to UTC first, so
                                the instant is kept, never the wall clock)
List, Array                     list (of the mapped inner type)
Struct                          struct (each field mapped)
==============================  =====================================

Durations, times, objects and untyped (all-null ``Null``) columns have no
Iceberg counterpart the sink writes: :class:`~sinks.exceptions.SinkError`
names the column and the cast to make.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl
from polars.datatypes import DataTypeClass

from sinks.casts import cast_columns
from sinks.exceptions import SinkError

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["iceberg_arrow", "iceberg_dtype", "iceberg_frame"]

_INTS: dict[type[pl.DataType], pl.DataType] = {
    pl.Int8: pl.Int32(),
    pl.Int16: pl.Int32(),
    pl.UInt8: pl.Int32(),
    pl.UInt16: pl.Int32(),
    pl.UInt32: pl.Int64(),
    pl.UInt64: pl.Int64(),
}
"""Iceberg's integers are ``int`` (32 bits) and ``long`` (64 bits), both signed."""
_REFUSED = (pl.Duration, pl.Time, pl.Object, pl.Null, pl.Int128)


def iceberg_dtype(dtype: pl.DataType | DataTypeClass, *, column: str, where: str) -> pl.DataType:
    """The Polars type a column of ``dtype`` is cast to before it is written
    (see the module's table); :class:`SinkError` for a type Iceberg lacks."""
    if isinstance(dtype, DataTypeClass):  # nested types may hold classes, not instances
        return iceberg_dtype(dtype(), column=column, where=where)
    base = dtype.base_type()
    if base in _INTS:
        return _INTS[base]
    if base in (pl.Categorical, pl.Enum):
        return pl.String()
    if isinstance(dtype, pl.Datetime):
        return pl.Datetime("us", "UTC" if dtype.time_zone else None)
    if isinstance(dtype, pl.List | pl.Array):
        return pl.List(iceberg_dtype(dtype.inner, column=column, where=where))
    if isinstance(dtype, pl.Struct):
        return pl.Struct([pl.Field(f.name, iceberg_dtype(f.dtype, column=column, where=where))
                          for f in dtype.fields])
    if base in _REFUSED:
        raise SinkError(
            f"{where}: column {column!r} has type {dtype}, which the Iceberg sink does not "
            "write; cast it first (a duration to Int64 microseconds, a time or an object to "
            "a string, an all-null column to the type it stands for)"
        )
    return dtype


def iceberg_frame(df: pl.DataFrame, *, where: str) -> pl.DataFrame:
    """``df`` with every column cast as the module's table says (one ``select``;
    the frame itself when nothing changes). ``where`` names the sink and batch."""
    casts: dict[str, pl.DataType] = {}
    for name, dtype in df.schema.items():
        target = iceberg_dtype(dtype, column=name, where=where)
        if target != dtype:
            casts[name] = target
    return cast_columns(df, casts, where=f"{where}:", fmt="Iceberg")


def iceberg_arrow(df: pl.DataFrame) -> pa.Table:
    """An :func:`iceberg_frame` as the Arrow table PyIceberg writes."""
    return df.to_arrow()
