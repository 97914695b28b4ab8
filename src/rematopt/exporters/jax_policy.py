"""Plans back into JAX: ``apply_plan(loss_fn, graph, plan) -> loss_fn'``.

A plan decides, for every forward value the backward pass reads, whether it is
kept on the device, offloaded to the host, or recomputed. JAX's name-based
policies (``save_only_these_names``) act on the primal program, but the
graph's forward nodes are the equations of the ``jax.vjp`` forward pass, which
include values the primal never names (``1 - tanh(x)**2``, say). So the plan
is applied exactly with a ``jax.custom_vjp``: its forward pass runs the traced
forward equations and saves the kept values (offloaded ones moved to host
memory), and its backward pass recomputes the rest from those, then runs the
traced backward equations.

A plan that computes a value twice in the backward pass (it frees a backward
value between its readers, or a recomputed one between two recomputations), or
computes again a forward value it first read from the forward pass's copy, runs
as it is: every computation after the first in a recomputed region
(:attr:`Fates.exact`; unet at the bench's size, cpsat's plan for half the plain
step: compiled to 15.88 MB computing each value once, 13.37 MB as it is, the
plan's own peak 12.68). In any other plan a recomputed value is computed once,
before its first reader, as the plan computes it.

XLA would merge a recomputation with the identical forward computation (CSE)
and so undo it; like ``jax.checkpoint``'s ``prevent_cse``, the inputs of each
recomputed region (consecutive recomputed units of the plan's backward pass)
go through one ``lax.optimization_barrier``, here together with the backward
value the plan computes just before it, to pin it in place; inside a region
XLA fuses the recomputation into the kernels that read it. XLA's CPU
pipeline expands the barriers away before CSE, for ``jax.checkpoint`` as for
this, so on CPU each region also reads that backward value through a data
dependence (:func:`_evaluate_tied`; docs/xla.md). Where the graph's nodes are
XLA's kernels (``fuse="xla"``), so does every backward kernel: XLA's CPU
scheduler then runs the backward pass in the plan's order, the order whose
peak the plan predicts, instead of one of its own.
"""

from __future__ import annotations

import collections
import functools
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import jax
import numpy as np

from ..errors import ImportFailure, PlanError
from ..graph import Graph
from ..importers.jaxpr.compiled import TAG
from ..importers.jaxpr.cost import EXPENSIVE, fusible
from ..importers.jaxpr.flatten import Const, evaluate, in_scope
from ..importers.jaxpr.primitives import MATMUL
from ..importers.jaxpr.step import Step, trace_step
from ..importers.jaxpr.unroll import iterations
from ..plan import COMPUTE, FREE, OFFLOAD, Plan
from ..simulate import simulate
from .jax_loops import LoopNote, Piece, Run, Unit, execute, gather, roll, unit_inputs, value


@dataclass(frozen=True)
class Fates:
    """What a plan does with the forward values read after the backward pass starts."""

    kept: frozenset[int]        # saved on the device
    offloaded: frozenset[int]   # saved in host memory
    recomputed: frozenset[int]  # computed again in the backward pass
    schedule: tuple[int, ...] = ()  # nodes the backward pass computes, in the plan's order (first time each)
    events: tuple[int, ...] = ()  # every computation of the backward pass, in the plan's order

    @property
    def exact(self) -> bool:
        """Whether the plan computes a value twice in the backward pass, or computes again a forward
        value it read there from the forward pass's copy: ``apply_plan`` then runs every one of
        these computations, each one after the first in a recomputed region of its own."""
        return len(set(self.events)) < len(self.events) or bool(self.saved.intersection(self.events))

    @property
    def saved(self) -> frozenset[int]:
        return self.kept | self.offloaded


def residual_fates(graph: Graph, plan: Plan) -> Fates:
    """Classify forward nodes by the plan's events.

    The backward pass starts at the plan's first compute of a backward node.
    From then on, a forward node's first computation is still the forward
    pass's (XLA's schedule, which ``fuse="xla"`` graphs follow, runs some
    forward kernels after the first backward one). A forward node read by a
    backward node or a recomputation is *saved* if that read uses a copy the
    forward pass computed (it crossed the boundary), and *offloaded* if the
    plan also offloads it; one computed again before any such read is
    *recomputed*. For a forward value with a backward consumer this is the rule
    "computed once: kept (or offloaded); computed again: recomputed", extended
    to values that a recomputation reads.
    """
    phase = [v.phase for v in graph.nodes]
    if "backward" not in phase:
        raise PlanError(f"{graph.name}: graph has no backward phase; plans apply to traced training steps")
    ops, nodes = plan.ops.tolist(), plan.nodes.tolist()
    start = next((t for t, (o, i) in enumerate(zip(ops, nodes))
                  if o == COMPUTE and phase[i] == "backward"), len(ops))
    offloaded = {i for o, i in zip(ops, nodes) if o == OFFLOAD}
    computed = {i for o, i in zip(ops[:start], nodes[:start]) if o == COMPUTE}
    fate: dict[int, str] = {}
    preds = graph.preds
    schedule: dict[int, None] = {}
    events: list[int] = []
    for o, i in zip(ops[start:], nodes[start:]):
        if o != COMPUTE:
            continue
        if phase[i] == "forward" and i not in computed:  # the forward pass's, computed late
            computed.add(i)
            continue
        events.append(i)
        if phase[i] == "backward" or i not in fate:
            schedule.setdefault(i)
        for p in preds[i]:
            if phase[p] == "forward" and p not in fate:
                fate[p] = "offloaded" if p in offloaded else "kept"
        if phase[i] == "forward" and i not in fate:
            fate[i] = "recomputed"
    pick = lambda what: frozenset(i for i, f in fate.items() if f == what)  # noqa: E731
    return Fates(pick("kept"), pick("offloaded"), pick("recomputed"), tuple(schedule), tuple(events))


def computes_twice(graph: Graph, plan: Plan) -> bool:
    """Whether ``apply_plan`` runs ``plan`` differently as planned and with ``as_planned=False``
    (:attr:`Fates.exact` of the plan it runs)."""
    return residual_fates(graph, unwritten_recomputed(graph, plan)).exact


def unwritten_recomputed(graph: Graph, plan: Plan) -> Plan:
    """``plan`` with each forward value XLA never writes (0 bytes on a ``fuse="xla"`` graph: computed
    inside the kernels reading it) that it keeps for the backward pass while recomputing one of its
    operands, computed again instead right before its first reader there. Kept, it is a residual XLA
    writes whole, beside the forward operand XLA holds for the kernels it fuses the value into; the
    planner priced it at 0 bytes. Measured (CPU, memory-minimizing scheduler): keras llama at its
    instance config, greedy at 0.6 in the eager order (a K projection's dot, a logistic and a softmax's
    division moved) compiled to 250,556 B instead of 267,068 B; at the bench's size, cpsat's plan for
    0.5 (the K projections' dots, the rotary stacks and the RMS norms' sums) 17.10 MiB instead of 17.48.
    The recomputation costs the value's FLOPs again, which the compiled program's price counts. The
    plan's peak is the same (it frees and computes 0-byte values); the rewrite is taken only where the
    plan stays valid and no other value's fate changes, the value read first first. A plan cpsat made
    through ``solve`` has each such value's operands on the device at its readers
    (:func:`~rematopt.fused_reads.fused_reads`), where the rewrite computes it."""
    if graph.meta.get("fuse") != "xla":
        return plan
    fates = residual_fates(graph, plan)
    preds, phase = graph.preds, [v.phase for v in graph.nodes]
    todo = unwritten_residuals(graph, fates)
    # the one read first goes first: computed again, it reads its operands there, which a value read
    # later (the softmax's sum, read by its division) must still be there for as the forward copy;
    # that value is then computed again before this one's recomputation
    while todo:
        ops, nodes = plan.ops.tolist(), plan.nodes.tolist()
        start = next(t for t, (o, i) in enumerate(zip(ops, nodes)) if o == COMPUTE and phase[i] == "backward")
        first = {u: next((t for t in range(start, len(ops)) if ops[t] == COMPUTE and u in preds[nodes[t]]), None)
                 for u in todo}
        u = min(todo, key=lambda u: (first[u] is None, first[u] or 0, u))
        todo.discard(u)
        if first[u] is None:
            continue
        t = first[u]
        moved = Plan(plan.graph, plan.planner, ops[:t] + [FREE, COMPUTE] + ops[t:],
                     nodes[:t] + [u, u] + nodes[t:], plan.stats, plan.extra)
        after = residual_fates(graph, moved)
        if (after.kept == fates.kept - {u} and after.recomputed == fates.recomputed | {u}
                and after.offloaded == fates.offloaded and simulate(graph, moved).valid):
            plan, fates = moved, after
            todo |= unwritten_residuals(graph, fates)
    return plan


def unwritten_residuals(graph: Graph, fates: Fates) -> set[int]:
    """The kept forward values of 0 bytes (XLA computes them inside their readers in the plain step)
    with an operand the plan recomputes: ``apply_plan`` saves them, so XLA writes them whole, unless
    :func:`unwritten_recomputed` computes them again in the backward pass."""
    return {u for u in fates.kept if not graph.bytes[u] and any(p in fates.recomputed for p in graph.preds[u])}


def apply_plan(loss_fn: Callable, graph: Graph, plan: Plan, scan: bool = True, ordered: bool = True,
               scopes: bool = False, as_planned: bool = True) -> Callable:
    """``loss_fn'`` with ``loss_fn``'s signature whose gradient (with respect to
    the graph's ``argnums``, ``meta.argnums``) saves exactly what ``plan``
    keeps, offloads what it offloads and recomputes the rest.

    ``graph`` must come from :func:`rematopt.jax.trace_grad` of this function
    at arguments of the same shapes and pytree structure, keyword arguments
    included (the function is traced again at call time, with its loops
    unrolled if the graph's were, and checked node by node; ImportFailure if
    it differs). A graph with unrolled loops applies to the program with its
    loops and stacked parameters: iterations the plan treats alike run as one
    ``lax.scan`` in the forward and the backward pass (:mod:`.jax_loops`;
    ``scan=False`` runs every iteration unrolled), and those it treats
    differently run unrolled, with an :class:`UnrolledLoop` warning saying
    which and why. After the first call, ``loss_fn'.loops`` holds a
    :class:`~rematopt.exporters.jax_loops.LoopNote` per loop. ``loss_fn'``
    supports reverse-mode differentiation
    (``jax.grad``, ``jax.vjp``) with respect to the graph's ``argnums``;
    differentiating any other argument raises PlanError (the plan holds no
    backward pass for it, so its gradient would be a silent zero).

    ``ordered`` (``fuse="xla"`` graphs, CPU): every backward kernel is tied to
    the one before it, so XLA runs the plan's order, the one its peak is of;
    ``ordered=False`` leaves the order to XLA's scheduler, which may find a
    better one or a worse one for the same plan (:func:`_evaluate_tied`).

    ``scopes``: every equation runs under a ``jax.named_scope`` naming it
    (``rmq<k>``, as the compiled graph's import names the plain step's), so each
    buffer of the compiled step says in its ``op_name`` which equation, and so
    which node, wrote it (``importers.jaxpr.compiled.equation_of``): what XLA
    holds at its peak set beside :func:`~rematopt.exporters.jax_applied.applied_step`'s.
    Metadata only: the compiled program is the same.

    ``as_planned``: a plan that computes a value twice in the backward pass runs
    every computation it makes (:attr:`Fates.exact`); ``as_planned=False`` runs
    each recomputed value once, before its first reader, held to its last: fewer
    FLOPs, more memory where the plan freed it between (resnet, cpsat at 0.8:
    727,460 B at +0.2% FLOPs, as planned 761,956 B at +26%; unet at the bench's
    size, cpsat at 0.5: 15.88 MB, as planned 13.37). ``--verify xla`` compiles both.
    """
    replay = simulate(graph, plan)
    if not replay.valid:
        where = "" if replay.error_event is None else f" at event {replay.error_event}"
        raise PlanError(f"plan for {graph.name}: invalid{where}: {replay.error}")
    plan = unwritten_recomputed(graph, plan)
    fates = residual_fates(graph, plan)
    argnums = tuple(graph.meta.get("argnums", (0,)))
    fuse = graph.meta.get("fuse", False)
    fuse = fuse if fuse == "xla" else bool(fuse)
    groups = graph.meta.get("groups") if fuse == "xla" else None  # as traced: no second compile
    unroll = bool(graph.meta.get("unroll", False))  # graphs from before unrolling existed were not unrolled
    copied = frozenset(graph.meta.get("xla", {}).get("weight_copies", ()))
    # forward values the graph holds no buffer for: XLA computed them inside their readers (_evaluate_tied)
    unbuffered = frozenset(i for i, n in enumerate(graph.nodes) if n.phase == "forward" and not graph.bytes[i]) \
        if fuse == "xla" else frozenset()
    built: dict[Any, Callable] = {}

    @functools.wraps(loss_fn)
    def planned(*args, **kwargs):
        leaves, tree = jax.tree_util.tree_flatten((*args, kwargs))
        key = (tree, tuple((np.shape(x), str(jax.numpy.result_type(x))) for x in leaves))
        if key not in built:
            step = trace_step(loss_fn, args, argnums, fuse, unroll, kwargs, groups)
            check_matches(step, graph)
            if scopes:
                for k, e in enumerate(step.flat.eqns):
                    e.scope = f"{TAG}{k}"
            built[key], planned.loops = _planned_step(step, fates, scan, ordered, as_planned and fates.exact, copied,
                                                         unbuffered)
            for note in planned.loops:
                if scan and not note.rolled:
                    warnings.warn(UnrolledLoop(f"apply_plan: {graph.name}: {note.describe()}"), stacklevel=2)
        return built[key](*leaves)

    planned.loops = []
    return planned


class UnrolledLoop(UserWarning):
    """A loop of the program runs unrolled (in part) in the planned gradient:
    the plan treats its iterations differently."""


def check_matches(step: Step, graph: Graph) -> None:
    """ImportFailure unless ``step`` has ``graph``'s nodes, op for op."""
    ops = ["input"] * step.n_inputs + [step.head(g).prim.name for g in range(len(step.groups))]
    # a fuse="xla" graph appends XLA's extra buffers and output allocations after the step's nodes
    if len(ops) != graph.meta.get("xla", {}).get("step_nodes", graph.n):
        raise ImportFailure(f"{graph.name}: graph has {graph.n} nodes, the function traces to {len(ops)}; "
                            "trace the graph from this function at these argument shapes")
    for node, op in zip(graph.nodes, ops):
        if node.op != op:
            raise ImportFailure(f"{graph.name}: node {node.id} is {node.op!r} in the graph but {op!r} "
                                "in the traced function")


def _planned_step(step: Step, fates: Fates, scan: bool = True, ordered: bool = True,
                  exact: bool = False, copied: frozenset[int] = frozenset(),
                  unbuffered: frozenset[int] = frozenset()) -> tuple[Callable, list[LoopNote]]:
    """The custom_vjp function over the caller's flat argument leaves, and
    what became of the program's loops (:mod:`.jax_loops`); ``exact``: every
    computation of the plan's backward pass (:attr:`Fates.exact`); ``copied``:
    the equations whose kernels read a copy XLA makes of a weight
    (:func:`~rematopt.importers.jaxpr.compiled.weight_copies`); ``unbuffered``: the forward
    nodes the graph holds no buffer for (:func:`_evaluate_tied`'s ``inside``)."""
    flat = step.flat
    eqns = flat.eqns
    prod = step.producers()
    n_in = step.n_inputs
    group_of = {step.node_of_group(g): members for g, members in enumerate(step.groups)}
    phase_of = {node: eqns[members[-1]].phase for node, members in group_of.items()}
    root = step.root_of
    view_at = {eqns[k].outs[0]: k for k in step.view_eqns}

    def view_eqns(refs) -> set[int]:
        """The view equations that make ``refs`` from their roots (a view is no
        node: each unit reading one makes it again, at no cost)."""
        ks = set()
        for r in refs:
            while not isinstance(r, Const) and r in view_at:
                ks.add(view_at[r])
                r = eqns[view_at[r]].ins[0]
        return ks

    def make_views(refs, env: dict) -> dict:
        """Make the views ``refs`` are of their roots in ``env`` (a root a
        scan made is a :class:`Piece` of its stack, taken out first)."""
        execute([Unit(-1, tuple(eqns[k] for k in sorted(view_eqns(refs))))], env, run_forward)
        return env

    def inputs_of(node: int) -> list[int]:
        inside = {v for k in group_of[node] for v in eqns[k].outs}
        return sorted({root(r) for k in group_of[node] for r in eqns[k].ins
                       if not isinstance(r, Const) and root(r) not in inside})

    def loop_of_eqn(k: int) -> tuple[str, int] | None:
        loops = iterations(eqns[k].name_stack)
        return loops[0] if loops else None

    def units(node: int, recompute: bool = False, loop_of: int | None = None) -> list[Unit]:
        """The node's unit: its equations in program order with the views they
        read; where the unit is in a loop, the equations of it (but its head)
        made outside every loop from values made outside the unit or by such
        equations (a view of a scan's first carry or of an outer value; with
        ``fuse="xla"`` also a computation XLA fused into the loop's kernel,
        such as the slice of a stacked dropout key) go in a unit of their own
        before it, so the iterations a plan treats alike run the same
        equations (the first one's would make that value, the others not)."""
        head = group_of[node][-1]
        loop = loop_of_eqn(group_of[node if loop_of is None else loop_of][-1])
        views = view_eqns([r for k in group_of[node] for r in eqns[k].ins])
        every = sorted(set(group_of[node]) | views)
        apart: list[int] = []
        if loop is not None:
            inside = {v for k in every for v in eqns[k].outs}
            outer: set = set()  # values of apart equations
            for k in every:
                reads = [r for r in eqns[k].ins if not isinstance(r, Const) and r in inside]
                if k != head and loop_of_eqn(k) is None and all(r in outer for r in reads):
                    apart.append(k)
                    outer.update(eqns[k].outs)
        own = [k for k in every if k not in apart]
        made = [Unit(node, tuple(eqns[k] for k in apart), recompute, None)] if apart else []
        return made + [Unit(node, tuple(eqns[k] for k in own), recompute, loop)]

    # Recompute closure: forward nodes the backward pass needs and the plan
    # does not save, back to saved values and arguments. Values are named by
    # their roots: a view is made again where it is read. A value is read
    # from the node producing it unless the reading node makes it itself:
    # with fuse="xla" a forward equation XLA fuses into a backward kernel is
    # one of that node's, computed again there for free, and its value is
    # that node's alone (a backward node reading it elsewhere, perhaps
    # earlier, reads the forward node's, kept or recomputed as the plan says).
    bwd_reads = {r for node in group_of if phase_of[node] == "backward" for r in inputs_of(node)
                 if r != step.ct_id and phase_of.get(prod[r]) != "backward"}
    recompute: dict[int, list[int]] = {}  # node -> its external inputs
    todo = list(bwd_reads)
    while todo:
        node = prod[todo.pop()]
        if node < n_in or node in fates.saved or node in recompute:
            continue
        recompute[node] = inputs_of(node)
        todo.extend(recompute[node])
    # The backward pass runs in the plan's order (a valid plan computes every
    # backward node, and every node of the closure, after its backward pass
    # starts). Each recomputed region's inputs pass through one optimization
    # barrier together with the backward value computed just before it, so that
    # XLA, where it keeps the barriers, neither merges the recomputation with the
    # forward computation (CSE) nor hoists it ahead of that point (:func:`regions`).
    order = [i for i in fates.schedule if i in recompute or phase_of.get(i) == "backward"]  # allocation nodes: none
    rec_inputs = sorted({r for ins in recompute.values() for r in ins if prod[r] not in recompute})
    read_after = {r for r in bwd_reads if prod[r] not in recompute}
    read_after |= set(rec_inputs)
    again: list[bool] = [i in recompute for i in order]
    if exact:  # every computation of the plan's backward pass, as it makes them
        order = [i for i in fates.events if i in phase_of]
        recompute = {i: inputs_of(i) for i in order if phase_of[i] == "forward"}
        made: set = set()  # values the backward pass made so far
        read_after = set()
        again, seen = [], set()
        for i in order:
            again.append(i in recompute or i in seen)
            seen.add(i)
            read_after.update(r for r in inputs_of(i) if r != step.ct_id and r not in made
                              and phase_of.get(prod[r]) != "backward")
            made.update(root(v) for k in group_of[i] for v in eqns[k].outs)
    saved_vals = sorted(v for v in read_after if prod[v] >= n_in)
    host_vals = {v for v in saved_vals if prod[v] in fates.offloaded}
    arg_vals = sorted(v for v in read_after if prod[v] < n_in)
    loss_ref, grad_refs = step.out_refs[0], step.out_refs[1:]
    grad_leaves = _grad_leaf_order(step)
    # Unrolling may have split a stacked argument into one leaf per slice: the
    # function takes the caller's leaves, slices them, and stacks their cotangents.
    sources = step.sources or [(k, None) for k in range(n_in)]
    position = {v: k for k, v in enumerate(step.arg_ids)}
    arg_leaves = sorted({sources[position[v]][0] for v in arg_vals})
    pieces: dict[int, list[int]] = {}
    for k, (j, _) in enumerate(sources):
        pieces.setdefault(j, []).append(k)

    forward_pass: list = [u for node in group_of if phase_of[node] == "forward" for u in units(node)]
    backward_pass: list = [u for node, a in zip(order, again) for u in units(node, a)]
    notes: dict[str, LoopNote] = {}
    if scan and any(u.loop for u in forward_pass):
        saved_set = set(saved_vals)
        aval = flat.avals.__getitem__
        forward_pass = roll(forward_pass, aval, saved_set | {root(r) for r in [loss_ref] if not isinstance(r, Const)},
                            lambda v: (v in saved_set, v in host_vals), "forward", notes)
        rolled = roll(backward_pass if exact else _first_reader_order(group_of, phase_of, recompute, inputs_of, prod,
                                                                        units),
                      aval, {root(r) for r in grad_refs if not isinstance(r, Const)}, lambda v: (), "backward", notes)
        if any(isinstance(it, Run) for it in rolled):
            backward_pass = rolled
    # fuse="xla": a node is one of XLA's kernels, so each backward kernel can be tied to the one before
    kernels = ordered and step.fused == "xla"
    if kernels:
        backward_pass = _once(backward_pass, exact)
    backward_pass = regions(backward_pass)

    def piece(leaves, k):
        j, s = sources[k]
        return leaves[j] if s is None else Piece(leaves[j], s)

    def run_forward(u: Unit, env: dict, last: Any) -> Any:
        evaluate(u.eqns, env)
        return last

    # values XLA may compute again inside each kernel reading them (cheap elementwise), which a region of a
    # plan run as planned ties only where no other operand of the size will do (_evaluate_tied)
    cheap = {v for e in eqns for v in e.outs if fusible(e.prim.name) and e.prim.name not in EXPENSIVE} \
        if exact else set()

    diff = {v for v, d in zip(step.arg_ids, step.diff_leaves) if d}
    # fuse="xla": the backward sums XLA computed inside several kernels of the plain step (_computed_once)
    joined = collections.Counter(k for members in step.groups for k in members)
    summed = {id(eqns[k]) for k, n in joined.items() if n > 1 and eqns[k].prim.name == "add_any"}
    weights = {eqns[k].outs[0]: diff.intersection(eqns[k].ins) for k in copied}
    inside = _computed_inside(eqns, prod, unbuffered)

    def run_backward(u: Unit, env: dict, last: Any) -> Any:
        if u.recompute:
            ins = unit_inputs(u)
            barred, pin = jax.lax.optimization_barrier(([env[v] for v in ins], last))
            made = _evaluate_tied(u.eqns, dict(zip(ins, barred)), pin, cheap, weights)
            env.update((v, made[v]) for e in u.eqns for v in e.outs)
            return last
        if kernels:  # the kernel's root reads the value before it: XLA runs the plan's order (_evaluate_tied)
            j = _tie_point(u.eqns)
            evaluate(u.eqns[:j], env)
            _evaluate_tied(u.eqns[j:], env, last, inside=inside)
        else:
            evaluate(u.eqns, env)
        for e in u.eqns:
            if id(e) in summed:
                _computed_once(e, env)
        return env[u.eqns[-1].outs[0]]

    def forward_env(leaves):
        env = {v: piece(leaves, k) for k, v in enumerate(step.arg_ids)}
        execute(forward_pass, env, run_forward)
        return make_views([loss_ref], env)

    held: dict[str, Any] = {}

    @jax.custom_vjp
    def f(*leaves):
        return value(forward_env(leaves), loss_ref)

    def f_fwd(*primals):
        leaves = [p.value for p in primals]
        stray = [name for name, p, d in zip(step.arg_names, primals, step.diff_leaves) if p.perturbed and not d]
        if stray:
            raise PlanError(f"apply_plan: {stray[0]} is differentiated, but the plan's graph differentiates "
                            f"argnums {step.argnums} only; trace the graph with argnums covering it")
        env = forward_env(leaves)
        # what the backward pass reads: whole stacks for the values a loop's scan made
        bases: list[Any] = []
        where: dict[int, int] = {}
        layout = []
        for v in saved_vals:
            x = env[v]
            base, index = (x.base, x.index) if isinstance(x, Piece) else (x, None)
            where.setdefault(id(base), len(bases))
            if where[id(base)] == len(bases):
                bases.append(base)
            layout.append((where[id(base)], index))
        host = {b for (b, _), v in zip(layout, saved_vals) if v in host_vals}
        held.update(layout=layout, host=host)
        saved = tuple(jax.device_put(x, jax.memory.Space.Host) if b in host else x for b, x in enumerate(bases))
        return value(env, loss_ref), (tuple(leaves[j] for j in arg_leaves), saved)

    def f_bwd(res, ct):
        arg_res, saved = res
        leaves = dict(zip(arg_leaves, arg_res))
        bases = [jax.device_put(x, jax.memory.Space.Device) if b in held["host"] else x for b, x in enumerate(saved)]
        env: dict[Any, Any] = {v: piece(leaves, position[v]) for v in arg_vals}
        env.update((v, bases[b] if index is None else Piece(bases[b], index))
                   for v, (b, index) in zip(saved_vals, held["layout"]))
        env[step.ct_id] = ct
        execute(backward_pass, env, run_backward, ct)
        make_views(grad_refs, env)
        ct_of = dict(zip(grad_leaves, grad_refs))
        return tuple(_leaf_cotangent(env, [ct_of.get(k) for k in ks], [flat.avals[step.arg_ids[k]] for k in ks],
                                     _stacked_dims([sources[k][1] for k in ks]))
                     for _, ks in sorted(pieces.items()))

    f.defvjp(f_fwd, f_bwd, symbolic_zeros=True)
    return f, list(notes.values())


def regions(items: list) -> list:
    """``items`` (a backward pass) with each run of consecutive recomputed
    units merged into one unit: a recomputed region behind one barrier, as
    ``jax.checkpoint`` places them. A barrier's operands are materialized, so a
    barrier per recomputed op keeps XLA from fusing the recomputation into the
    kernels that read it (measured on an H200, ``../shared/gpu/README.md``: 513
    kernels became 757 and the bytes they move rose from 101.5 to 155.6 GB)."""
    out: list = []
    for it in items:
        if isinstance(it, Run):
            it.body = regions(it.body)
            out.append(it)
        elif it.recompute and out and isinstance(out[-1], Unit) and out[-1].recompute and out[-1].loop == it.loop:
            out[-1] = Unit(out[-1].node, out[-1].eqns + it.eqns, True, it.loop)
        else:
            out.append(it)
    return out


def _once(items: list, remade: bool = False) -> list:
    """Backward units without the equations an earlier backward unit made.

    A ``fuse="xla"`` node holds the equations XLA fused into its kernel, so an
    equation can be in several nodes (a dot XLA fuses into two kernels). Untied,
    CSE merges the copies; tied to different backward values
    (:func:`_evaluate_tied`) it would not, and every copy would run (gpt at its
    instance config, no recomputation: FLOPs +27% over the plain step; +1.9%
    with each equation made once). ``remade`` (:attr:`Fates.exact`): an equation
    reading what a recomputed region made again is made again too, from that
    (unet, cpsat's least-peak plan: a split fused into two kernels of a
    convolution's gradient, which the plan frees and computes again between
    them; made once, the second kernel read the first copy's split, which XLA
    held to there). A later kernel holding an equation a region made makes it
    again inside, as the plan has it, from its operands' values then (reading
    the region's value instead held it to there: unet at the bench's size,
    cpsat at 0.5, 13.37 -> 14.42 MB; where those operands are the forward
    pass's, untied, CSE merges it with the forward pass's, which XLA holds:
    resnet, cpsat at 0.8, 761,956 B against 729,188 reading the region's)."""
    made: set = set()
    by: list = []  # the equations made, in order
    out: list = []
    for it in items:
        if isinstance(it, Run):  # its body runs in an environment of its own
            it.body = _once(it.body, remade)
        if isinstance(it, Run) or it.recompute:
            if remade and not isinstance(it, Run):
                stale = {v for e in it.eqns for v in e.outs}
                for e in by:
                    if any(not isinstance(r, Const) and r in stale for r in e.ins):
                        stale.update(e.outs)
                made.difference_update(stale)
            out.append(it)
            continue
        by.extend(it.eqns)
        eqns = tuple(e for e in it.eqns if not made.issuperset(e.outs))
        made.update(v for e in it.eqns for v in e.outs)
        if eqns:
            out.append(Unit(it.node, eqns, False, it.loop))
    return out


def _first_reader_order(group_of: dict, phase_of: dict, recompute: dict, inputs_of: Callable, prod: dict,
                        units: Callable) -> list[Unit]:
    """The backward nodes in program order, each recomputation right before
    its first reader and in the loop iteration of that reader (the order a
    rolled loop runs them in)."""
    out: list[Unit] = []
    done: set[int] = set()
    for node in group_of:
        if phase_of[node] != "backward":
            continue
        need: set[int] = set()
        todo = [prod[r] for r in inputs_of(node) if r in prod]
        while todo:
            p = todo.pop()
            if p in recompute and p not in done and p not in need:
                need.add(p)
                todo.extend(prod[r] for r in recompute[p])
        out.extend(u for p in sorted(need) for u in units(p, True, node))
        done |= need
        out.extend(units(node))
    return out


TIE = "tie"  # the scope of the tie's add in the compiled step's op_names


def _evaluate_tied(eqns: Sequence, env: dict, last: Any, cheap: set = frozenset(), weights: dict | None = None,
                   inside: set = frozenset()) -> dict:
    """Evaluate a recomputed region's equations, each made to read ``last``.

    XLA's CPU pipeline expands every optimization barrier away before CSE and
    scheduling, so a barrier alone neither stops CSE from merging the
    recomputation with the forward computation nor keeps the scheduler from
    running it early (resnet at the instance config, greedy at 0.7: no
    barrier left in ``compiled.as_text()``, FLOPs +0.03% over the plain step,
    XLA's figure +4.3%). A data dependence on the backward value computed just
    before the region survives every pass: an equation that reads nothing
    tied yet reads its smallest floating operand as ``x + 0 * last[0]`` (XLA
    does not fold ``x * 0`` for floats, NaN), and what it makes is tied in
    turn; a random draw that reads no float (:data:`KEYED`), its key, the
    float product converted (bits computed again from their key alone were the
    forward pass's to XLA's CSE, which held those to the backward pass; tying
    every integer, kept bits too, made XLA write their xor where its readers had
    computed it: keras_gpt2, cpsat at 0.8, 288,172 B against 304,140
    predicted). The smallest operand, because a library call (a convolution,
    a dot) cannot fuse the add and reads a copy: the weight's, not the
    activation's.
    Only on CPU: GPU XLA keeps barriers until scheduling. ``cheap``: values
    XLA may compute again inside each kernel reading them (elementwise, not
    :data:`~rematopt.importers.jaxpr.cost.EXPENSIVE`), tied only where no other
    operand of the same size is there: XLA computes ``x + 0 * last[0]`` of one
    from its operands, which then live until the tie (flax_linen at its instance
    config, the first round's cpsat plan at 0.8 as planned: 504,828 B, tying
    other operands 480,252 B, 438,156 predicted). ``weights``: per dot or
    convolution whose kernel reads a copy XLA makes of a weight (its first
    result), the differentiated arguments it reads, tied even where its other
    operand is: XLA's CSE merged the copy of an untied weight with the forward
    pass's, which then lived to the backward pass (keras_gemma at its instance
    config, the first round's cpsat plan at 0.5 as planned: five such copies at
    XLA's peak, 221,124 B against 203,276 predicted; tied, 198,596 B). ``inside``: forward values
    the graph holds no buffer for (XLA computed them inside their readers in the plain step) that
    elementwise arithmetic computes (:func:`_computed_inside`), tied where a library call reads them,
    so that XLA makes the call's copy of one at the call, as the plain step did: untied, XLA's
    memory-minimizing scheduler made it in the forward pass and held it to the backward pass
    (keras_llama at the device bench's size, cpsat at 0.6: its softmax division, a MiB a layer;
    18,246,684 B against 16,016,404 predicted, tied 17,198,108; docs/device.md).

    A backward kernel's root is tied the same way (``fuse="xla"`` graphs), so
    XLA's scheduler cannot run the backward pass in an order of its own, in
    which the plan's kept and recomputed values are live together (resnet at
    its instance config, greedy at 0.8: compiled to 760,228 B untied, 586,148 B
    tied, against 596,212 B predicted). Not always for the better: XLA's own
    order can beat the plan's (mlp, layers=3, width=32, batch=256, greedy at
    0.9: 215,452 B untied, 282,268 B tied, 313,684 B predicted)."""
    # GPU XLA keeps the barriers (H200, ../shared/gpu/), so the tie is only where they are expanded
    s = jax.numpy.ravel(last)[0] if getattr(last, "size", 0) and jax.default_backend() == "cpu" else None
    tied: set = set()

    def tie(r, kind: str) -> None:
        with jax.named_scope(TIE):  # names what XLA writes for the tie alone (``apply_plan(scopes=True)``)
            zero = s.astype(env[r].dtype) * 0 if kind == "f" else (s * 0).astype(env[r].dtype)
            env[r] = env[r] + zero
        tied.add(r)

    for e in eqns:
        reads = [r for r in e.ins if not isinstance(r, Const)]
        if any(env[r] is last for r in reads):  # it reads the value itself
            tied.update(reads)
        if s is not None and not tied.intersection(reads):
            kind = {r: _kind(env[r]) for r in reads}
            operands = [r for r in reads if kind[r] == "f"] or [
                r for r in reads if kind[r] in "iu" and e.prim.name in KEYED]
            if operands:
                r = min(operands, key=lambda r: (np.size(env[r]), r in cheap))
                tie(r, kind[r])
        if s is not None and inside and e.prim.name in MATMUL:
            for r in [r for r in reads if r in inside and r not in tied and _kind(env[r]) == "f"]:
                tie(r, "f")
        if s is not None and weights:
            for r in sorted(weights.get(e.outs[0], set()) - tied):  # differentiated: floats
                tie(r, "f")
        evaluate([e], env)
        if tied.intersection(reads):
            tied.update(e.outs)
    return env


# jax.random's primitives on keys: what XLA computes from a key alone
KEYED = frozenset({"random_wrap", "random_unwrap", "random_bits", "random_fold_in", "random_split", "random_seed",
                   "threefry2x32"})


def _kind(x: Any) -> str:
    """numpy's kind of a value's dtype ("f", "i", "u", "b", ...); "V" for what has none (a typed key)."""
    try:
        return np.dtype(getattr(x, "dtype", np.int32)).kind
    except TypeError:
        return "V"


# Ops that only rearrange their one operand: XLA folds them into the kernel making it (a transpose of a dot
# is the dot with its operands swapped), so a tie between the two would split that kernel.
REARRANGE = frozenset({"transpose", "reshape", "squeeze", "expand_dims", "copy", "copy_p"})


def _tie_point(eqns: Sequence) -> int:
    """Where a backward kernel is tied to the value before it: at its root, or
    where the root only rearranges (:data:`REARRANGE`) what the kernel
    computed, at that computation. Tied between a dot and the transpose of its
    result, XLA cannot fold the transpose into the dot: it writes the dot to a
    temporary, and the transposing kernel, which the next kernel's tie reads one
    element of, is duplicated into that tie and the real one runs at the step's
    end, holding the temporary until then (keras gemma at its instance config,
    greedy at 0.8: applied peak 0.945 of XLA's figure)."""
    j = len(eqns) - 1
    while j > 0 and eqns[j].prim.name in REARRANGE and eqns[j].ins[:1] and eqns[j].ins[0] in eqns[j - 1].outs:
        j -= 1
    return j


def _computed_inside(eqns: Sequence, prod: dict, unbuffered: frozenset[int]) -> set:
    """The values (views too) of ``unbuffered`` nodes that elementwise arithmetic computes, through any
    rearrangements (:data:`REARRANGE`): those XLA makes a library call's copy of. A rearranged argument or
    product is not one (a dot reads a transposed weight as it is; a tie would make XLA write the transpose:
    four layers of ``tanh(x @ w.T)``, 188,460 B tied against 180,228)."""
    made_by = {v: e for e in eqns for v in e.outs}
    out = set()
    for v in made_by:
        e = made_by[v]
        while e.prim.name in REARRANGE and e.ins and not isinstance(e.ins[0], Const) and e.ins[0] in made_by:
            e = made_by[e.ins[0]]
        if e.prim.name not in REARRANGE and fusible(e.prim.name) and prod.get(e.outs[0]) in unbuffered:
            out.add(v)
    return out


def _grad_leaf_order(step: Step) -> list[int]:
    """Flat leaf index of each gradient output (argnums order, then leaves)."""
    arg_tree_children = jax.tree_util.tree_unflatten(step.arg_tree, list(range(step.n_inputs)))
    return [leaf for i in step.argnums for leaf in jax.tree_util.tree_leaves(arg_tree_children[i])]


def _stacked_dims(indices: list) -> tuple[int, ...]:
    """The leading axes a caller leaf was split along, from its pieces' slice indices."""
    if indices[0] is None:
        return ()
    return tuple(max(ix[d] for ix in indices) + 1 for d in range(len(indices[0])))


def _leaf_cotangent(env: dict, refs: list, avals: list, dims: tuple[int, ...]) -> Any:
    """The cotangent of one caller leaf from its pieces' cotangent values
    (row-major; None: not differentiated): the backward scan's stacked
    gradient as it is when the pieces are its iterations."""
    shape = dims + tuple(avals[0].shape)
    if all(r is None for r in refs):
        return _zero_like(jax.ShapeDtypeStruct(shape, avals[0].dtype))
    if not dims:
        return value(env, refs[0])
    if all(isinstance(r, int) for r in refs):
        return gather(env, refs).reshape(shape)
    return jax.numpy.stack([_zero_like(a) if r is None else value(env, r) for r, a in zip(refs, avals)]).reshape(shape)


def _zero_like(aval: Any) -> Any:
    """The cotangent of an argument the graph does not differentiate."""
    if jax.numpy.issubdtype(aval.dtype, jax.numpy.inexact):
        return jax.numpy.zeros(aval.shape, aval.dtype)
    return np.zeros(aval.shape, dtype=jax.dtypes.float0)


def _computed_once(eqn: Any, env: dict) -> None:
    """On CPU, pass a backward sum's result (``add_any``: a cotangent summed over its forward value's
    readers) through a conditional on a runtime predicate whose branches both return it, under the
    equation's scope: XLA neither fuses across a conditional nor folds it, so the sum is written once.

    For the sums XLA computed inside several kernels of the plain step (a ``fuse="xla"`` graph's
    equation in several nodes' groups). XLA's CPU fusion computes such a sum again inside each kernel
    reading it, and the sum before it inside each of those: down a residual stream the chain grows a
    layer per block (gpt at the device bench's size: fusions of 161 to 173 operands, its plain step
    1,363 ms where the same step with each block's cotangent computed once runs 705; docs/device.md,
    "gpt's cross-layer fusions"). An optimization barrier is expanded away before fusion there. Not on
    GPU: its fusion bounds a kernel's operands, and a conditional there reads its predicate on the host.
    After the unit computing the sum, for the units after it; one computing it inside too computes it
    again, which XLA's CSE merges with this one (writing it inside each unit as well was tried: docs/xla.md,
    "Backward sums written once", which also says what the applied step (:mod:`.jax_applied`) misses)."""
    if jax.default_backend() != "cpu":
        return
    with in_scope(eqn):
        for v in eqn.outs:
            x = env[v]
            if getattr(x, "size", 0):
                env[v] = jax.lax.cond(jax.numpy.isfinite(jax.numpy.ravel(x)[0]), lambda a: a, lambda a: a * 1.0, x)
