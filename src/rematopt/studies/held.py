"""Where the first round's prediction is off, kernel by kernel: one plan's
applied step, compiled with every equation under a scope naming it
(``apply_plan(..., scopes=True)``; the program is the same), set beside
:func:`~rematopt.exporters.jax_applied.applied_step`, the prediction. It
says what :mod:`rematopt.studies.first_round` cannot: which backward kernels XLA ran
out of the plan's order, which ties XLA satisfied without the kernel they tie to
(:func:`ties_computed_inside`), and at XLA's peak, node by node, the bytes XLA held
in temporaries (its own or housed in an output's allocation) against those
the applied step holds at that kernel. Run from a checkout (models/ is
imported), on CPU under the memory-minimizing scheduler:

    python -m rematopt.studies.held MODEL PLANNER RATIO [once] [--json]

The plan is made as the first round makes it (:mod:`.first_round`: the
budget a share of the graph's no-remat peak, moved up while the planner
finds none; cpsat on CP-SAT's deterministic clock); ``once`` applies it with
``as_planned=False``. Found with it (flax_linen, cpsat at 0.8, as planned;
docs/xla.md): XLA's peak kernel where the plan has it, holding 66 KB more
than the applied step there: ties that read a value XLA computes again
inside them from its operands, which then live until the tie, and a
reduction the rolled backward pass ran at the step's end.
"""

from __future__ import annotations

import bisect
import json
import sys
import warnings
from dataclasses import asdict, dataclass, field
from typing import Any

from ..xla import flags


@dataclass
class Held:
    """One plan's applied step against XLA's compiled one."""

    xla_peak: int                 # XLA's figure (CPU: arguments + outputs + temp)
    predicted: int                # applied_peak: the first round's prediction
    peak_kernel: str              # the kernel XLA's live peak falls at
    peak_position: int | None     # its place in the applied step's order (None: no node of the plan's)
    applied_there: int            # the applied step's bytes live at that place
    housed: dict[str, int]        # of the temporaries there, the bytes in the outputs' allocations: "xla", "applied"
    out_of_order: list[dict[str, Any]] = field(default_factory=list)  # the fewest backward kernels XLA moved
    # the kernels whose tie computes the one element it reads of the kernel before inside (ties_computed_inside)
    ties_inside: list[dict[str, str]] = field(default_factory=list)
    nodes: list[dict[str, Any]] = field(default_factory=list)         # per node: bytes held at XLA's peak, both ways


def compare(step, graph, plan, as_planned: bool = True) -> Held:
    """:class:`Held` for ``plan`` on ``graph`` (a ``fuse="xla"`` graph of the factory step ``step``)."""
    import jax

    from ..exporters.jax_applied import applied_curve, applied_step, scanned_nodes
    from ..importers.jaxpr.compiled import equation_of
    from ..importers.jaxpr.step import trace_step
    from ..jax import apply_plan
    from ..xla.hlo import parse_hlo
    from ..xla.kernels import NOT_KERNELS
    from ..xla.memory import compiled_memory
    from ..xla.verify import xla_peak

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        applied = apply_plan(step.fn, graph, plan, scopes=True, as_planned=as_planned)
        compiled = flags.compile_jitted(jax.jit(jax.value_and_grad(applied, step.argnums)), step.args,
                                        flags.for_backend(jax.default_backend()), read_only=True)
    module = parse_hlo(compiled.as_text())
    memory = compiled_memory(module)
    scanned = scanned_nodes(applied.loops)
    run = applied_step(graph, plan, scanned, as_planned)
    curve = applied_curve(graph, run)

    traced = trace_step(step.fn, step.args, step.argnums, "xla", bool(graph.meta.get("unroll", False)), None,
                        graph.meta.get("groups"))
    node_of = traced.nodes_of_equations()

    def node(inst) -> int | None:
        k = equation_of(inst.metadata.op_name)
        return None if k is None else node_of.get(k)

    def backward(inst) -> bool:
        return "transpose(" in inst.metadata.op_name

    at: dict[tuple[int, str], list[int]] = {}
    for k, (i, c) in enumerate(run.order):
        at.setdefault((i, c[0]), []).append(k)
    kernels, seen = [], {}  # the backward pass's kernels: the pass apply_plan ties to the plan's order
    for pos, inst in enumerate(module.schedule):
        places = at.get((node(inst), "b")) if backward(inst) and inst.opcode not in NOT_KERNELS else None
        if places:  # a node's n-th kernel in XLA's schedule is its n-th computation in the plan's
            j = seen[node(inst)] = seen.get(node(inst), -1) + 1
            kernels.append((pos, inst.name, node(inst), places[min(j, len(places) - 1)]))
    kept = _in_order([k[3] for k in kernels])
    out_of_order = [{"xla_position": pos, "kernel": name, "node": u, "plan_position": k}
                    for j, (pos, name, u, k) in enumerate(kernels) if j not in kept]
    # the applied step's place for XLA's peak: that of its kernel, or of the nearest before it that has one
    # (a tie's add is a kernel of no node's)
    placed = {pos: k for pos, _, _, k in kernels}
    for pos, inst in enumerate(module.schedule):
        if not backward(inst) and (node(inst), "f") in at and inst.opcode not in NOT_KERNELS:
            placed.setdefault(pos, at[(node(inst), "f")][0])
    peak = memory.peak_index if not memory.peak_context else memory.peak_context[0].instruction
    peak = peak if isinstance(peak, int) else next(p for p, i in enumerate(module.schedule) if i.name == peak)
    k = next((placed[p] for p in range(peak, -1, -1) if p in placed), None)
    xla_bytes: dict[tuple, int] = {}
    unnamed: dict[str, list[str]] = {}  # the buffers of no node's, as "instruction bytes B (op_name)"
    for b in memory.live:
        if b.kind == "temp" or b.holds is not None:
            inst = module.by_name.get((b.holds or b).instruction)
            key = (node(inst), "b" if backward(inst) else "f") if inst is not None else (None, "f")
            xla_bytes[key] = xla_bytes.get(key, 0) + (b.holds or b).bytes
            if key[0] is None:
                x = b.holds or b
                unnamed.setdefault(key[1], []).append(f"{x.instruction} {x.bytes} B ({x.op_name})")
    applied_bytes: dict[tuple, int] = {}
    housed = {"xla": sum(b.holds.bytes for b in memory.live if b.holds is not None), "applied": 0}
    if k is not None:
        for c, born in run.born.items():
            if born <= k <= run.last.get(c, born) and born >= 0 and run.size[c]:
                key = (c[0], "b" if c[1][0] == "b" else "f")
                applied_bytes[key] = applied_bytes.get(key, 0) + run.size[c]
                housed["applied"] += run.size[c] if c in run.housed else 0
    rows = [{"node": u, "name": graph.nodes[u].name if u is not None else ", ".join(sorted(unnamed.get(c, []))),
             "copy": c, "xla": xla_bytes.get((u, c), 0), "applied": applied_bytes.get((u, c), 0)}
            for u, c in set(xla_bytes) | set(applied_bytes)]
    rows.sort(key=lambda r: (-(r["xla"] - r["applied"]), str(r["name"])))
    return Held(xla_peak=xla_peak(compiled)[0], predicted=max([graph.initial_bytes, *curve]),
                peak_kernel=memory.peak_instruction, peak_position=k,
                applied_there=curve[k + 1] if k is not None else 0, housed=housed, out_of_order=out_of_order,
                ties_inside=ties_computed_inside(module), nodes=[r for r in rows if r["xla"] != r["applied"]])


def ties_computed_inside(module) -> list[dict[str, str]]:
    """The kernels of ``module`` (an applied step compiled on CPU) whose tie does not read the buffer of
    the kernel before it: the element the tie reads (``x + 0 * last[0]``, ``jax_policy._evaluate_tied``)
    XLA computes inside from that kernel's operands, though it writes that kernel too (one element of a
    transposing copy is one of its operand), so nothing holds the kernel before to its place in the plan's
    order. Each: the kernel, and the opcode and op_name of what it computes inside. The op_names must name
    one equation each (``apply_plan(scopes=True)``, as :func:`compare` compiles it)."""
    from ..exporters.jax_policy import TIE
    from ..xla.kernels import SLICES, kernels, through

    fusions = [module.by_name[k.name] for k in kernels(module) if module.by_name[k.name].opcode == "fusion"]
    written = {f.metadata.op_name for f in fusions}  # what some kernel writes
    out = []
    for fusion in fusions:
        comp = module.computations[fusion.called[0]]
        for inst in comp.instructions:
            if inst.opcode != "multiply" or f"({TIE})" not in inst.metadata.op_name:
                continue
            read = next((comp.by_name[o] for o in inst.operands if o in comp.by_name
                         and comp.by_name[o].opcode in SLICES), None)
            source = comp.by_name.get(read.operands[0]) if read is not None else None
            source = through(source, comp.by_name, ("bitcast", "reshape")) if source is not None else None
            if (source is not None and source.opcode != "parameter" and source.metadata.op_name in written
                    and f"({TIE})" not in source.metadata.op_name):  # a tie's op_name names no one equation
                out.append({"kernel": fusion.name, "computes": source.opcode, "op_name": source.metadata.op_name})
    return out


def _in_order(xs: list[int]) -> set[int]:
    """The indices of a longest non-decreasing run through ``xs`` (patience sorting): the kernels
    left in the plan's order, so the rest are the fewest XLA moved."""
    tails: list[int] = []
    ends: list[int] = []
    back = [-1] * len(xs)
    for j, x in enumerate(xs):
        t = bisect.bisect_right(tails, x)
        back[j] = ends[t - 1] if t else -1
        if t == len(tails):
            tails.append(x)
            ends.append(j)
        else:
            tails[t], ends[t] = x, j
    out, j = set(), ends[-1] if ends else -1
    while j >= 0:
        out.add(j)
        j = back[j]
    return out


def plan_for(graph, planner: str, ratio: float):
    """The first round's plan (:func:`.first_round.first_plan`), or None."""
    from .. import planners as registry
    from .first_round import cpsat_limits, first_plan

    sol, _ = first_plan(graph, planner, ratio, cpsat_limits() if "time_limit" in registry.options(planner) else {})
    return None if sol is None else sol.plan


def report(held: Held, top: int = 25) -> str:
    lines = [f"XLA {held.xla_peak:,} B, predicted {held.predicted:,} B ({held.predicted / held.xla_peak:.3f}); "
             f"XLA's peak at {held.peak_kernel}, the applied step's position {held.peak_position} "
             f"({held.applied_there:,} B there); temporaries housed in the outputs' allocations there: XLA "
             f"{held.housed['xla']:,} B, the applied step {held.housed['applied']:,} B",
             f"{len(held.out_of_order)} backward kernels XLA ran out of the plan's order (the fewest it moved):"]
    lines += [f"  #{r['xla_position']} {r['kernel']} (node {r['node']}, the plan's computation {r['plan_position']})"
              for r in held.out_of_order[:top]]
    lines.append(f"{len(held.ties_inside)} kernels whose tie XLA computes from the kernel before's operands "
                 "(that kernel is held to no place):")
    lines += [f"  {r['kernel']}: {r['computes']} ({r['op_name']})" for r in held.ties_inside[:top]]
    lines.append("held at XLA's peak, XLA against the applied step (bytes; most held by XLA beyond it first):")
    lines += [f"  {r['xla']:>10,} {r['applied']:>10,}  {r['name']} ({r['copy']})" for r in held.nodes[:top]]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    args = [a for a in argv if a != "--json"]
    if len(args) < 3:
        print("usage: python -m rematopt.studies.held MODEL PLANNER RATIO [once] [--json]", file=sys.stderr)
        return 2
    from ..xla.factory import load_step, plan_graphs
    from .closed_loop import MODELS

    name, planner = args[0], args[1]
    try:
        ratio = float(args[2])
    except ValueError:
        print(f"held: RATIO must be a number, not {args[2]!r}", file=sys.stderr)
        return 2
    if name not in MODELS:
        print(f"held: unknown model {name!r} (one of {', '.join(MODELS)})", file=sys.stderr)
        return 2
    step = load_step(*MODELS[name])
    graph = next((g for g in plan_graphs(step) if g is not None and g.meta.get("fuse") == "xla"), None)
    if graph is None:
        print(f"held: {name} has no compiled graph", file=sys.stderr)
        return 2
    plan = plan_for(graph, planner, ratio)
    if plan is None:
        print(f"held: {planner} found no plan for {name} at {ratio}", file=sys.stderr)
        return 2
    held = compare(step, graph, plan, as_planned="once" not in args[3:])
    print(json.dumps(asdict(held)) if "--json" in argv else report(held))
    return 0


if __name__ == "__main__":
    flags.apply(flags.CPU_VERIFY)  # before the backend starts
    sys.exit(main(sys.argv[1:]))
