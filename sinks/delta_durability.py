"""Make a local Delta table's new versions survive a power loss.

delta-rs writes local tables through ``object_store``'s local file system,
which never calls ``fsync``: a commit's data files and its ``_delta_log``
entry sit in the page cache until the kernel flushes them. The engine writes
``commits/N`` (durably) right after the sink returns, so without this step a
power loss could keep ``commits/N`` and lose the Delta version holding batch
``N``'s rows: the batch would count as written and never be written again.
(``tests/crash/test_power_loss.py`` finds exactly that when this step is
skipped.)

:func:`persist_versions` fsyncs, for each new version, its data files, its
log entry and a checkpoint written for it, then the directories holding
them, ``_delta_log`` last: every file of a version the sink returns from is
on disk, and no log entry's name is durable before its data files' names. Object
stores (``s3://`` ...) need none of this: a PUT is durable when it returns.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from urllib.parse import unquote, urlparse

from statestore.durable import fsync_dir, fsync_file, note_written

__all__ = ["local_root", "persist_versions"]


def local_root(uri: str) -> Path | None:
    """The directory of a table on the local file system (``None`` for object stores)."""
    if "://" not in uri:
        return Path(uri)
    parsed = urlparse(uri)
    return Path(unquote(parsed.path)) if parsed.scheme == "file" else None


def persist_versions(root: Path, first: int, last: int) -> None:
    """fsync every file of table versions ``first..last`` (inclusive) under ``root``,
    then their directories (the table directory's own entry included)."""
    log_dir = root / "_delta_log"
    files: list[Path] = []
    for version in range(max(first, 0), last + 1):
        entry = log_dir / f"{version:020d}.json"
        files.extend(root / unquote(path) for path in _added_paths(entry))
        files.append(entry)
        checkpoint = log_dir / f"{version:020d}.checkpoint.parquet"
        if checkpoint.exists():
            files.extend([checkpoint, log_dir / "_last_checkpoint"])
    present = [path for path in files if path.exists()]
    note_written(present)
    dirs = {root, log_dir} | ({root.parent} if first == 0 else set())
    for path in present:
        fsync_file(path)
        dirs.add(path.parent)
    # NOTE: the log directory last: a log entry's name must not become durable
    # while the names of the data files it adds are not (found by the explorer)
    for directory in sorted(dirs, key=lambda d: (d == log_dir, -len(d.parts))):
        if directory.is_dir():
            fsync_dir(directory)


def _added_paths(entry: Path) -> list[str]:
    """The relative paths of the files a log entry adds (``add`` actions)."""
    try:
        text = entry.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    paths = []
    for line in text.splitlines():
        if '"add"' not in line:
            continue
        action = json.loads(line).get("add")
        if action and "://" not in action["path"]:
            paths.append(os.fspath(action["path"]))
    return paths
