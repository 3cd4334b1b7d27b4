"""The docstring Examples of the user API run as doctests (as py-polars does).

Every module below has its examples run with ``pl`` (polars) and ``mb``
(microbatch) already imported; the test of a module fails with doctest's
report of each failing example. The examples run offline: memory, file,
generator and local Delta inputs, ``trigger="available-now"``; Kafka examples
only build streams and writers (nothing connects until a query starts).

A second test keeps the public API documented: each name in ``DOCUMENTED``
must have an ``Examples`` section with at least one ``>>>`` example.
"""

from __future__ import annotations

import doctest
import importlib
import inspect
import io
import re
from typing import Any

import polars as pl
import pytest

import microbatch as mb

MODULES = [
    "microbatch",
    "microbatch.api.readers",
    "microbatch.api.stream",
    "microbatch.api.writer",
    "microbatch.api.query",
    "microbatch.plan.windows",
    "microbatch.sql.context",
    "microbatch.sql.dialect",
    "microbatch.sql.parse",
    "microbatch.sql.script",
    "microbatch.state.reader",
    "microbatch.testing",
    "sinks.memory",
]

OPTIONFLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE

DOCUMENTED = [
    # readers
    "microbatch.api.readers.read_memory",
    "microbatch.api.readers.read_files",
    "microbatch.api.readers.read_kafka",
    "microbatch.api.readers.read_delta",
    "microbatch.api.readers.read_iceberg",
    "microbatch.api.readers.generate",
    "microbatch.api.readers.table",
    "microbatch.api.readers.parquet_table",
    "microbatch.state.reader.read_state",
    # windows
    "microbatch.plan.windows.window",
    "microbatch.plan.windows.session_window",
    # stream: event time, aggregation, dedupe
    "microbatch.api.stream.Stream.with_watermark",
    "microbatch.api.stream.Stream.group_by",
    "microbatch.api.stream.GroupedStream.agg",
    "microbatch.api.stream.Stream.drop_duplicates",
    "microbatch.api.stream.Stream.fire_once",
    # stream: arbitrary stateful processing
    "microbatch.api.stream.GroupedStream.transform_with_state",
    "microbatch.api.stream.GroupedStream.map_groups_with_state",
    # stream: joins
    "microbatch.api.stream.Stream.join_interval",
    "microbatch.api.stream.Stream.join_window",
    "microbatch.api.stream.Stream.join",
    "microbatch.api.stream.Stream.join_static",
    "microbatch.api.stream.Stream.join_asof_table",
    # stream: side outputs
    "microbatch.api.stream.Stream.on_late",
    "microbatch.api.stream.Stream.on_dead_letters",
    # stream: stateless steps
    "microbatch.api.stream.Stream.select",
    "microbatch.api.stream.Stream.with_columns",
    "microbatch.api.stream.Stream.filter",
    "microbatch.api.stream.Stream.map_batches",
    # stream: writers
    "microbatch.api.stream.Stream.write_memory",
    "microbatch.api.stream.Stream.write_parquet",
    "microbatch.api.stream.Stream.write_delta",
    "microbatch.api.stream.Stream.write_webhook",
    "microbatch.api.stream.Stream.write_kafka",
    "microbatch.api.stream.Stream.write_console",
    "microbatch.api.stream.Stream.foreach_batch",
    "microbatch.api.stream.Stream.write_to",
    # writer and query
    "microbatch.api.writer.DataStreamWriter.start",
    "microbatch.api.query.StreamingQuery",
    "microbatch.api.query.StreamingQuery.await_termination",
    "microbatch.api.query.StreamingQuery.process_all_available",
    "microbatch.api.query.StreamingQuery.stop",
    "microbatch.api.query.StreamingQuery.last_progress",
    "microbatch.api.query.StreamingQuery.recent_progress",
    "microbatch.api.query.StreamingQuery.explain",
    "microbatch.api.query.StreamingQuery.status",
    # SQL
    "microbatch.sql.context.sql",
    "microbatch.sql.context.SQLContext",
]

_KAFKA_CALL = r"\b(?:write_kafka|KafkaSink)\(.*"
DEPRECATED = {
    "mb.read_parquet_output": re.compile(r"\bread_parquet_output\b"),
    "DataStreamWriter.dead_letters_to": re.compile(r"\bdead_letters_to\b"),
    # only in Kafka sink calls: polars' own write_delta(mode=...) is fine
    "write_kafka(value_format=...)": re.compile(_KAFKA_CALL + r"\bvalue_format\s*=", re.S),
    "write_kafka(mode=...)": re.compile(_KAFKA_CALL + r"\bmode\s*=", re.S),  # not output_mode=
}
"""Deprecated names that the examples must not teach."""

_EXAMPLES = re.compile(r"^Examples\n-{8,}\n(?P<body>.*?)(?=^\S[^\n]*\n-{3,}\n|\Z)", re.M | re.S)


def _doctests(module_name: str) -> list[doctest.DocTest]:
    module = importlib.import_module(module_name)
    finder = doctest.DocTestFinder()
    return finder.find(module, module_name, extraglobs={"pl": pl, "mb": mb})


def _resolve(qualname: str) -> Any:
    """The object named ``package.module.Name[.attr]`` (a property stays a property)."""
    parts = qualname.split(".")
    for split in range(len(parts) - 1, 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:split]))
        except ModuleNotFoundError:
            continue
        for attr in parts[split:]:
            obj = inspect.getattr_static(obj, attr)
        return obj
    raise LookupError(qualname)


@pytest.mark.parametrize("module_name", MODULES)
def test_docstring_examples(module_name: str) -> None:
    runner = doctest.DocTestRunner(optionflags=OPTIONFLAGS)
    report = io.StringIO()
    for test in _doctests(module_name):
        runner.run(test, out=report.write)
    result = runner.summarize(verbose=False)
    assert result.attempted, f"{module_name} has no docstring examples"
    assert not result.failed, (
        f"{result.failed} of {result.attempted} docstring examples of {module_name} "
        f"failed:\n{report.getvalue()}"
    )


@pytest.mark.parametrize("qualname", DOCUMENTED)
def test_public_api_has_examples(qualname: str) -> None:
    obj = _resolve(qualname)
    if isinstance(obj, staticmethod | classmethod):
        obj = obj.__func__
    doc = inspect.cleandoc(obj.__doc__ or "")
    match = _EXAMPLES.search(doc)
    assert match, f"{qualname}: the docstring has no 'Examples' section"
    assert ">>> " in match["body"], f"{qualname}: the 'Examples' section has no >>> example"


@pytest.mark.parametrize("module_name", MODULES)
def test_examples_avoid_deprecated_names(module_name: str) -> None:
    found = [
        f"{test.name} (line {example.lineno + 1 + (test.lineno or 0)}): {what}"
        for test in _doctests(module_name)
        for example in test.examples
        for what, pattern in DEPRECATED.items()
        if pattern.search(example.source)
    ]
    assert not found, "examples use deprecated names:\n" + "\n".join(found)
