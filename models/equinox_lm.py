"""A decoder written with equinox's own layers (``eqx.nn.Embedding``,
``eqx.nn.LayerNorm``, ``eqx.nn.MultiheadAttention``, ``eqx.nn.MLP``,
``eqx.nn.Dropout``), its blocks made by ``eqx.filter_vmap`` and run by
``jax.lax.scan``, equinox's scan-over-layers pattern. Dropout draws from the key
passed to the step. No value carries a ``checkpoint_name`` (equinox tags none).
``remat=`` wraps the scanned layer in ``eqx.filter_checkpoint``."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .common import Remat, configure, cross_entropy, rng

CONFIG = {"layers": 2, "width": 32, "heads": 2, "seq": 16, "vocab": 64, "batch": 2, "dropout": 0.1, "seed": 0}


class Block(eqx.Module):
    ln1: eqx.nn.LayerNorm
    attn: eqx.nn.MultiheadAttention
    ln2: eqx.nn.LayerNorm
    mlp: eqx.nn.MLP
    drop: eqx.nn.Dropout

    def __init__(self, width: int, heads: int, dropout: float, key: jax.Array):
        k1, k2 = jax.random.split(key)
        self.ln1, self.ln2 = eqx.nn.LayerNorm(width), eqx.nn.LayerNorm(width)
        self.attn = eqx.nn.MultiheadAttention(heads, width, key=k1)
        self.mlp = eqx.nn.MLP(width, width, 4 * width, 1, activation=jax.nn.gelu, key=k2)
        self.drop = eqx.nn.Dropout(dropout)

    def __call__(self, x: jax.Array, key: jax.Array) -> jax.Array:
        """One sequence, ``x``: (seq, width)."""
        h = jax.vmap(self.ln1)(x)
        mask = jnp.tril(jnp.ones((x.shape[0], x.shape[0]), bool))
        x = x + self.drop(self.attn(h, h, h, mask=mask), key=key)
        return x + jax.vmap(self.mlp)(jax.vmap(self.ln2)(x))


class Decoder(eqx.Module):
    embed: eqx.nn.Embedding
    pos: jax.Array
    blocks: Block  # stacked: every array leaf has a leading ``layers`` axis
    ln: eqx.nn.LayerNorm

    def __init__(self, c: dict, key: jax.Array):
        k_embed, k_pos, k_blocks = jax.random.split(key, 3)
        self.embed = eqx.nn.Embedding(c["vocab"], c["width"], key=k_embed)
        self.pos = jax.random.normal(k_pos, (c["seq"], c["width"])) * 0.02
        make = lambda k: Block(c["width"], c["heads"], c["dropout"], k)  # noqa: E731
        self.blocks = eqx.filter_vmap(make)(jax.random.split(k_blocks, c["layers"]))
        self.ln = eqx.nn.LayerNorm(c["width"])

    def __call__(self, tokens: jax.Array, key: jax.Array, remat: Remat = Remat()) -> jax.Array:
        """Logits of one sequence of ``tokens``. ``remat`` is an argument, not a field: the model's
        pytree (the step's arguments) is then the same under every policy, so the stock policies
        are candidates on the plain step's arguments (``rematopt.xla.verify``)."""
        x = jax.vmap(self.embed)(tokens) + self.pos
        params, static = eqx.partition(self.blocks, eqx.is_array)

        def layer(x, scanned):
            p, k = scanned
            return eqx.combine(p, static)(x, k), None

        if remat.per_layer:
            layer = eqx.filter_checkpoint(layer, policy=remat.policy, prevent_cse=False)

        keys = jax.random.split(key, jax.tree_util.tree_leaves(params)[0].shape[0])
        x, _ = jax.lax.scan(layer, x, (params, keys))
        return jax.vmap(self.ln)(x) @ self.embed.weight.T


def factory(remat: str | None = None, remat_scope: str = "layer", **overrides):
    """``(loss_fn, (model, tokens, key))`` at ``CONFIG`` updated with ``overrides``;
    ``model`` is the decoder's array leaves (``eqx.partition(model, eqx.is_array)``)."""
    c = configure(CONFIG, overrides)
    r = Remat.of(remat, remat_scope)
    params, static = eqx.partition(Decoder(c, jax.random.PRNGKey(c["seed"])), eqx.is_array)
    tokens = jnp.asarray(rng(c["seed"] + 1).integers(0, c["vocab"], (c["batch"], c["seq"] + 1), dtype=np.int32))

    def loss_fn(params, tokens, key):
        model = eqx.combine(params, static)
        keys = jax.random.split(key, tokens.shape[0])
        logits = jax.vmap(lambda t, k: model(t, k, r))(tokens[:, :-1], keys)
        return cross_entropy(logits, tokens[:, 1:])

    return r.step(loss_fn), (params, tokens, jax.random.PRNGKey(c["seed"] + 2))
