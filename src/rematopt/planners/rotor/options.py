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
from dataclasses import dataclass

from ...graph import Graph, Node
from .chain import Chain, Stage, cost, once
from .dp import Option

# Caps on the bytes kept across the gap, as shares of all the forward values
# the backward reads (0 and 1 are the extremes, which always exist).
KEPT_SHARES = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95)
# Caps at which the backward's peak comes first (then the cost): what a tight
# budget needs, where the cheapest backward recomputes all it needs at once.
LOW_PEAK_SHARES = (0.0, 0.25, 0.5)
# Seconds per cap: on gpt's 200-node block (depth 3, 2 workers) most caps are
# proven optimal in 2-4 s, the rest within 3% of their bound; presolve alone
# takes a second, so a cap gets at least MIN_SOLVE_S (fewer caps, solved)
# and the first (no answer to start from) up to FIRST_SOLVE_S.
SOLVE_S = 4.0
MIN_SOLVE_S = 3.0
FIRST_SOLVE_S = 8.0
# Depth 3 unless its model passes this many variables (gpt's block: 6,564;
# the 16-head decoder block: 22,179, where depth 2's 12,051 solve in 2 s).
MAX_VARIABLES = 15_000


def extremes(graph: Graph, stage: Stage) -> list[Option]:
    """Keep everything the backward reads (no recompute), and keep nothing
    that may go: recompute, at the backward's start, the stage's forward
    values it reads and the ones those need (program order), except those
    computed once (:func:`.chain.once`), which stay from the forward."""
    fwd = {v for v in stage.forward if not once(graph, v)}
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
            nodes.append(Node(j, n.name, op=n.op, bytes=n.bytes, cost=n.cost, recomputable=not once(g, v),
                              phase=n.phase, output=v in keep))
        else:
            nodes.append(Node(j, n.name, op="input", kind="input", bytes=n.bytes, cost=0.0,
                              persistent=v not in freeable))
    edges = [(sub[p], sub[v]) for v in inside for p in g.preds[v]]
    return Subgraph(Graph(f"{g.name}.stage{k}", nodes, edges), ids, len(st.forward))


def solved(chain: Chain, k: int, deadline: float, workers: int = 1, depth: int | None = 3,
           around: float | None = None) -> list[Option]:
    """Options of stage k from CP-SAT: for each cap in KEPT_SHARES, the
    cheapest backward that keeps at most that share of bytes across the
    gap, and among those the one whose backward peaks lowest (for each in
    LOW_PEAK_SHARES, the lowest peak first, then the cost). One model
    (recompute ``depth`` hops, as cpsat's rounds: depth 3 finds what depth 2
    cannot below a share of 0.5 on gpt's block, and the same above), its cap
    moved from solve to solve, each hinted with the answer of the nearest
    tighter cap (which fits). Caps nearest ``around`` (the share the budget
    asks for) first; what is not solved before ``deadline`` is not offered."""
    from ortools.sat.python import cp_model

    from ..meter import meter, now
    from ..staged.backends import CpSatBackend, tune
    from ..staged.model import INF, OutOfTime, build
    from ..staged.solution import Assignment, events
    from ..staged.units import integer_scale

    st = chain.stages[k]
    sg = subgraph(chain, k)
    g, b0 = sg.graph, sg.first_backward
    costs = [c for c in g.cost if c]
    scale, _ = integer_scale(costs, sum(costs) * len(g.compute_ids) + 1)
    first_forward = len(sg.ids) - len(st.backward) - b0
    forward = range(first_forward, first_forward + b0)
    # the cap is on every forward value kept across the gap (what recomputes read too), in
    # shares of what the backward reads
    total = sum(g.bytes[j] for j in forward if any(s >= forward.stop for s in g.succs[j]))
    try:
        model = build(g, CpSatBackend(), objective="overhead", mem_cap_bytes=None, offload=False,
                      transfer_cost_per_byte=0.0, cost_scale=scale, depth=depth, deadline=deadline)
        if depth is not None and depth > 2 and model.variables > MAX_VARIABLES:
            model = build(g, CpSatBackend(), objective="overhead", mem_cap_bytes=None, offload=False,
                          transfer_cost_per_byte=0.0, cost_scale=scale, depth=2, deadline=deadline)
    except OutOfTime:
        return []
    form, cp = model.form, model.backend.model
    for (s, i), var in form.R.items():  # the forward runs once, in order: no recompute before b0
        if s < b0 and s != form.ix.first[i] and not isinstance(var, int):
            form.b.add([(1, var)], 0, 0)
    kept = [(form.size[j], form.S[key]) for j in forward if (key := form.kept_key(b0, j)) is not None]
    const = sum(c for c, x in kept if isinstance(x, int) and x)
    terms = [(c, x) for c, x in kept if not isinstance(x, int)]
    cap_row = len(cp.proto.constraints)
    form.b.add(terms or [(0, form.U[next(iter(form.U))])], -INF, 0)
    peak = form.b.int_var(0, form.mem_cap, "Z")  # the backward's peak (units)
    for (s, q), u in form.U.items():
        if s >= b0:
            form.b.add([(1, u), (-1, peak)], -INF, 0)
    peak_row = len(cp.proto.constraints)
    form.b.add([(1, peak)], -INF, form.mem_cap)
    # lexicographic by weight: recompute cost first, then the backward's peak
    cost_first = [(c * (form.mem_cap + 1), x) for c, x in form.recompute_terms()] + [(1, peak)]
    out: list[Option] = []
    seen: set[tuple[int, ...]] = set()
    answers: dict[float, Assignment] = {}
    caps = [(x, False) for x in KEPT_SHARES] + [(x, True) for x in LOW_PEAK_SHARES]
    order = sorted(caps, key=lambda c: (abs(c[0] - around), c[1], c[0]) if around is not None else (c[1], c[0]))

    def run(limit: float, hint: Assignment | None) -> Assignment | None:
        cp.clear_hints()
        if hint is not None:
            for var, val in hint.values(form):
                cp.add_hint(var, val)
        solver = cp_model.CpSolver()
        tune(solver.parameters, limit, workers, lp_heavy=False)
        status = meter().solve(solver, cp)
        if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            return None
        return Assignment.from_values(form, lambda v: solver.value(v))

    for n, (share, low_peak) in enumerate(order):
        left = deadline - now()
        if left < MIN_SOLVE_S / 2:
            break
        cap = math.floor(share * total / form.unit) - const
        if cap < 0:
            continue
        cp.proto.constraints[cap_row].linear.domain[1] = cap
        # the nearest answer: a tighter one fits, a looser one still guides the search
        near = answers[min(answers, key=lambda x: (abs(x - share), -x))] if answers else None
        # the first solve finds a plan from nothing (2-3 s on a 200-node block), the others start from one
        limit = min(left, FIRST_SOLVE_S if near is None else min(SOLVE_S, max(MIN_SOLVE_S, left / (len(order) - n))))
        if low_peak:  # the lowest backward peak at that cap, then the cheapest at that peak
            form.b.minimize([(1, peak)])
            a = run(limit / 2, near)
            if a is None:
                continue
            cp.proto.constraints[peak_row].linear.domain[1] = max(u for (s, q), u in a.memory(form).items()
                                                                  if s >= b0)
            form.b.minimize(cost_first)
            a = run(limit / 2, a) or a
            cp.proto.constraints[peak_row].linear.domain[1] = form.mem_cap
        else:
            form.b.minimize(cost_first)
            a = run(limit, near)
            if a is None:
                continue
        answers[share] = a
        computes = [sg.ids[j] for op, j in events(form, a).events() if op == "compute"]
        seq = tuple(computes[b0:])
        if seq not in seen:
            seen.add(seq)
            fwd = set(st.forward)
            out.append(Option(seq, cost(chain.graph, [v for v in seq if v in fwd])))
    return out


def for_kind(chain: Chain, k: int, options: list[Option], other: int) -> list[Option]:
    """Stage ``k``'s options carried to stage ``other`` of the same kind."""
    src, dst = chain.stages[k], chain.stages[other]
    where = {v: j for j, v in enumerate(src.members)}
    return [Option(tuple(dst.members[where[v]] for v in o.seq), o.cost) for o in options]
