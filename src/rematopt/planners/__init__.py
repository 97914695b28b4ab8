"""Planner registry. Every planner is a function

    plan(graph: Graph, budget: int | None, options: dict) -> Plan

registered here by name as ``"module:function"`` (imported on first use, so
heavy solvers cost nothing until asked for). A new planner is one new module
plus one line below. Its module declares the options its planners read as
one frozen dataclass, ``Options`` (see :mod:`.options`): the command line's
options and their parsing are derived from those classes. Options a planner
does not declare are ignored (a batch gives every planner the same ones);
``rematopt solve`` refuses them.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any, Callable

from ..errors import PlannerError
from ..graph import Graph
from ..plan import Plan
from .options import names as option_names

PlannerFn = Callable[[Graph, "int | None", dict[str, Any]], Plan]

REGISTRY: dict[str, str] = {
    "no-remat": "rematopt.planners.no_remat:plan",
    "greedy": "rematopt.planners.greedy:plan",
    "chen-sqrt": "rematopt.planners.chen:plan_sqrt",
    "chen-greedy": "rematopt.planners.chen:plan_greedy",
    "dtr": "rematopt.planners.dtr:plan",
    "rotor": "rematopt.planners.rotor:plan",
    "xla-remat": "rematopt.planners.xla_remat:plan",
    "torch-knapsack": "rematopt.planners.torch_knapsack:plan",
    "jax-nothing-saveable": "rematopt.planners.policies.presets:plan_nothing_saveable",
    "jax-dots-saveable": "rematopt.planners.policies.presets:plan_dots_saveable",
    "jax-offload-dots": "rematopt.planners.policies.presets:plan_offload_dots",
    "jax-names": "rematopt.planners.policies.names:plan",
    "cpsat": "rematopt.planners.cpsat:plan",
}
# Where a planner's options class is, when not in its module as ``Options``.
OPTIONS_AT: dict[str, str] = {"cpsat": "rematopt.planners.cpsat.settings:Options"}


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


def options_class(name: str) -> type:
    """The options class of planner ``name`` (its module's ``Options``),
    found without running anything heavy; PlannerError if the planner is
    unknown or its module does not import here."""
    if name not in REGISTRY:
        get(name)  # the unknown-planner error
    module, attr = OPTIONS_AT.get(name, REGISTRY[name].split(":")[0] + ":Options").split(":")
    try:
        return getattr(import_module(module), attr)
    except (ModuleNotFoundError, AttributeError) as e:
        raise PlannerError(f"planner {name!r} is not available here ({e})") from None


def options_classes() -> dict[str, type]:
    """Planner name -> options class, for every planner whose options import here."""
    out = {}
    for name in names():
        try:
            out[name] = options_class(name)
        except PlannerError:
            continue
    return out


def options(name: str) -> frozenset[str]:
    """The options planner ``name`` reads."""
    return option_names(options_class(name))


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
