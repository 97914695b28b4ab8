"""rematopt report: gaps against hand-computed references, tables, figures
(skipped gracefully when their data is missing) and a self-contained HTML."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys

import pandas as pd
import pytest

from rematopt.studies import report
from rematopt.studies.batch import RESULTS, ResultsLog
from rematopt.errors import RematoptError
from rematopt.studies.figures import pareto_front, read_solver_log, solver_progress, with_final_point

pytest.importorskip("matplotlib")


def row(graph, planner, status, cost, peak, base, bound=None, budget=100, ratio=0.8, log_path=None, **kw):
    sha = graph  # one file per graph name here
    return {"key": f"{graph}-{planner}-{ratio}", "graph": graph, "family": graph.split("_")[0],
            "graph_sha256": sha, "nodes": kw.pop("nodes", 10), "budget": budget, "budget_ratio": ratio,
            "planner": planner, "options": json.dumps(kw.pop("options", {})), "status": status,
            "peak_bytes": peak, "compute_cost": cost, "base_cost": base,
            "overhead": None if cost is None else (cost - base) / base, "transfer_bytes": kw.pop("transfer", 0),
            "bound": bound, "gap": None, "wall_s": kw.pop("wall_s", 1.0), "no_remat_peak_bytes": 125,
            "working_set_bound_bytes": 50, "log_path": log_path, "rematopt_version": "0.1.0",
            "ortools_version": "9.15", **kw}


@pytest.fixture
def results(tmp_path):
    """Three (graph, budget) instances with references worked out by hand:
    a: cpsat proves 110 optimal in its staged space -> greedy 121 is 10% off,
       dtr misses the budget;
    b: cpsat finds 230 with bound 20 over base 200 -> reference 220: greedy 264
       is 20% off, dtr 231 is 5% off; c: no exact run -> base cost 100 is the
       reference, greedy 150 is 50% off."""
    d = tmp_path / "res"
    d.mkdir()
    (d / "logs").mkdir()
    (d / "logs" / "b.csv").write_text("phase,elapsed_s,incumbent,bound\nprimary,0.5,40,5\nprimary,1.0,,12\n"
                                     "primary,2.0,30,20\nsecondary,2.5,99,99\n")
    log = ResultsLog(d / RESULTS)
    for r in [row("fam_n10", "cpsat", "FEASIBLE", 110, 100, 100, bound=10, log_path="logs/missing.csv",
                  optimal_in="staged space"),
              row("fam_n10", "greedy", "FEASIBLE", 121, 90, 100),
              row("fam_n10", "dtr", "OVER_BUDGET", 100, 120, 100),
              row("other_b4", "cpsat", "FEASIBLE", 230, 100, 200, bound=20, log_path="logs/b.csv", wall_s=30.0),
              row("other_b4", "greedy", "FEASIBLE", 264, 99, 200),
              row("other_b4", "dtr", "FEASIBLE", 231, 80, 200),
              row("third_d3", "greedy", "FEASIBLE", 150, 100, 100),
              row("third_d3", "dtr", "CRASH", None, None, 100, error="worker killed by SIGKILL")]:
        log.append(r)
    return d


def test_gaps_against_the_optimum_or_the_best_bound(results):
    df = report.load_results(results)
    gap = {(r.graph, r.planner): r.gap_to_ref for r in df.itertuples()}
    assert gap["fam_n10", "greedy"] == pytest.approx(0.10)
    assert gap["other_b4", "greedy"] == pytest.approx(0.20)
    assert gap["other_b4", "dtr"] == pytest.approx(0.05)
    assert gap["third_d3", "greedy"] == pytest.approx(0.50)
    assert math.isnan(gap["fam_n10", "dtr"]) and math.isnan(gap["third_d3", "dtr"])  # no plan within budget
    kinds = {(r.graph, r.planner): r.ref_kind for r in df.itertuples()}
    assert kinds["fam_n10", "greedy"] == "optimum" and kinds["other_b4", "greedy"] == "bound"

    t = report.gap_table(df).set_index(["planner", "family"])
    assert t.loc[("greedy", "(all)"), "median gap %"] == pytest.approx(20.0)
    assert t.loc[("greedy", "(all)"), "worst gap %"] == pytest.approx(50.0)
    assert t.loc[("greedy", "(all)"), "vs optimum"] == 1
    assert t.loc[("dtr", "fam"), "within budget"] == 0 and math.isnan(t.loc[("dtr", "fam"), "median gap %"])
    assert "cpsat" not in t.index.get_level_values("planner")


def test_an_optimal_row_from_before_optimal_in_reads_as_the_staged_space(results):
    """Rows written before ``optimal_in`` existed said OPTIMAL of the staged
    space; a row of now says OPTIMAL only with ``optimal_in`` "all plans"."""
    log = ResultsLog(results / RESULTS)
    log.append(row("third_d3", "cpsat", "OPTIMAL", 120, 100, 100, bound=20))
    log.append(row("fam_n10", "cpsat", "OPTIMAL", 100, 100, 100, bound=0, optimal_in="all plans", key="fam-again"))
    df = report.load_results(results).set_index("key")
    assert df.loc["third_d3-cpsat-0.8", "optimal_in"] == "staged space"
    assert df.loc["fam-again", "optimal_in"] == "all plans" and df.loc["fam_n10-cpsat-0.8", "optimal_in"] == "staged space"


def test_exact_infeasible_beside_a_plan_within_budget_is_flagged(results):
    log = ResultsLog(results / RESULTS)
    log.append(row("third_d3", "cpsat", "INFEASIBLE", None, None, 100))
    df = report.load_results(results)
    odd = report.model_infeasible(df)
    assert odd[["graph", "met_by"]].values.tolist() == [["third_d3", "greedy"]]
    assert any("INFEASIBLE on 1 " in line and "third_d3 r=0.8" in line for line in report.summary_lines(df))


def test_a_heuristic_beating_the_exact_optimum_is_flagged(results):
    ResultsLog(results / RESULTS).append(row("fam_n10", "dtr", "FEASIBLE", 99, 100, 100, key="fam-dtr-again"))
    df = report.load_results(results)
    assert df.loc[df["key"] == "fam-dtr-again", "gap_to_ref"].item() == pytest.approx(-0.1)
    assert any("1 heuristic plans beat" in line and "dtr on fam_n10 r=0.8 (-10.000%)" in line
               for line in report.summary_lines(df))


def test_priced_transfers_count_in_the_gap(tmp_path):
    d = tmp_path / "res"
    d.mkdir()
    log = ResultsLog(d / RESULTS)
    opts = {"transfer_cost_per_byte": 0.5}
    log.append(row("g", "cpsat", "OPTIMAL", 100, 90, 100, bound=4, transfer=8, options=opts))  # total 104
    log.append(row("g", "greedy", "FEASIBLE", 130, 90, 100, options=opts))
    df = report.load_results(d).set_index("planner")
    assert df.loc["greedy", "gap_to_ref"] == pytest.approx(26 / 104)


def test_tables_figures_and_a_self_contained_index(results, tmp_path):
    out = tmp_path / "rep"
    setup = "rematopt import jax models.gpt:factory --set layers=48 -o g/gpt48.json"
    index = report.write_report(results, out, title="t", command="rematopt report res -o rep", setup=[setup])
    md = index.read_text()
    made = md.split("## How it was made")[1].split("```")[1].splitlines()
    assert made[1] == setup and made[-1] == "rematopt report res -o rep"  # inputs first, the report last
    for name in ("status_counts", "gaps", "exact", "budgets"):
        assert (out / f"{name}.csv").exists() and f"({name}.md)" in md
    for png in ("pareto.png", "gaps.png", "exact_time.png", "solver_progress.png"):
        assert (out / png).stat().st_size > 1000 and f"]({png})" in md
    assert "rematopt report res -o rep" in md
    assert len(pd.read_csv(results / "results.csv")) == 8  # derived from results.jsonl at report time
    html = (out / "index.html").read_text()
    assert html.count("data:image/png;base64,") == 4
    assert not re.search(r'src="(?!data:)', html)  # nothing outside the file
    budgets = pd.read_csv(out / "budgets.md", sep="|", skipinitialspace=True).iloc[1:]
    cells = dict(zip(budgets.iloc[:, 1].str.strip(), budgets.iloc[:, 3].str.strip()))  # graph -> cpsat overhead
    assert cells["fam_n10"] == "10.00% s*" and cells["other_b4"] == "15.00%"
    status = pd.read_csv(out / "status_counts.csv").set_index("planner")
    assert status.loc["dtr", "CRASH"] == 1 and status.loc["greedy", "FEASIBLE"] == 3


def test_progress_figure_is_skipped_without_readable_logs(results, tmp_path):
    df = report.load_results(results)
    assert solver_progress(df.assign(log_path=None), results, tmp_path) is None
    assert solver_progress(df.assign(log_path="logs/missing.csv"), results, tmp_path) is None
    assert not (tmp_path / "solver_progress.png").exists()
    assert solver_progress(df, results, tmp_path)["file"] == "solver_progress.png"


def test_solver_log_keeps_the_primary_phase_and_carries_the_incumbent(results, tmp_path):
    log = read_solver_log(results / "logs" / "b.csv")
    assert log["time"].tolist() == [0.5, 1.0, 2.0]
    assert log["incumbent"].tolist() == [40, 40, 30] and log["bound"].tolist() == [5, 12, 20]
    # An optimality proof fires no bound event: the row's objective and bound end the trace.
    done = with_final_point(log, pd.Series({"bound": 22.0, "stats": json.dumps({"objective": 25, "primary_s": 3})}))
    assert done.iloc[-1].tolist() == [3.0, 25.0, 22.0] and len(done) == 4
    (tmp_path / "odd.csv").write_text("a,b\n1,2\n")
    assert read_solver_log(tmp_path / "odd.csv") is None
    assert read_solver_log(tmp_path / "absent.csv") is None


def test_pareto_front_keeps_only_non_dominated_points():
    pts = [(1, 5), (2, 3), (2, 4), (3, 3), (0.5, 9), (4, 1)]
    assert pareto_front(pts) == [(0.5, 9), (1, 5), (2, 3), (4, 1)]


def test_no_results_is_one_line_and_exit_2(tmp_path):
    with pytest.raises(RematoptError, match="no results"):
        report.load_results(tmp_path)
    done = subprocess.run([sys.executable, "-m", "rematopt", "report", str(tmp_path), "-o", str(tmp_path / "r")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "no results" in done.stderr and "Traceback" not in done.stderr
