"""Stats, the typed planner result: a read-only mapping that is the plan
file's ``stats`` object, its round trip through a file, the batch columns
read from its fields; and the one peak sweep (``simulate.peak_of``)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from rematopt import Graph, Node, Plan, simulate
from rematopt.studies import batch
from rematopt.importers import synthetic
from rematopt.planners.cpsat.warm_start import Figures, best_within
from rematopt.reference import no_remat_plan
from rematopt.simulate import peak_of
from rematopt.solve import solve
from rematopt.stats import Stats


def test_a_stats_is_a_read_only_mapping_of_its_set_fields_then_its_details():
    s = Stats(status="FEASIBLE", peak_bytes=10, compute_cost=2.5, transfer_bytes=0, details={"selected": ["a"]})
    assert list(s) == ["status", "peak_bytes", "compute_cost", "transfer_bytes", "selected"]
    assert s["status"] == "FEASIBLE" and s["selected"] == ["a"] and len(s) == 5
    assert "best_bound" not in s and s.get("best_bound") is None and s.best_bound is None
    with pytest.raises(KeyError):
        s["gap"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.status = "OPTIMAL"
    with pytest.raises(TypeError):
        s["status"] = "OPTIMAL"
    with pytest.raises(TypeError):
        s.details["selected"] = []
    assert s.with_details(rounds=2)["rounds"] == 2 and "rounds" not in s


def test_a_typed_figure_cannot_hide_in_details():
    with pytest.raises(ValueError, match="stats details may not hold typed fields: gap"):
        Stats(details={"gap": 0.1})
    got = Stats.from_dict({"status": "OPTIMAL", "gap": 0.0, "best_bound": None, "rounds": [1], "space": "staged"})
    assert got.gap == 0.0 and got.best_bound is None and dict(got.details) == {"rounds": [1], "space": "staged"}


def test_stats_round_trip_through_a_plan_file(tmp_path):
    g = synthetic.chain(8, sinks=True)
    sol = solve(g, "greedy", budget_ratio=0.6)
    stats = sol.plan.stats
    assert isinstance(stats, Stats) and stats.budget_bytes == sol.budget and stats.wall_s == sol.wall_s
    assert stats.status == "FEASIBLE" and stats.peak_bytes == sol.replay.peak_bytes
    path = tmp_path / "plan.json"
    sol.plan.save(path)
    written = json.loads(path.read_text())["stats"]
    assert written == json.loads(json.dumps(dict(stats)))  # the file's object is the mapping, as it was
    assert {"status", "peak_bytes", "compute_cost", "transfer_bytes", "budget_bytes", "wall_s",
            "selected", "peak_model"} <= set(written) and "best_bound" not in written
    again = Plan.load(path).stats
    assert isinstance(again, Stats) and again == Stats.from_dict(written)
    assert again.peak_bytes == stats.peak_bytes and again["selected"] == stats["selected"]
    assert Plan.from_dict(Plan.load(path).to_dict()).stats == again


def _graph_input(tmp_path: Path, g):
    path = tmp_path / "g.json"
    g.save(path)
    inputs, _ = batch.load_inputs([path])
    return inputs[0]


def test_batch_columns_come_from_the_stats_fields(tmp_path):
    g = synthetic.chain(6)
    gi = _graph_input(tmp_path, g)
    spec = batch.make_spec(gi, 1.0, "no-remat", {}, tmp_path, None, 60.0)
    sol = solve(g, "no-remat", budget_ratio=1.0)
    sol.plan.stats = dataclasses.replace(sol.plan.stats, objective=3.0, best_bound=2.0, gap=1 / 3,
                                         time_to_first_s=0.5, time_to_best_s=0.75, reason="a test",
                                         details={"rounds": 2, "space": "staged", "deep": [1, 2]})
    row = batch.solution_row(spec, sol)
    assert (row["bound"], row["gap"], row["time_to_first_s"], row["time_to_best_s"]) == (2.0, 1 / 3, 0.5, 0.75)
    assert row["peak_bytes"] == sol.replay.peak_bytes and row["budget"] == sol.budget
    assert row["status"] == "FEASIBLE" and row["compute_cost"] == sol.replay.compute_cost
    extra = json.loads(row["stats"])
    assert extra == {"objective": 3.0, "reason": "a test", "rounds": 2, "space": "staged"}


def test_the_batch_hint_is_the_warm_starts_best_fast_plan():
    def row(planner, cost, transfer, peak):
        return {"graph_sha256": "h", "budget_ratio": 0.5, "planner": planner, "status": "FEASIBLE",
                "plan_path": f"{planner}.json", "budget": 100, "compute_cost": cost, "transfer_bytes": transfer,
                "peak_bytes": peak}

    rows = [row("a", 5.0, 0, 90), row("b", 4.0, 10, 99), row("c", 4.0, 0, 100), row("d", 1.0, 0, 101)]
    spec = {"graph_sha256": "h", "budget_ratio": 0.5, "options": {}}
    assert batch.best_hint(rows, spec)["planner"] == "c"  # d misses the budget; c is cheapest, then least transfer
    assert batch.best_hint(rows, {**spec, "options": {"objective": "peak"}})["planner"] == "a"
    # without offload a plan with transfers is no hint cpsat can use, however cheap
    cheap_offload = [row("e", 2.0, 10, 90), row("a", 5.0, 0, 90)]
    assert batch.best_hint(cheap_offload, spec)["planner"] == "a"
    assert batch.best_hint(cheap_offload, {**spec, "options": {"offload": True}})["planner"] == "e"
    figs = [(r["planner"], Figures(r["compute_cost"], r["transfer_bytes"], r["peak_bytes"])) for r in rows]
    assert best_within(figs, 100)[0] == "c" and best_within(figs, 100, by_peak=True)[0] == "a"


@pytest.mark.parametrize("planner", ["no-remat", "greedy", "chen-sqrt", "chen-greedy", "dtr", "jax-nothing-saveable",
                                     "jax-dots-saveable", "jax-offload-dots"])
@pytest.mark.parametrize("shape", ["chain", "unet", "random"])
def test_the_one_peak_sweep_is_the_simulators_peak(planner, shape):
    g = {"chain": lambda: synthetic.chain(12, sinks=True), "unet": lambda: synthetic.unet(2, train=True),
         "random": lambda: synthetic.random_layered(30, seed=2)}[shape]()
    p = solve(g, planner, budget_ratio=0.7, check_budget=False).plan
    r = simulate(g, p)
    assert r.valid and peak_of(g, p.ops, p.nodes) == r.peak_bytes == p.stats.peak_bytes
    assert g.initial_bytes == r.initial_bytes == peak_of(g, [], [])


def test_the_peak_sweep_counts_prefetches_and_not_offloads():
    # x (input, 1) -> a (2) -> b (4) -> c (8, output); p (16) persistent, read by c.
    nodes = [Node(0, "x", kind="input", bytes=1), Node(1, "a", bytes=2, cost=1), Node(2, "b", bytes=4, cost=1),
             Node(3, "c", bytes=8, cost=1, output=True), Node(4, "p", kind="input", bytes=16, persistent=True)]
    g = Graph("offload", nodes, [(0, 1), (1, 2), (2, 3), (4, 3), (1, 3)], order=[0, 4, 1, 2, 3])
    events = [("compute", 1), ("offload", 1), ("compute", 2), ("free", 1), ("free", 0),
              ("prefetch", 1), ("compute", 3), ("free", 1), ("free", 2)]
    p = Plan.from_events(g.name, "test", events)
    r = simulate(g, p)
    assert r.valid and r.transfer_bytes == 4 and g.initial_bytes == 17
    # the peak is at computing c: p + b + a (prefetched) + c; an offload adds nothing
    assert peak_of(g, p.ops, p.nodes) == r.peak_bytes == 16 + 4 + 2 + 8
    q = no_remat_plan(g)
    assert peak_of(g, q.ops, q.nodes) == simulate(g, q).peak_bytes
