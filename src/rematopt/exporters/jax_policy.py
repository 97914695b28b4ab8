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

XLA would merge a recomputation with the identical forward computation (CSE)
and so undo it; like ``jax.checkpoint``'s ``prevent_cse``, the inputs of each
recomputation go through ``lax.optimization_barrier``, here together with the
backward value the plan computes just before it, to pin it in place. XLA's CPU
pipeline drops the barriers before CSE, for ``jax.checkpoint`` as for this
(measured in ``reports/jax_measure/README.md``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable

import jax
import numpy as np

from ..errors import ImportFailure, PlanError
from ..graph import Graph
from ..importers.jaxpr.flatten import Const, bind, evaluate
from ..importers.jaxpr.step import Step, trace_step
from ..plan import COMPUTE, OFFLOAD, Plan
from ..simulate import simulate


@dataclass(frozen=True)
class Fates:
    """What a plan does with the forward values read after the backward pass starts."""

    kept: frozenset[int]        # saved on the device
    offloaded: frozenset[int]   # saved in host memory
    recomputed: frozenset[int]  # computed again in the backward pass
    schedule: tuple[int, ...] = ()  # nodes the backward pass computes, in the plan's order (first time each)

    @property
    def saved(self) -> frozenset[int]:
        return self.kept | self.offloaded


def residual_fates(graph: Graph, plan: Plan) -> Fates:
    """Classify forward nodes by the plan's events.

    The backward pass starts at the plan's first compute of a backward node.
    A forward node read from then on is *saved* if that read uses the copy
    computed before (so it crossed the boundary), and *offloaded* if the plan
    also offloads it; a forward node computed from then on before any such
    read is *recomputed*. For a forward value with a backward consumer this is
    the rule "computed once: kept (or offloaded); computed again: recomputed",
    extended to values that a recomputation reads.
    """
    phase = [v.phase for v in graph.nodes]
    if "backward" not in phase:
        raise PlanError(f"{graph.name}: graph has no backward phase; plans apply to traced training steps")
    ops, nodes = plan.ops.tolist(), plan.nodes.tolist()
    start = next((t for t, (o, i) in enumerate(zip(ops, nodes))
                  if o == COMPUTE and phase[i] == "backward"), len(ops))
    offloaded = {i for o, i in zip(ops, nodes) if o == OFFLOAD}
    fate: dict[int, str] = {}
    preds = graph.preds
    schedule: dict[int, None] = {}
    for o, i in zip(ops[start:], nodes[start:]):
        if o != COMPUTE:
            continue
        if phase[i] == "backward" or i not in fate:
            schedule.setdefault(i)
        for p in preds[i]:
            if phase[p] == "forward" and p not in fate:
                fate[p] = "offloaded" if p in offloaded else "kept"
        if phase[i] == "forward" and i not in fate:
            fate[i] = "recomputed"
    pick = lambda what: frozenset(i for i, f in fate.items() if f == what)  # noqa: E731
    return Fates(pick("kept"), pick("offloaded"), pick("recomputed"), tuple(schedule))


def apply_plan(loss_fn: Callable, graph: Graph, plan: Plan) -> Callable:
    """``loss_fn'`` with ``loss_fn``'s signature whose gradient (with respect to
    the graph's ``argnums``, ``meta.argnums``) saves exactly what ``plan``
    keeps, offloads what it offloads and recomputes the rest.

    ``graph`` must come from :func:`rematopt.jax.trace_grad` of this function
    at arguments of the same shapes and pytree structure, keyword arguments
    included (the function is traced again at call time, with its loops
    unrolled if the graph's were, and checked node by node; ImportFailure if
    it differs). A graph with unrolled loops applies to the program with its
    loops and stacked parameters: the planned gradient runs the loops
    unrolled. ``loss_fn'`` supports reverse-mode differentiation
    (``jax.grad``, ``jax.vjp``) with respect to the graph's ``argnums``;
    differentiating any other argument raises PlanError (the plan holds no
    backward pass for it, so its gradient would be a silent zero).
    """
    replay = simulate(graph, plan)
    if not replay.valid:
        where = "" if replay.error_event is None else f" at event {replay.error_event}"
        raise PlanError(f"plan for {graph.name}: invalid{where}: {replay.error}")
    fates = residual_fates(graph, plan)
    argnums = tuple(graph.meta.get("argnums", (0,)))
    fuse = bool(graph.meta.get("fuse", False))
    unroll = bool(graph.meta.get("unroll", False))  # graphs from before unrolling existed were not unrolled
    built: dict[Any, Callable] = {}

    @functools.wraps(loss_fn)
    def planned(*args, **kwargs):
        leaves, tree = jax.tree_util.tree_flatten((*args, kwargs))
        key = (tree, tuple((np.shape(x), str(jax.numpy.result_type(x))) for x in leaves))
        if key not in built:
            step = trace_step(loss_fn, args, argnums, fuse, unroll, kwargs)
            check_matches(step, graph)
            built[key] = _planned_step(step, fates)
        return built[key](*leaves)

    return planned


def check_matches(step: Step, graph: Graph) -> None:
    """ImportFailure unless ``step`` has ``graph``'s nodes, op for op."""
    ops = ["input"] * step.n_inputs + [step.head(g).prim.name for g in range(len(step.groups))]
    if len(ops) != graph.n:
        raise ImportFailure(f"{graph.name}: graph has {graph.n} nodes, the function traces to {len(ops)}; "
                            "trace the graph from this function at these argument shapes")
    for node, op in zip(graph.nodes, ops):
        if node.op != op:
            raise ImportFailure(f"{graph.name}: node {node.id} is {node.op!r} in the graph but {op!r} "
                                "in the traced function")


def _planned_step(step: Step, fates: Fates) -> Callable:
    """The custom_vjp function over the caller's flat argument leaves."""
    flat = step.flat
    eqns = flat.eqns
    prod = step.producers()
    n_in = step.n_inputs
    group_of = {step.node_of_group(g): members for g, members in enumerate(step.groups)}
    fwd = [e for e in eqns if e.phase == "forward"]
    bwd = [e for k, e in enumerate(eqns) if e.phase == "backward" and k not in step.view_eqns]
    root = step.root_of
    view_eqn = {eqns[k].outs[0]: eqns[k] for k in step.view_eqns}

    class Env(dict):
        """Values by id; a view not yet made is made from its root when read."""

        def __missing__(self, v):
            if v not in view_eqn:
                raise KeyError(v)
            e = view_eqn[v]
            self[v] = bind(e, [self[e.ins[0]]])[0]
            return self[v]

    def inputs_of(node: int) -> list[int]:
        inside = {v for k in group_of[node] for v in eqns[k].outs}
        return sorted({root(r) for k in group_of[node] for r in eqns[k].ins
                       if not isinstance(r, Const) and root(r) not in inside})

    # Recompute closure: forward nodes the backward pass needs and the plan
    # does not save, back to saved values and arguments. Values are named by
    # their roots: a view is made again from its root where it is read.
    bwd_made = {v for e in bwd for v in e.outs}
    bwd_reads = {root(r) for e in bwd for r in e.ins
                 if not isinstance(r, Const) and root(r) not in bwd_made and root(r) != step.ct_id}
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
    # starts). Each recomputation's inputs pass through an optimization barrier
    # together with the backward value computed just before it, so that XLA,
    # where it keeps the barriers, neither merges the recomputation with the
    # forward computation (CSE) nor hoists it ahead of that point.
    order = [i for i in fates.schedule if i in recompute or eqns[group_of[i][-1]].phase == "backward"]
    rec_inputs = sorted({r for ins in recompute.values() for r in ins if prod[r] not in recompute})
    read_after = {r for r in bwd_reads if prod[r] not in recompute}
    read_after |= set(rec_inputs)
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

    def piece(leaves, k):
        j, s = sources[k]
        return leaves[j] if s is None else leaves[j][s]

    def read(env, r):
        return r.value if isinstance(r, Const) else env[r]

    def forward_env(leaves):
        return evaluate(fwd, Env({v: piece(leaves, k) for k, v in enumerate(step.arg_ids)}))

    @jax.custom_vjp
    def f(*leaves):
        return read(forward_env(leaves), loss_ref)

    def f_fwd(*primals):
        leaves = [p.value for p in primals]
        stray = [name for name, p, d in zip(step.arg_names, primals, step.diff_leaves) if p.perturbed and not d]
        if stray:
            raise PlanError(f"apply_plan: {stray[0]} is differentiated, but the plan's graph differentiates "
                            f"argnums {step.argnums} only; trace the graph with argnums covering it")
        env = forward_env(leaves)
        saved = tuple(jax.device_put(env[v], jax.memory.Space.Host) if v in host_vals else env[v]
                      for v in saved_vals)
        return read(env, loss_ref), (tuple(leaves[j] for j in arg_leaves), saved)

    def f_bwd(res, ct):
        arg_res, saved = res
        leaves = dict(zip(arg_leaves, arg_res))
        env = Env({v: piece(leaves, position[v]) for v in arg_vals})
        env.update((v, jax.device_put(x, jax.memory.Space.Device) if v in host_vals else x)
                   for v, x in zip(saved_vals, saved))
        env[step.ct_id] = last = ct
        for node in order:
            members = [eqns[k] for k in group_of[node]]
            if node in recompute:
                ins = recompute[node]
                barred, _ = jax.lax.optimization_barrier(([env[v] for v in ins], last))
                made = evaluate(members, Env(zip(ins, barred)))
                env.update((v, made[v]) for e in members for v in e.outs)
            else:
                evaluate(members, env)
                last = env[members[-1].outs[0]]
        cts: list[Any] = [None] * n_in  # no cotangent: f_fwd refused perturbed ones
        for leaf, r in zip(grad_leaves, grad_refs):
            cts[leaf] = read(env, r)
        return tuple(_leaf_cotangent([cts[k] for k in ks], [flat.avals[step.arg_ids[k]] for k in ks],
                                     _stacked_dims([sources[k][1] for k in ks]))
                     for _, ks in sorted(pieces.items()))

    f.defvjp(f_fwd, f_bwd, symbolic_zeros=True)
    return f


def _grad_leaf_order(step: Step) -> list[int]:
    """Flat leaf index of each gradient output (argnums order, then leaves)."""
    arg_tree_children = jax.tree_util.tree_unflatten(step.arg_tree, list(range(step.n_inputs)))
    return [leaf for i in step.argnums for leaf in jax.tree_util.tree_leaves(arg_tree_children[i])]


def _stacked_dims(indices: list) -> tuple[int, ...]:
    """The leading axes a caller leaf was split along, from its pieces' slice indices."""
    if indices[0] is None:
        return ()
    return tuple(max(ix[d] for ix in indices) + 1 for d in range(len(indices[0])))


def _leaf_cotangent(cts: list, avals: list, dims: tuple[int, ...]) -> Any:
    """The cotangent of one caller leaf from those of its pieces (row-major;
    None: not differentiated)."""
    shape = dims + tuple(avals[0].shape)
    if all(c is None for c in cts):
        return _zero_like(jax.ShapeDtypeStruct(shape, avals[0].dtype))
    if not dims:
        return cts[0]
    return jax.numpy.stack([_zero_like(a) if c is None else c for c, a in zip(cts, avals)]).reshape(shape)


def _zero_like(aval: Any) -> Any:
    """The cotangent of an argument the graph does not differentiate."""
    if jax.numpy.issubdtype(aval.dtype, jax.numpy.inexact):
        return jax.numpy.zeros(aval.shape, aval.dtype)
    return np.zeros(aval.shape, dtype=jax.dtypes.float0)
