"""Make every file PyIceberg writes to a local warehouse durable before the catalog commit.

PyIceberg writes local files through Arrow's file system, which never calls
``fsync``. A catalog commit is the commit point of an Iceberg table, and a
SQLite catalog's commit *is* durable (SQLite fsyncs its database): without
this module a power loss right after it could keep the catalog row pointing
at a ``metadata.json`` (or a manifest, or a data file) that never reached the
disk -- a table that no longer loads.

:class:`DurableFileIO` is PyIceberg's own ``PyArrowFileIO`` except that a
local file it writes is fsync'ed when its stream closes, then its directory
(directories it creates are created durably, parents first): every data
file, manifest, manifest list and metadata file of a commit is on disk
before the catalog row that names them is written. Object stores
(``s3://`` ...) are unchanged: a PUT is durable when it returns. The writes
and fsyncs go through :mod:`statestore.durable`, so the power-loss explorer
(``tests/crash/explorer.py``) sees them, and ``durability="process"`` runs
(:func:`statestore.durable.without_fsync`) skip the fsyncs of the driver's
thread.

:func:`use_durable_io` installs it as the ``py-io-impl`` of a catalog whose
warehouse is local (unless the catalog names its own FileIO): tables the
catalog loads, and the metadata files its commits write, then use it.
:func:`note_catalog_commit` reports a SQLite catalog's database file to the
explorer's recorder after a commit (a no-op outside it).
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlparse

from pyiceberg.io import PY_IO_IMPL
from pyiceberg.io.pyarrow import PyArrowFile, PyArrowFileIO

from statestore.durable import (
    fsync_dir,
    fsync_file,
    make_dirs,
    note_replaced,
    note_written,
    write_atomic,
)

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table

__all__ = [
    "VERSION_HINT",
    "DurableFileIO",
    "note_catalog_commit",
    "sqlite_database",
    "use_durable_io",
    "write_version_hint",
]

DURABLE_IO = "sinks.iceberg_io.DurableFileIO"
"""The ``py-io-impl`` value that selects :class:`DurableFileIO`."""


class _SyncedStream(io.FileIO):
    """A local file that is made durable (data, then its name) when it closes."""

    def close(self) -> None:
        if self.closed:
            return
        super().close()
        path = Path(str(self.name))
        note_written([path])
        fsync_file(path)
        fsync_dir(path.parent)


class _DurableFile(PyArrowFile):
    """A local output file whose stream fsyncs on close (see the module docstring)."""

    def create(self, overwrite: bool = False) -> _SyncedStream:
        path = Path(self._path)
        make_dirs(path.parent)
        # "xb" refuses an existing file atomically (PyArrow's check-then-open does not)
        return _SyncedStream(path, "wb" if overwrite else "xb")


class DurableFileIO(PyArrowFileIO):
    """PyIceberg's ``PyArrowFileIO`` with durable local writes (module docstring)."""

    def new_output(self, location: str) -> PyArrowFile:
        """The file at ``location``: durable on close when it is local."""
        scheme, _, path = self.parse_location(location, self.properties)
        if scheme != "file":
            return super().new_output(location)
        return _DurableFile(location=location, path=path, fs=self.fs_by_scheme(scheme, None))


def use_durable_io(catalog: Catalog) -> bool:
    """Let ``catalog``'s tables and commits write through :class:`DurableFileIO`
    when its warehouse is a local directory (``file://`` or a path); whether it
    does. Kept as it is when the catalog names its own ``py-io-impl``, and for
    other warehouses (object stores need no fsync, and PyIceberg may pick
    another FileIO for their scheme)."""
    warehouse = str(catalog.properties.get("warehouse", ""))
    local = warehouse.startswith("file:") or (bool(warehouse) and "://" not in warehouse)
    if local and PY_IO_IMPL not in catalog.properties:
        catalog.properties[PY_IO_IMPL] = DURABLE_IO
    return catalog.properties.get(PY_IO_IMPL) == DURABLE_IO


def sqlite_database(catalog: Catalog) -> Path | None:
    """The database file of a SQL catalog on SQLite (``None`` for other catalogs)."""
    engine = getattr(catalog, "engine", None)
    url = getattr(engine, "url", None)
    if url is None or not str(getattr(url, "drivername", "")).startswith("sqlite"):
        return None
    database = getattr(url, "database", None)
    return Path(database) if database and database != ":memory:" else None


def note_catalog_commit(catalog: Catalog) -> None:
    """After a commit: report a SQLite catalog's database to the explorer's
    recorder as replaced atomically and durably, which SQLite's own commit
    guarantees (:func:`statestore.durable.note_replaced`). A no-op for other
    catalogs and outside a recording."""
    database = sqlite_database(catalog)
    if database is not None and database.exists():
        note_replaced(database)


VERSION_HINT = "version-hint.text"
"""The file in a table's ``metadata/`` directory naming its current metadata file
(the Hadoop-table convention that DuckDB's ``iceberg_scan(DIR)`` reads)."""


def write_version_hint(table: Table) -> Path | None:
    """Point ``metadata/version-hint.text`` of a table on local disk at its current
    metadata file (the file's name without ``.metadata.json``), so that readers
    without the catalog open the directory: ``iceberg_scan('lake/alerts')`` in
    DuckDB, ``microbatch diff lake/alerts``. Returns the hint's path, or None for
    a table on an object store or one without metadata yet.

    The hint is replaced atomically but not fsynced: the catalog stays the
    commit point. After a crash it may name the previous metadata file, an
    older but whole table; the sink rewrites it with every batch, replayed
    batches included, so it catches up on the next run."""
    location = str(table.metadata_location or "")
    parsed = urlparse(location)
    if parsed.scheme == "file":  # file:///x and file:/x (a REST server's) alike
        location = unquote(parsed.path)
    elif parsed.scheme or not location:
        return None
    current = Path(location)
    hint = current.parent / VERSION_HINT
    stem = current.name.removesuffix(".metadata.json")
    try:
        if hint.read_text() == stem:
            return hint
    except FileNotFoundError:
        pass
    write_atomic(hint, stem.encode(), durable=False)
    return hint
