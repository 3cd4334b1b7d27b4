"""A windowless ``group_by(keys).agg(...)`` over a changelog input: it retracts.

Each change row counts with its sign (+1 ``insert``/``update_postimage``,
-1 ``delete``/``update_preimage``: :func:`~microbatch.plan.changelog_inputs.sign_expr`).
Per batch, vectorized:

1. the batch's sign-weighted partials per key (one ``group_by``), with a
   hidden row count (``__mb_rows``, a ``len`` partial) beside the user's
   ``len``/``count``/``sum``/``mean``;
2. the state's partials of exactly those keys are looked up and added;
3. keys whose row count is above 0 are upserted; the others leave the state
   (their last row was deleted; a count below 0, a retraction of rows the
   operator never saw, is counted in ``unmatched_retractions`` and treated
   as empty, as Flink ignores a retraction without state);
4. ``update`` and ``changelog`` emit :func:`~microbatch.operators.changes.diff_rows`
   of the rows before and after the batch: a key that emptied is a
   ``delete`` with its last values, a new key an ``insert``, a changed one a
   pre/post pair; ``complete`` emits the whole state. ``append`` is refused
   when the query is built (a key's result is never final).

State is constant per key (the partials and the row count), and the state
before the batch is exactly what was emitted last (every change is emitted
in the batch that makes it), so no emitted rows are kept.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from microbatch.frames import collect
from microbatch.operators.base import OperatorContext
from microbatch.operators.changes import diff_rows
from microbatch.operators.window_agg import WindowAggregate
from microbatch.plan.aggregates import AggSpec
from microbatch.plan.changelog_inputs import (
    SIGN,
    check_change_types,
    sign_expr,
    signed_partials,
)
from microbatch.types import OutputMode

ROWS = AggSpec("len", None, "__mb_rows")
"""The hidden row count per key: the key leaves the result when it reaches 0."""
FOUND = "__found"


class RetractingAggregate(WindowAggregate):
    """``group_by(keys).agg(len, count, sum, mean)`` over change rows; a key whose
    rows are all deleted is removed from state and its result row deleted."""

    def __init__(
        self,
        *,
        operator_id: str,
        keys: list[str],
        aggs: list[AggSpec],
        output_mode: OutputMode,
    ) -> None:
        super().__init__(
            operator_id=operator_id,
            window=None,
            keys=keys,
            aggs=[*aggs, ROWS],
            output_mode=output_mode,
        )
        self.user_aggs = aggs

    def signature(self) -> dict[str, Any]:
        return {**super().signature(), "kind": "retract_aggregate"}

    def process(self, df: pl.DataFrame, ctx: OperatorContext) -> pl.DataFrame:
        store = self._load(df, ctx.batch_id)
        if store is None:
            ctx.metrics[self.operator_id] = {}
            return pl.DataFrame()
        before = after = self.row_schema.to_frame()
        unmatched = 0
        if df.width and df.height:
            check_change_types(df, ctx.batch_id, "group_by")
            partials = (
                df.lazy()
                .with_columns(sign_expr())
                .group_by(self.keys, maintain_order=True)
                .agg([e for a in self.aggs for e in signed_partials(a, df.schema)])
                .pipe(collect)
            )
            before, merged = self._merge_signed(store, partials)
            rows = pl.col(ROWS.partial_names()[0])
            unmatched = merged.filter(rows < 0).height
            after = merged.filter(rows > 0)
            store.upsert(after)
            store.delete(merged.filter(rows <= 0).select(self.keys))
        ctx.metrics[self.operator_id] = {
            **store.metrics,
            "late_rows": 0,
            "updated_keys": after.height,
            "unmatched_retractions": unmatched,
        }
        if self.output_mode == "complete":
            return self._finalize(store.to_frame())
        return diff_rows(
            self._finalize(before),
            self._finalize(after),
            keys=self.keys,
            order_by=self._orderable_keys(),
        )

    def _merge_signed(
        self, store: Any, partials: pl.DataFrame
    ) -> tuple[pl.DataFrame, pl.DataFrame]:
        """(stored rows of the batch's keys, the merged rows): partials add up."""
        found = store.lookup(partials.select(self.keys))
        pcols = [n for a in self.aggs for n in a.partial_names()]
        hit = found.get_column(FOUND)
        before = found.filter(hit).select(*self.keys, *pcols)
        state = found.select(FOUND, *[pl.col(n).alias(f"{n}__s") for n in pcols])
        merged = pl.concat([partials, state], how="horizontal").select(
            *self.keys,
            *[
                pl.when(pl.col(FOUND)).then(pl.col(f"{n}__s") + pl.col(n)).otherwise(pl.col(n))
                .alias(n)
                for n in pcols
            ],
        )
        return before, merged

    def _finalize(self, rows: pl.DataFrame) -> pl.DataFrame:
        """State rows -> the keys, then the user's aggregates (a ``mean`` of no
        value is null, as Polars' one-shot ``mean``)."""
        out: list[pl.Expr] = [pl.col(k) for k in self.keys]
        for agg in self.user_aggs:
            if agg.kind == "mean":
                total, count = (pl.col(n) for n in agg.partial_names())
                out.append(
                    pl.when(count > 0).then(total.cast(pl.Float64) / count).alias(agg.output)
                )
            else:
                out.append(agg.finalize())
        return rows.select(out)


__all__ = ["ROWS", "SIGN", "RetractingAggregate"]
