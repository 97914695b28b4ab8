"""``xla-remat``: XLA's rematerialization pass, on hand-worked programs (each
figure below is derived by hand in the comments) and on every shape, every
plan replayed through ``rematopt.solve`` (which refuses a plan whose claims
differ from its replay)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from brute_force import min_cost
from conftest import rematopt
from rematopt import Graph, Node, solve
from rematopt.errors import PlannerError
from rematopt.importers import load as load_graph
from rematopt.importers import synthetic
from rematopt.plan import COMPUTE, OFFLOAD, PREFETCH
from rematopt.planners import xla_remat
from rematopt.reference import no_remat_peak
from rematopt.simulate import base_cost


def program(name: str, spec: list[tuple]) -> Graph:
    """Nodes in program order: (name, bytes, cost, producers[, flags]); the
    first is a persistent input of 1 byte unless given otherwise."""
    ids = {s[0]: i for i, s in enumerate(spec)}
    nodes, edges = [], []
    for i, (nm, b, c, preds, *flags) in enumerate(spec):
        f = dict(flags[0]) if flags else {}
        nodes.append(Node(i, nm, op=nm, bytes=b, cost=c, **f))
        edges += [(ids[p], i) for p in preds]
    return Graph(name, nodes, edges)


X = ("x", 1, 0, [], {"kind": "input", "persistent": True})


def pressure(first: str = "a", a_bytes: int = 10, b_bytes: int = 8) -> Graph:
    """Two values a (cost 100) and b (cost 1), each read once early (by a1,
    b1, which nothing reads: a consumer still to run would make moving them
    free, and XLA takes free moves first) and once late; c (20 bytes) pushes
    memory over the limit between those reads. No-remat: x 1, a 11, b 19,
    a1 20 (freed), b1 20 (freed), c 39, d 40 (the peak), free c 20, e 21,
    free a 11, f 12, free b 4, out 5."""
    a = ("a", a_bytes, 100, ["x"])
    b = ("b", b_bytes, 1, ["x"])
    return program("pressure", [X, *((a, b) if first == "a" else (b, a)),
                                ("a1", 1, 1, ["a"]), ("b1", 1, 1, ["b"]), ("c", 20, 1, ["x"]), ("d", 1, 1, ["c"]),
                                ("e", 1, 1, ["a"]), ("f", 1, 1, ["b"]),
                                ("out", 1, 1, ["d", "e", "f"], {"output": True})])


def recomputed(graph: Graph, plan) -> list[str]:
    counts = {}
    for op, i in zip(plan.ops.tolist(), plan.nodes.tolist()):
        if op == COMPUTE:
            counts[i] = counts.get(i, 0) + 1
    return sorted(graph.nodes[i].name for i, c in counts.items() if c > 1)


def test_memory_reduced_not_flops_picks_the_expensive_value():
    """At c the tracker holds 39 > 33. a frees 10 bytes (cost 33 // 10 = 3),
    b 8 (33 // 8 = 4): XLA recomputes a, whose recomputation costs 100; b,
    at a cost of 1, would have done (39 - 8 = 31 <= 33), and that is the
    optimum the exhaustive search finds."""
    g = pressure()
    assert no_remat_peak(g) == 40
    sol = solve(g, "xla-remat", budget=33)
    assert recomputed(g, sol.plan) == ["a"]
    # replay: ... a1 20, free a1 and a 9, b1 10, free b1 9, c 29, d 30, free c 10, a' 20, e 21, ...
    assert sol.status == "FEASIBLE" and sol.replay.peak_bytes == 30
    assert sol.plan.stats["tracker_peak_bytes"] == 30
    assert sol.replay.compute_cost - base_cost(g) == 100
    best_cost, _ = min_cost(g, 33)
    assert best_cost == 1  # recompute b


def test_integer_division_ties_go_to_the_earlier_value():
    """b (9 bytes) before a (10), memory 40 at c: at 35, 35 // 9 == 35 // 10
    == 3, so the earlier b goes although a frees more; at 39, 39 // 9 = 4 >
    39 // 10 = 3 and a goes. min_remat_size = 10 keeps b from starting a block."""
    g = pressure(first="b", b_bytes=9)
    assert recomputed(g, solve(g, "xla-remat", budget=35).plan) == ["b"]
    assert recomputed(g, solve(g, "xla-remat", budget=39).plan) == ["a"]
    assert recomputed(g, solve(g, "xla-remat", budget=35, min_remat_size=10).plan) == ["a"]


def test_a_value_whose_consumers_have_not_run_moves_for_free():
    """p is read only after c: at c (31 > 25) moving p costs 0, so its
    computation moves to just before q and the original goes (dead code):
    x 1, c 21, d 22, free c 2, p 12, q 13, free p 3, out 4."""
    g = program("move", [X, ("p", 10, 5, ["x"]), ("c", 20, 1, ["x"]), ("d", 1, 1, ["c"]), ("q", 1, 1, ["p"]),
                         ("out", 1, 1, ["d", "q"], {"output": True})])
    sol = solve(g, "xla-remat", budget=25)
    st = sol.plan.stats
    assert sol.status == "FEASIBLE" and sol.replay.peak_bytes == 22
    assert sol.replay.compute_cost == base_cost(g) and st["clones"] == 1 and st["dead_code_removed"] == 1
    assert [g.nodes[i].name for i in sol.plan.nodes[sol.plan.ops == COMPUTE]] == ["c", "d", "p", "q", "out"]


def chain3() -> Graph:
    """a (8) -> b (8) -> c2 (4), a and b dead once c2 is made, c2 read by u
    early and e late; big (20) pushes memory to 25 > 24. Alone, c2 frees
    4 - 8 (b is dead); pairs [b, c2] 4 - 8, [a, b] 0; only [a, b, c2] frees 4.
    No-remat peak 26 (at d)."""
    return program("chain3", [X, ("a", 8, 1, ["x"]), ("b", 8, 1, ["a"]), ("c2", 4, 1, ["b"]), ("u", 1, 1, ["c2"]),
                              ("big", 20, 1, ["x"]), ("d", 1, 1, ["big"]), ("e", 1, 1, ["c2"]),
                              ("out", 1, 1, ["d", "e"], {"output": True})])


def test_block_rematerialization_needs_the_block_size_and_the_effort():
    g = chain3()
    assert no_remat_peak(g) == 26
    one = solve(g, "xla-remat", budget=24)  # default block_size_limit 1: nothing helps
    assert one.status == "OVER_BUDGET" and one.replay.peak_bytes == 26 and recomputed(g, one.plan) == []
    # Singles fail (effort 4: a, b, c2, u), pairs fail (effort 3), then the
    # block [a, b, c2] of the 3..4 search frees 4: 25 -> 21. Replay: ... u 6,
    # free u, free c2 1, big 21, d 22, free big 2, a' 10, b' 18, c2' 14, e 7 ...
    four = solve(g, "xla-remat", budget=24, block_size_limit=4)
    assert four.status == "FEASIBLE" and four.replay.peak_bytes == 22
    assert recomputed(g, four.plan) == ["a", "b", "c2"]
    assert four.plan.stats["max_rematerialized_block_size"] == 4
    assert solve(g, "xla-remat", budget=24, block_size_limit=2).status == "OVER_BUDGET"  # 3..4 > 2
    # effort: the pair search (3) exceeds 0 x the single search (4): no 3..4 search
    lazy = solve(g, "xla-remat", budget=24, block_size_limit=4, block_rematerialization_factor=0)
    assert lazy.status == "OVER_BUDGET" and recomputed(g, lazy.plan) == []


def offload_program() -> Graph:
    """a (10) read by a1 early (nothing reads a1) and by e late; c (20, cost
    10) pushes memory to 31 > 25. No-remat: x 1, a 11, a1 12 (freed), c 31,
    d 32 (the peak), free c 12, g 13, e 14, free a 4, out 5."""
    return program("offload", [X, ("a", 10, 1, ["x"]), ("a1", 1, 1, ["a"]), ("c", 20, 10, ["x"]),
                               ("d", 1, 1, ["c"]), ("g", 1, 1, ["x"]), ("e", 1, 1, ["a"]),
                               ("out", 1, 1, ["d", "g", "e"], {"output": True})])


def test_host_offload_when_the_compute_between_hides_the_copies():
    """From a1 to e the compute is 1 + 10 + 1 + 1 = 13; at 10 bytes per unit
    the copies take 1 + 1: a goes to the host (cost 25 // 10, a tie with
    recomputing it, which the offload wins). The copy back starts 1 unit
    before e, i.e. before g: x 1, a 11, a1 12, free a1 and a 1, c 21, d 22,
    free c 2, prefetch a 12, g 13, e 14."""
    g = offload_program()
    sol = solve(g, "xla-remat", budget=25, host_offload=True, bandwidth_to_host=10, bandwidth_from_host=10)
    events = [(op, g.nodes[i].name) for op, i in zip(sol.plan.ops.tolist(), sol.plan.nodes.tolist())
              if op in (OFFLOAD, PREFETCH)]
    assert events == [(OFFLOAD, "a"), (PREFETCH, "a")]
    names = [g.nodes[i].name for op, i in zip(sol.plan.ops.tolist(), sol.plan.nodes.tolist()) if op != 1]
    assert names.index("a", 2) == names.index("g") - 1  # the prefetch right before g
    assert sol.status == "FEASIBLE" and sol.replay.peak_bytes == 22 and sol.replay.transfer_bytes == 20
    assert sol.replay.compute_cost == base_cost(g) and sol.plan.stats["offloaded"] == 1
    # At 0.5 bytes per unit the copies take 40 > 13: a is recomputed, before g
    # (x, its operand, is read by g: XLA does not extend an operand's life).
    slow = solve(g, "xla-remat", budget=25, host_offload=True, bandwidth_to_host=0.5, bandwidth_from_host=0.5)
    assert recomputed(g, slow.plan) == ["a"] and slow.replay.transfer_bytes == 0
    order = [g.nodes[i].name for i in slow.plan.nodes[slow.plan.ops == COMPUTE]]
    assert order[order.index("d") + 1:] == ["a", "g", "e", "out"]
    assert slow.replay.peak_bytes == 22


def test_host_offload_without_bandwidths_takes_no_time():
    """Unset bandwidths: the copies take no time, so any compute between the
    reads hides them; the copy back comes right before e."""
    g = offload_program()
    sol = solve(g, "xla-remat", budget=25, host_offload=True)
    names = [g.nodes[i].name for i in sol.plan.nodes[sol.plan.ops != 1]]
    assert sol.replay.transfer_bytes == 20 and names[names.index("a", 2) + 1] == "e"
    assert sol.status == "FEASIBLE" and sol.replay.peak_bytes == 22


def test_recompute_mode_off_offloads_only_and_both_off_changes_nothing():
    g = offload_program()
    only = solve(g, "xla-remat", budget=25, recompute=False, host_offload=True, bandwidth_to_host=0.5,
                 bandwidth_from_host=0.5)
    assert only.status == "OVER_BUDGET" and recomputed(g, only.plan) == [] and only.replay.transfer_bytes == 0
    none = solve(g, "xla-remat", budget=25, recompute=False)
    assert none.replay.peak_bytes == no_remat_peak(g) and none.status == "OVER_BUDGET"


SHAPES = {
    "gpt_l2_w64": lambda: load_graph(Path(__file__).resolve().parents[1] / "instances" / "gpt_l2_w64.json"),
    "chain_sinks": lambda: synthetic.chain(10, sinks=True, seed=1),
    "linear_training": lambda: synthetic.linear_training(12, seed=2),
    "unet_train": lambda: synthetic.unet(3, train=True, seed=3),
    "random_layered": lambda: synthetic.random_layered(40, seed=4),
}


@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("ratio", [1.0, 0.8, 0.6, 0.0])
@pytest.mark.parametrize("options", [{}, {"block_size_limit": 4}, {"min_remat_size": 1 << 19},
                                     {"host_offload": True, "bandwidth_to_host": 1e6, "bandwidth_from_host": 1e6}],
                         ids=["default", "blocks", "min-size", "offload"])
def test_every_shape_replays_and_is_judged_on_its_replay(shape, ratio, options):
    g = SHAPES[shape]()
    budget = math.floor(ratio * no_remat_peak(g))
    sol = solve(g, "xla-remat", budget=budget, **options)  # replays; the claims must be exact
    assert sol.status == ("FEASIBLE" if sol.replay.peak_bytes <= budget else "OVER_BUDGET")
    assert sol.replay.peak_bytes <= no_remat_peak(g) or sol.plan.stats["rematerialized"] > 0
    again = solve(g, "xla-remat", budget=budget, **options)
    assert again.plan.ops.tolist() == sol.plan.ops.tolist() and again.plan.nodes.tolist() == sol.plan.nodes.tolist()
    for v in g.nodes:  # non-recomputable values are computed once
        if not v.recomputable and not v.is_input:
            assert int((sol.plan.nodes[sol.plan.ops == COMPUTE] == v.id).sum()) == 1


def literal_pick(p, lo: int, hi: int):
    """XLA's PickRematerializationCandidates as written: a walk over the
    list from its first item, each start on the skip lane in turn, blocks
    grown one item at a time, the strictly cheaper candidate kept (host
    offload before recompute, for single items). The oracle for the
    vectorised searches."""
    in_use = set(p.ops[p.in_progress]) if p.in_progress is not None else set()

    def block_cost(block):
        reduced, seen = 0, set()
        for k in block:
            if p.is_out[k] or k in in_use:
                return None
            if p.alive[k]:
                reduced += int(p.size[k])
            reduced -= sum(int(p.size[o]) for o in p.ops[k] if not p.alive[o] and o not in seen)
            seen.add(k)
        if reduced <= 0:
            return None
        return 0 if all(p.placed_users[k] == 0 for k in block) else p.limit // reduced

    def offload_cost(k):
        if (p.is_out[k] or k in in_use or p.unfinished[k] == 0 or not p.offloadable[k] or p.size[k] == 0
                or not p._hides_copies(k)):
            return None
        return p.limit // int(p.size[k])

    best, best_cost, effort, k = None, None, 0, p.first
    while k is not None:
        if not p._on_skip_lane(k):
            k = p.nxt[k]
            continue
        block, cur = [], k
        while len(block) < lo and cur is not None and p.placed[cur] and cur != p.in_progress:
            block.append(cur)
            cur = p.nxt[cur]
        if len(block) < lo:
            break
        if any(p.deny[i] or not p.remat[i] for i in block):
            k = p.nxt[k]
            continue
        if p.opts.host_offload and len(block) == 1:
            effort += 1
            c = offload_cost(block[0])
            if c is not None and (best_cost is None or c < best_cost):
                best, best_cost = (xla_remat.OFFLOADED, list(block)), c
        while p.opts.recompute and len(block) <= hi:
            effort += 1
            c = block_cost(block)
            if c is not None and (best_cost is None or c < best_cost):
                best, best_cost = (xla_remat.RECOMPUTE, list(block)), c
            nx = p.nxt[block[-1]]
            if nx is None or p.deny[nx] or not p.placed[nx] or nx == p.in_progress or not p.remat[nx]:
                break
            block.append(nx)
        k = p.nxt[k]
    return best, effort


@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("options", [{}, {"block_size_limit": 4}, {"block_size_limit": 3, "min_remat_size": 1 << 19},
                                     {"host_offload": True, "bandwidth_to_host": 1e6, "bandwidth_from_host": 1e6}],
                         ids=["default", "blocks", "blocks-min-size", "offload"])
def test_the_searches_choose_what_xlas_scan_chooses(shape, options, monkeypatch):
    """Same choice and same effort at every program point, so the same plan."""
    g = SHAPES[shape]()
    budgets = [math.floor(r * no_remat_peak(g)) for r in (0.9, 0.7, 0.5)]
    fast = [solve(g, "xla-remat", budget=b, **options).plan for b in budgets]
    original = xla_remat._Pass._pick

    def checked(self, lo, hi):
        got, want = original(self, lo, hi), literal_pick(self, lo, hi)
        assert got == want
        return got

    monkeypatch.setattr(xla_remat._Pass, "_pick", checked)
    for b, plan in zip(budgets, fast):
        again = solve(g, "xla-remat", budget=b, **options).plan
        assert again.ops.tolist() == plan.ops.tolist() and again.nodes.tolist() == plan.nodes.tolist()


def test_no_budget_is_the_program_as_given():
    g = SHAPES["unet_train"]()
    sol = solve(g, "xla-remat")
    assert sol.replay.peak_bytes == no_remat_peak(g) and sol.replay.compute_cost == base_cost(g)


def test_bad_options_are_refused_in_one_line(tmp_path):
    with pytest.raises(PlannerError, match="^xla-remat: bandwidth-to-host must be > 0, got 0$"):
        solve(chain3(), "xla-remat", budget=24, host_offload=True, bandwidth_to_host=0)
    with pytest.raises(PlannerError, match="^xla-remat: block-size-limit must be an integer >= 1, got 0$"):
        solve(chain3(), "xla-remat", budget=24, block_size_limit=0)
    path = tmp_path / "g.json"
    chain3().save(path)
    for bad in (["--bandwidth-from-host", "0"], ["--block-size-limit", "0"], ["--bandwidth-to-host", "-1"]):
        out = rematopt("solve", path, "--planner", "xla-remat", "--budget", "24", *bad)
        assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_command_line_over_budget_is_exit_zero(tmp_path):
    path = tmp_path / "g.json"
    chain3().save(path)
    out = rematopt("solve", path, "--planner", "xla-remat", "--budget", "24", "--json")
    assert out.returncode == 0 and json.loads(out.stdout)["status"] == "OVER_BUDGET"
    out = rematopt("solve", path, "--planner", "xla-remat", "--budget", "24", "--block-size-limit", "4", "--json")
    info = json.loads(out.stdout)
    assert out.returncode == 0 and info["status"] == "FEASIBLE" and info["peak_bytes"] == 22
