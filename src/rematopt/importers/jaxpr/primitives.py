"""Every primitive the importer knows: how it is priced, whether re-running it is
safe, and which ones are views of their operand.

A primitive outside these tables (each JAX release adds some) is guessed
rather than refused: priced from its shapes (:func:`guess_kind`), recomputable
when it is pure (:func:`pure_unknown`: no effects, arrays in and out, no
declared side effect), pinned otherwise. The graph names the guessed ones
(:func:`guessed`), and each is named once per trace in a :class:`GuessedPrimitive`
warning.

Random numbers: JAX's key-based draws (``random_bits`` and the key
operations, ``threefry2x32``, ``rng_bit_generator``) are pure functions of
their key operands, so re-running one gives the same bits and they are
recomputable. ``rng_uniform`` (``stablehlo.rng``) draws from the device's
hidden generator state and is not; nor is any equation with a JAX effect
(callbacks, prints) or a foreign call declared to have side effects.
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator

import jax

from .flatten import INLINE_PARAMS

# Data movement: no arithmetic, cost is bytes moved only.
LAYOUT = frozenset({
    "reshape", "broadcast_in_dim", "transpose", "squeeze", "expand_dims", "slice", "dynamic_slice",
    "dynamic_update_slice", "concatenate", "pad", "gather", "convert_element_type", "copy", "copy_p",
    "rev", "iota", "device_put", "split", "bitcast_convert_type", "reduce_precision", "stop_gradient",
    "stack", "unstack", "tile", "broadcast_to", "sharding_constraint", "optimization_barrier",
    "with_memory_space_constraint", "layout_constraint", "empty", "zeros_like", "platform_index",
})
# One result element per input element (after broadcasting): what XLA fuses freely.
ELEMENTWISE = frozenset({
    "add", "add_any", "sub", "mul", "div", "neg", "max", "min", "abs", "sign", "floor", "ceil", "round",
    "select_n", "integer_pow", "square", "sqrt", "rsqrt", "cbrt", "exp", "exp2", "expm1", "log", "log1p",
    "tanh", "logistic", "erf", "erfc", "erf_inv", "sin", "cos", "tan", "atan2", "pow", "eq", "ne", "lt",
    "le", "gt", "ge", "and", "or", "not", "xor", "clamp", "rem", "is_finite", "nextafter", "real", "imag",
    "conj", "shift_left", "shift_right_logical", "shift_right_arithmetic", "population_count",
    "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh", "lgamma", "digamma", "polygamma",
    "igamma", "igammac", "igamma_grad_a", "zeta", "bessel_i0e", "bessel_i1e", "regularized_incomplete_beta",
    "clz", "mulhi", "complex",
    "one_minus_square",  # 1 - x**2: JAX 0.11 writes tanh's derivative with it (absent from 0.10)
})
REDUCTIONS = frozenset({
    "reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "reduce_and", "reduce_or", "reduce_xor",
    "argmax", "argmin", "cumsum", "cumprod", "cummax", "cummin", "cumlogsumexp", "reduce",
    "reduce_window_sum", "reduce_window_max", "reduce_window_min", "reduce_window",
    "select_and_scatter_add", "select_and_gather_add", "select_and_scatter", "sort", "top_k", "approx_top_k",
})
# Indexed updates: priced per element of the result.
SCATTER = frozenset({"scatter", "scatter-add", "scatter-sub", "scatter-mul", "scatter-min", "scatter-max"})
MATMUL = frozenset({"dot_general", "conv_general_dilated", "ragged_dot_general"})
# Dense linear algebra and FFTs: pure; priced per element like the rest (a floor, not their O(n^3)).
LINALG = frozenset({
    "cholesky", "eigh", "eig", "lu", "lu_pivots_to_permutation", "qr", "geqrf", "householder_product", "svd",
    "triangular_solve", "tridiagonal", "tridiagonal_solve", "schur", "hessenberg", "fft", "custom_linear_solve",
})
# Key-based random numbers: pure functions of the key operands (see the module docstring).
RANDOM = frozenset({
    "random_seed", "random_bits", "random_split", "random_fold_in", "random_wrap", "random_unwrap",
    "random_clone", "random_gamma", "threefry2x32", "threefry4x32", "philox2x32", "philox4x32",
    "rng_bit_generator", "iota_2x32_shape",
})
# Draws from hidden device state, and calls out of the program: never re-run.
STATEFUL = frozenset({"rng_uniform", "io_callback", "debug_callback", "debug_print"})
# Calls whose result is a pure function of their operands by contract.
PURE_CALLS = frozenset({"pure_callback", "ffi_call"})
CONTROL_FLOW = frozenset({"scan", "while", "cond"})
# Calls the flattener inlines; inside a loop body kept whole they remain.
CALLS = frozenset(INLINE_PARAMS)
# Identities that only tag a value (``checkpoint_name``); XLA emits nothing for them.
TAGS = frozenset({"name"})

KNOWN = (LAYOUT | ELEMENTWISE | REDUCTIONS | SCATTER | MATMUL | LINALG | RANDOM | STATEFUL | PURE_CALLS
         | CONTROL_FLOW | CALLS | TAGS)

# Views: one operand, one result of the same bytes, and no buffer of its own
# under XLA. Measured on CPU (the optimised HLO of x = a @ w; y = op(x) with x and
# y both read later): ``name``, ``copy``, ``device_put`` without a target,
# ``stop_gradient`` and same-dtype converts vanish; reshapes, squeezes and
# unit-dimension broadcasts become ``bitcast``. Not views: ``transpose`` (a copy
# unless folded into a dot's dimension numbers), ``bitcast_convert_type`` (stays
# a ``bitcast-convert``), ``reduce_precision`` (arithmetic), dtype changes.
VIEW_OPS = frozenset({"name", "reshape", "squeeze", "expand_dims", "broadcast_in_dim", "convert_element_type",
                      "copy", "copy_p", "device_put", "stop_gradient", "sharding_constraint"})


def is_view(prim: str, params: dict, in_aval: Any, out_aval: Any) -> bool:
    """The result is its operand's buffer (see :data:`VIEW_OPS`)."""
    if prim not in VIEW_OPS or getattr(in_aval, "dtype", None) != getattr(out_aval, "dtype", None):
        return False
    if getattr(in_aval, "size", None) != getattr(out_aval, "size", None):
        return False  # broadcast_in_dim that adds elements
    if prim == "device_put":  # a transfer to another device or memory space is a copy
        return all(d is None for d in params.get("devices", (None,)))
    return True


def recomputable(prim: str, params: dict, effectful: bool, avals: Iterable[Any] = ()) -> bool:
    """Re-running it gives the same values and changes nothing else (an
    unknown primitive: when :func:`pure_unknown`, judged on ``avals``, its
    operands' and results')."""
    if effectful or prim in STATEFUL:
        return False
    if prim == "ffi_call" and params.get("has_side_effect", False):
        return False
    if prim not in KNOWN and not pure_unknown(params, avals):
        return False
    return all(recomputable(e.primitive.name, e.params, bool(e.effects), _eqn_avals(e))
               for j in sub_jaxprs(params) for e in j.eqns)


def pure_unknown(params: dict, avals: Iterable[Any]) -> bool:
    """An effect-free unknown primitive is taken to compute its results from
    its operands alone unless it declares a side effect or passes state that
    is not an array (a mutable ``Ref``, a token)."""
    if params.get("has_side_effect", False):
        return False
    return all(isinstance(a, jax.core.ShapedArray) for a in avals)


def guess_kind(in_avals: list, out_avals: list) -> str:
    """How an unknown primitive is priced: ``"elementwise"`` (per result
    element, as ``add``) when every result has the shape of an operand, else
    ``"data movement"`` (bytes only, as ``concatenate``)."""
    shapes = {tuple(getattr(a, "shape", ())) for a in in_avals}
    return "elementwise" if out_avals and all(tuple(getattr(a, "shape", ())) in shapes
                                              for a in out_avals) else "data movement"


class GuessedPrimitive(UserWarning):
    """The traced program holds a primitive rematopt has no table entry for;
    it is priced from its shapes and recomputed only if it is pure."""


def guessed(eqns: Iterable[Any]) -> list[str]:
    """Names of the unknown primitives among ``eqns`` and inside their loop
    and branch bodies, in order of first appearance."""
    names: dict[str, None] = {}
    for e in eqns:
        prim = e.prim if hasattr(e, "prim") else e.primitive
        if prim.name not in KNOWN:
            names.setdefault(prim.name)
        for j in sub_jaxprs(e.params):
            names.update(dict.fromkeys(guessed(j.eqns)))
    return list(names)


def _eqn_avals(e: Any) -> list:
    """A jaxpr equation's operand and result avals."""
    return [v.aval for v in (*e.invars, *e.outvars)]


def sub_jaxprs(params: dict) -> Iterator[Any]:
    """The jaxprs (open) among an equation's params: loop and branch bodies."""
    for v in params.values():
        for b in (v if isinstance(v, (tuple, list)) else (v,)):
            if hasattr(b, "eqns"):
                yield b
            elif hasattr(b, "jaxpr") and hasattr(b.jaxpr, "eqns"):
                yield b.jaxpr
