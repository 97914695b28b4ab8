"""Planner registry. Every planner is a function

    plan(graph: Graph, budget: int | None, options: dict) -> Plan

registered here by name as ``"module:function"`` (imported on first use, so
heavy solvers cost nothing until asked for). A new planner is one new module
plus one line below. Options a planner does not know are ignored (a batch
gives every planner the same ones); a module lists those its planners read
in ``OPTIONS``, so that ``rematopt solve`` can refuse the others.
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
    "greedy": "rematopt.planners.greedy:plan",
    "chen-sqrt": "rematopt.planners.chen:plan_sqrt",
    "chen-greedy": "rematopt.planners.chen:plan_greedy",
    "dtr": "rematopt.planners.dtr:plan",
    "jax-nothing-saveable": "rematopt.planners.jax_policies:plan_nothing_saveable",
    "jax-dots-saveable": "rematopt.planners.jax_policies:plan_dots_saveable",
    "jax-offload-dots": "rematopt.planners.jax_policies:plan_offload_dots",
    "jax-names": "rematopt.planners.jax_names:plan",
    "cpsat": "rematopt.planners.cpsat:plan",
}


def names() -> list[str]:
    return sorted(REGISTRY)


def available() -> list[str]:
    """Registered planners whose module imports here (optional extras may be missing)."""
    out = []
    for name in names():
        try:
            get(name)
        except PlannerError:
            continue
        out.append(name)
    return out


def options(name: str) -> frozenset[str]:
    """The options planner ``name`` reads (its module's ``OPTIONS``)."""
    return getattr(import_module(get(name).__module__), "OPTIONS", frozenset())


def get(name: str) -> PlannerFn:
    """The planner function registered as ``name``; PlannerError if unknown."""
    try:
        module, func = REGISTRY[name].split(":")
    except KeyError:
        raise PlannerError(f"unknown planner {name!r}; known: {', '.join(names())}") from None
    try:
        return getattr(import_module(module), func)
    except (ModuleNotFoundError, AttributeError) as e:
        raise PlannerError(f"planner {name!r} is not available here ({e})") from None
