"""How a sink takes a changelog frame (the vocabulary is :mod:`sinks.changelog`).

Two uses, one per output mode:

- ``update``: a sink holding a table applies the frame: :func:`table_changes`
  checks it and gives ``(upserts, deletes)`` (:func:`~sinks.changelog.split_changes`),
  :func:`last_changes` the same rows in frame order for a log (Kafka);
- ``changelog``: a sink appends the change rows themselves, ``_change_type``
  included: :func:`changelog_rows`.

A frame whose ``_change_type`` holds anything but the four change types (or a
null) is refused with a :class:`SinkError` before anything is written.
"""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl

from sinks.changelog import (
    CHANGE_TYPE,
    CHANGE_TYPES,
    INSERT,
    UPDATE_PREIMAGE,
    is_changelog,
    split_changes,
)
from sinks.exceptions import SinkConfigError, SinkError

__all__ = ["changelog_rows", "check_changes", "last_changes", "table_changes"]


def check_changes(frame: pl.DataFrame, where: str) -> None:
    """Refuse a ``_change_type`` column that is not text or holds an unknown value.

    ``where`` names the sink and batch in the message (``"DeltaSink('t') batch 3"``).
    """
    if not is_changelog(frame):
        return
    dtype = frame.schema[CHANGE_TYPE]
    if dtype not in (pl.String, pl.Categorical, pl.Enum) and dtype != pl.Null:
        raise SinkError(
            f"{where}: column {CHANGE_TYPE!r} has type {dtype}; it must be text with one of "
            f"{list(CHANGE_TYPES)} (Delta Change Data Feed's spelling)"
        )
    kinds = frame.get_column(CHANGE_TYPE).cast(pl.String)
    bad = kinds.filter(kinds.is_null() | ~kinds.is_in(CHANGE_TYPES))
    if bad.len():
        shown = sorted({str(v) for v in bad.head(20).to_list()})
        raise SinkError(
            f"{where}: {bad.len()} row(s) have a {CHANGE_TYPE!r} that is not one of the "
            f"change types (e.g. {shown}); use one of {list(CHANGE_TYPES)}. Nothing was "
            "written."
        )


def table_changes(
    frame: pl.DataFrame, keys: Sequence[str], where: str
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """``(upserts, deletes)`` that a table keyed by ``keys`` applies for ``frame``.

    A frame without ``_change_type`` is all upserts (the ``update`` mode of
    before changelogs). A changelog frame needs ``keys``: without them a delete
    cannot say which row it removes, and a :class:`SinkConfigError` says so.
    """
    if not is_changelog(frame):
        return frame, frame.clear()
    check_changes(frame, where)
    if not keys:
        raise SinkConfigError(
            f"{where}: output_mode='update' applies the deletes of a changelog (a frame with "
            f"{CHANGE_TYPE!r}) by key, and there are no key columns; give the sink its keys "
            "(merge_keys= for Delta, or a keyed query), or use output_mode='changelog' to "
            "append the changes themselves"
        )
    return split_changes(frame.with_columns(pl.col(CHANGE_TYPE).cast(pl.String)), keys)


def last_changes(frame: pl.DataFrame, keys: Sequence[str], where: str) -> pl.DataFrame:
    """The rows of a changelog ``frame`` that a keyed log (a compacted topic) needs, in order.

    Preimages are dropped; with ``keys``, only each key's last change is kept
    (at the position of that change). ``_change_type`` is kept, text. The
    result, applied in order, leaves a table in the same state as the frame.
    """
    check_changes(frame, where)
    rows = frame.with_columns(pl.col(CHANGE_TYPE).cast(pl.String)).filter(
        pl.col(CHANGE_TYPE) != UPDATE_PREIMAGE
    )
    if keys:
        rows = rows.unique(subset=list(keys), keep="last", maintain_order=True)
    return rows


def changelog_rows(frame: pl.DataFrame, keys: Sequence[str], where: str) -> pl.DataFrame:
    """``frame`` as the change rows that ``output_mode="changelog"`` appends.

    A changelog frame is checked and kept as it is (``_change_type`` as text).
    A frame without ``_change_type``:

    - without rows: gains an empty ``_change_type`` column (so a no-data batch
      has the output's columns);
    - of a query without key columns (an append-only result): every row is an
      ``insert``, as Flink reads an append-only stream as a changelog;
    - of a keyed query: refused with a :class:`SinkConfigError`, since a row of
      a keyed result may be an insert or an update, and the sink cannot tell.
    """
    if is_changelog(frame):
        check_changes(frame, where)
        return frame.with_columns(pl.col(CHANGE_TYPE).cast(pl.String))
    if frame.height and keys:
        raise SinkConfigError(
            f"{where}: output_mode='changelog' appends change rows, and this batch has no "
            f"{CHANGE_TYPE!r} column while the query is keyed by {list(keys)}: each row could "
            "be an insert or an update. Let the query emit its changes (output_mode="
            "'changelog' on the query's writer), add the column yourself, or use "
            "output_mode='update' to upsert the rows"
        )
    return frame.with_columns(pl.lit(INSERT, pl.String).alias(CHANGE_TYPE))
