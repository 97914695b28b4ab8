"""``dtr``: Dynamic Tensor Rematerialization (Kirisame et al., ICLR 2021).

DTR is an online runtime policy, here run ahead of time: execute the program
in ``order``; before each computation, while memory would exceed the budget,
evict the resident value with the smallest

    h_DTR(t) = c(t) / (m(t) * s(t))

(m: bytes, s: staleness, the number of computations since t was last read or
written, c: the cost of t plus that of its evicted neighbourhood e*(t), the
evicted values that recomputing t would need, or that would need t, to come
back). Like the paper's h_DTR^eq we take e*(t) as the connected components of
evicted values that t touches, found afresh before each eviction (an evicted
value is one computed, not resident, and possibly read again). When a
computation reads an evicted value, recompute it on demand (recursively, which
may evict more). Values are freed right after their last use.
``options["dtr_heuristic"] = "local"`` uses the paper's local-cost variant
c(t) = cost(t) instead. (Exact directed e*(t), tried on 40 feasible
shape/ratio pairs: 33 budgets met against 30 for the components and 29 for
local cost, but about 10x slower on random_layered_n250.)

Never evicted: values being read by the computation under way (pinned),
inputs and non-recomputable values (nothing could bring them back; they stay
until the last read of anything that might need them recomputed), and
outputs and persistent values. When only such values are resident and the
budget is still exceeded, the computation runs over budget and the plan
says OVER_BUDGET.

Thrashing: on dense DAGs under tight budgets, DTR can recompute the same
cones over and over (the paper reports such runs as failures). Once the
recomputations exceed ``options["dtr_thrash_limit"]`` (default 10) times the
number of compute nodes, eviction stops and the run finishes over budget
(stats ``thrashed``); on the published random_layered_n250 graph at ratio 0.9
an unguarded run made about 300,000 evictions for a 930x overhead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..graph import Graph
from ..plan import COMPUTE, Plan
from .frees import Schedule, always_kept, place_frees
from .meter import now, past
from .options import option, parse

HEURISTICS = ("h_dtr", "local")
THRASH_LIMIT = 10  # default dtr_thrash_limit: recomputations per compute node


def needed_until(graph: Graph) -> list[int]:
    """The last position at which each value may be read: by its own
    consumers, or by the recomputation of a recomputable consumer that may
    itself be needed later."""
    nodes = graph.nodes
    ext = list(graph.last_use)
    for u in reversed(graph.order):
        for w in graph.succs[u]:
            if nodes[w].recomputable and ext[w] > ext[u]:
                ext[u] = ext[w]
    return ext


class _Runtime:
    """The simulated DTR runtime: residency, pins, staleness clock, schedule."""

    def __init__(self, graph: Graph, budget: int | None, local: bool, max_recomputes: float, deadline: float):
        self.g, self.budget, self.local = graph, budget, local
        self.max_recomputes = max_recomputes
        self.deadline = deadline  # the time (:mod:`.meter`) past which eviction stops
        n = graph.n
        self.fixed = always_kept(graph)
        self.resident = [False] * n
        self.computed = [False] * n
        for i in graph.initial_resident:
            self.resident[i] = self.computed[i] = True
        self.mem = graph.initial_bytes
        self.pins = [0] * n
        self.last_access = [0] * n
        self.clock = 1
        self.needed = needed_until(graph)
        self.neighbours = [graph.preds[u] + graph.succs[u] for u in range(n)]
        self.now = 0  # position of the program step under way
        self.schedule: Schedule = []
        self.evictions = 0
        self.recomputes = 0

    # -- eviction ---------------------------------------------------------

    def _evicted_components(self) -> tuple[list[int], list[float]]:
        """Connected components (through producers and consumers) of the
        evicted values: values computed, not resident, and possibly read
        again. Returns each value's component id (-1 if not evicted) and each
        component's total cost."""
        g, now, nbrs = self.g, self.now, self.neighbours
        evicted = [c and not r and t >= now for c, r, t in zip(self.computed, self.resident, self.needed)]
        comp = [-1] * g.n
        costs: list[float] = []
        for s in range(g.n):
            if not evicted[s] or comp[s] >= 0:
                continue
            k = comp[s] = len(costs)
            total, stack = 0.0, [s]
            while stack:
                u = stack.pop()
                total += g.cost[u]
                for w in nbrs[u]:
                    if evicted[w] and comp[w] < 0:
                        comp[w] = k
                        stack.append(w)
            costs.append(total)
        return comp, costs

    def _victim(self) -> int | None:
        g = self.g
        if not self.local:
            comp, comp_cost = self._evicted_components()
        best, best_key = None, None
        for u in range(g.n):
            if not self.resident[u] or self.fixed[u] or self.pins[u] or g.bytes[u] == 0:
                continue
            c = g.cost[u]
            if not self.local:  # plus the evicted components u touches
                c += sum(comp_cost[k] for k in {comp[w] for w in self.neighbours[u]} if k >= 0)
            key = (c / (g.bytes[u] * (self.clock - self.last_access[u])), g.position[u])
            if best_key is None or key < best_key:
                best, best_key = u, key
        return best

    def _make_room(self, need: int) -> None:
        if self.recomputes > self.max_recomputes or past(self.deadline):
            return  # thrashing or out of time: stop evicting, finish over budget
        while self.budget is not None and self.mem + need > self.budget:
            u = self._victim()
            if u is None:
                return  # only pinned or fixed values left: run over budget
            self.resident[u] = False
            self.mem -= self.g.bytes[u]
            self.evictions += 1

    # -- execution ----------------------------------------------------------

    def _touch(self, u: int) -> None:
        self.last_access[u] = self.clock

    def run(self, v: int) -> list[int]:
        """Compute ``v`` (not resident), first recomputing any evicted value
        it reads, recursively; returns the values recomputed on the way."""
        preds = self.g.preds
        remats: list[int] = []
        stack = [[v, 0]]  # (node, index of the next producer to make resident)
        while stack:
            top = stack[-1]
            u, k = top
            if k < len(preds[u]):
                p = preds[u][k]
                if self.resident[p]:
                    self.pins[p] += 1
                    self._touch(p)
                    top[1] += 1
                elif self.fixed[p] or not self.computed[p]:
                    raise RuntimeError(f"dtr bug: {self.g.name}: value {p} was freed but cannot be recomputed")
                else:
                    stack.append([p, 0])
                continue
            self._make_room(self.g.bytes[u])
            self.schedule.append((COMPUTE, u))
            self.resident[u] = self.computed[u] = True
            self.mem += self.g.bytes[u]
            self._touch(u)
            self.clock += 1
            for p in preds[u]:
                self.pins[p] -= 1
            stack.pop()
            if u != v:
                remats.append(u)
                self.recomputes += 1
        return remats

    def free(self, u: int) -> None:
        if self.resident[u] and not (self.g.nodes[u].output or self.g.nodes[u].persistent):
            self.resident[u] = False
            self.mem -= self.g.bytes[u]


@dataclass(frozen=True)
class Options:
    dtr_heuristic: str = option("h_dtr", "eviction heuristic.", choices=HEURISTICS)
    dtr_thrash_limit: float = option(THRASH_LIMIT, "stop evicting after this many recomputes per compute node.",
                                     minimum=0)
    # h_dtr's victim search is O(n) per eviction: on the 9,652-node decoder
    # at its working-set bound it ran for minutes inside cpsat's warm start
    time_limit: float = option(math.inf, "stop evicting after this many seconds (the plan then finishes over "
                               "budget).", minimum=0)


def plan(graph: Graph, budget: int | None, options: dict[str, Any]) -> Plan:
    opts = parse(Options, options, "dtr")
    heuristic, limit = opts.dtr_heuristic, opts.dtr_thrash_limit
    rt = _Runtime(graph, budget, heuristic == "local", limit * len(graph.compute_ids),
                  now() + opts.time_limit)
    # Free after the last read: by a consumer for a recomputable value (it can
    # come back), by anything that might need it recomputed otherwise.
    hold = [rt.needed[u] if rt.fixed[u] else graph.last_use[u] for u in range(graph.n)]
    frees_at: list[list[int]] = [[] for _ in range(graph.n)]
    for u, t in enumerate(hold):
        frees_at[t].append(u)
    for t, v in enumerate(graph.order):
        rt.now = t
        remats = [] if graph.nodes[v].is_input else rt.run(v)
        for u in frees_at[t] + [u for u in remats if hold[u] <= t]:
            rt.free(u)
    return place_frees(graph, rt.schedule, "dtr", budget,
                       {"heuristic": heuristic, "evictions": rt.evictions,
                        "thrashed": rt.recomputes > rt.max_recomputes,
                        "out_of_time": past(rt.deadline)})
