"""``group_by(*keys).transform_with_state(fn, ...)``: per-key state and timers, vectorized.

Per batch (docs/semantics.md, "Stateful processing"):

1. with ``time_column`` and a watermark, rows at or before the watermark are late
   (late output, counted), as for sessions and dedupe; with
   ``event_time_order=True`` the other rows wait in state until the watermark
   passes them, and the rows it passes now are released in event-time order;
2. timers fire: event-time timers at or before the watermark in force,
   processing-time timers at or before the batch's recorded timestamp (so a
   re-run fires the same), in time then key order;
3. state whose TTL passed is removed (``expired_rows``): with
   ``ttl_time="processing"`` ``ttl`` after the key's last state write, by the
   batch's recorded timestamp; with ``"event"`` ``ttl`` after the newest event
   time of its rows, by the watermark. Timers and expiry keep time order: a
   key with a timer of the TTL's kind due at or before its expiry still gets
   its state for that call (writing it again keeps it);
4. ``fn`` is called **once** with the rows, the state of every key with rows or
   a firing timer, and the firing timers (:class:`StateInput`);
5. its :class:`StateOutput` is applied: deletes, then upserts, then new timers;
   its rows go downstream.

State, event timers, processing timers (and the rows waiting for the
watermark) are stores of one :class:`~microbatch.operators.state.StoreSet`,
versioned with the batch like every other operator's state, so a replay sees
and produces the same.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl

from microbatch.checkpoint.files import (
    make_dirs,
)
from microbatch.exceptions import IncompatibleCheckpointError, PlanError, TransformError
from microbatch.operators.base import (
    OperatorContext,
    StatefulOperator,
    check_signature,
    split_late_by_time,
)
from microbatch.operators.registry import builds
from microbatch.operators.state import StoreSet
from microbatch.operators.state_schema import StateSchemaFile, read_types, write_types
from microbatch.plan.event_time import event_time_ms
from microbatch.plan.nodes import TransformNode
from microbatch.plan.stateful import (
    KIND,
    TIMER,
    TIMER_KINDS,
    StateInput,
    StateOutput,
    TransformSpec,
)

if TYPE_CHECKING:
    from microbatch.types import OutputMode
    from statestore import StateStore

__all__ = ["TransformWithState"]

EXPIRE = "__expire_at"
LAST_EVENT = "__last_event"
FIRE = "__fire_at"
TIME = "__t"
SEQ = "__seq"
SCHEMA_FILE = "state-schema.json"
SCHEMA_ARROW = "state-schema.arrow"
PENDING_ARROW = "pending-schema.arrow"
_SEQ_BITS = 32
"""A waiting row's arrival number: ``batch_id << 32 | row index`` (unique, ordered)."""


class TransformWithState(StatefulOperator):
    """Runs ``fn`` once per batch over the keys' rows, state and fired timers."""

    def __init__(self, *, operator_id: str, spec: TransformSpec) -> None:
        self.operator_id = operator_id
        self.spec = spec
        self.keys = list(spec.keys)
        self.state_dir: Path | None = None
        self.state = StoreSet()
        self.key_schema: pl.Schema | None = None
        self.pending_schema: pl.Schema | None = None
        self.state_rows = pl.Schema()
        """The columns of a state store row (keys, state, the engine's own)."""
        self.added: tuple[str, ...] = ()

    def signature(self) -> dict[str, Any]:
        return self.spec.describe()

    # ----------------------------------------------------------------- state

    def open(self, state_dir: Path | None, batch_id: int) -> None:
        self.state_dir = state_dir
        self.state = StoreSet()
        self.state.backend = self.state_backend
        if state_dir is None:
            return
        check_signature(state_dir, self.signature())
        if self._schema_file().committed():
            recorded = self._recorded()
            self._evolve(recorded)
            pending = (read_types(state_dir / PENDING_ARROW)
                       if self.spec.event_time_order else None)
            self._define(pl.Schema(recorded["keys"]), pending)
            # NOTE: loaded now, not at the first batch: an idle query must know
            # whether a processing-time timer or TTL is due before any row arrives
            self.state.load_all(batch_id)

    def _schema_file(self) -> StateSchemaFile:
        assert self.state_dir is not None
        return StateSchemaFile(self.state_dir / SCHEMA_ARROW, self.state_dir / SCHEMA_FILE,
                               "transform-state")

    def _recorded(self) -> dict[str, Any]:
        """The recorded key and state columns (exact types: an Arrow IPC schema)."""
        types, names = self._schema_file().read()
        return {"keys": {k: types[k] for k in names["keys"]},
                "values": {k: types[k] for k in names["values"]},
                "added": names.get("added", [])}

    def _evolve(self, recorded: dict[str, Any]) -> None:
        """Accept added state columns (null in old state); refuse any other change."""
        before = recorded["values"]
        now = dict(self.spec.state_schema)
        removed = [c for c in before if c not in now]
        retyped = [f"{c}: {before[c]} -> {now[c]}" for c in before if c in now
                   and before[c] != now[c]]
        if removed or retyped:
            raise IncompatibleCheckpointError(
                f"the state schema of transform_with_state in {self.state_dir} changed: "
                + "; ".join([*(f"column {c!r} removed" for c in removed),
                             *(f"column {r} retyped" for r in retyped)])
                + ". Only adding state columns is accepted (they start as null); keep the "
                "old columns, or start the changed job on a new checkpoint directory."
            )
        self.added = tuple(dict.fromkeys([*recorded.get("added", []),
                                          *(c for c in now if c not in before)]))
        if any(c not in before for c in now):
            self._record(recorded["keys"], now, self.added)

    def _record(self, keys: dict[str, pl.DataType], values: dict[str, pl.DataType],
                added: tuple[str, ...], pending: pl.Schema | None = None) -> None:
        """Write the columns' exact types, then (the commit point) their names."""
        assert self.state_dir is not None
        make_dirs(self.state_dir)
        if pending is not None:
            write_types(self.state_dir / PENDING_ARROW, pending)
        self._schema_file().write({**keys, **values}, {
            "keys": list(keys), "values": list(values), "added": list(added)})

    def _define(self, keys: pl.Schema, pending: pl.Schema | None) -> None:
        assert self.state_dir is not None
        self.key_schema = keys
        key_types = dict(keys)
        values: dict[str, pl.DataType] = {**self.spec.state_schema, EXPIRE: pl.Int64()}
        if self.spec.ttl_time == "event":
            values[LAST_EVENT] = pl.Int64()
        self.state.define("state", self.state_dir / "state", key_schema=key_types,
                          value_schema=values, time_column=EXPIRE, added_values=self.added)
        self.state_rows = pl.Schema({**key_types, **values})
        for kind in TIMER_KINDS:
            self.state.define(f"{kind}_timers", self.state_dir / f"{kind}_timers",
                              key_schema={**key_types, TIMER: pl.Int64()},
                              value_schema={FIRE: pl.Int64()}, time_column=FIRE)
        if pending is not None:
            self.pending_schema = pending
            self.state.define("pending", self.state_dir / "pending",
                              key_schema={SEQ: pl.Int64()},
                              value_schema={**dict(pending), TIME: pl.Int64()},
                              time_column=TIME)

    def _load(self, df: pl.DataFrame, batch_id: int) -> bool:
        if not self.state:
            if df.width == 0:
                return False
            missing = [k for k in self.keys if k not in df.columns]
            if missing:
                raise PlanError(
                    f"transform_with_state keys {missing} are not columns of the stream; it "
                    f"has {df.columns}"
                )
            keys = pl.Schema({k: df.schema[k] for k in self.keys})
            pending = df.schema if self.spec.event_time_order else None
            self._define(keys, pending)
            self.state.begin_at(batch_id)  # defined in a later batch than 0
            self._record(dict(keys), dict(self.spec.state_schema), (), pending)
        elif df.width and self.pending_schema is not None and df.schema != self.pending_schema:
            raise PlanError(
                f"transform_with_state(event_time_order=True) keeps the rows waiting for the "
                f"watermark in state with the columns {dict(self.pending_schema)}; batch "
                f"{batch_id} has {dict(df.schema)}. Declare the input's schema so that it does "
                "not drift, or start the changed job on a new checkpoint directory."
            )
        self.state.load_all(batch_id)
        return True

    def commit(self) -> None:
        self.state.commit()

    def abort(self) -> None:
        self.state.abort()

    def has_expirable_state(self, watermark_ms: int | None) -> bool:
        if watermark_ms is None or not self.state.loaded:
            return bool(self.state) and watermark_ms is not None
        due = [self.state["event_timers"].next_time()]
        if self.spec.ttl_time == "event" and self.spec.ttl_ms is not None:
            due.append(self.state["state"].next_time())
        if self.spec.event_time_order:
            due.append(self.state["pending"].next_time())
        return any(t is not None and t <= watermark_ms for t in due)

    def due(self, now_ms: int, watermark_ms: int | None) -> bool:
        if not self.state.loaded:
            return False
        due = [self.state["processing_timers"].next_time()]
        if self.spec.ttl_time == "processing" and self.spec.ttl_ms is not None:
            due.append(self.state["state"].next_time())
        if any(t is not None and t <= now_ms for t in due):
            return True
        # NOTE: an event-time timer registered at or before the watermark in force
        # fires in the next batch, which must run even if the watermark stays put
        timer = self.state["event_timers"].next_time()
        return timer is not None and watermark_ms is not None and timer <= watermark_ms

    def eviction(self, *, has_watermark: bool) -> str:
        return "ttl" if self.spec.ttl_ms is not None else "none"

    def metrics(self) -> dict[str, Any]:
        return {**self.state.totals(), "rows": self.state.rows("state"),
                "timers": self.state.rows("event_timers") + self.state.rows("processing_timers"),
                "waiting_rows": self.state.rows("pending")}

    # ----------------------------------------------------------------- batch

    def process(self, df: pl.DataFrame, ctx: OperatorContext) -> pl.DataFrame:
        if not self._load(df, ctx.batch_id):
            return self._empty_output()
        wm, now = ctx.watermark_ms, ctx.timestamp_ms
        rows, late = self._rows(df, wm, ctx)
        store = self.state["state"]
        timers = self._fire(wm, now)
        expired = self._expire(store, wm, now)
        keys = self._relevant_keys(rows, timers)
        current, previous = self._current(store, keys, expired, timers, rows)
        out = StateOutput() if not keys.height else self._call(
            StateInput(rows=rows, state=current, timers=timers, batch_id=ctx.batch_id,
                       watermark_ms=wm, timestamp_ms=now), ctx.batch_id)
        written = self._apply(store, out, rows, previous, now=now, batch_id=ctx.batch_id)
        gone = self._expire(store, wm, now)  # written again, but its TTL already passed
        revived = 0 if written is None or not expired.height else expired.join(
            written, on=self.keys, how="semi", nulls_equal=True).height
        ctx.metrics[self.operator_id] = {
            **self.metrics(), "late_rows": late,
            "expired_rows": expired.height - revived + gone.height,
            "timers_fired": timers.height, "keys_called": keys.height,
        }
        return self._output(out.rows, ctx.batch_id)

    def _rows(self, df: pl.DataFrame, wm: int | None,
              ctx: OperatorContext) -> tuple[pl.DataFrame, int]:
        """The rows for ``fn`` (late rows split off), and how many were late."""
        if not df.width or self.spec.time_column is None or wm is None:
            rows, late = df, 0
            if df.width and self.spec.time_column is not None:  # no watermark yet
                rows = df.with_columns(event_time_ms(self.spec.time_column, df.schema)
                                       .alias(TIME))
        else:
            kept, late_rows = split_late_by_time(df, self.spec.time_column, wm)
            rows, late = kept, late_rows.height
            if late:
                ctx.late_rows.append(late_rows)
        if not self.spec.event_time_order:
            return (rows.drop(TIME) if TIME in rows.columns else rows), late
        pending = self.state["pending"]
        if rows.height:
            seq = (pl.int_range(pl.len(), dtype=pl.Int64) + (ctx.batch_id << _SEQ_BITS))
            pending.upsert(rows.select(seq.alias(SEQ), pl.exclude(TIME), TIME))
        if wm is None:
            return self._empty_pending(), late
        # NOTE: ordered by (event time, arrival): the order fn sees does not depend
        # on how the input was split into batches
        released = pending.pop_expired(wm)
        return released.select(list(self.pending_schema or {})), late

    def _fire(self, wm: int | None, now: int) -> pl.DataFrame:
        fired = []
        for kind, t in (("event", wm), ("processing", now)):
            if t is not None:
                due = self.state[f"{kind}_timers"].pop_expired(t)
                fired.append(due.select(*self.keys, TIMER, pl.lit(kind).alias(KIND)))
        timers = pl.concat(fired) if fired else self._empty_timers()
        return timers.sort(TIMER, maintain_order=True) if timers.height > 1 else timers

    def _expire(self, store: StateStore, wm: int | None, now: int) -> pl.DataFrame:
        """Remove and return the state rows whose TTL passed."""
        t = now if self.spec.ttl_time == "processing" else wm
        if self.spec.ttl_ms is None or t is None:
            return self.state_rows.to_frame()
        return store.pop_expired(t)

    def _relevant_keys(self, rows: pl.DataFrame, timers: pl.DataFrame) -> pl.DataFrame:
        parts = [f.select(self.keys) for f in (rows, timers) if f.height]
        if not parts:
            return self._empty_keys()
        return pl.concat(parts).unique(maintain_order=True)

    def _current(self, store: StateStore, keys: pl.DataFrame, expired: pl.DataFrame,
                 timers: pl.DataFrame, rows: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
        """The state ``fn`` sees (key and state columns), and the same rows with the
        engine's columns (what ``_with_ttl`` needs).

        Expiry keeps time order: an expired row comes back for a key with
        something due at or before its expiry, a timer of the TTL's kind or, with
        event-time TTL and ``event_time_order``, a released row: in time order, that
        happened while the state lived.
        """
        found = store.lookup(keys).filter("__found").drop("__found") if keys.height else None
        parts = [] if found is None else [found]
        if expired.height:
            active = [timers.filter(pl.col(KIND) == self.spec.ttl_time).select(
                *self.keys, pl.col(TIMER).alias("__at"))]
            if self.spec.ttl_time == "event" and self.spec.event_time_order and rows.height:
                assert self.spec.time_column is not None
                active.append(rows.select(*self.keys, event_time_ms(
                    self.spec.time_column, rows.schema).alias("__at")))
            first = pl.concat(active).group_by(self.keys).agg(pl.col("__at").min())
            parts.append(expired.join(first, on=self.keys, nulls_equal=True)
                         .filter(pl.col("__at") <= pl.col(EXPIRE)).drop("__at"))
        previous = pl.concat(parts) if parts else self.state_rows.to_frame()
        return previous.select(*self.keys, *self.spec.state_schema), previous

    def _call(self, inp: StateInput, batch_id: int) -> StateOutput:
        fn = self.spec.fn
        name = getattr(fn, "__qualname__", type(fn).__name__)
        try:
            out = fn(inp)
        except Exception as exc:
            raise TransformError(
                f"transform_with_state function {name} failed in batch {batch_id}: "
                f"{type(exc).__name__}: {exc}. The batch was not committed; fix the function "
                "and restart (the batch is re-run with the same input)."
            ) from exc
        if not isinstance(out, StateOutput):
            raise TransformError(
                f"transform_with_state function {name} returned {type(out).__name__}; it must "
                "return a StateOutput(rows=..., upserts=..., deletes=..., timers=...)"
            )
        return out

    def _apply(self, store: StateStore, out: StateOutput, rows: pl.DataFrame,
               previous: pl.DataFrame, *, now: int, batch_id: int) -> pl.DataFrame | None:
        """Apply ``fn``'s answer; return the keys it wrote (None: none)."""
        written = None
        if out.deletes is not None and out.deletes.height:
            store.delete(self._conform(out.deletes, self.keys, "deletes", batch_id))
        if out.upserts is not None and out.upserts.height:
            columns = [*self.keys, *self.spec.state_schema]
            upserts = self._conform(out.upserts, columns, "upserts", batch_id)
            twice = upserts.filter(pl.struct(self.keys).is_duplicated())
            if twice.height:
                raise TransformError(
                    f"transform_with_state: batch {batch_id}: StateOutput.upserts holds "
                    f"{twice.height} rows for keys that appear more than once (e.g. "
                    f"{twice.select(self.keys).row(0, named=True)}); give one row per key"
                )
            store.upsert(self._with_ttl(upserts, rows, previous, now))
            written = upserts.select(self.keys)
        if out.timers is not None and out.timers.height:
            self._register(out.timers, batch_id)
        return written

    def _with_ttl(self, upserts: pl.DataFrame, rows: pl.DataFrame,
                  previous: pl.DataFrame, now: int) -> pl.DataFrame:
        ttl = self.spec.ttl_ms
        if ttl is None:
            return upserts.with_columns(pl.lit(None, pl.Int64).alias(EXPIRE))
        if self.spec.ttl_time == "processing":
            return upserts.with_columns(pl.lit(now + ttl, pl.Int64).alias(EXPIRE))
        # event time: ttl after the key's newest event time so far
        assert self.spec.time_column is not None
        newest = rows.group_by(self.keys).agg(
            event_time_ms(self.spec.time_column, rows.schema).max().alias("__new"))
        old = previous.select(*self.keys, pl.col(LAST_EVENT).alias("__old"))
        marked = (upserts.join(newest, on=self.keys, how="left", nulls_equal=True)
                  .join(old, on=self.keys, how="left", nulls_equal=True))
        last = pl.max_horizontal("__new", "__old")
        return marked.with_columns(last.alias(LAST_EVENT), (last + ttl).alias(EXPIRE)).drop(
            "__new", "__old")

    def _register(self, timers: pl.DataFrame, batch_id: int) -> None:
        if KIND not in timers.columns:
            timers = timers.with_columns(pl.lit("event").alias(KIND))
        timers = self._conform(timers, [*self.keys, TIMER, KIND], "timers", batch_id)
        bad = timers.filter(~pl.col(KIND).is_in(TIMER_KINDS))
        if bad.height:
            raise TransformError(
                f"transform_with_state: batch {batch_id}: timer_kind must be 'event' or "
                f"'processing', got {bad[KIND].unique().to_list()}"
            )
        for kind in TIMER_KINDS:
            part = timers.filter(pl.col(KIND) == kind)
            if part.height:
                self.state[f"{kind}_timers"].upsert(
                    part.select(*self.keys, TIMER, pl.col(TIMER).alias(FIRE))
                    .unique([*self.keys, TIMER], maintain_order=True))

    def _conform(self, df: pl.DataFrame, columns: list[str], what: str,
                 batch_id: int) -> pl.DataFrame:
        missing = [c for c in columns if c not in df.columns]
        if missing:
            raise TransformError(
                f"transform_with_state: batch {batch_id}: StateOutput.{what} lacks column(s) "
                f"{missing}; it needs {columns}, it has {df.columns}"
            )
        types = {**(self.key_schema or {}), **self.spec.state_schema,
                 TIMER: pl.Int64(), KIND: pl.String()}
        try:
            return df.select([pl.col(c).cast(types[c], strict=True) for c in columns])
        except pl.exceptions.PolarsError as exc:
            raise TransformError(
                f"transform_with_state: batch {batch_id}: StateOutput.{what} does not fit the "
                f"declared types {[f'{c}: {types[c]}' for c in columns]}: "
                f"{str(exc).splitlines()[0]}"
            ) from None

    def _output(self, rows: pl.DataFrame | None, batch_id: int) -> pl.DataFrame:
        schema = self.spec.output_schema
        if rows is None:
            return self._empty_output()
        if schema is None:
            return rows
        missing = [c for c in schema if c not in rows.columns]
        if missing:
            raise TransformError(
                f"transform_with_state: batch {batch_id}: StateOutput.rows lacks column(s) "
                f"{missing} of output_schema {dict(schema)}"
            )
        try:
            return rows.select([pl.col(c).cast(t, strict=True) for c, t in schema.items()])
        except pl.exceptions.PolarsError as exc:
            raise TransformError(
                f"transform_with_state: batch {batch_id}: StateOutput.rows does not fit "
                f"output_schema {dict(schema)}: {str(exc).splitlines()[0]}"
            ) from None

    def _empty_output(self) -> pl.DataFrame:
        schema = self.spec.output_schema
        return schema.to_frame() if schema is not None else pl.DataFrame()

    def _empty_keys(self) -> pl.DataFrame:
        return pl.Schema(self.key_schema or {}).to_frame()

    def _empty_state(self) -> pl.DataFrame:
        return pl.Schema({**(self.key_schema or {}), **self.spec.state_schema}).to_frame()

    def _empty_pending(self) -> pl.DataFrame:
        return pl.Schema(self.pending_schema or {}).to_frame()

    def _empty_timers(self) -> pl.DataFrame:
        return pl.Schema({**(self.key_schema or {}), TIMER: pl.Int64(),
                          KIND: pl.String()}).to_frame()



@builds(TransformNode)
def build_transform(node: TransformNode, operator_id: str, mode: OutputMode) -> StatefulOperator:
    """``transform_with_state``: its output is what ``fn`` returns, whatever the mode."""
    return TransformWithState(operator_id=operator_id, spec=node.spec)
