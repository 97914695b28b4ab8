"""The order of first computations the staged space follows.

Stage ``s`` of the staged space first computes the ``s``-th compute node of
an order: by default the graph's program order. XLA's remat pass *moves*
computations later than that (a value only the backward reads is computed
there, once), which no staged plan in program order can do: on the
8,484-node decoder at 0.8 xla-remat's plan recomputes 3.08% where the best
staged plan cpsat found in 60 s recomputes 3.89%. In the staged space over
the order of that plan's first computations, the plan is a warm start the
rounds and LNS improve (2.50% in 60 s).

So on graphs too large for the rounds to search the whole space, when the
best fast plan lies outside the program-order space, cpsat searches the
staged space of that plan's order instead. Every claim of the run (gap,
OPTIMAL) is then over that space, and the stats say which (``order_from``).
Below a size (cpsat's ``Tuning.reorder_min_nodes``) the program order stays: there the rounds prove
optima in it, which another order could lose, and the bounds are weaker in
a moved order (random_layered_n250 at 0.8, the order of cpsat's plan
cleaned: coarse chains 1.81% of the base cost in 20 s, 2.66% in program
order).
"""

from __future__ import annotations

from ...graph import Graph
from ...plan import COMPUTE, PREFETCH, Plan

def in_staged_space(graph: Graph, plan: Plan) -> bool:
    """Whether the plan lies in the staged space over ``graph.order``: first
    computations in that order, and within each stage (ending with a first
    computation) the computes and prefetches at strictly increasing
    positions."""
    pos = graph.position
    stages = iter([i for i in graph.order if not graph.nodes[i].is_input])
    expected = next(stages, None)
    seen = [False] * graph.n
    last = -1
    for op, i in zip(plan.ops.tolist(), plan.nodes.tolist()):
        if op != COMPUTE and op != PREFETCH:
            continue
        if pos[i] <= last or expected is None:
            return False
        if op == COMPUTE and not seen[i]:
            if i != expected:
                return False
            seen[i] = True
            expected = next(stages, None)
            last = -1
            continue
        last = pos[i]
    return True


def first_computations(graph: Graph, plan: Plan) -> list[int]:
    """A program order from a valid plan of ``graph``: the inputs in program
    order, the compute nodes in the order the plan first computes them, and
    any it never computes (nothing reads them) in program order after them."""
    seen = [False] * graph.n
    first = []
    for op, i in zip(plan.ops.tolist(), plan.nodes.tolist()):
        if op == COMPUTE and not seen[i]:
            seen[i] = True
            first.append(i)
    inputs = [i for i in graph.order if graph.nodes[i].is_input]
    return inputs + first + [i for i in graph.order if not seen[i] and not graph.nodes[i].is_input]


def in_order_of(graph: Graph, plan: Plan) -> Graph:
    """``graph`` with the program order of ``plan``'s first computations."""
    return Graph(graph.name, graph.nodes, graph.edges, order=first_computations(graph, plan), meta=graph.meta,
                 source=graph.source, extra=graph.extra)


def search_order(graph: Graph, plan: Plan | None, min_nodes: int) -> Graph | None:
    """The graph in the order cpsat should search, if not its own: that of
    ``plan`` (the best outside plan) when the graph has at least
    ``min_nodes`` nodes and the plan lies outside the program-order staged space."""
    if plan is None or graph.n < min_nodes or in_staged_space(graph, plan):
        return None
    return in_order_of(graph, plan)
