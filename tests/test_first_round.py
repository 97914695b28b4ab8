"""``python -m rematopt.studies.first_round``: cpsat is limited by CP-SAT's deterministic time unless
the wall clock is asked for, so the study's table is the same on any load."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("jax")

from rematopt.studies.first_round import CPSAT_DETERMINISTIC_S, CPSAT_SECONDS, CPSAT_WALL_S, arguments, cpsat_limits  # noqa: E402,E501

ROOT = Path(__file__).resolve().parents[1]


def test_cpsat_runs_on_the_deterministic_clock_by_default_and_on_the_wall_clock_when_asked():
    chosen, names = arguments(["planners=cpsat", "gpt_scan"])
    assert names == ["gpt_scan"] and chosen["planners"] == ("cpsat",)
    assert cpsat_limits(chosen["deterministic_time"], chosen["time_limit"]) == {
        "deterministic_time": CPSAT_DETERMINISTIC_S, "time_limit": CPSAT_WALL_S, "workers": 1}
    chosen, _ = arguments(["deterministic_time=wall", "time_limit=3"])
    assert cpsat_limits(chosen["deterministic_time"], chosen["time_limit"]) == {"time_limit": 3.0, "workers": 1}
    assert cpsat_limits(None) == {"time_limit": CPSAT_SECONDS, "workers": 1}
    chosen, names = arguments(["deterministic_time=0.5", "ratios=0.8"])
    assert chosen["deterministic_time"] == 0.5 and chosen["ratios"] == (0.8,) and "gpt_scan" in names


def test_a_row_records_the_deterministic_time_its_plan_spent(tmp_path):
    out = tmp_path / "rows.jsonl"  # the study as run: a fresh process, XLA's scheduler set before it starts
    subprocess.run([sys.executable, "-m", "rematopt.studies.first_round", str(out), "planners=cpsat", "ratios=0.8",
                    "deterministic_time=0.5", "mlp"], check=True, cwd=ROOT, capture_output=True)
    rec, = [json.loads(line) for line in out.read_text().splitlines()]
    assert rec["xla"] > 0 and rec["plan_peak"] > 0, rec
    assert rec["stopped_by"] in (None, "deterministic_time") and 0 <= rec["deterministic_spent"] <= 0.5 + 1e-9
