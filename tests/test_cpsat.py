"""The exact planner against exhaustive search, and its contract: plans that
replay to the figures the model reports, flags respected, hints honoured.

Every solve goes through :func:`rematopt.solve`, which replays the plan and
raises PlanMismatch unless peak, compute cost and transfer bytes match the
planner's claims exactly."""

from __future__ import annotations

import math
import random
import re
from pathlib import Path

import pytest

from rematopt import solve
from rematopt.graph import Graph, Node
from rematopt.importers import synthetic
from rematopt.planners.cpsat import plan as cpsat_plan
from rematopt.planners.cpsat.tuning import Tuning
from rematopt.reference import no_remat_peak, peak_lower_bound, working_set_bound

from brute_force import min_cost, min_peak
from cpsat_cases import (FAST, PARTS, beaten_from_outside, budget_between, cases, check_claim, every_shape,
                         staged_status, tiny,
                         with_costs)
from rematopt.importers import load as load_graph

BENCH = Path(__file__).resolve().parents[2] / "shared" / "benchmarks" / "nodelink"


def check_overhead(g: Graph, budget: int, offload: bool = False, per_byte: int = 0) -> None:
    expect = min_cost(g, budget, offload, per_byte)
    sol = solve(g, "cpsat", budget=budget, objective="overhead", offload=offload,
                transfer_cost_per_byte=per_byte, **FAST)
    check_claim(g, sol)
    if expect is None:
        assert staged_status(sol) == "INFEASIBLE"
        return
    st = sol.plan.stats
    if beaten_from_outside(sol):  # a fast plan outside the staged space (another order) does better
        assert st["objective"] < expect[0] and sol.replay.peak_bytes <= budget
        return
    assert staged_status(sol) == "OPTIMAL"
    assert st["objective"] == expect[0]
    assert sol.replay.peak_bytes == expect[1]  # lexicographic: lowest peak at that cost
    recompute = sol.replay.compute_cost - sol.replay.base_cost
    assert recompute + sol.replay.transfer_bytes * per_byte == pytest.approx(expect[0])


@pytest.mark.parametrize("n, part", [(2, 0), (3, 0), (4, 0)] + [(5, k) for k in range(PARTS)])
def test_overhead_optimum_equals_exhaustive_on_every_shape(n, part):
    shapes = every_shape(n, seed=n, part=part, parts=PARTS if n == 5 else 1)
    assert shapes
    for g, budget in shapes:
        check_overhead(g, budget)


@pytest.mark.parametrize("n,count", [(5, 80), (6, 20)])
def test_overhead_optimum_equals_exhaustive_on_sampled_shapes(n, count):
    for g, rng in cases(n, every=False, count=count, seed=10 + n):
        check_overhead(g, budget_between(g, rng))


def test_offload_optimum_equals_exhaustive_on_every_4_node_shape():
    for g, rng in cases(4, every=True, count=0, seed=44):
        check_overhead(g, budget_between(g, rng), offload=True, per_byte=rng.choice([0, 1]))


def check_peak(g: Graph, sol, expect: tuple, offload: bool = False) -> None:
    """The exhaustive staged optimum (peak, then overhead), or a fast plan
    outside the staged space with a lower peak, returned instead of it
    (never OPTIMAL over a plan rematopt makes)."""
    check_claim(g, sol)
    if beaten_from_outside(sol) or sol.replay.peak_bytes < expect[0]:
        # a plan outside the staged space (greedy's, another order) peaks lower;
        # OPTIMAL only where the bound proves it (the working set, say)
        st = sol.plan.stats
        assert sol.replay.peak_bytes < expect[0] and st.get("best_bound", 0) <= sol.replay.peak_bytes
        assert sol.status != "OPTIMAL" or st["best_bound"] == sol.replay.peak_bytes
        return
    assert staged_status(sol) == "OPTIMAL" and sol.replay.peak_bytes == expect[0]
    if not offload:
        assert sol.replay.compute_cost - sol.replay.base_cost == pytest.approx(expect[1])


def test_peak_optimum_equals_exhaustive_on_every_4_node_shape():
    for g, rng in cases(4, every=True, count=0, seed=45):
        check_peak(g, solve(g, "cpsat", objective="peak", **FAST), min_peak(g))


@pytest.mark.parametrize("n,count", [(3, 10), (4, 25), (5, 15)])
def test_overhead_optimum_with_offload_equals_exhaustive(n, count):
    for g, rng in cases(n, every=False, count=count, seed=20 + n):
        check_overhead(g, budget_between(g, rng), offload=True, per_byte=rng.choice([0, 1]))


@pytest.mark.parametrize("n,count", [(3, 10), (4, 30), (5, 20), (6, 5)])
def test_peak_optimum_equals_exhaustive(n, count):
    for g, rng in cases(n, every=False, count=count, seed=30 + n):
        cap = rng.choice([None, 0, 3])
        expect = min_peak(g, cost_cap=cap)
        base = sum(g.cost[i] for i in g.compute_ids)
        opts = dict(FAST, objective="peak")
        if cap is not None:
            if base == 0:
                continue
            opts["max_overhead"] = cap / base
        sol = solve(g, "cpsat", **opts)
        check_peak(g, sol, expect)


def test_peak_optimum_with_offload_equals_exhaustive():
    for g, rng in cases(4, every=False, count=8, seed=41):
        expect = min_peak(g, offload=True, transfer_per_byte=1, cost_cap=4)
        sol = solve(g, "cpsat", objective="peak", offload=True, transfer_cost_per_byte=1,
                    max_overhead=4 / max(1e-9, sum(g.cost[i] for i in g.compute_ids)), **FAST)
        if sum(g.cost[i] for i in g.compute_ids) == 0:
            continue
        check_peak(g, sol, expect, offload=True)


def offload_graph() -> Graph:
    """a (big, expensive, needed at the end) -> b -> c -> d(a, c): keeping a
    costs its bytes through b and c; recomputing it costs 100; a host copy
    costs 2 x 1 per byte... cheaper than recomputing."""
    nodes = [Node(0, "a", bytes=4, cost=100), Node(1, "b", bytes=4, cost=1),
             Node(2, "c", bytes=4, cost=1), Node(3, "d", bytes=1, cost=1)]
    return Graph("offload", nodes, [(0, 1), (1, 2), (2, 3), (0, 3)])


def test_offload_strictly_lowers_the_optimum():
    g = offload_graph()
    budget = 9  # no-remat needs a + b + c = 12 at c
    without = solve(g, "cpsat", budget=budget, **FAST)
    with_offload = solve(g, "cpsat", budget=budget, offload=True, transfer_cost_per_byte=1, **FAST)
    assert staged_status(without) == staged_status(with_offload) == "OPTIMAL"
    assert with_offload.plan.stats["objective"] < without.plan.stats["objective"]
    assert with_offload.replay.transfer_bytes > 0
    assert with_offload.plan.stats["objective"] == min_cost(g, budget, True, 1)[0]


def test_non_recomputable_node_is_computed_once():
    g = offload_graph()
    g.nodes[0].recomputable = False
    g = Graph.from_dict(g.to_dict())
    sol = solve(g, "cpsat", budget=12, **FAST)
    counts = [op == "compute" and node == 0 for op, node in sol.plan.events()]
    assert sum(counts) == 1
    assert staged_status(solve(g, "cpsat", budget=9, **FAST)) == "INFEASIBLE"


def test_budget_below_working_set_reports_infeasible_without_a_model():
    g = synthetic.linear_training(4)
    p = cpsat_plan(g, working_set_bound(g) - 1, dict(FAST))
    assert p.stats["status"] == "INFEASIBLE" and len(p) == 0 and "variables" not in p.stats
    assert p.stats["infeasible_in"] == "all plans" and p.stats["proved_by"] == "working set"


def test_persistent_never_freed_and_outputs_resident():
    g = synthetic.unet(1, train=True)
    sol = solve(g, "cpsat", budget_ratio=0.8, **FAST)
    assert staged_status(sol) == "OPTIMAL"
    outputs = {v.id for v in g.nodes if v.output}
    freed_last = {}
    for op, node in sol.plan.events():
        freed_last[node] = op == "free"
    assert not any(freed_last.get(i, False) for i in outputs)


def test_model_figures_match_replay_on_random_graphs():
    """Hundreds of random small graphs, budgets and modes: solve() replays
    every plan and refuses any mismatch with the model's peak, compute cost
    and transfer bytes; the reported objective is the plan's own."""
    rng = random.Random(7)
    solved = 0
    for k in range(200):
        n = rng.randint(3, 7)
        edges = [(i, j) for j in range(n) for i in range(j) if rng.random() < 0.45]
        g = tiny(edges, n, rng)
        offload = rng.random() < 0.3
        if rng.random() < 0.5:
            sol = solve(g, "cpsat", budget=budget_between(g, rng), offload=offload,
                        transfer_cost_per_byte=1, **dict(FAST, time_limit=5))
        else:
            sol = solve(g, "cpsat", objective="peak", offload=offload, **dict(FAST, time_limit=5))
        if sol.replay is None:
            continue
        solved += 1
        st = sol.plan.stats
        transfer = sol.replay.transfer_bytes if offload and st["objective_kind"] == "overhead" else 0
        if st["objective_kind"] == "overhead":
            assert st["objective"] == pytest.approx(sol.replay.compute_cost - sol.replay.base_cost + transfer)
        else:
            assert st["objective"] == sol.replay.peak_bytes
    assert solved > 150


def test_complete_hint_is_never_beaten_by_the_result():
    """A plan from a previous solve, given as hint with no time to search,
    comes back at least as good. No time is 0.01 s of CP-SAT's deterministic
    clock: 0.01 s of wall clock ended now before, now after the first model
    was built, with the load (the same plan, reported two ways)."""
    g = synthetic.random_layered(14, seed=5)  # seed 3: xla-remat's reordered plan beats every staged one
    first = solve(g, "cpsat", budget_ratio=0.85, **FAST)
    assert first.replay is not None  # dtr's cleaned plan (1,203) beats the staged optimum (1,896)
    no_time = dict(FAST, deterministic_time=0.01)
    assert solve(g, "cpsat", budget_ratio=0.85, **no_time).replay is None  # nothing found in that time alone
    again = solve(g, "cpsat", budget_ratio=0.85, hint=first.plan, **no_time)
    assert again.replay is not None
    assert again.plan.stats["objective"] <= first.plan.stats["objective"]
    assert again.plan.stats["stopped_by"] == "deterministic_time"


def test_lp_bound_and_best_bound_are_below_the_objective():
    g = synthetic.unet(2, train=True)
    sol = solve(g, "cpsat", budget_ratio=0.7, **dict(FAST, lp_bound=True))
    st = sol.plan.stats
    assert staged_status(sol) == "OPTIMAL" and st["gap"] == 0.0
    assert st["lp_bound"] <= st["objective"] + 1e-6
    assert st["best_bound"] == st["objective"]
    assert st["variables"] > 0 and st["constraints"] > 0 and st["build_s"] >= 0


def test_max_clone_expansion_bounds_compute_events():
    g = synthetic.linear_training(6)
    loose = solve(g, "cpsat", objective="peak", **FAST)
    tight = solve(g, "cpsat", objective="peak", max_clone_expansion=1.0, **FAST)
    assert tight.replay.compute_events == len(g.compute_ids)
    assert loose.replay.peak_bytes <= tight.replay.peak_bytes


def test_log_writes_incumbent_and_bound(tmp_path):
    g = synthetic.unet(1, train=True)
    log = tmp_path / "log.csv"
    solve(g, "cpsat", budget_ratio=0.8, log_path=str(log), **FAST)
    lines = log.read_text().splitlines()
    assert lines[0] == "phase,elapsed_s,incumbent,bound"
    assert any(line.startswith("primary,") and line.split(",")[2] for line in lines[1:])


def test_overhead_objective_without_budget_is_refused():
    from rematopt.errors import PlannerError

    with pytest.raises(PlannerError):
        cpsat_plan(synthetic.chain(3), None, {"objective": "overhead"})


@pytest.mark.parametrize("options, message", [
    ({"workers": -1}, "workers must be an integer >= 0"),
    ({"workers": 1.5}, "workers must be an integer >= 0"),
    ({"offload": True, "transfer_cost_per_byte": -0.5}, "transfer-cost-per-byte must be a finite number >= 0"),
    ({"hint": "other graph"}, "the hint (a plan for 'chain_d3') does not replay on 'random_layered_n12"),
])
def test_bad_options_are_refused(options, message):
    from rematopt.errors import PlannerError
    from rematopt.reference import no_remat_plan

    if options.get("hint"):
        options = {"hint": no_remat_plan(synthetic.chain(3))}  # another graph's plan
    g = synthetic.random_layered(12, seed=0)
    with pytest.raises(PlannerError, match=re.escape(message)):
        solve(g, "cpsat", budget_ratio=0.9, **{**FAST, **options})


def test_benchmark_graph_meets_its_budget():
    path = BENCH / "mobilenet_train.json"
    if not path.exists():
        pytest.skip("../shared/benchmarks is absent")
    g = load_graph(path)
    sol = solve(g, "cpsat", budget_ratio=0.9, workers=2, time_limit=30, lp_bound=False)
    assert sol.status in ("OPTIMAL", "FEASIBLE")
    assert sol.replay.peak_bytes <= sol.budget


def test_lp_bound_never_exceeds_the_optimum():
    sols = [solve(g, "cpsat", budget=budget_between(g, rng), **dict(FAST, lp_bound=True))
            for g, rng in cases(5, every=False, count=14, seed=51)]
    optimal = [s for s in sols if staged_status(s) == "OPTIMAL"]
    assert len(optimal) >= 5 and all(staged_status(s) in ("OPTIMAL", "INFEASIBLE") or beaten_from_outside(s)
                                     for s in sols)
    # the LP bounds staged plans; a zero-cost plan from outside is optimal below it
    assert all(s.plan.stats["lp_bound"] <= s.plan.stats["objective"] + 1e-6 for s in optimal
               if not beaten_from_outside(s))


def test_deeper_recompute_spaces_never_do_worse():
    """Depth k restricts recomputes to k producer hops of each stage's node;
    the spaces are nested, so a budget feasible at depth k stays feasible
    deeper, at no higher cost, down to the full space. An empty restricted
    space is UNKNOWN (not INFEASIBLE: a deeper one may hold a plan)."""
    g = synthetic.linear_training(8)
    lo, hi = peak_lower_bound(g), no_remat_peak(g)
    for budget in (lo + (hi - lo) // 5, lo + 2 * (hi - lo) // 5):
        results = []
        for depth in (1, 2, 3, "full"):
            sol = solve(g, "cpsat", budget=budget, recompute_depth=depth, **FAST)
            assert staged_status(sol) == "OPTIMAL" or (sol.status == "UNKNOWN" and depth != "full")
            results.append(sol.plan.stats["objective"] if staged_status(sol) == "OPTIMAL" else math.inf)
        assert results == sorted(results, reverse=True)
        assert results[0] > results[-1]  # the restriction costs something at these budgets


def test_a_budget_met_outside_the_models_space_returns_the_fast_plan(monkeypatch):
    """When the model's space holds no plan (here: forced by a depth-0 space on
    a chain that must recompute), cpsat hands back the best fast planner's plan
    under the budget instead of nothing, marked as coming from it."""
    from rematopt.planners.cpsat import run

    g = synthetic.linear_training(8)
    lo, hi = peak_lower_bound(g), no_remat_peak(g)
    budget = lo + (hi - lo) // 5
    monkeypatch.setattr(run, "from_plan", lambda form, plan: None)  # nothing projects,
    monkeypatch.setattr(run, "plan_pairs", lambda ix, plan: {})  # nor widens the space
    monkeypatch.setattr(run, "next_depth", lambda setting, history, *_: 0 if not history else run.DONE)
    sol = solve(g, "cpsat", budget=budget, time_limit=10, workers=1)
    st = sol.plan.stats
    assert sol.status == "FEASIBLE" and st["plan_from"] != "cpsat" and st["space_status"] == "INFEASIBLE"
    assert sol.replay.valid and sol.replay.peak_bytes <= budget


def test_never_worse_than_a_hint_from_outside_the_models_space():
    """On this small random layered graph greedy, which rebuilds every selected
    value right before each use, meets the budget with no recompute by computing
    values later than their program position: outside the staged space, whose
    optimum recomputes. Given greedy's plan as a hint, cpsat returns it, and
    as it costs nothing, it is optimal in any space."""
    g = synthetic.random_layered(12, seed=0)
    lo, hi = peak_lower_bound(g), no_remat_peak(g)
    budget = lo + (hi - lo) // 5
    hint = solve(g, "greedy", budget=budget)
    staged = solve(g, "cpsat", budget=budget, recompute_depth="full", **FAST)
    # even without the warm start, the staged optimum is not claimed over greedy's plan
    st = staged.plan.stats
    assert hint.status == "FEASIBLE" and hint.replay.recompute_cost == 0 and st["space_status"] == "OPTIMAL"
    assert staged.status == "OPTIMAL" and st["proved_by"] == "zero cost"
    assert st["plan_from"] == "greedy" and staged.replay.recompute_cost == hint.replay.recompute_cost
    assert "greedy's plan, outside the model's space, beats the model's best" in st["reason"]
    sol = solve(g, "cpsat", budget=budget, recompute_depth="full", hint=hint.plan, **FAST)
    assert sol.plan.stats["plan_from"] == "greedy" and "beats the model's best" in sol.plan.stats["reason"]
    assert sol.replay.recompute_cost == hint.replay.recompute_cost and sol.replay.peak_bytes <= budget


@pytest.mark.parametrize("length, frac, depths", [(10, 0.0, [1, 2, "full"]), (16, 0.2, [1, 2, 4])])
def test_empty_restricted_spaces_double_the_depth(length, frac, depths):
    """A training chain near its working-set bound needs long recompute
    chains: while a round's space holds no plan the depth doubles, until the
    doubled space would hold more than half of the full space's
    re-materialisations (10 layers: depth 4 has 132 of 210; 16 layers: depth
    8 has 392 of 528); then the full space. The first space with a plan is
    solved to its optimum, as a solve restricted to that depth finds it."""
    g = synthetic.linear_training(length)
    lo, hi = peak_lower_bound(g), no_remat_peak(g)
    budget = lo + int((hi - lo) * frac)
    sol = solve(g, "cpsat", budget=budget, **dict(FAST, time_limit=10, tuning=Tuning(full_model_pairs=0)))
    st = sol.plan.stats
    rounds = st["rounds"][:len(depths)]  # up to the first space with a plan
    assert [r["recompute_depth"] for r in rounds] == depths
    assert [r["status"] for r in rounds] == ["INFEASIBLE"] * (len(depths) - 1) + ["OPTIMAL"]
    same = solve(g, "cpsat", budget=budget, recompute_depth=depths[-1], **FAST)
    assert same.plan.stats["rounds"][-1]["status"] == "OPTIMAL"
    assert same.plan.stats["rounds"][-1]["objective"] == rounds[-1]["objective"]
    assert st["objective"] <= rounds[-1]["objective"] and sol.replay.peak_bytes <= budget


def test_an_empty_restricted_space_asks_the_relaxations_whether_the_whole_is():
    """The MLP instance at 0.9 of its no-remat peak: the depth-1 space is
    empty, and so is the chains relaxation of the whole staged space, which
    settles it: INFEASIBLE after one round, as the full model confirms."""
    g = load_graph(Path(__file__).resolve().parents[1] / "instances" / "mlp_l4_w256.json")
    sol = solve(g, "cpsat", budget_ratio=0.9, **dict(FAST, workers=2))
    st = sol.plan.stats
    assert staged_status(sol) == "INFEASIBLE" and "chains relaxation" in st["reason"]
    assert sol.status == "UNKNOWN"  # a plan outside the staged space may meet the budget
    assert [(r["recompute_depth"], r["status"]) for r in st["rounds"]] == [(1, "INFEASIBLE")]
    assert st["gap_relaxation"]["status"] == "OPTIMAL"  # the weakest relaxation could not tell
    full = solve(g, "cpsat", budget_ratio=0.9, recompute_depth="full", **dict(FAST, workers=2))
    assert staged_status(full) == "INFEASIBLE"


def test_a_restricted_space_holds_the_hint_beyond_its_depth():
    """On a short training chain at a tight budget every plan recomputes
    chains deeper than one hop, so the depth-1 space alone holds none. Given
    the full space's optimum as hint, the depth-1 round also allows the hint's
    re-materialisations: it is solved from the hint and proven optimal in
    that space, rather than falling back to the plan from outside."""
    g = synthetic.linear_training(6)
    lo, hi = peak_lower_bound(g), no_remat_peak(g)
    budget = lo + (hi - lo) // 10
    full = solve(g, "cpsat", budget=budget, recompute_depth="full", **FAST)
    alone = solve(g, "cpsat", budget=budget, recompute_depth=1, **FAST)
    assert staged_status(full) == "OPTIMAL" and alone.status == "UNKNOWN"
    sol = solve(g, "cpsat", budget=budget, recompute_depth=1, hint=full.plan, **FAST)
    st = sol.plan.stats
    assert st["warm_start"] == "hint" and st["space"] == "depth 1 + cpsat's plan"
    assert staged_status(sol) == "OPTIMAL" and st.get("plan_from") is None
    assert sol.replay.recompute_cost == full.replay.recompute_cost and sol.replay.peak_bytes <= budget


def test_a_restricted_space_is_widened_only_for_a_hint_better_than_its_own():
    """dtr's plan here recomputes values beyond depth 1, but costs far more
    than staged eviction's plan inside the depth-1 space: the space is not
    widened (a wider space is a harder one) and the round starts from the
    better hint."""
    from rematopt.planners.staged.stages import Stages
    from rematopt.planners.staged.solution import staged_events

    g = synthetic.random_layered(16, seed=1)
    outside = solve(g, "dtr", budget_ratio=0.9)
    ix = Stages(g, False, 1)
    R = staged_events(ix, outside.plan)[0]
    assert outside.status == "FEASIBLE" and any(s != ix.first[i] and not ix.may_compute(s, i) for s, i in R)
    sol = solve(g, "cpsat", budget_ratio=0.9, hint=outside.plan, recompute_depth=1, **dict(FAST, warm_start="auto"))
    st = sol.plan.stats
    assert st["space"] == "depth 1" and st["warm_start"] == "staged-eviction"
    assert st["hint_objective"] < outside.replay.recompute_cost and st["objective"] <= st["hint_objective"]


def test_the_fast_planners_plan_is_on_record_before_any_model_is_built(monkeypatch):
    """The best fast planner's plan is fetched before the first model is
    built, so time_to_first_s counts it (on the 2,090-node decoder, building
    the model takes 9 s), and the run never returns anything worse."""
    from rematopt.planners.cpsat import run

    first_at_build = []
    original = run.make_model

    def recording(ctx, depth, also, **kw):
        first_at_build.append(ctx.trace.first)
        return original(ctx, depth, also, **kw)

    monkeypatch.setattr(run, "make_model", recording)
    g = synthetic.random_layered(12, seed=0)  # greedy meets this budget (see the test above)
    lo, hi = peak_lower_bound(g), no_remat_peak(g)
    budget = lo + (hi - lo) // 5
    greedy = solve(g, "greedy", budget=budget)
    sol = solve(g, "cpsat", budget=budget, time_limit=20, workers=1, lp_bound=False)
    assert first_at_build[0] is not None and sol.plan.stats["time_to_first_s"] == first_at_build[0]
    assert sol.replay.valid and sol.replay.peak_bytes <= budget
    assert sol.replay.recompute_cost <= greedy.replay.recompute_cost


@pytest.mark.parametrize("factor", [1e-10, 1e-12, 1e3])
def test_optimal_holds_for_tiny_and_huge_real_costs(factor):
    """Costs in seconds are tiny (a fuzz found OPTIMAL false when every cost
    was below 1e-9: the scale rounded them all to 0). The same graphs with
    costs times ``factor`` have the same optimal plans: cpsat's OPTIMAL
    objective is the exhaustive optimum times ``factor``, exactly scaled."""
    checked = 0
    for g, rng in cases(5, every=False, count=12, seed=71):
        budget = budget_between(g, rng)
        expect = min_cost(g, budget)
        sol = solve(with_costs(g, [factor] * g.n), "cpsat", budget=budget, **FAST)
        assert (staged_status(sol) == "INFEASIBLE") == (expect is None)
        if expect is not None and beaten_from_outside(sol):  # a fast plan outside the space does better
            assert sol.plan.stats["objective"] < expect[0] * factor * (1 - 1e-9)
            checked += 1
        elif expect is not None:
            assert staged_status(sol) == "OPTIMAL" and sol.plan.stats["cost_resolution"] == 0.0
            assert sol.plan.stats["objective"] == pytest.approx(expect[0] * factor, rel=1e-9, abs=0)
            checked += 1
    assert checked >= 6


def test_costs_spanning_fifteen_orders_hold_optimal_up_to_the_stated_resolution():
    """One graph with costs from 1e-12 to 1e3, drawn as real numbers (no
    power of ten makes them integers within the objective's range): the
    model rounds them, states ``cost_resolution``, and its OPTIMAL objective
    is within that of the exhaustive optimum (computed on the same graph with
    costs as exact integers of a finer unit)."""
    rng = random.Random(5)
    checked = 0
    for g, _ in cases(5, every=False, count=10, seed=73):
        budget = budget_between(g, random.Random(g.n + checked))
        real = [10 ** rng.uniform(-12, 3) * (1 + rng.random()) for _ in range(g.n)]
        gr = with_costs(g, [r / max(c, 1) for r, c in zip(real, g.cost)])
        # the exhaustive optimum on integer costs of unit 1e-12 (each rounded by at most 0.5e-12)
        gi = Graph(g.name, [Node(v.id, v.name, bytes=v.bytes, cost=round(v.cost * 1e12), kind=v.kind,
                                 output=v.output, recomputable=v.recomputable, persistent=v.persistent)
                            for v in gr.nodes], g.edges, g.order)
        expect = min_cost(gi, budget)
        sol = solve(gr, "cpsat", budget=budget, **FAST)
        assert (staged_status(sol) == "INFEASIBLE") == (expect is None)
        if expect is not None and beaten_from_outside(sol):
            assert sol.plan.stats["objective"] < expect[0] / 1e12 + 1e-12 * g.n
            checked += 1
        elif expect is not None:
            st = sol.plan.stats
            assert staged_status(sol) == "OPTIMAL" and st["cost_resolution"] >= 0
            assert st["objective"] <= expect[0] / 1e12 + st["cost_resolution"] + 1e-12 * g.n
            assert st["best_bound"] <= expect[0] / 1e12 + 1e-12 * g.n
            checked += 1
    assert checked >= 4


def test_cluster_sized_bytes_and_costs_plan_correctly():
    """Nodes of about 2^48 bytes (3e14; 3.6e15 in all, under the loader's
    limit of 2^53) with sizes sharing no divisor, and costs up to 1e6 s
    (1.7e7 in all): memory is counted in units
    rounded up (the model refused them before: "the sum of all variable
    domains do not fit on an int64_t"), so every plan that fits the model
    fits the budget, and no model optimum is claimed for the whole space."""
    rng = random.Random(3)
    base = synthetic.linear_training(6)
    nodes = [Node(v.id, v.name, bytes=v.bytes * 2**28 + rng.randrange(1, 2**20), cost=v.cost * 1e6,
                  kind=v.kind, output=v.output, persistent=v.persistent) for v in base.nodes]
    g = Graph("huge", nodes, base.edges, base.order)
    assert max(g.bytes) > 2**48 and sum(g.bytes) > 2**51 and max(g.cost) >= 1e6
    for ratio in (0.9, 0.7):
        sol = solve(g, "cpsat", budget_ratio=ratio, **FAST)
        st = sol.plan.stats
        assert sol.status in ("OPTIMAL", "FEASIBLE") and not st["memory_unit_exact"]
        assert sol.replay.valid and sol.replay.peak_bytes <= sol.budget
        assert st["best_bound"] is None or st["best_bound"] <= st["objective"]
    assert solve(g, "cpsat", objective="peak", **FAST).replay.valid


def test_costs_beyond_the_objective_range_are_one_clear_error():
    from rematopt.errors import PlannerError

    chain = synthetic.chain(4)
    g = with_costs(chain, [1e15] * chain.n)  # within the loader's limit (2^53 in all), not the model's
    with pytest.raises(PlannerError, match="at most .* are supported"):
        solve(g, "cpsat", objective="peak", **FAST)


def test_the_time_limit_covers_building_the_model():
    """--time-limit is the whole solve's: where building the first model
    would pass it, the run stops building and returns the best fast plan
    (here dtr's on a 300-layer training chain, whose full model takes longer
    than 2 s to build), marked as such, rather than building on past the
    limit; without a fast plan, no plan."""
    g = synthetic.linear_training(300)
    sol = solve(g, "cpsat", budget_ratio=0.8, time_limit=2, workers=1, recompute_depth="full")
    st = sol.plan.stats
    assert st["reason"] == "the time limit (2 s) ran out while building the first model"
    assert sol.status == "FEASIBLE" and st["plan_from"] not in (None, "cpsat") and st["rounds"] == []
    assert sol.replay.valid and sol.replay.peak_bytes <= sol.budget
    nothing = solve(g, "cpsat", budget_ratio=0.8, time_limit=2, workers=1, warm_start="none",
                    recompute_depth="full")
    assert nothing.status == "UNKNOWN" and len(nothing.plan) == 0 and "ran out while building" in \
        nothing.plan.stats["reason"]
