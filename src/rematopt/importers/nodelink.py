"""networkx node-link JSON, as published with Checkmate and Moccasin.

Two attribute conventions (``shared/benchmarks/README.md``):

* Checkmate: nodes ``{id, name, cost_ram, cost_cpu, backward}``, links
  ``{source, target}``; program order is ids ascending. ``backward`` becomes
  the node's phase.
* Moccasin's random layered graphs: nodes ``{name, out_cost, duration,
  param_cost}``, links ``{"0": source, "1": target}``; ``graph.order`` is the
  program order. A node's ``param_cost`` (parameter memory it reads) becomes a
  persistent input node feeding it, so it counts in every working set.

Node keys are mapped to dense ids in ascending key order; names are kept.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import ImportFailure, located
from ..graph import Graph, Node

# (bytes field, cost field) per convention, first match wins.
_ATTRS = (("cost_ram", "cost_cpu"), ("out_cost", "duration"), ("bytes", "cost"))


def is_nodelink(doc: Any) -> bool:
    """Node-link documents have ``nodes`` and ``links`` and no rematopt format tag."""
    return isinstance(doc, dict) and "format" not in doc and "nodes" in doc and "links" in doc


def from_nodelink(doc: dict[str, Any], source: str | None = None, name: str | None = None) -> Graph:
    """Convert a node-link document to a :class:`Graph`.

    Raises ImportFailure for missing attributes or links to unknown nodes.
    """

    def fail(problem: str):
        raise ImportFailure(located(source, f"node-link: {problem}"))

    raw_nodes, links = doc.get("nodes"), doc.get("links")
    if not isinstance(raw_nodes, list) or not isinstance(links, list) or not raw_nodes:
        fail("'nodes' and 'links' must be non-empty lists")
    if not all(isinstance(v, dict) for v in raw_nodes):
        fail("every node must be an object")
    key_field = "id" if all("id" in v for v in raw_nodes) else "name"
    if not all(key_field in v for v in raw_nodes):
        fail("nodes need an 'id' (or, in Moccasin's convention, a 'name') key")
    bytes_field, cost_field = next(
        ((b, c) for b, c in _ATTRS if all(b in v for v in raw_nodes)), (None, None))
    if bytes_field is None:
        fail("no known memory attribute on every node (cost_ram, out_cost or bytes)")
    first = links[0] if links and isinstance(links[0], dict) else {}
    src_field, dst_field = ("source", "target") if "source" in first else ("0", "1")
    keys = [v[key_field] for v in raw_nodes]
    try:
        keys_sorted = sorted(keys)
    except TypeError:
        keys_sorted = sorted(keys, key=str)
    if len(set(map(repr, keys))) != len(keys):
        fail("duplicate node keys")
    dense = {repr(k): i for i, k in enumerate(keys_sorted)}

    nodes: list[Node] = []
    for v in raw_nodes:
        i = dense[repr(v[key_field])]
        phase = None
        if "backward" in v:
            phase = "backward" if v["backward"] else "forward"
        nodes.append(Node(id=i, name=str(v.get("name", v[key_field])), op=str(v.get("op", "")),
                          bytes=v[bytes_field], cost=v.get(cost_field, 0), phase=phase))
    edges = []
    for k, link in enumerate(links):
        try:
            edges.append((dense[repr(link[src_field])], dense[repr(link[dst_field])]))
        except (KeyError, TypeError):
            fail(f"links[{k}] does not join two known nodes")
    graph_attrs = doc.get("graph") or {}
    if not isinstance(graph_attrs, dict):
        fail("'graph' must be an object of graph attributes")
    order = None
    if "order" in graph_attrs:
        try:
            order = [dense[repr(k)] for k in graph_attrs["order"]]
        except (KeyError, TypeError):
            fail("graph.order names a node that does not exist")

    # Parameter memory as persistent inputs, placed before every real node.
    n_real = len(nodes)
    params = [v for v in raw_nodes if v.get("param_cost", 0)]
    for p, v in enumerate(params, start=n_real):
        nodes.append(Node(id=p, name=f"param:{v.get('name', v[key_field])}", op="parameter",
                          kind="input", bytes=v["param_cost"], persistent=True))
        edges.append((p, dense[repr(v[key_field])]))
    if params:
        order = list(range(n_real, len(nodes))) + (order if order is not None else list(range(n_real)))
    title = graph_attrs.get("name")
    meta = {"source": "nodelink", "convention": bytes_field, "cost_unit": "source", "title": title}
    gname = name or (Path(source).stem if source else title or "nodelink")
    return Graph(str(gname), nodes, edges, order, meta, source)
