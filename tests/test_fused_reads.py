"""Plans of a compiled graph are made on ``fused_reads(graph)``: a kernel reading a value XLA never
writes (0 bytes on a ``fuse="xla"`` graph, computed inside its readers) also reads what that value
is made from, so no plan keeps the value across the backward pass's start without its operand (kept
alone, ``apply_plan`` saves it and XLA writes it whole beside the operand it still reads). The
optimum ``solve`` finds is the brute-force optimum of that graph, and its plan is a plan of the
original graph with the same peak and cost."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from brute_force import min_cost  # noqa: E402
from cpsat_cases import FAST, check_claim, staged_status  # noqa: E402

from rematopt.fused_reads import fused_reads
from rematopt.graph import Graph, Node
from rematopt.plan import COMPUTE
from rematopt.simulate import simulate
from rematopt.solve import FUSED_READS, solve

# id: (name, op, bytes, cost, phase, preds): a softmax's exp (8 bytes), its division (0: XLA computes it
# inside the value dot and the backward kernel reading it), a wide layer after it whose peak makes a plan
# under 23 bytes free the exp, the loss, and the backward kernels
SOFTMAX = {0: ("x", "input", 2, 0, "forward", []),
           1: ("scores", "dot_general", 8, 4, "forward", [0]),
           2: ("exp", "exp", 8, 1, "forward", [1]),
           3: ("div", "div", 0, 1, "forward", [2]),
           4: ("value", "dot_general", 2, 4, "forward", [3, 0]),
           5: ("hidden", "mul", 12, 1, "forward", [4]),
           6: ("loss", "reduce_sum", 1, 1, "forward", [5]),
           7: ("d_hidden", "mul", 2, 1, "backward", [6, 4]),
           8: ("d_value", "dot_general", 8, 1, "backward", [3, 7]),
           9: ("d_sum", "reduce_sum", 1, 1, "backward", [8]),
           10: ("d_scores", "mul", 2, 1, "backward", [2, 9])}


def softmax(fuse: str | None = "xla") -> Graph:
    nodes = [Node(i, name, op, "input" if op == "input" else "compute", size, float(cost), phase=phase,
                  output=i in (9, 10)) for i, (name, op, size, cost, phase, _) in SOFTMAX.items()]
    edges = [(p, i) for i, (*_, preds) in SOFTMAX.items() for p in preds]
    return Graph("softmax", nodes, edges, meta={"fuse": fuse} if fuse else {})


def test_readers_of_a_value_xla_never_writes_read_its_operands():
    g = softmax()
    f = fused_reads(g)
    assert set(f.edges) - set(g.edges) == {(2, 4), (2, 8)}  # the exp, for the division's two readers
    assert [v.to_dict() for v in f.nodes] == [v.to_dict() for v in g.nodes] and f.meta == g.meta
    plain = softmax(fuse=None)
    assert fused_reads(plain) is plain  # a graph of equations: every value is one a kernel writes


@pytest.mark.parametrize("budget", range(18, 25))
def test_the_optimum_is_the_brute_force_optimum_of_the_graph_with_the_reads(budget):
    g = softmax()
    expect, loose = min_cost(fused_reads(g), budget), min_cost(g, budget)
    sol = solve(g, "cpsat", budget=budget, objective="overhead", **FAST)
    check_claim(g, sol)
    assert expect is not None and loose is not None  # 18 to 22 bytes: the exp recomputed; 23 up: none
    assert staged_status(sol) == "OPTIMAL" and sol.plan.stats["objective"] == expect[0]
    assert loose[0] <= expect[0]  # the reads only take plans away: the claim names the graph it holds on
    assert sol.plan.stats["planned_on"] == FUSED_READS and FUSED_READS in sol.headline()
    replay = simulate(g, sol.plan)
    assert replay.valid and replay.peak_bytes == sol.replay.peak_bytes <= budget
    # every backward reader of the division finds the exp it is computed from on the device
    ops, nodes = sol.plan.ops.tolist(), sol.plan.nodes.tolist()
    on = set()
    for o, i in zip(ops, nodes):
        if o == COMPUTE and 3 in g.preds[i]:
            assert 2 in on
        on = on | {i} if o == COMPUTE else on - {i}

