"""Residuals exactly JAX's for models built from library layers (equinox,
Flax linen and nnx): attention, norms and MLPs under ``jax.vmap``, with
``custom_jvp`` / ``custom_vjp`` activations and ``jax.nn.dot_product_attention``.

The comparison holds the differentiated arguments fixed on both sides:
``print_saved_residuals(f, *args)`` differentiates every argument, so it is
compared with ``trace_grad(..., argnums=all)``; differentiating the parameters
alone saves fewer values (no LayerNorm statistics on the input's path), which
is what ``trace_grad``'s default ``argnums=0`` records.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

from rematopt.jax import trace_grad  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from jax_residuals import residual_values, saved_residuals  # noqa: E402


@jax.custom_vjp
def clipped_relu(x):
    """An activation with a hand-written VJP, as libraries define them."""
    return jnp.clip(x, 0.0, 6.0)


def _clip_fwd(x):
    return clipped_relu(x), x


def _clip_bwd(x, ct):
    return (ct * ((x > 0) & (x < 6)),)


clipped_relu.defvjp(_clip_fwd, _clip_bwd)


def sdpa(q, k, v):
    """jax.nn.dot_product_attention over (seq, heads, dim) with a causal mask."""
    return jax.nn.dot_product_attention(q[None], k[None], v[None], is_causal=True)[0]


def equinox_model(seq=32, width=16, layers=2, heads=2):
    eqx = pytest.importorskip("equinox")

    class Block(eqx.Module):
        ln1: eqx.nn.LayerNorm
        attn: eqx.nn.MultiheadAttention
        ln2: eqx.nn.LayerNorm
        mlp: eqx.nn.MLP
        qkv: eqx.nn.Linear

        def __init__(self, key):
            k1, k2, k3 = jax.random.split(key, 3)
            self.ln1, self.ln2 = eqx.nn.LayerNorm(width), eqx.nn.LayerNorm(width)
            self.attn = eqx.nn.MultiheadAttention(heads, width, key=k1)
            self.mlp = eqx.nn.MLP(width, width, 4 * width, 1, activation=jax.nn.relu, key=k2)
            self.qkv = eqx.nn.Linear(width, 3 * width, key=k3)

        def __call__(self, x):
            h = jax.vmap(self.ln1)(x)
            x = x + self.attn(h, h, h)
            q, k, v = jnp.split(jax.vmap(self.qkv)(h), 3, axis=-1)
            split = lambda t: t.reshape(seq, heads, width // heads)  # noqa: E731
            x = x + clipped_relu(sdpa(split(q), split(k), split(v)).reshape(seq, width))
            return x + jax.vmap(self.mlp)(jax.vmap(self.ln2)(x))

    keys = jax.random.split(jax.random.PRNGKey(0), layers + 1)
    params, static = eqx.partition([Block(k) for k in keys[:layers]], eqx.is_array)

    def loss(params, x):
        for block in eqx.combine(params, static):
            x = block(x)
        return jnp.mean(x ** 2)

    return loss, (params, jax.random.normal(keys[-1], (seq, width)))


def linen_model(seq=32, width=16, layers=2, heads=2, batch=2):
    nn = pytest.importorskip("flax.linen")

    class Block(nn.Module):
        @nn.compact
        def __call__(self, x):
            h = nn.LayerNorm()(x)
            x = x + nn.MultiHeadDotProductAttention(num_heads=heads)(h, h)
            q, k, v = jnp.split(nn.Dense(3 * width)(h), 3, axis=-1)
            split = lambda t: t.reshape(seq, heads, width // heads)  # noqa: E731
            attn = jax.vmap(lambda q, k, v: sdpa(split(q), split(k), split(v)).reshape(seq, width))(q, k, v)
            x = x + clipped_relu(attn)
            return x + nn.Dense(width)(nn.gelu(nn.Dense(4 * width)(nn.LayerNorm()(x))))

    class Model(nn.Module):
        @nn.compact
        def __call__(self, x):
            for _ in range(layers):
                x = Block()(x)
            return x

    x = jax.random.normal(jax.random.PRNGKey(1), (batch, seq, width))
    model = Model()
    params = model.init(jax.random.PRNGKey(0), x)

    def loss(params, x):
        return jnp.mean(model.apply(params, x) ** 2)

    return loss, (params, x)


def nnx_model(seq=32, width=16, layers=2, heads=2, batch=2):
    nnx = pytest.importorskip("flax.nnx")

    class Block(nnx.Module):
        def __init__(self, rngs):
            self.ln1, self.ln2 = nnx.LayerNorm(width, rngs=rngs), nnx.LayerNorm(width, rngs=rngs)
            self.attn = nnx.MultiHeadAttention(heads, width, decode=False, rngs=rngs)
            self.up, self.down = nnx.Linear(width, 4 * width, rngs=rngs), nnx.Linear(4 * width, width, rngs=rngs)

        def __call__(self, x):
            x = x + self.attn(self.ln1(x))
            return x + self.down(jax.nn.relu(self.up(self.ln2(x))))

    blocks = [Block(nnx.Rngs(i)) for i in range(layers)]
    graphdef, state = nnx.split(blocks)

    def loss(state, x):
        for block in nnx.merge(graphdef, state):
            x = block(x)
        return jnp.mean(x ** 2)

    return loss, (state, jax.random.normal(jax.random.PRNGKey(1), (batch, seq, width)))


MODELS = {"equinox": equinox_model, "linen": linen_model, "nnx": nnx_model}


def jax_residuals(fn, *args):
    return sorted(r.bytes for r in saved_residuals(fn, *args)
                  if not r.source.startswith(("from the argument", "from a literal", "from a constant")))


@pytest.mark.parametrize("library", sorted(MODELS))
@pytest.mark.parametrize("fuse", [False, True])
def test_residuals_are_exactly_jaxs_for_library_layers(library, fuse):
    fn, (params, x) = MODELS[library]()
    every = trace_grad(fn, params, x, argnums=(0, 1), fuse=fuse)
    expected = jax_residuals(fn, params, x)
    assert residual_values(every) == expected
    assert (every.meta["residuals"]["count"], every.meta["residuals"]["bytes"]) == (len(expected), sum(expected))
    params_only = trace_grad(fn, params, x, fuse=fuse)
    expected = jax_residuals(lambda p: fn(p, x), params)
    assert residual_values(params_only) == expected and sum(expected) < every.meta["residuals"]["bytes"]


def test_the_issues_equinox_decoder_at_sequence_256_width_64():
    fn, (params, x) = equinox_model(seq=256, width=64, heads=4)
    g = trace_grad(fn, params, x, argnums=(0, 1))
    expected = jax_residuals(fn, params, x)
    assert g.meta["residuals"]["bytes"] == sum(expected) > 7_000_000
