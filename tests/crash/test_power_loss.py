"""Power-loss crash states (``explorer.py``): recover from each, check exactly-once.

The suite explores an evenly spread sample of each path's distinct crash
states; ``make crash-explore`` (``scripts/crash_explore.py``) explores all of
them and writes the figures into ``docs/reliability.md``.
"""

from __future__ import annotations

import io
import random
from pathlib import Path

import explorer
import pytest

import sinks.delta_durability
import sinks.iceberg_io
from microbatch.operators import state_schema
from statestore.durable import note_written, write_atomic

pytestmark = [pytest.mark.crash]

SAMPLE = 30
"""Distinct crash states recovered per path in the suite (~0.3 s each)."""


@pytest.mark.parametrize("name", list(explorer.PATHS))
def test_every_sampled_power_loss_state_recovers_exactly_once(name: str, tmp_path: Path) -> None:
    report = explorer.explore(name, explorer.PATHS[name], tmp_path, max_states=SAMPLE)
    assert report.explored == min(SAMPLE, report.distinct)
    assert report.distinct > SAMPLE, "a batch's operations leave more states than the sample"
    assert not report.findings, "\n".join(f"{f.state}: {f.problem}" for f in report.findings)
    assert not report.refused, "\n".join(report.refused)
    assert report.recovered == report.explored
    kinds = set(report.ops)
    assert {"write", "fsync", "rename", "fsync_dir"} <= kinds
    if "Delta" in name:
        assert "wrote" in kinds, "the Delta sink reports delta-rs's files to the recorder"
    if "Iceberg" in name:
        assert "wrote" in kinds, "PyIceberg's files go through the sink's durable FileIO"
    if "state store" in name:
        assert "unlink" in kinds, "purges of old state versions are explored too"
    if name in explorer.FROM_SCRATCH:
        assert "mkdir" in kinds, "the first start creates the checkpoint's directories"


def test_without_the_delta_fsync_a_power_loss_loses_a_committed_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bug the explorer found: delta-rs never fsyncs a local table, so a power
    loss after ``commits/N`` could drop batch N's Delta version for good. With the
    sink's fsyncs removed, the states at the end of the recording lose rows."""
    monkeypatch.setattr(sinks.delta_durability, "fsync_file", lambda path: None)
    monkeypatch.setattr(sinks.delta_durability, "fsync_dir", lambda path: None)
    spec = explorer.PATHS["file -> Delta"]
    report = explorer.explore("file -> Delta", spec, tmp_path, last_points=1)
    assert report.findings, "the explorer should see the lost Delta version"
    assert any("missing" in f.problem for f in report.findings)


def test_without_the_iceberg_fsync_a_power_loss_loses_the_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Why the Iceberg sink writes through its durable FileIO: a SQLite catalog's
    commit is durable at once, so with PyIceberg's files left unsynced a power
    loss can keep the catalog row and lose the metadata or data it names."""

    def close_without_fsync(stream: sinks.iceberg_io._SyncedStream) -> None:
        if not stream.closed:
            io.FileIO.close(stream)
            note_written([Path(str(stream.name))])

    monkeypatch.setattr(sinks.iceberg_io._SyncedStream, "close", close_without_fsync)
    spec = explorer.PATHS["file -> Iceberg"]
    report = explorer.explore("file -> Iceberg", spec, tmp_path, last_points=1)
    lost = [r for r in report.refused if "cannot load Iceberg table" in r]
    assert lost, "the explorer should see the catalog name a lost metadata file"


def test_the_model_tears_an_unsynced_file_and_keeps_a_synced_one(tmp_path: Path) -> None:
    """The persistence model itself: an atomic write without fsync may leave the
    target empty or torn after a power loss; with fsyncs only old or new whole."""
    (tmp_path / "d").mkdir()
    target = tmp_path / "d" / "f"
    target.write_bytes(b"old")
    base = explorer.snapshot((tmp_path / "d",))
    for durable, want in ((False, {b"old", b"new content", b"", b"new c"}),
                          (True, {b"old", b"new content"})):
        trace = explorer.Trace((tmp_path / "d",))
        with explorer.recording(trace):
            write_atomic(target, b"new content", durable=durable)
        seen = set()
        for point in range(len(trace.ops) + 1):
            for state in explorer.crash_states(trace.ops, point, 64, random.Random(1)):
                files = dict(explorer.materialize(base, trace.ops, state).files)
                seen.add(files.get(target))
        assert seen == want, (durable, seen)


@pytest.mark.parametrize("agg", ["tumbling", "session", "fire_once"])
def test_a_crash_between_the_two_state_schema_files_is_recovered(
    agg: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by the explorer's first-start path (a SIGKILL does it too): the
    aggregation's state schema is ``schema.arrow`` then ``schema.json`` (the commit
    point); a start that found only the first refused the checkpoint as corrupt."""
    spec = explorer.harness.JobSpec(source="files", sink="parquet", agg=agg, files=2, cap=1,
                                    snapshot_every=None, state_retention=None)  # type: ignore[arg-type]
    soak = explorer.harness.Soak(spec, tmp_path)
    soak.prepare()
    soak.land(spec.files)
    real = state_schema.write_json_atomic

    def crash_before_names(path: Path, *args: object, **kwargs: object) -> None:
        if path.name == "schema.json":
            raise OSError(5, "the machine lost power here", str(path))
        real(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(state_schema, "write_json_atomic", crash_before_names)
    with pytest.raises(Exception, match="lost power"):
        explorer.run_job(spec, tmp_path)
    monkeypatch.undo()
    left = sorted(p.name for p in (tmp_path / "chk" / "state").rglob("schema.*"))
    assert left == ["schema.arrow"]
    explorer.run_job(spec, tmp_path)
    verdict = explorer.harness.verify(spec, tmp_path)
    assert verdict.exact, verdict
