"""Which batches of a query an Iceberg table holds: the sink's exactly-once record.

Every commit of batch ``N`` of query ``Q`` records it twice, atomically (one
catalog commit):

- in the summary of each snapshot it adds (``snapshot_properties``):
  ``microbatch.query-id = Q`` and ``microbatch.batch-id = N``;
- in the table's properties: ``microbatch.last-batch.Q = N``.

:func:`last_committed_batch` reads both and returns the larger: the
ancestors of the current snapshot are walked back to the newest one carrying
``Q`` (and no further), and the property is read. Why both: the snapshot
summary is where Iceberg tools look for a commit's origin, and it needs no
table-level write; the property survives ``expire_snapshots`` (which may drop
every snapshot of ``Q``) and records a batch that made no snapshot (an
``update`` batch whose deletes matched nothing). Neither ever goes backwards
for a query: batch ids only grow, and a batch is recorded only with its rows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyiceberg.table import Table

__all__ = [
    "BATCH_ID",
    "QUERY_ID",
    "ROLE",
    "batch_summary",
    "last_batch_property",
    "last_committed_batch",
]

QUERY_ID = "microbatch.query-id"
"""Snapshot summary key: the query (checkpoint) that made the snapshot."""
BATCH_ID = "microbatch.batch-id"
"""Snapshot summary key: the batch id whose rows the snapshot holds."""
ROLE = "microbatch.role"
"""Snapshot summary key: which output of the query (``output``, ``late``, ...)."""
_LAST_BATCH = "microbatch.last-batch."


def last_batch_property(query_id: str) -> str:
    """The table property holding ``query_id``'s last committed batch id."""
    return _LAST_BATCH + query_id


def batch_summary(query_id: str, batch_id: int, role: str) -> dict[str, str]:
    """The snapshot summary entries of a commit of ``batch_id``."""
    return {QUERY_ID: query_id, BATCH_ID: str(batch_id), ROLE: role}


def last_committed_batch(table: Table, query_id: str) -> int | None:
    """The largest batch id of ``query_id`` that ``table`` holds (``None``: none).

    Walks the current snapshot's ancestors (parent links) back to the newest
    snapshot of ``query_id``, stopping there, and reads the table property;
    the larger of the two."""
    found: int | None = None
    text = table.properties.get(last_batch_property(query_id))
    if text is not None and text.lstrip("-").isdigit():
        found = int(text)
    metadata = table.metadata
    snapshot = table.current_snapshot()
    while snapshot is not None:
        summary = snapshot.summary
        if summary is not None and summary.get(QUERY_ID) == query_id:
            batch = summary.get(BATCH_ID)
            if batch is not None and batch.isdigit():
                found = int(batch) if found is None else max(found, int(batch))
                break
        parent = snapshot.parent_snapshot_id
        snapshot = None if parent is None else metadata.snapshot_by_id(parent)
    return found
