"""Pieces the models share: seeded initialisation, layer norm, cross-entropy."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def dense_init(key, fan_in: int, fan_out: int) -> jax.Array:
    """He-style scaled normal weights, so activations stay O(1) through depth."""
    return jax.random.normal(key, (fan_in, fan_out), jnp.float32) * (2.0 / fan_in) ** 0.5


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
