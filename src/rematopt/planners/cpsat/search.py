"""One solve round, as a function: ``(model, hint, limit) -> Round``, with
the searches it is made of (the CP-SAT solve itself, the peak search that
looks for any plan within the budget, the lexicographic tie-break). Every
result is immutable; what carries over between rounds is decided by
:mod:`strategy` and :mod:`run`."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

from ortools.sat.python import cp_model

from ...errors import PlannerError
from ...graph import Graph
from ...plan import Plan
from ...reference import no_remat_peak
from ..meter import meter
from ..staged.backends import CpSatBackend, solver_takes_ctrl_c, stopped_early, tune
from ..staged.bounds import Question, question
from ..staged.model import Model, OutOfTime, add_tie_break, build
from ..staged.solution import Assignment, events, from_plan
from ..staged.stages import Stages
from ..staged.units import Scale, proof_overhead_cap
from .clock import Clock
from .settings import Settings, max_recomputes
from .signals import Interrupt, SolutionCallback, Trace, live_progress
from .tuning import Tuning

@dataclass(frozen=True)
class Context:
    """What every round of one solve shares: the graph, the settings, the
    cost scale (:class:`..staged.units.Scale`), the full staged space, the
    clock (a part of the solve gets its own: :meth:`Clock.until`), the
    trace, and the Ctrl-C flag."""

    graph: Graph
    cfg: Settings
    cost: Scale
    full: Stages
    clock: Clock
    trace: Trace
    stop: Interrupt

    @property
    def tuning(self) -> Tuning:
        return self.cfg.tuning

    def elapsed(self) -> float:
        return self.clock.elapsed()

    def left(self) -> float:
        return self.clock.left()

    def question(self, objective: str, cap_bytes: int | None) -> Question:
        """What this solve's relaxations are asked (:func:`..staged.bounds.question`):
        ``objective`` under ``cap_bytes``, within the run's caps."""
        cfg = self.cfg
        return question(self.graph, objective, self.cost, per_byte=cfg.transfer_cost_per_byte,
                        offload=cfg.offload, cap_bytes=cap_bytes,
                        max_overhead=cfg.max_overhead if cfg.objective == "peak" else None,
                        max_recomputes=max_recomputes(cfg, len(self.graph.compute_ids)))

    def proof_cap(self, rounded: bool = False) -> int | None:
        """``--max-overhead`` as a proof must read it (:func:`..staged.units.proof_overhead_cap`)."""
        return proof_overhead_cap(self.graph, self.cost, self.cfg.max_overhead, rounded)


@dataclass(frozen=True)
class Lowest:
    """The lowest-peak valid plan known, whatever the budget: where the
    peak search (:func:`fit`) starts."""

    plan: Plan
    peak_bytes: int


@dataclass(frozen=True)
class Solve:
    """One CP-SAT solve: status, the solution's values, objective and bound."""

    status: int
    values: list[int] | None
    objective: float
    bound: float


@dataclass(frozen=True)
class Round:
    """A round's outcome. ``best`` is never worse than the round's hint;
    ``fitted`` is the peak search's plan when it supplied the hint, and
    ``lowest`` a lower-peak plan that search found on the way."""

    model: Model
    status: int
    searched: int  # the search's own status (``status`` counts the hint as a plan)
    best: Assignment | None
    bound: float | None
    fitted: Assignment | None
    lowest: Lowest | None
    build_s: float  # the round's models, the peak search's included
    elapsed_s: float

    @property
    def depth(self) -> int | None:
        return self.model.depth

    @property
    def objective(self) -> int | None:
        """The best assignment's objective, model integers."""
        return None if self.best is None else self.model.objective_of(self.best)


def make_model(ctx: Context, depth: int | None, also: dict[int, set[int]] | None, *, fit: bool = False,
               backend: Any = None, round_down: bool = False) -> Model:
    """The round's model (``fit``: the peak search's, with the budget lifted
    and the peak minimised) on ``backend`` (a fresh CP-SAT one by default);
    ``round_down``: with sizes rounded down to an inexact memory unit.
    Raises OutOfTime when building it would pass the time limit."""
    cfg, g = ctx.cfg, ctx.graph
    top = cfg.budget if cfg.budget is not None else no_remat_peak(g)
    return build(g, backend if backend is not None else CpSatBackend(),
                 objective="peak" if fit else cfg.objective, mem_cap_bytes=None if fit else top,
                 offload=cfg.offload, transfer_cost_per_byte=cfg.transfer_cost_per_byte, cost_scale=ctx.cost.scale,
                 depth=depth, also=also if depth is not None else None,
                 max_recomputes=max_recomputes(cfg, len(g.compute_ids)),
                 max_overhead=None if fit or cfg.objective != "peak" else cfg.max_overhead,
                 overhead_cap=ctx.proof_cap(rounded=True) if round_down else None,
                 deadline=ctx.clock.end, round_down=round_down)


def solve_model(ctx: Context, model: Model, phase: str, limit: float, stop_at: int | None = None) -> Solve:
    """Run CP-SAT on ``model`` for ``limit`` seconds, tracing ``phase``
    ("primary", "fit" or "secondary"); stop at the first solution at most
    ``stop_at``. A Ctrl-C ends the search with its best and sets ``ctx.stop``."""
    cfg = ctx.cfg
    solver = cp_model.CpSolver()
    prm = solver.parameters
    hinted = len(model.backend.model.proto.solution_hint.vars) > 0  # a plan to improve: the bound matters
    tune(prm, max(limit, 0.01), cfg.workers, cfg.seed, lp_heavy=hinted)
    to_units: Callable[[float], float] = {"primary": model.to_units, "fit": model.to_bytes}.get(phase, lambda v: v)
    solver.best_bound_callback = lambda b: ctx.trace.new_bound(phase, to_units(b))
    with live_progress(ctx.trace, cfg.progress and phase in ("primary", "fit")), solver_takes_ctrl_c(prm):
        callback = SolutionCallback(ctx.trace, phase, to_units, stop_at)
        status = meter().solve(solver, model.backend.model, callback)
    if stopped_early(solver, status, limit) and not callback.stopped:
        ctx.stop.requested = True
    if status == cp_model.MODEL_INVALID:
        raise PlannerError(f"cpsat: model invalid ({model.backend.model.validate()})")
    values = list(solver.response_proto.solution) if status in (cp_model.OPTIMAL, cp_model.FEASIBLE) else None
    return Solve(status, values, solver.objective_value, solver.best_objective_bound)


def solve_round(ctx: Context, model: Model, hint: Assignment | None, lowest: Lowest | None) -> Round:
    """The round's search from ``hint``, until the time limit. Without one
    (overhead under a budget), if the lowest-peak plan so far lies in the
    round's space within ``fit_margin`` of the budget, the search first gets
    ``fit_after_share`` of the time left, at least ``min_round_s`` (presolve shows
    most empty spaces at once); if that ends with neither plan nor proof,
    :func:`fit` gets ``fit_share`` of the rest to find a plan within the budget
    from there, and the search resumes (from that plan, if any) for the rest."""
    cfg, t = ctx.cfg, ctx.tuning
    if hint is not None:
        model.hint(hint)
    start = (from_plan(model.form, lowest.plan)
             if hint is None and cfg.objective == "overhead" and cfg.budget is not None
             and lowest is not None and lowest.peak_bytes <= (1 + t.fit_margin) * cfg.budget else None)
    limit = min(ctx.left(), max(t.min_round_s, t.fit_after_share * ctx.left())) if start is not None else ctx.left()
    first = solve_model(ctx, model, "primary", limit)
    status, values, bound, fitted, found_lower = first.status, first.values, first.bound, None, None
    build_s = model.build_s
    if (start is not None and values is None and status == cp_model.UNKNOWN and not ctx.stop.requested
            and ctx.left() >= 0.05):
        try:
            fit_status, fitted, found_lower, fit_build_s = fit(ctx, model, start, t.fit_share * ctx.left())
        except OutOfTime:  # its model could not be built in the time left
            fit_status, fitted, found_lower, fit_build_s = cp_model.UNKNOWN, None, None, 0.0
        build_s += fit_build_s
        if ctx.stop.requested or fit_status == cp_model.INFEASIBLE:
            status = fit_status if fitted is None else cp_model.UNKNOWN
        else:
            if fitted is not None:
                model.hint(fitted)
            resumed = solve_model(ctx, model, "primary", ctx.left())
            status, values, bound = resumed.status, resumed.values, max(bound, resumed.bound)
    if hint is None and fitted is not None:
        hint = fitted
    searched = status
    best = Assignment.from_values(model.form, lambda v: values[v.index]) if values else None
    if hint is not None and (best is None or model.objective_of(best) > model.objective_of(hint)):
        best = hint  # never worse than the hint
        status = cp_model.FEASIBLE if status != cp_model.OPTIMAL else status
        ctx.trace.solution("primary", model.to_units(model.objective_of(best)), model.to_units(bound))
    return Round(model, status, searched, best, bound, fitted, found_lower, build_s, ctx.elapsed())


def fit(ctx: Context, model: Model, start: Assignment, limit: float
        ) -> tuple[int, Assignment | None, Lowest | None, float]:
    """Look for any plan of the round's space within the budget in at most
    ``limit`` seconds: minimise the peak over the same space with the
    budget lifted, from ``start`` (the lowest-peak plan so far, in this
    space), and stop at the first plan that fits. Every plan is a solution
    there, so the search moves from its start: on resnet_s2_c16 at 0.8 the
    full model had no plan in 60 s of overhead search; from dtr's plan (peak
    2% over) one fits after 6 s. (A peak variable bounded below by the
    budget, so that the first fit would be optimal, left the search stuck
    above it.) Returns FEASIBLE with that plan as the round's hint,
    INFEASIBLE if the peak's bound shows that no plan of the space fits,
    else UNKNOWN; a new lowest-peak plan if it found one; its build time."""
    cap, plan, lowest = model.form.mem_cap, None, None
    peak_model = make_model(ctx, model.depth, model.form.ix.also, fit=True)
    peak_model.hint(start)
    r = solve_model(ctx, peak_model, "fit", limit, stop_at=cap)
    if r.values is not None:
        a = Assignment.from_values(peak_model.form, lambda v: r.values[v.index])
        found = events(peak_model.form, a)
        if peak_model.peak_of(a) <= peak_model.peak_of(start):  # the next round's start: the spaces are nested
            lowest = Lowest(found, int(peak_model.to_bytes(peak_model.peak_of(a))))
        plan = found if r.objective <= cap else None
    hint = from_plan(model.form, plan) if plan is not None else None
    if hint is not None and model.admissible(hint):
        return cp_model.FEASIBLE, hint, lowest, peak_model.build_s
    proven = r.status == cp_model.INFEASIBLE or r.bound > cap
    return (cp_model.INFEASIBLE if proven else cp_model.UNKNOWN), None, lowest, peak_model.build_s


def tie_break(ctx: Context, model: Model, best: Assignment, optimum: int) -> tuple[int | None, Assignment | None]:
    """Fix the primary at its optimum and minimise the other figure (peak
    after overhead, overhead after peak) for at most as long as the optimum
    took (at least 1 s, within the time left). Returns the search's status
    (None: no time to run it) and its assignment (None if nothing was found)."""
    left = min(ctx.left(), max(1.0, ctx.elapsed()))
    if left < 0.05:
        return None, None
    second = add_tie_break(model, optimum)
    second.backend.model.clear_hints()
    second.hint(best)
    r = solve_model(ctx, second, "secondary", left)
    if r.values is None:
        return r.status, None
    return r.status, Assignment.from_values(model.form, lambda v: r.values[v.index])


def whole_bound_of(round_: Round) -> int | None:
    """The full model's bound, which holds for the whole staged space (when
    memory is counted exactly: with sizes rounded up, the model holds only
    some of the plans)."""
    if (round_.depth is None and round_.model.form.memory_exact and round_.searched != cp_model.INFEASIBLE
            and round_.bound is not None and math.isfinite(round_.bound)):
        return math.ceil(round_.bound - 1e-6)
    return None
