"""Starting the worker processes (:mod:`.worker`) from the bench, each under a wall-clock limit, and
stopping them all on Ctrl-C or the end of ``--time-limit``."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable

from .settings import CPU_SCHEDULER


class Stopped(Exception):
    """Ctrl-C, or the time limit running out in another task: this task's worker was ended, its results dropped."""


class Workers:
    """The bench's worker processes: what each kind spent (``spent``, for the report's time table; ``ran``,
    when each ran), and the ones running now, so that Ctrl-C, or the time limit running out in one task,
    ends the others' at once (:meth:`stop`)."""

    def __init__(self, spent: dict[str, dict[str, float]] | None = None):
        self.spent = {} if spent is None else spent
        self.ran: list[tuple[str, str, float, float, float]] = []  # kind, model, start, end (time.time()), CPU s
        self.lock = threading.Lock()
        self.procs: set[subprocess.Popen] = set()
        self.stopping = False

    def kill(self, proc: subprocess.Popen) -> None:
        """SIGKILL ``proc`` unless :meth:`reap` has reaped it (a reaped process's id may be another's)."""
        with self.lock:
            if proc.returncode is None:
                os.kill(proc.pid, signal.SIGKILL)

    def reap(self, proc: subprocess.Popen) -> float:
        """Wait for ``proc`` to end; its CPU seconds, its own and its children's (the timing worker's
        variant processes): ``os.wait4``'s, the one child's, where ``RUSAGE_CHILDREN`` would count the
        other task's worker too."""
        os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)  # ended, not reaped: a kill now is harmless
        with self.lock:
            _, status, usage = os.wait4(proc.pid, 0)
            proc.returncode = os.waitstatus_to_exitcode(status)
            self.procs.discard(proc)
        return usage.ru_utime + usage.ru_stime

    def stop(self) -> None:
        with self.lock:
            self.stopping = True
            running = list(self.procs)
        for proc in running:
            self.kill(proc)


def run_worker(spec: dict, env: dict, timeout: float, workers: Workers | None = None, kind: str = "",
            each: Callable[[dict], None] | None = None) -> dict:
    """Run a worker (:func:`.worker.main`) in a fresh interpreter; its last JSON line, or ``{"error": ...}``.
    ``each`` gets every ``{"row": ...}`` line as the worker prints it. Its wall and CPU seconds, and
    its phases', are added to ``workers.spent[kind]``."""
    workers = workers or Workers()
    if timeout <= 0:
        raise OutOfTime
    started, killed = time.time(), threading.Event()
    lines: list[str] = []
    with tempfile.TemporaryFile("w+") as err:
        with workers.lock:
            if workers.stopping:
                raise Stopped
            proc = subprocess.Popen([sys.executable, "-m", "rematopt.studies.device.worker",
                                     json.dumps({**spec, "launched": started})],
                                    stdout=subprocess.PIPE, stderr=err, text=True, env=env, cwd=spec["cwd"])
            workers.procs.add(proc)
        timer = threading.Timer(timeout, lambda: (killed.set(), workers.kill(proc)))
        timer.start()
        try:
            for line in proc.stdout:
                if each and line.startswith('{"row"') and not workers.stopping:
                    each(json.loads(line))
                elif line.strip():
                    lines.append(line)
        except BaseException:  # Ctrl-C: the worker goes with the run
            workers.kill(proc)
            raise
        finally:
            timer.cancel()
            cpu = workers.reap(proc)
            proc.stdout.close()
            with workers.lock:
                into = workers.spent.setdefault(kind, {"processes": 0, "wall": 0.0, "cpu": 0.0})
                into["processes"] += 1
                into["wall"] += time.time() - started
                into["cpu"] += cpu
                workers.ran.append((kind, spec.get("label", ""), started, time.time(), cpu))
        if workers.stopping:
            raise Stopped
        if killed.is_set():
            return {"error": f"stopped after {timeout:.0f} s of wall clock"}
        if proc.returncode != 0 or not lines:
            err.seek(0)
            last = [ln for ln in err.read().strip().splitlines()  # the exception's line, not JAX's traceback note
                    if ln.strip() and not ln.startswith(("For simplicity, JAX", "-----"))]
            return {"error": (last[-1] if last else f"exit status {proc.returncode}")[:300]}
    got = json.loads(lines[-1])
    with workers.lock:
        for phase, seconds in got.pop("phases", {}).items():
            workers.spent[kind][phase] = workers.spent[kind].get(phase, 0.0) + seconds
    return got


def cpu_seconds(who: int = resource.RUSAGE_SELF) -> float:
    """The CPU seconds (user + system) of this process, all its threads, or with ``resource.RUSAGE_CHILDREN``
    of its finished children."""
    ru = resource.getrusage(who)
    return ru.ru_utime + ru.ru_stime


def busy_cpu() -> float | None:
    """The CPU seconds every process on this machine has run since it started (``/proc/stat``: user, nice,
    system, irq and softirq time), or None where the kernel does not say (not Linux). Less the bench's
    own, it is what ran beside a timing: on the pinned core, another process's time does not count in a
    step's CPU time, but what it leaves in the core's caches does (:func:`.bench._time`)."""
    try:
        first = Path("/proc/stat").read_text().split("\n", 1)[0].split()
    except OSError:
        return None
    if len(first) < 8 or first[0] != "cpu":
        return None
    user, nice, system, _idle, _iowait, irq, softirq = map(int, first[1:8])
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def worker_env() -> dict[str, str]:
    """A worker's environment: this rematopt first on the path, XLA's CPU memory-minimizing scheduler on."""
    return {**os.environ, "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} {CPU_SCHEDULER}".strip(),
            "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[3]), os.environ.get("PYTHONPATH", "")])}


class OutOfTime(Exception):
    """The command's --time-limit ran out: the rows finished before it are kept."""
