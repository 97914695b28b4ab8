"""The remat pass's own contract, on small modules written in its style:
function budgets, measured costs, explicit marks, phases; the residual
model's selection and figures; the exported figures; REMAT_EFFECTFUL; and
any budget >= 0 for every heuristic planner."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

pytest.importorskip("jax")

from rematopt import planners, simulate, solve  # noqa: E402
from rematopt.errors import BudgetError, ImportFailure  # noqa: E402
from rematopt.exporters.mlir import export_mlir  # noqa: E402
from rematopt.importers.mlir import import_mlir  # noqa: E402
from rematopt.importers.synthetic import unet  # noqa: E402
from rematopt.plan import Plan  # noqa: E402
from rematopt.reference import no_remat_peak, peak_lower_bound  # noqa: E402
from mlir_cases import verify  # noqa: E402

DATA = Path(__file__).parent / "data" / "mlir"
STEP = DATA / "pass_step.mlir"
EFFECTFUL = DATA / "pass_effectful.mlir"
KIB256 = 256 * 1024  # every value of pass_step.mlir


def rematopt(*args):
    return subprocess.run([sys.executable, "-m", "rematopt", *map(str, args)],
                          capture_output=True, text=True, timeout=120)


def test_function_budget_and_measured_costs():
    g = import_mlir(STEP)
    assert g.meta["budget_bytes"] == KIB256 and g.meta["cost_unit"] == "ns"
    cost = {v.name: v.cost for v in g.nodes if not v.is_input}
    assert (cost["h"], cost["g"], cost["e"], cost["y"], cost["dy"]) == (900, 40, 30, 100, 40)
    assert [v.name for v in g.nodes if v.recompute] == ["e"]
    assert [v.name for v in g.nodes if v.phase == "backward"] == ["dy", "d1", "d2", "d3"]


def test_residual_model_selects_and_judges_as_the_pass():
    """Residual intervals (candidate to last use, both ends): h 2..8, g 3..7,
    e 4..9, y 5..6, all 256 KiB, so 1 MiB at positions 5-6. The mark e goes
    first (768 KiB); then by bytes x span / cost: g (4/40) before y (1/100)
    before h (6/900). After g and y only h is live: 256 KiB = the budget."""
    g = import_mlir(STEP)
    sol = solve(g, "greedy", peak_model="residual")  # the function's own budget
    stats = sol.plan.stats
    assert stats["selected"] == ["g", "e", "y"] and stats["marked"] == ["e"] and stats["auto_selected"] == 2
    assert (stats["peak_before_bytes"], stats["peak_after_bytes"]) == (4 * KIB256, KIB256)
    assert stats["selected_cost"] == 30 + 40 + 100
    # judged on the estimate, as the pass judges it; the true peak is higher
    assert sol.status == "FEASIBLE" and sol.budget == KIB256 < sol.replay.peak_bytes
    assert simulate(g, sol.plan).valid
    # the memory model judges the true peak: the same budget is out of reach
    assert solve(g, "greedy").status == "OVER_BUDGET"


def test_exported_figures_are_the_pass_figures(tmp_path):
    g = import_mlir(STEP)
    sol = solve(g, "greedy", peak_model="residual")
    out = tmp_path / "step.remat.mlir"
    out.write_text(export_mlir(STEP, sol.plan))
    figures = verify(out, "step")
    clones = len(re.findall(r"%[\w.]+\.remat\d+ =", out.read_text()))  # the clones' SSA names: %g.remat1 ...
    assert figures == {"tessera.remat_auto_selected": 2, "tessera.remat_budget_bytes": KIB256,
                       "tessera.remat_peak_before_bytes": 4 * KIB256, "tessera.remat_peak_after_bytes": KIB256,
                       "tessera.remat_selected_cost_ns": 170, "tessera.rematerialized": clones}
    # a clone standing in for a dropped original is that original in the program
    assert clones == sol.plan.stats["projected_clones"] - sol.plan.stats["originals_dropped"] == 3
    assert "tessera.recompute" not in out.read_text()


def test_budget_mb_and_bytes_attributes(tmp_path):
    with pytest.warns(UserWarning, match="REMAT_EFFECTFUL"):
        assert import_mlir(EFFECTFUL, drop_unsafe_marks=True).meta["budget_bytes"] == 2**20
    both = tmp_path / "both.mlir"
    both.write_text(STEP.read_text().replace("attributes {", "attributes {tessera.remat_budget_mb = 1 : i32, "))
    assert import_mlir(both).meta["budget_bytes"] == KIB256  # bytes are exact: they win
    bad = tmp_path / "bad.mlir"
    bad.write_text(STEP.read_text().replace("262144 : i64", '"lots"'))
    with pytest.raises(ImportFailure, match=r"tessera.remat_budget_bytes must be a finite number >= 0"):
        import_mlir(bad)


def test_a_mark_on_an_effectful_op_is_remat_effectful(tmp_path):
    with pytest.raises(ImportFailure) as err:
        import_mlir(EFFECTFUL)
    assert str(err.value).startswith(f"REMAT_EFFECTFUL: test.stateful_dropout at {EFFECTFUL}:5:")
    out = rematopt("solve", EFFECTFUL, "--planner", "greedy")
    assert out.returncode == 2 and out.stdout == "" and len(out.stderr.strip().splitlines()) == 1
    assert out.stderr.startswith(f"rematopt: REMAT_EFFECTFUL: test.stateful_dropout at {EFFECTFUL}:5:")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        g = import_mlir(EFFECTFUL, drop_unsafe_marks=True)
    assert [str(w.message).split(":")[0] for w in caught] == ["REMAT_EFFECTFUL"]
    assert [(v.name, v.recomputable, v.recompute) for v in g.nodes] == [
        ("x", True, False), ("a", True, True), ("d", False, False), ("y", True, False)]
    out = rematopt("solve", EFFECTFUL, "--planner", "greedy", "--drop-unsafe-marks", "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["marked"] == ["a"] and "REMAT_EFFECTFUL" in out.stderr
    args = ["import", "mlir", EFFECTFUL, "-o", tmp_path / "g.json"]
    assert rematopt(*args).returncode == 2 and not (tmp_path / "g.json").exists()
    assert rematopt(*args, "--drop-unsafe-marks").returncode == 0 and (tmp_path / "g.json").exists()


HEURISTICS = [p for p in planners.names() if p not in ("cpsat", "jax-names")]  # jax-names: exact, over names


@pytest.mark.parametrize("planner", HEURISTICS)
def test_every_heuristic_takes_budget_zero(planner):
    g = unet(2, train=True)
    assert peak_lower_bound(g) > 0
    sol = solve(g, planner, budget=0)  # replays the plan and checks its claims
    assert sol.status == "OVER_BUDGET" and sol.replay.valid and sol.budget == 0


def test_budget_zero_on_the_command_line(tmp_path):
    path = tmp_path / "unet.json"
    unet(2, train=True).save(path)
    out = rematopt("solve", path, "--planner", "greedy", "--budget", "0", "--json")
    assert out.returncode == 0, out.stderr
    info = json.loads(out.stdout)
    assert info["status"] == "OVER_BUDGET" and info["peak_bytes"] <= info["no_remat_peak_bytes"]
    out = rematopt("solve", path, "--budget", "0")  # cpsat proves it impossible: one line, exit 2
    assert out.returncode == 2 and "below the lower bound" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    with pytest.raises(BudgetError, match="below the lower bound"):
        solve(unet(2, train=True), "cpsat", budget=0)
    with pytest.raises(BudgetError, match=">= 0"):
        solve(unet(2, train=True), "greedy", budget=-1)


def test_residual_budget_on_the_command_line_exports_the_figures(tmp_path):
    plan = tmp_path / "plan.json"
    out = rematopt("solve", STEP, "--planner", "greedy", "--peak-model", "residual", "-o", plan, "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["status"] == "FEASIBLE"
    assert rematopt("export", "mlir", STEP, plan, "-o", tmp_path / "out.mlir").returncode == 0
    assert verify(tmp_path / "out.mlir", "step")["tessera.remat_peak_after_bytes"] == KIB256
    assert no_remat_peak(import_mlir(tmp_path / "out.mlir")) == simulate(import_mlir(STEP), Plan.load(plan)).peak_bytes


def test_remat_effectful_names_a_jax_location(tmp_path):
    """A module printed with JAX's locations: the op's place is its Python source."""
    path = tmp_path / "dbg.mlir"
    path.write_text('''func.func @main(%x: tensor<64xf32>) -> tensor<64xf32> {
  %d = "test.stateful_dropout"(%x) {tessera.recompute} : (tensor<64xf32>) -> tensor<64xf32> loc(#loc1)
  return %d : tensor<64xf32>
}
#loc1 = loc("jit(f)/dropout"("/src/model.py":3:17))
''')
    with pytest.raises(ImportFailure) as err:
        import_mlir(path)
    assert str(err.value).startswith(f'REMAT_EFFECTFUL: test.stateful_dropout at {path} (test.stateful_dropout.1, '
                                     'loc("jit(f)/dropout"("/src/model.py":3:17))): ')
