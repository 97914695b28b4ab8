"""Peak mode's bisection (``cpsat.peak``) against exhaustive search: from
the no-remat plan and the working-set bound alone (the usual rounds are
replaced by that), the probes must reach the staged optimum on tiny graphs,
with and without the overhead cap and offload, and no bound they prove may
pass it. Every plan is replayed by :func:`rematopt.solve`."""

from __future__ import annotations

import math

import pytest

from rematopt import simulate, solve
from rematopt.planners.cpsat import run
from rematopt.planners.staged.bounds import BOUNDS
from rematopt.reference import no_remat_plan
from rematopt.stats import Stats

from brute_force import min_peak
from cpsat_cases import FAST, cases, staged_status


@pytest.fixture
def weak_rounds(monkeypatch):
    """Peak rounds that find only the no-remat plan and prove nothing: the
    bisection does all the work (its overhead searches run as they are)."""
    overhead_rounds = run._run

    def rounds(ctx):
        if ctx.cfg.objective == "overhead":
            return overhead_rounds(ctx)
        p = no_remat_plan(ctx.graph)
        r = simulate(ctx.graph, p)
        p.stats = Stats(status="FEASIBLE", objective=r.peak_bytes, peak_bytes=r.peak_bytes,
                        compute_cost=r.compute_cost, transfer_bytes=r.transfer_bytes)
        return p

    monkeypatch.setattr(run, "_run", rounds)


def check(g, expect, sol, proven: bool = True) -> None:
    """The bisection's claims against the exhaustive optimum ``expect`` (peak
    bytes) of the staged space. Only a fast planner's plan (``plan_from``;
    greedy may compute out of program order) may peak lower."""
    st = sol.plan.stats
    assert st["best_bound"] <= expect
    assert sol.replay.peak_bytes >= expect or st.get("plan_from")
    for p in st["peak_probes"]:
        assert p["bound_bytes"] is None or p["bound_bytes"] <= expect, p
        assert p["verdict"] != "no" or p["cap_bytes"] < expect, p
        if p["verdict"] == "yes":
            assert p["peak_bytes"] <= p["cap_bytes"], p
            assert p["peak_bytes"] >= expect or p["by"].endswith("'s plan"), p
    if proven:
        assert staged_status(sol) == "OPTIMAL", st["peak_probes"]
        assert sol.replay.peak_bytes == expect or (st.get("plan_from") and sol.replay.peak_bytes < expect)
        assert st["bound_by"] in ("working set", "pinned values", "model", *BOUNDS)


@pytest.mark.parametrize("n,count", [(4, 12), (5, 12), (6, 5)])
def test_bisection_reaches_the_exhaustive_peak(weak_rounds, n, count):
    seen = 0
    for g, rng in cases(n, every=False, count=count, seed=90 + n):
        cap = rng.choice([None, 0, 3])
        base = sum(g.cost[i] for i in g.compute_ids)
        opts = dict(FAST, objective="peak", time_limit=10)
        if cap is not None:
            if base == 0:
                continue
            opts["max_overhead"] = cap / base
        expect = min_peak(g, cost_cap=cap)
        sol = solve(g, "cpsat", **opts)
        check(g, expect[0], sol)
        seen += bool(sol.plan.stats["peak_probes"])
    assert seen >= count // 2  # the no-remat plan is rarely optimal here


def test_bisection_with_offload_reaches_the_exhaustive_peak(weak_rounds):
    for g, rng in cases(4, every=False, count=8, seed=77):
        base = sum(g.cost[i] for i in g.compute_ids)
        if base == 0:
            continue
        expect = min_peak(g, offload=True, transfer_per_byte=1, cost_cap=4)
        sol = solve(g, "cpsat", objective="peak", offload=True, transfer_cost_per_byte=1, max_overhead=4 / base,
                    **dict(FAST, time_limit=10))
        check(g, expect[0], sol)


def test_bisection_out_of_time_never_bounds_above_the_optimum(weak_rounds):
    """With almost no time, probes end undecided or decided by the
    relaxations alone: whatever they prove stays at or below the optimum."""
    for g, rng in cases(6, every=False, count=6, seed=123):
        expect = min_peak(g)
        sol = solve(g, "cpsat", objective="peak", **dict(FAST, time_limit=0.3))
        check(g, expect[0], sol, proven=False)


def test_pareto_curve_points_are_the_exhaustive_peaks_at_their_caps(tmp_path):
    """Each cpsat point of ``rematopt pareto`` is the staged optimum under its
    cap (or a fast planner's plan below it), the curve falls as the cap
    rises, and the CSV and figure are written."""
    from click.testing import CliRunner

    from rematopt.cli import cli
    from rematopt.importers import synthetic
    from rematopt.studies.pareto import curve

    g = synthetic.linear_training(4)
    base = sum(g.cost[i] for i in g.compute_ids)
    points = curve(g, 4, time_limit=5, workers=1)
    assert len(points) == 4 and points[-1].max_overhead is None
    for p in points:
        expect = min_peak(g, cost_cap=None if p.max_overhead is None else p.max_overhead * base + 1e-9)[0]
        assert p.optimal_in in ("all plans", "staged space") and p.bound_bytes <= expect
        assert p.peak_bytes == expect or p.peak_bytes < expect  # below: a plan outside the staged space
        assert p.overhead <= (p.max_overhead if p.max_overhead is not None else math.inf) + 1e-12
    peaks = [p.peak_bytes for p in points]
    assert peaks == sorted(peaks, reverse=True) and peaks[0] > peaks[-1]
    out = CliRunner().invoke(cli, ["pareto", str(_saved(g, tmp_path)), "--points", "3", "--time-limit", "5",
                                   "--workers", "1", "--out", str(tmp_path / "curve")])
    assert out.exit_code == 0, out.output
    assert (tmp_path / "curve" / "pareto_curve.png").stat().st_size > 0
    rows = (tmp_path / "curve" / "pareto_curve.csv").read_text().splitlines()
    assert rows[0].startswith("graph,planner,peak_bytes") and sum(",cpsat," in r for r in rows) == 3


def _saved(g, folder):
    path = folder / "g.json"
    g.save(path)
    return path


def test_bench_peak_table_reports_status_bound_and_what_proved_it(tmp_path):
    from rich.console import Console

    from rematopt.studies.bench import peak_table
    from rematopt.importers import synthetic

    synthetic.linear_training(4).save(tmp_path / "lt4.json")
    console = Console(width=200, record=True)
    console.print(peak_table(caps=(None, 0.0), time_limit=5, workers=1, folders=[tmp_path]))
    text = console.export_text()
    rows = [line for line in text.splitlines() if "linear_train" in line]
    assert len(rows) == 2 and all("OPTIMAL" in r or "FEASIBLE (optimal in staged space)" in r for r in rows)
    assert "none" in rows[0] and "0%" in rows[1]
