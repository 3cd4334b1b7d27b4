"""``microbatch backfill`` over an Iceberg source and ``microbatch diff`` of Iceberg tables."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
from iceberg_helpers import append_snapshots, events, new_table, whole_table
from polars.testing import assert_frame_equal
from typer.testing import CliRunner

from microbatch.cli.app import app
from microbatch.cli.common import CliError
from microbatch.cli.table_refs import latest_metadata_file, parse_table_ref

REPO = Path(__file__).resolve().parents[2]

JOB = '''
from dataclasses import dataclass
import microbatch as mb


@dataclass(frozen=True)
class Params:
    catalog: str
    output: str


def build(params: Params) -> mb.DataStreamWriter:
    return (mb.read_iceberg("db.events", catalog=params.catalog, max_files_per_batch=2)
            .write_parquet(params.output))
'''


def test_backfill_shows_snapshots_files_and_rows_of_the_backlog(
    catalog_uri: str, tmp_path: Path
) -> None:
    table = new_table(catalog_uri)
    append_snapshots(table, [100, 50, 25, 0, 10, 5])
    job = tmp_path / "job.py"
    job.write_text(JOB)
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MICROBATCH_FAULT")}
    done = subprocess.run(
        [sys.executable, "-m", "microbatch.cli", "backfill", str(job), "--checkpoint",
         str(tmp_path / "chk"), "--param", f"catalog={catalog_uri}", "--param",
         f"output={out}"], cwd=REPO, capture_output=True, text=True, timeout=90, env=env,
        check=False)
    assert done.returncode == 0, done.stderr
    lines = [ln for ln in done.stderr.splitlines() if ln.startswith("backfill batch")]
    assert lines[0].startswith("backfill batch 0: snapshots 2/5 │ files 2/5 │ rows 150/190")
    assert lines[-1].startswith("backfill batch 2: snapshots 5/5 │ files 5/5 │ rows 190/190 "
                                "(100.0%)")
    got = pl.read_parquet(out / "**" / "*.parquet")  # every batch committed
    assert_frame_equal(got.sort("event_id"), whole_table(table).sort("event_id"))


def invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, ["diff", *args])
    return result.exit_code, result.stdout, result.stderr


def test_diff_takes_catalog_tables_and_table_directories(
    catalog_uri: str, tmp_path: Path
) -> None:
    a, b = new_table(catalog_uri, "db.a"), new_table(catalog_uri, "db.b")
    append_snapshots(a, [30, 20])
    append_snapshots(b, [50])
    code, out, err = invoke("db.a", "db.b", "--key", "event_id", "--catalog", catalog_uri)
    assert code == 0, err
    assert "equal" in out

    b.refresh().delete("event_id = 7")
    b.refresh().append(events(7, 1).set_column(2, "amount", pl.Series([0.5]).to_arrow()))
    b.refresh().append(events(900, 1))
    directory = Path(b.refresh().location().removeprefix("file://"))
    assert parse_table_ref(str(directory)).kind == "iceberg-metadata"
    assert latest_metadata_file(directory) == Path(
        b.refresh().metadata_location.removeprefix("file://"))
    delta = tmp_path / "delta"
    whole_table(a).write_delta(str(delta))
    code, out, err = invoke(str(delta), str(directory), "--key", "event_id", "--json")
    assert code == 1, err
    report = json.loads(out)
    assert (report["only_in_a"], report["only_in_b"], report["changed"]) == (0, 1, 1)
    assert report["changed_columns"] == {"amount": 1}


@pytest.mark.parametrize(("args", "message"), [
    (["db.a", "db.a"], "pass --catalog"),
    (["db.nope", "db.nope", "--catalog", "{catalog}"], "has no Iceberg table db.nope"),
    (["nonamespace", "x", "--catalog", "{catalog}"], "needs a namespace"),
    (["/no/such/table", "/no/such/table"], "cannot read Delta table /no/such/table"),
])
def test_diff_table_reference_errors_say_how_to_name_the_table(
    catalog_uri: str, args: list[str], message: str
) -> None:
    code, _, err = invoke(*[arg.format(catalog=catalog_uri) for arg in args])
    assert code == 2
    assert message in " ".join(err.split())
    assert "Traceback" not in err
    with pytest.raises(CliError, match="namespace"):
        parse_table_ref("events", catalog=catalog_uri)
