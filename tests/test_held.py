"""``python -m rematopt.studies.held``: one plan's applied step beside XLA's compiled one, kernel by
kernel (which backward kernels XLA moved out of the plan's order, what each holds at XLA's peak), run
as the study runs, in a fresh process under the memory-minimizing scheduler."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("jax")

from rematopt.studies.held import _in_order  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def held(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rematopt.studies.held", *args], cwd=ROOT, capture_output=True,
                          text=True)


def test_the_fewest_moved_kernels_are_the_complement_of_a_longest_ordered_run():
    assert _in_order([0, 1, 5, 2, 3, 4]) == {0, 1, 3, 4, 5}  # the 5 ran early
    assert _in_order([3, 0, 1, 2]) == {1, 2, 3}
    assert _in_order([0, 2, 2, 3]) == {0, 1, 2, 3}  # a node computed in two kernels keeps its place
    assert _in_order([]) == set()


def test_a_plan_on_mlp_set_beside_xla():
    run = held("mlp", "greedy", "0.6", "--json")
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    assert out["xla_peak"] > 0 and abs(out["predicted"] / out["xla_peak"] - 1) <= 0.05, out  # the first round's
    assert out["peak_position"] is not None and 0 < out["applied_there"] <= out["predicted"]
    assert all(r["xla"] != r["applied"] for r in out["nodes"]) and out["nodes"]
    positions = [r["plan_position"] for r in out["out_of_order"]]
    assert all(isinstance(k, int) and k >= 0 for k in positions)


def test_bad_input_is_one_line_and_status_2():
    for args in (["nosuch", "greedy", "0.6"], ["mlp"], ["mlp", "greedy", "half"]):
        run = held(*args)
        assert run.returncode == 2 and len(run.stderr.strip().splitlines()) == 1, run.stderr
