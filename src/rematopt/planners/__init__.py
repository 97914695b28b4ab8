"""Planner registry. Every planner is a function

    plan(graph: Graph, budget: int | None, options: dict) -> Plan

registered here by name as ``"module:function"`` (imported on first use, so
heavy solvers cost nothing until asked for). A new planner is one new module
plus one line below. Options a planner does not know are ignored.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any, Callable

from ..errors import PlannerError
from ..graph import Graph
from ..plan import Plan

PlannerFn = Callable[[Graph, "int | None", dict[str, Any]], Plan]

REGISTRY: dict[str, str] = {
    "no-remat": "rematopt.planners.no_remat:plan",
}


def names() -> list[str]:
    return sorted(REGISTRY)


def get(name: str) -> PlannerFn:
    """The planner function registered as ``name``; PlannerError if unknown."""
    try:
        module, func = REGISTRY[name].split(":")
    except KeyError:
        raise PlannerError(f"unknown planner {name!r}; known: {', '.join(names())}") from None
    return getattr(import_module(module), func)
