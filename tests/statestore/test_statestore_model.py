"""Model-based test: random operation sequences against a plain-Python dict.

Each machine drives a real store on real files through upserts, deletes,
pop_expired, evict, commits, aborts, reopenings by a new provider and
rewinds to older versions; after every step the store's whole content and a
lookup of every key ever seen (plus absent ones) must equal the model.
"""

from __future__ import annotations

import datetime as dt
import shutil
import tempfile
from pathlib import Path
from typing import Any, ClassVar

import polars as pl
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from statestore_model import Key, Model, Value

from statestore import StateStoreError, StateStoreProvider

T0 = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)
RETENTION = 4


class StoreMachine(RuleBasedStateMachine):
    """Shared rules; subclasses choose the schema, strategies and hash space."""

    KEYS: ClassVar[dict[str, pl.DataType]]
    VALUES: ClassVar[dict[str, pl.DataType]]
    TIME: ClassVar[str]
    HASH_BITS: ClassVar[int] = 64
    key_strategy: ClassVar[st.SearchStrategy[Key]]
    value_strategy: ClassVar[st.SearchStrategy[Value]]
    time_strategy: ClassVar[st.SearchStrategy[Any]]

    def __init__(self) -> None:
        super().__init__()
        self.directory = Path(tempfile.mkdtemp(prefix="statestore-model-"))
        self.model = Model(self.KEYS, self.VALUES)
        self.history: dict[int, dict[Key, Value]] = {0: {}}
        self.seen: set[Key] = set()
        self.floor = 0  # oldest version still guaranteed loadable (purges never undo)
        self.provider = self._provider()
        self.store = self.provider.load(0)

    def teardown(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)

    def _provider(self) -> StateStoreProvider:
        return StateStoreProvider(
            self.directory,
            self.KEYS,
            self.VALUES,
            time_column=self.TIME,
            retention_versions=RETENTION,
            max_changelog_chain=3,
            min_snapshot_bytes=4000,
            _hash_bits=self.HASH_BITS,
        )

    def _time_of(self, key: Key, value: Value) -> Any:
        names = [*self.KEYS, *self.VALUES]
        return (key + value)[names.index(self.TIME)]

    # ------------------------------------------------------------ mutations

    @rule(data=st.data())
    def upsert(self, data: st.DataObject) -> None:
        keys = data.draw(st.lists(self.key_strategy, max_size=8, unique=True))
        rows = [(k, data.draw(self.value_strategy)) for k in keys]
        self.store.upsert(self.model.row_frame(rows))
        self.model.rows.update(rows)
        self.seen.update(keys)

    @rule(data=st.data())
    def upsert_duplicate_keys_is_refused(self, data: st.DataObject) -> None:
        key = data.draw(self.key_strategy)
        rows = [(key, data.draw(self.value_strategy)), (key, data.draw(self.value_strategy))]
        with pytest.raises(StateStoreError, match="share their key"):
            self.store.upsert(self.model.row_frame(rows))

    @rule(data=st.data())
    def delete(self, data: st.DataObject) -> None:
        keys = data.draw(st.lists(self.key_strategy, max_size=8))  # duplicates and absent keys
        self.store.delete(self.model.key_frame(keys))
        for k in keys:
            self.model.rows.pop(k, None)

    @rule(data=st.data())
    def pop_expired(self, data: st.DataObject) -> None:
        t = data.draw(self.time_strategy)
        out = self.store.pop_expired(t)
        expired = {
            k: v
            for k, v in self.model.rows.items()
            if self._time_of(k, v) is not None and self._time_of(k, v) <= t
        }
        assert self.model.as_dict(out) == expired
        order = [
            tuple((x is not None, x if x is not None else 0) for x in (r[self.TIME], *keys))
            for r, keys in zip(
                out.iter_rows(named=True), out.select(list(self.KEYS)).rows(), strict=True
            )
        ]
        assert order == sorted(order)  # by time, then key; nulls first
        for k in expired:
            del self.model.rows[k]

    @rule(data=st.data())
    def evict(self, data: st.DataObject) -> None:
        name, dtype = data.draw(st.sampled_from(list(self.VALUES.items())))
        if dtype == pl.Boolean:
            predicate, keep = pl.col(name), (lambda x: x is True)
        elif dtype == pl.String:
            predicate, keep = pl.col(name).str.len_chars() > 1, (lambda x: len(x) > 1)
        else:
            predicate, keep = pl.col(name) > 0, (lambda x: x > 0)
        out = self.store.evict(predicate)
        index = list(self.VALUES).index(name)
        evicted = {
            k: v for k, v in self.model.rows.items() if v[index] is not None and keep(v[index])
        }
        assert self.model.as_dict(out) == evicted
        for k in evicted:
            del self.model.rows[k]

    # ------------------------------------------------------------ lifecycle

    @rule()
    def commit(self) -> None:
        version = self.store.commit()
        assert version == self.store.version
        self.history[version] = dict(self.model.rows)
        self.floor = max(self.floor, version - RETENTION + 1)
        assert self.provider.latest_version() == version

    @rule()
    def abort(self) -> None:
        self.store.abort()
        with pytest.raises(StateStoreError, match="aborted"):
            self.store.to_frame()
        self.store = self.provider.load(self.store.version)
        self.model.rows = dict(self.history[self.store.version])

    @rule()
    def reopen(self) -> None:
        """A new process: a new provider on the same directory loads the latest version."""
        self.provider = self._provider()
        latest = self.provider.latest_version()
        assert latest == max(self.history)
        self.store = self.provider.load(latest)
        self.model.rows = dict(self.history[latest])

    @precondition(lambda self: max(self.history) > self.floor)
    @rule(data=st.data())
    def rewind(self, data: st.DataObject) -> None:
        """Engine recovery: load an older retained version; newer ones are discarded."""
        latest = max(self.history)
        version = data.draw(st.integers(self.floor, latest))
        if data.draw(st.booleans()):
            self.provider = self._provider()
        self.store = self.provider.load(version)
        self.model.rows = dict(self.history[version])
        self.history = {v: rows for v, rows in self.history.items() if v <= version}
        assert self.provider.latest_version() == version

    @invariant()
    def matches_model(self) -> None:
        probes = sorted(self.seen, key=repr)[:40] + self.absent
        self.model.check(self.store, probes)

    absent: ClassVar[list[Key]] = []


_users = st.sampled_from(["a", "b", "", "é", "long-" * 10, "Ω"])
_minutes = st.integers(0, 4)


class WindowMachine(StoreMachine):
    """Nullable String + Datetime key (the time column), nullable Int64/Float64/String values."""

    KEYS: ClassVar = {"user": pl.String, "ts": pl.Datetime("ms", "UTC")}
    VALUES: ClassVar = {"n": pl.Int64, "x": pl.Float64, "tag": pl.String}
    TIME = "ts"
    key_strategy = st.tuples(
        st.none() | _users, st.none() | _minutes.map(lambda m: T0 + dt.timedelta(minutes=m))
    )
    value_strategy = st.tuples(
        st.none() | st.integers(-3, 3),
        st.none() | st.floats(-10, 10, allow_nan=False),
        st.none() | st.sampled_from(["", "x", "yy"]),
    )
    time_strategy = st.integers(-1, 5).map(lambda m: T0 + dt.timedelta(minutes=m))
    absent: ClassVar = [("zz", T0), ("a", T0 + dt.timedelta(days=1))]


class SessionMachine(StoreMachine):
    """Two integer key columns (one nullable); the time column is a nullable value that moves."""

    KEYS: ClassVar = {"id": pl.Int32, "part": pl.Int8}
    VALUES: ClassVar = {"expires": pl.Int64, "label": pl.String, "flag": pl.Boolean}
    TIME = "expires"
    key_strategy = st.tuples(st.none() | st.integers(0, 6), st.integers(-1, 1))
    value_strategy = st.tuples(
        st.none() | st.integers(0, 10),
        st.none() | st.sampled_from(["s", "tt", ""]),
        st.none() | st.booleans(),
    )
    time_strategy = st.integers(-1, 11)
    absent: ClassVar = [(99, 0), (0, 99)]


class CollidingWindowMachine(WindowMachine):
    """Every key hashes to one of two values: lookups must compare the real keys."""

    HASH_BITS = 1


class CollidingSessionMachine(SessionMachine):
    """All keys share one hash value (a 0-bit hash space)."""

    HASH_BITS = 0


_settings = settings(
    max_examples=40,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)

TestWindowModel = WindowMachine.TestCase
TestSessionModel = SessionMachine.TestCase
TestCollidingWindowModel = CollidingWindowMachine.TestCase
TestCollidingSessionModel = CollidingSessionMachine.TestCase
TestWindowModel.settings = _settings
TestSessionModel.settings = _settings
TestCollidingWindowModel.settings = _settings
TestCollidingSessionModel.settings = _settings
