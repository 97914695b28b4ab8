"""A traced program as flat equations grouped into graph nodes.

:func:`trace_step` splits a training step the way ``jax.vjp`` does: the
forward jaxpr computes the loss and the residuals (the leaves of the function
``jax.vjp`` returns, which is exactly what ``jax.ad_checkpoint`` reports as
saved residuals), the backward jaxpr turns residuals and the loss cotangent
into gradients. Both are flattened into one value space, so residuals are the
values crossing from forward to backward. :func:`trace_program` takes any
function as it is. A :class:`Step` keeps the equations, so the exporter can run
them again under a plan.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import jax

from ...errors import ImportFailure
from .. import costmodel
from . import cost, primitives
from .flatten import Const, Flat, aval_bytes
from .unroll import provenance, unroll


@dataclass
class Step:
    """Flat equations of one traced program and their grouping into nodes.

    Node ids: the argument leaves first (input nodes, in flattening order), then
    one node per group of equations in program order. Unfused, every group is
    one equation; fused, a group is a consumer plus the cheap elementwise
    producers folded into it, and only its last equation's results leave it.
    """

    flat: Flat
    arg_ids: list[int]                # value id of each flat argument leaf
    arg_names: list[str]
    arg_tree: Any                     # PyTreeDef of the argument tuple
    diff_leaves: list[bool]           # leaf belongs to a differentiated argument
    out_refs: list                    # the program's results (loss then gradients)
    res_refs: list = field(default_factory=list)  # residuals, as ``jax.vjp`` saves them
    ct_id: int | None = None          # the loss cotangent (not a node: the constant 1)
    argnums: tuple[int, ...] = ()
    groups: list[list[int]] = field(default_factory=list)  # equation indices per compute node
    fused: bool | str = False        # False, True (the table of cheap ops), "xla" (learned from XLA)
    compiled: dict | None = None      # fuse="xla": what XLA said about the compiled step
    # fuse="xla": each materialized equation's first kernel in XLA's schedule, and the temporaries
    # XLA makes beyond one per equation (:func:`.compiled.scratch_buffers`)
    positions: dict[int, int] = field(default_factory=dict)
    scratch: list = field(default_factory=list)
    stored: frozenset[int] = frozenset()  # the values XLA's kernels write
    written: dict[int, int] = field(default_factory=dict)  # bytes of the buffer XLA writes per equation
    pieces: dict[int, int] = field(default_factory=dict)   # of those, the ones written as several (.compiled._pieces): how many
    # fuse="xla" on CPU: equations whose buffer, and scratch instructions, XLA houses in an output's allocation
    housed: frozenset[int] = frozenset()
    housed_scratch: frozenset[str] = frozenset()
    # fuse="xla": equations whose kernel writes a temporary XLA then copies into the output's layout
    # (:func:`.compiled.layout_copies`), with that temporary's bytes
    layout_copied: dict[int, int] = field(default_factory=dict)
    dead: int = 0                     # equations dropped because nothing reads their results
    unrolled: bool = False            # loops were unrolled (:mod:`.unroll`)
    # Per flat leaf: (leaf of the caller's arguments, slice index) when unrolling
    # split a stacked argument; None when the leaves are the caller's own.
    sources: list[tuple[int, tuple[int, ...] | None]] | None = None
    # Views (:func:`.primitives.is_view`): their equations are in no group, and
    # their results are the buffer of the value ``root`` maps them to.
    view_eqns: frozenset[int] = frozenset()
    root: dict[int, int] = field(default_factory=dict)
    named: dict[int, str] = field(default_factory=dict)   # root value -> its checkpoint_name
    read_before_name: set[int] = field(default_factory=set)  # named roots the backward also reads unnamed
    # fuse="xla": the kernels of the compiled plain step writing each group's head equation, with the
    # share of the kernel that head takes (a multi-output fusion splits evenly); node costs come from them
    kernels_of: dict[int, list[tuple[Any, float]]] = field(default_factory=dict)

    @property
    def n_inputs(self) -> int:
        return len(self.arg_ids)

    def node_of_group(self, g: int) -> int:
        return self.n_inputs + g

    def nodes_of_equations(self) -> dict[int, int]:
        """equation index -> the node standing for it: the node of the group it heads, else of the
        first group holding it (an equation fused into several kernels is in each one's group)."""
        out: dict[int, int] = {}
        for g, members in enumerate(self.groups):
            for k in members:
                out.setdefault(k, self.node_of_group(g))
        out.update((members[-1], self.node_of_group(g)) for g, members in enumerate(self.groups))
        return out

    def producers(self) -> dict[int, int]:
        """value id -> node id of the node producing it (a view: its root's node)."""
        prod = {v: i for i, v in enumerate(self.arg_ids)}
        for g, members in enumerate(self.groups):
            for k in members:
                for v in self.flat.eqns[k].outs:
                    prod.setdefault(v, self.node_of_group(g))
        for g, members in enumerate(self.groups):  # an equation heading a node is that node's
            for v in self.flat.eqns[members[-1]].outs:  # (``fuse="xla"`` may also copy it into others)
                prod[v] = self.node_of_group(g)
        prod.update((v, prod[r]) for v, r in self.root.items() if r in prod)  # not the cotangent's views
        return prod

    def root_of(self, r: Any) -> Any:
        """The value whose buffer ``r`` is (``r`` itself unless it is a view)."""
        return r if isinstance(r, Const) else self.root.get(r, r)

    def head(self, g: int):
        return self.flat.eqns[self.groups[g][-1]]


def _arg_structs(args: Sequence, kwargs: dict | None = None) -> tuple[list, list[str], Any]:
    """Leaf structs and names of ``args`` (and of ``kwargs``, flattened after them)."""
    whole = tuple(args) if kwargs is None else (*args, kwargs)
    leaves_with_path, tree = jax.tree_util.tree_flatten_with_path(whole)
    structs, names = [], []
    for path, x in leaves_with_path:
        where = ("kwargs" + jax.tree_util.keystr(path[1:]) if kwargs is not None and path[0].idx == len(args)
                 else "args" + jax.tree_util.keystr(path))
        if not hasattr(x, "shape") and not isinstance(x, (int, float, bool, complex)):
            raise ImportFailure(f"argument {where}: not an array ({type(x).__name__})")
        x = jax.numpy.asarray(x) if not hasattr(x, "dtype") else x
        structs.append(jax.ShapeDtypeStruct(x.shape, x.dtype))
        names.append(where)
    return structs, names, tree


def _unrolled(fn: Callable, args: Sequence, what: str):
    """:func:`.unroll.unroll` with a tracing failure as one ImportFailure line."""
    _arg_structs(args)  # refuse non-array arguments before tracing
    try:
        return unroll(fn, args)
    except Exception as e:
        raise ImportFailure(f"tracing {what} failed: {type(e).__name__}: {_first_line(e)}") from None


def trace_step(loss_fn: Callable, args: Sequence, argnums: int | Sequence[int] = 0,
               fuse: bool | str = False, unroll_loops: bool = True, kwargs: dict | None = None,
               groups: list[list[int]] | None = None) -> Step:
    """Trace ``jax.value_and_grad(loss_fn, argnums)(*args, **kwargs)`` as
    forward + backward (keyword arguments are inputs, never differentiated),
    with static loops unrolled unless ``unroll_loops`` is false. A step with
    keyword arguments keeps its loops (unrolling splits arguments, which it
    does for positional ones only): pass them positionally to unroll."""
    argnums = (argnums,) if isinstance(argnums, int) else tuple(argnums)
    if not argnums or any(not 0 <= i < len(args) for i in argnums):
        raise ImportFailure(f"argnums {argnums} out of range for {len(args)} arguments")
    kwargs = dict(kwargs or {})
    unrolled = _unrolled(loss_fn, args, "the loss function") if unroll_loops and not kwargs else None
    if unrolled is not None:
        loss_fn, args = unrolled.fn, unrolled.args
    structs, names, tree = _arg_structs(args, kwargs)
    sizes = [len(jax.tree_util.tree_leaves(a)) for a in (*args, kwargs)]
    diff_leaves = [i in argnums for i, s in enumerate(sizes) for _ in range(s)]
    held: dict[str, Any] = {}

    def forward(*leaves):
        full = list(jax.tree_util.tree_unflatten(tree, leaves))
        kw = full.pop()

        def f(*diff):
            for i, x in zip(argnums, diff):
                full[i] = x
            return loss_fn(*full, **kw)

        loss, vjp = jax.vjp(f, *[full[i] for i in argnums])
        res, held["res_tree"] = jax.tree_util.tree_flatten(vjp)
        return loss, res

    try:
        closed_fwd, (loss_shape, res_shapes) = jax.make_jaxpr(forward, return_shape=True)(*structs)
    except Exception as e:  # the user's function failed to trace: report it in one line
        raise ImportFailure(f"tracing the loss function failed: {type(e).__name__}: {_first_line(e)}") from None
    if getattr(loss_shape, "shape", None) != () or not jax.numpy.issubdtype(loss_shape.dtype, jax.numpy.floating):
        raise ImportFailure(f"the loss function must return a float scalar, got {loss_shape}")

    def backward(res, ct):
        return jax.tree_util.tree_unflatten(held["res_tree"], res)(ct)

    closed_bwd = jax.make_jaxpr(backward)(res_shapes, loss_shape)
    flat = Flat()
    arg_ids = [flat.new_value(v.aval) for v in closed_fwd.jaxpr.invars]
    loss_ref, *res_refs = flat.add(closed_fwd, arg_ids, "forward")
    ct_id = flat.new_value(closed_bwd.jaxpr.invars[-1].aval)
    grad_refs = flat.add(closed_bwd, res_refs + [ct_id], "backward")
    step = Step(flat, arg_ids, names, tree, diff_leaves, [loss_ref] + grad_refs, res_refs, ct_id, argnums)
    step.dead = _drop_dead(flat, step.out_refs + res_refs)
    _find_views(step)
    step.groups = [list(g) for g in groups] if groups is not None else _groups(step, fuse)
    step.fused = fuse
    step.unrolled, step.sources = unrolled is not None, unrolled.sources if unrolled else None
    return step


def trace_program(fn: Callable, args: Sequence, fuse: bool | str = False, unroll_loops: bool = True) -> Step:
    """Trace ``fn(*args)`` as it is: no phases, no residuals; static loops
    unrolled unless ``unroll_loops`` is false."""
    unrolled = _unrolled(fn, args, "the function") if unroll_loops else None
    if unrolled is not None:
        fn, args = unrolled.fn, unrolled.args
    structs, names, tree = _arg_structs(args)
    try:
        closed = jax.make_jaxpr(fn)(*structs)
    except Exception as e:
        raise ImportFailure(f"tracing the function failed: {type(e).__name__}: {_first_line(e)}") from None
    flat = Flat()
    arg_ids = [flat.new_value(v.aval) for v in closed.jaxpr.invars]
    outs = flat.add(closed, arg_ids, None)
    step = Step(flat, arg_ids, names, tree, [False] * len(arg_ids), outs)
    step.dead = _drop_dead(flat, outs)
    _find_views(step)
    step.groups = _groups(step, fuse)
    step.fused = fuse
    step.unrolled, step.sources = unroll_loops, unrolled.sources if unrolled else None
    return step


def _first_line(e: Exception) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else ""


def _drop_dead(flat: Flat, roots: list) -> int:
    """Drop equations whose results nothing reads (JAX's AD leaves a few, e.g.
    the unused halves of ``argmax``-style tangent rules; XLA drops them too),
    keeping effectful ones; return how many were dropped."""
    live = {r for r in roots if not isinstance(r, Const)}
    keep = []
    for e in reversed(flat.eqns):
        if e.effectful or any(v in live for v in e.outs):
            keep.append(e)
            live.update(r for r in e.ins if not isinstance(r, Const))
    dropped = len(flat.eqns) - len(keep)
    flat.eqns = keep[::-1]
    return dropped


def _find_views(step: Step) -> None:
    """Mark the view equations and map each view's result to its root value.
    Two ``checkpoint_name`` tags stay their own nodes: a second name on a named
    root (one node carries one name), and a name on an argument (JAX's policies
    save or offload it as a value of its own, which the argument's node, resident
    throughout, cannot say)."""
    flat, views, root, named = step.flat, set(), step.root, step.named
    args = set(step.arg_ids)
    for k, e in enumerate(flat.eqns):
        if len(e.outs) != 1 or len(e.ins) != 1 or isinstance(e.ins[0], Const):
            continue
        src = step.root_of(e.ins[0])
        if not primitives.is_view(e.prim.name, e.params, flat.avals[e.ins[0]], flat.avals[e.outs[0]]):
            continue
        if e.prim.name == "name":
            if src in args or named.get(src, str(e.params["name"])) != str(e.params["name"]):
                continue
            named[src] = str(e.params["name"])
        views.add(k)
        root[e.outs[0]] = src
    step.view_eqns = frozenset(views)
    # JAX's name policies save the named value only: a backward read of the value
    # before its name is recomputed even when the name is saved.
    after_name = {e.outs[0] for k, e in enumerate(flat.eqns) if k in views and e.prim.name == "name"}
    for k, e in enumerate(flat.eqns):
        if k in views and e.ins[0] in after_name:
            after_name.add(e.outs[0])
    for k, e in enumerate(flat.eqns):
        if k in views or e.phase != "backward":
            continue
        step.read_before_name.update(step.root_of(r) for r in e.ins if not isinstance(r, Const)
                                     and step.root_of(r) in named and r not in after_name)


def _groups(step: Step, fuse: bool | str) -> list[list[int]]:
    eqns = step.flat.eqns
    ks = [k for k in range(len(eqns)) if k not in step.view_eqns]
    if fuse == "xla":
        from .compiled import compiled_groups

        groups, step.compiled = compiled_groups(step)
        return groups
    if not fuse:
        return [[k] for k in ks]
    # Values that must stay visible: program results and residuals.
    pinned = {step.root_of(r) for r in step.out_refs + step.res_refs if not isinstance(r, Const)}
    users: dict[int, list[int]] = {}
    for k in ks:
        for r in eqns[k].ins:
            if not isinstance(r, Const):
                users.setdefault(step.root_of(r), []).append(k)
    head = {k: k for k in ks}
    # Walk backwards so a consumer's group is settled before its producers are
    # considered; every member of a group then comes after the producer being
    # folded in, so folding never creates a cycle.
    for k in reversed(ks):
        e = eqns[k]
        if (len(e.outs) != 1 or e.effectful or not cost.fusible(e.prim.name) or e.outs[0] in pinned
                or not _recomputable(step.flat, e)):
            continue
        heads = {head[c] for c in users.get(e.outs[0], [])}
        if len(heads) != 1:
            continue
        h = heads.pop()
        he = eqns[h]
        if he.phase == e.phase and cost.fusion_consumer(he.prim.name) and not he.effectful:
            head[k] = h
    members: dict[int, list[int]] = {}
    for k in ks:
        members.setdefault(head[k], []).append(k)
    return [members[h] for h in sorted(members)]


def to_graph(step: Step, name: str, device: str = costmodel.DEFAULT_DEVICE,
             persistent_leaves: Sequence[bool] | None = None, meta: dict | None = None):
    """The :class:`~rematopt.graph.Graph` of ``step`` with costs on ``device``."""
    from ...graph import Graph, Node

    try:
        dev = costmodel.device(device)
    except KeyError as e:
        raise ImportFailure(str(e.args[0])) from None
    flat = step.flat
    persistent_leaves = persistent_leaves or [False] * step.n_inputs
    prod = step.producers()
    nodes = [Node(i, name=step.arg_names[i], op="input", kind="input", bytes=aval_bytes(flat.avals[v]),
                  persistent=bool(persistent_leaves[i]), extra={"aval": _short(flat.avals[v])})
             for i, v in enumerate(step.arg_ids)]
    for node, (_, index) in zip(nodes, step.sources or ()):
        if index is not None:  # one slice of a stacked argument: the iteration that reads it
            node.extra["iteration"] = list(index)
    edges: list[tuple[int, int]] = []
    # What jax.vjp saves, value by value (arguments aside, as JAX's own report
    # lists them), and the buffers those values are.
    args = set(step.arg_ids)
    residual_values = sorted({r for r in step.res_refs if not isinstance(r, Const) and r not in args})
    residual_roots = {step.root_of(r) for r in residual_values}
    views_of: dict[int, list[str]] = {}
    for k in sorted(step.view_eqns):
        if flat.eqns[k].outs[0] in prod:
            views_of.setdefault(prod[flat.eqns[k].outs[0]], []).append(flat.eqns[k].prim.name)
    for g, members in enumerate(step.groups):
        nid = step.node_of_group(g)
        head = flat.eqns[members[-1]]
        op = head.prim.name
        inside = {v for k in members for v in flat.eqns[k].outs}  # (a member may also sit in other groups)
        srcs = sorted({prod[r] for k in members for r in flat.eqns[k].ins
                       if not isinstance(r, Const) and r in prod and prod[r] != nid and step.root_of(r) not in inside})
        edges.extend((s, nid) for s in srcs)
        node = Node(nid, name=f"{op}.{nid}", op=op, bytes=sum(aval_bytes(flat.avals[v]) for v in head.outs),
                    cost=_node_seconds(step, members, dev), phase=head.phase,
                    recomputable=all(_recomputable(flat, flat.eqns[k]) for k in members))
        crossing = [j for j, v in enumerate(head.outs) if v in residual_roots]
        if crossing:  # saved by jax.vjp (even where the backward pass never reads it)
            node.extra["residual"] = True
        if len(head.outs) == 1:
            node.extra["aval"] = _short(flat.avals[head.outs[0]])
        else:
            node.extra["out_bytes"] = [aval_bytes(flat.avals[v]) for v in head.outs]
            if crossing:
                node.extra["residual_outputs"] = crossing
        if len(members) > 1:
            node.extra["fused"] = len(members)
        if op in primitives.CONTROL_FLOW:
            node.extra["body_bytes"] = _body_bytes(head)
        if head.source:
            node.extra["source"] = head.source
        scope, loops = provenance(head.name_stack)
        if scope:
            node.extra["name_stack"] = scope
        if loops:
            node.extra["iteration"] = list(loops)
        if op == "name":  # a second name on a named value (see _find_views)
            node.extra["checkpoint_name"] = str(head.params["name"])
        guessed = primitives.guessed(flat.eqns[k] for k in members)
        if guessed:  # priced and judged by primitives.guess_kind / pure_unknown, not a table
            node.extra["guessed"] = guessed
        nodes.append(node)
    by_node: dict[int, list[int]] = {}
    for r in residual_values:
        by_node.setdefault(prod[r], []).append(aval_bytes(flat.avals[r]))
    for i, node in enumerate(nodes):
        values = [step.arg_ids[i]] if node.is_input else step.head(i - step.n_inputs).outs
        if i in views_of:  # views merged into this node: one buffer
            node.extra["views"] = views_of[i]
        named = [step.named[v] for v in values if v in step.named]
        if named:  # jax.ad_checkpoint.checkpoint_name: what name policies select by
            node.extra["checkpoint_name"] = named[0]
            if any(v in step.read_before_name for v in values):
                node.extra["read_before_name"] = True
        own = [aval_bytes(flat.avals[v]) for v in values if v in residual_values]
        if sorted(by_node.get(i, [])) != sorted(own):  # jax.vjp also saves views of this buffer
            node.extra["residual_values"] = sorted(by_node[i])
    for r in step.out_refs:
        if not isinstance(r, Const) and r in prod:
            nodes[prod[r]].output = True
    if step.compiled is not None and step.sources:
        # the gradients of a stacked argument's slices, each as [node, the caller's leaf (as
        # ``step.sources`` numbers it)]: the caller's gradient stacks them (``jax_applied``). In the
        # graph's meta, not the nodes' extras, which tell the planners' repeated blocks apart
        diff = [i for i, d in enumerate(step.diff_leaves) if d]
        step.compiled["stacked_outputs"] = [[prod[r], step.sources[i][0]] for i, r in zip(diff, step.out_refs[1:])
                                            if not isinstance(r, Const) and r in prod and step.sources[i][1] is not None]
    order = None
    if step.fused == "xla":
        from .compiled import xla_memory

        order = xla_memory(step, nodes, edges)
    buffers = {step.root_of(r) for r in residual_values} - args
    info = {
        "source": "jax",
        "cost_unit": "s",
        "cost_from": ("the compiled plain step's kernels (rematopt.xla.cost)" if step.kernels_of
                      else "each node's equations on a roofline"),
        "jax_version": jax.__version__,
        "device": dev.name,
        "device_source": dev.source,
        "argnums": list(step.argnums),
        "fuse": step.fused,
        **({"groups": step.groups, "xla": step.compiled} if step.fused == "xla" else {}),
        "unroll": step.unrolled,
        "args": [f"{n}: {_short(flat.avals[v])}" for n, v in zip(step.arg_names, step.arg_ids)],
        "equations": len(flat.eqns),
        "dead_equations_dropped": step.dead,
        "nodes_unfused": step.n_inputs + len(flat.eqns) - len(step.view_eqns),
        "nodes": step.n_inputs + len(step.groups),
        "views": len(step.view_eqns),
        "guessed_primitives": _warn_guessed(flat),
        "residuals": {"count": len(residual_values),
                      "bytes": sum(aval_bytes(flat.avals[r]) for r in residual_values),
                      "buffers": len(buffers), "buffer_bytes": sum(aval_bytes(flat.avals[r]) for r in buffers)},
    }
    info.update(meta or {})
    return Graph(name, nodes, sorted(set(edges)), order, info)


def _recomputable(flat: Flat, e: Any) -> bool:
    avals = [flat.avals[r] for r in (*e.ins, *e.outs) if not isinstance(r, Const)]
    return primitives.recomputable(e.prim.name, e.params, e.effectful, avals)


def _warn_guessed(flat: Flat) -> list[str]:
    """The unknown primitives of the program, each named in one
    :class:`~.primitives.GuessedPrimitive` warning saying how it was taken."""
    names = primitives.guessed(flat.eqns)
    for name in names:
        first = next((e for e in flat.eqns if e.prim.name == name), None)
        if first is None:
            how = "inside a loop body kept whole"
        else:
            how = (f"{'at ' + first.source + ', ' if first.source else ''}priced as {cost.guessed_kind(flat, first)} "
                   "from its shapes, "
                   + ("recomputable" if _recomputable(flat, first) else "never recomputed (effects or state)"))
        warnings.warn(primitives.GuessedPrimitive(
            f"primitive {name!r} is in no table of rematopt.importers.jaxpr.primitives: {how}"), stacklevel=4)
    return names


def _node_seconds(step: Step, members: list[int], dev: costmodel.Device) -> float:
    """What the kernels XLA compiled for the node's head take (:mod:`rematopt.xla.cost`) where the
    compiled step is known (``fuse="xla"``), else the roofline of its equations."""
    if members[-1] in step.kernels_of:
        from ...xla.cost import kernel_cost

        return math.fsum(kernel_cost(k, dev).seconds * share for k, share in step.kernels_of[members[-1]])
    return _group_seconds(step, members, dev)


def _group_seconds(step: Step, members: list[int], dev: costmodel.Device) -> float:
    flat = step.flat
    if len(members) == 1:
        return cost.eqn_seconds(flat, flat.eqns[members[0]], dev)
    # A fusion reads its external operands and writes its result once; the
    # intermediates stay in registers.
    inside = {v for k in members for v in flat.eqns[k].outs}
    external = {r for k in members for r in flat.eqns[k].ins if not isinstance(r, Const) and r not in inside}
    moved = sum(aval_bytes(flat.avals[r]) for r in external) + cost.out_bytes(flat, flat.eqns[members[-1]])
    flops = math.fsum(cost.eqn_flops(flat, flat.eqns[k]) for k in members)
    return costmodel.roofline_seconds(flops, moved, dev)


def _body_bytes(eqn) -> int:
    p = eqn.params
    bodies = [p["jaxpr"]] if "jaxpr" in p else [p["body_jaxpr"]] if "body_jaxpr" in p else list(p.get("branches", ()))
    return max((cost.jaxpr_bytes(b) for b in bodies), default=0)


def _short(aval: Any) -> str:
    try:
        return aval.str_short(short_dtypes=True)
    except (AttributeError, TypeError):
        return str(aval)
