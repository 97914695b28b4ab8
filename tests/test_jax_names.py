"""checkpoint_name policies: names in the graph, the jax-names planner against
exhaustive enumeration, the plan a policy implies against what JAX saves under
that policy, and the exported policy applied in a user's own step."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.ad_checkpoint import checkpoint_name  # noqa: E402

from rematopt import Plan, load, simulate, solve  # noqa: E402
from rematopt.exporters.checkpoint_names import policy_source  # noqa: E402
from rematopt.jax import policy, policy_table, residual_fates, trace_grad  # noqa: E402
from rematopt.planners.policies import names as jax_names  # noqa: E402
from rematopt.planners.policies.space import FATES, Space, policy_plan  # noqa: E402
from rematopt.reference import no_remat_peak, pinned_bound  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
from jax_residuals import saved_residuals, tanh_derivative_in_forward  # noqa: E402
from models import gpt  # noqa: E402

GPT = {"layers": 2, "width": 16, "heads": 2, "seq": 8, "vocab": 32}


def block_loss(params, x):
    """A user's two-layer residual MLP, named as MaxText names its MLP."""
    for p in params:
        x = checkpoint_name(x, "decoder_layer_input")
        h = jnp.tanh(checkpoint_name(x @ p["wi"], "mlpwi"))
        x = x + checkpoint_name(h @ p["wo"], "mlpwo")
    return jnp.mean(jnp.sin(x) ** 2)


def block_args(layers=2, width=8, hidden=24, batch=32):
    rng = np.random.default_rng(0)
    params = [{"wi": jnp.asarray(rng.standard_normal((width, hidden), np.float32) / width ** 0.5),
               "wo": jnp.asarray(rng.standard_normal((hidden, width), np.float32) / hidden ** 0.5)}
              for _ in range(layers)]
    return params, jnp.asarray(rng.standard_normal((batch, width), np.float32))


@pytest.fixture(scope="module")
def block_graph():
    return trace_grad(block_loss, *block_args(), name="blocks")


def in_policies(g, sol) -> str:
    """jax-names' verdict over the policy space (what ``brute_force`` searches):
    ``optimal_in`` / ``infeasible_in`` name it, and the status says OPTIMAL
    only where no plan at all can do better: a policy plan that recomputes
    nothing or peaks at the pinned values' bound."""
    st, r = sol.plan.stats, sol.replay
    if sol.status == "OPTIMAL":
        assert st["optimal_in"] == "all plans"
        assert r.compute_cost == r.base_cost or r.peak_bytes == pinned_bound(g, st["offload"])
    if st.get("optimal_in"):
        assert sol.status in ("OPTIMAL", "FEASIBLE") and st["optimal_in"] in ("policy space", "all plans")
        return "OPTIMAL"
    if st.get("infeasible_in"):
        assert sol.status == "UNKNOWN" and st["infeasible_in"] == "policy space"
        return "INFEASIBLE"
    return sol.status


def brute_force(space, budget, offload, objective="overhead"):
    """The best figures over every policy: (cost, transfer, peak) or (peak, cost)."""
    fates = FATES if offload else ("device", "remat")
    best = None
    for combo in itertools.product(fates, repeat=len(space.keys)):
        p = policy_plan(space, dict(zip(space.keys, combo)), budget)
        s = p.stats
        if budget is not None and s["peak_bytes"] > budget:
            continue
        key = ((s["compute_cost"], s["transfer_bytes"], s["peak_bytes"]) if objective == "overhead"
               else (s["peak_bytes"], s["compute_cost"]))
        best = key if best is None or key < best else best
    return best


def test_nodes_record_their_checkpoint_name_and_keep_it_on_a_round_trip(block_graph, tmp_path):
    named = [(v.extra["checkpoint_name"], v.phase) for v in block_graph.nodes if "checkpoint_name" in v.extra]
    assert sorted(named) == sorted([(n, "forward") for n in ("decoder_layer_input", "mlpwi", "mlpwo")] * 2)
    block_graph.save(tmp_path / "g.json")
    again = load(tmp_path / "g.json")
    assert [v.extra.get("checkpoint_name") for v in again.nodes] == [v.extra.get("checkpoint_name")
                                                                      for v in block_graph.nodes]


def test_gpt_names_the_values_maxtext_names():
    fn, args = gpt.factory(**GPT)
    g = trace_grad(fn, *args)
    names = [v.extra["checkpoint_name"] for v in g.nodes if "checkpoint_name" in v.extra]
    assert sorted(set(names)) == ["decoder_layer_input", "key_proj", "mlpwi", "mlpwo", "out_proj",
                                  "query_proj", "value_proj"]
    assert all(names.count(n) == GPT["layers"] for n in set(names))


@pytest.mark.parametrize("per_layer", [False, True])
@pytest.mark.parametrize("offload", [False, True])
@pytest.mark.parametrize("ratio", [1.0, 0.9, 0.8, 0.7, 0.6])
def test_enumeration_finds_the_exhaustive_optimum(block_graph, per_layer, offload, ratio):
    budget = int(ratio * no_remat_peak(block_graph))
    space = Space(block_graph, per_layer)
    best = brute_force(space, budget, offload)
    sol = solve(block_graph, "jax-names", budget=budget, per_layer=per_layer, offload=offload, price=False,
                check_budget=False)
    assert sol.plan.stats["search"] == "enumeration"
    if best is None:
        assert in_policies(block_graph, sol) == "INFEASIBLE" and sol.status == "UNKNOWN" and sol.replay is None
        return
    assert in_policies(block_graph, sol) == "OPTIMAL"
    r = sol.replay
    assert (r.compute_cost, r.transfer_bytes, r.peak_bytes) == best


@pytest.mark.parametrize("offload", [False, True])
@pytest.mark.parametrize("ratio", [0.9, 0.8, 0.6])
@pytest.mark.parametrize("enumerate_max", [0, 4])  # 4: the global optimum (enumerated) is the incumbent
def test_cpsat_over_names_finds_the_exhaustive_optimum(block_graph, monkeypatch, offload, ratio, enumerate_max):
    monkeypatch.setattr(jax_names, "ENUMERATE_MAX", enumerate_max)
    budget = int(ratio * no_remat_peak(block_graph))
    best = brute_force(Space(block_graph, True), budget, offload)
    sol = solve(block_graph, "jax-names", budget=budget, per_layer=True, offload=offload, price=False,
                time_limit=20, workers=1, check_budget=False)
    assert sol.plan.stats["search"] == "cpsat"
    if best is None:
        assert in_policies(block_graph, sol) == "INFEASIBLE"
        return
    assert in_policies(block_graph, sol) == "OPTIMAL" and sol.replay.peak_bytes <= budget
    assert sol.replay.compute_cost == best[0]
    assert sol.plan.stats["best_bound"] <= sol.replay.overhead + 1e-12


def test_least_peak_objective_matches_enumeration(block_graph, monkeypatch):
    space = Space(block_graph, True)
    best = brute_force(space, None, True, objective="peak")
    sol = solve(block_graph, "jax-names", per_layer=True, offload=True, objective="peak", price=False)
    assert in_policies(block_graph, sol) == "OPTIMAL" and (sol.replay.peak_bytes, sol.replay.compute_cost) == best
    monkeypatch.setattr(jax_names, "ENUMERATE_MAX", 0)
    by_cpsat = solve(block_graph, "jax-names", per_layer=True, offload=True, objective="peak", price=False,
                     time_limit=20, workers=1)
    assert in_policies(block_graph, by_cpsat) == "OPTIMAL" and by_cpsat.replay.peak_bytes == best[0]


def test_the_planner_reports_the_unconstrained_cpsat_plan_beside_the_policy():
    one_layer = trace_grad(block_loss, *block_args(layers=1, width=4, hidden=8, batch=16))
    sol = solve(one_layer, "jax-names", budget_ratio=1.0, time_limit=5, workers=1)
    s = sol.plan.stats
    assert s["cpsat_status"] in ("OPTIMAL", "FEASIBLE")
    assert s["cpsat_bound"] <= sol.replay.overhead + 1e-12  # no policy beats the unconstrained bound
    assert s["price_of_policy"] == pytest.approx(sol.replay.overhead - s["cpsat_overhead"])


def jax_saved(fn, args, pol):
    """(named device residuals as sorted (name, bytes), host residual sizes, other residuals)
    of ``jax.checkpoint(fn, policy=pol)``; arguments excluded."""
    named, host, other = [], [], []
    for r in saved_residuals(jax.checkpoint(fn, policy=pol), *args):
        if r.host:
            host.append(r.bytes)
        elif r.name is not None:
            named.append((r.name, r.bytes))
        elif not r.source.startswith("from the argument"):
            other.append(r.source)
    return sorted(named), sorted(host), other


def plan_saved(g, plan):
    fates = residual_fates(g, plan)
    assert all("checkpoint_name" in g.nodes[i].extra for i in fates.saved if g.nodes[i].phase == "forward")
    device = sorted((g.nodes[i].extra["checkpoint_name"], g.nodes[i].bytes) for i in fates.kept)
    return device, sorted(g.nodes[i].bytes for i in fates.offloaded)


@pytest.mark.parametrize("fates", [
    {"decoder_layer_input": "device", "mlpwi": "remat", "mlpwo": "device"},
    {"decoder_layer_input": "remat", "mlpwi": "device", "mlpwo": "remat"},
    {"decoder_layer_input": "offload", "mlpwi": "device", "mlpwo": "offload"},
    {"decoder_layer_input": "remat", "mlpwi": "remat", "mlpwo": "remat"},
])
def test_the_plan_a_policy_implies_saves_what_jax_saves_under_it(block_graph, fates):
    plan = policy_plan(Space(block_graph, False), fates, None)
    assert simulate(block_graph, plan).valid
    device, host = plan_saved(block_graph, plan)
    named, jax_host, other = jax_saved(block_loss, block_args(), policy(block_graph, plan))
    assert (named, jax_host, other) == (device, host, [])


@pytest.mark.parametrize("ratio,offload", [(0.8, False), (0.6, True)])
def test_an_exported_policy_in_a_users_gpt_step_saves_its_residuals_and_keeps_gradients(ratio, offload):
    fn, args = gpt.factory(**GPT)
    g = trace_grad(fn, *args)
    if offload and tanh_derivative_in_forward():  # JAX 0.11 saves GELU's tanh derivative, unnamed: at 0.6 no name
        ratio = 0.65                               # policy fits (proven), at 0.65 the same policy as 0.10's at 0.6
    sol = solve(g, "jax-names", budget_ratio=ratio, offload=offload, price=False)
    assert in_policies(g, sol) == "OPTIMAL"
    # What a user writes:
    step = jax.jit(jax.value_and_grad(jax.checkpoint(fn, policy=policy(g, sol.plan))))
    loss, grads = step(*args)
    ref_loss, ref_grads = jax.value_and_grad(fn)(*args)
    assert np.allclose(loss, ref_loss, rtol=1e-6)
    for a, b in zip(jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(ref_grads)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    device, host = plan_saved(g, sol.plan)
    assert jax_saved(fn, args, policy(g, sol.plan)) == (device, host, [])
    assert bool(host) == (any(f == "offload" for f in policy_table(g, sol.plan).values()))


def test_a_per_layer_policy_is_one_policy_per_layer(block_graph):
    fates = {("decoder_layer_input", 0): "device", ("mlpwi", 0): "remat", ("mlpwo", 0): "device",
             ("decoder_layer_input", 1): "remat", ("mlpwi", 1): "device", ("mlpwo", 1): "remat"}
    plan = policy_plan(Space(block_graph, True), fates, None)
    table = policy_table(block_graph, plan)
    assert table["per_layer"][0]["mlpwi"] == "remat" and table["per_layer"][1]["mlpwi"] == "device"
    with pytest.raises(Exception, match="pass layer="):
        policy(block_graph, plan)
    assert "policies = [" in policy_source(table)
    params, x = block_args()

    def layered(params, x):  # the user's step with one jax.checkpoint per layer
        for i, p in enumerate(params):
            x = jax.checkpoint(lambda x, p: block_loss_layer(x, p), policy=policy(block_graph, plan, layer=i))(x, p)
        return jnp.mean(jnp.sin(x) ** 2)

    ref = jax.grad(block_loss)(params, x)
    got = jax.grad(layered)(params, x)
    for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(ref)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def block_loss_layer(x, p):
    x = checkpoint_name(x, "decoder_layer_input")
    h = jnp.tanh(checkpoint_name(x @ p["wi"], "mlpwi"))
    return x + checkpoint_name(h @ p["wo"], "mlpwo")


def rematopt(*args):
    return subprocess.run([sys.executable, "-m", "rematopt", *map(str, args)], capture_output=True, text=True,
                          cwd=ROOT, timeout=300)


def test_cli_plans_a_policy_and_exports_it_as_python_and_json(block_graph, tmp_path):
    block_graph.save(tmp_path / "g.json")
    run = rematopt("solve", tmp_path / "g.json", "--planner", "jax-names", "--per-layer", "--offload",
                   "--budget-ratio", "0.9", "--no-price", "--time-limit", "5", "--workers", "1", "-o", tmp_path / "p.json")
    assert run.returncode == 0, run.stderr
    plan = Plan.load(tmp_path / "p.json")
    table = policy_table(block_graph, plan)
    run = rematopt("export", "jax-policy", tmp_path / "g.json", tmp_path / "p.json", "--format", "json")
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout) == table
    run = rematopt("export", "jax-policy", tmp_path / "g.json", tmp_path / "p.json")
    assert run.returncode == 0 and "jax.checkpoint_policies." in run.stdout
    scope: dict = {"jax": jax}
    exec(run.stdout, scope)  # the printed Python is the policy itself
    printed = scope.get("policy") or scope["policies"]
    if "per_layer" not in table:
        params, x = block_args()
        assert jax_saved(block_loss, (params, x), printed) == jax_saved(block_loss, (params, x),
                                                                        policy(block_graph, plan))


@pytest.mark.parametrize("args,message", [
    (["solve", "{unnamed}", "--planner", "jax-names"], "no value carries a checkpoint_name"),
    (["export", "jax-policy", "{unnamed}", "{plan}"], "no value carries a checkpoint_name"),
])
def test_graphs_without_names_exit_2_with_one_line(tmp_path, args, message):
    g = trace_grad(lambda w, x: jnp.sum(jnp.tanh(x @ w)), jnp.ones((4, 4)), jnp.ones((2, 4)))
    g.save(tmp_path / "u.json")
    from rematopt import no_remat_plan

    no_remat_plan(g).save(tmp_path / "p.json")
    run = rematopt(*[a.format(unnamed=tmp_path / "u.json", plan=tmp_path / "p.json") for a in args])
    assert run.returncode == 2 and message in run.stderr and len(run.stderr.strip().splitlines()) == 1
