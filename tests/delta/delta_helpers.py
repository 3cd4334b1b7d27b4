"""Helpers shared by the Delta tests: data factories and table inspection."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import polars as pl


def transactions(start_id: int, n: int, *, day0: datetime | None = None,
                 minutes_per_row: int = 7, cards: int = 13) -> pl.DataFrame:
    """Card transactions with increasing event times (one row every few minutes)."""
    base = day0 or datetime(2026, 1, 1, tzinfo=UTC)
    ids = list(range(start_id, start_id + n))
    return pl.DataFrame(
        {
            "event_id": ids,
            "card_id": [i % cards for i in ids],
            "merchant": [f"m{i % 5}" for i in ids],
            "amount": [round((i * 37 % 1000) / 10, 2) for i in ids],
            "event_time": [base + timedelta(minutes=minutes_per_row * i) for i in ids],
        },
        schema={"event_id": pl.Int64, "card_id": pl.Int64, "merchant": pl.String,
                "amount": pl.Float64, "event_time": pl.Datetime("us", "UTC")},
    )


def append_versions(path: str, frames: list[pl.DataFrame], *,
                    storage_options: dict[str, str] | None = None,
                    partition_by: list[str] | None = None) -> None:
    """Append each frame as one Delta version."""
    from deltalake import write_deltalake

    for frame in frames:
        write_deltalake(path, frame.to_arrow(), mode="append", partition_by=partition_by,
                        storage_options=storage_options)


def operations(path: str, storage_options: dict[str, str] | None = None) -> list[str]:
    """The table's commit operations, oldest first."""
    from deltalake import DeltaTable

    history = DeltaTable(path, storage_options=storage_options).history()
    return [h["operation"] for h in sorted(history, key=lambda h: h["version"])]
