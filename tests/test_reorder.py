"""rematopt.reorder.eager: the same graph in an order that places the step's
outputs and what frees memory as early as their inputs allow. The order is
a valid topological one over the same nodes, every planner's plan of the
reordered graph replays in the simulator, and cpsat's optimum in the new
order is exhaustive search's in it."""

from __future__ import annotations

import pytest

from rematopt.graph import Graph, Node
from rematopt.importers import synthetic
from rematopt.plan import COMPUTE
from rematopt.reference import no_remat_peak, no_remat_plan, peak_lower_bound
from rematopt.reorder import eager
from rematopt.simulate import simulate
from rematopt.solve import solve

from brute_force import min_cost


def weight_gradients_last() -> Graph:
    """A two-layer step in the order XLA's CPU scheduler gives resnet: both
    weight gradients (outputs) after the whole backward pass, so the forward
    activations they read are held to the end."""
    spec = [  # name, kind, bytes, phase, output, inputs
        ("x", "input", 1, None, False, []),
        ("w1", "input", 1, None, False, []),
        ("w2", "input", 1, None, False, []),
        ("a1", "compute", 8, "forward", False, ["x", "w1"]),
        ("a2", "compute", 8, "forward", False, ["a1", "w2"]),
        ("loss", "compute", 1, "forward", True, ["a2"]),
        ("d2", "compute", 8, "backward", False, ["loss", "a2"]),
        ("d1", "compute", 8, "backward", False, ["d2", "w2"]),
        ("dx", "compute", 1, "backward", True, ["d1", "w1"]),
        ("copy", "compute", 8, "backward", False, []),  # a buffer written from nothing (XLA's transposed copy)
        ("g2", "compute", 1, "backward", True, ["d2", "a1", "copy"]),
        ("g1", "compute", 1, "backward", True, ["d1", "x"]),
    ]
    ids = {name: i for i, (name, *_) in enumerate(spec)}
    nodes = [Node(i, name, op=name, kind=kind, bytes=b, cost=0 if kind == "input" else 1, phase=phase, output=out,
                  persistent=kind == "input")
             for i, (name, kind, b, phase, out, _) in enumerate(spec)]
    edges = [(ids[u], ids[name]) for name, *_, ins in spec for u in ins]
    return Graph("weight_gradients_last", nodes, edges)


def names(graph: Graph) -> list[str]:
    return [graph.nodes[i].name for i in graph.order]


def test_outputs_move_as_early_as_their_inputs_allow():
    g = weight_gradients_last()
    h = eager(g)
    assert names(g) == ["x", "w1", "w2", "a1", "a2", "loss", "d2", "d1", "dx", "copy", "g2", "g1"]
    # g2 right after d2 (its last non-source input), the copy right before it; g1 right after d1, after dx
    # (both ready there: the old order decides)
    assert names(h) == ["x", "w1", "w2", "a1", "a2", "loss", "d2", "copy", "g2", "d1", "dx", "g1"]
    assert [v.to_dict() for v in h.nodes] == [v.to_dict() for v in g.nodes] and h.edges == g.edges
    # a1 (8 B) dies at g2 instead of living to the end: 8 + 8 B of forward values held less
    assert no_remat_peak(h) < no_remat_peak(g)


def test_backward_nodes_stay_after_the_first_backward_node():
    # "dw" reads only an input and frees a forward value: it may not move into the forward pass
    spec = [Node(0, "x", kind="input", bytes=1, persistent=True), Node(1, "a", bytes=8, cost=1, phase="forward"),
            Node(2, "b", bytes=8, cost=1, phase="forward", output=True),
            Node(3, "d", bytes=1, cost=1, phase="backward"),
            Node(4, "dw", bytes=1, cost=1, phase="backward", output=True)]
    g = Graph("early_backward", spec, [(0, 1), (1, 2), (2, 3), (1, 4)])
    assert names(eager(g)) == ["x", "a", "b", "d", "dw"]


@pytest.mark.parametrize("graph", [synthetic.linear_training(8), synthetic.unet(2, train=True, seed=3),
                                   synthetic.random_layered(40, seed=5), synthetic.decoder(2)],
                         ids=["linear", "unet", "random", "decoder"])
def test_a_valid_order_of_the_same_graph(graph):
    h = eager(graph)  # Graph() checks the order lists every node once and is topological
    assert sorted(h.order) == list(range(graph.n)) and h.edges == graph.edges
    assert [v.to_dict() for v in h.nodes] == [v.to_dict() for v in graph.nodes]
    pos = h.position
    assert all(pos[u] < pos[v] for u, v in h.edges)
    backward = [pos[i] for i in graph.compute_ids if graph.nodes[i].phase == "backward"]
    first = min((graph.position[i] for i in graph.compute_ids if graph.nodes[i].phase == "backward"), default=None)
    if first is not None:  # the first backward node of the old order is the first in the new
        assert min(backward) == pos[graph.order[first]]


@pytest.mark.parametrize("planner", ["greedy", "dtr", "cpsat", "chen-greedy", "xla-remat"])
def test_plans_of_the_reordered_graph_replay(planner):
    h = eager(weight_gradients_last())
    for budget in range(peak_lower_bound(h), no_remat_peak(h) + 1):
        options = {"time_limit": 10, "workers": 1, "seed": 1} if planner == "cpsat" else {}
        sol = solve(h, planner, budget=budget, **options)
        if not sol.has_plan:
            continue
        replay = simulate(h, sol.plan)
        assert replay.valid, replay.error
        assert replay.peak_bytes == sol.replay.peak_bytes
        if sol.status in ("OPTIMAL", "FEASIBLE"):
            assert replay.peak_bytes <= budget


def test_no_remat_plan_follows_the_new_order():
    h = eager(weight_gradients_last())
    plan = no_remat_plan(h)
    computed = [i for op, i in zip(plan.ops.tolist(), plan.nodes.tolist()) if op == COMPUTE]
    assert computed == [i for i in h.order if not h.nodes[i].is_input]
    assert simulate(h, plan).peak_bytes == no_remat_peak(h)


def test_cpsat_claims_in_the_new_order_are_exhaustive_searchs():
    """cpsat's optimum over the staged space of the new order (``optimal_in``)
    is exhaustive search's over that space, at every budget from the
    working-set bound to the no-remat peak (28 B: recompute cost 2; 29 B: 0)."""
    h = eager(weight_gradients_last())
    proved = 0
    for budget in range(peak_lower_bound(h), no_remat_peak(h) + 1):
        best = min_cost(h, budget)
        sol = solve(h, "cpsat", budget=budget, time_limit=10, workers=1, seed=1)
        st = sol.plan.stats
        if sol.status == "INFEASIBLE":
            assert best is None
        elif st.get("optimal_in") and not st.get("plan_from") and not st.get("order_from"):
            assert best is not None and st["objective"] == best[0] == sol.replay.recompute_cost
            proved += 1
    assert proved == no_remat_peak(h) - peak_lower_bound(h) + 1
