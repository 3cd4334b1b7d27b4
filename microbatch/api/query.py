"""The handle of a running query: ``StreamingQuery``.

A query runs its trigger loop in a background thread, so a notebook kernel
or a test keeps control; the CLI waits on it with ``await_termination``.
When a batch fails, the query thread records the error in ``chk/last_error``
(for ``microbatch status``); a run that starts successfully removes it.
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from typing import TYPE_CHECKING, Any

from microbatch.engine.execution import MicroBatchExecution
from microbatch.exceptions import QueryTerminatedError
from microbatch.observability.progress import clear_last_error, write_last_error
from microbatch.observability.progress_schema import ProgressRecord

if TYPE_CHECKING:
    from microbatch.observability.prometheus import MetricsServer
    from microbatch.observability.snapshot import QuerySnapshot

log = logging.getLogger("microbatch.api.query")

MAX_TRACEBACK_CHARS = 20_000
"""The end of a failed query's traceback kept in ``chk/last_error``."""


class StreamingQuery:
    """A started query. Thread-safe; every method may be called from any thread.

    ``id`` is stable across restarts of the same checkpoint; ``run_id``
    changes each start. The query runs its trigger loop in a background
    thread; ``await_termination`` waits for it and ``stop`` ends it
    gracefully.

    Examples
    --------
    >>> stream = mb.read_memory(pl.DataFrame({"x": [1, 2, 3]}))
    >>> query = stream.write_memory("doc_streaming_query").start(trigger="available-now")
    >>> query.await_termination()
    True
    >>> query.is_active, query.exception
    (False, None)
    >>> query
    <StreamingQuery id=... active=False status='stopped'>
    """

    def __init__(self, execution: MicroBatchExecution, *, name: str | None = None) -> None:
        self._exec = execution
        self.name = name
        self._exception: BaseException | None = None
        self._done = threading.Event()
        self._started = threading.Event()
        self._open_failed = False
        self._metrics: MetricsServer | None = None
        self._thread = threading.Thread(
            target=self._run, name=f"microbatch-{name or 'query'}", daemon=True
        )

    def _start(
        self, *, metrics_port: int | None = None, metrics_host: str = "127.0.0.1"
    ) -> StreamingQuery:
        if metrics_port is not None:  # bound first: a busy port fails before anything runs
            from microbatch.observability.prometheus import MetricsServer

            self._metrics = MetricsServer(self.snapshot, port=metrics_port, host=metrics_host)
        self._thread.start()
        self._started.wait()
        if self._open_failed:
            self._thread.join()
            self._stop_metrics()
            assert self._exception is not None
            raise self._exception
        return self

    def _run(self) -> None:
        try:
            self._exec.open()
        except BaseException as exc:
            self._exception = exc
            self._open_failed = True
            self._done.set()
            self._started.set()
            return
        self._started.set()
        try:
            clear_last_error(self._exec.checkpoint.root)
            self._exec.run()
            caught_up = self._exec.caught_up
            self._exec.status_message = "stopped" if caught_up is None else f"stopped: {caught_up}"
            if caught_up is not None:
                # WARNING: shown on stderr by default (no handler needed), so that a
                # re-run script printing an empty result says why
                log.warning("query %s: %s", self.id, caught_up)
        except BaseException as exc:
            self._exception = exc
            self._exec.status_message = f"failed: {exc}"
            log.error("query %s failed:\n%s", self.id, traceback.format_exc())
            self._record_error(exc)
        finally:
            self._exec.close()
            self._stop_metrics()
            self._done.set()
            with self._exec.cond:
                self._exec.cond.notify_all()

    def _record_error(self, exc: BaseException) -> None:
        """Write ``chk/last_error`` (the lock is still held: nobody else writes)."""
        ex = self._exec
        now = time.time()
        doc = {
            "query_id": ex.query_id,
            "run_id": ex.run_id,
            "name": self.name,
            "batch_id": ex.pending.batch_id if ex.pending is not None else ex.next_batch_id,
            "type": type(exc).__name__,
            "message": str(exc),
            "traceback": traceback.format_exc()[-MAX_TRACEBACK_CHARS:],
            "failed_at_ms": int(now * 1000),
            "failed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now)),
        }
        try:
            write_last_error(ex.checkpoint.root, doc)
        except OSError as write_error:  # never hide the query's own error
            log.warning("could not record the error in %s: %s", ex.checkpoint.root, write_error)

    def _stop_metrics(self) -> None:
        server, self._metrics = self._metrics, None
        if server is not None:
            server.stop()

    @property
    def id(self) -> str:
        """The query id recorded in the checkpoint's metadata."""
        return self._exec.query_id

    @property
    def run_id(self) -> str:
        """Unique to this start of the query."""
        return self._exec.run_id

    @property
    def checkpoint(self) -> str:
        return str(self._exec.checkpoint.root)

    @property
    def is_active(self) -> bool:
        return not self._done.is_set()

    @property
    def exception(self) -> BaseException | None:
        """The error that stopped the query, or ``None``."""
        return self._exception

    @property
    def status(self) -> dict[str, Any]:
        """What the query is doing now (JSON-serializable).

        Returns
        -------
        dict
            ``message`` (e.g. ``"running"``, ``"stopped"``, ``"failed: ..."``,
            ``"stopped: nothing new since batch 4: ..."``), ``is_active``,
            ``next_batch_id``, ``falling_behind`` (a batch overran its trigger
            interval) and ``caught_up`` (a bounded run found nothing new in its
            sources, so it ran no batch: the checkpoint already holds everything).

        Examples
        --------
        >>> stream = mb.read_memory(pl.DataFrame({"x": [1, 2, 3]}), max_records_per_batch=2)
        >>> query = stream.write_memory("doc_status").start(trigger="available-now")
        >>> query.await_termination()
        True
        >>> status = query.status
        >>> status["message"], status["is_active"], status["next_batch_id"], status["caught_up"]
        ('stopped', False, 2, False)

        Started again on the same checkpoint with nothing new, the run says so:

        >>> again = stream.write_memory("doc_status").start(
        ...     query.checkpoint, trigger="available-now")
        >>> again.await_termination()
        True
        >>> again.status["caught_up"], again.status["message"].split(":")[:2]
        (True, ['stopped', ' nothing new since batch 1'])
        """
        ex = self._exec
        return {
            "message": ex.status_message,
            "is_active": self.is_active,
            "next_batch_id": ex.next_batch_id,
            "falling_behind": ex.falling_behind,
            "caught_up": ex.caught_up is not None,
        }

    @property
    def last_progress(self) -> ProgressRecord | None:
        """The progress record of the newest batch, or ``None``.

        A record is a JSON-serializable dict: ``batch_id``, ``input_rows``,
        ``output_rows``, ``late_rows``, ``dead_letter_rows``, the watermark in
        force (``watermark_ms``) and the next one, durations, per-source offsets
        and lag, state sizes and more; its schema is the typed, versioned
        :class:`~microbatch.observability.progress_schema.ProgressRecord`.
        After a restart it starts from the records kept in the checkpoint.

        Examples
        --------
        >>> stream = mb.read_memory(pl.DataFrame({"x": [1, 2, 3]}))
        >>> query = stream.write_memory("doc_last_progress").start(trigger="available-now")
        >>> query.await_termination()
        True
        >>> p = query.last_progress
        >>> p["batch_id"], p["input_rows"], p["output_rows"], p["trigger"]
        (0, 3, 3, 'available-now')
        """
        recent = self._exec.progress.recent
        return recent[-1] if recent else None

    @property
    def recent_progress(self) -> list[ProgressRecord]:
        """Progress records of recent batches, oldest first.

        Each record is as :attr:`last_progress`; the records of older batches are
        dropped as new ones arrive.

        Examples
        --------
        >>> stream = mb.read_memory(pl.DataFrame({"x": [1, 2, 3, 4, 5]}), max_records_per_batch=2)
        >>> query = stream.write_memory("doc_recent_progress").start(trigger="available-now")
        >>> query.await_termination()
        True
        >>> [(p["batch_id"], p["input_rows"]) for p in query.recent_progress]
        [(0, 2), (1, 2), (2, 1)]
        """
        return list(self._exec.progress.recent)

    def snapshot(self) -> QuerySnapshot:
        """The query as of now, for views (notebook, ``explain``, Prometheus)."""
        from microbatch.observability.snapshot import QuerySnapshot

        ex = self._exec
        recent, totals = ex.progress.snapshot()
        return QuerySnapshot(
            id=ex.query_id,
            run_id=ex.run_id,
            name=self.name,
            checkpoint=str(ex.checkpoint.root),
            trigger=str(ex.trigger),
            message=ex.status_message,
            is_active=self.is_active,
            failed=self._exception is not None,
            metrics_url=self.metrics_url,
            recent=recent,
            totals=totals,
            plan=ex.plan,
            node_ids=ex.executor.node_ids(),
        )

    @property
    def metrics_url(self) -> str | None:
        """Where Prometheus metrics are served (``start(metrics_port=...)``), or ``None``."""
        return None if self._metrics is None else self._metrics.url

    def explain(self) -> None:
        """Print the plan with its stateful operators, state sizes and watermarks.

        The figures are live: the query's status, the state rows and bytes of
        each stateful operator, the watermark and what holds it per partition,
        each source's position and lag, and a summary of the newest batch.
        :meth:`explain_text` returns the same text.

        Examples
        --------
        >>> from datetime import datetime
        >>> events = pl.DataFrame(
        ...     {"ts": [datetime(2026, 1, 1, 0, 0, s) for s in (5, 30, 50)], "k": [1, 1, 2]}
        ... )
        >>> query = (
        ...     mb.read_memory(events)
        ...     .with_watermark("ts", "10s")
        ...     .group_by(mb.window("ts", "1m"), "k")
        ...     .agg(pl.len().alias("n"))
        ...     .write_memory("doc_explain")
        ...     .start(trigger="available-now")
        ... )
        >>> query.await_termination()
        True
        >>> query.explain()
        StreamingQuery ... [stopped]
        checkpoint: ...
        trigger: available-now
        <BLANKLINE>
        == Plan (root first), with state and watermarks ==
        Aggregate[kind=window, column=ts, ...; keys=['k']](len() as n)  [stateful]
          └ state agg-0: 2 rows, ...
          Watermark(ts, delay=10000ms)
            └ watermark wm-0: query watermark 2026-01-01T00:00:40.000+00:00 ...
        ...
        """
        print(self.explain_text())  # printing is the point, as in Spark

    def explain_text(self) -> str:
        """What :meth:`explain` prints: the plan annotated with live figures."""
        from microbatch.observability.query_view import explain_text

        return explain_text(self.snapshot())

    def _repr_html_(self) -> str:
        """Notebook view: status, the newest batch, and a table of recent batches."""
        from microbatch.observability.query_view import query_html

        return query_html(self.snapshot())

    def stop(self, timeout: float | None = None) -> None:
        """Finish the batch in flight, commit it, then stop; waits for that.

        A stopped query can be started again on the same checkpoint
        (``writer.start(checkpoint)``) and resumes where it stopped.
        :meth:`request_stop` asks for the same without waiting.

        Parameters
        ----------
        timeout
            Wait at most this many seconds (``None``: until the query stopped).

        Examples
        --------
        >>> src = mb.read_memory(schema={"x": pl.Int64})
        >>> query = src.write_memory("doc_stop").start(trigger="1s")
        >>> query.is_active
        True
        >>> _ = src.add({"x": [1, 2]})
        >>> query.process_all_available()
        >>> query.stop()
        >>> query.is_active, query.status["message"]
        (False, 'stopped')
        >>> mb.table("doc_stop")["x"].to_list()
        [1, 2]
        """
        self._exec.stop_requested.set()
        self._exec.wake.set()
        self._done.wait(timeout)

    def request_stop(self) -> None:
        """Ask for a graceful stop without waiting (safe in signal handlers)."""
        self._exec.stop_requested.set()
        self._exec.wake.set()

    def await_termination(self, timeout: float | None = None) -> bool:
        """Wait until the query stops; re-raise the error that stopped it.

        Parameters
        ----------
        timeout
            Wait at most this many seconds (``None``: as long as it takes).

        Returns
        -------
        bool
            ``True`` when the query has terminated, ``False`` when the timeout
            passed first.

        Raises
        ------
        QueryTerminatedError
            When a batch failed and stopped the query; ``__cause__`` holds the
            error.

        Examples
        --------
        A query with ``trigger="available-now"`` stops once it processed what was
        available at its start:

        >>> stream = mb.read_memory(pl.DataFrame({"x": [1, 2, 3]}))
        >>> query = stream.write_memory("doc_await").start(trigger="available-now")
        >>> query.await_termination()
        True

        A query that runs until stopped is still active when the timeout passes:

        >>> live = mb.read_memory(schema={"x": pl.Int64}).write_memory("doc_await_live").start()
        >>> live.await_termination(timeout=0.1)
        False
        >>> live.stop()

        The error of a failed batch is raised again, wrapped:

        >>> def fail(df):
        ...     raise ValueError("bad batch")
        >>> broken = (
        ...     mb.read_memory(pl.DataFrame({"x": [1]}))
        ...     .map_batches(fail)
        ...     .write_memory("doc_await_failed")
        ...     .start(trigger="available-now")
        ... )
        >>> broken.await_termination()
        Traceback (most recent call last):
        ...
        microbatch.exceptions.QueryTerminatedError: query ... stopped with an error: ...bad batch
        >>> type(broken.exception).__name__
        'ValueError'
        """
        if not self._done.wait(timeout):
            return False
        self._thread.join()
        self._raise_if_failed()
        return True

    def process_all_available(self, timeout: float | None = None) -> None:
        """Block until every record available at the time of the call is processed.

        Meant for notebooks and tests: it wakes the trigger loop instead of
        waiting for the next tick, and returns once the batches that the records
        (and the watermark they advance) call for are committed.

        Parameters
        ----------
        timeout
            Give up after this many seconds (``None``: as long as it takes).

        Raises
        ------
        QueryTerminatedError
            If the query fails meanwhile.
        TimeoutError
            When ``timeout`` seconds pass first.

        Examples
        --------
        >>> src = mb.read_memory(schema={"x": pl.Int64})
        >>> query = src.with_columns(y=pl.col("x") * 10).write_memory("doc_process_all").start()
        >>> _ = src.add({"x": [1, 2]})
        >>> query.process_all_available()
        >>> mb.table("doc_process_all")["y"].to_list()
        [10, 20]
        >>> _ = src.add({"x": [3]})
        >>> query.process_all_available()
        >>> mb.table("doc_process_all")["y"].to_list()
        [10, 20, 30]
        >>> query.stop()
        """
        ex = self._exec
        deadline = None if timeout is None else time.monotonic() + timeout
        with ex.cond:
            target = ex.plans_started + 1
        ex.wake.set()
        with ex.cond:
            while ex.last_idle_plan < target and not self._done.is_set():
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise TimeoutError("process_all_available timed out")
                ex.cond.wait(0.1 if remaining is None else min(0.1, remaining))
                ex.wake.set()
        self._raise_if_failed()

    def _raise_if_failed(self) -> None:
        if self._exception is not None:
            raise QueryTerminatedError(
                f"query {self.id or self.name} stopped with an error: {self._exception}"
            ) from self._exception

    def __repr__(self) -> str:
        message = self.status["message"]
        return f"<StreamingQuery id={self.id} active={self.is_active} status={message!r}>"
