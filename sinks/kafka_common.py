"""What the Kafka source and sink share: client configuration and logging.

Secrets (SASL passwords, SSL keys, OAuth tokens) pass through ``config`` to
librdkafka untouched, and only :func:`redact` ever turns a configuration into
text: every ``describe()``, progress record and log line uses it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

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
