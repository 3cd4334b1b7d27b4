"""AppendBuffer against a plain-list model, on real files: every committed
version, rebuilt from disk (snapshots and changelogs alike), holds exactly the
model's rows in the model's order; staged operations vanish on abort."""

from __future__ import annotations

from pathlib import Path

import hypothesis.strategies as st
import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings

from statestore import AppendBuffer, StateStoreError, StateStoreProvider

SCHEMA = {"k": pl.Int64(), "v": pl.Float64(), "t": pl.Int64()}


def provider(directory: Path, **kwargs: object) -> StateStoreProvider:
    return StateStoreProvider(
        directory, {"k": pl.Int64()}, {"v": pl.Float64(), "t": pl.Int64()},
        time_column="t", layout="append", **kwargs,  # type: ignore[arg-type]
    )


def frame(rows: list[tuple[int, float, int | None]]) -> pl.DataFrame:
    return pl.DataFrame(rows, schema=SCHEMA, orient="row")


def rows_of(buffer: AppendBuffer) -> list[tuple[int, float, int | None]]:
    return [tuple(r) for r in buffer.to_frame().iter_rows()]  # type: ignore[misc]


row = st.tuples(st.integers(0, 5), st.floats(-1e6, 1e6, allow_nan=False),
                st.one_of(st.none(), st.integers(0, 100)))
op = st.one_of(
    st.tuples(st.just("append"), st.lists(row, max_size=6)),
    st.tuples(st.just("pop"), st.integers(-1, 110)),
    st.tuples(st.just("replace"), st.lists(row, max_size=4)),
)


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(versions=st.lists(st.lists(op, max_size=4), min_size=1, max_size=12),
       snapshot_every=st.integers(1, 5))
def test_every_version_rebuilds_to_the_model(
    tmp_path_factory: pytest.TempPathFactory, versions: list, snapshot_every: int
) -> None:
    directory = tmp_path_factory.mktemp("buffer")
    keeper = provider(directory, max_changelog_chain=snapshot_every)
    model: list[tuple[int, float, int | None]] = []
    history = [list(model)]
    buffer = keeper.load_buffer(0)
    for ops in versions:
        for name, arg in ops:
            if name == "append":
                buffer.append(frame(arg))
                model += arg
            elif name == "pop":
                popped = [tuple(r) for r in buffer.pop_expired(arg).iter_rows()]
                assert popped == [r for r in model if r[2] is not None and r[2] <= arg]
                model = [r for r in model if r[2] is None or r[2] > arg]
            else:
                buffer.replace(frame(arg))
                model = list(arg)
            assert rows_of(buffer) == model
        buffer.commit()
        history.append(list(model))
    # a fresh provider (a restart) rebuilds every version from the files
    for version in range(len(history) - 1, -1, -1):
        rebuilt = provider(directory, max_changelog_chain=snapshot_every).load_buffer(version)
        assert rows_of(rebuilt) == history[version], version


def test_abort_discards_staged_operations(tmp_path: Path) -> None:
    keeper = provider(tmp_path)
    buffer = keeper.load_buffer(0)
    buffer.append(frame([(1, 1.0, 10), (2, 2.0, 20)]))
    assert buffer.commit() == 1
    buffer.pop_expired(15)
    buffer.append(frame([(3, 3.0, 30)]))
    buffer.abort()
    with pytest.raises(StateStoreError, match="aborted"):
        buffer.num_rows  # noqa: B018
    again = keeper.load_buffer(1)
    assert rows_of(again) == [(1, 1.0, 10), (2, 2.0, 20)]


def test_layouts_are_not_interchangeable(tmp_path: Path) -> None:
    with pytest.raises(StateStoreError, match="load_buffer"):
        provider(tmp_path).load(0)
    keyed = StateStoreProvider(tmp_path / "k", {"k": pl.Int64()}, {"v": pl.Float64()})
    with pytest.raises(StateStoreError, match="load\\(\\)"):
        keyed.load_buffer(0)
    with pytest.raises(StateStoreError, match="time_column"):
        StateStoreProvider(tmp_path / "a", {"k": pl.Int64()}, {"v": pl.Float64()},
                           layout="append")
