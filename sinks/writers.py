"""A table knows its writers: the streaming queries registered in its properties.

Two checkpoints appending the same rows to one table double them (each has
its own query id, so neither's exactly-once record stops the other). So a
streaming sink registers its query in the table's properties
(``microbatch.writer.<query id>`` = a JSON :class:`WriterEntry`: checkpoint,
role, since when) and, when it opens a table another active query is
registered on, refuses with :class:`OtherWriterError` unless it was given
``allow_other_writers=True``.

This module is the registry's format-independent part, shared by the Delta
sink (:mod:`sinks.delta_writers`: registration in a metadata commit, or the
``CREATE TABLE``) and the Iceberg sink (:mod:`sinks.iceberg`: registration in
the query's first data commit): the entry format, the rules deciding who may
write (:func:`check_registry`, over a table's properties as a plain mapping,
:class:`RegistryView`) and the property updates of a registration, a
savepoint handover and a promote. Committing those updates is the format's
business: a registration must be a commit that fails when another
registration landed since the table was read, so that of two queries starting
at once one is refused.

Rules::

    entries = table properties
    mine retired          -> RetiredWriterError
    --- only when opening (or not registered yet) ---
    mine promoted to batch B, committed(mine) < B    -> PromoteUnfinishedError
    a predecessor (this query continues it from its savepoint at batch S)
      that committed past S                          -> OtherWriterError
    another active entry, no opt-in                  -> OtherWriterError
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

from sinks.exceptions import OtherWriterError, PromoteUnfinishedError, RetiredWriterError

if TYPE_CHECKING:
    from sinks.base import SinkContext

__all__ = [
    "WRITER_PREFIX",
    "RegistryView",
    "WriterEntry",
    "check_registry",
    "handover_properties",
    "now_text",
    "promote_properties",
    "registration_properties",
    "writer_of",
    "writers_of",
]

WRITER_PREFIX = "microbatch.writer."
"""Table property key prefix; the rest of the key is the writer's query id."""


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


@dataclass(frozen=True)
class RegistryView:
    """What the rules read of one table, whatever its format, and how the
    refusals name it and its ways out."""

    table: str
    """How messages name the table: ``"Delta table /lake/t"``."""
    properties: Mapping[str, str | None]
    """The table's properties as loaded (the registry's entries among them)."""
    committed: Callable[[str], int | None]
    """A query id's last batch the table holds (``None``: none)."""
    opt_in: str
    """The writer that takes ``allow_other_writers=True``: ``"write_delta (DeltaSink)"``."""
    new_table: str = "a new table path"
    """Where else a query can write: ``"a new table path"``."""
    new_version: str = ("a new version of the output; `microbatch promote` can swap it in "
                        "for the live table later")
    """What that new table is (said in parentheses)."""


def now_text() -> str:
    """The current UTC time as ISO 8601 text, to the second."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def writer_of(ctx: SinkContext, *, allow_other_writers: bool) -> WriterEntry:
    """The entry of the query a sink was opened with ``ctx`` for (its query id,
    checkpoint and role), not registered yet (no ``since``)."""
    return WriterEntry(
        query_id=ctx.query_id,
        checkpoint=None if ctx.checkpoint_dir is None else str(ctx.checkpoint_dir),
        role=ctx.role,
        allow_other_writers=allow_other_writers,
    )


def writers_of(properties: Mapping[str, str | None]) -> dict[str, WriterEntry]:
    """The writers registered in a table's ``properties``, by query id."""
    return {
        key[len(WRITER_PREFIX):]: WriterEntry.from_property(key, value)
        for key, value in properties.items()
        if key.startswith(WRITER_PREFIX) and value is not None
    }


def check_registry(
    view: RegistryView, *, me: WriterEntry, opening: bool,
    predecessors: Mapping[str, int] | None = None,
) -> WriterEntry | None:
    """Refuse when ``me`` may not write the table (see the module's rules);
    return ``me``'s registered entry (``None``: not registered yet).

    ``opening``: also refuse other active writers and an unfinished promote
    (at open, and before a commit that registers ``me``); otherwise only a
    retirement. ``predecessors`` (query id -> its savepoint's batch): the
    queries ``me`` continues from a savepoint; they are not refused but
    handed over (:func:`registration_properties` retires them), unless one
    committed a batch after its savepoint (it kept running: its rows and
    ``me``'s would both land)."""
    predecessors = predecessors or {}
    entries = writers_of(view.properties)
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
            f"{view.table}: this query ({me.query_id}, checkpoint {me.checkpoint}) was "
            f"retired as its writer at {mine.retired} {how}. Nothing was written. Run that "
            f"query's checkpoint against this table, or write this one to {view.new_table}."
        )
    if not opening:
        return mine
    if mine is not None and mine.promoted_batch is not None:
        done = view.committed(me.query_id)
        if done is None or done < mine.promoted_batch:
            raise PromoteUnfinishedError(
                f"{view.table}: `microbatch promote` of {mine.rebuild} into this table "
                f"for this query ({me.query_id}) retired the old writers but did not commit "
                f"the rebuild's rows (batches up to {mine.promoted_batch}). Nothing was "
                "written. Re-run the same `microbatch promote` command: it finishes the swap."
            )
    for query_id, batch in predecessors.items():
        entry = entries.get(query_id)
        done = view.committed(query_id)
        if entry is not None and not entry.retired and done is not None and done > batch:
            raise OtherWriterError(
                f"{view.table}: {entry.describe()} committed batches "
                f"up to {done} to it after its savepoint at batch {batch}, which this query "
                f"({me.query_id}) continues from; both would write the batches after "
                f"{batch}. Nothing was written. Stop that query, take a new savepoint "
                "(`microbatch savepoint`) and start this job from it on a new checkpoint, "
                f"or write this query to {view.new_table}."
            )
    others = [e for q, e in entries.items()
              if q != me.query_id and not e.retired and q not in predecessors]
    if others and not me.allow_other_writers:
        listed = "; ".join(e.describe() for e in others)
        raise OtherWriterError(
            f"{view.table} is already written by {listed}. This query ({me.query_id}, "
            f"checkpoint {me.checkpoint}) would write its rows a second time (each "
            "checkpoint has its own query id, so their batches do not deduplicate). "
            f"Nothing was written. Two ways out: write this query to {view.new_table} "
            f"({view.new_version}), or, if several queries are meant to write this table, "
            f"pass allow_other_writers=True to {view.opt_in}."
        )
    return mine


def registration_properties(
    properties: Mapping[str, str | None], *, me: WriterEntry,
    predecessors: Mapping[str, int] | None = None,
) -> dict[str, str]:
    """The properties that register ``me`` (stamped with the time now) on a
    table with ``properties``, retiring the ``predecessors`` active on it
    (:func:`handover_properties`), to set in one commit."""
    entry = replace(me, since=now_text())
    props = handover_properties(properties, new=entry, predecessors=predecessors or {})
    props[entry.key] = entry.to_json()
    return props


def handover_properties(
    properties: Mapping[str, str | None], *, new: WriterEntry, predecessors: Mapping[str, int]
) -> dict[str, str]:
    """The properties that retire ``predecessors`` (query id -> savepoint batch)
    active in ``properties`` in favour of ``new``, which continues them."""
    props = {}
    for query_id, entry in writers_of(properties).items():
        if query_id in predecessors and not entry.retired:
            retired = replace(entry, retired=new.since or now_text(), replaced_by=new.query_id,
                              savepoint_batch=predecessors[query_id])
            props[retired.key] = retired.to_json()
    return props


def promote_properties(
    properties: Mapping[str, str | None], *, new: WriterEntry, rebuild: str, batch: int
) -> dict[str, str]:
    """The properties a promote sets on the live table: every other active
    writer retired (replaced by ``new``), and ``new`` registered with the batch
    its promote commit holds."""
    stamp = now_text()
    props = {}
    for query_id, entry in writers_of(properties).items():
        if query_id == new.query_id or entry.retired:
            continue
        retired = replace(entry, retired=stamp, replaced_by=new.query_id, rebuild=rebuild)
        props[retired.key] = retired.to_json()
    mine = replace(new, since=stamp, rebuild=rebuild, promoted_batch=batch)
    props[mine.key] = mine.to_json()
    return props
