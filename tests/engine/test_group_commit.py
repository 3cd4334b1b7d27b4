"""Group commit: ``commits/N`` is written without fsync and made durable inside
``offsets/N+1`` (or on its own when the query idles or stops); recovery
restores a lost or torn commit from the write-ahead log and re-runs a torn
newest one. The power-loss side is in ``tests/crash/test_power_loss_group_commit.py``.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import microbatch as mb
import statestore.durable
from microbatch.checkpoint import Checkpoint
from microbatch.checkpoint.files import read_json, write_json_atomic

ROWS = pl.DataFrame({"id": list(range(60)), "amount": [float(i % 7) for i in range(60)]})
PREDICATE = pl.col("amount") > 2


def land(directory: Path, rows: pl.DataFrame, cuts: list[int], first: int = 0) -> None:
    """``rows`` as Parquet files split at ``cuts`` (one batch each), named in order."""
    directory.mkdir(exist_ok=True)
    bounds = [0, *cuts, rows.height]
    for i, (a, b) in enumerate(itertools.pairwise(bounds)):
        rows.slice(a, b - a).write_parquet(directory / f"part-{first + i:04d}.parquet")


def run(work: Path) -> mb.StreamingQuery:
    stream = mb.read_files(work / "in", format="parquet", max_files_per_batch=1)
    query = stream.filter(PREDICATE).write_parquet(work / "out").start(
        work / "chk", trigger="available-now")
    query.await_termination(60)
    return query


def output(work: Path) -> pl.DataFrame:
    return mb.parquet_table(work / "out").sort("id")


def oracle(rows: pl.DataFrame) -> pl.DataFrame:
    return rows.filter(PREDICATE).sort("id")


@settings(max_examples=3, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cuts=st.lists(st.integers(1, ROWS.height - 1), min_size=2, max_size=5, unique=True))
def test_each_write_ahead_carries_the_commit_before_it(
    tmp_path_factory: pytest.TempPathFactory, cuts: list[int]
) -> None:
    work = tmp_path_factory.mktemp("gc")
    land(work / "in", ROWS, sorted(cuts))
    ops: list[statestore.durable.FileOp] = []
    with statestore.durable.recording(ops.append):
        run(work)
    assert output(work).equals(oracle(ROWS))
    chk = Checkpoint(work / "chk")
    batches = chk.offsets.batch_ids()
    assert batches == list(range(len(cuts) + 1))
    for batch_id in batches[1:]:
        entry = chk.offsets.get(batch_id)
        assert entry is not None
        assert entry.previous_commit == chk.commits.get(batch_id - 1)
    # a commit file is fsync'ed only when the run stops (the last one), never per batch
    synced = [op[1].name for op in ops if op[0] == "fsync" and op[1].parent.name == "commits"]
    assert synced == [str(batches[-1])]
    assert chk.commits.synced() == batches[-1]


def test_a_lost_or_torn_commit_is_restored_and_a_torn_newest_one_re_run(tmp_path: Path) -> None:
    """What a power loss may leave after batch 4 when the last sync was at batch 1:
    commits 2 and 3 lost or cut short (offsets/3 and /4 hold them), commits/4 cut
    short (nothing holds it: batch 4 is re-run, the sink's manifest absorbs it)."""
    land(tmp_path / "in", ROWS, [10, 20, 30, 40])
    run(tmp_path)
    chk = Checkpoint(tmp_path / "chk")
    embedded = {b: chk.offsets.get(b + 1).previous_commit for b in (2, 3)}  # type: ignore[union-attr]
    chk.commits.mark_synced(1)
    (tmp_path / "chk" / "commits" / "2").unlink()
    for name in ("3", "4"):
        path = tmp_path / "chk" / "commits" / name
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    more = pl.DataFrame({"id": list(range(60, 70)), "amount": [5.0] * 10})
    land(tmp_path / "in", more, [], first=5)

    query = run(tmp_path)

    assert query.exception is None
    assert output(tmp_path).equals(oracle(pl.concat([ROWS, more])))
    assert {b: chk.commits.get(b) for b in (2, 3)} == embedded
    assert chk.commits.batch_ids() == list(range(6))
    assert [p["batch_id"] for p in query.recent_progress if p.get("recovered")] == [4]


def test_a_checkpoint_written_before_group_commit_is_continued(tmp_path: Path) -> None:
    """No ``commits-durable`` marker and no embedded commits (main's format): every
    commit was fsync'ed, so the start records them as durable and goes on."""
    land(tmp_path / "in", ROWS, [20, 40])
    run(tmp_path)
    chk = Checkpoint(tmp_path / "chk")
    chk.commits.synced_path.unlink()
    for batch_id in chk.offsets.batch_ids():
        path = chk.offsets.path(batch_id)
        body = read_json(path, "offsets")
        body.pop("previous_commit", None)
        path.unlink()
        write_json_atomic(path, "offsets", body)
    more = pl.DataFrame({"id": list(range(60, 70)), "amount": [5.0] * 10})
    land(tmp_path / "in", more, [], first=3)

    query = run(tmp_path)

    assert query.exception is None
    assert output(tmp_path).equals(oracle(pl.concat([ROWS, more])))
    assert chk.commits.synced() == 3
    assert not any(p.get("recovered") for p in query.recent_progress)
