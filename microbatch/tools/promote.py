"""Swap a rebuilt Delta table in for a live one: ``microbatch promote``.

A rebuild runs beside the live job: a new checkpoint (``NEW``) writes a new
table (``REBUILD``) while the live query keeps writing ``LIVE``. Once
``microbatch diff LIVE REBUILD`` shows what changes, ``promote`` makes the
rebuild the live table and hands ``LIVE`` over to ``NEW``:

1. checks: ``NEW`` is not running and has every batch it wrote ahead
   committed (its last committed batch is ``B``); ``REBUILD`` was written by
   ``NEW``; no active writer of ``LIVE`` is running (its checkpoint lock);
2. **retire** (one metadata commit on ``LIVE``): every other writer of
   ``LIVE`` is marked retired, replaced by ``NEW``, and ``NEW`` is registered
   with ``promoted_batch=B`` (:func:`sinks.delta_writers.promote_entries`).
   From here the old checkpoints are refused on ``LIVE``, and so is ``NEW``
   until step 3 has landed;
3. **replace** (one overwrite commit on ``LIVE``): the rows of ``REBUILD``
   (streamed as Arrow record batches, never collected) with its schema and
   partitioning, carrying the app transaction ``(NEW's query id, B)`` and
   the custom metadata ``microbatch.promote`` (from where, which version).

NOTE: retire before replace. The other order would leave, after a kill
between the two, the rebuild's rows in ``LIVE`` with the old writer still
allowed to append to them.

Why Delta's own overwrite: every Delta reader (Spark, DuckDB, Polars,
delta-rs, Trino) sees the old rows or the new ones, atomically, at one table
version; the old version stays readable by time travel (rollback:
``DeltaTable(LIVE).restore(version before the promote)``); and the app
transaction in the same commit makes ``NEW``'s handed-over run idempotent on
``LIVE`` (it knows batches up to ``B`` are in). A pointer file that readers
follow works only for our readers; a directory rename is not atomic on S3.

Re-running after a kill is safe: a landed step 3 is recognised (``NEW``'s
entry names this rebuild and batch, and ``LIVE``'s transaction of ``NEW`` is
at ``B``) and nothing is done; a landed step 2 alone is finished by step 3.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from microbatch.checkpoint import Checkpoint
from microbatch.checkpoint.lock import is_locked
from microbatch.engine.faults import fault_point
from microbatch.exceptions import PromoteError
from sinks.delta import table_uri
from sinks.delta_durability import local_root, persist_versions
from sinks.delta_writers import (
    WRITER_PREFIX,
    WriterEntry,
    now_text,
    promote_entries,
    table_writers,
)

if TYPE_CHECKING:
    from deltalake import DeltaTable

__all__ = ["PromoteResult", "promote"]

ATTEMPTS = 5
"""Commit attempts of each step after a conflict (a reload in between)."""


@dataclass(frozen=True)
class PromoteResult:
    """What ``promote`` did (or found already done)."""

    live: str
    rebuild: str
    query_id: str
    batch: int
    """``NEW``'s last committed batch: ``LIVE``'s transaction of ``NEW`` from here."""
    version: int
    """The version of ``LIVE`` that holds the rebuild's rows."""
    rebuild_version: int
    previous_version: int
    """The version of ``LIVE`` before the promote: ``DeltaTable(LIVE).restore(it)``
    undoes it (the old writers are then active again)."""
    already: bool
    """The promote had landed before this call (a re-run): nothing was done."""
    retired: list[str] = field(default_factory=list)
    """The query ids retired from ``LIVE`` by this call."""

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def promote(
    rebuild: str, *, live: str, checkpoint: str | Path,
    storage_options: Mapping[str, str] | None = None,
) -> PromoteResult:
    """Replace ``live``'s rows with ``rebuild``'s in one Delta commit and hand ``live``
    over to the query of ``checkpoint`` (see the module docstring for the protocol).

    Raises :class:`PromoteError` (nothing changed) when a check fails."""
    options = dict(storage_options or {}) or None
    live_uri, rebuild_uri = table_uri(live), table_uri(rebuild)
    if live_uri == rebuild_uri:
        raise PromoteError(f"the rebuild and the live table are the same table ({live_uri})")
    chk = Checkpoint(checkpoint)
    query_id, batch = _committed(chk)
    rebuild_table = _load(rebuild_uri, options, "rebuild")
    new = _new_writer(rebuild_table, rebuild_uri, query_id, chk)
    table = _load(live_uri, options, "live")
    done = table.transaction_version(query_id)
    mine = table_writers(table).get(query_id)
    if mine is not None and mine.promoted_batch == batch and mine.rebuild == rebuild_uri \
            and done is not None and done >= batch:
        commit = _promote_commit(table)
        marker = commit.get("marker", {})
        return PromoteResult(live_uri, rebuild_uri, query_id, batch,
                             int(commit.get("version", table.version())),
                             int(marker.get("rebuild_version", -1)),
                             -1 if mine.previous_version is None else mine.previous_version,
                             already=True)
    if done is not None:
        raise PromoteError(
            f"Delta table {live_uri} already holds batches up to {done} of query {query_id} "
            f"(checkpoint {chk.root}): that query writes it already, or a promote of it was "
            "undone by a restore (its app transaction stays in the log). Nothing was "
            "changed. Promote a rebuild written by a new checkpoint."
        )
    _refuse_running_writers(table, live_uri, query_id)
    retired: list[str] = []
    if mine is not None and mine.promoted_batch == batch and mine.rebuild == rebuild_uri:
        previous = -1 if mine.previous_version is None else mine.previous_version  # a re-run
    else:
        previous = int(table.version())
        table, retired = _retire(table, live_uri, options, replace(new, previous_version=previous),
                                 rebuild_uri, batch)
    fault_point("promote.after_retire", batch)
    version = _replace(table, rebuild_table, Marker(live_uri, rebuild_uri, query_id, batch,
                                                    previous))
    return PromoteResult(live_uri, rebuild_uri, query_id, batch, version,
                         rebuild_table.version(), previous, already=False, retired=retired)


def _committed(chk: Checkpoint) -> tuple[str, int]:
    """``NEW``'s query id and last committed batch; refuse a running or unfinished one."""
    query_id = str(chk.read_metadata()["query_id"])
    if chk.is_running():
        raise PromoteError(
            f"checkpoint {chk.root} is running (its lock is held): stop the rebuild, then "
            "promote, then start it again on the live table"
        )
    last = chk.commits.latest()
    ahead = chk.offsets.latest()
    if last is None:
        raise PromoteError(f"checkpoint {chk.root} has no committed batch: run the rebuild first")
    if ahead is not None and ahead.batch_id > last.batch_id:
        raise PromoteError(
            f"checkpoint {chk.root} has batch {ahead.batch_id} written ahead and not "
            f"committed (the last committed one is {last.batch_id}): run the rebuild again "
            "on the same checkpoint until it ends, then promote"
        )
    return query_id, last.batch_id


def _load(uri: str, options: dict[str, str] | None, what: str) -> DeltaTable:
    from deltalake import DeltaTable

    try:
        return DeltaTable(uri, storage_options=options)
    except Exception as exc:
        first = str(exc).splitlines()[0] if str(exc) else repr(exc)
        raise PromoteError(f"cannot open the {what} Delta table {uri}: {first}") from exc


def _new_writer(table: DeltaTable, uri: str, query_id: str, chk: Checkpoint) -> WriterEntry:
    """``NEW``'s entry as a writer of the rebuild; refuse a rebuild ``NEW`` did not write."""
    entry = table_writers(table).get(query_id)
    if entry is None and table.transaction_version(query_id) is None:
        raise PromoteError(
            f"the rebuild {uri} was not written by the query of checkpoint {chk.root} "
            f"({query_id}): pass the checkpoint that wrote it"
        )
    return WriterEntry(query_id=query_id, checkpoint=str(chk.root),
                       role=entry.role if entry else "output")


def _refuse_running_writers(table: DeltaTable, uri: str, query_id: str) -> None:
    for entry in table_writers(table).values():
        if entry.query_id == query_id or entry.retired or not entry.checkpoint:
            continue
        if is_locked(Path(entry.checkpoint) / "lock"):
            raise PromoteError(
                f"Delta table {uri} is being written right now by {entry.describe()}: stop "
                "it (SIGTERM waits for the batch in flight), then promote. Nothing was changed."
            )


def _retire(  # noqa: PLR0917 - private, one call site
    table: DeltaTable, uri: str, options: dict[str, str] | None, new: WriterEntry,
    rebuild: str, batch: int,
) -> tuple[DeltaTable, list[str]]:
    """Step 2: one metadata commit retiring ``LIVE``'s other writers and registering ``NEW``."""
    from deltalake.exceptions import CommitFailedError

    for _ in range(ATTEMPTS):
        props = promote_entries(table, new=new, rebuild=rebuild, batch=batch)
        retired = [key[len(WRITER_PREFIX):] for key in props if key != new.key]
        try:
            table.alter.set_table_properties(props, raise_if_not_exists=False)
        except CommitFailedError:
            table = _load(uri, options, "live")
            _refuse_running_writers(table, uri, new.query_id)
            continue
        table.update_incremental()
        _persist(uri, table)
        return table, retired
    raise PromoteError(f"Delta table {uri}: retiring its writers conflicted {ATTEMPTS} times")


@dataclass(frozen=True)
class Marker:
    """What the promote commit records in its custom metadata ``microbatch.promote``."""

    live: str
    rebuild: str
    query_id: str
    batch: int
    previous_version: int


def _replace(table: DeltaTable, rebuild_table: DeltaTable, what: Marker) -> int:
    """Step 3: one overwrite commit with the rebuild's rows and ``(NEW, B)``."""
    from deltalake import CommitProperties, Transaction, write_deltalake

    uri, query_id, batch = what.live, what.query_id, what.batch
    rows = rebuild_table.to_pyarrow_dataset().scanner().to_reader()
    marker = {"from": what.rebuild, "rebuild_version": rebuild_table.version(),
              "query_id": query_id, "batch": batch, "at": now_text(),
              "previous_version": what.previous_version}
    try:
        write_deltalake(
            table, rows, mode="overwrite", schema_mode="overwrite",
            partition_by=list(rebuild_table.metadata().partition_columns) or None,
            commit_properties=CommitProperties(
                app_transactions=[Transaction(query_id, batch)],
                custom_metadata={"microbatch.promote": json.dumps(marker, sort_keys=True)},
            ),
        )
    except Exception as exc:
        first = str(exc).splitlines()[0] if str(exc) else repr(exc)
        raise PromoteError(
            f"cannot write the rebuild's rows into Delta table {uri}: {first}. The old "
            "writers are retired already; re-run the same promote command to finish."
        ) from exc
    table.update_incremental()
    _persist(uri, table)
    return int(table.version())


def _persist(uri: str, table: DeltaTable) -> None:
    root = local_root(uri)
    if root is not None:
        persist_versions(root, table.version(), table.version())


def _promote_commit(table: DeltaTable) -> dict[str, Any]:
    for commit in table.history(limit=20):
        if "microbatch.promote" in commit:
            return dict(commit, **{"marker": json.loads(commit["microbatch.promote"])})
    return {}


