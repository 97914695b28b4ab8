"""The gaps relaxation (the first level of :mod:`.chains`'s) at any size: built
with numpy, its memory rows chained so that the model has a few variables
per value rather than one term per (value, critical stage).

Without producer constraints the relaxation falls apart into *runs*: a run is
one droppable value's critical stages strictly between two of its points (its
stage, its consumers' stages, the end for outputs; an input's life opens
before its first point). A run is kept (its bytes count at each of its
critical stages) or dropped, and then pays one re-materialisation before the
point that ends it: a recompute, or with offload a prefetch plus the value's
one offload. With ``d[r] = rc[r] + pf[r]`` (1: run r dropped):

    sum_{r covers k} size(r) d[r] >= alive[k] - cap      (each critical stage k)
    rc[r] + pf[r] <= 1,  pf[r] <= O[i]                    (r a run of value i)
    minimise  sum cost(i) rc[r] + transfer(i) (pf[r] + O[i])

(peak: ``alive[k] - M`` on the right, minimise M.) This is the gaps
relaxation itself: its pres variable of a gap is ``1 - d[r]``, and its
constraint that a value kept into a gap was resident before it is implied by
the re-materialisation that the previous gap's end needs. A run covers a
contiguous range of rows, so between two rows where no run starts or ends
(a *segment*) only the largest ``alive`` counts, and the dropped units of
segment j carry over from segment j-1:

    F[j] = F[j-1] + sum_{r opens at j} size(r) d[r] - sum_{r closed before j} size(r) d[r]

with ``F[j] >= alive[j] - cap`` as its lower bound. On the 10,084-node GPT
decoder at 0.6 that is 4,413 runs and 4,465 segments where the rows hold 6.4
million (run, stage) terms: built in 0.1 s (the per-pair model did not build
in 60 s), and CP-SAT's bound is within 1e-5 of the optimum after 3 s.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from ortools.sat.python import cp_model

from ....graph import Graph
from ...meter import now
from ..stages import Stages
from .question import How, Question, WholeBound
from .solver import solve_relaxation


def gaps_bound(graph: Graph, q: Question, how: How) -> WholeBound:
    """The gaps relaxation of ``q`` solved as ``how`` says (``how.ix``: the
    full staged space's :class:`Stages`, when at hand)."""
    began = now()
    m, goal = gaps_model(graph, q, how.ix)
    return solve_relaxation(m, goal, began, how)


@dataclass(frozen=True)
class Runs:
    """The gaps relaxation as arrays. Rows are the critical stages ``crit``
    (ascending), ``alive[k]`` the units alive at row k, of which ``fixed[k]``
    stay whatever the plan. Per run: its value, its rows ``a..b``
    (inclusive), its size in units, and whether it may be recomputed or
    prefetched."""

    crit: np.ndarray
    alive: np.ndarray
    fixed: np.ndarray
    value: np.ndarray
    a: np.ndarray
    b: np.ndarray
    size: np.ndarray
    can_rc: np.ndarray
    can_pf: np.ndarray


def gap_runs(graph: Graph, ix: Stages, unit: int, floor: int) -> Runs:
    """The runs of ``graph`` (its values as ``ix`` says; sizes in ``unit``
    bytes, rounded down as in every relaxation) over the critical stages,
    those where more than ``floor`` units are alive."""
    g, T = graph, ix.T
    first = np.asarray(ix.first, dtype=np.int64)
    vals = np.asarray(ix.values, dtype=np.int64)
    is_val = np.zeros(g.n, dtype=bool)
    is_val[vals] = True
    size = np.asarray(g.bytes, dtype=np.int64) // unit
    droppable = np.asarray(ix.recomputable) | np.asarray(ix.offloadable)
    # every (value, point) pair, sorted by value then stage
    src = np.fromiter((i for j in range(g.n) for i in g.preds[j]), dtype=np.int64)
    dst = np.fromiter((j for j in range(g.n) for _ in g.preds[j]), dtype=np.int64)
    edge = is_val[src] & (first[dst] >= 0)
    out = vals[np.asarray([g.nodes[i].output for i in ix.values], dtype=bool)]
    own = vals[first[vals] >= 0]
    key = np.unique(np.concatenate([src[edge] * (T + 1) + first[dst[edge]], own * (T + 1) + first[own],
                                    out * (T + 1) + T - 1]))
    pv, pp = key // (T + 1), key % (T + 1)
    # each value's life: from its first point (stage 0 for an input) to its last
    starts = np.r_[0, np.flatnonzero(pv[1:] != pv[:-1]) + 1]
    owner, last = pv[starts], pp[np.r_[starts[1:], len(pv)] - 1]
    lo = np.where(first[owner] < 0, 0, pp[starts])
    alive = np.zeros(T + 1, dtype=np.int64)
    np.add.at(alive, lo, size[owner])
    np.add.at(alive, last + 1, -size[owner])
    crit = np.flatnonzero(np.cumsum(alive)[:T] > floor)
    alive = np.cumsum(alive)[crit]
    rows = len(crit)
    # fixed: a droppable value at its points, any other over its whole life
    fixed = np.zeros(rows + 1, dtype=np.int64)
    hard = ~droppable[owner]
    np.add.at(fixed, np.searchsorted(crit, lo[hard]), size[owner[hard]])
    np.add.at(fixed, np.searchsorted(crit, last[hard], side="right"), -size[owner[hard]])
    fixed = np.cumsum(fixed)[:rows]
    at = np.searchsorted(crit, pp)
    hit = droppable[pv] & (at < rows)
    hit[hit] = crit[at[hit]] == pp[hit]
    np.add.at(fixed, at[hit], size[pv[hit]])
    # runs: the rows strictly between two consecutive points of a droppable
    # value (an input's first point opens a gap from before stage 0)
    opened = first[owner] < 0
    pv = np.concatenate([pv, owner[opened]])
    pp = np.concatenate([pp, np.full(int(opened.sum()), -1)])
    order = np.lexsort((pp, pv))
    pv, pp = pv[order], pp[order]
    same = (pv[1:] == pv[:-1]) & droppable[pv[:-1]]
    v = pv[:-1][same]
    a = np.searchsorted(crit, pp[:-1][same], side="right")
    b = np.searchsorted(crit, pp[1:][same], side="left") - 1
    run = (a <= b) & (size[v] > 0)  # a run of no bytes never helps
    v, a, b = v[run], a[run], b[run]
    return Runs(crit, alive, fixed, v, a, b, size[v], np.asarray(ix.recomputable)[v],
                np.asarray(ix.offloadable)[v])


def segments(r: Runs) -> tuple[np.ndarray, np.ndarray]:
    """The first row of each segment (rows where no run starts or ends
    between) and its largest ``alive``."""
    n = len(r.crit)
    cut = np.zeros(n + 1, dtype=bool)
    cut[[0, *r.a.tolist(), *(r.b + 1).tolist()]] = True
    start = np.flatnonzero(cut[:n])
    return start, np.maximum.reduceat(r.alive, start) if n else r.alive


class _Chain:
    """The CP-SAT model of the module docstring: ``rc``/``pf`` per run
    (None where not allowed), ``O`` per value, and the chain ``F``."""

    def __init__(self, r: Runs, int_cost: tuple[int, ...], int_transfer: tuple[int, ...]):
        self.model = m = cp_model.CpModel()
        n = len(r.a)
        self.rc = [m.new_bool_var(f"rc[{k}]") if r.can_rc[k] else None for k in range(n)]
        self.pf = [m.new_bool_var(f"pf[{k}]") if r.can_pf[k] else None for k in range(n)]
        self.O: dict[int, cp_model.IntVar] = {}
        cost = []
        for k, v in enumerate(r.value.tolist()):
            if self.rc[k] is not None:
                cost.append((int_cost[v], self.rc[k]))
            if self.pf[k] is not None:
                if v not in self.O:
                    self.O[v] = m.new_bool_var(f"O[{v}]")
                    cost.append((int_transfer[v], self.O[v]))
                cost.append((int_transfer[v], self.pf[k]))
                m.add_implication(self.pf[k], self.O[v])
                if self.rc[k] is not None:
                    m.add(self.rc[k] + self.pf[k] <= 1)
        self.cost = cp_model.LinearExpr.weighted_sum([x for _, x in cost], [c for c, _ in cost])
        self.start, self.need = segments(r)
        d = [[x for x in (self.rc[k], self.pf[k]) if x is not None] for k in range(n)]
        nseg = len(self.start)
        opens, closes = np.searchsorted(self.start, r.a), np.searchsorted(self.start, r.b + 1)
        by_open, by_close = np.argsort(opens, kind="stable"), np.argsort(closes, kind="stable")
        o_at = np.searchsorted(opens[by_open], np.arange(nseg + 1))
        c_at = np.searchsorted(closes[by_close], np.arange(nseg + 1))
        size = r.size.tolist()
        cover = r.alive[self.start] - r.fixed[self.start]
        self.F: list[cp_model.IntVar] = []
        for j in range(nseg):
            xs, cs = [], []
            for k, sign in [(k, 1) for k in by_open[o_at[j]:o_at[j + 1]].tolist()] + \
                           [(k, -1) for k in by_close[c_at[j]:c_at[j + 1]].tolist()]:
                xs += d[k]
                cs += [sign * size[k]] * len(d[k])
            f = m.new_int_var(0, int(cover[j]), f"F[{j}]")
            change = cp_model.LinearExpr.weighted_sum(xs, cs)
            m.add(f == (change if not self.F else self.F[-1] + change))
            self.F.append(f)


def gaps_model(graph: Graph, q: Question, ix: Stages | None = None) -> tuple[cp_model.CpModel, cp_model.LinearExpr]:
    """The gaps relaxation of question ``q`` (values as ``ix`` says, default
    the full staged space's) and the objective it minimises: the cost under
    the memory cap, or the largest critical memory M (from ``q.peak_floor``)
    with the cost under the overhead cap."""
    ix = ix if ix is not None else Stages(graph, q.offload)
    peak = q.objective != "overhead"
    r = gap_runs(graph, ix, q.unit, q.peak_floor if peak else q.cap_units)
    c = _Chain(r, q.int_cost, q.int_transfer)
    m = c.model
    if q.max_recomputes is not None:
        m.add(sum(x for x in c.rc if x is not None) <= q.max_recomputes)
    if not peak:
        for f, need in zip(c.F, c.need.tolist()):
            if need > q.cap_units:
                m.add(f >= need - q.cap_units)
        return m, c.cost
    top = max(int(r.alive.max(initial=0)), q.peak_floor)
    goal = m.new_int_var(q.peak_floor, top, "M")
    for f, need in zip(c.F, c.need.tolist()):
        m.add(f + goal >= need)
    if q.overhead_cap is not None:
        m.add(c.cost <= q.overhead_cap)
    return m, goal
