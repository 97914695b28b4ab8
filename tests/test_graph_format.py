"""rematopt.graph/1 loading, validation and round trips."""

from __future__ import annotations

import json

import pytest

from rematopt import Graph, GraphError, Node, RematoptError, simulate
from rematopt.reference import no_remat_plan
from rematopt.importers.synthetic import chain, linear_training, random_layered, unet
from rematopt.importers import load as load_graph


def doc(**over):
    d = {
        "format": "rematopt.graph/1",
        "name": "g",
        "nodes": [
            {"id": 0, "name": "x", "op": "input", "kind": "input", "bytes": 8, "cost": 0},
            {"id": 1, "name": "a", "op": "exp", "bytes": 16, "cost": 1.5},
            {"id": 2, "name": "b", "op": "add", "bytes": 4, "cost": 0.5, "output": True},
        ],
        "edges": [[0, 1], [1, 2], [0, 2]],
        "order": [0, 1, 2],
        "meta": {"cost_unit": "s"},
    }
    d.update(over)
    return d


def write(tmp_path, d, name="g.json"):
    p = tmp_path / name
    p.write_text(json.dumps(d) if not isinstance(d, str) else d)
    return p


def test_load_reads_every_field(tmp_path):
    g = load_graph(write(tmp_path, doc()))
    assert g.n == 3 and g.nodes[0].is_input and g.nodes[2].output
    assert g.preds[2] == [0, 1] and g.succs[0] == [1, 2]
    assert g.cost_unit == "s" and g.compute_ids == [1, 2]


def test_round_trip_keeps_unknown_fields(tmp_path):
    d = doc()
    d["nodes"][1]["flops"] = 123
    d["nodes"][1]["recompute"] = True
    d["producer"] = "someone else's tool"
    g = load_graph(write(tmp_path, d))
    out = tmp_path / "out.json"
    g.save(out)
    again = json.loads(out.read_text())
    assert again["nodes"][1]["flops"] == 123 and again["nodes"][1]["recompute"] is True
    assert again["producer"] == "someone else's tool"
    assert load_graph(out).to_dict() == g.to_dict()


@pytest.mark.parametrize("make", [lambda: chain(5, sinks=True), lambda: linear_training(6),
                                  lambda: unet(2, train=True), lambda: random_layered(40, seed=3)])
def test_generated_graphs_round_trip(tmp_path, make):
    g = make()
    g.save(tmp_path / "g.json")
    assert load_graph(tmp_path / "g.json").to_dict() == g.to_dict()


@pytest.mark.parametrize("mutate, problem", [
    (lambda d: d.update(format="rematopt.graph/2"), "format must be"),
    (lambda d: d["nodes"][1].update(id=7), "dense"),
    (lambda d: d["nodes"].append(dict(d["nodes"][1])), "duplicate node id 1"),
    (lambda d: d["edges"].append([1, 9]), "does not exist"),
    (lambda d: d["edges"].append([2, 1]), "cycle"),
    (lambda d: d["edges"].append([1, 1]), "self-loop"),
    (lambda d: d["nodes"][1].update(kind="input"), "ends at input node 1 (a)"),
    (lambda d: d.update(order=[0, 2, 1]), "not topological"),
    (lambda d: d.update(order=[0, 1]), "exactly once"),
    (lambda d: d["nodes"][1].update(bytes=-1), "bytes must be an integer >= 0"),
    (lambda d: d["nodes"][1].update(bytes=1.5), "bytes must be an integer >= 0"),
    (lambda d: d["nodes"][1].update(cost=-2), "cost must be a finite number >= 0"),
    (lambda d: d["nodes"][1].update(cost="fast"), "cost must be a finite number >= 0"),
    (lambda d: d["nodes"][1].update(kind="weird"), "kind must be one of"),
    (lambda d: d["nodes"][1].update(phase="sideways"), "phase must be"),
    (lambda d: d["nodes"][1].update(persistent=True), "persistent node must be an input"),
    (lambda d: d["nodes"][1].update(output="yes"), "output must be true or false"),
    (lambda d: d.update(edges=[[0, 1, 2]]), "pair"),
    (lambda d: d.update(nodes="none"), "'nodes' must be a list"),
    (lambda d: d.update(order=[0, 1.0, 2]), "order entries must be integer node ids, got 1.0"),
    (lambda d: d.update(order=[0, None, 2]), "order entries must be integer node ids, got None"),
    (lambda d: d.update(order=[0, [1], 2]), "order entries must be integer node ids, got [1]"),
    (lambda d: d["meta"].update(budget_bytes="abc"), "meta.budget_bytes must be an integer"),
    (lambda d: d["meta"].update(budget_bytes="1e3"), "meta.budget_bytes must be an integer"),
    (lambda d: d["meta"].update(budget_bytes=float("nan")), "meta.budget_bytes must be an integer"),
    (lambda d: d["meta"].update(budget_bytes=[1]), "meta.budget_bytes must be an integer"),
    (lambda d: d["meta"].update(budget_bytes={"a": 1}), "meta.budget_bytes must be an integer"),
    (lambda d: d["meta"].update(budget_bytes=-1), "meta.budget_bytes must be an integer"),
    (lambda d: d["meta"].update(budget_bytes=2**63), "meta.budget_bytes must be an integer from 0 to 2^53"),
    (lambda d: d["nodes"][1].update(bytes=2**63), "bytes total exceeds the limit 2^53"),
    (lambda d: d["nodes"][1].update(bytes=2**64 + 55), "bytes total exceeds the limit 2^53"),
    (lambda d: d["nodes"][1].update(bytes=1e30), "bytes must be an integer >= 0"),
    (lambda d: [n.update(bytes=2**52 + 1) for n in d["nodes"]], "node 1 (a): the bytes total exceeds the limit"),
    (lambda d: d["nodes"][1].update(cost=1e308), "cost total exceeds the limit 2^53"),
    (lambda d: [n.update(cost=1e308 / 2) for n in d["nodes"]], "cost total exceeds the limit 2^53"),
    (lambda d: d["nodes"][1].pop("bytes"), "nodes[1] (id 1) has no 'bytes'"),
    (lambda d: d["nodes"][2].pop("cost"), "nodes[2] (id 2) has no 'cost'"),
    (lambda d: d.pop("edges"), "'edges' is missing"),
    (lambda d: d["nodes"][1].update(recompute=True, recomputable=False), "REMAT_EFFECTFUL: node 1 (a)"),
])
def test_invalid_graphs_are_rejected_with_file_and_reason(tmp_path, mutate, problem):
    d = doc()
    mutate(d)
    path = write(tmp_path, d)
    with pytest.raises(GraphError) as err:
        load_graph(path)
    assert str(err.value).startswith(str(path)) and problem in str(err.value)


def test_the_largest_real_sizes_load_and_simulate(tmp_path):
    """A petabyte of values and 1e6 s of compute (1e15 ns) are within the limit."""
    d = doc()
    d["nodes"][1].update(bytes=10**15, cost=1e6)
    d["nodes"][2].update(cost=1e15 - 1e6)
    g = load_graph(write(tmp_path, d))
    replay = simulate(g, no_remat_plan(g))
    assert replay.valid and replay.peak_bytes == 8 + 10**15 + 4 and replay.compute_cost == 1e15


@pytest.mark.parametrize("text, problem", [
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ('{"format": "rematopt.graph/1", "nodes": [{"id": 0, "bytes": ' + "7" * 5000 + ', "cost": 0}], "edges": []}',
     "unreadable JSON number"),
])
def test_unreadable_json_is_one_line(tmp_path, text, problem):
    path = write(tmp_path, text)
    with pytest.raises(GraphError) as err:
        load_graph(path)
    assert str(err.value).startswith(str(path)) and problem in str(err.value)


def test_malformed_and_missing_files(tmp_path):
    with pytest.raises(GraphError, match="malformed JSON at line 1"):
        load_graph(write(tmp_path, "{not json"))
    with pytest.raises(GraphError, match="no such file"):
        load_graph(tmp_path / "absent.json")
    with pytest.raises(GraphError, match="a graph must be a JSON object"):
        load_graph(write(tmp_path, "[1, 2]"))


def test_edges_in_reverse_order_are_fine_when_order_is_given():
    g = Graph("g", [Node(0, "b"), Node(1, "a")], [(1, 0)], order=[1, 0])
    assert g.position == [1, 0] and g.last_use == [1, 1]


NODELINK = {"directed": True, "graph": {"name": "cm"},
            "nodes": [{"id": i, "cost_ram": 8, "cost_cpu": 1} for i in range(3)],
            "links": [{"source": 0, "target": 1}, {"source": 1, "target": 2}]}


@pytest.mark.parametrize("mutate, problem", [
    (lambda d: d.update(links=5), "'nodes' and 'links' must be non-empty lists"),
    (lambda d: d.update(links=[5, 6]), "links[0] does not join two known nodes"),
    (lambda d: d.update(graph=[1, 2]), "'graph' must be an object"),
    (lambda d: d["nodes"][1].update(cost_ram=2**64 + 55), "bytes total exceeds the limit 2^53"),
    (lambda d: d["nodes"][1].update(cost_cpu=1e308), "cost total exceeds the limit 2^53"),
])
def test_invalid_nodelink_is_refused_with_file_and_reason(tmp_path, mutate, problem):
    d = json.loads(json.dumps(NODELINK))
    assert load_graph(write(tmp_path, d)).n == 3
    mutate(d)
    path = write(tmp_path, d)
    with pytest.raises(RematoptError) as err:
        load_graph(path)
    assert str(err.value).startswith(str(path)) and problem in str(err.value)
