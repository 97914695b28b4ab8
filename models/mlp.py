"""A multilayer perceptron classifier: ``layers`` dense + tanh layers, softmax cross-entropy.
``remat=`` checkpoints each dense + tanh layer with ``jax.checkpoint``."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from .common import Remat, configure, cross_entropy, dense_init, normal, rng

CONFIG = {"layers": 4, "width": 256, "in_dim": 128, "classes": 10, "batch": 64, "seed": 0}


def dense_tanh(h: jax.Array, layer: dict) -> jax.Array:
    return jnp.tanh(h @ layer["w"] + layer["b"])


def factory(remat: str | None = None, remat_scope: str = "layer", **overrides):
    """``(loss_fn, (params, batch))`` at ``CONFIG`` updated with ``overrides``."""
    c = configure(CONFIG, overrides)
    r = Remat.of(remat, remat_scope)
    hidden = r.layer(dense_tanh)
    gen = rng(c["seed"])
    dims = [c["in_dim"]] + [c["width"]] * c["layers"] + [c["classes"]]
    params = [{"w": dense_init(gen, a, b), "b": jnp.zeros((b,), jnp.float32)}
              for a, b in zip(dims[:-1], dims[1:])]
    x = normal(gen, (c["batch"], c["in_dim"]))
    y = jnp.arange(c["batch"], dtype=jnp.int32) % c["classes"]

    def loss_fn(params, batch):
        h, labels = batch
        for layer in params[:-1]:
            h = hidden(h, layer)
        return cross_entropy(h @ params[-1]["w"] + params[-1]["b"], labels)

    return r.step(loss_fn), (params, (x, y))
