"""Discarding aggregation: each batch's increment of additive aggregates.

``group_by([window], *keys, accumulation_mode="discarding").agg(...)`` is
Beam's ``AccumulationMode.DISCARDING`` (``.discardingFiredPanes()``): every
batch fires a pane per (window, keys) it touched, holding only what that
batch added, for sinks that add (a counter service, a ledger, a Delta table
summed by key). Per batch, vectorized:

1. windowed: rows whose oldest window is closed by the watermark in force
   (past ``window_end + allowed_lateness``) are late, as for the accumulating
   aggregation (:func:`~microbatch.operators.window_agg.split_late_windows`):
   counted, sent to the late output, never in an increment; a hopping row
   counts in its windows still open;
2. over a changelog input (``_change_type``, windowless only), each row is
   weighted +1 (``insert``, ``update_postimage``) or -1 (``delete``,
   ``update_preimage``);
3. one ``group_by`` over (window, keys) computes ``len``/``count``/``sum`` of
   the batch's rows; rows are emitted sorted by (window, keys).

No keyed state: the late rule needs only the watermark recorded in
``offsets/N``, so the sum of a window's increments over every batch equals
its accumulated value over the rows that were not late, and a re-run of a
batch (same rows, same watermark) emits the same increments, bit for bit.
The operator still records its signature in the checkpoint (a job switching
between accumulating and discarding on one checkpoint is refused).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl

from microbatch.frames import collect
from microbatch.operators.base import OperatorContext, StatefulOperator, check_signature
from microbatch.operators.registry import builds
from microbatch.operators.window_agg import WS, split_late_windows
from microbatch.plan.aggregates import TIME, AggSpec, check_discarding_input
from microbatch.plan.changelog_inputs import check_change_types, sign_expr, signed_partials
from microbatch.plan.event_time import ms_to_time
from microbatch.plan.nodes import DiscardingAggregateNode
from microbatch.plan.windows import WindowSpec
from microbatch.types import OutputMode
from sinks.changelog import CHANGE_TYPE


class DiscardingAggregate(StatefulOperator):
    """Emits, per batch, the increment of each (window, keys) the batch touched.

    Guarantees: the sum of the increments emitted for a (window, keys) equals the
    accumulating aggregation's value over the rows that were not late, for
    every batch split; a re-run of a batch emits the same rows; nothing is kept
    between batches but the operator's signature.
    """

    def __init__(
        self,
        *,
        operator_id: str,
        window: WindowSpec | None,
        keys: list[str],
        aggs: list[AggSpec],
    ) -> None:
        self.operator_id = operator_id
        self.window = window
        self.keys = keys
        self.aggs = aggs

    def signature(self) -> dict[str, Any]:
        return {
            "kind": "discarding_aggregate",
            "window": self.window.describe() if self.window else None,
            "keys": self.keys,
            "aggs": [a.state_name for a in self.aggs],
        }

    def open(self, state_dir: Path | None, batch_id: int) -> None:
        if state_dir is not None:
            check_signature(state_dir, self.signature())

    def commit(self) -> None:
        """Nothing is staged: increments depend only on the batch and its watermark."""

    def abort(self) -> None:
        """Nothing is staged."""

    def process(self, df: pl.DataFrame, ctx: OperatorContext) -> pl.DataFrame:
        if df.width == 0:  # a no-data batch of a source without a declared schema
            ctx.metrics[self.operator_id] = {"rows": 0, "bytes": 0, "late_rows": 0}
            return pl.DataFrame()
        check_discarding_input(df.schema, self.window)
        late_count = 0
        if self.window is not None:
            lf, late = split_late_windows(df, self.window, ctx.watermark_ms)
            late_count = late.height
            if late_count:
                ctx.late_rows.append(late)
        else:
            lf = df.lazy().with_columns(pl.lit(0, pl.Int64).alias(TIME))
        group = ([WS] if self.window is not None else []) + self.keys
        changelog = CHANGE_TYPE in df.columns
        if changelog:
            check_change_types(df, ctx.batch_id, "discarding group_by")
            lf = lf.with_columns(sign_expr())
        exprs = [_increment(a, df.schema, changelog) for a in self.aggs]
        # NOTE: maintain_order, then a sort by the group: the rows and every float sum
        # (folded in row order by the in-memory engine) are the same on a re-run
        out = collect(lf.group_by(group, maintain_order=True).agg(exprs))
        orderable = [
            c for c in group
            if not isinstance(out.schema[c], pl.List | pl.Struct | pl.Array | pl.Object)
        ]
        if orderable and out.height > 1:
            out = out.sort(orderable, maintain_order=True, nulls_last=True)
        ctx.metrics[self.operator_id] = {
            "rows": 0,
            "bytes": 0,
            "late_rows": late_count,
            "emitted_rows": out.height,
        }
        return out.select(self._output_columns(df.schema))

    def _output_columns(self, schema: pl.Schema) -> list[pl.Expr]:
        """``window_start, window_end`` (the window column's type), keys, increments."""
        cols: list[pl.Expr] = []
        if self.window is not None:
            dtype = schema[self.window.column]
            cols += [
                ms_to_time(self.window.start_of(pl.col(WS)), dtype).alias("window_start"),
                ms_to_time(self.window.end_of(pl.col(WS)), dtype).alias("window_end"),
            ]
        return cols + [pl.col(k) for k in self.keys] + [pl.col(a.output) for a in self.aggs]


def _increment(agg: AggSpec, schema: pl.Schema, changelog: bool) -> pl.Expr:
    """The batch's increment of ``agg`` (one partial: ``len``, ``count``, ``sum``),
    typed as the accumulating aggregate's partial; over a changelog each row
    counts with its sign, as in the retracting aggregation."""
    (partial,) = signed_partials(agg, schema) if changelog else agg.partials(schema)
    return partial.alias(agg.output)


@builds(DiscardingAggregateNode)
def build_discarding(
    node: DiscardingAggregateNode, operator_id: str, mode: OutputMode
) -> StatefulOperator:
    """The increments of ``node``'s aggregates; ``append`` is the only mode."""
    node.check_output_mode(mode)
    return DiscardingAggregate(
        operator_id=operator_id, window=node.window, keys=list(node.keys), aggs=list(node.aggs)
    )
