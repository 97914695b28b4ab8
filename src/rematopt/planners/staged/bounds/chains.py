"""The chains and slots relaxations: lower bounds for the whole staged space
from models far smaller than the staged one (``docs/cpsat.md``,
"Whole-space bounds"). With the gaps relaxation (:mod:`.gaps`) they are
three levels of one relaxation.

Memory is checked only at the first computations of the *critical* stages
``c_0 < c_1 < ...``: those where the values that are alive (between their
first computation and last use) exceed the cap. Between two critical stages
lies the interval ``I_k = (c_k, c_{k+1}]``. Per value i:

- ``pres[i,k]``: i is resident at the first computation of stage c_k. It is 1
  at i's own points (its stage, its consumers' stages, the end for outputs)
  and between them when i can be neither recomputed nor prefetched; a 0/1
  variable elsewhere in i's life; beyond "gaps", also past its last use up
  to its horizon (kept for someone's recompute), and absent otherwise.
- ``rc[i,k]`` / ``pf[i,k]``: i is recomputed / prefetched at least once in a
  stage of I_k (``O[i]``: its host copy).

    pres[i,k] <= pres[i,k-1] + rc[i,k-1] + pf[i,k-1]       (resident at c_k: resident at c_{k-1} or re-materialised between)
    pres[i,k] + rc[i,k] + pf[i,k] >= 1                     (a use of i strictly inside I_k)
    rc[i,k] <= pres[p,k] + rc[p,k] + pf[p,k]               (chains: every producer p of a recompute)
    pf[i,k] <= O[i]
    sum_i size(i) pres[i,k] <= cap                         (every critical stage)
    slot memory of a recompute (slots: see _Model.add_slot_loads)
    minimise  sum cost(i) rc[i,k] + transfer(i) (O[i] + sum_k pf[i,k])

(The first two hold only once i exists at c_{k-1}, resp. c_k; a producer
first computed after c_k needs nothing.) Each staged plan maps to a solution
that costs no more (resident or not at each first computation, re-materialised
or not in each interval), so the optimum is a lower bound on the whole staged
space, and an infeasible relaxation proves it empty. The levels:

- "gaps": no producer constraints, one variable per gap between two uses (a
  value dropped anywhere in it pays one re-materialisation). The optimum
  itself on the Checkmate graphs. Built by :mod:`.gaps` with numpy, its
  memory rows chained: a few seconds on the 10,084-node GPT decoder, where
  the model above, one term per (value, critical stage), did not build in 60 s.
- "chains": a recompute needs its producers, which on the random layered
  graphs are often long freed. Proves random_layered_n250 at 0.9 optimal
  (1,135; the gap bound is 740) in about 3 s.
- "slots": chains, plus the memory at a recompute's own slot where its stage
  is known, with the critical stages widened to those within one largest
  value of the cap. Exact on random_layered_n100 (377 and 1,097, where
  chains give 326 and 741), but harder to solve on bigger graphs.
"""

from __future__ import annotations

import bisect
import itertools
from collections import deque
from dataclasses import replace
from typing import Collection

from ortools.sat.python import cp_model

from ....graph import Graph
from ...meter import now
from ..model import OutOfTime, check_time
from ..stages import Stages
from .question import How, Question, WholeBound
from .solver import solve_relaxation

# Chains and slots make about three variables per (value, critical stage) up
# to the value's horizon: 1.2 million on the 2,090-node GPT decoder at 0.8
# (30 s to build in Python); n250's are 12,000-16,000. Above this, SKIPPED.
MAX_PAIRS = 200_000


def chains_bound(graph: Graph, q: Question, how: How, level: str) -> WholeBound:
    """The chains or slots relaxation (``level``) of ``q`` solved as ``how``
    says; SKIPPED above MAX_PAIRS, UNKNOWN when not built in its time."""
    began = now()
    try:
        m, goal = chains_model(graph, q, level, began + how.time_limit)
    except OutOfTime:  # not even built in the time it was given
        return WholeBound("UNKNOWN", None, now() - began)
    if m is None:  # too big to build in the time a proof gets
        return WholeBound("SKIPPED", None, now() - began)
    return solve_relaxation(m, goal, began, how)


def chains_model(graph: Graph, q: Question, level: str, deadline: float, rows: int | None = None,
                 hops: int | None = None) -> tuple[cp_model.CpModel | None, cp_model.LinearExpr | None]:
    """The chains or slots relaxation of ``q`` and its objective (None, None
    above MAX_PAIRS), at ``rows`` critical stages (default: all) with each
    value's entries reaching ``hops`` recomputes past its life (default:
    its horizon; see :class:`_Lifetimes`). Raises OutOfTime past ``deadline``."""
    shape = _Lifetimes(graph, level=level, offload=q.offload, unit=q.unit, cap=_floor(q), deadline=deadline,
                       rows=rows, hops=hops)
    if shape.pairs > MAX_PAIRS:
        return None, None
    return _relaxation(graph, q, shape, deadline)


def _floor(q: Question) -> int:
    """The memory a critical stage has more of alive: the cap, or for the peak its floor."""
    return q.cap_units if q.objective == "overhead" else q.peak_floor


def _relaxation(graph: Graph, q: Question, shape: "_Lifetimes", deadline: float | None
                ) -> tuple[cp_model.CpModel, cp_model.LinearExpr]:
    """The model of ``shape`` with the memory rows and objective of ``q``."""
    r = _Model(graph, shape, deadline)
    m = r.model
    cost = r.cost(q.int_cost, q.int_transfer)
    if q.max_recomputes is not None:
        m.add(sum(r.rc.values()) <= q.max_recomputes)
    if q.objective == "overhead":
        goal, cap = cost, q.cap_units
    else:
        goal = cap = m.new_int_var(q.peak_floor, max(sum(r.size), q.peak_floor), "M")
        if q.overhead_cap is not None:
            m.add(cost <= q.overhead_cap)
    for load in r.loads:
        m.add(load <= cap)
    for load, x in r.slot_loads:
        m.add(load <= cap).only_enforce_if(x)
    return m, goal


# The coarse chains bound's first model, in (value, critical stage) pairs:
# small enough that CP-SAT's root cuts lift its bound within seconds, where
# on the whole model they never finish (gpt_l2_w64 at 0.8: 56 of 111
# stages, 13,000 variables, 3.85% of the base cost at 14 s; all stages with
# every horizon, 3.44% after 60 s; the 9,652-node decoder on 8 stages, 2.65%
# at 30 s, where the gaps relaxation gives 2.27%). A model solved to
# optimality with time left is followed by one on twice as many stages.
COARSE_PAIRS = 20_000
# Entries one recompute past a value's life: a dropped value's producers are
# kept or recomputed for it, theirs are free. As strong as every horizon on
# gpt_l2_w64 (3.85% against 3.87% on 56 stages), with half the variables.
# Not where the whole chains model (every stage, every horizon) fits in
# COARSE_PAIRS: then that model is solved, as strong as any coarser one at
# its optimum and stronger in the time on random_layered_n250 at 0.8 (2.91%
# of the base cost in 15 s, against 2.64% with one hop; 40 s: 3.00% and
# 2.70%; gpt_l2_w64 at 0.8: 4.05% either way; random_layered_n500 at 0.9:
# 0.234% against 0.261%, one hop's model proven at 28 s).
COARSE_HOPS = 1
COARSE_MIN_ROWS = 4


def coarse_bound(graph: Graph, q: Question, how: How) -> WholeBound:
    """The chains relaxation on spread subsets of the critical stages
    (:func:`spread`), each value's entries one recompute past its life:
    fewer memory checks and coarser intervals, so a weaker relaxation whose
    bound CP-SAT proves where the whole chains model's it does not. First
    on as many stages as COARSE_PAIRS pairs allow (the whole chains model
    where it fits, see COARSE_HOPS), then on twice as many
    while each is solved to optimality in the time (and work) left; the best bound of
    them all (an INFEASIBLE one shows the whole staged space empty)."""
    began = now()
    deadline = began + how.time_limit
    try:
        shape = _Lifetimes(graph, level="chains", offload=q.offload, unit=q.unit, cap=_floor(q), deadline=deadline)
    except OutOfTime:
        return WholeBound("UNKNOWN", None, now() - began)
    if shape.pairs <= COARSE_PAIRS:  # the whole chains model is small: it is the first model and the last
        rows = len(shape.critical)
    else:
        rows = _rows_within(shape, COARSE_PAIRS)
    best, status, work = None, "UNKNOWN", 0.0
    while deadline - now() > 0.2:
        try:
            m, goal = _relaxation(graph, q, shape, deadline)
        except OutOfTime:
            break
        left = replace(how, work=None if how.work is None else how.work - work)
        r = solve_relaxation(m, goal, began, left, strong=True)
        work += r.work
        if r.status == "INFEASIBLE":
            return WholeBound("INFEASIBLE", None, now() - began, work=work)
        if r.bound is not None:
            best = max(best or 0, r.bound)
        status = r.status
        if r.interrupted or r.status != "OPTIMAL" or rows == len(shape.critical):
            return WholeBound(status, best, now() - began, r.interrupted, work)
        rows = min(2 * rows, len(shape.critical))
        shape.select(rows, COARSE_HOPS)
    return WholeBound(status, best, now() - began, work=work)


def _rows_within(shape: "_Lifetimes", pairs: int) -> int:
    """The most critical stages (at least COARSE_MIN_ROWS) whose model has at
    most ``pairs`` pairs, selected into ``shape``; returns how many."""
    lo, hi = min(COARSE_MIN_ROWS, len(shape.critical)), len(shape.critical)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        shape.select(mid, COARSE_HOPS)
        lo, hi = (mid, hi) if shape.pairs <= pairs else (lo, mid - 1)
    shape.select(lo, COARSE_HOPS)
    return lo


class _Lifetimes:
    """Each value's points (its stage, its consumers' stages, the end for
    outputs) and life, the critical stages (all of them, or ``rows`` of
    them), how far each value's variables reach (``reach``), and how many
    (value, critical stage) pairs the model makes (``pairs``).

    A value's variables reach past its last point up to its horizon: it may
    be kept, or recomputed, for a consumer's recompute. ``hops`` limits that
    to consumers ``hops`` recomputes away (0: the value's own life); a
    recompute whose producer's variables stop short of its row then needs
    nothing from that producer, which only relaxes the model further."""

    def __init__(self, graph: Graph, *, level: str, offload: bool, unit: int, cap: int,
                 deadline: float | None = None, rows: int | None = None, hops: int | None = None):
        g = graph
        self.level = level
        self.ix = ix = Stages(g, offload)
        T = ix.T
        self.size = size = [b // unit for b in g.bytes]
        self.points: dict[int, set[int]] = {}
        self.life: dict[int, tuple[int, int]] = {}
        alive = [0] * (T + 1)
        for i in ix.values:
            check_time(deadline)
            self.points[i] = ({ix.first[j] for j in g.succs[i] if ix.first[j] >= 0}
                              | ({T - 1} if g.nodes[i].output else set()) | ({ix.first[i]} - {-1}))
            self.life[i] = (max(ix.first[i], 0), max(self.points[i], default=-1))
            if self.life[i][1] >= self.life[i][0]:
                alive[self.life[i][0]] += size[i]
                alive[self.life[i][1] + 1] -= size[i]
        alive = list(itertools.accumulate(alive))[:T]
        # with slot memory, a stage within one value of the cap may overflow at a recompute's slot
        floor = cap - (max((size[i] for i in ix.values), default=0) if level == "slots" else 0)
        self.graph, self.alive = g, alive
        self.critical = [s for s in range(T) if alive[s] > floor]
        self.select(rows, hops)

    def select(self, rows: int | None, hops: int | None) -> None:
        """Check memory at ``rows`` of the critical stages (None: all) with
        entries reaching ``hops`` recomputes past a value's life (None: its
        horizon); sets ``crit``, ``reach`` and ``pairs``."""
        self.crit = crit = self.critical if rows is None else spread(self.critical, self.alive, rows)
        self.reach = self.reach_of(self.graph, hops)
        self.pairs = sum(bisect.bisect_left(crit, self.reach[i]) - bisect.bisect_left(crit, self.life[i][0])
                         for i in self.ix.values)

    def reach_of(self, g: Graph, hops: int | None) -> dict[int, int]:
        """The stage before which each value's variables exist: its horizon,
        or with ``hops`` h, its consumers' reach at h - 1 (0: one past its
        last point), whichever comes first."""
        ix = self.ix
        reach = {i: ix.horizon[i] for i in ix.values}
        if hops is None:
            return reach
        own = {i: self.life[i][1] + 1 for i in ix.values}
        near = dict(own)
        for _ in range(hops):
            near = {i: max([own[i]] + [near[c] for c in g.succs[i] if c in near and ix.recomputable[c]])
                    for i in ix.values}
        return {i: min(reach[i], near[i]) for i in ix.values}


def spread(crit: list[int], alive: list[int], rows: int) -> list[int]:
    """``rows`` of the critical stages ``crit``, evenly spaced, with the one
    where most is alive among them. Checking memory at fewer stages only
    relaxes the model (and coarsens its intervals): a smaller model whose
    bound CP-SAT proves sooner."""
    if len(crit) <= rows:
        return crit
    step = len(crit) / rows
    keep = {crit[int(k * step)] for k in range(rows)} | {max(crit, key=lambda s: alive[s])}
    return sorted(keep)


class _Model:
    """The relaxation's variables and its structural constraints (all but
    memory caps and the objective), as in the module docstring."""

    def __init__(self, graph: Graph, shape: _Lifetimes, deadline: float | None = None,
                 members: Collection[int] | None = None):
        """``members``: only these values get entries (default: all); a
        recompute then needs nothing of a producer outside them."""
        g, ix, crit = graph, shape.ix, shape.crit
        values = ix.values if members is None else sorted(set(members) & set(ix.values))
        inside = set(values)
        points, life, T = shape.points, shape.life, ix.T
        self.size = size = shape.size
        self.model = m = cp_model.CpModel()
        pres: dict[tuple[int, int], cp_model.IntVar | int] = {}
        self.rc: dict[tuple[int, int], cp_model.IntVar] = {}
        self.pf: dict[tuple[int, int], cp_model.IntVar] = {}
        self.O: dict[int, cp_model.IntVar] = {}

        reach = shape.reach

        def back_y(i: int, k: int) -> list:
            """rc[i,k] and pf[i,k], made on first use: re-materialising i in
            I_k serves a later point of i or a consumer's recompute."""
            lo = life[i][0]
            if (i, k) not in made:
                made.add((i, k))
                if lo <= crit[k] < reach[i] and ix.first[i] <= crit[k]:
                    if ix.recomputable[i]:
                        self.rc[i, k] = m.new_bool_var(f"rc[{i},{k}]")
                        todo.append((i, k))
                    if ix.offloadable[i]:
                        self.pf[i, k] = m.new_bool_var(f"pf[{i},{k}]")
                        if i not in self.O:
                            self.O[i] = m.new_bool_var(f"O[{i}]")
                        m.add_implication(self.pf[i, k], self.O[i])
            return [x for x in (self.rc.get((i, k)), self.pf.get((i, k))) if x is not None]

        def back(i: int, k: int) -> list:
            """The terms of pres[i,k] + rc[i,k] + pf[i,k]."""
            return [x for x in [pres.get((i, k), 0)] + back_y(i, k) if not _fixed(x, 0)]

        made: set[tuple[int, int]] = set()
        todo: deque[tuple[int, int]] = deque()  # recomputes whose producers are still to be required
        span: dict[int, range] = {}  # the rows each value has entries at
        for i in values:
            check_time(deadline)
            lo, last = life[i]
            droppable = ix.recomputable[i] or ix.offloadable[i]
            span[i] = range(bisect.bisect_left(crit, lo), bisect.bisect_left(crit, max(reach[i], last + 1)))
            for k in span[i]:
                c = crit[k]
                if c in points[i] or (c <= last and not droppable):
                    pres[i, k] = 1
                elif c < reach[i]:
                    pres[i, k] = m.new_bool_var(f"pres[{i},{k}]")
                back_y(i, k)  # all of them, in this order: made lazily, n250 at 0.9 takes 14 s to prove, not 2 s

        for i in values:
            check_time(deadline)
            first = bisect.bisect_left(crit, ix.first[i]) if ix.first[i] >= 0 else 0
            for k in range(first, span[i].stop):  # past its entries a value has no constraint
                if k and k - 1 >= first and (i, k) in pres and pres[i, k] is not pres.get((i, k - 1)):
                    self.at_least(back(i, k - 1), pres[i, k])  # (the same variable, or both fixed at 1: nothing)
                nxt = crit[k + 1] if k + 1 < len(crit) else T
                if not _fixed(pres.get((i, k), 0), 1) and any(crit[k] < u < nxt for u in points[i]):
                    self.at_least(back(i, k), 1)
        while todo:
            i, k = todo.popleft()
            for p in g.preds[i]:
                if p not in inside or ix.first[p] > crit[k] or _fixed(pres.get((p, k), 0), 1):
                    continue
                if max(reach[p], life[p][1] + 1) <= crit[k] < ix.horizon[p]:
                    continue  # p's entries stop short of row k (hops): the recompute needs nothing of p
                self.at_least(back(p, k), self.rc[i, k])
        by_row: list[list[int]] = [[] for _ in crit]
        for (i, k) in pres:
            by_row[k].append(i)
        self.loads = [sum(size[i] * pres[i, k] for i in sorted(by_row[k])) for k in range(len(crit))]
        self.slot_loads = []
        if shape.level == "slots":
            self.add_slot_loads(g, ix, crit, size, pres, back_y)

    def add_slot_loads(self, g: Graph, ix: Stages, crit: list[int], size: list[int], pres: dict,
                       back_y) -> None:
        """Memory at the slot of a recompute of i in stage r = c_{k+1} = c_k + 1
        (the only case where its stage is known): what is resident at v_r's
        first computation, less v_r and what is re-materialised after i's slot
        (``after``, suffix sums over program order), plus i and its producers:

            load[k+1] - size(v_r) - after(pos(i)) + size(i) (1 - pres[i,k+1])
                + sum_p size(p) (1 - pres[p,k+1]) <= cap        if rc[i,k]
        """
        m, pos = self.model, ix.pos
        total = sum(size)
        for k in range(len(crit) - 1):
            if crit[k + 1] != crit[k] + 1:
                continue  # a recompute's stage, hence its slot's memory, is unknown
            vr = ix.stage_node[crit[k + 1]]
            mats = sorted((pos[v], v) for v in ix.values if back_y(v, k))
            after: list = [0] * (len(mats) + 1)  # after[j]: sizes re-materialised at mats[j:]
            for j in range(len(mats) - 1, -1, -1):
                v = mats[j][1]
                after[j] = m.new_int_var(0, total, f"after[{k},{j}]")
                m.add(after[j] == size[v] * sum(back_y(v, k)) + after[j + 1])
            load = m.new_int_var(0, total, f"slotload[{k}]")
            m.add(load == self.loads[k + 1])
            for i in ix.values:
                x = self.rc.get((i, k))
                if x is None:
                    continue
                j = bisect.bisect_right(mats, (pos[i], g.n))
                e = [load, -size[vr] * pres.get((vr, k + 1), 0), -after[j], size[i] * (1 - pres.get((i, k + 1), 0))]
                e += [size[p] * (1 - pres.get((p, k + 1), 0)) for p in g.preds[i] if not g.nodes[p].persistent]
                self.slot_loads.append((sum(e), x))

    def at_least(self, terms: list, rhs) -> None:
        """sum(terms) >= rhs, where both sides may be plain 0/1 constants."""
        if any(not isinstance(x, int) for x in terms) or not isinstance(rhs, int):
            self.model.add(sum(terms) >= rhs)
        elif sum(terms) < rhs:
            self.model.add_bool_or([])  # no re-materialisation can meet a use: infeasible

    def cost(self, int_cost: tuple[int, ...], int_transfer: tuple[int, ...]) -> cp_model.LinearExpr:
        terms = ([(int_cost[i], x) for (i, k), x in self.rc.items()]
                 + [(int_transfer[i], x) for (i, k), x in self.pf.items()]
                 + [(int_transfer[i], x) for i, x in self.O.items()])
        return cp_model.LinearExpr.weighted_sum([x for _, x in terms], [c for c, _ in terms])


def _fixed(x: object, value: int) -> bool:
    """Whether a relaxation entry is the constant ``value`` rather than a variable."""
    return isinstance(x, int) and x == value
