"""Fixtures of the observability tests."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest

_names = itertools.count()


@pytest.fixture
def t0() -> datetime:
    """An event-time origin one hour ago, on a whole minute (windows align to it)."""
    now = datetime.now(UTC) - timedelta(hours=1)
    return now.replace(second=0, microsecond=0)


@pytest.fixture
def name() -> Callable[[], str]:
    """Fresh memory-table names."""
    return lambda: f"obs{next(_names)}"
