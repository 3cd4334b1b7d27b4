"""What stateful operators emit as a changelog (``_change_type``, see
:mod:`sinks.changelog` for the vocabulary).

One helper, :func:`diff_rows`, turns "the rows this operator emitted last for
some result keys" and "the rows it holds for them now" into the changes a
table keyed by those keys must apply, vectorized (joins, no loop per row).

Order within the frame it returns (the contract documented in
docs/semantics.md, "Changelogs"): every ``delete`` first, then each
``update_preimage`` directly followed by its ``update_postimage``, then every
``insert``; each group in ``order_by`` order. A key appears at most once per
group, and never in both ``delete`` and ``insert`` (that pair is an update).
"""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl

from sinks.changelog import CHANGE_TYPE, DELETE, INSERT, UPDATE_POSTIMAGE, UPDATE_PREIMAGE

__all__ = ["CHANGE_TYPE", "as_inserts", "diff_rows", "empty_changes", "sink_rows"]

_PAIR, _SIDE = "__mb_pair", "__mb_side"


def as_inserts(rows: pl.DataFrame) -> pl.DataFrame:
    """``rows`` as a changelog of inserts (``_change_type`` last)."""
    return rows.with_columns(pl.lit(INSERT, pl.String).alias(CHANGE_TYPE))


def sink_rows(output: pl.DataFrame, output_mode: str) -> pl.DataFrame:
    """A plan's output as the sink receives it: in ``changelog`` mode, the rows of
    a plan without a changing operator as inserts (it only ever adds rows)."""
    if output_mode == "changelog" and output.width and CHANGE_TYPE not in output.columns:
        return as_inserts(output)
    return output


def empty_changes(rows: pl.DataFrame) -> pl.DataFrame:
    """An empty changelog with the columns of ``rows``."""
    return as_inserts(rows.head(0))


def diff_rows(
    old: pl.DataFrame,
    new: pl.DataFrame,
    *,
    keys: Sequence[str],
    order_by: Sequence[str] = (),
) -> pl.DataFrame:
    """The changes from ``old`` to ``new``, two frames of the same columns whose
    ``keys`` identify a row (each key at most once in each frame).

    A key only in ``old`` is a ``delete`` carrying its old values; only in
    ``new``, an ``insert``; in both with a different value in some other
    column, an ``update_preimage`` (old values) followed by an
    ``update_postimage`` (new values); in both with equal values, nothing.
    Nulls compare equal, as do NaNs (Polars' ``eq_missing``).
    """
    keys = list(keys)
    values = [c for c in new.columns if c not in keys]
    old = old.select(new.columns)
    deleted = old.join(new.select(keys), on=keys, how="anti", nulls_equal=True)
    inserted = new.join(old.select(keys), on=keys, how="anti", nulls_equal=True)
    both = old.join(new, on=keys, how="inner", nulls_equal=True, suffix="__mb_new")
    if values:
        differs = pl.any_horizontal(
            [~pl.col(c).eq_missing(pl.col(f"{c}__mb_new")) for c in values]
        )
        both = both.filter(differs)
    else:
        both = both.head(0)
    if order_by:
        order = list(order_by)
        deleted = deleted.sort(order, maintain_order=True)
        inserted = inserted.sort(order, maintain_order=True)
        both = both.sort(order, maintain_order=True)
    both = both.with_row_index(_PAIR)
    pre = both.select(_PAIR, *keys, *values).with_columns(pl.lit(0, pl.Int8).alias(_SIDE))
    post = both.select(
        _PAIR, *keys, *[pl.col(f"{c}__mb_new").alias(c) for c in values]
    ).with_columns(pl.lit(1, pl.Int8).alias(_SIDE))
    # NOTE: each postimage directly follows its preimage (the vocabulary's rule)
    updates = (
        pl.concat([pre, post])
        .sort([_PAIR, _SIDE])
        .with_columns(
            pl.when(pl.col(_SIDE) == 0)
            .then(pl.lit(UPDATE_PREIMAGE))
            .otherwise(pl.lit(UPDATE_POSTIMAGE))
            .alias(CHANGE_TYPE)
        )
        .select(*new.columns, CHANGE_TYPE)
    )
    return pl.concat(
        [
            deleted.with_columns(pl.lit(DELETE, pl.String).alias(CHANGE_TYPE)),
            updates,
            as_inserts(inserted),
        ],
        how="vertical_relaxed",
    )
