"""The decoder of :mod:`models.gpt` with its layers stacked and run by
``jax.lax.scan``, as Flax's ``nn.scan`` and MaxText do: one set of block
parameters with a leading ``layers`` axis, one traced block body."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from . import gpt
from .common import Remat, configure, layer_norm

CONFIG = dict(gpt.CONFIG)


def init(c: dict) -> dict:
    """gpt's parameters (same seed, same values) with the blocks stacked."""
    params = gpt.init(c)
    blocks = params.pop("blocks")
    return {**params, "blocks": jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *blocks)}


def forward(params: dict, tokens: jax.Array, heads: int, remat: Remat = Remat()) -> jax.Array:
    x = params["embed"][tokens] + params["pos"][: tokens.shape[1]]

    def body(x, p):  # gpt's block, names included
        return gpt.block(x, p, heads), None

    x, _ = jax.lax.scan(remat.layer(body, prevent_cse=False), x, params["blocks"])
    return layer_norm(x, params["ln_f"]) @ params["embed"].T


def factory(remat: str | None = None, remat_scope: str = "layer", **overrides):
    """``(loss_fn, (params, tokens))`` at ``CONFIG`` updated with ``overrides``."""
    c = configure(CONFIG, overrides)
    return gpt.training_step(c, init(c), forward, Remat.of(remat, remat_scope, gpt.NAMES))
