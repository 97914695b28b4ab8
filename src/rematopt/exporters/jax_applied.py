"""The peak of the program :func:`~rematopt.jax.apply_plan` runs for a plan,
on the graph's memory model: the prediction ``--verify xla`` holds against
XLA's compiled figure.

A plan's own peak (:func:`~rematopt.simulate.simulate`) is of its events;
``apply_plan`` realizes some of them differently:

- the forward pass computes every forward node once, and a forward node the
  plan first computes after the backward pass starts (XLA's schedule runs the
  loss last) reads the forward pass's values, never a recomputed copy (the
  loss is the custom_vjp's primal result, so it cannot move to the backward
  pass): a value the plan frees and recomputes for it stays live until then;
- a recomputed value is computed once in the backward pass, before its first
  reader, and lives until its last reader: a plan recomputing it again for a
  later reader gets one long-lived copy;
- an offloaded value returns to the device when the backward pass starts;
- on CPU, XLA houses temporaries in the outputs' allocations by their live
  ranges in the step it compiles (:func:`_housed`).

Measured on the models' compiled graphs (CPU, memory-minimizing scheduler,
the first round of ``--verify xla``; docs/xla.md), this peak against XLA's
figure for the step in the plan's order, then the plan's own peak against
the same: mlp cpsat at 0.5 1.000 and 0.914, unet greedy 0.6 0.967 and 0.752,
keras llama greedy 0.8 1.018 and 0.802.
"""

from __future__ import annotations

from ..graph import Graph
from ..plan import COMPUTE, Plan
from .jax_policy import REARRANGE, residual_fates

# Kernels that read their operands as whole buffers in memory (XLA's CPU library calls), never fusing a slice.
LIBRARY_CALLS = frozenset({"dot_general", "conv_general_dilated"})


def applied_peak(graph: Graph, plan: Plan) -> int:
    """Peak bytes of ``apply_plan(loss_fn, graph, plan)``'s gradient step on
    ``graph``'s memory model (module docstring): each value is allocated when
    its pass computes it and freed after its last reader there, as the
    simulator frees a plan's values; outputs and persistent values never."""
    phase = [v.phase for v in graph.nodes]
    fates = residual_fates(graph, plan)
    ops, nodes = plan.ops.tolist(), plan.nodes.tolist()
    start = next(t for t, (o, i) in enumerate(zip(ops, nodes)) if o == COMPUTE and phase[i] == "backward")
    # the step's computations in the plan's order, each a (node, copy): "f" the forward pass's, "b" the backward's
    steps: dict[tuple[int, str], None] = {}
    for t, (o, i) in enumerate(zip(ops, nodes)):
        if o == COMPUTE:
            back = phase[i] == "backward" or (t >= start and i in fates.recomputed and (i, "f") in steps)
            steps.setdefault((i, "b" if back else "f"))
    order = _outputs_written_last(graph, list(steps))

    def read(u: int, by: str) -> tuple[int, str]:
        """The copy of ``u`` that a computation of pass ``by`` reads."""
        if phase[u] == "backward" or (by == "b" and (u in fates.recomputed or u in fates.offloaded)):
            return (u, "b")
        return (u, "f")

    born = {(u, "f"): -1 for u in graph.initial_resident}  # counted in the initial bytes
    first_backward = next(k for k, (_, c) in enumerate(order) if c == "b")
    born.update({(u, "b"): first_backward for u in fates.offloaded})
    for k, copy in enumerate(order):
        born.setdefault(copy, k)
    last = dict(born)
    operands: dict[tuple[int, str], list[tuple[int, str]]] = {}
    for k, (i, c) in enumerate(order):
        operands[(i, c)] = [read(u, c) for u in graph.preds[i]]
        last.update((r, k) for r in operands[(i, c)])
    for u, (first, end) in _slice_copies(graph, order).items():
        born[(u, "s")], last[(u, "s")] = first, end
    size = {copy: (graph.nodes[copy[0]].extra or {}).get("housed", graph.bytes[copy[0]]) for copy in born}
    housed = _housed(graph, born, last, operands, size, len(order))
    rises, frees = [0] * len(order), [0] * (len(order) + 1)  # frees[-1]: before the first computation
    for copy, k in born.items():
        if k >= 0 and copy not in housed:
            rises[k] += size[copy]
    for copy, k in last.items():
        node = graph.nodes[copy[0]]
        if copy not in housed and (copy[1] == "s" or not (node.output or node.persistent)):
            frees[k] += size[copy]
    mem = peak = graph.initial_bytes - frees[-1]
    for k in range(len(order)):
        mem += rises[k]
        peak = max(peak, mem)
        mem -= frees[k]
    return max(peak, graph.initial_bytes)


def _outputs_written_last(graph: Graph, order: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """``order`` with the backward outputs that only rearrange a library call's
    result (:data:`~.jax_policy.REARRANGE`: a weight gradient transposed into the
    parameter's layout) moved after the last backward computation, where XLA's
    scheduler writes them in the tied step: the tie after such a kernel reads one
    element of it, which XLA computes from the library call's result directly,
    so nothing but the step's output needs the kernel, and the library call's
    result lives until then (keras gemma at its instance config, cpsat at 0.8:
    eight such gradients, written at the step's end)."""
    def late(i: int) -> bool:
        node, preds = graph.nodes[i], graph.preds[i]
        return (node.phase == "backward" and node.op in REARRANGE and not graph.succs[i]
                and (node.output or "allocation" in (node.extra or {}))
                and len(preds) == 1 and graph.nodes[preds[0]].op in LIBRARY_CALLS)

    moved = [c for c in order if c[1] == "b" and late(c[0])]
    if not moved:
        return order
    rest = [c for c in order if c not in moved]
    end = max(k for k, (_, c) in enumerate(rest) if c == "b") + 1
    return rest[:end] + moved + rest[end:]


def _slice_copies(graph: Graph, order: list[tuple[int, str]]) -> dict[int, tuple[int, int]]:
    """The copies XLA makes of stacked arguments' slices, each as ``{input node:
    (first, last)}`` positions in ``order``. A graph with unrolled loops has an
    input per slice (``extra.iteration``), where ``apply_plan``'s step slices the
    caller's stacked leaf; a library call (:data:`LIBRARY_CALLS`) reads its
    operands as whole buffers, so XLA writes the slice it reads to a buffer of its
    own, once (CSE) for every such reader, and holds it from the first to the
    last (gpt_scan at its instance config, greedy at 0.8: twelve weight slices,
    393,216 B, live from the forward pass's dots to the backward pass's). Other
    kernels fuse the slice and read the stack in place."""
    sliced = {u for u in graph.initial_resident if "iteration" in (graph.nodes[u].extra or {})}
    out: dict[int, tuple[int, int]] = {}
    for k, (i, _) in enumerate(order):
        if graph.nodes[i].op in LIBRARY_CALLS:
            for u in sliced.intersection(graph.preds[i]):
                out[u] = (out.get(u, (k, k))[0], k)
    return out


def _housed(graph: Graph, born: dict, last: dict, operands: dict, size: dict, end: int) -> set:
    """The copies XLA's CPU buffer assignment houses in the outputs' allocations
    (:func:`~rematopt.xla.memory.cpu_allocations`), over the applied step's live
    ranges: the graph's ``extra.housed`` nodes were picked over the plain
    step's, which a plan changes (gpt at its instance config, cpsat at 0.5,
    on the compiled graph before the mapping merge: applied peak 0.872 of
    XLA's figure with the plain step's housing, 0.905 with the applied step's). A copy may take the place of a same-size operand
    dying there (the graph does not say which kernels are elementwise: any)."""
    from ..xla.memory import cpu_allocations

    outputs = {copy: graph.bytes[graph.nodes[copy[0]].extra["allocation"]] for copy in born
               if "allocation" in (graph.nodes[copy[0]].extra or {})}
    if not outputs:
        return set()
    temps = {c: (k, last[c]) for c, k in born.items() if k >= 0 and c not in outputs}
    shares = {c: [o for o in operands.get(c, []) if o in temps and last[o] == born[c] and size[o] == size[c]]
              for c in temps}
    return cpu_allocations(temps, shares, outputs, {a: born[a] for a in outputs}, {**size, **outputs}, end,
                           operands, born)
