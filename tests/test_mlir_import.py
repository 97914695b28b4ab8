"""MLIR front end: the small programs in tests/data/mlir, each checked against
hand-computed figures, and bad MLIR rejected with file and line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("jax")

from rematopt import Graph  # noqa: E402
from rematopt.errors import ImportFailure  # noqa: E402
from rematopt.importers.costmodel import DEVICES  # noqa: E402
from rematopt.importers.mlir import DYNAMIC_RESULT_BYTES, import_mlir  # noqa: E402
from rematopt.reference import no_remat_peak  # noqa: E402
from rematopt.importers import load as load_graph

DATA = Path(__file__).parent / "data" / "mlir"
A100 = DEVICES["a100"]


def by_name(g: Graph) -> dict:
    return {v.name: v for v in g.nodes}


def named_edges(g: Graph) -> set[tuple[str, str]]:
    return {(g.nodes[u].name, g.nodes[v].name) for u, v in g.edges}


def write(tmp_path: Path, text: str, name: str = "t.mlir") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_chain_names_bytes_edges_and_outputs():
    g = import_mlir(DATA / "chain.mlir")
    assert [v.name for v in g.nodes] == ["x", "a", "b", "c", "d", "e"]
    assert [v.op for v in g.nodes] == ["input", "math.exp", "arith.mulf", "math.tanh", "arith.addf", "arith.addf"]
    assert g.nodes[0].is_input and all(v.bytes == 16 * 16 * 4 for v in g.nodes)
    assert named_edges(g) == {("x", "a"), ("a", "b"), ("b", "c"), ("c", "d"), ("d", "e"), ("a", "e")}
    assert [v.name for v in g.nodes if v.output] == ["e"]
    assert all(v.recomputable and not v.recompute and v.phase is None for v in g.nodes)
    assert g.meta["cost_unit"] == "s" and g.meta["function"] == "main" and "budget_bytes" not in g.meta
    # exp is memory bound on an A100: 1 KiB in + 1 KiB out at 2.039 TB/s.
    assert by_name(g)["a"].cost == pytest.approx(2048 / 2.039e12, rel=1e-12)
    # a, c and d (or a, d and e) are resident at once; nothing more.
    assert no_remat_peak(g) == 3 * 1024


def test_marks_phases_and_retained_bytes():
    g = by_name(import_mlir(DATA / "chain_marked.mlir"))
    assert [n for n, v in g.items() if v.recompute] == ["a", "c"]
    assert g["b"].bytes == 512 and g["a"].bytes == 1024
    assert {n: v.phase for n, v in g.items()} == {"x": None, "a": "forward", "b": "forward", "c": "forward",
                                                    "d": "backward", "e": "backward"}


def test_budget_attribute_and_measured_costs_in_ns():
    g = import_mlir(DATA / "budget_measured.mlir")  # no main: the only public function
    assert g.name == "budget_measured.step" and g.meta["function"] == "step"
    assert g.meta["budget_bytes"] == 3 * 2**19 and g.meta["cost_unit"] == "ns"
    v = by_name(g)
    assert v["h"].cost == 800.0 and v["y"].cost == 800.0
    assert v["g"].cost == 50.0  # backward_work_ns wins over remat_cost_ns
    # layer_norm is unmeasured: its roofline seconds in ns (1 flop/element, 512 KiB moved).
    assert v["n"].cost == pytest.approx(max(65536 / A100.flops_per_s, 2 * 262144 / A100.bytes_per_s) * 1e9)
    assert all(v[n].recomputable for n in "hgny")


def test_solve_uses_the_budget_attribute():
    from rematopt.solve import solve

    g = import_mlir(DATA / "budget_measured.mlir")
    sol = solve(g, "no-remat")
    assert sol.summary()["budget_bytes"] == 1572864


def test_matmul_flops_make_a_large_dot_compute_bound(tmp_path):
    path = write(tmp_path, """
func.func @main(%a: tensor<2048x512xf32>, %b: tensor<512x2048xf32>) -> tensor<2048x2048xf32> {
  %c = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0] : (tensor<2048x512xf32>, tensor<512x2048xf32>) -> tensor<2048x2048xf32>
  return %c : tensor<2048x2048xf32>
}""")
    c = by_name(import_mlir(path))["c"]
    flops = 2 * 2048 * 2048 * 512
    assert c.cost == pytest.approx(flops / A100.flops_per_s) and c.bytes == 2048 * 2048 * 4


def test_calls_are_inlined_and_external_calls_stay_opaque():
    g = import_mlir(DATA / "call.mlir")
    assert [v.name for v in g.nodes] == ["x", "first.t", "first.s.m", "first.u", "second.t", "second.s.m",
                                         "second.u", "ext", "out"]
    assert named_edges(g) == {("x", "first.t"), ("first.t", "first.s.m"), ("first.s.m", "first.u"),
                              ("first.t", "first.u"), ("first.u", "second.t"), ("second.t", "second.s.m"),
                              ("second.s.m", "second.u"), ("second.t", "second.u"), ("second.u", "ext"),
                              ("ext", "out"), ("x", "out")}
    v = by_name(g)
    assert v["ext"].op == "func.call" and not v["ext"].recomputable
    assert v["second.s.m"].recomputable and v["out"].output


def test_unregistered_effectful_ops_are_not_recomputable():
    g = import_mlir(DATA / "effectful.mlir")
    v = by_name(g)
    assert v["a"].recomputable and v["b"].recomputable and v["c"].recomputable  # tessera.exp, silu, arith
    assert not v["r"].recomputable  # tessera.dropout_rng is not in the pure table
    send = next(n for n in g.nodes if n.op == "tessera.send")
    assert send.bytes == 0 and not send.recomputable and ("a", send.name) in named_edges(g)


def test_ops_with_regions_are_one_node_each_and_see_captured_values():
    g = import_mlir(DATA / "region.mlir")
    v = by_name(g)
    # the reduce's region is an add, the if's branches a negate and a return: pure
    assert v["sum"].recomputable and v["sel"].recomputable and v["big"].recomputable
    assert v["sum"].bytes == 64 and v["sel"].bytes == 4096 and v["p"].bytes == 1
    assert {("big", "sel"), ("p", "sel"), ("big", "sum"), ("zero", "sum")} <= named_edges(g)
    assert {n for n, x in v.items() if x.output} == {"sum", "sel"}
    assert g.n == 6  # the if's branch ops are inside it, not nodes


def test_dynamic_dimensions():
    v = by_name(import_mlir(DATA / "dynamic.mlir"))
    assert v["x"].bytes == v["a"].bytes == DYNAMIC_RESULT_BYTES == 4096
    assert v["y"].bytes == v["b"].bytes == 8 * 16 * 4


def test_numbered_values_fall_back_to_op_name_and_index(tmp_path):
    path = write(tmp_path, """
func.func @main(%arg0: tensor<4xi1>, %1: tensor<2xcomplex<f64>>) -> tensor<4xi1> {
  %0 = arith.xori %arg0, %arg0 : tensor<4xi1>
  %c = arith.constant 3 : index
  return %0 : tensor<4xi1>
}""")
    g = import_mlir(path)
    assert [v.name for v in g.nodes] == ["arg0", "arg1", "arith.xori.2", "c"]
    assert [v.bytes for v in g.nodes] == [4, 32, 4, 8]


def test_function_selection(tmp_path):
    text = """
func.func @f(%a: tensor<4xf32>) -> tensor<4xf32> {
  %b = math.exp %a : tensor<4xf32>
  return %b : tensor<4xf32>
}
func.func @g(%a: tensor<4xf32>) -> tensor<4xf32> {
  return %a : tensor<4xf32>
}
func.func private @decl(tensor<4xf32>) -> tensor<4xf32>
"""
    path = write(tmp_path, text)
    assert import_mlir(path, function="f").n == 2
    g = import_mlir(path, function="g")
    assert g.n == 1 and g.nodes[0].output
    with pytest.raises(ImportFailure, match=r"2 public functions \(f, g\).*--function"):
        import_mlir(path)
    with pytest.raises(ImportFailure, match=r"no function 'h' \(functions: f, g, decl\)"):
        import_mlir(path, function="h")
    with pytest.raises(ImportFailure, match=rf"^{path}:9: function 'decl' is only a declaration"):
        import_mlir(path, function="decl")


@pytest.mark.parametrize("text, line, reason", [
    ("""func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> {
  %b = func.call @main(%a) : (tensor<4xf32>) -> tensor<4xf32>
  return %b : tensor<4xf32>
}""", 2, "recursive call to @main"),
    ("""func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> {
  cf.br ^next
^next:
  return %a : tensor<4xf32>
}""", 1, "several blocks"),
    ("""func.func @main(%a: tensor<4xf32>, %b: tensor<8xf32>) -> tensor<4xf32> {
  %c = stablehlo.add %a, %b : (tensor<4xf32>, tensor<8xf32>) -> tensor<4xf32>
  return %c : tensor<4xf32>
}""", 2, "stablehlo.add"),
    ("""func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> {
  %b = math.exp %a {tessera.remat_cost_ns = "fast"} : tensor<4xf32>
  return %b : tensor<4xf32>
}""", 2, "tessera.remat_cost_ns must be a finite number"),
])
def test_bad_programs_name_file_and_line(tmp_path, text, line, reason):
    path = write(tmp_path, text)
    with pytest.raises(ImportFailure) as err:
        import_mlir(path)
    assert str(err.value).startswith(f"{path}:{line}: ") and reason in str(err.value)


def test_syntax_error_via_cli_exits_2_with_file_and_line(tmp_path):
    bad = DATA / "syntax_error.mlir"
    with pytest.raises(ImportFailure, match=rf"^{bad}:4: expected ':'"):
        import_mlir(bad)
    out = subprocess.run([sys.executable, "-m", "rematopt", "import", "mlir", str(bad), "-o", str(tmp_path / "g.json")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.strip() == f"rematopt: {bad}:4: expected ':'"
    assert not (tmp_path / "g.json").exists()


def test_import_cli_writes_a_graph_that_loads_back(tmp_path):
    out_path = tmp_path / "g.json"
    out = subprocess.run([sys.executable, "-m", "rematopt", "import", "mlir", str(DATA / "call.mlir"),
                          "--function", "main", "-o", str(out_path)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    g = load_graph(out_path)
    direct = import_mlir(DATA / "call.mlir")
    assert g.to_dict()["nodes"] == direct.to_dict()["nodes"] and g.edges == direct.edges
    assert load_graph(DATA / "call.mlir").n == 9  # GRAPH arguments accept MLIR directly
