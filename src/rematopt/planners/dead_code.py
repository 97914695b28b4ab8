"""Dropping computations nobody reads.

A staged plan computes every value at its program position, read or not:
a value only the backward reads, and not kept until then, is computed,
freed unread, and computed again where it is read. Dropping the unread
computation (and its free) moves the value's first computation to where it
is read, as XLA's remat pass does with its moves: the plan costs less, and
its memory is never higher at any event. Whatever such a computation alone
read may then go unread too; one backward walk finds them all.

A computation stays when it is the value's last one (every compute node is
computed at least once), and so does whatever it reads.
"""

from __future__ import annotations

from ..graph import Graph
from ..plan import COMPUTE, FREE, OFFLOAD, PREFETCH, Plan


def without_dead_computations(graph: Graph, plan: Plan) -> Plan:
    """``plan`` without its computations and prefetches whose value is freed,
    replaced or left at the end unread (outputs are read at the end), nor
    the frees that ended them. Same planner name; no stats (replay it)."""
    ops, nodes = plan.ops.tolist(), plan.nodes.tolist()
    keep = [True] * len(ops)
    read = [v.output for v in graph.nodes]  # the value resident from here is read before it goes
    freed_at: list[int | None] = [None] * graph.n  # the free that ends it
    computed_later = [False] * graph.n
    preds = graph.preds
    for k in range(len(ops) - 1, -1, -1):
        op, v = ops[k], nodes[k]
        if op == FREE:
            read[v], freed_at[v] = False, k
        elif op == OFFLOAD:
            read[v] = True
        elif op == COMPUTE or op == PREFETCH:
            if not read[v] and (computed_later[v] or op == PREFETCH):
                keep[k] = False
                if freed_at[v] is not None:
                    keep[freed_at[v]] = False
            elif op == COMPUTE:
                computed_later[v] = True
                for p in preds[v]:
                    read[p] = True
            read[v], freed_at[v] = False, None
    kept = [k for k, x in enumerate(keep) if x]
    return Plan(plan.graph, plan.planner, plan.ops[kept], plan.nodes[kept])
