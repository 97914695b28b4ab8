"""A U-Net-style encoder/decoder: ``depth`` levels of two 3x3 convolutions with
2x2 average-pool downsampling, a bottleneck, nearest-neighbour upsampling with
skip concatenations, and a per-pixel squared-error loss. NHWC layout.
``remat=`` checkpoints each two-convolution block with ``jax.checkpoint``."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from .common import Remat, configure, normal, rng
from .resnet import conv, conv_init

CONFIG = {"depth": 2, "channels": 8, "image": 16, "batch": 2, "seed": 0}


def down(x: jax.Array) -> jax.Array:
    b, h, w, c = x.shape
    return x.reshape(b, h // 2, 2, w // 2, 2, c).mean(axis=(2, 4))


def up(x: jax.Array) -> jax.Array:
    return jnp.repeat(jnp.repeat(x, 2, axis=1), 2, axis=2)


def factory(remat: str | None = None, remat_scope: str = "layer", **overrides):
    """``(loss_fn, (params, (images, targets)))`` at ``CONFIG`` updated with ``overrides``."""
    c = configure(CONFIG, overrides)
    r = Remat.of(remat, remat_scope)
    ch, depth = c["channels"], c["depth"]
    gen = rng(c["seed"])
    widths = [ch * 2 ** i for i in range(depth + 1)]
    params = {
        "enc": [(conv_init(gen, 3 if i == 0 else widths[i - 1], widths[i]),
                 conv_init(gen, widths[i], widths[i])) for i in range(depth)],
        "mid": (conv_init(gen, widths[depth - 1], widths[depth]),
                conv_init(gen, widths[depth], widths[depth])),
        "dec": [(conv_init(gen, widths[i + 1] + widths[i], widths[i]),
                 conv_init(gen, widths[i], widths[i])) for i in reversed(range(depth))],
        "out": conv_init(gen, widths[0], 3),
    }
    x = normal(gen, (c["batch"], c["image"], c["image"], 3))
    target = jnp.tanh(x)

    @r.layer
    def block(h, ws):
        return jax.nn.relu(conv(jax.nn.relu(conv(h, ws[0])), ws[1]))

    def loss_fn(params, batch):
        h, target = batch
        skips = []
        for ws in params["enc"]:
            h = block(h, ws)
            skips.append(h)
            h = down(h)
        h = block(h, params["mid"])
        for ws, skip in zip(params["dec"], reversed(skips)):
            h = block(jnp.concatenate([up(h), skip], axis=-1), ws)
        return jnp.mean(jnp.square(conv(h, params["out"]) - target))

    return r.step(loss_fn), (params, (x, target))
