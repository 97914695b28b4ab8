"""``rematopt.studies.schedule.run_tasks`` and the order ``rematopt bench device`` runs its processes in,
on stub tasks that record what ran beside them: at most ``slots`` at once, never before the tasks they
wait on, ``alone`` tasks (the timing processes) with nothing beside them, two tasks really at once
(each waits for the other at a barrier), and the first failure stopping the rest. No timings asserted."""

from __future__ import annotations

import math
import threading
from dataclasses import replace

import pytest

from rematopt.studies.schedule import Task, run_tasks


class Log:
    """Stub tasks that record, at their start and end, which tasks ran beside them."""

    def __init__(self):
        self.lock, self.running, self.beside, self.slots, self.order = threading.Lock(), set(), {}, {}, []

    def task(self, name: str, after: tuple[str, ...] = (), alone: bool = False, then=lambda: None) -> Task:
        def run(slot: int) -> None:
            with self.lock:
                self.beside[name] = set(self.running)
                for other in self.running:
                    self.beside[other].add(name)
                self.running.add(name)
                self.slots[name] = slot
                self.order.append(name)
            try:
                then()
            finally:
                with self.lock:
                    self.running.discard(name)
        return Task(name, run, after, alone)


def test_tasks_wait_on_their_inputs_and_alone_tasks_run_with_nothing_beside_them():
    log = Log()
    meet = threading.Barrier(2, timeout=30)  # a and b must run at once, or the barrier breaks
    tasks = [log.task("a", then=meet.wait), log.task("b", then=meet.wait), log.task("c", after=("a",)),
             log.task("t", after=("b",), alone=True), log.task("d", after=("b",)), log.task("u", alone=True)]
    ran = run_tasks(tasks, 2)
    assert sorted(r.name for r in ran) == sorted(t.name for t in tasks)
    assert log.beside["a"] >= {"b"} and {log.slots["a"], log.slots["b"]} == {0, 1}
    # the alone tasks: nothing beside them, on slot 0 (the core the timing is pinned to)
    assert log.beside["t"] == log.beside["u"] == set() and log.slots["t"] == log.slots["u"] == 0
    # every task after its inputs; d, ready with t (both wait on b), does not pass t, which comes first
    assert log.order.index("c") > log.order.index("a")
    assert log.order.index("b") < log.order.index("t") < log.order.index("d")
    assert log.order[-1] == "u" and all(len(s) <= 1 for s in log.beside.values())  # two slots: one beside at most
    ends = {r.name: r for r in ran}
    assert ends["t"].start >= max(ends[n].end for n in ("a", "b", "c"))


def test_one_slot_runs_the_tasks_in_the_order_given():
    log = Log()
    names = ["r", "p", "q", "t"]
    run_tasks([log.task("r"), log.task("p"), log.task("q", after=("r", "p")), log.task("t", after=("q",), alone=True)], 1)
    assert log.order == names and all(not s for s in log.beside.values())


def test_the_first_failure_stops_the_others_and_is_raised():
    log, stopped = Log(), threading.Event()

    def fail():
        raise TimeoutError("the time limit")

    def wait_for_stop():  # a running task that ends only when stop() is called, as a killed worker does
        assert stopped.wait(30)

    tasks = [log.task("long", then=wait_for_stop), log.task("bad", then=fail), log.task("later"),
             log.task("after_bad", after=("bad",))]
    with pytest.raises(TimeoutError, match="the time limit"):
        run_tasks(tasks, 2, stop=stopped.set)
    assert stopped.is_set() and "later" not in log.order and "after_bad" not in log.order
    assert log.running == set()  # the running task was waited for


def test_bad_task_lists_are_refused():
    log = Log()
    with pytest.raises(ValueError, match="waiting on no task"):
        run_tasks([log.task("a", after=("nowhere",))], 2)
    with pytest.raises(ValueError, match="named twice"):
        run_tasks([log.task("a"), log.task("a")], 2)
    with pytest.raises(ValueError, match="waiting on each other"):
        run_tasks([log.task("a", after=("b",)), log.task("b", after=("a",))], 2)


def test_the_device_bench_plans_beside_the_rows_and_times_each_model_alone(tmp_path):
    """The bench's own tasks (rematopt.studies.device.bench._model_tasks, in _order's order), their work stubbed:
    on two slots each model's planning runs beside rows, its plan rows after its rows and its planning,
    and every timing after all measuring and planning, with nothing beside it; on one slot (a GPU)
    model by model, as before."""
    pytest.importorskip("jax")
    from rematopt.studies.device.bench import _model_tasks, _order
    from rematopt.studies.device.launch import Workers
    from rematopt.studies.device.results import Bench
    from rematopt.studies.device.settings import MODELS

    models = ("gpt", "unet", "flax_linen")
    bench = Bench("cpu", "cpu")

    def graph() -> list[list[Task]]:
        return [_model_tasks(bench, MODELS[m], {}, 1, (0.8,), math.inf, True, {}, tmp_path, None, print, Workers(),
                             threading.RLock(), [0, 1], models, tmp_path) for m in models]

    log = Log()
    meet = threading.Barrier(2, timeout=30)  # the first model's planning and rows start at once
    stubbed = [replace(t, run=log.task(t.name, then=meet.wait if t.name in ("gpt planning", "gpt rows") else
                                       lambda: None).run) for t in _order(graph(), 2)]
    run_tasks(stubbed, 2)
    timings = [f"{m} timing" for m in models]
    assert log.order[-3:] == timings and all(log.beside[t] == set() for t in timings)
    assert log.beside["gpt planning"] >= {"gpt rows"}
    for m in models:
        assert log.order.index(f"{m} plan rows") > max(log.order.index(f"{m} rows"), log.order.index(f"{m} planning"))
    log = Log()
    run_tasks([replace(t, run=log.task(t.name).run) for t in _order(graph(), 1)], 1)
    assert log.order == [f"{m} {task}" for m in models for task in ("rows", "planning", "plan rows", "timing")]


def test_a_resource_is_held_by_one_running_task_at_most():
    log = Log()
    tasks = [replace(log.task(n), holds="device") for n in ("r1", "r2", "r3")] + [log.task(n) for n in ("p1", "p2")]
    ran = run_tasks(tasks, 4)
    assert sorted(r.name for r in ran) == ["p1", "p2", "r1", "r2", "r3"]
    for r in ("r1", "r2", "r3"):
        assert not log.beside[r] & {"r1", "r2", "r3"}
    assert log.order[:3] == ["r1", "p1", "p2"]  # r2 and r3 wait for the device; the plannings pass them


def test_on_a_gpu_the_bench_plans_each_budget_beside_one_row_process_on_the_device(tmp_path):
    """The bench's own tasks on a GPU backend (stubbed): one planning task a budget, the rows first in the
    order, every row and plan-row task holding the device (none beside another), the plan rows after
    their model's rows and every one of its budgets' plannings, each timing alone."""
    pytest.importorskip("jax")
    from rematopt.studies.device.bench import _model_tasks, _order
    from rematopt.studies.device.launch import Workers
    from rematopt.studies.device.results import Bench
    from rematopt.studies.device.settings import MODELS

    models, ratios = ("gpt", "unet"), (0.8, 0.6, 0.5)
    bench = Bench("gpu", "h200")
    tasks = [_model_tasks(bench, MODELS[m], {}, 1, ratios, math.inf, False, {}, tmp_path, None, print, Workers(),
                          threading.RLock(), list(range(8)), models, tmp_path) for m in models]
    assert [t.name for t in tasks[0]] == ["gpt rows", "gpt planning@0.8", "gpt planning@0.6", "gpt planning@0.5",
                                          "gpt plan rows", "gpt timing"]
    ordered = _order(tasks, 4, rows_first=True)
    assert [t.name for t in ordered][:4] == ["gpt plan rows", "unet plan rows", "gpt rows", "unet rows"]
    log = Log()
    run_tasks([replace(t, run=log.task(t.name).run) for t in ordered], 4)
    device = {t.name for t in ordered if t.holds == "device"}
    assert device == {f"{m} {k}" for m in models for k in ("rows", "plan rows")}
    assert all(not log.beside[d] & device for d in device)
    for m in models:
        assert log.order.index(f"{m} plan rows") > max(log.order.index(f"{m} planning@{r}") for r in ratios)
        assert log.beside[f"{m} timing"] == set()


def test_the_time_table_says_what_ran_at_once_and_the_idle_critical_path():
    """From the processes' (kind, model, start, end, CPU s): the seconds two ran at once, and the idle
    machine's figures: at least half the measuring and planning CPU on two cores, or the longest model's
    chain (its rows or planning, then its plan rows) where that is longer; about the run's own schedule
    at full speed (or that chain); the timing processes after it."""
    pytest.importorskip("jax")
    from rematopt.studies.device.bench import _overlap
    from rematopt.studies.device.report import _critical_path
    from rematopt.studies.device.results import Bench

    ran = [("probe", "", 0, 1, 1.0), ("micro-benchmarks", "", 1, 3, 2.0),
           ("planning", "a", 3, 63, 60.0), ("rows", "a", 3, 13, 10.0), ("rows", "b", 13, 23, 10.0),
           ("planning", "b", 23, 33, 10.0), ("rows", "b", 33, 38, 5.0), ("rows", "a", 63, 68, 5.0),
           ("timing", "a", 68, 88, 20.0), ("timing", "b", 88, 98, 10.0)]
    assert _overlap(ran) == pytest.approx(35.0)  # a's planning beside 3 to 38
    said = _critical_path(Bench("cpu", "cpu", processes=ran))
    # 100 s of CPU in 65 s; a's chain max(10, 60) + 5 = 65 > 100 / 2; 3 + 65 + 30
    assert "6 processes, 100 s of CPU in 65 s of wall clock" in said and "a's chain, 65 s" in said
    assert "at least 65 s" in said and "2 processes, 30 s of CPU" in said and "about 98 s on an idle" in said
    # at a third of a core each (300 process-seconds for 100 s of CPU): this schedule's 65 s take 21.7 s,
    # less than a's chain, which stays the figure
    slow = [(k, m, 3 * s, 3 * e, c) for k, m, s, e, c in ran]
    said = _critical_path(Bench("cpu", "cpu", processes=slow))
    assert "in 195 s of wall clock" in said and "about 65 s as this run's schedule" in said
    assert "about 98 s on an idle" in said
    # where the chain is short, the schedule: its 65 s at a share 100 / 100 of a core
    short = [p if p[:2] != ("rows", "a") or p[2] != 63 else ("rows", "a", 63, 68, 0.0) for p in ran]
    short = [p if p[:2] != ("planning", "a") else ("planning", "a", 3, 63, 20.0) for p in short]
    said = _critical_path(Bench("cpu", "cpu", processes=short))
    assert "55 s of CPU in 65 s" in said and "about 36 s as this run's schedule" in said  # 65 x 55 / 100
    assert _critical_path(Bench("cpu", "cpu", processes=ran[:-2])) == ""  # cut before any timing: no figure
