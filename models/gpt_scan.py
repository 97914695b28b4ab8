"""The decoder of :mod:`models.gpt` with its layers stacked and run by
``jax.lax.scan``, as Flax's ``nn.scan`` and MaxText do: one set of block
parameters with a leading ``layers`` axis, one traced block body."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from . import gpt
from .common import configure, layer_norm

CONFIG = dict(gpt.CONFIG)


def init(c: dict) -> dict:
    """gpt's parameters (same seed, same values) with the blocks stacked."""
    params = gpt.init(c)
    blocks = params.pop("blocks")
    return {**params, "blocks": jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *blocks)}


def forward(params: dict, tokens: jax.Array, heads: int) -> jax.Array:
    x = params["embed"][tokens] + params["pos"][: tokens.shape[1]]

    def block(x, p):  # gpt's block, names included
        x = checkpoint_name(x, "decoder_layer_input")
        x = x + gpt.attention(layer_norm(x, p["ln1"]), p, heads)
        return x + gpt.mlp(layer_norm(x, p["ln2"]), p), None

    x, _ = jax.lax.scan(block, x, params["blocks"])
    return layer_norm(x, params["ln_f"]) @ params["embed"].T


def factory(**overrides):
    """``(loss_fn, (params, tokens))`` at ``CONFIG`` updated with ``overrides``."""
    c = configure(CONFIG, overrides)
    return gpt.training_step(c, init(c), forward)
