"""Every error the state store raises on purpose.

Each class names one kind of problem; every message says what went wrong,
where (directory, file, version) and what the caller can do about it.
"""

from __future__ import annotations


class StateStoreError(Exception):
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
