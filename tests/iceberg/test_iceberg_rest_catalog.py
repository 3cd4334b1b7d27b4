"""The REST catalog path the Iceberg sink and source use, against a real server.

Everything goes through ``sinks.iceberg_catalog.resolve_catalog("http://...")``
and the local Iceberg REST catalog (``iceberg_rest_catalog`` in conftest.py):
namespaces, a partitioned table, appends that carry snapshot properties, a
fresh client reading them back, and the server refusing a stale writer.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import polars as pl
import pyarrow as pa
import pytest
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import IdentityTransform
from pyiceberg.types import LongType, NestedField, StringType

from scripts.iceberg_rest import RestCatalog, running_catalog
from scripts.maven_jars import free_port
from sinks.exceptions import SinkConfigError
from sinks.iceberg_catalog import resolve_catalog

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = Schema(
    NestedField(1, "account", StringType(), required=False),
    NestedField(2, "amount", LongType(), required=False),
)
BY_ACCOUNT = PartitionSpec(
    PartitionField(source_id=1, field_id=1000, transform=IdentityTransform(), name="account")
)


def _batch(accounts: list[str], amounts: list[int]) -> pa.Table:
    return pa.table({"account": pa.array(accounts, pa.string()),
                     "amount": pa.array(amounts, pa.int64())})


def _namespace() -> str:
    return f"ns_{uuid.uuid4().hex[:8]}"


def test_partitioned_appends_with_snapshot_properties_read_back(
    iceberg_rest_catalog: RestCatalog,
) -> None:
    writer = resolve_catalog(iceberg_rest_catalog.uri)
    ns = _namespace()
    writer.create_namespace(ns)
    table = writer.create_table((ns, "payments"), schema=SCHEMA, partition_spec=BY_ACCOUNT)
    batches = [_batch(["a", "b", "a"], [1, 2, 3]), _batch(["c", "a"], [4, 5])]
    for batch_id, batch in enumerate(batches):
        table.append(batch, snapshot_properties={"microbatch.batch-id": str(batch_id)})

    reader = resolve_catalog(iceberg_rest_catalog.uri)  # a second client: state is the server's
    assert (ns,) in reader.list_namespaces()
    again = reader.load_table(f"{ns}.payments")
    got = pl.DataFrame(again.scan().to_arrow())
    want = pl.concat([pl.DataFrame(b) for b in batches])  # the one-shot oracle
    assert got.sort(["account", "amount"]).equals(want.sort(["account", "amount"]))
    assert [f.name for f in again.spec().fields] == ["account"]
    snapshots = again.snapshots()
    assert [s.summary["microbatch.batch-id"] for s in snapshots if s.summary] == ["0", "1"]
    assert again.current_snapshot() is not None
    assert again.current_snapshot().snapshot_id == snapshots[-1].snapshot_id  # type: ignore[union-attr]
    # the server wrote the metadata and the client the data, both in the local warehouse
    table_dir = iceberg_rest_catalog.warehouse / ns / "payments"
    assert {p.name for p in (table_dir / "data").iterdir()} == {
        "account=a", "account=b", "account=c"}
    assert Path(again.metadata_location.removeprefix("file:")).parent == table_dir / "metadata"


def test_the_server_refuses_a_commit_on_a_stale_table(iceberg_rest_catalog: RestCatalog) -> None:
    catalog = resolve_catalog(iceberg_rest_catalog.uri)
    ns = _namespace()
    catalog.create_namespace(ns)
    # no client-side retry: PyIceberg would otherwise rebase the append and commit again
    catalog.create_table((ns, "t"), schema=SCHEMA, partition_spec=BY_ACCOUNT,
                         properties={"commit.retry.num-retries": "0"})
    first = resolve_catalog(iceberg_rest_catalog.uri).load_table((ns, "t"))
    second = resolve_catalog(iceberg_rest_catalog.uri).load_table((ns, "t"))
    first.append(_batch(["a"], [1]), snapshot_properties={"writer": "first"})
    with pytest.raises(CommitFailedException):
        second.append(_batch(["b"], [2]), snapshot_properties={"writer": "second"})

    after = catalog.load_table((ns, "t"))
    assert after.scan().to_arrow().to_pydict() == {"account": ["a"], "amount": [1]}
    assert [s.summary["writer"] for s in after.snapshots() if s.summary] == ["first"]


def test_a_rest_url_with_nothing_listening_says_so() -> None:
    port = free_port()  # free a moment ago: nothing listens there
    with pytest.raises(SinkConfigError, match=(
        rf"no Iceberg REST catalog answers at http://127\.0\.0\.1:{port} "
        r"\(Connection refused\): start the catalog's server")):
        resolve_catalog(f"http://127.0.0.1:{port}")


def test_the_server_stops_with_its_block_or_sigterm_and_its_directory_keeps_the_catalog(
    tmp_path: Path,
) -> None:
    with running_catalog(tmp_path) as first:
        resolve_catalog(first.uri).create_namespace("kept")
    with pytest.raises(SinkConfigError, match="Connection refused"):
        resolve_catalog(first.uri)  # stopped: nothing listens on its port any more

    # the shell command on the same directory: the same catalog.db, a new port
    env = {**os.environ, "MICROBATCH_PYTHON": sys.executable}
    with subprocess.Popen([str(ROOT / "scripts" / "iceberg-rest"), "run", str(tmp_path)],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env=env) as proc:
        assert proc.stdout is not None
        uri = proc.stdout.readline().strip()  # printed once the server answers
        assert uri.startswith("http://127.0.0.1:"), proc.stderr.read() if proc.stderr else ""
        assert ("kept",) in resolve_catalog(uri).list_namespaces()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    with pytest.raises(SinkConfigError, match="Connection refused"):
        resolve_catalog(uri)  # the server went with the command


def test_stream_into_and_out_of_a_rest_catalog_equals_one_shot(
    iceberg_rest_catalog: RestCatalog, tmp_path: Path,
) -> None:
    """The sink and the source through the REST catalog: raw events appended by one
    query (replayed after a lost commits/N: no duplicate), read back as a stream by
    another that counts them per window, equal to Polars on the events."""
    import random
    import shutil

    import microbatch as mb

    ns = _namespace()
    rng = random.Random(7)
    events = pl.DataFrame({
        "id": range(400),
        "account": [f"a{rng.randrange(5)}" for _ in range(400)],
        "amount": [rng.randrange(1, 100) for _ in range(400)],
    }).with_columns(ts=pl.datetime(2026, 1, 1, time_zone="UTC")
                    + pl.duration(seconds=pl.col("id") * 3))
    raw = f"{ns}.payments"
    chk = tmp_path / "chk-raw"
    for _ in range(2):  # the second run replays the last batch: its commit record is gone
        query = (mb.read_memory(events, max_records_per_batch=rng.randrange(30, 90))
                 .write_iceberg(raw, catalog=iceberg_rest_catalog.uri, partition_by="account")
                 .start(chk, trigger="available-now"))
        assert query.await_termination(60)
        last = max(int(p.name) for p in (chk / "commits").iterdir())
        (chk / "commits" / str(last)).unlink()
        shutil.rmtree(chk / "state", ignore_errors=True)
    table = resolve_catalog(iceberg_rest_catalog.uri).load_table((ns, "payments"))
    got = pl.from_arrow(table.scan().to_arrow())
    assert isinstance(got, pl.DataFrame)
    assert got.sort("id").equals(events.with_columns(pl.col("ts").dt.cast_time_unit("us")))

    counts = (mb.read_iceberg(raw, catalog=iceberg_rest_catalog.uri, max_files_per_batch=3)
              .with_watermark("ts", "1h")  # a snapshot spans minutes: nothing late
              .group_by(mb.window("ts", "5m"), "account")
              .agg(pl.len().alias("n"), pl.col("amount").sum().alias("total"))
              .write_memory(f"rest_counts_{ns}", output_mode="update")
              .start(tmp_path / "chk-counts", trigger="available-now"))
    assert counts.await_termination(60)
    want = (events.group_by(pl.col("ts").dt.truncate("5m").alias("window_start"), "account")
            .agg(pl.len().alias("n"), pl.col("amount").sum().alias("total"))
            .sort("window_start", "account"))
    streamed = (mb.table(f"rest_counts_{ns}").sort("window_start", "account")
                .select(want.columns).with_columns(pl.col("window_start").dt.cast_time_unit("us")))
    assert streamed.equals(want.cast(dict(streamed.schema)))  # type: ignore[arg-type]
