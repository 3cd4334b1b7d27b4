"""Durable file writes for the sinks: a copy of ``statestore/durable.py``.

Crash safety rests on three POSIX habits, done here and nowhere else:

1. a new file is written under a temp name in the target's directory, its data
   ``fsync``'ed, then ``rename``'d over the target, so a reader sees the old
   file or the whole new one, never a torn one;
2. the directory is ``fsync``'ed after a create, rename or unlink, so the name
   itself survives a power loss;
3. errors name the target file (``os.write`` errors carry no file name).

The layering rule lets sinks import only their own dependencies, never
``statestore``, so this is a copy of ``statestore/durable.py`` (everything below
the docstring is identical; ``tests/test_structure.py`` checks it).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

__all__ = ["fsync_dir", "fsync_file", "without_fsync", "write_atomic", "write_with"]

TMP_SUFFIX = ".tmp"
"""Temp files are ``.<name>.<pid>.tmp`` next to their target: a reader ignores them."""


def temp_path(path: Path) -> Path:
    """Where ``path`` is written before the rename that publishes it."""
    return path.with_name(f".{path.name}.{os.getpid()}{TMP_SUFFIX}")


_thread = threading.local()


@contextmanager
def without_fsync() -> Iterator[None]:
    """In the calling thread, skip every fsync of this module until the block ends.

    Writes stay atomic (temp file + rename), so they survive the process
    crashing (the kernel keeps the page cache), but not the machine crashing or
    losing power. Per thread, so one query's choice never weakens another's.
    """
    before = getattr(_thread, "skip", False)
    _thread.skip = True
    try:
        yield
    finally:
        _thread.skip = before


def _fsync_wanted() -> bool:
    return not getattr(_thread, "skip", False)


def fsync_dir(path: Path) -> None:
    """Make a create, rename or unlink inside directory ``path`` durable."""
    if not _fsync_wanted():
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_file(path: Path) -> None:
    """Flush a file's data to disk."""
    fsync_dir(path)  # the same call: open read-only, fsync, close


def write_atomic(
    path: Path, data: bytes | Sequence[bytes | memoryview], *, durable: bool = True
) -> int:
    """Replace ``path`` with ``data`` (bytes, or pieces written in order) so that
    readers never see a partial file; return the bytes written. ``durable=False``
    skips the fsyncs (atomic, but may be lost on a power failure)."""
    pieces = [data] if isinstance(data, bytes | memoryview) else data
    tmp = temp_path(path)
    written = 0
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            for piece in pieces:
                view = memoryview(piece)
                written += len(view)
                while view:
                    view = view[os.write(fd, view) :]
            if durable and _fsync_wanted():
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise OSError(exc.errno, exc.strerror, str(path)) from exc
    if durable:
        fsync_dir(path.parent)
    return written


def write_with(path: Path, write: Callable[[Path], None]) -> None:
    """Publish the file that ``write(temp_path)`` creates at ``path`` atomically and
    durably (for writers that need a path, e.g. Parquet). The directory fsync is
    left to the caller, who may publish several files first."""
    tmp = temp_path(path)
    try:
        write(tmp)
        fsync_file(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
