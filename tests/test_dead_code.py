"""Dropping computations nobody reads (planners/dead_code.py): the plan
stays valid, never costs or peaks more, and what it drops is exactly the
unread work."""

from __future__ import annotations

import random

import pytest

from rematopt.graph import Graph, Node
from rematopt.plan import COMPUTE, Plan
from rematopt.planners.dead_code import without_dead_computations
from rematopt.reference import no_remat_peak, peak_lower_bound
from rematopt.simulate import simulate
from rematopt.solve import solve

from cpsat_cases import cases


def graph() -> Graph:
    """x -> p -> q, x -> c -> d; out reads d and q: p and q are read only at the end."""
    spec = [("x", 1, 0, [], {"kind": "input", "persistent": True}), ("p", 10, 5, ["x"], {}),
            ("q", 10, 3, ["p"], {}), ("c", 20, 1, ["x"], {}), ("d", 1, 1, ["c"], {}),
            ("out", 1, 1, ["d", "q"], {"output": True})]
    ids = {s[0]: i for i, s in enumerate(spec)}
    return Graph("dead", [Node(i, n, bytes=b, cost=c, **f) for i, (n, b, c, _, f) in enumerate(spec)],
                 [(ids[p], i) for i, s in enumerate(spec) for p in s[3]])


def plan_of(g: Graph, seq: list[tuple[str, str]], planner: str = "test") -> Plan:
    return Plan.from_events(g.name, planner, [(op, g.node_by_name(n).id) for op, n in seq])


def names(g: Graph, plan: Plan) -> list[tuple[str, str]]:
    ops = ("compute", "free", "offload", "prefetch")
    return [(ops[o], g.nodes[i].name) for o, i in zip(plan.ops.tolist(), plan.nodes.tolist())]


def test_an_unread_chain_moves_to_its_reader():
    """p and q computed in program order, q freed unread and p freed after
    q: both computed again before out. The first two computations go (q's
    first, which read p, is what made p's first read), costing 8 less."""
    g = graph()
    staged = plan_of(g, [("compute", "p"), ("compute", "q"), ("free", "q"), ("free", "p"), ("compute", "c"),
                         ("compute", "d"), ("free", "c"), ("compute", "p"), ("compute", "q"), ("free", "p"),
                         ("compute", "out")])
    moved = without_dead_computations(g, staged)
    assert names(g, moved) == [("compute", "c"), ("compute", "d"), ("free", "c"), ("compute", "p"),
                               ("compute", "q"), ("free", "p"), ("compute", "out")]
    before, after = simulate(g, staged), simulate(g, moved)
    assert before.valid and after.valid
    assert after.recompute_cost == before.recompute_cost - 8 == 0
    assert after.peak_bytes <= before.peak_bytes


def test_a_last_computation_stays_even_unread():
    """A node nobody reads is still computed once (every compute node must be)."""
    g = graph()
    plan = plan_of(g, [("compute", "p"), ("compute", "q"), ("free", "p"), ("compute", "c"), ("compute", "d"),
                       ("free", "c"), ("compute", "out")])
    assert names(g, without_dead_computations(g, plan)) == names(g, plan)


def test_offloads_read_and_unread_prefetches_go():
    g = graph()
    plan = plan_of(g, [("compute", "p"), ("offload", "p"), ("free", "p"), ("compute", "c"), ("compute", "d"),
                       ("free", "c"), ("prefetch", "p"), ("free", "p"), ("prefetch", "p"), ("compute", "q"),
                       ("free", "p"), ("compute", "out")])
    moved = without_dead_computations(g, plan)
    assert names(g, moved) == [e for k, e in enumerate(names(g, plan)) if k not in (6, 7)]
    assert simulate(g, moved).valid and simulate(g, moved).transfer_bytes < simulate(g, plan).transfer_bytes


@pytest.mark.parametrize("planner", ["greedy", "dtr", "chen-greedy", "xla-remat", "cpsat"])
def test_never_worse_on_random_graphs(planner):
    """Every planner's plan on tiny random graphs: the result replays, costs
    and peaks no more, computes every node, drops only computations and
    frees, and is its own result again."""
    rng = random.Random(7)
    opts = {"cpsat": dict(time_limit=5, workers=1, warm_start="none", lp_bound=False)}.get(planner, {})
    for g, _ in cases(6, every=False, count=30, seed=11):
        budget = rng.randint((no_remat_peak(g) * 2) // 3, no_remat_peak(g))
        sol = solve(g, planner, budget=budget, check_budget=False, **opts)
        if not len(sol.plan):
            continue
        moved = without_dead_computations(g, sol.plan)
        before, after = simulate(g, sol.plan), simulate(g, moved)
        assert after.valid, after.error
        assert after.recompute_cost <= before.recompute_cost and after.peak_bytes <= before.peak_bytes
        assert set(moved.ops.tolist()) <= set(sol.plan.ops.tolist())
        assert (moved.ops == COMPUTE).sum() <= (sol.plan.ops == COMPUTE).sum()
        again = without_dead_computations(g, moved)
        assert again.ops.tolist() == moved.ops.tolist() and again.nodes.tolist() == moved.nodes.tolist()


def test_cpsat_returns_its_plan_without_unread_computations():
    """cpsat's unproven plan with an unread computation comes back as the
    outside plan ``cpsat+dce`` when cheaper; within the budget only; and a
    plan with nothing to drop leaves the outside plan as it was."""
    from rematopt.planners.cpsat.run import cleaned, context
    from rematopt.planners.cpsat.settings import Settings

    g = graph()  # cleaned() itself
    staged = plan_of(g, [("compute", "p"), ("compute", "q"), ("free", "q"), ("free", "p"), ("compute", "c"),
                         ("compute", "d"), ("free", "c"), ("compute", "p"), ("compute", "q"), ("free", "p"),
                         ("compute", "out")], planner="cpsat")  # as the model's plans are named
    ctx = context(g, Settings.parse(simulate(g, staged).peak_bytes, {}))
    found = cleaned(ctx, staged, None)
    assert found.name == "cpsat+dce" and found.objective == 0 and simulate(g, found.plan).valid
    assert cleaned(ctx, found.plan, None) is None  # nothing left to drop
    assert cleaned(ctx, found.plan, found) is found
    tight = context(g, Settings.parse(simulate(g, found.plan).peak_bytes - 1, {}))
    assert cleaned(tight, staged, None) is None  # over the budget: not admitted


def test_a_run_returns_its_plan_cleaned_where_that_is_cheaper_proven_or_not(monkeypatch):
    """At any size: a run whose plan is not proven optimal returns it cleaned
    where that is cheaper (``cpsat+dce``, FEASIBLE, replaying to the figures
    reported, the staged bound below it); so does a run whose plan is proven
    optimal in the staged space, as the cleaned plan lies outside it (then
    claimed optimal only where it costs nothing); otherwise the staged optimum comes back
    as such (``optimal_in: "staged space"``)."""
    from rematopt.importers import synthetic
    from rematopt.planners.cpsat import run, search
    from rematopt.planners.cpsat.tuning import Tuning

    solve_model = search.solve_model

    def starve(ctx, model, phase, limit, stop_at=None):  # the full round gets no time: unproven
        return solve_model(ctx, model, phase, 1e-3 if phase == "primary" and model.depth is None else limit, stop_at)

    g = synthetic.random_layered(16, seed=3)  # 16 nodes: its depth-2 optimum computes values nobody reads
    with monkeypatch.context() as m:
        m.setattr(search, "solve_model", starve)
        m.setattr(run, "fast_plans", lambda *a, **k: [])
        # depth rounds, and no proof between them
        sol = solve(g, "cpsat", budget_ratio=0.9, time_limit=20, workers=1, warm_start="none",
                    tuning=Tuning(full_model_pairs=0, proof_share=0.0))
    st = sol.plan.stats
    assert st["status"] == "FEASIBLE" and st["plan_from"] == "cpsat+dce"
    assert st["objective"] < st["rounds"][-1]["objective"]
    assert st["objective"] == pytest.approx(sol.replay.compute_cost - sum(g.cost[i] for i in g.compute_ids))
    assert st["best_bound"] <= st["objective"]
    seen = {"cleaned": 0, "staged optimum": 0}
    for seed in range(6):
        h = synthetic.random_layered(12, seed=seed)
        budget = (peak_lower_bound(h) + no_remat_peak(h)) // 2
        done = solve(h, "cpsat", budget=budget, time_limit=20, workers=1).plan.stats
        staged = done["rounds"][-1]
        if staged["status"] != "OPTIMAL" or staged["recompute_depth"] != "full":
            continue
        if done.get("plan_from") == "cpsat+dce":
            seen["cleaned"] += 1
            assert done["objective"] < staged["objective"]  # OPTIMAL only where it costs nothing:
            assert done.get("optimal_in") == ("all plans" if done["objective"] == 0 else None)
        elif not done.get("plan_from"):
            seen["staged optimum"] += 1
            assert done["optimal_in"] in ("staged space", "all plans") and done["objective"] == staged["objective"]
    assert all(seen.values()), seen
