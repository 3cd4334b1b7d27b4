"""What a query *is*: the logical plan and the small frozen specs it is built
from (windows, aggregations, joins, triggers, durations).

Nothing here runs a batch: the engine (:mod:`microbatch.engine`) and the
operators (:mod:`microbatch.operators`) build what runs from these specs. A
spec's serialized form goes into the checkpoint, so an incompatible change to
a job is detected on restart.
"""

from __future__ import annotations

__all__: list[str] = []
