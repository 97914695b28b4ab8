"""cpsat in the order of an outside plan's first computations
(planners/staged/order.py): the order is the plan's, its staged space holds
the plan, and every claim made in it holds against exhaustive search over
that space."""

from __future__ import annotations

import pytest

from rematopt.planners.cpsat.tuning import TUNING, Tuning
from rematopt.planners.staged.order import first_computations, in_order_of, in_staged_space, search_order
from rematopt.reference import no_remat_peak, no_remat_plan
from rematopt.simulate import simulate
from rematopt.solve import solve

from brute_force import min_cost
from cpsat_cases import cases, budget_between
from test_gap_study import move_graph

MOVE_BUDGET = 25
# cpsat searching the outside plan's order at any size
REORDER_ALWAYS = Tuning(reorder_min_nodes=0)


def test_the_order_of_a_plan_with_a_move():
    """xla-remat at 25 computes p only after c: that is the order, it is
    topological, and the plan is staged in it and not in program order."""
    g = move_graph()
    moved = solve(g, "xla-remat", budget=MOVE_BUDGET).plan
    names = [g.nodes[i].name for i in first_computations(g, moved)]
    assert names.index("p") > names.index("c") and names[0] == "x"
    h = in_order_of(g, moved)
    assert h.order != g.order and [n.name for n in h.nodes] == [n.name for n in g.nodes]
    assert in_staged_space(h, moved) and not in_staged_space(g, moved)
    assert not in_staged_space(h, no_remat_plan(g))  # p first computed before c: not in the moved order


def test_never_computed_nodes_go_last_in_program_order():
    g = move_graph()
    plan = no_remat_plan(g)
    keep = [k for k, i in enumerate(plan.nodes.tolist()) if g.nodes[i].name != "q" and g.nodes[i].name != "out"]
    partial = type(plan)(plan.graph, plan.planner, plan.ops[keep], plan.nodes[keep])
    names = [g.nodes[i].name for i in first_computations(g, partial)]
    assert names[-2:] == ["q", "out"]
    in_order_of(g, partial)  # a valid program order: Graph checks it is topological


def test_where_the_program_order_stays():
    g = move_graph()
    moved = solve(g, "xla-remat", budget=MOVE_BUDGET).plan
    assert search_order(g, moved, TUNING.reorder_min_nodes) is None  # 6 nodes: below reorder_min_nodes
    assert search_order(g, no_remat_plan(g), 0) is None  # a plan staged in program order
    assert search_order(g, None, 0) is None
    assert search_order(g, moved, 0).order == in_order_of(g, moved).order


def test_cpsat_searches_the_order_of_the_moves():
    """The move graph at 25: in program order the staged optimum recomputes
    p (cost 5); greedy and xla-remat both compute p after c, where it is
    free. cpsat proves the moved order's optimum, which exhaustive search
    over that order confirms."""
    g = move_graph()
    sol = solve(g, "cpsat", budget=MOVE_BUDGET, time_limit=20, workers=1, seed=1, tuning=REORDER_ALWAYS)
    st = sol.plan.stats
    assert st["order_from"] in ("greedy", "xla-remat")
    replay = simulate(g, sol.plan)
    assert replay.valid and replay.peak_bytes <= MOVE_BUDGET
    space = in_order_of(g, sol.plan)
    assert in_staged_space(space, sol.plan)
    best = min_cost(space, MOVE_BUDGET)
    assert best is not None and replay.recompute_cost == best[0]
    assert best[0] < min_cost(g, MOVE_BUDGET)[0]
    assert sol.status == "OPTIMAL" and st["objective"] == best[0]


@pytest.mark.parametrize("n", [5, 6])
def test_claims_in_the_moved_order_hold(n):
    """Tiny graphs, cpsat with its warm start, reordering at any size: every
    plan replays within the budget, lies in the staged space of the order
    its stats name, and every OPTIMAL or INFEASIBLE there is exhaustive
    search's; a bound never passes the space's optimum."""
    moved = 0
    for g, rng in cases(n, every=False, count=25, seed=40 + n):
        budget = budget_between(g, rng)
        if budget >= no_remat_peak(g):
            continue
        sol = solve(g, "cpsat", budget=budget, time_limit=10, workers=1, seed=1, lp_bound=False,
                    check_budget=False, tuning=REORDER_ALWAYS)
        st = sol.plan.stats
        space = g
        if sol.has_plan:
            replay = simulate(g, sol.plan)
            assert replay.valid and replay.peak_bytes <= budget
            if st.get("order_from"):
                moved += 1
                space = in_order_of(g, sol.plan)
                assert st.get("plan_from") is not None or in_staged_space(space, sol.plan)
        best = min_cost(space, budget)
        if sol.status == "INFEASIBLE":
            assert best is None
        elif sol.status == "OPTIMAL" and not st.get("plan_from"):
            assert best is not None and st["objective"] == best[0]
        if best is not None and st.get("best_bound") is not None and not st.get("plan_from"):
            assert st["best_bound"] <= best[0] + 1e-9
    assert moved > 0  # the cases do reach a moved order
