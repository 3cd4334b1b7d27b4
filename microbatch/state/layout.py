"""Which stores an operator keeps, and their schemas, from its recorded files alone.

Every stateful operator records its state's column types when its first batch
with columns runs (:mod:`microbatch.operators.state_schema`); this module turns
those records into :class:`StoreLayout` rows, one per store, without the job's
code and without writing anything, for the offline reader and savepoints. A
store's versions follow :mod:`statestore.contract`: batch N is version
``N + 1 - base`` (``base`` is 0 but for a join input first seen later).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import polars as pl

from microbatch.checkpoint.files import read_json
from microbatch.exceptions import CheckpointError
from microbatch.operators import asof_join, dedupe, fire_once, interval_join, session, transform
from microbatch.operators import window_agg as window
from microbatch.operators.join_state import T as JOIN_TIME
from microbatch.operators.state_schema import StateSchemaFile, read_keyed_schema, read_types
from microbatch.plan.stateful import TIMER, TIMER_KINDS
from sinks.changelog import CHANGE_TYPE

if TYPE_CHECKING:
    from statestore import StateStoreProvider

__all__ = ["NO_STORE_KINDS", "OperatorLayout", "StoreLayout", "operator_layout"]

NO_STORE_KINDS = ("discarding_aggregate", "static_join")
"""Operators that keep no keyed state (only their signature, or a table's version)."""


@dataclass(frozen=True)
class StoreLayout:
    """One store of an operator: where it is and what its rows are."""

    name: str
    """``"state"`` for a single-store operator; else e.g. ``"sessions"``,
    ``"event_timers"``, ``"left/rows"``."""
    directory: Path
    keys: dict[str, pl.DataType]
    values: dict[str, pl.DataType]
    time_column: str | None
    layout: Literal["keyed", "append"] = "keyed"
    added: tuple[str, ...] = ()
    base: int = 0
    """The batch id at which the store's version 0 begins (join inputs)."""
    out_time: pl.DataType | None = None
    """The type window bounds are emitted in (windows, sessions)."""

    def version(self, batch_id: int) -> int:
        """The version holding the state after committed batch ``batch_id``."""
        return batch_id + 1 - self.base

    def provider(self) -> StateStoreProvider:
        """A read-only provider of the store (nothing is created or deleted)."""
        from statestore import StateStoreProvider

        return StateStoreProvider(
            self.directory, self.keys, self.values, time_column=self.time_column,
            layout=self.layout, added_values=self.added, read_only=True,
        )


@dataclass(frozen=True)
class OperatorLayout:
    """An operator's id, recorded signature and stores (empty before its first batch)."""

    operator_id: str
    signature: dict[str, Any]
    stores: list[StoreLayout] = field(default_factory=list)

    @property
    def kind(self) -> str:
        """The operator's kind as recorded (``window_aggregate``, ``deduplicate``...)."""
        return str(self.signature.get("kind", "?"))


def operator_layout(op_dir: Path) -> OperatorLayout:
    """The stores of the operator whose state is in ``op_dir``.

    Raises CheckpointError when ``op_dir`` has no ``operator.json`` or the kind
    is not one this version knows.
    """
    if not (op_dir / "operator.json").exists():
        raise CheckpointError(f"{op_dir} holds no operator state (no operator.json)")
    signature = read_json(op_dir / "operator.json", "operator")
    kind = signature.get("kind")
    reader = _KINDS.get(kind)
    if reader is None and kind not in NO_STORE_KINDS:
        raise CheckpointError(
            f"the state in {op_dir} was written by an operator of kind {kind!r}, which this "
            "version of microbatch cannot read offline; upgrade microbatch."
        )
    stores = reader(op_dir, signature) if reader is not None else []
    return OperatorLayout(op_dir.name, signature, stores)


def _aggregate(op_dir: Path, sig: dict[str, Any]) -> list[StoreLayout]:
    rec = read_keyed_schema(op_dir)
    if rec is None:
        return []
    timed = sig.get("window") is not None or sig.get("ttl_ms") is not None
    return [StoreLayout("state", op_dir, rec["keys"], rec["values"],
                        window.EXPIRE if timed else None, layout=rec["layout"],
                        out_time=rec["out_time"])]


def _keyed(time_column: str) -> Any:
    def read(op_dir: Path, sig: dict[str, Any]) -> list[StoreLayout]:
        rec = read_keyed_schema(op_dir)
        if rec is None:
            return []
        return [StoreLayout("state", op_dir, rec["keys"], rec["values"], time_column)]
    return read


def _sessions(op_dir: Path, sig: dict[str, Any]) -> list[StoreLayout]:
    rec = read_keyed_schema(op_dir)
    if rec is None:
        return []
    keys = rec["keys"]
    return [
        StoreLayout("sessions", op_dir / "sessions", {**keys, session.SLOT: pl.Int64()},
                    rec["values"], session.E, out_time=rec["out_time"]),
        StoreLayout("index", op_dir / "index", keys,
                    {session.N: pl.Int64(), session.MAX_END: pl.Int64()}, session.MAX_END),
    ]


def _transform(op_dir: Path, sig: dict[str, Any]) -> list[StoreLayout]:
    file = StateSchemaFile(op_dir / transform.SCHEMA_ARROW, op_dir / transform.SCHEMA_FILE,
                           "transform-state")
    if not file.committed():
        return []
    types, names = file.read()
    keys = {k: types[k] for k in names["keys"]}
    values = {k: types[k] for k in names["values"]}
    values[transform.EXPIRE] = pl.Int64()
    if sig.get("ttl_time") == "event":
        values[transform.LAST_EVENT] = pl.Int64()
    out = [StoreLayout("state", op_dir / "state", keys, values, transform.EXPIRE,
                       added=tuple(names.get("added", [])))]
    out += [StoreLayout(f"{kind}_timers", op_dir / f"{kind}_timers",
                        {**keys, TIMER: pl.Int64()}, {transform.FIRE: pl.Int64()}, transform.FIRE)
            for kind in TIMER_KINDS]
    pending = op_dir / transform.PENDING_ARROW
    if pending.exists():
        out.append(StoreLayout("pending", op_dir / "pending", {transform.SEQ: pl.Int64()},
                               {**dict(read_types(pending)), transform.TIME: pl.Int64()},
                               transform.TIME))
    return out


def _join_input(directory: Path) -> tuple[pl.Schema, int] | None:
    file = StateSchemaFile(directory / "schema.arrow", directory / "meta.json", "join-input")
    if not file.committed():
        return None
    schema, meta = file.read()
    return schema, int(meta["base"])


def _interval_join(op_dir: Path, sig: dict[str, Any]) -> list[StoreLayout]:
    on, how = list(sig["on"]), sig.get("how")
    out = []
    for side, tracked in (("left", ("left", "full")), ("right", ("right", "full"))):
        recorded = _join_input(op_dir / side)
        if recorded is None:
            continue
        schema, base = recorded
        keys = {k: schema[k] for k in on}
        values = {c: t for c, t in schema.items() if c not in on}
        values[interval_join.EXP] = pl.Int64()
        if how in tracked:
            values[interval_join.MATCHED] = pl.Boolean()
        j = interval_join
        out += [
            StoreLayout(f"{side}/rows", op_dir / side / "rows", {**keys, j.SLOT: pl.Int64()},
                        values, j.EXP, base=base),
            StoreLayout(f"{side}/index", op_dir / side / "index", keys,
                        {j.LO: pl.Int64(), j.HI: pl.Int64(), j.MAXEXP: pl.Int64()},
                        j.MAXEXP, base=base),
        ]
    return out


def _asof_join(op_dir: Path, sig: dict[str, Any]) -> list[StoreLayout]:
    a, on = asof_join, list(sig["on"])
    out = []
    events = _join_input(op_dir / "events")
    if events is not None:
        schema, base = events
        out.append(StoreLayout("events", op_dir / "events" / "rows", {a.RID: pl.Int64()},
                               {**schema, JOIN_TIME: pl.Int64()}, JOIN_TIME, base=base))
    dim = _join_input(op_dir / "dimension")
    if dim is not None:
        schema, base = dim
        changelog = CHANGE_TYPE in schema
        keys = {k: schema[k] for k in on}
        values = {c: t for c, t in schema.items() if c not in on and c != CHANGE_TYPE}
        if changelog:
            values[a.GONE] = pl.Boolean()
        out += [
            StoreLayout("dimension/versions", op_dir / "dimension" / "versions",
                        {**keys, a.SLOT: pl.Int64()},
                        {**values, a.VF: pl.Int64(), a.NEXT: pl.Int64()}, a.NEXT, base=base),
            StoreLayout("dimension/index", op_dir / "dimension" / "index", keys,
                        {a.N: pl.Int64()}, None, base=base),
        ]
    return out


_KINDS: dict[Any, Any] = {
    "window_aggregate": _aggregate,
    "retract_aggregate": _aggregate,
    "deduplicate": _keyed(dedupe.EXPIRES),
    "fire_once": _keyed(fire_once.EXPIRE),
    "session_aggregate": _sessions,
    "transform_with_state": _transform,
    "interval_join": _interval_join,
    "asof_join": _asof_join,
}
