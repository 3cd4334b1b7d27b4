"""A pipelined batch's second half: sink and commit of batch N on one
background thread while the query's thread reads and executes batch N+1.

One batch at a time: :meth:`Committer.hand_off` takes a batch only after the
previous one was settled (:meth:`Committer.settle`), so the sinks see batch ids
in order and ``commits/N`` is always written before ``commits/N+1``. The thread
runs at the query's durability level (fsyncs are per thread, see
:mod:`microbatch.engine.durability`). An error of the background half is raised
by the next :meth:`settle`, in the query's thread, with the batch id it belongs to.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from microbatch.engine.durability import Durability, durability_level

__all__ = ["Committer"]

log = logging.getLogger("microbatch.engine.committer")


class Committer:
    """Runs each handed-off batch's ``finish`` on one background thread, in order.

    Guarantees: at most one batch is in flight; :meth:`settle` returns only
    when it finished (and re-raises what it raised); :meth:`close` waits for
    it and never raises.
    """

    def __init__(self, durability: Durability, name: str | None = None) -> None:
        self._durability = durability
        self._name = f"microbatch-commit-{name}" if name else "microbatch-commit"
        self._pool: ThreadPoolExecutor | None = None
        self._future: Future[None] | None = None
        self._batch_id: int | None = None

    @property
    def in_flight(self) -> int | None:
        """The batch handed off and not settled yet, if any."""
        return self._batch_id

    def hand_off(self, batch_id: int, finish: Callable[[], None]) -> None:
        """Run ``finish`` (batch ``batch_id``'s sink and commit) in the background."""
        if self._future is not None:
            raise RuntimeError(f"batch {self._batch_id} is still in flight; settle it first")
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix=self._name)
        self._batch_id = batch_id
        self._future = self._pool.submit(self._run, finish)

    def _run(self, finish: Callable[[], None]) -> None:
        with durability_level(self._durability):
            finish()

    def settle(self) -> int | None:
        """Wait for the batch in flight; its id (``None``: there was none).

        Raises what its sink or commit raised; the batch then stays uncommitted
        and a restart re-runs it from its write-ahead entry."""
        future, batch_id = self._future, self._batch_id
        if future is None:
            return None
        try:
            future.result()
        finally:
            self._future = self._batch_id = None
        return batch_id

    def close(self) -> None:
        """Wait for the batch in flight (logging its error), then stop the thread."""
        try:
            self.settle()
        except BaseException as exc:
            log.error("the sink or commit of a pipelined batch failed while closing: %r", exc)
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
