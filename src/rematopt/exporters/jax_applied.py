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
  reader, and lives until its last reader, unless the plan computes a value
  twice there, or computes again a forward value it read there from the forward
  pass's copy (:attr:`~.jax_policy.Fates.exact`): then every computation of the
  backward pass is a copy of its own (:func:`_every_computation`), and a forward
  value a backward kernel makes inside is made again from its operands' latest
  copies (:func:`_remade`);
- an offloaded value returns to the device when the backward pass starts;
- on CPU, XLA houses temporaries in the outputs' allocations by their live
  ranges in the step it compiles (:func:`_housed`);
- what XLA does on its own: a result it writes in a layout of its own
  (``extra.layout_copy``: a convolution's weight gradient) it copies into the
  output at the step's end, so its buffer lives from the kernel to there and
  the output's allocation is free until then; its own buffers (``xla_buffer``
  nodes: a transposed copy for a convolution) are made for their first
  reader, wherever the plan computes them, and again for a library call the
  backward pass recomputes (:func:`_buffers_made_again`); a recomputed elementwise or layout
  op is fused into the kernels reading it (they read what it reads), unless a
  library call reads it directly; a recomputation nothing in the backward
  pass reads is not made; a slice of a stacked argument that a library call
  reads is a copy (:func:`_slice_copies`; a matrix's, held from the first
  reader to the last); the gradient of such a slice (whatever writes it) is held
  to the step's end, where XLA stacks the slices' gradients into the caller's,
  one allocation per leaf (:func:`_housed`), unless the step scans such
  gradients (``scanned``: then only the dots' outside the scan); a recomputed library call makes
  a kept operand that is XLA's copy of a buffer again from that buffer
  (:func:`_copied_again`);
  where its kernel writes only a factor of a value (a softmax's division by
  its sum: the sum's reciprocal), each reader multiplies the rest in, so
  reads the value's operand of its shape too (the forward pass's exp,
  wherever the plan recomputes it); a kernel computing a recomputed value
  inside reads what its region is tied to (:func:`_ties`), and one that made a
  forward value inside in the plain step reads the region recomputing it
  when that came after the first such kernel (:func:`_read_recomputed`);
  a kept value of 0 bytes whose operand the plan recomputes (one
  ``unwritten_recomputed`` could not move) is saved whole (:func:`~.jax_policy.unwritten_residuals`;
  keras llama at the bench's size, cpsat at a 10.8 MiB planning budget in the eager order: four
  softmax divisions of 1 MiB, applied 13.62 -> 15.61 MiB against XLA's 17.10).

Measured on the models' compiled graphs (CPU, memory-minimizing scheduler,
the first round of ``--verify xla``; docs/xla.md), this peak against XLA's
figure for the step in the plan's order, then the plan's own peak against
the same: mlp cpsat at 0.5 1.000 and 0.914, unet greedy 0.6 0.985 and 0.752,
keras llama greedy 0.8 1.018 and 0.802; what XLA does on its own took resnet
cpsat 0.8 from 1.119 to 1.000 and unet cpsat 0.8 from 0.946 to 1.001.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..graph import Graph
from ..importers.jaxpr.cost import EXPENSIVE, fusible, fusion_consumer
from ..plan import COMPUTE, OFFLOAD, Plan
from .jax_policy import residual_fates, unwritten_recomputed, unwritten_residuals

# Kernels that read their operands as whole buffers in memory (XLA's CPU library calls), never fusing a slice.
LIBRARY_CALLS = frozenset({"dot_general", "conv_general_dilated"})
# The gradients of a stacked argument's slices a scan stacks as it runs: a dot's, or its transpose's, which XLA
# folds into the dot (gpt_scan's weight gradients: ``dot.53``, op_name ``.../transpose``).
STACKED_DOTS = LIBRARY_CALLS | {"transpose"}


def applied_peak(graph: Graph, plan: Plan, scanned: dict[str, set[int]] | None = None,
                 as_planned: bool = True) -> int:
    """Peak bytes of ``apply_plan(loss_fn, graph, plan)``'s gradient step on
    ``graph``'s memory model (module docstring): each value is allocated when
    its pass computes it and freed after its last reader there, as the
    simulator frees a plan's values; outputs and persistent values never.
    ``scanned``: the nodes the step ran inside a ``lax.scan``, by pass
    (:func:`scanned_nodes` of the applied function's ``loops``; None: none);
    ``as_planned`` as ``apply_plan`` takes it."""
    return max([graph.initial_bytes, *applied_curve(graph, applied_step(graph, plan, scanned, as_planned))])


def applied_curve(graph: Graph, step: "AppliedStep") -> list[int]:
    """The bytes live at each computation of ``step`` (:func:`applied_step`), the
    first entry before any (what the initial bytes are once the values nothing
    reads are freed); :func:`applied_peak` is their most."""
    n = len(step.order)
    rises, frees = [0] * n, [0] * (n + 1)  # frees[-1]: before the first computation
    for copy, k in step.born.items():
        if k >= 0 and copy not in step.housed:
            rises[k] += step.size[copy]
    for copy, k in step.last.items():
        node = graph.nodes[copy[0]]
        if copy not in step.housed and (copy[1] == "s" or not (node.output or node.persistent)):
            frees[k] += step.size[copy]
    mem = graph.initial_bytes - frees[-1]
    curve = [mem]
    for k in range(n):
        mem += rises[k]
        curve.append(mem)
        mem -= frees[k]
    return curve


@dataclass(frozen=True)
class AppliedStep:
    """The computations of the applied step in order, each a (node, copy): "f"
    the forward pass's, "b" the backward's ("s": XLA's copy of a stacked
    argument's slice, :func:`_slice_copies`); each copy's ``born`` and ``last``
    position there (-1: before the first), its bytes, and the copies XLA's CPU
    buffer assignment houses in the outputs' allocations."""

    order: list[tuple[int, str]]
    born: dict[tuple[int, str], int]
    last: dict[tuple[int, str], int]
    size: dict[tuple[int, str], int]
    housed: set[tuple[int, str]]


def scanned_nodes(loops) -> dict[str, set[int]]:
    """The graph nodes an applied step runs inside a ``lax.scan``, by pass ("forward",
    "backward"): from ``apply_plan(...).loops`` once the function was traced."""
    out: dict[str, set[int]] = {}
    for note in loops:
        for phase, nodes in note.nodes.items():
            out.setdefault(phase, set()).update(nodes)
    return out


def applied_step(graph: Graph, plan: Plan, scanned: dict[str, set[int]] | None = None,
                 as_planned: bool = True) -> AppliedStep:
    """The live ranges of the values of ``apply_plan``'s step for ``plan`` (module docstring);
    ``scanned`` and ``as_planned`` as :func:`applied_peak` takes them."""
    phase = [v.phase for v in graph.nodes]
    plan = unwritten_recomputed(graph, plan)  # as apply_plan runs it
    fates = residual_fates(graph, plan)
    exact = as_planned and fates.exact
    ops, nodes = plan.ops.tolist(), plan.nodes.tolist()
    start = next(t for t, (o, i) in enumerate(zip(ops, nodes)) if o == COMPUTE and phase[i] == "backward")
    def read(u: int, by: str) -> tuple[int, str]:
        """The copy of ``u`` that a computation of pass ``by`` reads."""
        if phase[u] == "backward" or (by[0] == "b" and (u in fates.recomputed or u in fates.offloaded)):
            return (u, "b")
        return (u, "f")

    # the step's computations in the plan's order, each a (node, copy): "f" the forward pass's, "b" the backward's
    if exact:
        order, operands = _every_computation(graph, plan, start)
    else:
        steps: dict[tuple[int, str], None] = {}
        for t, (o, i) in enumerate(zip(ops, nodes)):
            if o == COMPUTE:
                back = phase[i] == "backward" or (t >= start and i in fates.recomputed and (i, "f") in steps)
                steps.setdefault((i, "b" if back else "f"))
        order = list(steps)
        operands = {(i, c): [read(u, c) for u in graph.preds[i]] for i, c in order}
    # apply_plan recomputes what the backward pass reads, not every value the plan computes again
    # (resnet, cpsat at 0.8: a convolution recomputed for a sum the step keeps, which XLA drops)
    needed = {copy for copy in order if copy[1] == "f" or phase[copy[0]] == "backward"}
    for copy in reversed(order):
        if copy in needed:
            needed.update(operands[copy])
    order = [copy for copy in order if copy in needed]

    made = _remade(graph, order, operands) if exact else _made_again(graph, order, operands, read)
    again = {**made, **_buffers_made_again(graph, order, operands)}
    _copied_again(graph, order, operands)
    remade = _read_recomputed(graph, order, operands)
    tie = _ties(graph, order)

    born = {(u, "f"): -1 for u in graph.initial_resident}  # counted in the initial bytes
    first_backward = next(k for k, (_, c) in enumerate(order) if c[0] == "b")
    born.update({(u, "b"): first_backward for u in fates.offloaded})
    for k, copy in enumerate(order):
        born.setdefault(copy, k)
    # a recomputed elementwise or layout op XLA fuses into each kernel reading it: no buffer of its
    # own, and those kernels read what it reads. Not into a library call (a convolution), unless
    # that reads it through XLA's copy of it (an xla_buffer of its bytes), which computes it
    readers: dict[tuple[int, str], list[tuple[int, str]]] = {}
    for copy in [*order, *again]:
        for r in operands[copy]:
            readers.setdefault(r, []).append(copy)

    def fuses(copy: tuple[int, str], reader: tuple[int, str]) -> bool:
        node = graph.nodes[reader[0]]
        return (fusion_consumer(node.op) or (node.extra or {}).get("fused", 1) > 1
                or any(graph.nodes[u].op == "xla_buffer" and size0(u) == size0(copy[0]) for u in graph.preds[node.id]))

    def size0(u: int) -> int:
        return (graph.nodes[u].extra or {}).get("housed", graph.bytes[u])

    fused = {c for c in [*order, *again] if c[1][0] == "b" and phase[c[0]] == "forward"
             and fusible(graph.nodes[c[0]].op) and all(fuses(c, r) for r in readers.get(c, []))
             and (len(readers.get(c, [])) <= 1 or graph.nodes[c[0]].op not in EXPENSIVE)}

    residuals = unwritten_residuals(graph, fates)

    def factor_of(copy: tuple[int, str]) -> list[tuple[int, str]]:
        """The operands of ``copy``'s shape that its kernel does not write into it: XLA's kernel
        writes less than the value (a division by a broadcast sum writes the sum's reciprocal) and
        each reader multiplies the operand in. Not where the forward pass writes the whole value for
        a reader (XLA's copy of it for a dot), which a backward kernel's copy of it merges with (keras
        llama's attention weights: the forward dot's copy, held to the backward dot)."""
        aval = (graph.nodes[copy[0]].extra or {}).get("aval")
        rest = [o for o in operands.get(copy, []) if aval is not None and size0(o[0]) > size0(copy[0])
                and (graph.nodes[o[0]].extra or {}).get("aval") == aval]
        whole = {size0(p) for r in graph.succs[copy[0]] if phase[r] == "forward" for p in graph.preds[r]
                 if graph.nodes[p].op == "xla_buffer" and phase[p] == "forward"}
        return [o for o in rest if size0(o[0]) not in whole]

    def inside(x: tuple[int, str], reader: tuple[int, str]) -> bool:
        """Whether ``reader``'s kernel computes ``x`` inside instead of reading a buffer of it: ``x`` is
        fused, or a cheap recomputation XLA also writes for a library call and computes again in this
        kernel, which made it inside in the plain step (:func:`_read_recomputed`)."""
        return x in fused or (x in remade.get(reader, ()) and fusible(graph.nodes[x[0]].op)
                              and graph.nodes[x[0]].op not in EXPENSIVE and fuses(x, reader))

    def reads(copy: tuple[int, str]) -> list[tuple[int, str]]:
        """What ``copy``'s kernel reads: for an operand computed inside, what that reads (and the value
        its region is tied to, :func:`tied`)."""
        return [r for o in operands[copy] for x in (o, *factor_of(o))
                for r in ([*reads(x), *([tie[x]] if x in tie and tied(x, copy) else [])] if inside(x, copy) else [x])]

    def tied(x: tuple[int, str], reader: tuple[int, str]) -> bool:
        """Whether ``reader``'s kernel, computing ``x`` inside, reads the value its region is tied to:
        where it is the one kernel computing it. One that several kernels read XLA may write once
        after all (keras llama greedy at 0.8: a recomputed multiply read by three kernels, written
        by one reading the tie; tied in each reader it read 1.057 of XLA's figure, 1.017 untied)."""
        return x in remade.get(reader, ()) or len(readers.get(x, [])) == 1

    last = dict(born)
    first_read: dict[tuple[int, str], int] = {}
    for k, copy in enumerate(order):
        for r in reads(copy):
            last[r] = k
            first_read.setdefault(r, k)
    # a value made again that a library call reads is written for it
    born.update((c, first_read[c]) for c in again if c in first_read and c not in fused)
    last.update((c, born[c]) for c in again if c in born and c not in last)
    for u, (first, end) in _slice_copies(graph, order).items():
        born[(u, "s")], last[(u, "s")] = first, end
    extra = {copy: graph.nodes[copy[0]].extra or {} for copy in born}
    backward_pass = next(k for k, (i, c) in enumerate(order) if c[0] == "b" and graph.nodes[i].op != "xla_buffer")
    # a buffer XLA makes on its own in the backward pass (a transposed copy for a convolution) is
    # made for its reader, wherever the plan first computed its node; one the forward pass makes
    # stays there (keras gpt2: the dropout masks' random bits, read in the backward pass)
    born.update((c, first_read[c]) for c in born if graph.nodes[c[0]].op == "xla_buffer" and c in first_read
                and born[c] >= backward_pass)
    # a result XLA copies into the output's layout holds its kernel's buffer to the step's end; so does
    # a stacked argument's slice's gradient, whatever writes it (a dot, its transpose, a reduction: a
    # bias's), which XLA stacks there into the caller's gradient (:func:`_housed`); where the step scans
    # some of them (:data:`STACKED_DOTS`), only the dots outside the scan
    copied = sorted((c for c in born if "layout_copy" in extra[c]), key=lambda c: extra[c]["layout_copy_order"])
    every = graph.meta.get("xla", {}).get("stacked_outputs", [])
    in_scan = (scanned or {}).get("backward", set())
    if any(u in in_scan and graph.nodes[u].op in STACKED_DOTS for u, _ in every):
        stacked = {u: leaf for u, leaf in every if graph.nodes[u].op in LIBRARY_CALLS
                   and "layout_copy" not in (graph.nodes[u].extra or {})}
    else:  # a scan stacks the slices' gradients it computes as it runs
        stacked = {u: leaf for u, leaf in every if u not in in_scan}
    copied += [c for c in born if c[0] in stacked and "allocation" in extra[c] and c not in copied]
    last.update((c, len(order) - 1) for c in copied)
    # the copies one after another, in the order of the results (resnet, cpsat at 0.8: as XLA runs them):
    # a buffer copied earlier may be housed in the allocation of a result copied later
    copied_at = {c: len(order) - 1 + j / len(copied) for j, c in enumerate(copied)}
    size = {c: 0 if c in fused else extra[c].get("layout_copy", extra[c].get("housed", graph.bytes[c[0]]))
            for c in born}
    size.update((c, graph.bytes[extra[c]["allocation"]]) for c in copied if "layout_copy" not in extra[c])
    # a kept value XLA never writes in the plain step whose operand the plan recomputes (the rest of
    # unwritten_recomputed's: its first reader comes before that) is a residual XLA writes whole
    size.update(((u, "f"), _written_bytes(graph, u)) for u in residuals if (u, "f") in size)
    housed = _housed(graph, born, last, operands, size, len(order), copied_at, stacked)
    return AppliedStep(order, born, last, size, housed)


def _every_computation(graph: Graph, plan: Plan, start: int) -> tuple[list, dict]:
    """The computations of ``apply_plan``'s step for a plan it runs as it is (:attr:`~.jax_policy.Fates.exact`),
    with their operands: a node's first computation in the backward pass is its copy "b", each later one
    "b1", "b2", ... (an offloaded value's first is its prefetch), and a backward computation reads the
    copy made last before it (a forward value's "f" until the backward pass makes it again)."""
    phase = [v.phase for v in graph.nodes]
    ops, nodes = plan.ops.tolist(), plan.nodes.tolist()
    offloaded = {i for o, i in zip(ops, nodes) if o == OFFLOAD}
    latest: dict[int, str] = {}
    made = dict.fromkeys(offloaded, 1)  # backward copies made so far, by node
    order: list[tuple[int, str]] = []
    operands: dict[tuple[int, str], list[tuple[int, str]]] = {}
    for t, (o, i) in enumerate(zip(ops, nodes)):
        if o != COMPUTE:
            continue
        if t == start:
            latest.update(dict.fromkeys(offloaded, "b"))
        if t < start and i in latest:  # the forward pass computes each value once
            continue
        if phase[i] == "forward" and i not in latest:  # the forward pass's (late, after ``start``)
            copy = "f"
        else:
            k = made.get(i, 0)
            made[i] = k + 1
            copy = "b" if k == 0 else f"b{k}"
        operands[(i, copy)] = [(u, latest.get(u, "f") if copy[0] == "b" else "f") for u in graph.preds[i]]
        latest[i] = copy
        order.append((i, copy))
    return order, operands


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
    sliced = {u for u in graph.initial_resident if "iteration" in (graph.nodes[u].extra or {})
              and len(_dims((graph.nodes[u].extra or {}).get("aval"))) <= 2}
    out: dict[int, tuple[int, int]] = {}
    for k, (i, _) in enumerate(order):
        if graph.nodes[i].op in LIBRARY_CALLS:
            for u in sliced.intersection(graph.preds[i]):
                out[u] = (out.get(u, (k, k))[0], k)
    return out


def _written_bytes(graph: Graph, u: int) -> int:
    """The bytes of ``u``'s value as a buffer, from its ``extra.aval`` (such as ``f32[4,128,128]``)."""
    aval = (graph.nodes[u].extra or {}).get("aval") or ""
    width = max(1, int("".join(ch for ch in aval.partition("[")[0] if ch.isdigit()) or 8) // 8)  # bool: a byte
    return width * math.prod(_dims(aval))


def _dims(aval: str | None) -> list[int]:
    """The dimensions of an ``extra.aval`` such as ``f32[32,2,16]`` (none where unknown)."""
    return [int(d) for d in (aval or "").partition("[")[2].rstrip("]").split(",") if d]


def _buffers_made_again(graph: Graph, order: list, operands: dict) -> dict:
    """XLA's own buffers (``xla_buffer`` nodes) that a library call (:data:`LIBRARY_CALLS`)
    recomputed in the backward pass reads, as copies ``(u, "b")``: ``apply_plan`` keeps the
    program's values, not XLA's, so XLA writes the operand again for the recomputed dot, and the
    forward pass's buffer dies at its forward reader (keras llama, greedy at 0.6: the attention's
    grouped values broadcast to every head, two 8 KiB buffers held from the forward pass to the
    recomputed dots, 1.054 of XLA's figure; 0.999). Rewrites ``operands`` so."""
    again = {}
    for i, c in order:
        if c[0] == "b" and graph.nodes[i].phase == "forward" and graph.nodes[i].op in LIBRARY_CALLS:
            for j, (u, cu) in enumerate(operands[(i, c)]):
                if cu == "f" and graph.nodes[u].op == "xla_buffer":
                    operands[(i, c)][j] = (u, "b")
                    again[(u, "b")] = None
    operands.update((c, []) for c in again)
    return again


def _copied_again(graph: Graph, order: list, operands: dict) -> None:
    """A library call (:data:`LIBRARY_CALLS`) recomputed in the backward pass reads its kept
    forward operands tied (``x + 0 * last``, ``jax_policy._evaluate_tied``), and XLA cannot fuse
    the tie into the call: where an operand is XLA's copy of a buffer (its node made from an
    ``xla_buffer`` of its bytes that nothing else reads: a projection's result transposed for the
    attention's value dot), XLA makes the copy again from that buffer, which the forward pass
    holds to the recomputation beside the kept copy (gpt_scan at its instance config, cpsat at
    0.5: the v projection's two 16 KiB results, held from the forward pass to the recomputed value
    dot). Not where the call also reads an ``xla_buffer`` of the operand's bytes: the graph does
    not say which operand that copies (the score dot's q and k: XLA holds the raw q beside its
    copy, and the raw k alone). Rewrites ``operands`` so."""
    def bytes_of(u: int) -> int:
        return (graph.nodes[u].extra or {}).get("housed", graph.bytes[u])

    def copy_source(u: int) -> list[int]:
        return [p for p in graph.preds[u] if graph.nodes[p].op == "xla_buffer" and graph.succs[p] == [u]
                and bytes_of(p) == bytes_of(u)]

    for i, c in order:
        if c[0] != "b" or graph.nodes[i].phase != "forward" or graph.nodes[i].op not in LIBRARY_CALLS:
            continue
        copies = {bytes_of(p) for p in graph.preds[i] if graph.nodes[p].op == "xla_buffer"}
        for j, (u, cu) in enumerate(operands[(i, c)]):
            source = copy_source(u)
            if cu == "f" and len(source) == 1 and bytes_of(u) not in copies:
                operands[(i, c)][j] = (source[0], "f")


def _made_again(graph: Graph, order: list, operands: dict, read) -> dict:
    """The forward values the backward pass makes again inside one of its kernels (a ``fuse="xla"``
    node holds the equations XLA fused into its kernel), as copies ``(u, "b")`` with their operands.
    ``apply_plan`` makes each once and the kernels after it read that one, not the kept forward
    value (resnet, greedy at 0.7 in the eager order: a ReLU kept for a recomputed convolution is
    made again by the select that reads it; XLA drops the kept one). Rewrites ``operands`` so."""
    groups = graph.meta.get("groups") if graph.meta.get("fuse") == "xla" else None
    if not groups:
        return {}
    base = graph.meta["xla"]["step_nodes"] - len(groups)
    node_of = {g[-1]: base + j for j, g in enumerate(groups)}
    made_at: dict[int, int] = {}
    for k, (i, c) in enumerate(order):
        if c[0] == "b" and base <= i < base + len(groups):
            for e in groups[i - base][:-1]:
                u = node_of.get(e)
                if u is not None and graph.nodes[u].phase == "forward" and (u, "b") not in operands:
                    made_at.setdefault(u, k)
    again = {}
    for k, copy in enumerate(order):
        for j, (u, c) in enumerate(operands[copy]):
            if c == "f" and made_at.get(u, k) < k:
                operands[copy][j] = (u, "b")
                again[(u, "b")] = None
    operands.update({c: [read(o, "b") for o in graph.preds[c[0]]] for c in again})
    return again


def _remade(graph: Graph, order: list, operands: dict) -> dict:
    """:func:`_made_again` for a plan ``apply_plan`` runs as it is: a backward kernel holding a forward
    value the plan never computes again makes it again, as a copy ``(u, "bm<n>")``, where it has none yet
    or one of its operands was made again since (``jax_policy._once`` with ``remade``); a later
    computation reads the copy made last (resnet at its instance config, greedy at 0.8: a ReLU made again
    from each recomputation of the convolution it reads). Rewrites ``operands`` so."""
    groups = graph.meta.get("groups") if graph.meta.get("fuse") == "xla" else None
    if not groups:
        return {}
    base = graph.meta["xla"]["step_nodes"] - len(groups)
    node_of = {g[-1]: base + j for j, g in enumerate(groups)}
    planned = {i for i, c in order if c[0] == "b"}
    latest: dict[int, tuple[int, str]] = {}  # node -> its copy made last
    made_at: dict[int, int] = {}  # a value made inside kernels -> where it was made last
    changed: dict[int, int] = {}  # node -> where its latest copy was made
    again: dict = {}
    for k, (i, c) in enumerate(order):
        if c[0] == "b":
            operands[(i, c)] = [latest[u] if u in made_at else (u, cu) for u, cu in operands[(i, c)]]
            if base <= i < base + len(groups):
                for e in groups[i - base][:-1]:
                    u = node_of.get(e)
                    if u is None or graph.nodes[u].phase != "forward" or u in planned:
                        continue
                    if u not in made_at or any(changed.get(p, -1) > made_at[u] for p in graph.preds[u]):
                        copy = (u, f"bm{sum(1 for x in again if x[0] == u)}")
                        operands[copy] = [latest.get(p, (p, "f")) for p in graph.preds[u]]
                        again[copy] = None
                        latest[u], made_at[u] = copy, k
        latest[i] = (i, c)
        changed[i] = k
    return again


def _read_recomputed(graph: Graph, order: list, operands: dict) -> dict:
    """Add to ``operands`` the recomputed forward values that backward kernels
    read where the graph has them make the value inside, and return those
    reads, by kernel. ``apply_plan`` makes an equation once, in the first
    backward kernel holding it (``jax_policy._once``); a later kernel holding it
    reads the value last made, which a recomputed region made after that first
    kernel replaces (resnet, cpsat at 0.5: a ReLU made inside a select, then
    recomputed for a convolution, read again by the transposed copy for a
    weight gradient after that, which XLA computes inside that copy)."""
    groups = graph.meta.get("groups") if graph.meta.get("fuse") == "xla" else None
    if not groups:
        return {}
    base = graph.meta["xla"]["step_nodes"] - len(groups)
    node_of = {g[-1]: base + j for j, g in enumerate(groups)}
    at = {copy: k for k, copy in enumerate(order)}
    first_maker: dict[int, int] = {}
    added: dict = {}
    for k, (i, c) in enumerate(order):
        if c[0] != "b" or not base <= i < base + len(groups):
            continue
        for e in groups[i - base][:-1]:
            u = node_of.get(e)
            if u is None or graph.nodes[u].phase != "forward":
                continue
            first = first_maker.setdefault(u, k)
            if first < at.get((u, "b"), -1) < k and (u, "b") not in operands[(i, c)]:
                operands[(i, c)].append((u, "b"))
                added.setdefault((i, c), []).append((u, "b"))
    return added


def _ties(graph: Graph, order: list) -> dict:
    """Each recomputed copy's tie: the backward value computed before its region,
    which ``apply_plan`` has the region read (``x + 0 * last[0]``,
    ``jax_policy._evaluate_tied``), so a kernel computing the copy inside reads
    that value too and holds it until then (resnet, cpsat at 0.5: an
    input-gradient convolution held for a transposed copy that recomputes a
    ReLU after it)."""
    out: dict = {}
    before = None
    for i, c in order:
        node = graph.nodes[i]
        if c[0] == "b" and node.phase == "forward":
            if before is not None:
                out[(i, c)] = before
        elif c[0] == "b" and node.op != "xla_buffer":
            before = (i, c)
    return out


def _housed(graph: Graph, born: dict, last: dict, operands: dict, size: dict, end: int, copied: dict,
            stacked: dict) -> set:
    """The copies XLA's CPU buffer assignment houses in the outputs' allocations
    (:func:`~rematopt.xla.memory.cpu_allocations`), over the applied step's live
    ranges: the graph's ``extra.housed`` nodes were picked over the plain
    step's, which a plan changes (gpt at its instance config, cpsat at 0.5,
    on the compiled graph before the mapping merge: applied peak 0.872 of
    XLA's figure with the plain step's housing, 0.905 with the applied step's). A copy may take the place of a same-size operand
    dying there (the graph does not say which kernels are elementwise: any).
    An output in ``copied`` is a temporary to its copy (at the position
    given, at the step's end), and its allocation is written there and houses
    temporaries until then (resnet, cpsat at 0.8: XLA houses 20 temporaries in the 6 weight
    gradients' allocations, all written before the copies). The results in ``stacked``
    (``{node: the caller's leaf}``: gradients of a stacked argument's slices) share one allocation per
    leaf, which XLA writes when it stacks them at the step's end (equinox_lm, greedy at 0.8: an
    allocation per slice housed the forward pass's dots, applied peak 0.912 of XLA's figure; 0.998;
    flax_linen, cpsat at 0.5 computed once: an allocation per slice for its biases' and layer norms'
    reductions and its attention kernels' transposed dots housed 16 KiB more than XLA's stacks do,
    0.943; 0.962).
    A value of several buffers (``extra.pieces``) is housed nowhere: the rule takes one buffer at a time."""
    from ..xla.memory import cpu_allocations

    def allocation_of(c: tuple[int, str]):
        leaf = stacked.get(c[0])
        return c if c not in copied else ("allocation", c) if leaf is None else ("stack", leaf)

    allocation = {c: allocation_of(c) for c in born if "allocation" in (graph.nodes[c[0]].extra or {})}
    outputs: dict = {}
    written: dict = {}
    for c, a in allocation.items():
        outputs[a] = outputs.get(a, 0) + graph.bytes[graph.nodes[c[0]].extra["allocation"]]
        written[a] = min(written.get(a, end), copied[c] if a != c else born[c])
    if not outputs:
        return set()
    temps = {c: (k, copied.get(c, last[c])) for c, k in born.items()
             if k >= 0 and c not in outputs and "pieces" not in (graph.nodes[c[0]].extra or {})}
    shares = {c: [o for o in operands.get(c, []) if o in temps and last[o] == born[c] and size[o] == size[c]]
              for c in temps}
    return cpu_allocations(temps, shares, outputs, written, {**size, **outputs}, end, operands, {**born, **written})
