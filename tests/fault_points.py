"""Stopping an in-process query at a fault point (``MICROBATCH_FAULT``), for the
recovery tests of sources and sinks."""

from __future__ import annotations

from collections.abc import Callable

import pytest

import microbatch as mb
from microbatch.engine.faults import InjectedFault


def raise_at(monkeypatch: pytest.MonkeyPatch, point: str,
             start: Callable[[], mb.StreamingQuery]) -> None:
    """Start a query with the fault ``point`` (e.g. ``"after_sink@2"``) set to raise,
    check that it stopped there, and clear the fault for the next start."""
    monkeypatch.setenv("MICROBATCH_FAULT", point)
    monkeypatch.setenv("MICROBATCH_FAULT_ACTION", "raise")
    query = start()
    with pytest.raises(mb.QueryTerminatedError):
        query.await_termination(60)
    assert isinstance(query.exception, InjectedFault)
    monkeypatch.delenv("MICROBATCH_FAULT")
