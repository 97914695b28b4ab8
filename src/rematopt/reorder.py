"""Another program order for a graph: the same nodes and edges, a different
topological ``order``.

A compiled graph (``trace_grad(fuse="xla")``) runs in XLA's schedule of the
plain step, and the planners keep a graph's order. XLA's CPU scheduler runs
the weight-gradient convolutions of resnet and unet last, so the ReLU
gradients and forward activations they read are held through the whole
backward pass, and no plan in that order frees them (resnet at its instance
config: greedy at 0.7 finds nothing below 760,052 B, the plain step is
760,740 B). :func:`eager` places what only frees memory as soon as its
inputs are there; ``apply_plan`` ties a compiled graph's backward kernels
in the plan's order, so XLA runs the order planned in (docs/xla.md, "Two
orders").
"""

from __future__ import annotations

from .graph import Graph


def eager(graph: Graph) -> Graph:
    """``graph`` in the order that computes each node whose result is a step
    output (a gradient) or whose computation frees at least the bytes it
    makes, as early as its inputs allow, and each computed node without
    inputs (a buffer XLA writes from nothing) right before its first reader.
    Every other node keeps its place relative to the others, and no backward
    node moves before the first backward node of ``graph.order`` (the applied
    step runs the backward pass after the forward one).

    "Frees" is judged when the node is placed: the inputs it is the last
    reader of among the nodes not yet placed, outputs and persistent values
    excepted. A step output costs nothing when its memory is an allocation
    of its own (XLA's outputs, ``extra.allocation``) and is placed early
    whatever its bytes: the gradients are what the step is for."""
    nodes, preds, succs = graph.nodes, graph.preds, graph.succs
    source = [not v.is_input and not preds[i] for i, v in enumerate(nodes)]
    keeps = [v.output or v.persistent for v in nodes]
    readers_left = [len(succs[i]) for i in range(graph.n)]
    waiting = [sum(1 for u in preds[i] if not source[u]) for i in range(graph.n)]
    placed = [False] * graph.n
    order: list[int] = []
    backward_started = False

    def put(i: int) -> None:
        nonlocal backward_started
        for u in preds[i]:
            if source[u] and not placed[u]:
                put(u)
        placed[i] = True
        order.append(i)
        backward_started = backward_started or nodes[i].phase == "backward"
        for u in preds[i]:
            readers_left[u] -= 1
        for w in succs[i]:
            if not source[i]:
                waiting[w] -= 1
            if waiting[w] == 0 and not placed[w]:
                ready.append(w)

    def frees(i: int) -> bool:
        if nodes[i].is_input or source[i] or (nodes[i].phase == "backward" and not backward_started):
            return False
        if nodes[i].output:
            return True
        freed = sum(graph.bytes[u] for u in preds[i] if readers_left[u] == 1 and not keeps[u])
        return freed > 0 and graph.bytes[i] <= freed

    ready: list[int] = []
    for i in graph.order:
        if placed[i] or (source[i] and succs[i]):
            continue
        put(i)
        moved = True
        while moved:  # each placement may make another node ready, or free enough to place it
            moved = False
            for w in sorted(set(ready), key=graph.position.__getitem__):
                if not placed[w] and frees(w):
                    put(w)
                    moved = True
                    break
            ready = [w for w in ready if not placed[w]]
    return Graph(graph.name, nodes, graph.edges, order=order, meta=graph.meta, source=graph.source,
                 extra=graph.extra)
