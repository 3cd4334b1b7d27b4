"""The file source's ledger: the durable, append-only list of admitted files.

An offset of the file source is a count of admitted files, so the ledger is
what makes ``[start, end)`` name the same files across restarts. Entries are
checksummed JSON files written atomically; :meth:`FileLedger.load` refuses a
gap or an overlap between entries.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from microbatch.checkpoint.files import (
    fsync_dir,
    make_dirs,
    read_json,
    remove,
    write_json_atomic,
)
from microbatch.exceptions import CheckpointCorruptError

LEDGER_KIND = "file-ledger"



@dataclass(frozen=True)
class LedgerFile:
    """One admitted file: its position in the log and what it was when admitted."""

    seq: int
    path: str
    """Path relative to the source directory, with ``/`` separators."""
    size: int
    mtime_ns: int

    def to_json(self) -> dict[str, Any]:
        """The ledger-entry form of this file."""
        return {"seq": self.seq, "path": self.path, "size": self.size, "mtime_ns": self.mtime_ns}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> LedgerFile:
        """Inverse of :meth:`to_json`."""
        return cls(int(doc["seq"]), str(doc["path"]), int(doc["size"]), int(doc["mtime_ns"]))


class FileLedger:
    """The append-only list of admitted files, durable under ``directory``.

    Every :meth:`append` writes one entry file ``<first_seq>`` atomically
    (checksummed, see :mod:`microbatch.checkpoint.files`) before the files
    become visible, so an offset handed to the engine always refers to files
    that survive a crash. When there are more than ``compact_threshold``
    entry files they are rewritten as one entry; the ledger's content never
    changes. With ``directory=None`` the ledger lives in memory only.
    """

    compact_threshold: int = 100

    def __init__(self, directory: Path | None) -> None:
        self.directory = directory
        self._files: list[LedgerFile] = []
        self._paths: set[str] = set()
        self._entries: list[Path] = []
        if directory is not None:
            make_dirs(directory)
            self._load(directory)

    def __len__(self) -> int:
        return len(self._files)

    def __contains__(self, path: object) -> bool:
        return path in self._paths

    def __iter__(self) -> Iterator[LedgerFile]:
        return iter(self._files)

    def files(self, start: int, end: int) -> list[LedgerFile]:
        """The files with ``start <= seq < end``."""
        return self._files[start:end]

    @property
    def entry_count(self) -> int:
        """How many entry files the ledger is stored in (0 in memory)."""
        return len(self._entries)

    def append(self, files: Sequence[tuple[str, int, int]]) -> None:
        """Admit ``(path, size, mtime_ns)`` files, in the given order, durably."""
        if not files:
            return
        first = len(self._files)
        added = [LedgerFile(first + i, p, size, mtime) for i, (p, size, mtime) in enumerate(files)]
        if self.directory is not None:
            entry = self.directory / f"{first:020d}"
            body = {"first_seq": first, "files": [f.to_json() for f in added]}
            write_json_atomic(entry, LEDGER_KIND, body)
            self._entries.append(entry)
        self._files.extend(added)
        self._paths.update(f.path for f in added)
        if len(self._entries) > self.compact_threshold:
            self.compact()

    def compact(self) -> None:
        """Rewrite all entry files as one, then remove the others.

        NOTE: the compacted entry replaces entry ``0`` atomically *before* the
        others are removed; a crash in between leaves entries fully covered by
        entry ``0``, which :meth:`_load` recognises, checks and removes.
        """
        if self.directory is None or len(self._entries) <= 1:
            return
        target = self.directory / f"{0:020d}"
        body = {"first_seq": 0, "files": [f.to_json() for f in self._files]}
        write_json_atomic(target, LEDGER_KIND, body)
        for entry in self._entries:
            if entry != target:
                remove(entry)
        fsync_dir(self.directory)
        self._entries = [target]

    def _load(self, directory: Path) -> None:
        found = sorted((int(p.name), p) for p in directory.iterdir() if p.name.isdigit())
        stale: list[Path] = []
        for first, entry in found:
            body = read_json(entry, LEDGER_KIND)
            files = [LedgerFile.from_json(doc) for doc in body["files"]]
            if body["first_seq"] != first or [f.seq for f in files] != list(
                range(first, first + len(files))
            ):
                raise CheckpointCorruptError(
                    f"file ledger entry {entry} does not hold files {first}.. in sequence; "
                    "restore the source's state directory from a backup or start the "
                    "query on a new checkpoint"
                )
            end = first + len(files)
            if end <= len(self._files) and files == self._files[first:end]:
                stale.append(entry)  # left behind by an interrupted compaction
                continue
            if first != len(self._files):
                raise CheckpointCorruptError(
                    f"file ledger entry {entry} starts at file {first} but the entries before "
                    f"it hold {len(self._files)} files (an entry is missing or overlaps); "
                    "restore the source's state directory or start on a new checkpoint"
                )
            self._files.extend(files)
            self._entries.append(entry)
        self._paths = {f.path for f in self._files}
        for entry in stale:
            remove(entry)
