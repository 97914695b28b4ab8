"""The staged model at scale: entries only at active stages, and memory
chained across stage boundaries where writing every stage's resident sum
would be O(n^2) terms. Both must leave the model's optima unchanged."""

from __future__ import annotations

import pytest
from ortools.sat.python import cp_model

from rematopt.planners.staged import model as model_mod
from rematopt.planners.staged.backends import CpSatBackend
from rematopt.planners.staged.model import build
from rematopt.planners.staged.stages import Stages
from rematopt.planners.staged.solution import Assignment, events
from rematopt.simulate import simulate

from brute_force import min_cost, min_peak
from cpsat_cases import budget_between, cases


def optimum(g, *, chained: bool, objective: str, budget=None, offload=False, depth=None, monkeypatch=None):
    """Solve the model built with the direct or the chained memory accounting;
    return (status, objective in model integers, replayed plan)."""
    monkeypatch.setattr(model_mod, "DIRECT_TERMS", -1 if chained else 10**9)
    m = build(g, CpSatBackend(), objective=objective, mem_cap_bytes=budget, offload=offload,
              transfer_cost_per_byte=1.0 if offload else 0.0, cost_scale=1, depth=depth)
    assert (m.form.kept_by_stage() is None) == chained
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    solver.parameters.max_time_in_seconds = 20
    status = solver.solve(m.backend.model)
    if status != cp_model.OPTIMAL:
        return solver.status_name(status), None, None
    a = Assignment.from_values(m.form, solver.value)
    return "OPTIMAL", round(solver.objective_value), simulate(g, events(m.form, a))


@pytest.mark.parametrize("offload", [False, True])
def test_chained_memory_gives_the_direct_optimum_and_brute_force(offload, monkeypatch):
    """Sampled 5-node graphs: the chained model's overhead optimum under
    a budget equals the direct one's and brute force's, and its plan replays
    within the budget at that cost."""
    checked = 0
    for g, rng in cases(5, every=False, count=25, seed=11 + offload):
        budget = budget_between(g, rng)
        expect = min_cost(g, budget, offload, 1)
        got = [optimum(g, chained=c, objective="overhead", budget=budget, offload=offload,
                       monkeypatch=monkeypatch) for c in (False, True)]
        assert got[0][:2] == got[1][:2]
        if expect is None:
            assert got[1][0] == "INFEASIBLE"
            continue
        status, cost, replay = got[1]
        assert status == "OPTIMAL" and replay.peak_bytes <= budget
        assert cost == expect[0] == replay.recompute_cost + replay.transfer_bytes
        checked += 1
    assert checked >= 10


def test_chained_memory_gives_the_minimum_peak(monkeypatch):
    """Peak objective: the chained model's optimum is brute force's minimum
    peak (the model counts memory in units of the sizes' gcd: compare replays)."""
    for g, _ in cases(5, every=False, count=15, seed=5):
        direct = optimum(g, chained=False, objective="peak", monkeypatch=monkeypatch)
        chained = optimum(g, chained=True, objective="peak", monkeypatch=monkeypatch)
        assert direct[1] == chained[1]
        assert chained[2].peak_bytes == min_peak(g)[0]


@pytest.mark.parametrize("depth", [None, 1, 2])
def test_remat_pairs_are_the_lives_walked(depth):
    """The (stage, value) pairs read off the near sets are those a walk over
    every life finds, and the count without listing them agrees."""
    for g, _ in cases(6, every=False, count=20, seed=3):
        for offload in (False, True):
            ix = Stages(g, offload, depth)
            walked = [(s, i) for i in ix.values for s in ix.stages(i) if s != ix.first[i]
                      and (ix.may_compute(s, i) or ix.may_prefetch(s, i))]
            assert ix.remat_pairs() == walked
            assert ix.count_remat_pairs() == len(walked)


def test_kept_entries_exist_only_at_active_stages():
    """A value kept through stages where nothing touches it has no entry
    there; kept_key finds the one variable that stands for them all."""
    from rematopt.graph import Graph, Node
    n = 8  # a chain whose first value is read again only by the last node
    nodes = [Node(i, f"n{i}", bytes=1, cost=1) for i in range(n)]
    g = Graph("carry", nodes, [(i, i + 1) for i in range(n - 1)] + [(0, n - 1)])
    m = build(g, CpSatBackend(), objective="overhead", mem_cap_bytes=None, offload=False,
              transfer_cost_per_byte=0.0, cost_scale=1, depth=1)
    f = m.form
    # value 0 is read in stages 1 (node 1), 2 (node 1 recomputed, depth 1) and 7:
    # variables after each active stage (1, 2, 3), and 7 shares stage 3's
    assert f.active[0] == [0, 1, 2, n - 1]
    assert sorted(s for (s, i) in f.S if i == 0) == [1, 2, 3, n - 1]
    assert f.kept_key(5, 0) == (3, 0) and f.kept_key(n - 1, 0) == (3, 0)
    assert f.S[3, 0] is f.S[n - 1, 0]
    assert f.kept_key(0, 0) is None
