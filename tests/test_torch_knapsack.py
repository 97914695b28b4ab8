"""``torch-knapsack``: PyTorch's memory-budget partitioner, on hand-worked
graphs (figures derived in the comments) and on every phased shape, every
plan replayed through ``rematopt.solve``."""

from __future__ import annotations

import json
import math

import pytest

from brute_force import min_cost
from conftest import rematopt
from rematopt import Graph, Node, solve
from rematopt.errors import NotApplicable, PlannerError
from rematopt.importers import synthetic
from rematopt.plan import COMPUTE
from rematopt.planners.torch_knapsack import Partition, dp_knapsack, greedy_knapsack, ilp_knapsack
from rematopt.reference import no_remat_peak
from rematopt.simulate import base_cost
from rematopt.studies.batch import read_rows


def joint(name: str, spec: list[tuple]) -> Graph:
    """(name, op, bytes, cost, producers, phase[, flags]) in program order."""
    ids = {s[0]: i for i, s in enumerate(spec)}
    nodes, edges = [], []
    for i, (nm, op, b, c, preds, phase, *flags) in enumerate(spec):
        nodes.append(Node(i, nm, op=op, bytes=b, cost=c, phase=phase, **(flags[0] if flags else {})))
        edges += [(ids[p], i) for p in preds]
    return Graph(name, nodes, edges)


def dots(reduce_op: str = "reduce_sum") -> Graph:
    """x -> h1 = dot(x) -> h2 = dot(h1) -> y = sum(h2), and the backward
    g2(y, h2), g1(g2, h1), gx(g1, x). No-remat: x 10, h1 20, h2 30, y 31,
    g2 41 (the peak), free y, h2 30, g1 40, free g2, h1 20, gx 30."""
    return joint("dots", [("x", "input", 10, 0, [], None, {"kind": "input"}),
                          ("h1", "dot_general", 10, 10, ["x"], "forward"),
                          ("h2", "dot_general", 10, 10, ["h1"], "forward"),
                          ("y", reduce_op, 1, 1, ["h2"], "forward"),
                          ("g2", "mul", 10, 1, ["y", "h2"], "backward"),
                          ("g1", "mul", 10, 1, ["g2", "h1"], "backward"),
                          ("gx", "mul", 10, 1, ["g1", "x"], "backward", {"output": True})])


def recomputed(graph: Graph, plan) -> list[str]:
    counts: dict[int, int] = {}
    for i in plan.nodes[plan.ops == COMPUTE].tolist():
        counts[i] = counts.get(i, 0) + 1
    return sorted(graph.nodes[i].name for i, c in counts.items() if c > 1)


def test_the_partition_sorts_values_as_torch_does():
    """Items: the dots and the reduction (1 x 4 < 10), largest first; weights:
    bytes x 1.1 (one hop to the backward), y's doubled (sum and its consumer
    mul fuse, so torch takes it to be free to recompute: saving costs more)."""
    g = dots()
    p = Partition.of(g, ban_reductions=True)
    assert [g.nodes[i].name for i in p.items] == ["h1", "h2", "y"]
    assert p.weight[:4] == [11, 11, 11, 2]
    assert [g.nodes[i].name for i in p.cut(set(p.items))] == ["x", "h1", "h2", "y"]
    assert [g.nodes[i].name for i in Partition.of(g, ban_reductions=False).items] == ["h1", "h2"]


def test_the_knapsack_caps_saved_bytes_not_the_peak():
    """Save-all: x, h1, h2, y = 31 bytes; inputs 10; the range is 21. At 0.5
    the weights are 10/21, 10/21, 1/21 and the cap 0.5: one dot fits, with y
    it would not (0.524). torch keeps h1 (the tie goes to the earlier item),
    the cut then saves x and h1 (11 + 11 < saving h2 or y as well), and h2 and
    y are recomputed for the backward. Saved bytes 10 <= 10.5, yet the replay
    peaks at 41 (g2 reads y and h2, recomputed, while h1 is kept for g1):
    over a budget of 40 which one recomputation of h1 meets (the exhaustive
    search: cost 10, peak 40)."""
    g = dots()
    assert no_remat_peak(g) == 41
    sol = solve(g, "torch-knapsack", budget=40, activation_memory_budget=0.5)
    st = sol.plan.stats
    assert st["knapsack_saved"] == ["h1"] and st["knapsack_saved_bytes"] == 10
    assert st["knapsack_cap_bytes"] == pytest.approx(10.5) and st["saved"] == ["h1"] and st["saved_bytes"] == 20
    assert recomputed(g, sol.plan) == ["h2", "y"] and sol.replay.compute_cost - base_cost(g) == 11
    assert sol.status == "OVER_BUDGET" and sol.replay.peak_bytes == 41
    assert min_cost(g, 40) == (10, 40)
    # No fraction does better: 1 saves everything (41), 0 recomputes h1, h2, y
    # and keeps h1 to g1 (41); the search returns the lowest peak, over budget.
    searched = solve(g, "torch-knapsack", budget=40)
    assert searched.status == "OVER_BUDGET" and searched.replay.peak_bytes == 41
    assert {p["peak_bytes"] for p in searched.plan.stats["probes"]} == {41}


def test_petabyte_graphs_fit_the_max_flow():
    """A 2^52-byte forward value the backward never reads weighs 2^52 x 1.1^100
    in the cut, past int64: the weights are divided down, and the choice is
    the small graph's."""
    small, big = dots(), dots().to_dict()
    big["nodes"].append({"id": 7, "name": "z", "op": "mul", "bytes": 2**52, "cost": 1, "phase": "forward"})
    big["edges"].append([0, 7])
    big["order"].insert(1, 7)
    big = Graph.from_dict(big)
    assert sum(Partition.of(big, True).weight) < 2**63
    for g in (small, big):
        sol = solve(g, "torch-knapsack", activation_memory_budget=0.5)
        assert sol.plan.stats["saved"] == ["h1"] and recomputed(g, sol.plan) == ["h2", "y"]


def test_fractions_zero_and_one():
    g = dots()
    everything = solve(g, "torch-knapsack", activation_memory_budget=1)  # every item banned: no recompute
    assert recomputed(g, everything.plan) == [] and everything.plan.stats["chosen_by"] == "cut"
    nothing = solve(g, "torch-knapsack", activation_memory_budget=0)  # inputs only
    assert recomputed(g, nothing.plan) == ["h1", "h2", "y"] and nothing.plan.stats["saved"] == []
    default = solve(g, "torch-knapsack")  # no budget: torch's default fraction, 1
    assert default.plan.stats["activation_memory_budget"] == 1


def test_reductions_are_recomputed_when_not_banned():
    """Without the 4x rule y is free: h2 is saved anyway for g2, so the cut
    leaves y to be recomputed from it, even at fraction 1."""
    g = dots()
    sol = solve(g, "torch-knapsack", activation_memory_budget=1, ban_recompute_reductions=False)
    assert recomputed(g, sol.plan) == ["y"]


def test_free_ops_are_recomputed_at_fraction_one_and_marks_are_honoured():
    """r = broadcast(h) is twice h's size: saving h (10 x 1.1^2 = 12) beats
    saving r (20 x 1.1 = 22, doubled: broadcast and mul fuse), so torch
    recomputes r in the backward although nothing asked it to save memory.
    A recompute mark on h makes it recomputed too (torch's MUST_RECOMPUTE)."""
    spec = [("x", "input", 10, 0, [], None, {"kind": "input"}),
            ("h", "dot_general", 10, 10, ["x"], "forward"),
            ("r", "broadcast_in_dim", 20, 3, ["h"], "forward"),
            ("s", "reduce_sum", 10, 1, ["r"], "forward", {"output": True}),
            ("g", "mul", 20, 1, ["r", "s"], "backward", {"output": True})]
    g = joint("free", spec)
    sol = solve(g, "torch-knapsack", activation_memory_budget=1)
    assert sol.plan.stats["saved"] == ["h", "s"] and recomputed(g, sol.plan) == ["r"]
    spec[1] = ("h", "dot_general", 10, 10, ["x"], "forward", {"recompute": True})
    marked = joint("free", spec)
    sol = solve(marked, "torch-knapsack", activation_memory_budget=1)
    assert "h" not in sol.plan.stats["saved"] and recomputed(marked, sol.plan) == ["h", "r"]


def test_nodes_without_op_names_are_all_items():
    """The published node-link graphs carry no ops: every forward value the
    backward reads is an item, so fraction 1 recomputes nothing."""
    g = joint("noops", [("a", "", 4, 1, [], "forward"), ("b", "", 4, 1, ["a"], "forward"),
                        ("gb", "", 4, 1, ["b"], "backward"), ("ga", "", 4, 1, ["gb", "a"], "backward",
                                                               {"output": True})])
    p = Partition.of(g, True)
    assert sorted(g.nodes[i].name for i in p.items) == ["a", "b"]
    assert recomputed(g, solve(g, "torch-knapsack", activation_memory_budget=1).plan) == []


def test_the_three_solvers():
    """Greedy by runtime per weight takes the 0.6 item (10/unit) and then
    nothing fits; the DP and the ILP take the two 0.5 items (9 > 6)."""
    memory, runtime = [0.6, 0.5, 0.5], [6.0, 4.5, 4.5]
    assert greedy_knapsack(memory, runtime, 1.0) == [0]
    assert dp_knapsack(memory, runtime, 1.0) == [1, 2]
    assert ilp_knapsack(memory, runtime, 1.0) == [1, 2]
    # torch's DP rounds weights to 1/10000: 0.33334 counts as 0.3333 and fits a 0.3333 cap
    assert dp_knapsack([0.33334], [1.0], 0.3333) == [0]
    assert greedy_knapsack([0.33334], [1.0], 0.3333) == [] and ilp_knapsack([0.33334], [1.0], 0.3333) == []
    # a weightless item is kept by the DP only if it is worth something (torch's backtrack)
    assert dp_knapsack([0.0, 0.0], [2.0, 0.0], 0.5) == [0]


@pytest.mark.parametrize("solver", ["dp", "greedy", "ilp"])
def test_each_solver_through_solve(solver):
    g = dots()
    sol = solve(g, "torch-knapsack", budget=41, activation_memory_budget=0.5,
                activation_memory_budget_solver=solver)
    st = sol.plan.stats
    assert st["solver"] == solver and st["knapsack_saved_bytes"] == 10  # one dot: runtime 10
    assert sol.status == "FEASIBLE" and sol.replay.peak_bytes == 41


SHAPES = {
    "chain_sinks": lambda: synthetic.chain(10, sinks=True, seed=1),
    "linear_training": lambda: synthetic.linear_training(12, seed=2),
    "unet_train": lambda: synthetic.unet(3, train=True, seed=3),
}


@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("ratio", [1.0, 0.8, 0.6, 0.0])
@pytest.mark.parametrize("options", [{}, {"activation_memory_budget": 0.3},
                                     {"activation_memory_budget": 0.6, "activation_memory_budget_solver": "greedy"},
                                     {"activation_memory_budget_solver": "ilp"}],
                         ids=["search", "fraction", "greedy", "ilp-search"])
def test_every_shape_replays_and_is_judged_on_its_replay(shape, ratio, options):
    g = SHAPES[shape]()
    budget = math.floor(ratio * no_remat_peak(g))
    sol = solve(g, "torch-knapsack", budget=budget, **options)  # replays; the claims must be exact
    assert sol.status == ("FEASIBLE" if sol.replay.peak_bytes <= budget else "OVER_BUDGET")
    st = sol.plan.stats
    assert st["knapsack_saved_bytes"] <= st["knapsack_cap_bytes"] + 1e-9 * max(1, st["knapsack_cap_bytes"])
    again = solve(g, "torch-knapsack", budget=budget, **options)
    assert again.plan.nodes.tolist() == sol.plan.nodes.tolist() and again.plan.ops.tolist() == sol.plan.ops.tolist()
    if "activation_memory_budget" not in options:  # the search returns its best probe
        within = [p for p in st["probes"] if p["peak_bytes"] <= budget]
        if within:
            assert sol.replay.compute_cost == min(p["compute_cost"] for p in within)
        else:
            assert sol.replay.peak_bytes == min(p["peak_bytes"] for p in st["probes"])


def test_a_graph_without_phases_is_not_applicable(tmp_path):
    g = synthetic.random_layered(20, seed=1)
    with pytest.raises(NotApplicable, match="no phases"):
        solve(g, "torch-knapsack", budget=10)
    path = tmp_path / "g.json"
    g.save(path)
    out = rematopt("solve", path, "--planner", "torch-knapsack", "--budget-ratio", "0.8")
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1 and "no phases" in out.stderr


def test_bad_options_are_refused_in_one_line(tmp_path):
    with pytest.raises(PlannerError, match="^torch-knapsack: activation-memory-budget must be a number from 0 to 1"):
        solve(dots(), "torch-knapsack", activation_memory_budget=1.5)
    path = tmp_path / "g.json"
    dots().save(path)
    for bad in (["--activation-memory-budget", "1.5"], ["--activation-memory-budget", "-0.1"]):
        out = rematopt("solve", path, "--planner", "torch-knapsack", "--budget", "40", *bad)
        assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    out = rematopt("solve", path, "--planner", "torch-knapsack", "--activation-memory-budget-solver", "lp")
    assert out.returncode == 2 and "'lp' is not one of 'dp', 'greedy', 'ilp'" in out.stderr  # click's own check
    out = rematopt("solve", path, "--planner", "torch-knapsack", "--budget", "40", "--activation-memory-budget",
                   "0.5", "--json")
    info = json.loads(out.stdout)
    assert out.returncode == 0 and info["status"] == "OVER_BUDGET" and info["knapsack_saved_bytes"] == 10


def test_both_planners_through_the_batch(tmp_path):
    graphs = tmp_path / "graphs"
    graphs.mkdir()
    dots().save(graphs / "dots.json")
    synthetic.random_layered(20, seed=1).save(graphs / "flat.json")
    out = rematopt("batch", graphs, "--planners", "xla-remat,torch-knapsack", "--budget-ratios", "1.0",
                   "--activation-memory-budget", "0.5", "--block-size-limit", "2", "--out", tmp_path / "out")
    assert out.returncode == 0, out.stderr
    rows = {(r["graph"].split("_w")[0], r["planner"]): r for r in read_rows(tmp_path / "out")}
    assert rows[("dots", "torch-knapsack")]["status"] == "FEASIBLE"
    assert json.loads(rows[("dots", "torch-knapsack")]["stats"])["knapsack_saved_bytes"] == 10
    assert rows[("random_layered_n20", "torch-knapsack")]["status"] == "SKIPPED"
    assert "no phases" in rows[("random_layered_n20", "torch-knapsack")]["error"]
    assert rows[("random_layered_n20", "xla-remat")]["status"] in ("FEASIBLE", "OVER_BUDGET")
    assert json.loads(rows[("dots", "xla-remat")]["options"])["block_size_limit"] == 2
