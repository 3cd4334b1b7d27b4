"""The row filter that finds the data files a batch's keys may be in (``update`` mode).

Update mode replaces the table rows whose key equals one of the batch's keys
(:mod:`sinks.iceberg_upsert`). Which files hold such rows is decided by
PyIceberg's scan planning (partition values and column bounds) with a filter
of a few terms, whatever the number of keys: per key column the range
``min <= k <= max`` of the batch's values (``k = v`` when they are all one
value), ``OR k IS NULL`` when a key value is null, the columns AND'ed. Every
row of a touched key matches it, so no file holding one is missed; files it
matches that hold none are read and left alone.

Null key values match nulls, as the Delta sink's ``IS NOT DISTINCT FROM``
does. A key column whose values have no order Iceberg prunes by (booleans,
nested types, floats holding NaN) adds no term: every file is a candidate
for it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import polars as pl

if TYPE_CHECKING:
    from pyiceberg.expressions import BooleanExpression

__all__ = ["candidate_filter"]


def candidate_filter(keys: pl.DataFrame, columns: Sequence[str]) -> BooleanExpression:
    """An expression true for every table row whose ``columns`` equal one row of
    ``keys`` (and maybe for others); ``AlwaysFalse`` when ``keys`` has no rows."""
    e = _expressions()
    term: BooleanExpression = e.AlwaysFalse() if keys.height == 0 else e.AlwaysTrue()
    if keys.height == 0:
        return term
    for name in columns:
        term = e.And(term, _column_term(name, keys[name]))
    return term


def _expressions() -> Any:
    """PyIceberg's expression classes (untyped: their pydantic constructors
    take the column name positionally, which type checkers do not see)."""
    from pyiceberg import expressions

    return expressions


def _column_term(name: str, values: pl.Series) -> BooleanExpression:
    e = _expressions()
    dtype = values.dtype
    if dtype == pl.Boolean or dtype.is_nested() or (dtype.is_float() and values.is_nan().any()):
        return e.AlwaysTrue()  # type: ignore[no-any-return]
    present = values.drop_nulls()
    term: BooleanExpression
    if present.len() == 0:
        return e.IsNull(name)  # type: ignore[no-any-return]
    low, high = present.min(), present.max()
    if low == high:
        term = e.EqualTo(name, low)
    else:
        term = e.And(e.GreaterThanOrEqual(name, low), e.LessThanOrEqual(name, high))
    if present.len() < values.len():
        term = e.Or(term, e.IsNull(name))
    return term
