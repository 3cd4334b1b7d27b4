"""Names that moved out of ``sinks`` still import, with a ``DeprecationWarning``."""

from __future__ import annotations

import pytest

import statestore.durable


def test_sinks_durable_is_an_alias_of_the_one_durable_layer() -> None:
    with pytest.warns(DeprecationWarning, match=r"sinks\.durable\.write_atomic moved to "
                      r"statestore\.durable\.write_atomic") as record:
        from sinks.durable import write_atomic
    assert write_atomic is statestore.durable.write_atomic
    assert record[0].filename == __file__  # points at the importing line


def test_sinks_durable_knows_only_the_layers_names() -> None:
    import sinks.durable

    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        _ = sinks.durable.nothing_here
    with pytest.raises(AttributeError):
        _ = sinks.durable._recorders


def test_sinks_kafka_common_is_an_alias_of_kafka_client() -> None:
    import sinks.kafka_client

    with pytest.warns(DeprecationWarning, match=r"sinks\.kafka_common\.redact moved to "
                      r"sinks\.kafka_client\.redact"):
        from sinks.kafka_common import redact
    assert redact is sinks.kafka_client.redact
    assert redact({"sasl.password": "x", "acks": "all"}) == {"acks": "all",
                                                             "sasl.password": "***"}
