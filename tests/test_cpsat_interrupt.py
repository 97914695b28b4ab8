"""Ctrl-C never loses a finished result: a real SIGINT, sent at each stage of
a cpsat run (the search, the warm start, the peak search, the build of a
deeper round, a relaxation proof between rounds), ends the run with the best
plan so far, which the simulator replays. Solved in another thread, cpsat
leaves Ctrl-C to the caller; where SIGINT is ignored, it stays ignored.
Each test sets up the SIGINT handling it tests (:func:`sigint_raises`)."""

from __future__ import annotations

import os
import signal
import threading

import pytest
from ortools.sat.python import cp_model

from rematopt import solve
from rematopt.planners.cpsat import run, search, signals
from rematopt.planners.cpsat.tuning import Tuning
from rematopt.importers import synthetic
from rematopt.reference import no_remat_plan

# depth rounds, so there is a "between"
DEPTH_ROUNDS = Tuning(full_model_pairs=0)
OPTS = dict(budget_ratio=0.8, time_limit=60, workers=1, lp_bound=False, tuning=DEPTH_ROUNDS)


@pytest.fixture(autouse=True)
def sigint_raises():
    """Python's own SIGINT handler (KeyboardInterrupt), as an interactive
    process starts with, whatever this worker started with (a background job
    starts with SIGINT ignored) and whatever an earlier test left."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.fixture
def graph():
    return synthetic.random_layered(40, seed=1)


def ctrl_c() -> None:
    """One SIGINT. Never more within a solve: OR-Tools' handler calls exit()
    on the third, from inside the signal handler while the solver's threads
    run, which can leave the process hung instead of ended."""
    os.kill(os.getpid(), signal.SIGINT)


def check(sol, rounds: int) -> None:
    st = sol.plan.stats
    # the incumbent cleaned of unread computations may cost nothing, which proves it
    assert st["interrupted"] and (sol.status == "FEASIBLE" or st.get("proved_by") == "zero cost")
    assert sol.replay.valid and sol.replay.peak_bytes <= sol.budget
    assert len(st["rounds"]) == rounds
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the caller's handler is back


def test_ctrl_c_during_the_search_returns_the_incumbent(graph, monkeypatch):
    original = signals.SolutionCallback.on_solution_callback
    sent = []

    def first_solution_then_ctrl_c(self):
        original(self)
        if not sent:
            sent.append(True)
            ctrl_c()

    monkeypatch.setattr(signals.SolutionCallback, "on_solution_callback", first_solution_then_ctrl_c)
    sol = solve(graph, "cpsat", **OPTS)
    check(sol, rounds=1)
    assert sol.plan.stats["wall_s"] < 30


def test_ctrl_c_during_the_warm_start_returns_the_hint(graph, monkeypatch):
    original = run.warm_start

    def warm_start_then_ctrl_c(*args):
        found = original(*args)
        ctrl_c()
        return found

    monkeypatch.setattr(run, "warm_start", warm_start_then_ctrl_c)
    sol = solve(graph, "cpsat", **OPTS)
    check(sol, rounds=0)
    st = sol.plan.stats
    if st.get("plan_from"):  # a fast plan outside the model's space (xla-remat reorders) beats the hint
        assert st["objective"] < st["hint_objective"] and "beats the model's best" in st["reason"]
    else:
        assert st["objective"] == st["hint_objective"]


def test_ctrl_c_while_building_a_deeper_round_keeps_the_previous_rounds_plan(graph, monkeypatch):
    original = run.make_model

    def build_then_ctrl_c(ctx, depth, also, **kw):
        model = original(ctx, depth, also, **kw)
        if depth == 2:
            ctrl_c()
        return model

    monkeypatch.setattr(run, "make_model", build_then_ctrl_c)
    # no proof between the rounds: slots would prove depth 1
    sol = solve(graph, "cpsat", **{**OPTS, "tuning": Tuning(full_model_pairs=0, proof_share=0.0)})
    check(sol, rounds=1)
    assert sol.plan.stats["recompute_depth"] == 1


def test_ctrl_c_during_a_relaxation_proof_keeps_the_rounds_plan(graph, monkeypatch):
    """After depth 1, the slots relaxation is asked whether any plan beats
    its optimum; a Ctrl-C at its search's first bound stops that search and
    ends the run with the round's plan."""
    original = run.ask
    solver_class = cp_model.CpSolver

    class CtrlCAtTheFirstBound(solver_class):
        def solve(self, model, callback=None):
            sent = []

            def first_bound(bound):
                if not sent:
                    sent.append(True)
                    ctrl_c()

            self.best_bound_callback = first_bound
            return super().solve(model, callback)

    def slots_then_ctrl_c(graph, q, name, **kwargs):
        if name != "slots":
            return original(graph, q, name, **kwargs)
        with monkeypatch.context() as m:
            m.setattr(cp_model, "CpSolver", CtrlCAtTheFirstBound)
            return original(graph, q, name, **kwargs)

    monkeypatch.setattr(run, "ask", slots_then_ctrl_c)
    sol = solve(graph, "cpsat", **OPTS)
    check(sol, rounds=1)
    proofs = sol.plan.stats["relaxation_proofs"]
    assert [p["level"] for p in proofs] == ["chains", "slots"] and proofs[-1]["status"] == "UNKNOWN"


def test_ctrl_c_after_the_peak_search_returns_its_plan(graph, monkeypatch):
    """A round with no start (no warm start, its first search given no time)
    finds its plan by the peak search from the lowest-peak plan (here the
    no-remat plan, given as the hint); a Ctrl-C right after it ends the run
    with that plan instead of resuming the overhead search."""
    solve_model, fit = search.solve_model, search.fit

    def starved(ctx, model, phase, limit, stop_at=None):
        if phase == "primary" and limit == 0:
            return search.Solve(cp_model.UNKNOWN, None, 0.0, 0.0)
        return solve_model(ctx, model, phase, limit, stop_at)

    def fit_then_ctrl_c(*args):
        found = fit(*args)
        ctrl_c()
        return found

    monkeypatch.setattr(search, "solve_model", starved)
    monkeypatch.setattr(search, "fit", fit_then_ctrl_c)
    monkeypatch.setattr(run, "warm_start", lambda ctx, model, outside, spent: (None, None))
    # the peak search at once, from the no-remat plan whatever its peak
    fit_at_once = Tuning(full_model_pairs=0, fit_after_share=0.0, min_round_s=0.0, fit_margin=float("inf"))
    sol = solve(graph, "cpsat", hint=no_remat_plan(graph), **{**OPTS, "tuning": fit_at_once})
    check(sol, rounds=1)
    st = sol.plan.stats
    assert st["warm_start"] == "peak search"
    # that plan, or the same cleaned of the computations nobody reads (cheaper)
    assert st["objective"] == st["hint_objective"] or (st["plan_from"] == "cpsat+dce"
                                                       and st["objective"] < st["hint_objective"])


def test_ctrl_c_during_a_solve_in_another_thread_is_the_callers(graph, monkeypatch):
    """Solved in a worker thread, cpsat leaves SIGINT to the caller: a Ctrl-C
    while its search runs raises KeyboardInterrupt in the main thread (with
    CP-SAT's handler installed from the worker thread, it aborted the
    process), the solve carries on to a valid plan, and the caller's handler
    is still in place afterwards."""
    import time

    original = signals.SolutionCallback.on_solution_callback
    searching, released = threading.Event(), threading.Event()

    def hold_the_search(self):
        original(self)
        searching.set()
        released.wait(10)

    monkeypatch.setattr(signals.SolutionCallback, "on_solution_callback", hold_the_search)
    out = {}
    worker = threading.Thread(target=lambda: out.setdefault("sol", solve(graph, "cpsat", **OPTS)))
    worker.start()
    try:
        assert searching.wait(30)
        with pytest.raises(KeyboardInterrupt):
            ctrl_c()
            time.sleep(5)
    finally:
        released.set()
        worker.join()
    sol = out["sol"]
    assert sol.status in ("OPTIMAL", "FEASIBLE") and not sol.plan.stats["interrupted"]
    assert sol.replay.valid and sol.replay.peak_bytes <= sol.budget
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_where_sigint_is_ignored_it_stays_ignored_and_the_run_goes_on(graph, monkeypatch):
    """Started with SIGINT ignored (a background job), cpsat installs no
    handler and CP-SAT does not catch it: a SIGINT during the search changes
    nothing, and the run ends as it would have (its time limit or proof)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    original = signals.SolutionCallback.on_solution_callback
    during = []

    def first_solution_then_ctrl_c(self):
        original(self)
        if not during:
            during.append(signal.getsignal(signal.SIGINT))
            ctrl_c()

    monkeypatch.setattr(signals.SolutionCallback, "on_solution_callback", first_solution_then_ctrl_c)
    sol = solve(graph, "cpsat", **dict(OPTS, time_limit=5))
    assert during == [signal.SIG_IGN] and not sol.plan.stats["interrupted"]
    assert sol.status in ("OPTIMAL", "FEASIBLE") and sol.replay.valid and sol.replay.peak_bytes <= sol.budget
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
