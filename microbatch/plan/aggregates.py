"""Streaming aggregations as partial -> merge -> finalize.

Each supported Polars aggregation expression maps to partial columns that a
batch computes with one ``group_by``, that merge associatively with the
partials already in state, and that finalize into the user's column. Each
partial column has a stable name derived from the aggregation, so changing
an aggregation never silently reuses old state.

Supported: ``pl.len()``, ``col.count()``, ``col.sum()``, ``col.min()``,
``col.max()``, ``col.mean()``, ``col.first()`` / ``col.last()`` (by event
time; ties go to the earlier / later arrival), each optionally ``.alias``-ed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import polars as pl

from microbatch.exceptions import PlanError

SUPPORTED = (
    "pl.len(), col.count(), col.sum(), col.min(), col.max(), col.mean(), col.first(), col.last()"
)
TIME = "__t"  # the event time (epoch ms) column available while aggregating


@dataclass(frozen=True)
class AggSpec:
    """One output aggregate: its kind, input column and output name."""

    kind: str
    column: str | None
    output: str

    @property
    def state_name(self) -> str:
        return f"{self.kind}({self.column or ''})"

    def partial_names(self) -> list[str]:
        base = f"__p_{self.output}"
        if self.kind == "mean":
            return [f"{base}_sum", f"{base}_cnt"]
        if self.kind in {"first", "last"}:
            return [f"{base}_t", f"{base}_v"]
        return [base]

    def partials(self, schema: pl.Schema) -> list[pl.Expr]:
        """Expressions computing this aggregate's partials inside a group_by
        over rows of ``schema``."""
        names = self.partial_names()
        if self.kind == "len":
            return [pl.len().cast(pl.Int64).alias(names[0])]
        assert self.column is not None  # every other kind aggregates a column
        col = pl.col(self.column)
        match self.kind:
            case "count":
                return [col.count().cast(pl.Int64).alias(names[0])]
            case "sum":
                return [col.sum().alias(names[0])]
            case "min":
                return [col.min().alias(names[0])]
            case "max":
                return [col.max().alias(names[0])]
            case "mean":
                # Decimal sums are exact (order-independent); others sum as Float64
                exact = isinstance(schema.get(self.column or ""), pl.Decimal)
                return [
                    (col.sum() if exact else col.cast(pl.Float64).sum()).alias(names[0]),
                    col.count().cast(pl.Int64).alias(names[1]),
                ]
            case "first":
                return [
                    pl.col(TIME).min().alias(names[0]),
                    col.sort_by(TIME, maintain_order=True).first().alias(names[1]),
                ]
            case "last":
                return [
                    pl.col(TIME).max().alias(names[0]),
                    col.sort_by(TIME, maintain_order=True).last().alias(names[1]),
                ]
        raise AssertionError(self.kind)

    def merges(self) -> list[pl.Expr]:
        """Expressions merging partial rows (state first, then batch) per key."""
        names = self.partial_names()
        match self.kind:
            case "len" | "count" | "sum":
                return [pl.col(names[0]).sum()]
            case "min":
                return [pl.col(names[0]).min()]
            case "max":
                return [pl.col(names[0]).max()]
            case "mean":
                return [pl.col(names[0]).sum(), pl.col(names[1]).sum()]
            case "first":
                return [
                    pl.col(names[0]).min(),
                    pl.col(names[1]).sort_by(names[0], maintain_order=True).first(),
                ]
            case "last":
                return [
                    pl.col(names[0]).max(),
                    pl.col(names[1]).sort_by(names[0], maintain_order=True).last(),
                ]
        raise AssertionError(self.kind)

    def finalize(self) -> pl.Expr:
        """The user's output column from the merged partials."""
        names = self.partial_names()
        if self.kind == "mean":
            return (pl.col(names[0]).cast(pl.Float64) / pl.col(names[1])).alias(self.output)
        if self.kind in {"first", "last"}:
            return pl.col(names[1]).alias(self.output)
        return pl.col(names[0]).alias(self.output)

    def partial_dtypes(self, schema: pl.Schema) -> dict[str, pl.DataType]:
        """Types of the partial columns for an input ``schema``."""
        frame = schema.to_frame().with_columns(pl.lit(0, pl.Int64).alias(TIME))
        return dict(frame.select(self.partials(schema)).schema)


def _column_of(node: Any) -> str | None:
    if isinstance(node, dict):
        if "Column" in node:
            return str(node["Column"])
        if "input" in node and isinstance(node["input"], dict) and "Column" in node["input"]:
            return str(node["input"]["Column"])
    return None


def parse_aggregation(expr: pl.Expr) -> AggSpec:
    """Map one Polars aggregation expression to an :class:`AggSpec` or refuse it."""
    if not isinstance(expr, pl.Expr):
        raise PlanError(f"agg() takes Polars expressions such as pl.len(); got {expr!r}")
    tree = json.loads(expr.meta.serialize(format="json"))
    output = expr.meta.output_name(raise_if_undetermined=False)
    if isinstance(tree, dict) and "Alias" in tree:
        tree = tree["Alias"][0]
    if tree == "Len":
        return AggSpec("len", None, output or "len")
    if isinstance(tree, dict) and "Agg" in tree and len(tree["Agg"]) == 1:
        ((name, arg),) = tree["Agg"].items()
        kind = {
            "Sum": "sum",
            "Min": "min",
            "Max": "max",
            "Mean": "mean",
            "Count": "count",
            "First": "first",
            "Last": "last",
        }.get(name)
        column = _column_of(arg)
        if kind and column and output:
            if kind == "count" and isinstance(arg, dict) and arg.get("include_nulls"):
                kind = "len"
                column = None
            return AggSpec(kind, column, output)
    raise PlanError(
        f"aggregation {expr} cannot be computed incrementally: a streaming aggregation "
        f"must merge partial results across batches. Supported: {SUPPORTED} on a column "
        "(use .alias() to name it). Compute other values from these in a later "
        ".with_columns(...)."
    )


def parse_aggregations(exprs: tuple[Any, ...]) -> list[AggSpec]:
    """All of ``agg(...)``'s expressions; output names must be unique."""
    flat: list[Any] = []
    for e in exprs:
        flat.extend(e if isinstance(e, list | tuple) else [e])
    if not flat:
        raise PlanError("agg() needs at least one aggregation, e.g. pl.len()")
    specs = [parse_aggregation(e) for e in flat]
    names = [s.output for s in specs]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise PlanError(f"agg() produces the column name(s) {dupes} twice; use .alias()")
    return specs


ADDITIVE = frozenset({"len", "count", "sum"})
"""Aggregates whose per-batch increments add up to the accumulated value."""


def check_additive(aggs: tuple[AggSpec, ...] | list[AggSpec]) -> None:
    """Refuse a discarding aggregation (``accumulation_mode="discarding"``) of an
    aggregate that is not additive: its increments would not add up to anything."""
    bad = [f"{a.kind}({a.column or ''}) as {a.output}" for a in aggs if a.kind not in ADDITIVE]
    if bad:
        raise PlanError(
            f"group_by(..., accumulation_mode='discarding') emits each batch's increment, "
            f"which a sink adds to what it holds; {', '.join(bad)} is not additive (the "
            "value over two batches is not the sum of the values over each). Only "
            "pl.len(), col.count() and col.sum() can be discarded. For a mean, emit "
            "col.sum() and col.count() and divide downstream, after adding them up; for "
            "min/max/first/last, use accumulation_mode='accumulating' (the default)."
        )


def check_discarding_input(schema: pl.Schema, window: Any) -> None:
    """A discarding aggregation over a changelog input (``_change_type``) runs
    without a window only: its increments are sign-weighted (a delete or an
    update preimage subtracts). Windows over a changelog are refused: an update
    or delete of an old row arrives after its window closed, would be late,
    and the increments would drift from the source table for good."""
    from microbatch.exceptions import ChangelogInputError
    from sinks.changelog import CHANGE_TYPE

    if window is not None and CHANGE_TYPE in schema:
        raise ChangelogInputError(
            "group_by(mb.window(...), ..., accumulation_mode='discarding') over a changelog "
            f"input (its rows carry {CHANGE_TYPE!r}) is refused: an update or delete of an "
            "old row arrives after its window closed, would be late, and the increments "
            "would drift from the source table for good. Group without a window (the "
            "increments are then sign-weighted: deletes and update preimages subtract), or, "
            f"when the source only inserts, drop {CHANGE_TYPE!r} before group_by."
        )
