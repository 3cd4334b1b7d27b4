"""Short runs of the crash soak's Kafka variants (``scripts/crash_soak.py``; the
1,000-kill soak is ``make soak``): a windowed aggregation over a real Kafka topic,
SIGKILLed inside its sink and around it, restarted on the same checkpoint, then
compared with the one-shot Polars result.

- Kafka -> Kafka (one transaction per batch): a ``read_committed`` consumer of
  the output topic sees every expected row once and nothing else, while the
  killed runs' open transactions left aborted records in the topic;
- Kafka -> webhook: every expected key was acknowledged, with its one body
  (never another: no 409 conflict), and the kill after the posts made the
  replay post them again (redeliveries the receiver deduplicated).
"""

from __future__ import annotations

import sys
import uuid
from pathlib import Path

import pytest
from kafka_helpers import Broker

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "reliability"))
from harness import DEAD_LETTER_POINT, JobSpec, soak

pytestmark = [pytest.mark.kafka, pytest.mark.crash, pytest.mark.slow]


def test_kafka_to_kafka_exactly_once_under_kills(kafka_broker: Broker, tmp_path: Path) -> None:
    spec = JobSpec(source="kafka", sink="kafka", files=16, cap=1_000,
                   bootstrap=kafka_broker.bootstrap, topic=f"soak-{uuid.uuid4().hex[:8]}")
    named = ["sink.after_data", "sink.after_commit", DEAD_LETTER_POINT]
    run = soak(spec, tmp_path, kills=len(named), seed=7, named=named, sigterms=0)

    verdict = run.verdict
    assert verdict is not None
    assert verdict.exact, f"{verdict}\nhistory: {run.history()}"
    assert verdict.rows_expected > 1_000
    assert run.kills >= len(named), run.history()
    assert verdict.aborted_rows, "the kill inside the transaction left no aborted records"
    assert verdict.dead_letters == 2 * spec.files  # the bad values, each exactly once


def test_kafka_to_webhook_every_key_once_under_kills(kafka_broker: Broker,
                                                       tmp_path: Path) -> None:
    spec = JobSpec(source="kafka", sink="webhook", files=16, cap=1_000, cards=20,
                   bootstrap=kafka_broker.bootstrap, topic=f"soak-{uuid.uuid4().hex[:8]}")
    named = ["sink.after_data", DEAD_LETTER_POINT, "after_sink"]
    run = soak(spec, tmp_path, kills=len(named), seed=9, named=named, sigterms=0)

    verdict = run.verdict
    assert verdict is not None
    assert verdict.exact, f"{verdict}\nhistory: {run.history()}"
    assert verdict.rows_expected > 150
    assert run.kills >= len(named), run.history()
    assert verdict.conflicts == 0
    assert verdict.redeliveries > 0, "the kill after the posts replayed nothing"
    assert verdict.deliveries == verdict.rows_out + verdict.redeliveries
