"""A table knows its writers, and a rebuild is swapped in with ``microbatch promote``:
the example job ``jobs/daily_totals.py`` as real CLI processes, SIGKILLed inside
promote and inside the handed-over job, checked against a one-shot Polars oracle.

One workflow, run once by the module fixture and asserted step by step:

1. OLD writes LIVE; a stray non-streaming append corrupts LIVE (the doubled rows
   of the issue); a second checkpoint on LIVE is refused (exit 2, one paragraph);
2. NEW rebuilds into REBUILD beside it; ``diff`` LIVE vs REBUILD differs;
3. promote is refused while OLD runs; SIGKILLed between its two commits; then
   OLD and NEW are both refused on LIVE until promote is re-run; a third run
   finds it done;
4. NEW takes LIVE over, SIGKILLed once after a commit, and appends new input
   exactly once; OLD stays refused as a retired writer.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl
import pytest
from delta_helpers import append_versions, transactions
from deltalake import DeltaTable
from test_delta_cli import one_shot_daily_totals

from microbatch.checkpoint.lock import CheckpointLock
from microbatch.exceptions import PromoteError
from microbatch.tools.promote import PromoteResult, promote
from sinks.delta_writers import WriterEntry, table_writers

REPO = Path(__file__).resolve().parents[2]
JOB = REPO / "jobs" / "daily_totals.py"


def cli(*args: str | Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("MICROBATCH_FAULT")}
    base["PYTHONPATH"] = os.pathsep.join([str(REPO), base.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-m", "microbatch.cli", *map(str, args)], cwd=REPO,
                          capture_output=True, text=True, timeout=120,
                          env={**base, **(env or {})}, check=False)


def run(chk: Path, lake: Path, out: Path, env: dict[str, str] | None = None,
        ) -> subprocess.CompletedProcess[str]:
    return cli("run", JOB, "--checkpoint", chk, "--trigger", "available-now",
               "--param", f"input={lake}", "--param", f"output={out}", env=env)


def table(path: Path) -> pl.DataFrame:
    return pl.read_delta(str(path)).sort("day", "card_id")


@dataclass
class Flow:
    """What each step of the workflow returned, for the tests to assert on."""

    tmp: Path
    steps: dict[str, subprocess.CompletedProcess[str]] = field(default_factory=dict)
    frames: dict[str, pl.DataFrame] = field(default_factory=dict)
    versions: dict[str, int] = field(default_factory=dict)
    refusal: str = ""
    again: PromoteResult | None = None
    history: list[dict[str, object]] = field(default_factory=list)
    writers: dict[str, WriterEntry] = field(default_factory=dict)

    @property
    def lake(self) -> Path:
        return self.tmp / "lake"

    @property
    def live(self) -> Path:
        return self.tmp / "live"

    @property
    def rebuild(self) -> Path:
        return self.tmp / "rebuild"

    def chk(self, name: str) -> Path:
        return self.tmp / "chk" / name


@pytest.fixture(scope="module")
def flow(tmp_path_factory: pytest.TempPathFactory) -> Flow:
    f = Flow(tmp_path_factory.mktemp("promote"))
    append_versions(str(f.lake), [transactions(i * 150, 150) for i in range(3)])
    steps = f.steps
    f.frames["oracle_first"] = one_shot_daily_totals(f.lake)
    steps["old"] = run(f.chk("old"), f.lake, f.live)
    # a stray writer (not a streaming query) appends a copy of some rows: LIVE is wrong
    pl.read_delta(str(f.live)).head(5).write_delta(str(f.live), mode="append")
    f.versions["live_before"] = DeltaTable(str(f.live)).version()
    steps["second"] = run(f.chk("second"), f.lake, f.live)
    f.versions["live_after_second"] = DeltaTable(str(f.live)).version()
    steps["new"] = run(f.chk("new"), f.lake, f.rebuild)
    f.frames["rebuild"] = table(f.rebuild)
    steps["diff_before"] = cli("diff", f.live, f.rebuild)  # whole rows: LIVE repeats keys
    command = ("promote", f.rebuild, "--to", f.live, "--checkpoint", f.chk("new"))
    lock = CheckpointLock(f.chk("old") / "lock")
    lock.acquire()  # as a running OLD would hold it
    try:
        with pytest.raises(PromoteError) as refused:
            promote(str(f.rebuild), live=str(f.live), checkpoint=f.chk("new"))
        f.refusal = str(refused.value)
    finally:
        lock.release()
    f.versions["live_after_locked"] = DeltaTable(str(f.live)).version()
    steps["promote_killed"] = cli(*command, env={"MICROBATCH_FAULT": "promote.after_retire"})
    steps["old_mid"] = run(f.chk("old"), f.lake, f.live)
    steps["new_mid"] = run(f.chk("new"), f.lake, f.live)
    f.frames["live_mid"] = table(f.live)
    steps["promote"] = cli(*command)
    f.versions["live_promoted"] = DeltaTable(str(f.live)).version()
    f.frames["live_promoted"] = table(f.live)
    f.history = DeltaTable(str(f.live)).history(limit=2)
    f.again = promote(str(f.rebuild), live=str(f.live), checkpoint=f.chk("new"))
    f.versions["live_again"] = DeltaTable(str(f.live)).version()
    # new input arrives; NEW takes LIVE over (killed once after a commit of its new batch)
    append_versions(str(f.lake), [transactions(450 + i * 150, 150) for i in range(2)])
    steps["handover_killed"] = run(f.chk("new"), f.lake, f.live,
                                   env={"MICROBATCH_FAULT": "sink.after_commit"})
    steps["handover"] = run(f.chk("new"), f.lake, f.live)
    steps["old_after"] = run(f.chk("old"), f.lake, f.live)
    f.frames["live_final"] = table(f.live)
    assert f.again is not None
    DeltaTable(str(f.live)).restore(f.again.previous_version)  # the documented undo
    f.frames["undone"] = table(f.live)
    f.writers = table_writers(DeltaTable(str(f.live)))
    return f


def test_a_second_checkpoint_appending_to_the_table_is_refused(flow: Flow) -> None:
    assert flow.steps["old"].returncode == 0, flow.steps["old"].stderr
    second = flow.steps["second"]
    assert second.returncode == 2, second.stderr
    message = " ".join(second.stderr.split())
    assert "Traceback" not in second.stderr
    assert message.count("error:") == 1  # one paragraph
    assert f"checkpoint {flow.chk('old')}" in message  # names the other writer
    assert "new table path" in message
    assert "allow_other_writers=True" in message
    assert flow.versions["live_after_second"] == flow.versions["live_before"]  # nothing written


def test_the_rebuild_differs_from_the_corrupted_live_table(flow: Flow) -> None:
    assert flow.steps["new"].returncode == 0, flow.steps["new"].stderr
    assert flow.steps["diff_before"].returncode == 1, flow.steps["diff_before"].stdout
    assert flow.frames["rebuild"].equals(flow.frames["oracle_first"])


def test_promote_is_refused_while_a_writer_of_live_runs(flow: Flow) -> None:
    assert "being written right now" in flow.refusal
    assert str(flow.chk("old")) in flow.refusal
    assert flow.versions["live_after_locked"] == flow.versions["live_before"]


def test_a_killed_promote_blocks_both_writers_until_it_is_rerun(flow: Flow) -> None:
    assert flow.steps["promote_killed"].returncode == -9  # SIGKILL between its commits
    old, new = flow.steps["old_mid"], flow.steps["new_mid"]
    assert (old.returncode, new.returncode) == (2, 2), old.stderr + new.stderr
    assert "was retired as its writer" in old.stderr
    assert "did not commit the rebuild's rows" in " ".join(new.stderr.split())
    assert flow.frames["live_mid"].height > 0  # the old rows, untouched meanwhile


def test_promote_swaps_the_rebuild_in_once(flow: Flow) -> None:
    assert flow.steps["promote"].returncode == 0, flow.steps["promote"].stderr
    assert flow.frames["live_promoted"].equals(flow.frames["oracle_first"])
    assert "promoted" in flow.steps["promote"].stdout
    assert flow.again is not None
    assert flow.again.already  # a re-run finds it done and commits nothing
    assert flow.again.previous_version == flow.versions["live_before"]  # what undo restores
    assert flow.versions["live_again"] == flow.versions["live_promoted"]
    assert "microbatch.promote" in flow.history[0]  # the overwrite names its rebuild
    assert flow.history[1]["operation"] == "SET TBLPROPERTIES"  # the retirement


def test_the_new_checkpoint_takes_live_over_exactly_once(flow: Flow) -> None:
    assert flow.steps["handover_killed"].returncode == -9, flow.steps["handover_killed"].stderr
    assert flow.steps["handover"].returncode == 0, flow.steps["handover"].stderr
    assert flow.frames["live_final"].equals(one_shot_daily_totals(flow.lake))
    old = flow.steps["old_after"]
    assert old.returncode == 2, old.stderr
    assert "by `microbatch promote`" in " ".join(old.stderr.split())


def test_restoring_the_version_before_the_promote_undoes_it(flow: Flow) -> None:
    assert flow.frames["undone"].equals(flow.frames["live_mid"])  # the old rows again
    active = {e.checkpoint for e in flow.writers.values() if not e.retired}
    assert active == {str(flow.chk("old"))}  # and the old writer is the writer again
