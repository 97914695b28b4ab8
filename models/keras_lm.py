"""keras-hub's decoder backbones (Llama, Gemma, GPT-2) as causal language models on
Keras 3's JAX backend, trained the way Keras documents for JAX: a pure loss over
the trainable variables through ``model.stateless_call``. Each is built from a
small config with weights from its own initializers (``keras.utils.set_random_seed``);
nothing is downloaded. keras-hub runs the layers in a Python loop (no scan) and
tags no value with ``checkpoint_name``. ``dropout`` > 0 trains with dropout
(``training=True``), whose masks come from a Keras ``SeedGenerator`` state in the
non-trainable variables.

``KERAS_BACKEND`` must be ``jax``: importing this module sets it unless Keras is
already imported, and refuses another backend.

``remat=`` takes every policy per layer and on the whole step (one ``jax.checkpoint``
around the loss). Per layer, each decoder block's ``call`` runs under
``jax.checkpoint(policy=...)``, its arrays traced and every other argument (``training``,
gpt2's ``use_causal_mask``, the ``None`` caches) closed over as a Python value, which is
what a JAX user of Keras writes: Keras's own idiom cannot say it. ``keras.RematScope``
(``mode="list_of_layers"``) runs a named layer under ``keras.remat``, which is
``jax.checkpoint(f)`` with no policy (nothing saved: no dots, no names, no offload), and it
traces every argument of ``call``: keras-hub's Llama and GPT-2 blocks then fail on
``if training`` in their ``Dropout`` (``TracerBoolConversionError``; Gemma's passed, at dropout 0).
That is Keras 3.15.1, the newest on PyPI in December 2026. The block runs in its own
``keras.StatelessScope`` inside the checkpoint, so the dropout seed state it advances comes
out as an output and is assigned back to the step's scope, and the recomputation draws the
same masks as the forward. keras-hub tags no ``checkpoint_name``, so the name presets
(MaxText's ``minimal`` ...) save nothing, like ``nothing_saveable``."""

from __future__ import annotations

import inspect
import os
import sys

os.environ.setdefault("KERAS_BACKEND", "jax")
# keras-hub imports TensorFlow where it is installed (its tokenizers and metrics), and a process that
# has imported TensorFlow segfaults in OR-Tools' CP-SAT; the JAX backend needs neither.
for _tf in ("tensorflow", "tensorflow_text"):
    sys.modules.setdefault(_tf, None)  # type: ignore[assignment]

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402

if keras.backend.backend() != "jax":
    raise ImportError(f"Keras runs on the {keras.backend.backend()} backend; set KERAS_BACKEND=jax "
                      "before Keras is imported")

import keras_hub  # noqa: E402

from .common import Remat, configure, rng  # noqa: E402

CONFIG = {"backbone": "llama", "layers": 2, "width": 32, "heads": 4, "kv_heads": 2, "hidden": 64, "seq": 16,
          "vocab": 64, "batch": 2, "dropout": 0.0, "seed": 0}


def backbone(c: dict) -> keras_hub.models.Backbone:
    """The keras-hub backbone ``c["backbone"]`` at config ``c``."""
    common = {"vocabulary_size": c["vocab"], "num_layers": c["layers"], "hidden_dim": c["width"],
              "intermediate_dim": c["hidden"], "dropout": c["dropout"]}
    if c["backbone"] == "llama":
        return keras_hub.models.LlamaBackbone(num_query_heads=c["heads"], num_key_value_heads=c["kv_heads"],
                                              **common)
    if c["backbone"] == "gemma":
        return keras_hub.models.GemmaBackbone(num_query_heads=c["heads"], num_key_value_heads=c["kv_heads"],
                                              head_dim=c["width"] // c["heads"], **common)
    if c["backbone"] == "gpt2":
        return keras_hub.models.GPT2Backbone(num_heads=c["heads"], max_sequence_length=c["seq"], **common)
    raise TypeError(f"unknown backbone {c['backbone']!r}; known: llama, gemma, gpt2")


CAUSAL_LM = {"llama": "LlamaCausalLM", "gemma": "GemmaCausalLM", "gpt2": "GPT2CausalLM"}


def checkpointed(block: keras.layers.Layer, policy):
    """``block.call`` under ``jax.checkpoint(policy=policy)``: the tensors among its arguments and
    the block's variables are the checkpoint's inputs; the other arguments (``training`` ...) stay
    Python values, closed over, so the block's ``if training`` sees a bool (module docstring)."""
    call = block.call
    signature = inspect.signature(call)

    def run(*args, **kwargs):
        given = signature.bind(*args, **kwargs).arguments
        tensors = {k: v for k, v in given.items() if keras.ops.is_tensor(v)}
        variables = block.trainable_variables + block.non_trainable_variables

        def pure(values, tensors):
            with keras.StatelessScope(state_mapping=list(zip(variables, values))) as scope:
                out = call(**{**given, **tensors})
            return out, [scope.get_current_value(v) for v in block.non_trainable_variables]

        out, state = jax.checkpoint(pure, policy=policy)([v.value for v in variables], tensors)
        for v, value in zip(block.non_trainable_variables, state):
            v.assign(value)  # into the step's StatelessScope: the dropout seed, advanced
        return out

    return run


def factory(remat: str | None = None, remat_scope: str = "layer", **overrides):
    """``(loss_fn, (trainable, non_trainable, tokens))`` at ``CONFIG`` updated with
    ``overrides``: the causal LM's trainable and non-trainable variable values,
    and ``batch`` sequences of ``seq + 1`` tokens."""
    c = configure(CONFIG, overrides)
    r = Remat.of(remat, remat_scope)
    keras.utils.set_random_seed(c["seed"])
    model = getattr(keras_hub.models, CAUSAL_LM[c["backbone"]])(backbone=backbone(c), preprocessor=None)
    if r.per_layer:
        for block in model.backbone.transformer_layers:
            block.call = checkpointed(block, r.policy)
    trainable = [v.value for v in model.trainable_variables]
    non_trainable = [v.value for v in model.non_trainable_variables]
    tokens = jnp.asarray(rng(c["seed"] + 1).integers(0, c["vocab"], (c["batch"], c["seq"] + 1), dtype=np.int32))
    training = c["dropout"] > 0

    def loss_fn(trainable, non_trainable, tokens):
        inputs = {"token_ids": tokens[:, :-1], "padding_mask": jnp.ones_like(tokens[:, :-1])}
        logits, _ = model.stateless_call(trainable, non_trainable, inputs, training=training)
        return keras.losses.sparse_categorical_crossentropy(tokens[:, 1:], logits, from_logits=True).mean()

    return r.step(loss_fn), (trainable, non_trainable, tokens)
