"""Pieces the models share: seeded initialisation, layer norm, cross-entropy, and
the ``remat=`` / ``remat_scope=`` option every factory takes (:class:`Remat`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np


def rng(seed: int) -> np.random.Generator:
    """Initialisation uses numpy's generator: eager ``jax.random`` calls compile a
    kernel per shape, which made building a model cost more than tracing it."""
    return np.random.default_rng(seed)


def normal(gen: np.random.Generator, shape: tuple[int, ...], scale: float = 1.0) -> jax.Array:
    return jnp.asarray(gen.standard_normal(shape, dtype=np.float32) * np.float32(scale))


def dense_init(gen: np.random.Generator, fan_in: int, fan_out: int) -> jax.Array:
    """He-style scaled normal weights, so activations stay O(1) through depth."""
    return normal(gen, (fan_in, fan_out), (2.0 / fan_in) ** 0.5)


def layer_norm(x: jax.Array, scale: jax.Array, eps: float = 1e-5) -> jax.Array:
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + eps) * scale


def cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Mean softmax cross-entropy of integer ``labels``."""
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, labels[..., None], axis=-1))


def configure(defaults: dict, overrides: dict) -> dict:
    """``defaults`` updated with ``overrides``; TypeError names an unknown key."""
    unknown = sorted(set(overrides) - set(defaults))
    if unknown:
        raise TypeError(f"unknown config {', '.join(unknown)}; known: {', '.join(defaults)}")
    return {**defaults, **overrides}


# MaxText's decoder-layer names (its ``get_remat_policy``): what its presets save.
_QKV = ("query_proj", "value_proj", "key_proj", "qkv_proj")
_MLP_IN = ("mlpwi", "mlpwi_0", "mlpwi_1")


def _save(*names: str) -> Callable[[tuple[str, ...]], Callable]:
    return lambda _model_names: jax.checkpoint_policies.save_only_these_names(*names)


def _offload(names: tuple[str, ...] | None) -> Callable[[tuple[str, ...]], Callable]:
    """Offload ``names`` (the model's own checkpoint names when None) to host memory, save nothing else."""
    return lambda model_names: jax.checkpoint_policies.save_and_offload_only_these_names(
        names_which_can_be_saved=[], names_which_can_be_offloaded=list(model_names if names is None else names),
        offload_src="device", offload_dst="pinned_host")


def _jax(name: str) -> Callable[[tuple[str, ...]], Callable]:
    return lambda _model_names: getattr(jax.checkpoint_policies, name)


# ``remat=`` name -> the JAX policy it is, given the checkpoint names the model tags.
REMAT_POLICIES: dict[str, Callable[[tuple[str, ...]], Callable]] = {
    # JAX's own (jax.checkpoint_policies)
    "nothing_saveable": _jax("nothing_saveable"),
    "dots_saveable": _jax("dots_saveable"),
    "dots_with_no_batch_dims_saveable": _jax("dots_with_no_batch_dims_saveable"),
    "everything_saveable": _jax("everything_saveable"),
    "save_and_offload_only_these_names": _offload(None),
    # MaxText's presets (remat_policy=...): "full" is jax.checkpoint's default, nothing saved
    "full": _jax("nothing_saveable"),
    "minimal": _save(*_QKV, "out_proj", *_MLP_IN, "mlpwo"),
    "minimal_with_context": _save(*_QKV, "out_proj", *_MLP_IN, "mlpwo", "context"),
    "save_dot_except_mlpwi": _save(*_QKV, "out_proj", "mlpwo"),
    "save_dot_except_mlp": _save(*_QKV, "out_proj"),
    "save_dot_with_context_except_mlp": _save(*_QKV, "context", "out_proj"),
    "save_qkv_proj": _save(*_QKV),
    "save_out_proj": _save("out_proj"),
    "minimal_offloaded": _offload((*_QKV, "out_proj", *_MLP_IN, "mlpwo")),
    "qkv_proj_offloaded": _offload(("query_proj", "value_proj", "key_proj")),
}
REMAT_SCOPES = ("layer", "step")


@dataclass(frozen=True)
class Remat:
    """A factory's ``remat=`` (None: no checkpointing, else a key of
    :data:`REMAT_POLICIES`) and ``remat_scope=``: ``"layer"`` checkpoints each
    block in the model library's own idiom, as MaxText and Flax users do;
    ``"step"`` wraps the whole loss in one ``jax.checkpoint``, where the
    backward re-runs the forward at once (measured on an H200: whole-loss
    ``nothing_saveable`` kept 0.99x the plain step's memory)."""

    name: str | None = None
    scope: str = "layer"
    names: tuple[str, ...] = ()  # the checkpoint names the model tags

    @classmethod
    def of(cls, name: str | None, scope: str, names: tuple[str, ...] = ()) -> Remat:
        """Validated; TypeError names the unknown policy or scope (as :func:`configure` does)."""
        if name is not None and name not in REMAT_POLICIES:
            raise TypeError(f"unknown remat {name!r}; known: None, {', '.join(REMAT_POLICIES)}")
        if scope not in REMAT_SCOPES:
            raise TypeError(f"unknown remat_scope {scope!r}; known: {', '.join(REMAT_SCOPES)}")
        return cls(name, scope, tuple(names))

    @property
    def per_layer(self) -> bool:
        return self.name is not None and self.scope == "layer"

    @property
    def policy(self) -> Callable | None:
        return None if self.name is None else REMAT_POLICIES[self.name](self.names)

    def layer(self, fn: Callable, prevent_cse: bool = True) -> Callable:
        """``fn`` (one block) under ``jax.checkpoint`` when checkpointing per layer;
        ``prevent_cse=False`` inside a scan, as JAX's documentation advises."""
        return jax.checkpoint(fn, policy=self.policy, prevent_cse=prevent_cse) if self.per_layer else fn

    def step(self, loss_fn: Callable) -> Callable:
        """``loss_fn`` under one ``jax.checkpoint`` when checkpointing the whole step."""
        return jax.checkpoint(loss_fn, policy=self.policy) if self.name is not None and self.scope == "step" \
            else loss_fn
