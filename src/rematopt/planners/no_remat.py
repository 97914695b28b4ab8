"""``no-remat``: keep everything, the plan every budget ratio is measured from."""

from __future__ import annotations

from typing import Any

from ..graph import Graph
from ..plan import Plan
from ..reference import no_remat_plan
from ..simulate import base_cost, peak_of
from ..stats import Stats
from .options import NoOptions

Options = NoOptions  # takes none


def plan(graph: Graph, budget: int | None, options: dict[str, Any]) -> Plan:
    p = no_remat_plan(graph)
    peak = peak_of(graph, p.ops, p.nodes)
    p.stats = Stats(status="FEASIBLE" if budget is None or peak <= budget else "OVER_BUDGET",
                    peak_bytes=peak, compute_cost=base_cost(graph), transfer_bytes=0)
    return p
