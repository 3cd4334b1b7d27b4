"""Published Nexmark figures of other engines, per core, with their source and setup.

Flink: the example result table of nexmark/nexmark's ``GUIDE_V1.md`` ("Benchmark
Results", read at commit 6b3646c): "Throughput/Cores", i.e. events per second
per core actually used (a CPU collector on each worker node; Cores = mean CPU
used). Setup there: 100M events from the in-process ``datagen`` source at 10M
events/s, 3 worker machines of 8 cores (8 TaskManagers of 1 slot, parallelism
8), RocksDB state with incremental checkpoints every 3 minutes, mini-batch
2 s / 50,000 rows, blackhole sink; Flink 1.13-2.0.
"""

from __future__ import annotations

FLINK_SOURCE = "https://github.com/nexmark/nexmark/blob/master/GUIDE_V1.md"
FLINK_PER_CORE: dict[str, float] = {
    "q0": 155_020, "q1": 157_940, "q2": 175_210, "q3": 152_120, "q4": 34_330,
    "q5": 22_140, "q7": 12_330, "q8": 146_140, "q11": 39_700, "q12": 75_670,
}
"""Events/s per core, from the guide's table (K/s x 1000)."""
