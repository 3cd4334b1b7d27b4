"""An operator's state outside a running job: read it, save it, start from it.

- :func:`read_state` (``mb.read_state``; ``microbatch state``): an operator's
  state at a committed batch as one DataFrame, from the checkpoint's files
  alone (no job code, no lock, nothing written);
- :func:`write_savepoint` (``microbatch savepoint``): every operator's state at
  the last committed batch, with its offsets, as Parquet + a manifest;
- :func:`restore_savepoint` (``microbatch run --from-savepoint``): a changed
  job's new checkpoint, continuing from a savepoint when its operators' state
  is compatible.

Where each operator keeps which store is :mod:`microbatch.state.layout`.
"""

from __future__ import annotations

from microbatch.state.reader import read_state

__all__ = ["read_state"]
