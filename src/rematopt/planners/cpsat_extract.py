"""Between plans and the staged model's variables, both ways.

:class:`Assignment` is a solution of the model as sets of the entries that are
1. ``events`` turns it into a plan (the model's own frees, so the replay's
peak is the model's memory maximum), and ``from_plan`` projects any valid plan
into the model's plan space (used for hints): each recompute or prefetch is
moved to its stage's slot, and frees are placed at each value's last use.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from ..plan import COMPUTE, FREE, OFFLOAD, PREFETCH, Plan, PlanBuilder
from .cpsat_model import Formulation


@dataclass
class Assignment:
    """The 1-entries of S, R, P, O and F (fixed ones included)."""

    S: set[tuple[int, int]] = field(default_factory=set)
    R: set[tuple[int, int]] = field(default_factory=set)
    P: set[tuple[int, int]] = field(default_factory=set)
    O: set[int] = field(default_factory=set)
    F: set[tuple[int, int, int]] = field(default_factory=set)

    @classmethod
    def from_values(cls, form: Formulation, value: Callable[[Any], int]) -> "Assignment":
        """Read a solution; ``value(var)`` gives a variable's value."""

        def ones(table: dict) -> set:
            return {k for k, v in table.items() if (v if isinstance(v, int) else value(v)) > 0.5}

        return cls(ones(form.S), ones(form.R), ones(form.P), ones(form.O), ones(form.F))

    def memory(self, form: Formulation) -> dict[tuple[int, int], int]:
        """U[s,q] (units) by the memory-accounting recursion of the model."""
        ix, size = form.ix, form.size
        node_at = {ix.pos[i]: i for i in range(form.graph.n)}
        frees: dict[tuple[int, int], int] = {}
        for (s, i, q) in self.F:
            frees[s, q] = frees.get((s, q), 0) + size[i]
        base = [0] * ix.T
        for (s, i) in self.S:
            if s < ix.T:
                base[s] += size[i]
        out = {}
        for s in range(ix.T):
            mem, prev = base[s], None
            for q in form.slots(s):
                x = node_at[q]
                if prev is not None:
                    mem -= frees.get((s, prev), 0)
                if (s, x) in self.R or (s, x) in self.P:
                    mem += size[x]
                out[s, q] = mem
                prev = q
        return out

    def peak_bytes(self, form: Formulation) -> int:
        mem = self.memory(form)
        top = max(mem.values(), default=0) * form.unit + form.persistent_bytes
        return max(top, form.initial_bytes)

    def counts(self, form: Formulation) -> list[int]:
        c = [0] * form.graph.n
        for (s, i) in self.R:
            c[i] += 1
        return c

    def transfer_bytes(self, form: Formulation) -> int:
        b = form.graph.bytes
        return sum(b[i] for i in self.O) + sum(b[i] for (s, i) in self.P)

    def values(self, form: Formulation) -> list[tuple[Any, int]]:
        """(variable, value) for every model variable: a complete hint."""
        out: list[tuple[Any, int]] = []
        for table, ones in ((form.S, self.S), (form.R, self.R), (form.P, self.P),
                            (form.O, self.O), (form.F, self.F)):
            out += [(v, int(k in ones)) for k, v in table.items() if not isinstance(v, int)]
        mem = self.memory(form)
        out += [(v, mem[k]) for k, v in form.U.items()]
        return out


def events(form: Formulation, a: Assignment) -> Plan:
    """The plan of an assignment: at each slot compute or prefetch, offload
    right after a first computation, then free what the model frees there.
    Inputs are offloaded and (if not kept) freed before the first event."""
    g, ix = form.graph, form.ix
    node_at = {ix.pos[i]: i for i in range(g.n)}
    b = PlanBuilder()
    inputs = [i for i in g.order if g.nodes[i].is_input and not g.nodes[i].persistent]
    for i in inputs:
        if i in a.O:
            b.offload(i)
    for i in inputs:
        if (0, i) not in a.S:
            b.free(i)
    frees: dict[tuple[int, int], list[int]] = {}
    for (s, i, q) in sorted(a.F, key=lambda k: ix.pos[k[1]]):
        frees.setdefault((s, q), []).append(i)
    for s in range(ix.T):
        for q in form.slots(s):
            x = node_at[q]
            if (s, x) in a.R:
                b.compute(x)
                if s == ix.first[x] and x in a.O:
                    b.offload(x)
            elif (s, x) in a.P:
                b.prefetch(x)
            for i in frees.get((s, q), ()):
                b.free(i)
    return b.build(g.name, "cpsat")


def from_plan(form: Formulation, plan: Plan) -> Assignment | None:
    """Project a plan into the model's plan space, or None if the projection
    is not a valid staged plan. Events between the first computations of
    ``v_{s-1}`` and ``v_s`` belong to stage s; each stage then runs its
    recomputes and prefetches at their slots in program order (a node computed
    twice in one stage is computed once), values are kept into the next stage
    only if read there before being re-materialised, and materialisations no
    one reads are dropped. The result is checked against the model's rules;
    its peak may differ from the plan's, its costs are never higher."""
    g, ix = form.graph, form.ix
    if ix.T == 0:
        return Assignment()
    R: set[tuple[int, int]] = set()
    P: set[tuple[int, int]] = set()
    O: set[int] = set()
    stage = 0
    for op, i in zip(plan.ops.tolist(), plan.nodes.tolist()):
        if op == COMPUTE:
            if stage < ix.T and i == ix.stage_node[stage] and (stage, i) not in R:
                R.add((stage, i))
                stage += 1
            else:
                R.add((min(stage, ix.T - 1), i))
        elif op == PREFETCH:
            P.add((min(stage, ix.T - 1), i))
        elif op == OFFLOAD:
            O.add(i)
    if stage < ix.T:
        return None
    if any(k not in form.R for k in R) or any(k not in form.P for k in P):
        return None
    _drop_unread(form, R, P)
    a = Assignment(R=R, P=P, O={i for i in O if i in form.O and any((s, i) in P for s in ix.stages(i))})
    if not all(_keep_and_free(form, a, i) for i in ix.values):
        return None
    return a if _satisfies(form, a) else None


def _reads(form: Formulation, R: set, s: int, i: int) -> bool:
    return any((s, j) in R for j in form.graph.succs[i])


def _drop_unread(form: Formulation, R: set, P: set) -> None:
    """Remove re-materialisations that nothing reads before the value is
    materialised again (or the plan ends, outputs aside), until none is left."""
    ix, g = form.ix, form.graph
    changed = True
    while changed:
        changed = False
        for (s, i) in sorted(R | P, reverse=True):
            if s == ix.first[i]:
                continue
            if not _needed_from(form, R, P, s, i, include_own=True):
                R.discard((s, i))
                P.discard((s, i))
                changed = True


def _needed_from(form: Formulation, R: set, P: set, s: int, i: int, include_own: bool) -> bool:
    """Whether i, available in stage s, is read in stage s (if ``include_own``)
    or in a later stage before it is materialised again, or is an output."""
    ix = form.ix
    if include_own and _reads(form, R, s, i):
        return True
    for t in range(s + 1, ix.horizon[i] + 1):
        if (t, i) in R or (t, i) in P:
            return False
        if _reads(form, R, t, i):
            return True
    return form.graph.nodes[i].output


def _keep_and_free(form: Formulation, a: Assignment, i: int) -> bool:
    """Fill S and F for value i: kept into stage s+1 iff read there (or later)
    before its next materialisation, else freed after its last read in stage
    s (or its own slot). False if a kept value is read nowhere."""
    ix, pos = form.ix, form.ix.pos
    kept = form.graph.nodes[i].is_input and _needed_from(form, a.R, a.P, -1, i, include_own=False)
    if kept and ix.T:
        a.S.add((0, i))
    for s in ix.stages(i):
        mat = (s, i) in a.R or (s, i) in a.P
        if not (kept or mat):
            continue
        kept = _needed_from(form, a.R, a.P, s, i, include_own=False)
        if kept:
            if s + 1 <= ix.horizon[i] or form.graph.nodes[i].output:
                a.S.add((s + 1, i))
            continue
        reads = [pos[j] for j in form.graph.succs[i] if (s, j) in a.R]
        if not (reads or mat):
            return False
        a.F.add((s, i, max(reads + ([pos[i]] if mat else []))))
    return True


def _satisfies(form: Formulation, a: Assignment) -> bool:
    """Dependencies and exclusivity, the rules a projection can break."""
    g, ix = form.graph, form.ix
    for (s, j) in a.R:
        for i in g.preds[j]:
            if not g.nodes[i].persistent and not ((s, i) in a.S or (s, i) in a.R or (s, i) in a.P):
                return False
    for (s, i) in a.S:
        if (s, i) in a.R or (s, i) in a.P:
            return False
    return True
