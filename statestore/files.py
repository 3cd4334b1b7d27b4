"""The on-disk versions of a store: checksummed Arrow IPC files, written atomically.

Layout under the store directory::

    changelog/<version>.arrow   what version changed: deleted keys, then upserted rows
    snapshot/<version>.arrow    every live row of version

Every file is a plain Arrow IPC file (compressed) whose schema metadata holds
the format version, the kind, the version number and the SHA-256 of the file
itself computed with the digest's two copies (header and footer schema)
replaced by a fixed placeholder. A reader restores the placeholder and checks
the digest, so any flipped or missing byte is detected.

Writes go through :mod:`statestore.durable` (temp file, fsync, rename, directory
fsync): a reader sees the old file or the whole new one. A version is committed
once its changelog file exists.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Literal

import polars as pl
import pyarrow as pa

from statestore.durable import (
    TMP_SUFFIX,
    fsync_dir,
    make_dirs,
    remove,
    write_atomic,
    write_with,
)
from statestore.exceptions import StateCorruptError, StateStoreError

FORMAT_VERSION = 1
Kind = Literal["changelog", "snapshot"]
KINDS: tuple[Kind, Kind] = ("changelog", "snapshot")

_PLACEHOLDER = hashlib.sha256(b"statestore checksum placeholder").hexdigest().encode()
_M_FORMAT = b"statestore.format"
_M_KIND = b"statestore.kind"
_M_VERSION = b"statestore.version"
_M_DIGEST = b"statestore.sha256"


def _pieces(raw: memoryview, at: list[int], middle: bytes) -> list[memoryview | bytes]:
    """``raw`` with the 64 bytes at each offset in ``at`` replaced by ``middle``."""
    out: list[memoryview | bytes] = []
    start = 0
    for offset in at:
        out += [raw[start:offset], middle]
        start = offset + len(middle)
    out.append(raw[start:])
    return out


def _digest_offsets(raw: bytes, needle: bytes) -> list[int]:
    # The schema (with its metadata) is written before the data and again in the
    # footer after it: the first and last occurrences, whatever the data holds.
    first, last = raw.find(needle), raw.rfind(needle)
    return sorted({first, last}) if first >= 0 else []


def write_arrow(
    path: Path, frame: pl.DataFrame, *, kind: Kind, version: int, compression: str | None
) -> int:
    """Atomically write ``frame`` as a checksummed Arrow IPC file; return its size."""
    table = frame.to_arrow()
    table = table.replace_schema_metadata(
        {
            _M_FORMAT: str(FORMAT_VERSION).encode(),
            _M_KIND: kind.encode(),
            _M_VERSION: str(version).encode(),
            _M_DIGEST: _PLACEHOLDER,
        }
    )
    sink = pa.BufferOutputStream()
    # One dictionary per categorical column for the whole file (the IPC file
    # format cannot replace dictionaries between batches).
    options = pa.ipc.IpcWriteOptions(compression=compression, unify_dictionaries=True)
    with pa.ipc.new_file(sink, table.schema, options=options) as writer:
        writer.write_table(table, max_chunksize=1 << 20)
    raw = sink.getvalue().to_pybytes()
    offsets = _digest_offsets(raw, _PLACEHOLDER)
    digest = hashlib.sha256(raw).hexdigest().encode()
    return write_atomic(path, _pieces(memoryview(raw), offsets, digest))


def read_arrow(
    path: Path,
    *,
    kind: Kind,
    version: int,
    schema: dict[str, pl.DataType],
    added: Collection[str] = (),
) -> pl.DataFrame:
    """Read and verify a file written by :func:`write_arrow`.

    Raises StateCorruptError naming ``path`` when it is missing, truncated, fails
    its checksum or is not this kind/version of state file, and StateStoreError
    when it holds other columns than ``schema`` (the store's schema changed).
    Columns named in ``added`` (value columns added to the schema since the file
    was written) may be absent: they read as nulls.
    """
    advice = (
        "Restore the file from a backup, or load an older version / start the "
        "operator on a new state directory (its state is lost)."
    )
    try:
        raw = path.read_bytes()
    except FileNotFoundError as exc:
        raise StateCorruptError(f"state file {path} is missing. {advice}") from exc
    except OSError as exc:
        raise StateCorruptError(f"cannot read state file {path}: {exc}. {advice}") from exc
    try:
        reader = pa.ipc.open_file(pa.py_buffer(raw))
        meta = reader.schema.metadata or {}
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise StateCorruptError(
            f"state file {path} is not a readable Arrow IPC file ({exc}); it is truncated "
            f"or corrupted. {advice}"
        ) from exc
    if not {_M_FORMAT, _M_KIND, _M_VERSION, _M_DIGEST} <= meta.keys():
        raise StateCorruptError(
            f"state file {path} lacks the state store's metadata: it was not written by "
            f"statestore. {advice}"
        )
    if int(meta[_M_FORMAT]) > FORMAT_VERSION:
        raise StateStoreError(
            f"state file {path} has format {int(meta[_M_FORMAT])}, newer than the format "
            f"{FORMAT_VERSION} this statestore reads; upgrade the package."
        )
    digest = meta[_M_DIGEST]
    hasher = hashlib.sha256()
    for piece in _pieces(memoryview(raw), _digest_offsets(raw, digest), _PLACEHOLDER):
        hasher.update(piece)
    if hasher.hexdigest().encode() != digest:
        raise StateCorruptError(
            f"state file {path} fails its checksum: it was changed or damaged after it "
            f"was written. {advice}"
        )
    if meta[_M_KIND] != kind.encode() or meta[_M_VERSION] != str(version).encode():
        raise StateCorruptError(
            f"state file {path} holds {meta[_M_KIND].decode()} version "
            f"{meta[_M_VERSION].decode()}, not {kind} version {version}: it was renamed or "
            f"copied. {advice}"
        )
    try:
        frame = pl.DataFrame(reader.read_all())
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise StateCorruptError(f"state file {path} cannot be decoded ({exc}). {advice}") from exc
    expected = dict(schema)
    if kind == "changelog":
        expected["__op"] = pl.Int8()
    return _fit_schema(frame, expected, added, path)


def _fit_schema(
    frame: pl.DataFrame, expected: dict[str, Any], added: Collection[str], path: Path
) -> pl.DataFrame:
    """``frame`` with the columns added to the schema since it was written (as
    nulls), or :class:`StateStoreError` when it holds another schema."""
    absent = [c for c in added if c in expected and c not in frame.columns]
    if absent:
        frame = frame.with_columns(
            [pl.lit(None, expected[c]).alias(c) for c in absent]
        ).select(list(expected))
    if dict(frame.schema) != expected:
        raise StateStoreError(
            f"state file {path} has columns {dict(frame.schema)}, but the store's schema is "
            f"{expected}: the operator's state schema changed. Use a new state directory "
            "(or the old schema)."
        )
    return frame


_STREAM_PIECE = 8 << 20


def _footer_offset(fh: BinaryIO, size: int, needle: bytes) -> int:
    """Offset of ``needle`` in the footer of the Arrow file ``fh`` (its last occurrence)."""
    import struct

    fh.seek(size - 10)
    (footer_len,) = struct.unpack("<i", fh.read(4))
    start = max(0, size - 10 - footer_len)
    fh.seek(start)
    tail = fh.read(size - start)
    at = tail.rfind(needle)
    return -1 if at < 0 else start + at


def _header_offset(fh: BinaryIO, needle: bytes) -> int:
    fh.seek(0)
    head = fh.read(1 << 20)
    at: int = head.find(needle)
    return at


def _hash_replacing(fh: BinaryIO, size: int, offsets: list[int], middle: bytes) -> str:
    """SHA-256 of the file with the 64 bytes at each offset replaced by ``middle``,
    read in pieces (the file is never whole in memory)."""
    hasher = hashlib.sha256()
    fh.seek(0)
    at = 0
    for offset in [*offsets, size]:
        while at < offset:
            piece = fh.read(min(_STREAM_PIECE, offset - at))
            hasher.update(piece)
            at += len(piece)
        if offset < size:
            hasher.update(middle)
            fh.seek(offset + len(middle))
            at = offset + len(middle)
    return hasher.hexdigest()


def write_arrow_chunks(
    path: Path,
    schema: dict[str, pl.DataType],
    chunks: Iterable[pl.DataFrame],
    *,
    kind: Kind,
    version: int,
    compression: str | None,
) -> int:
    """Atomically and durably write ``chunks`` as one checksummed Arrow IPC file, the
    same format as :func:`write_arrow`, holding one chunk in memory at a time (a
    snapshot of state larger than memory); return its size."""
    meta = {
        _M_FORMAT: str(FORMAT_VERSION).encode(),
        _M_KIND: kind.encode(),
        _M_VERSION: str(version).encode(),
        _M_DIGEST: _PLACEHOLDER,
    }
    arrow_schema = pl.DataFrame(schema=schema).to_arrow().schema.with_metadata(meta)
    size = 0

    def write(tmp: Path) -> None:
        nonlocal size
        options = pa.ipc.IpcWriteOptions(compression=compression, unify_dictionaries=True)
        with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(
            sink, arrow_schema, options=options
        ) as writer:
            for chunk in chunks:
                if chunk.height:
                    writer.write_table(chunk.to_arrow().cast(arrow_schema), max_chunksize=1 << 20)
        size = tmp.stat().st_size
        with tmp.open("r+b") as fh:
            offsets = sorted(
                {_header_offset(fh, _PLACEHOLDER), _footer_offset(fh, size, _PLACEHOLDER)}
            )
            digest = _hash_replacing(fh, size, offsets, _PLACEHOLDER).encode()
            for offset in offsets:
                fh.seek(offset)
                fh.write(digest)

    write_with(path, write)
    fsync_dir(path.parent)
    return size


def file_digest(path: Path) -> str:
    """The checksum a state file records (its identity), read from its schema only."""
    try:
        with pa.memory_map(str(path)) as source:
            meta = pa.ipc.open_file(source).schema.metadata or {}
    except (FileNotFoundError, pa.ArrowException, OSError, ValueError):
        return ""
    return bytes(meta.get(_M_DIGEST, b"")).decode()


def iter_arrow(
    path: Path,
    *,
    kind: Kind,
    version: int,
    schema: dict[str, pl.DataType],
    added: Collection[str] = (),
) -> Iterator[pl.DataFrame]:
    """The rows of a file written by :func:`write_arrow` or :func:`write_arrow_chunks`,
    one record batch at a time, after the checks of :func:`read_arrow` (the checksum
    read in pieces): a snapshot larger than memory is never whole in memory."""
    advice = (
        "Restore the file from a backup, or load an older version / start the "
        "operator on a new state directory (its state is lost)."
    )
    try:
        size = path.stat().st_size
        with path.open("rb") as fh:
            reader = pa.ipc.open_file(pa.memory_map(str(path)))
            meta = reader.schema.metadata or {}
            digest = meta.get(_M_DIGEST, b"")
            offsets = sorted({_header_offset(fh, digest), _footer_offset(fh, size, digest)})
            ok = bool(digest) and -1 not in offsets and (
                _hash_replacing(fh, size, offsets, _PLACEHOLDER).encode() == digest
            )
    except FileNotFoundError as exc:
        raise StateCorruptError(f"state file {path} is missing. {advice}") from exc
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise StateCorruptError(
            f"state file {path} is not a readable Arrow IPC file ({exc}); it is truncated "
            f"or corrupted. {advice}"
        ) from exc
    if not ok or meta.get(_M_KIND) != kind.encode() or meta.get(_M_VERSION) != str(
        version
    ).encode():
        # the full checks and their precise messages
        read_arrow(path, kind=kind, version=version, schema=schema, added=added)
        raise StateCorruptError(f"state file {path} fails its checks. {advice}")
    expected = dict(schema)
    for i in range(reader.num_record_batches):
        frame = pl.DataFrame(pa.Table.from_batches([reader.get_batch(i)]))
        yield _fit_schema(frame, expected, added, path)


@dataclass(frozen=True)
class Chain:
    """The files that rebuild one version: a snapshot (or nothing: empty) then changelogs."""

    version: int
    snapshot: int  # 0 means start from the empty state
    changelogs: tuple[int, ...]


class VersionFiles:
    """Lists, plans, purges and discards the version files of one store directory.

    ``read_only=True`` (an offline reader beside a job that may be running)
    creates nothing and removes nothing: a temp file may be a live write.
    """

    def __init__(self, directory: Path, *, read_only: bool = False) -> None:
        self.directory = directory
        self.dirs = {kind: directory / kind for kind in KINDS}
        if read_only:
            return
        for d in self.dirs.values():
            make_dirs(d)
        for d in self.dirs.values():
            for leftover in d.glob(f".*{TMP_SUFFIX}"):  # writes cut short by a crash
                remove(leftover)

    def path(self, kind: Kind, version: int) -> Path:
        """Where ``kind`` of ``version`` lives."""
        return self.dirs[kind] / f"{version}.arrow"

    def versions(self, kind: Kind) -> list[int]:
        """Versions that have a ``kind`` file, ascending."""
        out: list[int] = []
        if not self.dirs[kind].is_dir():
            return out
        for entry in os.scandir(self.dirs[kind]):
            stem, dot, ext = entry.name.partition(".")
            if dot and ext == "arrow" and stem.isdigit():
                out.append(int(stem))
        return sorted(out)

    def latest(self) -> int:
        """Newest committed version (0 when none)."""
        return max([0, *self.versions("changelog"), *self.versions("snapshot")])

    def chain(self, version: int) -> Chain:
        """The files to rebuild ``version``; StateCorruptError when one is missing."""
        latest = self.latest()
        if version > latest:
            raise StateCorruptError(
                f"state version {version} does not exist in {self.directory} (no "
                f"{self.path('changelog', version)}): the newest committed version is "
                f"{latest}. Load a version <= {latest}; if the "
                "checkpoint says this version was committed, the state directory was "
                "replaced or truncated: restore it or start on a new checkpoint."
            )
        snapshot = max((s for s in self.versions("snapshot") if s <= version), default=0)
        have = set(self.versions("changelog"))
        needed = tuple(range(snapshot + 1, version + 1))
        missing = [v for v in needed if v not in have]
        if missing:
            snapshots = self.versions("snapshot")
            hint = f" The oldest snapshot is version {snapshots[0]}." if snapshots else ""
            raise StateCorruptError(
                f"state version {version} cannot be rebuilt from {self.directory}: "
                f"{self.path('changelog', missing[0])} is missing (the chain is "
                f"{'snapshot ' + str(snapshot) if snapshot else 'the empty state'} + changelogs "
                f"{snapshot + 1}..{version}). Versions older than the retention are purged."
                f"{hint} Load a newer version, restore the file from a backup, or start the "
                "operator on a new state directory."
            )
        return Chain(version, snapshot, needed)

    def size(self, kind: Kind, version: int) -> int:
        """Size in bytes of a version file (0 when absent)."""
        try:
            return self.path(kind, version).stat().st_size
        except FileNotFoundError:
            return 0

    def _remove(self, kind: Kind, versions: list[int]) -> None:
        for v in versions:
            remove(self.path(kind, v))
        if versions:
            fsync_dir(self.dirs[kind])

    def discard_after(self, version: int) -> None:
        """Delete every file of versions newer than ``version`` (an abandoned future).

        Newest first, snapshot before changelog: a crash midway leaves a contiguous
        run of committed versions, never a hole.
        """
        newer = {v for kind in KINDS for v in self.versions(kind) if v > version}
        for v in sorted(newer, reverse=True):
            remove(self.path("snapshot", v))
            remove(self.path("changelog", v))
        if newer:
            for d in self.dirs.values():
                fsync_dir(d)

    def purge(self, latest: int, retention: int) -> None:
        """Delete files not needed to load any of the newest ``retention`` versions."""
        oldest = max(0, latest - retention + 1)
        base = max((s for s in self.versions("snapshot") if s <= oldest), default=0)
        if base:
            self._remove("snapshot", [v for v in self.versions("snapshot") if v < base])
            self._remove("changelog", [v for v in self.versions("changelog") if v <= base])
