"""Every error the engine raises on purpose, and the tuple of user errors.

Each class names one kind of problem; every message says what went wrong,
where (batch id, file, source) and what the user can do about it.

One root: :class:`MicrobatchError` (defined in ``statestore.exceptions``, the
lowest layer, and re-exported here and as ``microbatch.MicrobatchError``) is the
base of the engine's errors below, of ``sinks.exceptions.SinkError`` and of
``statestore.exceptions.StateStoreError``. Deliberately outside it:
``microbatch.engine.faults.InjectedFault`` (a test's stand-in for a crash).
"""

from __future__ import annotations

from typing import Any

from statestore.exceptions import MicrobatchError

__all__ = [
    "USER_ERRORS",
    "ChangeDataFeedError",
    "ChangelogInputError",
    "CheckpointCorruptError",
    "CheckpointError",
    "CheckpointFormatError",
    "CheckpointLockedError",
    "DurationError",
    "ExecutorError",
    "IncompatibleCheckpointError",
    "JobError",
    "MicrobatchError",
    "PlanError",
    "PromoteError",
    "QueryTerminatedError",
    "ReplayError",
    "SQLError",
    "SavepointError",
    "SourceError",
    "StateBudgetExceededError",
    "StateReadError",
    "TransformError",
    "TriggerError",
    "UnknownColumnError",
]

USER_ERRORS: tuple[type[BaseException], ...] = (MicrobatchError,)
"""The errors that are the user's to fix, stated once: the CLI prints one as a
paragraph with exit code 2 (not a traceback), and the crash explorer counts a
restart that refuses with one as a clear refusal. Every error the project
raises on purpose (engine, state store, sinks, CLI) derives from
:class:`MicrobatchError`; anything else (a Polars or Arrow error, an
``AssertionError``) is a bug."""


class PlanError(MicrobatchError):
    """The query cannot be built as written (wrong option, unsupported step)."""


class ChangelogInputError(PlanError):
    """An operator cannot take a changelog input (rows carrying ``_change_type``)
    as written: a window, session, dedupe or interval join over change rows, or
    an aggregate that cannot be retracted in constant state. The message names
    the alternative."""


class UnknownColumnError(PlanError):
    """A query names a column its stream does not have (refused when the query is
    built, when the stream's schema is known). ``column`` is the name given,
    ``candidates`` the closest existing names."""

    def __init__(self, message: str, *, column: str, candidates: list[str]) -> None:
        super().__init__(message)
        self.column = column
        self.candidates = candidates

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickle with the keyword fields (a query's error may cross processes)."""
        return (_unknown_column_error, (str(self), self.column, self.candidates))


def _unknown_column_error(message: str, column: str, candidates: list[str]) -> UnknownColumnError:
    return UnknownColumnError(message, column=column, candidates=candidates)


class SQLError(PlanError):
    """A SQL text cannot be parsed, or names a construct the engine cannot run
    incrementally; refused when the query is built, never a wrong result.

    ``line`` and ``column`` (1-based) point at the construct in the SQL text,
    ``construct`` names it (``"CUMULATE"``, ``"ORDER BY"``, ``"syntax"``) and
    ``fix`` says what to write instead. The message carries all four."""

    def __init__(self, problem: str, *, line: int, column: int, construct: str, fix: str) -> None:
        super().__init__(f"SQL line {line}, column {column}: {construct}: {problem} {fix}".rstrip())
        self.problem = problem
        self.line = line
        self.column = column
        self.construct = construct
        self.fix = fix

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickle with the keyword fields (a query's error may cross processes)."""
        return (
            _sql_error,
            (self.problem, self.line, self.column, self.construct, self.fix),
        )


def _sql_error(problem: str, line: int, column: int, construct: str, fix: str) -> SQLError:
    return SQLError(problem, line=line, column=column, construct=construct, fix=fix)


class DurationError(PlanError):
    """A duration string such as ``"10s"`` could not be parsed."""


class TriggerError(PlanError):
    """A trigger string is not one of ``"once"``, ``"available-now"`` or an interval."""


class TransformError(PlanError):
    """A ``transform_with_state`` function raised, or answered rows, state or timers
    that do not fit the declared schemas; the batch is not committed."""


class SourceError(MicrobatchError):
    """A source could not list or read its data."""


class ChangeDataFeedError(SourceError):
    """A Delta table version has no change data feed (``read_delta(changes=True)``):
    it removes or rewrites data while ``delta.enableChangeDataFeed`` was off. The
    message names the version and how to turn the feed on."""


class CheckpointError(MicrobatchError):
    """The checkpoint directory cannot be used."""


class CheckpointCorruptError(CheckpointError):
    """A checkpoint file is truncated, fails its checksum, or is not ours."""


class CheckpointFormatError(CheckpointError):
    """A checkpoint file was written by a newer format than this engine reads."""


class CheckpointLockedError(CheckpointError):
    """Another running query holds the checkpoint's lock."""


class IncompatibleCheckpointError(CheckpointError):
    """The checkpoint was written by a job whose sources or operators differ."""


class StateReadError(CheckpointError):
    """An operator's state cannot be read offline as asked (``read_state``,
    ``microbatch state``): no such operator or committed batch, a purged version;
    the message lists what can be read."""


class SavepointError(CheckpointError):
    """A savepoint cannot be written, or a job cannot start from it: the message
    names every incompatibility between the savepoint's state and the new job."""


class ReplayError(CheckpointError):
    """A replay (``microbatch replay``) cannot run as asked: the old checkpoint no
    longer holds the batches, the job reads other sources than the ones it
    recorded, or the new checkpoint is not a fresh one nor an interrupted replay
    of the same batches. The message says what differs and how to fix it."""


class JobError(MicrobatchError):
    """A job file cannot be loaded or its ``build`` function misbehaves."""


class QueryTerminatedError(MicrobatchError):
    """A streaming query stopped because a batch failed; ``__cause__`` holds why."""


class ExecutorError(MicrobatchError):
    """The executor that runs a query's plan elsewhere (Ray) is unusable: its
    extra is not installed, its cluster cannot be reached, or its workers kept
    dying; the batch was not committed and re-runs from the checkpoint."""


class StateBudgetExceededError(MicrobatchError):
    """The query's state outgrew its ``state_memory_budget`` in a batch; the
    message names the largest operators and how to bound them. The batch was
    not committed: a restart with a larger budget, a TTL or a shorter window
    re-runs it from the checkpoint.

    Attributes: ``batch_id``, ``budget_bytes``, ``state_bytes`` and
    ``operators`` (one dict per stateful operator, the largest first:
    ``operator``, ``kind``, ``keys``, ``bytes``, ``rows``)."""

    def __init__(
        self,
        message: str,
        *,
        batch_id: int,
        budget_bytes: int,
        state_bytes: int,
        operators: list[dict[str, Any]],
    ) -> None:
        super().__init__(message)
        self.batch_id = batch_id
        self.budget_bytes = budget_bytes
        self.state_bytes = state_bytes
        self.operators = operators

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickle with the keyword fields (a query's error may cross processes)."""
        return (_budget_error, (str(self), self.batch_id, self.budget_bytes,
                                self.state_bytes, self.operators))


def _budget_error(message: str, batch_id: int, budget_bytes: int, state_bytes: int,
                  operators: list[dict[str, Any]]) -> StateBudgetExceededError:
    return StateBudgetExceededError(message, batch_id=batch_id, budget_bytes=budget_bytes,
                                    state_bytes=state_bytes, operators=operators)


class PromoteError(MicrobatchError):
    """``microbatch promote`` cannot swap a rebuild into a live table (a writer
    still running, a batch not committed, a table missing); nothing was changed."""
