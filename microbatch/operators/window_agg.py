"""Grouped aggregation, over tumbling/hopping event-time windows or plain keys.

Per batch, vectorized:

1. event time -> epoch ms; windows assigned (one row per window of a row);
2. rows whose windows are all closed by the watermark in force are late:
   counted and sent to the late output, never silently dropped;
3. one ``group_by`` computes the batch's partial aggregates per (window, keys);
4. the state's partials for exactly those (window, keys) are looked up and
   merged pairwise, then upserted;
5. emit by output mode: ``append`` pops the windows that the watermark
   closed (``window_end <= watermark``); ``update`` emits the rows merged in
   this batch and evicts closed windows; ``changelog`` emits the same rows as
   changes (``insert`` the first time, then ``update_preimage`` with the
   values emitted before + ``update_postimage``); ``complete`` emits the
   whole state.

Allowed lateness ``L`` (``mb.window(..., allowed_lateness=L)``): a window's
state is kept until ``window_end + L <= watermark``; only rows whose oldest
window is past that are late. In append mode a window is first emitted
(``revision`` 0) when the watermark passes its end, and each later batch that
changes it emits the corrected row again with the next ``revision``.

Each window row carries ``__expire_at`` (the store's time column: its end
until first emitted, then end + L) and ``__rev`` (-1 until emitted), so both
the first emission and the final eviction cost only the rows they touch.

Append mode without allowed lateness keeps no keyed state at all: each
batch's partials are appended to an :class:`~statestore.AppendBuffer` (no
lookup, no upsert), and when the watermark closes windows their partial rows
are popped and combined in one ``group_by`` (steps 4-5 become "append; pop
and combine"). Every ``COMPACT_EVERY`` batches a buffer above
``COMPACT_MIN_ROWS`` rows is combined in place, so long windows do not hold
one partial row per batch. Checkpoints written before the buffer existed
keep their keyed store (the layout is recorded with the state's schema).

A plain ``group_by(keys, ttl=T)`` (no window) bounds its state by processing
time instead: each key's row carries ``__expire_at`` = the recorded timestamp of
the batch that last updated it + ``T``; each batch first removes the keys whose
time passed (counted as ``expired_rows``), so a key seen again later starts
afresh.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import polars as pl

from microbatch.durations import format_duration_ms
from microbatch.exceptions import ChangelogInputError, PlanError
from microbatch.frames import collect
from microbatch.operators.base import (
    LATE_REASON,
    OperatorContext,
    SingleStoreOperator,
    check_input_types,
    check_signature,
    iso_ms,
    late_reason,
)
from microbatch.operators.changes import CHANGE_TYPE, diff_rows, empty_changes
from microbatch.operators.exact_partials import (
    CombinePlan,
    combine_plan,
    exact_window_merge,
    exact_window_partials,
    merge_slice_partials,
    slice_partials,
)
from microbatch.operators.packed_group_by import fits_int64, group_by_window_and_key
from microbatch.operators.state_schema import read_keyed_schema, write_keyed_schema
from microbatch.plan.aggregates import TIME, AggSpec
from microbatch.plan.event_time import event_time_ms, ms_to_time
from microbatch.plan.windows import WindowSpec, assign_windows
from microbatch.types import OutputMode

if TYPE_CHECKING:
    from statestore import AppendBuffer, StateStore, StateStoreProvider

COMPACT_EVERY = 16
"""Batches between checks whether the append buffer should be combined in place."""
COMPACT_MIN_ROWS = 200_000
"""An append buffer at least this large is combined in place at the check."""
EXACT_MIN_ROWS = 150_000
"""Rows from which a ``group_by`` runs on the exact streaming path
(:mod:`~microbatch.operators.exact_partials`): below, its fixed cost exceeds its
gain (measured on 2 cores: 11.5 against 9.0 ms at 100k rows, 25 against 28 ms at
200k). Either path gives a function of the rows alone."""
WS = "__ws"
EXPIRE = "__expire_at"
REV = "__rev"


class WindowAggregate(SingleStoreOperator):
    """``group_by([window], *keys).agg(...)`` with state in a versioned store."""


    def __init__(
        self,
        *,
        operator_id: str,
        window: WindowSpec | None,
        keys: list[str],
        aggs: list[AggSpec],
        output_mode: OutputMode,
        ttl_ms: int | None = None,
    ) -> None:
        if ttl_ms is not None and window is not None:
            raise PlanError("ttl bounds the state of a group_by without a window")
        self.operator_id = operator_id
        self.ttl_ms = ttl_ms
        self.window = window
        self.keys = keys
        self.aggs = aggs
        self.output_mode = output_mode
        self.state_dir: Path | None = None
        self.provider: StateStoreProvider | None = None
        self.store: StateStore | None = None
        self.buffer: AppendBuffer | None = None
        self.layout: Literal["keyed", "append"] = "keyed"
        self.out_time_dtype: pl.DataType | None = None
        self.key_schema: dict[str, pl.DataType] | None = None
        self.row_schema = pl.Schema()
        self._before: pl.DataFrame | None = None
        # a scaled-out shard's batch partials, merged from its slices' (see take_partials)
        self._pending: tuple[pl.DataFrame, pl.DataFrame | None] | None = None

    def signature(self) -> dict[str, Any]:
        return {
            "kind": "window_aggregate",
            "window": self.window.describe() if self.window else None,
            "keys": self.keys,
            "state": [a.state_name for a in self.aggs],
            # NOTE: only when set, so checkpoints written before ttl existed still match
            **({"ttl_ms": self.ttl_ms} if self.ttl_ms is not None else {}),
        }

    # ----------------------------------------------------------- state

    def open(self, state_dir: Path | None, batch_id: int) -> None:
        self.state_dir = state_dir
        if state_dir is not None:
            check_signature(state_dir, self.signature())
            recorded = read_keyed_schema(state_dir)
            if recorded is not None:
                self._make_provider(recorded)
                if self.ttl_ms is not None:
                    # NOTE: loaded now, not at the first batch: an idle query must know
                    # when the TTL of some key is due before any row arrives
                    assert self.provider is not None
                    self.store = self.provider.load(batch_id)

    def _state_schema(self, df: pl.DataFrame) -> dict[str, Any]:
        missing = [k for k in self.keys if k not in df.columns]
        if missing:
            raise PlanError(
                f"group_by key(s) {missing} are not columns of the stream; it has {df.columns}"
            )
        if CHANGE_TYPE in df.columns and type(self) is WindowAggregate:
            raise ChangelogInputError(
                f"group_by over rows carrying {CHANGE_TYPE!r} (a changelog) whose schema was "
                "unknown when the query was built, so the aggregation would count deletes "
                "as rows: declare the source's schema (schema=..., or map_batches(..., "
                "schema=...)) so that the group_by retracts"
            )
        keys: dict[str, pl.DataType] = {}
        if self.window is not None:
            keys[WS] = pl.Int64()
        keys.update({k: df.schema[k] for k in self.keys})
        values: dict[str, pl.DataType] = {}
        for agg in self.aggs:
            if agg.column is not None and agg.column not in df.columns:
                raise PlanError(
                    f"aggregation {agg.kind}({agg.column!r}) names a column the stream "
                    f"does not have; it has {df.columns}"
                )
            values.update(agg.partial_dtypes(df.schema))
        if self.window is not None:
            values.update({EXPIRE: pl.Int64(), REV: pl.Int64()})
        elif self.ttl_ms is not None:
            values[EXPIRE] = pl.Int64()
        out_dtype = df.schema[self.window.column] if self.window else None
        layout = "append" if self._can_buffer() else "keyed"
        return {"keys": keys, "values": values, "out_time": out_dtype, "layout": layout}

    def _can_buffer(self) -> bool:
        """Partials need no keyed state: each window is emitted once, when it closes."""
        return (
            self.window is not None
            and self.output_mode == "append"
            and not self.window.allowed_lateness_ms
            and self.ttl_ms is None
        )

    def _make_provider(self, schema: dict[str, Any]) -> None:
        self.key_schema = schema["keys"]
        self.out_time_dtype = schema["out_time"]
        self.row_schema = pl.Schema({**schema["keys"], **schema["values"]})
        self.layout = schema["layout"]
        if self.state_dir is None:
            raise AssertionError("stateful operators need a checkpoint directory")
        from statestore.backends import make_provider

        self.provider = make_provider(
            self.state_dir,
            backend=self.state_backend,
            key_schema=schema["keys"],
            value_schema=schema["values"],
            time_column=EXPIRE if self.window is not None or self.ttl_ms is not None else None,
            layout=self.layout,
        )

    def _define(self, df: pl.DataFrame, batch_id: int) -> bool:
        """Make the provider at the first batch with columns; check types later."""
        if self.provider is None:
            if df.width == 0:
                return False
            schema = self._state_schema(df)
            assert self.state_dir is not None
            self._make_provider(schema)
            assert self.provider is not None
            self.provider.begin_at(batch_id)  # defined in a later batch than 0
            write_keyed_schema(self.state_dir, schema)
        elif df.width:
            self._check_types(df, batch_id)
        return True

    def _load(self, df: pl.DataFrame, batch_id: int) -> StateStore | None:
        if not self._define(df, batch_id):
            return None
        assert self.provider is not None
        self.store = self.provider.load(batch_id)
        return self.store

    def _check_types(self, df: pl.DataFrame, batch_id: int) -> None:
        """The batch's keys and aggregated columns have the state's types."""
        check_input_types(
            self.state_dir,
            batch_id,
            recorded=dict(self.row_schema),
            schema=df.schema,
            keys=self.keys,
            aggs=self.aggs,
        )

    def eviction(self, *, has_watermark: bool) -> str:
        """A plain ``group_by`` and ``complete`` mode keep every key forever,
        unless ``ttl`` forgets idle keys."""
        if self.ttl_ms is not None:
            return "ttl"
        if not has_watermark or self.window is None or self.output_mode == "complete":
            return "none"
        return "watermark"

    def has_expirable_state(self, watermark_ms: int | None) -> bool:
        return self.window is not None and self.output_mode != "complete"

    def commit(self) -> None:
        if self.buffer is not None:
            self.buffer.commit()
        super().commit()

    def pending_rows(self) -> int:
        """Partial rows taken by :meth:`take_partials` for the next batch."""
        return 0 if self._pending is None else self._pending[0].height

    def abort(self) -> None:
        self._pending = None
        if self.buffer is not None:
            self.buffer.abort()
            self.buffer = None
        super().abort()

    def metrics(self) -> dict[str, Any]:
        return dict(self.buffer.metrics) if self.buffer is not None else super().metrics()

    def due(self, now_ms: int, watermark_ms: int | None) -> bool:
        if self.ttl_ms is None or self.store is None:
            return False
        t = self.store.next_time()
        return t is not None and t <= now_ms

    # ------------------------------------------------------------ batch

    # ------------------------------------------------------------ combine

    def combine_plan(self, schema: pl.Schema) -> CombinePlan | None:
        """How a slice of a batch's rows of ``schema`` is pre-aggregated before
        the shuffle of a scaled-out query (``None``: its rows must travel): float
        sums only where this operator sums them exactly (the append buffer)."""
        if type(self) is not WindowAggregate or not len(schema) or CHANGE_TYPE in schema:
            return None
        if any(k not in schema for k in self.keys) or (
            self.window is not None and self.window.column not in schema
        ):
            return None
        if any(a.column is not None and a.column not in schema for a in self.aggs):
            return None
        buffered = self.layout == "append" or (self.provider is None and self._can_buffer())
        return combine_plan(self.aggs, schema, self._state_keys(), floats=buffered)

    def combine_slice(
        self, df: pl.DataFrame, ctx: OperatorContext
    ) -> tuple[pl.DataFrame, pl.DataFrame | None, dict[str, Any]] | None:
        """The map side of a scaled-out batch: a slice's partials per (window,
        keys), its late rows (split against the batch's watermark, as
        :meth:`process` splits them) and its facts; ``None``: ship the rows."""
        plan = self.combine_plan(df.schema)
        if plan is None:
            return None
        late: pl.DataFrame | None = None
        live = df.lazy()
        if self.window is not None:
            live, late = self._split_late(df, ctx.watermark_ms)
        got = slice_partials(plan, df, live)
        if got is None:
            return None
        return got[0], late, got[1]

    def take_partials(
        self,
        schema: pl.Schema,
        parts: list[tuple[pl.DataFrame, dict[str, Any]]],
        late: list[pl.DataFrame | None],
    ) -> bool:
        """The reduce side: the slices' partials (in slice order) merged into the
        batch's, which the next :meth:`process` takes instead of computing them
        from rows (bit for bit the same); False (nothing taken) when they cannot
        be merged exactly here and the rows must travel."""
        plan = self.combine_plan(schema)
        if plan is None:
            return False
        merged = merge_slice_partials(plan, parts)
        if merged is None:
            return False
        frames = [f for f in late if f is not None]
        lates = pl.concat(frames, how="vertical") if frames else None
        self._pending = (merged, lates)
        return True

    def process(self, df: pl.DataFrame, ctx: OperatorContext) -> pl.DataFrame:
        pending, self._pending = self._pending, None
        if self.layout == "append" or (self.provider is None and self._can_buffer()):
            return self._process_buffered(df, ctx, pending)
        store = self._load(df, ctx.batch_id)
        if store is None:
            ctx.metrics[self.operator_id] = {}
            return pl.DataFrame()
        wm = ctx.watermark_ms
        late_count = 0
        merged = None
        # NOTE: before the merge, so that a key whose TTL passed starts afresh
        expired = store.pop_expired(ctx.timestamp_ms).height if self.ttl_ms is not None else 0
        if df.width and pending is not None:  # merged from the slices' partials
            partials, late_rows = pending
            late_count = 0 if late_rows is None else late_rows.height
            if late_rows is not None and late_count:
                ctx.late_rows.append(late_rows)
            merged = self._merge(store, partials, ctx.timestamp_ms)
            store.upsert(merged, keys_from_lookup=True)
        elif df.width:  # a no-data batch of a source without a declared schema has no columns
            lf = df.lazy()
            if self.window is not None:
                lf, late = self._split_late(df, wm)
                late_count = late.height
                if late_count:
                    ctx.late_rows.append(late)
            elif any(a.kind in {"first", "last"} for a in self.aggs):
                lf = lf.with_columns(arrival_order(ctx.batch_id).alias(TIME))
            partials = (
                lf.group_by(self._state_keys(), maintain_order=True)
                .agg([e for a in self.aggs for e in a.partials(df.schema)])
                .pipe(collect)
            )
            merged = self._merge(store, partials, ctx.timestamp_ms)
            store.upsert(merged, keys_from_lookup=True)
        emitted = self._emit(store, merged, wm)
        ctx.metrics[self.operator_id] = {
            **store.metrics,
            "late_rows": late_count,
            "updated_keys": 0 if merged is None else merged.height,
            **({"expired_rows": expired} if self.ttl_ms is not None else {}),
        }
        return emitted

    def _process_buffered(
        self,
        df: pl.DataFrame,
        ctx: OperatorContext,
        pending: tuple[pl.DataFrame, pl.DataFrame | None] | None = None,
    ) -> pl.DataFrame:
        """Append mode: append the batch's partials, pop and combine the closed windows."""
        if not self._define(df, ctx.batch_id):
            ctx.metrics[self.operator_id] = {}
            return pl.DataFrame()
        assert self.provider is not None
        assert self.window is not None
        buffer = self.buffer = self.provider.load_buffer(ctx.batch_id)
        wm = ctx.watermark_ms
        late_count = 0
        if df.width:
            if pending is not None:  # merged from the slices' partials
                batch_partials, late_rows = pending
                late = df.head(0) if late_rows is None else late_rows
            else:
                live, late = self._split_late(df, wm)
                batch_partials = self._partials(df, live)
            late_count = late.height
            if late_count:
                ctx.late_rows.append(late)
            # NOTE: no maintain_order: the order of groups changes no result (a key has
            # one partial row per batch, and the buffer keeps batches in arrival order)
            partials = batch_partials.with_columns(
                self.window.end_of(pl.col(WS)).alias(EXPIRE),
                pl.lit(-1, pl.Int64).alias(REV),
            )
            buffer.append(partials)
        closed = self._combine(buffer.pop_expired(wm)) if wm is not None else None
        if ctx.batch_id % COMPACT_EVERY == 0 and buffer.num_rows >= COMPACT_MIN_ROWS:
            buffer.replace(self._combine(buffer.to_frame()))
        ctx.metrics[self.operator_id] = {
            **buffer.metrics,
            "late_rows": late_count,
            "updated_keys": 0,
        }
        if closed is None:
            return self._finalize(self.row_schema.to_frame())
        return self._finalize(self._in_emit_order(closed))

    def _partials(self, df: pl.DataFrame, live: pl.LazyFrame) -> pl.DataFrame:
        """The batch's partial aggregates per (window, keys): exact when every
        aggregate has an exact form (on the streaming engine from ``EXACT_MIN_ROWS``
        rows, else the in-memory one: the same bits, so a shard of a scaled-out
        query, which sees fewer rows, agrees with one process), else folded in row
        order by the in-memory engine; either way a function of the batch's rows
        alone."""
        assert self.window is not None
        exact = exact_window_partials(
            df, live, window_column=WS, spec=self.window, keys=self.keys, aggs=self.aggs,
            streaming=df.height >= EXACT_MIN_ROWS,
        )
        if exact is not None:
            return exact
        return group_by_window_and_key(
            collect(live), WS, self.keys, self.window.slide_ms,
            [e for a in self.aggs for e in a.partials(df.schema)],
        )

    def _combine(self, partials: pl.DataFrame) -> pl.DataFrame:
        """One row per (window, keys): the partial rows combined exactly (any order;
        as for :meth:`_partials`), else in arrival order."""
        if partials.is_empty():
            return partials
        assert self.window is not None
        exact = exact_window_merge(
            partials, window_column=WS, spec=self.window, keys=self.keys, aggs=self.aggs,
            constant=[EXPIRE, REV],  # a function of the window; -1 until emitted
            streaming=partials.height >= EXACT_MIN_ROWS,
        )
        if exact is not None:
            return exact.select(list(self.row_schema))
        # NOTE: rechunked so that the sums run over one contiguous array however the
        # rows were held: a replay from a snapshot gives bit-identical floats
        merged = group_by_window_and_key(
            partials.rechunk(), WS, self.keys, self.window.slide_ms,
            [*[e for a in self.aggs for e in a.merges()], pl.col(EXPIRE).first(),
             pl.col(REV).first()],
        )
        return merged.select(list(self.row_schema))

    def _in_emit_order(self, rows: pl.DataFrame) -> pl.DataFrame:
        """``rows`` sorted by (window end, keys): by one packed Int64 when there is
        one integer key without nulls and the ranges fit (the same order: a sort on
        two columns row-encodes them, 2-3x slower), else by the columns."""
        keys = self._orderable_keys()
        if (
            len(keys) == 1 and rows.height > 1 and fits_int64(rows.schema[keys[0]])
            and not rows.get_column(keys[0]).null_count()
            and not rows.get_column(EXPIRE).null_count()
        ):
            key = pl.col(keys[0]).cast(pl.Int64)
            e0, e1, k0, k1 = rows.select(
                pl.col(EXPIRE).min().alias("e0"), pl.col(EXPIRE).max().alias("e1"),
                key.min().alias("k0"), key.max().alias("k1"),
            ).row(0)
            bits = (k1 - k0).bit_length()
            if (e1 - e0).bit_length() + bits <= 62:
                return rows.sort((pl.col(EXPIRE) - e0) * (1 << bits) + (key - k0))
        return rows.sort([EXPIRE, *keys])

    def _orderable_keys(self) -> list[str]:
        return [
            k for k in self.keys
            if not isinstance(self.row_schema[k], pl.List | pl.Struct | pl.Array | pl.Object)
        ]

    def _state_keys(self) -> list[str]:
        return ([WS] if self.window is not None else []) + self.keys

    def _split_late(self, df: pl.DataFrame, wm: int | None) -> tuple[pl.LazyFrame, pl.DataFrame]:
        assert self.window is not None
        return split_late_windows(df, self.window, wm)

    def _merge(self, store: StateStore, partials: pl.DataFrame, now_ms: int) -> pl.DataFrame:
        """Batch partials merged with the stored partials of the same keys."""
        keys = self._state_keys()
        found = store.lookup(partials.select(keys))
        pcols = [n for a in self.aggs for n in a.partial_names()]
        state = found.select(pl.col("__found"), *[pl.col(n).alias(f"{n}__s") for n in pcols])
        both = pl.concat([partials, state], how="horizontal")
        hit = pl.col("__found")
        exprs: list[pl.Expr] = []
        for agg in self.aggs:
            names = agg.partial_names()
            s = {n: pl.col(f"{n}__s") for n in names}
            b = {n: pl.col(n) for n in names}
            if agg.kind in {"len", "count", "sum", "mean"}:
                exprs += [pl.when(hit).then(s[n] + b[n]).otherwise(b[n]).alias(n) for n in names]
            elif agg.kind == "min":
                exprs.append(pl.min_horizontal(s[names[0]], b[names[0]]).alias(names[0]))
            elif agg.kind == "max":
                exprs.append(pl.max_horizontal(s[names[0]], b[names[0]]).alias(names[0]))
            else:
                t, v = names
                take_batch = ~hit | ((b[t] < s[t]) if agg.kind == "first" else (b[t] >= s[t]))
                exprs += [
                    pl.when(take_batch).then(b[t]).otherwise(s[t]).alias(t),
                    pl.when(take_batch).then(b[v]).otherwise(s[v]).alias(v),
                ]
        if self.window is not None:
            end = self.window.end_of(pl.col(WS))
            first_expiry = (
                end if self.output_mode == "append" else end + self.window.allowed_lateness_ms
            )
            state = state.with_columns(found[EXPIRE], found[REV])
            both = pl.concat([partials, state], how="horizontal")
            exprs += [
                pl.when(hit).then(pl.col(EXPIRE)).otherwise(first_expiry).alias(EXPIRE),
                pl.when(hit).then(pl.col(REV)).otherwise(-1).alias(REV),
            ]
        elif self.ttl_ms is not None:
            exprs.append(pl.lit(now_ms + self.ttl_ms, pl.Int64).alias(EXPIRE))
        if self.output_mode == "changelog":
            # the rows emitted last for these keys: their stored partials
            self._before = both.filter(hit).select(
                *keys, *[pl.col(f"{n}__s").alias(n) for n in pcols]
            )
        return both.select(*keys, *exprs)

    def _emit(self, store: StateStore, merged: pl.DataFrame | None, wm: int | None) -> pl.DataFrame:
        if self.output_mode == "complete":
            return self._finalize(store.to_frame())
        empty = self.row_schema.to_frame()
        due = store.pop_expired(wm) if self.window is not None and wm is not None else empty
        if self.output_mode == "update":
            return self._finalize(merged if merged is not None else empty)
        if self.output_mode == "changelog":
            return self._changes(merged, empty)
        if self.window is None or wm is None:
            return self._finalize(empty)
        # append: windows closing now (first emission) and closed windows changed again
        closing = due.filter(pl.col(REV) < 0).with_columns(pl.lit(0, pl.Int64).alias(REV))
        changed = empty
        if merged is not None and self.window.allowed_lateness_ms:
            end = self.window.end_of(pl.col(WS))
            changed = merged.filter((pl.col(REV) >= 0) & (end <= wm)).with_columns(pl.col(REV) + 1)
        if self.window.allowed_lateness_ms:
            kept_until = self.window.end_of(pl.col(WS)) + self.window.allowed_lateness_ms
            keep = pl.concat([closing, changed]).filter(kept_until > wm)
            if keep.height:
                store.upsert(keep.with_columns(kept_until.alias(EXPIRE)))
        return self._finalize(pl.concat([closing, changed]))

    def _changes(self, merged: pl.DataFrame | None, empty: pl.DataFrame) -> pl.DataFrame:
        """``changelog`` mode: the batch's changes to the result table.

        A (window, keys) seen for the first time is an ``insert``; one already
        emitted (state holds exactly what was emitted last: every change is
        emitted in the batch that makes it) whose aggregates changed is an
        ``update_preimage`` with the old values followed by an
        ``update_postimage``; an unchanged one (a ``max`` not exceeded) is
        nothing. Windows the watermark evicts stay in the result: no change.
        """
        new = self._finalize(merged if merged is not None else empty)
        if merged is None or self._before is None:
            return empty_changes(new)
        before = self._finalize(self._before)
        self._before = None
        key = [*(["window_start", "window_end"] if self.window else []), *self.keys]
        order = [*(["window_start", "window_end"] if self.window else []), *self._orderable_keys()]
        return diff_rows(before, new, keys=key, order_by=order)

    def _finalize(self, rows: pl.DataFrame) -> pl.DataFrame:
        """State rows -> ``window_start, window_end, keys..., aggregates...``."""
        out: list[pl.Expr] = []
        if self.window is not None:
            dtype = self.out_time_dtype or pl.Datetime("ms")
            out += [
                ms_to_time(self.window.start_of(pl.col(WS)), dtype).alias("window_start"),
                ms_to_time(self.window.end_of(pl.col(WS)), dtype).alias("window_end"),
            ]
        out += [pl.col(k) for k in self.keys]
        out += [a.finalize() for a in self.aggs]
        if (
            self.window is not None
            and self.window.allowed_lateness_ms
            and self.output_mode == "append"
        ):
            out.append(pl.col(REV).alias("revision"))
        # NOTE: no sort here: popped windows already come ordered by (end, keys) from the
        # store, merged rows in the batch's deterministic group_by order.
        return rows.select(out)


def arrival_order(batch_id: int) -> pl.Expr:
    """An Int64 that grows with each row's arrival: the batch id, then the row's
    position in the batch. Without a window, ``first``/``last`` keep the first
    and last row to arrive (as Polars' ``first()``/``last()`` over the rows in
    order); a batch re-run after a crash numbers its rows the same way."""
    return pl.lit(batch_id << 32, pl.Int64) + pl.int_range(pl.len(), dtype=pl.Int64)


def split_late_windows(
    df: pl.DataFrame, spec: WindowSpec, wm: int | None
) -> tuple[pl.LazyFrame, pl.DataFrame]:
    """Window assignments of ``spec`` still open, and the rows with at least one closed
    window (with ``late_reason``), at watermark ``wm`` (``None``: only null times are late).

    A row is late when its oldest window is closed (for tumbling windows:
    its only window). Late rows go to the late output; a hopping or cumulating row whose
    newer windows are still open also counts in those (Spark's rule: a
    closed window's assignment is dropped, an open one is kept).
    """
    # a window is final (its rows late) once the watermark passes end + lateness
    wm = None if wm is None else wm - spec.allowed_lateness_ms
    with_t = df.lazy().with_columns(event_time_ms(spec.column, df.schema).alias(TIME))
    newest_start = (pl.col(TIME) // spec.slide_ms) * spec.slide_ms
    oldest_end = newest_start + spec.slide_ms
    late_expr = pl.col(TIME).is_null()
    closed = None
    if wm is not None:
        late_expr = late_expr | (oldest_end <= wm)
        allowance = (
            f" and {format_duration_ms(spec.allowed_lateness_ms)} of allowed lateness"
            if spec.allowed_lateness_ms
            else ""
        )
        closed = pl.format(
            "window ending {} closed by watermark {}" + allowance,
            iso_ms(oldest_end),
            iso_ms(pl.lit(wm + spec.allowed_lateness_ms)),
        )
    reason = late_reason(f"event time {spec.column!r} is null", closed)
    marked = collect(with_t.with_columns(late_expr.alias("__late")))
    late = marked.filter("__late").with_columns(reason.alias(LATE_REASON)).drop(TIME, "__late")
    live = assign_windows(
        marked.lazy().filter(pl.col(TIME).is_not_null()).drop("__late"), spec, TIME
    )
    if wm is not None:
        live = live.filter(spec.end_of(pl.col(WS)) > wm)
    return live, late
