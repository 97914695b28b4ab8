"""A decoder written with Flax nnx's own layers (``nnx.Embed``, ``nnx.LayerNorm``,
``nnx.MultiHeadAttention``, ``nnx.Linear``, ``nnx.Dropout``) whose blocks are
made by ``nnx.vmap`` and run by ``nnx.scan``, the scan-over-layers pattern of
Flax's nnx guide. The step takes the model's state and a typed ``jax.random.key`` from which
an ``nnx.Rngs`` stream draws the dropout masks, split per layer by
``nnx.split_rngs``.

Flax tags no value with ``checkpoint_name``; the block does it in its own code,
with MaxText's names, as a user who wants name policies would. ``remat=``
wraps the scanned block call in ``nnx.remat``."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.ad_checkpoint import checkpoint_name

from .common import Remat, configure, cross_entropy, rng

CONFIG = {"layers": 2, "width": 32, "heads": 2, "seq": 16, "vocab": 64, "batch": 2, "dropout": 0.1, "seed": 0}
NAMES = ("decoder_layer_input", "out_proj", "mlpwi", "mlpwo")


class Block(nnx.Module):
    def __init__(self, width: int, heads: int, dropout: float, rngs: nnx.Rngs):
        self.ln1, self.ln2 = nnx.LayerNorm(width, rngs=rngs), nnx.LayerNorm(width, rngs=rngs)
        self.attn = nnx.MultiHeadAttention(heads, width, decode=False, rngs=rngs)
        self.up, self.down = nnx.Linear(width, 4 * width, rngs=rngs), nnx.Linear(4 * width, width, rngs=rngs)
        self.drop = nnx.Dropout(dropout)

    def __call__(self, x, rngs: nnx.Rngs):
        x = checkpoint_name(x, "decoder_layer_input")
        mask = nnx.make_causal_mask(jnp.ones(x.shape[:2], jnp.int32))
        x = x + self.drop(checkpoint_name(self.attn(self.ln1(x), mask=mask), "out_proj"), rngs=rngs)
        h = checkpoint_name(self.up(self.ln2(x)), "mlpwi")
        return x + checkpoint_name(self.down(nnx.gelu(h)), "mlpwo")


class Decoder(nnx.Module):
    def __init__(self, c: dict, rngs: nnx.Rngs, remat: Remat = Remat()):
        self.remat = remat
        self.embed = nnx.Embed(c["vocab"], c["width"], rngs=rngs)
        self.pos = nnx.Param(jax.random.normal(rngs.params(), (c["seq"], c["width"])) * 0.02)

        @nnx.split_rngs(splits=c["layers"])
        @nnx.vmap(in_axes=(0,), out_axes=0)
        def blocks(rngs):
            return Block(c["width"], c["heads"], c["dropout"], rngs)

        self.blocks = blocks(rngs)
        self.ln = nnx.LayerNorm(c["width"], rngs=rngs)

    def __call__(self, tokens, rngs: nnx.Rngs):
        x = self.embed(tokens) + self.pos[...]
        checkpointed = nnx.remat(policy=self.remat.policy, prevent_cse=False) if self.remat.per_layer else lambda f: f

        @nnx.split_rngs(splits=self.blocks.ln1.scale.shape[0])
        @nnx.scan(in_axes=(nnx.Carry, 0, 0), out_axes=nnx.Carry)
        @checkpointed
        def run(x, block, rngs):
            return block(x, rngs)

        return self.embed.attend(self.ln(run(x, self.blocks, rngs)))


def factory(remat: str | None = None, remat_scope: str = "layer", **overrides):
    """``(loss_fn, (params, rest, tokens))`` at ``CONFIG`` updated with
    ``overrides``: ``nnx.split(model, nnx.Param, ...)``'s parameters (the
    differentiated argument) and the rest of its state (the RNG streams)."""
    c = configure(CONFIG, overrides)
    r = Remat.of(remat, remat_scope, NAMES)
    model = Decoder(c, nnx.Rngs(params=c["seed"]), r)
    graphdef, params = nnx.split(model)
    tokens = jnp.asarray(rng(c["seed"] + 1).integers(0, c["vocab"], (c["batch"], c["seq"] + 1), dtype=np.int32))

    def loss_fn(params, tokens, key):
        logits = nnx.merge(graphdef, params)(tokens[:, :-1], nnx.Rngs(dropout=key))
        return cross_entropy(logits, tokens[:, 1:])

    return r.step(loss_fn), (params, tokens, jax.random.key(c["seed"] + 2))
