"""Sources: replayable logs that know their offsets and return any recorded
range again (Kafka, files, Delta versions, memory, the generator)."""

from __future__ import annotations

__all__: list[str] = []
