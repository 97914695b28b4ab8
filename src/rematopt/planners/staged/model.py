"""The staged formulation (``cpsat`` searches it, ``rotor`` solves its stages in it), written once against a tiny backend
interface so CP-SAT (the exact model) and GLOP (its LP relaxation) are built
by the same code. ``docs/cpsat.md`` states it as mathematics, family by family;
each ``add_*`` function below is one family, its inequalities in its docstring,
and so are the objectives and side caps (:func:`build` puts them together).

Notation. Stages ``s = 0..T-1`` follow the compute nodes in program order;
``v_s`` is first computed in stage ``s``. A stage sweeps the *slots* of the
nodes at positions ``0..pos(v_s)`` in program order: at its slot a node may be
computed (R) or prefetched (P), and after a slot the values whose last in-stage
use it was are freed (F) unless kept into the next stage (S). ``A[s,i] =
S[s,i] + R[s,i] + P[s,i]`` says i is available in stage s. Memory U is
tracked in units of ``gcd`` of all byte sizes (exact), costs as integers
(see :func:`.units.integer_scale`).
"""

from __future__ import annotations

import bisect
import math
import time
from dataclasses import dataclass
from typing import Any, Protocol

from ...graph import Graph
from ..meter import past
from .limits import Limits
from .stages import Stages
from .units import cap_units, int_costs, memory_unit, overhead_cap_units, peak_floor_units

# -- backend interface -------------------------------------------------------


class Backend(Protocol):
    """What the formulation needs from a solver: 0/1 and integer variables,
    two-sided linear constraints, and a linear objective."""

    def bool_var(self, name: str) -> Any: ...
    def int_var(self, lb: int, ub: int, name: str) -> Any: ...
    def add(self, terms: list[tuple[int, Any]], lb: float, ub: float) -> None: ...
    def minimize(self, terms: list[tuple[int, Any]]) -> None: ...


INF = math.inf


class Lin:
    """A linear expression over backend variables and 0/1 constants: the
    formulation fixes many (stage, value) entries, and folding them into the
    bounds keeps the constraints small."""

    __slots__ = ("terms", "const")

    def __init__(self) -> None:
        self.terms: list[tuple[int, Any]] = []
        self.const = 0

    def add(self, coef: int, x: Any) -> "Lin":
        if isinstance(x, int):
            self.const += coef * x
        elif coef:
            self.terms.append((coef, x))
        return self


def lin(*pairs: tuple[int, Any]) -> Lin:
    e = Lin()
    for c, x in pairs:
        e.add(c, x)
    return e


def constrain(backend: Backend, e: Lin, lb: float, ub: float) -> None:
    """``lb <= e <= ub``; constraints left with no variables are dropped (the
    index construction guarantees they hold)."""
    if e.terms:
        backend.add(e.terms, lb - e.const, ub - e.const)


# The most (stage, value) terms the memory accounting writes out at stage
# starts; past it, memory is chained from stage to stage instead
# (:meth:`Formulation.add_memory_accounting`).
DIRECT_TERMS = 1_000_000

# -- building within the deadline ----------------------------------------------


class OutOfTime(Exception):
    """Building a model ran past the solve's deadline: the 9,652-node decoder's
    depth-1 model took 290 s of Python loops, where the time limit is the
    whole command's."""


def check_time(deadline: float | None) -> None:
    """Raise OutOfTime once ``deadline`` (on the run's :mod:`..meter`) has passed, or its wall clock."""
    if past(deadline):
        raise OutOfTime


# -- the formulation -----------------------------------------------------------


class Formulation:
    """Variables of the staged model and the constraint families that tie them.

    Entries that the index fixes are plain ints (0 or 1), everything else a
    backend variable: ``S[s,i]`` kept into stage s, ``R[s,i]`` computed in
    stage s, ``P[s,i]`` prefetched in stage s, ``O[i]`` offloaded once (right
    after its first computation; inputs: at the start), ``F[s,i,q]`` freed
    right after slot q (position of i or of a consumer), ``U[s,q]`` memory
    (in ``unit`` bytes) right after slot q's compute or prefetch.
    """

    def __init__(self, graph: Graph, backend: Backend, *, offload: bool = False,
                 transfer_cost_per_byte: float = 0.0, cost_scale: int = 1, mem_cap_bytes: int | None = None,
                 depth: int | None = None, also: dict[int, set[int]] | None = None,
                 deadline: float | None = None, round_down: bool = False):
        self.graph = graph
        self.b = backend
        self.deadline = deadline  # building raises OutOfTime past it
        self.ix = Stages(graph, offload, depth, also)
        self.unit, self.memory_exact = memory_unit(graph)
        # Where the unit is not exact, sizes rounded up make every plan of the
        # model fit the true budget (its plans are valid, its INFEASIBLE and
        # bound prove nothing); rounded down (``round_down``), every true plan
        # fits the model (its INFEASIBLE and bound hold, its plans may not fit).
        self.round_down = round_down
        self.size = [x // self.unit if round_down else -(-x // self.unit) for x in graph.bytes]
        self.cost_scale = cost_scale
        self.int_cost, self.int_transfer = int_costs(graph, cost_scale, transfer_cost_per_byte)
        self.persistent_bytes = graph.persistent_bytes
        self.initial_bytes = graph.initial_bytes
        # the largest memory (units, persistent bytes aside) any slot may use
        self.mem_cap = sum(self.size) if mem_cap_bytes is None else cap_units(graph, self.unit, mem_cap_bytes)
        self.S: dict[tuple[int, int], Any] = {}
        self.R: dict[tuple[int, int], Any] = {}
        self.P: dict[tuple[int, int], Any] = {}
        self.O: dict[int, Any] = {}
        self.F: dict[tuple[int, int, int], Any] = {}
        self.U: dict[tuple[int, int], Any] = {}
        self.make_variables()

    # -- variables ---------------------------------------------------------

    def make_variables(self) -> None:
        """Entries only where a value is *active*: its first stage, the stages
        where it may be materialised or read, and its horizon. Between two
        active stages it is only carried (``S[s+1,i] = S[s,i]``): one
        variable, made at the stage after the first of them, and no entry
        at the carrying stages themselves (:meth:`kept_key` finds it)."""
        ix, b, g = self.ix, self.b, self.graph
        remat: dict[int, list[int]] = {}
        for s, i in ix.remat_pairs():
            remat.setdefault(i, []).append(s)
        for i in ix.values:
            check_time(self.deadline)
            if ix.first[i] >= 0:
                self.R[ix.first[i], i] = 1
            for s in remat.get(i, ()):
                if ix.may_compute(s, i):
                    self.R[s, i] = b.bool_var(f"R[{s},{i}]")
                if ix.may_prefetch(s, i):
                    self.P[s, i] = b.bool_var(f"P[{s},{i}]")
            if remat.get(i) and any((s, i) in self.P for s in remat[i]):
                self.O[i] = b.bool_var(f"O[{i}]")
        values = set(ix.values)
        reads: dict[int, set[int]] = {}
        self._consumers: dict[tuple[int, int], list[int]] = {}
        for (s, j) in self.R:
            for i in g.preds[j]:
                if i in values:
                    reads.setdefault(i, set()).add(s)
        self.active: dict[int, list[int]] = {}
        self.points: dict[int, list[int]] = {}  # stages where i's S variables are made
        self.keyed: dict[int, list[int]] = {}  # stages (< T) with an S entry: the points and active stages
        for i in ix.values:
            check_time(self.deadline)
            first, horizon = ix.first[i], ix.horizon[i]
            mats = [s for s in [first] + remat.get(i, []) if s >= 0]
            # (an output's consumer may be recomputed past i's horizon: not from i)
            act = sorted({s for s in set(mats) | reads.get(i, set()) if s <= horizon} | {horizon})
            self.active[i] = act
            for s in act:
                self._consumers[s, i] = [j for j in g.succs[i] if (s, j) in self.R]
            points = sorted({first + 1} | {a + 1 for a in act}) if first + 1 <= horizon else []
            self.points[i] = points = [c for c in points if c <= horizon]
            for c in points:
                self.S[c, i] = b.bool_var(f"S[{c},{i}]")
            for s in act:
                if s > first and (s, i) not in self.S:
                    self.S[s, i] = self.S[points[bisect.bisect_right(points, s) - 1], i]
            self.keyed[i] = sorted(set(points) | {s for s in act if s > first})
            if g.nodes[i].output:
                self.S[ix.T, i] = 1
        for s in range(ix.T):
            check_time(self.deadline)
            for q in self.slots(s):
                for i in self.freeable_at(s, q):
                    self.F[s, i, q] = b.bool_var(f"F[{s},{i},{q}]")
        for s in range(ix.T):
            check_time(self.deadline)
            for q in self.slots(s):
                self.U[s, q] = b.int_var(0, self.mem_cap, f"U[{s},{q}]")

    def kept_into_first(self) -> list[tuple[int, Any]]:
        """(i, S[0,i]) for the inputs that may be kept into stage 0, by id."""
        return [(i, self.S[0, i]) for i in self.ix.values if self.ix.first[i] < 0 and (0, i) in self.S]

    def kept_by_stage(self) -> list[list[tuple[int, Any]]] | None:
        """For each stage, (i, S variable) for every value that may be resident
        when it starts (by id), or None past DIRECT_TERMS entries."""
        ix = self.ix
        if ix.count_pairs() > DIRECT_TERMS:
            return None
        kept: list[list[tuple[int, Any]]] = [[] for _ in range(ix.T)]
        for i in ix.values:
            points = self.points[i] + [ix.horizon[i] + 1]
            for c, end in zip(points, points[1:]):
                for s in range(c, min(end, ix.T)):
                    kept[s].append((i, self.S[c, i]))
        return kept

    def kept_key(self, s: int, i: int) -> tuple[int, int] | None:
        """The key of ``S`` that says whether i is resident when stage s
        starts (carrying stages share the entry made after the last active
        one), or None where i cannot be (outside its life)."""
        if s == self.ix.T:
            return (s, i) if (s, i) in self.S else None
        points = self.points.get(i, ())
        k = bisect.bisect_right(points, s) - 1
        return (points[k], i) if k >= 0 and s <= self.ix.horizon[i] else None

    def s(self, s: int, i: int) -> Any:
        return self.S.get((s, i), 0)

    def r(self, s: int, i: int) -> Any:
        return self.R.get((s, i), 0)

    def p(self, s: int, i: int) -> Any:
        return self.P.get((s, i), 0)

    def available(self, s: int, i: int) -> Lin:
        """A[s,i] = S[s,i] + R[s,i] + P[s,i]."""
        return lin((1, self.s(s, i)), (1, self.r(s, i)), (1, self.p(s, i)))

    def consumers(self, s: int, i: int) -> list[int]:
        """Consumers of i that may be computed in stage s (s active for i)."""
        return self._consumers.get((s, i), [])

    def materialises(self, s: int, i: int) -> bool:
        return (s, i) in self.R or (s, i) in self.P

    def slots(self, s: int) -> list[int]:
        """Positions in stage s where a value may be computed or prefetched:
        the only points where memory can reach a new maximum."""
        if not hasattr(self, "_slots"):
            by_stage: list[list[int]] = [[] for _ in range(self.ix.T)]
            for (t, i) in list(self.R) + list(self.P):
                if t < self.ix.T:
                    by_stage[t].append(self.ix.pos[i])
            self._slots = [sorted(set(x)) for x in by_stage]
        return self._slots[s]

    def free_points(self, s: int, i: int) -> list[int]:
        """Q(s,i): slots after which i may be freed in stage s (its own slot if
        it may materialise there, and the slots of its possible consumers)."""
        own = [self.ix.pos[i]] if self.materialises(s, i) else []
        return own + [self.ix.pos[j] for j in self.consumers(s, i)]

    def freeable_at(self, s: int, q: int) -> list[int]:
        if not hasattr(self, "_freeable"):
            self._freeable: dict[tuple[int, int], list[int]] = {}
            for i in self.ix.values:
                for t in self.active[i]:
                    for point in self.free_points(t, i):
                        self._freeable.setdefault((t, point), []).append(i)
        return self._freeable.get((s, q), [])

    # -- constraint families ------------------------------------------------

    def add_all(self) -> None:
        self.add_exclusive_availability()
        self.add_usefulness()
        self.add_dependency_constraints()
        self.add_free_constraints()
        self.add_offload_constraints()
        self.add_memory_accounting()

    def add_exclusive_availability(self) -> None:
        """S[s,i] + R[s,i] + P[s,i] <= 1: a value resident at a stage's start
        is never re-materialised in it (freeing it first and recomputing at its
        slot is the same plan as not keeping it: S=0, R=1)."""
        for i in self.ix.values:
            check_time(self.deadline)
            for s in self.active[i]:
                constrain(self.b, self.available(s, i), -INF, 1)

    def add_usefulness(self) -> None:
        """S[s,i] + R[s,i] + P[s,i] <= S[s+1,i] + sum_{j consumer} R[s,j] for
        every s > first(i): nothing is kept or re-materialised that no one
        reads (dropping it only lowers memory and cost)."""
        for i in self.ix.values:
            check_time(self.deadline)
            for s in self.active[i]:
                if s == self.ix.first[i]:
                    continue
                e = self.available(s, i).add(-1, self.s(s + 1, i))
                for j in self.consumers(s, i):
                    e.add(-1, self.r(s, j))
                constrain(self.b, e, -INF, 0)

    def add_dependency_constraints(self) -> None:
        """R[s,j] <= S[s,i] + R[s,i] + P[s,i] for every non-persistent
        predecessor i of j: a computation needs its inputs resident (kept from
        the previous stage, or materialised at their earlier slot)."""
        g = self.graph
        for (s, j), rv in self.R.items():
            check_time(self.deadline)
            for i in g.preds[j]:
                if g.nodes[i].persistent:
                    continue
                constrain(self.b, self.available(s, i).add(-1, rv), 0, INF)

    def add_free_constraints(self) -> None:
        """For every (s, i) with consumers j in stage s and free points Q:

        sum_{q in Q} F[s,i,q] + S[s+1,i] = A[s,i]    (freed once, or kept)
        F[s,i,pos(j)] <= R[s,j],  F[s,i,pos(i)] <= R[s,i] + P[s,i]   (freed after a real use)
        R[s,j] + sum_{q in Q, q < pos(j)} F[s,i,q] <= 1               (not freed before a use)
        """
        pos = self.ix.pos
        for i in self.ix.values:
            check_time(self.deadline)
            for s in self.active[i]:
                points = self.free_points(s, i)
                e = lin(*((1, self.F[s, i, q]) for q in points))
                e.add(1, self.s(s + 1, i))
                for c, x in self.available(s, i).terms:
                    e.add(-c, x)
                e.const -= self.available(s, i).const
                constrain(self.b, e, 0, 0)
                if self.materialises(s, i):
                    constrain(self.b, lin((1, self.F[s, i, pos[i]]), (-1, self.r(s, i)), (-1, self.p(s, i))), -INF, 0)
                for j in self.consumers(s, i):
                    constrain(self.b, lin((1, self.F[s, i, pos[j]]), (-1, self.r(s, j))), -INF, 0)
                    before = lin((1, self.r(s, j)), *((1, self.F[s, i, q]) for q in points if q < pos[j]))
                    constrain(self.b, before, -INF, 1)

    def add_offload_constraints(self) -> None:
        """P[s,i] <= O[i]: a prefetch needs the host copy, made once right
        after i's first computation (inputs: at the start), where i is
        resident; offloading later would change no figure."""
        for (s, i), pv in self.P.items():
            constrain(self.b, lin((1, pv), (-1, self.O[i])), -INF, 0)

    def add_memory_accounting(self) -> None:
        """Memory after slot q of stage s, in units, persistent bytes aside,
        chained over all slots q_1 < q_2 < ... of all stages in order (x_k
        the node at q_k):

        U[0,q_1] = sum_{i input} size(i) S[0,i] + size(x_1) (R+P)[0,x_1]
        U[s,q_k] = U[prev] - sum_i size(i) F[prev,i] + size(x_k) (R+P)[s,x_k]

        where prev is the slot before (the previous stage's last slot at a
        stage's first). The free constraints make the chain equal to
        ``sum_i size(i) S[s,i]`` at a stage's start. That sum is written out
        there instead (``U[s,q_1] = sum_i size(i) S[s,i] + ...``) while all
        of them hold at most DIRECT_TERMS terms: CP-SAT propagates the cap
        onto the kept values at once, where the chain propagates it weakly
        (depth 4 of a 16-node chain went from OPTIMAL to FEASIBLE in the
        same time). On a deep network they are O(n^2): 11.9 million on the
        9,652-node decoder, which the chain does without. This is
        what the simulator checks at a compute (resident + new) or a prefetch
        (resident after); at an idle slot U only falls, so bounding every U by
        the cap (``mem_cap`` or the peak variable) is exact."""
        ix, g = self.ix, self.graph
        node_at = {ix.pos[i]: i for i in range(g.n)}
        kept = self.kept_by_stage()
        prev: tuple[int, int] | None = None
        for s in range(ix.T):
            check_time(self.deadline)
            for q in self.slots(s):
                x = node_at[q]
                e = lin((self.size[x], self.r(s, x)), (self.size[x], self.p(s, x)), (-1, self.U[s, q]))
                if prev is None or (kept is not None and prev[0] != s):
                    for i, var in (kept[s] if kept is not None else self.kept_into_first()):
                        e.add(self.size[i], var)
                else:
                    e.add(1, self.U[prev])
                    for i in self.freeable_at(*prev):
                        e.add(-self.size[i], self.F[prev[0], i, prev[1]])
                constrain(self.b, e, 0, 0)
                prev = (s, q)

    # -- objective pieces ------------------------------------------------------

    def recompute_terms(self) -> list[tuple[int, Any]]:
        """sum cost(i) R[s,i] over re-computations (s > first(i)), in scaled integers."""
        return [(self.int_cost[i], v) for (s, i), v in self.R.items()
                if s != self.ix.first[i] and self.int_cost[i]]

    def transfer_terms(self) -> list[tuple[int, Any]]:
        """transfer(i) (O[i] + sum_s P[s,i]): every offload and prefetch moves bytes(i)."""
        t = self.int_transfer
        return ([(t[i], v) for i, v in self.O.items() if t[i]]
                + [(t[i], v) for (s, i), v in self.P.items() if t[i]])

    def recompute_events(self) -> list[Any]:
        return [v for (s, i), v in self.R.items() if s != self.ix.first[i]]

    def bound_memory(self, cap: Any) -> None:
        """U[s,q] <= cap for every slot: the peak, as a constant or a variable."""
        for u in self.U.values():
            constrain(self.b, lin((1, u), (-1, cap)), -INF, 0)


# -- objectives and side caps ----------------------------------------------------


def add_recompute_cap(form: Formulation, cap: int) -> None:
    """sum R[s,i] over re-computations (s > first(i)) <= cap: the clone bound."""
    form.b.add([(1, v) for v in form.recompute_events()], -INF, cap)


def add_overhead_cap(form: Formulation, cap: int) -> None:
    """recompute + transfer cost <= cap (model integers): ``--max-overhead``."""
    form.b.add(form.recompute_terms() + form.transfer_terms(), -INF, cap)


def add_peak_objective(form: Formulation, floor: int) -> Any:
    """minimise M subject to U[s,q] <= M for every slot, M >= floor (the peak
    lower bound in units, so a plan reaching it is proven at once). Returns M."""
    peak = form.b.int_var(floor, max(form.mem_cap, floor), "M")
    form.bound_memory(peak)
    form.b.minimize([(1, peak)])
    return peak


def add_overhead_objective(form: Formulation) -> None:
    """minimise sum cost(i) R[s,i] (re-computations) + sum transfer(i) (O[i] + P[s,i])."""
    form.b.minimize(form.recompute_terms() + form.transfer_terms())


@dataclass(frozen=True)
class Model:
    """One round's model: the formulation on its backend, its objective
    (``peak`` holds the peak variable M when the peak is minimised) and the
    data that turns solutions into objective values."""

    form: Formulation
    objective: str  # "overhead" or "peak"
    peak: Any | None
    cost_scale: int
    overhead_cap: int | None  # model integers
    max_recomputes: int | None
    peak_floor: int  # units
    build_s: float
    variables: int = 0  # as built (CP-SAT backend)
    constraints: int = 0

    @property
    def backend(self) -> Any:
        return self.form.b

    @property
    def depth(self) -> int | None:
        return self.form.ix.depth

    def overhead_of(self, a: Any) -> int:
        """Recompute plus transfer cost of an assignment, in model integers."""
        f = self.form
        cost = sum(f.int_cost[i] for (s, i) in a.R if s != f.ix.first[i])
        return cost + sum(f.int_transfer[i] for i in a.O) + sum(f.int_transfer[i] for (s, i) in a.P)

    def peak_of(self, a: Any) -> int:
        """The peak of an assignment in units (at least the floor)."""
        return max(max(a.memory(self.form).values(), default=0), self.peak_floor)

    def objective_of(self, a: Any) -> int:
        return self.peak_of(a) if self.objective == "peak" else self.overhead_of(a)

    def admissible(self, a: Any) -> bool:
        """Whether an assignment meets the budget, the clone bound and the overhead cap."""
        f = self.form
        return Limits(f.mem_cap, self.max_recomputes, self.overhead_cap).admit(
            max(a.memory(f).values(), default=0), len(a.R) - len(f.graph.compute_ids), self.overhead_of(a))

    def to_bytes(self, value: float) -> float:
        """Memory in model units, as bytes."""
        return value * self.form.unit + self.form.persistent_bytes

    def to_units(self, value: float) -> float:
        """An objective value in cost units (overhead) or bytes (peak)."""
        return value / self.cost_scale if self.objective == "overhead" else self.to_bytes(value)

    def hint(self, a: Any) -> None:
        """Make ``a`` the solver's starting point (the peak variable too)."""
        for var, val in a.values(self.form):
            self.backend.model.add_hint(var, val)
        if self.peak is not None:
            self.backend.model.add_hint(self.peak, self.peak_of(a))


def build(graph: Graph, backend: Backend, *, objective: str, mem_cap_bytes: int | None, offload: bool,
          transfer_cost_per_byte: float, cost_scale: int, depth: int | None = None,
          also: dict[int, set[int]] | None = None, max_recomputes: int | None = None,
          max_overhead: float | None = None, overhead_cap: int | None = None, deadline: float | None = None,
          round_down: bool = False) -> Model:
    """The staged model with every constraint family, the side caps and the
    objective: ``overhead`` (under ``mem_cap_bytes``) or ``peak`` (with
    ``mem_cap_bytes`` None the budget is lifted; ``max_overhead`` x base
    cost caps the overhead, in model integers ``overhead_cap`` where the
    caller widens it for a proof); sizes rounded down with ``round_down``
    (see :class:`Formulation`). Raises OutOfTime past ``deadline``."""
    began = time.perf_counter()
    form = Formulation(graph, backend, offload=offload, transfer_cost_per_byte=transfer_cost_per_byte,
                       cost_scale=cost_scale, mem_cap_bytes=mem_cap_bytes, depth=depth, also=also,
                       deadline=deadline, round_down=round_down)
    form.add_all()
    if max_recomputes is not None:
        add_recompute_cap(form, max_recomputes)
    floor = peak_floor_units(graph, form.unit, up=not round_down)
    cap = None
    peak = None
    if objective == "overhead":
        add_overhead_objective(form)
    else:
        if max_overhead is not None:
            cap = overhead_cap if overhead_cap is not None else overhead_cap_units(form.int_cost, graph,
                                                                                   max_overhead)
            add_overhead_cap(form, cap)
        peak = add_peak_objective(form, floor)
    n_vars, n_cons = backend.size if hasattr(backend, "size") else (0, 0)
    return Model(form, objective, peak, cost_scale, cap, max_recomputes, floor, time.perf_counter() - began,
                 n_vars, n_cons)


def add_tie_break(model: Model, optimum: int) -> Model:
    """Fix the primary objective at ``optimum`` and minimise the other
    figure (the peak after the overhead, the overhead after the peak): the
    lexicographic second stage, on the same backend."""
    form = model.form
    if model.objective == "overhead":
        form.b.add(form.recompute_terms() + form.transfer_terms(), -INF, optimum)
        peak = add_peak_objective(form, model.peak_floor)
        return Model(form, "peak", peak, model.cost_scale, None, model.max_recomputes, model.peak_floor, 0.0)
    form.b.add([(1, model.peak)], -INF, optimum)
    terms = form.recompute_terms() + form.transfer_terms()
    form.b.minimize(terms or [(0, model.peak)])
    return Model(form, "overhead", model.peak, model.cost_scale, None, model.max_recomputes, model.peak_floor, 0.0)
