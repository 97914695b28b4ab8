"""What a cpsat run shows while it solves, and how it takes Ctrl-C: the
trace of incumbents and bounds (``--log``), the solution callback that
records them, the live progress line, and the SIGINT handling that lets a
Ctrl-C end the run with its best plan instead of killing it.

A process that starts with SIGINT ignored (a background job of a
non-interactive shell) cannot be interrupted, and cpsat keeps it so: it
installs no handler and does not let CP-SAT catch SIGINT, and the run ends at
its time limit or proof (:func:`..staged.backends.sigint_ignored`)."""

from __future__ import annotations

import signal
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator

from ortools.sat.python import cp_model

from ..staged.backends import sigint_ignored


@dataclass
class Trace:
    """Incumbents and bounds as the solver reports them (CSV with ``--log``)."""

    start: float
    rows: list[tuple[str, float, float | None, float | None]] = field(default_factory=list)
    first: float | None = None
    best: float | None = None
    incumbent: float | None = None
    bound: float | None = None
    lowest_peak: float | None = None  # bytes: the search for a plan within the budget (search.fit)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def solution(self, phase: str, value: float, bound: float | None) -> None:
        with self.lock:
            t = time.perf_counter() - self.start
            if phase == "fit":
                self.lowest_peak = value
            if phase == "primary":
                if self.first is None:
                    self.first = t
                if self.incumbent is None or value < self.incumbent:
                    self.best, self.incumbent = t, value
                if bound is not None:
                    self.bound = bound
            self.rows.append((phase, t, value, bound))

    def new_bound(self, phase: str, bound: float) -> None:
        with self.lock:
            if phase == "primary":
                self.bound = bound
            self.rows.append((phase, time.perf_counter() - self.start, None, bound))

    def write(self, path: str) -> None:
        with open(path, "w") as f:
            f.write("phase,elapsed_s,incumbent,bound\n")
            for phase, t, inc, bnd in self.rows:
                f.write(f"{phase},{t:.4f},{'' if inc is None else inc},{'' if bnd is None else bnd}\n")


class SolutionCallback(cp_model.CpSolverSolutionCallback):
    """Records each solution; stops the search at the first one whose
    objective is at most ``stop_at`` (then ``stopped``)."""

    def __init__(self, trace: Trace, phase: str, to_units: Any, stop_at: int | None = None) -> None:
        super().__init__()
        self.trace, self.phase, self.to_units, self.stop_at = trace, phase, to_units, stop_at
        self.stopped = False

    def on_solution_callback(self) -> None:
        self.trace.solution(self.phase, self.to_units(self.objective_value),
                            self.to_units(self.best_objective_bound))
        if self.stop_at is not None and self.objective_value <= self.stop_at:
            self.stopped = True
            self.stop_search()


class Interrupt:
    """Whether Ctrl-C has asked the run to stop: the one piece of state a
    cpsat run shares with a signal handler and with CP-SAT's early stops."""

    def __init__(self) -> None:
        self.requested = False


@contextmanager
def deferred_sigint(stop: Interrupt) -> Iterator[None]:
    """While the block runs, SIGINT sets ``stop.requested`` instead of
    raising (main thread only: elsewhere signals cannot be handled; SIGINT
    ignored stays ignored)."""
    if threading.current_thread() is not threading.main_thread() or sigint_ignored():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        stop.requested = True

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@contextmanager
def live_progress(trace: Trace, enabled: bool) -> Iterator[None]:
    """Elapsed time, incumbent, bound and gap on stderr while the solver runs."""
    if not enabled:
        yield
        return
    from rich.console import Console
    from rich.live import Live
    from rich.text import Text

    class _Line:
        def __rich__(self) -> Text:
            return Text(progress_line(trace))

    with Live(_Line(), console=Console(stderr=True), refresh_per_second=4, transient=True):
        yield


def progress_line(trace: Trace) -> str:
    """The progress line: the incumbent, bound and gap, or while there is no
    plan within the budget yet, the peak search's lowest peak."""
    t = time.perf_counter() - trace.start
    inc, bnd = trace.incumbent, trace.bound
    if inc is None and trace.lowest_peak is not None:
        return f"cpsat {t:6.1f}s  no plan within the budget yet, lowest peak {trace.lowest_peak:,.0f} B"
    gap = "" if inc is None or bnd is None or not inc else f"  gap {(inc - bnd) / abs(inc):.2%}"
    return (f"cpsat {t:6.1f}s  incumbent {'-' if inc is None else f'{inc:.6g}'}"
            f"  bound {'-' if bnd is None else f'{bnd:.6g}'}{gap}")
