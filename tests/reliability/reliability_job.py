"""The job the reliability harness kills and restarts (a job file for ``microbatch run``).

A windowed aggregation with state, end to end::

    generator, JSON-lines files or a Kafka topic of JSON values
        -> with_watermark("event_time", delay)
        -> group_by(window(event_time, W) | session_window(event_time, gap), card_id)
        -> agg(n = len(), total = sum(amount as Decimal(18, 2)))
        [-> fire_once(n >= FIRE_AT): early alerts, once per window]
        -> Parquet manifest sink, Delta sink, Iceberg sink (SQLite catalog), Kafka
           sink (transactional, exactly once) or webhook sink (one POST per row, Idempotency-Key
           ``<window_start>/<card_id>``); late rows -> Parquet side output

Params (all strings): ``output`` (required); ``source`` (``generator`` |
``files`` | ``kafka``), ``input`` (the directory, for ``files``), ``agg``
(``tumbling`` | ``session`` | ``fire_once``), ``sink`` (``parquet`` | ``delta``
| ``iceberg`` | ``kafka`` | ``webhook``), ``window`` (``1m``), ``gap`` (``30s``), ``delay``
(``10s``), ``rows``, ``cap`` (records or files per batch), ``seed``, ``cards``,
``partitions``; for Kafka ``bootstrap`` and ``topic`` (the job reads
``<topic>-in`` and writes ``<topic>-out``); for the webhook ``url``.

Test-only hooks, read from the environment (they wrap statestore functions in
this process; statestore itself is not changed):

``RELIABILITY_STATE_FAULT=WHEN:KIND:VERSION``
    SIGKILL this process ``before`` or ``after`` the first state file of
    ``KIND`` (``changelog`` | ``snapshot``) for a state version ``>= VERSION``
    is written (version N+1 is batch N's commit; a session window writes two
    stores per commit, so ``after`` lands between them); ``torn`` leaves a
    partial file under the statestore's temp name first, as a crash in the
    middle of the write does.
``RELIABILITY_SNAPSHOT_EVERY=K`` / ``RELIABILITY_STATE_RETENTION=R``
    snapshot at least every K versions and keep only R versions, so that
    crashes also land around snapshots and purges.
``RELIABILITY_ENOSPC=KIND:VERSION``
    raise ``OSError(ENOSPC)`` instead of writing that state file (a full disk).
"""

from __future__ import annotations

import errno
import os
import signal
from collections.abc import Callable, Mapping
from typing import Any

import polars as pl

import microbatch as mb
from sinks.parquet import ParquetSink

START = "2026-01-01T00:00:00+00:00"
"""Fixed event-time origin of the generator: the output never depends on when it runs."""

SCHEMA = {
    "event_id": pl.Int64,
    "card_id": pl.Int64,
    "amount": pl.Decimal(18, 2),
    "event_time": pl.Datetime("ms", "UTC"),
}
"""Columns of the JSON-lines input of the ``files`` source."""
MONEY = pl.Decimal(18, 2)
FIRE_AT = 3
"""``agg=fire_once``: a window fires when it holds this many rows."""
ICEBERG_TABLE = "rel.out"
"""``sink=iceberg``: the table, in a SQLite catalog under the output directory."""


def iceberg_catalog(output: str) -> str:
    """``sink=iceberg``: the catalog (its warehouse beside it, under ``output``)."""
    return f"sqlite:///{os.path.abspath(output)}/catalog.db"


def build(params: dict[str, str]) -> mb.DataStreamWriter:
    """The windowed aggregation described in the module docstring."""
    install_state_hooks(os.environ)
    cap = int(params.get("cap", "2000"))
    source = params.get("source", "generator")
    if source == "files":
        stream = mb.read_files(params["input"], format="json", schema=SCHEMA,
                               max_files_per_batch=cap)
    elif source == "kafka":
        # watermarks per Kafka partition; bad values go to the dead letters
        stream = mb.read_kafka(params["topic"] + "-in", bootstrap=params["bootstrap"],
                               schema=SCHEMA, max_records_per_batch=cap,
                               metadata_columns=())
    else:
        stream = mb.generate(
            rows_per_second=None,
            total_rows=int(params.get("rows", "60000")),
            cards=int(params.get("cards", "200")),
            partitions=int(params.get("partitions", "2")),
            max_delay="5s",
            seed=int(params.get("seed", "1")),
            start=START,
            max_records_per_batch=cap,
        )
    if params.get("agg", "tumbling") == "session":
        by: Any = mb.session_window("event_time", gap=params.get("gap", "30s"))
    else:
        by = mb.window("event_time", params.get("window", "1m"))
    # money as decimal: sums are exact whatever the batch split (float sums are not)
    stream = stream.with_columns(pl.col("amount").cast(MONEY))
    result = (
        stream.with_watermark("event_time", params.get("delay", "10s"))
        .group_by(by, "card_id")
        .agg(pl.len().alias("n"), pl.col("amount").sum().alias("total"))
        .on_late(ParquetSink(params["output"] + "-late"))
    )
    if params.get("agg") == "fire_once":
        result = result.fire_once(pl.col("n") >= FIRE_AT)
    sink = params.get("sink", "parquet")
    if sink == "delta":
        return result.write_delta(params["output"])
    if sink == "iceberg":
        return result.write_iceberg(ICEBERG_TABLE, catalog=iceberg_catalog(params["output"]))
    if sink == "kafka":
        return result.write_kafka(params["topic"] + "-out", bootstrap=params["bootstrap"],
                                  key="card_id")
    if sink == "webhook":
        key = pl.format("{}/{}", pl.col("window_start").dt.strftime("%Y-%m-%dT%H:%M:%S"),
                        "card_id")
        return result.with_columns(key.alias("key")).write_webhook(
            params["url"], key="key", max_in_flight=8, retry_for="2m", backoff=("20ms", "500ms"))
    return result.write_parquet(params["output"])


# ------------------------------------------------------------------ test-only hooks


def install_state_hooks(env: Mapping[str, str]) -> None:
    """Wrap the statestore's file writer and provider defaults as ``env`` asks."""
    fault, enospc = env.get("RELIABILITY_STATE_FAULT"), env.get("RELIABILITY_ENOSPC")
    every, keep = env.get("RELIABILITY_SNAPSHOT_EVERY"), env.get("RELIABILITY_STATE_RETENTION")
    if not (fault or enospc or every or keep):
        return
    from statestore import provider

    if every or keep:
        _set_provider_defaults(provider, every, keep)
    if fault or enospc:
        provider.write_arrow = _faulty_writer(provider.write_arrow, fault, enospc)  # type: ignore[attr-defined]


def _set_provider_defaults(module: Any, every: str | None, keep: str | None) -> None:
    cls = module.StateStoreProvider
    original = cls.__init__

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        if every:
            kwargs.setdefault("max_changelog_chain", int(every))
        if keep:
            kwargs.setdefault("retention_versions", int(keep))
        original(self, *args, **kwargs)

    cls.__init__ = init


def _faulty_writer(
    write: Callable[..., int], fault: str | None, enospc: str | None
) -> Callable[..., int]:
    when, want_kind, want_version = _parse_fault(fault) if fault else ("", "", -1)
    full_kind, _, full_version = (enospc or "::").partition(":")

    def writer(path: Any, frame: pl.DataFrame, *, kind: str, version: int, **kw: Any) -> int:
        if enospc and kind == full_kind and str(version) == full_version:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        hit = fault is not None and kind == want_kind and version >= want_version
        if hit and when == "before":
            os.kill(os.getpid(), signal.SIGKILL)
        if hit and when == "torn":
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            tmp.write_bytes(b"ARROW1\x00\x00" + b"\x00" * 64)
            os.kill(os.getpid(), signal.SIGKILL)
        written = write(path, frame, kind=kind, version=version, **kw)
        if hit and when == "after":
            os.kill(os.getpid(), signal.SIGKILL)
        return written

    return writer


def _parse_fault(spec: str) -> tuple[str, str, int]:
    parts = spec.split(":")
    if len(parts) != 3 or parts[0] not in ("before", "after", "torn"):
        raise mb.JobError(f"RELIABILITY_STATE_FAULT={spec!r}: use WHEN:KIND:VERSION")
    return parts[0], parts[1], int(parts[2])
