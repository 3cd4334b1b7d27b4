"""Kafka topics as a replayable log (``mb.read_kafka``).

Offsets are Spark's: a JSON object ``{"topic:partition": next_offset}``,
recorded in the engine's write-ahead log. Batch N is the range
``[start[p], end[p])`` of every partition ``p``; a partition missing from an
offset is at 0 (where every Kafka partition begins), so partitions added to a
topic later are picked up from their beginning. Partitions are assigned
explicitly (``Consumer.assign``): there is no consumer-group rebalancing, and
the consumer group, when one is named (``commit_group``), only mirrors the
committed positions for lag tools.

A read returns exactly the recorded range, every time: messages are taken
per partition in offset order until the partition's end, and rows come out
ordered by (topic, partition, offset), whatever order the broker's fetches
arrived in. Control records and aborted transactional records (with the
default ``isolation.level=read_committed``) occupy offsets but carry no
data; a partition is complete when a message at or past ``end - 1`` arrived
or the consumer reached the end of the partition at or past ``end``.

Consecutive batches stream: when a read starts where the previous one of a
partition ended, the consumer keeps its position and prefetched messages
(messages fetched past ``end`` are kept for the next read); any other start
re-positions that partition.

Failure handling:

- Records no longer on the broker (retention, ``delete_records``): with
  ``on_data_loss="fail"`` (default) the batch fails with a
  :class:`~microbatch.exceptions.SourceError` naming each partition and the
  lost range; with ``"skip"`` the loss is logged, counted
  (:meth:`KafkaSource.metrics`) and the read goes on from the earliest
  offset still there.
- An unreachable broker (at start or restarted mid-run) is retried with
  exponential backoff for ``broker_timeout``; librdkafka reconnects by itself
  and a read resumes at the exact offset it needs, so nothing is lost or
  read twice. After ``broker_timeout`` without progress the batch fails and
  is retried from the write-ahead log on the next start.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import itertools
import logging
import operator
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from functools import partial
from typing import Any, Literal, TypeVar

import numpy as np
import polars as pl
from confluent_kafka import Message as _Message  # C-speed map(_Message.value, msgs)

from microbatch.durations import parse_duration_ms
from microbatch.exceptions import PlanError, SourceError
from microbatch.sources.base import (
    DEAD_LETTER_SCHEMA,
    ReadSplit,
    Source,
    SourceBatch,
    SourceContext,
    balanced_runs,
    check_batch_cap,
    empty_dead_letters,
)
from microbatch.sources.kafka_changelog import decode_debezium, decode_upsert
from microbatch.sources.kafka_chunks import Backlog, Chunk, Fields, concat, to_chunks
from microbatch.sources.kafka_decode import decode_values
from microbatch.types import DataLossMode, KafkaFormat, StartingOffsets
from sinks.changelog import CHANGE_TYPE
from sinks.kafka_client import check_config, client_config, redact

log = logging.getLogger("microbatch.sources.kafka")


METADATA_COLUMNS = ("key", "topic", "partition", "offset", "timestamp")
"""Record metadata columns added after the value's columns, by default all."""
METADATA_TYPES: dict[str, pl.DataType] = {
    "key": pl.Binary(),
    "topic": pl.String(),
    "partition": pl.Int32(),
    "offset": pl.Int64(),
    "timestamp": pl.Datetime("ms", "UTC"),
    "headers": pl.List(pl.Struct({"key": pl.String(), "value": pl.Binary()})),
}
CHANGELOG_FORMATS = ("debezium-json", "upsert")
"""Formats whose rows form a changelog (they carry ``_change_type``)."""
EARLIEST, LATEST = -2, -1
"""Spark's special per-partition starting offsets."""
CONSUMER_DEFAULTS: dict[str, Any] = {
    "isolation.level": "read_committed",
    "fetch.max.bytes": 64 * 1024 * 1024,
    "max.partition.fetch.bytes": 16 * 1024 * 1024,
    "queued.min.messages": 500_000,
    "fetch.wait.max.ms": 100,
}
"""Consumer settings used unless ``config`` overrides them: large fetches and a
deep prefetch queue (measured: 2-5x the throughput of librdkafka's defaults)."""
_RESERVED = ("bootstrap.servers", "enable.auto.commit", "enable.partition.eof",
             "auto.offset.reset", "group.id")
_CONSUME_MAX = 100_000
_POLL_S = 0.2
_T = TypeVar("_T")

Key = tuple[str, int]


def _key_str(key: Key) -> str:
    return f"{key[0]}:{key[1]}"


def _parse_key(text: str) -> Key:
    topic, _, part = text.rpartition(":")
    return topic, int(part)


class KafkaSource(Source):
    """One or more Kafka topics, read in exactly the recorded offset ranges.

    Parameters
    ----------
    topics
        A topic name or a list of names (explicit names; no patterns).
    bootstrap
        ``host:port[,host:port...]`` of the cluster.
    format
        ``"json"`` (one JSON object per value), ``"csv"`` (one header-less
        record per value, fields in schema order), ``"raw"`` (a ``value``
        column of bytes), or a changelog (rows carry ``_change_type``, see
        :mod:`microbatch.sources.kafka_changelog`): ``"debezium-json"``
        (Debezium envelopes) or ``"upsert"`` (key = key columns, value = row,
        tombstone = delete).
    schema
        Columns and types of the decoded value, or of the Debezium row images
        (required for every format but raw).
    key_columns
        ``format="upsert"`` only (and required there): the columns of the
        record key's JSON object, a tombstone's row.
    starting_offsets
        Where a new query starts: ``"earliest"`` (default), ``"latest"``, a
        timestamp in epoch milliseconds (the first record at or after it,
        per partition), or ``{partition: offset}`` (keys ``int`` for a single
        topic or ``"topic:partition"``; ``-2`` earliest, ``-1`` latest;
        partitions not named start at earliest). Only used when the
        checkpoint has no offsets yet.
    max_records_per_batch
        Cap on records (offsets) per batch, split across partitions in
        proportion to their backlog.
    config
        Extra librdkafka settings (SASL/SSL and the like) for every client;
        never shown: :meth:`describe` redacts secrets.
    on_data_loss
        ``"fail"`` or ``"skip"`` when recorded offsets are no longer on the
        broker (see the module docstring).
    commit_group
        After each committed batch, commit its end offsets to this consumer
        group so standard lag tools (``kafka-consumer-groups``) see the query.
        Informational only: the checkpoint, not the group, is the position.
    metadata_columns
        Which of ``key, topic, partition, offset, timestamp`` (and
        ``headers``, off by default) to add after the value's columns.
    broker_timeout
        How long an unreachable broker is retried before a batch fails.

    Guarantees: ``read(a, b)`` returns the records of exactly the offsets
    ``[a, b)`` of each partition, ordered by (topic, partition, offset), the
    same on every call while the records are on the broker; malformed values
    go to ``dead_letters`` (location ``topic:partition@offset``) and never
    stop the batch; ``SourceBatch.partitions`` gives each row's partition.
    """

    kind = "kafka"

    def __init__(
        self,
        topics: str | Sequence[str],
        *,
        bootstrap: str,
        format: KafkaFormat = "json",
        schema: pl.Schema | Mapping[str, Any] | None = None,
        starting_offsets: StartingOffsets = "earliest",
        max_records_per_batch: int | None = None,
        config: Mapping[str, Any] | None = None,
        on_data_loss: DataLossMode = "fail",
        commit_group: str | None = None,
        metadata_columns: str | Sequence[str] = METADATA_COLUMNS,
        broker_timeout: str | int = "2m",
        key_columns: str | Sequence[str] | None = None,
    ) -> None:
        self._options: dict[str, Any] = {
            "topics": topics, "bootstrap": bootstrap, "format": format, "schema": schema,
            "starting_offsets": starting_offsets,
            "max_records_per_batch": max_records_per_batch,
            "config": None if config is None else dict(config), "on_data_loss": on_data_loss,
            "metadata_columns": metadata_columns, "broker_timeout": broker_timeout,
            "key_columns": key_columns,
        }  # the arguments it was made with, for splits (no group: a split never commits)
        names = [topics] if isinstance(topics, str) else list(topics)
        if not names or not all(isinstance(t, str) and t and ":" not in t for t in names):
            raise PlanError(f"read_kafka: topics must be topic names, got {topics!r}")
        if len(set(names)) != len(names):
            raise PlanError(f"read_kafka: a topic is named twice in {names}")
        if not isinstance(bootstrap, str) or not bootstrap:
            raise PlanError("read_kafka: bootstrap='host:port' is required")
        if format not in ("json", "raw", "csv", "debezium-json", "upsert"):
            raise PlanError(
                "read_kafka: format must be 'json', 'csv', 'raw', 'debezium-json' or 'upsert', "
                f"got {format!r}"
            )
        if format != "raw" and schema is None:
            raise PlanError(
                f"read_kafka({names[0]!r}, format={format!r}) needs a schema: values carry no "
                "types. Pass schema={'col': pl.Int64, ...}, or format='raw' for bytes."
            )
        if on_data_loss not in ("fail", "skip"):
            raise PlanError(
                f"read_kafka: on_data_loss must be 'fail' or 'skip', got {on_data_loss!r}"
            )
        check_batch_cap(max_records_per_batch, option="max_records_per_batch", reader="read_kafka")
        try:
            self._config = check_config(config, reserved=_RESERVED)
        except ValueError as exc:
            raise PlanError(f"read_kafka: {exc}") from None
        self.topics: tuple[str, ...] = tuple(names)
        self.bootstrap = bootstrap
        self.format: KafkaFormat = format
        self.value_schema = pl.Schema(schema) if schema is not None else None
        self.metadata_columns = _check_metadata_columns(metadata_columns)
        if format in CHANGELOG_FORMATS and CHANGE_TYPE in (self.value_schema or ()):
            raise PlanError(
                f"read_kafka(format={format!r}) adds the column {CHANGE_TYPE!r} itself; "
                "leave it out of the schema"
            )
        taken = set(self.value_schema or ()) | ({"value"} if format == "raw" else set())
        clash = [c for c in self.metadata_columns if c in taken]
        if clash:
            raise PlanError(
                f"read_kafka: the value schema and the record metadata both have column(s) "
                f"{clash}; leave them out with metadata_columns=[...]"
            )
        self.key_columns = _check_key_columns(key_columns, format, self.value_schema)
        self.starting_offsets = _check_starting(starting_offsets, self.topics)
        self.on_data_loss: DataLossMode = on_data_loss
        self.max_records_per_batch, self.commit_group = max_records_per_batch, commit_group
        self.broker_timeout_s = parse_duration_ms(broker_timeout, what="broker_timeout") / 1000
        self._consumer: Any = None
        self._admin: Any = None
        self._committer: Any = None
        self._lock = threading.Lock()
        self._next: dict[Key, int] = {}
        """Per assigned partition: where the consumer's stream continues."""
        self._leftover: dict[Key, Backlog] = {}
        """Records fetched past the end of the last read, for the next one."""
        self._paused: set[Key] = set()
        """Assigned partitions paused because more than ``_leftover_limit`` of their
        messages wait in ``_leftover``: librdkafka stops prefetching them (and drops
        what it prefetched) until a read needs more than is held, so one partition's
        deep queue does not pile up in memory while a read waits for another's."""
        self._leftover_limit = max(20_000, 2 * (max_records_per_batch or 100_000))
        self._latest: dict[Key, int] = {}
        self._position: dict[Key, int] = {}
        self.lost_records = 0

    @functools.cached_property
    def _fields(self) -> Fields:
        """The record attributes a read keeps: what the metadata columns need."""
        return Fields(
            timestamps="timestamp" in self.metadata_columns,
            keys="key" in self.metadata_columns or self.format == "upsert",
            headers="headers" in self.metadata_columns,
        )

    # ------------------------------------------------------------------ identity

    def identity(self) -> dict[str, Any]:
        """The topics: a checkpoint's offsets mean nothing for other topics."""
        return {"kind": self.kind, "topics": sorted(self.topics)}

    def describe(self) -> dict[str, Any]:
        """Topics and options, the config with secrets redacted.

        Static: it is part of the plan's text and the job's fingerprint, so the
        changing numbers are in :meth:`lag` and :meth:`metrics`.
        """
        return {
            **self.identity(),
            "bootstrap": self.bootstrap,
            "format": self.format,
            "schema": {k: str(v) for k, v in (self.value_schema or {}).items()},
            **({"key_columns": list(self.key_columns)} if self.key_columns else {}),
            "starting_offsets": self.starting_offsets,
            "max_records_per_batch": self.max_records_per_batch,
            "on_data_loss": self.on_data_loss,
            "commit_group": self.commit_group,
            "config": redact(self._config),
        }

    def metrics(self) -> dict[str, Any]:
        """Runtime numbers: per-partition :meth:`lag`, its total, and records lost
        to retention that ``on_data_loss="skip"`` went past."""
        lag = self.lag()
        return {"lag": lag, "lag_total": sum(lag.values()), "lost_records": self.lost_records}

    @property
    def schema(self) -> pl.Schema:
        """Value columns (or ``value``), ``_change_type`` for a changelog format, then
        the chosen metadata columns."""
        cols: dict[str, pl.DataType] = (
            {"value": pl.Binary()} if self.format == "raw" else dict(self.value_schema or {})
        )
        if self.format in CHANGELOG_FORMATS:
            cols[CHANGE_TYPE] = pl.String()
        cols.update({c: METADATA_TYPES[c] for c in self.metadata_columns})
        return pl.Schema(cols)

    def lag(self) -> dict[str, int]:
        """Records behind the latest offset, per ``topic:partition``, as of the last plan.

        Measured from the end of the last committed batch (or the start, before
        the first) to the latest offset the last ``latest_offset`` call saw.
        """
        return {
            _key_str(k): max(0, hw - self._position.get(k, 0))
            for k, hw in sorted(self._latest.items())
        }

    # ------------------------------------------------------------------ lifecycle

    def _client_config(self) -> dict[str, Any]:
        return client_config(self._config, self.bootstrap)

    def open(self, ctx: SourceContext) -> None:
        """Create the consumer and admin clients (no broker contact yet)."""
        from confluent_kafka import Consumer
        from confluent_kafka.admin import AdminClient

        self.close()
        base = self._client_config()
        self._admin = AdminClient(
            {k: v for k, v in base.items() if k not in CONSUMER_DEFAULTS and k != "isolation.level"}
        )
        self._consumer = Consumer({
            **CONSUMER_DEFAULTS, **base,
            "group.id": self.commit_group or f"microbatch-reader-{ctx.source_id}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "error",
        })

    def close(self) -> None:
        """Close the clients; the source can be opened again."""
        for client in (self._consumer, self._committer):
            if client is not None:
                try:
                    client.close()
                except Exception:  # closing must not hide the error that led here
                    log.debug("error closing a Kafka consumer", exc_info=True)
        self._consumer = self._committer = self._admin = None
        self._next.clear()
        self._leftover.clear()
        self._paused.clear()

    def _clients(self) -> tuple[Any, Any]:
        if self._consumer is None or self._admin is None:
            self.open(SourceContext("0", None))
        return self._consumer, self._admin

    # ------------------------------------------------------------------ offsets

    def initial_offset(self) -> dict[str, int]:
        """Resolve ``starting_offsets`` against the partitions that exist now."""
        keys = self._partitions()
        spec = self.starting_offsets
        wanted: dict[Key, int] = {}
        for key in keys:
            if isinstance(spec, dict):
                wanted[key] = spec.get(_key_str(key), EARLIEST)
            else:
                wanted[key] = {"earliest": EARLIEST, "latest": LATEST}.get(spec, spec)
        out: dict[Key, int] = {}
        need_latest = [k for k, v in wanted.items() if v == LATEST]
        if need_latest:
            out.update(self._list_offsets(need_latest, "latest"))
        need_earliest = [k for k, v in wanted.items() if v == EARLIEST]
        if need_earliest:
            out.update(self._list_offsets(need_earliest, "earliest"))
        by_time = {k: v for k, v in wanted.items() if v not in (EARLIEST, LATEST)}
        if isinstance(spec, int) and by_time:
            out.update(self._offsets_for_time(list(by_time), spec))
        elif by_time:
            out.update(by_time)
        self._position = dict(out)
        return _encode(out)

    def latest_offset(self, start: Any, *, capped: bool = True) -> dict[str, int]:
        """The latest offsets now (new partitions from 0), capped per batch."""
        begin = self._decode(start)
        keys = sorted(set(self._partitions()) | set(begin))
        hw = self._list_offsets(keys, "latest", missing_ok=True)
        self._latest = {k: v for k, v in hw.items() if v is not None}
        if not self._position:
            self._position = dict(begin)
        end: dict[Key, int] = {}
        went_back = []
        for key in keys:
            s = begin.get(key, 0)
            h = hw.get(key)
            if h is None:
                end[key] = s  # partition gone from the broker: nothing new to read
            elif h < s:
                went_back.append(f"{_key_str(key)} latest {h} < recorded {s}")
                end[key] = s
            else:
                end[key] = h
        if went_back:
            self._data_loss(
                "the latest offsets are behind the checkpoint's (was the topic deleted and "
                "re-created?): " + "; ".join(went_back),
                records=0,
            )
        if capped and self.max_records_per_batch is not None:
            end = _cap(begin, end, self.max_records_per_batch)
        return _encode(end)

    def compare(self, a: Any, b: Any) -> int:
        """0 when equal, -1 when ``a`` is at or before ``b`` in every partition, else 1."""
        x, y = self._decode(a), self._decode(b)
        keys = set(x) | set(y)
        diffs = [x.get(k, 0) - y.get(k, 0) for k in keys]
        if not any(diffs):
            return 0
        return -1 if all(d <= 0 for d in diffs) else 1

    def bound(self, end: Any, limit: Any) -> dict[str, int]:
        """Per partition the smaller offset (a partition missing from ``limit`` is at 0)."""
        e, lim = self._decode(end), self._decode(limit)
        return _encode({k: min(v, lim.get(k, 0)) for k, v in e.items()})

    # ------------------------------------------------------------------ reading

    def read(self, start: Any, end: Any) -> SourceBatch:
        """Exactly the records at offsets ``[start[p], end[p])`` of each partition."""
        begin, stop = self._decode(start), self._decode(end)
        ranges = {k: (begin.get(k, 0), e) for k, e in stop.items() if e > begin.get(k, 0)}
        with self._lock, _no_cyclic_gc():
            per_part = self._fetch(ranges)
            return self._build(per_part)

    def read_splits(self, start: Any, end: Any, pieces: int) -> list[ReadSplit] | None:
        """The partitions with records in ``[start, end)``, in (topic, partition)
        order, as ``pieces`` contiguous runs of about equal record counts
        (:class:`KafkaSplit`). A read's rows are ordered by (topic, partition,
        offset), so the runs read one after the other are the range's rows in
        the same order, with the same decoding and dead letters."""
        begin, stop = self._decode(start), self._decode(end)
        ranges = sorted((k, begin.get(k, 0), e) for k, e in stop.items() if e > begin.get(k, 0))
        return [
            KafkaSplit(self._options, tuple(ranges[lo:hi]))
            for lo, hi in balanced_runs([e - b for _, b, e in ranges], pieces)
        ]

    def read_run(self, ranges: Sequence[tuple[Key, int, int]]) -> SourceBatch:
        """The records of ``(partition, start, end)`` ranges, as :meth:`read` gives them."""
        if not ranges:
            with _no_cyclic_gc():
                return self._build({})
        return self.read(_encode({k: b for k, b, _ in ranges}),
                         _encode({k: e for k, _, e in ranges}))

    def _fetch(self, ranges: dict[Key, tuple[int, int]]) -> dict[Key, list[Chunk]]:
        """Consume each range; records per partition, in offset order."""
        consumer, _ = self._clients()
        stale = {k: s for k, (s, _) in ranges.items() if self._next.get(k) != s}
        if stale:
            self._reposition(consumer, stale)
        self._resume(consumer, [k for k, (_, e) in ranges.items() if k in self._paused
                                and not self._covers(k, e)])
        read = _RangeRead(self, consumer, ranges)
        for key in ranges:
            held = self._leftover.pop(key, None)
            if held is not None:
                for chunk in held:
                    read.take(key, chunk)
                if held.eof is not None:
                    read.at_end(key, held.eof)
        read.run()
        for key, (_, e) in ranges.items():
            self._next[key] = max(e, read.resumed.get(key, e))
        return read.got

    def _reposition(self, consumer: Any, starts: dict[Key, int]) -> None:
        """(Re)assign partitions at ``starts``, dropping their prefetched messages."""
        from confluent_kafka import TopicPartition

        assigned = {(tp.topic, tp.partition) for tp in consumer.assignment()}
        # NOTE: librdkafka keeps a partition paused across unassign + assign: without
        # this resume a repositioned paused partition never delivers again
        paused = [TopicPartition(k[0], k[1]) for k in starts if k in assigned and k in self._paused]
        if paused:
            consumer.resume(paused)
        again = [TopicPartition(k[0], k[1]) for k in starts if k in assigned]
        if again:
            consumer.incremental_unassign(again)
        for key in starts:
            self._leftover.pop(key, None)
            self._paused.discard(key)
        consumer.incremental_assign([TopicPartition(k[0], k[1], s) for k, s in starts.items()])
        self._next.update(starts)

    def _pause(self, consumer: Any, keys: Sequence[Key]) -> None:
        """Stop fetching ``keys`` (assigned partitions) until :meth:`_resume`; the consumer
        continues after the last message it delivered."""
        from confluent_kafka import TopicPartition

        if keys:
            consumer.pause([TopicPartition(k[0], k[1]) for k in keys])
            self._paused.update(keys)

    def _covers(self, key: Key, end: int) -> bool:
        """Do the records held for ``key`` reach ``end``?"""
        held = self._leftover.get(key)
        return held is not None and len(held) > 0 and held.last >= end - 1

    def _resume(self, consumer: Any, keys: Sequence[Key]) -> None:
        from confluent_kafka import TopicPartition

        if keys:
            consumer.resume([TopicPartition(k[0], k[1]) for k in keys])
            self._paused.difference_update(keys)

    def _out_of_range(self, key: Key, at: int, rng: tuple[int, int]) -> int:
        """The consumer's next offset ``at`` of ``key`` is not on the broker.

        Returns where to go on: ``at`` again after a transient error, or (with
        ``on_data_loss="skip"``) the earliest offset still there.
        """
        s, e = rng
        low = int(self._list_offsets([key], "earliest")[key])
        if low <= at:
            return at
        self._data_loss(
            f"{_key_str(key)}: offsets [{at}, {min(low, e)}) of the batch's range [{s}, {e}) "
            f"are no longer on the broker (earliest is {low}; retention or delete_records)",
            records=min(low, e) - at,
        )
        return low

    def _data_loss(self, what: str, *, records: int) -> None:
        if self.on_data_loss == "fail":
            raise SourceError(
                f"kafka {','.join(self.topics)}: data loss: {what}. Set "
                "on_data_loss='skip' to go on without these records, or start the query "
                "on a new checkpoint."
            )
        self.lost_records += records
        log.warning("kafka %s: skipping lost records: %s", ",".join(self.topics), what)

    def _build(self, per_part: dict[Key, list[Chunk]]) -> SourceBatch:
        """Decode every value in one call; add metadata; dead letters for bad values."""
        order = sorted(per_part)
        counts = [sum(map(len, per_part[k])) for k in order]
        rec = concat([c for k in order for c in per_part[k]], self._fields)
        topics = np.repeat(np.array([k[0] for k in order], dtype=object), counts)
        parts = np.repeat(np.array([k[1] for k in order], dtype=np.int32), counts)
        values = rec.values
        keys: list[bytes | None] | None = rec.keys
        if self.format == "debezium-json":
            assert self.value_schema is not None
            decoded = decode_debezium(values, self.value_schema)
        elif self.format == "upsert":
            assert self.value_schema is not None
            assert keys is not None
            decoded = decode_upsert(keys, values, self.value_schema, self.key_columns)
        else:
            decoded = decode_values(values, format=self.format, schema=self.value_schema)
        good = decoded.good
        offsets = rec.offsets
        cols: list[pl.Series] = []
        for name in self.metadata_columns:
            if name == "key":
                cols.append(pl.Series("key", keys, dtype=pl.Binary)[good])
            elif name == "topic":
                cols.append(pl.Series("topic", topics[good].tolist(), dtype=pl.String))
            elif name == "partition":
                cols.append(pl.Series("partition", parts[good], dtype=pl.Int32))
            elif name == "offset":
                cols.append(pl.Series("offset", offsets[good], dtype=pl.Int64))
            elif name == "timestamp":
                assert rec.timestamps is not None
                cols.append(
                    pl.Series("timestamp", rec.timestamps[good]).cast(pl.Datetime("ms", "UTC"))
                )
            elif name == "headers":
                heads = [  # off by default: a Python loop per record
                    [{"key": hk, "value": hv} for hk, hv in (h or [])] for h in rec.headers or ()
                ]
                series = pl.Series("headers", heads, dtype=METADATA_TYPES["headers"])
                cols.append(series[good])
        data = decoded.data.with_columns(cols) if cols else decoded.data
        if len(self.topics) == 1:
            partition_ids = pl.Series("partition", parts[good], dtype=pl.Int32)
        else:
            partition_ids = pl.Series(
                "partition", [f"{t}:{p}" for t, p in zip(topics[good], parts[good], strict=True)],
                dtype=pl.String,  # NOTE: typed when empty too (an empty split's rows)
            )
        letters = empty_dead_letters()
        if decoded.bad:
            idx = [i for i, _ in decoded.bad]
            letters = pl.DataFrame(
                {
                    "source": f"kafka:{','.join(self.topics)}",
                    "location": [f"{topics[i]}:{parts[i]}@{offsets[i]}" for i in idx],
                    "reason": [r for _, r in decoded.bad],
                    "raw": [values[i] or b"" for i in idx],
                },
                schema=DEAD_LETTER_SCHEMA,
            )
        return SourceBatch(data=data, dead_letters=letters, partitions=partition_ids)

    # ------------------------------------------------------------------ commit

    def commit(self, end: Any) -> None:
        """Remember the committed position (lag); mirror it to ``commit_group``.

        A failed group commit is logged, never raised: the checkpoint is the
        position of record, the group is for lag tools only.
        """
        stop = self._decode(end)
        self._position = dict(stop)
        if not self.commit_group:
            return
        from confluent_kafka import Consumer, TopicPartition

        try:
            if self._committer is None:
                self._committer = Consumer({
                    **self._client_config(), "group.id": self.commit_group,
                    "enable.auto.commit": False,
                })
            self._committer.commit(
                offsets=[TopicPartition(k[0], k[1], o) for k, o in sorted(stop.items())],
                asynchronous=False,
            )
        except Exception as exc:
            log.warning("kafka: could not commit offsets to group %r: %s", self.commit_group, exc)

    # ------------------------------------------------------------------ broker calls

    def _retry(self, what: str, call: Callable[[], _T]) -> _T:
        """``call()`` until it succeeds or ``broker_timeout`` passed (backoff 0.2 s .. 5 s)."""
        from confluent_kafka import KafkaException

        deadline = time.monotonic() + self.broker_timeout_s
        delay = 0.2
        while True:
            try:
                return call()
            except KafkaException as exc:
                err = exc.args[0] if exc.args else exc
                fatal = getattr(err, "fatal", lambda: False)()
                if fatal or time.monotonic() + delay > deadline:
                    raise SourceError(
                        f"kafka {','.join(self.topics)} at {self.bootstrap}: {what} failed "
                        f"({err}); gave up after {self.broker_timeout_s:.0f}s. Check that the "
                        "broker is up and reachable."
                    ) from None
                log.warning("kafka: %s failed (%s); retrying in %.1fs", what, err, delay)
                time.sleep(delay)
                delay = min(delay * 2, 5.0)

    def _partitions(self) -> list[Key]:
        """Every partition of the topics now (a missing topic has none yet)."""
        from confluent_kafka import KafkaError

        _, admin = self._clients()
        keys: list[Key] = []
        for topic in self.topics:
            meta = self._retry(
                f"metadata of {topic!r}", partial(admin.list_topics, topic=topic, timeout=10)
            )
            info = meta.topics.get(topic)
            if info is None:
                continue
            if info.error is not None:
                if info.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                    continue
                if info.error.code() != KafkaError.LEADER_NOT_AVAILABLE:
                    raise SourceError(f"kafka: metadata of topic {topic!r}: {info.error}")
            keys.extend((topic, p) for p in info.partitions)
        return sorted(keys)

    def _list_offsets(
        self, keys: Sequence[Key], which: Literal["earliest", "latest"], *, missing_ok: bool = False
    ) -> dict[Key, Any]:
        """Earliest or latest (last stable, under read_committed) offset per partition."""
        if not keys:
            return {}
        from confluent_kafka import IsolationLevel, KafkaError, KafkaException, TopicPartition
        from confluent_kafka.admin import OffsetSpec

        _, admin = self._clients()
        # NOTE: OffsetSpec's factory methods carry no annotations in confluent-kafka
        spec = OffsetSpec.latest() if which == "latest" else OffsetSpec.earliest()  # type: ignore[no-untyped-call]
        level = (IsolationLevel.READ_UNCOMMITTED
                 if self._isolation() == "read_uncommitted" else IsolationLevel.READ_COMMITTED)

        def call() -> dict[Key, Any]:
            futures = admin.list_offsets(
                {TopicPartition(t, p): spec for t, p in keys}, isolation_level=level,
                request_timeout=10,
            )
            out: dict[Key, Any] = {}
            for tp, fut in futures.items():
                try:
                    out[(tp.topic, tp.partition)] = fut.result().offset
                except KafkaException as exc:
                    err = exc.args[0]
                    if missing_ok and err.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                        out[(tp.topic, tp.partition)] = None
                    else:
                        raise
            return out

        return self._retry(f"{which} offsets", call)

    def _offsets_for_time(self, keys: Sequence[Key], ts_ms: int) -> dict[Key, int]:
        """The first offset at or after ``ts_ms`` per partition (latest if none)."""
        from confluent_kafka import TopicPartition

        consumer, _ = self._clients()
        found = self._retry(
            "offsets for timestamp",
            lambda: consumer.offsets_for_times(
                [TopicPartition(t, p, ts_ms) for t, p in keys], timeout=10
            ),
        )
        latest = self._list_offsets(keys, "latest")
        out: dict[Key, int] = {}
        for tp in found:
            key = (tp.topic, tp.partition)
            out[key] = tp.offset if tp.offset >= 0 else latest[key]
        return out

    def _isolation(self) -> str:
        return str(self._config.get("isolation.level", CONSUMER_DEFAULTS["isolation.level"]))

    def _decode(self, offset: Any) -> dict[Key, int]:
        if not isinstance(offset, dict) or not all(
            isinstance(k, str) and ":" in k and isinstance(v, int) and not isinstance(v, bool)
            for k, v in offset.items()
        ):
            raise SourceError(
                f"kafka: {offset!r} is not a Kafka offset ({{'topic:partition': offset}}); "
                "was the checkpoint written by another kind of source?"
            )
        return {_parse_key(k): v for k, v in offset.items()}


class KafkaSplit(ReadSplit):
    """Some partitions' offset ranges of a batch, read where the split is sent.

    Carries the source's options (bootstrap servers, topics, format, schema,
    client config) and ``(topic, partition, start, end)`` per partition; the
    worker reads them with its own consumer (``assign`` at the recorded
    offsets, ``read_committed`` as configured: transaction markers and
    aborted records take offsets but give no rows, as on the driver). The
    consumer is kept per process for the next batch, so consecutive batches
    of a partition stream from where the last one ended.
    """

    def __init__(self, options: dict[str, Any], ranges: tuple[tuple[Key, int, int], ...]) -> None:
        self.options = options
        self.ranges = ranges

    def read(self) -> SourceBatch:
        return _split_reader(self.options).read_run(self.ranges)

    @property
    def records(self) -> int:
        """Offsets in the split's ranges (records, markers and aborted records)."""
        return sum(e - b for _, b, e in self.ranges)

    def __repr__(self) -> str:
        parts = ", ".join(f"{_key_str(k)}[{b}, {e})" for k, b, e in self.ranges)
        return f"KafkaSplit({parts})"


_READERS: dict[str, KafkaSource] = {}
_READERS_LOCK = threading.Lock()


def _split_reader(options: dict[str, Any]) -> KafkaSource:
    """This process's source for splits of a query's Kafka source (one consumer,
    kept for the next batch; the process is a worker of one query)."""
    key = repr(sorted(options.items(), key=operator.itemgetter(0)))
    with _READERS_LOCK:
        reader = _READERS.get(key)
        if reader is None:
            reader = _READERS[key] = KafkaSource(**options)
        return reader


class _RangeRead:
    """The state of one :meth:`KafkaSource.read`: what arrived, what is still pending."""

    def __init__(
        self, source: KafkaSource, consumer: Any, ranges: dict[Key, tuple[int, int]]
    ) -> None:
        self.source = source
        self.consumer = consumer
        self.ranges = ranges
        self.got: dict[Key, list[Chunk]] = {k: [] for k in ranges}
        self.pending: dict[Key, int] = {k: e for k, (_, e) in ranges.items()}
        self.resumed: dict[Key, int] = {}
        """Partitions whose stream was moved past a lost range (``skip``)."""
        self.last_error = ""

    def position(self, key: Key) -> int:
        """The next offset of ``key`` this read waits for."""
        got = self.got[key]
        return got[-1].last + 1 if got else self.resumed.get(key, self.ranges[key][0])

    def take(self, key: Key, chunk: Chunk) -> None:
        """Keep ``chunk`` (one partition) up to the end; the rest is left over."""
        leftover = self.source._leftover
        end = self.pending.get(key)
        if end is None:  # not wanted by this read, or already complete
            _hold(leftover, key, chunk)
            return
        head, tail = chunk.split(end)
        if head is not None:
            self.got[key].append(head)
        if tail is not None:
            _hold(leftover, key, tail)
            del self.pending[key]
        elif chunk.last >= end - 1:
            del self.pending[key]

    def run(self) -> None:
        """Consume until every partition reached its end (or fail after the timeout)."""
        progress_at = time.monotonic()
        consume = self.consumer.consume
        while self.pending:
            # NOTE: first take what the consumer already holds, without waiting, in
            # one large call: asking only for what this read still needs (``want``)
            # made thousands of tiny calls when another partition's prefetched
            # messages (kept for the next read) filled the queue ahead of them
            msgs = consume(_CONSUME_MAX, timeout=0)
            if not msgs:  # nothing held: wait for at most what this read needs
                want = sum(e - self.position(k) for k, e in self.pending.items())
                msgs = consume(max(1, min(want, _CONSUME_MAX)), timeout=_POLL_S)
            if not msgs:
                if time.monotonic() - progress_at > self.source.broker_timeout_s:
                    self.stalled()
                continue
            progress_at = time.monotonic()
            events: list[tuple[Any, Any]] = []
            # NOTE: not errors.count(None): KafkaError.__eq__(None) leaves a TypeError set;
            # a KafkaError is always true (no __bool__ or __len__), so any() is one C pass
            if any(map(_Message.error, msgs)):  # events: rare, so no loop over the data
                msgs, events = _split_events(msgs)
            for key, chunk in to_chunks(msgs, self.source._fields,
                                        multi_topic=len(self.source.topics) > 1):
                self.take(key, chunk)
            del msgs  # NOTE: the Message objects go now, before the next consume()
            # NOTE: events after the data: a partition's end-of-partition event follows
            # its messages in the queue, often in the same consume() result
            for m, err in events:
                self.on_error(m, err)
            self.pause_complete()
        self.pause_complete()

    def pause_complete(self) -> None:
        """Pause the partitions this read needs nothing more of that hold more than
        ``_leftover_limit`` (two batches) of messages for later reads: bounds the
        memory while the read waits for a slower partition, without re-fetching in the
        steady state, where a partition is paused rarely."""
        source = self.source
        limit = source._leftover_limit
        full = [k for k, held in source._leftover.items()
                if len(held) > limit and k not in self.pending and k not in source._paused]
        source._pause(self.consumer, full)

    def at_end(self, key: Key, offset: int) -> None:
        """The consumer reached the end of ``key`` at ``offset``: every record below it
        was delivered. A read waiting for no more than that is complete.

        NOTE: librdkafka reports an end once, until new records arrive; an end seen
        while no read waited for ``key`` is kept with its held records, or a later
        read of a range ending in a transaction marker (no record to wait for) would
        wait for an end that never comes again.
        """
        end = self.pending.get(key)
        if end is not None:
            if offset >= end:
                del self.pending[key]
            return
        leftover = self.source._leftover
        held = leftover.get(key)
        if held is None:
            held = leftover[key] = Backlog()
        held.eof = offset if held.eof is None else max(held.eof, offset)

    def on_error(self, m: Any, err: Any) -> None:
        """An event from the consumer: end of partition, lost offsets, or a broker error."""
        from confluent_kafka import KafkaError

        key = (m.topic(), m.partition())
        code = err.code()
        if code == KafkaError._PARTITION_EOF:
            self.at_end(key, m.offset())
        elif code in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE):
            if key not in self.pending:
                self.source._next.pop(key, None)  # re-positioned when next needed
                return
            at = self.position(key)
            moved = self.source._out_of_range(key, at, self.ranges[key])
            self.source._reposition(self.consumer, {key: moved})
            if moved > at:
                self.resumed[key] = moved
            if moved >= self.pending[key]:
                del self.pending[key]
        elif err.fatal():
            raise SourceError(f"kafka {','.join(self.source.topics)}: fatal error {err}")
        else:
            self.last_error = str(err)
            log.warning("kafka %s: %s (retrying)", _key_str(key), err)

    def stalled(self) -> None:
        """No message for ``broker_timeout``: fail the batch, saying where it stood."""
        where = ", ".join(
            f"{_key_str(k)} at {self.position(k)} of [{self.ranges[k][0]}, {e})"
            for k, e in self.pending.items()
        )
        last = f" (last error: {self.last_error})" if self.last_error else ""
        raise SourceError(
            f"kafka {','.join(self.source.topics)}: no records for "
            f"{self.source.broker_timeout_s:.0f}s while reading {where}{last}; is the broker "
            "up? The batch will be re-read from its recorded range on restart."
        )


@contextlib.contextmanager
def _no_cyclic_gc() -> Iterator[None]:
    """Pause the cyclic garbage collector while a batch's messages are alive.

    A batch holds up to millions of ``Message`` objects (no reference cycles);
    with the collector on, each allocation burst triggers full collections
    that traverse all of them: measured, 2x the time of the whole read.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _hold(leftover: dict[Key, Backlog], key: Key, chunk: Chunk) -> None:
    """Keep ``chunk`` of partition ``key`` for a later read."""
    held = leftover.get(key)
    if held is None:
        held = leftover[key] = Backlog()
    held.append(chunk)


def _split_events(msgs: list[Any]) -> tuple[list[Any], list[tuple[Any, Any]]]:
    """``consume()``'s result as its data messages and its events (message, error),
    each in order, with Python code per event only."""
    errors = list(map(_Message.error, msgs))
    at = np.flatnonzero(np.fromiter(map(operator.is_not, errors, itertools.repeat(None)),
                                    dtype=bool, count=len(msgs)))
    events = [(msgs[i], errors[i]) for i in at.tolist()]
    bounds = [-1, *at.tolist(), len(msgs)]
    data = list(itertools.chain.from_iterable(
        msgs[a + 1:b] for a, b in itertools.pairwise(bounds)))
    return data, events


def _cap(begin: dict[Key, int], end: dict[Key, int], cap: int) -> dict[Key, int]:
    """Cap the batch at ``cap`` offsets, split across partitions by backlog.

    Largest-remainder apportionment, ties by partition: deterministic for the
    same offsets.
    """
    backlog = {k: e - begin.get(k, 0) for k, e in end.items()}
    total = sum(backlog.values())
    if total <= cap:
        return end
    share = {k: cap * b // total for k, b in backlog.items()}
    rest = cap - sum(share.values())
    order = sorted(backlog, key=lambda k: (-((cap * backlog[k]) % total), k))
    for k in order[:rest]:
        share[k] += 1
    return {k: begin.get(k, 0) + share[k] for k in end}


def _encode(offsets: dict[Key, int]) -> dict[str, int]:
    return {_key_str(k): int(v) for k, v in sorted(offsets.items())}


def _check_key_columns(
    columns: str | Sequence[str] | None, format: str, schema: pl.Schema | None
) -> tuple[str, ...]:
    """``key_columns`` as a tuple: required by, and only allowed with, ``format="upsert"``."""
    names = () if columns is None else (columns,) if isinstance(columns, str) else tuple(columns)
    if format != "upsert":
        if names:
            raise PlanError(
                f"read_kafka: key_columns is for format='upsert' (the record key's columns); "
                f"format={format!r} takes none"
            )
        return names
    if not names:
        raise PlanError(
            "read_kafka(format='upsert') needs key_columns=[...]: the columns of the record "
            "key's JSON object, which a tombstone (a delete) carries"
        )
    missing = [c for c in names if c not in (schema or {})]
    if missing or len(set(names)) != len(names):
        raise PlanError(
            f"read_kafka: key_columns {list(names)} must be distinct columns of the schema "
            f"{list(schema or {})}; {missing} are not"
        )
    return names


def _check_metadata_columns(columns: str | Sequence[str]) -> tuple[str, ...]:
    """``metadata_columns`` as a tuple (a string is one column name)."""
    names = (columns,) if isinstance(columns, str) else tuple(columns)
    unknown = [c for c in names if c not in METADATA_TYPES]
    if unknown:
        raise PlanError(
            f"read_kafka: unknown metadata column(s) {unknown}; choose from "
            f"{list(METADATA_TYPES)}"
        )
    return names


def _check_starting(spec: Any, topics: tuple[str, ...]) -> Any:
    """Validate ``starting_offsets``; dicts become ``{"topic:partition": offset}``."""
    if spec in ("earliest", "latest"):
        return spec
    if isinstance(spec, int) and not isinstance(spec, bool):
        if spec < 0:
            raise PlanError(f"read_kafka: a starting timestamp must be >= 0 ms, got {spec}")
        return spec
    if isinstance(spec, Mapping):
        out: dict[str, int] = {}
        for key, value in spec.items():
            if isinstance(key, int) and not isinstance(key, bool):
                if len(topics) != 1:
                    raise PlanError(
                        "read_kafka: with several topics name partitions as 'topic:partition' "
                        f"in starting_offsets, got {key!r}"
                    )
                name = f"{topics[0]}:{key}"
            elif isinstance(key, str) and ":" in key and key.rpartition(":")[0] in topics:
                name = key
            else:
                raise PlanError(f"read_kafka: starting_offsets key {key!r} names no partition "
                                f"of {list(topics)}")
            if isinstance(value, bool) or not isinstance(value, int) or value < EARLIEST:
                raise PlanError(f"read_kafka: starting offset {value!r} of {name} must be an "
                                "offset >= 0, -2 (earliest) or -1 (latest)")
            out[name] = value
        return dict(sorted(out.items()))
    raise PlanError(
        "read_kafka: starting_offsets must be 'earliest', 'latest', a timestamp in epoch ms "
        f"or {{partition: offset}}, got {spec!r}"
    )
