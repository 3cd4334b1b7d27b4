"""Stream-stream interval join: ``left.join_interval(right, ...)``.

A left row ``l`` and a right row ``r`` match when their join keys are equal
(a null key never matches, as in Polars) and
``l.t + lower <= r.t <= l.t + upper``.

Rules (docs/semantics.md, "Joins"), with ``W`` the watermark in force:

- a row of either input whose time is null or ``<= W`` is late (late
  output, counted); every other row is kept until no future row can match:
- future right rows have ``r.t > W``, so a left row is evicted once
  ``l.t + upper <= W``; future left rows have ``l.t > W``, so a right row is
  evicted once ``r.t - lower <= W``. Hence a row that is not late always
  finds every partner that is not late, and the union of the output equals
  the one-shot join of the rows that were not late, for every batch split;
- outer joins emit a row that never matched (nulls for the other side) when
  it is evicted — exactly once, because eviction removes it from state.

State per input (two stores, scalar columns only, see :class:`JoinSide`):
``rows`` keyed by (join keys, slot) with the row's other columns, its
expiry ``__exp`` (the time column) and, for a side whose unmatched rows are
emitted, ``__matched``; ``index`` keyed by the join keys with the key's live
slot range ``[__lo, __hi)`` and the latest expiry. A batch, vectorized:

1. split late rows off both inputs;
2. fetch the stored rows of the other input for the batch's keys (index
   lookup, explode the slot ranges, one rows lookup);
3. match new-left x stored-right, stored-left x new-right and
   new-left x new-right (each pair once) with a Polars join on the keys and
   a filter on the interval;
4. store the new rows (slots handed out from ``__hi``), flag matched rows;
5. evict what the watermark allows and emit the outer joins' unmatched rows.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl

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
from microbatch.plan.joins import IntervalJoinSpec, output_columns
from microbatch.plan.nodes import IntervalJoinNode

if TYPE_CHECKING:
    from microbatch.types import OutputMode
    from statestore import StateStore

SLOT, EXP, MATCHED = "__slot", "__exp", "__matched"
LO, HI, MAXEXP, FOUND = "__lo", "__hi", "__maxexp", "__found"
NEW_LO, BASE = "__new_lo", "__base"
LT, LS, RT, RS = "__lt", "__ls", "__rt", "__rs"


class JoinSide:
    """The rows of one join input kept for matching: many rows per join key.

    Slots of a key are handed out in arrival order from ``__hi``; rows leave
    by expiry, so a key's live rows have slots in ``[__lo, __hi)``.
    ``__lo`` moves up lazily to the lowest live slot whenever the key's rows
    are fetched, so the slots probed stay close to the rows alive. The index
    row of a key expires with its latest row (``__maxexp``), so a key whose
    rows all left costs nothing.
    """

    def __init__(self, side: str, on: list[str], time_column: str, *, track: bool) -> None:
        self.side = side
        self.on = on
        self.time_column = time_column
        self.track = track
        """Whether unmatched rows of this input are emitted (outer side)."""
        self.input = InputState(side)
        self.state = StoreSet()

    # ------------------------------------------------------------ lifecycle

    def open(self, directory: Path | None) -> None:
        self.state = StoreSet()
        if self.input.open(directory):
            self._make_providers()

    def prepare(self, df: pl.DataFrame, batch_id: int, what: str) -> None:
        """Record the input's schema on first sight (else check it), load the stores."""
        if df.width:
            if self.input.schema is None:
                require_columns(df.schema, [*self.on, self.time_column], side=self.side, what=what)
                self.input.define(df.schema, batch_id)
                self._make_providers()
            else:
                self.input.check(df.schema, batch_id)
        if self.state:
            self.state.load_all(self.input.version(batch_id))

    @property
    def rows(self) -> StateStore | None:
        """The input's rows by (key, slot), as loaded for this batch."""
        return self.state.get("rows")

    @property
    def index(self) -> StateStore | None:
        """Per key: the live slot range and the latest expiry."""
        return self.state.get("index")

    def _make_providers(self) -> None:
        schema = self.input.schema
        directory = self.input.directory
        assert schema is not None
        assert directory is not None
        keys = {k: schema[k] for k in self.on}
        values = {c: t for c, t in schema.items() if c not in self.on}
        values[EXP] = pl.Int64()
        if self.track:
            values[MATCHED] = pl.Boolean()
        self.state.define(
            "rows",
            directory / "rows",
            key_schema={**keys, SLOT: pl.Int64()},
            value_schema=values,
            time_column=EXP,
        )
        self.state.define(
            "index",
            directory / "index",
            key_schema=keys,
            value_schema={LO: pl.Int64(), HI: pl.Int64(), MAXEXP: pl.Int64()},
            time_column=MAXEXP,
        )

    @property
    def known(self) -> bool:
        return self.input.schema is not None

    @property
    def schema(self) -> pl.Schema:
        assert self.input.schema is not None
        return self.input.schema

    def commit(self) -> None:
        self.state.commit()

    def abort(self) -> None:
        self.state.abort()

    def metrics(self) -> dict[str, Any]:
        return {
            **self.state.totals(),
            "rows": self.state.rows("rows"),
            "keys": self.state.rows("index"),
        }

    # ---------------------------------------------------------------- batch

    def store_columns(self) -> list[str]:
        return [*self.on, SLOT, *(c for c in self.schema if c not in self.on), EXP] + (
            [MATCHED] if self.track else []
        )

    def empty_rows(self) -> pl.DataFrame:
        schema = self.schema
        cols: dict[str, pl.DataType] = {k: schema[k] for k in self.on}
        cols[SLOT] = pl.Int64()
        cols.update({c: t for c, t in schema.items() if c not in self.on})
        cols[EXP] = pl.Int64()
        if self.track:
            cols[MATCHED] = pl.Boolean()
        return pl.DataFrame(schema=cols)

    def fetch(self, keys: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
        """The stored rows of ``keys`` (unique, non-null), and the index rows
        of those keys whose low slot moved up (to upsert)."""
        rows, index = self.rows, self.index
        if rows is None or index is None or not keys.height or not index.num_rows:
            return self.empty_rows(), pl.DataFrame()
        idx = index.lookup(keys).filter(pl.col(FOUND) & (pl.col(LO) < pl.col(HI))).drop(FOUND)
        if not idx.height:
            return self.empty_rows(), pl.DataFrame()
        wanted = idx.select(*self.on, pl.int_ranges(LO, HI, dtype=pl.Int64).alias(SLOT)).explode(
            SLOT
        )
        found = rows.lookup(wanted).filter(FOUND).drop(FOUND)
        lowest = found.group_by(self.on).agg(pl.col(SLOT).min().alias(NEW_LO))
        moved = (
            idx.join(lowest, on=self.on, how="left", maintain_order="left")
            .with_columns(pl.coalesce(NEW_LO, HI).alias(NEW_LO))
            .filter(pl.col(NEW_LO) != pl.col(LO))
            .select(*self.on, pl.col(NEW_LO).alias(LO), HI, MAXEXP)
        )
        return found, moved

    def group(self, new: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
        """The new rows to keep, and per key (first-seen order) their count and
        latest expiry."""
        if not self.track:  # a null key never matches: keep such rows only to emit them
            new = new.filter(pl.all_horizontal(pl.col(self.on).is_not_null()))
        stats = new.group_by(self.on, maintain_order=True).agg(
            pl.len().cast(pl.Int64).alias("__n"), pl.col(EXP).max().alias("__m")
        )
        return new, stats

    def assign(
        self, new: pl.DataFrame, stats: pl.DataFrame, moved: pl.DataFrame
    ) -> tuple[pl.DataFrame, pl.DataFrame]:
        """``new`` rows (from :meth:`group`) with their slots, and the index rows
        to upsert (with the low slots that :meth:`fetch` moved)."""
        index = self.index
        assert index is not None
        old = index.lookup(stats.select(self.on)).select(LO, HI, MAXEXP, FOUND)
        hit = pl.col(FOUND)
        stats = stats.hstack(old).with_columns(
            pl.when(hit).then(pl.col(HI)).otherwise(0).alias(BASE),
            pl.when(hit).then(pl.col(LO)).otherwise(0).alias(LO),
        )
        updates = stats.select(
            *self.on,
            LO,
            (pl.col(BASE) + pl.col("__n")).alias(HI),
            pl.max_horizontal(MAXEXP, "__m").alias(MAXEXP),
        )
        if moved.height:  # a key both fetched and appended: keep the moved low slot
            updates = (
                updates.join(
                    moved.select(*self.on, pl.col(LO).alias(NEW_LO)),
                    on=self.on,
                    how="left",
                    nulls_equal=True,
                    maintain_order="left",
                )
                .with_columns(pl.coalesce(NEW_LO, LO).alias(LO))
                .drop(NEW_LO)
            )
            only = moved.join(updates, on=self.on, how="anti", nulls_equal=True)
            updates = pl.concat([updates, only.select(updates.columns)])
        slotted = new.join(
            stats.select(*self.on, BASE),
            on=self.on,
            how="left",
            nulls_equal=True,
            maintain_order="left",
        )
        slotted = (
            _rank_within(slotted, self.on)
            .with_columns((pl.col(BASE) + pl.col(SLOT)).alias(SLOT))
            .drop(BASE)
        )
        return slotted, updates

    def write(self, rows: pl.DataFrame, index_rows: pl.DataFrame) -> None:
        assert self.rows is not None
        assert self.index is not None
        if rows.height:
            self.rows.upsert(rows.select(self.store_columns()))
        if index_rows.height:
            self.index.upsert(index_rows)

    def evict(self, watermark_ms: int) -> pl.DataFrame:
        """Remove the rows no future row can match; return them."""
        assert self.rows is not None
        assert self.index is not None
        gone = self.rows.pop_expired(watermark_ms)
        self.index.pop_expired(watermark_ms)
        return gone


class IntervalJoin(BinaryOperator):
    """Both inputs' rows kept in state until the watermark says no match can come."""

    def __init__(self, *, operator_id: str, spec: IntervalJoinSpec) -> None:
        self.operator_id = operator_id
        self.spec = spec
        on = list(spec.on)
        self.left = JoinSide("left", on, spec.left_time, track=spec.how in ("left", "full"))
        self.right = JoinSide("right", on, spec.right_time, track=spec.how in ("right", "full"))

    def signature(self) -> dict[str, Any]:
        return self.spec.describe()

    def open(self, state_dir: Path | None, batch_id: int) -> None:
        if state_dir is not None:
            check_signature(state_dir, self.signature())
        self.left.open(None if state_dir is None else state_dir / "left")
        self.right.open(None if state_dir is None else state_dir / "right")

    def commit(self) -> None:
        self.left.commit()
        self.right.commit()

    def abort(self) -> None:
        self.left.abort()
        self.right.abort()

    def has_expirable_state(self, watermark_ms: int | None) -> bool:
        return watermark_ms is not None and (self.left.known or self.right.known)

    def metrics(self) -> dict[str, Any]:
        left, right = self.left.metrics(), self.right.metrics()
        return {
            "rows": left["rows"] + right["rows"],
            "bytes": left["bytes"] + right["bytes"],
            "left_rows": left["rows"],
            "right_rows": right["rows"],
            "left_keys": left["keys"],
            "right_keys": right["keys"],
            "left_bytes": left["bytes"],
            "right_bytes": right["bytes"],
            "commit_ms": round(left["commit_ms"] + right["commit_ms"], 3),
            "changelog_bytes": left["changelog_bytes"] + right["changelog_bytes"],
        }

    # ------------------------------------------------------------ batch

    def process_pair(
        self, left: pl.DataFrame, right: pl.DataFrame, ctx: OperatorContext
    ) -> pl.DataFrame:
        spec, wm = self.spec, ctx.watermark_ms
        self.left.prepare(left, ctx.batch_id, "join_interval")
        self.right.prepare(right, ctx.batch_id, "join_interval")
        if not (self.left.known and self.right.known):
            # NOTE: matches need both inputs; a row seen before the other input ever had
            # columns waits in state (its side is known) until the other side shows up
            return self._one_sided(left, right, ctx)
        require_same_key_types(
            self.left.schema,
            self.right.schema,
            list(spec.on),
            sides=("left", "right"),
            what="join_interval",
        )
        new_l, late_l = self._split(left, self.left, wm, +spec.upper_ms)
        new_r, late_r = self._split(right, self.right, wm, -spec.lower_ms)
        for late in (late_l, late_r):
            if late.height:
                ctx.late_rows.append(late)
        on = list(spec.on)
        new_l, stats_l = self.left.group(new_l)
        new_r, stats_r = self.right.group(new_r)
        cand_r, moved_r = self.right.fetch(_non_null(stats_l, on))
        cand_l, moved_l = self.left.fetch(_non_null(stats_r, on))
        new_l, index_l = self.left.assign(new_l, stats_l, moved_l)
        new_r, index_r = self.right.assign(new_r, stats_r, moved_r)
        out_cols, rename = output_columns(self.left.schema, self.right.schema, on, spec.suffix)
        nl = self._left_frame(new_l, pl.col(T))
        cl = self._left_frame(cand_l, pl.col(EXP) - spec.upper_ms)
        nr = self._right_frame(new_r, pl.col(T), rename)
        cr = self._right_frame(cand_r, pl.col(EXP) + spec.lower_ms, rename)
        m_new_old = self._match(nl, cr)
        m_old_new = self._match(cl, nr)
        m_new_new = self._match(nl, nr)
        store_l, store_r = new_l.drop(T), new_r.drop(T)
        if self.left.track:
            store_l = _flag(store_l, cand_l, [m_new_old, m_new_new], [m_old_new], on=on, slot=LS)
        if self.right.track:
            store_r = _flag(store_r, cand_r, [m_old_new, m_new_new], [m_new_old], on=on, slot=RS)
        self.left.write(store_l, index_l)
        self.right.write(store_r, index_r)
        pieces = [pl.concat([m_new_old, m_old_new, m_new_new]).select(out_cols)]
        unmatched = 0
        if wm is not None:
            gone_l, gone_r = self.left.evict(wm), self.right.evict(wm)
            if self.left.track:
                lonely = gone_l.filter(~pl.col(MATCHED)).select(list(self.left.schema))
                pieces.append(lonely)
                unmatched += lonely.height
            if self.right.track:
                lonely = (
                    gone_r.filter(~pl.col(MATCHED)).select(list(self.right.schema)).rename(rename)
                )
                pieces.append(lonely)
                unmatched += lonely.height
        out = pl.concat(pieces, how="diagonal").select(out_cols)
        ctx.metrics[self.operator_id] = {
            **self.metrics(),
            "late_rows": late_l.height + late_r.height,
            "matched_rows": out.height - unmatched,
            "unmatched_rows": unmatched,
        }
        return out

    def _split(
        self, df: pl.DataFrame, side: JoinSide, wm: int | None, exp_offset: int
    ) -> tuple[pl.DataFrame, pl.DataFrame]:
        """Rows not late, with ``__t`` and their expiry ``__exp``; and late rows."""
        frame = df if df.width else side.schema.to_frame()
        ok, late = split_late(frame, side.time_column, wm, side.side)
        return ok.with_columns((pl.col(T) + exp_offset).alias(EXP)), late

    def _left_frame(self, rows: pl.DataFrame, time: pl.Expr) -> pl.DataFrame:
        return rows.select(*self.left.schema, time.alias(LT), pl.col(SLOT).alias(LS))

    def _right_frame(
        self, rows: pl.DataFrame, time: pl.Expr, rename: dict[str, str]
    ) -> pl.DataFrame:
        return rows.select(
            *self.spec.on,
            *[pl.col(c).alias(out) for c, out in rename.items()],
            time.alias(RT),
            pl.col(SLOT).alias(RS),
        )

    def _match(self, left: pl.DataFrame, right: pl.DataFrame) -> pl.DataFrame:
        """Pairs with equal keys and the right time in the left row's interval."""
        s = self.spec
        return left.join(right, on=list(s.on), how="inner", maintain_order="left_right").filter(
            (pl.col(RT) >= pl.col(LT) + s.lower_ms) & (pl.col(RT) <= pl.col(LT) + s.upper_ms)
        )

    def _one_sided(
        self, left: pl.DataFrame, right: pl.DataFrame, ctx: OperatorContext
    ) -> pl.DataFrame:
        """Before both inputs have shown their columns: keep (or drop late) rows of
        the known input; nothing can match yet and nothing is evicted."""
        wm = ctx.watermark_ms
        for side, df, offset in (
            (self.left, left, self.spec.upper_ms),
            (self.right, right, -self.spec.lower_ms),
        ):
            if not side.known:
                continue
            new, late = self._split(df, side, wm, offset)
            if late.height:
                ctx.late_rows.append(late)
            rows, index_rows = side.assign(*side.group(new), pl.DataFrame())
            side.write(
                rows.drop(T).with_columns(pl.lit(False).alias(MATCHED))
                if side.track
                else rows.drop(T),
                index_rows,
            )
        ctx.metrics[self.operator_id] = self.metrics()
        return pl.DataFrame()


def _rank_within(rows: pl.DataFrame, on: list[str]) -> pl.DataFrame:
    """``rows`` with ``__slot`` = the row's rank among the rows of its key, in order.

    NOTE: the same as ``int_range(len()).over(on)``, which costs several times
    more when most keys are distinct: a stable sort, a group start per run, back.
    """
    if rows.height == 0:
        return rows.with_columns(pl.lit(0, pl.Int64).alias(SLOT))
    pos = pl.int_range(pl.len(), dtype=pl.Int64)
    # NOTE: ne_missing(null, <shifted-in null>) is False: the first row is a start anyway
    starts = pl.any_horizontal([pl.col(k).ne_missing(pl.col(k).shift(1)) for k in on]) | (pos == 0)
    return (
        rows.with_row_index("__i")
        .sort(on, maintain_order=True, nulls_last=True)
        .with_columns((pos - pl.when(starts).then(pos).forward_fill()).alias(SLOT))
        .sort("__i")
        .drop("__i")
    )


def _non_null(keys: pl.DataFrame, on: list[str]) -> pl.DataFrame:
    """The distinct join keys of a batch (from :meth:`JoinSide.group`) that can match."""
    return keys.select(on).filter(pl.all_horizontal(pl.col(on).is_not_null()))


def _flag(
    new: pl.DataFrame,
    stored: pl.DataFrame,
    new_hits: list[pl.DataFrame],
    stored_hits: list[pl.DataFrame],
    *,
    on: list[str],
    slot: str,
) -> pl.DataFrame:
    """New rows with ``__matched``, plus the stored rows that matched for the first time."""

    def hits(frames: list[pl.DataFrame]) -> pl.DataFrame:
        return (
            pl.concat([f.select(*on, pl.col(slot).alias(SLOT)) for f in frames])
            .unique()
            .with_columns(pl.lit(True).alias("__hit"))
        )

    flagged = new.join(hits(new_hits), on=[*on, SLOT], how="left", maintain_order="left")
    flagged = flagged.with_columns(pl.col("__hit").fill_null(False).alias(MATCHED)).drop("__hit")
    first = stored.filter(~pl.col(MATCHED)).join(
        hits(stored_hits), on=[*on, SLOT], how="semi", maintain_order="left"
    )
    return pl.concat([flagged, first.with_columns(pl.lit(True).alias(MATCHED))], how="diagonal")


@builds(IntervalJoinNode)
def build_interval_join(
    node: IntervalJoinNode, operator_id: str, mode: OutputMode
) -> StatefulOperator:
    """The stream-stream interval join (``join_interval``, ``join_window``)."""
    return IntervalJoin(operator_id=operator_id, spec=node.spec)
