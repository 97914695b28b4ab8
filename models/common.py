"""Pieces the models share: seeded initialisation, layer norm, cross-entropy."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def rng(seed: int) -> np.random.Generator:
    """Initialisation uses numpy's generator: eager ``jax.random`` calls compile a
    kernel per shape, which made building a model cost more than tracing it."""
    return np.random.default_rng(seed)


def normal(gen: np.random.Generator, shape: tuple[int, ...], scale: float = 1.0) -> jax.Array:
    return jnp.asarray(gen.standard_normal(shape, dtype=np.float32) * np.float32(scale))


def dense_init(gen: np.random.Generator, fan_in: int, fan_out: int) -> jax.Array:
    """He-style scaled normal weights, so activations stay O(1) through depth."""
    return normal(gen, (fan_in, fan_out), (2.0 / fan_in) ** 0.5)


def layer_norm(x: jax.Array, scale: jax.Array, eps: float = 1e-5) -> jax.Array:
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + eps) * scale


def cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Mean softmax cross-entropy of integer ``labels``."""
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, labels[..., None], axis=-1))


def configure(defaults: dict, overrides: dict) -> dict:
    """``defaults`` updated with ``overrides``; TypeError names an unknown key."""
    unknown = sorted(set(overrides) - set(defaults))
    if unknown:
        raise TypeError(f"unknown config {', '.join(unknown)}; known: {', '.join(defaults)}")
    return {**defaults, **overrides}
