"""``cpsat``: the exact planner. Solves the staged model of
:mod:`..staged` (formulation: ``docs/cpsat.md``) in rounds with CP-SAT
from a warm start (:mod:`.search`, chosen by :mod:`.strategy`), asks the
staged space's bounds (:mod:`..staged.bounds`) and reports what was
proven (:mod:`.report`).

Objectives: ``overhead`` (default with a budget) minimises recompute plus
transfer cost with every memory check <= budget; ``peak`` (default without a
budget) minimises the peak with recompute plus transfer cost <= max_overhead x
base cost. Once the primary optimum is proven, the other figure is minimised
without losing it (lexicographic). Reported costs come from the plan
(``cost_of_counts``), objective and bounds in cost units or bytes.
"""

from __future__ import annotations

from typing import Any

from ...graph import Graph
from ...plan import Plan
from ...reference import peak_lower_bound
from ...stats import Stats
from .settings import OPTIONS, Options, Settings
from .verdict import ALL_PLANS, Source

__all__ = ["OPTIONS", "Options", "Settings", "plan"]


def plan(graph: Graph, budget: int | None, options: dict[str, Any]) -> Plan:
    from . import run  # CP-SAT is imported when a plan is asked for, not for the options
    from .report import no_plan

    cfg = Settings.parse(budget, options)
    if budget is not None and budget < peak_lower_bound(graph):
        return no_plan(graph.name, "INFEASIBLE", reason=f"budget {budget:,} bytes is below the lower bound "
                                                        f"{peak_lower_bound(graph):,} bytes; no model built",
                       proved_by=Source.WORKING_SET.value, infeasible_in=ALL_PLANS)
    if not graph.compute_ids:  # the empty plan: no cost, and the inputs every plan holds
        overhead = cfg.objective == "overhead"
        return Plan(graph.name, "cpsat", [], [],
                    Stats(status="OPTIMAL", peak_bytes=graph.initial_bytes, compute_cost=0.0, transfer_bytes=0,
                          objective=0.0 if overhead else float(graph.initial_bytes), optimal_in=ALL_PLANS,
                          details={"proved_by": (Source.ZERO_COST if overhead else Source.WORKING_SET).value,
                                   "objective_kind": cfg.objective}))
    return run.run(graph, cfg)
