"""Missing commit-log entries: only the last batch may be uncommitted.

The documented rule re-runs the last ``offsets/N`` without ``commits/N``.
When commit entries *below* it are missing too (a careless clean-up, a restore
from an incomplete backup), re-running only the last batch would leave the
others unaccounted for: the first start refuses, names the batches and the
fix, exits 2 at the CLI, and changes nothing. For file -> Parquet and
file -> Delta, through ``microbatch run`` on a real job.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from harness import JobSpec, Kill, Soak, verify

pytestmark = pytest.mark.slow

FILES = 14


@pytest.fixture(params=["parquet", "delta"])
def clean(request: pytest.FixtureRequest, tmp_path: Path) -> Soak:
    """One clean run over every input file, one file per batch.

    NOTE: one per test: the checkpoint records the input directory's path, so a
    copy of the working directory elsewhere would be a different job."""
    spec = JobSpec(source="files", sink=request.param, cap=1, files=FILES,
                   snapshot_every=None, state_retention=None)
    soak = Soak(spec, tmp_path / "w")
    soak.prepare()
    soak.land(FILES)
    outcome = soak.run(Kill("clean"))
    assert outcome.returncode == 0, outcome.stderr[-2000:]
    assert verify(spec, soak.work).exact
    return soak


def _ids(directory: Path) -> list[int]:
    return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit())


def _snapshot(soak: Soak) -> dict[str, bytes]:
    """Every file of the checkpoint logs and the output, by relative path."""
    return {
        str(p.relative_to(soak.work)): p.read_bytes()
        for base in (soak.chk / "offsets", soak.chk / "commits", soak.work / "out")
        for p in sorted(base.rglob("*")) if p.is_file()
    }


def test_one_missing_trailing_commit_reruns_that_batch(clean: Soak) -> None:
    soak = clean
    last = _ids(soak.chk / "commits")[-1]
    (soak.chk / "commits" / str(last)).unlink()
    outcome = soak.run(Kill("clean"))
    assert outcome.returncode == 0, outcome.stderr[-2000:]
    assert f"recovering batch {last} from its write-ahead entry" in outcome.stderr
    assert _ids(soak.chk / "commits")[-1] == last
    assert verify(soak.spec, soak.work).exact


@pytest.mark.parametrize("run_length", [2, 4])
def test_a_run_of_missing_trailing_commits_is_refused_at_the_first_start(
    clean: Soak, run_length: int
) -> None:
    soak = clean
    commits = _ids(soak.chk / "commits")
    gone = commits[-run_length:]
    for batch in gone:
        (soak.chk / "commits" / str(batch)).unlink()
    before = _snapshot(soak)
    for attempt in range(2):  # refused at the first start, and again at the next
        outcome = soak.run(Kill("clean"))
        assert outcome.returncode == 2, (attempt, outcome.stderr[-2000:])
        message = outcome.stderr
        assert f"missing entries for batches {gone[:-1]}" in message
        assert "Restore the missing commit files" in message
        assert "Traceback" not in message
        assert _snapshot(soak) == before  # nothing ran, nothing was written


def test_a_missing_commit_in_the_middle_is_refused(clean: Soak) -> None:
    soak = clean
    commits = _ids(soak.chk / "commits")
    middle = commits[len(commits) // 2]
    (soak.chk / "commits" / str(middle)).unlink()
    before = _snapshot(soak)
    outcome = soak.run(Kill("clean"))
    assert outcome.returncode == 2, outcome.stderr[-2000:]
    assert f"missing entries for batches [{middle}]" in outcome.stderr
    assert "Traceback" not in outcome.stderr
    assert _snapshot(soak) == before
