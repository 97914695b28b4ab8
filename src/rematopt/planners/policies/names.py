"""``jax-names``: the best ``checkpoint_name`` policy under a memory budget.

The space is :mod:`~rematopt.planners.policies.space`'s: each name (or each
(name, layer) with ``per_layer``) is ``device``, ``remat`` or, with
``offload``, ``offload``. The objective is the least recompute overhead within
the budget, ties broken by the fewest bytes moved to the host and then the
lowest peak (``objective="peak"``: the least peak, then the least overhead).

With few groups the space is enumerated: saved sets in order of recompute
cost (which depends on the saved set alone), each checked all offloaded first
(if that misses the budget, every split of it does), then its device subsets
grown while they fit. With many, CP-SAT searches the decisions
(:mod:`~rematopt.planners.policies.search`). What the search proves holds
over the policy space: ``optimal_in`` / ``infeasible_in`` "policy space",
with status FEASIBLE / UNKNOWN, since a plan no policy expresses may do
better (``price_of_policy``); ``OPTIMAL`` only where nothing can (no
recompute, or a peak at :func:`~rematopt.reference.pinned_bound`). Beside
the policy, the stats give the unconstrained ``cpsat`` plan and bound at the same budget (``price_of_policy``: how much
overhead expressing the plan as a policy costs).
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, replace
from typing import Any

from ...errors import NotApplicable
from ...graph import Graph
from ...plan import Plan
from ...reference import pinned_bound
from ...simulate import simulate
from ...stats import Stats
from ..options import names, option, parse
from .space import Space, no_names, policy_plan

@dataclass(frozen=True)
class Options:
    objective: str | None = option(None, "minimise overhead under the budget, or the peak.",
                                   choices=("overhead", "peak"))
    offload: bool = option(False, "allow host offload.")
    per_layer: bool = option(False, "one decision per (checkpoint_name, layer).")
    price: bool = option(True, "also run cpsat for the price of expressing the plan as a policy.")
    time_limit: float = option(60.0, "solver time limit, seconds.", minimum=0, finite=True)
    workers: int = option(0, "solver threads (default: all cores).", minimum=0)
    seed: int = option(0, "solver random seed.")


OPTIONS = names(Options)
# Up to this many groups the space (2^k saved sets) is enumerated: 10 groups
# (1,024 saved sets) take about a second on the 2-layer GPT.
ENUMERATE_MAX = 10


def plan(graph: Graph, budget: int | None, options: dict[str, Any]) -> Plan:
    if not graph.has_phases:
        raise NotApplicable(f"{graph.name}: jax-names needs a traced training step (forward and backward phases)")
    o = parse(Options, options, "jax-names")
    objective, offload, time_limit = o.objective or "overhead", o.offload, o.time_limit
    space = Space(graph, o.per_layer)
    if not space.keys:
        raise NotApplicable(no_names(graph))
    fates = ("device", "offload") if offload else ("device",)
    start = time.perf_counter()
    if len(space.keys) <= ENUMERATE_MAX:
        found, how = _enumerate(space, budget, fates, objective), "enumeration"
    else:
        found, how = _search(space, budget, offload, objective, time_limit, o), "cpsat"
    policy, best, status, bound, evaluated = found
    stats: dict[str, Any] = {"search": how, "groups": len(space.keys), "per_layer": space.per_layer,
                             "offload": offload, "objective_kind": objective, "policies_evaluated": evaluated,
                             "policy_space": len(fates + ("remat",)) ** len(space.keys),
                             "search_s": time.perf_counter() - start}
    base = math.fsum(graph.cost[i] for i in graph.compute_ids)
    if bound is not None and base:
        stats["best_bound"] = bound / base  # overhead no policy within budget goes below
    if o.price:
        stats.update(_price(graph, budget, offload, time_limit, o, base))
    bound_units = stats.pop("best_bound", None)
    if best is None:
        why = ("no policy in the space fits the budget" if status == "INFEASIBLE"
               else "the search ended before finding a policy within budget")
        return Plan(graph.name, "jax-names", [], [], Stats(
            status="UNKNOWN", reason=why, best_bound=bound_units, details=stats,
            infeasible_in=POLICIES if status == "INFEASIBLE" else None))
    out = policy_plan(space, policy, budget, stats=stats)
    out.stats = replace(out.stats, best_bound=bound_units, **claim(graph, objective, offload, status, out.stats))
    if "cpsat_overhead" in stats and base:
        overhead = (out.stats["compute_cost"] - base) / base
        out.stats = out.stats.with_details(price_of_policy=overhead - stats["cpsat_overhead"])
    return out


# What the search's proofs cover (Stats.optimal_in, infeasible_in).
POLICIES = "policy space"


def claim(graph: Graph, objective: str, offload: bool, status: str, st: Stats) -> dict[str, Any]:
    """The status of a policy's plan over every plan: OPTIMAL where nothing
    can beat it (it recomputes nothing, or peaks at the pinned values'
    bound), else FEASIBLE, optimal among ``POLICIES`` when the search proved
    it (``status`` OPTIMAL)."""
    primary = st["compute_cost"] - math.fsum(graph.cost[i] for i in graph.compute_ids)
    if (primary <= 0 if objective == "overhead" else st["peak_bytes"] <= pinned_bound(graph, offload)):
        return {"status": "OPTIMAL", "optimal_in": "all plans"}
    return {"status": "FEASIBLE", "optimal_in": POLICIES if status == "OPTIMAL" else None}


def _figures(p: Plan) -> tuple:
    return p.stats["compute_cost"], p.stats["transfer_bytes"], p.stats["peak_bytes"]


def _enumerate(space: Space, budget: int | None, fates: tuple, objective: str):
    """(policy, plan, status, recompute-cost bound, policies evaluated)."""
    keys = space.keys
    cache: dict[tuple, Plan] = {}

    def evaluate(policy: dict) -> Plan:
        key = tuple(policy.get(k, "remat") for k in keys)
        if key not in cache:
            cache[key] = policy_plan(space, policy, budget)
        return cache[key]

    low = fates[-1]  # the fate that fits best: offload if allowed
    subsets = [[k for b, k in enumerate(keys) if mask >> b & 1] for mask in range(1 << len(keys))]
    cost = [space.recompute_cost({k: "device" for k in s}) for s in subsets]
    lowest = [evaluate({k: low for k in s}).stats["peak_bytes"] for s in subsets] if objective == "peak" else None
    cap = budget
    if objective == "peak":
        cap = min(lowest)
        if budget is not None and cap > budget:
            return None, None, "INFEASIBLE", None, len(cache)
    order = sorted(range(len(subsets)), key=lambda j: (cost[j], len(subsets[j])))
    if objective == "peak":
        order = [j for j in order if lowest[j] == cap]
    j = 0
    while j < len(order):
        tied = [i for i in order[j:] if cost[i] == cost[order[j]]]
        j += len(tied)
        best = None
        for i in tied:
            fit = _best_split(subsets[i], fates, cap, evaluate)
            if fit is not None and (best is None or _figures(fit[1])[1:] < _figures(best[1])[1:]):
                best = fit
        if best is not None:
            return best[0], best[1], "OPTIMAL", cost[order[j - 1]] if objective == "overhead" else None, len(cache)
    return None, None, "INFEASIBLE", None, len(cache)


def _best_split(saved: list, fates: tuple, cap: int | None, evaluate):
    """The split of ``saved`` into device / offload that fits ``cap`` with the
    least transfer (then peak), or None. Fitting splits are closed under
    moving groups to offload, so device sets are grown only while they fit."""
    def fits(p: Plan) -> bool:
        return cap is None or p.stats["peak_bytes"] <= cap

    start = {k: fates[-1] for k in saved}
    first = evaluate(start)
    if not fits(first):
        return None
    best = (start, first)
    if len(fates) == 1:
        return best
    stack = [(start, 0)]
    while stack:
        policy, nxt = stack.pop()
        for b in range(nxt, len(saved)):
            grown = {**policy, saved[b]: "device"}
            p = evaluate(grown)
            if fits(p):
                if _figures(p)[1:] <= _figures(best[1])[1:]:  # a tie: offloading moved nothing
                    best = (grown, p)
                stack.append((grown, b + 1))
    return best


def _search(space: Space, budget: int | None, offload: bool, objective: str, time_limit: float, o: Options):
    from .search import best_under

    workers, seed = o.workers or os.cpu_count() or 1, o.seed
    deadline = time.perf_counter() + time_limit
    found = best_under(space, budget, offload, time_limit, workers, seed, _global_start(space, budget, offload))
    evaluated = found.policies_evaluated
    if objective == "peak" and found.policy is not None:
        # Tighten the budget below each policy found until none fits: the last is the least peak.
        best, proven = found, found.proven
        while proven and time.perf_counter() < deadline:
            tighter = best_under(space, best.plan.stats["peak_bytes"] - 1, offload,
                                 deadline - time.perf_counter(), workers, seed)
            evaluated += tighter.policies_evaluated
            if tighter.policy is None:
                proven = tighter.proven
                break
            best = tighter
        least = best_under(space, best.plan.stats["peak_bytes"], offload,
                           max(1.0, deadline - time.perf_counter()), workers, seed)  # its least overhead
        evaluated += least.policies_evaluated
        if least.policy is not None:
            proven, best = proven and least.proven, least
        return best.policy, best.plan, "OPTIMAL" if proven and best.proven else "FEASIBLE", None, evaluated
    if found.policy is None:
        return None, None, "INFEASIBLE" if found.proven else "UNKNOWN", found.bound, evaluated
    return found.policy, found.plan, "OPTIMAL" if found.proven else "FEASIBLE", found.bound, evaluated


def _global_start(space: Space, budget: int | None, offload: bool) -> dict | None:
    """The best global policy, per layer: a per-layer search's first incumbent
    (the per-layer space holds every global policy)."""
    glob = Space(space.graph, False)
    if not space.per_layer or len(glob.keys) > ENUMERATE_MAX:
        return None
    policy = _enumerate(glob, budget, ("device", "offload") if offload else ("device",), "overhead")[0]
    return None if policy is None else {(name, layer): policy.get(name, "remat") for name, layer in space.keys}


def _price(graph: Graph, budget: int | None, offload: bool, time_limit: float, o: Options,
           base: float) -> dict[str, Any]:
    """The unconstrained cpsat plan's overhead and bound at the same budget."""
    from .. import get

    p = get("cpsat")(graph, budget, {"offload": offload, "time_limit": time_limit, "lp_bound": False,
                                     "workers": o.workers, "seed": o.seed})
    out: dict[str, Any] = {"cpsat_status": p.stats.get("status")}
    if base and len(p):
        out["cpsat_overhead"] = simulate(graph, p).overhead  # the replay's figure, not the claim
    if base and p.stats.get("best_bound") is not None:
        out["cpsat_bound"] = p.stats["best_bound"] / base
    return out
