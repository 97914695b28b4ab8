"""rematopt batch --verify xla: JAX factories as inputs, each (factory, ratio,
planner) job running the closed loop in a worker; rows say whether the
compiled step fits, the figures every job of a factory shares are compiled
once, resume skips the done jobs, a factory that fails is a row, and bad
specs end in one line and exit 2. Through the real CLI, from the checkout
(models/ is imported), on a tiny MLP whose activations outweigh its
parameters: measured, 0.9 of its compiled plain step fits and 0.4 does not."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("jax")

from rematopt.importers import load as load_graph  # noqa: E402
from rematopt.plan import Plan  # noqa: E402
from rematopt.simulate import simulate  # noqa: E402
from rematopt.studies.batch import read_rows  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--set", "layers=3", "--set", "width=32", "--set", "in_dim=32", "--set", "batch=256"]
LIMIT = "120"  # seconds per loop: enough that rounds end by their count or the bracket, not by the clock


def rematopt(*args, env=None):
    return subprocess.run([sys.executable, "-m", "rematopt", *map(str, args)], capture_output=True, text=True,
                          cwd=ROOT, timeout=300, env=env)


def verified_batch(out, *extra, ratios="0.9,0.4"):
    return rematopt("batch", "models.mlp:factory", *TINY, "--verify", "xla", "--planners", "greedy",
                    "--budget-ratios", ratios, "--time-limit", LIMIT, "--out", out, *extra)


def test_rows_say_whether_the_compiled_step_fits_and_resume_skips_done_jobs(tmp_path):
    out = tmp_path / "res"
    run = verified_batch(out)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "2 jobs to run" in " ".join(run.stderr.split()) and "FEASIBLE 1, OVER_BUDGET 1" in run.stdout
    rows = read_rows(out)
    assert sorted(r["budget_ratio"] for r in rows) == [0.4, 0.9]
    (prepared,) = (out / "factories").glob("*/prepared.json")
    shared = json.loads(prepared.read_text())
    for r in rows:
        assert r["verify"] == "xla" and r["graph_file"] == "models.mlp:factory"
        assert r["budget"] == r["budget_bytes"] == int(r["budget_ratio"] * r["xla_plain_peak_bytes"])
        assert r["fits"] == (r["xla_peak_bytes"] <= r["budget"])
        assert r["status"] == ("FEASIBLE" if r["fits"] else "OVER_BUDGET")
        assert r["peak_bytes"] == r["xla_peak_bytes"] and r["no_remat_peak_bytes"] == r["xla_plain_peak_bytes"]
        assert json.loads(r["xla_settings"])["cpu_scheduler"] == "memory-minimizing"
        candidates = json.loads(r["candidates"])
        assert all(c["fits"] == (c["xla_peak_bytes"] <= r["budget"]) for c in candidates)
        assert r["fits"] == any(c["fits"] for c in candidates)  # fits whenever any candidate does
        # the plain step and the stock policies: the factory's shared compiles, not the job's own, priced as the
        # loop prices its plans, so a fitting answer is chosen by priced time, as solve --verify xla chooses it
        assert all(c["priced_s"] > 0 for c in candidates)
        assert r["chosen_by"] == ("priced time" if r["fits"] else "compiled peak")
        assert r["xla_plain_peak_bytes"] == shared["known"]["plain"]["peak_bytes"]
        stock = {c["label"]: c["xla_peak_bytes"] for c in candidates if c["kind"] == "policy"}
        assert {k: v["peak_bytes"] for k, v in shared["known"].items() if k != "plain"}.items() <= stock.items()
        if r["plan_path"]:  # the chosen plan, replayed on the graph it was made for
            graph = load_graph(prepared.parent / shared["graph"])
            replay = simulate(graph, Plan.load(out / r["plan_path"]))
            assert replay.valid and replay.peak_bytes == r["plan_peak_bytes"]
    assert {r["fits"] for r in rows} == {True, False}

    # a job's row says what solve --verify xla --json says of the same step, ratio and planner
    solved = rematopt("solve", "models.mlp:factory", *TINY, "--verify", "xla", "--budget-ratio", "0.9", "-p", "greedy",
                      "--time-limit", LIMIT, "--json")
    assert solved.returncode == 0, solved.stderr[-2000:]
    alone = json.loads(solved.stdout)
    (row,) = [r for r in rows if r["budget_ratio"] == 0.9]
    for k in ("fits", "chosen", "chosen_by", "xla_peak_bytes", "predicted_peak_bytes", "budget_bytes",
              "xla_plain_peak_bytes", "planning_budget_bytes", "order", "rounds"):
        assert row[k] == alone[k], k

    again = verified_batch(out, "--resume")
    assert again.returncode == 0, again.stderr[-2000:]
    said = " ".join(again.stderr.split())  # rich wraps lines at the terminal's width
    assert "0 jobs to run" in said and "2 already done" in said and "no new rows" in again.stdout
    assert "compiled once" in run.stderr and "compiled once" not in again.stderr  # the shared figures are kept
    assert read_rows(out) == rows

    report = rematopt("report", out, "-o", tmp_path / "rep")
    assert report.returncode == 0, report.stderr[-2000:]
    table = (tmp_path / "rep" / "verified.md").read_text()
    assert table.count("| mlp ") == 2 and "ran with --verify xla" in (tmp_path / "rep" / "index.md").read_text()


CRASHING = """
import os

def factory(**config):
    os.abort()  # as a factory that takes the interpreter down would
"""


def test_a_factory_that_crashes_is_a_row_per_job_and_resume_runs_them_again(tmp_path):
    (tmp_path / "crashing_model.py").write_text(CRASHING)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    out = tmp_path / "res"
    args = ("batch", "crashing_model:factory", "--verify", "xla", "--planners", "greedy", "--budget-ratios", "0.8,0.6",
            "--time-limit", "10", "--out", out)
    run = rematopt(*args, env=env)
    assert run.returncode == 0, run.stderr[-2000:]
    rows = read_rows(out)
    assert len(rows) == 2 and all(r["status"] == "CRASH" and "preparing crashing_model:factory" in r["error"]
                                  for r in rows)
    again = rematopt(*args, "--resume", env=env)
    assert "2 jobs to run (2 of them again)" in " ".join(again.stderr.split())


HANGING = """
import os, time

def factory(**config):
    with open(os.environ["HANG_PID_FILE"], "w") as f:
        f.write(str(os.getpid()))
    time.sleep(120)
"""


def test_ctrl_c_while_a_factory_is_prepared_ends_its_worker_and_writes_no_row(tmp_path):
    (tmp_path / "hanging_model.py").write_text(HANGING)
    pid_file = tmp_path / "pid"
    env = dict(os.environ, HANG_PID_FILE=str(pid_file),
               PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    out = tmp_path / "res"
    proc = subprocess.Popen([sys.executable, "-m", "rematopt", "batch", "hanging_model:factory", "--verify", "xla",
                             "--planners", "greedy", "--budget-ratios", "0.8", "--out", str(out)],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # Ctrl-C raises there
    deadline = time.monotonic() + 120
    while not pid_file.exists() or not pid_file.read_text():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.2)
    worker = int(pid_file.read_text())
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "interrupted" in err
    with pytest.raises(ProcessLookupError):  # the worker went with the batch
        for _ in range(50):
            os.kill(worker, 0)
            time.sleep(0.1)
    assert not read_rows(out) and not list((out / "factories").glob("*/prepared.json"))


def test_deterministic_time_goes_to_each_jobs_loop(tmp_path):
    """--deterministic-time D is each job's loop's (solve --verify xla's): its
    rounds take their shares of D on one cpsat worker, and the row says
    which limit ended the loop and that it is the deterministic run."""
    out = tmp_path / "res"
    run = rematopt("batch", "models.mlp:factory", "--set", "layers=1", "--set", "width=32", "--set", "in_dim=16",
                   "--set", "batch=8", "--verify", "xla", "--planners", "cpsat", "--budget-ratios", "0.9",
                   "--time-limit", LIMIT, "--deterministic-time", "0.1", "--out", out)
    assert run.returncode == 0, run.stderr[-2000:]
    (row,) = read_rows(out)
    assert json.loads(row["options"])["deterministic_time"] == 0.1
    assert row["deterministic"] is True and row["stopped_by"] != "time_limit"
    rounds = json.loads(row["planning_rounds"])
    assert len(rounds) == row["rounds"] >= 1 and all(0 < r["limit_s"] <= 0.1 for r in rounds)
    assert row["deterministic_spent"] == pytest.approx(sum(r["deterministic_spent"] for r in rounds), abs=1e-3)


@pytest.mark.parametrize("args, problem", [
    (["models.nosuch:factory", "--verify", "xla"], "models.nosuch:factory: cannot import models.nosuch"),
    (["models.mlp:nofactory", "--verify", "xla"], "models.mlp:nofactory: models.mlp has no callable nofactory"),
    (["models.mlp:factory", "--verify", "xla", "--set", "nosuch=1"], "models.mlp:factory: calling the factory failed"),
    (["models.mlp:factory", "--verify", "xla", "--set", "layers"], "expected KEY=VALUE"),
    (["models.mlp:factory"], "models.mlp:factory: a JAX MODULE:FACTORY input goes with --verify xla"),
    (["models/mlp.py", "--verify", "xla"], "models/mlp.py: --verify xla takes JAX MODULE:FACTORY inputs"),
    (["models.mlp:factory", "--verify", "xla", "--deterministic-time", "-1"],
     "--deterministic-time must be a finite number >= 0, got -1"),
])
def test_bad_specs_end_in_one_line_and_exit_2(tmp_path, args, problem):
    run = rematopt("batch", *args, "--planners", "greedy", "--budget-ratios", "0.5", "--out", tmp_path / "o")
    assert run.returncode == 2, run.stderr[-2000:]
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and problem in lines[0], run.stderr
    assert not read_rows(tmp_path / "o")
