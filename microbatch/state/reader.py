"""``read_state``: an operator's state at a committed batch, read offline.

Reads only files: the checkpoint's commit log, the operator's ``operator.json``
and recorded schemas (:mod:`microbatch.state.layout`) and its store versions
(``StateStoreProvider(read_only=True).read_version``). It takes no lock and
writes or deletes nothing, so it is safe beside a running job.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from microbatch.checkpoint import Checkpoint
from microbatch.exceptions import StateReadError
from microbatch.plan.event_time import ms_to_time
from microbatch.state.layout import OperatorLayout, StoreLayout, operator_layout

__all__ = ["StateCatalog", "batch_ranges", "read_state", "store_rows"]

STORE = "store"
"""The output column naming the store a row comes from (operators with several)."""
SHARD = "shard"
"""The output column naming the shard a row comes from (Ray-sharded checkpoints)."""

_UTC_MS = pl.Datetime("ms", "UTC")
# The engine's own columns, as the reader shows them: new name, and whether the
# value is epoch milliseconds (shown as a UTC datetime).
_DECODED: dict[str, tuple[str, bool]] = {
    "__expire_at": ("expire_at", True),
    "__expires": ("expire_at", True),
    "__exp": ("expire_at", True),
    "__maxexp": ("max_expire_at", True),
    "__max_end": ("max_end", True),
    "__fire_at": ("fire_at", True),
    "__t": ("event_time", True),
    "__last_event": ("last_event", True),
    "__vf": ("valid_from", True),
    "__rev": ("revision", False),
    "__fire": ("fired", False),
    "__slot": ("slot", False),
    "__n": ("slots", False),
    "__lo": ("slot_lo", False),
    "__hi": ("slot_hi", False),
    "__seq": ("arrival", False),
    "__matched": ("matched", False),
    "__rid": ("row_id", False),
    "__gone": ("deleted", False),
    "__next": ("valid_to_ms", False),
}


@dataclass(frozen=True)
class StateCatalog:
    """What a checkpoint holds: its committed batches and stateful operators
    (per operator, one layout per shard directory; ``shards`` is empty when the
    checkpoint is not sharded)."""

    root: Path
    committed: list[int]
    operators: dict[str, list[tuple[int | None, OperatorLayout]]]

    @classmethod
    def open(cls, checkpoint: str | os.PathLike[str]) -> StateCatalog:
        """Read the catalog of ``checkpoint`` (StateReadError when it is none)."""
        chk = Checkpoint(checkpoint)
        if not chk.exists():
            raise StateReadError(
                f"{chk.root} is not a microbatch checkpoint (no metadata file); pass the "
                "--checkpoint directory of a job that ran"
            )
        state = chk.root / "state"
        found: dict[str, list[tuple[int | None, OperatorLayout]]] = {}
        shard_root = state / "shards"
        dirs: list[tuple[int | None, Path]] = []
        if shard_root.is_dir():
            for shard in sorted(shard_root.iterdir()):
                if shard.is_dir() and shard.name.isdigit():
                    dirs += [(int(shard.name), d) for d in sorted(shard.iterdir())]
        if state.is_dir():
            dirs += [(None, d) for d in sorted(state.iterdir()) if d.name != "shards"]
        for shard_id, d in dirs:
            if (d / "operator.json").exists():
                found.setdefault(d.name, []).append((shard_id, operator_layout(d)))
        return cls(chk.root, chk.commits.batch_ids(), found)

    def kinds(self) -> dict[str, str]:
        """Operator id -> kind."""
        return {op: layouts[0][1].kind for op, layouts in self.operators.items()}

    def choose(self, operator: str | None) -> str:
        """``operator``, or the only stateful operator; StateReadError listing the ids."""
        listed = ", ".join(f"{k} ({v})" for k, v in self.kinds().items()) or "none"
        if operator is None:
            if len(self.operators) == 1:
                return next(iter(self.operators))
            raise StateReadError(
                f"checkpoint {self.root} has {len(self.operators)} stateful operators ({listed}); "
                "say which one with operator=... (--operator ID)"
                if self.operators else
                f"checkpoint {self.root} holds no operator state: the job has no stateful "
                "operator, or none ran a batch yet"
            )
        if operator not in self.operators:
            raise StateReadError(
                f"checkpoint {self.root} has no state for operator {operator!r}; its stateful "
                f"operators are: {listed}"
            )
        return operator

    def readable_batches(self, operator: str) -> list[int]:
        """The committed batches whose state of ``operator`` can be rebuilt now."""
        ok = set(self.committed)
        for _, layout in self.operators[operator]:
            for store in layout.stores:
                versions = set(store.provider().committed_versions())
                ok = {b for b in ok if store.version(b) <= 0 or store.version(b) in versions}
        return sorted(ok)

    def batch(self, operator: str, batch: int | None) -> int:
        """``batch``, or the last committed one, checked readable."""
        if not self.committed:
            raise StateReadError(
                f"checkpoint {self.root} has no committed batch yet: there is no state to read"
            )
        chosen = self.committed[-1] if batch is None else batch
        readable = self.readable_batches(operator)
        if chosen not in readable:
            why = ("is not committed" if chosen not in self.committed
                   else "is older than the state's retention (its files were purged)")
            raise StateReadError(
                f"batch {chosen} of checkpoint {self.root} {why}; the state of {operator} can be "
                f"read at batches {batch_ranges(readable) or 'none'}"
            )
        return chosen

    def frame(self, operator: str, batch: int, *, decode: bool = True) -> pl.DataFrame:
        """The state of ``operator`` after ``batch`` (see :func:`read_state`)."""
        layouts = self.operators[operator]
        sharded = layouts[0][0] is not None
        frames = []
        for shard, layout in layouts:
            several = len(layout.stores) > 1
            for store in layout.stores:
                rows = store_rows(store, batch)
                if decode:
                    rows = _decode(rows, store, layout)
                front = []
                if several:
                    front.append(pl.lit(store.name).alias(STORE))
                if sharded:
                    front.append(pl.lit(shard, pl.Int32).alias(SHARD))
                frames.append(rows.select(*front, pl.all()) if front else rows)
        if not frames:
            return pl.DataFrame()
        return pl.concat(frames, how="diagonal_relaxed")


def store_rows(store: StoreLayout, batch: int) -> pl.DataFrame:
    """The raw rows of ``store`` after committed ``batch`` (empty before its input existed)."""
    version = store.version(batch)
    if version <= 0:
        return pl.DataFrame(schema={**store.keys, **store.values})
    return store.provider().read_version(version)


def read_state(
    checkpoint: str | os.PathLike[str],
    operator: str | None = None,
    batch: int | None = None,
) -> pl.DataFrame:
    """An operator's state after a committed batch, as one DataFrame, read offline.

    Needs only the checkpoint's files (not the job's code), takes no lock and
    changes nothing: safe beside a running job.

    Parameters
    ----------
    checkpoint
        The job's checkpoint directory.
    operator
        An operator id (``agg-0``, ``transform-1``...: ``microbatch state CHECKPOINT``
        lists them); ``None`` when the job has one stateful operator.
    batch
        A committed batch id: the state after it. ``None``: the last committed
        batch. A batch that is not committed, or whose state files were
        purged (older than the retention), is refused naming the readable ones.

    Returns
    -------
    polars.DataFrame
        One row per state row: the operator's keys and state columns. When
        the operator keeps several stores (timers, waiting rows, a join's
        sides, a session index) a first column ``store`` names the store of
        each row (``"state"``, ``"event_timers"``, ``"processing_timers"``,
        ``"pending"``, ``"sessions"``, ``"index"``, ``"left/rows"``...), the
        frame holding the union of their columns (null where a store lacks
        one); a Ray-sharded checkpoint adds ``shard``. The engine's own columns
        are shown decoded: a window's ``__ws`` as ``window_start`` and
        ``window_end`` (the output's type), partial aggregates ``__p_NAME`` as
        ``NAME`` (``NAME_sum``/``NAME_cnt`` for a mean, ``NAME_t``/``NAME_v``
        for first/last), epoch-millisecond times as UTC datetimes
        (``expire_at``, ``fire_at``, ``event_time``...), and the rest renamed
        without the ``__`` (``revision``, ``slot``, ``arrival``...). Append-mode
        windows without allowed lateness keep one partial row per window, key
        and batch (combine them to get the window's value so far).

    Raises
    ------
    StateReadError
        No such checkpoint, operator or committed batch, or a purged version.

    Examples
    --------
    >>> import tempfile
    >>> import polars as pl
    >>> import microbatch as mb
    >>> from microbatch.testing import StreamTest
    >>> chk = tempfile.mkdtemp()
    >>> t = StreamTest(lambda s: s.group_by("k").agg(pl.len().alias("n")),
    ...                schema={"k": pl.Int64}, output_mode="update", checkpoint=chk)
    >>> _ = t.add({"k": [1, 1, 2]}).process()
    >>> _ = t.add({"k": [2]}).process()
    >>> t.close()
    >>> mb.read_state(chk).sort("k").rows()  # after the last committed batch
    [(1, 2), (2, 2)]
    >>> mb.read_state(chk, batch=0).sort("k").rows()
    [(1, 2), (2, 1)]
    """
    catalog = StateCatalog.open(checkpoint)
    op = catalog.choose(operator)
    return catalog.frame(op, catalog.batch(op, batch))


def _decode(rows: pl.DataFrame, store: StoreLayout, layout: OperatorLayout) -> pl.DataFrame:
    exprs: list[pl.Expr] = []
    taken = set(rows.columns)
    window = layout.signature.get("window")
    out_time = store.out_time or _UTC_MS
    for name in rows.columns:
        if name == "__ws" and isinstance(window, dict) and "size_ms" in window:
            key, size = pl.col(name), int(window["size_ms"])
            # NOTE: a cumulating window's key is its end (its start is shared)
            start, end = (((key - 1) // size) * size, key) \
                if window.get("kind") == "cumulate_window" else (key, key + size)
            exprs += [ms_to_time(start, out_time).alias("window_start"),
                      ms_to_time(end, out_time).alias("window_end")]
        elif name == "__ws":  # fire_once: the window id it fired for, as epoch ms
            label = str(layout.signature.get("window_id", "window_start"))
            exprs.append(ms_to_time(pl.col(name), out_time).alias(_free(label, name, taken)))
        elif name in ("__s", "__e") and layout.kind == "session_aggregate":
            exprs.append(ms_to_time(pl.col(name), out_time).alias(
                "window_start" if name == "__s" else "window_end"))
        elif name.startswith("__p_"):
            exprs.append(pl.col(name).alias(_free(name[4:], name, taken)))
        elif name in _DECODED:
            new, is_time = _DECODED[name]
            col = pl.col(name)
            exprs.append((col.cast(pl.Int64).cast(pl.Datetime("ms")).dt.replace_time_zone("UTC")
                          if is_time else col).alias(_free(new, name, taken)))
        else:
            exprs.append(pl.col(name))
    return rows.select(exprs)


def _free(new: str, old: str, taken: set[str]) -> str:
    """``new`` unless a column of that name exists (then the engine's ``old`` name)."""
    if new in taken:
        return old
    taken.add(new)
    return new


def batch_ranges(ids: list[int]) -> str:
    """Batch ids as people read them: ``[0, 1, 2, 5]`` as ``0..2, 5``."""
    out: list[str] = []
    start = prev = None
    for i in [*ids, None]:
        if start is not None and (i is None or i != prev + 1):  # type: ignore[operator]
            out.append(str(start) if start == prev else f"{start}..{prev}")
            start = None
        if i is not None and start is None:
            start = i
        prev = i
    return ", ".join(out)
