"""The gap relaxation (``cpsat_bound``): a lower bound for the whole staged
space, checked against exhaustive search and the full model, and how ``cpsat``
uses it to claim whole-space optimality from a depth-restricted solve."""

from __future__ import annotations

import random

import pytest

from rematopt import solve
from rematopt.graph import Graph
from rematopt.importers import synthetic
from rematopt.planners.cpsat_bound import gap_bound
from rematopt.reference import no_remat_peak, peak_lower_bound

from brute_force import min_cost, min_peak
from test_cpsat import FAST, budget_between, cases


def bound(g: Graph, budget: int | None, offload: bool = False, per_byte: int = 0, objective: str = "overhead",
          overhead_cap: int | None = None):
    """The relaxation on a tiny graph (integer costs and bytes: unit 1, scale 1)."""
    pinned = sum(v.bytes for v in g.nodes if v.persistent)
    cap = sum(g.bytes) if budget is None else budget - pinned
    return gap_bound(g, objective=objective, unit=1, cap_units=cap, int_cost=[int(c) for c in g.cost],
                     int_transfer=[b * per_byte for b in g.bytes], offload=offload, overhead_cap=overhead_cap,
                     peak_floor=0)


def check_below_exhaustive(g: Graph, budget: int, offload: bool, per_byte: int, tally: list[int]) -> None:
    expect = min_cost(g, budget, offload, per_byte)
    got = bound(g, budget, offload, per_byte)
    if got.status == "INFEASIBLE":
        assert expect is None, f"relaxation infeasible, exhaustive search finds cost {expect[0]}"
        return
    assert got.status == "OPTIMAL"
    if expect is not None:
        assert got.bound <= expect[0]
        tally[0] += got.bound == expect[0] and expect[0] > 0  # tight and not trivially so


@pytest.mark.parametrize("n", [4, 5])
def test_bound_never_exceeds_the_exhaustive_optimum_on_every_shape(n):
    tally = [0]
    for g, rng in cases(n, every=True, count=0, seed=100 + n):
        check_below_exhaustive(g, budget_between(g, rng), False, 0, tally)
    assert tally[0] > 0  # the bound is often the optimum itself on tiny graphs


@pytest.mark.parametrize("n,count", [(5, 60), (6, 20)])
def test_bound_never_exceeds_the_exhaustive_optimum_with_offload(n, count):
    tally = [0]
    for g, rng in cases(n, every=False, count=count, seed=200 + n):
        check_below_exhaustive(g, budget_between(g, rng), True, rng.choice([0, 1, 2]), tally)
    assert tally[0] > 0


def test_peak_bound_never_exceeds_the_exhaustive_optimum():
    """Objective peak: the relaxation's smallest stage memory, with and without
    an overhead cap, is at most the lowest peak a plan reaches under that cap."""
    for g, rng in cases(4, every=True, count=0, seed=300):
        pinned = sum(v.bytes for v in g.nodes if v.persistent)
        cap = rng.choice([None, 0, 3])
        expect = min_peak(g, cost_cap=cap)
        got = bound(g, None, objective="peak", overhead_cap=cap)
        if expect is None:
            continue
        assert got.status == "OPTIMAL" and got.bound + pinned <= expect[0]


@pytest.mark.parametrize("seed", range(6))
def test_bound_never_exceeds_the_full_models_optimum(seed):
    """On graphs too big for exhaustive search, the full staged model proven
    optimal is the reference: random layered DAGs and training graphs."""
    rng = random.Random(seed)
    g = (synthetic.random_layered(16, seed=seed) if seed % 2 else synthetic.unet(2, train=True, seed=seed))
    budget = budget_between(g, rng)
    sol = solve(g, "cpsat", budget=budget, recompute_depth="full", **FAST)
    relax = sol.plan.stats["gap_relaxation"]
    if sol.status == "INFEASIBLE":
        return
    assert sol.status == "OPTIMAL" and relax["status"] == "OPTIMAL"
    assert relax["bound"] <= sol.plan.stats["objective"] + 1e-9


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
        assert sol.status == "INFEASIBLE" and "gap relaxation" in sol.plan.stats["reason"]
        assert sol.plan.stats["rounds"] == [] and min_cost(g, budget) is None
        found += 1
    assert found >= 10


def test_a_restricted_solve_claims_the_whole_space_only_when_the_bound_meets_it(monkeypatch):
    """With auto depth on a model too big for the whole space, only a depth-
    restricted subspace is solved. Its optimum is the whole space's only when
    the gap relaxation reaches it (OPTIMAL, best_bound = objective); otherwise
    it is FEASIBLE with the relaxation's bound, the subspace's own status and
    bound kept apart, and the full model's optimum lies in between."""
    import rematopt.planners.cpsat as cpsat

    monkeypatch.setattr(cpsat, "FULL_MODEL_PAIRS", 0)
    monkeypatch.setattr(cpsat, "FULL_ROUND_PAIRS", 0)  # no full round either
    seen = set()
    g = synthetic.random_layered(16, seed=1)
    for ratio in (0.9, 0.8):
        sol = solve(g, "cpsat", budget_ratio=ratio, time_limit=20, workers=1)
        st = sol.plan.stats
        assert st["space"].startswith("depth ") and st["space_status"] == "OPTIMAL" and st["space_gap"] == 0.0
        relax = st["gap_relaxation"]["bound"]
        assert st["best_bound"] == min(relax, st["objective"])
        full = solve(g, "cpsat", budget_ratio=ratio, time_limit=20, workers=1, recompute_depth="full")
        assert full.status == "OPTIMAL" and full.plan.stats["space"] == "staged"
        assert st["best_bound"] <= full.plan.stats["objective"] <= st["objective"]
        if st["objective"] <= relax:
            assert st["status"] == "OPTIMAL" and st["gap"] == 0.0
        else:
            assert st["status"] == "FEASIBLE" and st["gap"] == pytest.approx((st["objective"] - relax) / st["objective"])
        seen.add(st["status"])
    assert seen == {"OPTIMAL", "FEASIBLE"}


def test_published_checkmate_graphs_are_proven_over_the_whole_space(benchmarks_dir):
    """On vgg16_train and mobilenet_train at 0.9 the relaxation reaches the
    optimum of a restricted (or the full) solve: whole-space OPTIMAL."""
    for name in ("vgg16_train", "mobilenet_train"):
        g = Graph.load(benchmarks_dir / f"{name}.json")
        sol = solve(g, "cpsat", budget_ratio=0.9, time_limit=30, workers=2, lp_bound=False)
        st = sol.plan.stats
        assert sol.status == "OPTIMAL" and st["best_bound"] == st["objective"] > 0
        assert st["gap_relaxation"]["bound"] == st["objective"]
