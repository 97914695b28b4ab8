"""CP-SAT over the name decisions, for policy spaces too large to enumerate.

The model holds the recompute cost exactly and the memory of a policy's plan
as lower bounds; the simulator judges each policy the solver proposes, and a
policy over budget is cut off and the model solved again (a lazy-constraint
loop). Every cut removes only policies over budget, so each solve's bound is a
bound over the whole policy space, and the first proposal within budget from a
solve proven optimal is optimal over it.

Variables: ``dev[g]``, ``off[g]`` per group (at most one); ``reach[u]`` per
forward value the backward pass may recompute; ``need[x]``, ``kept[x]`` per
named node (read after the forward pass; saved on the device and read).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from functools import reduce
from typing import Mapping

from ortools.sat.python import cp_model

from ...plan import COMPUTE, Plan
from ...simulate import simulate
from ..frees import always_kept, drop_points
from .space import Space, policy_plan

# Costs become integers by this scale on the largest cost (rounded down, so the
# model's optimum is a lower bound on every policy's recompute cost).
COST_LIMIT = 10**6


@dataclass(frozen=True)
class Found:
    """The best policy a search found within budget (None: none exists or none found)."""

    policy: dict | None
    plan: Plan | None
    proven: bool        # optimal (or, with no policy, infeasible) over the policy space
    bound: float        # lower bound on the recompute cost of every policy within budget
    policies_evaluated: int
    solves: int


class NameModel:
    """The CP-SAT model of one policy space under one budget."""

    def __init__(self, space: Space, budget: int | None, offload: bool):
        self.space, self.budget, self.offload = space, budget, offload
        g = space.graph
        self.m = cp_model.CpModel()
        m = self.m
        self.keys = space.keys
        self.dev = {k: m.NewBoolVar(f"dev[{k}]") for k in self.keys}
        self.off = {k: m.NewBoolVar(f"off[{k}]") if offload else 0 for k in self.keys}
        for k in self.keys:
            m.Add(self.dev[k] + self.off[k] <= 1)
        self.group_of = {i: k for k, nodes in space.groups.items() for i in nodes}
        self.candidates = space.recompute_set(set())
        self.reach = {u: m.NewBoolVar(f"reach[{u}]") for u in sorted(self.candidates)}
        self.add_recompute_closure()
        self.add_need()
        if budget is not None:
            self.add_forward_memory(budget)
            self.add_backward_memory(budget)
        costs = [g.cost[u] for u in self.candidates if g.cost[u] > 0]
        self.scale = COST_LIMIT / max(costs) if costs else 1.0
        self.int_cost = {u: math.floor(g.cost[u] * self.scale) for u in self.candidates}
        unit = reduce(math.gcd, (g.bytes[i] for i in self.group_of), 0) or 1
        self.units = {k: sum(g.bytes[i] for i in space.groups[k]) // unit for k in self.keys}
        self.weight = sum(self.units.values()) + 1  # offloaded bytes break ties in cost
        self.objective = (self.weight * sum(self.int_cost[u] * r for u, r in self.reach.items())
                          + sum(self.units[k] * self.off[k] for k in self.keys))
        m.Minimize(self.objective)

    def objective_of(self, policy: Mapping) -> int:
        """The model's objective at ``policy``."""
        saved = {i for k, f in policy.items() if f != "remat" for i in self.space.groups[k]}
        reach = self.space.recompute_set(saved)
        return (self.weight * sum(self.int_cost[u] for u in reach)
                + sum(self.units[k] for k, f in policy.items() if f == "offload"))

    def saved(self, x: int):
        k = self.group_of.get(x)
        return 0 if k is None else self.dev[k] + self.off[k]

    def add_recompute_closure(self) -> None:
        """reach[u] >= 1 - saved(u) for u the backward pass reads;
        reach[p] >= reach[u] - saved(p) for p -> u (saved(p) = 0 unnamed);
        reach[x] + saved(x) <= 1."""
        g, m = self.space.graph, self.m
        for u in self.space.backward_reads:
            if u in self.reach:
                m.Add(self.reach[u] + self.saved(u) >= 1)
        for u, r in self.reach.items():
            m.Add(r + self.saved(u) <= 1)
            for p in g.preds[u]:
                if p in self.reach:
                    m.Add(self.reach[p] >= r - self.saved(p))

    def add_need(self) -> None:
        """need[x] >= reach[u] for each consumer u of x, = 1 if the backward
        pass reads x; kept[x] >= dev[g(x)] + need[x] - 1."""
        g, m = self.space.graph, self.m
        direct = set(self.space.backward_reads)
        self.kept = {}
        for x, k in self.group_of.items():
            need = m.NewBoolVar(f"need[{x}]")
            if x in direct:
                m.Add(need == 1)
            for u in g.succs[x]:
                if u in self.reach:
                    m.Add(need >= self.reach[u])
            self.kept[x] = m.NewBoolVar(f"kept[{x}]")
            m.Add(self.kept[x] >= self.dev[k] + need - 1)

    def add_forward_memory(self, budget: int) -> None:
        """At each forward compute: the all-remat plan's memory plus every
        kept named value past its last forward read <= budget (exact: the
        forward pass is the same under every policy but for those)."""
        g, space = self.space.graph, self.space
        base = policy_plan(space, {}, None)
        replay = simulate(g, base)
        drop, pos = drop_points(g), g.position
        rows: dict[frozenset, int] = {}
        seen = set()
        for t, (op, i) in enumerate(zip(base.ops.tolist(), base.nodes.tolist())):
            if op != COMPUTE or not space.forward[i] or i in seen:
                continue
            seen.add(i)
            terms = frozenset(x for x in self.group_of if drop[x] < pos[i])
            rows[terms] = max(rows.get(terms, 0), int(replay.timeline[t]))
        self._add_rows(rows, budget)

    def add_backward_memory(self, budget: int) -> None:
        """At each backward compute c: bytes(c), its operands, the live
        backward values, persistent values, and forward values the backward
        pass reads directly before and after c (resident under every policy),
        plus kept named values whose first backward read is after c."""
        g, space = self.space.graph, self.space
        pos, last = g.position, g.last_use
        back = [i for i in g.order if g.nodes[i].phase == "backward"]
        reads: dict[int, list[int]] = {}
        for c in back:
            for p in g.preds[c]:
                if space.forward[p]:
                    reads.setdefault(p, []).append(pos[c])
        span = {u: (min(r), max(r)) for u, r in reads.items()}
        held = always_kept(g)
        inputs = [i for i in g.initial_resident]
        rows: dict[frozenset, int] = {}
        for c in back:
            t = pos[c]
            live = set(g.preds[c])
            live.update(i for i in inputs if g.nodes[i].persistent or g.nodes[i].output or last[i] >= t)
            live.update(u for u, (a, b) in span.items() if a <= t <= b)
            live.update(v for v in back if pos[v] < t <= last[v] or (pos[v] < t and g.nodes[v].output))
            live.update(u for u in span if held[u] and not g.nodes[u].is_input and pos[u] < t <= span[u][1])
            terms = frozenset(x for x in self.group_of if x in span and pos[x] < t < span[x][0])
            const = sum(g.bytes[v] for v in live) + g.bytes[c]
            rows[terms] = max(rows.get(terms, 0), const)
        self._add_rows(rows, budget)

    def _add_rows(self, rows: Mapping[frozenset, int], budget: int) -> None:
        g = self.space.graph
        for terms, const in rows.items():
            self.m.Add(sum(g.bytes[x] * self.kept[x] for x in terms) <= budget - const)

    def cut(self, policy: Mapping, offloaded_fails: bool) -> None:
        """Exclude ``policy`` and every policy that saves the same groups
        with a superset of its device groups (none fits, as the device ->
        offload move never raises memory); with ``offloaded_fails``, every
        split of its saved set."""
        terms = []
        for k in self.keys:
            fate = policy.get(k, "remat")
            if fate == "remat":
                terms.append(self.dev[k] + self.off[k])
            elif fate == "device" and not offloaded_fails:
                terms.append(1 - self.dev[k])
            else:
                terms.append(1 - self.dev[k] - self.off[k])
        self.m.Add(sum(terms) >= 1)

    def read(self, solver: cp_model.CpSolver) -> dict:
        return {k: "device" if solver.Value(self.dev[k]) else
                "offload" if self.offload and solver.Value(self.off[k]) else "remat" for k in self.keys}

    def bound(self, solver: cp_model.CpSolver) -> float:
        """Lower bound on the recompute cost, in the graph's cost unit."""
        return math.floor(solver.BestObjectiveBound() / self.weight) / self.scale


def best_under(space: Space, budget: int | None, offload: bool, time_limit: float, workers: int,
               seed: int, incumbent: dict | None = None) -> Found:
    """The policy of least recompute cost whose plan fits ``budget``;
    ``incumbent``, a policy known to fit, is the hint and the fallback."""
    model = NameModel(space, budget, offload)
    deadline = time.perf_counter() + time_limit
    evaluated = solves = 0
    bound = 0.0
    hint = incumbent
    fallback = (incumbent, policy_plan(space, incumbent, budget)) if incumbent is not None else (None, None)

    def incumbent_found(proven: bool = False) -> Found:
        return Found(fallback[0], fallback[1], proven, bound, evaluated, solves)

    if incumbent is not None:  # nothing worse than it is wanted
        model.m.Add(model.objective <= model.objective_of(incumbent))

    while True:
        left = deadline - time.perf_counter()
        if left <= 0:
            return incumbent_found()
        solver = cp_model.CpSolver()
        solver.parameters.max_time_in_seconds = left
        solver.parameters.num_workers = workers
        solver.parameters.random_seed = seed
        if hint:
            model.m.ClearHints()
            for k, fate in hint.items():
                model.m.AddHint(model.dev[k], fate == "device")
                if offload:
                    model.m.AddHint(model.off[k], fate == "offload")
        status = solver.Solve(model.m)
        solves += 1
        if status == cp_model.INFEASIBLE:
            return incumbent_found(proven=True)  # cuts left no policy but the incumbent (or none)
        if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            return incumbent_found()
        bound = max(bound, model.bound(solver))
        if incumbent is not None and solver.BestObjectiveBound() >= model.objective_of(incumbent):
            return incumbent_found(proven=True)  # nothing left beats the incumbent
        policy = model.read(solver)
        plan = policy_plan(space, policy, budget)
        evaluated += 1
        if budget is None or plan.stats["peak_bytes"] <= budget:
            if status != cp_model.OPTIMAL and fallback[1] is not None and \
                    fallback[1].stats["compute_cost"] < plan.stats["compute_cost"]:
                return incumbent_found()
            return Found(policy, plan, status == cp_model.OPTIMAL, bound, evaluated, solves)
        offloaded_fails = True
        if offload and any(f == "device" for f in policy.values()):
            moved = {k: "offload" if f == "device" else f for k, f in policy.items()}
            evaluated += 1
            offloaded_fails = policy_plan(space, moved, budget).stats["peak_bytes"] > budget
        model.cut(policy, offloaded_fails)
        hint = policy
