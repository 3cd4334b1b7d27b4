"""What every kind of state (keyed store, append buffer) shares: one committed
version plus staged changes, committed through the provider or discarded.

A subclass supplies its staged changes as a changelog (``_changelog``), all its
rows (``to_frame``) for a snapshot, whether anything is staged (``_has_staged``)
and what to forget after a commit (``_committed``).
"""

from __future__ import annotations

import time
from typing import Any

import polars as pl

from statestore.contract import VersionKeeper
from statestore.exceptions import StateStoreError

__all__ = ["VersionedState"]


class VersionedState:
    """Committed ``version`` plus staged changes; ``commit()`` or ``abort()``.

    Guarantees: ``commit()`` makes the staged changes durable as ``version + 1``
    or, when writing fails, closes this object (the changes are lost) and
    raises StateStoreError; ``abort()`` discards them and closes it. A closed
    object refuses every call, saying why; the provider then rebuilds from disk.
    """

    _kind = "state"
    _reload = "provider.load(version)"

    def __init__(self, provider: VersionKeeper, version: int) -> None:
        self._provider = provider
        self._version = version
        self._closed: str | None = None
        self._last: dict[str, Any] = {
            "commit_ms": 0.0,
            "load_ms": 0.0,
            "changelog_bytes": 0,
            "snapshot_written": False,
        }

    @property
    def version(self) -> int:
        """The committed version held (plus any staged changes)."""
        return self._version

    def to_frame(self) -> pl.DataFrame:
        """Every row, staged changes included (what a snapshot writes)."""
        raise NotImplementedError

    def commit(self) -> int:
        """Durably write the staged changes as ``version + 1`` and return it.

        The object stays usable as that version. If writing fails it is closed
        and StateStoreError is raised; the caller re-runs the batch from
        ``provider`` at ``version``.
        """
        self._check_open()
        started = time.perf_counter()
        version = self._version + 1
        try:
            changelog_bytes, snapshot = self._provider.write_version(
                self, version, self._changelog(), self.to_frame
            )
        except BaseException as exc:
            self.close(f"its commit of version {version} failed ({exc!r})")
            self._provider.release(self)
            if isinstance(exc, OSError):
                raise StateStoreError(
                    f"commit of state version {version} in {self._provider.directory} failed: "
                    f"{exc}. Load version {version - 1} and re-run the batch (a partly "
                    f"written version {version} is then discarded)."
                ) from exc
            raise
        self._version = version
        self._committed()
        self._last.update(
            commit_ms=(time.perf_counter() - started) * 1000,
            changelog_bytes=changelog_bytes,
            snapshot_written=snapshot,
        )
        return version

    def abort(self) -> None:
        """Discard staged changes and close; the provider's next load rebuilds from disk."""
        if self._closed is None:
            self.close("it was aborted")
            self._provider.release(self)

    # ------------------------------------------- called by the provider only

    def holds_committed(self, version: int) -> bool:
        """True when this is exactly committed ``version``: open, nothing staged."""
        return self._closed is None and not self._has_staged() and self._version == version

    def begin_batch(self, load_ms: float) -> None:
        """Reset per-batch metrics (the provider, on each load)."""
        self._last.update(load_ms=load_ms, commit_ms=0.0, changelog_bytes=0, snapshot_written=False)

    def close(self, reason: str) -> None:
        """Make every later call fail, saying ``reason`` (a newer load replaced it)."""
        self._closed = reason

    # ----------------------------------------------------------- subclasses

    def _changelog(self) -> pl.DataFrame:
        raise NotImplementedError

    def _has_staged(self) -> bool:
        raise NotImplementedError

    def _committed(self) -> None:
        """Forget the staged changes just written."""
        raise NotImplementedError

    def _check_open(self) -> None:
        if self._closed is not None:
            raise StateStoreError(
                f"this {type(self).__name__} (version {self._version}) can no longer be used "
                f"because {self._closed}; call {self._reload} for a fresh one"
            )
