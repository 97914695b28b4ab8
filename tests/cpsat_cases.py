"""Cases for the exact planner's tests, shared by its test files: tiny
random graphs, every DAG shape with a budget, the fast solve settings, and
how to read a result whose staged optimum a fast plan beat."""

from __future__ import annotations

import random

from rematopt.graph import Graph, Node
from rematopt.reference import no_remat_peak, peak_lower_bound, pinned_bound

from brute_force import exhaustive_dags

FAST = dict(workers=1, time_limit=20, seed=1, lp_bound=False, warm_start="none")


def tiny(edges: list[tuple[int, int]], n: int, rng: random.Random, flags: bool = True) -> Graph:
    """Graph on ids 0..n-1 with random sizes and integer costs; with
    ``flags``, sometimes an input source, an output sink, a non-recomputable
    node, or a persistent input."""
    nodes = [Node(i, f"n{i}", bytes=rng.randint(1, 8), cost=rng.randint(0, 5)) for i in range(n)]
    extra_edges = list(edges)
    if flags:
        if rng.random() < 0.3:
            nodes[0].kind, nodes[0].cost = "input", 0
        if rng.random() < 0.3:
            nodes[-1].output = True
        if rng.random() < 0.3:
            nodes[rng.randrange(1, n)].recomputable = False
        if rng.random() < 0.15:
            nodes.append(Node(n, "param", kind="input", persistent=True, bytes=rng.randint(1, 4)))
            extra_edges.append((n, rng.randrange(1, n)))
    order = None
    if nodes[-1].persistent:
        order = [n] + list(range(n))
    return Graph(f"tiny{n}", nodes, extra_edges, order)


def budget_between(g: Graph, rng: random.Random) -> int:
    """A budget below the no-remat peak (when the lower bound allows), where
    recomputation, offload and infeasibility happen."""
    lo, hi = peak_lower_bound(g), no_remat_peak(g)
    return rng.randint(lo, hi - 1) if hi > lo else lo


def cases(n: int, every: bool, count: int, seed: int):
    """Every shape on n nodes, or ``count`` sampled shapes whose no-remat
    peak exceeds the peak lower bound (so the budget forces a choice)."""
    rng = random.Random(seed)
    shapes = list(exhaustive_dags(n))
    if every:
        for edges in shapes:
            yield tiny(edges, n, rng), rng
        return
    found = 0
    while found < count:
        g = tiny(rng.choice(shapes), n, rng)
        if no_remat_peak(g) > peak_lower_bound(g):
            found += 1
            yield g, rng


def beaten_from_outside(sol) -> bool:
    """Whether cpsat proved its space's optimum but returned a fast planner's
    plan that beats it (``plan_from``): OPTIMAL is never claimed over a plan
    rematopt can make. Greedy may compute nodes out of program order, which
    no staged plan does (a 4-node graph: 0, 2 then 1, 3 without recompute).
    Such a plan that costs nothing is OPTIMAL in any space (``zero cost``)."""
    st = sol.plan.stats
    zero = sol.status == "OPTIMAL" and st.get("proved_by") == "zero cost" and st.get("objective") == 0
    return (sol.status == "FEASIBLE" or zero) and st.get("plan_from") not in (None, "cpsat") and \
        st.get("space_status", "OPTIMAL") == "OPTIMAL" and "beats the model's best" in st.get("reason", "")


def staged_status(sol) -> str:
    """cpsat's verdict over the staged space, which ``brute_force.min_cost``
    searches: OPTIMAL where ``optimal_in`` names it (or all plans),
    INFEASIBLE where ``infeasible_in`` does, else the status. The status
    itself speaks of every plan (:func:`check_claim`)."""
    st = sol.plan.stats
    return "OPTIMAL" if st.get("optimal_in") else "INFEASIBLE" if st.get("infeasible_in") else sol.status


def check_claim(g, sol) -> None:
    """OPTIMAL and INFEASIBLE hold for every valid plan: OPTIMAL only where
    the plan reaches a bound that every plan obeys (it costs nothing, or it
    peaks at :func:`~rematopt.reference.pinned_bound`), INFEASIBLE only below
    that bound; a
    staged-space verdict is FEASIBLE or UNKNOWN with ``optimal_in`` /
    ``infeasible_in`` "staged space"."""
    st = sol.plan.stats
    if sol.status == "OPTIMAL":
        assert st["optimal_in"] == "all plans"
        if st.get("objective_kind", "overhead") == "overhead":
            # nothing recomputed, and transfers (if any) free at the run's price
            assert sol.replay.recompute_cost == 0 and st["objective"] == 0 and st["proved_by"] == "zero cost"
        else:
            assert sol.replay.peak_bytes == pinned_bound(g, bool(st.get("offload")))
            assert st["proved_by"] in ("working set", "pinned values")
    elif st.get("optimal_in") is not None:
        assert sol.status == "FEASIBLE" and st["optimal_in"] == "staged space"
    if sol.status == "INFEASIBLE":
        assert st["infeasible_in"] == "all plans" and st["proved_by"] in ("working set", "pinned values")
        assert sol.budget < pinned_bound(g, bool(st.get("offload")))
    elif st.get("infeasible_in") is not None:
        assert sol.status == "UNKNOWN" and st["infeasible_in"] == "staged space" and not sol.has_plan


def staged_optimum(sol) -> float | None:
    """The staged space's proven optimum of a full-space solve (the full
    round's objective), whether or not a plan from outside the space beat it
    and was returned; None if the full round did not prove one."""
    last = (sol.plan.stats.get("rounds") or [{}])[-1]
    return last["objective"] if last.get("status") == "OPTIMAL" and last["recompute_depth"] == "full" else None


PARTS = 8  # the 1,024 five-node shapes in items that ``-n`` can spread


def every_shape(n: int, seed: int, part: int = 0, parts: int = 1) -> list[tuple[Graph, int]]:
    """Every DAG shape on n nodes with its random budget (drawn as the shapes
    are made, so a part's cases do not depend on how the rest are split)."""
    every = [(g, budget_between(g, rng)) for g, rng in cases(n, every=True, count=0, seed=seed)]
    return every[part::parts]


def with_costs(g: Graph, scale: list[float]) -> Graph:
    """``g`` with node i's cost multiplied by ``scale[i]``."""
    nodes = [Node(v.id, v.name, bytes=v.bytes, cost=v.cost * scale[v.id], kind=v.kind, output=v.output,
                  recomputable=v.recomputable, persistent=v.persistent) for v in g.nodes]
    return Graph(g.name, nodes, g.edges, g.order)
