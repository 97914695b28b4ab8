"""A GPT-style decoder: token and position embeddings, ``layers`` pre-norm blocks
of causal multi-head attention and a GELU MLP, tied output projection,
next-token cross-entropy.

Values carry the ``checkpoint_name`` MaxText gives them (``decoder_layer_input``,
``query_proj``, ``key_proj``, ``value_proj``, ``out_proj``, ``mlpwi``, ``mlpwo``),
so name policies (``jax.checkpoint_policies.save_only_these_names``, the
``jax-names`` planner) act on the same values as in MaxText. ``remat=`` checkpoints
each block with ``jax.checkpoint`` (see :class:`models.common.Remat`)."""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax.ad_checkpoint import checkpoint_name

from .common import Remat, configure, cross_entropy, dense_init, layer_norm, normal, rng

CONFIG = {"layers": 2, "width": 64, "heads": 4, "seq": 32, "vocab": 128, "batch": 2, "seed": 0}
NAMES = ("decoder_layer_input", "query_proj", "key_proj", "value_proj", "out_proj", "mlpwi", "mlpwo")


def init(c: dict) -> dict:
    d = c["width"]
    gen = rng(c["seed"])
    blocks = [{
        "ln1": jnp.ones((d,), jnp.float32),
        "wq": dense_init(gen, d, d), "wk": dense_init(gen, d, d), "wv": dense_init(gen, d, d),
        "proj": dense_init(gen, d, d) / c["layers"] ** 0.5,
        "ln2": jnp.ones((d,), jnp.float32), "up": dense_init(gen, d, 4 * d),
        "down": dense_init(gen, 4 * d, d) / c["layers"] ** 0.5,
    } for _ in range(c["layers"])]
    return {"embed": normal(gen, (c["vocab"], d), 0.02), "pos": normal(gen, (c["seq"], d), 0.02),
            "blocks": blocks, "ln_f": jnp.ones((d,), jnp.float32)}


def attention(x: jax.Array, p: dict, heads: int) -> jax.Array:
    b, t, d = x.shape
    q, k, v = (checkpoint_name(x @ p[w], name).reshape(b, t, heads, d // heads)
               for w, name in (("wq", "query_proj"), ("wk", "key_proj"), ("wv", "value_proj")))
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / (d // heads) ** 0.5
    mask = jnp.tril(jnp.ones((t, t), bool))
    weights = jax.nn.softmax(jnp.where(mask, scores, -1e9), axis=-1)
    out = jnp.einsum("bhqk,bkhd->bqhd", weights, v).reshape(b, t, d)
    return checkpoint_name(out @ p["proj"], "out_proj")


def mlp(x: jax.Array, p: dict) -> jax.Array:
    h = jax.nn.gelu(checkpoint_name(x @ p["up"], "mlpwi"))
    return checkpoint_name(h @ p["down"], "mlpwo")


def block(x: jax.Array, p: dict, heads: int) -> jax.Array:
    """One pre-norm decoder block (shared with models/gpt_scan.py)."""
    x = checkpoint_name(x, "decoder_layer_input")
    x = x + attention(layer_norm(x, p["ln1"]), p, heads)
    return x + mlp(layer_norm(x, p["ln2"]), p)


def forward(params: dict, tokens: jax.Array, heads: int, remat: Remat = Remat()) -> jax.Array:
    x = params["embed"][tokens] + params["pos"][: tokens.shape[1]]
    layer = remat.layer(partial(block, heads=heads))
    for p in params["blocks"]:
        x = layer(x, p)
    return layer_norm(x, params["ln_f"]) @ params["embed"].T


def training_step(c: dict, params: dict, forward_fn, remat: Remat) -> tuple:
    """``(loss_fn, (params, tokens))``: next-token cross-entropy of
    ``forward_fn`` at config ``c`` (shared with models/gpt_scan.py)."""
    tokens = jnp.asarray(rng(c["seed"] + 1).integers(0, c["vocab"], (c["batch"], c["seq"] + 1), dtype=np.int32))

    def loss_fn(params, tokens):
        logits = forward_fn(params, tokens[:, :-1], c["heads"], remat)
        return cross_entropy(logits, tokens[:, 1:])

    return remat.step(loss_fn), (params, tokens)


def factory(remat: str | None = None, remat_scope: str = "layer", **overrides):
    """``(loss_fn, (params, tokens))`` at ``CONFIG`` updated with ``overrides``."""
    c = configure(CONFIG, overrides)
    return training_step(c, init(c), forward, Remat.of(remat, remat_scope, NAMES))
