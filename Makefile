# Two commands do all set-up on a fresh clone:
#   make demo   - the fraud-alert style demo on the embedded generator (no services)
#   make test   - the whole test suite (on two pytest-xdist workers)
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test lint bench bench-latency bench-sinks bench-kafka bench-kafka-latency bench-stateful bench-disk-state bench-scale-out bench-worker-writes bench-lakehouse bench-peers bench-nexmark soak crash-explore clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,ray,disk,iceberg]'
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then command -v chromium >/dev/null || (apt-get update -qq && apt-get install -y -qq chromium >/dev/null) || echo 'warning: could not install chromium (tests/observability renders the report with it)'; fi
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/microbatch demo

# The suite on TEST_WORKERS pytest-xdist workers (tests/conftest.py says which tests
# share one worker); TEST_WORKERS=0 runs it in this process.
# The suite starts hundreds of `microbatch` processes: with PYTHONDONTWRITEBYTECODE
# set (as on our CI machine) each one compiled the project's ~160 modules from
# source, 0.4 s of its 1.3 s start. So the sources are compiled once first, and
# the suite may write bytecode (a stale .pyc is never used: Python checks the source).
# mypy (30 s cold) runs beside pytest, on the CPU the suite leaves idle while it
# waits on brokers, Ray and killed processes; the target fails if either fails.
TEST_WORKERS ?= 2
test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m compileall -q -j 0 microbatch sinks statestore jobs examples tests benchmarks >/dev/null
	typed_log=$$(mktemp); $(BIN)/mypy >$$typed_log 2>&1 & typed_pid=$$!; \
	PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS); \
	tests=$$?; wait $$typed_pid; typed=$$?; cat $$typed_log; rm -f $$typed_log; \
	test $$tests -eq 0 -a $$typed -eq 0

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/python -m benchmarks

# The fraud job's detection latency through a real Kafka broker (starts its own).
bench-latency: $(STAMP)
	$(BIN)/python -m benchmarks.fraud_latency $(ARGS)

# The demo's sink step per batch and per sink (webhook, Delta MERGE); ARGS="--baseline REV"
# compares with the sinks of a git revision, interleaved (benchmarks/fraud_sinks.py).
bench-sinks: $(STAMP)
	$(BIN)/python -m benchmarks.fraud_sinks $(ARGS)
# The Kafka source against a raw confluent-kafka loop on the same topic, interleaved
# (benchmarks/bench_kafka.py; starts its own broker).
bench-kafka: $(STAMP)
	$(BIN)/python -m benchmarks.bench_kafka $(ARGS)

# End-to-end latency broker -> Delta/Kafka sink at 50k ev/s, trigger 1s and back to back
# (benchmarks/kafka_latency.py; starts its own broker).
bench-kafka-latency: $(STAMP)
	$(BIN)/python -m benchmarks.kafka_latency $(ARGS)

# transform_with_state at 10k and 10M live keys against group_by (benchmarks/bench_stateful.py).
bench-stateful: $(STAMP)
	$(BIN)/python -m benchmarks.bench_stateful $(ARGS)

# The on-disk (LMDB) state backend against the in-memory store at 10M keys, and a
# run toward 100M keys with the process's RSS (benchmarks/bench_disk_state.py;
# ARGS="--keys 1000000 --grow-to 10000000 --time-limit 300" for a quick one).
bench-disk-state: $(STAMP)
	$(BIN)/python -m benchmarks.bench_disk_state $(ARGS)

# Delta against Iceberg: the sinks' cost per batch and the sources' streaming read, each
# against the format's one-shot write/read (benchmarks/bench_lakehouse.py; ARGS="--quick").
bench-lakehouse: $(STAMP)
	$(BIN)/python -m benchmarks.bench_lakehouse $(ARGS)

# The Ray executor's cost per batch against one process, and the scaling model
# (benchmarks/bench_scale_out.py): Q1 from Parquet files into Delta, read and written
# by the workers; starts a local Ray cluster (ARGS="--nodes 2": a two-node cluster on
# this machine; "--source memory": the in-memory pipeline; "--source files": who reads).
bench-scale-out: $(STAMP)
	$(BIN)/python -m benchmarks.bench_scale_out $(ARGS)

# The driver's time per batch when Ray workers write the Delta sink's files
bench-worker-writes: $(STAMP)
	$(BIN)/python -m benchmarks.bench_worker_writes $(ARGS)

# This engine vs Spark Structured Streaming, Bytewax and Quix Streams on the same data
# (benchmarks/compare.py). The peers live in their own venv: quixstreams pins an older
# confluent-kafka than the dev venv's. ARGS=--quick for the 1M-event smoke run.
BENCH_VENV ?= benchmarks/.venv-peers
bench-peers:
	test -x $(BENCH_VENV)/bin/python || $(PYTHON) -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(BENCH_VENV)/bin/python -m pip install --quiet -e '.[bench]' || true
	$(BENCH_VENV)/bin/python -m benchmarks.compare --install $(ARGS)

# Nexmark q0-q12 (benchmarks/nexmark/): this engine (Python API and SQL), Spark Structured
# Streaming (from the peers venv, made as bench-peers makes it) and one-shot Polars, every
# output checked; ARGS="--events N --queries q1,q5 --engines microbatch,polars".
bench-nexmark: $(STAMP)
	test -x $(BENCH_VENV)/bin/python || $(PYTHON) -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/python -m pip install --quiet -e '.[bench]' || true
	$(BIN)/python -m benchmarks.nexmark --peers-python $(BENCH_VENV)/bin/python $(ARGS)

# The crash soak, not part of make test (scripts/crash_soak.py): 1,000 SIGKILLs at every
# named lifecycle point and at random moments across file -> Delta, Kafka -> Kafka (exactly
# once), Kafka -> webhook and three more variants, each output checked against a one-shot
# Polars result; starts its own Kafka broker; writes the figures into docs/reliability.md.
# Three variants at a time; about 40 minutes on 2 cores. ARGS=--keep keeps the working directory.
soak: $(STAMP)
	$(BIN)/python scripts/crash_soak.py --kills 1000 --seed 1 --jobs 3 --write-docs docs/reliability.md $(ARGS)

# Power-loss crash states (scripts/crash_explore.py, tests/crash/explorer.py): every state a
# power loss may leave during two batches of each path, recovered and checked; not part of
# make test (which recovers a sample). Writes the figures into docs/reliability.md.
crash-explore: $(STAMP)
	$(BIN)/python scripts/crash_explore.py --write-docs docs/reliability.md $(ARGS)

clean:
	rm -rf $(VENV) demo-output .pytest_cache .ruff_cache
