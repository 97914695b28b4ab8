"""Warm starts for cpsat: the best fast plan, the projection of plans into the
staged space, staged eviction, and the peak search for a first plan within
the budget, all checked by replay."""

from __future__ import annotations

import math

import pytest
from ortools.sat.python import cp_model

from rematopt import solve
from rematopt.importers import synthetic
from rematopt.planners.cpsat import run, search, signals
from rematopt.planners.cpsat.tuning import TUNING, Tuning
from rematopt.planners.staged.backends import CpSatBackend
from rematopt.planners.staged.model import Formulation
from rematopt.planners.staged.solution import events, from_plan
from rematopt.planners.cpsat.warm_start import (best_within, fast_planners, fast_plans, lowest_peak,
                                                staged_eviction)
from rematopt.reference import no_remat_plan, resolve_budget
from rematopt.simulate import simulate

from brute_force import min_cost
from cpsat_cases import FAST, budget_between, cases, staged_status

GRAPHS = [synthetic.linear_training(8), synthetic.unet(2, train=True),
          synthetic.random_layered(30, seed=2), synthetic.chain(6, sinks=True)]


@pytest.mark.parametrize("g", GRAPHS, ids=lambda g: g.name[:20])
def test_best_fast_plan_is_valid_and_under_budget(g):
    budget = resolve_budget(g, ratio=0.9)
    p, _ = best_within(fast_plans(g, budget), budget)
    assert "cpsat" not in fast_planners()
    r = simulate(g, p)
    assert r.valid and r.peak_bytes <= budget


@pytest.mark.parametrize("g", [g for g in GRAPHS if not g.name.startswith("random")], ids=lambda g: g.name[:20])
@pytest.mark.parametrize("depth", [None, 1, 2])
def test_staged_eviction_meets_the_cap_in_the_model_space(g, depth):
    budget = resolve_budget(g, ratio=0.8)
    form = Formulation(g, CpSatBackend(), mem_cap_bytes=budget, depth=depth)
    a = staged_eviction(form)
    assert a is not None
    p = events(form, a)
    r = simulate(g, p)
    assert r.valid, r.error
    assert r.peak_bytes == max(max(a.memory(form).values()) * form.unit + form.persistent_bytes,
                               form.initial_bytes) <= budget  # the model's memory is the replay's
    assert all(k in form.R for k in a.R)


@pytest.mark.parametrize("g", GRAPHS, ids=lambda g: g.name[:20])
def test_no_remat_projects_onto_itself(g):
    form = Formulation(g, CpSatBackend())
    a = from_plan(form, no_remat_plan(g))
    assert a is not None
    r0, r1 = simulate(g, no_remat_plan(g)), simulate(g, events(form, a))
    assert r1.valid and r1.peak_bytes == r0.peak_bytes and r1.compute_cost == r0.compute_cost


def test_staged_eviction_gives_up_where_it_gets_stuck():
    """On this random layered graph at 0.8 staged eviction finds no first
    plan: it says so (None) rather than returning one that breaks the cap."""
    g = GRAPHS[2]
    form = Formulation(g, CpSatBackend(), mem_cap_bytes=resolve_budget(g, ratio=0.8))
    assert staged_eviction(form) is None


def test_staged_eviction_reaches_a_budget_compute_once_misses():
    g = synthetic.linear_training(8)
    budget = resolve_budget(g, ratio=0.7)
    form = Formulation(g, CpSatBackend(), mem_cap_bytes=budget)
    a = staged_eviction(form)
    assert a is not None
    r = simulate(g, events(form, a))
    assert r.valid and r.peak_bytes <= budget < simulate(g, no_remat_plan(g)).peak_bytes
    assert r.compute_events > len(g.compute_ids)


@pytest.mark.parametrize("g", GRAPHS, ids=lambda g: g.name[:20])
def test_fast_plans_rank_by_cost_within_the_budget_and_by_peak_without(g):
    budget = resolve_budget(g, ratio=0.8)
    plans = fast_plans(g, budget)
    assert plans and all(r.valid and simulate(g, p).peak_bytes == r.peak_bytes for p, r in plans)
    within = [(r.compute_cost, r.transfer_bytes) for p, r in plans if r.peak_bytes <= budget]
    best = best_within(plans, budget)
    if within:
        r = simulate(g, best[0])
        assert r.peak_bytes <= budget and (r.compute_cost, r.transfer_bytes) == min(within)
        assert r.peak_bytes == best[1].peak_bytes and r.compute_cost == best[1].compute_cost
    else:
        assert best is None
    low, replay = lowest_peak(plans)
    assert simulate(g, low).peak_bytes == replay.peak_bytes == min(r.peak_bytes for p, r in plans)
    assert lowest_peak([]) is None and best_within([], budget) is None


def test_a_round_with_no_start_finds_its_plan_by_minimising_the_peak(monkeypatch):
    """When the overhead search from nothing ends with neither plan nor proof
    (here: given no time at all) and the lowest-peak plan so far lies in the
    space (here: the no-remat plan, given as the hint), ``fit`` minimises the
    peak from it with the budget lifted and stops at the first plan that
    fits; the overhead search then resumes from it to the exhaustive optimum.
    Where no plan fits, the peak's bound proves the space empty: INFEASIBLE,
    as exhaustive search says."""
    solve_model = search.solve_model

    def starved(ctx, model, phase, limit, stop_at=None):
        if phase == "primary" and limit == 0:  # the first search of a round with no start
            return search.Solve(cp_model.UNKNOWN, None, 0.0, 0.0)
        return solve_model(ctx, model, phase, limit, stop_at)

    # the peak search at once, from the no-remat plan whatever its peak
    fit_at_once = Tuning(fit_after_share=0.0, min_round_s=0.0, fit_margin=math.inf)
    monkeypatch.setattr(search, "solve_model", starved)
    monkeypatch.setattr(run, "warm_start", lambda ctx, model, outside, spent: (None, None))
    monkeypatch.setattr(run, "fast_plans", lambda *a, **k: [])  # this is about the staged space alone
    monkeypatch.setattr(run, "cleaned", lambda ctx, plan, outside: outside)
    seen = {"OPTIMAL": 0, "INFEASIBLE": 0}
    for k, (g, rng) in enumerate(cases(5, every=False, count=80, seed=11)):
        budget, per_byte = budget_between(g, rng), k % 2
        expect = min_cost(g, budget, bool(per_byte), per_byte)
        sol = solve(g, "cpsat", budget=budget, offload=bool(per_byte), transfer_cost_per_byte=per_byte,
                    recompute_depth="full", tuning=fit_at_once, **{**FAST, "hint": no_remat_plan(g)})
        st = sol.plan.stats
        assert not st["interrupted"]
        if expect is None:
            assert staged_status(sol) == "INFEASIBLE"
            if st["rounds"]:  # not settled by the gap relaxation before any search: by the peak's bound
                assert st["rounds"][-1]["status"] == "INFEASIBLE"
                seen["INFEASIBLE"] += 1
        else:
            assert staged_status(sol) == "OPTIMAL" and st["objective"] == expect[0]
            assert st["warm_start"] == "peak search" and sol.replay.peak_bytes <= budget
            seen["OPTIMAL"] += 1
    assert seen["OPTIMAL"] >= 20 and seen["INFEASIBLE"] >= 3, seen


def test_the_peak_search_needs_a_start_near_the_budget(monkeypatch):
    """From a plan more than ``fit_margin`` over the budget (the no-remat plan at
    0.8) the peak search is not tried: the overhead search keeps the whole
    round (had it been cut for a peak search, it would get no time here), and
    reaches the full model's optimum."""
    def no_fit(*args):
        raise AssertionError("the peak search ran")

    fit_at_once = Tuning(fit_after_share=0.0, min_round_s=0.0)
    monkeypatch.setattr(search, "fit", no_fit)
    monkeypatch.setattr(run, "warm_start", lambda ctx, model, outside, spent: (None, None))
    for seed in range(3):
        g = synthetic.random_layered(12, seed=seed)
        budget = resolve_budget(g, ratio=0.8)
        assert simulate(g, no_remat_plan(g)).peak_bytes > (1 + TUNING.fit_margin) * budget
        sol = solve(g, "cpsat", budget=budget, recompute_depth="full", tuning=fit_at_once,
                    **{**FAST, "hint": no_remat_plan(g)})
        full = solve(g, "cpsat", budget=budget, recompute_depth="full", **FAST)
        assert sol.status == full.status
        assert sol.plan.stats.get("objective") == full.plan.stats.get("objective")
        assert sol.plan.stats["warm_start"] is None


def test_the_progress_line_shows_the_peak_search_until_a_plan_fits():
    trace = signals.Trace(0.0)
    assert "incumbent -  bound -" in signals.progress_line(trace)
    trace.solution("fit", 479_428.0, 300_000.0)
    assert signals.progress_line(trace).endswith("no plan within the budget yet, lowest peak 479,428 B")
    trace.solution("primary", 200.0, None)
    trace.new_bound("primary", 150.0)
    assert signals.progress_line(trace).endswith("incumbent 200  bound 150  gap 25.00%")


@pytest.mark.parametrize("cap", [0.0, 0.1, 0.5])
def test_budget_sweep_finds_low_peaks_within_the_overhead_cap(cap):
    """Peak objective with an overhead cap: the quick planners' sweep over
    budgets returns valid plans, the best admitted one within the cap and,
    when the cap allows any recompute that helps, below the no-remat peak."""
    from types import SimpleNamespace

    from rematopt.planners.cpsat.run import admit, budget_sweep
    from rematopt.planners.cpsat.settings import Settings
    from rematopt.reference import no_remat_peak

    g = synthetic.linear_training(16)
    ctx = SimpleNamespace(graph=g, cfg=Settings.parse(None, {"objective": "peak", "max_overhead": cap}))
    start = fast_plans(g, None, planners=("dtr", "greedy"))
    found = budget_sweep(ctx, start)
    assert found and all(r.valid for _, r in found)
    admitted = [r for p, r in found if admit(ctx, p, r, p.planner) is not None]
    assert all(r.recompute_cost <= cap * r.base_cost + 1e-12 for r in admitted)
    best = min((r.peak_bytes for r in admitted), default=no_remat_peak(g))
    assert (best < no_remat_peak(g)) == (cap > 0)


def test_where_no_fast_plan_meets_the_budget_dtr_asked_for_a_little_more_may():
    """The committed 2-layer decoder at 0.6 of its no-remat peak: greedy and dtr end over the budget,
    dtr asked for 1.1 of it ends under; the plan kept replays under the run's budget. Where a fast plan
    meets the budget nothing more runs."""
    from pathlib import Path
    from types import SimpleNamespace

    from rematopt.fused_reads import fused_reads
    from rematopt.importers import load
    from rematopt.planners.cpsat.run import admit, looser_budgets
    from rematopt.planners.cpsat.settings import Settings
    from rematopt.reference import no_remat_peak

    decoder = load(Path(__file__).resolve().parents[1] / "instances" / "gpt_l2_w64.json")
    g = fused_reads(decoder)  # the graph cpsat plans on
    budget = int(0.6 * no_remat_peak(decoder))
    ctx = SimpleNamespace(graph=g, cfg=Settings.parse(budget, {}))
    at_budget = fast_plans(g, budget, planners=("greedy", "dtr"))
    assert not any(admit(ctx, p, r, p.planner) for p, r in at_budget)
    found = looser_budgets(ctx, at_budget, deadline=math.inf)
    assert found and all(r.valid and r.peak_bytes <= budget and admit(ctx, p, r, p.planner) for p, r in found)
    assert looser_budgets(ctx, found, deadline=math.inf) == []


def test_xla_remat_runs_right_after_the_quick_planners():
    """Its moves beat every staged plan at loose budgets, and it takes under a
    second: it runs before rotor and the rest, so a short warm-start share
    still reaches it (after rotor, the decoder's 15 s share ran out first)."""
    g = synthetic.random_layered(14, seed=3)
    ran = []
    fast_plans(g, resolve_budget(g, ratio=0.85), on_plan=lambda p, r: ran.append(p.planner))
    assert ran[:3] == ["greedy", "dtr", "xla-remat"] and "chen-greedy" in ran[3:]
    assert fast_planners().index("xla-remat") < fast_planners().index("rotor")


def test_a_plan_outside_the_space_that_costs_nothing_is_optimal():
    """p is read only after c: computing it later (xla-remat's move, or
    greedy's) fits every budget down to the working set with no recompute,
    where a staged plan must drop and recompute p. Nothing costs less than
    nothing, so that plan is OPTIMAL in any space; one that costs more stays
    FEASIBLE (random_layered(14, seed=3) at 0.85: xla-remat's 486)."""
    from test_gap_study import move_graph

    g = move_graph()
    for budget in (22, 25):
        sol = solve(g, "cpsat", budget=budget, time_limit=10, workers=1)
        st = sol.plan.stats
        assert sol.replay.peak_bytes <= budget and sol.replay.compute_cost == sum(g.cost[i] for i in g.compute_ids)
        assert st["status"] == "OPTIMAL" and st["proved_by"] == "zero cost" and st["plan_from"]
        assert st["best_bound"] == 0.0 and st["gap"] == 0.0
    g = synthetic.random_layered(14, seed=3)
    sol = solve(g, "cpsat", budget=resolve_budget(g, ratio=0.85), time_limit=10, workers=1)
    st = sol.plan.stats
    assert st.get("plan_from") and st["objective"] > 0 and st["status"] == "FEASIBLE"
