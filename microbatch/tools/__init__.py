"""Tools over tables and logs that are not part of a running query: comparing
two tables (``microbatch diff``)."""

from __future__ import annotations

__all__: list[str] = []
