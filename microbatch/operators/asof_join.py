"""Temporal (as-of) join: ``events.join_asof_table(dim, on, time, dim_time)``.

``dim`` is a changelog stream of versions (key, ``dim_time`` = valid from,
values). Each event gets the version of its key with the latest
``dim_time <= event time`` (Polars ``join_asof(strategy="backward")``).

Rules (docs/semantics.md, "Joins"), ``W`` the watermark in force (the minimum
of both inputs' watermarks):

- an event waits in state until ``time <= W``: only then can no version with
  ``dim_time <= time`` arrive any more (a later version would have to be
  late), so its answer is final. It is emitted in the batch whose watermark
  first reaches its time;
- an event or a version whose time is null or ``<= W`` on arrival is late;
- versions are kept while an event could still need them: a version is
  dropped once the next version of its key has ``dim_time <= W`` (then every
  event still to come, at ``time > W``, takes that one or a newer one). Two
  versions of a key with the same ``dim_time``: the later arrival replaces
  the earlier.

A changelog dimension (its rows carry ``_change_type``, e.g.
``read_delta(path, changes=True)``): ``update_preimage`` rows are ignored;
``insert`` and ``update_postimage`` are versions valid from their
``dim_time``; a ``delete`` is a *tombstone* version, "no value from here on":
an event whose version is a tombstone gets nulls (``how="left"``) or is
dropped (``"inner"``). A delete takes effect at its ``_commit_timestamp``
when the dimension has that column and ``dim_time`` is another one (a
delete's row image carries the deleted row's old ``dim_time``, which says
nothing about when it was deleted), else at its ``dim_time``. A tombstone
expires as soon as the watermark reaches its own time: from then on every
event still to come would get no value from it, which is what an absent
version gives too (the versions before it expire in the same call, their
``__next`` being its time); a key whose newest version was a tombstone then
leaves the index as well, so deleted keys cost no state.

State: ``events`` keyed by a row id (batch id, row) with the event's
columns and its time (the time column: ``pop_expired(W)`` returns exactly the
events that became final); ``versions`` keyed by (key, slot) with the
version's columns and ``__next`` (the next version's ``dim_time``, null for
the newest: the time column, so dropping superseded versions costs only
those); ``index`` per key with the number of slots. A key's versions are
re-sorted and re-slotted whenever it receives a new version, so its slots
stay dense. Everything is vectorized per batch.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl

from microbatch.exceptions import ChangelogInputError, SourceError
from microbatch.operators.base import OperatorContext, StatefulOperator, check_signature
from microbatch.operators.join_state import (
    BinaryOperator,
    InputState,
    T,
    require_columns,
    require_same_key_types,
    split_late,
)
from microbatch.operators.registry import builds
from microbatch.operators.state import StoreSet
from microbatch.plan.joins import AsOfJoinSpec, events_changelog_refusal, output_columns
from microbatch.plan.nodes import AsOfJoinNode
from sinks.changelog import CHANGE_TYPE, CHANGE_TYPES, DELETE, UPDATE_PREIMAGE

if TYPE_CHECKING:
    from microbatch.types import OutputMode

RID, SLOT, VF, NEXT, N, FOUND, OLD = "__rid", "__slot", "__vf", "__next", "__n", "__found", "__old"
HIT, GONE, ORD = "__hit", "__gone", "__ord"
COMMIT_TIMESTAMP = "_commit_timestamp"
"""Delta Change Data Feed's commit time column (``read_delta(path, changes=True)``):
when the dimension has it, a ``delete`` takes effect then (module docstring)."""
ROW_BITS = 32
"""A row id is ``batch_id << 32 | row``: unique for batches below 2**31 rows."""


class AsOfJoin(BinaryOperator):
    """Events wait until final, then take their key's version valid at their time."""

    def __init__(self, *, operator_id: str, spec: AsOfJoinSpec) -> None:
        self.operator_id = operator_id
        self.spec = spec
        self.on = list(spec.on)
        self.events_in = InputState("events")
        self.dim_in = InputState("dimension")
        self.state = StoreSet()

    def signature(self) -> dict[str, Any]:
        return self.spec.describe()

    # ----------------------------------------------------------- state

    def open(self, state_dir: Path | None, batch_id: int) -> None:
        self.state = StoreSet()
        if state_dir is not None:
            check_signature(state_dir, self.signature())
        if self.events_in.open(None if state_dir is None else state_dir / "events"):
            self._events_provider()
        if self.dim_in.open(None if state_dir is None else state_dir / "dimension"):
            self._dim_providers()

    def _events_provider(self) -> None:
        schema = self.events_in.schema
        assert schema is not None
        assert self.events_in.directory is not None
        self.state.define(
            "events",
            self.events_in.directory / "rows",
            key_schema={RID: pl.Int64()},
            value_schema={**schema, T: pl.Int64()},
            time_column=T,
        )

    @property
    def changelog(self) -> bool:
        """Whether the dimension is a changelog (its rows carry ``_change_type``)."""
        return self.dim_in.schema is not None and CHANGE_TYPE in self.dim_in.schema

    def _dim_values(self) -> list[str]:
        """The dimension's value columns: not the keys, not ``_change_type``."""
        assert self.dim_in.schema is not None
        return [c for c in self.dim_in.schema if c not in self.on and c != CHANGE_TYPE]

    def _stored_values(self) -> list[str]:
        """A stored version's value columns (and the tombstone flag of a changelog)."""
        return [*self._dim_values(), *([GONE] if self.changelog else [])]

    def _dim_providers(self) -> None:
        schema = self.dim_in.schema
        directory = self.dim_in.directory
        assert schema is not None
        assert directory is not None
        keys = {k: schema[k] for k in self.on}
        values = {c: schema[c] for c in self._dim_values()}
        if self.changelog:  # NOTE: only then, so a plain dimension's state layout is unchanged
            values[GONE] = pl.Boolean()
        self.state.define(
            "versions",
            directory / "versions",
            key_schema={**keys, SLOT: pl.Int64()},
            value_schema={**values, VF: pl.Int64(), NEXT: pl.Int64()},
            time_column=NEXT,
        )
        self.state.define(
            "index", directory / "index", key_schema=keys, value_schema={N: pl.Int64()}
        )

    def _prepare(self, events: pl.DataFrame, dim: pl.DataFrame, batch_id: int) -> None:
        what = "join_asof_table"
        if events.width:
            if CHANGE_TYPE in events.columns:
                raise ChangelogInputError(events_changelog_refusal())
            if self.events_in.schema is None:
                require_columns(events.schema, [*self.on, self.spec.time], side="events", what=what)
                self.events_in.define(events.schema, batch_id)
                self._events_provider()
            else:
                self.events_in.check(events.schema, batch_id)
        if dim.width:
            if self.dim_in.schema is None:
                require_columns(
                    dim.schema, [*self.on, self.spec.dim_time], side="dimension", what=what
                )
                self.dim_in.define(dim.schema, batch_id)
                self._dim_providers()
            else:
                self.dim_in.check(dim.schema, batch_id)
        for name in self.state.providers:
            # NOTE: each input's stores count versions from the batch it was first seen in
            base = self.events_in if name == "events" else self.dim_in
            self.state.load(name, base.version(batch_id))

    def commit(self) -> None:
        self.state.commit()

    def abort(self) -> None:
        self.state.abort()

    def has_expirable_state(self, watermark_ms: int | None) -> bool:
        return watermark_ms is not None and bool(self.state)

    def metrics(self) -> dict[str, Any]:
        rows = {name: self.state.rows(name) for name in ("events", "versions", "index")}
        return {
            **self.state.totals(),
            "rows": sum(rows.values()),
            "events_waiting": rows["events"],
            "dimension_versions": rows["versions"],
            "dimension_keys": rows["index"],
        }

    # ----------------------------------------------------------- batch

    def process_pair(
        self, left: pl.DataFrame, right: pl.DataFrame, ctx: OperatorContext
    ) -> pl.DataFrame:
        wm = ctx.watermark_ms
        self._prepare(left, right, ctx.batch_id)
        late_rows = 0
        if self.state.get("versions") is not None and self.dim_in.schema is not None:
            dim = right if right.width else self.dim_in.schema.to_frame()
            new, late = self._split_dim(dim, wm, ctx.batch_id)
            late_rows += late.height
            if late.height:
                ctx.late_rows.append(late)
            self._add_versions(new.filter(pl.all_horizontal(pl.col(self.on).is_not_null())))
        if self.state.get("events") is None or self.events_in.schema is None:
            ctx.metrics[self.operator_id] = {**self.metrics(), "late_rows": late_rows}
            return pl.DataFrame()
        events = self.state["events"]
        frame = left if left.width else self.events_in.schema.to_frame()
        new, late = split_late(frame, self.spec.time, wm, "events")
        late_rows += late.height
        if late.height:
            ctx.late_rows.append(late)
        if new.height:
            rid = (ctx.batch_id << ROW_BITS) + pl.int_range(pl.len(), dtype=pl.Int64)
            events.upsert(new.select(rid.alias(RID), *self.events_in.schema, T))
        ready = (
            events.pop_expired(wm)
            if wm is not None
            else pl.DataFrame(schema={RID: pl.Int64(), **self.events_in.schema, T: pl.Int64()})
        )
        out = self._enrich(ready.drop(RID))
        if wm is not None and self.state.get("versions") is not None:
            self._expire_versions(wm)
        ctx.metrics[self.operator_id] = {
            **self.metrics(),
            "late_rows": late_rows,
            "emitted_rows": out.height,
        }
        return out

    def _split_dim(
        self, dim: pl.DataFrame, wm: int | None, batch_id: int
    ) -> tuple[pl.DataFrame, pl.DataFrame]:
        """The batch's versions that are not late (``__t`` = valid from; a changelog's
        with ``__gone`` and without ``_change_type``), and the late rows."""
        spec = self.spec
        if not self.changelog:
            return split_late(dim, spec.dim_time, wm, "dimension")
        kind = pl.col(CHANGE_TYPE)
        bad = dim.filter(~kind.is_in(CHANGE_TYPES).fill_null(value=False))
        if bad.height:
            raise SourceError(
                f"join_asof_table: batch {batch_id}: the dimension's {CHANGE_TYPE} holds "
                f"{bad.get_column(CHANGE_TYPE).unique().to_list()}; a changelog's rows must "
                f"be one of {list(CHANGE_TYPES)}. Fix the dimension's source, or drop "
                f"{CHANGE_TYPE} (.drop({CHANGE_TYPE!r})) to read every row as a version."
            )
        rows = dim.filter(kind != UPDATE_PREIMAGE)  # a preimage is not a version
        deleted = kind == DELETE
        if COMMIT_TIMESTAMP in dim.columns and spec.dim_time != COMMIT_TIMESTAMP:
            # NOTE: a delete takes effect at its commit; the arrival order is kept,
            # so that of two versions with the same time the later one still wins
            rows = rows.with_row_index(ORD)
            versions = split_late(rows.filter(~deleted), spec.dim_time, wm, "dimension")
            deletes = split_late(rows.filter(deleted), COMMIT_TIMESTAMP, wm, "dimension")
            new = pl.concat([versions[0], deletes[0]]).sort(ORD).drop(ORD)
            late = pl.concat([versions[1], deletes[1]]).sort(ORD).drop(ORD)
        else:
            new, late = split_late(rows, spec.dim_time, wm, "dimension")
        return new.with_columns(deleted.alias(GONE)).drop(CHANGE_TYPE), late

    def _expire_versions(self, wm: int) -> None:
        """Drop versions superseded at or before ``wm``, tombstones whose time it
        reached, and the index row of a key left without versions."""
        popped = self.state["versions"].pop_expired(wm)
        if not self.changelog or not popped.height:
            return
        index = self.state["index"]
        tombstones = popped.filter(GONE).select(*self.on, SLOT)
        if not tombstones.height:
            return
        counts = index.lookup(tombstones)
        # NOTE: every older version of the key expired with it (its __next is the
        # tombstone's time): a key whose newest version was popped has none left
        emptied = tombstones.filter(pl.col(SLOT) == counts.get_column(N) - 1)
        if emptied.height:
            index.delete(emptied.select(self.on).unique(maintain_order=True))

    def _versions_of(self, keys: pl.DataFrame) -> pl.DataFrame:
        """Every stored version of ``keys`` (unique, non-null), with its slot."""
        versions, index = self.state["versions"], self.state["index"]
        counts = index.lookup(keys).filter(pl.col(FOUND) & (pl.col(N) > 0))
        # NOTE: slots below a key's oldest live version were dropped by pop_expired
        # (holes); they are probed and not found until the key's next re-slotting
        wanted = counts.select(*self.on, pl.int_ranges(0, N, dtype=pl.Int64).alias(SLOT)).explode(
            SLOT
        )
        return versions.lookup(wanted).filter(FOUND).drop(FOUND, NEXT)

    def _add_versions(self, new: pl.DataFrame) -> None:
        """Merge new versions into their keys' histories, re-sorted and re-slotted."""
        if not new.height:
            return
        assert self.dim_in.schema is not None
        versions, index = self.state["versions"], self.state["index"]
        values = self._stored_values()
        keys = new.select(self.on).unique(maintain_order=True)
        stored = self._versions_of(keys)
        merged = (
            pl.concat(
                [
                    stored.select(*self.on, *values, VF, pl.col(SLOT).alias(OLD)),
                    new.select(
                        *self.on, *values, pl.col(T).alias(VF), pl.lit(None, pl.Int64).alias(OLD)
                    ),
                ]
            )
            .unique([*self.on, VF], keep="last", maintain_order=True)
            .sort([*self.on, VF], maintain_order=True)
            .with_columns(
                pl.col(VF).shift(-1).over(self.on).alias(NEXT),
                pl.int_range(pl.len(), dtype=pl.Int64).over(self.on).alias(SLOT),
            )
        )
        if self.changelog:  # a tombstone expires at its own time (module docstring)
            merged = merged.with_columns(
                pl.when(GONE).then(pl.col(VF)).otherwise(pl.col(NEXT)).alias(NEXT)
            )
        counts = merged.group_by(self.on, maintain_order=True).agg(pl.len().cast(pl.Int64).alias(N))
        stale = stored.join(counts, on=self.on, how="left", maintain_order="left").filter(
            pl.col(SLOT) >= pl.col(N)
        )
        if stale.height:
            versions.delete(stale.select(*self.on, SLOT))
        versions.upsert(merged.select(*self.on, SLOT, *values, VF, NEXT))
        index.upsert(counts)

    def _enrich(self, ready: pl.DataFrame) -> pl.DataFrame:
        """Final events (sorted by time) joined as of their time with the versions."""
        spec = self.spec
        events_schema = self.events_in.schema
        assert events_schema is not None
        dim_schema = self.dim_in.schema
        if dim_schema is None:  # no version ever arrived
            return ready.drop(T) if spec.how == "left" else ready.drop(T).head(0)
        require_same_key_types(
            events_schema,
            dim_schema,
            self.on,
            sides=("events", "dimension"),
            what="join_asof_table",
        )
        dim_out = pl.Schema({c: t for c, t in dim_schema.items() if c != CHANGE_TYPE})
        out_cols, rename = output_columns(events_schema, dim_out, self.on, spec.suffix)
        keys = (
            ready.select(self.on)
            .filter(pl.all_horizontal(pl.col(self.on).is_not_null()))
            .unique(maintain_order=True)
        )
        versions = self._versions_of(keys)
        right = versions.select(
            *self.on,
            *[pl.col(c).alias(o) for c, o in rename.items()],
            pl.col(VF),
            pl.lit(True).alias(HIT),
            *([GONE] if self.changelog else []),
        ).sort(VF, maintain_order=True)
        joined = ready.join_asof(
            right,
            left_on=T,
            right_on=VF,
            by=self.on,
            strategy="backward",
            check_sortedness=False,
        )
        if self.changelog:  # a tombstone in force: no value, and none of its columns
            live = ~pl.col(GONE).fill_null(value=False)
            joined = joined.with_columns(
                pl.when(live).then(pl.col(c)).alias(c) for c in [*rename.values(), HIT]
            )
        if spec.how == "inner":
            joined = joined.filter(pl.col(HIT).is_not_null())
        return joined.select(out_cols)


@builds(AsOfJoinNode)
def build_asof_join(node: AsOfJoinNode, operator_id: str, mode: OutputMode) -> StatefulOperator:
    """``join_asof_table``: events with the changelog's version as of their time."""
    return AsOfJoin(operator_id=operator_id, spec=node.spec)
