"""The ``microbatch`` command line (``run``, ``status``, ``report``, ``demo``,
``backfill``, ``diff``): user mistakes are one clear message and exit code 2,
never a traceback."""

from __future__ import annotations

from microbatch.cli.app import main

__all__ = ["main"]
