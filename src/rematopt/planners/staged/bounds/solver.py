"""A relaxation's CP-SAT model solved into a :class:`WholeBound`: the one
solve that the gaps, chains and slots bounds share."""

from __future__ import annotations

import math

from ortools.sat.python import cp_model

from ...meter import meter, now
from ..backends import solver_takes_ctrl_c, stopped_early, tune
from .question import How, WholeBound


def solve_relaxation(m: cp_model.CpModel, goal: cp_model.LinearExpr, began: float, how: How,
                     strong: bool = False) -> WholeBound:
    """Minimise ``goal`` in ``m`` within what is left of ``how.time_limit``
    (counted from ``began``) and within ``how.work``; ``how.below``: see :class:`How`. ``strong``:
    only the bound matters (:func:`tune`'s LP-heavy workers and root cuts)."""
    below = how.below
    left = how.time_limit - (now() - began)
    if left <= 0 or (how.work is not None and how.work <= 0):
        return WholeBound("UNKNOWN", None, now() - began)
    if below is not None:
        m.add(goal <= below)
    m.minimize(goal)
    solver = cp_model.CpSolver()
    tune(solver.parameters, max(left, 0.01), how.workers, how.seed, strong=strong)
    if how.work is not None:
        solver.parameters.max_deterministic_time = min(solver.parameters.max_deterministic_time, how.work)
    solver.parameters.stop_after_first_solution = below is not None
    with solver_takes_ctrl_c(solver.parameters, how.interruptible):
        status = meter().solve(solver, m)
    seconds = now() - began
    # an early stop without a proof is Ctrl-C's doing, unless the solution
    # found under ``below`` stopped it by design
    unproven = (cp_model.UNKNOWN,) if below is not None else (cp_model.FEASIBLE, cp_model.UNKNOWN)
    stopped = stopped_early(solver, status, left, unproven)
    work = solver.deterministic_time
    if status == cp_model.INFEASIBLE:
        return WholeBound("INFEASIBLE", None, seconds, work=work)
    # The search's bound holds even when it ends with no solution: asked for
    # one below ``below``, every plan either costs more than that or at
    # least the bound (n250 at 0.8: chains reaches 2,596 where gaps has 1,828).
    lower = math.ceil(solver.best_objective_bound - 1e-6) if math.isfinite(solver.best_objective_bound) else None
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return WholeBound("UNKNOWN", lower, seconds, stopped, work)
    return WholeBound("OPTIMAL" if status == cp_model.OPTIMAL else "FEASIBLE", lower, seconds, stopped, work)
