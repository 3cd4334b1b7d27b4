"""A Kafka topic as a sink: one transaction per batch (exactly once), or headers to dedupe.

``delivery_guarantee="exactly_once"`` (default) gives exactly-once *effect* for consumers
reading with ``isolation.level=read_committed``. Protocol for batch ``N``
(NOTE: the order is what makes it exactly-once):

1. ``open``: ``init_transactions()`` with ``transactional.id =
   microbatch-<query_id>-<topic>``: fences any older producer of this query
   (a zombie of a killed run) and aborts its open transaction.
2. Read the committed offset of consumer group ``microbatch-sink-<query_id>-<topic>``
   on the bookkeeping partition ``<commit_topic>:0``. It holds ``last + 1``
   where ``last`` is the last batch whose transaction committed. If
   ``N <= last``: batch ``N`` is already in the topic, return.
3. ``begin_transaction()``; produce every row; flush.
4. ``ctx.at("sink.after_data", N)``.
5. ``send_offsets_to_transaction(<commit_topic>:0 -> N + 1, metadata = {"batch_id": N, ...})``
   then ``commit_transaction()``: the rows and the batch marker become
   visible atomically, or neither does.
6. ``ctx.at("sink.after_commit", N)``.

A crash anywhere before 5 leaves an open transaction that step 1 of the next
run aborts; a crash after 5 leaves a marker that step 2 reads, so the replay
is a no-op. Any delivery failure fails the transaction and so the batch
(retried from the write-ahead log on restart); nothing is dropped.

``delivery_guarantee="at_least_once"``: no transactions; each record carries the headers
``mb_query_id``, ``mb_batch_id`` and ``mb_row`` (its row number in the
batch), so a consumer can drop the duplicates a replay may write. Every
delivery is confirmed (``flush`` and delivery reports) before ``add_batch``
returns; an error fails the batch.

Values are serialized for the whole batch in one call (``write_ndjson`` then
split into lines), never one ``json.dumps`` per row.

Changes (:mod:`sinks.changelog`) with ``format="json"`` (or ``"raw"``): the
record key is ``key=`` when given, otherwise the query's key columns as one
JSON object (``{"k":1}``), so that the changes of a key stay on one partition,
in order.

- ``output_mode="update"`` with a batch carrying ``_change_type``: one record
  per key changed in the batch (its last change; preimages dropped): the row
  without ``_change_type`` as the value, and for a ``delete`` a *tombstone*
  (the key, a null value). Compacting the topic by key (last record per key,
  a tombstone meaning absent) gives the result table. It needs a key
  (:class:`SinkConfigError` otherwise). Without ``_change_type``, as before:
  every row a record, keyed by ``key=`` only.
- ``output_mode="changelog"``: every change row a record, ``_change_type``
  in the value (see :func:`sinks.changes.changelog_rows` for a batch without
  it); ``format="raw"`` is refused (it writes only the ``value`` column).

Changelog formats (a frame's ``_change_type`` column, :mod:`sinks.changelog`;
a frame without it is all inserts/upserts), whatever the output mode:

- ``format="upsert"`` (Kafka Streams' KTable, Flink's upsert-kafka): the key is
  the key columns as a JSON object, the value the row as JSON (without
  ``_change_type``); a ``delete`` is a tombstone (null value); preimages are
  not written. These are the records of ``output_mode="update"`` with
  ``_change_type`` above (one implementation): one per key changed in the
  batch, its last change; a frame without ``_change_type``, one per row.
- ``format="debezium-json"``: one Debezium envelope per change, ``{"before",
  "after", "op", "source"}``: ``insert`` is ``c`` (``after``), a preimage
  followed by its postimage is one ``u`` (``before`` and ``after``; a postimage
  without one has ``before`` null), ``delete`` is ``d`` (``before``) followed,
  when records are keyed, by a tombstone with the same key (Debezium's
  ``tombstones.on.delete``; ``tombstones_on_delete=False`` leaves it out).
  ``source`` is ``{"connector": "microbatch", "query_id", "batch_id"}``; there
  is no ``ts_ms``, so a replayed batch writes the same bytes. The key is the key
  columns as JSON when there are any (``key_columns`` or the query's), else
  ``key``.
"""

from __future__ import annotations

import json
import logging
import threading
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, NamedTuple

import numpy as np
import polars as pl

from sinks.base import BatchContext, Sink, SinkContext
from sinks.changelog import (
    CHANGE_TYPE,
    DELETE,
    INSERT,
    UPDATE_POSTIMAGE,
    UPDATE_PREIMAGE,
    is_changelog,
)
from sinks.changes import changelog_rows, check_changes, last_changes
from sinks.exceptions import SinkConfigError, SinkError
from sinks.kafka_client import check_config, client_config, create_topics, redact

log = logging.getLogger("sinks.kafka")

DeliveryGuarantee = Literal["exactly_once", "at_least_once"]
"""As Flink's ``sink.delivery-guarantee``."""
ValueFormat = Literal["json", "raw", "debezium-json", "upsert"]
"""``json``/``raw`` write rows; ``debezium-json``/``upsert`` write changes."""
DEFAULT_COMMIT_TOPIC = "microbatch-sink-commits"
"""The bookkeeping topic (one partition) whose group offsets mark committed batches."""
_RESERVED = ("bootstrap.servers", "transactional.id", "enable.idempotence")
_TIMEOUT_S = 60.0
_GRACE_S = 5.0
"""How long past its own timeout a transaction call may take before the sink gives up."""
_ROW = "__microbatch_record_row"
"""A row number column added while picking a changelog's records (dropped after)."""


class _Records(NamedTuple):
    """A batch as the records to produce: record ``i`` comes from row ``rows[i]`` of
    ``frame`` (``rows`` None: from row ``i``), whose header expressions it gets; its
    key is ``keys[i]`` (``keys`` None: no key), its value ``values[i]`` (None: a
    tombstone)."""

    frame: pl.DataFrame
    rows: np.ndarray | None
    keys: list[bytes | None] | None
    values: Sequence[bytes | None]


class TransactionStuckError(SinkError):
    """A transaction call of the Kafka client did not return within its timeout."""


class KafkaSink(Sink):
    """Writes each batch's rows to a topic; exactly once per batch id (see the module docs).

    Parameters
    ----------
    topic
        The output topic (must exist, or the broker must auto-create it).
    bootstrap
        ``host:port[,...]`` of the cluster.
    key
        Column name or Polars expression for the record key (cast to text,
        or bytes as they are); ``None`` for no key (for changes, the query's key
        columns as one JSON object: see the module docs).
    format
        ``"json"``: every column of the row as one JSON object (datetimes in
        ISO-8601, decimals as exact strings); ``"raw"``: the ``value`` column
        (bytes or text) as is; ``"upsert"`` and ``"debezium-json"``: the
        changes of a changelog frame (see the module docs).
    headers
        ``{header_name: column_or_expression}`` added to every record
        (values cast to text).
    delivery_guarantee
        ``"exactly_once"`` (a transaction per batch) or ``"at_least_once"``
        (dedupe headers).
    config
        Extra librdkafka settings for the producer (SASL/SSL...); never shown.
    value_format, mode
        Deprecated names of ``format`` and ``delivery_guarantee`` (removed in 0.3).
    commit_topic
        The bookkeeping topic for exactly-once markers (created with one
        partition when missing).
    key_columns
        For ``upsert`` and ``debezium-json``: the columns of the record key
        (a JSON object); default the query's key columns (its grouping keys).
        ``upsert`` needs some; they exclude ``key``.
    tombstones_on_delete
        ``debezium-json``: write a tombstone after each ``d`` record (default,
        as Debezium does, so that log compaction can drop the key).
    """

    def __init__(
        self,
        topic: str,
        *,
        bootstrap: str,
        key: str | pl.Expr | None = None,
        format: ValueFormat = "json",
        headers: Mapping[str, str | pl.Expr] | None = None,
        delivery_guarantee: DeliveryGuarantee = "exactly_once",
        config: Mapping[str, Any] | None = None,
        commit_topic: str = DEFAULT_COMMIT_TOPIC,
        value_format: ValueFormat | None = None,
        mode: DeliveryGuarantee | None = None,
        key_columns: str | Sequence[str] | None = None,
        tombstones_on_delete: bool = True,
    ) -> None:
        if value_format is not None:
            _renamed("value_format", "format")
            format = value_format
        if mode is not None:
            _renamed("mode", "delivery_guarantee")
            delivery_guarantee = mode
        if not isinstance(topic, str) or not topic:
            raise SinkConfigError(f"write_kafka needs a topic name, got {topic!r}")
        if not isinstance(bootstrap, str) or not bootstrap:
            raise SinkConfigError("write_kafka needs bootstrap='host:port'")
        if delivery_guarantee not in ("exactly_once", "at_least_once"):
            raise SinkConfigError(
                "write_kafka: delivery_guarantee must be 'exactly_once' or 'at_least_once', "
                f"got {delivery_guarantee!r}"
            )
        if format not in ("json", "raw", "debezium-json", "upsert"):
            raise SinkConfigError(
                "write_kafka: format must be 'json', 'raw', 'debezium-json' or 'upsert', "
                f"got {format!r}"
            )
        names = (() if key_columns is None
                 else (key_columns,) if isinstance(key_columns, str) else tuple(key_columns))
        if names and format not in ("debezium-json", "upsert"):
            raise SinkConfigError(
                f"write_kafka: key_columns is for format='upsert' or 'debezium-json'; with "
                f"format={format!r} pass key=<column or expression>"
            )
        if names and key is not None:
            raise SinkConfigError(
                "write_kafka: pass key_columns=[...] (a JSON object of those columns) or "
                "key=<column or expression>, not both"
            )
        if format == "upsert" and key is not None:
            raise SinkConfigError(
                "write_kafka(format='upsert'): the record key is the key columns as JSON; "
                "pass key_columns=[...] instead of key="
            )
        try:
            self._config = check_config(config, reserved=_RESERVED)
        except ValueError as exc:
            raise SinkConfigError(f"write_kafka: {exc}") from None
        self.topic = topic
        self.bootstrap = bootstrap
        self.key = pl.col(key) if isinstance(key, str) else key
        self.format: ValueFormat = format
        self.headers = {
            name: (pl.col(e) if isinstance(e, str) else e) for name, e in (headers or {}).items()
        }
        self.delivery_guarantee: DeliveryGuarantee = delivery_guarantee
        self.commit_topic = commit_topic
        self.key_columns: tuple[str, ...] = names
        self.tombstones_on_delete = bool(tombstones_on_delete)
        self._producer: Any = None
        self._reader: Any = None
        self._call_timeout_s = _TIMEOUT_S
        """Bound of one transaction call (send_offsets, commit): at most transaction.timeout.ms."""
        self._errors: list[str] = []
        self.batches_written = 0

    # ------------------------------------------------------------------ identity

    @property
    def transactional_id(self) -> str:
        """``microbatch-<query_id>-<topic>``: stable across restarts of the query."""
        return f"microbatch-{self._query_id()}-{self.topic}"

    @property
    def group_id(self) -> str:
        """The consumer group whose offset on ``commit_topic:0`` marks committed batches."""
        return f"microbatch-sink-{self._query_id()}-{self.topic}"

    def _query_id(self) -> str:
        return self.context.query_id

    @property
    def label(self) -> str:
        return f"KafkaSink({self.topic!r})"

    def describe(self) -> dict[str, Any]:
        """Topic, mode and options; the config with secrets redacted."""
        return {
            "kind": type(self).__name__,
            "topic": self.topic,
            "bootstrap": self.bootstrap,
            "delivery_guarantee": self.delivery_guarantee,
            "format": self.format,
            "key": None if self.key is None else str(self.key),
            "headers": sorted(self.headers),
            **({"key_columns": list(self.key_columns)} if self.key_columns else {}),
            "commit_topic": (
                self.commit_topic if self.delivery_guarantee == "exactly_once" else None
            ),
            "config": redact(self._config),
        }

    # ------------------------------------------------------------------ lifecycle

    def on_open(self, ctx: SinkContext) -> None:
        """Create the producer; in exactly-once mode fence older runs (init_transactions)."""
        from confluent_kafka import Consumer, KafkaException, Producer

        if ctx.output_mode == "changelog" and self.format == "raw":
            raise SinkConfigError(
                f"{self.label}: output_mode='changelog' writes each change with its "
                f"{CHANGE_TYPE!r}, and format='raw' writes only the 'value' column; use "
                "format='json'"
            )
        if self.format == "upsert" and not (self.key_columns or ctx.key_columns):
            raise SinkConfigError(
                f"KafkaSink({self.topic!r}, format='upsert'): records are keyed by the key "
                "columns, and this query has none (no aggregation); pass key_columns=[...] "
                "to write_kafka"
            )
        self.close()
        base = client_config(self._config, self.bootstrap)
        producer_cfg: dict[str, Any] = {
            "linger.ms": 20,
            "batch.size": 1_000_000,
            "compression.type": "lz4",
            "queue.buffering.max.messages": 1_000_000,
            **base,
            "enable.idempotence": True,
        }
        if self.delivery_guarantee == "exactly_once":
            producer_cfg["transactional.id"] = self.transactional_id
            producer_cfg.setdefault("transaction.timeout.ms", 60_000)
            # NOTE: past transaction.timeout.ms the coordinator aborts the transaction,
            # so a commit call waiting longer than that cannot succeed anyway
            self._call_timeout_s = min(_TIMEOUT_S,
                                       float(producer_cfg["transaction.timeout.ms"]) / 1000)
            self._ensure_commit_topic(base)
            self._reader = Consumer({
                **base, "group.id": self.group_id, "enable.auto.commit": False,
                "isolation.level": "read_committed",
            })
        else:
            producer_cfg["on_delivery"] = self._on_delivery
        self._producer = Producer(producer_cfg)
        if self.delivery_guarantee == "exactly_once":
            try:
                self._producer.init_transactions(_TIMEOUT_S)
            except KafkaException as exc:
                raise SinkError(
                    f"KafkaSink({self.topic!r}): init_transactions for transactional.id "
                    f"{self.transactional_id!r} failed: {exc.args[0]}"
                ) from None

    def close(self) -> None:
        """Flush (at-least-once) and close the clients."""
        if self._producer is not None and self.delivery_guarantee == "at_least_once":
            self._producer.flush(10)
        if self._reader is not None:
            try:
                self._reader.close()
            except Exception:  # closing must not hide the error that led here
                log.debug("error closing the marker reader", exc_info=True)
        self._producer = self._reader = None

    # ------------------------------------------------------------------ writing

    def is_written(self, batch: BatchContext) -> bool:
        """Exactly once: the marker says the batch's transaction committed. At least
        once: never (consumers dedupe on the ``mb_*`` headers)."""
        if self.delivery_guarantee == "at_least_once":
            return False
        last = self.last_committed_batch()
        return last is not None and batch.batch_id <= last

    def write(self, batch: BatchContext, df: pl.DataFrame) -> None:
        """One transaction with the rows and the batch's marker, or, at least once,
        confirmed deliveries with dedupe headers."""
        records = self._records(batch, df)
        if self.delivery_guarantee == "at_least_once":
            self._write_at_least_once(batch, records)
        else:
            self._write_transaction(batch, records)

    def last_committed_batch(self) -> int | None:
        """The last batch id whose transaction committed, read from the marker group."""
        from confluent_kafka import KafkaException, TopicPartition

        if self._reader is None:
            return None
        try:
            (tp,) = self._reader.committed([TopicPartition(self.commit_topic, 0)],
                                           timeout=_TIMEOUT_S)
        except KafkaException as exc:
            raise SinkError(
                f"KafkaSink({self.topic!r}): cannot read the committed-batch marker of group "
                f"{self.group_id!r}: {exc.args[0]}"
            ) from None
        if tp.error is not None:
            raise SinkError(f"KafkaSink({self.topic!r}): marker of {self.group_id!r}: {tp.error}")
        return None if tp.offset < 0 else tp.offset - 1

    def _write_transaction(self, batch: BatchContext, records: _Records) -> None:
        from confluent_kafka import KafkaException, TopicPartition

        batch_id = batch.batch_id
        producer = self._producer
        producer.begin_transaction()
        try:
            self._produce(records, headers=None)
            batch.at("sink.after_data")
            marker = json.dumps({"batch_id": batch_id, "query_id": self._query_id(),
                                 "rows": len(records.values)})
            group = self._reader.consumer_group_metadata()
            self._bounded("send_offsets_to_transaction", batch_id, lambda: (
                producer.send_offsets_to_transaction(
                    [TopicPartition(self.commit_topic, 0, batch_id + 1, metadata=marker)],
                    group, self._call_timeout_s,
                )))
            self._bounded("commit_transaction", batch_id,
                          lambda: producer.commit_transaction(self._call_timeout_s))
        except TransactionStuckError:
            # NOTE: no abort: the stuck call still owns the producer (a second
            # transactional call would fail or block too); the next start's
            # init_transactions fences this producer and aborts its transaction
            self.close()
            raise
        except KafkaException as exc:
            err = exc.args[0]
            self._abort(batch_id)
            raise SinkError(
                f"KafkaSink({self.topic!r}): transaction of batch {batch_id} failed: {err}; "
                "nothing of it is visible to read_committed consumers, and the batch is "
                "retried on restart"
            ) from None
        except BaseException:
            self._abort(batch_id)
            raise
        self.batches_written += 1
        batch.at("sink.after_commit")

    def _bounded(self, what: str, batch_id: int, call: Callable[[], object]) -> None:
        """``call()`` on a helper thread, given up on ``_GRACE_S`` past its timeout.

        librdkafka's ``send_offsets_to_transaction`` can block for good, whatever its
        timeout, when the group coordinator went down during the transaction (seen
        with a broker SIGKILLed and restarted; confluentinc/librdkafka#5456); a batch
        must fail instead of hanging the query.
        """
        outcome: list[BaseException | None] = []

        def run() -> None:
            try:
                call()
            except BaseException as exc:  # handed to the caller's thread
                outcome.append(exc)
            else:
                outcome.append(None)

        thread = threading.Thread(target=run, name=f"microbatch-kafka-{what}", daemon=True)
        thread.start()
        thread.join(self._call_timeout_s + _GRACE_S)
        if not outcome:
            raise TransactionStuckError(
                f"KafkaSink({self.topic!r}): {what} of batch {batch_id} did not return "
                f"within {self._call_timeout_s + _GRACE_S:.0f}s (the Kafka client can block "
                "past its timeout after the broker coordinating the transaction was down); the "
                "transaction stays open, nothing of it is visible to read_committed "
                "consumers, and it is aborted when the query starts again, which retries "
                "the batch. Check that the broker is up, then restart the query."
            )
        if outcome[0] is not None:
            raise outcome[0]

    def _abort(self, batch_id: int) -> None:
        try:
            self._producer.abort_transaction(_TIMEOUT_S)
        except Exception as exc:  # the next init_transactions aborts it anyway
            log.warning("kafka sink %s: abort of batch %d failed: %s", self.topic, batch_id, exc)

    def _write_at_least_once(self, batch: BatchContext, records: _Records) -> None:
        batch_id = batch.batch_id
        self._errors = []
        fixed = [("mb_query_id", batch.query_id.encode()), ("mb_batch_id", str(batch_id).encode())]
        self._produce(records, headers=fixed)
        batch.at("sink.after_data")
        remaining = self._producer.flush(_TIMEOUT_S)
        if remaining or self._errors:
            first = self._errors[0] if self._errors else f"{remaining} record(s) unconfirmed"
            raise SinkError(
                f"KafkaSink({self.topic!r}): batch {batch_id}: {len(self._errors)} delivery "
                f"error(s), {remaining} record(s) unconfirmed (first: {first}); the batch is "
                "retried on restart (consumers dedupe on mb_query_id/mb_batch_id/mb_row)"
            )
        self.batches_written += 1
        batch.at("sink.after_commit")

    def _on_delivery(self, err: Any, _msg: Any) -> None:
        if err is not None:
            self._errors.append(str(err))

    def _produce(
        self, records: _Records, *, headers: list[tuple[str, bytes]] | None
    ) -> None:
        """Enqueue every record; vectorized serialization, one produce call per record."""
        frame, rows, keys, values = records
        if not len(values):
            return
        extra = {name: self._column_bytes(frame, e, rows) for name, e in self.headers.items()}
        producer = self._producer
        if headers is None and not extra:
            messages = (
                [{"value": v, "key": k} for v, k in zip(values, keys, strict=True)]
                if keys is not None else [{"value": v} for v in values]
            )
            self._produce_batch(messages)
            return
        base = list(headers or [])
        for i, value in enumerate(values):
            row_headers: list[tuple[str, bytes | None]] = (
                [*base, ("mb_row", str(i).encode())] if headers is not None else []
            )
            row_headers.extend((name, col[i]) for name, col in extra.items())
            key = keys[i] if keys is not None else None
            while True:
                try:
                    producer.produce(self.topic, value, key, headers=row_headers)
                    break
                except BufferError:
                    producer.poll(0.1)
            if i % 10_000 == 0:
                producer.poll(0)

    def _produce_batch(self, messages: list[dict[str, Any]]) -> None:
        producer = self._producer
        chunk = 50_000
        i = 0
        while i < len(messages):
            part = messages[i : i + chunk]
            queued = producer.produce_batch(self.topic, part)
            if queued < len(part):
                failed = [m for m in part if "_error" in m]
                if failed and not all("QUEUE_FULL" in str(m["_error"]) for m in failed):
                    raise SinkError(
                        f"KafkaSink({self.topic!r}): {len(failed)} record(s) not queued: "
                        f"{failed[0]['_error']}"
                    )
                # queue full: wait for deliveries, then enqueue the rest of this chunk
                producer.poll(0.1)
                messages[i : i + chunk] = [
                    {k: v for k, v in m.items() if k != "_error"} for m in failed
                ]
                continue
            producer.poll(0)
            i += chunk
        producer.flush(_TIMEOUT_S)

    def _records(self, batch: BatchContext, df: pl.DataFrame) -> _Records:
        """The records to write for ``df``, by format and output mode (module docs)."""
        where = f"{self.label} batch {batch.batch_id}"
        if self.format == "debezium-json":
            return self._debezium(batch, df, where)
        if self.format == "upsert" or (batch.output_mode == "update" and is_changelog(df)):
            return self._upserts(batch, df, where)
        if batch.output_mode == "changelog":
            frame = changelog_rows(df, batch.key_columns, where)
            names = () if self.key is not None else self._key_columns(batch, frame, where)
            return _Records(frame, None, self._keys(frame, None, names), self._values(frame))
        plain = self._column_bytes(df, self.key) if self.key is not None else None
        return _Records(df, None, plain, self._values(df))

    def _upserts(self, batch: BatchContext, df: pl.DataFrame, where: str) -> _Records:
        """A keyed log's records (``format="upsert"``, or ``output_mode="update"`` with
        ``_change_type``): per key its last change in the batch, preimages dropped, a
        ``delete`` a tombstone (the key, a null value); without ``_change_type``, a
        record per row."""
        names = self._key_columns(batch, df, where)
        if self.key is None and not names:
            raise SinkConfigError(
                f"{where}: output_mode='update' turns a delete into a tombstone (a record "
                "with the row's key and no value), and this query has neither key columns "
                "nor a record key; pass key= to write_kafka"
            )
        if not is_changelog(df):
            return _Records(df, None, self._keys(df, None, names), self._values(df))
        last = last_changes(df.with_row_index(_ROW), names, where)
        rows = last.get_column(_ROW).to_numpy()
        is_delete = (last.get_column(CHANGE_TYPE) == DELETE).to_numpy()
        values = self._values(last.drop(_ROW, CHANGE_TYPE))
        return _Records(df, rows, self._keys(df, rows, names), _null_where(values, is_delete))

    def _debezium(self, batch: BatchContext, df: pl.DataFrame, where: str) -> _Records:
        """One Debezium envelope per change (a preimage and its postimage: one ``u``),
        and, when keyed, a tombstone right after each ``d``."""
        check_changes(df, where)
        change = (df.get_column(CHANGE_TYPE).cast(pl.String) if is_changelog(df)
                  else pl.repeat(INSERT, df.height, dtype=pl.String, eager=True))
        data = df.drop(CHANGE_TYPE, strict=False)
        names = () if self.key is not None else self._key_columns(batch, data, where)
        kept = (change != UPDATE_PREIMAGE).to_numpy()
        rows = np.flatnonzero(kept)
        is_delete = (change == DELETE).to_numpy()[rows]
        keys = self._keys(df, rows, names)
        row = pl.struct(data.columns)
        ct = pl.lit(change)
        envelopes = data.select(
            before=pl.when(ct == DELETE).then(row)
            .when((ct == UPDATE_POSTIMAGE) & (ct.shift(1) == UPDATE_PREIMAGE))
            .then(row.shift(1)),
            after=pl.when(ct.is_in((INSERT, UPDATE_POSTIMAGE))).then(row),
            op=ct.replace_strict(
                {INSERT: "c", UPDATE_POSTIMAGE: "u", DELETE: "d", UPDATE_PREIMAGE: ""}
            ),
            source=pl.struct(
                connector=pl.lit("microbatch"), query_id=pl.lit(batch.query_id),
                batch_id=pl.lit(batch.batch_id, dtype=pl.Int64),
            ),
        ).filter(pl.Series(kept))
        values = _ndjson(envelopes)
        if keys is None or not self.tombstones_on_delete or not is_delete.any():
            return _Records(df, rows, keys, values)
        # a tombstone (same key, null value) right after each delete, as Debezium writes
        deletes = np.flatnonzero(is_delete)
        n = len(rows)
        order = np.argsort(np.concatenate([np.arange(n) * 2, deletes * 2 + 1]), kind="stable")
        at = np.concatenate([np.arange(n), deletes])[order]
        tomb = np.concatenate([np.zeros(n, dtype=bool), np.ones(len(deletes), dtype=bool)])
        return _Records(
            df,
            rows[at],
            pl.Series(keys, dtype=pl.Binary).gather(at).to_list(),
            _null_where(pl.Series(values, dtype=pl.Binary).gather(at).to_list(), tomb[order]),
        )

    def _key_columns(
        self, batch: BatchContext, frame: pl.DataFrame, where: str
    ) -> tuple[str, ...]:
        """``key_columns=``, else the query's key columns; checked against ``frame``."""
        names = self.key_columns or batch.key_columns
        missing = [c for c in names if c not in frame.columns]
        if missing:
            fix = "; fix key_columns" if self.key_columns else ""
            raise SinkError(f"{where}: the key column(s) {missing} are not in the batch "
                            f"(its columns: {frame.columns}){fix}")
        return names

    def _keys(
        self, frame: pl.DataFrame, rows: np.ndarray | None, names: Sequence[str]
    ) -> list[bytes | None] | None:
        """The record keys of ``frame``'s ``rows``: ``key=`` when given, else the
        ``names`` columns as one JSON object, else none."""
        if self.key is not None:
            return self._column_bytes(frame, self.key, rows)
        if not names:
            return None
        return list(_ndjson((frame if rows is None else frame[rows]).select(names)))

    def _values(self, df: pl.DataFrame) -> Sequence[bytes | None]:
        if self.format == "raw":
            if "value" not in df.columns:
                raise SinkError(
                    f"KafkaSink({self.topic!r}) with format='raw' needs a 'value' "
                    f"column; the batch has {df.columns}"
                )
            return self._column_bytes(df, pl.col("value"))  # a null value is a tombstone
        return _ndjson(df)

    @staticmethod
    def _column_bytes(
        df: pl.DataFrame, expr: pl.Expr, rows: np.ndarray | None = None
    ) -> list[bytes | None]:
        series = df.select(expr).to_series()
        if series.dtype != pl.Binary:
            series = series.cast(pl.String).cast(pl.Binary)
        return (series if rows is None else series.gather(rows)).to_list()

    def _ensure_commit_topic(self, base: dict[str, Any]) -> None:
        """Create the one-partition bookkeeping topic when it does not exist."""
        from confluent_kafka import KafkaException

        try:
            create_topics(base, [self.commit_topic], partitions=1, exist_ok=True,
                          timeout_s=_TIMEOUT_S)
        except (KafkaException, TimeoutError) as exc:
            reason = exc.args[0] if exc.args else exc
            raise SinkError(
                f"KafkaSink: cannot create the bookkeeping topic {self.commit_topic!r}: {reason}"
            ) from None


def _ndjson(df: pl.DataFrame) -> list[bytes]:
    """Each row as one JSON object, serialized in one call."""
    lines = df.write_ndjson().encode().split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    if len(lines) != df.height:
        raise SinkError(f"KafkaSink: serialized {len(lines)} lines for {df.height} rows")
    return lines


def _null_where(values: Sequence[bytes | None], mask: np.ndarray) -> list[bytes | None]:
    """``values`` with null where ``mask`` is true (vectorized)."""
    frame = pl.DataFrame({"v": pl.Series(values, dtype=pl.Binary), "m": mask})
    return frame.select(pl.when(pl.col("m")).then(None).otherwise(pl.col("v"))).to_series() \
        .to_list()


def _renamed(old: str, new: str) -> None:
    warnings.warn(
        f"write_kafka/KafkaSink: {old}= is deprecated and will be removed in 0.3; use {new}= "
        "(the same option names as read_kafka and Flink's Kafka sink)",
        DeprecationWarning,
        stacklevel=3,
    )
