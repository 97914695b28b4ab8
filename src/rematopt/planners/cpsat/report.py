"""What a cpsat run claims: the plan of its best assignment and the stats
that say what was proven, in which space (``docs/cpsat.md``, "What OPTIMAL
means"), or the plan from outside the model when the model's space holds
nothing as good."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from ortools.sat.python import cp_model

from ...graph import Graph
from ...plan import Plan
from ...reference import peak_lower_bound, pinned_bound
from ...simulate import Replay, cost_of_counts, simulate
from ...stats import Stats
from .backends import STATUS
from .model import Model
from .bounds import Question, WholeBound
from .search import Context, Round
from .solution import Assignment, events

# The level a proof names for the full model with sizes rounded down (run.rounded_down_proof).
ROUNDED_DOWN = "rounded-down model"
# What ``optimal_in`` and ``infeasible_in`` name: every valid plan under the
# settings, or only the staged space (of the order ``order_from`` names).
ALL_PLANS, STAGED = "all plans", "staged space"


@dataclass(frozen=True)
class Outside:
    """A valid plan from outside the model (the hint, or the best fast
    planner's) that meets the budget and caps, with its replay and primary
    objective (cost units, or bytes): the run returns nothing worse."""

    plan: Plan
    replay: Replay
    objective: float
    name: str


@dataclass(frozen=True)
class Outcome:
    """Everything a run found, for :func:`report`."""

    ctx: Context
    model: Model  # the returned round's (else the last built)
    history: tuple[Round, ...]
    done: Round | None  # the round whose plan is returned (strategy.returned_round)
    best: Assignment | None  # done's best, after the tie-break
    secondary: bool  # whether the tie-break found it
    secondary_status: int | None  # the tie-break search's status (None: not run)
    whole: WholeBound | None  # the gap relaxation
    proofs: tuple[Any, ...]  # run.Proof records
    lower: int | None  # the whole space's lower bound, model integers
    empty: bool  # a relaxation showed the whole space empty
    outside: Outside | None
    hint_source: str | None
    hint_objective: int | None
    lp_bound: float | None
    lp_skipped: str | None  # why the LP was not solved
    built_in_time: bool  # False: the time limit ran out while building a deeper round's model
    build_s: float
    primary_s: float


def no_plan(graph_name: str, status: str, **stats: Any) -> Plan:
    return Plan(graph_name, "cpsat", [], [], Stats.from_dict({"status": status, **stats}))


def report(o: Outcome) -> Plan:
    """The returned plan with its stats (see the module docstring)."""
    ctx, model, g, cfg = o.ctx, o.model, o.ctx.graph, o.ctx.cfg
    chosen = o.done or (o.history[-1] if o.history else None)
    status = chosen.status if chosen is not None else cp_model.UNKNOWN
    bound = chosen.bound if chosen is not None else None
    solved_depth = chosen.depth if chosen is not None else model.depth
    gap_infeasible = o.whole is not None and o.whole.status == "INFEASIBLE"
    if gap_infeasible:
        status = cp_model.INFEASIBLE
    if gap_infeasible or o.empty:
        solved_depth = None
    best, stopped = o.best, ctx.stop.requested
    unproven_empty = False
    if not model.form.memory_exact:
        # sizes rounded up: the model's optimum, bound and emptiness speak of
        # the plans that fit it, not of all plans; only the relaxations and
        # the rounded-down model (sizes rounded down) bound the whole space
        status = cp_model.FEASIBLE if status == cp_model.OPTIMAL else status
        bound = None
        if status == cp_model.INFEASIBLE and not (gap_infeasible or o.empty):
            status, unproven_empty = cp_model.UNKNOWN, True
    rounds = [round_row(r) for r in o.history]
    stats: dict[str, Any] = {
        "status": STATUS.get(status, "UNKNOWN"), "objective_kind": cfg.objective,
        "objective": None, "best_bound": model.to_units(bound) if best is not None and bound is not None else None,
        "gap": None, "time_to_first_s": ctx.trace.first, "time_to_best_s": ctx.trace.best,
        "primary_s": o.primary_s, "variables": model.variables, "constraints": model.constraints,
        "build_s": o.build_s, "recompute_depth": "full" if solved_depth is None else solved_depth,
        "cost_scale": ctx.scale, "cost_scale_exact": ctx.exact, "cost_resolution": ctx.resolution,
        "memory_unit_bytes": model.form.unit, "memory_unit_exact": model.form.memory_exact,
        "offload": cfg.offload, "warm_start": o.hint_source,
        "hint_objective": model.to_units(o.hint_objective) if o.hint_objective is not None else None,
        "interrupted": stopped, "lexicographic": o.secondary,
        # only the primary objective is what OPTIMAL proves; the other figure
        # is proven minimal among its optima only when this says OPTIMAL
        "secondary_status": None if o.secondary_status is None else STATUS.get(o.secondary_status, "UNKNOWN"),
        "rounds": rounds,
    }
    if not o.built_in_time:
        stats["time_limit_reached_while_building"] = True
    if o.whole is not None:
        stats["gap_relaxation"] = {"status": o.whole.status, "seconds": o.whole.seconds,
                                   "bound": None if o.whole.bound is None else model.to_units(o.whole.bound)}
    if o.proofs:
        stats["relaxation_proofs"] = [asdict(p) for p in o.proofs]
    proven_whole = best is not None and o.lower is not None and model.objective_of(best) <= o.lower
    trivial = 0.0 if cfg.objective == "overhead" else float(peak_lower_bound(g))
    restricted = solved_depth is not None and cfg.depth is None
    if restricted:
        # The default asked about the whole staged space, but only a
        # depth-restricted subspace was solved: its optimum and bound say
        # nothing about the whole space; the relaxations' bound does.
        stats.update(space=space_name(model, o.outside), space_status=stats["status"],
                     space_bound=stats["best_bound"], best_bound=None)
        if stats["status"] == "OPTIMAL":
            stats["status"] = "OPTIMAL" if proven_whole else "FEASIBLE"
    else:
        stats["space"] = "staged" if solved_depth is None else space_name(model, o.outside)
    if best is not None and o.lower is not None and (restricted or solved_depth is None):
        # a whole-space bound (the relaxation's, or the trivial one) under
        # the full model's own, whichever is higher
        found = [(model.to_units(o.lower), lower_source(o)),
                 (trivial, "working set" if cfg.objective == "peak" else "trivial")]
        if stats["best_bound"] is not None:
            found.append((stats["best_bound"], "model"))
        stats["best_bound"], stats["bound_by"] = max(found, key=lambda x: x[0])  # ties: the relaxation
        if proven_whole:
            stats["status"] = "OPTIMAL"
    elif restricted and best is not None:
        stats["best_bound"], stats["bound_by"] = trivial, "working set" if cfg.objective == "peak" else "trivial"
    elif stats["best_bound"] is not None:  # no relaxation answered in time: the full model's own bound
        stats["bound_by"] = "model"
    if gap_infeasible:  # no model solved, so no LP of it either
        stats["reason"] = "the gap relaxation of the staged space is infeasible: no staged plan meets the budget"
    elif o.empty:
        what = o.proofs[-1].level
        what = f"the staged model with sizes rounded down to its {model.form.unit:,} B memory unit" \
            if what == ROUNDED_DOWN else f"the {what} relaxation of the staged space"
        stats["reason"] = f"{what} is infeasible: no staged plan meets the budget"
    elif cfg.lp_bound and o.lp_skipped:
        stats["lp_bound"] = None
        stats["lp_bound_skipped"] = o.lp_skipped
    elif cfg.lp_bound:
        stats["lp_bound"] = o.lp_bound
    if best is None:
        if status == cp_model.INFEASIBLE and solved_depth is not None and not gap_infeasible:
            stats["status"] = "UNKNOWN"  # only a restricted space was shown empty
            stats["reason"] = (f"no plan recomputes within {solved_depth} producer hops of each stage's "
                               "node; try --recompute-depth full")
        elif unproven_empty:
            stats["reason"] = (f"no plan of the model, whose sizes are rounded up to its {model.form.unit:,} B "
                               "memory unit, meets the budget, and the time ran out before the sizes rounded "
                               "down decided whether one does")
        elif status == cp_model.UNKNOWN:
            empty = [r["recompute_depth"] for r in rounds
                     if r["status"] == "INFEASIBLE" and r["recompute_depth"] != "full"]
            why = "stopped by Ctrl-C" if stopped else "the time limit ran out"
            where = f" (none recomputes within {max(empty)} producer hops of each stage's node)" if empty else ""
            stats["reason"] = f"{why} before any plan within the budget was found{where}"
        if o.outside is not None:  # the model's space is empty, the budget is not
            lower = None if gap_infeasible or o.empty else whole_units(ctx, model.form.unit, o.lower)
            reason = (f"only the model with sizes rounded down to its {model.form.unit:,} B memory unit holds "
                      "a plan within the budget" if o.outside.name == ROUNDED_DOWN else None)
            return fallback(g.name, o.outside, stats, reason, lower=lower, lower_by=lower_source(o))
        if stats["status"] == "INFEASIBLE":
            stats["proved_by"] = "gaps" if gap_infeasible else o.proofs[-1].level if o.empty else "model"
        return no_plan(g.name, stats["status"], **{k: v for k, v in stats.items() if k != "status"})
    form = model.form
    p = events(form, best)
    counts, peak, moved = best.counts(form), simulate(g, p).peak_bytes, best.transfer_bytes(form)
    # the objective as the plan realises it, not the model's scaled integers
    recompute = cost_of_counts(g, [max(c - 1, 0) for c in counts])
    objective = recompute + moved * cfg.transfer_cost_per_byte if cfg.objective == "overhead" else peak
    if o.outside is not None and o.outside.objective < objective:
        return fallback(g.name, o.outside, stats, f"{o.outside.plan.planner}'s plan, outside the model's space, "
                                                  f"beats the model's best ({objective:.6g})",
                        whole_units(ctx, model.form.unit, o.lower), lower_source(o))
    stats.update(objective=objective, peak_bytes=peak, compute_cost=cost_of_counts(g, counts),
                 transfer_bytes=moved, compute_events=len(best.R), recompute_events=len(best.R) - len(g.compute_ids))
    if restricted and stats["space_bound"] is not None:
        stats["space_bound"] = min(stats["space_bound"], objective)
        stats["space_gap"] = gap(objective, stats["space_bound"])
    if stats["best_bound"] is not None and cfg.objective == "overhead":
        # bounds on rounded costs hold for the true ones up to the rounding
        stats["best_bound"] = max(0.0, stats["best_bound"] - ctx.resolution / 2)
    if stats["best_bound"] is not None:
        b = min(stats["best_bound"], objective)
        stats["best_bound"] = b
        stats["gap"] = gap(objective, b)
    if stats["status"] == "OPTIMAL":
        stats["proved_by"] = stats.get("bound_by", "model")
    return Plan(g.name, "cpsat", p.ops, p.nodes, Stats.from_dict(stats))


def report_unbuilt(ctx: Context, outside: Outside | None, whole: WholeBound, q: Question) -> Plan:
    """The time limit ran out before the first model was built: the plan from
    outside the model if there is one, else no plan; only the gaps
    relaxation (``whole``, of question ``q``) bounds the staged space."""
    stats: dict[str, Any] = {
        "status": "UNKNOWN", "reason": f"the time limit ({ctx.cfg.time_limit:g} s) ran out while building the "
                                       "first model", "objective_kind": ctx.cfg.objective,
        "time_to_first_s": ctx.trace.first, "time_to_best_s": ctx.trace.best, "interrupted": ctx.stop.requested,
        "cost_scale": ctx.scale, "cost_scale_exact": ctx.exact, "cost_resolution": ctx.resolution, "rounds": [],
        "warm_start": None if outside is None else outside.name,
        "gap_relaxation": {"status": whole.status, "seconds": whole.seconds,
                           "bound": None if whole.bound is None else whole_units(ctx, q.unit, whole.bound)}}
    if whole.status == "INFEASIBLE":
        stats.update(status="INFEASIBLE", proved_by="gaps", reason="the gap relaxation of the staged space is "
                                                                   "infeasible: no staged plan meets the budget")
    if outside is not None:
        return fallback(ctx.graph.name, outside, stats, stats["reason"], whole_units(ctx, q.unit, whole.bound), "gaps")
    return no_plan(ctx.graph.name, "UNKNOWN", **{k: v for k, v in stats.items() if k != "status"})


def whole_units(ctx: Context, unit: int, value: int | None) -> float | None:
    """A whole-space bound (model integers) in the objective's units: cost
    units less half the rounding resolution, or bytes."""
    if value is None:
        return None
    if ctx.cfg.objective == "overhead":
        return max(0.0, value / ctx.scale - ctx.resolution / 2)
    return float(value * unit + ctx.graph.persistent_bytes)


def lower_source(o: Outcome) -> str:
    """Which mechanism gave the whole-space lower bound ``o.lower``: the
    gaps relaxation, a chains or slots proof, or the full model."""
    if o.lower is None or (o.whole is not None and o.whole.bound == o.lower):
        return "gaps"
    bound = o.model.to_units(o.lower)
    return next((p.level for p in o.proofs if p.bound == bound), "model")


def round_row(r: Round) -> dict[str, Any]:
    """A round's entry in the ``rounds`` stat."""
    m = r.model
    return {"recompute_depth": "full" if r.depth is None else r.depth, "status": STATUS.get(r.status),
            "objective": None if r.best is None else m.to_units(r.objective),
            "best_bound": None if r.bound is None else m.to_units(r.bound), "variables": m.variables,
            "constraints": m.constraints, "elapsed_s": r.elapsed_s}


def space_name(model: Model, outside: Outside | None) -> str:
    """The plan space a round searched: "staged", "depth 1", or "depth 1 + dtr's plan" once widened."""
    if model.depth is None:
        return "staged"
    return f"depth {model.depth}" + (f" + {outside.plan.planner}'s plan" if model.form.ix.also and outside else "")


def fallback(graph_name: str, outside: Outside, stats: dict[str, Any], reason: str | None = None,
             lower: float | None = None, lower_by: str | None = None) -> Plan:
    """Hand back the plan from outside the model: never less than the hint.
    Marked as such. ``lower`` (objective units, by ``lower_by``) bounds every
    staged plan, so the gap says how much better one could be; the plan
    itself may lie outside that space (greedy's may beat every staged plan).
    The rounded-down model's plan is a staged plan: where it meets the bound
    it is the optimum (OPTIMAL). So is a plan that costs nothing, in any
    space (xla-remat's moves fit some budgets with no recompute at all)."""
    r = outside.replay
    if stats.get("objective_kind") == "overhead" and outside.objective == 0:
        lower, lower_by = 0.0, "zero cost"
    bound = None if lower is None else min(lower, outside.objective)
    proven = (outside.name == ROUNDED_DOWN or lower_by == "zero cost") and bound is not None \
        and bound >= outside.objective
    stats.update(peak_bytes=r.peak_bytes, compute_cost=r.compute_cost, transfer_bytes=r.transfer_bytes,
                 space_status=stats.get("space_status", stats["status"]),
                 status="OPTIMAL" if proven else "FEASIBLE", plan_from=outside.plan.planner,
                 objective=outside.objective, best_bound=bound,
                 gap=None if bound is None else gap(outside.objective, bound),
                 reason=reason or "no plan found in the model's space")
    if bound is not None:
        stats["bound_by"] = lower_by
    if proven:
        stats["proved_by"] = lower_by
    return Plan(graph_name, "cpsat", outside.plan.ops, outside.plan.nodes, Stats.from_dict(stats))


def over_all_plans(graph: Graph, budget: int | None, objective: str, offload: bool, plan: Plan) -> Plan:
    """``plan`` with its status speaking of every valid plan under the run's
    settings. The model, the relaxations and the bisection prove things of
    the staged space only, and plans outside it exist (a plan cleaned of
    unread computations, one that computes in another order, or a node twice
    in a stage): the 14-node fuzz case's staged optimum costs 6 where dtr's
    cleaned plan costs 2. So ``OPTIMAL`` stands only where a bound that holds
    for every plan reaches the plan (``zero cost``: it recomputes and moves
    nothing; or :func:`no_plan_peaks_below` its peak), ``INFEASIBLE`` only
    where that bound passes the budget; a staged-space verdict becomes
    ``FEASIBLE`` (a plan) or ``UNKNOWN`` (none), and ``optimal_in`` /
    ``infeasible_in`` say where a claim holds: "all plans" or "staged space"."""
    st = dict(plan.stats)
    staged = st["status"]
    if staged in ("OPTIMAL", "INFEASIBLE"):
        st["optimal_in" if staged == "OPTIMAL" else "infeasible_in"] = STAGED
    if st.get("peak_bytes") is not None:
        universal = (("zero cost" if st.get("objective") == 0 else None) if objective == "overhead" else
                     no_plan_peaks_below(graph, offload, st["peak_bytes"]))
        if universal is not None:
            st.update(status="OPTIMAL", optimal_in=ALL_PLANS, proved_by=universal, bound_by=universal,
                      best_bound=st["peak_bytes"] if objective == "peak" else 0.0, gap=0.0)
        elif staged == "OPTIMAL":
            st["status"] = "FEASIBLE"
    elif staged == "INFEASIBLE":
        by = None if budget is None else no_plan_peaks_below(graph, offload, budget + 1)
        if by is None:
            st["status"] = "UNKNOWN"
        else:
            st.update(status="INFEASIBLE", infeasible_in=ALL_PLANS, proved_by=by,
                      reason=f"no plan meets the budget: every plan holds {pinned_bound(graph, offload):,} bytes "
                             "at once (a node's working set, with the values that cannot be made again and are "
                             "read later)")
    plan.stats = Stats.from_dict(st)
    return plan


def no_plan_peaks_below(graph: Graph, offload: bool, peak: int) -> str | None:
    """What shows that no valid plan peaks below ``peak`` bytes, if anything:
    the working-set bound, or the pinned values' (:func:`~rematopt.reference.pinned_bound`)."""
    if peak <= peak_lower_bound(graph):
        return "working set"
    return "pinned values" if peak <= pinned_bound(graph, offload) else None


def gap(objective: float, bound: float) -> float:
    return 0.0 if objective == bound else (objective - bound) / abs(objective)
