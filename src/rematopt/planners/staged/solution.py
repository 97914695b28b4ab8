"""Between plans and the staged model's variables, both ways.

:class:`Assignment` is a solution of the model as sets of the entries that are
1. ``events`` turns it into a plan (the model's own frees, so the replay's
peak is the model's memory maximum), and ``from_plan`` projects any valid plan
into the model's plan space (used for hints): each recompute or prefetch is
moved to its stage's slot, and frees are placed at each value's last use.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any, Callable

from ...plan import COMPUTE, OFFLOAD, PREFETCH, Plan, PlanBuilder
from .model import Formulation
from .stages import Stages


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
        """U[s,q] (units) by the memory-accounting chain of the model."""
        ix, size = form.ix, form.size
        node_at = {ix.pos[i]: i for i in range(form.graph.n)}
        frees: dict[tuple[int, int], int] = {}
        for (s, i, q) in self.F:
            frees[s, q] = frees.get((s, q), 0) + size[i]
        mem = sum(size[i] for (s, i) in self.S if s == 0 and ix.first[i] < 0)
        out, prev = {}, None
        for s in range(ix.T):
            for q in form.slots(s):
                x = node_at[q]
                if prev is not None:
                    mem -= frees.get(prev, 0)
                if (s, x) in self.R or (s, x) in self.P:
                    mem += size[x]
                out[s, q] = mem
                prev = (s, q)
        return out

    def kept(self, form: Formulation, s: int, i: int) -> bool:
        """Whether i is resident when stage s starts."""
        return form.kept_key(s, i) in self.S

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
        out: dict[int, tuple[Any, int]] = {}  # by id: S variables are shared across carry stages
        for table, ones in ((form.S, self.S), (form.R, self.R), (form.P, self.P),
                            (form.O, self.O), (form.F, self.F)):
            for k, v in table.items():
                if not isinstance(v, int):
                    out.setdefault(id(v), (v, int(k in ones)))
        mem = self.memory(form)
        out.update((id(v), (v, mem[k])) for k, v in form.U.items())
        return list(out.values())


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
    is not a valid staged plan. Its materialisations go to their stages
    (:func:`staged_events`); each stage then runs its recomputes and
    prefetches at their slots in program order (a node computed twice in one
    stage is computed once), values are kept into the next stage only if read
    there before being re-materialised, and materialisations no one reads are
    dropped. The result is checked against the model's rules; its peak may
    differ from the plan's, its costs are never higher."""
    if form.ix.T == 0:
        return Assignment()
    staged = staged_events(form.ix, plan)
    if staged is None:
        return None
    R, P, O = staged
    if any(k not in form.R for k in R) or any(k not in form.P for k in P):
        return None
    return canonical(form, R, P, O)


def staged_events(ix: Stages, plan: Plan) -> tuple[set, set, set] | None:
    """A plan's computations and prefetches as (stage, node) pairs, and its
    offloaded nodes: events between the first computations of ``v_{s-1}``
    and ``v_s`` belong to stage s. None if the plan never first-computes
    some stage's node in program order."""
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
    return (R, P, O) if stage == ix.T else None


def plan_pairs(ix: Stages, plan: Plan) -> dict[int, set[int]]:
    """The re-materialisations of ``plan`` per stage: what widens a
    restricted space so that it holds the plan."""
    staged = staged_events(ix, plan)
    pairs: dict[int, set[int]] = {}
    for s, i in (staged[0] | staged[1]) if staged else ():
        if s != ix.first[i]:
            pairs.setdefault(s, set()).add(i)
    return pairs


def canonical(form: Formulation, R: set, P: set, O: set) -> Assignment | None:
    """The assignment that computes R and prefetches P with the fewest
    resident bytes: materialisations no one reads are dropped, a value is
    kept into the next stage iff its next event is a read (not a
    re-materialisation), else freed after its last read in the stage. None if
    a computation's inputs are not available (or R/P break the model's
    index). One pass per value over its events, so it is cheap enough for
    heuristics to call in a loop."""
    g, ix, pos = form.graph, form.ix, form.ix.pos
    R, P = set(R), set(P)
    reads: dict[int, set[int]] = {}
    next_read: dict[int, int] = {}  # walking backwards: the earliest read so far, and materialisation
    next_mat: dict[int, int] = {}
    for (s, i) in sorted(R | P, key=lambda k: (k[0], pos[k[1]]), reverse=True):
        if s != ix.first[i] and not _read_later(form, next_read.get(i), next_mat.get(i), s, i):
            R.discard((s, i))
            P.discard((s, i))
            continue
        next_mat[i] = s
        if (s, i) in R:
            for p in g.preds[i]:
                reads.setdefault(p, set()).add(s)
                next_read[p] = s
    a = Assignment(R=R, P=P, O={i for i in O if any((s, i) in P for s in ix.stages(i))})
    mats: dict[int, set[int]] = {}
    for (s, i) in R | P:
        mats.setdefault(i, set()).add(s)
    for i in ix.values:
        if not _keep_and_free(form, a, i, sorted(reads.get(i, ())), mats.get(i, set())):
            return None
    return a if _satisfies(form, a) else None


def _read_later(form: Formulation, nxt: int | None, next_mat: int | None, s: int, i: int) -> bool:
    """Whether i, materialised in stage s, is read in s or later before it is
    materialised again (outputs: or at the end). The caller walks backwards:
    ``nxt`` is i's earliest read from (s, pos(i)) on, ``next_mat`` its
    earliest materialisation after stage s that is kept."""
    ix = form.ix
    if nxt == s:
        return True
    stop = nxt if nxt is not None else ix.horizon[i] + 1
    if next_mat is not None and next_mat <= min(stop, ix.horizon[i]):
        return False
    return nxt is not None or form.graph.nodes[i].output


def _keep_and_free(form: Formulation, a: Assignment, i: int, reads: list[int], mats: set[int]) -> bool:
    """Fill S and F for value i from its read and materialisation stages:
    kept into stage s+1 iff its next event after s is a read, else freed
    after its last read in s (or its own slot). False if a read finds i
    unavailable."""
    ix, pos, g = form.ix, form.ix.pos, form.graph
    events = sorted(set(reads) | mats)
    avail = g.nodes[i].is_input  # inputs are resident before stage 0
    prev = -1
    for k, s in enumerate(events + [None]):
        end = ix.T if s is None else s
        nxt_is_read = s is not None and s not in mats
        keep = avail and (nxt_is_read or (s is None and g.nodes[i].output))
        if keep:
            keyed = form.keyed.get(i, [])
            a.S.update((t, i) for t in keyed[bisect.bisect_left(keyed, prev + 1):
                                             bisect.bisect_right(keyed, min(end, ix.horizon[i]))])
            if s is None:
                a.S.add((ix.T, i))
        elif avail and prev >= 0:
            last = [pos[j] for j in g.succs[i] if (prev, j) in a.R]
            if prev in mats:
                last.append(pos[i])
            a.F.add((prev, i, max(last)))
        if s is None:
            break
        if s in mats:
            avail = True
        elif not keep:
            return False
        prev = s
    return True


def _satisfies(form: Formulation, a: Assignment) -> bool:
    """Dependencies and exclusivity, the rules a projection can break."""
    g = form.graph
    for (s, j) in a.R:
        for i in g.preds[j]:
            if not g.nodes[i].persistent and not ((s, i) in a.S or (s, i) in a.R or (s, i) in a.P):
                return False
    for (s, i) in a.S:
        if (s, i) in a.R or (s, i) in a.P:
            return False
    return True
