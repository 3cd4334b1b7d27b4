"""How a scaled-out query splits a batch's rows and its state into shards.

The plan's *frontier* is its stateful nodes that have only stateless steps
(and watermark nodes) below them: their input rows are what workers compute
from the sources and exchange. Every row entering the frontier goes to one of
``S`` shards, by a hash of the *shard key*: the columns that every keyed
stateful node of the plan groups by (the intersection of their keys, so that
each shard holds every row any of its operators needs for a key). Shard
``s`` keeps its own copy of every operator's state under
``state/shards/<s>/``; rows of a key reach their shard in the order they had
in the batch, so a shard computes what a single process computes for its keys.

- keys in common: hash partitioning (the scaled-out case);
- keyed operators without a key in common (a dedupe on ``event_id`` feeding a
  window by ``card``, a window without keys): every row goes to shard 0 (the
  query runs on one worker, correctly; a warning says so);
- only row-local stateful steps (a stream-static join): rows are spread by
  their position in the batch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import polars as pl

from microbatch._deprecation import REMOVED_IN, issue_deprecation_warning, moved_names
from microbatch.checkpoint.files import make_dirs, read_json, write_json_atomic
from microbatch.engine.batch_executor import SHARD_FILE
from microbatch.exceptions import IncompatibleCheckpointError
from microbatch.plan.nodes import PlanNode, StatefulNode

HASH_SEED = 0x6D62
_PROBE = pl.DataFrame({"k": [0, 1, -7, 2**40], "s": ["a", "", "card-17", None]})

Mode = Literal["hash", "single", "spread"]


def frontier(plan: PlanNode) -> list[tuple[int, int]]:
    """(position in ``plan.walk()``, input side) of every stateful node whose
    inputs hold no stateful node: where rows are exchanged between workers."""
    out = []
    for pos, node in enumerate(plan.walk()):
        if not isinstance(node, StatefulNode):
            continue
        for side, child in enumerate(node.children):
            if not any(isinstance(n, StatefulNode) for n in child.walk()):
                out.append((pos, side))
    return out


@dataclass(frozen=True)
class ShardLayout:
    """How rows reach shards: ``mode``, the shard key and the shard count."""

    shards: int
    mode: Mode
    columns: tuple[str, ...]

    @classmethod
    def for_plan(cls, plan: PlanNode, shards: int) -> ShardLayout:
        keyed = [k for k in (node.shard_keys() for node in plan.walk()) if k is not None]
        if not keyed:
            return cls(shards, "spread", ())
        common = [c for c in keyed[0] if all(c in k for k in keyed[1:])]
        return cls(shards, "hash", tuple(common)) if common else cls(shards, "single", ())

    def shard_of(self, df: pl.DataFrame, first_row: int) -> pl.Series:
        """The shard of each row of ``df`` (whose first row is row ``first_row``
        of the batch's input)."""
        if self.mode == "hash":
            hashed = df.select(pl.struct(list(self.columns)).hash(HASH_SEED) % self.shards)
            return hashed.to_series().cast(pl.UInt32)
        if self.mode == "spread":
            return (pl.int_range(first_row, first_row + df.height, eager=True)
                    % self.shards).cast(pl.UInt32)
        return pl.zeros(df.height, pl.UInt32, eager=True)

    def split(self, df: pl.DataFrame, first_row: int) -> list[pl.DataFrame]:
        """``df`` cut into one frame per shard, each in ``df``'s row order."""
        if self.shards == 1 or self.mode == "single":
            return [df] + [df.head(0)] * (self.shards - 1)
        tagged = df.with_columns(self.shard_of(df, first_row).alias("__mb_shard"))
        parts = tagged.partition_by("__mb_shard", as_dict=True, maintain_order=True,
                                    include_key=False)
        empty = df.head(0)
        return [parts.get((s,), empty) for s in range(self.shards)]

    def describe(self) -> dict[str, Any]:
        return {
            "shards": self.shards,
            "mode": self.mode,
            "columns": list(self.columns),
            "hash_probe": hash_probe(),
            "polars": pl.__version__,
        }


def hash_probe() -> int:
    """The hash of fixed rows: it changes when Polars changes how it hashes keys."""
    return int(_PROBE.select(pl.struct("k", "s").hash(HASH_SEED).sum()).item())


def bind_layout(
    state_root: Path, layout: ShardLayout, *, has_batches: bool, explicit: bool
) -> ShardLayout:
    """Record the layout in ``state/shards.json`` on a new checkpoint, or check
    it against the recorded one (the shard count and key cannot change: each
    shard's state holds the keys that hash to it)."""
    path = state_root / SHARD_FILE
    want = layout.describe()
    if not path.exists():
        legacy = [p.name for p in state_root.iterdir()] if state_root.is_dir() else []
        if has_batches and legacy:
            raise IncompatibleCheckpointError(
                f"the checkpoint {state_root.parent} holds the state of a query that ran in one "
                f"process ({', '.join(sorted(legacy))} in {state_root}); its state is not split "
                "into shards, so the Ray executor cannot take it over. Run it without "
                "--workers/executor, or start the scaled-out job on a new checkpoint directory."
            )
        make_dirs(state_root)
        write_json_atomic(path, "shards", want)
        return layout
    have = read_json(path, "shards")
    if have.get("shards") != layout.shards:
        if explicit:
            raise IncompatibleCheckpointError(
                f"the state in {state_root} is split into {have.get('shards')} shards, fixed "
                f"for the life of the checkpoint; this run asks for {layout.shards}. Leave "
                "shards= out (the recorded count is used; any number of workers can own them), "
                "or start on a new checkpoint directory."
            )
        layout = ShardLayout(int(have["shards"]), layout.mode, layout.columns)
        want = layout.describe()
    changed = [k for k in ("mode", "columns", "hash_probe") if have.get(k) != want.get(k)]
    if changed:
        raise IncompatibleCheckpointError(
            f"the state in {state_root} was split into shards "
            f"{json.dumps({k: have.get(k) for k in changed})} and this run would split it "
            f"{json.dumps({k: want.get(k) for k in changed})} (Polars {have.get('polars')} then, "
            f"{pl.__version__} now). A key would look for its state in the wrong shard: run "
            "the job with the version of Polars and the plan that wrote the checkpoint, or "
            "start on a new checkpoint directory."
        )
    return layout


def node_keys(node: PlanNode) -> tuple[str, ...] | None:
    """Deprecated: ``node.shard_keys()`` (each node declares its own)."""
    issue_deprecation_warning(
        f"{__name__}.node_keys(node) is replaced by node.shard_keys(); the old name will be "
        f"removed in microbatch {REMOVED_IN}",
        version="0.2.0",
    )
    return node.shard_keys()

if not TYPE_CHECKING:  # mypy would take every missing name for a moved one
    __getattr__ = moved_names(
        __name__, {"STATEFUL_NODES": "microbatch.plan.nodes:StatefulNode"}, version="0.2.0"
    )
    """``STATEFUL_NODES`` is the class ``StatefulNode`` (``isinstance`` works alike)."""
