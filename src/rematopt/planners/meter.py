"""Where the planners read the time: the wall clock, or (``cpsat
--deterministic-time``) the deterministic time CP-SAT's solves have spent,
so that every decision of a run (each share of the limit, each deadline,
each stop) is the same on a loaded machine as on an idle one.

A :class:`Meter` is set for the length of a run (:func:`metered`); the code
under it reads :func:`now` and asks :func:`past`, sets a CP-SAT solve's
limits with :meth:`Meter.limit` and runs it with :meth:`Meter.solve`, which
counts its deterministic time. Work outside CP-SAT (the fast planners,
building a model) spends no deterministic time: under a deterministic meter
it runs to its end, bounded by the wall clock alone. The wall clock stays
the outer bound: once it has run out, the deterministic clock reads its end,
so every part of the run stops as if its share were spent, and the meter
remembers that the run was cut (:attr:`Meter.wall_ran_out`).
"""

from __future__ import annotations

import math
import time
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Iterator

# A solve that ran this close to its wall limit was stopped by it: CP-SAT
# stopped 3 ms before a 0.652 s wall limit (0.995 of it) on random_layered(100).
WALL_STOP_SHARE = 0.98
WALL_STOP_S = 0.02
# The longest wall limit handed to a solver that takes whole milliseconds
# (GLOP): a day, where no wall limit is set.
MAX_WALL_S = 86_400.0


@dataclass
class Meter:
    """``deterministic_limit``: the run's deterministic seconds (None: the
    meter reads the wall clock); ``wall_end``: the ``time.perf_counter()``
    value at which the wall-clock limit ends."""

    deterministic_limit: float | None = None
    wall_end: float = math.inf
    spent: float = 0.0  # deterministic seconds spent by the solves run with :meth:`solve`
    wall_ran_out: bool = False  # a deterministic run cut by the wall clock

    @property
    def deterministic(self) -> bool:
        return self.deterministic_limit is not None

    def now(self) -> float:
        """Seconds on this meter's clock: ``time.perf_counter()``, or the
        deterministic time spent (its limit, once the wall clock has run out)."""
        if self.deterministic_limit is None:
            return time.perf_counter()
        if not self.wall_ran_out and time.perf_counter() >= self.wall_end:
            self.wall_ran_out = True
        return max(self.spent, self.deterministic_limit) if self.wall_ran_out else self.spent

    def past(self, deadline: float | None) -> bool:
        """Whether ``deadline`` (on this clock) has passed, or the wall clock has run out."""
        t = self.now()
        return (deadline is not None and t > deadline) or self.wall_ran_out

    def wall_left(self) -> float:
        return max(0.0, self.wall_end - time.perf_counter())

    def wall_seconds(self, seconds: float) -> float:
        """A wall limit for a solver that has no deterministic one (GLOP):
        ``seconds``, or under a deterministic meter what is left of the wall clock."""
        return min(self.wall_left() if self.deterministic else seconds, MAX_WALL_S)

    def limit(self, prm: Any, seconds: float) -> None:
        """Set a CP-SAT solve's limit to ``seconds`` of this meter's clock:
        wall seconds, or deterministic ones (one worker) with what is left
        of the wall clock as the outer bound."""
        if self.deterministic_limit is None:
            prm.max_time_in_seconds = seconds
            return
        prm.max_deterministic_time = max(0.0, seconds)
        prm.max_time_in_seconds = min(self.wall_left(), MAX_WALL_S)
        prm.num_workers = 1

    def solve(self, solver: Any, model: Any, callback: Any = None) -> int:
        """``solver.solve(model, callback)``, its deterministic time counted;
        a search that ended on the wall clock marks the run cut."""
        status = solver.solve(model, callback)
        if self.deterministic_limit is not None:
            self.spent += solver.deterministic_time
            if solver.wall_time >= WALL_STOP_SHARE * solver.parameters.max_time_in_seconds - WALL_STOP_S:
                self.wall_ran_out = True
        return status

    def used(self, solver: Any) -> float:
        """The seconds a finished solve took on this meter's clock."""
        return solver.deterministic_time if self.deterministic else solver.wall_time


_WALL = Meter()  # outside a metered run: the wall clock, no state
_CURRENT: ContextVar[Meter] = ContextVar("rematopt_meter", default=_WALL)


def meter() -> Meter:
    """The meter of the run in progress (the wall clock outside one)."""
    return _CURRENT.get()


def now() -> float:
    return meter().now()


def past(deadline: float | None) -> bool:
    return meter().past(deadline)


@contextmanager
def metered(m: Meter) -> Iterator[Meter]:
    """Read the time from ``m`` within the block (this thread only)."""
    token = _CURRENT.set(m)
    try:
        yield m
    finally:
        _CURRENT.reset(token)
