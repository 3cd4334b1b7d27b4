"""Kafka changelog formats: Debezium JSON envelopes and upsert (KTable) topics, decoded
in bulk into changelog rows (a ``_change_type`` column, see :mod:`sinks.changelog`).

``debezium-json``: each value is an envelope ``{"before", "after", "op", ...}``,
bare or wrapped in ``{"schema": ..., "payload": {...}}`` (Kafka Connect's
JsonConverter with schemas enabled). ``c`` and ``r`` (snapshot read) give one
``insert`` row (``after``); ``u`` gives ``update_preimage`` (``before``) then
``update_postimage`` (``after``), or the postimage alone when ``before`` is null
(Postgres without ``REPLICA IDENTITY FULL``); ``d`` gives one ``delete`` row
(``before``). A null value (the tombstone Debezium writes after a delete) carries
no row and is skipped. A value that is not such an envelope (bad JSON, an
unknown op, ``c``/``r``/``u`` without ``after``, ``d`` without ``before``, an
image that does not fit the schema) is a dead letter with the reason; every row
of a record is kept or none is.

``upsert``: the value is the row as JSON, the key the row's key columns as a JSON
object (Kafka Streams' KTable, ksqlDB, Flink's upsert-kafka). A value is an
upsert: an ``update_postimage`` row (a reader cannot know whether the key existed
before, and :func:`sinks.changelog.split_changes` applies ``insert`` and
``update_postimage`` alike); a null value (tombstone) is a ``delete`` of the
key, with the key columns from the record key and nulls elsewhere.

The envelopes are parsed with Polars' JSON path functions and the images with
:func:`~microbatch.sources.kafka_decode.decode_values`, over the whole batch:
no Python loop per record on the good path.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import polars as pl

from microbatch.sources.kafka_decode import Decoded, decode_values
from sinks.changelog import CHANGE_TYPE, DELETE, INSERT, UPDATE_POSTIMAGE, UPDATE_PREIMAGE

__all__ = ["decode_debezium", "decode_upsert"]

_OPS = ("c", "r", "u", "d")


def _as_text(values: Sequence[bytes | None]) -> tuple[pl.Series, list[tuple[int, str]]]:
    """The values as UTF-8 text (null for null values), and the ones that are not UTF-8."""
    raw = pl.Series(values, dtype=pl.Binary)
    try:
        return raw.cast(pl.String), []
    except pl.exceptions.ComputeError:  # rare: find the bad ones (error path only)
        bad: list[tuple[int, str]] = []
        text: list[str | None] = []
        for i, v in enumerate(values):
            try:
                text.append(None if v is None else v.decode("utf-8"))
            except UnicodeDecodeError:
                bad.append((i, "invalid UTF-8 in the value"))
                text.append(None)
        return pl.Series(text, dtype=pl.String), bad


def decode_debezium(values: Sequence[bytes | None], schema: pl.Schema) -> Decoded:
    """Debezium envelopes to changelog rows: ``schema``'s columns then ``_change_type``.

    ``good`` gives each row's record index (a ``u`` record gives two rows);
    ``bad`` the ``(record index, reason)`` of each envelope that is not valid.
    """
    text, bad = _as_text(values)
    env = pl.DataFrame({"text": text}).select(
        pl.int_range(pl.len(), dtype=pl.Int64).alias("i"),
        pl.col("text").is_null().alias("tombstone"),
        pl.col("text").str.json_path_match("$").is_not_null().alias("json"),
        pl.coalesce(pl.col("text").str.json_path_match("$.payload"), pl.col("text"))
        .alias("env"),
    ).select(
        "i", "tombstone", "json",
        pl.col("env").str.json_path_match("$.op").alias("op"),
        pl.col("env").str.json_path_match("$.before").alias("before"),
        pl.col("env").str.json_path_match("$.after").alias("after"),
    )
    shown = pl.col("op").fill_null("null")
    reason = (
        pl.when(pl.col("tombstone")).then(None)
        .when(~pl.col("json")).then(pl.lit("invalid JSON: not a Debezium envelope"))
        .when(~pl.col("op").is_in(_OPS) | pl.col("op").is_null())
        .then(pl.format("unknown Debezium op {} (expected one of c, r, u, d)", shown))
        .when(pl.col("op").is_in(("c", "r", "u")) & pl.col("after").is_null())
        .then(pl.format("Debezium op '{}' without an 'after' image", shown))
        .when((pl.col("op") == "d") & pl.col("before").is_null())
        .then(pl.lit("Debezium op 'd' without a 'before' image"))
        .otherwise(None)
    )
    env = env.with_columns(reason.alias("reason"))
    utf8_bad = {i for i, _ in bad}
    letters = env.filter(pl.col("reason").is_not_null())
    bad.extend(
        (i, r) for i, r in zip(letters["i"].to_list(), letters["reason"].to_list(), strict=True)
        if i not in utf8_bad
    )
    ok = env.filter(pl.col("reason").is_null() & ~pl.col("tombstone"))
    op = pl.col("op")
    # one row per image: (record, order within the record, change type, image JSON)
    images = pl.concat([
        ok.filter((op == "u") & pl.col("before").is_not_null()).select(
            "i", pl.lit(0).alias("k"), pl.lit(UPDATE_PREIMAGE).alias(CHANGE_TYPE),
            pl.col("before").alias("image")),
        ok.filter(op.is_in(("c", "r", "u"))).select(
            "i", pl.lit(1).alias("k"),
            pl.when(op == "u").then(pl.lit(UPDATE_POSTIMAGE)).otherwise(pl.lit(INSERT))
            .alias(CHANGE_TYPE),
            pl.col("after").alias("image")),
        ok.filter(op == "d").select(
            "i", pl.lit(1).alias("k"), pl.lit(DELETE).alias(CHANGE_TYPE),
            pl.col("before").alias("image")),
    ]).sort("i", "k")
    record = images["i"].to_numpy()
    decoded = decode_values(
        images["image"].cast(pl.Binary).to_list(), format="json", schema=schema
    )
    rows = decoded.data.with_columns(images[CHANGE_TYPE].gather(decoded.good))
    good = record[decoded.good]
    if decoded.bad:
        failed = {int(record[j]): r for j, r in decoded.bad}
        bad.extend((i, f"Debezium image: {r}") for i, r in failed.items())
        keep = ~np.isin(good, np.fromiter(failed, dtype=np.int64, count=len(failed)))
        rows, good = rows.filter(pl.Series(keep)), good[keep]
    return Decoded(rows, good.astype(np.int64), sorted(bad))


def decode_upsert(
    keys: Sequence[bytes | None],
    values: Sequence[bytes | None],
    schema: pl.Schema,
    key_columns: Sequence[str],
) -> Decoded:
    """Upsert records to changelog rows: a value is an ``update_postimage`` of its
    row, a tombstone a ``delete`` of its key (key columns from the record key)."""
    value_col = pl.Series(values, dtype=pl.Binary)
    tomb = value_col.is_null().to_numpy()
    upsert_at = np.flatnonzero(~tomb)
    delete_at = np.flatnonzero(tomb)
    ups = decode_values(value_col.gather(upsert_at).to_list(), format="json", schema=schema)
    key_schema = pl.Schema({c: schema[c] for c in key_columns})
    key_col = pl.Series(keys, dtype=pl.Binary).gather(delete_at)
    dels = decode_values(key_col.to_list(), format="json", schema=key_schema)
    bad = [(int(upsert_at[j]), r) for j, r in ups.bad]
    bad.extend(
        (int(delete_at[j]), f"tombstone key: {r.replace('null value (tombstone)', 'no key')}")
        for j, r in dels.bad
    )
    deleted = dels.data.select(
        *(pl.col(c) if c in key_columns else pl.lit(None, dtype=t).alias(c)
          for c, t in schema.items())
    )
    rows = pl.concat([
        ups.data.with_columns(pl.lit(UPDATE_POSTIMAGE).alias(CHANGE_TYPE)),
        deleted.with_columns(pl.lit(DELETE).alias(CHANGE_TYPE)),
    ])
    good = np.concatenate([upsert_at[ups.good], delete_at[dels.good]]).astype(np.int64)
    order = np.argsort(good, kind="stable")
    return Decoded(rows[order], good[order], sorted(bad))
