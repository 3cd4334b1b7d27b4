"""What a query tells about itself: the progress record of each batch, source
lag and end-to-end latency, ``microbatch status`` and its alarms, the HTML
report, Prometheus metrics and the notebook view.

Nothing here drives the engine: the engine pushes the facts of each batch to
:func:`~microbatch.observability.record.progress_record`, and the views read a
:class:`~microbatch.observability.snapshot.QuerySnapshot`, never a query's
private fields.
"""

from __future__ import annotations

__all__: list[str] = []
