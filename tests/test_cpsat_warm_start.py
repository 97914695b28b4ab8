"""Warm starts for cpsat: the best fast plan, the projection of plans into the
staged space, and staged eviction, all checked by replay."""

from __future__ import annotations

import pytest

from rematopt.importers import synthetic
from rematopt.planners.cpsat_backends import CpSatBackend
from rematopt.planners.cpsat_extract import events, from_plan
from rematopt.planners.cpsat_model import Formulation
from rematopt.planners.warm_start import best_fast_plan, fast_planners, staged_eviction
from rematopt.reference import no_remat_plan, resolve_budget
from rematopt.simulate import simulate

GRAPHS = [synthetic.linear_training(8), synthetic.unet(2, train=True),
          synthetic.random_layered(30, seed=2), synthetic.chain(6, sinks=True)]


@pytest.mark.parametrize("g", GRAPHS, ids=lambda g: g.name[:20])
def test_best_fast_plan_is_valid_and_under_budget(g):
    budget = resolve_budget(g, ratio=0.9)
    p = best_fast_plan(g, budget)
    assert "cpsat" not in fast_planners()
    if p is not None:
        r = simulate(g, p)
        assert r.valid and r.peak_bytes <= budget


@pytest.mark.parametrize("g", GRAPHS, ids=lambda g: g.name[:20])
@pytest.mark.parametrize("depth", [None, 1, 2])
def test_staged_eviction_meets_the_cap_in_the_model_space(g, depth):
    budget = resolve_budget(g, ratio=0.8)
    form = Formulation(g, CpSatBackend(), mem_cap_bytes=budget, depth=depth)
    a = staged_eviction(form)
    if a is None:
        return
    p = events(form, a)
    r = simulate(g, p)
    assert r.valid, r.error
    assert r.peak_bytes == a.peak_bytes(form) <= budget
    assert all(k in form.R for k in a.R)


@pytest.mark.parametrize("g", GRAPHS, ids=lambda g: g.name[:20])
def test_no_remat_projects_onto_itself(g):
    form = Formulation(g, CpSatBackend())
    a = from_plan(form, no_remat_plan(g))
    assert a is not None
    r0, r1 = simulate(g, no_remat_plan(g)), simulate(g, events(form, a))
    assert r1.valid and r1.peak_bytes == r0.peak_bytes and r1.compute_cost == r0.compute_cost


def test_staged_eviction_reaches_a_budget_compute_once_misses():
    g = synthetic.linear_training(8)
    budget = resolve_budget(g, ratio=0.7)
    form = Formulation(g, CpSatBackend(), mem_cap_bytes=budget)
    a = staged_eviction(form)
    assert a is not None
    r = simulate(g, events(form, a))
    assert r.valid and r.peak_bytes <= budget < simulate(g, no_remat_plan(g)).peak_bytes
    assert r.compute_events > len(g.compute_ids)
