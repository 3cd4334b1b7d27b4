"""How a trigger runs batches: one loop object per trigger, chosen once.

Spark's ``TriggerExecutor``: the trigger spec (:mod:`microbatch.plan.triggers`)
says *when*; the loop here drives the engine's ``run_batch`` accordingly and
knows nothing else of it (the :class:`BatchRunner` protocol):

- :class:`IntervalLoop`: a batch at every tick of the interval (aligned to the
  wall clock, no drift), or back to back for ``0s``; until stopped;
- :class:`OnceLoop`: a recovered batch if any, one uncapped batch, then the
  no-data batch the advanced watermark calls for;
- :class:`AvailableNowLoop`: capped batches up to the end offsets every source
  has at start, then that no-data batch.

The bounded loops then call ``end_of_input`` (the flush batch of
``flush_at_end``, and the note of a run that found nothing new).
"""

from __future__ import annotations

from typing import Protocol

from microbatch.plan.triggers import AvailableNow, Once, ProcessingTime, Trigger
from microbatch.types import Offset

__all__ = ["AvailableNowLoop", "BatchRunner", "IntervalLoop", "OnceLoop", "TriggerLoop", "loop_for"]

IDLE_POLL_S = 0.05
"""How long a back-to-back (``0s``) trigger waits before planning again when the
previous plan found no new data."""


class BatchRunner(Protocol):
    """What a trigger loop needs from the engine."""

    def run_batch(self, *, capped: bool = True, bounds: dict[str, Offset] | None = None) -> bool:
        """Plan and run the next batch (a recovered one first); False: nothing to do."""
        ...

    def has_pending(self) -> bool:
        """True when a batch written ahead but not committed waits to be re-run
        (two at most: a pipelined query's batch in flight and the next one)."""
        ...

    def committed_offsets(self) -> dict[str, Offset]:
        """Every source's committed end offset."""
        ...

    def available_offsets(self) -> dict[str, Offset]:
        """Every source's end offset available now, uncapped."""
        ...

    def stopping(self) -> bool:
        """True once a stop was asked."""
        ...

    def now(self) -> float:
        """The engine's clock, in seconds."""
        ...

    def wait(self, seconds: float) -> None:
        """Sleep up to ``seconds``; a stop or ``process_all_available`` wakes it."""
        ...

    def idle(self) -> None:
        """Tell waiters that everything available has been processed."""
        ...

    def end_of_input(self) -> None:
        """A bounded trigger processed all its input (``flush_at_end`` runs here)."""
        ...


class TriggerLoop(Protocol):
    """Runs batches on a :class:`BatchRunner` until the trigger says stop."""

    drains_backlog: bool
    """True when every batch but the last is known to be full (``available-now``):
    the engine may read the next batch ahead."""

    def run(self, runner: BatchRunner) -> None: ...


def next_tick(started: float, interval_ms: int) -> float:
    """The start (seconds) of the interval after the one containing ``started``.

    Ticks sit on multiples of the interval of the wall clock, so batches never
    drift; when a batch overruns, the next tick is already past and the next
    batch starts at once (and its progress says ``falling_behind``).
    """
    started_ms = round(started * 1000)  # whole milliseconds: no float drift at boundaries
    return (started_ms // interval_ms + 1) * interval_ms / 1000


class IntervalLoop:
    """``ProcessingTime(interval)``: a batch per tick until stopped."""

    drains_backlog = False

    def __init__(self, interval_ms: int) -> None:
        self.interval_ms = interval_ms

    def run(self, runner: BatchRunner) -> None:
        while not runner.stopping():
            tick = runner.now()
            ran = runner.run_batch()
            if runner.stopping():
                return
            if self.interval_ms == 0:
                if not ran:
                    runner.wait(IDLE_POLL_S)
                continue
            runner.wait(max(0.0, next_tick(tick, self.interval_ms) - runner.now()))


class OnceLoop:
    """``Once``: the recovered batch, one uncapped batch, the closing no-data batch."""

    drains_backlog = False

    def run(self, runner: BatchRunner) -> None:
        while runner.has_pending():  # NOTE: two, when a pipelined batch was in flight
            runner.run_batch()
        runner.run_batch(capped=False)
        # the no-data batch that the advanced watermark calls for, no new data
        runner.run_batch(bounds=runner.committed_offsets())
        runner.end_of_input()
        runner.idle()


class AvailableNowLoop:
    """``AvailableNow``: capped batches up to the ends available at start."""

    drains_backlog = True

    def run(self, runner: BatchRunner) -> None:
        targets = runner.available_offsets()
        while not runner.stopping() and runner.run_batch(bounds=targets):
            pass
        runner.end_of_input()
        runner.idle()


def loop_for(trigger: Trigger) -> TriggerLoop:
    """The loop of ``trigger`` (chosen once, when the query is built)."""
    if isinstance(trigger, Once):
        return OnceLoop()
    if isinstance(trigger, AvailableNow):
        return AvailableNowLoop()
    assert isinstance(trigger, ProcessingTime)
    return IntervalLoop(trigger.interval_ms)
