"""A Delta table knows its writers: the streaming queries registered in its properties.

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

import json
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

from sinks.exceptions import (
    OtherWriterError,
    PromoteUnfinishedError,
    RetiredWriterError,
    SinkError,
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

WRITER_PREFIX = "microbatch.writer."
"""Table property key prefix; the rest of the key is the writer's query id."""
REGISTER_ATTEMPTS = 5


@dataclass(frozen=True)
class WriterEntry:
    """One query registered as a writer of a table (the value of its property)."""

    query_id: str
    checkpoint: str | None = None
    role: str = "output"
    """``output``, ``late`` or ``dead_letter``: which of the query's outputs."""
    since: str = ""
    """When it registered (UTC, ISO 8601)."""
    allow_other_writers: bool = False
    retired: str | None = None
    """When ``microbatch promote`` retired it (``None``: active)."""
    replaced_by: str | None = None
    """The query id that took the table over."""
    rebuild: str | None = None
    """The table the promoted rows came from (on the new writer's and the
    retired writers' entries)."""
    savepoint_batch: int | None = None
    """On a writer retired by its successor started from its savepoint: the
    savepoint's batch (the successor writes the batches after it)."""
    promoted_batch: int | None = None
    """On the new writer's entry: the batch up to which the promote commit holds
    its rows (its app transaction on this table)."""
    previous_version: int | None = None
    """On the new writer's entry: the table's version before the promote (what
    ``DeltaTable.restore`` goes back to, to undo it)."""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return WRITER_PREFIX + self.query_id

    def to_json(self) -> str:
        body = {k: v for k, v in asdict(self).items() if v not in (None, {}, False, "")}
        body.pop("query_id")
        return json.dumps(body, sort_keys=True)

    @classmethod
    def from_property(cls, key: str, value: str) -> WriterEntry:
        query_id = key[len(WRITER_PREFIX):]
        try:
            body = json.loads(value)
        except json.JSONDecodeError:
            body = {}
        if not isinstance(body, dict):
            body = {}
        known = {f for f in cls.__dataclass_fields__ if f not in ("query_id", "extra")}
        extra = {k: v for k, v in body.items() if k not in known}
        return cls(query_id=query_id, extra=extra,
                   **{k: v for k, v in body.items() if k in known})

    def describe(self) -> str:
        where = f"checkpoint {self.checkpoint}" if self.checkpoint else "no checkpoint"
        return f"query {self.query_id} ({where}, its {self.role} since {self.since or '?'})"


def now_text() -> str:
    """The current UTC time as ISO 8601 text, to the second."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def table_writers(table: DeltaTable) -> dict[str, WriterEntry]:
    """The writers registered on ``table`` (as of its loaded version), by query id."""
    config = table.metadata().configuration
    return {
        key[len(WRITER_PREFIX):]: WriterEntry.from_property(key, value)
        for key, value in config.items()
        if key.startswith(WRITER_PREFIX) and value is not None
    }


def check_writers(
    table: DeltaTable, *, uri: str, me: WriterEntry, opening: bool,
    predecessors: Mapping[str, int] | None = None,
) -> WriterEntry | None:
    """Refuse when ``me`` may not write ``table`` (see the module's protocol);
    return ``me``'s registered entry (``None``: not registered yet).

    ``opening``: also refuse other active writers and an unfinished promote
    (at open); otherwise only a retirement (before each commit).
    ``predecessors`` (query id -> its savepoint's batch): the queries ``me``
    continues from a savepoint; they are not refused but handed over
    (:func:`register_writer` retires them), unless one committed a batch
    after its savepoint (it kept running: its rows and ``me``'s would both
    land)."""
    predecessors = predecessors or {}
    entries = table_writers(table)
    mine = entries.get(me.query_id)
    if mine is not None and mine.retired:
        how = (
            f"by `microbatch promote`, which replaced the table's rows with the rebuild "
            f"{mine.rebuild} and handed the table to query {mine.replaced_by}"
            if mine.savepoint_batch is None else
            f"by query {mine.replaced_by}, which continues this query from its savepoint at "
            f"batch {mine.savepoint_batch} (`microbatch run --from-savepoint`) and writes "
            "the batches after it"
        )
        raise RetiredWriterError(
            f"Delta table {uri}: this query ({me.query_id}, checkpoint {me.checkpoint}) was "
            f"retired as its writer at {mine.retired} {how}. Nothing was written. Run that "
            "query's checkpoint against this table, or write this one to a new table path."
        )
    if not opening:
        return mine
    if mine is not None and mine.promoted_batch is not None:
        done = table.transaction_version(me.query_id)
        if done is None or done < mine.promoted_batch:
            raise PromoteUnfinishedError(
                f"Delta table {uri}: `microbatch promote` of {mine.rebuild} into this table "
                f"for this query ({me.query_id}) retired the old writers but did not commit "
                f"the rebuild's rows (batches up to {mine.promoted_batch}). Nothing was "
                "written. Re-run the same `microbatch promote` command: it finishes the swap."
            )
    for query_id, batch in predecessors.items():
        entry = entries.get(query_id)
        done = table.transaction_version(query_id)
        if entry is not None and not entry.retired and done is not None and done > batch:
            raise OtherWriterError(
                f"Delta table {uri}: {entry.describe()} committed batches "
                f"up to {done} to it after its savepoint at batch {batch}, which this query "
                f"({me.query_id}) continues from; both would write the batches after "
                f"{batch}. Nothing was written. Stop that query, take a new savepoint "
                "(`microbatch savepoint`) and start this job from it on a new checkpoint, "
                "or write this query to a new table path."
            )
    others = [e for q, e in entries.items()
              if q != me.query_id and not e.retired and q not in predecessors]
    if others and not me.allow_other_writers:
        listed = "; ".join(e.describe() for e in others)
        raise OtherWriterError(
            f"Delta table {uri} is already written by {listed}. This query ({me.query_id}, "
            f"checkpoint {me.checkpoint}) would write its rows a second time (each "
            "checkpoint has its own query id, so their batches do not deduplicate). "
            "Nothing was written. Two ways out: write this query to a new table path (a "
            "new version of the output; `microbatch promote` can swap it in for the live "
            "table later), or, if several queries are meant to write this table, pass "
            "allow_other_writers=True to write_delta (DeltaSink)."
        )
    return mine


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
        entry = replace(me, since=now_text())
        props = handover_entries(table, new=entry, predecessors=predecessors or {})
        props[entry.key] = entry.to_json()
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
    props = {}
    for query_id, entry in table_writers(table).items():
        if query_id in predecessors and not entry.retired:
            retired = replace(entry, retired=new.since or now_text(), replaced_by=new.query_id,
                              savepoint_batch=predecessors[query_id])
            props[retired.key] = retired.to_json()
    return props


def promote_entries(
    table: DeltaTable, *, new: WriterEntry, rebuild: str, batch: int
) -> dict[str, str]:
    """The properties a promote sets on the live ``table``: every other active
    writer retired (replaced by ``new``), and ``new`` registered with the batch
    its promote commit holds."""
    stamp = now_text()
    props = {}
    for query_id, entry in table_writers(table).items():
        if query_id == new.query_id or entry.retired:
            continue
        retired = replace(entry, retired=stamp, replaced_by=new.query_id, rebuild=rebuild)
        props[retired.key] = retired.to_json()
    mine = replace(new, since=stamp, rebuild=rebuild, promoted_batch=batch)
    props[mine.key] = mine.to_json()
    return props
