"""The ``microbatch`` command line (``run``, ``status``, ``report``, ``demo``,
``backfill``, ``diff``, ``lateness``): user mistakes are one clear message and
exit code 2, never a traceback; Ctrl-C at any moment is exit code 130.

Importing this package is cheap: the commands are imported when :func:`main`
runs (Ctrl-C before that: :mod:`microbatch._interrupt`).
"""

from __future__ import annotations


def main() -> None:
    """Entry point of the ``microbatch`` console script."""
    from microbatch.cli.app import main as run_app

    run_app()


__all__ = ["main"]
