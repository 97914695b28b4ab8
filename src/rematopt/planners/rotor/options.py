"""A stage's options: backward sequences, each a trade of the memory kept
between its forward and its backward against the cost of recomputing.

Rotor's two forward modes are the extremes (:func:`extremes`): keep all
that the backward reads, or nothing (recompute the forward values it reads
at its start). Between them, :func:`solved` asks CP-SAT, on the stage's
subgraph with the staged formulation of ``cpsat`` (``model.build``), for the
cheapest backward at several caps on the bytes kept across the gap, each
with the lowest backward peak at that cost: Rockmate's per-block ILP.
Options are solved once per kind (one representative stage) and mapped to
the other stages of the kind by the canonical order of their members.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from ...graph import Graph, Node
from .chain import Chain, Stage, cost
from .dp import Option

# Caps on the bytes kept across the gap, as shares of all the forward values
# the backward reads (0 and 1 are the extremes, which always exist).
KEPT_SHARES = (0.15, 0.3, 0.45, 0.6, 0.75, 0.9)


def extremes(graph: Graph, stage: Stage) -> list[Option]:
    """Keep everything the backward reads (no recompute), and keep nothing:
    recompute, at the backward's start, the stage's forward values it reads
    and the ones those need (program order)."""
    fwd = set(stage.forward)
    need: set[int] = set()
    stack = [p for v in stage.backward for p in graph.preds[v] if p in fwd]
    while stack:
        v = stack.pop()
        if v not in need:
            need.add(v)
            stack.extend(p for p in graph.preds[v] if p in fwd)
    redo = tuple(v for v in stage.forward if v in need)
    return [Option(tuple(stage.backward), 0.0), Option(redo + tuple(stage.backward), cost(graph, redo))]


@dataclass(frozen=True)
class Subgraph:
    """A stage as a graph of its own: what it reads from outside as inputs
    (persistent: what stays resident throughout), its forward then its
    backward, what it leaves behind as outputs. ``ids[j]`` is the real id of
    sub node j."""

    graph: Graph
    ids: tuple[int, ...]
    first_backward: int  # the first backward stage (index among the sub graph's compute nodes)


def subgraph(chain: Chain, k: int) -> Subgraph:
    g, st = chain.graph, chain.stages[k]
    inside = st.forward + st.backward
    member = set(inside)
    freeable = st.cin_rec | st.cin_fix | st.gin | st.releases
    outside = sorted({p for v in inside for p in g.preds[v] if p not in member}, key=g.position.__getitem__)
    ids = tuple(outside) + inside
    sub = {v: j for j, v in enumerate(ids)}
    keep = st.gout | st.held
    nodes = []
    for j, v in enumerate(ids):
        n = g.nodes[v]
        if v in member:
            nodes.append(Node(j, n.name, op=n.op, bytes=n.bytes, cost=n.cost, recomputable=n.recomputable,
                              phase=n.phase, output=v in keep))
        else:
            nodes.append(Node(j, n.name, op="input", kind="input", bytes=n.bytes, cost=0.0,
                              persistent=v not in freeable))
    edges = [(sub[p], sub[v]) for v in inside for p in g.preds[v]]
    return Subgraph(Graph(f"{g.name}.stage{k}", nodes, edges), ids, len(st.forward))


def solved(chain: Chain, k: int, deadline: float, workers: int = 1, depth: int | None = 2) -> list[Option]:
    """Options of stage k from CP-SAT, one per cap in KEPT_SHARES that
    gives a new sequence (each solve within the time left before
    ``deadline``; what is not solved in time is not offered)."""
    from ortools.sat.python import cp_model

    from ..cpsat.backends import CpSatBackend, tune
    from ..cpsat.model import OutOfTime, build, integer_scale
    from ..cpsat.solution import Assignment, events

    sg = subgraph(chain, k)
    g = sg.graph
    costs = [c for c in g.cost if c]
    scale, _ = integer_scale(costs, sum(costs) * len(g.compute_ids) + 1)
    first_forward = len(sg.ids) - len(chain.stages[k].backward) - sg.first_backward
    forward = range(first_forward, first_forward + sg.first_backward)
    # the cap is on every forward value kept across the gap (what recomputes read too), in shares of
    # what the backward reads
    total = sum(g.bytes[j] for j in forward if any(s >= forward.stop for s in g.succs[j]))
    out: list[Option] = []
    seen: set[tuple[int, ...]] = set()
    for share in KEPT_SHARES:
        left = deadline - time.perf_counter()
        if left < 0.05:
            break
        try:
            model = build(g, CpSatBackend(), objective="overhead", mem_cap_bytes=None, offload=False,
                          transfer_cost_per_byte=0.0, cost_scale=scale, depth=depth, deadline=deadline)
        except OutOfTime:
            break
        form = model.form
        b0 = sg.first_backward
        for (s, i), var in form.R.items():  # the forward runs once, in order: no recompute before b0
            if s < b0 and s != form.ix.first[i] and not isinstance(var, int):
                form.b.add([(1, var)], 0, 0)
        kept = []
        for j in forward:
            key = form.kept_key(b0, j)
            if key is not None:
                kept.append((form.size[j], form.S[key]))
        cap = math.floor(share * total / form.unit)
        const = sum(c for c, x in kept if isinstance(x, int) and x)
        terms = [(c, x) for c, x in kept if not isinstance(x, int)]
        if terms:
            form.b.add(terms, -math.inf, cap - const)
        elif const > cap:
            continue
        solver = cp_model.CpSolver()
        tune(solver.parameters, max(0.05, (deadline - time.perf_counter()) / 2), workers, lp_heavy=False)
        status = solver.solve(model.backend.model)
        if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            continue
        a = Assignment.from_values(form, lambda v: solver.value(v))
        if status == cp_model.OPTIMAL:
            a = _lowest_backward_peak(model, a, int(round(solver.objective_value)), b0, deadline, workers) or a
        plan = events(form, a)
        computes = [sg.ids[j] for op, j in plan.events() if op == "compute"]
        seq = tuple(computes[b0:])
        if seq not in seen:
            seen.add(seq)
            fwd = set(chain.stages[k].forward)
            out.append(Option(seq, cost(chain.graph, [v for v in seq if v in fwd])))
    return out


def _lowest_backward_peak(model, a, optimum: int, b0: int, deadline: float, workers: int):
    """The same cost, the lowest memory over the backward's slots (the
    forward's memory is not the option's: the plan runs its own forward)."""
    from ortools.sat.python import cp_model

    from ..cpsat.backends import tune
    from ..cpsat.model import INF
    from ..cpsat.solution import Assignment

    form = model.form
    left = deadline - time.perf_counter()
    if left < 0.05:
        return None
    form.b.add(form.recompute_terms() + form.transfer_terms(), -INF, optimum)
    z = form.b.int_var(0, form.mem_cap, "Z")
    for (s, q), u in form.U.items():
        if s >= b0:
            form.b.add([(1, u), (-1, z)], -INF, 0)
    form.b.minimize([(1, z)])
    model.backend.model.clear_hints()
    for var, val in a.values(form):
        model.backend.model.add_hint(var, val)
    solver = cp_model.CpSolver()
    tune(solver.parameters, max(0.05, left / 4), workers, lp_heavy=False)
    status = solver.solve(model.backend.model)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None
    return Assignment.from_values(form, lambda v: solver.value(v))


def for_kind(chain: Chain, k: int, options: list[Option], other: int) -> list[Option]:
    """Stage ``k``'s options carried to stage ``other`` of the same kind."""
    src, dst = chain.stages[k], chain.stages[other]
    where = {v: j for j, v in enumerate(src.members)}
    return [Option(tuple(dst.members[where[v]] for v in o.seq), o.cost) for o in options]
