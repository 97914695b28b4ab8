"""Run tasks a few at a time, in the order given, as their inputs are ready: ``rematopt bench device``
measures and plans on both cores of the 2-core machine at once and times each model with nothing
beside it (a task marked ``alone``); on a GPU it plans on the host's cores beside one row process at
a time on the device (a resource the row tasks hold). Each task runs on a thread of its own (its work is a worker
process), on a numbered slot, so that it can pin its process to the slot's core."""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Task:
    name: str
    run: Callable[[int], None]  # called with its slot, 0 .. slots - 1
    after: tuple[str, ...] = ()  # the tasks that must end before it starts
    alone: bool = False  # starts when no other task runs, and none starts beside it (on slot 0)
    holds: str = ""  # a resource (the GPU a row measures on) that one running task at most holds


@dataclass(frozen=True)
class Ran:
    name: str
    slot: int
    start: float  # time.time()
    end: float


def run_tasks(tasks: list[Task], slots: int, stop: Callable[[], None] = lambda: None) -> list[Ran]:
    """Run ``tasks``, at most ``slots`` at once; when each ran, in the order they ended. A free slot takes
    the first task in ``tasks`` whose ``after`` have ended and whose resource (``holds``) no running task
    holds; a ready ``alone`` task waits for the others to end, and no later task passes it. The first exception of a task (``OutOfTime``, a bug), or Ctrl-C
    here, calls ``stop`` (which must make the running tasks end soon), waits for them and is raised:
    no task starts after it."""
    names = [t.name for t in tasks]
    unknown = {a for t in tasks for a in t.after} - set(names)
    if len(set(names)) != len(names) or unknown:
        twice = {n for n in names if names.count(n) > 1}
        raise ValueError(f"tasks named twice or waiting on no task: {sorted(twice | unknown)}")
    waiting, done, ran = list(tasks), set(), []
    running: dict[str, tuple[Task, int, float]] = {}  # name: the task, its slot, when it started
    ended: queue.Queue[tuple[str, BaseException | None]] = queue.Queue()

    def body(task: Task, slot: int) -> None:
        try:
            task.run(slot)
        except BaseException as e:  # noqa: BLE001 - raised again by run_tasks
            ended.put((task.name, e))
        else:
            ended.put((task.name, None))

    def end() -> BaseException | None:
        name, error = ended.get()
        task, slot, start = running.pop(name)
        ran.append(Ran(name, slot, start, time.time()))
        if error is None:
            done.add(name)
        return error

    try:
        while waiting or running:
            for task in list(waiting):
                free = sorted(set(range(slots)) - {s for _, s, _ in running.values()})
                if not free or any(t.alone for t, _, _ in running.values()):
                    break
                if not set(task.after) <= done or task.holds and any(t.holds == task.holds
                                                                      for t, _, _ in running.values()):
                    continue
                if task.alone and running:
                    break
                waiting.remove(task)
                running[task.name] = (task, free[0], time.time())
                threading.Thread(target=body, args=(task, free[0]), name=f"task {task.name}", daemon=True).start()
            if not running:
                raise ValueError(f"tasks waiting on each other: {[t.name for t in waiting]}")
            error = end()
            if error is not None:
                raise error
    except BaseException:
        stop()
        while running:
            end()
        raise
    return ran
