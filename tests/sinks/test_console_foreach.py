"""ConsoleSink and ForeachBatchSink: at-most-once per batch id within a sink object."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from sinks.base import SinkContext
from sinks.console import ConsoleSink
from sinks.exceptions import SinkConfigError, SinkError
from sinks.foreach import ForeachBatchSink

REPO = Path(__file__).resolve().parents[2]


def opened(sink):
    """``sink`` opened for query ``q``, as the engine does before the first batch."""
    sink.open(SinkContext(query_id="q"))
    return sink


def test_add_batch_before_open_is_refused():
    with pytest.raises(SinkError, match=r"ConsoleSink.add_batch\(0\) before open"):
        ConsoleSink().add_batch(0, pl.DataFrame({"a": [1]}))


def test_console_prints_a_header_and_the_frame():
    out = io.StringIO()
    sink = ConsoleSink(stream=out)
    sink.open(SinkContext(query_id="q1"))
    sink.add_batch(7, pl.DataFrame({"word": ["hello"], "n": [3]}))
    text = out.getvalue()
    assert text.startswith("-" * 43 + "\nBatch: 7\n" + "-" * 43 + "\n")
    assert "shape: (1, 2)" in text
    assert "hello" in text


def test_console_writes_to_stdout_by_default(capsys):
    opened(ConsoleSink()).add_batch(0, pl.DataFrame({"a": [41]}))
    assert "Batch: 0" in capsys.readouterr().out


def test_console_skips_a_repeated_or_older_batch_id():
    out = io.StringIO()
    sink = ConsoleSink(stream=out)
    sink.open(SinkContext(query_id="q1"))
    sink.add_batch(0, pl.DataFrame({"a": [1]}))
    sink.add_batch(1, pl.DataFrame({"a": [2]}))
    sink.add_batch(1, pl.DataFrame({"a": [2]}))
    sink.add_batch(0, pl.DataFrame({"a": [1]}))
    assert out.getvalue().count("Batch: ") == 2

    sink.open(SinkContext(query_id="q2"))  # another query: its batch 0 is new
    sink.add_batch(0, pl.DataFrame({"a": [1]}))
    assert out.getvalue().count("Batch: 0") == 2


def test_console_limits_rows_to_num_rows():
    out = io.StringIO()
    sink = opened(ConsoleSink(num_rows=4, stream=out))
    sink.add_batch(0, pl.DataFrame({"a": list(range(100, 200))}))
    text = out.getvalue()
    assert "shape: (100, 1)" in text
    assert "…" in text
    shown = [v for v in range(100, 200) if f" {v} " in text]
    assert shown == [100, 101, 198, 199]


def test_console_truncate_false_shows_long_strings_and_all_columns():
    df = pl.DataFrame({"s": ["x" * 300], **{f"c{i}": [i] for i in range(40)}})
    short, full = io.StringIO(), io.StringIO()
    opened(ConsoleSink(stream=short)).add_batch(0, df)
    opened(ConsoleSink(truncate=False, stream=full)).add_batch(0, df)
    assert "x" * 300 not in short.getvalue()
    assert "x" * 300 in full.getvalue()
    assert "c20" in full.getvalue()


@pytest.mark.parametrize("num_rows", [0, -1, 2.5, True])
def test_console_rejects_bad_num_rows(num_rows):
    with pytest.raises(SinkConfigError, match="num_rows"):
        ConsoleSink(num_rows=num_rows)


def test_foreach_calls_fn_with_frame_and_batch_id_once_per_id():
    calls: list[tuple[int, list[int]]] = []
    sink = ForeachBatchSink(lambda df, batch_id: calls.append((batch_id, df["a"].to_list())))
    sink.open(SinkContext(query_id="q1"))
    sink.add_batch(0, pl.DataFrame({"a": [1, 2]}))
    sink.add_batch(0, pl.DataFrame({"a": [1, 2]}))
    sink.add_batch(1, pl.DataFrame({"a": [3]}))
    sink.add_batch(1, pl.DataFrame({"a": [3]}))
    assert calls == [(0, [1, 2]), (1, [3])]


def test_foreach_failure_names_the_batch_and_the_retry_calls_fn_again():
    attempts: list[int] = []

    def flaky(df: pl.DataFrame, batch_id: int) -> None:
        attempts.append(batch_id)
        if len(attempts) == 1:
            raise ConnectionError("warehouse unreachable")

    sink = opened(ForeachBatchSink(flaky))
    with pytest.raises(SinkError, match="flaky failed on batch 3: ConnectionError") as info:
        sink.add_batch(3, pl.DataFrame({"a": [1]}))
    assert isinstance(info.value.__cause__, ConnectionError)
    sink.add_batch(3, pl.DataFrame({"a": [1]}))
    sink.add_batch(3, pl.DataFrame({"a": [1]}))
    assert attempts == [3, 3]


def test_foreach_rejects_a_non_callable():
    with pytest.raises(SinkConfigError, match="needs a function"):
        ForeachBatchSink("print")  # type: ignore[arg-type]


def test_foreach_describe_names_the_function():
    def upsert_to_warehouse(df: pl.DataFrame, batch_id: int) -> None:
        del df, batch_id

    described = ForeachBatchSink(upsert_to_warehouse).describe()
    assert described["kind"] == "ForeachBatchSink"
    assert described["fn"].endswith("upsert_to_warehouse")


def test_package_facade_exports_the_public_api():
    # A fresh interpreter in the repo root imports the package as users do.
    code = (
        "import sinks; "
        "from sinks import Sink, SinkContext, OutputMode, SinkError, SinkConfigError, "
        "MemorySink, memory_table, ConsoleSink, ForeachBatchSink, ParquetSink, "
        "read_parquet_output; "
        "assert sinks.__doc__; "
        "assert all(hasattr(sinks, n) for n in sinks.__all__); "
        "import sys; assert 'microbatch' not in sys.modules, 'sinks imported the engine'"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
