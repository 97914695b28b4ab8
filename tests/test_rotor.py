"""``rotor``: Rotor's DP over the model's chain of stages. Its optimum
against the brute-force oracle on chains, its plans replayed to exactly the
figures the DP claims, and the chains it is given (or refuses)."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest

from brute_force import min_cost
from conftest import rematopt as cli
from rematopt import Graph, Node, load, solve
from rematopt.errors import NotApplicable, PlannerError
from rematopt.importers import synthetic
from rematopt.planners.rotor import chain_of, to_plan, window_for
from rematopt.planners.rotor.chain import Piece, from_graph
from rematopt.planners.rotor.dp import Pieces, solve as dp_solve
from rematopt.planners.rotor.options import extremes
from rematopt.reference import no_remat_peak, peak_lower_bound
from rematopt.simulate import simulate

INSTANCES = Path(__file__).resolve().parents[1] / "instances"


def chain_graph(n: int, sizes: list[int], costs: list[int], reads_input: bool) -> Graph:
    """An input x, layers c1..cn, a loss, and gradients d_n..d_1: d_k reads
    c_k and the gradient after it (Rotor's model), and with ``reads_input``
    the layer's input c_{k-1} too (Checkmate's linear graphs)."""
    nodes = [Node(0, "x", op="input", kind="input", bytes=sizes[0])]
    edges = []
    for k in range(1, n + 1):
        nodes.append(Node(k, f"c{k}", op="f", bytes=sizes[k], cost=costs[k], phase="forward"))
        edges.append((k - 1, k))
    loss = len(nodes)
    nodes.append(Node(loss, "loss", op="loss", bytes=4, cost=1, phase="forward", output=True))
    edges.append((n, loss))
    prev = loss
    for k in range(n, 0, -1):
        i = len(nodes)
        nodes.append(Node(i, f"d{k}", op="b", bytes=sizes[k], cost=2 * costs[k], phase="backward", output=k == 1))
        edges += [(k, i), (prev, i)] + ([(k - 1, i)] if reads_input else [])
        prev = i
    return Graph(f"chain{n}", nodes, edges)


def rotor_at(graph: Graph, budget: int):
    """The DP's plan with Rotor's two options per stage (a one-node stage
    has no other), replayed: (plan, replay) or None."""
    chain = from_graph(graph)
    pieces = Pieces(chain, [extremes(graph, s) for s in chain.stages[:chain.length]])
    result = dp_solve(pieces, budget)
    if result is None:
        return None
    plan = to_plan(graph, chain, result, budget)
    return plan, simulate(graph, plan)


def cases(reads_input: bool):
    rng = random.Random(7 + reads_input)
    for n in (3, 4, 4, 5):
        sizes = [rng.choice([4, 8, 12]) for _ in range(n + 1)]
        costs = [rng.choice([1, 2, 3]) for _ in range(n + 1)]
        yield chain_graph(n, sizes, costs, reads_input)


@pytest.mark.parametrize("graph", list(cases(False)), ids=lambda g: g.name)
def test_rotor_is_the_staged_optimum_on_chains(graph):
    """Rotor's model: the gradient reads its layer's output. At every budget
    where the DP has a plan, it costs what exhaustive search over the staged
    space finds; the budgets where it has none are the tightest ones
    (below them no persistent schedule fits: the staged space also holds
    plans that drop the sweep's own checkpoint)."""
    lo, hi = peak_lower_bound(graph), no_remat_peak(graph)
    missing = []
    for budget in range(lo, hi + 1, 4):
        best = min_cost(graph, budget)
        got = rotor_at(graph, budget)
        if got is None:
            missing.append(budget)
            continue
        plan, replay = got
        assert replay.valid and replay.peak_bytes == plan.stats["peak_bytes"] <= budget
        assert replay.compute_cost == plan.stats["compute_cost"]
        assert best is not None and replay.recompute_cost == best[0], (budget, replay.recompute_cost, best)
    assert missing == list(range(lo, lo + 4 * len(missing), 4))  # a prefix of the budgets
    assert len(missing) < (hi - lo) // 4 + 1  # and not all of them


@pytest.mark.parametrize("graph", list(cases(True)), ids=lambda g: g.name)
def test_rotor_never_beats_the_staged_optimum(graph):
    """Checkmate's linear graphs (the gradient reads the layer's input too):
    the DP's plans are staged plans, never cheaper than the optimum."""
    lo, hi = peak_lower_bound(graph), no_remat_peak(graph)
    for budget in range(lo, hi + 1, 4):
        got = rotor_at(graph, budget)
        if got is None:
            continue
        plan, replay = got
        best = min_cost(graph, budget)
        assert replay.valid and replay.peak_bytes == plan.stats["peak_bytes"] <= budget
        assert best is not None and replay.recompute_cost >= best[0]


def test_a_staged_plan_no_persistent_schedule_has():
    """Where the gradient reads the layer's input, dropping an input after
    the forward and recomputing it from the one before for one backward step
    beats every Rotor schedule: 1 recompute against 2 (documented limit)."""
    g = chain_graph(4, [4] * 5, [1] * 5, reads_input=True)
    budget = 24
    assert min_cost(g, budget)[0] == 1
    plan, replay = rotor_at(g, budget)
    assert replay.recompute_cost == 2


@pytest.mark.parametrize("name", ["gpt_l2_w64", "gpt_l2_w64_fused", "mlp_l4_w256"])
@pytest.mark.parametrize("ratio", [0.9, 0.8, 0.5])
def test_instances_replay_to_the_claims(name, ratio):
    """solve() refuses a plan whose replay differs from its claims; the
    DP's peak is its replay's, and within the budget when it says FEASIBLE.
    (No staged plan fits mlp_l4_w256 at 0.9: cpsat's chains relaxation
    shows it.)"""
    g = load(INSTANCES / f"{name}.json")
    sol = solve(g, planner="rotor", budget_ratio=ratio, time_limit=6, workers=1)
    st = sol.plan.stats
    assert st["peak_bytes"] == sol.replay.peak_bytes
    assert (st["status"] == "FEASIBLE") == (sol.replay.peak_bytes <= sol.plan.stats["budget_bytes"])
    if ratio >= 0.8 and name.startswith("gpt"):
        assert st["status"] == "FEASIBLE"


def test_decoder_beats_keeping_nothing_and_everything():
    """On a chain of identical blocks every block shares the kind's options:
    the DP's plan fits where keeping every residual does not, and costs
    less than recomputing every block's forward."""
    g = synthetic.decoder(6, heads=2)
    budget = int(0.7 * no_remat_peak(g))
    sol = solve(g, planner="rotor", budget=budget, time_limit=8, workers=1)
    assert sol.plan.stats["status"] == "FEASIBLE" and sol.replay.peak_bytes <= budget
    forward = math.fsum(v.cost for v in g.nodes if v.phase == "forward")
    assert 0 < sol.replay.recompute_cost < forward
    assert sol.plan.stats["kinds"] == 2 and sol.plan.stats["stages"] == 8  # embedding, 6 blocks, head


def test_cpsat_takes_the_plan_as_its_hint():
    """Rotor's plans are staged: projected into cpsat's depth-1 space widened
    by their recomputes (as cpsat's warm start does) they keep their cost
    and fit the same budget, so cpsat searches from them."""
    from rematopt.planners.staged.backends import CpSatBackend
    from rematopt.planners.staged.model import build
    from rematopt.planners.staged.solution import from_plan, plan_pairs
    from rematopt.planners.staged.stages import Stages
    from rematopt.planners.staged.units import integer_scale

    g = load(INSTANCES / "gpt_l2_w64.json")
    budget = int(0.8 * no_remat_peak(g))
    sol = solve(g, planner="rotor", budget=budget, time_limit=6, workers=1)
    assert sol.plan.stats["status"] == "FEASIBLE"
    costs = [c for c in g.cost if c]
    scale, _ = integer_scale(costs, sum(costs) * len(g.compute_ids))
    model = build(g, CpSatBackend(), objective="overhead", mem_cap_bytes=budget, offload=False,
                  transfer_cost_per_byte=0.0, cost_scale=scale, depth=1, also=plan_pairs(Stages(g, False), sol.plan))
    a = from_plan(model.form, sol.plan)
    assert a is not None and model.admissible(a)
    assert model.overhead_of(a) == pytest.approx(sol.replay.recompute_cost * scale, rel=1e-6)


def test_stages_that_run_once():
    """A forward node that may not be computed twice pins its stage to the
    first pass: no plan recomputes it."""
    g = chain_graph(4, [4] * 5, [1] * 5, reads_input=False)
    d = g.to_dict()
    d["nodes"][2]["recomputable"] = False  # c2
    g = Graph.from_dict(d)
    for budget in range(peak_lower_bound(g), no_remat_peak(g) + 1, 4):
        got = rotor_at(g, budget)
        if got is not None:
            plan, replay = got
            assert replay.valid
            assert sum(1 for op, v in plan.events() if op == "compute" and v == 2) == 1


def test_pieces_add_up():
    """A piece frees what it is told at its last read, keeps what it is told."""
    g = chain_graph(3, [4] * 4, [1] * 4, reads_input=False)
    p = Piece.of(g, (1, 2), frees={0}, keeps={2})
    assert (p.profile.peak, p.profile.end) == (4, 0)  # x freed after c1, c1 after c2; c2 stays
    p = Piece.of(g, (1, 2), frees=(), keeps=())
    assert (p.profile.peak, p.profile.end) == (8, 0)


def test_not_a_chain():
    g = synthetic.random_layered(60, seed=2)
    with pytest.raises(NotApplicable):
        chain_of(g)
    with pytest.raises(PlannerError):
        solve(g, planner="rotor", budget_ratio=0.8)


def test_cli_refuses_a_graph_that_is_no_chain(tmp_path):
    path = tmp_path / "g.json"
    synthetic.random_layered(40, seed=1).save(path)
    out = cli("solve", path, "--planner", "rotor", "--budget-ratio", "0.8")
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1 and "not" in out.stderr


def test_window_grows_the_dp_only_as_far_as_it_pays():
    assert window_for(49) is None  # exact Rotor for the 48-layer decoder's chain
    assert 4 <= window_for(481) < window_for(97) < 97


ALREADY_RESIDENT = Path(__file__).parent / "data" / "fuzz" / "rotor_already_resident.json"


@pytest.mark.parametrize("budget", [None, *range(1, 3)])
def test_an_output_is_never_recomputed(budget):
    """Issue 37: stage 1's backward reads v4, an output (resident for good
    once computed); keeping nothing recomputed it where it was resident.
    Outputs and unrecomputable values stay from the forward instead, at
    every budget from the working-set bound to the no-remat peak."""
    g = load(ALREADY_RESIDENT)
    assert (peak_lower_bound(g), no_remat_peak(g)) == (1, 2)
    sol = solve(g, planner="rotor", budget=budget)
    replay = simulate(g, sol.plan)
    assert replay.valid and replay.peak_bytes == sol.plan.stats["peak_bytes"] <= (budget or 2)
    computes = [v for op, v in sol.plan.events() if op == "compute"]
    assert all(computes.count(v) == 1 for v in g.compute_ids if g.nodes[v].output or not g.nodes[v].recomputable)


def test_cli_plans_the_already_resident_graph():
    out = cli("solve", ALREADY_RESIDENT, "--planner", "rotor", "--budget", "1")
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    assert out.stdout.splitlines()[0].startswith("peak 2 B -> 1 B") and "(rotor" in out.stdout.splitlines()[0]
