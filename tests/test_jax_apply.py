"""Plans back into JAX: residual fates read off plan events, and loss
functions whose gradients equal the original's while saving, offloading and
recomputing exactly what the plan says (checked with JAX's own saved-residual
report)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

jax = pytest.importorskip("jax")
import numpy as np  # noqa: E402

from rematopt import ImportFailure, no_remat_plan  # noqa: E402
from rematopt.jax import apply_plan, residual_fates, trace_grad  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from jax_residuals import assert_same_gradients, recompute_plan, saved, tanh_derivative_in_forward  # noqa: E402
from models import gpt, mlp  # noqa: E402

MLP = {"layers": 3, "width": 32, "in_dim": 16, "batch": 8}
GPT = {"layers": 1, "width": 16, "heads": 2, "seq": 4, "vocab": 16}


def residual_nodes(g):
    return {v.id for v in g.nodes if v.phase == "forward"
            and any(g.nodes[s].phase == "backward" for s in g.succs[v.id])}


@pytest.fixture(scope="module")
def mlp_step():
    fn, args = mlp.factory(**MLP)
    return fn, args, trace_grad(fn, *args)


def test_no_remat_plan_keeps_every_residual(mlp_step):
    fn, args, g = mlp_step
    fates = residual_fates(g, no_remat_plan(g))
    assert fates.kept == residual_nodes(g) and not fates.offloaded and not fates.recomputed
    planned = apply_plan(fn, g, no_remat_plan(g))
    assert_same_gradients(fn, planned, args)
    assert saved(planned, args) == (sorted(g.nodes[i].bytes for i in residual_nodes(g)), [])


def test_recomputing_the_tanh_outputs_saves_their_inputs_instead(mlp_step):
    fn, args, g = mlp_step
    tanhs = {v.id for v in g.nodes if v.op == "tanh" and v.phase == "forward"}
    plan = recompute_plan(g, recompute=tanhs)
    fates = residual_fates(g, plan)
    assert fates.recomputed == tanhs
    # recomputing tanh(z) reads z, which the plan kept resident: z crosses instead
    zs = {p for t in tanhs for p in g.preds[t]}
    assert fates.kept == (residual_nodes(g) - tanhs) | zs
    planned = apply_plan(fn, g, plan)
    assert_same_gradients(fn, planned, args)
    assert saved(planned, args) == (sorted(g.nodes[i].bytes for i in fates.kept), [])


def test_recompute_everything_saves_only_arguments(mlp_step):
    fn, args, g = mlp_step
    every = {v.id for v in g.nodes if v.phase == "forward" and not v.output}
    plan = recompute_plan(g, recompute=every)
    fates = residual_fates(g, plan)
    assert not fates.kept and residual_nodes(g) & every <= fates.recomputed <= every
    planned = apply_plan(fn, g, plan)
    assert_same_gradients(fn, planned, args)
    assert saved(planned, args) == ([], [])


def test_offloaded_residuals_go_to_host_memory(mlp_step):
    fn, args, g = mlp_step
    res = sorted(residual_nodes(g))
    off = set(res[::2])
    plan = recompute_plan(g, offload=off)
    fates = residual_fates(g, plan)
    assert fates.offloaded == off and fates.kept == set(res) - off
    planned = apply_plan(fn, g, plan)
    assert_same_gradients(fn, planned, args)
    assert saved(planned, args) == (sorted(g.nodes[i].bytes for i in fates.kept),
                                    sorted(g.nodes[i].bytes for i in off))


def test_gpt_gradients_match_under_a_mixed_plan():
    fn, args = gpt.factory(**GPT)
    g = trace_grad(fn, *args, fuse=True)
    res = sorted(residual_nodes(g))
    recompute = {i for i in res[1::3] if g.nodes[i].recomputable}
    plan = recompute_plan(g, recompute=recompute, offload=set(res[2::3]) - recompute)
    planned = apply_plan(fn, g, plan)
    assert_same_gradients(fn, planned, args)
    fates = residual_fates(g, plan)
    dev, host = saved(planned, args)
    assert len(dev) == len(fates.kept) and len(host) == len(fates.offloaded) > 0


def test_planner_plans_apply_when_the_planner_is_there(mlp_step):
    from rematopt import PlannerError, solve

    fn, args, g = mlp_step
    try:
        sol = solve(g, "greedy", budget_ratio=0.7)
    except PlannerError as e:
        pytest.skip(f"greedy planner not available: {e}")
    fates = residual_fates(g, sol.plan)
    assert fates.recomputed  # a 0.7 budget forces recomputation
    assert_same_gradients(fn, apply_plan(fn, g, sol.plan), args)


def test_graph_of_another_function_is_refused(mlp_step):
    fn, args, g = mlp_step
    other_fn, other_args = mlp.factory(**{**MLP, "layers": 2})
    planned = apply_plan(other_fn, g, no_remat_plan(g))
    with pytest.raises(ImportFailure, match="nodes"):
        planned(*other_args)


def test_an_invalid_plan_is_refused(mlp_step):
    from rematopt import Plan, PlanError

    fn, _, g = mlp_step
    with pytest.raises(PlanError, match="invalid: end of plan: compute node .* was never computed"):
        apply_plan(fn, g, Plan.from_events(g.name, "bad", []))


def test_a_graph_without_phases_is_refused():
    from rematopt import PlanError
    from rematopt.jax import trace

    g = trace(lambda x: x * 2.0, np.ones(3, np.float32))
    with pytest.raises(PlanError, match="no backward phase"):
        residual_fates(g, no_remat_plan(g))


def test_a_scan_not_unrolled_is_one_node_whose_stacked_residuals_cross_together():
    def loss(ws, x):
        h, _ = jax.lax.scan(lambda h, w: (jax.numpy.tanh(h @ w), None), x, ws)
        return jax.numpy.sum(h ** 2)

    ws = np.random.default_rng(0).standard_normal((3, 8, 8)).astype(np.float32) * 0.3
    args = (ws, np.ones((4, 8), np.float32))
    g = trace_grad(loss, *args, unroll=False)
    (scan,) = [v for v in g.nodes if v.op == "scan" and v.phase == "forward"]
    assert scan.extra["residual_outputs"] and scan.id in residual_nodes(g)
    others = {i for i in residual_nodes(g) if i != scan.id}
    plan = recompute_plan(g, recompute=others)
    fates = residual_fates(g, plan)
    assert fates.kept == {scan.id} and fates.recomputed == others
    planned = apply_plan(loss, g, plan)
    assert_same_gradients(loss, planned, args)
    # saved: the stacked residuals (read by the backward scan) and the final
    # carry (read by the recomputation of h ** 2's derivative): all its outputs, four
    # (three on JAX 0.11, whose backward scan reads tanh's derivative, not its output)
    assert saved(planned, args) == (sorted(scan.extra["out_bytes"]), [])
    assert len(scan.extra["out_bytes"]) == (3 if tanh_derivative_in_forward() else 4)


def scaled_loss(params, batch, *, scale, shift=0.0):
    """A loss with a pytree batch and keyword arguments, as users write them."""
    h = jax.numpy.tanh(batch["x"] @ params["w"] + params["b"]) * scale["s"]
    return jax.numpy.mean((h - batch["y"]) ** 2) + shift


def scaled_args():
    rng = np.random.default_rng(0)
    params = {"w": rng.standard_normal((6, 5)).astype(np.float32), "b": np.zeros(5, np.float32)}
    batch = {"x": rng.standard_normal((4, 6)).astype(np.float32), "y": rng.standard_normal((4, 5)).astype(np.float32)}
    return params, batch, {"scale": {"s": np.float32(0.5)}, "shift": np.float32(1.0)}


@pytest.mark.parametrize("argnums", [0, (0, 1)])
def test_keyword_arguments_pytrees_and_argnums_differentiate_as_jax_grad_does(argnums):
    params, batch, kw = scaled_args()
    g = trace_grad(scaled_loss, params, batch, argnums=argnums, kwargs=kw)
    assert [v.name for v in g.nodes if v.is_input][-2:] == ["kwargs['scale']['s']", "kwargs['shift']"]
    tanhs = {v.id for v in g.nodes if v.op == "tanh" and v.phase == "forward"}
    planned = apply_plan(scaled_loss, g, recompute_plan(g, recompute=tanhs))
    want = jax.grad(scaled_loss, argnums=argnums)(params, batch, **kw)
    got = jax.jit(jax.grad(planned, argnums=argnums))(params, batch, **kw)
    assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(want)
    for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert float(planned(params, batch, **kw)) == pytest.approx(float(scaled_loss(params, batch, **kw)), rel=1e-6)


def test_differentiating_an_argument_outside_argnums_is_refused_not_zero():
    from rematopt import PlanError

    params, batch, kw = scaled_args()
    g = trace_grad(scaled_loss, params, batch, kwargs=kw)
    planned = apply_plan(scaled_loss, g, no_remat_plan(g))
    with pytest.raises(PlanError, match=r"args\[1\]\['x'\] is differentiated.*argnums \(0,\)"):
        jax.grad(planned, argnums=1)(params, batch, **kw)
    with pytest.raises(PlanError, match=r"kwargs\['shift'\] is differentiated"):
        jax.grad(lambda shift: planned(params, batch, scale=kw["scale"], shift=shift))(kw["shift"])
    with pytest.raises(ImportFailure, match="nodes"):  # the graph was traced with both keyword arguments
        planned(params, batch, scale=kw["scale"])
