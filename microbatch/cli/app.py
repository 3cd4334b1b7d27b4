"""The ``microbatch`` command line: ``run``, ``sql``, ``status``, ``report``, ``demo``,
``backfill``, ``replay``, ``diff``, ``lateness``, ``promote``, ``state`` and
``savepoint``; each command lives in a module of this package (``queries``,
``inspect``, ``tables``, ``promote``, ``state``) and registers on the one app.

Exit codes:

- ``0``: the query ended (its trigger finished, or a first SIGTERM stopped it
  after the batch in flight was committed);
- ``1``: the query failed while running a batch (the message names the cause;
  the batch was not committed and is retried on the next start);
- ``2``: the command could not start: a wrong option, a job file problem, an
  unknown or mistyped ``--param``, a missing or Delta input of ``read_files``,
  an unwritable output, a native library's panic at start, a checkpoint that
  is locked, corrupt or unwritable, or a bad trigger;
- ``130``: SIGINT: a first one stopped the query after the batch in flight was
  committed, or came before the query started (nothing ran); a second signal
  ended the process at once (the batch in flight is recovered from its
  write-ahead entry on the next start).

User mistakes are reported as one red paragraph on stderr, never a Python
traceback (``--verbose`` adds the traceback of a failed query).
"""

from __future__ import annotations

import signal
import sys

from microbatch._interrupt import EXIT_INTERRUPTED, exit_handler
from microbatch.cli import inspect, promote, queries, tables
from microbatch.cli import sql as sql_command
from microbatch.cli import state as state_command
from microbatch.cli.common import JobCommand, app

__all__ = ["app", "main"]

for command in (queries.run, sql_command.sql, inspect.status, inspect.report, queries.demo,
                queries.backfill, queries.replay, tables.diff, tables.lateness,
                promote.promote, state_command.state, state_command.savepoint):
    # in the order of `microbatch --help`; a command taking a job lists its parameters
    job_command = command in (queries.run, queries.backfill, queries.replay)
    app.command(cls=JobCommand if job_command else None)(command)


def main() -> None:
    """Entry point of the ``microbatch`` console script.

    Until a command installs its own SIGINT handler (a query's graceful stop,
    ``status --watch``'s end), SIGINT writes one line and exits 130 at once
    (:func:`_interrupted`). It does not raise ``KeyboardInterrupt`` into
    whatever is running: CPython 3.11 marks a ``KeyboardInterrupt`` that leaves
    a string ``exec``/``eval`` (dataclasses and typing run them while Typer
    imports pydantic) as unhandled and kills the process with SIGINT at exit,
    even after the CLI caught it and chose exit code 130. A command that hands
    SIGINT back to Python still ends with 130 through the ``except``.
    """
    try:
        signal.signal(signal.SIGINT, _interrupted)
        app()
    except KeyboardInterrupt:
        sys.exit(EXIT_INTERRUPTED)


_interrupted = exit_handler(b"\ninterrupted (SIGINT)\n")
"""Nothing to finish: no command has started work yet."""


if __name__ == "__main__":
    main()
