"""Writing input files in a chosen arrival order for file-source tests."""

from __future__ import annotations

import os
from pathlib import Path

import polars as pl


def write_parquet_files(directory: Path, frames: list[pl.DataFrame]) -> list[Path]:
    """Write each frame as one file with increasing mtimes (the arrival order)."""
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
