"""Per-equation cost on the shared roofline model (:mod:`rematopt.importers.costmodel`).

FLOPs come from the equation's avals: ``dot_general`` and convolutions from
their dimension numbers, per element for elementwise ops and reductions (the
transcendental ones weighted), none for pure data movement; a primitive no
table knows as one or the other by its shapes (:func:`.primitives.guess_kind`).
Control flow is costed from its body: ``scan`` as ``length`` iterations,
``while`` as one iteration (its trip count is not known when tracing), ``cond``
as its dearest branch.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .. import costmodel
from .flatten import Const, Eqn, Flat, aval_bytes
from .primitives import ELEMENTWISE, KNOWN, LAYOUT, REDUCTIONS, TAGS, guess_kind


# Elementwise ops XLA's fusion does not compute again in each of several readers (its IsExpensive:
# transcendentals and divisions); it writes them once (keras gemma, greedy at 0.8: a recomputed softmax exp
# read by three backward kernels is an 8 KiB buffer at XLA's peak).
EXPENSIVE = frozenset({"exp", "exp2", "expm1", "log", "log1p", "tanh", "logistic", "sqrt", "rsqrt", "cbrt", "pow",
                       "div", "rem", "erf", "erfc", "erf_inv", "sin", "cos", "tan", "atan2"})


def fusible(op: str) -> bool:
    """A cheap equation XLA would fuse into its consumer."""
    return op in ELEMENTWISE or op in LAYOUT


def fusion_consumer(op: str) -> bool:
    """An equation XLA's loop/input fusion can absorb producers into."""
    return op in ELEMENTWISE or op in LAYOUT or op in REDUCTIONS


def in_bytes(flat: Flat, eqn: Eqn) -> int:
    return sum(_ref_bytes(flat, r) for r in eqn.ins)


def out_bytes(flat: Flat, eqn: Eqn) -> int:
    return sum(aval_bytes(flat.avals[v]) for v in eqn.outs)


def _ref_bytes(flat: Flat, r: Any) -> int:
    return aval_bytes(_ref_aval(flat, r))


def _ref_aval(flat: Flat, r: Any) -> Any:
    """A value id's aval; for a constant, the array itself (it has shape and dtype)."""
    return np.asarray(r.value) if isinstance(r, Const) else flat.avals[r]


def _elements(aval: Any) -> int:
    return int(math.prod(getattr(aval, "shape", ())))


def eqn_flops(flat: Flat, eqn: Eqn) -> float:
    """Arithmetic of one non-control-flow equation."""
    op = eqn.prim.name
    out_avals = [flat.avals[v] for v in eqn.outs]
    in_avals = [_ref_aval(flat, r) for r in eqn.ins]
    out_el = sum(_elements(a) for a in out_avals)
    if op == "dot_general":
        (lhs_contract, _), _ = eqn.params["dimension_numbers"]
        contracted = math.prod(in_avals[0].shape[d] for d in lhs_contract)
        return costmodel.matmul_flops(out_el, contracted)
    if op == "conv_general_dilated":
        rhs = in_avals[1]
        out_features = rhs.shape[eqn.params["dimension_numbers"].rhs_spec[0]]
        return costmodel.conv_flops(out_el, _elements(rhs), out_features)
    if op in LAYOUT or (op not in KNOWN and guessed_kind(flat, eqn) == "data movement"):
        return 0.0
    return costmodel.elementwise_flops(op, max([out_el] + [_elements(a) for a in in_avals]))


def guessed_kind(flat: Flat, eqn: Eqn) -> str:
    """How an equation of an unknown primitive is priced (:func:`.primitives.guess_kind`)."""
    return guess_kind([_ref_aval(flat, r) for r in eqn.ins], [flat.avals[v] for v in eqn.outs])


def eqn_seconds(flat: Flat, eqn: Eqn, dev: costmodel.Device) -> float:
    """Roofline seconds of one equation; control flow from its body."""
    op = eqn.prim.name
    if op in TAGS:
        return 0.0
    if op == "scan":
        return eqn.params["length"] * jaxpr_seconds(eqn.params["jaxpr"], dev)
    if op == "while":
        return jaxpr_seconds(eqn.params["body_jaxpr"], dev) + jaxpr_seconds(eqn.params["cond_jaxpr"], dev)
    if op == "cond":
        return max(jaxpr_seconds(b, dev) for b in eqn.params["branches"])
    return costmodel.roofline_seconds(eqn_flops(flat, eqn), in_bytes(flat, eqn) + out_bytes(flat, eqn), dev)


def jaxpr_seconds(closed: Any, dev: costmodel.Device) -> float:
    """Summed roofline seconds of a (sub-)jaxpr, flattened the same way."""
    flat = _flatten_abstract(closed)
    return math.fsum(eqn_seconds(flat, e, dev) for e in flat.eqns)


def jaxpr_bytes(closed: Any) -> int:
    """Bytes a (sub-)jaxpr's equations produce per execution: its working data."""
    flat = _flatten_abstract(closed)
    return sum(out_bytes(flat, e) for e in flat.eqns)


def _flatten_abstract(closed: Any) -> Flat:
    from jax.extend import core as jcore

    if not isinstance(closed, jcore.ClosedJaxpr):
        closed = jcore.ClosedJaxpr(closed, ())
    flat = Flat()
    flat.add(closed, [flat.new_value(v.aval) for v in closed.jaxpr.invars])
    return flat
