"""What runs a query: the trigger loop and the batch lifecycle
(:mod:`~microbatch.engine.execution`), the evaluation of the plan over a batch
(:mod:`~microbatch.engine.batch_executor`), watermarks, read-ahead and the named
fault points of the crash tests.
"""

from __future__ import annotations

__all__: list[str] = []
