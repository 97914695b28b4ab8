"""Large-neighbourhood search (planners/cpsat/lns.py): it never worsens the
incumbent, every plan it keeps replays within the budget, a window over
every stage reaches the exhaustive optimum, it stops at its deadline, and
``--lns`` is read and run by cpsat."""

from __future__ import annotations

import math
import subprocess
import sys
import time

import pytest
from ortools.sat.python import cp_model

from rematopt import solve
from rematopt.errors import PlannerError
from rematopt.importers import synthetic
from rematopt.planners.cpsat import lns
from rematopt.planners.staged.backends import CpSatBackend
from rematopt.planners.staged.model import Model, build
from rematopt.planners.cpsat.settings import Settings
from rematopt.planners.cpsat.tuning import Tuning
from rematopt.planners.staged.solution import Assignment, events, from_plan
from rematopt.planners.cpsat.warm_start import staged_eviction
from rematopt.reference import no_remat_plan, resolve_budget
from rematopt.simulate import simulate

from brute_force import min_cost, min_peak
from cpsat_cases import budget_between, cases


def model_of(g, budget, depth=None, objective="overhead") -> Model:
    return build(g, CpSatBackend(), objective=objective, mem_cap_bytes=budget, offload=False,
                 transfer_cost_per_byte=0.0, cost_scale=1, depth=depth)


def first_solution(model: Model) -> Assignment | None:
    """Any solution of ``model``: the first one CP-SAT finds."""
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    solver.parameters.stop_after_first_solution = True
    solver.parameters.max_time_in_seconds = 10
    if solver.solve(model.backend.model) not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None
    return Assignment.from_values(model.form, solver.value)


def replay(model: Model, a: Assignment):
    return simulate(model.form.graph, events(model.form, a))


CASES = [(synthetic.random_layered(n, seed=seed), ratio, depth)
         for n, seed, ratio, depth in [(40, 1, 0.8, None), (60, 2, 0.7, 1), (80, 4, 0.9, 2), (100, 6, 0.8, 2),
                                       (150, 8, 0.8, 1)]]


@pytest.mark.parametrize("g, ratio, depth", CASES, ids=[f"{g.name}-{r}-{d}" for g, r, d in CASES])
def test_lns_never_worsens_and_every_kept_plan_replays_within_budget(g, ratio, depth):
    budget = resolve_budget(g, ratio=ratio)
    model = model_of(g, budget, depth)
    start = staged_eviction(model.form)
    assert start is not None and model.admissible(start)
    before = model.objective_of(start)
    kept = []
    res = lns.improve(model, start, deadline=time.perf_counter() + 120, workers=1, budget=budget, width=3,
                      on_improve=kept.append, tuning=Tuning(max_windows=12))
    assert res.before == before and res.after == model.objective_of(res.best) <= before
    assert res.windows and all(w.after <= w.before for w in res.windows)
    objectives = [model.objective_of(a) for a in kept]
    assert objectives == sorted(objectives, reverse=True) and len(set(objectives)) == len(objectives)
    assert (res.after < before) == bool(kept) == any(w.after < w.before for w in res.windows)
    for a in kept + [res.best]:
        assert model.admissible(a)
        r = replay(model, a)
        assert r.valid and r.peak_bytes <= budget, r.error
        assert r.recompute_cost == model.overhead_of(a)  # integer costs, scale 1


def test_lns_improves_a_poor_start_on_some_graph():
    """The property above is not vacuous: from staged eviction, windows of a
    few stages lower the cost on these graphs."""
    gains = []
    for g, ratio, depth in CASES[1:4]:
        budget = resolve_budget(g, ratio=ratio)
        model = model_of(g, budget, depth)
        start = staged_eviction(model.form)
        res = lns.improve(model, start, deadline=time.perf_counter() + 120, workers=1, budget=budget, width=4,
                          tuning=Tuning(max_windows=8))
        gains.append(res.before - res.after)
    assert any(x > 0 for x in gains), gains


@pytest.mark.parametrize("seed", range(3))
def test_one_window_over_every_stage_reaches_the_exhaustive_optimum(seed):
    solved = 0
    for g, rng in cases(5, every=False, count=12, seed=seed):
        budget = budget_between(g, rng)
        exact = min_cost(g, budget)
        model = model_of(g, budget)
        start = first_solution(model)
        assert (start is None) == (exact is None)
        if start is None:
            continue
        res = lns.improve(model, start, deadline=time.perf_counter() + 120, workers=1, budget=budget,
                          width=model.form.ix.T)  # stops when exhausted
        assert res.exhausted and res.after == exact[0], (g.to_dict(), budget)
        solved += 1
    assert solved >= 6


@pytest.mark.parametrize("seed", range(2))
def test_peak_lns_over_every_stage_reaches_the_lowest_peak(seed):
    for g, _ in cases(5, every=False, count=8, seed=10 + seed):
        model = model_of(g, None, objective="peak")
        start = from_plan(model.form, no_remat_plan(g))
        res = lns.improve(model, start, deadline=time.perf_counter() + 120, workers=1, width=model.form.ix.T)  # till exhausted
        assert res.after <= res.before
        assert model.to_bytes(res.after) == min_peak(g)[0] == replay(model, res.best).peak_bytes


def test_peak_lns_with_narrow_windows_keeps_the_peak_it_claims():
    g = synthetic.random_layered(80, seed=7)
    model = model_of(g, None, objective="peak")
    start = from_plan(model.form, no_remat_plan(g))
    # four windows, the deadline only a safety net: as much work on a loaded machine as on an idle one
    res = lns.improve(model, start, deadline=time.perf_counter() + 120, workers=1, width=5,
                      tuning=Tuning(max_windows=4))
    assert res.after <= res.before and (len(res.windows) == 4 or res.exhausted)
    assert replay(model, res.best).peak_bytes == model.to_bytes(res.after)


def test_lns_stops_at_its_deadline():
    g = synthetic.random_layered(250, seed=1)
    budget = resolve_budget(g, ratio=0.8)
    model = model_of(g, budget, depth=1)
    start = staged_eviction(model.form)
    for left in (0.0, 1.5):
        began = time.perf_counter()
        res = lns.improve(model, start, deadline=began + left, workers=1, budget=budget, width=200)
        assert time.perf_counter() - began < left + 1.5  # the last window's limit is the time left
        assert all(w.seconds <= left + 0.5 for w in res.windows)
    assert not lns.improve(model, start, deadline=time.perf_counter(), workers=1).windows


def test_the_lns_option_is_read_and_refused_in_one_line():
    assert Settings.parse(100, {}).lns == "auto"
    assert Settings.parse(100, {"lns": "off"}).lns == "off"
    with pytest.raises(PlannerError, match="^cpsat: lns must be one of auto, on, off, got 'yes'$"):
        Settings.parse(100, {"lns": "yes"})
    out = subprocess.run([sys.executable, "-m", "rematopt", "solve", "--lns", "maybe", "--budget-ratio", "0.9"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "maybe" in out.stderr and "Traceback" not in out.stderr, out.stderr


def test_auto_turns_lns_on_for_large_models_only():
    small = model_of(synthetic.random_layered(40, seed=1), None, objective="peak")
    assert small.variables < lns.AUTO_VARIABLES
    assert not lns.wanted("auto", small) and lns.wanted("on", small) and not lns.wanted("off", small)


def test_cpsat_with_lns_on_returns_a_plan_at_least_as_good_within_the_limit():
    g = synthetic.random_layered(500, seed=1)
    budget = resolve_budget(g, ratio=0.8)
    form = model_of(g, budget, depth=1).form
    hint = events(form, staged_eviction(form))  # the warm start's, were it not cut short on a loaded machine
    # The round gets a tenth of the limit, LNS three windows, no bound after them: the same work on a loaded
    # machine as on an idle one, the limit a safety net (a 10 s run shared half and half ran no window under load).
    sol = solve(g, "cpsat", budget=budget, time_limit=60, workers=1, seed=1, lp_bound=False, recompute_depth=1,
                lns="on", hint=hint, tuning=Tuning(lns_share=0.9, max_windows=3, min_after_s=math.inf))
    st = sol.plan.stats
    assert sol.replay.valid and sol.replay.peak_bytes <= sol.budget
    assert sol.wall_s < 60
    rounds = st["rounds"]
    assert rounds[-1]["status"] == "FEASIBLE"  # the depth-1 optimum takes longer (58 s on 2 workers)
    info = st["lns"]
    # the round left LNS its share of the time: its three windows ran
    assert info["windows"] == 3 and info["objective_after"] <= info["objective_before"]
    assert info["objective_before"] == rounds[-1]["objective"]
    assert st["objective"] == sol.replay.recompute_cost
    # LNS's plan, or the same cleaned of the computations nobody reads (cheaper)
    assert st["objective"] == info["objective_after"] or (st["plan_from"] == "cpsat+dce"
                                                          and st["objective"] < info["objective_after"])
    off = solve(g, "cpsat", budget_ratio=0.8, time_limit=2, workers=1, lp_bound=False, recompute_depth=1,
                lns="off")
    assert "lns" not in off.plan.stats


@pytest.mark.parametrize("g, ratio, depth", CASES[1:4], ids=[f"{g.name}-{r}-{d}" for g, r, d in CASES[1:4]])
def test_cone_windows_free_whole_lives_and_never_worsen(g, ratio, depth):
    """A cone is a value the incumbent pays for and its neighbours; its
    window frees their variables over their whole lives and the memory of
    the stages between, whatever their distance; cones alone (every other
    window) keep every property of the search."""
    import random

    budget = resolve_budget(g, ratio=ratio)
    model = model_of(g, budget, depth)
    start = staged_eviction(model.form)
    hood = lns.Neighbourhoods(model)
    group = lns.cone(model, hood, start, random.Random(1), 200)
    paid = {i for (s, i) in start.R if s != model.form.ix.first[i]}
    assert group and group & paid
    free, a, b = hood.free_for(group)
    form = model.form
    for i in group:  # every entry of every value in the cone is free
        for table in (form.S, form.R, form.F):
            for k, v in table.items():
                if k[1] == i and not isinstance(v, int):
                    assert v.index in free and a <= k[0] <= b
    assert {u.index for (s, q), u in form.U.items() if a <= s < b} <= set(free)
    res = lns.improve(model, start, deadline=time.perf_counter() + 120, workers=1, budget=budget, width=3,
                      tuning=Tuning(max_windows=6))
    assert any(w.kind == "cone" for w in res.windows)
    assert res.after <= res.before and model.admissible(res.best)
    r = replay(model, res.best)
    assert r.valid and r.peak_bytes <= budget and r.recompute_cost == model.overhead_of(res.best)
