"""Operators over a changelog input: what a stream whose schema holds
``_change_type`` (see :mod:`sinks.changelog`) may go through, decided when the
query is built.

- A windowless ``group_by(keys).agg(...)`` retracts: each change row carries a
  sign (+1 for ``insert``/``update_postimage``, -1 for ``delete``/
  ``update_preimage``) and ``pl.len()``, ``count``, ``sum`` and ``mean`` are
  kept as sign-weighted partials (:func:`signed_partials`), constant state per
  key. ``min``/``max``/``first``/``last`` are refused (:func:`check_retractable`):
  retracting them needs every value of the key (a multiset per key).
- ``filter`` relabels the change rows whose update crosses the predicate
  (:func:`changelog_filter`).
- Windows, sessions, ``drop_duplicates`` and interval/window joins treat each
  row as an event: they are refused (:func:`refuse_event_time_operator`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import polars as pl

from microbatch.exceptions import ChangelogInputError
from microbatch.plan.aggregates import AggSpec
from sinks.changelog import (
    CHANGE_TYPE,
    CHANGE_TYPES,
    DELETE,
    INSERT,
    UPDATE_POSTIMAGE,
    UPDATE_PREIMAGE,
)

__all__ = [
    "SIGN",
    "changelog_filter",
    "check_retractable",
    "is_changelog_schema",
    "refuse_event_time_operator",
    "refuse_upsert_topics",
    "relabel_filtered",
    "selects_change_types",
    "sign_expr",
    "signed_partials",
]

SIGN = "__mb_sign"
"""The column holding a change row's sign (Int64 +1/-1) while aggregating."""

_INSERT_ONLY_FIX = (
    f'.filter(pl.col("{CHANGE_TYPE}") == "insert").drop("{CHANGE_TYPE}") when the '
    "source only ever appends (its rows are events), or a windowless "
    "group_by(keys).agg(...), which retracts"
)


def is_changelog_schema(schema: pl.Schema | None) -> bool:
    """Whether rows of ``schema`` are change rows (they carry ``_change_type``)."""
    return schema is not None and CHANGE_TYPE in schema


def refuse_event_time_operator(schema: pl.Schema | None, what: str) -> None:
    """Refuse ``what`` (a window, session, dedupe or interval join) over a changelog:
    these operators treat each row as an event and cannot take one back."""
    if is_changelog_schema(schema):
        raise ChangelogInputError(
            f"{what} over a changelog input (its rows carry {CHANGE_TYPE!r}): event-time "
            "operators need an insert-only stream, they cannot retract a row already "
            f"counted when its delete or update arrives. Fix: {_INSERT_ONLY_FIX}"
        )


def check_retractable(aggs: Sequence[AggSpec], schema: pl.Schema, *, ttl: bool) -> None:
    """Refuse what a retracting ``group_by`` over a changelog cannot keep exactly.

    ``min``/``max``/``first``/``last``: taking back the current minimum needs
    the next one, i.e. every value of the key (Flink keeps a multiset per key,
    state O(distinct values per key) instead of O(1)). ``ttl``: expiring a
    key's partials would make a later delete of one of its rows retract from
    nothing. A ``sum``/``mean`` of an unsigned column: a retraction is a
    negative partial.
    """
    if ttl:
        raise ChangelogInputError(
            "group_by(ttl=...) over a changelog input: a key whose partials expired "
            "would take a later delete or update of its rows away from nothing, and "
            "its result would be wrong. Drop ttl= (a key's state leaves when its last "
            "row is deleted)"
        )
    for agg in aggs:
        if agg.kind in {"min", "max", "first", "last"}:
            raise ChangelogInputError(
                f"{agg.kind}({agg.column!r}) over a changelog input cannot be retracted "
                "in constant state: when the current value is deleted, the next one "
                "is needed, i.e. every value of the key. Supported over a changelog: "
                "pl.len(), count, sum, mean. Alternatives: read an insert-only source "
                f'(.filter(pl.col("{CHANGE_TYPE}") == "insert")'
                f'.drop("{CHANGE_TYPE}") when it only appends), or keep the multiset '
                "of values per key yourself with group_by(keys).transform_with_state(...)"
            )
        dtype = schema.get(agg.column or "")
        if agg.kind in {"sum", "mean"} and dtype is not None and dtype.is_unsigned_integer():
            raise ChangelogInputError(
                f"{agg.kind}({agg.column!r}) over a changelog input: the column is "
                f"{dtype}, and a retraction subtracts; cast it to a signed type first, "
                f'e.g. .with_columns(pl.col("{agg.column}").cast(pl.Int64))'
            )


def refuse_upsert_topics(formats: Sequence[str]) -> None:
    """Refuse a retracting ``group_by`` over an ``upsert`` Kafka topic (``formats``:
    the formats of the sources below it): its updates carry no preimage, so the
    old row of a changed key would never be taken back."""
    if "upsert" in formats:
        raise ChangelogInputError(
            'group_by over read_kafka(..., format="upsert"): an upsert record carries '
            "the new row without the old one (no update_preimage) and a tombstone only "
            "the key, so the aggregate cannot take back what a changed or deleted key "
            'counted before. Read a complete changelog (format="debezium-json" with '
            "before images, or read_delta(changes=True)), or keep the latest row per key "
            "yourself with group_by(key).transform_with_state(...) and aggregate its output"
        )


def check_change_types(df: pl.DataFrame, batch_id: int, what: str) -> None:
    """Every row of ``df`` carries one of the vocabulary's four ``_change_type``
    values (``what``, the operator weighing them, is named in the error)."""
    if CHANGE_TYPE not in df.columns:
        raise ChangelogInputError(
            f"batch {batch_id}: the {what} over a changelog got rows without "
            f"{CHANGE_TYPE!r}; has a step before it dropped the column?"
        )
    bad = df.filter(~pl.col(CHANGE_TYPE).is_in(CHANGE_TYPES) | pl.col(CHANGE_TYPE).is_null())
    if bad.height:
        values = bad.get_column(CHANGE_TYPE).unique(maintain_order=True).head(5).to_list()
        raise ChangelogInputError(
            f"batch {batch_id}: {bad.height} row(s) with {CHANGE_TYPE} {values}; a "
            f"changelog's rows are one of {list(CHANGE_TYPES)}, which the {what} weighs "
            "by kind. Fix the source, or filter those rows out before the group_by"
        )


def sign_expr() -> pl.Expr:
    """+1 for ``insert``/``update_postimage``, -1 for ``delete``/``update_preimage``,
    null for anything else (refused by the operator before it aggregates)."""
    ct = pl.col(CHANGE_TYPE)
    return (
        pl.when(ct.is_in([INSERT, UPDATE_POSTIMAGE]))
        .then(pl.lit(1, pl.Int64))
        .when(ct.is_in([DELETE, UPDATE_PREIMAGE]))
        .then(pl.lit(-1, pl.Int64))
        .otherwise(pl.lit(None, pl.Int64))
        .alias(SIGN)
    )


def signed_partials(agg: AggSpec, schema: pl.Schema) -> list[pl.Expr]:
    """``agg``'s partials (names and types of :meth:`AggSpec.partials`) weighted by
    the rows' :data:`SIGN`, inside a ``group_by``: they merge by addition."""
    names = agg.partial_names()
    dtypes = agg.partial_dtypes(schema)
    sign = pl.col(SIGN)
    if agg.kind == "len":
        return [sign.sum().cast(dtypes[names[0]]).alias(names[0])]
    assert agg.column is not None
    col = pl.col(agg.column)
    counted = (sign * col.is_not_null().cast(pl.Int64)).sum()

    def signed_sum(value: pl.Expr, name: str) -> pl.Expr:
        return pl.when(sign > 0).then(value).otherwise(-value).sum().cast(dtypes[name]).alias(name)

    match agg.kind:
        case "count":
            return [counted.cast(dtypes[names[0]]).alias(names[0])]
        case "sum":
            return [signed_sum(col, names[0])]
        case "mean":
            exact = isinstance(schema.get(agg.column), pl.Decimal)
            value = col if exact else col.cast(pl.Float64)
            return [signed_sum(value, names[0]), counted.cast(dtypes[names[1]]).alias(names[1])]
    raise AssertionError(agg.kind)  # refused by check_retractable


def selects_change_types(predicates: Sequence[Any], constraints: dict[str, Any]) -> bool:
    """Whether a filter reads ``_change_type`` itself: it then selects kinds of
    change (drop the preimages, keep the inserts), deliberately, and is not
    relabelled."""
    if CHANGE_TYPE in constraints:
        return True
    exprs = [one for p in predicates for one in (p if isinstance(p, list | tuple) else [p])]
    return any(
        (e == CHANGE_TYPE) if isinstance(e, str) else
        isinstance(e, pl.Expr) and CHANGE_TYPE in e.meta.root_names()
        for e in exprs
    )


def changelog_filter(predicates: Sequence[Any], constraints: dict[str, Any]) -> pl.Expr:
    """The keep-mask of ``filter(*predicates, **constraints)`` (a null is dropped,
    as ``LazyFrame.filter`` does)."""
    exprs: list[pl.Expr] = []
    for p in predicates:
        for one in p if isinstance(p, list | tuple) else [p]:
            exprs.append(pl.col(one) if isinstance(one, str) else pl.lit(one) if not
                         isinstance(one, pl.Expr) else one)
    exprs += [pl.col(name) == value for name, value in constraints.items()]
    if not exprs:
        return pl.lit(True)
    return pl.all_horizontal(exprs).fill_null(False)


_KEEP, _PAIR, _PRE_KEPT, _POST_KEPT = "__mb_keep", "__mb_pair", "__mb_pre_kept", "__mb_post_kept"


def relabel_filtered(lf: pl.LazyFrame, keep: pl.Expr) -> pl.LazyFrame:
    """Keep the change rows where ``keep`` holds, relabelling an update that crosses it.

    An update is a preimage and its postimage; the k-th ``update_preimage`` of the
    frame pairs with its k-th ``update_postimage`` (for an operator's output, a
    preimage directly followed by its postimage; for a Delta Change Data Feed,
    the k-th preimage and postimage of a version). A preimage kept whose
    postimage is dropped becomes a ``delete`` (the row left the result); a
    postimage kept whose preimage is dropped becomes an ``insert`` (the row
    entered it). A lone postimage (an upsert topic) stays as it is.
    Vectorized: two joins on the pair number, no loop per row.
    """
    ct = pl.col(CHANGE_TYPE)
    is_pre, is_post = ct == UPDATE_PREIMAGE, ct == UPDATE_POSTIMAGE
    marked = lf.with_columns(keep.alias(_KEEP)).with_columns(
        pl.when(is_pre)
        .then(is_pre.cast(pl.Int64).cum_sum())
        .when(is_post)
        .then(is_post.cast(pl.Int64).cum_sum())
        .alias(_PAIR)
    )
    pre = marked.filter(is_pre).select(_PAIR, pl.col(_KEEP).alias(_PRE_KEPT))
    post = marked.filter(is_post).select(_PAIR, pl.col(_KEEP).alias(_POST_KEPT))
    columns = lf.collect_schema().names()
    joined = marked.join(pre, on=_PAIR, how="left", maintain_order="left").join(
        post, on=_PAIR, how="left", maintain_order="left"
    )
    # NOTE: a partner that is absent (null) is not "dropped": only False relabels
    crossed_out = is_pre & pl.col(_POST_KEPT).eq_missing(pl.lit(False))
    crossed_in = is_post & pl.col(_PRE_KEPT).eq_missing(pl.lit(False))
    return (
        joined.filter(pl.col(_KEEP))
        .with_columns(
            pl.when(crossed_out)
            .then(pl.lit(DELETE))
            .when(crossed_in)
            .then(pl.lit(INSERT))
            .otherwise(ct)
            .alias(CHANGE_TYPE)
        )
        .select(columns)
    )
