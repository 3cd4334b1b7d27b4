"""Names that moved out of ``sinks`` still import, with a ``DeprecationWarning``."""

from __future__ import annotations

import pytest

import statestore.durable


def test_sinks_durable_is_an_alias_of_the_one_durable_layer() -> None:
    with pytest.warns(DeprecationWarning, match=r"sinks\.durable\.write_atomic moved to "
                      r"statestore\.durable\.write_atomic"):
        from sinks.durable import write_atomic
    assert write_atomic is statestore.durable.write_atomic


def test_sinks_durable_knows_only_the_layers_names() -> None:
    import sinks.durable

    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        _ = sinks.durable.nothing_here
    with pytest.raises(AttributeError):
        _ = sinks.durable._recorders

