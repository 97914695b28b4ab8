"""Primitives the JAX libraries emit, each handled or refused in one line:
random draws (recomputable where they are a pure function of a key, never
where they read hidden state), custom_jvp / custom_vjp rules, nested jit,
remat already in the program, integer operations, callbacks, and primitives
no table knows (defined here: guessed from their shapes, recomputed when pure,
pinned when effectful)."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.extend import core as jcore  # noqa: E402
from jax.interpreters import ad, mlir  # noqa: E402

from rematopt import no_remat_plan, simulate, solve  # noqa: E402
from rematopt.importers import costmodel  # noqa: E402
from rematopt.jax import GuessedPrimitive, apply_plan, residual_fates, trace, trace_grad  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
from jax_residuals import assert_same_gradients, jax_residuals, recompute_plan, residual_values  # noqa: E402

RNG = np.random.default_rng(0)
W = jnp.asarray(RNG.standard_normal((16, 16)) / 4, jnp.float32)
X = jnp.asarray(RNG.standard_normal((8, 16)), jnp.float32)


def dropout_loss(w, x, key):
    """Dropout from a key, as Flax, equinox and Keras draw it (threefry bits)."""
    h = jnp.tanh(x @ w)
    keep = jax.random.bernoulli(key, 0.7, h.shape)
    return jnp.mean((jnp.where(keep, h / 0.7, 0.0) @ w) ** 2)


def forward_nodes(g, pred):
    return {v.id for v in g.nodes if v.phase == "forward" and pred(v)}


@pytest.mark.parametrize("key", [jax.random.PRNGKey(3), jax.random.key(3)], ids=["raw", "typed"])
def test_a_key_based_draw_recomputed_gives_the_same_mask(key):
    args = (W, X, key)
    g = trace_grad(dropout_loss, *args)
    draws = forward_nodes(g, lambda v: v.op.startswith("random_") or v.op in ("threefry2x32", "shift_right_logical"))
    assert draws and all(g.nodes[i].recomputable for i in draws)
    assert residual_values(g) == jax_residuals(dropout_loss, args)
    everything = forward_nodes(g, lambda v: not v.output)
    plan = recompute_plan(g, recompute=everything)
    assert draws & residual_fates(g, plan).recomputed, "the plan draws the mask again in the backward pass"
    assert_same_gradients(dropout_loss, apply_plan(dropout_loss, g, plan), args)


def test_a_draw_from_hidden_state_is_never_recomputed():
    def loss(w, x):
        noise = jax.lax.rng_uniform(0.0, 1.0, x.shape)  # stablehlo.rng: the device's generator state
        return jnp.mean(jnp.tanh((x + noise) @ w) ** 2)

    g = trace_grad(loss, W, X)
    (rng,) = [v for v in g.nodes if v.op == "rng_uniform"]
    assert not rng.recomputable
    sol = solve(g, "cpsat", budget_ratio=0.9, time_limit=3, workers=1)
    assert sol.has_plan and rng.id not in residual_fates(g, sol.plan).recomputed
    computes = [i for op, i in zip(sol.plan.ops.tolist(), sol.plan.nodes.tolist()) if op == 0]
    assert computes.count(rng.id) == 1


def test_a_loop_drawing_from_hidden_state_is_not_recomputable_either():
    def f(x):
        def body(c, _):
            return c + jax.lax.rng_uniform(0.0, 1.0, c.shape), None
        return jax.lax.scan(body, x, None, length=3)[0]

    assert not [v for v in trace(f, X, unroll=False).nodes if v.op == "scan"][0].recomputable
    assert [v.recomputable for v in trace(f, X).nodes if v.op == "rng_uniform"] == [False] * 3


def test_callbacks_pure_ones_recompute_io_ones_do_not():
    def f(x):
        y = jax.pure_callback(np.sin, jax.ShapeDtypeStruct(x.shape, x.dtype), x)
        jax.experimental.io_callback(lambda v: None, None, y)
        return y * 2

    flags = {v.op: v.recomputable for v in trace(f, X).nodes if not v.is_input}
    assert flags["pure_callback"] is True and flags["io_callback"] is False


def test_custom_rules_nested_jit_remat_and_integer_ops_trace_and_apply():
    @jax.custom_jvp
    def softplus(x):
        return jnp.logaddexp(x, 0.0)

    softplus.defjvp(lambda p, t: (softplus(p[0]), t[0] * jax.nn.sigmoid(p[0])))

    @jax.custom_vjp
    def clip_grad(x):
        return x

    clip_grad.defvjp(lambda x: (x, None), lambda _, ct: (jnp.clip(ct, -1.0, 1.0),))

    @jax.jit
    def block(w, x):
        return softplus(x @ w)

    def loss(w, x):
        h = jax.checkpoint(block)(w, x)                      # remat already in the program
        idx = jnp.argmax(h, axis=-1) % 4 + (jnp.arange(h.shape[0]) >> 1)  # integer ops
        picked = jnp.take_along_axis(h, idx[:, None], axis=-1)
        return jnp.mean(clip_grad(h) ** 2) + jnp.mean(picked)

    args = (W, X)
    g = trace_grad(loss, *args)
    assert residual_values(g) == jax_residuals(loss, args)
    assert {"argmax", "shift_right_arithmetic", "rem", "iota"} <= {v.op for v in g.nodes}
    assert not {"custom_jvp_call", "custom_vjp_call", "jit", "checkpoint"} & {v.op for v in g.nodes}
    # jax.checkpoint recomputes the block's matmul in the backward pass, beside its gradient's (w.r.t. w)
    assert sum(v.op == "dot_general" and v.phase == "backward" for v in g.nodes) == 2
    for plan in (no_remat_plan(g), recompute_plan(g, recompute=forward_nodes(g, lambda v: v.recomputable
                                                                             and not v.output))):
        assert simulate(g, plan).valid
        assert_same_gradients(loss, apply_plan(loss, g, plan), args)


def _primitive(name: str, fn, jvp=None, transpose=None, effect=None) -> jcore.Primitive:
    """A primitive no table knows, defined as a library would: abstract
    evaluation, an implementation, an XLA lowering, and a derivative
    (``jvp(g, ans, x)``, or ``transpose(ct, x)`` for a linear one)."""
    prim = jcore.Primitive(name)
    prim.def_impl(fn)
    shape = lambda x, **_: jax.eval_shape(fn, x)  # noqa: E731
    if effect is None:
        prim.def_abstract_eval(lambda x, **p: jax.core.ShapedArray(shape(x).shape, shape(x).dtype))
    else:
        prim.def_effectful_abstract_eval(lambda x, **p: (jax.core.ShapedArray(x.shape, x.dtype), {effect}))
    mlir.register_lowering(prim, mlir.lower_fun(lambda x, **_: fn(x), multiple_results=False))
    if jvp is not None:
        ad.defjvp2(prim, jvp)
    if transpose is not None:
        ad.deflinear2(prim, transpose)
    return prim


# Elementwise: 2 tanh(x / 2), whose derivative reads its own result.
SOFT_CLIP = _primitive("soft_clip", lambda x: 2 * jnp.tanh(x / 2), jvp=lambda g, ans, x: g * (1 - (ans / 2) ** 2))
# Data movement: the rows twice over; linear, so its transpose sums the halves.
TILE_ROWS = _primitive("tile_rows", lambda x: jnp.concatenate([x, x]),
                       transpose=lambda ct, x: [ct[:x.aval.shape[0]] + ct[x.aval.shape[0]:]])


class Journal(jcore.Effect):
    """A side effect of the test's own (as a logging or I/O primitive has)."""


JOURNAL = Journal()
WRITE_JOURNAL = _primitive("write_journal", lambda x: x, effect=JOURNAL)
# No JAX effect, but bound with ``has_side_effect=True`` (as ``ffi_call`` declares one).
FLAGGED_WRITE = _primitive("flagged_write", lambda x: x)


def guessed_loss(w, x):
    h = SOFT_CLIP.bind(SOFT_CLIP.bind(x @ w))
    return jnp.mean((TILE_ROWS.bind(h) @ w) ** 2)


def traced_with_warnings(fn, *args, **kw):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        g = fn(*args, **kw)
    return g, [str(w.message) for w in caught if issubclass(w.category, GuessedPrimitive)]


def test_unknown_pure_primitives_are_priced_from_shapes_recomputed_and_applied():
    args = (W, X)
    g, said = traced_with_warnings(trace_grad, guessed_loss, *args)
    # named once each (soft_clip is bound twice), with how it was taken
    assert len(said) == 2 and "'soft_clip'" in said[0] and "'tile_rows'" in said[1]
    assert "test_jax_primitives.py" in said[0] and "elementwise" in said[0] and "recomputable" in said[0]
    assert "data movement" in said[1]
    assert g.meta["guessed_primitives"] == ["soft_clip", "tile_rows"]
    dev = costmodel.device(g.meta["device"])
    clips = [v for v in g.nodes if v.op == "soft_clip"]
    (tile,) = [v for v in g.nodes if v.op == "tile_rows"]
    assert len(clips) == 2 and all(v.phase == "forward" and v.recomputable for v in clips + [tile])
    assert all(v.extra["guessed"] == [v.op] for v in clips + [tile])
    assert not any("guessed" in v.extra for v in g.nodes if v.op not in ("soft_clip", "tile_rows"))
    h_bytes = X.shape[0] * W.shape[1] * 4
    assert all(v.cost == costmodel.roofline_seconds(X.shape[0] * W.shape[1], 2 * h_bytes, dev) for v in clips)
    assert tile.bytes == 2 * h_bytes and tile.cost == costmodel.roofline_seconds(0.0, 3 * h_bytes, dev)
    assert residual_values(g) == jax_residuals(guessed_loss, args)
    plan = recompute_plan(g, recompute=forward_nodes(g, lambda v: v.recomputable and not v.output))
    assert {tile.id, clips[1].id} <= residual_fates(g, plan).recomputed  # bound again in the backward pass
    assert_same_gradients(guessed_loss, apply_plan(guessed_loss, g, plan), args)
    sol = solve(g, "cpsat", budget_ratio=0.8, time_limit=5, workers=1)
    assert sol.has_plan
    assert_same_gradients(guessed_loss, apply_plan(guessed_loss, g, sol.plan), args)


def test_an_effectful_unknown_primitive_is_pinned():
    def loss(w, x):
        return jnp.mean(jnp.tanh(WRITE_JOURNAL.bind(x) @ w) ** 2)

    g, said = traced_with_warnings(trace_grad, loss, W, X)
    (journal,) = [v for v in g.nodes if v.op == "write_journal"]
    assert not journal.recomputable and g.meta["guessed_primitives"] == ["write_journal"]
    assert len(said) == 1 and "never recomputed" in said[0]
    sol = solve(g, "cpsat", budget_ratio=0.9, time_limit=3, workers=1)
    assert sol.has_plan
    computes = [i for op, i in zip(sol.plan.ops.tolist(), sol.plan.nodes.tolist()) if op == 0]
    assert computes.count(journal.id) == 1
    # a primitive declaring a side effect by its params is pinned too
    g, said = traced_with_warnings(trace, lambda x: FLAGGED_WRITE.bind(x, has_side_effect=True) * 2, X)
    assert [v.recomputable for v in g.nodes if v.op == "flagged_write"] == [False] and len(said) == 1


def test_an_unknown_primitive_inside_a_loop_kept_whole():
    def looped(prim, **params):
        return lambda x: jax.lax.scan(lambda c, _: (prim.bind(c, **params), None), x, None, length=2)[0]

    for prim, pure in ((SOFT_CLIP, True), (FLAGGED_WRITE, False)):
        params = {} if pure else {"has_side_effect": True}
        g, said = traced_with_warnings(trace, looped(prim, **params), X, unroll=False)
        (scan,) = [v for v in g.nodes if v.op == "scan"]
        assert scan.recomputable is pure and scan.extra["guessed"] == [prim.name]
        assert g.meta["guessed_primitives"] == [prim.name] and len(said) == 1 and "loop body" in said[0]


def test_the_tanh_derivative_of_jax_0_10_and_0_11_needs_no_guess():
    """JAX 0.11 writes it with ``one_minus_square`` (1 - x**2), 0.10 with ``mul``
    and ``sub``: this JAX's own, then a stand-in of 0.11's where this JAX lacks it."""
    def loss(w, x):
        return jnp.mean(jnp.tanh(x @ w) ** 2)

    g, said = traced_with_warnings(trace_grad, loss, W, X)
    assert said == [] and g.meta["guessed_primitives"] == []
    one_minus_square = _primitive("one_minus_square", lambda x: 1 - x * x, jvp=lambda g, ans, x: -2 * g * x)

    def stand_in(w, x):
        return jnp.mean(one_minus_square.bind(x @ w) @ w)

    g, said = traced_with_warnings(trace_grad, stand_in, W, X)
    (node,) = [v for v in g.nodes if v.op == "one_minus_square"]
    assert said == [] and g.meta["guessed_primitives"] == [] and node.recomputable and "guessed" not in node.extra


def test_lowered_to_mlir_a_key_draw_recomputes_and_a_hidden_state_draw_does_not(tmp_path):
    from rematopt.importers.mlir import import_mlir

    def f(state, x):
        _, bits = jax.lax.rng_bit_generator(state, x.shape, dtype=jnp.uint32)  # a pure function of state
        noise = jax.lax.rng_uniform(0.0, 1.0, x.shape)                       # the device's hidden state
        return x * (bits > jnp.uint32(2 ** 31)) + noise

    text = jax.jit(f).lower(jnp.zeros((4,), jnp.uint32), X).as_text()
    (tmp_path / "rng.mlir").write_text(text)
    flags = {v.op: v.recomputable for v in import_mlir(tmp_path / "rng.mlir").nodes if not v.is_input}
    assert flags["stablehlo.rng_bit_generator"] is True and flags["stablehlo.rng"] is False
