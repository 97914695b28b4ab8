"""Views are one buffer: a value tagged with ``checkpoint_name``, reshaped,
squeezed or converted to its own dtype is its source's buffer under XLA, so the
importer merges it into the source's node. A tagged step and an untagged one
have the same graph, peak and buffers; JAX's residual report (which lists a view
and its source apart) still matches value by value; plans and name policies
still apply."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.ad_checkpoint import checkpoint_name  # noqa: E402

from rematopt import PlanError, no_remat_plan, simulate, solve  # noqa: E402
from rematopt.jax import apply_plan, policy, policy_table, trace, trace_grad  # noqa: E402
from rematopt.reference import no_remat_peak  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
from jax_residuals import (assert_same_gradients, jax_residuals, residual_values, saved_residuals,  # noqa: E402
                          tanh_derivative_in_forward)
from models import mlp  # noqa: E402
from models.common import cross_entropy  # noqa: E402

MLP = {"layers": 3, "batch": 256}  # the 3-layer tanh MLP (256 x 256 activations)


def tagged(params, batch):
    """models.mlp's loss with each layer's pre-activation and activation named."""
    h, labels = batch
    for layer in params[:-1]:
        h = checkpoint_name(jnp.tanh(checkpoint_name(h @ layer["w"] + layer["b"], "proj")), "act")
    return cross_entropy(h @ params[-1]["w"] + params[-1]["b"], labels)


@pytest.fixture(scope="module")
def mlp_pair():
    fn, args = mlp.factory(**MLP)
    return fn, args, trace_grad(fn, *args), trace_grad(tagged, *args)


def test_a_tagged_step_has_the_untagged_steps_graph_and_peak(mlp_pair):
    """Before views were merged: 3,431,508 B tagged against 2,907,220 B untagged
    (+524,288 B: two 256 x 256 f32 buffers counted twice; JAX 0.10)."""
    _, _, plain, named = mlp_pair
    # JAX 0.11's step holds each tanh's derivative where 0.10's holds an add of the backward pass
    assert no_remat_peak(named) == no_remat_peak(plain) == (2_645_076 if tanh_derivative_in_forward() else 2_907_220)
    assert [v.op for v in named.nodes] == [v.op for v in plain.nodes] and named.edges == plain.edges
    assert sorted(v.extra["checkpoint_name"] for v in named.nodes if "checkpoint_name" in v.extra) == \
        ["act"] * 3 + ["proj"] * 3
    r_plain, r_named = plain.meta["residuals"], named.meta["residuals"]
    assert (r_named["buffers"], r_named["buffer_bytes"]) == (r_plain["buffers"], r_plain["buffer_bytes"])
    # JAX 0.10's vjp saves each tanh and its named view apart; 0.11's backward pass reads only the named one
    assert r_named["count"] == r_plain["count"] if tanh_derivative_in_forward() else r_named["count"] > r_plain["count"]


def test_jaxs_report_still_matches_value_by_value(mlp_pair):
    fn, args, plain, named = mlp_pair
    assert residual_values(named) == jax_residuals(tagged, args)
    assert residual_values(plain) == jax_residuals(fn, args)


def test_xla_gives_the_tagged_and_untagged_steps_the_same_memory(mlp_pair):
    fn, args, _, _ = mlp_pair
    temp = [jax.jit(jax.value_and_grad(f)).lower(*args).compile().memory_analysis().temp_size_in_bytes
            for f in (fn, tagged)]
    assert temp[0] == temp[1]


def test_plans_apply_to_the_tagged_step(mlp_pair):
    _, args, _, named = mlp_pair
    # 0.85: JAX 0.11's graph has no plan at 0.8 (its least is 2,122,836 B, 0.803 of its peak)
    sol = solve(named, "cpsat", budget_ratio=0.85, time_limit=3, workers=1)
    assert sol.has_plan and sol.replay.peak_bytes <= sol.budget < no_remat_peak(named)
    assert_same_gradients(tagged, apply_plan(tagged, named, sol.plan), args)


def test_a_name_the_backward_reads_before_it_is_left_to_recomputation(mlp_pair):
    """On JAX 0.10, tanh's derivative reads tanh's own output, not the named one: JAX saving
    'act' would still recompute the tanh, so the policy space leaves 'act' to
    remat, and a plan that keeps it is no name policy. JAX 0.11 computes the
    derivative in the forward pass from the same output; the backward pass reads
    the derivative and the named output, and 'act' is a name like any other."""
    _, args, _, named = mlp_pair
    acts = [v for v in named.nodes if v.extra.get("checkpoint_name") == "act"]
    early = tanh_derivative_in_forward()
    assert acts and all(bool(v.extra.get("read_before_name")) != early for v in acts)
    assert not any(v.extra.get("read_before_name") for v in named.nodes if v.extra.get("checkpoint_name") == "proj")
    if early:
        assert policy_table(named, no_remat_plan(named)) == {"act": "device", "proj": "remat"}
    else:
        with pytest.raises(PlanError, match="also reads before checkpoint_name tags it"):
            policy_table(named, no_remat_plan(named))
    sol = solve(named, "jax-names", budget_ratio=0.85, price=False)
    chosen = {n for n, fate in sol.plan.stats["policy"].items() if fate == "device"}
    assert sol.plan.stats["optimal_in"] in ("policy space", "all plans") and chosen == ({"act"} if early else {"proj"})
    pol = policy(named, sol.plan)
    saved = [r for r in saved_residuals(jax.checkpoint(tagged, policy=pol), *args)
             if not r.source.startswith("from the argument")]
    kept = sorted(v.bytes for v in named.nodes if v.extra.get("checkpoint_name") in chosen)
    assert sorted(r.bytes for r in saved) == kept and all(r.name in chosen for r in saved)
    assert_same_gradients(tagged, jax.checkpoint(tagged, policy=pol), args)


def test_views_merge_and_copies_stay():
    def f(x):
        y = jnp.sin(x)
        views = (y.reshape(4, 8), jnp.squeeze(y[None]), y.astype(jnp.float32), jnp.array(y, copy=True),
                 jax.device_put(y), jax.lax.stop_gradient(y), checkpoint_name(y, "n"))
        copies = (y.T, jax.lax.bitcast_convert_type(y, jnp.int32), jnp.broadcast_to(y, (2, 8, 4)))
        return views, copies

    g = trace(f, jnp.ones((8, 4)))
    ops = [v.op for v in g.nodes]
    assert ops == ["input", "sin", "transpose", "bitcast_convert_type", "broadcast_in_dim"]
    (sin,) = [v for v in g.nodes if v.op == "sin"]
    assert sin.extra["checkpoint_name"] == "n" and sin.output and sin.bytes == 8 * 4 * 4
    assert set(sin.extra["views"]) >= {"reshape", "squeeze", "copy", "device_put", "stop_gradient", "name"}
    assert g.meta["views"] == len(sin.extra["views"])


def test_a_second_name_on_a_named_value_stays_its_own_node():
    def loss(w, x):
        h = checkpoint_name(jnp.tanh(x @ w), "a")
        return jnp.sum(checkpoint_name(h, "b") ** 2)

    g = trace_grad(loss, jnp.ones((4, 4)), jnp.ones((2, 4)))
    assert sorted(v.extra["checkpoint_name"] for v in g.nodes if "checkpoint_name" in v.extra) == ["a", "b"]
    assert [v.op for v in g.nodes if v.extra.get("checkpoint_name") == "b"] == ["name"]
    assert simulate(g, no_remat_plan(g)).valid


def test_views_of_arguments_and_of_the_cotangent_apply():
    """A view of a parameter (reshaped weights) is the parameter's buffer; the
    planned gradient makes it again where the backward pass reads it."""
    def loss(w, x):
        h = jnp.tanh(x @ w.reshape(8, 8))
        return jnp.mean(checkpoint_name(h, "h").reshape(-1) ** 2)

    rng = np.random.default_rng(0)
    args = (jnp.asarray(rng.standard_normal(64), jnp.float32), jnp.asarray(rng.standard_normal((4, 8)), jnp.float32))
    g = trace_grad(loss, *args)
    assert "reshape" in g.nodes[0].extra["views"] and not any(v.op == "reshape" for v in g.nodes)
    assert residual_values(g) == jax_residuals(loss, args)
    # 0.9: at 0.8 JAX 0.11's graph (900 B, without 0.10's add of two cotangents) is below its working set
    for plan in (no_remat_plan(g), solve(g, "cpsat", budget_ratio=0.9, time_limit=5, workers=1).plan):
        assert_same_gradients(loss, apply_plan(loss, g, plan), args)

    @jax.custom_vjp
    def sum_sin(x):
        return jnp.sum(jnp.sin(x))

    sum_sin.defvjp(lambda x: (sum_sin(x), x), lambda x, ct: (jnp.reshape(ct, (1,)) * jnp.cos(x),))
    g = trace_grad(sum_sin, jnp.ones(1))  # the backward reshapes the loss cotangent, which is no node
    assert [v.op for v in g.nodes] == ["input", "sin", "reduce_sum", "cos", "mul"]
    assert_same_gradients(sum_sin, apply_plan(sum_sin, g, no_remat_plan(g)), (jnp.ones(1),))


@pytest.mark.parametrize("op,view", [
    (lambda x: checkpoint_name(x, "n"), True),
    (lambda x: x.reshape(64, 16, 16), True),
    (lambda x: x[:, None, :], True),
    (lambda x: jnp.array(x, copy=True), True),
    (lambda x: jax.device_put(x), True),
    (lambda x: jax.lax.stop_gradient(x), True),
    (lambda x: x.T, False),
    (lambda x: jax.lax.bitcast_convert_type(x, jnp.int32), False),
], ids=["name", "reshape", "unit_broadcast", "copy", "device_put", "stop_gradient", "transpose", "bitcast_convert"])
def test_what_merges_is_what_xla_makes_no_buffer_for(op, view):
    """XLA on CPU, x = a @ w then y = op(x), both read afterwards: a view leaves
    no instruction but a bitcast in the optimised HLO; the others leave a
    transpose, copy or bitcast-convert (in a fusion or not). The importer merges
    exactly the first kind."""
    a, w = jnp.ones((64, 128)), jnp.ones((128, 256))

    def f(a, w):
        x = a @ w
        y = op(x)
        return jnp.sum(y.astype(jnp.float32).reshape(-1)[:100] @ jnp.ones((100,))) + jnp.sum(jnp.tanh(x))

    hlo = jax.jit(f).lower(a, w).compile().as_text()
    kinds = {"transpose", "copy", "bitcast-convert"} & set(re.findall(r"= \S+ ([a-z-]+)\(", hlo))
    g = trace(lambda x: op(jnp.sin(x)), jnp.ones((64, 256)))
    assert (g.n == 2) == view  # input and sin: op merged into sin's node
    assert bool(kinds) == (not view), kinds
