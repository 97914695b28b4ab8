"""The CLI through its real entry point: exit codes, --json output, bad input."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from rematopt import no_remat_peak
from rematopt.importers.synthetic import chain, unet
from rematopt.reference import no_remat_plan
from rematopt.importers import load as load_graph


def rematopt(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "rematopt", *map(str, args)],
                          capture_output=True, text=True, cwd=cwd, timeout=120)


@pytest.fixture
def graph_file(tmp_path):
    path = tmp_path / "unet.json"
    unet(2, train=True).save(path)
    return path


def test_solve_on_embedded_default_prints_json():
    out = rematopt("solve", "--planner", "no-remat", "--json")
    assert out.returncode == 0, out.stderr
    info = json.loads(out.stdout)
    for key in ("status", "planner", "peak_bytes", "budget_bytes", "no_remat_peak_bytes", "compute_cost",
                "base_cost", "overhead", "transfer_bytes", "wall_s", "plan"):
        assert key in info
    assert info["peak_bytes"] == info["no_remat_peak_bytes"] and info["overhead"] == 0


def test_solve_writes_a_plan_that_simulate_accepts(tmp_path, graph_file):
    plan = tmp_path / "plan.json"
    out = rematopt("solve", graph_file, "--planner", "no-remat", "--budget-ratio", "1.0", "-o", plan, "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["plan"] == str(plan)
    sim = rematopt("simulate", graph_file, plan, "--json")
    assert sim.returncode == 0, sim.stderr
    info = json.loads(sim.stdout)
    assert info["valid"] and info["peak_bytes"] == no_remat_peak(load_graph(graph_file))


def test_simulate_exits_1_on_an_invalid_plan(tmp_path, graph_file):
    plan = tmp_path / "bad.json"
    plan.write_text(json.dumps({"format": "rematopt.plan/1", "graph": "g", "planner": "hand",
                                "events": [{"op": "free", "node": 0}]}))
    out = rematopt("simulate", graph_file, plan, "--json")
    assert out.returncode == 1
    info = json.loads(out.stdout)
    assert not info["valid"] and info["error_event"] == 0 and "not resident" in info["error"]


def test_inspect_json(graph_file):
    out = rematopt("inspect", graph_file, "--json")
    info = json.loads(out.stdout)
    g = load_graph(graph_file)
    assert info["nodes"] == g.n and info["no_remat_peak_bytes"] == no_remat_peak(g)


def test_generate_and_import_nodelink(tmp_path, benchmarks_dir):
    out = rematopt("import", "nodelink", benchmarks_dir / "vgg16_train.json", "-o", tmp_path / "v.json")
    assert out.returncode == 0, out.stderr
    assert load_graph(tmp_path / "v.json").n == 45
    out = rematopt("generate", "random-layered", "-n", 50, "--seed", 3, "-o", tmp_path / "r.json")
    assert out.returncode == 0 and load_graph(tmp_path / "r.json").n == 50


@pytest.mark.parametrize("make_args, message", [
    (lambda t, g: ["inspect", t / "missing.json"], "missing.json: no such file"),
    (lambda t, g: ["inspect", t / "broken.json"], "broken.json: malformed JSON"),
    (lambda t, g: ["inspect", t / "cycle.json"], "cycle.json: the edges contain a cycle"),
    (lambda t, g: ["inspect", t / "plan_as_graph.json"], "format must be 'rematopt.graph/1'"),
    (lambda t, g: ["solve", g, "--budget", "10"], "below the lower bound"),  # cpsat proves it impossible
    (lambda t, g: ["solve", g, "--planner", "no-remat", "--budget", "ten"], "cannot read 'ten' as a size"),
    (lambda t, g: ["solve", g, "--planner", "no-remat", "--budget", "1e400"], "size '1e400' is too large"),
    (lambda t, g: ["solve", g, "--planner", "no-remat", "--budget", "1e30"], "exceeds the limit 2^53"),
    (lambda t, g: ["solve", g, "--planner", "magic"], "unknown planner 'magic'"),
    (lambda t, g: ["simulate", g, t / "broken.json"], "broken.json: malformed JSON"),
    (lambda t, g: ["solve", g, "--workers", "-2"], "workers must be an integer >= 0"),
    (lambda t, g: ["solve", g, "--offload", "--transfer-cost-per-byte", "-1"],
     "transfer-cost-per-byte must be a finite number >= 0"),
    (lambda t, g: ["solve", g, "--budget-ratio", "0.9", "--hint", t / "other_plan.json"],
     "other_plan.json: the hint does not replay on "),
    # output paths are checked before the solve, not after it
    (lambda t, g: ["solve", g, "-o", t / "missing" / "plan.json"], "plan.json: no such directory"),
    (lambda t, g: ["solve", g, "--log", t / "missing" / "log.csv"], "log.csv: no such directory"),
    # an option the planner would ignore: its plan would look like an answer to a question not asked
    (lambda t, g: ["solve", g, "--planner", "greedy", "--objective", "peak"], "'greedy' does not take --objective"),
    (lambda t, g: ["solve", g, "--planner", "dtr", "--offload", "--log", t / "l.csv"],
     "'dtr' does not take --log, --offload"),
    (lambda t, g: ["solve", g, "--trim", "midpoint"], "'cpsat' does not take --trim"),
    (lambda t, g: ["generate", "chain", "-n", "4", "-o", t / "missing" / "g.json"],
     "g.json: No such file or directory"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, graph_file, make_args, message):
    (tmp_path / "broken.json").write_text('{"format": ')
    (tmp_path / "cycle.json").write_text(json.dumps({
        "format": "rematopt.graph/1", "name": "c", "nodes": [{"id": 0, "name": "a", "bytes": 1, "cost": 1},
                                                  {"id": 1, "name": "b", "bytes": 1, "cost": 1}],
        "edges": [[0, 1], [1, 0]]}))
    (tmp_path / "plan_as_graph.json").write_text(json.dumps({"format": "rematopt.plan/1", "events": []}))
    no_remat_plan(chain(4)).save(tmp_path / "other_plan.json")
    out = rematopt(*make_args(tmp_path, graph_file))
    assert out.returncode == 2
    assert message in out.stderr and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_budget_with_units(graph_file):
    peak = no_remat_peak(load_graph(graph_file))
    out = rematopt("solve", graph_file, "--planner", "no-remat", "--budget", f"{peak / 2**20 + 1}MiB", "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["status"] == "FEASIBLE"


def test_every_planner_option_is_taken_by_its_planner(tmp_path, graph_file):
    """The options refused above are refused only where they do not apply."""
    plan = tmp_path / "p.json"
    rematopt("solve", graph_file, "--planner", "no-remat", "-o", plan)
    runs = [
        ["--planner", "cpsat", "--budget-ratio", "0.9", "--objective", "overhead", "--offload", "--host-bandwidth",
         "1e9", "--max-clone-expansion", "0", "--time-limit", "5", "--workers", "1", "--seed", "1", "--hint", plan,
         "--warm-start", "auto", "--recompute-depth", "auto", "--log", tmp_path / "log.csv"],
        ["--planner", "cpsat", "--objective", "peak", "--max-overhead", "0.5", "--transfer-cost-per-byte", "0",
         "--time-limit", "5", "--workers", "1"],
        ["--planner", "greedy", "--budget-ratio", "0.9", "--peak-model", "residual", "--trim", "max-clone",
         "--max-clone-expansion", "4", "--no-offload"],
    ]
    for args in runs:
        out = rematopt("solve", graph_file, *args, "--json")
        assert out.returncode in (0, 3), (args, out.stderr)  # taken (3: taken, and no plan within the budget)


def test_export_model_writes_the_formulation_by_its_names(tmp_path, graph_file):
    """--export-model writes the first round's CP-SAT model as proto text and
    its LP as MPS, both with the formulation's variable names, the proto
    with as many variables as the run reports for its model."""
    target = tmp_path / "model.pbtxt"
    out = rematopt("solve", graph_file, "--budget-ratio", "0.9", "--recompute-depth", "full", "--time-limit", "20",
                   "--workers", "1", "--warm-start", "none", "--export-model", target, "--json")
    assert out.returncode == 0, out.stderr
    text, mps = target.read_text(), (tmp_path / "model.mps").read_text()
    for name in ("R[", "S[", "F[", "U["):
        assert f'name: "{name}' in text and f" {name}" in mps
    assert json.loads(out.stdout)["variables"] == text.count("variables {")
    missing = rematopt("solve", graph_file, "--budget-ratio", "0.9", "--export-model", tmp_path / "no" / "m.txt")
    assert missing.returncode == 2 and "no such directory" in missing.stderr


@pytest.mark.parametrize("text, expected", [
    ("2M", 2 * 2**20), ("1E9", 10**9), ("1e9", 10**9), ("1.5GiB", 3 * 2**29), ("512MB", 512 * 10**6),
    ("64k", 65536), ("3Ki", 3072), (".5M", 2**19), ("1048576", 1048576), (" 7 b ", 7), ("2.5e+3KB", 2_500_000),
])
def test_sizes_as_people_type_them(text, expected):
    from rematopt.sizes import parse_bytes

    assert parse_bytes(text) == expected


@pytest.mark.parametrize("text", ["ten", "1.5XB", "-3M", "1e", "M", ""])
def test_unreadable_sizes_are_refused(text):
    from rematopt.errors import BudgetError
    from rematopt.sizes import parse_bytes

    with pytest.raises(BudgetError, match="cannot read"):
        parse_bytes(text)


def test_tables_show_bytes_in_human_units_next_to_the_count(graph_file):
    from rematopt.sizes import human_bytes

    out = rematopt("solve", graph_file, "--planner", "greedy", "--budget", "1E3")
    assert out.returncode == 0, out.stderr
    rows = {line.split("│")[1].strip(): line.split("│")[2].strip() for line in out.stdout.splitlines()
            if line.count("│") == 3}
    peak = no_remat_peak(load_graph(graph_file))
    assert rows["no_remat_peak_bytes"] == f"{peak:,} ({human_bytes(peak)})" and "MiB" in rows["no_remat_peak_bytes"]
    assert rows["budget_bytes"] == "1,000"  # under 1 KiB: the count alone
    assert rows["status"] == "OVER_BUDGET"  # greedy takes any budget >= 0
    assert human_bytes(1536) == "1.5 KiB" and human_bytes(3 * 2**30) == "3 GiB" and human_bytes(512) == "512 B"


def test_a_solve_time_limit_counts_the_command_from_its_start(monkeypatch):
    """--time-limit is the whole command's: the planner is given what is left
    after the process's start and the graph's loading, less the finishing
    reserve, never below zero."""
    from click.testing import CliRunner

    from rematopt.cli import cli, common, core

    got = []

    def fake_solve(graph, planner, **options):
        got.append(options["time_limit"])
        raise core.RematoptError("stop here")

    monkeypatch.setattr(core, "solve", fake_solve)
    monkeypatch.setattr(core, "since_start", lambda: 2.0)
    for limit, left in (("10", 10 - 2.0 - core.FINISH_S), ("1", 0.0)):
        CliRunner().invoke(cli, ["solve", "--planner", "dtr", "--budget-ratio", "0.9", "--time-limit", limit])
        assert got.pop() == pytest.approx(left)

    monkeypatch.undo()
    assert common.since_start() == 0.0  # outside main (this test runner): nothing to count
    for age, counted in ((100.0, False), (1.5, True)):  # an old process (an in-process call), a fresh one
        monkeypatch.setattr(common, "_process_age", lambda: age)
        common.command_started()
        try:
            assert (common.since_start() >= 1.5) is counted
        finally:
            common.command_started(None)
    assert common.since_start() == 0.0


# -- solve's headline: what happened, in one line before the table --------------------------------


def _headline(*args):
    from click.testing import CliRunner

    from rematopt.cli import cli

    run = CliRunner().invoke(cli, ["solve", *map(str, args)])
    return run.exit_code, run.output.splitlines()[0]


def test_solve_opens_with_the_peak_before_and_after_the_recompute_and_the_proof(graph_file):
    from rematopt import solve
    from rematopt.sizes import human_bytes

    g = load_graph(graph_file)
    code, line = _headline(graph_file, "--time-limit", 20, "--workers", 1)
    sol = solve(g, "cpsat", time_limit=20, workers=1)
    assert code == 0 and sol.status == "OPTIMAL"
    cut = round(100 * (1 - sol.replay.peak_bytes / no_remat_peak(g)))
    assert line.startswith(f"peak {human_bytes(no_remat_peak(g))} -> {human_bytes(sol.replay.peak_bytes)} "
                           f"(-{cut}%), +")
    assert " recompute, proven optimal in " in line and line.endswith(" s")


def test_solve_headline_of_a_heuristic_and_of_a_plan_over_budget(graph_file):
    from rematopt.sizes import human_bytes

    g = load_graph(graph_file)
    code, line = _headline(graph_file, "--planner", "greedy", "--budget-ratio", 0.95)
    assert code == 0 and line.startswith(f"peak {human_bytes(no_remat_peak(g))} -> ")
    assert line.endswith(" s)") and "not proven optimal (greedy, " in line
    code, line = _headline(graph_file, "--planner", "greedy", "--budget", 1000)
    assert code == 0 and line.startswith("over budget: peak ") and ", above the 1000 B budget, " in line
    assert "the best plan found (greedy, " in line
    code, line = _headline(graph_file, "--planner", "no-remat")
    assert line.startswith(f"peak {human_bytes(no_remat_peak(g))} -> {human_bytes(no_remat_peak(g))} (0%), "
                           "no recompute, not proven optimal (no-remat, ")


def test_solve_headline_gives_the_gap_of_a_feasible_plan(graph_file, monkeypatch):
    """A FEASIBLE plan with a bound says how far from optimal it may be (the
    planner is the no-remat plan claiming a 25% gap, so the figures are exact)."""
    from dataclasses import replace

    from rematopt import planners
    from rematopt.planners import no_remat

    def with_gap(graph, budget, options):
        plan = no_remat.plan(graph, budget, options)
        plan.stats = replace(plan.stats, status="FEASIBLE", gap=0.25)
        return plan

    monkeypatch.setattr(planners, "get", lambda name: with_gap)
    code, line = _headline(graph_file, "--planner", "no-remat")
    assert code == 0 and line.endswith(" s") and ", no recompute, within 25% of optimal in " in line


def test_solve_headline_says_plainly_when_there_is_no_plan(tmp_path):
    from rematopt import Graph, Node

    # as in test_fuzz's INFEASIBLE case: a is not recomputable and d reads it
    g = Graph("inf", [Node(0, "x", kind="input", bytes=0), Node(1, "a", bytes=4, cost=1, recomputable=False),
                      Node(2, "b", bytes=8, cost=1), Node(3, "c", bytes=4, cost=1),
                      Node(4, "d", bytes=4, cost=1, output=True)],
              [(0, 1), (1, 2), (2, 3), (3, 4), (1, 4)])
    f = tmp_path / "g.json"
    g.save(f)
    code, line = _headline(f, "--budget", 12, "--time-limit", 20, "--workers", 1)
    assert code == 3 and line.startswith("no plan fits the 12 B budget: ") and "(INFEASIBLE, cpsat, " in line
    code, line = _headline("--budget-ratio", 0.8, "--time-limit", 0)
    assert code == 3 and line.startswith("no plan fits the ") and "(UNKNOWN, cpsat, " in line
