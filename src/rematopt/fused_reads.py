"""The graph cpsat plans a compiled step on (``solve.PLAN_ON_FUSED_READS``): each kernel reading a
value XLA never writes also reads what that value is computed from.

On a ``fuse="xla"`` graph a value of 0 bytes is one XLA computes inside the kernels reading it (a
softmax's division by its sum, made from the exp in each reader). The graph's edges let a plan keep
it without its operands, for free; ``apply_plan`` then saves it as a residual, which XLA writes whole,
and XLA still reads the forward operand in the backward kernels it fuses it into, holding both
(keras llama at the bench's size, cpsat at a 10.8 MiB planning budget in the eager order: a plan of
10.51 MiB compiled to 17.10 MiB, three layers' divisions and exps, 1 MiB each, held from the forward
pass into the backward). With the reads added, a plan that keeps the division keeps (and pays for)
the exp, or recomputes the exp before the division's readers, and ``apply_plan`` then recomputes
the division there (:func:`~rematopt.exporters.jax_policy.unwritten_recomputed`): the same budget
gives a 9.89 MiB plan compiling to 13.52 MiB. A plan of this graph is a plan of the original (it
reads more, never less), with the same peak and cost.
"""

from __future__ import annotations

from .graph import Graph


def fused_reads(graph: Graph) -> Graph:
    """``graph`` (a ``fuse="xla"`` graph; any other is returned as it is) with an edge from each
    operand of a 0-byte computed forward value to each of that value's readers, through 0-byte
    operands to the values XLA writes (an input, or a node of bytes)."""
    if graph.meta.get("fuse") != "xla":
        return graph
    preds = graph.preds

    def unwritten(u: int) -> bool:
        return not graph.bytes[u] and not graph.nodes[u].is_input and graph.nodes[u].op != "xla_buffer"

    sources: dict[int, set[int]] = {}

    def read_through(u: int) -> set[int]:
        """What a kernel computing ``u`` inside reads: its operands, and theirs where XLA writes none."""
        if u not in sources:
            sources[u] = set()
            for p in preds[u]:
                sources[u] |= {p, *(read_through(p) if unwritten(p) else ())}
        return sources[u]

    edges = set(graph.edges)
    for r in range(graph.n):
        for u in preds[r]:
            if unwritten(u) and graph.nodes[u].phase == "forward":
                edges.update((p, r) for p in read_through(u))
    if len(edges) == len(set(graph.edges)):
        return graph
    return Graph(graph.name, graph.nodes, sorted(edges), order=graph.order, meta=graph.meta, source=graph.source,
                 extra=graph.extra)
