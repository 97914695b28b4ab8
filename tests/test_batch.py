"""rematopt batch: rows replayed and durable, failures recorded, resume, hints,
the dask executor and the CLI. Jobs run in real worker processes; the planners
that fail are fakes from a module written into tmp_path (put on PYTHONPATH so
the workers can import it), so nothing depends on which planners exist."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from rematopt import Plan, no_remat_peak, planners, simulate
from rematopt.studies import batch
from rematopt.errors import BudgetError, GraphError, PlannerError, RematoptError
from rematopt.importers import load as load_graph
from rematopt.importers.synthetic import chain, random_layered, unet

FAKES = '''
import dataclasses, os, signal, time
from rematopt.plan import Plan
from rematopt.planners.no_remat import plan as no_remat
from rematopt.planners.options import NoOptions as Options
from rematopt.stats import Stats

def crash(graph, budget, options):
    os.abort()

def hang(graph, budget, options):
    if os.environ.get("FAKE_PID_FILE"):
        with open(os.environ["FAKE_PID_FILE"], "a") as f:
            f.write(str(os.getpid()) + " ")
    time.sleep(120)

def hog(graph, budget, options):
    return bytearray(8 << 30)

def broken(graph, budget, options):
    raise ValueError("bad model")

def liar(graph, budget, options):
    p = no_remat(graph, budget, options)
    p.stats = dataclasses.replace(p.stats, peak_bytes=p.stats.peak_bytes - 1)
    return p

def patient(graph, budget, options):
    """Searches until SIGINT, then returns its best plan (as cpsat does)."""
    stop = []
    signal.signal(signal.SIGINT, lambda *a: stop.append(1))
    while not stop:
        time.sleep(0.05)
    return no_remat(graph, budget, options)

def quitter(graph, budget, options):
    """Searches until SIGINT, then gives up without a plan (cpsat's UNKNOWN)."""
    stop = []
    signal.signal(signal.SIGINT, lambda *a: stop.append(1))
    while not stop:
        time.sleep(0.05)
    return Plan(graph.name, "quitter", [], [], Stats(status="UNKNOWN"))

def fragile(graph, budget, options):
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # dies of the SIGINT instead of raising
    time.sleep(120)

def stubborn(graph, budget, options):
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    time.sleep(120)

def echo_hint(graph, budget, options):
    """An 'exact' planner that reports the hint it was given."""
    p = no_remat(graph, budget, options)
    hint = options.get("hint")
    p.stats = p.stats.with_details(hint_planner=hint.planner if hint is not None else None,
                                   hint_events=len(hint) if hint is not None else 0)
    with open(options["log_path"], "w") as f:
        f.write("phase,elapsed_s,incumbent,bound" + chr(10) + "primary,0.1,5,1" + chr(10))
    return p
'''


@pytest.fixture
def fakes(tmp_path, monkeypatch):
    """Register the fake planners here and make them importable in workers."""
    (tmp_path / "fakeplanners.py").write_text(textwrap.dedent(FAKES))
    monkeypatch.syspath_prepend(str(tmp_path))
    # Workers import rematopt as this process does (PYTHONPATH may point at a worktree's src).
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])))
    for name in ("crash", "hang", "hog", "broken", "liar", "patient", "quitter", "stubborn", "fragile",
                 "echo_hint"):
        monkeypatch.setitem(planners.REGISTRY, f"fake-{name}", f"fakeplanners:{name}")
    return tmp_path


@pytest.fixture
def graph_dir(tmp_path):
    d = tmp_path / "graphs"
    (d / "sub").mkdir(parents=True)
    chain(6, sinks=True).save(d / "chain6.json")
    random_layered(24, seed=1).save(d / "sub" / "random_layered_n24.json")
    (d / "sub" / "notes.json").write_text('{"not": "a graph"}')
    return d


def run(paths, names, ratios, out, **kw):
    inputs, skipped = batch.load_inputs(paths)
    plan_kw = {k: kw.pop(k) for k in ("options", "resume", "memory_limit", "timeout_margin", "exact_max_nodes")
               if k in kw}
    bp = batch.plan_batch(inputs, names, ratios, out, **plan_kw)
    return batch.run_batch(bp, out, **kw), skipped


def test_rows_hold_the_replay_of_saved_plans_and_resume_skips_them(graph_dir, tmp_path):
    out = tmp_path / "res"
    rows, skipped = run([graph_dir], ["no-remat"], [1.0, 0.9, 0.01], out, jobs=2)
    assert [p.name for p, _ in skipped] == ["notes.json"]
    assert len(rows) == 6 and len(batch.read_rows(out)) == 6
    for row in rows:  # a heuristic takes any budget: below the lower bound too (OVER_BUDGET)
        g = load_graph(row["graph_file"])
        assert row["budget"] == int(row["budget_ratio"] * no_remat_peak(g))
        replay = simulate(g, Plan.load(out / row["plan_path"]))
        assert replay.valid and row["has_plan"] is True
        assert row["status"] == ("FEASIBLE" if row["budget_ratio"] == 1.0 else "OVER_BUDGET")
        assert (row["peak_bytes"], row["compute_cost"], row["transfer_bytes"]) == (
            replay.peak_bytes, replay.compute_cost, replay.transfer_bytes)
        assert row["rematopt_version"] and row["ortools_version"] and row["error"] is None
    csv = (out / "results.csv").read_text().splitlines()
    assert len(csv) == 7 and "budget_ratio" in csv[0]
    # the exact planner would prove such a budget impossible: not run
    inputs, _ = batch.load_inputs([graph_dir])
    exact = batch.plan_batch(inputs, ["cpsat"], [0.01], tmp_path / "exact")
    assert not exact.specs and [r["status"] for r in exact.skipped] == ["INFEASIBLE_BUDGET"] * 2
    assert all("below the lower bound" in r["error"] for r in exact.skipped)

    with pytest.raises(RematoptError, match="--resume"):
        run([graph_dir], ["no-remat"], [1.0], out)
    inputs, _ = batch.load_inputs([graph_dir])
    again = batch.plan_batch(inputs, ["no-remat"], [1.0, 0.9, 0.01, 0.95], out, resume=True)
    assert [s["budget_ratio"] for s in again.specs] == [0.95, 0.95]  # only the new budget runs
    changed = batch.plan_batch(inputs, ["no-remat"], [1.0], out, options={"time_limit": 5}, resume=True)
    assert len(changed.specs) == 2  # other options, other jobs


def test_failures_become_rows_and_never_stop_the_batch(fakes, tmp_path, monkeypatch):
    path = tmp_path / "unet.json"
    unet(2, train=True).save(path)
    monkeypatch.setattr(batch, "STOP_GRACE_S", 1.0)
    names = ["fake-crash", "fake-hang", "fake-patient", "fake-quitter", "fake-stubborn", "fake-fragile", "fake-hog",
             "fake-broken", "fake-liar", "no-remat"]
    rows, _ = run([path], names, [1.0], tmp_path / "res", jobs=4, options={"time_limit": 0.1},
                  timeout_margin=6, memory_limit=1 << 30)  # the workers mostly sleep: 4 at once is light
    status = {r["planner"]: (r["status"], r["error"]) for r in rows}
    assert status["no-remat"] == ("FEASIBLE", None)
    assert status["fake-crash"][0] == "CRASH" and "SIGABRT" in status["fake-crash"][1]
    assert status["fake-hang"][0] == "TIMEOUT" and "6.1 s" in status["fake-hang"][1]
    assert status["fake-stubborn"][0] == "TIMEOUT" and "6.1 s" in status["fake-stubborn"][1]
    assert status["fake-fragile"][0] == "TIMEOUT"
    # Stopped by SIGINT at the hard timeout, it hands back its plan: a replayed row.
    patient = next(r for r in rows if r["planner"] == "fake-patient")
    assert patient["status"] == "FEASIBLE" and "best plan kept" in patient["error"]
    assert simulate(unet(2, train=True), Plan.load(tmp_path / "res" / patient["plan_path"])).valid
    # Stopped there without a plan, its UNKNOWN is no answer: a time-out, which a resume reruns.
    assert status["fake-quitter"][0] == "TIMEOUT" and "no plan" in status["fake-quitter"][1]
    assert status["fake-hog"][0] == "OOM"
    assert status["fake-broken"] == ("ERROR", "ValueError: bad model")
    assert status["fake-liar"][0] == "ERROR" and "replay" in status["fake-liar"][1]
    assert len(batch.read_rows(tmp_path / "res")) == len(names)
    assert {r["budget"] for r in rows} == {no_remat_peak(unet(2, train=True))}  # failed rows too


def test_resume_reruns_the_failed_jobs_and_replaces_their_rows(fakes, graph_dir, tmp_path, monkeypatch):
    out, chain6 = tmp_path / "res", graph_dir / "chain6.json"
    names = ["fake-broken", "fake-crash", "no-remat"]
    rows, _ = run([chain6], names, [1.0, 0.9, 0.01], out, jobs=2)
    first = {(r["planner"], r["budget_ratio"]): r for r in rows}
    assert [first["fake-broken", r]["status"] for r in (1.0, 0.9, 0.01)] == ["ERROR"] * 3
    assert [first["fake-crash", r]["status"] for r in (1.0, 0.9, 0.01)] == ["CRASH"] * 3
    order = [r["key"] for r in batch.read_rows(out)]
    failed = {first[p, r]["key"] for p in ("fake-broken", "fake-crash") for r in (1.0, 0.9, 0.01)}

    # The same jobs (same keys), now with planners that work.
    monkeypatch.setitem(planners.REGISTRY, "fake-broken", "rematopt.planners.no_remat:plan")
    monkeypatch.setitem(planners.REGISTRY, "fake-crash", "rematopt.planners.no_remat:plan")
    inputs, _ = batch.load_inputs([chain6])
    again = batch.plan_batch(inputs, names, [1.0, 0.9, 0.01], out, resume=True)
    assert {s["key"] for s in again.specs} == failed and not again.skipped
    assert set(again.rerun) == failed  # their earlier rows, for the CLI's count
    assert len(again.done) == 3  # no-remat's three answers
    new = batch.run_batch(again, out, jobs=2)
    assert {r["key"] for r in new} == failed

    table = batch.read_rows(out)
    assert [r["key"] for r in table] == order  # one row per job, each in its first place
    status = {(r["planner"], r["budget_ratio"]): r["status"] for r in table}
    assert status["fake-broken", 1.0] == status["fake-crash", 1.0] == "FEASIBLE"
    assert status["fake-broken", 0.9] == status["fake-crash", 0.9] == "OVER_BUDGET"
    assert all(r["error"] is None for r in table if r["budget_ratio"] != 0.01)
    assert len((out / batch.RESULTS).read_text().splitlines()) == 9  # the log too: old rows replaced
    assert len((out / "results.csv").read_text().splitlines()) == 10
    assert not batch.plan_batch(inputs, names, [1.0, 0.9, 0.01], out, resume=True).specs


def test_resume_keeps_every_answer_and_reruns_every_failure(graph_dir, tmp_path):
    inputs, _ = batch.load_inputs([graph_dir / "chain6.json"])
    g = inputs[0]
    statuses = ["OPTIMAL", "FEASIBLE", "OVER_BUDGET", "INFEASIBLE", "INFEASIBLE_BUDGET", "UNKNOWN",
                "ERROR", "CRASH", "OOM", "TIMEOUT", "SKIPPED", "SOMETHING_NEW"]
    ratios = [1 - i / 100 for i in range(len(statuses))]  # all above the lower bound (0.29)
    out = tmp_path / "res"
    out.mkdir()
    log = batch.ResultsLog(out / batch.RESULTS)
    for r, status in zip(ratios, statuses):
        log.append({"key": batch.job_key(g.sha256, r, "no-remat", {}), "budget_ratio": r, "status": status})
    again = batch.plan_batch(inputs, ["no-remat"], ratios, out, resume=True)
    rerun = [statuses[ratios.index(s["budget_ratio"])] for s in again.specs]
    assert rerun == ["ERROR", "CRASH", "OOM", "TIMEOUT", "SKIPPED", "SOMETHING_NEW"]
    assert sorted(row["status"] for row in again.done.values()) == sorted(statuses[:6])


def test_a_later_row_replaces_its_key_in_place_but_never_an_answer(tmp_path):
    log = batch.ResultsLog(tmp_path / batch.RESULTS)
    for key, status in [("a", "CRASH"), ("b", "OPTIMAL"), ("c", "TIMEOUT"), ("a", "FEASIBLE"), ("b", "ERROR"),
                        ("c", "OOM")]:
        log.append({"key": key, "status": status})
    expect = [("a", "FEASIBLE"), ("b", "OPTIMAL"), ("c", "OOM")]
    assert [(r["key"], r["status"]) for r in batch.read_rows(tmp_path)] == expect
    log.compact()
    assert [json.loads(line)["key"] for line in log.path.read_text().splitlines()] == ["a", "b", "c"]
    assert [(r["key"], r["status"]) for r in batch.read_rows(tmp_path)] == expect
    assert [p.name for p in tmp_path.iterdir()] == [batch.RESULTS]  # no temporary file left


def test_exact_jobs_run_last_with_the_best_fast_plan_as_hint(fakes, tmp_path, monkeypatch):
    path = tmp_path / "chain.json"
    chain(5, sinks=True).save(path)  # working set / no-remat peak = 1/3
    monkeypatch.setitem(planners.REGISTRY, "cpsat", "fakeplanners:echo_hint")
    rows, _ = run([path], ["cpsat", "no-remat"], [1.0, 0.5], tmp_path / "res", jobs=2)
    assert [r["planner"] for r in rows][-2:] == ["cpsat", "cpsat"]
    exact = {r["budget_ratio"]: r for r in rows if r["planner"] == "cpsat"}
    hinted = json.loads(exact[1.0]["stats"])
    assert exact[1.0]["hint_from"] == "no-remat" and hinted["hint_planner"] == "no-remat"
    fast = next(r for r in rows if r["planner"] == "no-remat" and r["budget_ratio"] == 1.0)
    assert hinted["hint_events"] == len(Plan.load(tmp_path / "res" / fast["plan_path"])) > 0
    # At 0.5 no-remat misses the budget, so there is no hint to give.
    assert exact[0.5]["hint_from"] is None and json.loads(exact[0.5]["stats"])["hint_events"] == 0
    log = exact[1.0]["log_path"]  # given to the planner, kept relative to the results
    assert log.startswith("logs/") and (tmp_path / "res" / log).read_text().startswith("phase,elapsed_s")


def test_exact_planners_skipped_above_the_size_limit(fakes, tmp_path, monkeypatch):
    path = tmp_path / "chain.json"
    chain(5).save(path)
    monkeypatch.setitem(planners.REGISTRY, "cpsat", "fakeplanners:echo_hint")
    rows, _ = run([path], ["cpsat"], [1.0], tmp_path / "res", exact_max_nodes=3)
    assert len(rows) == 1 and rows[0]["status"] == "SKIPPED" and "6 nodes" in rows[0]["error"]
    inputs, _ = batch.load_inputs([path])
    lifted = batch.plan_batch(inputs, ["cpsat"], [1.0], tmp_path / "res", resume=True)
    assert [s["key"] for s in lifted.specs] == [rows[0]["key"]]  # a resume without the cap runs it


def test_a_torn_last_line_is_ignored_and_the_next_row_survives(tmp_path):
    log = tmp_path / batch.RESULTS
    log.write_text(json.dumps({"key": "a", "status": "FEASIBLE"}) + "\n" + '{"key": "b", "sta')
    assert [r["key"] for r in batch.read_rows(tmp_path)] == ["a"]
    batch.ResultsLog(log).append({"key": "c", "status": "OPTIMAL"})
    assert [r["key"] for r in batch.read_rows(tmp_path)] == ["a", "c"]


def test_bad_inputs_fail_before_any_job(tmp_path, graph_dir):
    inputs, _ = batch.load_inputs([graph_dir])
    with pytest.raises(PlannerError, match="unknown planner"):
        batch.plan_batch(inputs, ["no-such"], [0.5], tmp_path / "o")
    with pytest.raises(BudgetError):
        batch.plan_batch(inputs, ["no-remat"], [-0.5], tmp_path / "o")
    with pytest.raises(GraphError, match="no such file"):
        batch.load_inputs([tmp_path / "missing"])
    with pytest.raises(GraphError, match="notes.json"):  # named explicitly, so it must be a graph
        batch.load_inputs([graph_dir / "sub" / "notes.json"])


@pytest.mark.parametrize("name, family", [
    ("random_layered_n100", "random_layered"), ("vgg16_train", "vgg16"), ("mobilenet_train", "mobilenet"),
    ("chain", "chain"), ("chain_d50", "chain"), ("gpt2_small_b8", "gpt2_small"), ("unet3_train", "unet3"),
])
def test_family_is_the_name_before_size_and_role_tokens(name, family):
    assert batch.family_of(name) == family


def test_dask_executor_gives_the_local_rows(graph_dir, tmp_path):
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=1, threads_per_worker=2, processes=False,
                                  dashboard_address=None) as cluster:
        rows, _ = run([graph_dir], ["no-remat"], [1.0], tmp_path / "dask", jobs=2, executor="dask",
                      scheduler=cluster.scheduler_address)
    local, _ = run([graph_dir], ["no-remat"], [1.0], tmp_path / "local", jobs=2)
    figures = ("key", "status", "peak_bytes", "compute_cost", "budget")
    assert sorted(tuple(r[k] for k in figures) for r in rows) == sorted(tuple(r[k] for k in figures) for r in local)


def rematopt(*args):
    return subprocess.run([sys.executable, "-m", "rematopt", *map(str, args)], capture_output=True, text=True,
                          timeout=120)


def test_cli_batch_then_report(graph_dir, tmp_path):
    out, rep = tmp_path / "res", tmp_path / "rep"
    done = rematopt("batch", graph_dir, "--planners", "no-remat", "--budget-ratios", "1.0,0.9", "--jobs", "2",
                    "--time-limit", "5", "--out", out)
    assert done.returncode == 0, done.stderr
    assert "FEASIBLE 2" in done.stdout and "OVER_BUDGET 2" in done.stdout
    assert json.loads((out / "batch.json").read_text())[0]["command"].startswith("rematopt batch")
    resumed = rematopt("batch", graph_dir, "--planners", "no-remat", "--budget-ratios", "1.0,0.9", "--out", out,
                       "--time-limit", "5", "--resume")
    assert resumed.returncode == 0 and "no new rows" in resumed.stdout
    made = rematopt("report", out, "-o", rep)
    assert made.returncode == 0, made.stderr
    index = (rep / "index.md").read_text()
    assert "rematopt batch" in index and "rematopt report" in index and "pareto.png" in index
    assert "data:image/png;base64," in (rep / "index.html").read_text()


@pytest.mark.parametrize("args, problem", [
    (["--planners", "nope"], "unknown planner 'nope'"),
    (["--budget-ratios", "0.5,x"], "--budget-ratios"),
])
def test_cli_bad_input_is_one_line_and_exit_2(graph_dir, tmp_path, args, problem):
    done = rematopt("batch", graph_dir, *args, "--out", tmp_path / "o")
    assert done.returncode == 2 and problem in done.stderr and "Traceback" not in done.stderr


INTERRUPTED = """
import signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C raises, however the suite was started
from rematopt import planners
from rematopt.studies import batch
planners.REGISTRY["fake-hang"] = "fakeplanners:hang"
inputs, _ = batch.load_inputs([sys.argv[1]])
bp = batch.plan_batch(inputs, ["no-remat", "fake-hang"], [1.0], sys.argv[2], resume=True)
batch.run_batch(bp, sys.argv[2], jobs=2)
"""


def test_ctrl_c_keeps_finished_rows_ends_workers_and_resume_runs_the_rest(fakes, graph_dir, tmp_path):
    import os
    import signal
    import time

    out, pids = tmp_path / "res", tmp_path / "pids"
    env = {**os.environ, "FAKE_PID_FILE": str(pids)}
    proc = subprocess.Popen([sys.executable, "-c", INTERRUPTED, str(graph_dir), str(out)], env=env,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not (pids.exists() and len(pids.read_text().split()) == 2
                                                   and len(batch.read_rows(out)) == 2):
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()  # a failed run leaves no batch behind (a no-op once it has ended)
    assert proc.returncode != 0 and "KeyboardInterrupt" in err
    rows = batch.read_rows(out)
    assert sorted(r["planner"] for r in rows) == ["no-remat", "no-remat"]  # finished rows only, none torn
    time.sleep(0.5)
    for pid in map(int, pids.read_text().split()):  # the hung workers were ended
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    inputs, _ = batch.load_inputs([graph_dir])
    rest = batch.plan_batch(inputs, ["no-remat", "fake-hang"], [1.0], out, resume=True)
    assert sorted(s["planner"] for s in rest.specs) == ["fake-hang", "fake-hang"]


def test_workers_take_the_hard_timeouts_sigint_where_the_batch_ignores_it(fakes, tmp_path, monkeypatch):
    """A batch started with SIGINT ignored (a background job) passes that on to
    its workers; they take SIGINT again, so a hung planner stopped at the hard
    timeout still ends with its own row, not SIGKILL."""
    import signal

    path = tmp_path / "chain.json"
    chain(5).save(path)
    monkeypatch.setattr(batch, "STOP_GRACE_S", 2.0)
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        (row,), _ = run([path], ["fake-hang"], [1.0], tmp_path / "res", options={"time_limit": 0.1},
                        timeout_margin=6)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert row["status"] == "TIMEOUT" and row["error"] == "stopped at the hard timeout (6.1 s); no plan"


def test_mlir_inputs_run_like_any_graph(tmp_path):
    from pathlib import Path

    mlir = Path(__file__).parent / "data" / "mlir" / "chain.mlir"
    if not mlir.exists():
        pytest.skip(f"{mlir} not found")
    rows, _ = run([mlir], ["no-remat"], [1.0], tmp_path / "res")
    g = load_graph(mlir)
    assert rows[0]["status"] == "FEASIBLE" and rows[0]["peak_bytes"] == no_remat_peak(g)
    assert simulate(g, Plan.load(tmp_path / "res" / rows[0]["plan_path"])).valid


def test_a_planner_that_does_not_apply_is_skipped_not_an_error(tmp_path):
    """jax-names needs checkpoint names; a chain has none: the job is
    SKIPPED with the planner's reason, the batch's other rows unaffected."""
    path = tmp_path / "chain.json"
    chain(5).save(path)
    rows, _ = run([path], ["jax-names", "dtr"], [1.0], tmp_path / "res")
    status = {r["planner"]: r for r in rows}
    assert status["jax-names"]["status"] == "SKIPPED" and "jax-names needs" in status["jax-names"]["error"]
    assert status["dtr"]["status"] in ("OPTIMAL", "FEASIBLE")
