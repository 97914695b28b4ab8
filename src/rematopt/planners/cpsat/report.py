"""What a cpsat run claims: the plan of its best assignment and the stats
that say what was proven, in which space (``docs/cpsat.md``, "What OPTIMAL
means"), or the plan from outside the model when the model's space holds
nothing as good."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from ...graph import Graph
from ...plan import Plan
from ...reference import peak_lower_bound, pinned_bound
from ...simulate import Replay, cost_of_counts, simulate
from ...stats import Stats
from ..staged.backends import STATUS
from ..staged.bounds import Question, WholeBound
from ..staged.model import Model
from ..staged.solution import Assignment, events
from ..staged.units import objective_units
from . import verdict
from .search import Context, Round
from .verdict import Bound, Source, gap, reaching



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
    best, stopped = o.best, ctx.stop.requested
    gap_infeasible = o.whole is not None and o.whole.status == "INFEASIBLE"
    proven_whole = best is not None and o.lower is not None and model.objective_of(best) <= o.lower
    claim = verdict.staged(STATUS.get(chosen.status, "UNKNOWN") if chosen is not None else "UNKNOWN",
                           chosen.depth if chosen is not None else model.depth, gaps_empty=gap_infeasible,
                           shown_empty=o.empty, memory_exact=model.form.memory_exact, automatic=cfg.depth is None,
                           has_plan=best is not None, proven_whole=proven_whole)
    solved_depth, restricted = claim.depth, claim.restricted
    # the rounds' own bound, of the space they solved (with sizes rounded up, of no space)
    own = (model.to_units(chosen.bound) if best is not None and chosen.bound is not None
           and model.form.memory_exact else None)
    rounds = [round_row(r) for r in o.history]
    stats: dict[str, Any] = {
        "status": claim.status, "objective_kind": cfg.objective,
        "objective": None, "best_bound": None,
        "gap": None, "time_to_first_s": ctx.trace.first, "time_to_best_s": ctx.trace.best,
        "primary_s": o.primary_s, "variables": model.variables, "constraints": model.constraints,
        "build_s": o.build_s, "recompute_depth": "full" if solved_depth is None else solved_depth,
        "cost_scale": ctx.cost.scale, "cost_scale_exact": ctx.cost.exact, "cost_resolution": ctx.cost.resolution,
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
    trivial = (Bound(0.0, Source.TRIVIAL) if cfg.objective == "overhead"
               else Bound(float(peak_lower_bound(g)), Source.WORKING_SET))
    if restricted:  # its optimum and bound say nothing about the whole space; the relaxations' bound does
        stats.update(space=space_name(model, o.outside), space_status=claim.space_status, space_bound=own)
    else:
        stats["space"] = "staged" if solved_depth is None else space_name(model, o.outside)
    bounds: list[Bound] = []
    if best is not None and o.lower is not None and (restricted or solved_depth is None):
        # a whole-space bound (the relaxation's, or the trivial one) under
        # the full model's own, whichever is higher (ties: the relaxation)
        bounds = [Bound(model.to_units(o.lower), lower_source(o)), trivial]
        if not restricted and own is not None:
            bounds.append(Bound(own, Source.MODEL))
    elif restricted and best is not None:
        bounds = [trivial]
    elif own is not None:  # no relaxation answered in time: the full model's own bound
        bounds = [Bound(own, Source.MODEL)]
    if gap_infeasible:  # no model solved, so no LP of it either
        stats["reason"] = "the gap relaxation of the staged space is infeasible: no staged plan meets the budget"
    elif o.empty:
        what = o.proofs[-1].level
        what = f"the staged model with sizes rounded down to its {model.form.unit:,} B memory unit" \
            if what == Source.ROUNDED_DOWN else f"the {what} relaxation of the staged space"
        stats["reason"] = f"{what} is infeasible: no staged plan meets the budget"
    elif cfg.lp_bound and o.lp_skipped:
        stats["lp_bound"] = None
        stats["lp_bound_skipped"] = o.lp_skipped
    elif cfg.lp_bound:
        stats["lp_bound"] = o.lp_bound
    if best is None:
        if claim.restricted_empty:
            stats["reason"] = (f"no plan recomputes within {solved_depth} producer hops of each stage's "
                               "node; try --recompute-depth full")
        elif claim.unproven_empty:
            stats["reason"] = (f"no plan of the model, whose sizes are rounded up to its {model.form.unit:,} B "
                               "memory unit, meets the budget, and the time ran out before the sizes rounded "
                               "down decided whether one does")
        elif claim.status == "UNKNOWN":
            empty = [r["recompute_depth"] for r in rounds
                     if r["status"] == "INFEASIBLE" and r["recompute_depth"] != "full"]
            why = "stopped by Ctrl-C" if stopped else "the time limit ran out"
            where = f" (none recomputes within {max(empty)} producer hops of each stage's node)" if empty else ""
            stats["reason"] = f"{why} before any plan within the budget was found{where}"
        if o.outside is not None:  # the model's space is empty, the budget is not
            lower = None if gap_infeasible or o.empty else whole_units(ctx, model.form.unit, o.lower)
            reason = (f"only the model with sizes rounded down to its {model.form.unit:,} B memory unit holds "
                      "a plan within the budget" if o.outside.name == Source.ROUNDED_DOWN else None)
            return fallback(g.name, o.outside, stats, reason, lower=lower, lower_by=lower_source(o))
        if stats["status"] == "INFEASIBLE":
            stats["proved_by"] = (Source.GAPS if gap_infeasible else o.proofs[-1].level if o.empty
                                  else Source.MODEL).value
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
    top = max(bounds, key=lambda b: b.value, default=None)  # ties: the first
    if top is not None and cfg.objective == "overhead":
        # bounds on rounded costs hold for the true ones up to the rounding
        top = Bound(max(0.0, top.value - ctx.cost.resolution / 2), top.source)
    proved = (top.source if top is not None else Source.MODEL) if stats["status"] == "OPTIMAL" else None
    stats.update(verdict.verdict(objective, [top] if top is not None else [], proved).stats())
    return Plan(g.name, "cpsat", p.ops, p.nodes, Stats.from_dict(stats))


def report_unbuilt(ctx: Context, outside: Outside | None, whole: WholeBound, q: Question) -> Plan:
    """The time limit ran out before the first model was built: the plan from
    outside the model if there is one, else no plan; only the gaps
    relaxation (``whole``, of question ``q``) bounds the staged space."""
    stats: dict[str, Any] = {
        "status": "UNKNOWN", "reason": f"the time limit ({ctx.cfg.time_limit:g} s) ran out while building the "
                                       "first model", "objective_kind": ctx.cfg.objective,
        "time_to_first_s": ctx.trace.first, "time_to_best_s": ctx.trace.best, "interrupted": ctx.stop.requested,
        "cost_scale": ctx.cost.scale, "cost_scale_exact": ctx.cost.exact, "cost_resolution": ctx.cost.resolution, "rounds": [],
        "warm_start": None if outside is None else outside.name,
        "gap_relaxation": {"status": whole.status, "seconds": whole.seconds,
                           "bound": None if whole.bound is None else whole_units(ctx, q.unit, whole.bound)}}
    if whole.status == "INFEASIBLE":
        stats.update(status="INFEASIBLE", proved_by=Source.GAPS.value,
                     reason="the gap relaxation of the staged space is infeasible: no staged plan meets the budget")
    if outside is not None:
        return fallback(ctx.graph.name, outside, stats, stats["reason"], whole_units(ctx, q.unit, whole.bound),
                        Source.GAPS)
    return no_plan(ctx.graph.name, "UNKNOWN", **{k: v for k, v in stats.items() if k != "status"})


def whole_units(ctx: Context, unit: int, value: int | None) -> float | None:
    """A whole-space bound (model integers) in the run's objective's units
    (:func:`..staged.units.objective_units`)."""
    return objective_units(ctx.graph, ctx.cfg.objective, ctx.cost, unit, value)


def lower_source(o: Outcome) -> Source:
    """Which mechanism gave the whole-space lower bound ``o.lower``: the
    gaps relaxation, a chains or slots proof, or the full model."""
    if o.lower is None or (o.whole is not None and o.whole.bound == o.lower):
        return Source.GAPS
    bound = o.model.to_units(o.lower)
    return next((p.level for p in o.proofs if p.bound == bound), Source.MODEL)


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
             lower: float | None = None, lower_by: Source | None = None) -> Plan:
    """Hand back the plan from outside the model: never less than the hint.
    Marked as such. ``lower`` (objective units, by ``lower_by``) bounds every
    staged plan, so the gap says how much better one could be; the plan
    itself may lie outside that space (greedy's may beat every staged plan).
    The rounded-down model's plan is a staged plan: where it meets the bound
    it is the optimum (OPTIMAL). So is a plan that costs nothing, in any
    space (xla-remat's moves fit some budgets with no recompute at all)."""
    r = outside.replay
    bound = None if lower is None else Bound(lower, lower_by)
    if stats.get("objective_kind") == "overhead" and outside.objective == 0:
        bound = Bound(0.0, Source.ZERO_COST)
    proved = reaching(outside.objective, bound,
                      outside.name == Source.ROUNDED_DOWN or (bound is not None and bound.source == Source.ZERO_COST))
    stats.update(peak_bytes=r.peak_bytes, compute_cost=r.compute_cost, transfer_bytes=r.transfer_bytes,
                 space_status=stats.get("space_status", stats["status"]), plan_from=outside.plan.planner,
                 objective=outside.objective, reason=reason or "no plan found in the model's space")
    stats.update(verdict.verdict(outside.objective, [bound] if bound is not None else [], proved).stats())
    return Plan(graph_name, "cpsat", outside.plan.ops, outside.plan.nodes, Stats.from_dict(stats))


def over_all_plans(graph: Graph, budget: int | None, objective: str, offload: bool, plan: Plan) -> Plan:
    """``plan`` with its status speaking of every valid plan under the run's
    settings (:func:`.verdict.over_all_plans`), from the bounds every plan
    obeys: ``zero cost`` (a plan that recomputes and moves nothing), and
    :func:`no_plan_peaks_below` a peak, which proves a plan at it optimal and
    a budget below it infeasible."""
    st = plan.stats
    universal = None
    if st.get("peak_bytes") is not None:
        if objective == "overhead":
            universal = Bound(0.0, Source.ZERO_COST) if st.get("objective") == 0 else None
        else:
            by = no_plan_peaks_below(graph, offload, st["peak_bytes"])
            universal = None if by is None else Bound(st["peak_bytes"], by)
    by = None if budget is None else no_plan_peaks_below(graph, offload, budget + 1)
    empty_below = None if by is None else Bound(pinned_bound(graph, offload), by)
    plan.stats = Stats.from_dict(verdict.over_all_plans(dict(st), universal, empty_below))
    return plan


def no_plan_peaks_below(graph: Graph, offload: bool, peak: int) -> Source | None:
    """What shows that no valid plan peaks below ``peak`` bytes, if anything:
    the working-set bound, or the pinned values' (:func:`~rematopt.reference.pinned_bound`)."""
    if peak <= peak_lower_bound(graph):
        return Source.WORKING_SET
    return Source.PINNED_VALUES if peak <= pinned_bound(graph, offload) else None
