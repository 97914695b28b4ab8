"""Warm starts for ``cpsat``: run the fast planners and keep the best valid
plan under the budget, so CP-SAT starts from a good incumbent instead of
searching for a first one."""

from __future__ import annotations

from typing import Any

from ..graph import Graph
from ..plan import Plan
from ..simulate import simulate
from . import available, get

# Planners that are not fast, or that would recurse.
SLOW = frozenset({"cpsat"})


def fast_planners() -> list[str]:
    """The registered planners that import here, the exact one aside."""
    return [name for name in available() if name not in SLOW]


def best_fast_plan(graph: Graph, budget: int | None, options: dict[str, Any] | None = None) -> Plan | None:
    """The valid plan with the lowest compute cost plus transfer bytes (then
    the lowest peak) among the fast planners' plans that meet ``budget``
    (every plan qualifies when it is None). Each candidate is replayed by the
    simulator, so a planner's own claims are never trusted; a planner that
    fails on this graph is skipped. None if no plan meets the budget."""
    best: tuple[tuple[float, int, int], Plan] | None = None
    for name in fast_planners():
        try:
            p = get(name)(graph, budget, dict(options or {}))
        except Exception:  # a baseline that fails here is simply not a candidate
            continue
        r = simulate(graph, p)
        if not r.valid or (budget is not None and r.peak_bytes > budget):
            continue
        key = (r.compute_cost, r.transfer_bytes, r.peak_bytes)
        if best is None or key < best[0]:
            p.planner = name
            best = (key, p)
    return best[1] if best else None
