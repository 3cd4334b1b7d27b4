"""Stream-static join: ``stream.join_static(other, on, how)``.

The static side is a ``pl.DataFrame``, Parquet file(s) or a Delta table.
Once per batch (never per row) the operator asks whether it changed — a
Delta table's version, the files' names, sizes and modification times — and
re-reads it only then. The join itself is one Polars ``join`` of the batch.

No state store: the only thing kept in the checkpoint is which Delta version
each batch used (``versions/<batch id>.json``, written before the batch's
rows reach the sink), so a batch re-run after a crash joins with the same
version even if the table moved on meanwhile. Parquet inputs cannot be read
as of an earlier time: a re-run uses the files as they are then.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import polars as pl

from microbatch.checkpoint.files import make_dirs, read_json, remove, write_json_atomic
from microbatch.exceptions import PlanError, SourceError
from microbatch.operators.base import OperatorContext, StatefulOperator, check_signature
from microbatch.operators.registry import builds
from microbatch.plan.joins import StaticJoinSpec, StaticTable
from microbatch.plan.nodes import StaticJoinNode
from microbatch.types import OutputMode

log = logging.getLogger("microbatch.plan.joins")

KEEP_RECORDS = 100
"""Batches whose Delta version stays recorded (a re-run is at most the last one)."""


class StaticTableReader:
    """The current contents of a static table, re-read only when it changed."""

    def __init__(self, table: StaticTable) -> None:
        self.table = table
        self.frame: pl.DataFrame | None = table.frame
        self.version: Any = None
        self.reads = 0
        self._delta: Any = None

    def current_version(self) -> Any:
        """A value that changes when the table does (cheap: metadata only)."""
        table = self.table
        if table.kind == "frame":
            return 0
        assert table.path is not None
        if table.kind == "delta":
            from deltalake import DeltaTable

            try:
                if self._delta is None:
                    self._delta = DeltaTable(table.path, storage_options=table.storage_options)
                else:
                    self._delta.update_incremental()
                return int(self._delta.version())
            except Exception as exc:
                raise SourceError(
                    f"join_static: cannot read Delta table {table.path}: {exc}"
                ) from exc
        return [[str(p), s.st_size, s.st_mtime_ns] for p, s in self._files()]

    def _files(self) -> list[tuple[Path, Any]]:
        assert self.table.path is not None
        root = Path(self.table.path)
        paths = [root] if root.is_file() else sorted(root.rglob("*.parquet"))
        if not paths:
            raise SourceError(f"join_static: no Parquet files under {root}")
        return [(p, p.stat()) for p in paths]

    def read(self, version: Any) -> pl.DataFrame:
        """The table at ``version`` (from :meth:`current_version`, or recorded)."""
        if self.frame is not None and version == self.version:
            return self.frame
        table = self.table
        if table.kind == "delta":
            try:
                frame = pl.read_delta(
                    table.path or "", version=version, storage_options=table.storage_options
                )
            except Exception as exc:
                raise SourceError(
                    f"join_static: cannot read version {version} of Delta table {table.path}: {exc}"
                ) from exc
        elif table.kind == "parquet":
            frame = pl.read_parquet([str(p) for p, _ in self._files()])
        else:
            assert table.frame is not None
            frame = table.frame
        self.frame, self.version = frame, version
        self.reads += 1
        return frame


class StaticJoin(StatefulOperator):
    """Each batch joined with the static table's current version."""

    def __init__(self, *, operator_id: str, spec: StaticJoinSpec) -> None:
        self.operator_id = operator_id
        self.spec = spec
        self.reader = StaticTableReader(spec.table)
        self.state_dir: Path | None = None

    def signature(self) -> dict[str, Any]:
        # NOTE: not the table's path or contents: the static side keeps no state, so
        # pointing the job at another table (or DataFrame) needs no new checkpoint
        return {"kind": "static_join", "on": list(self.spec.on), "how": self.spec.how}

    def open(self, state_dir: Path | None, batch_id: int) -> None:
        self.state_dir = state_dir
        if state_dir is not None:
            check_signature(state_dir, self.signature())

    def commit(self) -> None:
        if self.state_dir is None or self.spec.table.kind != "delta":
            return
        records = sorted(self.state_dir.glob("versions/*.json"), key=lambda p: int(p.stem))
        for path in records[:-KEEP_RECORDS]:
            remove(path)

    def abort(self) -> None:
        pass

    def _version_for(self, batch_id: int) -> Any:
        """The version batch ``batch_id`` uses: the recorded one on a re-run."""
        if self.state_dir is None or self.spec.table.kind != "delta":
            return self.reader.current_version()
        path = self.state_dir / "versions" / f"{batch_id}.json"
        if path.exists():
            return read_json(path, "static-version")["version"]
        version = self.reader.current_version()
        make_dirs(path.parent)
        write_json_atomic(path, "static-version", {"version": version})
        return version

    def process(self, df: pl.DataFrame, ctx: OperatorContext) -> pl.DataFrame:
        reads = self.reader.reads
        version = self._version_for(ctx.batch_id)
        table = self.reader.read(version)
        ctx.metrics[self.operator_id] = {
            "rows": 0,
            "static_rows": table.height,
            "static_version": version if self.spec.table.kind == "delta" else None,
            "static_reloaded": self.reader.reads > reads,
        }
        if df.width == 0:
            return df
        missing = [
            f"{k!r} ({side})"
            for k in self.spec.on
            for side, cols in (("stream", df.columns), ("static table", table.columns))
            if k not in cols
        ]
        if missing:
            raise PlanError(f"join_static: join column(s) {', '.join(missing)} missing")
        return df.join(
            table,
            on=list(self.spec.on),
            how=self.spec.how,
            suffix=self.spec.suffix,
            coalesce=True,
            maintain_order="left",
        )


@builds(StaticJoinNode)
def build_static_join(node: StaticJoinNode, operator_id: str, mode: OutputMode) -> StatefulOperator:
    """``join_static``: row-local, re-reads the table when it changes."""
    return StaticJoin(operator_id=operator_id, spec=node.spec)
