"""Consumed Kafka records as columns, as soon as ``consume()`` returns them.

confluent-kafka hands Python one ``Message`` object per record (the client
has no batch or columnar API, up to 2.16), and those objects are tracked by
the cyclic garbage collector: a read that kept them until the batch was
decoded paid a collection over every held record (measured: 48 ms for 250k
held messages against 10 ms for their values alone). So each ``consume()``
result is turned at once into one :class:`Chunk` per partition run: the
offsets (and timestamps) as NumPy arrays, the values (and keys, headers) as
lists of ``bytes``, each taken by one C-level ``map`` over the result, no
Python loop per record; the messages are dropped right after. Only the
attributes the query uses are taken (:class:`Fields`).

What "no per-record Python object" can mean with this client: the client
still creates a ``Message`` and a ``bytes`` value per record inside
``consume()``; what the source adds is a constant number of C-speed passes
per ``consume()`` call and nothing per record in Python code.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from confluent_kafka import Message as _Message  # C-speed map(_Message.value, msgs)

_second = operator.itemgetter(1)

Key = tuple[str, int]


@dataclass(frozen=True)
class Fields:
    """Which record attributes a read keeps besides offsets and values."""

    timestamps: bool = False
    keys: bool = False
    headers: bool = False


@dataclass(frozen=True)
class Chunk:
    """Consecutive records of one partition, in offset order, as columns.

    ``offsets`` and ``timestamps`` (epoch ms, when kept) are int64 arrays;
    ``values``, ``keys`` and ``headers`` (when kept) lists, one item per record.
    """

    offsets: np.ndarray
    values: list[bytes | None]
    timestamps: np.ndarray | None = None
    keys: list[bytes | None] | None = None
    headers: list[Any] | None = None

    def __len__(self) -> int:
        return len(self.values)

    @property
    def last(self) -> int:
        """The offset of the last record."""
        return int(self.offsets[-1])

    def part(self, lo: int, hi: int) -> Chunk:
        """Records ``[lo, hi)`` by position."""
        return Chunk(
            self.offsets[lo:hi], self.values[lo:hi],
            None if self.timestamps is None else self.timestamps[lo:hi],
            None if self.keys is None else self.keys[lo:hi],
            None if self.headers is None else self.headers[lo:hi],
        )

    def split(self, end: int) -> tuple[Chunk | None, Chunk | None]:
        """The records below offset ``end`` and those at or past it (``None``: none)."""
        n = len(self)
        cut = n if self.last < end else int(np.searchsorted(self.offsets, end))
        if cut == n:
            return self, None
        if cut == 0:
            return None, self
        return self.part(0, cut), self.part(cut, n)


def to_chunks(msgs: list[Any], fields: Fields, *, multi_topic: bool) -> list[tuple[Key, Chunk]]:
    """``consume()``'s data messages as one chunk per partition run (librdkafka
    delivers each fetched partition batch contiguously), in arrival order."""
    n = len(msgs)
    if not n:
        return []
    parts = np.fromiter(map(_Message.partition, msgs), dtype=np.int64, count=n)
    whole = Chunk(
        np.empty(0, dtype=np.int64),  # offsets: per run, below
        list(map(_Message.value, msgs)),
        np.fromiter(map(_second, map(_Message.timestamp, msgs)), dtype=np.int64, count=n)
        if fields.timestamps else None,
        list(map(_Message.key, msgs)) if fields.keys else None,
        list(map(_Message.headers, msgs)) if fields.headers else None,
    )
    change = parts[1:] != parts[:-1]
    topics: list[str]
    if multi_topic:
        topics = [str(t) for t in map(_Message.topic, msgs)]
        names = np.array(topics, dtype=object)
        change |= names[1:] != names[:-1]
    else:
        topics = [msgs[0].topic()]
    bounds = [0, *(np.flatnonzero(change) + 1).tolist(), n]
    out = []
    for a, b in itertools.pairwise(bounds):  # a loop per partition run, not per record
        run = whole if b - a == n else whole.part(a, b)
        out.append(((topics[a] if multi_topic else topics[0], int(parts[a])),
                     replace(run, offsets=_offsets(msgs, a, b))))
    return out


def _offsets(msgs: list[Any], a: int, b: int) -> np.ndarray:
    """The offsets of ``msgs[a:b]`` (one partition, strictly increasing): from the
    first and the last alone when they span exactly ``b - a`` offsets (no gap:
    the usual case), else read one by one (compacted topics, transaction
    markers)."""
    first, last = msgs[a].offset(), msgs[b - 1].offset()
    if last - first + 1 == b - a:
        return np.arange(first, last + 1, dtype=np.int64)
    return np.fromiter(map(_Message.offset, msgs[a:b]), dtype=np.int64, count=b - a)


class Backlog:
    """Records of one partition held for later reads: chunks in offset order.

    ``len()`` counts records (not chunks); ``last`` is the last held offset;
    ``eof``, when not ``None``, the offset at which the consumer reported the
    end of the partition (every record below it was delivered).
    """

    __slots__ = ("chunks", "eof", "records")

    def __init__(self) -> None:
        self.chunks: list[Chunk] = []
        self.records = 0
        self.eof: int | None = None

    def append(self, chunk: Chunk) -> None:
        """Hold ``chunk`` after what is held (its offsets follow theirs)."""
        self.chunks.append(chunk)
        self.records += len(chunk)

    def __len__(self) -> int:
        return self.records

    def __iter__(self) -> Iterator[Chunk]:
        return iter(self.chunks)

    @property
    def last(self) -> int:
        """The offset of the last held record."""
        return self.chunks[-1].last


def concat(chunks: Sequence[Chunk], fields: Fields) -> Chunk:
    """One chunk of ``chunks`` in order (they may come from several partitions)."""
    if len(chunks) == 1:
        return chunks[0]
    chain = itertools.chain.from_iterable
    return Chunk(
        np.concatenate([c.offsets for c in chunks]) if chunks else np.empty(0, np.int64),
        list(chain(c.values for c in chunks)),
        np.concatenate([c.timestamps for c in chunks if c.timestamps is not None])
        if fields.timestamps and chunks else
        (np.empty(0, np.int64) if fields.timestamps else None),
        list(chain(c.keys or () for c in chunks)) if fields.keys else None,
        list(chain(c.headers or () for c in chunks)) if fields.headers else None,
    )
