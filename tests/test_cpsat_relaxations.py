"""The relaxations of ``staged.bounds`` (gaps alone, and with recompute
chains, and with a recompute's slot memory): lower bounds for the whole staged space, checked against exhaustive
search and the full model, and how ``cpsat`` uses them to claim whole-space
optimality from a depth-restricted solve."""

from __future__ import annotations

import math
import random

import pytest
from ortools.sat.python import cp_model

from rematopt import solve
from rematopt.graph import Graph
from rematopt.importers import synthetic
from rematopt.planners.cpsat import run, search, strategy
from rematopt.planners.cpsat.tuning import Tuning
from rematopt.planners.staged.bounds import chains
from rematopt.planners.staged.units import integer_scale
from rematopt.planners.staged.bounds import BOUNDS, Question, ask
from rematopt.reference import no_remat_peak, peak_lower_bound

from brute_force import min_cost, min_peak

LEVELS = ("gaps", "chains", "slots")  # the three levels of one relaxation
from cpsat_cases import FAST, PARTS, budget_between, cases, every_shape, staged_optimum, staged_status
from rematopt.importers import load as load_graph


def bound(g: Graph, budget: int | None, offload: bool = False, per_byte: int = 0, objective: str = "overhead",
          overhead_cap: int | None = None, level: str = "gaps", below: int | None = None,
          max_recomputes: int | None = None):
    """A relaxation on a tiny graph (integer costs and bytes: unit 1, scale 1)."""
    pinned = sum(v.bytes for v in g.nodes if v.persistent)
    cap = sum(g.bytes) if budget is None else budget - pinned
    q = Question(objective, 1, cap, tuple(int(c) for c in g.cost), tuple(b * per_byte for b in g.bytes), offload,
                 overhead_cap, max_recomputes, 0)
    return ask(g, q, level, below=below)


def check_below_exhaustive(g: Graph, budget: int, offload: bool, per_byte: int, tally: list[int]) -> None:
    """Every level stays at or below the exhaustive optimum (infeasible only
    when no plan exists), chains and slots at or above gaps; and asked whether
    a plan as good as the optimum exists, neither says no."""
    expect = min_cost(g, budget, offload, per_byte)
    got = {level: bound(g, budget, offload, per_byte, level=level) for level in tuple(BOUNDS)}
    for level, b in got.items():
        if b.status == "INFEASIBLE":
            assert expect is None, f"{level} relaxation infeasible, exhaustive search finds cost {expect[0]}"
            continue
        assert b.status == "OPTIMAL"
        if expect is not None:
            assert b.bound <= expect[0], level
    if expect is None or got["gaps"].status == "INFEASIBLE":
        return
    for level in ("chains", "slots"):
        assert got[level].status == "INFEASIBLE" or got[level].bound >= got["gaps"].bound
        assert bound(g, budget, offload, per_byte, level=level, below=expect[0]).status != "INFEASIBLE"
    tally[0] += got["gaps"].bound == expect[0] and expect[0] > 0  # tight and not trivially so
    tally[1] += got["chains"].bound > got["gaps"].bound  # the chains see what the gaps cannot


@pytest.mark.parametrize("n, part", [(4, 0)] + [(5, k) for k in range(PARTS)])
def test_bounds_never_exceed_the_exhaustive_optimum_on_every_shape(n, part):
    tally = [0, 0]
    for g, budget in every_shape(n, seed=100 + n, part=part, parts=PARTS if n == 5 else 1):
        check_below_exhaustive(g, budget, False, 0, tally)
    assert tally[0] > 0  # the bound is often the optimum itself on tiny graphs


def test_chains_see_what_the_gaps_cannot_on_five_nodes():
    """On a few five-node shapes a recompute chain is needed, which only the
    chains level prices (four nodes leave no room for one)."""
    def sharper(g, budget):
        gaps, chains = bound(g, budget, level="gaps"), bound(g, budget, level="chains")
        return gaps.status == chains.status == "OPTIMAL" and chains.bound > gaps.bound

    assert any(sharper(g, budget) for g, budget in every_shape(5, seed=105))
    assert not any(sharper(g, budget) for g, budget in every_shape(4, seed=104))


@pytest.mark.parametrize("n,count", [(5, 60), (6, 20)])
def test_bounds_never_exceed_the_exhaustive_optimum_with_offload(n, count):
    tally = [0, 0]
    for g, rng in cases(n, every=False, count=count, seed=200 + n):
        check_below_exhaustive(g, budget_between(g, rng), True, rng.choice([0, 1, 2]), tally)
    assert tally[0] > 0


@pytest.mark.parametrize("level", tuple(BOUNDS))
def test_peak_bounds_never_exceed_the_exhaustive_optimum(level):
    """Objective peak: the relaxation's smallest critical memory, with and
    without an overhead cap, is at most the lowest peak a plan reaches under
    that cap."""
    for g, rng in cases(4, every=True, count=0, seed=300):
        pinned = sum(v.bytes for v in g.nodes if v.persistent)
        cap = rng.choice([None, 0, 3])
        expect = min_peak(g, cost_cap=cap)
        got = bound(g, None, objective="peak", overhead_cap=cap, level=level)
        if expect is None:
            continue
        assert got.status == "OPTIMAL" and got.bound + pinned <= expect[0]


@pytest.mark.parametrize("level", tuple(BOUNDS))
def test_clone_bounded_bounds_never_exceed_the_models_optimum(level):
    """With at most ``extra`` recomputes (``--max-clone-expansion``), against
    the full model's optimum under the same cap (itself checked against
    exhaustive search in test_cpsat)."""
    tally = 0
    for g, rng in cases(5, every=False, count=40, seed=400):
        budget = budget_between(g, rng)
        n, extra = len(g.compute_ids), rng.choice([0, 1, 2])
        sol = solve(g, "cpsat", budget=budget, recompute_depth="full", max_clone_expansion=(n + extra + 0.5) / n, **FAST)
        got = bound(g, budget, level=level, max_recomputes=extra)
        if staged_optimum(sol) is not None:
            assert got.status == "OPTIMAL" and got.bound <= staged_optimum(sol) + 1e-9
            tally += got.bound > 0
        elif got.status != "INFEASIBLE":
            assert staged_status(sol) == "INFEASIBLE" and got.status == "OPTIMAL"
    assert tally > 0


@pytest.mark.parametrize("seed", range(6))
def test_bounds_never_exceed_the_full_models_optimum(seed):
    """On graphs too big for exhaustive search, the full staged model proven
    optimal is the reference: random layered DAGs and training graphs."""
    rng = random.Random(seed)
    g = (synthetic.random_layered(16, seed=seed) if seed % 2 else synthetic.unet(2, train=True, seed=seed))
    budget = budget_between(g, rng)
    sol = solve(g, "cpsat", budget=budget, recompute_depth="full", **FAST)
    relax = sol.plan.stats["gap_relaxation"]
    if staged_status(sol) == "INFEASIBLE":
        return
    optimum = staged_optimum(sol)
    assert optimum is not None and relax["status"] == "OPTIMAL"
    assert relax["bound"] <= optimum + 1e-9
    scale, _ = integer_scale([g.cost[i] for i in g.compute_ids], reach=sum(g.cost) * g.n)
    unit = math.gcd(*[v.bytes for v in g.nodes if not v.persistent])
    pinned = sum(v.bytes for v in g.nodes if v.persistent)
    for level in ("chains", "slots"):
        q = Question("overhead", unit, (budget - pinned) // unit,
                     tuple(math.floor(c * scale + 1e-9) for c in g.cost), (0,) * g.n, False)
        got = ask(g, q, level, time_limit=20)
        assert got.status == "OPTIMAL" and relax["bound"] <= got.bound / scale <= optimum + 1e-9


def test_each_level_sees_more_than_the_one_before():
    """A 14-node random layered graph at 0.9: each level's optimum is higher,
    up to the full model's (1,660); at 0.7 on another, only slots sees that
    no staged plan fits, which the full model confirms."""
    g = synthetic.random_layered(14, seed=5)
    budget = int(0.9 * no_remat_peak(g))
    got = [bound(g, budget, level=level).bound for level in LEVELS]
    full = solve(g, "cpsat", budget=budget, recompute_depth="full", **FAST)
    assert got[0] < got[1] < got[2] <= staged_optimum(full)
    g = synthetic.random_layered(14, seed=8)
    budget = int(0.7 * no_remat_peak(g))
    got = [bound(g, budget, level=level).status for level in LEVELS]
    assert got == ["OPTIMAL", "OPTIMAL", "INFEASIBLE"]
    assert staged_status(solve(g, "cpsat", budget=budget, recompute_depth="full", **FAST)) == "INFEASIBLE"


def test_an_infeasible_relaxation_is_reported_without_a_search():
    """Budgets at or above the peak lower bound that no staged plan meets
    (inputs that cannot be dropped, say): where the relaxation proves it,
    cpsat answers INFEASIBLE without solving a model, and exhaustive search agrees."""
    found = 0
    for g, rng in cases(5, every=True, count=0, seed=7):
        lo, hi = peak_lower_bound(g), no_remat_peak(g)
        budget = next((b for b in range(lo, hi) if bound(g, b).status == "INFEASIBLE"), None)
        if budget is None:
            continue
        sol = solve(g, "cpsat", budget=budget, **FAST)
        assert staged_status(sol) == "INFEASIBLE" and sol.plan.stats["gap_relaxation"]["status"] == "INFEASIBLE"
        assert sol.plan.stats["rounds"] == [] and min_cost(g, budget) is None
        found += 1
    assert found >= 10


def test_a_restricted_solve_claims_the_whole_space_only_when_the_bound_meets_it(monkeypatch):
    """With auto depth on a model too big for the whole space, only a depth-
    restricted subspace is solved. Its optimum is the whole space's only when
    a relaxation reaches it (OPTIMAL, best_bound = objective): the gap one, or
    a stronger one asked whether any staged plan does better; otherwise it is
    FEASIBLE with the relaxations' best bound, the subspace's own status and
    bound kept apart, and the full model's optimum lies in between."""
    # depth rounds and no full round; an empty depth-1 space is followed by depth 2
    tuning = Tuning(full_model_pairs=0, full_round_pairs=0, doubling_share=1.0)
    monkeypatch.setattr(run, "cleaned", lambda ctx, plan, outside: outside)  # the staged plan, not cleaned
    monkeypatch.setattr(run, "without_dead", lambda g, plans: [])  # nor the fast planners' cleaned ones
    seen = set()
    for seed, ratio in ((1, 0.9), (1, 0.8), (6, 0.9)):
        g = synthetic.random_layered(16, seed=seed)
        # no warm start: its plan's recomputes could widen the depth-1 space
        sol = solve(g, "cpsat", budget_ratio=ratio, time_limit=20, workers=1, warm_start="none", tuning=tuning)
        st = sol.plan.stats
        assert st["space"].startswith("depth ") and st["space_status"] == "OPTIMAL" and st["space_gap"] == 0.0
        proofs = st.get("relaxation_proofs", [])
        relax = max([st["gap_relaxation"]["bound"]] + [p["bound"] for p in proofs if p["bound"] is not None])
        assert st["best_bound"] == min(relax, st["objective"])
        full = solve(g, "cpsat", budget_ratio=ratio, time_limit=20, workers=1, recompute_depth="full")
        assert staged_optimum(full) is not None
        assert st["best_bound"] <= staged_optimum(full) <= st["objective"]
        if st["objective"] <= relax:
            assert staged_status(sol) == "OPTIMAL" and st["gap"] == 0.0
            proven_by = ("gaps" if st["gap_relaxation"]["bound"] >= st["objective"] else
                         next(p["level"] for p in proofs if p["status"] == "INFEASIBLE"))
            seen.add(f"OPTIMAL by {proven_by}")
        else:
            assert st["status"] == "FEASIBLE" and st["gap"] == pytest.approx((st["objective"] - relax) / st["objective"])
            # a relaxation that cannot prove the incumbent leaves the deeper round to run
            assert [r["recompute_depth"] for r in st["rounds"]] == [1, 2]
            seen.add("FEASIBLE")
        assert not st["interrupted"]
    # a proof's INFEASIBLE: no staged plan beats the incumbent
    assert seen == {"OPTIMAL by gaps", "OPTIMAL by chains", "FEASIBLE"}


def test_published_checkmate_graphs_are_proven_over_the_whole_space(benchmarks_dir):
    """On vgg16_train and mobilenet_train at 0.9 the relaxation reaches the
    optimum of a restricted (or the full) solve: whole-space OPTIMAL."""
    for name in ("vgg16_train", "mobilenet_train"):
        g = load_graph(benchmarks_dir / f"{name}.json")
        sol = solve(g, "cpsat", budget_ratio=0.9, time_limit=30, workers=2, lp_bound=False)
        st = sol.plan.stats
        assert staged_status(sol) == "OPTIMAL" and st["best_bound"] == st["objective"] > 0
        assert st["gap_relaxation"]["bound"] == st["objective"]


def test_slots_prove_random_layered_n100_optimal_over_the_whole_space(benchmarks_dir):
    """random_layered_n100 at 0.8: the slot relaxation's optimum is the
    optimum itself (the gaps give 573, the chains 741), so a restricted round's
    plan is proven optimal without the full model."""
    g = load_graph(benchmarks_dir / "random_layered_n100.json")
    sol = solve(g, "cpsat", budget_ratio=0.8, time_limit=60, workers=2, lp_bound=False)
    st = sol.plan.stats
    assert staged_status(sol) == "OPTIMAL" and st["space"].startswith("depth ")
    assert any(p["level"] == "slots" and p["status"] == "INFEASIBLE" for p in st["relaxation_proofs"])
    q = Question("overhead", 1, int(0.8 * no_remat_peak(g)), tuple(int(c) for c in g.cost), (0,) * g.n, False)
    got = ask(g, q, "slots", time_limit=60, workers=2)
    assert got.status == "OPTIMAL" and got.bound == st["objective"]


def test_a_search_without_an_answer_still_lends_its_bound(benchmarks_dir):
    """random_layered_n250 at 0.8: asked for a solution below 5,484 (the
    target gap's bound), chains finds none and proves nothing in 15 s, yet its
    bound so far (2,596 measured) beats the gaps' 1,828 and stays below the
    best plan known (5,734)."""
    g = load_graph(benchmarks_dir / "random_layered_n250.json")
    q = Question("overhead", 1, int(0.8 * no_remat_peak(g)), tuple(int(c) for c in g.cost), (0,) * g.n, False)
    gaps = ask(g, q, "gaps", time_limit=15, workers=2)
    got = ask(g, q, "chains", below=5_483, time_limit=15, workers=2)
    assert gaps.status == "OPTIMAL" and got.status in ("UNKNOWN", "FEASIBLE")
    assert gaps.bound < got.bound <= 5_734


def test_a_relaxation_too_big_to_build_is_skipped_and_the_rounds_go_on(monkeypatch):
    """Above MAX_PAIRS the chains and slots models are not built: SKIPPED,
    no bound claimed, and the solve continues with the deeper rounds."""
    monkeypatch.setattr(chains, "MAX_PAIRS", 0)
    g = synthetic.random_layered(16, seed=1)
    budget = int(0.8 * no_remat_peak(g))
    for level in ("chains", "slots"):
        assert bound(g, budget, level=level).status == "SKIPPED"
    assert bound(g, budget, level="gaps").status == "OPTIMAL"  # gaps is never skipped
    # depth rounds; an empty depth-1 space is followed by depth 2
    sol = solve(g, "cpsat", budget=budget, time_limit=20, workers=1,
                tuning=Tuning(full_model_pairs=0, doubling_share=1.0))
    st = sol.plan.stats
    assert [p["status"] for p in st["relaxation_proofs"]][:2] == ["SKIPPED", "SKIPPED"]
    assert [r["recompute_depth"] for r in st["rounds"]][:2] == [1, 2] and not st["interrupted"]


def test_a_starved_full_round_leaves_the_proven_rounds_plan_and_lends_its_bound(monkeypatch):
    """A full round that runs out of time without improving on a restricted
    round's proven optimum does not speak for the plan: ``space`` and
    ``space_status`` stay with the round that proved it (the full round shows
    in ``rounds``), the tie-break runs on that round's model, and the full
    model's bound, valid for the whole space, still counts in ``best_bound``."""
    solve_model = search.solve_model

    def starve(ctx, model, phase, limit, stop_at=None):  # the full round's search gets no time
        return solve_model(ctx, model, phase, 1e-3 if phase == "primary" and model.depth is None else limit, stop_at)

    for seed, ratio in ((3, 0.9), (6, 0.9), (9, 0.9), (14, 0.8)):  # depth 2 proven, the gaps bound below it
        g = synthetic.random_layered(16, seed=seed)
        # the model alone (no warm start): greedy now sinks values to their readers at no
        # overhead, outside the staged space, and its plan would be adopted as FEASIBLE
        full = solve(g, "cpsat", budget_ratio=ratio, time_limit=20, workers=1, recompute_depth="full",
                     warm_start="none")
        with monkeypatch.context() as m:
            m.setattr(search, "solve_model", starve)
            m.setattr(run, "fast_plans", lambda *a, **k: [])  # this is about the rounds alone
            m.setattr(run, "cleaned", lambda ctx, plan, outside: outside)  # and their staged plan
            # rounds, even on a small graph, and no proof between them
            sol = solve(g, "cpsat", budget_ratio=ratio, time_limit=20, workers=1, warm_start="none",
                        tuning=Tuning(full_model_pairs=0, proof_share=0.0))
        st = sol.plan.stats
        last, proven = st["rounds"][-1], [r for r in st["rounds"] if r["status"] == "OPTIMAL"]
        assert last["recompute_depth"] == "full" and last["status"] == "FEASIBLE" and proven
        # the full round started from the proven optimum and could only match it
        assert last["objective"] == proven[-1]["objective"] == st["objective"]
        assert st["space"] == f"depth {proven[-1]['recompute_depth']}"
        assert st["space_status"] == "OPTIMAL" and st["space_gap"] == 0.0 and st["lexicographic"]
        assert st["best_bound"] >= min(last["best_bound"], st["objective"])
        assert st["best_bound"] <= staged_optimum(full) <= st["objective"]
        assert staged_status(sol) == ("OPTIMAL" if st["best_bound"] >= st["objective"] else "FEASIBLE")


def test_without_a_plan_a_deeper_round_needs_only_the_minimum_time():
    """With a plan to keep, a deeper round starts only with twice the time
    spent left; without one any attempt beats none, so min_round_s is enough."""
    empty, proven = fake_round(cp_model.INFEASIBLE, found=False), fake_round(cp_model.OPTIMAL, found=True)
    # 8 s of 20 left
    assert strategy.may_start(2, empty, False, 12.0, 20.0, 0.0, full_pairs=10)
    assert not strategy.may_start(2, proven, False, 12.0, 20.0, 0.0, full_pairs=10)  # 24 s would be needed
    assert not strategy.may_start(2, fake_round(cp_model.UNKNOWN, found=False), False, 12.0, 20.0, 0.0, 10)
    assert not strategy.may_start(2, empty, True, 12.0, 20.0, 0.0, 10)  # Ctrl-C ends the rounds
    assert not strategy.may_start(2, empty, False, 16.0, 20.0, 0.0, 10)  # 4 s left: less than min_round_s
    assert strategy.may_start(2, proven, False, 6.0, 20.0, 2.0, 10)  # 14 s left, 8 s needed: proofs not counted


def fake_round(status: int, found: bool, depth: int | None = 1, objective: int = 5) -> search.Round:
    """A round as the strategy sees it: its depth, status, and whether it holds a plan."""

    class FakeModel:
        def objective_of(self, a):
            return objective

    model = FakeModel()
    model.depth = depth
    best = object() if found else None
    return search.Round(model, status, status, best, None, None, None, 0.0, 0.0)


def test_the_depth_schedule_from_a_history():
    """Automatic depths: the full space when small; else 1, 2, then full once
    a plan is found; doubling while the rounds are empty and the doubled
    space holds at most DOUBLING_SHARE of the re-materialisations; a fixed
    depth runs once."""
    pairs = {1: 10, 2: 20, 4: 40, 8: 90, None: 100}.get
    assert strategy.next_depth(None, [], full_pairs=10, remat_pairs=pairs) is None
    assert strategy.next_depth(None, [], full_pairs=10**6, remat_pairs=pairs) == 1
    assert strategy.next_depth(3, [], full_pairs=10, remat_pairs=pairs) == 3
    assert strategy.next_depth("full", [], full_pairs=10**6, remat_pairs=pairs) is None
    found = [fake_round(cp_model.OPTIMAL, True, depth=1)]
    assert strategy.next_depth(None, found, 10**6, pairs) == 2
    assert strategy.next_depth(None, found + [fake_round(cp_model.OPTIMAL, True, depth=2)], 10**6, pairs) is None
    empty = [fake_round(cp_model.INFEASIBLE, False, depth=d) for d in (1, 2, 4)]
    assert [strategy.next_depth(None, empty[:k], 10**6, pairs) for k in (1, 2, 3)] == [2, 4, None]  # 8: 90 > 50
    assert strategy.next_depth(None, empty[:1] + [fake_round(cp_model.INFEASIBLE, False, depth=None)],
                               10**6, pairs) == strategy.DONE
    assert strategy.next_depth(3, [fake_round(cp_model.OPTIMAL, True, depth=3)], 10, pairs) == strategy.DONE


def test_the_returned_round_and_the_proof_and_widening_decisions():
    """The returned round is the last with a plan, unless a later unproven
    round only matched an earlier proven optimum; proofs are asked once per
    objective value; the space widens only for an outside plan better than
    every hint it holds."""
    proven = fake_round(cp_model.OPTIMAL, True, depth=2, objective=7)
    matched = fake_round(cp_model.FEASIBLE, True, depth=None, objective=7)
    better = fake_round(cp_model.FEASIBLE, True, depth=None, objective=6)
    empty = fake_round(cp_model.UNKNOWN, False, depth=None)
    assert strategy.returned_round([proven, matched]) is proven
    assert strategy.returned_round([proven, better]) is better
    assert strategy.returned_round([proven, empty]) is proven
    assert strategy.returned_round([empty]) is None
    assert strategy.wants_optimality_proof(proven, proven=False, asked_at=None)
    assert not strategy.wants_optimality_proof(proven, proven=False, asked_at=7)
    assert not strategy.wants_optimality_proof(proven, proven=True, asked_at=None)
    assert not strategy.wants_optimality_proof(matched, proven=False, asked_at=None)
    assert strategy.wants_emptiness_proof(fake_round(cp_model.INFEASIBLE, False), asked=False)
    assert not strategy.wants_emptiness_proof(fake_round(cp_model.INFEASIBLE, False), asked=True)
    assert strategy.should_widen(1, outside_objective=3.0, hint_objective=None, widened=False)
    assert strategy.should_widen(1, 3.0, 4.0, False) and not strategy.should_widen(1, 3.0, 3.0, False)
    assert not strategy.should_widen(None, 3.0, None, False) and not strategy.should_widen(1, None, None, False)
    assert not strategy.should_widen(1, 3.0, None, widened=True)


def test_a_run_without_a_plan_says_why(monkeypatch):
    """UNKNOWN without a plan names the cause, and the deepest space shown
    empty: here depth 1 is empty and the depth-2 search finds nothing."""
    solve_model = search.solve_model

    def nothing_at_depth_2(ctx, model, phase, limit, stop_at=None):
        if model.depth == 2:
            return search.Solve(cp_model.UNKNOWN, None, 0.0, 0.0)
        return solve_model(ctx, model, phase, limit, stop_at)

    monkeypatch.setattr(search, "solve_model", nothing_at_depth_2)
    g = synthetic.random_layered(16, seed=3)
    # depth rounds, and no time for the relaxations' proofs between them
    sol = solve(g, "cpsat", budget_ratio=0.9, time_limit=20, workers=1, warm_start="none",
                tuning=Tuning(full_model_pairs=0, proof_share=0.0))
    st = sol.plan.stats
    assert [(r["recompute_depth"], r["status"]) for r in st["rounds"]] == [(1, "INFEASIBLE"), (2, "UNKNOWN")]
    assert sol.status == "UNKNOWN" and st["reason"] == (
        "the time limit ran out before any plan within the budget was found "
        "(none recomputes within 1 producer hops of each stage's node)")
