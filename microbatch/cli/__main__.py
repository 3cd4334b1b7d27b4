"""``python -m microbatch.cli`` is the ``microbatch`` command."""

from __future__ import annotations

from microbatch.cli.app import main

main()
