"""One cpsat solve from start to plan: the plan from outside the model (the
hint, or the best fast planner's), the warm start, the rounds that
:mod:`strategy` chooses, the relaxations that bound the whole staged space,
the tie-break, and the report (:mod:`report`)."""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from ortools.sat.python import cp_model

from ...errors import PlannerError
from ...graph import Graph
from ...plan import Plan
from ...reference import no_remat_peak, peak_lower_bound
from ...simulate import Replay, simulate
from ...stats import Stats
from ..meter import Meter, metered, now, past
from ..staged.backends import STATUS, LpBackend
from ..staged.bounds import AFTER, BOUNDS, PROOFS, Question, WholeBound, ask
from ..staged.limits import Limits
from ..staged.model import Model, OutOfTime
from ..staged.order import search_order
from ..staged.solution import Assignment, events, from_plan, plan_pairs
from ..staged.stages import Stages
from ..staged.units import cost_scale
from . import lns, peak
from .clock import Clock
from .report import Outcome, Outside, over_all_plans, report, report_unbuilt, whole_units
from .search import Context, Lowest, Round, make_model, solve_model, solve_round, tie_break, whole_bound_of
from .settings import Settings, max_recomputes
from .signals import Interrupt, Trace, deferred_sigint
from .strategy import (DONE, may_start, next_depth, proof_time, returned_round, should_widen,
                       wants_emptiness_proof, wants_optimality_proof)
from .verdict import Bound, Source, reaching, verdict
from .warm_start import (FIRST, MODEL_MAX_NODES, best_within, evicted_plan, fast_planners, fast_plans,
                         lowest_peak, staged_eviction, warm_start_share, without_dead)

# Bisection steps of the peak objective's budget sweep (:func:`budget_sweep`).
SWEEP_STEPS = 8
# "Any plan at all" to a relaxation proof: an objective no plan reaches.
ANY_PLAN = 2**60
# Building the LP of a bigger model takes longer than its bound is worth
# (about 20 s on the 2,090-node decoder's depth-1 model).
LP_MAX_VARIABLES = 40_000


@dataclass(frozen=True)
class Proof:
    """One relaxation asked whether any staged plan beats ``below`` (units;
    None: whether any plan meets the budget at all)."""

    level: Source
    below: float | None
    status: str
    seconds: float
    elapsed_s: float
    bound: float | None  # units


def run(graph: Graph, cfg: Settings) -> Plan:
    """Solve with Ctrl-C deferred: during the search CP-SAT stops itself and
    hands back its best solution; elsewhere (warm start, building a round's
    model) a SIGINT only marks the run stopped, and the run ends at the next
    checkpoint with the best plan so far. The time is read from a
    :class:`~..meter.Meter`: with ``deterministic_time``, the deterministic
    time of the run's CP-SAT solves, the wall clock only its outer bound;
    the plan's ``stopped_by`` says which limit ended the run (:func:`limits`)."""
    m = Meter() if cfg.deterministic_time is None else Meter(cfg.deterministic_time,
                                                             time.perf_counter() + cfg.time_limit)
    with metered(m):
        ctx = context(graph, cfg)
        with deferred_sigint(ctx.stop):
            if cfg.objective == "peak":  # the rounds, then the bisection that proves the peak
                plan = peak.run(ctx, _run, admit)
            else:
                plan = bounded(ctx)
    plan = over_all_plans(graph, cfg.budget, cfg.objective, cfg.offload, plan)
    plan.stats = plan.stats.with_details(**limits(cfg, m, ctx.stop.requested, plan.stats))
    return plan


def limits(cfg: Settings, m: Meter, interrupted: bool, st: Stats) -> dict[str, Any]:
    """The plan's record of its limits: the limits the run had, the deterministic time
    it spent, and which ended it (``stopped_by``: ``time_limit``,
    ``deterministic_time``, ``interrupt``, or None where it proved its
    answer first, over every plan or over the staged space: ``optimal_in``,
    ``infeasible_in``); ``deterministic``: whether the run is the one
    ``deterministic_time`` makes on any load (not when the wall clock cut it)."""
    proven = st["status"] in ("OPTIMAL", "INFEASIBLE") or bool(st.get("optimal_in") or st.get("infeasible_in"))
    if interrupted:
        by = "interrupt"
    elif m.wall_ran_out or (not m.deterministic and not proven):
        by = "time_limit"
    else:
        by = None if proven else "deterministic_time"
    return {"time_limit": cfg.time_limit, "deterministic_time": cfg.deterministic_time,
            "deterministic_spent": round(m.spent, 3) if m.deterministic else None, "stopped_by": by,
            "deterministic": m.deterministic and not m.wall_ran_out and not interrupted}


def bounded(ctx: Context) -> Plan:
    """The overhead run: the outside plan, the order of the staged space
    (:func:`.order.search_order`: the program's, or on large graphs the
    outside plan's when it moves computations), the rounds, then the bounds asked after them
    (:data:`bounds.AFTER`) in the time they leave, which is at least
    ``after_share`` of the limit where the automatic rounds cannot search the
    whole staged space (more than ``full_model_pairs`` pairs): their bound, not
    the rounds' search, is what closes the gap there. Each bound that beats the run's
    raises ``best_bound`` (``bound_by``), and one that reaches the model's
    plan proves it optimal."""
    cfg, t = ctx.cfg, ctx.tuning
    big = cfg.depth is None and ctx.full.count_pairs() > t.full_model_pairs
    rounds = replace(ctx, clock=ctx.clock.until(ctx.clock.end - (t.after_share * ctx.clock.limit if big else 0.0)))
    found = outside_plan(rounds, rounds.clock.at(warm_start_share(ctx.graph, t)))
    ordered = search_order(ctx.graph, found[0].plan if found[0] is not None else None, t.reorder_min_nodes)
    if ordered is not None and not ctx.stop.requested:  # the rounds and the bounds in the outside plan's order
        ctx = replace(context(ordered, cfg), clock=ctx.clock, trace=ctx.trace, stop=ctx.stop)
        rounds = replace(ctx, clock=rounds.clock)
    plan = _run(rounds, found)
    if ordered is not None:
        plan.stats = Stats.from_dict({**plan.stats, "order_from": found[0].name})
    st = plan.stats
    if ctx.stop.requested or st["status"] in ("OPTIMAL", "INFEASIBLE") or st.get("gap") == 0 or ctx.left() < t.min_after_s:
        return plan
    q = run_question(ctx)
    found = dict(st)
    for level in AFTER:
        r = relaxation(ctx, q, level, ctx.left() - 0.1)
        proof = Proof(Source(level), None, r.status, r.seconds, ctx.elapsed(), whole_units(ctx, q.unit, r.bound))
        found["relaxation_proofs"] = [*found.get("relaxation_proofs", []), asdict(proof)]
        objective = found.get("objective")
        if r.status == "INFEASIBLE" and objective is None:  # no staged plan meets the budget
            found.update(status="INFEASIBLE", proved_by=proof.level.value, reason=f"the {level} relaxation of the "
                                                                                  "staged space is infeasible: no "
                                                                                  "staged plan meets the budget")
            break
        if objective is None or proof.bound is None or proof.bound <= (found.get("best_bound") or 0.0):
            continue
        bound = Bound(proof.bound, proof.level)  # above the run's: it decides (a plan from outside stays unproven)
        found.update(verdict(objective, [bound], reaching(objective, bound, not found.get("plan_from"))).stats())
        if found["status"] == "OPTIMAL":
            break
    plan.stats = Stats.from_dict(found)
    return plan


def context(graph: Graph, cfg: Settings) -> Context:
    """What every round of a solve starting now shares: the full staged
    space and the cost scale (:func:`..staged.units.cost_scale`); its clock
    is the run's meter's (deterministic seconds, with ``deterministic_time``)."""
    clock = Clock.starting_now(cfg.time_limit if cfg.deterministic_time is None else cfg.deterministic_time)
    full = Stages(graph, cfg.offload)
    return Context(graph, cfg, cost_scale(graph, full, cfg.transfer_cost_per_byte), full, clock,
                   Trace(time.perf_counter()), Interrupt())


def outside_plan(ctx: Context, deadline: float) -> tuple[Outside | None, Lowest | None]:
    """The user's hint, else (``warm_start="auto"``) the fast planners' plan
    that is best by the run's objective among those that honour every
    setting (:func:`admit`): it stands in when the model's space yields
    nothing or only worse. And whatever the budget, the valid plan with the
    lowest peak among them (where the peak search starts)."""
    cfg, g = ctx.cfg, ctx.graph
    plans: list[tuple[Plan, Replay]] = []
    if cfg.hint is not None:
        replay = simulate(g, cfg.hint)
        if not replay.valid:  # a plan of another graph, say: refused, not silently dropped
            raise PlannerError(f"cpsat: the hint (a plan for {cfg.hint.graph!r}) does not replay on "
                               f"{g.name!r}: {replay.error}")
        plans = [(cfg.hint, replay)]
    elif cfg.warm_start == "auto":
        def on_record(plan: Plan, r: Replay) -> None:  # a plan to return from the moment it exists
            o = admit(ctx, plan, r, plan.planner)
            if o is not None:
                ctx.trace.solution("primary", o.objective, None)

        plans = heuristic_plans(ctx, deadline=deadline, on_plan=on_record)
        plans += without_dead(g, [p for p, _ in plans])
    name = "hint" if cfg.hint is not None else None
    if cfg.hint is None and cfg.warm_start == "auto":  # nothing to search from otherwise: more time than the share
        plans += looser_budgets(ctx, plans, deadline=ctx.clock.at(ctx.tuning.eviction_share))
        plans += deeper_eviction(ctx, plans, ctx.clock.at(ctx.tuning.eviction_share))
    low = lowest_peak(plans)
    lowest = None if low is None else Lowest(low[0], low[1].peak_bytes)
    outside = best_admitted(ctx, plans, name)
    if outside is None:
        return None, lowest
    # the run returns nothing worse from here on, even when the plan does not
    # fit the model's space (time_to_first_s counts it)
    if cfg.hint is not None:
        ctx.trace.solution("primary", outside.objective, None)
    return outside, lowest


def without_first_plan(ctx: Context, plans: list[tuple[Plan, Replay]]) -> bool:
    """Overhead objective under a budget, where none of ``plans`` is admitted: the
    run has no plan to return or to search from (:func:`looser_budgets`,
    :func:`deeper_eviction`)."""
    cfg = ctx.cfg
    return cfg.objective == "overhead" and cfg.budget is not None and \
        not any(admit(ctx, p, r, p.planner) for p, r in plans)


def deeper_eviction(ctx: Context, plans: list[tuple[Plan, Replay]], deadline: float) -> list[tuple[Plan, Replay]]:
    """Staged eviction in a deeper space than the first round's, when no
    fast planner's plan is admitted under the budget (overhead objective):
    a first plan there is one the widened round can search from."""
    cfg, g = ctx.cfg, ctx.graph
    if not without_first_plan(ctx, plans):
        return []
    plan = evicted_plan(g, cfg.budget, deadline)
    if plan is None:
        return []
    replay = simulate(g, plan)
    if replay.valid and admit(ctx, plan, replay, plan.planner) is not None:
        ctx.trace.solution("primary", replay.recompute_cost, None)
        return [(plan, replay)]
    return []


def heuristic_plans(ctx: Context, **kw: Any) -> list[tuple[Plan, Replay]]:
    """The fast planners' plans at the run's budget; for the peak objective
    also at the lowest budget there is (the working-set bound), where they
    cut the peak hardest: greedy asked for 88 GB gave a lower peak than the
    peak-mode optimum a 116 GB budget ran at, but none asked for 116 GB."""
    g, cfg = ctx.graph, ctx.cfg
    if cfg.objective != "peak":
        return fast_plans(g, cfg.budget, **kw)
    # the quick planners first (the others take 20 s on the decoder), and the
    # working-set bound last: dtr evicts slowest there
    ends = (cfg.budget, peak_lower_bound(g))
    plans = fast_plans(g, cfg.budget, planners=FIRST, **kw)
    plans += budget_sweep(ctx, plans, **kw)
    plans += fast_plans(g, ends[1], planners=FIRST, **kw)
    rest = [n for n in fast_planners() if n not in FIRST]
    return plans + [x for b in ends for x in fast_plans(g, b, planners=rest, **kw)]


# Budgets a little above the run's, as shares of it, at which the quick planners try again (looser_budgets):
# the loosest first, where dtr evicts least (near a budget it cannot meet it thrashes: flax_linen's step on
# JAX 0.11, 1.86 s at the budget, 0.01 s at 1.1 of it).
LOOSER = (1.15, 1.1, 1.08, 1.05, 1.02)


def looser_budgets(ctx: Context, plans: list[tuple[Plan, Replay]], deadline: float) -> list[tuple[Plan, Replay]]:
    """Overhead objective, where no fast planner's plan is admitted at the
    run's budget: the quick planners (FIRST) asked for a little more
    (:data:`LOOSER`, up to the first share that yields one), keeping the
    plans admitted at the run's budget. dtr evicts once memory passes its
    budget and can end over it; asked for more it evicts elsewhere and can
    end under: flax_linen's step traced on JAX 0.11 at 0.7 of its no-remat
    peak (81,051 B), 97,292 B from dtr at the budget and at 1.02 of it,
    under it at 1.08 and 1.1, where cpsat on one worker had found no plan in
    3 s."""
    cfg, g = ctx.cfg, ctx.graph
    if not without_first_plan(ctx, plans):
        return []
    for share in LOOSER:
        found = [(p, r) for p, r in fast_plans(g, int(cfg.budget * share), planners=FIRST, deadline=deadline)
                 if admit(ctx, p, r, p.planner)]
        if found:
            return found
    return []


def budget_sweep(ctx: Context, plans: list[tuple[Plan, Replay]], deadline: float | None = None,
                 **kw: Any) -> list[tuple[Plan, Replay]]:
    """Peak objective: the quick planners (FIRST) bisected over budgets, from
    the lowest admitted peak of ``plans`` down to the working-set bound, for
    the lowest budget at which one's plan is admitted (within the overhead
    cap). Under a cap, the plans at the two ends are the no-remat peak or
    over the cap: on the 9,652-node decoder at 10%, dtr at 0.8 of the
    no-remat peak costs 5.8%, where the rounds found nothing below the
    no-remat peak in 30 s."""
    g = ctx.graph
    lo = peak_lower_bound(g)
    hi = min((r.peak_bytes for p, r in plans if admit(ctx, p, r, p.planner)), default=no_remat_peak(g))
    found: list[tuple[Plan, Replay]] = []
    for step in range(SWEEP_STEPS):
        mid = (lo + hi) // 2
        at = now()
        if mid <= lo or (deadline is not None and past(deadline)):
            break
        # each step gets its share of what is left (half of it kept for the rest)
        share = None if deadline is None else at + (deadline - at) / (2 * (SWEEP_STEPS - step))
        got = fast_plans(g, mid, deadline=share, planners=FIRST, **kw)
        found += got
        fits = [r.peak_bytes for p, r in got if r.peak_bytes <= mid and admit(ctx, p, r, p.planner)]
        hi, lo = (min(fits), lo) if fits else (hi, mid)
    return found


def best_admitted(ctx: Context, plans: list[tuple[Plan, Replay]], name: str | None = None) -> Outside | None:
    """The plan best by the run's own objective among those that honour every
    setting (:func:`admit`), named ``name`` (default: its planner's name):
    a peak run must never return a higher peak than a fast planner's plan
    within its caps, nor an overhead run a costlier one."""
    admitted = [(o, o.replay) for o in (admit(ctx, p, r, name or p.planner) for p, r in plans) if o is not None]
    best = best_within(admitted, None, by_peak=ctx.cfg.objective == "peak")
    return None if best is None else best[0]


def admit(ctx: Context, plan: Plan, r: Replay, name: str) -> Outside | None:
    """``plan`` with its replay and primary objective, if it is valid and
    honours every setting: the budget, offload (none unless allowed), the
    clone bound and the overhead cap."""
    cfg, n = ctx.cfg, len(ctx.graph.compute_ids)
    overhead = r.recompute_cost + r.transfer_bytes * cfg.transfer_cost_per_byte
    limits = Limits(cfg.budget, max_recomputes(cfg, n), None if cfg.max_overhead is None
                    else cfg.max_overhead * r.base_cost, cfg.offload)
    if r.valid and limits.admit(r.peak_bytes, r.compute_events - n, overhead, r.transfer_bytes):
        return Outside(plan, r, overhead if cfg.objective == "overhead" else float(r.peak_bytes), name)
    return None


def warm_start(ctx: Context, model: Model, outside: Outside | None, spent: float
               ) -> tuple[Assignment | None, str | None]:
    """The hint: the better of the outside plan, projected into the model's
    plan space, and staged eviction (slow on big models, so it stops at a
    deadline: the warm start's share of the time limit, less ``spent``).
    Only assignments that meet the budget and caps count."""
    found: list[tuple[int, str, Assignment]] = []

    def consider(a: Assignment | None, name: str) -> None:
        if a is not None and model.admissible(a):
            found.append((model.objective_of(a), name, a))
            ctx.trace.solution("primary", model.to_units(found[-1][0]), None)

    deadline = now() + warm_start_share(ctx.graph, ctx.tuning) * ctx.clock.limit - spent
    if outside is not None:
        consider(from_plan(model.form, outside.plan), outside.name)
    # its deadline is checked between rounds, and one round took 3 minutes on
    # the 84,084-node decoder (a limit of 120 s ended at 279 s)
    if (ctx.cfg.hint is not None or ctx.cfg.warm_start == "auto") and ctx.graph.n < MODEL_MAX_NODES:
        consider(staged_eviction(model.form, deadline=deadline), "staged-eviction")
    if not found:
        return None, None
    _, name, a = min(found, key=lambda x: x[0])
    return a, name


def cleaned(ctx: Context, plan: Plan, outside: Outside | None) -> Outside | None:
    """The better of ``outside`` and the model's plan ``plan`` without its
    unread computations (:mod:`..dead_code`, named ``cpsat+dce``): a staged
    plan computes a value at its stage even when nothing reads it before it
    is freed (random_layered_n1000 at 0.8: 4.80% with them, 3.06% without;
    n250: 4.60% and 3.04%). Without them the plan lies outside the staged
    space, so the report returns it as an outside plan that beats the
    model's best: FEASIBLE, the bounds still those of the staged space (its
    gap then says how much cheaper any staged plan could be). Asked of a
    staged optimum too: its proof does not cover the cleaned plan."""
    found = best_admitted(ctx, without_dead(ctx.graph, [plan]))
    return found if found is not None and (outside is None or found.objective < outside.objective) else outside


def run_question(ctx: Context) -> Question:
    """What the relaxations of the run are asked: its objective under its
    budget (the peak objective: under the no-remat peak)."""
    cfg = ctx.cfg
    return ctx.question(cfg.objective, cfg.budget if cfg.budget is not None else no_remat_peak(ctx.graph))


def relaxation(ctx: Context, q: Question, level: str, limit: float, below: int | None = None) -> WholeBound:
    """The bound ``level`` (:data:`bounds.BOUNDS`) of ``q``; Ctrl-C stops it
    unless it is asked up front (a SIGINT there waits for the next checkpoint)."""
    cfg = ctx.cfg
    r = ask(ctx.graph, q, level, below=below, time_limit=limit, workers=cfg.workers, seed=cfg.seed,
            interruptible=not BOUNDS[level].up_front, ix=ctx.full)
    if r.interrupted:
        ctx.stop.requested = True
    return r


def relaxation_proof(ctx: Context, q: Question, model: Model, best: Assignment | None, lower: int | None,
                     proof_s: float) -> tuple[list[Proof], int | None, bool]:
    """Ask the stronger relaxations in turn (chains, then slots) whether any
    staged plan beats ``best``; if none does, ``best`` is optimal over the
    whole space. Without ``best``, whether any staged plan meets the budget at
    all (the 108-node MLP at 0.9: chains shows it empty in 0.02 s, after
    depth 1; the full model took 8 s). Returns the attempts, the whole-space
    lower bound raised by what they prove, and whether the space is empty."""
    obj = model.objective_of(best) if best is not None else ANY_PLAN + 1
    deadline = now() + proof_time(ctx.elapsed(), ctx.clock.limit, proof_s, ctx.tuning)
    attempts: list[Proof] = []
    empty = False
    for level in PROOFS:
        left = deadline - now()
        proven = best is not None and lower is not None and obj <= lower
        if ctx.stop.requested or proven or empty or left < 0.05:
            break
        r = relaxation(ctx, q, level, left, below=obj - 1)
        if best is None:
            empty = r.status == "INFEASIBLE"
            attempts.append(Proof(Source(level), None, r.status, r.seconds, ctx.elapsed(), None))
            continue
        found = obj if r.status == "INFEASIBLE" else r.bound
        if found is not None:
            lower = max(lower or 0, min(found, obj))
        attempts.append(Proof(Source(level), model.to_units(obj - 1), r.status, r.seconds, ctx.elapsed(),
                              None if found is None else model.to_units(min(found, obj))))
    return attempts, lower, empty


def rounded_down_proof(ctx: Context, done: Round | None, lower: int | None, outside: Outside | None
                       ) -> tuple[Proof | None, int | None, bool, Outside | None]:
    """Where the memory unit is not exact, the rounds' model counts sizes
    rounded up: its plans fit the true budget, but its INFEASIBLE and its
    bound say nothing of the plans that fit only by the bytes rounded away
    (a 6-node graph of ~10^11 B sizes at a 2 B unit: INFEASIBLE at a budget
    a plan meets exactly). The full model with sizes rounded down holds
    every true plan, so its INFEASIBLE shows the whole space empty and its
    bound bounds it; a solution of it that replays within every setting is
    a plan. Solved in the time left, from the returned round's plan. Returns
    the attempt, the lower bound raised by it, whether the space is empty,
    and the better of ``outside`` and the plan it found."""
    try:
        down = make_model(ctx, None, None, round_down=True)
    except OutOfTime:
        return None, lower, False, outside
    if done is not None and done.best is not None:
        hint = from_plan(down.form, events(done.model.form, done.best))
        if hint is not None and down.admissible(hint):
            down.hint(hint)
    began = now()
    r = solve_model(ctx, down, "rounded-down", ctx.left())
    empty = r.status == cp_model.INFEASIBLE
    bound = None
    if not empty and r.bound is not None and math.isfinite(r.bound) and r.status != cp_model.UNKNOWN:
        bound = math.ceil(r.bound - 1e-6)
        lower = bound if lower is None else max(lower, bound)
    if r.values is not None:
        plan = events(down.form, Assignment.from_values(down.form, lambda v: r.values[v.index]))
        found = admit(ctx, plan, simulate(ctx.graph, plan), Source.ROUNDED_DOWN.value)
        if found is not None and (outside is None or found.objective < outside.objective):
            outside = found
    proof = Proof(Source.ROUNDED_DOWN, None, STATUS.get(r.status, "UNKNOWN"), now() - began,
                  ctx.elapsed(), None if bound is None else down.to_units(bound))
    return proof, lower, empty, outside


def lp_bound(ctx: Context, depth: int | None, also: dict[int, set[int]] | None, limit: float) -> float | None:
    """The LP relaxation of the same formulation, in the objective's units."""
    overhead = ctx.cfg.objective == "overhead"
    lp = make_model(ctx, depth, also, backend=LpBackend(ctx.cost.scale if overhead else 1.0))
    value = lp.backend.solve(limit)
    if value is None or overhead:
        return value
    return lp.to_bytes(value)


def export(ctx: Context, model: Model, path: str) -> None:
    """Write ``model`` as CP-SAT proto text to ``path`` and the LP of the
    same formulation as MPS beside it (``.mps``): the variables carry the
    formulation's names (``R[s,i]``...), to read against docs/cpsat.md."""
    Path(path).write_text(model.backend.export())
    lp = make_model(ctx, model.depth, model.form.ix.also, backend=LpBackend(1.0))
    Path(path).with_suffix(".mps").write_text(lp.backend.export())


@dataclass(frozen=True)
class Rounds:
    """What the rounds left: the rounds searched, the round a Ctrl-C stopped
    before its search (its hint), the relaxation proofs asked between them,
    the whole-space lower bound (model integers), whether a relaxation
    showed the whole space empty, the last model built, whether every model
    asked for was built in time, and where the first round's hint came from."""

    history: tuple[Round, ...]
    stopped: Round | None
    proofs: tuple[Proof, ...]
    lower: int | None
    empty: bool
    model: Model | None
    built_in_time: bool
    hint_source: str | None
    hint_objective: int | None


def _run(ctx: Context, found: tuple[Outside | None, Lowest | None] | None = None) -> Plan:
    """The rounds, from the outside plan ``found`` (made here if None), then
    what follows them: LNS, the rounded-down proof, the tie-break, the
    outside plans an optimum is held against, the LP bound, the report."""
    # a valid plan before any model is built (the GPT decoder's takes 9 s)
    outside, lowest = found or outside_plan(ctx, ctx.clock.at(warm_start_share(ctx.graph, ctx.tuning)))
    outside_s = ctx.elapsed()
    # the gaps bound first: it needs no model, and a big graph's first model
    # may not be built in time
    q = run_question(ctx)
    whole = relaxation(ctx, q, "gaps", min(ctx.tuning.gap_bound_share * ctx.clock.limit, ctx.left()))
    rs = search_rounds(ctx, q, whole, outside, outside_s, lowest)
    if rs.model is None:  # not even the first model was built in time
        return report_unbuilt(ctx, outside, whole, q)
    history, proofs, lower, empty = rs.history, list(rs.proofs), rs.lower, rs.empty
    done = returned_round(history) or rs.stopped
    lns_stats = None
    if done is not None and not ctx.stop.requested:  # LNS from the round's best, in the time left
        done, lns_stats = lns.after_rounds(ctx, done, lower)
    if (not rs.model.form.memory_exact and not ctx.stop.requested and not empty and rs.built_in_time
            and whole.status != "INFEASIBLE" and ctx.left() > 0.05
            and not (done is not None and lower is not None and done.objective <= lower)):
        proof, lower, empty, outside = rounded_down_proof(ctx, done, lower, outside)
        proofs += [proof] if proof is not None else []
    chosen = done or (history[-1] if history else None)
    model = chosen.model if chosen is not None else rs.model
    primary_s = ctx.elapsed()
    best, secondary_status, secondary = tie_broken(ctx, model, done)
    outside = held_against(ctx, model, done, best, outside)
    lp, lp_skipped = (None, None) if empty or whole.status == "INFEASIBLE" else lp_of(ctx, model)
    if ctx.cfg.log_path:
        ctx.trace.write(ctx.cfg.log_path)
    outcome = Outcome(ctx=ctx, model=model, history=history, done=done, best=best,
                      secondary=secondary is not None, secondary_status=secondary_status, whole=whole,
                      proofs=tuple(proofs), lower=lower, empty=empty, outside=outside,
                      hint_source=rs.hint_source, hint_objective=rs.hint_objective, lp_bound=lp,
                      lp_skipped=lp_skipped, built_in_time=rs.built_in_time, primary_s=primary_s,
                      build_s=sum(r.build_s for r in history) if history else model.build_s)
    plan = report(outcome)
    if lns_stats is not None:
        plan.stats = plan.stats.with_details(lns=lns_stats)
    return plan


def search_rounds(ctx: Context, q: Question, whole: WholeBound, outside: Outside | None, outside_s: float,
                  lowest: Lowest | None) -> Rounds:
    """The rounds :mod:`strategy` chooses, each from the last one's plan (the
    first from the warm start), with the relaxation proofs it asks between
    them, until it is done, the space is shown empty, a Ctrl-C, or the time
    limit runs out while a model is built."""
    cfg, g, t = ctx.cfg, ctx.graph, ctx.tuning
    full = ctx.full
    full_pairs = full.count_pairs()
    remat_cache: dict[int | None, int] = {}

    def remat_pairs(depth: int | None) -> int:
        """The (stage, value) pairs where the depth-``depth`` space may re-materialise a value."""
        if depth not in remat_cache:
            ix = full if depth is None else Stages(g, cfg.offload, depth)
            remat_cache[depth] = ix.count_remat_pairs()
        return remat_cache[depth]

    built_in_time = True
    lower = whole.bound
    history: list[Round] = []
    stopped_round: Round | None = None  # Ctrl-C before a round's search: its hint
    proofs: list[Proof] = []
    proof_s, proof_at, asked_empty, empty = 0.0, None, False, False
    also: dict[int, set[int]] = {}
    hint_source = hint_obj = None
    model: Model | None = None  # the last one built
    while True:
        depth = next_depth(cfg.depth, history, full_pairs, remat_pairs, t)
        if depth == DONE:
            break
        if history:
            last = history[-1]
            proven = last.best is not None and lower is not None and last.objective <= lower
            if not ctx.stop.requested and wants_optimality_proof(last, proven, proof_at):
                # a restricted round's optimum may be the whole space's: ask the relaxations
                began = now()
                done_proofs, lower, _ = relaxation_proof(ctx, q, last.model, last.best, lower, proof_s)
                proofs += done_proofs
                proof_s += now() - began
                proof_at = last.objective
            if not ctx.stop.requested and wants_emptiness_proof(last, asked_empty):
                # a restricted space is empty: the relaxations may show that the whole one is
                began = now()
                done_proofs, lower, empty = relaxation_proof(ctx, q, last.model, None, lower, proof_s)
                proofs += done_proofs
                proof_s += now() - began
                asked_empty = True
                if empty:
                    break
            proven = last.best is not None and lower is not None and last.objective <= lower
            if ctx.stop.requested or proven or not may_start(depth, last, ctx.stop.requested, ctx.elapsed(),
                                                             ctx.clock.limit, proof_s, full_pairs, t):
                break
        try:
            prev = events(history[-1].model.form, history[-1].best) if history and history[-1].best else None
            first = model is None
            model = make_model(ctx, depth, also)
            if first and cfg.export_model:
                export(ctx, model, cfg.export_model)
            if whole.status == "INFEASIBLE":  # no staged plan at all: nothing to search
                break
            if prev is None:
                hint, hint_source = warm_start(ctx, model, outside, outside_s)
                hint_units = model.to_units(model.objective_of(hint)) if hint is not None else None
                if should_widen(depth, outside.objective if outside else None, hint_units, bool(also)):
                    also = plan_pairs(full, outside.plan)
                    if also:  # the same round, in a space that holds the outside plan
                        model = make_model(ctx, depth, also)
                        widened = from_plan(model.form, outside.plan)
                        if widened is not None and model.admissible(widened):
                            hint, hint_source = widened, outside.name
                hint_obj = model.objective_of(hint) if hint is not None else None
            else:
                hint = from_plan(model.form, prev)
            if ctx.stop.requested:  # Ctrl-C while building or warm-starting: keep the best so far
                if returned_round(history) is None and hint is not None:
                    stopped_round = Round(model, cp_model.FEASIBLE, cp_model.UNKNOWN, hint,
                                          history[-1].bound if history else None, None, None,
                                          model.build_s, ctx.elapsed())
                break
            r = solve_round(lns.round_context(ctx, model), model, hint, lowest)
            if hint is None and r.fitted is not None:
                hint_source, hint_obj = "peak search", model.objective_of(r.fitted)
            lowest = r.lowest or lowest
            bound = whole_bound_of(r)
            if bound is not None:
                lower = max(lower or 0, bound)
            history.append(r)
        except OutOfTime:  # the time limit is the whole solve's, model building included
            built_in_time = False
            break
    return Rounds(tuple(history), stopped_round, tuple(proofs), lower, empty, model, built_in_time, hint_source,
                  hint_obj)


def tie_broken(ctx: Context, model: Model, done: Round | None) -> tuple[Assignment | None, int | None,
                                                                         Assignment | None]:
    """The returned round's best after the tie-break (run only on a proven
    optimum), the tie-break's status (None: not run) and its plan (None: none found)."""
    best = done.best if done is not None else None
    if best is None or done.status != cp_model.OPTIMAL or ctx.stop.requested:
        return best, None, None
    status, secondary = tie_break(ctx, model, best, done.objective)
    return (secondary if secondary is not None else best), status, secondary


def held_against(ctx: Context, model: Model, done: Round | None, best: Assignment | None,
                 outside: Outside | None) -> Outside | None:
    """The best plan from outside the staged space that ``best`` is held
    against: ``outside``, the fast planners' plans (run now, if the warm
    start did not) where ``best`` is a staged optimum, and ``best`` cleaned
    of the computations nobody reads."""
    if best is None:
        return outside
    if done.status == cp_model.OPTIMAL and (ctx.cfg.hint is not None or ctx.cfg.warm_start != "auto"):
        # an optimum is never claimed over a plan rematopt itself can make:
        # without the warm start's fast plans, run them now
        rivals = heuristic_plans(ctx)
        rivals += without_dead(ctx.graph, [p for p, _ in rivals])
        rival = best_admitted(ctx, rivals + ([(outside.plan, outside.replay)] if outside else []))
        if rival is not None and (outside is None or rival.objective < outside.objective):
            outside = rival
    # a staged optimum too: its proof does not cover the cleaned plan
    return cleaned(ctx, events(model.form, best), outside)


def lp_of(ctx: Context, model: Model) -> tuple[float | None, str | None]:
    """The LP bound of ``model`` (``--lp-bound``), or why it was not solved."""
    if not ctx.cfg.lp_bound:
        return None, None
    if model.variables > LP_MAX_VARIABLES:
        return None, f"model has {model.variables:,} variables (> {LP_MAX_VARIABLES:,})"
    try:  # the LP of the model solved (the whole space's LP takes minutes on n100)
        return lp_bound(ctx, model.depth, model.form.ix.also, max(1.0, ctx.clock.limit / 4)), None
    except OutOfTime:
        return None, "the time limit ran out while building the LP"
