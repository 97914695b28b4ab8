"""Warm starts for ``cpsat``, so CP-SAT starts from a good incumbent instead
of searching for a first one: the best valid plan of the fast planners under
the budget, and a staged-eviction heuristic that works in the model's own
plan space (on random_layered_n100/n250 no fast planner's plan projects
under a 0.9 budget; eviction plans fit, at 1.3-3x the optimal recompute
cost on the benchmark graphs)."""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any, Callable, NamedTuple, Sequence, TypeVar

from ...graph import Graph
from ...plan import Plan
from ...simulate import Replay, simulate
from .. import available, get, options_class
from ..dead_code import without_dead_computations
from ..meter import now, past
from ..options import names
from .tuning import Tuning

if TYPE_CHECKING:
    from ..staged.solution import Assignment
    from ..staged.model import Formulation

P = TypeVar("P")
# Planners that are not fast, or that would recurse (exact searches
# themselves: jax-names runs cpsat). The compiler planners stay in: an
# optimum is never claimed over a plan rematopt can make, and xla-remat's
# moves reorder computations, which beats every staged plan on some small
# graphs (random_layered(14, seed=3) at 0.85: 486 against the staged 1,198).
SLOW = frozenset({"cpsat", "jax-names"})


# Run first: the fastest planners with good plans (the 9,652-node decoder:
# dtr 0.75 s and greedy; all of them 27 s), so a first plan is on record early.
# Greedy before dtr: on the decoder at 12, 24, 48 and 96 layers greedy takes
# 0.04, 0.11, 0.15, 0.36 s (linear) and dtr 0.08, 0.26, 0.78, 2.83 s (its
# victim search is linear per eviction), so the first plan's time grows
# linearly with the graph.
FIRST = ("greedy", "dtr")
# Then XLA's pass, which moves computations later than program order, outside
# the staged space: under a second on the 8,484-node decoder (3.7 s on the
# 99,847-node chain), and at loose budgets no staged plan beats it (the
# decoder at 0.8: 3.08% against rotor's 4.06%). After rotor, the warm
# start's share ran out before it there.
MOVES = ("xla-remat",)
# Then the chain DP, before the rest: it takes seconds to tens of seconds
# (CP-SAT on one block of each kind), and on the 48-layer decoder at 0.8 its
# plan costs 4.0% where dtr's costs 6.5%; elsewhere it declines at once.
NEXT = ("rotor",)
# ... on graphs this large: below, cpsat's own rounds do better than its
# options take to solve (gpt_l2_w64, 498 nodes: depth 2 proven in seconds).
NEXT_MIN_NODES = 1000


def fast_planners() -> list[str]:
    """The registered planners that import here, the exact one aside, the
    quick good ones (FIRST) first, then MOVES, then NEXT."""
    names = [name for name in available() if name not in SLOW]
    order = FIRST + MOVES + NEXT
    return sorted(names, key=lambda n: (order.index(n) if n in order else len(order), n))


def fast_plans(graph: Graph, budget: int | None, options: dict[str, Any] | None = None,
               deadline: float | None = None, on_plan: Callable[[Plan, Replay], None] | None = None,
               planners: Sequence[str] | None = None) -> list[tuple[Plan, Replay]]:
    """The fast planners' (or those of ``planners`` among them) valid plans
    for ``budget``, whether or not they meet it, each with its replay (a
    planner's own claims are never trusted), each handed to ``on_plan`` as
    soon as it is made. A planner that fails on this graph is skipped, and
    none starts after ``deadline`` (on the run's :mod:`..meter`)."""
    plans = []
    for name in fast_planners():
        if planners is not None and name not in planners:
            continue
        if deadline is not None and past(deadline):
            break
        if name in NEXT and graph.n < NEXT_MIN_NODES:
            continue
        if graph.n >= MODEL_MAX_NODES and name not in FIRST + MOVES + NEXT:
            break  # the rest take minutes there (chen-greedy: 141 s on the 99,847-node chain)
        run_options = dict(options or {})
        if deadline is not None and "time_limit" in names(options_class(name)):  # dtr: a time limit of its own
            left = max(0.0, deadline - now())
            # dtr's victim search is quadratic: on the 99,847-node chain it ran out of any share
            # and finished over budget; leave rotor, which comes next there, half of it
            later = [n for n in NEXT if n in names_left(planners, name)] if graph.n >= NEXT_MIN_NODES else []
            run_options["time_limit"] = left / 2 if name in FIRST and later else left
        try:
            with warnings.catch_warnings():  # a baseline's own warnings are not the user's concern here
                warnings.simplefilter("ignore")
                p = get(name)(graph, budget, run_options)
        except Exception:  # a baseline that fails here is simply not a candidate
            continue
        r = simulate(graph, p)
        if r.valid:
            p.planner = name
            plans.append((p, r))
            if on_plan is not None:
                on_plan(p, r)
    return plans


def without_dead(graph: Graph, plans: Sequence[Plan]) -> list[tuple[Plan, Replay]]:
    """Each plan with its unread computations dropped (:mod:`..dead_code`),
    where that drops any, named ``<planner>+dce``, with its replay: a staged
    plan computes a value only the backward reads at its program position
    too; dropped, the value is first computed where it is read (XLA's move),
    which no staged plan in program order does, so on large graphs cpsat
    then searches that plan's order (:mod:`..staged.order`)."""
    found = []
    for p in plans:
        moved = without_dead_computations(graph, p)
        if len(moved) < len(p):
            moved.planner = f"{p.planner}+dce"
            found.append((moved, simulate(graph, moved)))
    return found


def names_left(planners: Sequence[str] | None, after: str) -> list[str]:
    """The fast planners (of ``planners``, if given) that run after ``after``."""
    order = [n for n in fast_planners() if planners is None or n in planners]
    return order[order.index(after) + 1:] if after in order else []


# Past this many nodes no model is built in the time left anyway (the
# 99,847-node chain's depth-1 model is not built in 120 s): the fast
# planners (rotor above all) take a larger share (:mod:`.tuning`).
MODEL_MAX_NODES = 40_000


def warm_start_share(graph: Graph, tuning: Tuning) -> float:
    """The share of the time limit the fast planners may take before the first model."""
    return tuning.warm_start_share if graph.n < MODEL_MAX_NODES else tuning.large_warm_start_share


class Figures(NamedTuple):
    """What :func:`best_within` ranks plans by (a Replay has the same fields)."""

    compute_cost: float
    transfer_bytes: int
    peak_bytes: int


def best_within(plans: Sequence[tuple[P, Any]], budget: int | None, by_peak: bool = False) -> tuple[P, Any] | None:
    """The plan with the lowest compute cost, then transfer bytes, then peak
    (``by_peak``: the lowest peak, then compute cost, then transfer bytes)
    among those that meet ``budget`` (all, when it is None), with its
    figures (a Replay, or :class:`Figures`). The one ranking of "the best
    fast plan": cpsat's warm start and the batch's hint both use it."""
    def rank(r) -> tuple:
        return (r.peak_bytes, r.compute_cost, r.transfer_bytes) if by_peak else \
            (r.compute_cost, r.transfer_bytes, r.peak_bytes)

    fit = [(rank(r), k) for k, (p, r) in enumerate(plans) if budget is None or r.peak_bytes <= budget]
    return plans[min(fit)[1]] if fit else None


def lowest_peak(plans: list[tuple[Plan, Replay]]) -> tuple[Plan, Replay] | None:
    """The valid plan with the lowest peak (then compute cost), with its
    replay: where none meets the budget, the closest start for a search that
    minimises the peak."""
    return min(((p, r) for p, r in plans if r.valid), key=lambda x: (x[1].peak_bytes, x[1].compute_cost),
               default=None)


def staged_eviction(form: "Formulation", max_rounds: int = 10_000,
                    deadline: float | None = None) -> "Assignment | None":
    """A first solution inside the staged model's own plan space, where the
    fast planners' plans often do not fit once projected. Start from computing every
    node once; at the first slot whose memory exceeds the cap, evict values
    resident there that are kept past the stage and not read again in it: an
    evicted value is freed after its last read before that slot and
    recomputed at the stage of its next read. Its producers must then be
    resident there: each is recomputed too if it can be from kept values,
    else kept alive until then (which may cost memory at this slot). Values
    go cheapest recompute cost per byte saved first, until the excess is
    covered. None if it gets stuck or runs past ``deadline`` (on the run's
    :mod:`..meter`: on a 2,000-node decoder a round takes seconds)."""
    from ..staged.solution import canonical

    ix, g, size = form.ix, form.graph, form.size
    pos = ix.pos
    R = {(ix.first[i], i) for i in g.compute_ids}
    for _ in range(max_rounds):
        if deadline is not None and past(deadline):
            return None
        a = canonical(form, R, set(), set())
        if a is None:
            return None
        mem = a.memory(form)
        over = next((k for k in sorted(mem) if mem[k] > form.mem_cap), None)
        if over is None:
            return a
        s, q = over
        freed = {i: f for (t, i, f) in a.F if t == s}
        resident = {i for i in ix.values
                    if (a.kept(form, s, i) or ((s, i) in a.R and pos[i] <= q)) and freed.get(i, q) >= q}
        read_late = {p for (t, j) in a.R if t == s and pos[j] >= q for p in g.preds[j]}
        candidates = []
        for i in resident:
            if (not a.kept(form, s + 1, i) or i in read_late or not ix.recomputable[i] or not size[i]):
                continue
            t = s + 1
            while a.kept(form, t, i) and not any((t, j) in a.R for j in g.succs[i]):
                t += 1
            if not a.kept(form, t, i) or (t, i) not in form.R:
                continue
            cost, saved, redo = g.cost[i], size[i], [(t, i)]
            for p in g.preds[i]:
                if g.nodes[p].persistent or a.kept(form, t, p) or (t, p) in a.R:
                    continue
                if (t, p) in form.R and all(g.nodes[u].persistent or a.kept(form, t, u) for u in g.preds[p]):
                    cost += g.cost[p]
                    redo.append((t, p))
                elif p not in resident:
                    saved -= size[p]
            if saved > 0:
                candidates.append((cost / saved, -saved, i, redo))
        if not candidates:
            return None
        excess = mem[over] - form.mem_cap
        for _, neg_saved, i, redo in sorted(candidates):
            R.update(redo)
            excess += neg_saved
            if excess <= 0:
                break
    return None


class _Index:
    """A backend that makes no solver variables: the formulation's tables
    as an index of the plan space, for heuristics that work in it."""

    def __init__(self) -> None:
        self.made = 0

    def bool_var(self, name: str) -> "_Entry":
        self.made += 1
        return _Entry(self.made)

    def int_var(self, lb: int, ub: int, name: str) -> "_Entry":
        return self.bool_var(name)

    def add(self, terms: list, lb: float, ub: float) -> None:
        pass

    def minimize(self, terms: list) -> None:
        pass


class _Entry:
    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index


# Recompute depths staged eviction tries when no fast planner's plan fits:
# on random_layered_n1000 at 0.8 nothing fits and eviction in the depth-1
# space gets stuck; in depth 2 it finds a plan (21 s, 14% overhead) that
# the depth-1 round, widened by its recomputes, searches from.
EVICTION_DEPTHS = (2, 3)


def evicted_plan(graph: Graph, budget: int, deadline: float) -> Plan | None:
    """Staged eviction's plan in the depth-2 space, else depth 3 (the model's
    index only, no solver), or None (stuck, or past ``deadline``)."""
    from ..staged.model import Formulation, OutOfTime
    from ..staged.solution import events

    for depth in EVICTION_DEPTHS:
        try:
            form = Formulation(graph, _Index(), mem_cap_bytes=budget, depth=depth, deadline=deadline)
        except OutOfTime:
            return None
        a = staged_eviction(form, deadline=deadline)
        if a is not None:
            plan = events(form, a)
            plan.planner = "staged-eviction"
            return plan
    return None

