"""Issue 28: every INFEASIBLE, every "no plan at peak <= P" and every OPTIMAL
of cpsat is a statement about the true byte counts, also where the model
counts memory in a unit that does not divide every size (sizes rounded up,
so its plans fit; its emptiness and bound then prove nothing, and the model
with sizes rounded down decides). Checked against the exhaustive search on
graphs whose sizes are large and coprime, as the importers make them."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from brute_force import min_cost, min_peak
from conftest import rematopt
from rematopt import Graph, Node, load, solve
from rematopt.planners.staged.units import memory_unit
from rematopt.reference import no_remat_peak, peak_lower_bound

CASE = Path(__file__).parent / "data" / "fuzz" / "inexact_unit_infeasible.json"
CPSAT = dict(time_limit=5.0, workers=1, seed=1)


def large_coprime(seed: int, n: int, size: int) -> Graph:
    """A random DAG of ``n`` nodes (one input, the last an output) whose
    sizes lie in [size, 4 size], all odd: no common unit, and a total that
    passes the model's memory ceiling once ``size`` is ~10^11."""
    rng = random.Random(seed)
    nodes, edges = [], []
    for i in range(n):
        nodes.append(Node(i, f"v{i}", op="add", kind="input" if i == 0 else "compute",
                          bytes=rng.randint(size, 4 * size) | 1, cost=0 if i == 0 else rng.randint(1, 5),
                          output=i == n - 1))
        edges += [[p, i] for p in rng.sample(range(i), k=min(i, rng.randint(1, 2)))] if i else []
    return Graph(f"coprime{seed}", nodes, edges)


def budgets(g: Graph) -> list[int]:
    lo, hi = peak_lower_bound(g), no_remat_peak(g)
    return sorted({lo, lo + (hi - lo) // 4, (lo + hi) // 2, hi})


@pytest.mark.parametrize("setting", [{}, {"offload": True}, {"objective": "peak"}, {"max_clone_expansion": 2.0}],
                         ids=["overhead", "offload", "peak", "clone"])
def test_a_plan_that_meets_the_budget_exactly_is_found(setting):
    """The reported case: INFEASIBLE at 734,698,077,409 B, which a plan meets exactly."""
    g = load(CASE)
    assert memory_unit(g) == (2, False)
    budget = peak_lower_bound(g)
    best = min_cost(g, budget, offload=bool(setting.get("offload")))
    assert best is not None and best[1] == budget  # the oracle's plan peaks at exactly the budget
    sol = solve(g, "cpsat", budget=budget, **CPSAT, **setting)
    assert sol.has_plan and sol.replay.peak_bytes <= budget, sol.plan.stats.get("reason")
    if "objective" not in setting and not setting.get("offload"):
        assert sol.replay.recompute_cost == best[0]


def test_the_hinted_run_agrees():
    """With a plan at exactly the budget as hint, the same: a plan, never INFEASIBLE."""
    g = load(CASE)
    budget = peak_lower_bound(g)
    hint = solve(g, "cpsat", budget=no_remat_peak(g), **CPSAT).plan
    sol = solve(g, "cpsat", budget=budget, hint=hint, **CPSAT)
    assert sol.plan.stats["status"] != "INFEASIBLE" and sol.has_plan


@pytest.mark.parametrize("seed", range(6))
def test_claims_hold_for_the_true_bytes(seed):
    """On large coprime sizes, at budgets from the working set to no-remat,
    with and without offload: INFEASIBLE only where the oracle finds no
    staged plan, OPTIMAL at most at the oracle's cost, every bound at most
    the staged optimum, and
    a stated basis for every OPTIMAL and INFEASIBLE."""
    g = large_coprime(seed, 5 + seed % 3, (3 * 10**11, 10**12, 2**45)[seed % 3])
    assert not memory_unit(g)[1]
    for budget in budgets(g):
        for offload in (False, True):
            best = min_cost(g, budget, offload=offload)
            sol = solve(g, "cpsat", budget=budget, offload=offload, **CPSAT)
            st = sol.plan.stats
            if st["status"] in ("OPTIMAL", "INFEASIBLE"):
                assert st.get("proved_by"), st
            if best is None:
                assert not sol.has_plan
                continue
            assert st["status"] != "INFEASIBLE", (budget, offload, best, st.get("reason"))
            if st.get("best_bound") is not None and not offload:
                assert st["best_bound"] <= best[0] + 1e-9
            if st["status"] == "OPTIMAL" and not offload:  # a fast planner's plan may beat every staged one
                assert sol.replay.recompute_cost <= best[0]


@pytest.mark.parametrize("seed", range(3))
def test_peak_claims_hold_for_the_true_bytes(seed):
    """Peak mode (the bisection's "no plan at peak <= P" probes): the bound
    at most the oracle's lowest peak, OPTIMAL only at it."""
    g = large_coprime(10 + seed, 5, 3 * 10**11)
    lowest = min_peak(g)[0]
    for cap in (None, 0.3):
        sol = solve(g, "cpsat", objective="peak", max_overhead=cap, **CPSAT)
        st = sol.plan.stats
        oracle = lowest if cap is None else min_peak(g, cost_cap=int(cap * sum(g.cost[i] for i in g.compute_ids)))[0]
        assert st["best_bound"] <= oracle <= sol.replay.peak_bytes
        if st["status"] == "OPTIMAL":
            assert sol.replay.peak_bytes == oracle and st.get("proved_by")


def test_an_empty_space_is_still_infeasible():
    """Below every plan's peak (but above the working set) the rounded-down
    model shows the staged space empty (UNKNOWN over all plans, INFEASIBLE
    in the staged space), and the claim names it."""
    for seed in range(40):
        g = large_coprime(100 + seed, 6, 3 * 10**11)
        lo = peak_lower_bound(g)
        if min_cost(g, lo) is None:
            break
    else:
        pytest.fail("no graph with an empty space at its working-set bound")
    sol = solve(g, "cpsat", budget=lo, **CPSAT)
    st = sol.plan.stats
    assert st["status"] == "UNKNOWN" and st["infeasible_in"] == "staged space" and not sol.has_plan
    assert sol.plan.stats["proved_by"] in ("gaps", "chains", "slots", "rounded-down model")


def test_a_negative_time_limit_is_refused():
    done = rematopt("solve", "--time-limit", "-1")
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "time-limit" in done.stderr
