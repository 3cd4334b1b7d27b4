"""Named crash points for recovery tests.

Set ``MICROBATCH_FAULT`` to ``POINT`` or ``POINT@BATCH`` (comma-separated for
several) and the process kills itself with SIGKILL when the engine reaches
that point (for that batch id). With ``MICROBATCH_FAULT_ACTION=raise`` it
raises :class:`InjectedFault` instead, for in-process tests; with
``pause`` it stops there for good (a hung process, for tests that kill
something else meanwhile).

Points, in lifecycle order: ``after_plan``, ``after_write_ahead``,
``after_read``, ``after_execute``, ``sink.before_data`` / ``sink.after_data`` /
``sink.before_commit`` / ``sink.after_commit`` (inside sinks that have them;
the Iceberg sink: before its data files, before its catalog commit, after it),
``after_sink``, ``after_state_commit``, ``after_commit``,
``after_report``; in the workers of a scaled-out query (Ray):
``worker.map``, ``worker.reduce``, ``worker.after_write`` (the worker wrote
a sink's data files, the driver has not committed them), ``worker.commit`` (in
the reduce, before its shards' state commit), ``worker.after_commit`` (the
shards' version N+1 durable, the driver not yet answered); while ``run
--from-savepoint`` assembles a new checkpoint: ``restore.before_publish`` (with
the savepoint's batch id). The side outputs,
written before the sink in step 5, have their own sink points:
``dead_letter.sink.after_data``, ``late.sink.after_data`` (so that
``sink.after_data`` is the query's sink, whether or not the batch had a bad
or late record). Outside a query: ``promote.after_retire`` (``microbatch
promote``, between its two commits; the batch is the promoted one).

With ``MICROBATCH_FAULT_ONCE=DIR`` each point fires once: a marker file in
``DIR`` records that it did (a replaced worker does not die again there).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable

POINTS = (
    "after_plan",
    "after_write_ahead",
    "after_read",
    "after_execute",
    "sink.before_data",
    "sink.after_data",
    "sink.before_commit",
    "sink.after_commit",
    "after_sink",
    "after_state_commit",
    "after_commit",
    "after_report",
)
WORKER_POINTS = ("worker.map", "worker.reduce", "worker.after_write", "worker.commit",
                 "worker.after_commit")
"""Points inside the Ray workers of a scaled-out query (not passed in one process)."""
RESTORE_POINTS = ("restore.before_publish",)
"""Points of ``run --from-savepoint`` (passed once, before the first batch)."""


class InjectedFault(RuntimeError):
    """Raised at a crash point when ``MICROBATCH_FAULT_ACTION=raise``."""


def _armed() -> list[tuple[str, int | None]]:
    spec = os.environ.get("MICROBATCH_FAULT", "").strip()
    armed = []
    for item in filter(None, (part.strip() for part in spec.split(","))):
        point, _, batch = item.partition("@")
        armed.append((point, int(batch) if batch else None))
    return armed


def fault_point(name: str, batch_id: int) -> None:
    """Crash here if ``MICROBATCH_FAULT`` names this point (and batch)."""
    if "MICROBATCH_FAULT" not in os.environ:
        return
    for point, batch in _armed():
        if point == name and (batch is None or batch == batch_id):
            once = os.environ.get("MICROBATCH_FAULT_ONCE")
            if once:
                marker = os.path.join(once, f"{name}@{batch_id}")
                try:
                    os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
                except FileExistsError:
                    continue
            if os.environ.get("MICROBATCH_FAULT_ACTION") == "raise":
                raise InjectedFault(f"injected fault at {name} in batch {batch_id}")
            if os.environ.get("MICROBATCH_FAULT_ACTION") == "pause":
                while True:
                    time.sleep(3600)
            os.kill(os.getpid(), signal.SIGKILL)


def side_fault_point(side: str) -> Callable[[str, int], None]:
    """:func:`fault_point` for a side output: its points are ``SIDE.NAME``."""

    def at(name: str, batch_id: int) -> None:
        fault_point(f"{side}.{name}", batch_id)

    return at
