"""Primitives the JAX libraries emit, each handled or refused in one line:
random draws (recomputable where they are a pure function of a key, never
where they read hidden state), custom_jvp / custom_vjp rules, nested jit,
remat already in the program, integer operations, callbacks, and a primitive
no table knows."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.extend import core as jcore  # noqa: E402

from rematopt import ImportFailure, no_remat_plan, simulate, solve  # noqa: E402
from rematopt.jax import apply_plan, residual_fates, trace, trace_grad  # noqa: E402

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


def test_an_unknown_primitive_is_refused_in_one_line_naming_it():
    frob = jcore.Primitive("frobnicate")
    frob.def_impl(lambda x: x)
    frob.def_abstract_eval(lambda x: x)
    with pytest.raises(ImportFailure, match=r"primitive 'frobnicate' at .*test_jax_primitives.py") as e:
        trace(lambda x: frob.bind(jnp.sin(x)), X)
    assert "\n" not in str(e.value)

    def looped(x):  # inside a loop body kept whole, too
        return jax.lax.scan(lambda c, _: (frob.bind(c), None), x, None, length=2)[0]

    with pytest.raises(ImportFailure, match="primitive 'frobnicate'"):
        trace(looped, X, unroll=False)


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
