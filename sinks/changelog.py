"""The changelog vocabulary: Delta Change Data Feed's ``_change_type`` column.

A *changelog* frame is an ordinary frame with one more column,
``_change_type`` (String), whose values are:

- ``insert``: a row added to the result table;
- ``update_preimage``: the row as it was before an update (informational: a
  table that applies the change ignores it);
- ``update_postimage``: the row as it is after an update. Operators emit it
  directly after its preimage; a source may not (a Delta Change Data Feed does
  not pair them, an upsert Kafka topic has no preimages): pair them by key;
- ``delete``: a row removed from the result table (all its columns carry the
  values it had, so that a consumer can find it by any key).

Applying every change of a query's output, in order, to an empty table gives
the query's result table. Within a batch, the changes of one key keep their
order; across batches, every change of batch N precedes every change of batch
N + 1. A frame without ``_change_type`` is an upsert of each of its rows (the
``update`` output mode of sinks before changelogs).

This module is the vocabulary only: it is shared by sources, operators and
sinks (it lives in ``sinks`` because sinks never import the engine).
"""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl

__all__ = [
    "CHANGE_TYPE",
    "CHANGE_TYPES",
    "DELETE",
    "INSERT",
    "UPDATE_POSTIMAGE",
    "UPDATE_PREIMAGE",
    "is_changelog",
    "split_changes",
]

CHANGE_TYPE = "_change_type"
"""The column that says what a row of a changelog frame is."""
INSERT = "insert"
UPDATE_PREIMAGE = "update_preimage"
UPDATE_POSTIMAGE = "update_postimage"
DELETE = "delete"
CHANGE_TYPES: tuple[str, ...] = (INSERT, UPDATE_PREIMAGE, UPDATE_POSTIMAGE, DELETE)
"""Every value ``_change_type`` may take, in Delta Change Data Feed's spelling."""


def is_changelog(frame: pl.DataFrame) -> bool:
    """Whether ``frame`` carries a ``_change_type`` column."""
    return CHANGE_TYPE in frame.columns


def split_changes(
    frame: pl.DataFrame, keys: Sequence[str]
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """``(upserts, deletes)``: what a table keyed by ``keys`` applies for ``frame``.

    For each key only its last change in the frame counts (changes are in
    order): a last ``insert``/``update_postimage`` is an upsert of that row, a
    last ``delete`` removes the key. Preimages are dropped. Both results lack
    the ``_change_type`` column. A frame without it is all upserts.
    """
    if not is_changelog(frame):
        return frame, frame.clear()
    rows = frame.filter(pl.col(CHANGE_TYPE) != UPDATE_PREIMAGE)
    if keys:
        rows = rows.unique(subset=list(keys), keep="last", maintain_order=True)
    kind = rows.get_column(CHANGE_TYPE)
    upserts = rows.filter(kind != DELETE).drop(CHANGE_TYPE)
    deletes = rows.filter(kind == DELETE).drop(CHANGE_TYPE)
    return upserts, deletes
