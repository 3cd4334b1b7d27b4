"""Durable file writes: the one implementation for ``statestore``, ``sinks`` and
``microbatch``.

Crash safety rests on three POSIX habits, done here and nowhere else:

1. a new file is written under a temp name in the target's directory, its data
   ``fsync``'ed, then ``rename``'d over the target, so a reader sees the old
   file or the whole new one, never a torn one;
2. the directory is ``fsync``'ed after a create, rename or unlink, so the name
   itself survives a power loss;
3. errors name the target file (``os.write`` errors carry no file name).

Every file operation on durable data (checkpoint, state store, sink output)
goes through this module, so a recorder installed with :func:`recording` sees
all of them in program order: ``write``, ``fsync``, ``rename``, ``unlink``,
``mkdir`` and ``fsync_dir`` (``tests/crash/explorer.py`` replays them into the
crash states a power loss may leave; ``note_written`` reports files that a
library such as delta-rs wrote on its own).

This module imports only the standard library, so both lower packages use it
without importing ``microbatch``: it is the one module of ``statestore`` that
``sinks`` may import (``tests/test_structure.py`` checks it). Its module state
(the recorder, the per-thread :func:`without_fsync`) therefore covers every
durable write of a query. ``sinks/durable.py`` is a deprecated alias of it.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

__all__ = [
    "FileOp",
    "discard_temp",
    "fsync_dir",
    "fsync_enabled",
    "fsync_file",
    "make_dirs",
    "note_replaced",
    "note_written",
    "publish",
    "recording",
    "remove",
    "without_fsync",
    "write_atomic",
    "write_temp",
    "write_with",
]

TMP_SUFFIX = ".tmp"
"""Temp files are ``.<name>.<pid>.tmp`` next to their target: a reader ignores them."""


def temp_path(path: Path) -> Path:
    """Where ``path`` is written before the rename that publishes it."""
    return path.with_name(f".{path.name}.{os.getpid()}{TMP_SUFFIX}")


_thread = threading.local()

FileOp = tuple[str, Path, Path | None, bytes | None]
"""A recorded operation: ``(kind, path, target, data)``. ``kind`` is ``write``
(a new file at ``path`` holding ``data``), ``wrote`` (the same, done earlier by
another library: :func:`note_written`), ``fsync`` (the file at ``path``),
``rename`` (``path`` to ``target``), ``unlink``, ``mkdir`` or ``fsync_dir``."""

_recorders: list[Callable[[FileOp], None]] = []
"""The active recorder (the last one installed), if any."""


@contextmanager
def recording(recorder: Callable[[FileOp], None]) -> Iterator[None]:
    """Call ``recorder`` with every operation this module makes until the block ends
    (all threads: a test tool, one recording at a time)."""
    _recorders.append(recorder)
    try:
        yield
    finally:
        _recorders.remove(recorder)


_record_lock = threading.Lock()
"""One operation at a time reaches the recorder (writes may come from two threads)."""


def _record(kind: str, path: Path, target: Path | None = None, data: bytes | None = None) -> None:
    if _recorders:
        with _record_lock:
            _recorders[-1]((kind, path, target, data))


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


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    """Make a create, rename or unlink inside directory ``path`` durable."""
    if not _fsync_wanted():
        return
    _fsync(path)
    _record("fsync_dir", path)


def fsync_file(path: Path) -> None:
    """Flush a file's data to disk."""
    if not _fsync_wanted():
        return
    _fsync(path)
    _record("fsync", path)


def make_dirs(path: Path) -> None:
    """Create directory ``path`` and its missing parents, each one durably (the
    parent is fsync'ed after the create: a directory whose own name is lost in a
    power loss takes every durable file inside it along)."""
    missing = []
    at = path
    while not at.is_dir():
        missing.append(at)
        if at.parent == at:
            break
        at = at.parent
    for directory in reversed(missing):
        try:
            directory.mkdir()
        except FileExistsError:
            if not directory.is_dir():
                raise
            continue  # another thread or process made it first
        _record("mkdir", directory)
        fsync_dir(directory.parent)


def remove(path: Path, *, missing_ok: bool = True) -> None:
    """Unlink ``path``; the caller fsyncs the directory (after several removes)."""
    try:
        path.unlink()
    except FileNotFoundError:
        if not missing_ok:
            raise
        return
    _record("unlink", path)


def note_written(paths: Sequence[Path]) -> None:
    """Report files that another library wrote under ``paths`` (and did not fsync)
    to the recorder, before they are made durable with :func:`fsync_file`."""
    if _recorders:
        for path in paths:
            _record("wrote", path, None, path.read_bytes())


def note_replaced(path: Path) -> None:
    """Report to the recorder that another library replaced ``path``'s content
    atomically and durably (a SQLite commit: the old content or the new one,
    never a mix, and durable when it returns), as what gives the same
    guarantee here: a synced temp file renamed over ``path``, then its
    directory synced. Only reports: no I/O but reading ``path``."""
    if _recorders:
        tmp = temp_path(path)
        _record("write", tmp, None, path.read_bytes())
        _record("fsync", tmp)
        _record("rename", tmp, path)
        _record("fsync_dir", path.parent)


def write_atomic(
    path: Path,
    data: bytes | memoryview | Sequence[bytes | memoryview],
    *,
    durable: bool = True,
    sync_dir: bool = True,
) -> int:
    """Replace ``path`` with ``data`` (bytes, or pieces written in order) so that
    readers never see a partial file; return the bytes written. ``durable=False``
    skips the fsyncs (atomic, but may be lost on a power failure);
    ``sync_dir=False`` fsyncs the file but leaves the directory fsync to the
    caller, who may publish several files in it first (as :func:`write_with`)."""
    written = write_temp(path, data, durable=durable)
    publish(path, durable=durable, sync_dir=sync_dir)
    return written


def fsync_enabled() -> bool:
    """Whether this thread's writes fsync (not inside :func:`without_fsync`): to
    hand the caller's level to a helper thread (``write_temp(durable=...)``)."""
    return _fsync_wanted()


def write_temp(
    path: Path, data: bytes | memoryview | Sequence[bytes | memoryview], *, durable: bool = True
) -> int:
    """The first half of :func:`write_atomic`: ``data`` under ``path``'s temp name,
    fsync'ed when ``durable``; return the bytes written. Independent temp files
    may be written (and fsync'ed) concurrently; :func:`publish` renames one."""
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
            if _recorders:
                _record("write", tmp, None, b"".join(bytes(p) for p in pieces))
            if durable and _fsync_wanted():
                os.fsync(fd)
                _record("fsync", tmp)
        finally:
            os.close(fd)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise OSError(exc.errno, exc.strerror, str(path)) from exc
    return written


def publish(path: Path, *, durable: bool = True, sync_dir: bool = True) -> None:
    """The second half of :func:`write_atomic`: rename the temp file written by
    :func:`write_temp` to ``path``, then fsync the directory (``sync_dir``)."""
    tmp = temp_path(path)
    try:
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise OSError(exc.errno, exc.strerror, str(path)) from exc
    _record("rename", tmp, path)
    if durable and sync_dir:
        fsync_dir(path.parent)


def discard_temp(path: Path) -> None:
    """Remove a temp file :func:`write_temp` left unpublished (an aborted write)."""
    remove(temp_path(path))


def write_with(path: Path, write: Callable[[Path], None]) -> None:
    """Publish the file that ``write(temp_path)`` creates at ``path`` atomically and
    durably (for writers that need a path, e.g. Parquet). The directory fsync is
    left to the caller, who may publish several files first."""
    tmp = temp_path(path)
    try:
        write(tmp)
        if _recorders:
            _record("write", tmp, None, tmp.read_bytes())
        fsync_file(tmp)
        os.replace(tmp, path)
        _record("rename", tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
