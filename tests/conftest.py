"""Shared fixtures: small factories with sensible defaults."""

from __future__ import annotations

import itertools
from pathlib import Path

import polars as pl
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


def write_parquet_files(directory: Path, frames: list[pl.DataFrame]) -> list[Path]:
    """Write each frame as one file with increasing mtimes (the arrival order)."""
    import os

    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, frame in enumerate(frames):
        path = directory / f"part-{i:05d}.parquet"
        frame.write_parquet(path)
        os.utime(
            path,
            ns=(
                1_700_000_000_000_000_000 + i * 1_000_000,
                1_700_000_000_000_000_000 + i * 1_000_000,
            ),
        )
        paths.append(path)
    return paths
