"""Schemas known when a query is built: every plan node's output schema, and
the checks that refuse a misspelled column before a checkpoint is touched.

A source declares its schema (``read_files(..., schema=)``, the generator's,
a Kafka source's value schema, a Delta table's, the first frame of
``read_memory``); each stateless step derives its output through Polars' lazy
schema resolution (the step is applied to an empty ``LazyFrame`` of the input
schema, nothing is read); each stateful node states its own output from its
inputs' (:meth:`PlanNode.derive_schema`). Where a schema cannot be known (a
source without a declared schema, ``map_batches`` without ``schema=``), it is
``None`` and the checks wait until the first batch, as before.
"""

from __future__ import annotations

import difflib
import re
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

import polars as pl

from microbatch.exceptions import PlanError, UnknownColumnError
from microbatch.plan.columns import column_name

__all__ = [
    "check_columns",
    "check_event_time_column",
    "closest_columns",
    "column_name",
    "derive_step_schema",
    "output_schema",
]

_cache: weakref.WeakKeyDictionary[object, pl.Schema | None] = weakref.WeakKeyDictionary()


class SchemaNode(Protocol):
    """What :func:`output_schema` needs of a plan node (a protocol, so this module
    does not import ``plan.nodes``, which imports it)."""

    @property
    def children(self) -> tuple[SchemaNode, ...]: ...

    def derive_schema(self, inputs: tuple[pl.Schema, ...]) -> pl.Schema | None: ...


def output_schema(node: SchemaNode) -> pl.Schema | None:
    """The schema of ``node``'s output rows (``None``: known only when a batch runs).

    Hidden engine columns (``__mb_*``) are not part of it. Computed once per
    node (plan nodes are immutable) and cached.
    """
    if node in _cache:
        return _cache[node]
    inputs = [output_schema(child) for child in node.children]
    schema = None if any(s is None for s in inputs) else node.derive_schema(
        tuple(s for s in inputs if s is not None)
    )
    _cache[node] = schema
    return schema


def closest_columns(name: str, columns: Iterable[str], n: int = 3) -> list[str]:
    """The names among ``columns`` closest to ``name`` (case-insensitive first)."""
    cols = [c for c in columns if not c.startswith("__mb_")]
    same_case = [c for c in cols if c.lower() == name.lower() and c != name]
    close = difflib.get_close_matches(name, cols, n=n, cutoff=0.6)
    return list(dict.fromkeys(same_case + close))[:n]


def _unknown(name: str, schema: pl.Schema, where: str) -> UnknownColumnError:
    cols = [c for c in schema if not c.startswith("__mb_")]
    near = closest_columns(name, cols)
    hint = f"did you mean {' or '.join(repr(c) for c in near)}? " if near else ""
    return UnknownColumnError(
        f"{where}: column {name!r} is not a column of the stream; {hint}"
        f"the stream has {cols}",
        column=name,
        candidates=near,
    )


def check_columns(schema: pl.Schema | None, columns: Sequence[str], where: str) -> None:
    """Refuse the first of ``columns`` that ``schema`` lacks, naming the closest
    existing ones (nothing is checked when the schema is unknown)."""
    if schema is None:
        return
    for name in columns:
        if name not in schema:
            raise _unknown(name, schema, where)


def check_event_time_column(schema: pl.Schema | None, column: str, where: str) -> None:
    """``column`` exists and is a Datetime, a Date or an integer (epoch ms)."""
    if schema is None:
        return
    check_columns(schema, [column], where)
    dtype = schema[column]
    if isinstance(dtype, pl.Datetime) or dtype == pl.Date or dtype.is_integer():
        return
    hint = (
        f'parse it first: .with_columns(pl.col("{column}").str.to_datetime())'
        if dtype == pl.String
        else f'cast it first: .with_columns(pl.col("{column}").cast(pl.Datetime("ms")))'
    )
    raise PlanError(
        f"{where}: event-time column {column!r} has type {dtype}; it must be a Datetime, "
        f"a Date, or an integer of epoch milliseconds; {hint}"
    )


_COLUMN_IN_MESSAGE = re.compile(r'(?:column|field)[^"\']*["\']([^"\']+)["\']')


def derive_step_schema(
    label: str, apply: Callable[[pl.LazyFrame], pl.LazyFrame], schema: pl.Schema
) -> pl.Schema:
    """The output schema of a stateless step (``apply``) over rows of ``schema``,
    resolved lazily on an empty frame (nothing is read or computed). Polars'
    resolution errors become :class:`PlanError` naming the step (``label``) and,
    for a missing column, the closest existing ones."""
    try:
        return apply(schema.to_frame().lazy()).collect_schema()
    except pl.exceptions.ColumnNotFoundError as exc:
        text = str(exc)
        match = _COLUMN_IN_MESSAGE.search(text) or re.search(r'"([^"]+)"', text)
        if match:
            return_error = _unknown(match.group(1), schema, label)
        else:
            return_error = UnknownColumnError(
                f"{label}: {_first_line(exc)}; the stream has {list(schema)}",
                column="",
                candidates=[],
            )
        raise return_error from None
    except (pl.exceptions.PolarsError, TypeError, ValueError) as exc:
        raise PlanError(f"{label}: {_first_line(exc)}") from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
