"""Shared fixtures: small factories with sensible defaults."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

_names = itertools.count()


@pytest.fixture
def table_name() -> str:
    """A fresh memory-sink table name per test."""
    return f"t{next(_names)}"


@pytest.fixture
def chk(tmp_path: Path) -> Path:
    """A checkpoint directory path (not yet created)."""
    return tmp_path / "chk"
