"""Loops with a static trip count, unrolled before differentiation.

``jax.lax.scan`` (and ``fori_loop``, which is a scan when its bounds are
static) hides a stack of layers in one equation. The importer first traces
the primal program, then runs that jaxpr again with every ``scan``, and every
``while`` whose trip count the literals fix, expanded into its iterations, and
hands that function to ``jax.vjp``. The graph is then the one a Python loop
over the layers would give. Each iteration's equations run under a name scope
``ITERATION`` + index + ``@`` + the loop, which JAX carries into the backward equations it
derives, so every node knows its loop indices (:func:`provenance`).

A stacked argument that a scan slices (stacked layer parameters) becomes one
argument per slice, so each layer's parameters and gradient are their own
nodes. A scan's stacked outputs stay a :class:`Stack` of per-iteration values
and are stacked into one array only where an operation reads them whole.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import jax
import numpy as np
from jax._src import source_info_util as siu  # name stacks: no public equivalent
from jax.extend import core as jcore

from .flatten import INLINE_PARAMS, bind_primitive

ITERATION = "rematopt.iteration="
# Calls whose body is unrolled when it holds a loop (jit inlined, checkpoint
# rewrapped). A custom_jvp/custom_vjp call is bound as it is, loops and all:
# inlining it would drop its differentiation rule.
CALLS = {name: INLINE_PARAMS[name] for name in ("jit", "pjit", "closed_call", "core_call", "checkpoint",
                                                 "remat", "remat2")}
REMAT = ("checkpoint", "remat", "remat2")
# A while loop whose counter runs longer than this stays one node (and a loop
# whose condition never turns false is not run forever to find out).
MAX_TRIP = 1_000


@dataclass(frozen=True)
class Stack:
    """A stacked array held as its slices along the leading axis."""

    items: tuple


jax.tree_util.register_pytree_node(Stack, lambda s: (s.items, None), lambda _, items: Stack(tuple(items)))


@dataclass(frozen=True)
class Unrolled:
    """The loss function over split arguments, and how they map back."""

    fn: Callable
    args: tuple
    sources: list[tuple[int, tuple[int, ...] | None]]  # per new leaf: (original leaf, slice index or None)


def provenance(ns: Any) -> tuple[str, tuple[int, ...]]:
    """(name stack without transforms and iteration scopes, loop indices outermost first)."""
    names = [part.name for part in getattr(ns, "stack", ())
             if isinstance(part, siu.Scope) and not part.name.startswith(ITERATION)]
    return "/".join(names), tuple(i for _, i in iterations(ns))


def iterations(ns: Any) -> tuple[tuple[str, int], ...]:
    """(loop, index) of each unrolled loop the name stack is in, outermost
    first; ``loop`` tells apart the loops of one trace (the nested loop of
    every outer iteration has the same one)."""
    out = []
    for part in getattr(ns, "stack", ()):
        if isinstance(part, siu.Scope) and part.name.startswith(ITERATION):
            index, _, loop = part.name[len(ITERATION):].partition("@")
            out.append((loop, int(index)))
    return tuple(out)


def _scope(eqn: Any, i: int) -> str:
    return f"{ITERATION}{i}@{id(eqn):x}"


def unroll(fn: Callable, args: Sequence) -> Unrolled | None:
    """``fn`` with its static loops unrolled and scanned arguments split; None if it has none."""
    leaves, tree = jax.tree_util.tree_flatten(tuple(args))
    structs = [jax.ShapeDtypeStruct(np.shape(x), jax.numpy.result_type(x)) for x in leaves]
    closed, out_shape = jax.make_jaxpr(lambda *xs: fn(*jax.tree_util.tree_unflatten(tree, xs)),
                                       return_shape=True)(*structs)
    if not _has_loop(closed.jaxpr):
        return None
    out_tree = jax.tree_util.tree_structure(out_shape)
    depth = _scanned_leaves(closed.jaxpr)
    dims = {j: structs[j].shape[:k] for j, k in depth.items()}
    sources = [(j, s) for j in range(len(leaves))
               for s in (itertools.product(*map(range, dims[j])) if j in dims else [None])]
    new_args = jax.tree_util.tree_unflatten(tree, [
        _nest([jax.ShapeDtypeStruct(x.shape[len(dims[j]):], x.dtype)] * int(np.prod(dims[j])), dims[j], tuple)
        if j in dims else x for j, x in enumerate(structs)])

    def unrolled(*a):
        slices: dict[int, list] = {}
        orig: list[Any] = [None] * len(leaves)
        for (j, s), x in zip(sources, jax.tree_util.tree_leaves(a)):
            if s is None:
                orig[j] = x
            else:
                slices.setdefault(j, []).append(x)
        orig = [_nest(slices[j], dims[j], Stack) if j in slices else x for j, x in enumerate(orig)]
        outs = run(closed, orig, siu.new_name_stack())
        return jax.tree_util.tree_unflatten(out_tree, [whole(o) for o in outs])

    return Unrolled(unrolled, tuple(new_args), sources)


def _nest(items: list, dims: tuple[int, ...], make: Callable) -> Any:
    """Row-major ``items`` as nested ``make(tuple)`` of the given leading dims."""
    if not dims:
        return items[0]
    step = len(items) // dims[0]
    return make(tuple(_nest(items[i * step:(i + 1) * step], dims[1:], make) for i in range(dims[0])))


def whole(v: Any) -> Any:
    """An array from a value that may be a :class:`Stack`."""
    if isinstance(v, Stack):
        return jax.numpy.stack([whole(x) for x in v.items])
    return v


def run(closed: Any, args: Sequence, ns: Any) -> list:
    """Evaluate ``closed`` on ``args``, unrolling loops; ``ns`` is the enclosing name stack."""
    jaxpr, consts = (closed.jaxpr, closed.consts) if isinstance(closed, jcore.ClosedJaxpr) else (closed, ())
    env: dict[Any, Any] = dict(zip(jaxpr.constvars, consts))
    env.update(zip(jaxpr.invars, args))

    def read(v):
        return v.val if isinstance(v, jcore.Literal) else env[v]

    for eqn in jaxpr.eqns:
        ins = [read(v) for v in eqn.invars]
        here = ns + eqn.source_info.name_stack
        name = eqn.primitive.name
        body = eqn.params.get(CALLS.get(name, ""))
        if name == "scan" and eqn.params["length"] > 0:
            outs = _scan(eqn, ins, here)
        elif name == "while" and (trips := _trip_count(eqn, ins)) is not None:
            outs = _while(eqn, ins, here, trips)
        elif body is not None and _has_loop(_jaxpr_of(body)):
            outs = _call(eqn, body, ins, here)
        else:
            with siu.user_context(eqn.source_info.traceback, name_stack=here):
                outs = bind_primitive(eqn.primitive, eqn.params, [whole(x) for x in ins])
        env.update(zip(eqn.outvars, outs))
    return [read(v) for v in jaxpr.outvars]


def scan_counts(params: dict) -> tuple[int, int]:
    """How many of a scan equation's operands are constants and how many the carry: JAX 0.10's
    ``num_consts`` and ``num_carry``, or from JAX 0.11 on the ``ft_in`` tree (constants, carry, scanned
    inputs)."""
    if "num_consts" in params:
        return params["num_consts"], params["num_carry"]
    consts, carry, _ = params["ft_in"].unpack()
    return len(list(consts.vals)), len(list(carry.vals))


def _scan(eqn: Any, ins: list, ns: Any) -> list:
    p = eqn.params
    (nc, nk), length = scan_counts(p), p["length"]
    consts, carry, xs = ins[:nc], ins[nc:nc + nk], ins[nc + nk:]
    ys: list[list] = []
    for k in range(length):
        i = length - 1 - k if p["reverse"] else k
        with siu.user_context(eqn.source_info.traceback, name_stack=ns):
            x_i = [_slice(x, i) for x in xs]
        out = run(p["jaxpr"], consts + carry + x_i, ns.extend(_scope(eqn, i)))
        carry = out[:nk]
        if not ys:
            ys = [[None] * length for _ in out[nk:]]
        for col, y in zip(ys, out[nk:]):
            col[i] = y
    return carry + [Stack(tuple(col)) for col in ys]


def _slice(x: Any, i: int) -> Any:
    if isinstance(x, Stack):
        return x.items[i]
    return jax.lax.index_in_dim(x, i, keepdims=False)


def _while(eqn: Any, ins: list, ns: Any, trips: int) -> list:
    p = eqn.params
    body_consts = ins[p["cond_nconsts"]:p["cond_nconsts"] + p["body_nconsts"]]
    carry = ins[p["cond_nconsts"] + p["body_nconsts"]:]
    for k in range(trips):
        carry = run(p["body_jaxpr"], body_consts + carry, ns.extend(_scope(eqn, k)))
    return carry


def _call(eqn: Any, body: Any, ins: list, ns: Any) -> list:
    """A call-like equation whose body holds a loop: inlined, or for
    ``checkpoint`` rewrapped with the same policy around the unrolled body."""
    if eqn.primitive.name in REMAT:
        p = eqn.params
        wrapped = jax.checkpoint(lambda *a: run(body, a, ns), prevent_cse=p.get("prevent_cse", True),
                                 policy=p.get("policy"))
        return list(wrapped(*ins))
    return run(body, ins, ns)


def _trip_count(eqn: Any, ins: list) -> int | None:
    """Iterations of a while loop whose condition depends only on carries the
    literals fix (a counter from a literal start to a literal bound); else None."""
    p = eqn.params
    cn, bn = p["cond_nconsts"], p["body_nconsts"]
    cond, body = p["cond_jaxpr"], p["body_jaxpr"]
    cond_consts, body_consts, init = ins[:cn], ins[cn:cn + bn], ins[cn + bn:]
    # The carries the condition reads, closed under what the body computes them from.
    need = {k - cn for k in set().union(*_deps(cond.jaxpr)) if k >= cn}
    deps = _deps(body.jaxpr)
    while True:
        reads = set().union(*(deps[k] for k in need))
        grown = need | {k - bn for k in reads if k >= bn}
        if grown == need:
            break
        need = grown
    known = [init[k] for k in need] + [body_consts[k] for k in reads if k < bn] + list(cond_consts)
    if any(isinstance(x, (jax.core.Tracer, Stack)) for x in known):
        return None
    run_cond, run_body = jcore.jaxpr_as_fun(cond), jcore.jaxpr_as_fun(body)
    with jax.ensure_compile_time_eval():  # concrete even inside the caller's trace
        # Carries and consts the counter does not depend on are zeros: they never reach it.
        carry = [init[k] if k in need else np.zeros(v.aval.shape, v.aval.dtype)
                 for k, v in enumerate(body.jaxpr.invars[bn:])]
        consts = [c if k in reads else np.zeros(v.aval.shape, v.aval.dtype)
                  for k, (c, v) in enumerate(zip(body_consts, body.jaxpr.invars))]
        for trips in range(MAX_TRIP + 1):
            if not bool(run_cond(*cond_consts, *carry)[0]):
                return trips
            carry = run_body(*consts, *carry)
    return None


def _deps(jaxpr: Any) -> list[set[int]]:
    """For each output of ``jaxpr``, the input positions it depends on."""
    src: dict[Any, set[int]] = {v: {k} for k, v in enumerate(jaxpr.invars)}
    for e in jaxpr.eqns:
        d = set().union(*(src.get(v, set()) for v in e.invars if not isinstance(v, jcore.Literal)))
        for v in e.outvars:
            src[v] = d
    return [set() if isinstance(v, jcore.Literal) else src.get(v, set()) for v in jaxpr.outvars]


def _jaxpr_of(body: Any) -> Any:
    return body.jaxpr if isinstance(body, jcore.ClosedJaxpr) else body


def _sub_jaxprs(eqn: Any):
    for v in eqn.params.values():
        for b in (v if isinstance(v, (tuple, list)) else (v,)):
            if isinstance(b, (jcore.ClosedJaxpr, jcore.Jaxpr)):
                yield _jaxpr_of(b)


def _has_loop(jaxpr: Any) -> bool:
    return any(e.primitive.name in ("scan", "while") or any(_has_loop(j) for j in _sub_jaxprs(e))
               for e in jaxpr.eqns)


def _scanned_leaves(jaxpr: Any) -> dict[int, int]:
    """Leaf index -> how many leading axes scans slice it along (nested scans
    slice a slice), through the calls :func:`run` unrolls."""
    found: dict[int, int] = {}

    def walk(jx, origin: dict):  # var -> (leaf, axes already sliced off)
        for e in jx.eqns:
            body = e.params.get(CALLS.get(e.primitive.name, ""))
            if body is not None:
                inner = _jaxpr_of(body)
                walk(inner, {iv: origin[v] for iv, v in zip(inner.invars, e.invars) if _var_in(v, origin)})
            if e.primitive.name != "scan" or e.params["length"] == 0:
                continue
            nc, nk = scan_counts(e.params)
            inner, sub = _jaxpr_of(e.params["jaxpr"]), {}
            for k, (iv, v) in enumerate(zip(inner.invars, e.invars)):
                if _var_in(v, origin) and not nc <= k < nc + nk:
                    leaf, axes = origin[v]
                    if k >= nc + nk:  # stacked input: sliced along one more axis
                        axes += 1
                        found[leaf] = max(found.get(leaf, 0), axes)
                    sub[iv] = (leaf, axes)
            walk(inner, sub)

    walk(jaxpr, {v: (k, 0) for k, v in enumerate(jaxpr.invars)})
    return found


def _var_in(v: Any, origin: dict) -> bool:
    return not isinstance(v, jcore.Literal) and v in origin
