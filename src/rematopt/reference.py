"""Reference points every figure is measured against (``FORMATS.md``,
"Reference points"), and budget resolution."""

from __future__ import annotations

import math

from .errors import BudgetError, located
from .graph import LIMIT, Graph
from .plan import Plan, PlanBuilder
from .simulate import peak_of


def no_remat_plan(graph: Graph) -> Plan:
    """Compute every node once in ``order`` and free each value right after its
    last consumer; outputs and persistent nodes are never freed. A value nobody
    consumes is freed right after it is computed (inputs: before the first event)."""
    pos = graph.position
    frees_at: list[list[int]] = [[] for _ in range(graph.n)]
    early: list[int] = []
    for v in graph.nodes:
        if v.output or v.persistent:
            continue
        if v.is_input and not graph.succs[v.id]:
            early.append(v.id)
        else:
            frees_at[graph.last_use[v.id]].append(v.id)
    b = PlanBuilder()
    for i in early:
        b.free(i)
    for t, i in enumerate(graph.order):
        if not graph.nodes[i].is_input:
            b.compute(i)
        for j in sorted(frees_at[t], key=pos.__getitem__):
            b.free(j)
    return b.build(graph.name, "no-remat")


def no_remat_peak(graph: Graph) -> int:
    """Peak bytes of :func:`no_remat_plan`."""
    p = no_remat_plan(graph)
    return peak_of(graph, p.ops, p.nodes)


def working_set_bound(graph: Graph) -> int:
    """max over compute nodes i of bytes(i) + bytes of i's non-persistent
    predecessors, plus the bytes of all persistent nodes: computing i needs all
    of that resident at once, so no plan can peak lower."""
    size = graph.bytes
    best = 0
    for i in graph.compute_ids:
        need = size[i] + sum(size[p] for p in graph.preds[i] if not graph.nodes[p].persistent)
        best = max(best, need)
    return best + graph.persistent_bytes


# Above this many node visits the pinned values' walks are skipped: 2.3
# million (50 pinned values on a 20,000-node random DAG) took 0.09 s.
PINNED_MAX_VISITS = 10**7


def pinned_bound(graph: Graph, offload: bool = False) -> int:
    """A bound on every plan's peak, at least :func:`peak_lower_bound`: at
    the first computation of i, beside i and its inputs, a value that cannot
    be made again (an input, or a node not recomputable; and not offloadable
    where offload is allowed) is resident if i must come after it was made
    and before something that reads it is first computed (or it is an
    output): it has to last from then until that reader. A 5-node graph whose
    unrecomputable ``a`` is read by the last node needs 16 B where no working
    set passes 12 B (tests/test_fuzz.py's INFEASIBLE case)."""
    n, size, nodes = graph.n, graph.bytes, graph.nodes
    pinned = [u for u in range(n) if not nodes[u].persistent and size[u]
              and (nodes[u].is_input or not nodes[u].recomputable) and not (offload and nodes[u].offloadable)]
    if len(pinned) * (n + len(graph.edges)) > PINNED_MAX_VISITS:
        return peak_lower_bound(graph)

    def reach(starts: list[int], step: list[list[int]]) -> set[int]:
        seen, todo = set(), list(starts)
        while todo:
            for j in step[todo.pop()]:
                if j not in seen:
                    seen.add(j)
                    todo.append(j)
        return seen

    extra = [0] * n
    compute = set(graph.compute_ids)
    for u in pinned:
        after = compute if nodes[u].is_input else reach([u], graph.succs)  # first computed after u is made
        before = compute if nodes[u].output else reach(graph.succs[u], graph.preds)  # and before a reader
        for i in after & before:
            if u not in graph.preds[i]:
                extra[i] += size[u]
    need = max((size[i] + extra[i] + sum(size[p] for p in graph.preds[i] if not nodes[p].persistent)
                for i in graph.compute_ids), default=0)
    return max(need + graph.persistent_bytes, peak_lower_bound(graph))


def peak_lower_bound(graph: Graph) -> int:
    """The largest bound we can state cheaply: the working-set bound, and the
    memory resident before the first event (every peak includes it)."""
    return max(working_set_bound(graph), graph.initial_bytes)


def ratio_budget(no_remat_peak: int, ratio: float) -> int:
    """The budget a ratio means: ``floor(ratio x no-remat peak)`` bytes (FORMATS.md)."""
    return math.floor(ratio * no_remat_peak)


def resolve_budget(graph: Graph, budget: int | None = None, ratio: float | None = None,
                   check: bool = True) -> int | None:
    """Budget in bytes from ``budget`` or ``ratio`` x no-remat peak (floored),
    else the graph's own default (``meta.budget_bytes``), else None.

    Raises BudgetError when both are given, when either is negative, for a
    budget beyond :data:`~rematopt.graph.LIMIT`, or (with
    ``check``) when the budget is below :func:`peak_lower_bound`.
    """
    if budget is not None and ratio is not None:
        raise BudgetError("give a budget in bytes or a budget ratio, not both")
    if ratio is not None:
        if not (ratio >= 0 and math.isfinite(ratio)):
            raise BudgetError(f"budget ratio must be a finite number >= 0, got {ratio}")
        budget = ratio_budget(no_remat_peak(graph), ratio)
    elif budget is None and graph.meta.get("budget_bytes") is not None:
        budget = int(graph.meta["budget_bytes"])
    if budget is None:
        return None
    if budget < 0:
        raise BudgetError(f"budget must be >= 0 bytes, got {budget}")
    if budget > LIMIT:
        raise BudgetError(f"budget {budget:,} bytes exceeds the limit 2^53 = {LIMIT:,} bytes")
    if check:
        bound = peak_lower_bound(graph)
        if budget < bound:
            raise BudgetError(located(graph.source or graph.name,
                                      f"budget {budget:,} bytes is below the lower bound "
                                      f"{bound:,} bytes (working set or resident inputs); "
                                      "no plan can meet it"))
    return budget
