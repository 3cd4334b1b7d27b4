"""Atomic, checksummed JSON files: the one on-disk format of the checkpoint.

A file is ``{"format": F, "kind": K, "sha256": H, "body": B}`` where ``H`` is
the SHA-256 of the canonical JSON of ``B``. Writes go through
:mod:`statestore.durable` (temp file, fsync, rename, directory fsync), so a
reader sees either the old file or the whole new one.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from microbatch.exceptions import CheckpointCorruptError, CheckpointFormatError
from statestore.durable import fsync_dir, fsync_file, make_dirs, remove, write_atomic

__all__ = [
    "encode",
    "fsync_dir",
    "fsync_file",
    "make_dirs",
    "read_json",
    "read_json_object",
    "remove",
    "write_bytes_atomic",
    "write_json_atomic",
]

FORMAT_VERSION = 1


def _canonical(body: Any) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":"), default=str).encode()


def write_bytes_atomic(path: Path, data: bytes, *, durable: bool = True) -> None:
    """Replace ``path`` with ``data`` so that readers never see a partial file."""
    write_atomic(path, data, durable=durable)


def encode(kind: str, body: Any) -> bytes:
    """Serialize ``body`` inside the versioned, checksummed envelope."""
    payload = _canonical(body)
    digest = hashlib.sha256(payload).hexdigest()
    head = f'{{"format":{FORMAT_VERSION},"kind":"{kind}","sha256":"{digest}","body":'
    return head.encode() + payload + b"}\n"


def write_json_atomic(path: Path, kind: str, body: Any, *, durable: bool = True) -> None:
    """Write ``body`` to ``path`` atomically inside the checksummed envelope."""
    write_bytes_atomic(path, encode(kind, body), durable=durable)


def read_json(path: Path, kind: str) -> Any:
    """Read and verify a file written by :func:`write_json_atomic`.

    Raises :class:`CheckpointCorruptError` when the file is truncated, not
    JSON, of another kind or fails its checksum, and
    :class:`CheckpointFormatError` when a newer engine wrote it.
    """
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise CheckpointCorruptError(f"cannot read checkpoint file {path}: {exc}") from exc
    try:
        doc = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointCorruptError(
            f"checkpoint file {path} is not valid JSON ({getattr(exc, 'msg', exc)}); "
            "it is truncated or was overwritten. Restore it from a backup, or start the query "
            "on a new checkpoint directory."
        ) from exc
    if not isinstance(doc, dict) or not {"format", "kind", "sha256", "body"} <= doc.keys():
        raise CheckpointCorruptError(
            f"checkpoint file {path} is not a microbatch checkpoint file (missing envelope "
            "fields); is this directory the checkpoint of another program?"
        )
    if not isinstance(doc["format"], int) or doc["format"] > FORMAT_VERSION:
        raise CheckpointFormatError(
            f"checkpoint file {path} has format {doc['format']!r}, newer than the format "
            f"{FORMAT_VERSION} this version of microbatch reads; upgrade microbatch."
        )
    if doc["kind"] != kind:
        raise CheckpointCorruptError(
            f"checkpoint file {path} holds a {doc['kind']!r} record where {kind!r} was expected"
        )
    if hashlib.sha256(_canonical(doc["body"])).hexdigest() != doc["sha256"]:
        raise CheckpointCorruptError(
            f"checkpoint file {path} fails its checksum: its content was changed after it "
            "was written. Restore it, or start on a new checkpoint directory."
        )
    return doc["body"]


def read_json_object(path: Path, kind: str) -> dict[str, Any]:
    """:func:`read_json` of a file whose body must be a JSON object."""
    body = read_json(path, kind)
    if not isinstance(body, dict):
        raise CheckpointCorruptError(
            f"checkpoint file {path} holds {type(body).__name__} where a {kind!r} object "
            "was expected; the file was edited"
        )
    return body
