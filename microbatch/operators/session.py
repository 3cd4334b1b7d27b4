"""Session-window aggregation: ``group_by(mb.session_window(col, gap), *keys)``.

A row at time t opens ``[t, t + gap)``; sessions of a key merge when they
overlap or touch (next start <= current end). The output's
``window_start`` is the first event, ``window_end`` the last event + gap.

State: two stores with scalar columns only. ``sessions`` holds one row per
open session, keyed by (keys, slot), with the session end as the time
column, so finding the sessions the watermark closed costs only the rows
returned. ``index`` holds per key the slot high-water mark and the latest
session end (its time column), so a batch looks up exactly the sessions of
its keys and a key whose sessions all closed is dropped.

Lateness (departure from a literal reading of docs/design.md, see
docs/semantics.md): a row is late when its event time is at or before the
watermark in force. Emitted sessions end at or before that watermark, so a
row that is not late can never touch (or bridge into) a session that was
already emitted; this is what makes the append output equal a one-shot
sessionization of the rows that were not late, for every batch split.

Per batch, vectorized: late rows split off; rows pre-aggregated per
(keys, t); the keys' stored sessions looked up and exploded; everything
sorted by (keys, start); a running max of ends per key marks where a new
session begins; one ``group_by`` merges; sessions re-imploded per key and
upserted; then sessions whose end <= watermark are emitted and dropped.

Output modes: ``append`` emits each session once, when the watermark closes
it; ``complete`` every session held; ``update`` and ``changelog`` the batch's
changes to the result table keyed by (``window_start``, ``window_end``, keys),
with ``_change_type``: a session whose end moved or that merged into another
is a ``delete`` of the row emitted before, the new session an ``insert``, a
session whose bounds stayed but whose aggregates changed an
``update_preimage``/``update_postimage`` pair (:mod:`microbatch.operators.changes`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl

from microbatch.frames import collect
from microbatch.operators.base import (
    OperatorContext,
    StatefulOperator,
    check_input_types,
    check_signature,
    split_late_by_time,
)
from microbatch.operators.changes import diff_rows, empty_changes
from microbatch.operators.state import StoreSet
from microbatch.operators.state_schema import read_keyed_schema, write_keyed_schema
from microbatch.plan.aggregates import TIME, AggSpec
from microbatch.plan.event_time import ms_to_time
from microbatch.plan.windows import SessionWindowSpec
from microbatch.types import OutputMode

if TYPE_CHECKING:
    from statestore import StateStore

S, E, SLOT, N, MAX_END = "__s", "__e", "__slot", "__n", "__max_end"


class SessionAggregate(StatefulOperator):
    """Session windows per key, merged across batches, emitted when closed."""


    def __init__(
        self,
        *,
        operator_id: str,
        window: SessionWindowSpec,
        keys: list[str],
        aggs: list[AggSpec],
        output_mode: OutputMode,
    ) -> None:
        self.operator_id = operator_id
        self.window = window
        self.keys = keys
        self.aggs = aggs
        self.output_mode = output_mode
        self.state_dir: Path | None = None
        self.state = StoreSet()
        self.out_time_dtype: pl.DataType | None = None
        self.row_schema = pl.Schema()
        self.pcols = [n for a in aggs for n in a.partial_names()]

    def signature(self) -> dict[str, Any]:
        return {
            "kind": "session_aggregate",
            "window": self.window.describe(),
            "keys": self.keys,
            "state": [a.state_name for a in self.aggs],
        }

    def open(self, state_dir: Path | None, batch_id: int) -> None:
        self.state_dir = state_dir
        self.state.backend = self.state_backend
        if state_dir is not None:
            check_signature(state_dir, self.signature())
            recorded = read_keyed_schema(state_dir)
            if recorded is not None:
                self._make_providers(recorded)

    def _make_providers(self, schema: dict[str, Any]) -> None:
        assert self.state_dir is not None
        self.out_time_dtype = schema["out_time"]
        keys = schema["keys"]
        self.row_schema = pl.Schema({**keys, SLOT: pl.Int64(), **schema["values"]})
        self.state.define(
            "sessions",
            self.state_dir / "sessions",
            key_schema={**keys, SLOT: pl.Int64()},
            value_schema=schema["values"],
            time_column=E,
        )
        self.state.define(
            "index",
            self.state_dir / "index",
            key_schema=keys,
            value_schema={N: pl.Int64(), MAX_END: pl.Int64()},
            time_column=MAX_END,
        )

    @property
    def sessions(self) -> StateStore:
        """Sessions keyed by (keys, slot), the session end as time column."""
        return self.state["sessions"]

    @property
    def index(self) -> StateStore:
        """Per key: the slot high-water mark and the latest session end."""
        return self.state["index"]

    def _load(self, df: pl.DataFrame, batch_id: int) -> bool:
        if not self.state:
            if df.width == 0:
                return False
            values: dict[str, pl.DataType] = {S: pl.Int64(), E: pl.Int64()}
            for agg in self.aggs:
                values.update(agg.partial_dtypes(df.schema))
            schema = {
                "keys": {k: df.schema[k] for k in self.keys},
                "values": values,
                "out_time": df.schema[self.window.column],
            }
            assert self.state_dir is not None
            self._make_providers(schema)
            self.state.begin_at(batch_id)  # defined in a later batch than 0
            write_keyed_schema(self.state_dir, schema)
        elif df.width:
            check_input_types(
                self.state_dir,
                batch_id,
                recorded=dict(self.row_schema),
                schema=df.schema,
                keys=self.keys,
                aggs=self.aggs,
            )
        self.state.load_all(batch_id)
        return True

    def commit(self) -> None:
        self.state.commit()

    def abort(self) -> None:
        self.state.abort()

    def eviction(self, *, has_watermark: bool) -> str:
        """``complete`` mode keeps every session forever."""
        return "watermark" if has_watermark and self.output_mode != "complete" else "none"

    def has_expirable_state(self, watermark_ms: int | None) -> bool:
        return self.output_mode != "complete"

    def metrics(self) -> dict[str, Any]:
        if self.state.get("sessions") is None:
            return {}
        return {
            **self.sessions.metrics,
            **self.state.totals(),
            "rows": self.state.rows("sessions"),
            "keys": self.state.rows("index"),
        }

    # ------------------------------------------------------------ batch

    def process(self, df: pl.DataFrame, ctx: OperatorContext) -> pl.DataFrame:
        if not self._load(df, ctx.batch_id):
            return pl.DataFrame()
        wm = ctx.watermark_ms
        events = self._events(df, wm, ctx) if df.width else None
        changed, before = (
            self._merge(events) if events is not None and events.height else (None, None)
        )
        emitted = self._emit(changed, before, wm)
        ctx.metrics[self.operator_id] = {
            **self.metrics(),
            "updated_sessions": 0 if changed is None else changed.height,
        }
        return emitted

    def _events(self, df: pl.DataFrame, wm: int | None, ctx: OperatorContext) -> pl.DataFrame:
        """Rows that are not late, pre-aggregated per (keys, event time)."""
        gap = self.window.gap_ms
        kept, late = split_late_by_time(df, self.window.column, wm)
        if late.height:
            ctx.late_rows.append(late)
        return (
            kept.lazy()
            .with_columns(pl.col(TIME).alias(S))
            .group_by([*self.keys, S], maintain_order=True)
            .agg([e for a in self.aggs for e in a.partials(df.schema)])
            .with_columns((pl.col(S) + gap).alias(E))
            .pipe(collect)
        )

    def _merge(self, events: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
        """Merge batch events with their keys' stored sessions; stage the result;
        return the keys' sessions as one row per (key, session), and their
        stored sessions before this batch."""
        keys = events.select(self.keys).unique(maintain_order=True)
        high = self.index.lookup(keys).select(
            *self.keys, pl.when("__found").then(pl.col(N)).otherwise(0).alias(N)
        )
        wanted = (
            high.filter(pl.col(N) > 0)
            .select(*self.keys, pl.int_ranges(0, pl.col(N), dtype=pl.Int64).alias(SLOT))
            .explode(SLOT)
        )
        stored = (
            self.sessions.lookup(wanted).filter("__found").select(*self.keys, S, E, *self.pcols)
            if wanted.height
            else events.select(*self.keys, S, E, *self.pcols).head(0)
        )
        allrows = pl.concat(
            [stored, events.select(*self.keys, S, E, *self.pcols)], how="vertical_relaxed"
        )
        merges = [e for a in self.aggs for e in a.merges()]
        sessions = (
            allrows.lazy()
            .sort([*self.keys, S], maintain_order=True)
            .with_columns(pl.col(E).cum_max().over(self.keys).alias("__run_end"))
            .with_columns(
                (pl.col(S) > pl.col("__run_end").shift(1).over(self.keys))
                .fill_null(True)
                .cum_sum()
                .alias("__sid")
            )
            .group_by([*self.keys, "__sid"], maintain_order=True)
            .agg(pl.col(S).min(), pl.col(E).max(), *merges)
            .drop("__sid")
            .with_columns(pl.int_range(pl.len(), dtype=pl.Int64).over(self.keys).alias(SLOT))
            .pipe(collect)
        )
        counts = sessions.group_by(self.keys, maintain_order=True).agg(
            pl.len().cast(pl.Int64).alias("__m"), pl.col(E).max().alias(MAX_END)
        )
        stale = (
            counts.join(high, on=self.keys, how="left", nulls_equal=True)
            .filter(pl.col(N) > pl.col("__m"))
            .select(*self.keys, pl.int_ranges(pl.col("__m"), pl.col(N), dtype=pl.Int64).alias(SLOT))
            .explode(SLOT)
        )
        if stale.height:
            self.sessions.delete(stale)
        self.sessions.upsert(sessions.select(*self.keys, SLOT, S, E, *self.pcols))
        self.index.upsert(counts.select(*self.keys, pl.col("__m").alias(N), MAX_END))
        return sessions, stored

    def _emit(
        self, changed: pl.DataFrame | None, before: pl.DataFrame | None, wm: int | None
    ) -> pl.DataFrame:
        closed = None
        if wm is not None and self.output_mode != "complete":
            closed = self.sessions.pop_expired(wm)
            self.index.pop_expired(wm)
        if self.output_mode == "append":
            return self._finalize(closed if closed is not None else self._empty())
        if self.output_mode in ("update", "changelog"):
            return self._changes(changed, before)
        return self._finalize(self.sessions.to_frame())

    def _changes(self, changed: pl.DataFrame | None, before: pl.DataFrame | None) -> pl.DataFrame:
        """The batch's changes to the result table, keyed by (window_start,
        window_end, keys).

        NOTE: in these modes every session of a key is emitted in each batch
        that touches the key, so the key's stored sessions before the batch are
        exactly the rows last emitted for it (the versioned state is the record
        of what was emitted, across restarts); sessions the watermark closed
        left the state as final rows, and no row that is not late can touch
        them. A session whose end moved, or that merged into another, is a
        ``delete`` of its old row and an ``insert`` of the new one (the end is
        part of the key).
        """
        if changed is None or before is None:
            return empty_changes(self._finalize(self._empty()))
        key = ["window_start", "window_end", *self.keys]
        return diff_rows(
            self._finalize(before), self._finalize(changed), keys=key, order_by=key
        )

    def _empty(self) -> pl.DataFrame:
        return self.row_schema.to_frame()

    def _finalize(self, rows: pl.DataFrame) -> pl.DataFrame:
        dtype = self.out_time_dtype or pl.Datetime("ms")
        result = rows.select(
            ms_to_time(pl.col(S), dtype).alias("window_start"),
            ms_to_time(pl.col(E), dtype).alias("window_end"),
            *[pl.col(k) for k in self.keys],
            *[a.finalize() for a in self.aggs],
        )
        if result.height > 1:
            return result.sort(["window_start", *self.keys], maintain_order=True)
        return result
