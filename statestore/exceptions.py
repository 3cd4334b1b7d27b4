"""Every error the state store raises on purpose, and the root of every error
the project raises on purpose.

Each class names one kind of problem; every message says what went wrong,
where (directory, file, version) and what the caller can do about it.

:class:`MicrobatchError` is defined here, in the lowest layer, so that the
engine's errors (``microbatch.exceptions``), the sinks' (``sinks.exceptions``)
and the state store's derive from one class while ``statestore`` and ``sinks``
never import ``microbatch``. The engine re-exports it as
``microbatch.MicrobatchError``.
"""

from __future__ import annotations

__all__ = ["MicrobatchError", "StateCorruptError", "StateStoreError"]


class MicrobatchError(Exception):
    """Base class of every error raised on purpose by microbatch: the engine,
    the state store and the sinks.

    Its message names what went wrong, where and what to do, so the CLI
    reports one as a paragraph with exit code 2 rather than a traceback
    (``microbatch.exceptions.USER_ERRORS``).
    """


class StateStoreError(MicrobatchError):
    """Base class of all errors raised by :mod:`statestore`.

    Raised directly for misuse: a frame without the schema's columns, duplicate
    keys in one ``upsert``, a store used after ``abort()``, a state directory
    written with another schema.
    """


class StateCorruptError(StateStoreError):
    """A committed version cannot be loaded from disk.

    A file is missing from the version's chain (snapshot + changelogs), is
    truncated, fails its checksum or is not a state store file. The message
    names the file and what to do; the store never silently starts empty.
    """
