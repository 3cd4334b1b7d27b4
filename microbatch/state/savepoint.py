"""Savepoints: every operator's state at the last committed batch, with its offsets.

Layout of a savepoint directory::

    DIR/
      manifest.json                   query id, batch id, offsets/N and commits/N
                                      entries, each operator's id, kind, signature
                                      and stores (key/value column names, layout)
      state/<op>/<store>.parquet      the store's rows after batch N (exact types;
                                      an append buffer's rows in arrival order)
      sources/<id>/...                the sources' own logs (e.g. the file ledger)

The directory is assembled under a temporary name beside ``DIR`` and renamed
into place last: a savepoint that exists is complete. It is read by
:mod:`microbatch.state.restore` (``microbatch run --from-savepoint``).
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any

from microbatch.checkpoint import Checkpoint
from microbatch.checkpoint.files import fsync_dir, make_dirs, read_json, write_json_atomic
from microbatch.exceptions import SavepointError
from microbatch.state.reader import StateCatalog, store_rows
from statestore.durable import write_with

__all__ = ["MANIFEST", "read_manifest", "store_file", "write_savepoint"]

MANIFEST = "manifest.json"
FORMAT = 1


def store_file(operator_id: str, store: str) -> str:
    """The savepoint-relative Parquet file of an operator's store."""
    return f"state/{operator_id}/{store.replace('/', '.')}.parquet"


def write_savepoint(checkpoint: str | os.PathLike[str], directory: str | os.PathLike[str]
                    ) -> dict[str, Any]:
    """Export every operator's state at the last committed batch of ``checkpoint``,
    with that batch's offsets and commit entries, to ``directory``; return the manifest.

    Reads only files and takes no lock (a running job may go on). ``directory``
    must not exist yet; it appears complete or not at all.
    """
    catalog = StateCatalog.open(checkpoint)
    target = Path(directory).expanduser().resolve()
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise SavepointError(
            f"{target} already exists; a savepoint is written to a new directory (choose "
            "another path, or delete the old savepoint)")
    if not catalog.committed:
        raise SavepointError(f"checkpoint {catalog.root} has no committed batch: nothing to save")
    sharded = sorted(op for op, layouts in catalog.operators.items() if layouts[0][0] is not None)
    if sharded:
        raise SavepointError(
            f"the state of {sharded} in {catalog.root} is split into Ray shards; savepoints "
            "of sharded checkpoints are not supported yet (read them with read_state)")
    batch = catalog.committed[-1]
    chk = Checkpoint(catalog.root)
    offsets, commit = chk.offsets.get(batch), chk.commits.get(batch)
    if offsets is None or commit is None:
        raise SavepointError(f"batch {batch} of {catalog.root} has no offsets or commit entry")
    stage = target.parent / f".{target.name}.writing"  # a savepoint killed midway: redone
    shutil.rmtree(stage, ignore_errors=True)
    operators: dict[str, Any] = {}
    try:
        for op, layouts in catalog.operators.items():
            layout = layouts[0][1]
            catalog.batch(op, batch)  # readable (not purged), else a clear error
            stores = {}
            for store in layout.stores:
                rows = store_rows(store, batch)
                path = stage / store_file(op, store.name)
                make_dirs(path.parent)
                write_with(path, lambda p, rows=rows: rows.write_parquet(p))  # type: ignore[misc]
                stores[store.name] = {
                    "file": store_file(op, store.name), "keys": list(store.keys),
                    "values": list(store.values), "time_column": store.time_column,
                    "layout": store.layout, "rows": rows.height}
            operators[op] = {"kind": layout.kind, "signature": layout.signature,
                             "stores": stores}
        sources = catalog.root / "sources"
        if sources.is_dir():
            shutil.copytree(sources, stage / "sources")
        manifest = {
            "format": FORMAT,
            "query_id": chk.read_metadata().get("query_id"),
            "checkpoint": str(catalog.root),
            "batch_id": batch,
            "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "offsets": offsets.to_json(),
            "commit": commit.to_json(),
            "operators": operators,
        }
        write_json_atomic(stage / MANIFEST, "savepoint", manifest)
        if target.exists():
            target.rmdir()  # empty (checked above)
        os.replace(stage, target)
        fsync_dir(target.parent)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return manifest


def read_manifest(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """The manifest of a savepoint (SavepointError when ``directory`` is none)."""
    path = Path(directory).expanduser() / MANIFEST
    if not path.exists():
        raise SavepointError(
            f"{Path(directory).expanduser()} is not a savepoint (no {MANIFEST}); make one with "
            "`microbatch savepoint CHECKPOINT DIR`")
    manifest = read_json(path, "savepoint")
    if int(manifest.get("format", 0)) > FORMAT:
        raise SavepointError(f"{path} has format {manifest.get('format')}; upgrade microbatch")
    return dict(manifest)
