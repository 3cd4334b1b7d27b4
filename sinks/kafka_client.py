"""Kafka client helpers: the one home for what the Kafka source and sink share.

- :func:`client_config`: the configuration every client of ours starts from
  (the user's ``config``, the bootstrap servers, librdkafka's log lines on
  :data:`client_log`);
- :func:`check_config`: refuses user keys that microbatch sets itself;
- :func:`redact`: the only way a configuration becomes text;
- :func:`create_topics`: create topics (tolerating ones that exist when asked)
  and wait until the broker's metadata shows their partitions.

Secrets (SASL passwords, SSL keys, OAuth tokens) pass through ``config`` to
librdkafka untouched, and only :func:`redact` ever turns a configuration into
text: every ``describe()``, progress record and log line uses it.

It lives in ``sinks`` because ``microbatch`` may import ``sinks`` but not the
other way round: ``microbatch.sources.kafka`` imports it from here. Tests,
benchmarks and the soak create their topics with :func:`create_topics` too.
``confluent_kafka`` is imported only when a client is made.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "REDACTED",
    "SECRET_MARKERS",
    "check_config",
    "client_config",
    "client_log",
    "create_topics",
    "redact",
]

SECRET_MARKERS = ("password", "secret", "token", "key", "credential", "jaas", "sasl.oauthbearer")
"""A config key containing one of these (e.g. ``sasl.password``,
``ssl.key.pem``, ``ssl.keystore.password``) has its value hidden."""

REDACTED = "***"

client_log = logging.getLogger("microbatch.kafka.client")
"""librdkafka's own log lines (connection errors, retries) go here."""


def redact(config: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` with the values of secret-looking keys replaced by ``***``.

    Non-scalar values (callbacks such as ``oauth_cb``, loggers) are shown as
    their type name only.
    """
    out: dict[str, Any] = {}
    for key, value in sorted(config.items()):
        lowered = str(key).lower()
        if any(marker in lowered for marker in SECRET_MARKERS):
            out[key] = REDACTED
        elif isinstance(value, str | int | float | bool) or value is None:
            out[key] = value
        else:
            out[key] = f"<{type(value).__name__}>"
    return out


def check_config(config: Mapping[str, Any] | None, *, reserved: tuple[str, ...]) -> dict[str, Any]:
    """A copy of ``config``; refuses keys the caller sets itself (named in ``reserved``)."""
    cfg = dict(config or {})
    clash = sorted(k for k in cfg if k in reserved)
    if clash:
        raise ValueError(
            f"config sets {', '.join(clash)}, which microbatch sets itself; remove them "
            "(use the keyword arguments instead)"
        )
    return cfg


def client_config(config: Mapping[str, Any], bootstrap: str) -> dict[str, Any]:
    """``config`` with the bootstrap servers set and librdkafka logging to :data:`client_log`."""
    return {**config, "bootstrap.servers": bootstrap, "logger": client_log}


def create_topics(
    config: Mapping[str, Any] | str,
    topics: Sequence[str],
    *,
    partitions: int,
    replication_factor: int = -1,
    topic_config: Mapping[str, str] | None = None,
    exist_ok: bool = False,
    timeout_s: float = 30.0,
) -> None:
    """Create ``topics`` (``partitions`` each) and return once the broker's
    metadata shows each one with its partitions.

    ``config`` is a client configuration or just the bootstrap servers.
    ``replication_factor=-1`` takes the broker's default. With ``exist_ok`` a
    topic that exists already is kept as it is and not created (so a client
    without the right to create topics can "ensure" an existing one), and one
    created meanwhile by another client is fine; otherwise its
    ``KafkaException`` propagates, as do other admin errors. Raises
    ``TimeoutError`` when a topic's metadata does not show up within
    ``timeout_s``.
    """
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic

    base: dict[str, Any] = (
        {"bootstrap.servers": config} if isinstance(config, str) else dict(config)
    )
    admin = AdminClient(base)
    new = list(topics)
    if exist_ok:  # NOTE: all topics: asking for one by name may auto-create it
        listed = admin.list_topics(timeout=timeout_s).topics
        new = [name for name in new if name not in listed]
    futures = admin.create_topics(
        [NewTopic(name, num_partitions=partitions, replication_factor=replication_factor,
                  config=dict(topic_config or {})) for name in new],
        request_timeout=timeout_s,
    ) if new else {}
    created = set()
    for name, future in futures.items():
        try:
            future.result(timeout_s)
            created.add(name)
        except KafkaException as exc:
            if not (exist_ok and exc.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS):
                raise
    deadline = time.monotonic() + timeout_s
    for name in topics:
        while True:  # the metadata of a new topic propagates asynchronously
            meta = admin.list_topics(topic=name, timeout=timeout_s).topics.get(name)
            if meta is not None and meta.error is None and meta.partitions and (
                name not in created or len(meta.partitions) == partitions
            ):
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"the topic {name!r} did not appear within {timeout_s:g}s")
            time.sleep(0.05)
