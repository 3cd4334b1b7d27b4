"""A batch's columns against its table's: the differences, and the message that
refuses them; the column-name options of a sink. Shared by the table sinks
(Delta, Iceberg), which compare column types as text in their own format's words."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

from sinks.exceptions import SinkConfigError

__all__ = ["Difference", "SchemaMode", "column_names", "mismatch_message", "schema_differences"]

SchemaMode = Literal["merge"]
"""A table sink's ``schema_mode``: ``"merge"`` adds new columns (``None``: refuse)."""
Difference = tuple[str, str, str, str]
"""``(kind, column, table type, batch type)``; ``kind`` is ``"type"``,
``"missing"`` (in the table, not the batch) or ``"new"``."""

_WORDS = {"type": "has type {b} in the batch but {t} in the table",
          "missing": "({t}) is in the table but not in the batch",
          "new": "({b}) is in the batch but not in the table"}


def schema_differences(table: Mapping[str, str], batch: Mapping[str, str]) -> list[Difference]:
    """Each difference between two ``column -> type text`` mappings: the table's
    columns in order (missing or retyped), then the batch's new ones."""
    out: list[Difference] = []
    for name, text in table.items():
        if name not in batch:
            out.append(("missing", name, text, "-"))
        elif batch[name] != text:
            out.append(("type", name, text, batch[name]))
    out.extend(("new", name, "-", text) for name, text in batch.items() if name not in table)
    return out


def mismatch_message(
    table: str, batch_id: int, problems: list[Difference], schema_mode: str | None, *,
    retype: str, evolve: str,
) -> str:
    """Why ``batch_id`` is refused by ``table`` (e.g. ``"Delta table /t"``), each
    difference named, and the fix: ``retype`` (who refuses a type change) or
    ``evolve`` (how to add columns), whichever applies."""
    details = "; ".join(
        f"column {name!r} " + _WORDS[kind].format(t=t, b=b) for kind, name, t, b in problems
    )
    if any(kind == "type" for kind, *_ in problems):
        fix = (f"{retype} does not change a column's type: cast the column in the query to "
               "the table's type, or write to a new table.")
    else:
        fix = (f"For additive evolution pass schema_mode='merge' to {evolve}, or write to a "
               "new table.")
    mode = "" if schema_mode is None else f" (schema_mode={schema_mode!r})"
    return (f"{table}: batch {batch_id} does not match the table's schema{mode}: "
            f"{details}. Nothing was written. {fix}")


def column_names(value: str | Sequence[str] | None, what: str) -> tuple[str, ...]:
    """A sink option naming columns (``partition_by``, ``merge_keys``) as a tuple;
    :class:`SinkConfigError` when it names a column twice."""
    names = (value,) if isinstance(value, str) else tuple(value or ())
    if len(set(names)) != len(names):
        raise SinkConfigError(f"{what} names a column twice: {list(names)}")
    return names
