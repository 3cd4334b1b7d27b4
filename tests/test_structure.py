"""The package tree draws the architecture, and nothing ties it in knots.

- no import cycle between modules of ``microbatch``, ``statestore`` and
  ``sinks``, counting every import: top level, inside functions and under
  ``TYPE_CHECKING``;
- ``statestore`` and ``sinks`` never import ``microbatch`` (they are usable on
  their own; the engine reaches them through small protocols); of
  ``statestore``, ``sinks`` imports only the shared foundation (the durable-write
  layer and the error root);
- at most 12 modules at the top of ``microbatch/``: the rest lives in rooms.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("microbatch", "statestore", "sinks")


def _modules() -> dict[str, Path]:
    mods = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            mods[name.removesuffix(".__init__")] = path
    return mods


def _imports(name: str, path: Path, mods: dict[str, Path]) -> set[str]:
    """Modules of ours that ``name`` imports, anywhere in its source."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = name.split(".")
                if path.name != "__init__.py":
                    parts = parts[:-1]
                parts = parts[: len(parts) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            for alias in node.names:
                full = f"{base}.{alias.name}"
                found.add(full if full in mods else base)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {m for m in found if m in mods and m != name}


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    return {name: _imports(name, path, mods) for name, path in mods.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles() -> None:
    assert _cycles(_graph()) == []


def test_the_cycle_check_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_statestore_and_sinks_never_import_microbatch() -> None:
    graph = _graph()
    offenders = {
        name: sorted(t for t in targets if t.split(".")[0] == "microbatch")
        for name, targets in graph.items()
        if name.split(".")[0] in ("statestore", "sinks")
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_at_most_twelve_modules_at_the_top_of_microbatch() -> None:
    top = sorted(p.name for p in (ROOT / "microbatch").glob("*.py"))
    assert len(top) <= 12, top


def test_every_package_has_an_init_with_a_docstring() -> None:
    for package in PACKAGES:
        for directory in [ROOT / package, *(ROOT / package).rglob("*/")]:
            if directory.name == "__pycache__" or not list(directory.glob("*.py")):
                continue
            init = directory / "__init__.py"
            assert init.is_file(), f"{directory} is a package without __init__.py"
            assert ast.get_docstring(ast.parse(init.read_text())), f"{init} says nothing"


SINKS_MAY_IMPORT_FROM_STATESTORE = {"statestore.durable", "statestore.exceptions"}
"""The shared foundation below both packages: the one durable-write layer and
the one error root (``MicrobatchError``)."""


def test_sinks_import_only_the_shared_foundation_of_statestore() -> None:
    """``sinks`` writes its files through ``statestore.durable`` (one durable-write
    layer, one recorder, one fsync switch), derives its errors from the one root
    in ``statestore.exceptions`` and uses nothing else of ``statestore``."""
    graph = _graph()
    reached = {
        target
        for name, targets in graph.items()
        if name.split(".")[0] == "sinks"
        for target in targets
        if target.split(".")[0] == "statestore"
    }
    assert reached <= SINKS_MAY_IMPORT_FROM_STATESTORE, sorted(reached)


def test_there_is_one_durable_write_layer() -> None:
    """``sinks/durable.py`` is a deprecated alias, not a copy with its own state."""
    import sinks.durable
    import statestore.durable

    assert "_recorders" not in vars(sinks.durable)
    assert "write_atomic" not in vars(sinks.durable)
    assert statestore.durable.write_atomic.__module__ == "statestore.durable"


def _room(module: str) -> str:
    parts = module.split(".")
    return parts[0] if parts[0] != "microbatch" or len(parts) == 1 else ".".join(parts[:2])


def test_the_rooms_of_microbatch_form_layers() -> None:
    """Between sub-packages too, dependencies run one way (the README's table):
    ``plan`` does not reach into the engine, ``observability`` reads pushed facts
    and snapshots, never the engine or the query."""
    rooms: dict[str, set[str]] = defaultdict(set)
    for name, targets in _graph().items():
        for target in targets:
            if _room(name) != _room(target):
                rooms[_room(name)].add(_room(target))
    assert _cycles(rooms) == []
    assert "microbatch.engine" not in rooms["microbatch.observability"]
    assert "microbatch.api" not in rooms["microbatch.observability"]
    assert "microbatch.engine" not in rooms["microbatch.plan"]
    assert "microbatch.engine" not in rooms["microbatch.operators"]


def _subclasses(cls: type) -> set[type]:
    found = set()
    for sub in cls.__subclasses__():
        found |= {sub, *_subclasses(sub)}
    return found


def test_every_stateful_node_has_an_operator_and_runs_in_the_executor_matrix() -> None:
    """A stateful plan node is one class: its operator module registers a builder
    (:mod:`microbatch.operators.registry`), and the executor matrix runs a query
    with it on one process and on Ray workers (``tests/distributed``)."""
    import importlib.util
    import sys

    from microbatch.operators.registry import registered
    from microbatch.plan.nodes import StatefulNode

    kinds = {k for k in _subclasses(StatefulNode) if k.__module__.startswith("microbatch.")}
    assert kinds, "no StatefulNode subclass found"
    assert {k.__name__ for k in kinds - registered().keys()} == set()

    sys.path.insert(0, str(ROOT / "tests" / "engine"))  # determinism_queries
    try:
        path = ROOT / "tests" / "distributed" / "test_executor_matrix.py"
        spec = importlib.util.spec_from_file_location("executor_matrix_structure", path)
        assert spec is not None
        assert spec.loader is not None
        matrix = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(matrix)
        covered = {
            type(node) for stream in matrix.matrix_streams() for node in stream.plan.walk()
        }
    finally:
        sys.path.remove(str(ROOT / "tests" / "engine"))
    assert {k.__name__ for k in kinds - covered} == set()


def test_a_node_class_has_one_builder() -> None:
    from microbatch.operators.registry import builds, registered
    from microbatch.plan.nodes import AggregateNode

    # NOTE: load the real builders first: run before any operator module was
    # imported, the lambda below would register itself and poison later tests
    assert AggregateNode in registered()
    with pytest.raises(TypeError, match="already has an operator builder"):
        builds(AggregateNode)(lambda node, operator_id, mode: None)  # type: ignore[arg-type,return-value]


def test_every_error_class_of_the_project_has_one_root() -> None:
    """Every exception class defined in ``microbatch``, ``statestore`` and ``sinks``
    derives from ``MicrobatchError``, except the few named here with why."""
    import importlib
    import inspect

    import microbatch as mb

    outside = {
        "microbatch.engine.faults.InjectedFault",  # a test's stand-in for a crash
        "microbatch.distributed.runner._WorkerLost",  # internal: caught and retried
    }
    found = []
    for name in _modules():
        if name.endswith("__main__"):
            continue  # runs the CLI
        module = importlib.import_module(name)
        for value in vars(module).values():
            if (inspect.isclass(value) and issubclass(value, BaseException)
                    and value.__module__ == name):
                found.append(value)
    assert len(found) > 20
    strays = sorted(f"{c.__module__}.{c.__qualname__}" for c in found
                    if not issubclass(c, mb.MicrobatchError))
    assert strays == sorted(outside)
