"""Start a changed job from a savepoint: ``microbatch run NEW --checkpoint DIR
--from-savepoint SP [--map OLD=NEW]``.

Rule (docs/state.md): each operator of the new job takes the state of the
savepoint's operator with the same id, or the one ``--map OLD=NEW`` names;
``--map OLD=`` drops an old operator's state, ``--map =NEW`` starts a new
operator empty. Paired operators must be of the same kind with the same
signature (window, keys, TTL...; the aggregations may change), and each store
must have the same key columns and types and, for layouts, the same layout;
state columns are matched by name: added ones start null (refused where a null
would give a wrong result: ``first``/``last`` partials), dropped ones are
dropped, retyped ones refused. Every incompatibility is named in one error.

The new checkpoint is assembled under a temporary name beside ``DIR`` (new
query id, ``offsets/N`` and ``commits/N`` of the savepoint's batch N, the
sources' logs, each store's rows as state version N + 1 written by the
statestore's own checksummed file writer) and renamed into place last, with
``savepoint.json`` recording its origin: a process killed midway leaves no
checkpoint, and running the same command again finishes the restore, or (once
it is in place) simply continues the job at batch N + 1.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl

from microbatch.checkpoint import BatchLog, CommitEntry, OffsetEntry
from microbatch.checkpoint.files import fsync_dir, read_json, write_json_atomic
from microbatch.engine.batch_executor import build_operators
from microbatch.engine.faults import fault_point
from microbatch.exceptions import SavepointError
from microbatch.operators.join_state import BinaryOperator
from microbatch.operators.window_agg import WindowAggregate
from microbatch.plan.schemas import output_schema
from microbatch.state.layout import StoreLayout, operator_layout
from microbatch.state.savepoint import read_manifest
from statestore.files import write_arrow

if TYPE_CHECKING:
    from microbatch.api.writer import DataStreamWriter
    from microbatch.operators.base import StatefulOperator

__all__ = ["ORIGIN", "Mapping", "parse_map", "restore_savepoint"]

ORIGIN = "savepoint.json"
"""The file of a restored checkpoint naming the savepoint it started from."""
_IGNORED = ("state", "aggs", "keys")
"""Signature fields that may change (aggregations) or are checked per store (keys)."""


Mapping = list[tuple[str, str]]
"""(old operator id, new operator id) pairs; ``""`` on one side: dropped / started empty."""


def parse_map(items: list[str]) -> Mapping:
    """``["agg-0=agg-1", "dedupe-1="]`` as ``[("agg-0", "agg-1"), ("dedupe-1", "")]``."""
    out: Mapping = []
    for item in items:
        old, eq, new = item.partition("=")
        if not eq or (not old and not new):
            raise SavepointError(
                f"--map {item!r}: write OLD=NEW (operator ids), OLD= to drop an old "
                "operator's state, or =NEW to start a new operator empty")
        out.append((old.strip(), new.strip()))
    return out


def restore_savepoint(savepoint: str | os.PathLike[str], checkpoint: str | os.PathLike[str],
                      writer: DataStreamWriter, mapping: Mapping | None = None) -> str:
    """Make ``checkpoint`` a new checkpoint continuing from ``savepoint`` for the job
    of ``writer``; ``"restored"``, or ``"resumed"`` when it already is one.

    Raises SavepointError naming every incompatibility (nothing is written then).
    """
    manifest = read_manifest(savepoint)
    root = Path(checkpoint).expanduser().resolve()
    origin = {"query_id": manifest["query_id"], "batch_id": manifest["batch_id"]}
    if (root / "metadata").exists():
        if (root / ORIGIN).exists():
            done = read_json(root / ORIGIN, "savepoint-origin")
            if {k: done.get(k) for k in origin} == origin:
                return "resumed"
        raise SavepointError(
            f"{root} already holds a checkpoint that did not start from this savepoint; "
            "--from-savepoint starts the job on a new checkpoint directory: choose an empty "
            "one (or leave --from-savepoint out to continue that checkpoint)")
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        raise SavepointError(f"{root} is not empty; --from-savepoint needs a new checkpoint "
                             "directory")
    stage = root.parent / f".{root.name}.restoring"
    shutil.rmtree(stage, ignore_errors=True)  # a restore killed midway
    try:
        _stage_state(Path(savepoint).expanduser(), stage, manifest, writer, mapping or [])
        _stage_logs(Path(savepoint).expanduser(), stage, manifest, origin, mapping or [])
        fault_point("restore.before_publish", int(manifest["batch_id"]))
        if root.exists():
            root.rmdir()
        os.replace(stage, root)  # NOTE: the commit point: the checkpoint appears whole
        fsync_dir(root.parent)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return "restored"


def _pairs(old: dict[str, Any], new: dict[str, StatefulOperator], mapping: Mapping,
           problems: list[str]) -> dict[str, str]:
    """New operator id -> old operator id ("" when it starts empty)."""
    kinds = ", ".join(f"{k} ({v['kind']})" for k, v in old.items()) or "none"
    new_kinds = ", ".join(f"{k} ({op.signature().get('kind')})" for k, op in new.items()) or "none"
    pairs: dict[str, str] = {}
    handled: set[str] = set()
    for o, n in mapping:
        if o and o not in old:
            problems.append(f"--map {o}={n}: the savepoint has no operator {o!r} (it has {kinds})")
        if n and n not in new:
            problems.append(f"--map {o}={n}: the new job has no stateful operator {n!r} (it has "
                            f"{new_kinds})")
        if n in pairs:
            problems.append(f"--map: new operator {n!r} is given two old ones")
        if n:
            pairs[n] = o
        handled.add(o)
    for o in old:
        if o not in handled and o in new and o not in pairs:
            pairs[o] = o
            handled.add(o)
    for o in old:
        if o not in handled:
            problems.append(
                f"the savepoint's operator {o} ({old[o]['kind']}) has state and no counterpart in "
                f"the new job (its stateful operators: {new_kinds}): map it with --map {o}=NEW_ID "
                f"or drop its state with --map {o}=")
    for n, op in new.items():
        if n not in pairs:
            problems.append(
                f"the new job's operator {n} ({op.signature().get('kind')}) has no state in the "
                f"savepoint (it has {kinds}): map one with --map OLD_ID={n}, or start it empty "
                f"with --map ={n}")
    return pairs


def _stage_state(savepoint: Path, stage: Path, manifest: dict[str, Any],
                 writer: DataStreamWriter, mapping: Mapping) -> None:
    version = int(manifest["batch_id"]) + 1
    built = build_operators(writer.plan, writer.output_mode)
    nodes = {id(node): node for node in writer.plan.walk()}
    new = {op.operator_id: op for op in built.values()}
    node_of = {op.operator_id: nodes[key] for key, op in built.items()}
    old = manifest["operators"]
    problems: list[str] = []
    # NOTE: the offsets are positions in these sources: the engine refuses other ones
    identity = {"sources": {str(i): s.identity() for i, s in enumerate(writer.plan.sources())}}
    saved = manifest["offsets"].get("identity") or {}
    if json.loads(json.dumps(identity, default=str)) != saved:
        problems.append(f"the sources changed (the savepoint's offsets are positions in "
                        f"{json.dumps(saved, sort_keys=True)}, the new job reads "
                        f"{json.dumps(identity, sort_keys=True, default=str)})")
    pairs = _pairs(old, new, mapping, problems)
    for n, o in pairs.items():
        op, op_dir = new[n], stage / "state" / n
        if isinstance(op, BinaryOperator):
            problems.append(f"{n}: starting a join ({op.signature().get('kind')}) from a savepoint "
                            "is not supported yet; drop its state (--map OLD=) or run the job on "
                            "a new checkpoint")
            continue
        op.open(op_dir, version)
        if not o:
            continue
        before = old[o]
        sig, was = op.signature(), before["signature"]
        if before["kind"] != sig.get("kind"):
            problems.append(f"{o} -> {n}: the operator kind changed ({before['kind']} -> "
                            f"{sig.get('kind')})")
            continue
        changed = sorted(k for k in {*sig, *was} - set(_IGNORED) if sig.get(k) != was.get(k))
        problems += [f"{o} -> {n}: {k!r} changed ({was.get(k)!r} -> {sig.get(k)!r})"
                     for k in changed]
        schema = output_schema(node_of[n].children[0])
        if schema is None:
            problems.append(
                f"{n}: its input columns are not known when the job is built (a source without "
                "a declared schema, or map_batches without schema=), so its state's types "
                "cannot be checked: declare the input's schema")
            continue
        if not before["stores"]:
            continue
        _define(op, pl.DataFrame(schema=schema), version)
        stores = {s.name: s for s in operator_layout(op_dir).stores}
        for name, spec in before["stores"].items():
            store = stores.get(name)
            if store is not None:
                _fill(savepoint, spec, store, op, where=f"{o} -> {n}, store {name!r}",
                      version=version, problems=problems)
    if problems:
        raise SavepointError(
            "the new job cannot start from the savepoint "
            f"{savepoint} (batch {manifest['batch_id']}): " + "; ".join(problems) + ". Keep "
            "the state compatible (docs/state.md), map or drop operators with --map, or start "
            "the changed job on a new checkpoint without --from-savepoint")


def _fill(savepoint: Path, spec: dict[str, Any], store: StoreLayout, op: StatefulOperator, *,
          where: str, version: int, problems: list[str]) -> None:
    """Check one store's columns against the savepoint's; write its rows as ``version``."""
    rows = pl.read_parquet(savepoint / spec["file"])
    old_keys = {k: rows.schema[k] for k in spec["keys"]}
    found = len(problems)
    for k in dict.fromkeys([*old_keys, *store.keys]):
        if k not in store.keys:
            problems.append(f"{where}: key column {k!r} was removed")
        elif k not in old_keys:
            problems.append(f"{where}: key column {k!r} was added")
        elif old_keys[k] != store.keys[k]:
            problems.append(f"{where}: key column {k!r} changed type ({old_keys[k]} -> "
                            f"{store.keys[k]})")
    if spec.get("layout", "keyed") != store.layout:
        problems.append(f"{where}: the store's layout changed ({spec.get('layout')} -> "
                        f"{store.layout}: the output mode or allowed lateness changed)")
    no_null = _null_unsafe(op)
    for c, dtype in store.values.items():
        if c in spec["values"] and rows.schema[c] != dtype:
            problems.append(f"{where}: state column {c!r} changed type ({rows.schema[c]} -> "
                            f"{dtype})")
        elif c not in spec["values"] and c in no_null:
            problems.append(f"{where}: state column {c!r} was added but cannot start as null "
                            "(a first()/last() aggregate); add it under another operator")
    if len(problems) > found:
        return
    frame = rows.select(
        *store.keys,
        *(pl.col(c) if c in spec["values"] else pl.lit(None, dtype).alias(c)
          for c, dtype in store.values.items()))
    write_arrow(store.directory / "snapshot" / f"{version}.arrow", frame, kind="snapshot",
                version=version, compression="lz4")


def _define(op: StatefulOperator, empty: pl.DataFrame, version: int) -> None:
    """Let the operator's own code record its state's schema for an input of
    ``empty``'s columns and start its stores (empty) at ``version``."""
    if isinstance(op, WindowAggregate):
        op._define(empty, version)  # records the schema; the layout decides how it loads
        return
    op._load(empty, version)  # type: ignore[attr-defined]
    op.abort()


def _null_unsafe(op: StatefulOperator) -> set[str]:
    """State columns a null cannot stand for (partials of first/last)."""
    out: set[str] = set()
    for agg in getattr(op, "aggs", None) or []:
        if agg.kind in ("first", "last"):
            out.update(agg.partial_names())
    return out


def _stage_logs(savepoint: Path, stage: Path, manifest: dict[str, Any],
                origin: dict[str, Any], mapping: Mapping) -> None:
    write_json_atomic(stage / "metadata", "metadata", {
        "query_id": str(uuid.uuid4()),
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "from_savepoint": {**origin, "savepoint": str(savepoint.resolve())},
    })
    where = f"{savepoint / 'manifest.json'}"
    BatchLog(stage / "offsets", OffsetEntry).add(
        OffsetEntry.from_json(manifest["offsets"], where=where))
    BatchLog(stage / "commits", CommitEntry).add(
        CommitEntry.from_json(manifest["commit"], where=where))
    if (savepoint / "sources").is_dir():
        shutil.copytree(savepoint / "sources", stage / "sources")
    pairs = [list(pair) for pair in mapping]
    write_json_atomic(stage / ORIGIN, "savepoint-origin",
                      {**origin, "savepoint": str(savepoint.resolve()), "map": pairs})
