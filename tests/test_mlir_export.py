"""MLIR back end: plans written into programs. The output must parse and
verify, and importing it must give a graph whose no-remat replay peaks at the
plan's peak (plans here free every value after its last use)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("jax")

from rematopt.errors import PlanError, PlannerError  # noqa: E402
from rematopt.exporters.mlir import export_mlir  # noqa: E402
from rematopt.importers.mlir import import_mlir  # noqa: E402
from rematopt.plan import Plan, PlanBuilder  # noqa: E402
from rematopt.reference import no_remat_peak, no_remat_plan  # noqa: E402
from rematopt.simulate import simulate  # noqa: E402
from mlir_cases import remat_plan, verify  # noqa: E402

DATA = Path(__file__).parent / "data" / "mlir"
PROGRAMS = ["chain", "chain_marked", "budget_measured", "call", "effectful", "region", "dynamic", "remat"]


def round_trip(tmp_path, name, plan, **kw):
    out = tmp_path / f"{name}.out.mlir"
    out.write_text(export_mlir(DATA / f"{name}.mlir", plan, **kw))
    return out, import_mlir(out, function=kw.get("function"))


def shape(g):
    return [(v.name, v.op, v.bytes, v.recomputable, v.output) for v in g.nodes], sorted(
        (g.nodes[u].name, g.nodes[v].name) for u, v in g.edges)


@pytest.mark.parametrize("name", PROGRAMS)
def test_no_remat_plan_gives_back_the_same_graph(tmp_path, name):
    g = import_mlir(DATA / f"{name}.mlir")
    out, g2 = round_trip(tmp_path, name, no_remat_plan(g))
    figures = verify(out, g.meta["function"])
    assert figures.pop("tessera.remat_budget_mb", 1.5) == 1.5  # the input's budget stays
    assert shape(g2) == shape(g)
    assert no_remat_peak(g2) == no_remat_peak(g)
    assert figures.pop("tessera.remat_budget_bytes", 3 * 2**19) == 3 * 2**19  # a plan made with no budget
    assert figures == {"tessera.remat_peak_before_bytes": no_remat_peak(g), "tessera.rematerialized": 0,
                       "tessera.remat_peak_after_bytes": no_remat_peak(g), "tessera.remat_selected_cost_ns": 0,
                       "tessera.remat_auto_selected": 0}
    assert "tessera.recompute" not in out.read_text()


def test_recompute_plan_on_stablehlo_lowers_the_peak(tmp_path):
    g = import_mlir(DATA / "remat.mlir")
    a1 = g.node_by_name("a1").id
    plan = remat_plan(g, [a1])
    replay = simulate(g, plan)
    assert replay.valid and replay.peak_bytes == 9216 < no_remat_peak(g) == 12288
    out, g2 = round_trip(tmp_path, "remat", plan)
    figures = verify(out)
    # the clone reads x through a barrier that also waits for a3, as JAX pins jax.checkpoint
    assert [v.name for v in g2.nodes] == ["x", "a1", "a2", "a3", "a1.remat1.barrier", "a1.remat1", "out"]
    assert "%a1.remat1.barrier:2 = stablehlo.optimization_barrier %x, %a3" in out.read_text()
    assert {(g2.nodes[u].name, g2.nodes[v].name) for u, v in g2.edges} == {
        ("x", "a1"), ("a1", "a2"), ("a2", "a3"), ("x", "a1.remat1.barrier"), ("a3", "a1.remat1.barrier"),
        ("x", "a1.remat1"), ("a1.remat1.barrier", "a1.remat1"), ("a3", "out"), ("a1.remat1", "out")}
    assert g2.node_by_name("a1.remat1.barrier").bytes == 0  # a barrier allocates nothing
    assert no_remat_peak(g2) == replay.peak_bytes
    assert figures == {"tessera.remat_peak_before_bytes": 12288, "tessera.remat_peak_after_bytes": 9216,
                       "tessera.rematerialized": 1, "tessera.remat_auto_selected": 1,
                       "tessera.remat_selected_cost_ns": round(g.nodes[a1].cost * 1e9)}
    assert g.nodes[a1].cost * 1e9 > 0.5  # the figure is not a rounded zero


def test_marks_are_removed_and_phases_kept(tmp_path):
    g = import_mlir(DATA / "chain_marked.mlir")
    plan = remat_plan(g, [g.node_by_name("a").id])
    replay = simulate(g, plan)
    out, g2 = round_trip(tmp_path, "chain_marked", plan)
    assert "tessera.recompute" not in out.read_text() and not any(v.recompute for v in g2.nodes)
    assert no_remat_peak(g2) == replay.peak_bytes
    assert [(v.name, v.phase, v.bytes) for v in g2.nodes] == [
        ("x", None, 1024), ("a", "forward", 1024), ("b", "forward", 512), ("c", "forward", 1024),
        ("d", "backward", 1024), ("a.remat1", "forward", 1024), ("e", "backward", 1024)]


def test_recomputing_inlined_ops(tmp_path):
    g = import_mlir(DATA / "call.mlir")
    x = g.node_by_name("x")
    plan = remat_plan(g, [g.node_by_name("first.t").id])
    out, g2 = round_trip(tmp_path, "call", plan, xla=False)
    text = out.read_text()
    assert "call @block" not in text and "call @external" in text  # inlined in the output
    assert [v.name for v in g2.nodes][:5] == [x.name, "first.t", "first.s.m", "first.t.remat1", "first.u"]
    assert no_remat_peak(g2) == simulate(g, plan).peak_bytes
    verify(out)


def test_originals_nobody_reads_any_more_are_erased(tmp_path):
    g = import_mlir(DATA / "chain.mlir")
    plan = remat_plan(g, [g.node_by_name("c").id])  # c's only reader moves to the clone
    out, g2 = round_trip(tmp_path, "chain", plan)
    assert [v.name for v in g2.nodes] == ["x", "a", "b", "c.remat1", "d", "e"]
    assert verify(out)["tessera.rematerialized"] == 1
    assert no_remat_peak(g2) <= simulate(g, plan).peak_bytes


def test_clones_keep_measured_costs_and_budget(tmp_path):
    g = import_mlir(DATA / "budget_measured.mlir")
    plan = remat_plan(g, [g.node_by_name("h").id])
    out, g2 = round_trip(tmp_path, "budget_measured", plan)
    assert g2.node_by_name("h.remat1").cost == 800.0 and g2.meta["budget_bytes"] == g.meta["budget_bytes"]
    assert no_remat_peak(g2) == simulate(g, plan).peak_bytes


def test_greedy_plan_round_trips(tmp_path):
    from rematopt import planners
    from rematopt.solve import solve

    try:
        planners.get("greedy")
    except PlannerError as e:
        pytest.skip(f"greedy planner not available: {e}")
    g = import_mlir(DATA / "remat.mlir")
    sol = solve(g, "greedy", budget=9216)
    out, g2 = round_trip(tmp_path, "remat", sol.plan)
    figures = verify(out)
    # greedy frees the argument after the last op, the program right after its last reader
    assert no_remat_peak(g2) <= sol.replay.peak_bytes < no_remat_peak(g)
    clones = sol.plan.compute_events - len(g.compute_ids)
    assert clones >= 1 and figures["tessera.rematerialized"] == clones
    assert figures["tessera.remat_budget_bytes"] == 9216
    assert figures["tessera.remat_auto_selected"] == len(sol.plan.stats["selected"]) >= 1


def test_offload_becomes_attributes(tmp_path):
    g = import_mlir(DATA / "remat.mlir")
    b = PlanBuilder()
    b.offload(0)  # the argument goes to host at once (and stays on the device)
    for ev in [("c", 1), ("f", 0), ("o", 1), ("c", 2), ("f", 1), ("c", 3), ("f", 2), ("p", 1), ("c", 4),
               ("f", 3), ("f", 1)]:
        {"c": b.compute, "f": b.free, "o": b.offload, "p": b.prefetch}[ev[0]](ev[1])
    plan = b.build(g.name, "hand")
    assert simulate(g, plan).valid
    out, g2 = round_trip(tmp_path, "remat", plan)
    text = out.read_text()
    assert ('%a1 = stablehlo.broadcast_in_dim %x, dims = [1] {tessera.offload, tessera.offload_after = ["a1"], '
            'tessera.prefetch_before = ["out"]}') in text
    assert '%x: tensor<16xf32> {tessera.offload, tessera.offload_after = ["x"], tessera.prefetch_before = []}' in text
    # and as XLA's host-offload annotations (what JAX lowers device_put(x, memory_kind=...) to):
    # a1 goes to pinned host right after it is computed, comes back right before out, and out reads the copy
    place = 'stablehlo.custom_call @annotate_device_placement({}) {{backend_config = "", has_side_effect = true, ' \
            'mhlo.frontend_attributes = {{_xla_buffer_placement = "{}"}}}}'
    assert f"%a1.host1 = {place.format('%a1', 'pinned_host')}" in text
    assert f"%a1.device2 = {place.format('%a1.host1', 'device')}" in text
    assert "%out = stablehlo.dot_general %a3, %a1.device2" in text
    assert [v.name for v in g2.nodes] == ["x", "x.host1", "a1", "a1.host1", "a2", "a3", "a1.device2", "out"]
    assert [v.bytes for v in g2.nodes if ".host" in v.name] == [0, 0]  # host memory takes no device bytes
    assert no_remat_peak(g2) == simulate(g, plan).peak_bytes == 9216 < no_remat_peak(g)
    out2, g3 = round_trip(tmp_path, "remat", plan, xla=False)  # attributes only
    assert "annotate_device_placement" not in out2.read_text() and shape(g3) == shape(g)
    verify(out)


def test_invalid_plans_are_refused(tmp_path):
    g = import_mlir(DATA / "remat.mlir")
    bad = Plan.from_events(g.name, "hand", [("compute", 2)])
    with pytest.raises(PlanError, match=r"does not replay on .*remat.mlir \(function 'main'\): "):
        export_mlir(DATA / "remat.mlir", bad)
    e = import_mlir(DATA / "effectful.mlir")
    names = [v.name for v in e.nodes]
    send = next(v.id for v in e.nodes if v.op == "tessera.send")
    order = [names.index("a"), send, names.index("r"), names.index("b"), names.index("c")]
    moved = Plan.from_events(e.name, "hand", [("compute", i) for i in order])
    assert simulate(e, moved).valid
    with pytest.raises(PlanError, match="computes 'r' out of program order"):
        export_mlir(DATA / "effectful.mlir", moved)


def rematopt(*args):
    return subprocess.run([sys.executable, "-m", "rematopt", *map(str, args)],
                          capture_output=True, text=True, timeout=120)


def test_export_cli(tmp_path):
    plan = tmp_path / "plan.json"
    remat_plan(import_mlir(DATA / "remat.mlir"), [1]).save(plan)
    out = rematopt("export", "mlir", DATA / "remat.mlir", plan, "-o", tmp_path / "out.mlir")
    assert out.returncode == 0, out.stderr
    assert no_remat_peak(import_mlir(tmp_path / "out.mlir")) == 9216
    wrong = rematopt("export", "mlir", DATA / "chain.mlir", plan, "-o", tmp_path / "bad.mlir")
    assert wrong.returncode == 2 and len(wrong.stderr.strip().splitlines()) == 1
    assert wrong.stderr.startswith(f"rematopt: {plan}: does not replay on ")


def as_mlir(g) -> str:
    """A program with ``g``'s shape: one pure generic op per compute node,
    reading its predecessors, with a result of the node's bytes (f32)."""
    ty = {v.id: f"tensor<{max(v.bytes // 4, 1)}xf32>" for v in g.nodes}
    args = [v for v in g.nodes if v.is_input]
    lines = [f"func.func @main({', '.join(f'%v{v.id}: {ty[v.id]}' for v in args)}) -> "
             f"({', '.join(ty[v.id] for v in g.nodes if v.output)}) {{"]
    for i in g.order:
        if not g.nodes[i].is_input:
            ps = g.preds[i]
            lines.append(f'  %v{i} = "tessera.gelu"({", ".join(f"%v{p}" for p in ps)}) : '
                         f'({", ".join(ty[p] for p in ps)}) -> {ty[i]}')
    outs = [v.id for v in g.nodes if v.output]
    lines.append(f"  return {', '.join(f'%v{i}' for i in outs)} : {', '.join(ty[i] for i in outs)}")
    return "\n".join(lines + ["}"]) + "\n"


@pytest.mark.parametrize("seed", range(4))
def test_random_programs_keep_the_plan_peak(tmp_path, seed):
    import numpy as np

    from rematopt.importers.synthetic import random_layered

    g0 = random_layered(18, seed=seed)
    g0.nodes[g0.order[-1]].output = True
    for v in g0.nodes:
        v.bytes = 4 * max(v.bytes // 4, 1)
    src = tmp_path / "g.mlir"
    src.write_text(as_mlir(g0))
    g = import_mlir(src)
    assert [(v.bytes, v.output) for v in g.nodes] == [(g0.nodes[int(v.name[1:])].bytes, g0.nodes[int(v.name[1:])].output)
                                                       for v in g.nodes]
    shared = [v.id for v in g.nodes if not v.is_input and len(g.succs[v.id]) >= 2]
    rng = np.random.default_rng(seed)
    targets = sorted(rng.choice(shared, size=min(3, len(shared)), replace=False).tolist())
    plan = remat_plan(g, targets)
    replay = simulate(g, plan)
    assert replay.valid, replay.error
    out = tmp_path / "out.mlir"
    out.write_text(export_mlir(src, plan))
    g2 = import_mlir(out)
    assert g2.n == g.n + len(targets) and no_remat_peak(g2) == replay.peak_bytes
    from rematopt.reference import peak_lower_bound
    from rematopt.solve import solve

    try:
        sol = solve(g, "greedy", budget=max(peak_lower_bound(g), int(0.8 * no_remat_peak(g))))
    except PlannerError as e:
        pytest.skip(f"greedy planner not available: {e}")
    out.write_text(export_mlir(src, sol.plan))
    assert no_remat_peak(import_mlir(out)) <= sol.replay.peak_bytes
