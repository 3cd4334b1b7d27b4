"""The row filter that selects a batch's keys in an Iceberg table (``update`` mode).

PyIceberg deletes rows by a boolean expression. For the keys of a batch the
expression is built without a term per row:

- one key column: ``k IN (values)`` (``OR k IS NULL`` when a key is null);
- several: the key column with the most distinct values is the *inner* one;
  the batch's keys are grouped by the other columns, and each group is
  ``a = x AND b = y AND inner IN (values)``; the groups are OR'ed as a
  balanced tree (PyIceberg's visitors recurse: a chain of thousands of ORs
  would overflow the stack). A windowed aggregation, keyed by
  ``(window_start, window_end, group...)``, makes one term per window.

Null key values match nulls (``IS NULL``), as the Delta sink's
``IS NOT DISTINCT FROM`` does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import polars as pl

if TYPE_CHECKING:
    from pyiceberg.expressions import BooleanExpression

__all__ = ["key_filter"]


def key_filter(keys: pl.DataFrame, columns: Sequence[str]) -> BooleanExpression:
    """An expression true exactly for the table rows whose ``columns`` equal one
    row of ``keys`` (``AlwaysFalse`` when ``keys`` has no rows)."""
    from pyiceberg.expressions import AlwaysFalse, And

    keys = keys.select(columns).unique()
    if keys.height == 0:
        return AlwaysFalse()
    inner = max(columns, key=lambda c: (keys[c].n_unique(), -list(columns).index(c)))
    outer = [c for c in columns if c != inner]
    if not outer:
        return _in(inner, keys[inner].to_list())
    groups = keys.group_by(outer, maintain_order=True).agg(pl.col(inner))
    terms: list[BooleanExpression] = []
    for row in groups.iter_rows(named=True):  # one term per group, not per key
        term = _in(inner, row[inner])
        for name in reversed(outer):
            term = And(_equal(name, row[name]), term)
        terms.append(term)
    return _balanced_or(terms)


def _expressions() -> Any:
    """PyIceberg's expression classes (untyped: their pydantic constructors
    take the column name positionally, which type checkers do not see)."""
    from pyiceberg import expressions

    return expressions


def _equal(name: str, value: Any) -> BooleanExpression:
    e = _expressions()
    term: BooleanExpression = e.IsNull(name) if value is None else e.EqualTo(name, value)
    return term


def _in(name: str, values: list[Any]) -> BooleanExpression:
    e = _expressions()
    present = [v for v in values if v is not None]
    has_null = len(present) < len(values)
    term: BooleanExpression = e.In(name, present) if present else e.IsNull(name)
    if present and has_null:
        term = e.Or(term, e.IsNull(name))
    return term


def _balanced_or(terms: list[BooleanExpression]) -> BooleanExpression:
    from pyiceberg.expressions import Or

    while len(terms) > 1:
        paired: list[BooleanExpression] = [Or(terms[i], terms[i + 1])
                                           for i in range(0, len(terms) - 1, 2)]
        if len(terms) % 2:
            paired.append(terms[-1])
        terms = paired
    return terms[0]
