"""The block table (``rematopt.blocks``): repeated layers found from the
importer's loop indices, its name stacks, or structural hashing, and checked
for isomorphism exactly whichever found them."""

from __future__ import annotations

import warnings
from pathlib import Path

import networkx as nx
import pytest

import rematopt
from rematopt.blocks import find_blocks, signature
from rematopt.graph import Graph, Node
from rematopt.importers.synthetic import decoder, linear_training, random_layered, unet

INSTANCES = Path(__file__).resolve().parents[1] / "instances"


def check_table(graph: Graph, table) -> None:
    """What every table promises: a partition of the nodes, members in
    program order and in their phase, positions along the forward order,
    and blocks of one kind isomorphic under the canonical correspondence."""
    pos = graph.position
    seen = list(table.outside)
    for k, b in enumerate(table.blocks):
        assert b.position == k
        for part in (b.inputs, b.forward, b.backward):
            assert list(part) == sorted(part, key=pos.__getitem__)
        assert all(graph.nodes[v].is_input for v in b.inputs)
        assert all(graph.nodes[v].phase != "backward" and not graph.nodes[v].is_input for v in b.forward)
        assert all(graph.nodes[v].phase == "backward" for v in b.backward)
        seen += b.nodes
    assert sorted(seen) == list(range(graph.n))
    firsts = [pos[b.forward[0]] for b in table.blocks]
    assert firsts == sorted(firsts)
    edges = set(graph.edges)
    for kind, positions in table.kinds.items():
        ref = table.blocks[positions[0]]
        for p in positions[1:]:
            other = table.blocks[p]
            assert signature(graph, ref.nodes) == signature(graph, other.nodes)
            for u in ref.nodes:  # every edge among members has its counterpart
                for v in graph.succs[u]:
                    if table.block_of(v) == ref.position:
                        assert (table.counterpart(u, p), table.counterpart(v, p)) in edges
                w = table.counterpart(u, p)
                assert table.canonical(w) == table.canonical(u)
                node, twin = graph.nodes[u], graph.nodes[w]
                assert (node.op, node.bytes, node.cost) == (twin.op, twin.bytes, twin.cost)


def without(graph: Graph, *fields: str) -> Graph:
    """``graph`` with the importer's provenance fields dropped, as a
    node-link or MLIR graph would come."""
    d = graph.to_dict()
    for v in d["nodes"]:
        for f in fields:
            v.pop(f, None)
    return Graph.from_dict(d)


@pytest.mark.parametrize("name, layers, kinds", [("gpt_l2_w64", 2, 1), ("gpt_l10_w128_s64", 10, 1),
                                                 ("gpt_l10_w128_s64_fused", 10, 1)])
def test_decoder_instances_are_found_by_hashing(name, layers, kinds):
    g = rematopt.load(INSTANCES / f"{name}.json")
    table = find_blocks(g)
    assert table.source == "hash" and len(table) == layers and len(table.kinds) == kinds
    check_table(g, table)
    # each block holds its layer's 8 parameters and a gradient the size of its forward
    assert all(len(b.inputs) == 8 for b in table.blocks)
    assert all(g.nodes[v].persistent for b in table.blocks for v in b.inputs)
    # the embedding, head and loss are outside, before and after the blocks
    first, last = table.blocks[0].forward[0], table.blocks[-1].forward[-1]
    fwd_outside = [v for v in table.outside if g.nodes[v].phase == "forward"]
    assert any(g.position[v] < g.position[first] for v in fwd_outside)
    assert any(g.position[v] > g.position[last] for v in fwd_outside)
    # the gradient of block k reads block k's forward values, and no other block's but its predecessor's
    for b in table.blocks:
        read = {table.block_of(p) for v in b.backward for p in g.preds[v] if g.nodes[p].phase == "forward"}
        assert b.position in read and read - {None} <= {b.position, b.position - 1}


def test_mlp_first_layer_differs():
    """mlp_l4_w256: 4 hidden layers, the first reading the 128-wide input;
    the three 256-wide layers are the blocks."""
    g = rematopt.load(INSTANCES / "mlp_l4_w256.json")
    table = find_blocks(g)
    assert table.source == "hash" and len(table) == 3 and len(table.kinds) == 1
    check_table(g, table)


@pytest.mark.parametrize("name", ["resnet_s2_c16", "unet_d2_c8"])
def test_blocks_that_differ_are_no_repetition(name):
    """resnet's two stages and unet's levels differ in channels and sizes."""
    assert find_blocks(rematopt.load(INSTANCES / f"{name}.json")) is None


def test_no_repetition():
    assert find_blocks(random_layered(200, seed=3)) is None
    assert find_blocks(unet(3, train=True)) is None
    assert find_blocks(linear_training(8, seed=1)) is None  # jittered sizes: every layer differs


def test_generated_chain_of_blocks():
    g = decoder(6, heads=2)
    table = find_blocks(g)
    check_table(g, table)
    assert len(table) == 6
    # the last block's output goes to the head, whose gradient its own gradient reads: another kind
    assert table.kinds == {0: (0, 1, 2, 3, 4), 1: (5,)}
    names = [[g.nodes[v].name for v in b.forward] for b in table.blocks]
    assert all(n[0] == f"l{k}.norm1" and n[-1] == f"l{k}.add2" for k, n in enumerate(names))
    assert all(g.nodes[v].name.startswith(f"d(l{k}.") for k, b in enumerate(table.blocks) for v in b.backward)
    assert sorted(g.nodes[v].name for v in table.outside) == ["d(embed)", "d(head)", "d(norm_f)", "embed",
                                                              "head", "loss", "norm_f"]


def test_pure_chain_is_one_node_blocks():
    g = linear_training(8)
    table = find_blocks(g)
    check_table(g, table)
    assert [(len(b.forward), len(b.backward)) for b in table.blocks] == [(1, 1)] * 7
    assert [g.nodes[b.backward[0]].name for b in table.blocks] == [f"d(c{k})" for k in range(1, 8)]


def collision_graph() -> Graph:
    """Four blocks of six equal nodes chained by a link node: blocks 0, 1
    and 3 are two transitive triangles, block 2 a hexagon oriented with the
    same in/out degrees and roles in program order (source, middle, source,
    sink, middle, sink). Weisfeiler-Lehman cannot tell them apart."""
    triangles = [(0, 1), (1, 3), (0, 3), (2, 4), (4, 5), (2, 5)]
    hexagon = [(0, 1), (1, 3), (2, 3), (2, 4), (4, 5), (0, 5)]
    nodes, edges = [Node(0, "x", op="x", bytes=4, cost=1.0)], []
    prev = 0
    for k, inner in enumerate([triangles, triangles, hexagon, triangles]):
        base = len(nodes)
        nodes += [Node(base + j, f"b{k}.{j}", op="op", bytes=8, cost=1.0) for j in range(6)]
        edges += [(base + a, base + b) for a, b in inner]
        edges += [(prev, base + 0), (prev, base + 2)]
        link = len(nodes)
        nodes.append(Node(link, f"link{k}", op="x", bytes=4, cost=1.0))
        edges += [(base + 3, link), (base + 5, link)]
        prev = link
    nodes.append(Node(len(nodes), "out", op="out", bytes=4, cost=1.0, output=True))
    edges.append((prev, len(nodes) - 1))
    return Graph("collision", nodes, edges)


def test_a_hash_collision_does_not_make_a_kind():
    g = collision_graph()
    nxg = g.to_networkx()
    for v in g.nodes:
        nxg.nodes[v.id]["label"] = v.op
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        inner = {k: nx.weisfeiler_lehman_graph_hash(nxg.subgraph(range(1 + 7 * k, 7 + 7 * k)), node_attr="label")
                 for k in range(4)}
    assert len(set(inner.values())) == 1  # the hash says all four blocks are alike
    table = find_blocks(g)
    check_table(g, table)
    assert len(table) == 4
    kinds = [b.kind for b in table.blocks]
    assert kinds[0] == kinds[1] == kinds[3] != kinds[2]
    assert not nx.is_isomorphic(nxg.subgraph(table.blocks[1].nodes), nxg.subgraph(table.blocks[2].nodes))


def test_counterpart_refuses_outside_nodes_and_other_kinds():
    g = decoder(3, heads=1)
    table = find_blocks(g)
    with pytest.raises(ValueError, match="in no block"):
        table.counterpart(table.outside[0], 0)
    with pytest.raises(ValueError, match="different kinds"):
        table.counterpart(table.blocks[0].forward[0], 2)
    assert table.block_of(table.outside[0]) is None and table.canonical(table.outside[0]) is None


jax = pytest.importorskip("jax")


def test_scan_iterations_and_the_python_loop_give_the_same_blocks():
    """gpt_scan unrolled carries ``iteration``; gpt's Python loop does not:
    hashing finds the same blocks as the loop indices."""
    from rematopt.jax import load_factory, trace_grad

    loss, args = load_factory("models.gpt_scan:factory", layers=3)
    scanned = trace_grad(loss, *args)
    table = find_blocks(scanned)
    assert table.source == "iteration" and len(table) == 3 and len(table.kinds) == 1
    check_table(scanned, table)
    hashed = find_blocks(without(scanned, "iteration"))
    assert hashed.source == "hash" and hashed.blocks == table.blocks
    loss, args = load_factory("models.gpt:factory", layers=3)
    loop = trace_grad(loss, *args)
    from_loop = find_blocks(loop)
    assert from_loop.source == "hash" and len(from_loop) == 3
    assert all(signature(loop, a.nodes) == signature(scanned, b.nodes)
               for a, b in zip(from_loop.blocks, table.blocks))


def test_name_stack_scopes():
    import jax.numpy as jnp
    from rematopt.jax import trace_grad

    def loss(params, x):
        for k, p in enumerate(params):
            with jax.named_scope(f"layers_{k}"):
                x = jnp.tanh(x @ p)
        return jnp.sum(x * x)

    g = trace_grad(loss, [jnp.full((16, 16), 0.1) for _ in range(4)], jnp.ones((4, 16)))
    table = find_blocks(g)
    assert table.source == "name_stack" and len(table) == 4
    check_table(g, table)
    # block 0 holds the batch too (only it reads it) and has no input gradient: its own kind
    assert [b.kind for b in table.blocks] == [0, 1, 1, 1]
    assert all(g.nodes[v].extra["name_stack"] == f"layers_{b.position}" for b in table.blocks
               for v in b.forward + b.backward)
