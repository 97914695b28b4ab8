"""Training steps of models built from the JAX libraries' own layers (models/:
Flax linen with ``nn.scan``, Flax nnx with ``nnx.scan``, equinox with a scanned
``filter_vmap`` stack, keras-hub's Llama, Gemma and GPT-2 through
``stateless_call``), from trace to plan and back: residuals exactly JAX's, a
cpsat plan at 0.7 that replays, ``apply_plan`` gradients equal to the plain
step's, and the name-policy path (or the message where nothing is named).

A library that is not installed skips its models with the reason; the
``libraries`` extra (``pip install -e ".[libraries]"``) installs them all.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

import pytest

jax = pytest.importorskip("jax")
import numpy as np  # noqa: E402

from rematopt import simulate, solve  # noqa: E402
from rematopt.errors import NotApplicable  # noqa: E402
from rematopt.importers.jaxpr.unroll import unroll  # noqa: E402
from rematopt.jax import apply_plan, policy, residual_fates, trace_grad  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
from jax_residuals import jax_residuals, residual_values, residuals_by_node, saved_residuals  # noqa: E402

SMALL = {"layers": 2, "width": 16, "heads": 2, "seq": 8, "vocab": 32}
# name -> (module, library it needs, config overrides, scanned, tags checkpoint names)
MODELS = {
    "flax_linen": ("flax_linen", "flax", SMALL, True, True),
    "flax_nnx": ("flax_nnx", "flax", SMALL, True, True),
    "equinox": ("equinox_lm", "equinox", SMALL, True, False),
    "keras_llama": ("keras_lm", "keras_hub", {**SMALL, "backbone": "llama", "hidden": 32, "kv_heads": 1}, False,
                    False),
    "keras_gemma": ("keras_lm", "keras_hub", {**SMALL, "backbone": "gemma", "hidden": 32, "kv_heads": 1}, False,
                    False),
    "keras_gpt2": ("keras_lm", "keras_hub", {**SMALL, "backbone": "gpt2", "hidden": 32, "dropout": 0.1}, False,
                   False),
}


def factory(name):
    module, library, config, _, _ = MODELS[name]
    if importlib.util.find_spec(library) is None:  # found, not imported: Keras picks its backend on import
        pytest.skip(f"{library} is not installed; pip install -e '.[libraries]' installs it")
    return importlib.import_module(f"models.{module}").factory(**config)


@pytest.fixture(scope="module", params=sorted(MODELS))
def step(request):
    fn, args = factory(request.param)
    return request.param, fn, args, trace_grad(fn, *args, name=request.param)


PLAIN: dict = {}


def assert_plain_gradients(name, fn, args, other):
    """``other``'s loss and gradients are the plain step's (compiled once per model)."""
    if name not in PLAIN:
        PLAIN[name] = jax.jit(jax.value_and_grad(fn))(*args)
    (want_loss, want), (loss, got) = PLAIN[name], jax.jit(jax.value_and_grad(other))(*args)
    assert float(loss) == pytest.approx(float(want_loss), rel=1e-6)
    for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module", params=sorted(m for m in MODELS if MODELS[m][3]))
def scanned_step(request):
    fn, args = factory(request.param)
    return request.param, fn, args, trace_grad(fn, *args, name=request.param)


def test_residuals_are_jaxs_for_the_step_the_graph_is_of(step):
    name, fn, args, g = step
    unrolled = unroll(fn, args)
    assert (unrolled is not None) == MODELS[name][3], "scanned exactly where the library scans"
    fn1, args1 = (unrolled.fn, unrolled.args) if unrolled else (fn, args)
    expected = jax_residuals(fn1, args1)
    assert residual_values(g) == expected
    assert g.meta["residuals"]["count"] == len(expected)


def test_a_scanned_steps_residuals_differ_from_jaxs_only_by_what_jax_hoists_out_of_the_loop(scanned_step):
    """JAX saves a loop-invariant residual of the scanned body (the causal mask)
    once, outside the loop; the unrolled graph has one per iteration. With H the
    hoisted bytes and L the layers: the graph's per-iteration residuals are JAX's
    stacked ones plus L*H, and its others are JAX's others minus H."""
    name, fn, args, g = scanned_step
    layers = MODELS[name][2]["layers"]
    report = [r for r in saved_residuals(lambda p: fn(p, *args[1:]), args[0])
              if not r.source.startswith(("from the argument", "from a literal", "from a constant"))]
    stacked = sum(r.bytes for r in report if r.source.startswith("output of scan"))
    other = sum(r.bytes for r in report) - stacked
    in_loop = sum(b for i, b in residuals_by_node(g) if "iteration" in g.nodes[i].extra)
    outside = sum(b for i, b in residuals_by_node(g) if "iteration" not in g.nodes[i].extra)
    hoisted = other - outside
    assert hoisted >= 0 and in_loop - stacked == layers * hoisted


def test_a_cpsat_plan_at_0_7_replays_and_applies_with_the_plain_gradients(step):
    name, fn, args, g = step
    sol = solve(g, "cpsat", budget_ratio=0.7, time_limit=3, workers=1)
    assert sol.has_plan and sol.replay.valid and sol.replay.peak_bytes <= sol.budget
    assert simulate(g, sol.plan).peak_bytes == sol.replay.peak_bytes
    assert residual_fates(g, sol.plan).recomputed, "0.7 of the no-remat peak needs recomputation"
    assert_plain_gradients(name, fn, args, apply_plan(fn, g, sol.plan))


def test_the_name_policy_path_or_a_message_naming_what_to_tag(step):
    name, fn, args, g = step
    if not MODELS[name][4]:
        with pytest.raises(NotApplicable, match=r"no value carries a checkpoint_name.*checkpoint_name\(x, ") as e:
            solve(g, "jax-names", budget_ratio=0.8, price=False)
        first_matmul = next(v.extra["name_stack"] for v in g.nodes if v.op == "dot_general")
        assert "\n" not in str(e.value) and first_matmul.split("/")[0] in str(e.value)
        return
    sol = solve(g, "jax-names", budget_ratio=0.8, price=False)
    assert sol.plan.stats["optimal_in"] in ("policy space", "all plans")  # proven over the name policies at least
    pol = policy(g, sol.plan)
    fates = residual_fates(g, sol.plan)
    kept_named = sum(g.nodes[i].bytes for i in fates.kept if "checkpoint_name" in g.nodes[i].extra)
    # JAX saves what the plan keeps (its report names them in the program the graph is of, unrolled:
    # under a scan they would be its stacked outputs)
    unrolled = unroll(fn, args)
    fn1, args1 = (unrolled.fn, unrolled.args) if unrolled else (fn, args)
    saved = saved_residuals(jax.checkpoint(lambda p: fn1(p, *args1[1:]), policy=pol), args1[0])
    assert sum(r.bytes for r in saved if r.name) == kept_named > 0
    assert_plain_gradients(name, fn, args, jax.checkpoint(fn, policy=pol))
