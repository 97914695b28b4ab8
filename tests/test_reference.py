"""Reference points: published figures, and properties on random DAGs."""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import nodelink_files
from rematopt import Graph, Node, no_remat_peak, no_remat_plan, simulate, working_set_bound
from rematopt.errors import BudgetError
from rematopt.plan import Plan
from rematopt.reference import peak_lower_bound, resolve_budget
from rematopt.simulate import base_cost
from rematopt.importers import load as load_graph

# shared/benchmarks/README.md, "Reference figures"
PUBLISHED = {
    "vgg16_train": (15_825_108_992, 13_153_337_344, 15_500),
    "mobilenet_train": (34_701_056_000, 6_635_651_072, 162_080),
    "vgg19_infer": (6_576_668_672, 6_576_668_672, 5_551_065),
    "random_layered_n100": (46_319, 20_020, 47_769),
    "random_layered_n250": (146_840, 87_600, 125_569),
}


def test_published_graphs_are_all_checked(benchmarks_dir):
    assert {p.stem for p in benchmarks_dir.glob("*.json")} == set(PUBLISHED)


@pytest.mark.parametrize("path", nodelink_files(), ids=lambda p: p.stem)
def test_published_reference_figures(path):
    g = load_graph(path)
    peak, ws, base = PUBLISHED[path.stem]
    replay = simulate(g, no_remat_plan(g))
    assert replay.valid, replay.error
    assert replay.peak_bytes == no_remat_peak(g) == peak
    assert working_set_bound(g) == ws
    assert base_cost(g) == replay.compute_cost == base


@st.composite
def dags(draw, max_nodes=12):
    n = draw(st.integers(1, max_nodes))
    nodes = []
    for i in range(n):
        kind = draw(st.sampled_from(["compute", "compute", "compute", "input"]))
        nodes.append(Node(i, f"v{i}", kind=kind, bytes=draw(st.integers(0, 100)),
                          cost=draw(st.floats(0, 10, allow_nan=False)),
                          persistent=kind == "input" and draw(st.booleans()),
                          output=draw(st.booleans()) and draw(st.booleans())))
    edges = [(u, v) for v in range(n) for u in range(v)
             if nodes[v].kind == "compute" and draw(st.integers(0, 3)) == 0]
    order = list(range(n))
    # any topological order: a seeded shuffle of Kahn's algorithm
    rng = random.Random(draw(st.integers(0, 1000)))
    indeg = [0] * n
    for _, v in edges:
        indeg[v] += 1
    ready, order = [i for i in range(n) if indeg[i] == 0], []
    while ready:
        i = ready.pop(rng.randrange(len(ready)))
        order.append(i)
        for u, v in edges:
            if u == i:
                indeg[v] -= 1
                if indeg[v] == 0:
                    ready.append(v)
    return Graph("random", nodes, edges, order)


@settings(max_examples=150, deadline=None)
@given(dags())
def test_no_remat_plan_is_valid_and_above_the_bounds(g):
    replay = simulate(g, no_remat_plan(g))
    assert replay.valid, replay.error
    assert replay.peak_bytes == no_remat_peak(g)
    assert replay.peak_bytes >= working_set_bound(g)
    assert replay.peak_bytes >= peak_lower_bound(g)
    assert replay.compute_cost == base_cost(g) and replay.recompute_cost == 0


def free_at_end_events(g: Graph) -> list[tuple[str, int]]:
    events = [("compute", i) for i in g.order if not g.nodes[i].is_input]
    return events + [("free", v.id) for v in g.nodes if not v.persistent and not v.output]


@settings(max_examples=100, deadline=None)
@given(dags(), st.integers(0, 10_000))
def test_freeing_a_value_earlier_never_raises_the_peak(g, seed):
    rng = random.Random(seed)
    events = free_at_end_events(g)
    peak = simulate(g, Plan.from_events(g.name, "t", events)).peak_bytes
    for _ in range(len(events)):
        frees = [k for k, (op, _) in enumerate(events) if op == "free"]
        if not frees:
            break
        k = rng.choice(frees)
        node = events[k][1]
        # earliest legal spot: after the node's own compute and its consumers' computes
        needed = {node} | set(g.succs[node])
        after = max((j for j, (op, i) in enumerate(events[:k]) if op == "compute" and i in needed),
                    default=-1)
        j = rng.randint(after + 1, k)
        events.insert(j, events.pop(k))
        replay = simulate(g, Plan.from_events(g.name, "t", events))
        assert replay.valid, replay.error
        assert replay.peak_bytes <= peak
        peak = replay.peak_bytes


def test_resolve_budget_rules():
    g = Graph("g", [Node(0, "a", bytes=10), Node(1, "b", bytes=20)], [(0, 1)], meta={"budget_bytes": 40})
    assert resolve_budget(g) == 40
    assert resolve_budget(g, ratio=1.0) == 30 and resolve_budget(g, budget=31) == 31
    with pytest.raises(BudgetError, match="below the lower bound 30"):
        resolve_budget(g, ratio=0.5)
    assert resolve_budget(g, budget=0, check=False) == 0
    with pytest.raises(BudgetError, match="not both"):
        resolve_budget(g, budget=1, ratio=1.0)
    with pytest.raises(BudgetError, match=">= 0"):
        resolve_budget(g, budget=-1, check=False)


def test_nodelink_conventions_and_params(tmp_path):
    """Moccasin's convention with a parameter becomes a persistent input feeding the node."""
    doc = {"directed": True, "graph": {"order": [5, 7]},
           "nodes": [{"name": 7, "out_cost": 3, "duration": 2, "param_cost": 0},
                     {"name": 5, "out_cost": 4, "duration": 1, "param_cost": 10}],
           "links": [{"0": 5, "1": 7}]}
    (tmp_path / "m.json").write_text(json.dumps(doc))
    g = load_graph(tmp_path / "m.json")
    assert [v.name for v in g.nodes] == ["5", "7", "param:5"]
    assert g.nodes[2].persistent and g.preds[0] == [2] and g.order == [2, 0, 1]
    assert working_set_bound(g) == 4 + 3 + 10
    doc["links"] = [{"0": 5, "1": 99}]
    (tmp_path / "m.json").write_text(json.dumps(doc))
    with pytest.raises(Exception, match=r"m.json: node-link: links\[0\] does not join two known nodes"):
        load_graph(tmp_path / "m.json")
