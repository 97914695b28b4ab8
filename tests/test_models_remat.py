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
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

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
    for scope in ["step"] if name == "keras_lm" else ["layer"]:
        fn, args = mod.factory(remat="dots_with_no_batch_dims_saveable", remat_scope=scope, **LIB_TINY)
        assert jax.tree_util.tree_structure(args) == jax.tree_util.tree_structure(plain), (name, scope)
        assert has_remat(fn, plain), (name, scope)
        assert max_error(grads(fn, plain), base) < 1e-5, (name, scope)


def test_keras_refuses_per_layer_with_the_reason():
    mod = module("keras_lm")
    with pytest.raises(TypeError, match="RematScope"):
        mod.factory(remat="nothing_saveable", **LIB_TINY)


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


def compiled_temps(xla_flags: str) -> dict:
    env = {**os.environ, "XLA_FLAGS": xla_flags, "JAX_PLATFORMS": "cpu"}
    run = subprocess.run([sys.executable, "-c", TEMPS.format(root=str(ROOT))], capture_output=True, text=True,
                         env=env, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(run.stdout.splitlines()[-1])


def test_per_layer_remat_shrinks_the_cpu_temp_under_the_memory_minimizing_scheduler():
    temps = compiled_temps("--xla_cpu_enable_concurrency_optimized_scheduler=false")
    assert temps["nothing_saveable"] < temps["None"] and temps["dots_saveable"] < temps["None"], temps
    assert temps["nothing_saveable"] != temps["dots_saveable"], temps
