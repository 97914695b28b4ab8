"""Exhaustive search over the staged plan space, written independently of the
CP-SAT model, to check its optima on tiny graphs.

The plan space (the same as ``docs/cpsat.md`` describes for the model):
stage s ends with the first computation of the s-th compute node ``v_s``; a
stage visits the positions ``0..pos(v_s)`` in program order, and at a node's
position it may compute it (``v_s`` itself must be computed; any other node
only if recomputable, already computed once and with its producers resident)
or prefetch it (from a host copy), or do nothing. Any resident value may be
freed at any time (persistent ones never); the host copy of a value is made
right after its first computation (inputs: before the first event). Outputs
must be resident at the end.

Frees matter only at the next memory check, so the search frees a subset of
resident values right before each compute or prefetch, and offloads where
the space allows; both choices are enumerated. Dijkstra over states (stage,
position, device set, host set) with lexicographic labels (cost, peak) finds
the cheapest plan under a budget and, among those, the lowest peak; the
labels combine monotonically (cost adds, peak takes a max), so Dijkstra is
exact for them.
"""

from __future__ import annotations

import heapq
from itertools import combinations

from rematopt.graph import Graph


def _subsets(items: list[int]):
    for r in range(len(items) + 1):
        yield from combinations(items, r)


def min_cost(graph: Graph, budget: int, offload: bool = False, transfer_per_byte: int = 0,
             cost_cap: int | None = None) -> tuple[int, int] | None:
    """(recompute + transfer cost, peak) of the lexicographically best plan
    with every memory check <= budget, or None if there is none. Costs must
    be integers (tests use integer costs so the comparison is exact)."""
    n = graph.n
    nodes = graph.nodes
    size = graph.bytes
    cost = [int(c) for c in graph.cost]
    preds = [sum(1 << p for p in graph.preds[i]) for i in range(n)]
    stage_nodes = [i for i in graph.order if not nodes[i].is_input]
    first = {v: s for s, v in enumerate(stage_nodes)}
    T = len(stage_nodes)
    pinned = sum(1 << v.id for v in nodes if v.persistent)
    outputs = sum(1 << v.id for v in nodes if v.output)
    can_offload = [offload and v.offloadable and v.bytes > 0 for v in nodes]

    def mem(d: int) -> int:
        return sum(size[i] for i in range(n) if d >> i & 1)

    d0 = sum(1 << i for i in graph.initial_resident)
    if mem(d0) > budget:
        return None
    starts = []
    inputs = [v.id for v in nodes if v.is_input and can_offload[v.id]]
    for off in _subsets(inputs):
        h = sum(1 << i for i in off)
        starts.append(((sum(size[i] * transfer_per_byte for i in off), mem(d0)), (0, 0, d0, h)))
    best: dict[tuple, tuple[int, int]] = {}
    heap = []
    for label, state in starts:
        if state not in best or label < best[state]:
            best[state] = label
            heapq.heappush(heap, (label, state))
    while heap:
        label, state = heapq.heappop(heap)
        if best.get(state) != label:
            continue
        c, peak = label
        s, k, d, h = state
        if cost_cap is not None and c > cost_cap:
            continue
        if s == T:
            if d & outputs == outputs:
                return label
            continue
        v = stage_nodes[s]
        x = graph.order[k]
        nxt = (s + 1, 0) if x == v else (s, k + 1)
        moves = []  # (node made resident or None, added cost, host set, producers it needs)
        if x != v:
            moves.append((None, 0, h, 0))
        if not nodes[x].is_input and not d >> x & 1 and d & preds[x] == preds[x]:
            if x == v:
                moves.append((x, 0, h, preds[x]))
                if can_offload[x]:
                    moves.append((x, size[x] * transfer_per_byte, h | 1 << x, preds[x]))
            elif nodes[x].recomputable and first[x] < s:
                moves.append((x, cost[x], h, preds[x]))
        if h >> x & 1 and not d >> x & 1 and x != v:
            moves.append((x, size[x] * transfer_per_byte, h, 0))
        for made, extra, h2, need in moves:
            if made is None:
                succ = [(d, peak)]
            else:
                droppable = [i for i in range(n) if d >> i & 1 and not (pinned | need) >> i & 1]
                succ = []
                for drop in _subsets(droppable):
                    d2 = (d & ~sum(1 << i for i in drop)) | 1 << made
                    m = mem(d2)
                    if m <= budget:
                        succ.append((d2, max(peak, m)))
            for d2, p2 in succ:
                new = (c + extra, p2)
                st = (nxt[0], nxt[1], d2, h2)
                if st not in best or new < best[st]:
                    best[st] = new
                    heapq.heappush(heap, (new, st))
    return None


def min_peak(graph: Graph, offload: bool = False, transfer_per_byte: int = 0,
             cost_cap: int | None = None) -> tuple[int, int] | None:
    """(peak, cost) of the plan with the lowest peak whose cost is <= cost_cap,
    then the lowest cost: the smallest budget among all subset sums of byte
    sizes under which :func:`min_cost` finds a plan within the cap."""
    sums = {0}
    for b in graph.bytes:
        sums |= {x + b for x in sums}
    for budget in sorted(sums):
        found = min_cost(graph, budget, offload, transfer_per_byte, cost_cap)
        if found is not None and (cost_cap is None or found[0] <= cost_cap):
            return budget, found[0]
    return None


def exhaustive_dags(n: int):
    """Every DAG on nodes 0..n-1 whose edges go forward in id order (so ids
    ascending is the program order): all 2^(n(n-1)/2) edge subsets."""
    pairs = [(i, j) for j in range(n) for i in range(j)]
    for mask in range(1 << len(pairs)):
        yield [pairs[b] for b in range(len(pairs)) if mask >> b & 1]



def min_cost_any_plan(graph: Graph, budget: int) -> tuple[int, int] | None:
    """(recompute cost, peak) of the lexicographically best plan of *any*
    kind, without offload: every event sequence the simulator accepts, in any
    order, a node computed any number of times (not only the staged space
    that :func:`min_cost` searches). Dijkstra over (device set, set computed
    once) with the same lexicographic labels; a free costs nothing, so it is
    a move of its own. What ``OPTIMAL`` claims (every valid plan) is checked
    against this."""
    n, nodes, size = graph.n, graph.nodes, graph.bytes
    cost = [int(c) for c in graph.cost]
    preds = [sum(1 << p for p in graph.preds[i]) for i in range(n)]
    pinned = sum(1 << v.id for v in nodes if v.persistent)
    outputs = sum(1 << v.id for v in nodes if v.output)
    every = sum(1 << i for i in graph.compute_ids)
    computable = [i for i in graph.compute_ids]

    def mem(d: int) -> int:
        return sum(size[i] for i in range(n) if d >> i & 1)

    d0 = sum(1 << i for i in graph.initial_resident)
    if mem(d0) > budget:
        return None
    start = (d0, 0)
    best = {start: (0, mem(d0))}
    heap = [((0, mem(d0)), start)]
    while heap:
        label, state = heapq.heappop(heap)
        if best.get(state) != label:
            continue
        (c, peak), (d, done) = label, state
        if done == every and d & outputs == outputs:
            return label
        moves = [((c, peak), (d & ~(1 << i), done)) for i in range(n) if d >> i & 1 and not pinned >> i & 1]
        for i in computable:
            again = bool(done >> i & 1)
            if d >> i & 1 or d & preds[i] != preds[i] or (again and not nodes[i].recomputable):
                continue
            m = mem(d) + size[i]
            if m <= budget:
                moves.append(((c + (cost[i] if again else 0), max(peak, m)), (d | 1 << i, done | 1 << i)))
        for new, st in moves:
            if st not in best or new < best[st]:
                best[st] = new
                heapq.heappush(heap, (new, st))
    return None
