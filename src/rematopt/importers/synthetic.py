"""Seeded synthetic graphs: the shapes the planners are tested and stressed on.

Every generator is deterministic in its arguments (``seed`` included) and
returns a :class:`Graph` whose ``meta`` records the generator and its
parameters, so a graph file says how to make it again.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

from ..graph import Graph, Node

MiB = 1 << 20


def _graph(name: str, nodes: list[Node], edges: list[tuple[int, int]], params: dict,
           order: list[int] | None = None) -> Graph:
    meta = {"source": "synthetic", "generator": name.split("_")[0], "params": params, "cost_unit": "unit"}
    return Graph(name, nodes, edges, order, meta)


def _sizes(rng: np.random.Generator | None, base: int, cost: float) -> tuple[int, float]:
    """``base`` bytes and ``cost``, jittered by up to +-50% when seeded."""
    if rng is None:
        return base, cost
    return int(base * rng.uniform(0.5, 1.5)), round(cost * rng.uniform(0.5, 1.5), 3)


def chain(depth: int, sinks: bool = False, bytes: int = MiB, cost: float = 1.0,
          seed: int | None = None) -> Graph:
    """A source ``x`` and a chain ``c1 -> ... -> c{depth}``.

    With ``sinks``, every chain node ``ci`` also feeds its own sink ``si`` in the
    backward phase, consumed late in the program (``s{depth}`` first, ``s1``
    last), so every intermediate is live until near the end: the stress shape
    for the greedy pass, whose clone count grows as depth^2 / 2 on it.
    """
    if depth < 1:
        raise ValueError("depth must be >= 1")
    rng = np.random.default_rng(seed) if seed is not None else None
    phase = "forward" if sinks else None
    nodes = [Node(0, "x", op="source", bytes=_sizes(rng, bytes, cost)[0], cost=cost, phase=phase)]
    edges = []
    for i in range(1, depth + 1):
        b, c = _sizes(rng, bytes, cost)
        nodes.append(Node(i, f"c{i}", op="link", bytes=b, cost=c, phase=phase))
        edges.append((i - 1, i))
    if sinks:
        for i in range(depth, 0, -1):
            s = len(nodes)
            b, c = _sizes(rng, bytes, cost)
            nodes.append(Node(s, f"s{i}", op="sink", bytes=b, cost=c, phase="backward"))
            edges.append((i, s))
    return _graph(f"chain{'_sinks' if sinks else ''}_d{depth}", nodes, edges,
                  {"depth": depth, "sinks": sinks, "bytes": bytes, "cost": cost, "seed": seed})


def training(forward: Graph, name: str | None = None) -> Graph:
    """The forward+backward graph of a forward graph, built the way Checkmate
    derives its training graphs: a ``loss`` node after the last forward node,
    then for each forward node v (in reverse order) a gradient node ``d(v)``
    that reads the gradients of v's consumers (or the loss), v's own output
    and v's inputs. ``d(v)`` has v's bytes and twice its cost (the usual
    backward-to-forward FLOP ratio). The loss and the last gradient are outputs."""
    n = forward.n
    nodes = [Node(v.id, v.name, op=v.op, kind=v.kind, bytes=v.bytes, cost=v.cost,
                  persistent=v.persistent, phase="forward") for v in forward.nodes]
    edges = list(forward.edges)
    sinks = [v.id for v in forward.nodes if not forward.succs[v.id] and not v.is_input]
    loss = n
    nodes.append(Node(loss, "loss", op="loss", bytes=4, cost=1.0, phase="forward"))
    edges += [(s, loss) for s in sinks]
    grad: dict[int, int] = {}
    for v in reversed(forward.order):
        node = forward.nodes[v]
        if node.is_input:
            continue
        g = len(nodes)
        grad[v] = g
        nodes.append(Node(g, f"d({node.name})", op="grad", bytes=node.bytes, cost=2 * node.cost,
                          phase="backward"))
        upstream = [grad[s] for s in forward.succs[v]] or [loss]
        edges += [(u, g) for u in upstream] + [(v, g)]
        edges += [(p, g) for p in forward.preds[v]]
    order = list(forward.order) + list(range(loss, len(nodes)))
    nodes[loss].output = True
    nodes[-1].output = True  # the gradient of the first layer: the step's result
    meta_params = dict(forward.meta.get("params", {}))
    g = _graph(name or f"{forward.name}_train", nodes, edges, meta_params, order)
    g.meta["generator"] = f"training({forward.meta.get('generator', 'graph')})"
    return g


def linear_training(length: int, bytes: int = MiB, cost: float = 1.0, seed: int | None = None) -> Graph:
    """Checkmate's linear graph: a chain of ``length`` layers and its backward pass."""
    return training(chain(length - 1, bytes=bytes, cost=cost, seed=seed), name=f"linear_train_n{length}")


def unet(depth: int, bytes: int = 16 * MiB, cost: float = 1.0, train: bool = False,
         seed: int | None = None) -> Graph:
    """A U-Net-like encoder/decoder: ``depth`` encoder stages, each halving the
    activation size, a bottleneck, and ``depth`` decoder stages, each reading
    the previous decoder stage and the encoder stage of its level (the skip
    connection). With ``train``, the forward+backward graph (see :func:`training`)."""
    if depth < 1:
        raise ValueError("depth must be >= 1")
    rng = np.random.default_rng(seed) if seed is not None else None
    nodes: list[Node] = []
    edges: list[tuple[int, int]] = []

    def add(name: str, op: str, size: int, c: float, inputs: list[int]) -> int:
        b, c = _sizes(rng, size, c)
        i = len(nodes)
        nodes.append(Node(i, name, op=op, bytes=b, cost=c))
        edges.extend((p, i) for p in inputs)
        return i

    x = add("x", "source", bytes, cost, [])
    enc = []
    prev = x
    for level in range(depth):
        size = bytes >> level
        conv = add(f"enc{level}", "conv", size, cost, [prev])
        enc.append(conv)
        prev = add(f"down{level}", "pool", size >> 1, cost / 4, [conv])
    prev = add("bottleneck", "conv", bytes >> depth, cost, [prev])
    for level in reversed(range(depth)):
        size = bytes >> level
        up = add(f"up{level}", "upsample", size, cost / 4, [prev])
        prev = add(f"dec{level}", "conv", size, cost, [up, enc[level]])
    add("head", "conv", bytes, cost, [prev])
    g = _graph(f"unet_d{depth}", nodes, edges, {"depth": depth, "bytes": bytes, "cost": cost, "seed": seed})
    return training(g, name=f"unet_d{depth}_train") if train else g


def decoder(layers: int, heads: int = 4, bytes: int = MiB, cost: float = 1.0) -> Graph:
    """A chain of ``layers`` identical pre-norm decoder blocks and its
    backward pass (see :func:`training`): per block a norm, per head a
    query, key, value, score (4x bytes), softmax and attention output, an
    output projection and residual add, a norm, a 4x-wide MLP (up,
    activation, down) and residual add; an embedding before and a norm and
    head after. Matmuls cost 4x, scores and softmax 2x, the rest 1x.
    ``6 heads + 9`` forward nodes a block, twice that with the backward: the
    repeated-layer shape at any size (480 blocks of 16 heads: 101,000 nodes)."""
    if layers < 1 or heads < 1:
        raise ValueError("layers and heads must be >= 1")
    nodes: list[Node] = []
    edges: list[tuple[int, int]] = []

    def add(name: str, op: str, scale: float, c: float, inputs: list[int]) -> int:
        i = len(nodes)
        nodes.append(Node(i, name, op=op, bytes=int(bytes * scale), cost=cost * c))
        edges.extend((p, i) for p in inputs)
        return i

    x = add("embed", "embed", 1, 1, [])
    head_bytes = 1 / heads
    for k in range(layers):
        norm = add(f"l{k}.norm1", "norm", 1, 1, [x])
        outs = []
        for h in range(heads):
            q, key, v = (add(f"l{k}.h{h}.{w}", "matmul", head_bytes, 4 / heads, [norm]) for w in "qkv")
            s = add(f"l{k}.h{h}.scores", "scores", 4 * head_bytes, 2 / heads, [q, key])
            p = add(f"l{k}.h{h}.softmax", "softmax", 4 * head_bytes, 2 / heads, [s])
            outs.append(add(f"l{k}.h{h}.attend", "attend", head_bytes, 2 / heads, [p, v]))
        proj = add(f"l{k}.proj", "matmul", 1, 4, outs)
        x = add(f"l{k}.add1", "add", 1, 1, [x, proj])
        norm = add(f"l{k}.norm2", "norm", 1, 1, [x])
        up = add(f"l{k}.up", "matmul", 4, 16, [norm])
        act = add(f"l{k}.act", "gelu", 4, 4, [up])
        down = add(f"l{k}.down", "matmul", 1, 16, [act])
        x = add(f"l{k}.add2", "add", 1, 1, [x, down])
    norm = add("norm_f", "norm", 1, 1, [x])
    add("head", "matmul", 2, 8, [norm])
    params = {"layers": layers, "heads": heads, "bytes": bytes, "cost": cost}
    forward = _graph(f"decoder_l{layers}_h{heads}", nodes, edges, params)
    return training(forward, name=f"decoder_l{layers}_h{heads}_train")


def random_layered(n: int, width: float = 0.27, layer_variance: float = 0.75, edge_density: float = 0.2,
                   skip_density: float = 0.14, seed: int = 0) -> Graph:
    """Random layered DAG after the recipe Moccasin used (Gagrani et al. 2022,
    "Neural Topological Ordering for Computation Graphs", Appendix A): one
    source and one sink, the other nodes spread over layers; edges between
    consecutive layers with probability ``edge_density`` (every node keeps at
    least one producer and one consumer), plus skip edges to a later layer,
    about ``skip_density`` per node.

    Parameters follow the published file names (``w``, ``nlv``, ``ed``,
    ``scd``). Where the paper leaves details open we fitted them to the two
    published instances: mean layer width ``2 * width * sqrt(n)``, each layer's
    width varied uniformly by +-``layer_variance``; output bytes
    ``10 * max(1, round(Gamma(2, 102)))`` (mean about 2,040, multiples of 10),
    duration uniform on 0..999; source and sink cost 0. Program order: layer
    by layer, nodes in random order within a layer (a topological order).
    """
    if n < 3:
        raise ValueError("n must be >= 3")
    rng = np.random.default_rng(seed)
    mean_width = max(1.0, 2 * width * math.sqrt(n))
    layers: list[list[int]] = []
    next_id = 2
    while next_id < n:
        w = max(1, round(mean_width * (1 + rng.uniform(-layer_variance, layer_variance))))
        w = min(w, n - next_id)
        layers.append(list(range(next_id, next_id + w)))
        next_id += w
    edges: set[tuple[int, int]] = set()
    for a, b in zip(layers, layers[1:]):
        for u in a:
            for v in b:
                if rng.random() < edge_density:
                    edges.add((u, v))
        for v in b:  # every node needs a producer
            if not any((u, v) in edges for u in a):
                edges.add((int(rng.choice(a)), v))
        for u in a:  # and a consumer
            if not any((u, v) in edges for v in b):
                edges.add((u, int(rng.choice(b))))
    for k, layer in enumerate(layers[:-2]):
        for u in layer:
            if rng.random() < skip_density * 2:
                target_layer = layers[int(rng.integers(k + 2, len(layers)))]
                edges.add((u, int(rng.choice(target_layer))))
    edges |= {(0, v) for v in layers[0]} | {(u, 1) for u in layers[-1]}
    nodes = [Node(i, str(i), op="layer",
                  bytes=10 * max(1, round(rng.gamma(2.0, 102.0))),
                  cost=0 if i < 2 else int(rng.integers(0, 1000))) for i in range(n)]
    nodes[0].op, nodes[1].op = "source", "sink"
    order = [0]
    for layer in layers:
        order += [int(v) for v in rng.permutation(layer)]
    order.append(1)
    params = {"n": n, "width": width, "layer_variance": layer_variance, "edge_density": edge_density,
              "skip_density": skip_density, "seed": seed}
    name = f"random_layered_n{n}_w{width}_nlv{layer_variance}_ed{edge_density}_scd{skip_density}_s{seed}"
    return _graph(name, nodes, sorted(edges), params, order)


# The generators `rematopt generate KIND` offers, by name.
GENERATORS: dict[str, Callable[..., Graph]] = {
    "chain": chain,
    "linear-train": linear_training,
    "unet": unet,
    "decoder": decoder,
    "random-layered": random_layered,
}
