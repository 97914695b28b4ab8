"""Synthetic generators: deterministic in their seed, and the shapes they promise."""

from __future__ import annotations

import networkx as nx
import pytest

from rematopt import no_remat_plan, simulate
from rematopt.importers.synthetic import GENERATORS, chain, linear_training, random_layered, unet


@pytest.mark.parametrize("make", [lambda s: chain(6, sinks=True, seed=s), lambda s: linear_training(5, seed=s),
                                  lambda s: unet(3, train=True, seed=s), lambda s: random_layered(60, seed=s)])
def test_seeded_and_deterministic(make):
    assert make(1).to_dict() == make(1).to_dict()
    assert make(1).to_dict() != make(2).to_dict()


def test_chain_with_sinks_keeps_every_link_live_to_its_late_sink():
    g = chain(5, sinks=True)
    links = [g.node_by_name(f"c{i}").id for i in range(1, 6)]
    sinks = [g.node_by_name(f"s{i}").id for i in range(1, 6)]
    assert g.n == 11 and all(g.nodes[s].phase == "backward" for s in sinks)
    last_forward = max(g.position[c] for c in links)
    for c, s in zip(links, sinks):
        assert s in g.succs[c] and g.position[s] > last_forward
    # s1 is the last op, so c1 lives through the whole backward part
    assert g.order[-1] == g.node_by_name("s1").id


def test_training_graph_mirrors_the_forward_pass():
    g = linear_training(4)
    fwd = [v for v in g.nodes if v.phase == "forward"]
    bwd = [v for v in g.nodes if v.phase == "backward"]
    assert len(fwd) == 5 and len(bwd) == 4  # 4 layers + loss; one gradient per layer
    assert nx.is_directed_acyclic_graph(g.to_networkx())
    assert all(g.position[f.id] < g.position[b.id] for f in fwd for b in bwd)
    assert sum(v.output for v in g.nodes) == 2


def test_unet_has_skip_connections():
    g = unet(3)
    for level in range(3):
        enc, dec = g.node_by_name(f"enc{level}").id, g.node_by_name(f"dec{level}").id
        assert enc in g.preds[dec]
    assert g.node_by_name("enc2").bytes == g.node_by_name("enc0").bytes // 4


def test_random_layered_is_a_single_source_single_sink_dag():
    g = random_layered(120, seed=4)
    nxg = g.to_networkx()
    assert nx.is_directed_acyclic_graph(nxg)
    assert [v for v in nxg if nxg.in_degree(v) == 0] == [0]
    assert [v for v in nxg if nxg.out_degree(v) == 0] == [1]
    assert g.order[0] == 0 and g.order[-1] == 1
    assert all(v.bytes % 10 == 0 and v.bytes > 0 for v in g.nodes)
    assert any(g.position[v] - g.position[u] > 20 for u, v in g.edges)  # skip connections


@pytest.mark.parametrize("name", sorted(GENERATORS))
def test_every_generator_gives_a_plannable_graph(name):
    g = GENERATORS[name](8)
    assert simulate(g, no_remat_plan(g)).valid
