"""``agg(...).fire_once(condition)``: a rule on a windowed aggregate fires once.

Below it, the window aggregation emits a window's row in every batch that
changes it (early firing, Spark's ``update`` mode). Per batch, vectorized:

1. evaluate ``condition`` on the batch's changed rows;
2. look up their (window, keys) in state: the windows that already fired;
3. a row whose condition holds and whose window never fired is emitted with
   ``revision`` 0 and its window is remembered; with ``corrections``, a changed
   row of a window that already fired is emitted again with the next revision;
4. forget windows once the watermark passes their end plus the window's allowed
   lateness: the aggregation has dropped them too, and no later row can change
   them (such rows are late).

In ``changelog`` output mode the aggregation below emits a changelog too, and
this operator emits a firing as an ``insert`` and, with ``corrections``, a
correction as the row emitted before (``update_preimage``, taken from the
aggregation's preimage) directly followed by the new one (``update_postimage``).

So each (window, keys) fires at most once, in the batch where the condition
first holds, across crashes and replays (the state is versioned with the batch).
For a condition that stays true once it holds as a window grows (``n >= 3``,
a sum of positive amounts over a bound), the set of windows that fired equals
the one-shot result over the rows that were not late, whatever the batch split.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl

from microbatch.exceptions import PlanError
from microbatch.operators.base import (
    OperatorContext,
    SingleStoreOperator,
    StatefulOperator,
    check_signature,
)
from microbatch.operators.registry import builds
from microbatch.operators.state_schema import read_keyed_schema, write_keyed_schema
from microbatch.plan.event_time import event_time_ms
from microbatch.plan.nodes import FireOnceNode
from sinks.changelog import CHANGE_TYPE, INSERT, UPDATE_POSTIMAGE, UPDATE_PREIMAGE

if TYPE_CHECKING:
    from microbatch.types import OutputMode
    from statestore import StateStore, StateStoreProvider

WS = "__ws"
REV = "__rev"
EXPIRE = "__expire_at"
FIRE = "__fire"
REVISION = "revision"
"""Output column with ``corrections``: 0 for the firing, then 1, 2... per change."""


class FireOnce(SingleStoreOperator):
    """Emits each window's row the first time ``condition`` holds (see the module doc)."""

    def __init__(
        self,
        *,
        operator_id: str,
        condition: pl.Expr,
        keys: list[str],
        allowed_lateness_ms: int,
        corrections: bool,
        changelog: bool = False,
        cumulative: bool = False,
    ) -> None:
        self.operator_id = operator_id
        # NOTE: cumulating windows share their starts, so a window is known by its end
        self.window_id = "window_end" if cumulative else "window_start"
        self.condition = condition
        self.keys = keys
        self.allowed_lateness_ms = allowed_lateness_ms
        self.corrections = corrections
        self.changelog = changelog
        self.state_dir: Path | None = None
        self.provider: StateStoreProvider | None = None
        self.store: StateStore | None = None

    def signature(self) -> dict[str, Any]:
        return {
            "kind": "fire_once",
            "condition": str(self.condition),
            "keys": self.keys,
            "allowed_lateness_ms": self.allowed_lateness_ms,
            "corrections": self.corrections,
            **({"window_id": self.window_id} if self.window_id != "window_start" else {}),
        }

    def open(self, state_dir: Path | None, batch_id: int) -> None:
        self.state_dir = state_dir
        if state_dir is not None:
            check_signature(state_dir, self.signature())
            recorded = read_keyed_schema(state_dir)
            if recorded is not None:
                self._make_provider(recorded)

    def _make_provider(self, schema: dict[str, Any]) -> None:
        from statestore.backends import make_provider

        assert self.state_dir is not None
        self.provider = make_provider(
            self.state_dir,
            backend=self.state_backend,
            key_schema=schema["keys"],
            value_schema=schema["values"],
            time_column=EXPIRE,
        )

    def _load(self, df: pl.DataFrame, batch_id: int) -> StateStore | None:
        if self.provider is None:
            if df.width == 0:
                return None
            keys: dict[str, pl.DataType] = {WS: pl.Int64()}
            keys.update({k: df.schema[k] for k in self.keys})
            schema = {
                "keys": keys,
                "values": {REV: pl.Int64(), EXPIRE: pl.Int64()},
                "out_time": None,
            }
            assert self.state_dir is not None
            self._make_provider(schema)
            assert self.provider is not None
            self.provider.begin_at(batch_id)  # defined in a later batch than 0
            write_keyed_schema(self.state_dir, schema)
        assert self.provider is not None
        self.store = self.provider.load(batch_id)
        return self.store

    def has_expirable_state(self, watermark_ms: int | None) -> bool:
        return watermark_ms is not None

    def process(self, df: pl.DataFrame, ctx: OperatorContext) -> pl.DataFrame:
        store = self._load(df, ctx.batch_id)
        if store is None:
            return df
        fired_now = 0
        out = df
        if df.height:
            out, fired_now = self._fire(store, df)
        elif self.corrections and df.width:  # the same columns in a batch without rows
            out = df.select(pl.exclude(CHANGE_TYPE), pl.lit(None, pl.Int64).alias(REVISION))
            if self.changelog:
                out = out.with_columns(pl.lit(None, pl.String).alias(CHANGE_TYPE))
        if ctx.watermark_ms is not None:
            store.pop_expired(ctx.watermark_ms)
        ctx.metrics[self.operator_id] = {**store.metrics, "fired": fired_now}
        return out

    def _fire(self, store: StateStore, df: pl.DataFrame) -> tuple[pl.DataFrame, int]:
        preimages = None
        if self.changelog:
            # NOTE: the aggregation below emits a changelog: the preimages are the
            # window rows it emitted before (what this operator emitted last for a
            # fired window, since every change of one is passed on)
            kind = pl.col(CHANGE_TYPE)
            preimages = df.filter(kind == UPDATE_PREIMAGE).drop(CHANGE_TYPE)
            df = df.filter(kind != UPDATE_PREIMAGE).drop(CHANGE_TYPE)
        try:
            rows = df.with_columns(
                event_time_ms(self.window_id, df.schema).alias(WS),
                self.condition.fill_null(False).alias(FIRE),
            )
        except pl.exceptions.PolarsError as exc:
            raise PlanError(
                f"fire_once: the condition {self.condition} cannot be evaluated on the "
                f"aggregated rows (columns {df.columns}): {exc}"
            ) from exc
        state_keys = [WS, *self.keys]
        found = store.lookup(rows.select(state_keys))
        rows = rows.with_columns(found["__found"], found[REV])
        first = pl.col(FIRE) & ~pl.col("__found")
        emit = first | pl.col("__found") if self.corrections else first
        chosen = rows.filter(emit).with_columns(
            pl.when(pl.col("__found")).then(pl.col(REV) + 1).otherwise(0).alias(REV)
        )
        expire = event_time_ms("window_end", df.schema) + self.allowed_lateness_ms
        store.upsert(chosen.select(*state_keys, REV, expire.alias(EXPIRE)))
        fired = int(chosen.select((~pl.col("__found")).sum()).item())
        if preimages is not None:
            return self._changes(chosen, preimages), fired
        out = chosen.drop(WS, FIRE, "__found")
        out = out.rename({REV: REVISION}) if self.corrections else out.drop(REV)
        return out, fired

    def _changes(self, chosen: pl.DataFrame, preimages: pl.DataFrame) -> pl.DataFrame:
        """``changelog`` mode: a firing is an ``insert``; a correction the row
        emitted before (``revision`` one less) as ``update_preimage``, directly
        followed by the new one as ``update_postimage``."""
        columns = list(preimages.columns)
        chosen = chosen.with_row_index("__pos")
        post = chosen.select(
            "__pos",
            *columns,
            REV,
            pl.when("__found").then(pl.lit(UPDATE_POSTIMAGE)).otherwise(pl.lit(INSERT))
            .alias(CHANGE_TYPE),
            pl.lit(1, pl.Int8).alias("__side"),
        )
        window = [self.window_id, *self.keys]
        pre = (
            chosen.filter("__found")
            .select("__pos", *window, REV)
            .join(preimages, on=window, how="inner", nulls_equal=True)
            .select(
                "__pos",
                *columns,
                pl.col(REV) - 1,
                pl.lit(UPDATE_PREIMAGE).alias(CHANGE_TYPE),
                pl.lit(0, pl.Int8).alias("__side"),
            )
        )
        out = pl.concat([pre, post]).sort(["__pos", "__side"]).drop("__pos", "__side")
        out = out.rename({REV: REVISION}) if self.corrections else out.drop(REV)
        return out.select(pl.exclude(CHANGE_TYPE), CHANGE_TYPE)


@builds(FireOnceNode)
def build_fire_once(node: FireOnceNode, operator_id: str, mode: OutputMode) -> StatefulOperator:
    """``fire_once`` over its aggregation (which runs in update mode below it)."""
    window = node.child.window
    return FireOnce(
        operator_id=operator_id,
        condition=node.condition,
        keys=list(node.child.keys),
        allowed_lateness_ms=getattr(window, "allowed_lateness_ms", 0),
        corrections=node.corrections,
        changelog=mode == "changelog",
        cumulative=getattr(window, "cumulative", False),
    )
