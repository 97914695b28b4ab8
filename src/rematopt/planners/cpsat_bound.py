"""A lower bound for the whole staged space, from a model small enough to
solve in a fraction of a second: the *gap relaxation* (``docs/cpsat.md``,
"Whole-space bound").

Take a value i and the stages where it must be resident at the first
computation of the stage's node: its own stage, the stages of its consumers,
and (outputs) the last one. Between two such consecutive stages a and b lies
a *gap*. If i is not resident at the first computation of some stage s
strictly inside the gap, the model must recompute or prefetch it in a stage
of (s, b] before its use in b; the stages of two gaps do not overlap, so each
gap i leaves costs at least min(recompute, transfer) of i on its own. Keeping
only the memory checks at those first computations, and dropping what a
recompute needs (its producers, its own slot's memory), leaves a 0/1 model
with one variable per gap:

    minimise  sum_g w_g d_g
    s.t.      sum_{i forced at s} size(i) + sum_{g of i, s inside g} size(i) (1 - d_g) <= cap   (every stage s)

Every plan of the staged model maps to a solution of it that costs no more,
so its optimum (or CP-SAT's bound on it) bounds the whole space from below,
and its infeasibility proves the whole space empty. On mobilenet_train it is
the optimum itself (265 and 600 cost units at budget ratios 0.9 and 0.8); on
the random layered graphs, where recomputes need producers that are long
gone, it is about 60% of it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ortools.sat.python import cp_model

from ..graph import Graph
from .cpsat_model import Stages


@dataclass
class GapBound:
    """The relaxation's verdict, in model integers (cost x scale, or memory units)."""

    status: str  # OPTIMAL, FEASIBLE (bound only), INFEASIBLE, UNKNOWN
    bound: int | None


def gap_bound(graph: Graph, *, objective: str, unit: int, cap_units: int, int_cost: list[int],
              int_transfer: list[int], offload: bool, overhead_cap: int | None = None,
              max_recomputes: int | None = None, peak_floor: int = 0, time_limit: float = 5.0,
              workers: int = 1) -> GapBound:
    """Solve the gap relaxation. Memory is in ``unit`` bytes with persistent
    bytes aside, as in :class:`Formulation`; ``int_cost`` / ``int_transfer``
    must not exceed the model's (floored, when the cost scale is inexact).
    ``objective`` "overhead" minimises the cost under ``cap_units``; "peak"
    minimises the largest stage memory, with the cost under ``overhead_cap``."""
    ix = Stages(graph, offload)
    size = [b // unit for b in graph.bytes]
    T = ix.T
    forced = [0] * T
    inside: list[list[tuple[int, cp_model.IntVar]]] = [[] for _ in range(T)]
    weights: list[tuple[int, cp_model.IntVar]] = []
    m = cp_model.CpModel()
    for i in ix.values:
        node = graph.nodes[i]
        weight = min([int_cost[i]] * ix.recomputable[i] + [int_transfer[i]] * ix.offloadable[i], default=None)
        points = sorted({ix.first[j] for j in graph.succs[i] if ix.first[j] >= 0}
                        | ({T - 1} if node.output else set()) | {ix.first[i]})
        for s in points:
            if s >= 0:
                forced[s] += size[i]
        for a, b in zip(points, points[1:]):
            stages = range(max(a + 1, 0), b)
            if not stages:
                continue
            if weight is None:
                for s in stages:
                    forced[s] += size[i]
                continue
            d = m.new_bool_var("")
            weights.append((weight, d))
            for s in stages:
                forced[s] += size[i]
                inside[s].append((size[i], d))
    cost = cp_model.LinearExpr.weighted_sum([d for _, d in weights], [w for w, _ in weights])
    if max_recomputes is not None and not offload:
        m.add(sum(d for _, d in weights) <= max_recomputes)
    if objective == "overhead":
        for s in range(T):
            if forced[s] > cap_units and not inside[s]:
                return GapBound("INFEASIBLE", None)
            if inside[s]:
                m.add(forced[s] - sum(c * d for c, d in inside[s]) <= cap_units)
        m.minimize(cost)
    else:
        top = max(max(forced, default=0), peak_floor)
        z = m.new_int_var(peak_floor, top, "peak")
        for s in range(T):
            m.add(forced[s] - sum(c * d for c, d in inside[s]) <= z)
        if overhead_cap is not None:
            m.add(cost <= overhead_cap)
        m.minimize(z)
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(time_limit, 0.01)
    solver.parameters.num_workers = workers
    # CP-SAT's own SIGINT handler would swallow a Ctrl-C meant for cpsat
    solver.parameters.catch_sigint_signal = False
    status = solver.solve(m)
    if status == cp_model.INFEASIBLE:
        return GapBound("INFEASIBLE", None)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return GapBound("UNKNOWN", None)
    return GapBound("OPTIMAL" if status == cp_model.OPTIMAL else "FEASIBLE",
                    math.ceil(solver.best_objective_bound - 1e-6))
