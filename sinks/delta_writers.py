"""A Delta table knows its writers: the streaming queries registered in its properties.

The entry format and the rules are :mod:`sinks.writers` (shared with the
Iceberg sink); this module reads them from a Delta table and commits them.

Two checkpoints appending the same rows to one table double them (each has
its own query id, so neither's app transaction stops the other). So every
streaming :class:`sinks.delta.DeltaSink` registers its query in the table's
properties (``microbatch.writer.<query id>`` = a JSON :class:`WriterEntry`:
checkpoint, role, since when) and, when it opens a table another active query
is registered on, refuses with :class:`OtherWriterError` unless it was given
``allow_other_writers=True``.

Why table properties and not a scan of the log's app transactions:

- cheap: the properties are part of the table's snapshot, which the sink
  loads anyway (no extra read, whatever the table's history length);
- race-free: a registration is a metadata commit, and Delta refuses a commit
  whose snapshot predates another metadata change ("Metadata changed since
  last commit"). Two writers starting at once cannot both register: the loser
  reloads, finds the winner, and refuses;
- it carries what a transaction id cannot: the checkpoint to name in the
  refusal, and a retirement (``microbatch promote`` retires the live table's
  writers when it swaps a rebuild in, :func:`promote_entries`).

A table written before this registry existed has no entries: the first query
that opens it registers itself.

Protocol (NOTE: registration happens at open, before the first data commit,
and the retirement check runs before every commit attempt)::

    open:   entries = table properties
            mine retired          -> RetiredWriterError
            mine promoted to batch B, txn(mine) < B -> PromoteUnfinishedError
            another active entry, no opt-in          -> OtherWriterError
            a predecessor (this query continues it from its savepoint at batch S)
              that committed past S                  -> OtherWriterError
            mine missing          -> register (metadata commit, which also retires
                                     the predecessors); on a conflict reload and
                                     check again
    write:  after each refresh: mine retired -> RetiredWriterError
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from sinks.exceptions import SinkError
from sinks.writers import (
    WRITER_PREFIX,
    RegistryView,
    WriterEntry,
    check_registry,
    handover_properties,
    now_text,
    promote_properties,
    registration_properties,
    writers_of,
)

if TYPE_CHECKING:
    from deltalake import DeltaTable

__all__ = [
    "WRITER_PREFIX",
    "WriterEntry",
    "check_writers",
    "handover_entries",
    "now_text",
    "promote_entries",
    "register_writer",
    "table_writers",
]

REGISTER_ATTEMPTS = 5


def _properties(table: DeltaTable) -> Mapping[str, str | None]:
    return table.metadata().configuration


def _view(table: DeltaTable, uri: str) -> RegistryView:
    return RegistryView(table=f"Delta table {uri}", properties=_properties(table),
                        committed=table.transaction_version, opt_in="write_delta (DeltaSink)")


def table_writers(table: DeltaTable) -> dict[str, WriterEntry]:
    """The writers registered on ``table`` (as of its loaded version), by query id."""
    return writers_of(_properties(table))


def check_writers(
    table: DeltaTable, *, uri: str, me: WriterEntry, opening: bool,
    predecessors: Mapping[str, int] | None = None,
) -> WriterEntry | None:
    """Refuse when ``me`` may not write ``table`` (see the module's protocol:
    :func:`sinks.writers.check_registry` on its properties, with its app
    transactions as the committed batches); return ``me``'s registered entry
    (``None``: not registered yet)."""
    return check_registry(_view(table, uri), me=me, opening=opening, predecessors=predecessors)


def register_writer(
    table: DeltaTable, *, uri: str, me: WriterEntry, reload: Any,
    predecessors: Mapping[str, int] | None = None,
) -> DeltaTable:
    """Check ``me`` against ``table``'s writers and register it when it is not;
    returns the table handle to use from here (reloaded after a conflict).

    ``reload()`` returns a fresh handle. A registration is a metadata commit:
    a concurrent registration makes it fail, and the reloaded table is checked
    again (so of two queries starting at once, one is refused). The same
    commit retires ``predecessors`` active on the table (:func:`handover_entries`)."""
    from deltalake.exceptions import CommitFailedError

    for _ in range(REGISTER_ATTEMPTS):
        mine = check_writers(table, uri=uri, me=me, opening=True, predecessors=predecessors)
        if mine is not None:
            return table
        props = registration_properties(_properties(table), me=me, predecessors=predecessors)
        try:
            table.alter.set_table_properties(props, raise_if_not_exists=False)
        except CommitFailedError:
            table = reload()
            continue
        except Exception as exc:
            raise SinkError(
                f"cannot register query {me.query_id} as a writer of Delta table {uri}: {exc}"
            ) from exc
        table.update_incremental()
        return table
    raise SinkError(
        f"Delta table {uri}: registering query {me.query_id} as a writer conflicted "
        f"{REGISTER_ATTEMPTS} times with other commits; try again"
    )


def handover_entries(
    table: DeltaTable, *, new: WriterEntry, predecessors: Mapping[str, int]
) -> dict[str, str]:
    """The properties that retire ``predecessors`` (query id -> savepoint batch)
    active on ``table`` in favour of ``new``, which continues them."""
    return handover_properties(_properties(table), new=new, predecessors=predecessors)


def promote_entries(
    table: DeltaTable, *, new: WriterEntry, rebuild: str, batch: int
) -> dict[str, str]:
    """The properties a promote sets on the live ``table``: every other active
    writer retired (replaced by ``new``), and ``new`` registered with the batch
    its promote commit holds."""
    return promote_properties(_properties(table), new=new, rebuild=rebuild, batch=batch)
