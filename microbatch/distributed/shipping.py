"""Sending a query's plan to worker processes.

The plan holds the user's functions (steps, ``transform_with_state``) and its
sources. Functions travel with cloudpickle (a job file's module by value: the
workers cannot import it by its made-up name). Sources never travel: they are
open on the driver (consumers, file ledgers); a worker sees a
:class:`SourceStub` in their place, which keeps the source's position (its id)
and schema. What a worker reads of a source travels per batch instead, as a
read split (:class:`~microbatch.sources.base.ReadSplit`) that needs none of the
driver's open state.
"""

from __future__ import annotations

import io
import pickle
import sys
from typing import Any

from microbatch.plan.nodes import PlanNode
from microbatch.sources.base import Source

JOB_MODULE_PREFIX = "_microbatch_job_"


class SourceStub:
    """Stands for a driver-side source in a worker's copy of the plan."""

    def __init__(self, position: int, schema: Any) -> None:
        self.position = position
        self.schema = schema

    def __repr__(self) -> str:
        return f"SourceStub({self.position})"


def dumps_plan(plan: PlanNode) -> bytes:
    """The plan as bytes a worker can load, sources replaced by stubs."""
    from ray import cloudpickle

    for name, module in list(sys.modules.items()):
        if name.startswith(JOB_MODULE_PREFIX):
            cloudpickle.register_pickle_by_value(module)  # type: ignore[no-untyped-call]
    # NOTE: the same object twice in a plan (a self-join) keeps one id, as on the driver
    positions = {id(source): i for i, source in enumerate(plan.sources())}

    class PlanPickler(cloudpickle.Pickler):
        def persistent_id(self, obj: Any) -> Any:
            if isinstance(obj, Source) and id(obj) in positions:
                return ("source", positions[id(obj)], obj.schema)
            return None

    buffer = io.BytesIO()
    PlanPickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(plan)  # type: ignore[no-untyped-call]
    return buffer.getvalue()


def loads_plan(blob: bytes) -> PlanNode:
    """The plan sent by :func:`dumps_plan`."""

    stubs: dict[int, SourceStub] = {}

    class PlanUnpickler(pickle.Unpickler):
        def persistent_load(self, pid: Any) -> Any:
            kind, position, schema = pid
            if kind != "source":  # pragma: no cover - only our own ids are written
                raise pickle.UnpicklingError(f"unknown persistent id {pid!r}")
            return stubs.setdefault(position, SourceStub(position, schema))

    plan = PlanUnpickler(io.BytesIO(blob)).load()
    assert isinstance(plan, PlanNode)
    return plan
