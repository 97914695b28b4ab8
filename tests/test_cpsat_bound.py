"""The relaxations of ``cpsat_bound`` (gaps alone, and with recompute
chains, and with a recompute's slot memory): lower bounds for the whole staged space, checked against exhaustive
search and the full model, and how ``cpsat`` uses them to claim whole-space
optimality from a depth-restricted solve."""

from __future__ import annotations

import math
import random
import time

import pytest
from ortools.sat.python import cp_model

from rematopt import solve
from rematopt.graph import Graph
from rematopt.importers import synthetic
from rematopt.planners.cpsat_bound import LEVELS, relaxation_bound
from rematopt.planners.cpsat_model import integer_scale
from rematopt.reference import no_remat_peak, peak_lower_bound

from brute_force import min_cost, min_peak
from test_cpsat import FAST, budget_between, cases
from rematopt.importers import load as load_graph


def bound(g: Graph, budget: int | None, offload: bool = False, per_byte: int = 0, objective: str = "overhead",
          overhead_cap: int | None = None, level: str = "gaps", below: int | None = None,
          max_recomputes: int | None = None):
    """A relaxation on a tiny graph (integer costs and bytes: unit 1, scale 1)."""
    pinned = sum(v.bytes for v in g.nodes if v.persistent)
    cap = sum(g.bytes) if budget is None else budget - pinned
    return relaxation_bound(g, level=level, objective=objective, unit=1, cap_units=cap,
                            int_cost=[int(c) for c in g.cost], int_transfer=[b * per_byte for b in g.bytes],
                            offload=offload, overhead_cap=overhead_cap, max_recomputes=max_recomputes,
                            peak_floor=0, below=below)


def check_below_exhaustive(g: Graph, budget: int, offload: bool, per_byte: int, tally: list[int]) -> None:
    """Every level stays at or below the exhaustive optimum (infeasible only
    when no plan exists), chains and slots at or above gaps; and asked whether
    a plan as good as the optimum exists, neither says no."""
    expect = min_cost(g, budget, offload, per_byte)
    got = {level: bound(g, budget, offload, per_byte, level=level) for level in LEVELS}
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


@pytest.mark.parametrize("n", [4, 5])
def test_bounds_never_exceed_the_exhaustive_optimum_on_every_shape(n):
    tally = [0, 0]
    for g, rng in cases(n, every=True, count=0, seed=100 + n):
        check_below_exhaustive(g, budget_between(g, rng), False, 0, tally)
    assert tally[0] > 0  # the bound is often the optimum itself on tiny graphs
    assert tally[1] > 0 or n < 5  # 4 nodes leave no room for a recompute chain


@pytest.mark.parametrize("n,count", [(5, 60), (6, 20)])
def test_bounds_never_exceed_the_exhaustive_optimum_with_offload(n, count):
    tally = [0, 0]
    for g, rng in cases(n, every=False, count=count, seed=200 + n):
        check_below_exhaustive(g, budget_between(g, rng), True, rng.choice([0, 1, 2]), tally)
    assert tally[0] > 0


@pytest.mark.parametrize("level", LEVELS)
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


@pytest.mark.parametrize("level", LEVELS)
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
        if sol.status == "OPTIMAL":
            assert got.status == "OPTIMAL" and got.bound <= sol.plan.stats["objective"] + 1e-9
            tally += got.bound > 0
        elif got.status != "INFEASIBLE":
            assert sol.status == "INFEASIBLE" and got.status == "OPTIMAL"
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
    if sol.status == "INFEASIBLE":
        return
    assert sol.status == "OPTIMAL" and relax["status"] == "OPTIMAL"
    optimum = sol.plan.stats["objective"]
    assert relax["bound"] <= optimum + 1e-9
    scale, _ = integer_scale([g.cost[i] for i in g.compute_ids])
    unit = math.gcd(*[v.bytes for v in g.nodes if not v.persistent])
    pinned = sum(v.bytes for v in g.nodes if v.persistent)
    for level in ("chains", "slots"):
        got = relaxation_bound(g, level=level, objective="overhead", unit=unit, cap_units=(budget - pinned) // unit,
                               int_cost=[math.floor(c * scale + 1e-9) for c in g.cost], int_transfer=[0] * g.n,
                               offload=False, time_limit=20)
        assert got.status == "OPTIMAL" and relax["bound"] <= got.bound / scale <= optimum + 1e-9


def test_each_level_sees_more_than_the_one_before():
    """A 14-node random layered graph at 0.9: each level's optimum is higher,
    up to the full model's (1,660); at 0.7 on another, only slots sees that
    no staged plan fits, which the full model confirms."""
    g = synthetic.random_layered(14, seed=5)
    budget = int(0.9 * no_remat_peak(g))
    got = [bound(g, budget, level=level).bound for level in LEVELS]
    full = solve(g, "cpsat", budget=budget, recompute_depth="full", **FAST)
    assert full.status == "OPTIMAL" and got[0] < got[1] < got[2] <= full.plan.stats["objective"]
    g = synthetic.random_layered(14, seed=8)
    budget = int(0.7 * no_remat_peak(g))
    got = [bound(g, budget, level=level).status for level in LEVELS]
    assert got == ["OPTIMAL", "OPTIMAL", "INFEASIBLE"]
    assert solve(g, "cpsat", budget=budget, recompute_depth="full", **FAST).status == "INFEASIBLE"


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
    a relaxation reaches it (OPTIMAL, best_bound = objective): the gap one, or
    a stronger one asked whether any staged plan does better; otherwise it is
    FEASIBLE with the relaxations' best bound, the subspace's own status and
    bound kept apart, and the full model's optimum lies in between."""
    import rematopt.planners.cpsat as cpsat

    monkeypatch.setattr(cpsat, "FULL_MODEL_PAIRS", 0)
    monkeypatch.setattr(cpsat, "FULL_ROUND_PAIRS", 0)  # no full round either
    monkeypatch.setattr(cpsat, "DOUBLING_SHARE", 1.0)  # an empty depth-1 space is followed by depth 2
    seen = set()
    for seed, ratio in ((1, 0.9), (1, 0.8), (6, 0.9)):
        g = synthetic.random_layered(16, seed=seed)
        # no warm start: its plan's recomputes could widen the depth-1 space
        sol = solve(g, "cpsat", budget_ratio=ratio, time_limit=20, workers=1, warm_start="none")
        st = sol.plan.stats
        assert st["space"].startswith("depth ") and st["space_status"] == "OPTIMAL" and st["space_gap"] == 0.0
        proofs = st.get("relaxation_proofs", [])
        relax = max([st["gap_relaxation"]["bound"]] + [p["bound"] for p in proofs if p["bound"] is not None])
        assert st["best_bound"] == min(relax, st["objective"])
        full = solve(g, "cpsat", budget_ratio=ratio, time_limit=20, workers=1, recompute_depth="full")
        assert full.status == "OPTIMAL" and full.plan.stats["space"] == "staged"
        assert st["best_bound"] <= full.plan.stats["objective"] <= st["objective"]
        if st["objective"] <= relax:
            assert st["status"] == "OPTIMAL" and st["gap"] == 0.0
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
        assert sol.status == "OPTIMAL" and st["best_bound"] == st["objective"] > 0
        assert st["gap_relaxation"]["bound"] == st["objective"]


def test_slots_prove_random_layered_n100_optimal_over_the_whole_space(benchmarks_dir):
    """random_layered_n100 at 0.8: the slot relaxation's optimum is the
    optimum itself (the gaps give 573, the chains 741), so a restricted round's
    plan is proven optimal without the full model."""
    g = load_graph(benchmarks_dir / "random_layered_n100.json")
    sol = solve(g, "cpsat", budget_ratio=0.8, time_limit=60, workers=2, lp_bound=False)
    st = sol.plan.stats
    assert sol.status == "OPTIMAL" and st["space"].startswith("depth ")
    assert any(p["level"] == "slots" and p["status"] == "INFEASIBLE" for p in st["relaxation_proofs"])
    got = relaxation_bound(g, level="slots", objective="overhead", unit=1, cap_units=int(0.8 * no_remat_peak(g)),
                           int_cost=[int(c) for c in g.cost], int_transfer=[0] * g.n, offload=False,
                           time_limit=60, workers=2)
    assert got.status == "OPTIMAL" and got.bound == st["objective"]


def test_a_search_without_an_answer_still_lends_its_bound(benchmarks_dir):
    """random_layered_n250 at 0.8: asked for a solution below 5,484 (the
    target gap's bound), chains finds none and proves nothing in 15 s, yet its
    bound so far (2,596 measured) beats the gaps' 1,828 and stays below the
    best plan known (5,734)."""
    g = load_graph(benchmarks_dir / "random_layered_n250.json")
    kw = dict(objective="overhead", unit=1, cap_units=int(0.8 * no_remat_peak(g)),
              int_cost=[int(c) for c in g.cost], int_transfer=[0] * g.n, offload=False, workers=2)
    gaps = relaxation_bound(g, level="gaps", time_limit=15, **kw)
    got = relaxation_bound(g, level="chains", below=5_483, time_limit=15, **kw)
    assert gaps.status == "OPTIMAL" and got.status in ("UNKNOWN", "FEASIBLE")
    assert gaps.bound < got.bound <= 5_734


def test_a_relaxation_too_big_to_build_is_skipped_and_the_rounds_go_on(monkeypatch):
    """Above MAX_PAIRS the chains and slots models are not built: SKIPPED,
    no bound claimed, and the solve continues with the deeper rounds."""
    import rematopt.planners.cpsat as cpsat
    import rematopt.planners.cpsat_bound as cpsat_bound

    monkeypatch.setattr(cpsat_bound, "MAX_PAIRS", 0)
    monkeypatch.setattr(cpsat, "FULL_MODEL_PAIRS", 0)
    monkeypatch.setattr(cpsat, "DOUBLING_SHARE", 1.0)  # an empty depth-1 space is followed by depth 2
    g = synthetic.random_layered(16, seed=1)
    budget = int(0.8 * no_remat_peak(g))
    for level in ("chains", "slots"):
        assert bound(g, budget, level=level).status == "SKIPPED"
    assert bound(g, budget, level="gaps").status == "OPTIMAL"  # gaps is never skipped
    sol = solve(g, "cpsat", budget=budget, time_limit=20, workers=1)
    st = sol.plan.stats
    assert [p["status"] for p in st["relaxation_proofs"]][:2] == ["SKIPPED", "SKIPPED"]
    assert [r["recompute_depth"] for r in st["rounds"]][:2] == [1, 2] and not st["interrupted"]


def test_a_starved_full_round_leaves_the_proven_rounds_plan_and_lends_its_bound(monkeypatch):
    """A full round that runs out of time without improving on a restricted
    round's proven optimum does not speak for the plan: ``space`` and
    ``space_status`` stay with the round that proved it (the full round shows
    in ``rounds``), the tie-break runs on that round's model, and the full
    model's bound, valid for the whole space, still counts in ``best_bound``."""
    import rematopt.planners.cpsat as cpsat

    build, solve_phase = cpsat.CpSatRun.build, cpsat.CpSatRun.solve_phase

    def track(self, depth):
        self.depth_built = depth
        return build(self, depth)

    def starve(self, phase, limit):  # the full round's search gets no time
        return solve_phase(self, phase, 1e-3 if phase == "primary" and self.depth_built is None else limit)

    for seed, ratio in ((3, 0.9), (6, 0.9), (9, 0.9), (14, 0.8)):  # depth 2 proven, the gaps bound below it
        g = synthetic.random_layered(16, seed=seed)
        full = solve(g, "cpsat", budget_ratio=ratio, time_limit=20, workers=1, recompute_depth="full")
        with monkeypatch.context() as m:
            m.setattr(cpsat, "FULL_MODEL_PAIRS", 0)  # rounds, even on a small graph
            m.setattr(cpsat.CpSatRun, "relaxation_proof", lambda self, best: [])  # no proof between rounds
            m.setattr(cpsat.CpSatRun, "build", track)
            m.setattr(cpsat.CpSatRun, "solve_phase", starve)
            sol = solve(g, "cpsat", budget_ratio=ratio, time_limit=20, workers=1, warm_start="none")
        st = sol.plan.stats
        last, proven = st["rounds"][-1], [r for r in st["rounds"] if r["status"] == "OPTIMAL"]
        assert last["recompute_depth"] == "full" and last["status"] == "FEASIBLE" and proven
        # the full round started from the proven optimum and could only match it
        assert last["objective"] == proven[-1]["objective"] == st["objective"]
        assert st["space"] == f"depth {proven[-1]['recompute_depth']}"
        assert st["space_status"] == "OPTIMAL" and st["space_gap"] == 0.0 and st["lexicographic"]
        assert st["best_bound"] >= min(last["best_bound"], st["objective"])
        assert full.status == "OPTIMAL" and st["best_bound"] <= full.plan.stats["objective"] <= st["objective"]
        assert st["status"] == ("OPTIMAL" if st["best_bound"] >= st["objective"] else "FEASIBLE")


def test_without_a_plan_a_deeper_round_needs_only_the_minimum_time():
    """With a plan to keep, a deeper round starts only with twice the time
    spent left; without one any attempt beats none, so MIN_ROUND_S is enough."""
    import rematopt.planners.cpsat as cpsat

    g = synthetic.random_layered(16, seed=3)
    run = cpsat.CpSatRun(g, cpsat.Settings.parse(int(0.9 * no_remat_peak(g)), {"time_limit": 20}))
    run.start, run.proof_s, run.interrupted = time.perf_counter() - 12, 0.0, False  # 8 s left
    assert run.next_round(2, cp_model.INFEASIBLE, found=False)
    assert not run.next_round(2, cp_model.OPTIMAL, found=True)  # 24 s would be needed
    assert not run.next_round(2, cp_model.UNKNOWN, found=False)  # an unproven round ends the rounds
    run.start = time.perf_counter() - 16  # 4 s left: less than MIN_ROUND_S
    assert not run.next_round(2, cp_model.INFEASIBLE, found=False)


def test_a_run_without_a_plan_says_why(monkeypatch):
    """UNKNOWN without a plan names the cause, and the deepest space shown
    empty: here depth 1 is empty and the depth-2 search finds nothing."""
    import rematopt.planners.cpsat as cpsat

    build, solve_phase = cpsat.CpSatRun.build, cpsat.CpSatRun.solve_phase

    def track(self, depth):
        self.depth_built = depth
        return build(self, depth)

    def nothing_at_depth_2(self, phase, limit, stop_at=None):
        if self.depth_built == 2:
            return cp_model.UNKNOWN, None, 0.0, 0.0
        return solve_phase(self, phase, limit, stop_at)

    monkeypatch.setattr(cpsat, "FULL_MODEL_PAIRS", 0)
    monkeypatch.setattr(cpsat.CpSatRun, "relaxation_proof", lambda self, best: [])
    monkeypatch.setattr(cpsat.CpSatRun, "build", track)
    monkeypatch.setattr(cpsat.CpSatRun, "solve_phase", nothing_at_depth_2)
    g = synthetic.random_layered(16, seed=3)
    sol = solve(g, "cpsat", budget_ratio=0.9, time_limit=20, workers=1, warm_start="none")
    st = sol.plan.stats
    assert [(r["recompute_depth"], r["status"]) for r in st["rounds"]] == [(1, "INFEASIBLE"), (2, "UNKNOWN")]
    assert sol.status == "UNKNOWN" and st["reason"] == (
        "the time limit ran out before any plan within the budget was found "
        "(none recomputes within 1 producer hops of each stage's node)")
