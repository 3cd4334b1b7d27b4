"""Source lag: how far a query is behind each of its sources, per partition.

A source may answer itself through the optional :meth:`Source.lag` hook (the
Kafka source does: records between the committed position and the latest
offset seen by the last plan). For the built-in sources that do not, this
module computes the same figure from what the source already holds in
memory, without touching the disk or the network:

- files: files admitted to the ledger by the last plan but not read yet (a
  plan admits every new file, ``max_files_per_batch`` only caps the read),
  and the age of the oldest of them (its modification time);
- generator: rows that the wall clock has made available but that were not
  read, per partition, and how long the oldest of them has been available;
- memory: rows added but not read.

Everything is "as of the last plan" for sources that list at plan time
(Kafka, files) and "as of now" for those whose backlog is a pure function
of the clock (generator) or of memory (memory source).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from microbatch.observability.progress_schema import SourceLag
from microbatch.sources.base import PartitionLag, Source
from microbatch.types import Offset

log = logging.getLogger("microbatch.observability.progress")

MAX_PARTITIONS = 1024
"""At most this many partitions are listed per source in a progress record
(totals always cover every partition)."""


def source_lag(source: Source, position: Offset, now_ms: int) -> SourceLag | None:
    """The lag of ``source`` for a query whose committed position is ``position``.

    Returns ``{"unit", "records", "seconds", "partitions": {id: {"records",
    "seconds"}}}`` (``records`` counts files for a files source, as ``unit``
    says), or ``None`` when the source cannot tell. Never raises: lag is
    informational, and a failure here must not fail a committed batch.
    """
    try:
        hooked = source.lag()
        if hooked is not None:
            return _summary(_normalize(hooked), unit="records")
        return _builtin(source, position, now_ms)
    except Exception as exc:  # informational only: log, never stop the query
        log.warning("could not measure the lag of source %s: %s", source.kind, exc)
        return None


def _builtin(source: Source, position: Offset, now_ms: int) -> SourceLag | None:
    from microbatch.sources.files import FileSource
    from microbatch.sources.generator import GeneratorSource
    from microbatch.sources.memory import MemorySource

    if isinstance(source, FileSource):
        return _files_lag(source, int(position), now_ms)
    if isinstance(source, GeneratorSource):
        return _generator_lag(source, position, now_ms)
    if isinstance(source, MemorySource):
        unread = max(0, int(source.latest_offset(position, capped=False)) - int(position))
        parts = {} if source.partition_column else {"0": _part(unread, None)}
        return {"unit": "records", "records": unread, "seconds": None, "partitions": parts}
    return None


def _files_lag(source: Any, position: int, now_ms: int) -> SourceLag:
    """Ledger files after ``position``: admitted by the last plan, not read yet."""
    ledger = source.ledger
    pending = ledger.files(position, len(ledger))
    # NOTE: the ledger is in admission order, (mtime, name): the first is the oldest
    seconds = max(0.0, (now_ms - pending[0].mtime_ns / 1e6) / 1000) if pending else 0.0
    return _summary({"0": _part(len(pending), round(seconds, 3))}, unit="files")


def _generator_lag(source: Any, position: Offset, now_ms: int) -> SourceLag:
    """Rows available now and not read, per partition (row ``i`` is in ``i % P``)."""
    end = source.latest_offset(position, capped=False)  # arithmetic on the clock only
    first_unread, available = int(position["rows"]), int(end["rows"])
    count = source.partitions
    rate = source.rows_per_second
    parts: dict[str, PartitionLag] = {}
    for p in range(min(count, MAX_PARTITIONS)):
        first = first_unread + (p - first_unread) % count
        unread = 0 if first >= available else (available - 1 - first) // count + 1
        seconds = 0.0
        if unread:
            # row i becomes available once (i + 1) / rate seconds have passed
            since_ms = position["wall_ms"] + (0 if rate is None else (first + 1) * 1000 / rate)
            seconds = round(max(0.0, (now_ms - since_ms) / 1000), 3)
        parts[str(p)] = _part(unread, seconds)
    out = _summary(parts, unit="records")
    out["records"] = max(0, available - first_unread)  # every partition, listed or not
    return out


def _part(records: int | None, seconds: float | None) -> PartitionLag:
    return {"records": records, "seconds": seconds}


def _normalize(raw: Mapping[str, int | PartitionLag]) -> dict[str, PartitionLag]:
    parts: dict[str, PartitionLag] = {}
    for pid, value in raw.items():
        if isinstance(value, Mapping):
            parts[str(pid)] = _part(value.get("records"), value.get("seconds"))
        else:
            parts[str(pid)] = _part(int(value), None)
    return parts


def _summary(parts: dict[str, PartitionLag], *, unit: str) -> SourceLag:
    """Totals over ``parts`` (records summed, seconds the oldest) and the first
    :data:`MAX_PARTITIONS` partitions."""
    records = [p["records"] for p in parts.values() if p["records"] is not None]
    seconds = [p["seconds"] for p in parts.values() if p["seconds"] is not None]
    listed = dict(list(parts.items())[:MAX_PARTITIONS])
    out: SourceLag = {
        "unit": unit,
        "records": sum(records) if records else None,
        "seconds": max(seconds) if seconds else None,
        "partitions": listed,
    }
    if len(listed) < len(parts):
        out["partitions_not_listed"] = len(parts) - len(listed)
    return out
