"""A GPT-style decoder: token and position embeddings, ``layers`` pre-norm blocks
of causal multi-head attention and a GELU MLP, tied output projection,
next-token cross-entropy."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from .common import configure, cross_entropy, dense_init, layer_norm, normal, rng

CONFIG = {"layers": 2, "width": 64, "heads": 4, "seq": 32, "vocab": 128, "batch": 2, "seed": 0}


def init(c: dict) -> dict:
    d = c["width"]
    gen = rng(c["seed"])
    blocks = [{
        "ln1": jnp.ones((d,), jnp.float32), "qkv": dense_init(gen, d, 3 * d),
        "proj": dense_init(gen, d, d) / c["layers"] ** 0.5,
        "ln2": jnp.ones((d,), jnp.float32), "up": dense_init(gen, d, 4 * d),
        "down": dense_init(gen, 4 * d, d) / c["layers"] ** 0.5,
    } for _ in range(c["layers"])]
    return {"embed": normal(gen, (c["vocab"], d), 0.02), "pos": normal(gen, (c["seq"], d), 0.02),
            "blocks": blocks, "ln_f": jnp.ones((d,), jnp.float32)}


def attention(x: jax.Array, p: dict, heads: int) -> jax.Array:
    b, t, d = x.shape
    qkv = (x @ p["qkv"]).reshape(b, t, 3, heads, d // heads)
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / (d // heads) ** 0.5
    mask = jnp.tril(jnp.ones((t, t), bool))
    weights = jax.nn.softmax(jnp.where(mask, scores, -1e9), axis=-1)
    out = jnp.einsum("bhqk,bkhd->bqhd", weights, v).reshape(b, t, d)
    return out @ p["proj"]


def forward(params: dict, tokens: jax.Array, heads: int) -> jax.Array:
    x = params["embed"][tokens] + params["pos"][: tokens.shape[1]]
    for p in params["blocks"]:
        x = x + attention(layer_norm(x, p["ln1"]), p, heads)
        x = x + jax.nn.gelu(layer_norm(x, p["ln2"]) @ p["up"]) @ p["down"]
    return layer_norm(x, params["ln_f"]) @ params["embed"].T


def factory(**overrides):
    """``(loss_fn, (params, tokens))`` at ``CONFIG`` updated with ``overrides``."""
    c = configure(CONFIG, overrides)
    params = init(c)
    tokens = jnp.asarray(rng(c["seed"] + 1).integers(0, c["vocab"], (c["batch"], c["seq"] + 1), dtype=np.int32))

    def loss_fn(params, tokens):
        logits = forward(params, tokens[:, :-1], c["heads"])
        return cross_entropy(logits, tokens[:, 1:])

    return loss_fn, (params, tokens)
