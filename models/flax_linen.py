"""A decoder written with Flax linen's own layers (``nn.Embed``, ``nn.LayerNorm``,
``nn.MultiHeadDotProductAttention``, ``nn.Dense``, ``nn.Dropout``) whose blocks
are stacked and run by ``nn.scan``, as linen users (and MaxText) scan layers:
one set of block parameters with a leading ``layers`` axis. Weights come from
``model.init`` with a seeded key; dropout draws from the ``dropout`` key passed
to the step.

Flax tags no value with ``checkpoint_name``; the block does it in its own code,
with MaxText's names, as a user who wants name policies would. ``remat=``
wraps the block in ``nn.remat`` before ``nn.scan``, as MaxText does."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn
from jax.ad_checkpoint import checkpoint_name

from .common import Remat, configure, cross_entropy, rng

CONFIG = {"layers": 2, "width": 32, "heads": 2, "seq": 16, "vocab": 64, "batch": 2, "dropout": 0.1, "seed": 0}
NAMES = ("decoder_layer_input", "out_proj", "mlpwi", "mlpwo")


class Block(nn.Module):
    heads: int
    dropout: float

    @nn.compact
    def __call__(self, x, _):
        x = checkpoint_name(x, "decoder_layer_input")
        h = nn.LayerNorm()(x)
        mask = nn.make_causal_mask(jnp.ones(x.shape[:2], jnp.int32))
        attn = nn.MultiHeadDotProductAttention(num_heads=self.heads, deterministic=True)(h, h, mask=mask)
        x = x + nn.Dropout(self.dropout, deterministic=False)(checkpoint_name(attn, "out_proj"))
        h = checkpoint_name(nn.Dense(4 * x.shape[-1])(nn.LayerNorm()(x)), "mlpwi")
        return x + checkpoint_name(nn.Dense(x.shape[-1])(nn.gelu(h)), "mlpwo"), None


class Decoder(nn.Module):
    layers: int
    heads: int
    vocab: int
    width: int
    dropout: float
    remat: Remat = Remat()

    @nn.compact
    def __call__(self, tokens):
        embed = nn.Embed(self.vocab, self.width)
        x = embed(tokens) + self.param("pos", nn.initializers.normal(0.02), (tokens.shape[1], self.width))
        block = nn.remat(Block, policy=self.remat.policy, prevent_cse=False) if self.remat.per_layer else Block
        stack = nn.scan(block, variable_axes={"params": 0}, split_rngs={"params": True, "dropout": True},
                        length=self.layers)
        # the checkpointed stack keeps the plain one's name, hence its parameters and dropout keys
        x, _ = stack(self.heads, self.dropout, name="ScanBlock_0" if self.remat.per_layer else None)(x, None)
        return embed.attend(nn.LayerNorm()(x))


def factory(remat: str | None = None, remat_scope: str = "layer", **overrides):
    """``(loss_fn, (params, tokens, key))`` at ``CONFIG`` updated with ``overrides``."""
    c = configure(CONFIG, overrides)
    r = Remat.of(remat, remat_scope, NAMES)
    model = Decoder(c["layers"], c["heads"], c["vocab"], c["width"], c["dropout"], r)
    tokens = jnp.asarray(rng(c["seed"] + 1).integers(0, c["vocab"], (c["batch"], c["seq"] + 1), dtype=np.int32))
    params = model.init({"params": jax.random.PRNGKey(c["seed"]), "dropout": jax.random.PRNGKey(0)},
                        tokens[:, :-1])

    def loss_fn(params, tokens, key):
        logits = model.apply(params, tokens[:, :-1], rngs={"dropout": key})
        return cross_entropy(logits, tokens[:, 1:])

    return r.step(loss_fn), (params, tokens, jax.random.PRNGKey(c["seed"] + 2))
