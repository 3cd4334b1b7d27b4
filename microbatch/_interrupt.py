"""Ctrl-C while the ``microbatch`` command starts: exit 130 with one line, no traceback.

Importing ``microbatch`` (Polars, Arrow, the engine) takes about a second;
a SIGINT in that time would print a ``KeyboardInterrupt`` traceback from deep
inside an import. This module is the first thing ``microbatch`` imports,
and importing it runs :func:`install_if_cli`: in the ``microbatch`` command's
process only (the console script or ``python -m microbatch.cli``; never in a
program that imports the library), SIGINT then writes one line and exits 130 at
once. Nothing has run yet, so there is nothing to finish or recover.

``microbatch.cli.main`` then hands SIGINT back to Python inside its own
``try`` (a ``KeyboardInterrupt`` there is the same line and 130), and the
commands that run a query install their graceful handler
(:class:`microbatch.cli.queries.StopOnSignal`).
"""

from __future__ import annotations

import itertools
import os
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from types import FrameType

EXIT_INTERRUPTED = 130
"""The exit code of a command ended by SIGINT (128 + 2, the shell's convention)."""

MESSAGE = b"\ninterrupted (SIGINT) while starting: nothing was run\n"


def is_cli_process() -> bool:
    """Whether this process is the ``microbatch`` command (script or ``-m microbatch.cli``)."""
    if Path(sys.argv[0]).name == "microbatch" if sys.argv else False:
        return True
    argv = list(getattr(sys, "orig_argv", []))
    return any(a == "-m" and b == "microbatch.cli" for a, b in itertools.pairwise(argv))


def exit_handler(message: bytes) -> Callable[[int, FrameType | None], None]:
    """A SIGINT handler that writes ``message`` on stderr and exits 130 at once,
    without unwinding (nothing runs after it: no ``finally``, no atexit)."""

    def handler(signum: int = signal.SIGINT, frame: FrameType | None = None) -> None:
        os.write(2, message)
        os._exit(EXIT_INTERRUPTED)

    return handler


exit_at_once = exit_handler(MESSAGE)
"""The start-up SIGINT handler: one line on stderr, exit 130, no unwinding."""


def install_if_cli() -> None:
    """In the ``microbatch`` command's main thread, make SIGINT :func:`exit_at_once`
    (unless someone already replaced Python's default handler)."""
    if (threading.current_thread() is threading.main_thread() and is_cli_process()
            and signal.getsignal(signal.SIGINT) is signal.default_int_handler):
        signal.signal(signal.SIGINT, exit_at_once)


install_if_cli()  # on import: `microbatch/__init__.py` imports this module first

__all__ = [
    "EXIT_INTERRUPTED",
    "MESSAGE",
    "exit_at_once",
    "exit_handler",
    "install_if_cli",
    "is_cli_process",
]
