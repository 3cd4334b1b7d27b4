"""``drop_duplicates(subset, within=...)``: the first row per key, state bounded
by the watermark; or ``drop_duplicates(subset, ttl=...)``: bounded by processing time.

A row is dropped as a duplicate when a row with the same ``subset`` values
was kept before and is still remembered; the kept
row's key is remembered until the watermark passes its event time +
``within``. A row whose event time is at or before the watermark in force is
late (counted, late output): its duplicates may already have been forgotten.
Vectorized: one ``unique`` per batch, one lookup and one upsert of the batch's
new keys, and eviction that costs the keys expired.

With ``ttl`` instead (no watermark needed), a kept key is remembered ``ttl``
after the recorded timestamp of the batch that kept it; a row of the key after
that is kept again (a new first row). Forgotten keys count as ``expired_rows``.
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
    split_late_by_time,
)
from microbatch.operators.registry import builds
from microbatch.operators.state_schema import read_keyed_schema, write_keyed_schema
from microbatch.plan.aggregates import TIME
from microbatch.plan.nodes import DedupeNode

if TYPE_CHECKING:
    from microbatch.types import OutputMode
    from statestore import StateStore, StateStoreProvider

EXPIRES = "__expires"


class Deduplicate(SingleStoreOperator):
    """Keeps the first row of each ``subset`` key within ``within_ms`` of event time,
    or within ``ttl_ms`` of processing time."""

    def __init__(
        self,
        *,
        operator_id: str,
        subset: list[str],
        within_ms: int | None,
        time_column: str | None,
        ttl_ms: int | None = None,
    ) -> None:
        if (ttl_ms is None) == (within_ms is None or time_column is None):
            raise PlanError("drop_duplicates takes within= (with a watermark) or ttl=")
        self.operator_id = operator_id
        self.ttl_ms = ttl_ms
        self.subset = subset
        self.within_ms = within_ms
        self.time_column = time_column
        self.state_dir: Path | None = None
        self.provider: StateStoreProvider | None = None
        self.store: StateStore | None = None

    def signature(self) -> dict[str, Any]:
        if self.ttl_ms is not None:
            return {"kind": "deduplicate", "subset": self.subset, "ttl_ms": self.ttl_ms}
        return {
            "kind": "deduplicate",
            "subset": self.subset,
            "within_ms": self.within_ms,
            "time_column": self.time_column,
        }

    def open(self, state_dir: Path | None, batch_id: int) -> None:
        self.state_dir = state_dir
        if state_dir is not None:
            check_signature(state_dir, self.signature())
            recorded = read_keyed_schema(state_dir)
            if recorded is not None:
                self._make_provider(recorded)
                if self.ttl_ms is not None:  # an idle query must know when a key expires
                    assert self.provider is not None
                    self.store = self.provider.load(batch_id)

    def _make_provider(self, schema: dict[str, Any]) -> None:
        from statestore.backends import make_provider

        assert self.state_dir is not None
        self.provider = make_provider(
            self.state_dir,
            backend=self.state_backend,
            key_schema=schema["keys"],
            value_schema=schema["values"],
            time_column=EXPIRES,
        )

    def _load(self, df: pl.DataFrame, batch_id: int) -> StateStore | None:
        if self.provider is None:
            if df.width == 0:
                return None
            missing = [c for c in self.subset if c not in df.columns]
            if missing:
                raise PlanError(
                    f"drop_duplicates subset {missing} are not columns of the stream; "
                    f"it has {df.columns}"
                )
            schema = {
                "keys": {c: df.schema[c] for c in self.subset},
                "values": {EXPIRES: pl.Int64},
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

    def eviction(self, *, has_watermark: bool) -> str:
        if self.ttl_ms is not None:
            return "ttl"
        return "watermark" if has_watermark else "none"

    def due(self, now_ms: int, watermark_ms: int | None) -> bool:
        if self.ttl_ms is None or self.store is None:
            return False
        t = self.store.next_time()
        return t is not None and t <= now_ms

    def process(self, df: pl.DataFrame, ctx: OperatorContext) -> pl.DataFrame:
        store = self._load(df, ctx.batch_id)
        if store is None:
            return df
        if self.ttl_ms is not None:
            return self._process_ttl(store, df, ctx)
        if df.width == 0:
            return df
        assert self.time_column is not None
        assert self.within_ms is not None
        wm = ctx.watermark_ms
        kept, late = split_late_by_time(df, self.time_column, wm)
        if late.height:
            ctx.late_rows.append(late)
        if wm is not None:  # keys older than `within` before the watermark are forgotten
            store.pop_expired(wm)
        first = kept.unique(self.subset, keep="first", maintain_order=True)
        seen = store.lookup(first.select(self.subset))["__found"]
        new = first.filter(~seen)
        store.upsert(new.select(*self.subset, (pl.col(TIME) + self.within_ms).alias(EXPIRES)))
        ctx.metrics[self.operator_id] = {
            **store.metrics,
            "late_rows": late.height,
            "duplicates_dropped": df.height - late.height - new.height,
        }
        return new.drop(TIME)

    def _process_ttl(self, store: StateStore, df: pl.DataFrame,
                     ctx: OperatorContext) -> pl.DataFrame:
        """Forget keys kept ``ttl`` ago (by the batch's recorded timestamp), then keep
        each key's first row unless it is remembered."""
        assert self.ttl_ms is not None
        expired = store.pop_expired(ctx.timestamp_ms).height
        new = df
        if df.width:
            first = df.unique(self.subset, keep="first", maintain_order=True)
            new = first.filter(~store.lookup(first.select(self.subset))["__found"])
            store.upsert(new.select(
                *self.subset, pl.lit(ctx.timestamp_ms + self.ttl_ms, pl.Int64).alias(EXPIRES)))
        ctx.metrics[self.operator_id] = {
            **store.metrics,
            "expired_rows": expired,
            "duplicates_dropped": df.height - new.height,
        }
        return new


@builds(DedupeNode)
def build_dedupe(node: DedupeNode, operator_id: str, mode: OutputMode) -> StatefulOperator:
    """``drop_duplicates`` within a watermark delay, or with a processing-time TTL."""
    return Deduplicate(
        operator_id=operator_id,
        subset=list(node.subset),
        within_ms=node.within_ms,
        time_column=node.time_column,
        ttl_ms=node.ttl_ms,
    )
