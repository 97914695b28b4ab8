"""``remat=`` / ``remat_scope=`` on every factory in models/: each policy, per
layer in the library's own idiom and on the whole step, gives the plain step's
gradients and really checkpoints (a remat equation in the step's jaxpr); the
default (None) traces the very jaxpr it did before; bad names get a TypeError
naming them; and on CPU, under XLA's memory-minimizing scheduler, per-layer
checkpointing shrinks the compiled temp (XLA's default CPU scheduler undoes it,
issue 36)."""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import sys
from pathlib import Path

import pytest

from conftest import last_json

jax = pytest.importorskip("jax")
import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from models.common import REMAT_POLICIES, Remat  # noqa: E402

TINY = {"gpt": {"layers": 2, "width": 16, "heads": 2, "seq": 8, "vocab": 32},
        "gpt_scan": {"layers": 2, "width": 16, "heads": 2, "seq": 8, "vocab": 32},
        "mlp": {"layers": 3, "width": 16, "in_dim": 8, "batch": 4},
        "resnet": {"channels": 4, "image": 8, "batch": 2},
        "unet": {"channels": 4, "image": 8}}
LIBRARIES = {"flax_linen": "flax", "flax_nnx": "flax", "equinox_lm": "equinox", "keras_lm": "keras_hub"}
LIB_TINY = {"layers": 2, "width": 16, "heads": 2, "seq": 8, "vocab": 32}


def module(name):
    if name in LIBRARIES and importlib.util.find_spec(LIBRARIES[name]) is None:
        pytest.skip(f"{LIBRARIES[name]} is not installed; pip install -e '.[libraries]' installs it")
    return importlib.import_module(f"models.{name}")


def grads(fn, args):
    return jax.tree_util.tree_leaves(jax.jit(jax.grad(fn))(*args))


def max_error(a, b):
    return max(float(np.max(np.abs(np.asarray(x) - np.asarray(y)))) for x, y in zip(a, b))


def has_remat(fn, args) -> bool:
    """jax.checkpoint's equation (``remat2`` in jax 0.10, ``checkpoint`` in others) in the loss's jaxpr."""
    return re.search(r"\b(remat2?|checkpoint)\[", str(jax.make_jaxpr(fn)(*args))) is not None


@pytest.mark.parametrize("name", sorted(TINY))
@pytest.mark.parametrize("scope", ["layer", "step"])
def test_each_policy_keeps_the_gradients(name, scope):
    mod = module(name)
    fn, args = mod.factory(**TINY[name])
    assert not has_remat(fn, args)
    base = grads(fn, args)
    policies = sorted(REMAT_POLICIES) if name == "mlp" else ["dots_saveable"]
    for policy in policies:
        fn, args = mod.factory(remat=policy, remat_scope=scope, **TINY[name])
        assert has_remat(fn, args), (name, policy, scope)
        assert max_error(grads(fn, args), base) < 1e-6, (name, policy, scope)


@pytest.mark.parametrize("name", sorted(LIBRARIES))
def test_library_idioms_keep_the_gradients(name):
    """... on the plain step's arguments too: a policy is a candidate of --verify xla on those
    (equinox_lm kept its Remat in the module's pytree, so the plain arguments failed to combine)."""
    mod = module(name)
    fn, plain = mod.factory(**LIB_TINY)
    base = grads(fn, plain)
    for scope in ["layer", "step"] if name == "keras_lm" else ["layer"]:
        fn, args = mod.factory(remat="dots_with_no_batch_dims_saveable", remat_scope=scope, **LIB_TINY)
        assert jax.tree_util.tree_structure(args) == jax.tree_util.tree_structure(plain), (name, scope)
        assert has_remat(fn, plain), (name, scope)
        assert max_error(grads(fn, plain), base) < 1e-5, (name, scope)


KERAS_TINY = {**LIB_TINY, "kv_heads": 1, "hidden": 32, "dropout": 0.1}


def count_remat(fn, args) -> int:
    return len(re.findall(r"\b(remat2?|checkpoint)\[", str(jax.make_jaxpr(fn)(*args))))


@pytest.mark.parametrize("backbone", ["llama", "gemma", "gpt2"])
def test_keras_blocks_keep_the_gradients_under_every_policy(backbone):
    """Per layer, a checkpoint around each keras-hub decoder block, under every policy, with dropout
    on (``training=True``: the blocks' ``if training`` sees a bool, and the recomputation draws the
    forward's masks, else the gradients would differ)."""
    mod = module("keras_lm")
    plain, args = mod.factory(backbone=backbone, **KERAS_TINY)
    assert count_remat(plain, args) == 0
    steps = {name: mod.factory(remat=name, backbone=backbone, **KERAS_TINY)[0] for name in sorted(REMAT_POLICIES)}
    assert count_remat(steps["dots_saveable"], args) == KERAS_TINY["layers"]
    # one program for the plain step and every policy's (at XLA's backend optimization level 0, as the suite
    # compiles: conftest.FAST_COMPILE): 14 s of CPU for llama, where a default compile per policy took 4 s each
    every = jax.jit(lambda *a: [jax.grad(f)(*a) for f in (plain, *steps.values())])
    base, *got = every(*args)
    base = jax.tree_util.tree_leaves(base)
    assert max(float(np.max(np.abs(np.asarray(g)))) for g in base) > 1e-3  # not a vanishing gradient
    for name, g in zip(steps, got):
        assert max_error(jax.tree_util.tree_leaves(g), base) < 1e-5, (backbone, name)


def test_default_traces_the_jaxpr_it_did_before():
    """remat=None adds nothing: the jaxpr is the one of the blocks written out by hand."""
    from models import gpt
    from models.common import cross_entropy, layer_norm

    fn, args = gpt.factory(**TINY["gpt"])

    def by_hand(params, tokens):
        x = params["embed"][tokens[:, :-1]] + params["pos"][: tokens.shape[1] - 1]
        for p in params["blocks"]:
            x = gpt.block(x, p, TINY["gpt"]["heads"])
        return cross_entropy(layer_norm(x, params["ln_f"]) @ params["embed"].T, tokens[:, 1:])

    assert str(jax.make_jaxpr(jax.grad(fn))(*args)) == str(jax.make_jaxpr(jax.grad(by_hand))(*args))


@pytest.mark.parametrize("bad", [{"remat": "dots"}, {"remat_scope": "block"}])
def test_bad_names_are_named(bad):
    from models import gpt

    with pytest.raises(TypeError, match=repr(next(iter(bad.values())))):
        gpt.factory(**{"remat": "nothing_saveable", **bad})
    with pytest.raises(TypeError, match="known"):
        Remat.of(bad.get("remat", "full"), bad.get("remat_scope", "layer"))


TEMPS = """
import json, sys
import jax
sys.path.insert(0, {root!r})
from models import gpt
out = {{}}
for remat in (None, "nothing_saveable", "dots_saveable"):
    fn, args = gpt.factory(remat=remat, layers=4, width=64, heads=4, seq=64, batch=4, vocab=512)
    out[str(remat)] = jax.jit(jax.value_and_grad(fn)).lower(*args).compile().memory_analysis().temp_size_in_bytes
print(json.dumps(out))
"""


def compiled_temps(xla_flags: str, code: str = TEMPS) -> dict:
    env = {**os.environ, "XLA_FLAGS": xla_flags, "JAX_PLATFORMS": "cpu"}
    return last_json(code.format(root=str(ROOT)), env)


def test_per_layer_remat_shrinks_the_cpu_temp_under_the_memory_minimizing_scheduler():
    temps = compiled_temps("--xla_cpu_enable_concurrency_optimized_scheduler=false")
    assert temps["nothing_saveable"] < temps["None"] and temps["dots_saveable"] < temps["None"], temps
    assert temps["nothing_saveable"] != temps["dots_saveable"], temps


KERAS_TEMPS = """
import json, sys
import jax
sys.path.insert(0, {root!r})
from models import keras_lm
out = {{}}
for backbone in ("llama", "gemma", "gpt2"):
    for remat in (None, "nothing_saveable"):
        fn, args = keras_lm.factory(backbone=backbone, remat=remat, layers=3, width=16, heads=2, kv_heads=1,
                                    hidden=32, seq=64, vocab=32, batch=2)
        analysis = jax.jit(jax.value_and_grad(fn)).lower(*args).compile().memory_analysis()
        out[backbone + " " + str(remat)] = analysis.temp_size_in_bytes
print(json.dumps(out))
"""


def test_keras_per_layer_remat_shrinks_the_cpu_temp_under_the_memory_minimizing_scheduler():
    """At sequence 64 over width 16 activations dominate: per-layer ``nothing_saveable`` measured
    0.43x (llama), 0.48x (gemma) and 0.76x (gpt2) the plain step's temp."""
    module("keras_lm")
    temps = compiled_temps("--xla_cpu_enable_concurrency_optimized_scheduler=false", KERAS_TEMPS)
    for backbone in ("llama", "gemma", "gpt2"):
        assert temps[f"{backbone} nothing_saveable"] < 0.9 * temps[f"{backbone} None"], temps
