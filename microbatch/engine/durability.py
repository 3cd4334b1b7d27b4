"""Durability levels of a query's writes: what a committed batch survives.

- ``"fsync"`` (the default): every checkpoint, state and sink file is
  fsync'ed (and its directory) before the batch counts as committed: a
  committed batch survives the process, the machine or the power failing.
  (Group commit: ``commits/N`` itself is made durable by the next batch's
  write-ahead entry, or at idle or stop; a power loss before that re-runs
  batch N, whose sink writes are already durable and idempotent.)
- ``"process"``: the same writes, in the same order, each still atomic (temp
  file + rename), without the fsyncs. A committed batch survives the process
  crashing or being killed (the kernel still holds the data), not the machine
  crashing or losing power: after an OS crash, a checkpoint may be missing its
  newest entries or hold torn files (the next start then reports a damaged
  checkpoint rather than guessing). Worth it for tiny batches on slow disks,
  where the fsyncs are most of a batch's cost.

Every checkpoint, state and file-sink write goes through
:mod:`statestore.durable`, so one switch there sets the level. Only the query's
own thread skips fsyncs: other queries in the same process
keep their level. Sinks that write through their own libraries (Delta Lake,
Kafka) keep their own durability.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Literal

from statestore.durable import without_fsync

__all__ = ["DURABILITY_LEVELS", "Durability", "durability_level"]

Durability = Literal["fsync", "process"]
DURABILITY_LEVELS: tuple[Durability, ...] = ("fsync", "process")


@contextmanager
def durability_level(level: Durability) -> Iterator[None]:
    """Run the block (the query's batches) at ``level`` in the calling thread."""
    if level == "process":
        with without_fsync():  # the one durable-write layer: state, checkpoint and sinks
            yield
    else:
        yield
