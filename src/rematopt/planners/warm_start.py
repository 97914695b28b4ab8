"""Warm starts for ``cpsat``: run the fast planners and keep the best valid
plan under the budget, so CP-SAT starts from a good incumbent instead of
searching for a first one."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..graph import Graph
from ..plan import Plan
from ..simulate import simulate
from . import available, get

if TYPE_CHECKING:
    from .cpsat_extract import Assignment
    from .cpsat_model import Formulation

# Planners that are not fast, or that would recurse.
SLOW = frozenset({"cpsat"})


def fast_planners() -> list[str]:
    """The registered planners that import here, the exact one aside."""
    return [name for name in available() if name not in SLOW]


def best_fast_plan(graph: Graph, budget: int | None, options: dict[str, Any] | None = None) -> Plan | None:
    """The valid plan with the lowest compute cost plus transfer bytes (then
    the lowest peak) among the fast planners' plans that meet ``budget``
    (every plan qualifies when it is None). Each candidate is replayed by the
    simulator, so a planner's own claims are never trusted; a planner that
    fails on this graph is skipped. None if no plan meets the budget."""
    best: tuple[tuple[float, int, int], Plan] | None = None
    for name in fast_planners():
        try:
            p = get(name)(graph, budget, dict(options or {}))
        except Exception:  # a baseline that fails here is simply not a candidate
            continue
        r = simulate(graph, p)
        if not r.valid or (budget is not None and r.peak_bytes > budget):
            continue
        key = (r.compute_cost, r.transfer_bytes, r.peak_bytes)
        if best is None or key < best[0]:
            p.planner = name
            best = (key, p)
    return best[1] if best else None


def staged_eviction(form: "Formulation", max_rounds: int = 10_000) -> "Assignment | None":
    """A first solution inside the staged model's own plan space, for when no
    fast planner's plan projects under the budget. Start from computing every
    node once; at the first slot whose memory exceeds the cap, evict values
    that are resident there, kept past the stage and not read again in it,
    cheapest recompute cost per byte first, until the excess is covered. An
    evicted value is freed after its last read before that slot and
    recomputed at the stage of its next read, from producers that are kept
    there or can be recomputed there from kept ones (one level, no cascade).
    None if it gets stuck."""
    from .cpsat_extract import canonical

    ix, g, size = form.ix, form.graph, form.size
    pos = ix.pos
    R = {(ix.first[i], i) for i in g.compute_ids}
    for _ in range(max_rounds):
        a = canonical(form, R, set(), set())
        if a is None:
            return None
        mem = a.memory(form)
        over = next((k for k in sorted(mem) if mem[k] > form.mem_cap), None)
        if over is None:
            return a
        s, q = over
        read_late = {p for (t, j) in a.R if t == s and pos[j] >= q for p in g.preds[j]}
        candidates = []
        for i in ix.values:
            if ((s + 1, i) not in a.S or s + 1 >= ix.T or i in read_late or not ix.recomputable[i]
                    or not size[i] or not ((s, i) in a.S or ((s, i) in a.R and pos[i] <= q))):
                continue
            t = s + 1
            while (t, i) in a.S and not any((t, j) in a.R for j in g.succs[i]):
                t += 1
            if (t, i) not in a.S or (t, i) not in form.R:
                continue
            missing = [p for p in g.preds[i] if not g.nodes[p].persistent and (t, p) not in a.S]
            if all((t, p) in form.R and all(g.nodes[u].persistent or (t, u) in a.S for u in g.preds[p])
                   for p in missing):
                cost = g.cost[i] + sum(g.cost[p] for p in missing)
                candidates.append((cost / size[i], -size[i], i, t, missing))
        excess = mem[over] - form.mem_cap
        if not candidates:
            return None
        for _, neg_size, i, t, missing in sorted(candidates):
            R.add((t, i))
            R.update((t, p) for p in missing)
            excess += neg_size
            if excess <= 0:
                break
    return None
