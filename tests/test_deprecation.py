"""The one deprecation mechanism (``microbatch/_deprecation.py``): old names keep
working, warn once per use in one message format, and point at the caller."""

from __future__ import annotations

import sys
import types
import warnings
from collections.abc import Iterator

import pytest

from microbatch._deprecation import (
    REMOVED_IN,
    deprecated_alias,
    issue_deprecation_warning,
    moved_names,
)


def test_issue_deprecation_warning_tags_the_version_and_points_at_the_caller() -> None:
    def old_thing() -> None:
        issue_deprecation_warning("old_thing is deprecated: use new_thing", version="0.2.0")

    with pytest.warns(DeprecationWarning, match="old_thing") as record:
        old_thing()  # the line the warning names
    assert len(record) == 1
    assert str(record[0].message) == (
        "old_thing is deprecated: use new_thing (deprecated in microbatch 0.2.0)"
    )
    assert record[0].filename == __file__


@pytest.fixture
def old_module() -> Iterator[types.ModuleType]:
    """A module whose ``OldName`` moved to ``microbatch.exceptions.PlanError``."""
    module = types.ModuleType("microbatch_test_old")
    module.__getattr__ = moved_names(  # type: ignore[method-assign]
        "microbatch_test_old", {"OldName": "microbatch.exceptions:PlanError"}, version="0.2.0"
    )
    sys.modules[module.__name__] = module
    yield module
    del sys.modules[module.__name__]


def test_moved_names_answers_an_old_name_with_the_new_object(
    old_module: types.ModuleType,
) -> None:
    from microbatch.exceptions import PlanError

    with pytest.warns(DeprecationWarning, match="OldName") as record:
        from microbatch_test_old import OldName
    assert OldName is PlanError
    assert str(record[0].message) == (
        "microbatch_test_old.OldName moved to microbatch.exceptions.PlanError; the old name "
        f"will be removed in microbatch {REMOVED_IN} (deprecated in microbatch 0.2.0)"
    )
    assert record[0].filename == __file__
    with pytest.warns(DeprecationWarning, match="OldName"):
        assert old_module.OldName is PlanError  # attribute access warns too


def test_moved_names_leaves_other_names_missing(old_module: types.ModuleType) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(AttributeError, match="has no attribute 'Other'"):
            _ = old_module.Other


def new_function(x: int, *, times: int = 2) -> int:
    """Multiplies."""
    return x * times


old_function = deprecated_alias(new_function, "old_function", version="0.2.0")


class Thing:
    def __init__(self, base: int) -> None:
        self.base = base

    def add(self, x: int) -> int:
        """Adds to the base."""
        return self.base + x

    plus = deprecated_alias(add, "plus", version="0.2.0")


def test_deprecated_alias_of_a_function_calls_the_new_one() -> None:
    with pytest.warns(DeprecationWarning, match="old_function") as record:
        assert old_function(3, times=3) == 9
    assert str(record[0].message) == (
        "old_function is renamed new_function; the old name will be removed in microbatch "
        f"{REMOVED_IN} (deprecated in microbatch 0.2.0)"
    )
    assert record[0].filename == __file__
    assert old_function.__name__ == "old_function"
    assert "new_function" in (old_function.__doc__ or "")


def test_deprecated_alias_of_a_method_binds_like_the_method() -> None:
    with pytest.warns(DeprecationWarning, match=r"^Thing\.plus is renamed Thing\.add;"):
        assert Thing(1).plus(2) == 3
    assert Thing.plus.__qualname__ == "Thing.plus"


def test_new_names_do_not_warn() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert new_function(2) == 4
        assert Thing(1).add(2) == 3


def test_old_module_paths_warn_in_the_same_format() -> None:
    import importlib

    sys.modules.pop("microbatch.triggers", None)
    try:
        with pytest.warns(DeprecationWarning, match=r"^microbatch\.triggers moved to "
                          r"microbatch\.plan\.triggers; the old name will be removed in "
                          r"microbatch 0\.3 .*\(deprecated in microbatch 0\.2\.0\)$"):
            module = importlib.import_module("microbatch.triggers")
        assert module is importlib.import_module("microbatch.plan.triggers")
    finally:
        sys.modules.pop("microbatch.triggers", None)


def test_the_user_errors_function_is_a_deprecated_name_of_the_tuple() -> None:
    from microbatch.cli.common import user_errors
    from microbatch.exceptions import USER_ERRORS

    with pytest.warns(DeprecationWarning, match=r"user_errors\(\) is renamed "
                      r"microbatch\.exceptions\.USER_ERRORS"):
        assert user_errors() == USER_ERRORS


def test_the_renamed_plan_and_engine_names_still_work() -> None:
    """Names renamed by the operator registry (0.2.0) answer with a warning."""
    import importlib

    from microbatch.operators.registry import build_operator
    from microbatch.plan.joins import AggregateJoinSpec
    from microbatch.plan.nodes import AggregateJoinNode, AggregateNode, StatefulNode

    nodes = importlib.import_module("microbatch.plan.nodes")
    joins = importlib.import_module("microbatch.plan.joins")
    sharding = importlib.import_module("microbatch.distributed.sharding")
    with pytest.warns(DeprecationWarning, match="WindowJoinNode moved to"):
        assert nodes.WindowJoinNode is AggregateJoinNode
    with pytest.warns(DeprecationWarning, match="WindowJoinSpec moved to"):
        assert joins.WindowJoinSpec is AggregateJoinSpec
    with pytest.warns(DeprecationWarning, match="STATEFUL_NODES moved to"):
        assert sharding.STATEFUL_NODES is StatefulNode
    with pytest.warns(DeprecationWarning, match="microbatch.engine.executor moved to"):
        old = importlib.import_module("microbatch.engine.executor")
    assert old.build_operator is build_operator  # imported there, the same signature
    with pytest.warns(DeprecationWarning, match="window_join moved to"):
        assert old.window_join is old.aggregate_join
    node = AggregateNode(nodes.SourceNode.__new__(nodes.SourceNode), None, ("k",), ())
    with pytest.warns(DeprecationWarning, match="replaced by node.shard_keys"):
        assert sharding.node_keys(node) == ("k",)
