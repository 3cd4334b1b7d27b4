"""The Iceberg sink's ``partition_by``: identity columns and Iceberg's transforms,
written as Spark SQL writes them.

Accepted terms (function names case-insensitive, spaces tolerated; Spark's
plural forms too)::

    card_id                  identity
    year(ts)   years(ts)     year
    month(ts)  months(ts)    month
    day(ts)    days(ts)      day
    hour(ts)   hours(ts)     hour
    bucket(16, card_id)      bucket[16]
    truncate(4, name)        truncate[4]

A term is a :class:`PartitionTerm`: the source column and Iceberg's transform
string (what ``str(transform)`` of the table's spec says), so a requested
spec and a table's spec compare as plain tuples. Partition fields get
Iceberg's default names (``ts_day``, ``card_id_bucket_16``,
``name_trunc_4``), as Spark and PyIceberg name them. PyIceberg computes every
transform but identity with the ``pyiceberg-core`` package (in the
``microbatch[iceberg]`` extra).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sinks.exceptions import SinkConfigError
from sinks.iceberg_catalog import INSTALL_HINT, IcebergUnavailableError

if TYPE_CHECKING:
    from pyiceberg.table import Table
    from pyiceberg.table.update.spec import UpdateSpec

ACCEPTED = ("column (identity), year(col), month(col), day(col), hour(col), "
            "bucket(N, col), truncate(W, col)")
"""The forms a ``partition_by`` term may take, for error messages."""

_TIME = {"year": "year", "years": "year", "month": "month", "months": "month",
         "day": "day", "days": "day", "hour": "hour", "hours": "hour"}
_COLUMN = r"\s*([^(),\s]+)\s*"
_TIME_TERM = re.compile(rf"\s*([a-z]+)\s*\({_COLUMN}\)\s*", re.IGNORECASE)
_SIZED_TERM = re.compile(rf"\s*(bucket|truncate)\s*\(\s*(\d+)\s*,{_COLUMN}\)\s*", re.IGNORECASE)
_SIZED_TRANSFORM = re.compile(r"(bucket|truncate)\[(\d+)\]")
_FIELD_SUFFIX = {"bucket": "bucket", "truncate": "trunc"}


@dataclass(frozen=True)
class PartitionTerm:
    """One partition field: ``column`` and Iceberg's ``transform`` string
    (``identity``, ``year``, ``month``, ``day``, ``hour``, ``bucket[N]``,
    ``truncate[W]``)."""

    column: str
    transform: str = "identity"

    @property
    def field_name(self) -> str:
        """Iceberg's default partition field name: ``ts_day``, ``id_bucket_16``,
        ``name_trunc_4``; the column itself for identity."""
        name, size = self._parts()
        if name == "identity":
            return self.column
        return "_".join([self.column, _FIELD_SUFFIX.get(name, name), *([size] if size else [])])

    def __str__(self) -> str:
        """The term as ``partition_by`` writes it: ``card_id``, ``day(ts)``,
        ``bucket(16, card_id)``."""
        name, size = self._parts()
        if name == "identity":
            return self.column
        return f"{name}({size}, {self.column})" if size else f"{name}({self.column})"

    def _parts(self) -> tuple[str, str | None]:
        """``("bucket", "16")`` for ``bucket[16]``; ``("day", None)`` for ``day``."""
        sized = _SIZED_TRANSFORM.fullmatch(self.transform)
        return (sized[1], sized[2]) if sized else (self.transform, None)


def parse_partition_term(text: str) -> PartitionTerm:
    """``text`` as a :class:`PartitionTerm`; :class:`SinkConfigError` naming the
    accepted forms for anything else (an unknown function, a missing or zero
    size, an empty column)."""
    if "(" not in text and ")" not in text:
        if not text.strip():
            raise SinkConfigError(f"partition_by has an empty term {text!r}; use {ACCEPTED}")
        return PartitionTerm(text)
    sized = _SIZED_TERM.fullmatch(text)
    if sized and int(sized[2]) > 0:
        return PartitionTerm(sized[3], f"{sized[1].lower()}[{int(sized[2])}]")
    timed = _TIME_TERM.fullmatch(text)
    if timed and timed[1].lower() in _TIME:
        return PartitionTerm(timed[2], _TIME[timed[1].lower()])
    raise SinkConfigError(
        f"partition_by term {text!r} is not an Iceberg partition: use {ACCEPTED} "
        "(e.g. partition_by=['day(event_time)', 'bucket(16, card_id)']; N and W are "
        "positive integers)"
    )


def partition_terms(value: str | Sequence[str] | None) -> tuple[PartitionTerm, ...]:
    """``partition_by`` as terms; :class:`SinkConfigError` for a bad term or a
    term given twice (the same column and transform)."""
    texts = (value,) if isinstance(value, str) else tuple(value or ())
    terms = tuple(parse_partition_term(t) for t in texts)
    if len(set(terms)) != len(terms):
        raise SinkConfigError(f"partition_by names a partition twice: {list(texts)}")
    return terms


def require_transforms(terms: Sequence[PartitionTerm]) -> None:
    """Raise :class:`IcebergUnavailableError` (naming the install command) when
    ``terms`` has a transform and ``pyiceberg-core``, which computes them, is
    missing: refused when the sink is built, not on the first batch."""
    transformed = [str(t) for t in terms if t.transform != "identity"]
    if not transformed:
        return
    try:
        import pyiceberg_core  # noqa: F401
    except ImportError as exc:
        raise IcebergUnavailableError(
            f"partition_by={transformed}: PyIceberg computes partition transforms with the "
            f"pyiceberg-core package, which is missing; {INSTALL_HINT}"
        ) from exc


def table_terms(table: Table) -> tuple[PartitionTerm, ...]:
    """The partition fields of ``table``'s current spec as terms (``void`` fields,
    which a v1 table keeps for dropped partitions, left out)."""
    schema = table.schema()
    return tuple(
        PartitionTerm(schema.find_column_name(f.source_id) or "?", str(f.transform))
        for f in table.spec().fields if str(f.transform) != "void"
    )


def add_partition_fields(update: UpdateSpec, terms: Sequence[PartitionTerm]) -> None:
    """Add ``terms`` to a spec being built, with Iceberg's default field names;
    :class:`SinkConfigError` when a transform cannot take its column's type (e.g.
    ``day`` of a string)."""
    for term in terms:
        try:
            update.add_field(term.column, term.transform, term.field_name)
        except ValueError as exc:
            raise SinkConfigError(
                f"partition_by term {str(term)!r}: {exc}; year/month/day take dates and "
                "timestamps, hour timestamps, bucket takes integers, decimals, dates, times, "
                "timestamps, strings and binary, truncate integers, decimals, strings "
                "and binary"
            ) from exc
