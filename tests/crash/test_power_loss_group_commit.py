"""Power loss under group commit (``explorer.py``'s model): ``commits/N`` is written
without fsync, so a power loss may lose it or cut it short until ``offsets/N+1``
(which embeds it) or the stop's sync makes it durable. Every such state of a
recorded run must recover exactly once, never be refused."""

from __future__ import annotations

import random
from pathlib import Path

import explorer
import pytest

pytestmark = [pytest.mark.crash]

PER_KIND = 2
"""States recovered per kind of damage to an unsynced commit (~0.5 s each)."""


def test_a_lost_or_torn_unsynced_commit_recovers_exactly_once(tmp_path: Path) -> None:
    spec = explorer.PATHS["file -> Parquet"]
    soak = explorer.harness.Soak(spec, tmp_path)
    soak.prepare()
    roots = (tmp_path / "chk", tmp_path / "out", tmp_path / "out-late")
    explorer.run_job(spec, tmp_path)
    base = explorer.snapshot(roots)
    soak.land(spec.files)
    trace = explorer.Trace(roots)
    with explorer.recording(trace):
        explorer.run_job(spec, tmp_path)
    ops = trace.ops
    commits = [op for op in ops if op.kind == "write" and op.path.parent.name == "commits"]
    assert len(commits) >= 2, "the recorded run commits several batches"
    synced = {op.ino for op in ops if op.kind == "fsync" and op.path.parent.name == "commits"}
    assert len(synced) == 1, "only the last commit is fsync'ed on its own (at the stop)"

    # crash points where a commit is not durable: right after its rename (nothing holds
    # it: re-run) and right after the next write-ahead (offsets/N+1 holds it: restored)
    points = set()
    for op in commits:
        rename = next(o.index for o in ops[op.index:] if o.kind == "rename" and o.ino == op.ino)
        points.add(rename + 1)
        after = [o for o in ops[rename:] if o.kind == "fsync_dir" and o.path.name == "offsets"]
        if after:
            points.add(after[0].index + 1)
    chosen: dict[str, dict[str, explorer.Tree]] = {"lost": {}, "torn": {}, "empty": {}}
    rng = random.Random(3)
    renames = {o.ino: o.index for o in ops if o.kind == "rename"}
    for point in sorted(points):
        unsynced_names = {o.index for o in explorer.unsynced(ops[:point]).names}
        for state in explorer.crash_states(ops, point, 64, rng):
            variants = dict(state.variants)
            for op in commits:
                if op.index >= point or op.ino in synced:
                    continue
                rename = renames[op.ino]
                kind = ("lost" if rename in unsynced_names and rename not in state.persisted
                        else variants.get(op.ino or ""))
                if kind in chosen and len(chosen[kind]) < PER_KIND:
                    tree = explorer.materialize(base, ops, state, frozenset({tmp_path}))
                    chosen[kind].setdefault(tree.digest(), tree)
    for kind, trees in chosen.items():
        assert trees, f"no state with a {kind} commit was reached"
        for tree in trees.values():
            tree.write(roots)
            problem = explorer.check_state(spec, tmp_path)
            assert problem is None, f"{kind} commit: {problem}"
