"""The gaps relaxation at scale (``staged.bounds.gaps``): its runs against a direct
reading of the definitions, its chained segments against every memory row
written out, its bound against exhaustive search (both objectives, with and
without offload), and a solve whose first model is never built still
reporting the bound."""

from __future__ import annotations

import random

import numpy as np
import pytest
from ortools.sat.python import cp_model

from rematopt import solve
from rematopt.graph import Graph, Node
from rematopt.importers import synthetic
from rematopt.planners.cpsat import run
from rematopt.planners.staged.bounds.gaps import gap_runs
from rematopt.planners.staged.model import OutOfTime
from rematopt.planners.staged.stages import Stages
from rematopt.planners.staged.bounds import Question, ask
from rematopt.reference import no_remat_peak, peak_lower_bound

from brute_force import min_cost, min_peak
from cpsat_cases import FAST, budget_between, cases


def question(g: Graph, budget: int | None, offload: bool = False, per_byte: int = 0, objective: str = "overhead",
             overhead_cap: int | None = None, max_recomputes: int | None = None) -> Question:
    """Integer costs and bytes: unit 1, scale 1; the peak floor as the model's."""
    pinned = sum(v.bytes for v in g.nodes if v.persistent)
    cap = sum(g.bytes) if budget is None else budget - pinned
    return Question(objective, 1, cap, tuple(int(c) for c in g.cost), tuple(b * per_byte for b in g.bytes),
                    offload, overhead_cap, max_recomputes, max(0, peak_lower_bound(g) - pinned))


def runs_by_definition(g: Graph, ix: Stages, cap: int):
    """The critical stages, fixed loads and runs read off the definitions,
    one stage and one value at a time."""
    points = {i: {ix.first[j] for j in g.succs[i] if ix.first[j] >= 0} | ({ix.T - 1} if g.nodes[i].output else set())
              | ({ix.first[i]} - {-1}) for i in ix.values}
    life = {i: (max(ix.first[i], 0), max(points[i])) for i in ix.values}
    alive = [sum(g.bytes[i] for i in ix.values if life[i][0] <= s <= life[i][1]) for s in range(ix.T)]
    crit = [s for s in range(ix.T) if alive[s] > cap]
    fixed, runs = [], set()
    for k, c in enumerate(crit):
        load = 0
        for i in ix.values:
            lo, last = life[i]
            if not lo <= c <= last:
                continue
            if c in points[i] or not (ix.recomputable[i] or ix.offloadable[i]):
                load += g.bytes[i]
            elif g.bytes[i]:
                before = max([p for p in points[i] if p < c], default=-1)
                after = min(p for p in points[i] if p > c)
                runs.add((i, before, after))
        fixed.append(load)
    return crit, [alive[c] for c in crit], fixed, runs


def test_runs_match_the_definitions():
    rng = random.Random(3)
    checked = 0
    for n in (12, 20, 30):
        for seed in range(4):
            g = synthetic.random_layered(n, seed=seed) if seed % 2 else synthetic.unet(2, train=True, seed=seed)
            for offload in (False, True):
                ix = Stages(g, offload)
                cap = rng.randint(peak_lower_bound(g), no_remat_peak(g))
                r = gap_runs(g, ix, 1, cap)
                crit, alive, fixed, runs = runs_by_definition(g, ix, cap)
                assert r.crit.tolist() == crit and r.alive.tolist() == alive and r.fixed.tolist() == fixed
                # each run is one gap: its rows are exactly the critical stages inside it
                spans = {(int(v), crit[a], crit[b]) for v, a, b in zip(r.value, r.a, r.b)}
                want = {(i, min(c for c in crit if p < c < q), max(c for c in crit if p < c < q)) for i, p, q in runs}
                assert spans == want and len(r.a) == len(runs)
                cover = np.zeros(len(crit) + 1, dtype=np.int64)  # every run kept: all that is alive
                np.add.at(cover, r.a, r.size)
                np.add.at(cover, r.b + 1, -r.size)
                assert (r.fixed + np.cumsum(cover)[:-1]).tolist() == alive
                checked += len(runs)
    assert checked > 100


def rows_optimum(g: Graph, q: Question) -> int | None:
    """The overhead relaxation with every memory row written out (a term per
    run and critical stage), solved by CP-SAT: the segments' reference."""
    r = gap_runs(g, Stages(g, q.offload), q.unit, q.cap_units)
    m = cp_model.CpModel()
    rc = [m.new_bool_var("") if r.can_rc[k] else None for k in range(len(r.a))]
    pf = [m.new_bool_var("") if r.can_pf[k] else None for k in range(len(r.a))]
    O = {}
    cost = []
    for k, v in enumerate(r.value.tolist()):
        if rc[k] is not None:
            cost.append(q.int_cost[v] * rc[k])
        if pf[k] is not None:
            O.setdefault(v, m.new_bool_var(""))
            m.add_implication(pf[k], O[v])
            cost.append(q.int_transfer[v] * pf[k])
    cost += [q.int_transfer[v] * x for v, x in O.items()]
    for row in range(len(r.crit)):
        cover = [k for k in range(len(r.a)) if r.a[k] <= row <= r.b[k]]
        m.add(sum(int(r.size[k]) * x for k in cover for x in (rc[k], pf[k]) if x is not None)
              >= int(r.alive[row]) - q.cap_units)
    m.minimize(sum(cost))
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    status = solver.solve(m)
    return None if status == cp_model.INFEASIBLE else round(solver.objective_value)


@pytest.mark.parametrize("seed", range(8))
def test_the_chained_segments_are_the_rows_written_out(seed):
    rng = random.Random(seed)
    g = synthetic.random_layered(rng.choice([20, 40, 60]), seed=seed)
    for offload in (False, True):
        q = question(g, budget_between(g, rng), offload, rng.choice([0, 1, 3]))
        want, got = rows_optimum(g, q), ask(g, q, "gaps", time_limit=20)
        assert got.status == ("INFEASIBLE" if want is None else "OPTIMAL")
        assert want is None or got.bound == want


@pytest.mark.parametrize("n,count", [(5, 80), (6, 30)])
def test_the_bound_never_exceeds_the_exhaustive_optimum(n, count):
    """Both objectives, with and without offload (transfer 0-2 per byte),
    with and without an overhead cap for the peak."""
    tight = 0
    for g, rng in cases(n, every=False, count=count, seed=500 + n):
        offload, per_byte = rng.random() < 0.5, rng.choice([0, 1, 2])
        budget = budget_between(g, rng)
        expect = min_cost(g, budget, offload, per_byte)
        got = ask(g, question(g, budget, offload, per_byte), "gaps")
        assert got.status == "OPTIMAL" if expect is not None else got.status in ("OPTIMAL", "INFEASIBLE")
        if expect is not None:
            assert got.bound <= expect[0]
            tight += got.bound == expect[0] and expect[0] > 0
        pinned = sum(v.bytes for v in g.nodes if v.persistent)
        cap = rng.choice([None, 0, 3])
        lowest = min_peak(g, offload, per_byte, cost_cap=cap)
        got = ask(g, question(g, None, offload, per_byte, "peak", cap), "gaps")
        if lowest is not None:
            assert got.status == "OPTIMAL" and got.bound + pinned <= lowest[0]
    assert tight > 0


def test_what_no_plan_can_meet_is_infeasible_and_a_loose_budget_costs_nothing():
    """An input that cannot be dropped, read at the end, above the budget
    with the values it overlaps: INFEASIBLE, as exhaustive search says; at
    the no-remat peak the bound is 0 with no critical stage at all."""
    nodes = [Node(0, "x", kind="input", bytes=6, offloadable=False), Node(1, "a", bytes=4, cost=1),
             Node(2, "b", bytes=4, cost=1), Node(3, "y", bytes=1, cost=1, output=True)]
    g = Graph("pinned", nodes, [(0, 1), (1, 2), (2, 3), (0, 3)])
    assert min_cost(g, 13) is None
    assert ask(g, question(g, 13), "gaps").status == "INFEASIBLE"
    top = no_remat_peak(g)
    assert len(gap_runs(g, Stages(g, False), 1, top).crit) == 0
    got = ask(g, question(g, top), "gaps")
    assert (got.status, got.bound) == ("OPTIMAL", 0)


def test_questions_asked_before_the_model_match_the_models(monkeypatch):
    """run.run_question is asked before any model exists; it must say what the
    model built afterwards holds (unit, cap, overhead cap, clone cap, peak floor)."""
    seen: dict = {}
    relaxation, make_model = run.relaxation, run.make_model

    def spy_q(ctx, q, level, limit, below=None):
        seen.setdefault("q", q)
        return relaxation(ctx, q, level, limit, below)

    def spy_model(*a, **k):
        seen.setdefault("model", make_model(*a, **k))
        return seen["model"]

    monkeypatch.setattr(run, "relaxation", spy_q)
    monkeypatch.setattr(run, "make_model", spy_model)
    g = synthetic.random_layered(14, seed=2)
    for objective, extra in (("overhead", {}), ("peak", {"max_overhead": 0.1}), ("overhead", {"offload": True})):
        seen.clear()
        budget = int(0.95 * no_remat_peak(g)) if objective == "overhead" else None
        solve(g, "cpsat", budget=budget, objective=objective, max_clone_expansion=1.5, **{**FAST, **extra})
        q, model = seen["q"], seen["model"]
        assert (q.objective, q.offload) == (objective, bool(extra.get("offload")))
        assert (q.unit, q.cap_units, q.overhead_cap, q.max_recomputes, q.peak_floor) == (
            model.form.unit, model.form.mem_cap, model.overhead_cap, model.max_recomputes, model.peak_floor)


def test_a_solve_whose_first_model_is_never_built_still_reports_the_bound(monkeypatch):
    """The 10,084-node GPT decoder's first model takes longer than the time
    limit: the fast planners' plan comes back with the gaps relaxation's
    bound over the staged space (or the coarse chains' asked after it, which
    need no model either), and the gap to it."""
    def never(*a, **k):
        raise OutOfTime

    g = synthetic.random_layered(30, seed=4)
    full = solve(g, "cpsat", budget_ratio=0.8, recompute_depth="full", **FAST)
    monkeypatch.setattr(run, "make_model", never)
    sol = solve(g, "cpsat", budget_ratio=0.8, time_limit=10, workers=1)
    st = sol.plan.stats
    assert sol.replay.valid and st["plan_from"] and "building the first model" in st["reason"]
    assert st["gap_relaxation"]["status"] == "OPTIMAL" and st["bound_by"] in ("gaps", "coarse chains")
    assert 0 < st["gap_relaxation"]["bound"] <= st["best_bound"] <= st["objective"]
    assert st["gap"] == pytest.approx((st["objective"] - st["best_bound"]) / st["objective"])
    assert st["best_bound"] <= full.plan.stats["objective"] + 1e-9
