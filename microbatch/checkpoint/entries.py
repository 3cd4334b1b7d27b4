"""The typed entries of the write-ahead log (``offsets/N``) and the commit log
(``commits/N``).

Spark's ``OffsetSeq`` / ``CommitMetadata``: each is a frozen record with a JSON
form (the body of a checksummed checkpoint file); reading validates every field
and names the file when one is missing or of the wrong type, so a hand-edited or
foreign file is an error, never a silent default.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, Self

from microbatch.exceptions import CheckpointCorruptError
from microbatch.types import Offset

__all__ = ["CommitEntry", "LogEntry", "OffsetEntry"]


class LogEntry(Protocol):
    """What :class:`~microbatch.checkpoint.batch_log.BatchLog` stores."""

    KIND: ClassVar[str]

    @property
    def batch_id(self) -> int: ...

    def to_json(self) -> dict[str, Any]: ...

    @classmethod
    def from_json(cls, doc: Mapping[str, Any], *, where: str) -> Self: ...


def _field(doc: Mapping[str, Any], name: str, types: type | tuple[type, ...], where: str) -> Any:
    """``doc[name]``, checked to be of ``types`` (never a bool)."""
    if name not in doc:
        raise CheckpointCorruptError(f"{where} has no {name!r}; the file was edited or is foreign")
    value = doc[name]
    if isinstance(value, bool) or not isinstance(value, types):
        raise CheckpointCorruptError(
            f"{where}: {name!r} is {value!r}, not of the expected type; the file was edited"
        )
    return value


@dataclass(frozen=True)
class OffsetEntry:
    """``offsets/N``: batch N as fixed before it is read (the write-ahead record).

    From the moment it is written the batch is fixed forever: a re-run reads
    exactly ``sources``' ranges with ``watermark_ms`` and ``timestamp_ms``.
    """

    KIND: ClassVar[str] = "offsets"

    batch_id: int
    sources: Mapping[str, tuple[Offset, Offset]]
    """Source id -> (start, end) offsets of the batch."""
    watermark_ms: int | None
    """The watermark in force for the batch (computed at the end of N-1)."""
    timestamp_ms: int
    """The batch's processing time (what processing-time logic sees)."""
    identity: Mapping[str, Any] = field(default_factory=dict)
    """What must not change across restarts (the sources' identities)."""
    fingerprint: str = ""
    """A hash of the whole job's configuration when the batch was planned."""
    in_flight: tuple[int, ...] = ()
    """Earlier batches whose sink and commit were still running when this one
    was written ahead (a pipelined query): a restart may find them uncommitted
    and re-runs them first. Written only when not empty."""
    previous_commit: CommitEntry | None = None
    """Group commit: ``commits/N-1`` again, made durable by this entry's fsync
    (the commit file itself is written without one); ``None`` in entries
    written before group commit, and for a batch whose predecessor's commit
    was already made durable on its own (the query went idle or stopped)."""

    def to_json(self) -> dict[str, Any]:
        doc = {
            "batch_id": self.batch_id,
            "sources": {sid: {"start": s, "end": e} for sid, (s, e) in self.sources.items()},
            "watermark_ms": self.watermark_ms,
            "timestamp_ms": self.timestamp_ms,
            "identity": dict(self.identity),
            "fingerprint": self.fingerprint,
        }
        if self.in_flight:
            doc["in_flight"] = list(self.in_flight)
        if self.previous_commit is not None:
            doc["previous_commit"] = self.previous_commit.to_json()
        return doc

    @classmethod
    def from_json(cls, doc: Mapping[str, Any], *, where: str) -> Self:
        sources = _field(doc, "sources", dict, where)
        ranges: dict[str, tuple[Offset, Offset]] = {}
        for sid, span in sources.items():
            if not isinstance(span, dict) or "start" not in span or "end" not in span:
                raise CheckpointCorruptError(f"{where}: source {sid!r} has no start/end offsets")
            ranges[str(sid)] = (span["start"], span["end"])
        return cls(
            batch_id=_field(doc, "batch_id", int, where),
            sources=ranges,
            watermark_ms=_field(doc, "watermark_ms", (int, type(None)), where),
            timestamp_ms=_field(doc, "timestamp_ms", int, where),
            identity=doc.get("identity") or {},
            fingerprint=str(doc.get("fingerprint") or ""),
            in_flight=_batch_ids(doc.get("in_flight"), where),
            previous_commit=_previous_commit(doc, where),
        )


def _batch_ids(value: Any, where: str) -> tuple[int, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(
        isinstance(v, int) and not isinstance(v, bool) for v in value
    ):
        raise CheckpointCorruptError(f"{where}: 'in_flight' is not a list of batch ids: {value!r}")
    return tuple(value)


def _previous_commit(doc: Mapping[str, Any], where: str) -> CommitEntry | None:
    """The commit of the batch before, embedded by group commit (``None``: none)."""
    body = doc.get("previous_commit")
    if body is None:
        return None
    if not isinstance(body, dict):
        raise CheckpointCorruptError(f"{where}: 'previous_commit' is not an object")
    entry = CommitEntry.from_json(body, where=f"{where} (previous_commit)")
    if entry.batch_id != _field(doc, "batch_id", int, where) - 1:
        raise CheckpointCorruptError(
            f"{where}: 'previous_commit' commits batch {entry.batch_id}, not the batch "
            "before this one; the file was edited"
        )
    return entry


@dataclass(frozen=True)
class CommitEntry:
    """``commits/N``: batch N is done: state version N+1 and the sinks' writes are
    durable. Carries what batch N+1 needs to start: the next watermark and the
    tracker's per-partition event-time maxima."""

    KIND: ClassVar[str] = "commits"

    batch_id: int
    next_watermark_ms: int | None
    watermark: Mapping[str, Any] | None = None
    """The watermark tracker's state (per node and partition)."""
    committed_at_ms: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "batch_id": self.batch_id,
            "next_watermark_ms": self.next_watermark_ms,
            "watermark": None if self.watermark is None else dict(self.watermark),
            "committed_at_ms": self.committed_at_ms,
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any], *, where: str) -> Self:
        watermark = doc.get("watermark")
        if watermark is not None and not isinstance(watermark, dict):
            raise CheckpointCorruptError(f"{where}: 'watermark' is not an object")
        return cls(
            batch_id=_field(doc, "batch_id", int, where),
            next_watermark_ms=_field(doc, "next_watermark_ms", (int, type(None)), where),
            watermark=watermark,
            committed_at_ms=int(doc.get("committed_at_ms") or 0),
        )
