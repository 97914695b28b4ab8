"""Flatten a jaxpr into one list of equations over integer value ids.

Call-like primitives (``jit``, ``custom_jvp_call``, ``custom_vjp_call``,
``checkpoint``...) are inlined, so a graph node is always a real operation;
control flow (``scan``, ``while``, ``cond``) and any other primitive stays one
equation. Every equation keeps its primitive and params, so the flat list can
be evaluated again (:func:`evaluate`), which is how plans go back into JAX.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from typing import Any, Sequence

import jax
import numpy as np
from jax.extend import core as jcore

# Primitives whose body is inlined, and the param holding that body.
INLINE_PARAMS = {
    "jit": "jaxpr", "pjit": "jaxpr", "closed_call": "call_jaxpr", "core_call": "call_jaxpr",
    "custom_jvp_call": "call_jaxpr", "custom_vjp_call": "call_jaxpr", "custom_vjp_call_jaxpr": "fun_jaxpr",
    "checkpoint": "jaxpr", "remat2": "jaxpr", "remat": "jaxpr",
}


@dataclass(frozen=True)
class Const:
    """A literal or closed-over constant: an operand, never a node."""

    value: Any


@dataclass
class Eqn:
    prim: Any                  # jax.extend.core.Primitive
    params: dict[str, Any]
    ins: list                  # operands: value ids (int) or Const
    outs: list[int]            # value ids, one per result
    effectful: bool
    source: str = ""
    phase: str | None = None
    name_stack: Any = None     # jax NameStack, whole (inlined bodies' stacks are relative to their call)
    scope: str | None = None   # a jax.named_scope to bind it under, naming it in XLA's op_names


@dataclass
class Flat:
    """Equations in program order plus the abstract value of every value id."""

    eqns: list[Eqn] = field(default_factory=list)
    avals: list[Any] = field(default_factory=list)

    def new_value(self, aval: Any) -> int:
        self.avals.append(aval)
        return len(self.avals) - 1

    def add(self, closed: "jcore.ClosedJaxpr", in_refs: Sequence, phase: str | None = None) -> list:
        """Append ``closed``'s equations, its invars bound to ``in_refs``;
        return the refs of its outvars."""
        env: dict[Any, Any] = {v: Const(c) for v, c in zip(closed.jaxpr.constvars, closed.consts)}
        return self._walk(closed.jaxpr, env, list(in_refs), phase, None)

    def _walk(self, jaxpr: "jcore.Jaxpr", env: dict, in_refs: list, phase: str | None, outer: Any) -> list:
        if len(in_refs) != len(jaxpr.invars):
            raise ValueError(f"jaxpr takes {len(jaxpr.invars)} inputs, got {len(in_refs)}")
        env.update(zip(jaxpr.invars, in_refs))

        def read(v):
            return Const(v.val) if isinstance(v, jcore.Literal) else env[v]

        for eqn in jaxpr.eqns:
            ins = [read(v) for v in eqn.invars]
            body = _inline_body(eqn)
            ns = eqn.source_info.name_stack if outer is None else outer + eqn.source_info.name_stack
            if body is not None:
                sub_jaxpr, consts = body
                sub_env = {v: Const(c) for v, c in zip(sub_jaxpr.constvars, consts)}
                outs = self._walk(sub_jaxpr, sub_env, ins, phase, ns)
                env.update(zip(eqn.outvars, outs))
                continue
            outs = [self.new_value(v.aval) for v in eqn.outvars]
            env.update(zip(eqn.outvars, outs))
            self.eqns.append(Eqn(eqn.primitive, dict(eqn.params), ins, outs,
                                 bool(eqn.effects), _source(eqn), phase, ns))
        return [read(v) for v in jaxpr.outvars]


def _inline_body(eqn) -> tuple[Any, Sequence] | None:
    """(jaxpr, consts) of a call-like equation, or None to keep it as one op."""
    key = INLINE_PARAMS.get(eqn.primitive.name)
    body = eqn.params.get(key) if key else None
    if body is None or len(body.in_avals if hasattr(body, "in_avals") else body.invars) != len(eqn.invars):
        return None
    if isinstance(body, jcore.ClosedJaxpr):
        return body.jaxpr, body.consts
    return body, ()


def _source(eqn) -> str:
    """``file.py:LINE (function)`` of the user frame that emitted ``eqn``."""
    try:
        from jax._src import source_info_util  # summary only; no public equivalent

        text = source_info_util.summarize(eqn.source_info)
    except Exception:  # pragma: no cover - diagnostics only
        return ""
    return os.path.basename(text)  # file name only: graphs must not depend on where they were made


def aval_bytes(aval: Any) -> int:
    """Device bytes of one abstract value (0 for tokens and float0)."""
    shape = getattr(aval, "shape", None)
    dtype = getattr(aval, "dtype", None)
    if shape is None or dtype is None:
        return 0
    try:
        itemsize = np.dtype(dtype).itemsize
    except TypeError:
        itemsize = getattr(dtype, "itemsize", 0) or 0
    if str(dtype) == "float0":
        return 0
    return int(np.prod(shape, dtype=np.int64)) * int(itemsize)


def bind(eqn: Eqn, invals: Sequence) -> list:
    """Run one equation on concrete or traced values (as ``eval_jaxpr`` does), under its ``scope``."""
    with in_scope(eqn):
        return bind_primitive(eqn.prim, eqn.params, invals)


def in_scope(eqn: Eqn) -> contextlib.AbstractContextManager:
    """The ``jax.named_scope`` of ``eqn``'s ``scope``, where it has one: what is traced inside is named for it."""
    return jax.named_scope(eqn.scope) if eqn.scope is not None else contextlib.nullcontext()


def bind_primitive(prim: Any, eqn_params: dict, invals: Sequence) -> list:
    """``prim`` applied to ``invals`` with a jaxpr equation's params; a list of results."""
    params = prim.get_bind_params(eqn_params)
    subfuns: Sequence = ()
    if isinstance(params, tuple):  # jax < 0.7 returned (subfuns, params)
        subfuns, params = params
    out = prim.bind(*subfuns, *invals, **params)
    return list(out) if prim.multiple_results else [out]


def evaluate(eqns: Sequence[Eqn], env: dict[int, Any]) -> dict[int, Any]:
    """Evaluate ``eqns`` in order, reading and extending ``env`` (value id -> value)."""
    def read(r):
        return r.value if isinstance(r, Const) else env[r]

    for eqn in eqns:
        env.update(zip(eqn.outs, bind(eqn, [read(r) for r in eqn.ins])))
    return env
