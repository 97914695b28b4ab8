"""A ResNet-style CNN: a stem convolution, ``stages`` stages of ``blocks`` basic
residual blocks (two 3x3 convolutions, ReLU), stride-2 downsampling between
stages, global average pooling and a linear classifier. NHWC layout.
``remat=`` checkpoints each residual block with ``jax.checkpoint``."""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from .common import Remat, configure, cross_entropy, dense_init, normal, rng

CONFIG = {"stages": 2, "blocks": 1, "channels": 16, "image": 16, "classes": 10, "batch": 4, "seed": 0}
DN = ("NHWC", "HWIO", "NHWC")


def conv(x: jax.Array, w: jax.Array, stride: int = 1) -> jax.Array:
    return jax.lax.conv_general_dilated(x, w, (stride, stride), "SAME", dimension_numbers=DN)


def conv_init(gen: np.random.Generator, cin: int, cout: int) -> jax.Array:
    return normal(gen, (3, 3, cin, cout), (2.0 / (9 * cin)) ** 0.5)


def residual_block(h: jax.Array, blk: dict, stride: int) -> jax.Array:
    out = conv(jax.nn.relu(conv(h, blk["c1"], stride)), blk["c2"])
    skip = conv(h, blk["skip"], stride) if blk["skip"] is not None else h[:, ::stride, ::stride]
    return jax.nn.relu(out + skip)


def factory(remat: str | None = None, remat_scope: str = "layer", **overrides):
    """``(loss_fn, (params, (images, labels)))`` at ``CONFIG`` updated with ``overrides``."""
    c = configure(CONFIG, overrides)
    r = Remat.of(remat, remat_scope)
    gen = rng(c["seed"])
    ch = c["channels"]
    params = {"stem": conv_init(gen, 3, ch), "stages": []}
    for s in range(c["stages"]):
        cin, cout = ch * 2 ** max(s - 1, 0), ch * 2 ** s
        params["stages"].append([{"c1": conv_init(gen, cin if b == 0 else cout, cout),
                                  "c2": conv_init(gen, cout, cout) * 0.5,
                                  "skip": conv_init(gen, cin, cout) if b == 0 and cin != cout else None}
                                 for b in range(c["blocks"])])
    params["head"] = dense_init(gen, ch * 2 ** (c["stages"] - 1), c["classes"])
    x = normal(gen, (c["batch"], c["image"], c["image"], 3))
    y = jnp.arange(c["batch"], dtype=jnp.int32) % c["classes"]

    def loss_fn(params, batch):
        h, labels = batch
        h = jax.nn.relu(conv(h, params["stem"]))
        for s, stage in enumerate(params["stages"]):
            for b, blk in enumerate(stage):
                h = r.layer(partial(residual_block, stride=2 if s > 0 and b == 0 else 1))(h, blk)
        return cross_entropy(jnp.mean(h, axis=(1, 2)) @ params["head"], labels)

    return r.step(loss_fn), (params, (x, y))
