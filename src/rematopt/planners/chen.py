"""Chen et al. 2016, "Training Deep Nets with Sublinear Memory Cost".

Both planners keep a set of checkpoints chosen among the articulation points
of the forward graph (a value whose removal disconnects it, so a segment
between two checkpoints can be recomputed from the first alone), drop every
other forward value after the forward pass, and recompute each segment once
for the backward pass (:func:`~rematopt.planners.frees.keep_schedule` with
``retain``: a recomputed value stays until its last read).

- ``chen-sqrt``: about every sqrt(m)-th of the m candidates, so about sqrt(m)
  segments of about sqrt(m) values each (O(sqrt n) memory on a chain).
- ``chen-greedy``: the paper's budgeted variant: walk the forward values in
  order, close a segment at the first candidate once the segment holds more
  than a threshold of bytes; sweep the threshold and keep the cheapest plan
  under the budget (else the lowest peak, OVER_BUDGET).
"""

from __future__ import annotations

import math
from typing import Any

from ..graph import Graph
from ..plan import Plan
from .frees import keep_schedule, place_frees
from .options import NoOptions

Options = NoOptions  # takes none

THRESHOLDS = 48  # thresholds tried by chen-greedy (geometric, plus 0)


def forward_ids(graph: Graph) -> list[int]:
    """Compute nodes of the forward pass, in program order: the non-backward
    ones when the graph has phases, else all of them."""
    return [i for i in graph.order
            if not graph.nodes[i].is_input and graph.nodes[i].phase != "backward"]


def candidates(graph: Graph) -> list[int]:
    """Articulation points of the (undirected) forward graph, in program order."""
    import networkx as nx  # here, not at the top: the command line imports this module for its Options

    fwd = forward_ids(graph)
    g = nx.Graph()
    g.add_nodes_from(fwd)
    inside = set(fwd)
    g.add_edges_from((u, v) for u, v in graph.edges if u in inside and v in inside)
    cut = set(nx.articulation_points(g))
    return [i for i in fwd if i in cut]


def _plan(graph: Graph, checkpoints: list[int], planner: str, budget: int | None,
          details: dict[str, Any]) -> Plan:
    schedule = keep_schedule(graph, checkpoints, retain=True)
    names = [graph.nodes[i].name for i in checkpoints]
    return place_frees(graph, schedule, planner, budget, {"checkpoints": names, **details})


def plan_sqrt(graph: Graph, budget: int | None, options: dict[str, Any]) -> Plan:
    cands = candidates(graph)
    k = max(1, round(math.sqrt(len(cands))))
    return _plan(graph, cands[k - 1::k], "chen-sqrt", budget, {"candidates": len(cands)})


def segment_checkpoints(graph: Graph, cands: list[int], threshold: float) -> list[int]:
    """Chen's greedy segmentation: a candidate becomes a checkpoint once the
    bytes accumulated since the last checkpoint exceed ``threshold``."""
    is_cand = set(cands)
    out, acc = [], 0
    for i in forward_ids(graph):
        acc += graph.bytes[i]
        if i in is_cand and acc > threshold:
            out.append(i)
            acc = 0
    return out


def plan_greedy(graph: Graph, budget: int | None, options: dict[str, Any]) -> Plan:
    cands = candidates(graph)
    total = sum(graph.bytes[i] for i in forward_ids(graph))
    smallest = min((graph.bytes[i] for i in cands if graph.bytes[i] > 0), default=1)
    # Geometric sweep from the smallest candidate to the whole forward pass
    # (one segment), plus 0 (every candidate a checkpoint).
    ratio = (max(total, smallest) / smallest) ** (1 / (THRESHOLDS - 1))
    thresholds = [0.0] + [smallest * ratio ** j for j in range(THRESHOLDS)]
    seen: set[tuple[int, ...]] = set()
    best: tuple | None = None
    for threshold in thresholds:
        cps = tuple(segment_checkpoints(graph, cands, threshold))
        if cps in seen:
            continue
        seen.add(cps)
        p = _plan(graph, list(cps), "chen-greedy", budget,
                  {"candidates": len(cands), "threshold_bytes": threshold})
        st = p.stats
        # Under the budget: cheapest (then lowest peak); otherwise lowest peak.
        key = (0, st.compute_cost, st.peak_bytes) if st.status == "FEASIBLE" else \
              (1, st.peak_bytes, st.compute_cost)
        if best is None or key < best[0]:
            best = (key, p)
    p = best[1]
    p.stats = p.stats.with_details(thresholds_tried=len(seen))
    return p
