"""``rematopt bench device``: the remat JAX users write against rematopt's plans, as the device runs them.

For each model, every variant of its training step (``jax.jit(jax.value_and_grad(loss))``) is
compiled and run once on the backend present, on a GPU each in a fresh process (so one row's memory
does not leak into the next row's device peak), on CPU a model's rows in one (the peak there is the
compiled program's), two such processes at a time, the timing processes alone (:func:`_model_tasks`):

- ``plain``: the step as written;
- ``layer:<policy>`` / ``step:<policy>``: the factory's ``remat=`` per layer, in the model library's
  idiom, and on the whole loss;
- ``xla-gpu@r`` (GPU only): the plain step under XLA's own GPU rematerialization, its slop factor
  aimed at r x the plain step's compiled peak;
- ``rematopt@r``: a plan for r x the plain step's peak applied with ``rematopt.jax.apply_plan``,
  from ``--verify xla``'s loop on CP-SAT's deterministic clock, so the plans are the same on any load.

Each row: XLA's compiled peak (``peak_memory_in_bytes`` on GPU / TPU; temp + arguments + outputs -
aliases on CPU, which computes no peak), the device's peak where it reports one, and the largest
gradient difference from the plain step. Then every variant of the model is timed in interleaved
rounds, each in a process of its own (and a second compile of the plain step, ``plain (again)``,
beside them: the noise floor); a row's step time is its fastest round. On CPU the clock is the
process's CPU time with the worker pinned to one core, so the other work on a shared machine does
not enter the figure; on a GPU, wall-clock time. Last, each row's kernels are priced
(:mod:`rematopt.xla.cost`) on the rates micro-benchmarks measured on the core
(:mod:`rematopt.xla.machine`; on a GPU its data sheet), scaled so that the plain step's predicted
time is its measured time, plus on CPU the page faults the compiled program predicts
(:func:`rematopt.xla.cost.step_faults`) at their measured price; every other row is predicted. On
CPU every row runs under XLA's memory-minimizing scheduler
(``--xla_cpu_enable_concurrency_optimized_scheduler=false``), without which XLA's CPU schedule
undoes rematerialization.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from ..importers.costmodel import profile_for
from ..xla.cost import KERNEL_CLASSES, Calibration, StepCost, calibrate, profiled_by_class
from ..xla.machine import Machine
from .schedule import Task, run_tasks

CPU_SCHEDULER = "--xla_cpu_enable_concurrency_optimized_scheduler=false"
POLICIES = ("nothing_saveable", "dots_saveable", "dots_with_no_batch_dims_saveable")
RATIOS = (0.8, 0.6, 0.5)
# --quick: fewer rows and one budget (7.6 min of CPU on the idle 2-core machine, 62% of it planning: 6 min 13 s
# one process after another, 4 min 20 s two at a time, measured at 9538fcc; 4 min 26 s at b286b1b; on
# 2026-12-06's slower machine 5 min 29 s at 3008b92, 4 min 36 s planning in 3 rounds an order; docs/device.md)
QUICK_POLICIES = {"layer": ("nothing_saveable", "dots_saveable"), "step": ("dots_saveable",)}
QUICK_RATIOS = (0.8,)
# Interleaved timing rounds (one step of every variant each). On the shared 2-core machine the CPU
# time of one step varies by under 5% between rounds (quick gpt, load average 10); the fastest of
# 5 rounds is steady to within that.
ROUNDS, QUICK_ROUNDS = 9, 5
# Short steps get more rounds, up to ROUND_SECONDS of each variant's steps (at most MAX_ROUNDS): quick
# keras_llama's 12.8 ms steps, fastest of 5 rounds, differed by 10.6% between the even and odd rounds.
ROUND_SECONDS, MAX_ROUNDS = 0.5, 60
# Steps profiled per kernel (xla.profile.kernel_seconds), each kernel's fastest taken: the plain step's
# for the per-class calibration, the plans' for the report. quick gpt's plain step profiled 218 ms of
# kernels in its fastest of 5 (wall time, pinned, a load average of 5).
PROFILE_STEPS = 5
AGAIN = "plain (again)"
# XLA's GPU memory limit is (0.8 x device memory - inputs - outputs) x slop / 100 (issue 36).
GPU_LIMIT_SHARE = 0.8
# Planning runs on CP-SAT's deterministic clock (one worker, seed 0; rematopt.planners.meter), so the
# same plans come out at any load: D deterministic seconds per budget's closed loop, in at most
# PLAN_ROUNDS rounds per order (each round compiles its plan twice on CPU: the rounds are the time).
# Quick at D = 5 and 8 rounds made the plans the 40 wall seconds had made (gpt 107.49 MB compiled, +5.5%
# on the graph, in 11 rounds; unet 8.38 MB, +0.0%, 7 rounds; flax_linen 12.26 MB against 12.13, 10
# rounds); at 4 rounds gpt's plan was +7.0%, but every quick plan still fits at 0.8 and is at or below
# the fastest fitting baseline, and quick took 6 min 13 s on the idle 2-core machine (planning 189 of
# its 372 s) where 8 rounds took 9 min of CPU: quick planned in 4. On the slower machine of 2026-12-06
# 4 rounds took 5 min 29 s (planning 368 s of CPU), 3 rounds 4 min 36 s (281 s): every quick plan still
# fits and is at or below the fastest fitting baseline (keras_llama 0.952x, its plan +34% on the graph
# against +9%; gpt +2.8% against +6.5%): quick plans in 3. The full sizes: 4 rounds, so that the four
# models' three budgets end within the hour the full run had (quick gpt's 8 rounds took 99 s of CPU).
DETERMINISTIC_S, QUICK_DETERMINISTIC_S = 10.0, 5.0
PLAN_ROUNDS, QUICK_PLAN_ROUNDS = 4, 3
# The wall clock's bound on one budget's loop where the command has no --time-limit: far above what D
# takes, so that only a machine many times slower cuts it (a cut loop says so: stopped_by time_limit).
PLAN_WALL_S = 1800.0
# A row, measuring or timing process never runs longer than this.
WORKER_WALL_S = 900.0
# On CPU, the row and planning processes run this many at a time, each row process pinned to a core of
# its own: the 2-core machine ran them one after another, one core idle (quick on the idle machine:
# rows 89 s, planning 189 s of its 372 s; two at a time on the loaded machine, two processes ran at once
# for 790 of its 1,008 s; docs/device.md).
AT_ONCE = 2
# On an accelerator, the processes at once: each budget's planning in a process of its own on the host's
# cores (CP-SAT on one worker, XLA's compiles), beside one process at a time measuring rows on the
# device; timing alone. A lent GPU host has 16 cores and 15 minutes, and the CPU run's gpt planning alone
# took 624 s of its 1,685 s for three budgets one after another (docs/device.md, "On a GPU").
GPU_AT_ONCE = 8


@dataclass(frozen=True)
class Model:
    label: str
    spec: str  # MODULE:FACTORY
    config: dict  # on CPU
    quick: dict  # under --quick, on any backend
    accelerator: dict  # on a GPU or TPU

    def config_for(self, backend: str, quick: bool) -> dict:
        return self.quick if quick else self.config if backend == "cpu" else self.accelerator


# Defaults: the GPT decoder at a size where activations dominate (issue 36), a U-Net, one Flax and
# one Keras model. On CPU, sizes chosen so a row compiles and runs in seconds on the 2-core machine. On
# an accelerator, widths, sequences and images at the size of ../shared/gpu's GPT step (its plain step
# 16.1 GB as XLA compiled it on an H200) and layers as on CPU, so planning takes as long as there; every
# one traced at that size on CPU (gpt, keras_llama: 1,699 and 1,079 equations; their outputs 125 and
# 62 GB in all, unet 23, flax_linen 14), none compiled there.
MODELS = {
    "gpt": Model("gpt", "models.gpt:factory", {"layers": 8, "width": 256, "heads": 8, "seq": 256, "batch": 4,
                                               "vocab": 512},
                 {"layers": 4, "width": 64, "heads": 4, "seq": 256, "batch": 8, "vocab": 256},
                 {"layers": 8, "width": 1024, "heads": 16, "seq": 1024, "batch": 8, "vocab": 8192}),
    "unet": Model("unet", "models.unet:factory", {"depth": 3, "channels": 16, "image": 64, "batch": 4},
                  {"depth": 2, "channels": 8, "image": 64, "batch": 4},
                  {"depth": 3, "channels": 64, "image": 256, "batch": 16}),
    "flax_linen": Model("flax_linen", "models.flax_linen:factory",
                        {"layers": 4, "width": 128, "heads": 4, "seq": 128, "vocab": 256, "batch": 4},
                        {"layers": 2, "width": 32, "heads": 2, "seq": 128, "vocab": 64, "batch": 8},
                        {"layers": 4, "width": 1024, "heads": 16, "seq": 1024, "vocab": 8192, "batch": 8}),
    "keras_llama": Model("keras_llama", "models.keras_lm:factory",
                         {"backbone": "llama", "layers": 4, "width": 128, "heads": 4, "kv_heads": 2, "hidden": 256,
                          "seq": 128, "vocab": 256, "batch": 4},
                         {"backbone": "llama", "layers": 2, "width": 32, "heads": 4, "kv_heads": 2, "hidden": 64,
                          "seq": 128, "vocab": 64, "batch": 8},
                         {"backbone": "llama", "layers": 4, "width": 1024, "heads": 16, "kv_heads": 8,
                          "hidden": 2816, "seq": 1024, "vocab": 8192, "batch": 8}),
}
DEFAULT_MODELS = tuple(MODELS)
# not a default: the smallest step, for checking the bench itself
MODELS["mlp"] = Model("mlp", "models.mlp:factory", {"layers": 8, "width": 512, "batch": 256},
                      {"layers": 3, "width": 32, "in_dim": 16, "batch": 16},
                      {"layers": 8, "width": 4096, "batch": 4096})


@dataclass
class Row:
    model: str
    variant: str
    kind: str  # plain, layer, step, xla-gpu, rematopt
    budget_ratio: float | None = None
    compiled_peak: int | None = None
    compiled_peak_is: str = ""
    device_peak: int | None = None
    step_ms: float | None = None
    step_ms_spread: float | None = None  # fastest step of the even rounds against the odd ones, over step_ms
    predicted_ms: float | None = None  # kernels priced on the profile calibrated on the plain step, and page faults
    predicted_raw_ms: float | None = None  # on the data-sheet profile
    predicted_class_ms: float | None = None  # as predicted_ms, one scale per kernel class (xla.cost.kernel_class)
    predicted_peak: int | None = None  # the plan's peak on the graph (rematopt rows)
    predicted_overhead: float | None = None  # the plan's recompute overhead on the graph
    page_faults: int | None = None  # minor page faults per step (median over the rounds)
    predicted_faults: int | None = None  # per step, from the compiled program (xla.cost.step_faults)
    kernels: int | None = None
    bytes_moved: int | None = None
    grad_error: float | None = None
    # which limit ended planning (rematopt rows; xla.verify's stopped_by): deterministic_time, max_rounds,
    # bracket (every order's bracket closed first) or time_limit (the wall clock cut it: not reproducible)
    stopped_by: str | None = None
    deterministic_spent: float | None = None  # the deterministic seconds cpsat spent on the plan
    rounds: int | None = None  # the planning rounds the loop ran, all orders together (rematopt rows)
    compile_s: float | None = None
    argument_bytes: int | None = None
    output_bytes: int | None = None
    device_memory: int | None = None  # what the device reports it can hold (GPU)
    note: str = ""


# ---------------------------------------------------------------- one row, in its own process

_PHASES: dict[str, float] = {}  # this worker's wall seconds per phase, sent back with its answer


@contextmanager
def _phase(name: str) -> Iterator[None]:
    """Count the block's wall seconds toward this worker's phase ``name`` (the report's time table)."""
    started = time.perf_counter()
    try:
        yield
    finally:
        _PHASES[name] = _PHASES.get(name, 0.0) + time.perf_counter() - started


def _compile(spec: dict):
    """The variant ``spec`` names, compiled: (compiled, args, compile seconds)."""
    import jax

    from ..jax import load_factory

    config = dict(spec["config"])
    if spec.get("remat"):
        config.update(remat=spec["remat"], remat_scope=spec["scope"])
    with _phase("build"):  # the model's library imported, its parameters made
        fn, args = load_factory(spec["model"], **config)
    if spec.get("plan"):
        from ..importers import load as load_graph
        from ..jax import apply_plan
        from ..plan import Plan

        fn = apply_plan(fn, load_graph(spec["graph"]), Plan.load(spec["plan"]), ordered=spec.get("ordered", True),
                        as_planned=spec.get("as_planned", True))
    start = time.perf_counter()
    with _phase("compile"):
        compiled = jax.jit(jax.value_and_grad(fn)).lower(*args).compile(**_options(spec))
    return compiled, args, time.perf_counter() - start


def measure(spec: dict) -> dict:
    """Compile and run one variant once (``spec`` as :func:`_bench_model` makes it): its memory, its
    kernels' price, its gradients against the plain step's; a dict of :class:`Row`'s fields. The
    compiled module's text goes to ``spec["hlo"]`` for the calibration; step times are
    :func:`time_steps`'s."""
    import jax
    import numpy as np

    from ..importers.costmodel import device
    from ..xla.cost import step_cost, step_faults
    from ..xla.memory import xla_reference

    compiled, args, compile_s = _compile(spec)
    backend = jax.default_backend()
    analysis = compiled.memory_analysis()
    ref = xla_reference(analysis, backend)
    text = compiled.as_text()
    Path(spec["hlo"]).write_text(text)
    cost = step_cost(text, device(spec["device"]))
    faults = step_faults(text, int(analysis.temp_size_in_bytes)) if backend == "cpu" else 0
    out = jax.block_until_ready(compiled(*args))
    grads = [np.asarray(x) for x in jax.tree_util.tree_leaves(out[1])]
    if spec["grads"] and not Path(spec["grads"]).exists():
        np.savez(spec["grads"], *grads)
        error = 0.0
    else:
        with np.load(spec["grads"]) as base:
            error = max((float(np.max(np.abs(g - base[f"arr_{i}"]))) for i, g in enumerate(grads)), default=0.0)
    stats = jax.devices()[0].memory_stats() or {}
    return {"compiled_peak": ref.bytes, "compiled_peak_is": ref.what, "device_peak": stats.get("peak_bytes_in_use"),
            "predicted_raw_ms": 1e3 * cost.seconds, "kernels": len(cost.kernels), "bytes_moved": cost.bytes_moved,
            "predicted_faults": faults, "grad_error": error, "compile_s": compile_s, "backend": backend,
            "argument_bytes": int(analysis.argument_size_in_bytes), "output_bytes": int(analysis.output_size_in_bytes),
            "device_memory": stats.get("bytes_limit")}


def time_steps(spec: dict) -> dict:
    """Time every variant of one model in interleaved rounds: each round runs one step of every variant
    (the order rotated each round), so the machine's drift reaches all of them alike. Each variant runs
    in a process of its own (:func:`serve`, pinned like this one), so a step finds glibc's heap as its
    own steps left it, as in a training loop: in one process shared by all, the allocator's state left
    by one variant moved the next one's page faults (quick gpt's 0.8 plan: 25,793 a step alone, as
    :func:`rematopt.xla.cost.step_faults` predicts, 27,313 / 27,713 right after per-layer / whole-step
    dots_saveable's step; per-layer nothing_saveable 44,898 alone, 36,837 after an untimed step of its
    own that followed another variant's). The clock is ``spec["clock"]``: ``cpu``, the process's CPU
    time (pinned to one core, so this is the step's work on that core, whatever else loads the
    machine), or ``wall``; at least ``spec["rounds"]`` rounds, more for short steps (up to
    :data:`ROUND_SECONDS` of each variant's steps). Per variant, its milliseconds and minor page faults
    per round, and its compiled peak (a second copy of a program must match the first). The compiles
    hit JAX's persistent cache the row processes filled. The variants' processes start (interpreter,
    imports, model, compile, warm-up) pinned in turn to the cores of ``spec["start_on"]`` (the bench:
    both cores, nothing else of it running), each with a one-thread XLA pool, and before the rounds
    every thread of each moves to ``spec["pin"]`` (``out["cores"]``: where each variant's threads then
    are). Then each variant of ``spec["profile"]`` is profiled kernel by kernel
    (:func:`rematopt.xla.profile.kernel_seconds`, :data:`PROFILE_STEPS` steps, wall time)."""
    out = {"times": {}, "faults": {}, "peaks": {}, "errors": {}, "profiles": {}, "cores": {}}
    common = {k: v for k, v in spec.items() if k not in ("variants", "profile", "rounds", "start_on")}
    start_on = spec.get("start_on") or ([spec["pin"]] if "pin" in spec else [])
    servers = {}
    # on a GPU the variants' processes share the device: each takes what it uses, not JAX's default 75%
    env = {**os.environ, "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    started = time.perf_counter()
    try:
        for k, (label, variant) in enumerate(spec["variants"].items()):
            pin = {"pin": start_on[k % len(start_on)]} if start_on else {}
            servers[label] = subprocess.Popen(
                [sys.executable, "-m", "rematopt.studies.device",
                 json.dumps({**common, **variant, **pin, "serve": True})],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=spec.get("cwd"), env=env)
        for label in list(servers):
            got = _ask(servers[label])
            if "error" in got:  # one variant's failure is its row's note, the others still run
                out["errors"][label] = got["error"]
                servers.pop(label).kill()
                continue
            out["peaks"][label], out["times"][label], out["faults"][label] = got["peak"], [], []
            if "pin" in spec:
                out["cores"][label] = _move(servers[label].pid, spec["pin"])
        _PHASES["start, compile and warm up each variant"] = time.perf_counter() - started
        labels = list(servers)
        started = time.perf_counter()
        slowest = max((_ask(servers[label], "step")["ms"] for label in labels), default=0.0) / 1e3
        rounds = max(spec["rounds"], min(MAX_ROUNDS, math.ceil(ROUND_SECONDS / max(slowest, 1e-6))))
        out["rounds"] = rounds
        for r in range(rounds):
            for label in labels[r % len(labels):] + labels[:r % len(labels)]:
                got = _ask(servers[label], "step")
                out["times"][label].append(got["ms"])
                out["faults"][label].append(got["faults"])
        _PHASES["rounds"] = time.perf_counter() - started
        with _phase("profile"):
            for label in spec.get("profile", ()):
                if label in servers:
                    out["profiles"][label] = _ask(servers[label], "profile")["profile"]
    finally:
        for server in servers.values():
            server.kill()
            server.wait()
    return out


def _move(pid: int, core: int) -> list[int]:
    """Pin every thread of process ``pid`` to ``core`` (``sched_setaffinity`` moves one thread; a thread
    inherits its maker's cores); the cores its threads may then run on."""
    cores: set[int] = set()
    for tid in map(int, os.listdir(f"/proc/{pid}/task")):
        try:
            os.sched_setaffinity(tid, {core})
            cores |= os.sched_getaffinity(tid)
        except ProcessLookupError:  # the thread ended meanwhile
            pass
    return sorted(cores)


def _ask(server: subprocess.Popen, command: str | None = None) -> dict:
    """Send ``command`` to a :func:`serve` process (none: read its greeting); its JSON answer."""
    if command:
        server.stdin.write(command + "\n")
        server.stdin.flush()
    while True:
        line = server.stdout.readline()
        if not line:
            return {"error": f"the variant's process ended (exit status {server.poll()})"}
        if line.startswith("{"):
            return json.loads(line)


def serve(spec: dict) -> None:
    """One variant's process for :func:`time_steps`: compile it (on the main thread, as a user's program
    does), run its warm-up, print its compiled peak; then per line read, ``step`` runs one step (its
    milliseconds and minor page faults printed), ``profile`` profiles it kernel by kernel; end of input
    ends it. Every step runs on one thread of its own (:func:`rematopt.xla.machine.off_main_thread`), as
    the faults are predicted for: compiled (from JAX's persistent cache) on that thread too, quick gpt's
    whole-step dots_saveable step faulted 19,273 pages a step in the bench where it faults 43,721 so,
    as predicted (43,849)."""
    import jax

    from ..xla.machine import off_main_thread
    from ..xla.memory import xla_reference
    from ..xla.profile import kernel_seconds

    clock = time.process_time if spec["clock"] == "cpu" else time.perf_counter
    try:
        compiled, args, _ = _compile(spec)
    except Exception as e:
        print(json.dumps({"error": _why(e)}), flush=True)
        return

    def loop() -> None:
        jax.block_until_ready(compiled(*args))  # the warm-up
        print(json.dumps({"peak": xla_reference(compiled.memory_analysis(), jax.default_backend()).bytes}), flush=True)
        for line in sys.stdin:
            if line.strip() == "step":
                faults, t = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, clock()
                jax.block_until_ready(compiled(*args))
                ms = 1e3 * (clock() - t)
                print(json.dumps({"ms": ms, "faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults}),
                      flush=True)
            elif line.strip() == "profile":
                print(json.dumps({"profile": kernel_seconds(compiled, args, steps=PROFILE_STEPS)}), flush=True)

    off_main_thread(loop)


def _why(e: Exception, width: int = 200) -> str:
    """A worker's failure as its row's note: the exception's type and the first line of its message."""
    return f"{type(e).__name__}: {str(e).splitlines()[0][:width] if str(e) else ''}"


def _options(spec: dict) -> dict:
    return {"compiler_options": {"xla_gpu_memory_limit_slop_factor": spec["slop"]}} if spec.get("slop") else {}


def plan_step(spec: dict) -> dict:
    """Trace the step on XLA's compiled groups (``fuse="xla"``) and run ``--verify xla``'s closed loop
    (:func:`rematopt.xla.verify.verify`, no stock candidates: the bench measures those itself) at
    each ratio, its candidates priced as ``rematopt solve --verify xla`` prices them (on CPU the fixed
    :data:`~rematopt.xla.machine.REFERENCE`: priced on each run's measured rates, flax_linen 0.8's
    choice swapped between plans of 63.06 and 63.08 ms; elsewhere the named device's data sheet, the
    bench's profile); the graph and each ratio's chosen plan saved under ``spec["dir"]``. Where the loop
    fails, plain cpsat on the per-equation graph at r x its no-remat peak, and the note says why."""
    from ..jax import load_factory, trace_grad
    from ..solve import solve
    from ..xla.verify import verify

    with _phase("build"):
        fn, args = load_factory(spec["model"], **spec["config"])
    folder = Path(spec["dir"])
    out: dict = {"plans": {}}
    graph = None
    for ratio in spec["ratios"]:
        path = folder / f"plan_{ratio}.json"
        wall = min(PLAN_WALL_S, spec["until"] - time.time())  # the command's wall clock, the outer bound
        try:
            if graph is None:
                with _phase("trace"):
                    graph = trace_grad(fn, *args, name=spec["label"], fuse="xla", device=spec["device"])
            with _phase("closed loop"):
                v = verify(fn, args, graph, "cpsat", ratio, time_limit=wall, stock={},
                           deterministic_time=spec["deterministic_time"], max_rounds=spec["max_rounds"])
        except Exception as e:  # the loop's failure is a finding of the bench, reported on the row
            why = f"--verify xla failed ({_why(e, 120)})"
            fallback = trace_grad(fn, *args, name=spec["label"], device=spec["device"])
            sol = solve(fallback, "cpsat", budget_ratio=ratio, time_limit=max(1.0, spec["until"] - time.time()),
                        deterministic_time=spec["deterministic_time"] / 2, workers=1, lp_bound=False,
                        check_budget=False)
            if sol.replay is None:
                out["plans"][str(ratio)] = {"status": f"{why}; cpsat: {sol.plan.stats.status}"}
                continue
            fallback.save(folder / f"graph_{ratio}.json")
            sol.plan.save(path)
            out["plans"][str(ratio)] = {"status": f"{why}; cpsat {sol.plan.stats.status} on the per-equation graph "
                                                  f"at r x its peak", "path": str(path),
                                        "graph": str(folder / f"graph_{ratio}.json"), "nodes": fallback.n,
                                        "peak": sol.replay.peak_bytes, "overhead": sol.replay.overhead,
                                        "stopped_by": sol.plan.stats.get("stopped_by") or "bracket",
                                        "deterministic_spent": sol.plan.stats.get("deterministic_spent")}
            continue
        c = v.chosen
        loop = {"stopped_by": v.stopped_by or "bracket", "rounds": v.rounds,
                "deterministic_spent": v.deterministic_spent, "chosen_by": v.chosen_by,
                "fault_rounds": sum(r.aim != "budget" for r in v.planning)}
        if c.plan is None:
            out["plans"][str(ratio)] = {"status": f"--verify xla: no plan compiled smaller than the plain step after "
                                                  f"{v.rounds} rounds", **loop}
            continue
        graph.save(folder / "graph.json")
        c.plan.save(path)
        faults = f" ({loop['fault_rounds']} aimed under the mmap ceiling)" if loop["fault_rounds"] else ""
        out["plans"][str(ratio)] = {"status": f"--verify xla: cpsat {c.status}, {'fits' if c.fits else 'misses'} "
                                              f"after {v.rounds} round{'s' * (v.rounds != 1)}{faults}, chosen by "
                                              f"{v.chosen_by}",
                                    "path": str(path), "graph": str(folder / "graph.json"), "nodes": graph.n,
                                    "peak": c.predicted_peak, "overhead": c.overhead, "ordered": c.ordered,
                                    "as_planned": c.as_planned,
                                    **loop}
    return out


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


def _worker(spec: dict, env: dict, timeout: float, workers: Workers | None = None, kind: str = "",
            each: Callable[[dict], None] | None = None) -> dict:
    """Run a worker (:func:`main`) in a fresh interpreter; its last JSON line, or ``{"error": ...}``.
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
            proc = subprocess.Popen([sys.executable, "-m", "rematopt.studies.device",
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


def _children_cpu() -> float:
    """The CPU seconds (user + system) of this process's finished children."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def worker_env() -> dict[str, str]:
    """A worker's environment: this rematopt first on the path, XLA's CPU memory-minimizing scheduler on."""
    return {**os.environ, "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} {CPU_SCHEDULER}".strip(),
            "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH", "")])}


class OutOfTime(Exception):
    """The command's --time-limit ran out: the rows finished before it are kept."""


# ---------------------------------------------------------------- the bench

@dataclass
class Bench:
    backend: str
    device: str  # the cost profile's name
    kind: str = ""  # the device as XLA names it (device_kind)
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    planning: str = ""
    ratios: tuple[float, ...] = RATIOS
    deterministic_time: float | None = None  # each budget's planning, in CP-SAT's deterministic seconds
    clock: str = "cpu"  # what a step time is: "cpu" (the process's CPU time, one core) or "wall"
    costs: dict[tuple[str, str], StepCost] = field(default_factory=dict)  # (model, variant): its kernels, data sheet
    machine: Machine | None = None  # the CPU's measured rates (None on a GPU: its data sheet)
    calibrations: dict[str, Calibration | str] = field(default_factory=dict)  # per model, or why there is none
    # (model, variant): seconds per kernel name, profiled in the timing process (plain and the plans)
    profiles: dict[tuple[str, str], dict[str, float]] = field(default_factory=dict)
    class_calibrations: dict[str, Calibration | str] = field(default_factory=dict)  # per kernel class, per model
    # per kind of worker process: how many, their wall and CPU seconds, and their phases' wall seconds
    spent: dict[str, dict[str, float]] = field(default_factory=dict)
    run: dict[str, float] = field(default_factory=dict)  # the whole run: wall, cpu, load_start, load_end, two_at_once
    processes: list[tuple[str, str, float, float, float]] = field(default_factory=list)  # Workers.ran


def run_bench(models: tuple[str, ...] = DEFAULT_MODELS, quick: bool = False, runs: int | None = None,
              ratios: tuple[float, ...] | None = None, time_limit: float | None = None, out: Path | None = None,
              progress: Callable[[str], None] = print, cwd: Path | None = None,
              configs: dict[str, dict] | None = None, deterministic_time: float | None = None,
              work: Path | None = None) -> Bench:
    """Measure every variant of every model; writes the report after each row (Ctrl-C, or the end of
    ``time_limit``, the whole run's wall seconds, keeps them). Each budget's plan is cpsat's under
    ``deterministic_time`` deterministic seconds (default :data:`DETERMINISTIC_S`, quick
    :data:`QUICK_DETERMINISTIC_S`), so the plans are the same at any load. On CPU the models' row and
    planning processes run :data:`AT_ONCE` at a time, and each model's timing process with none beside
    it (:func:`_model_tasks`). The workers' files (per model: its traced graph, plans, compiled modules,
    gradients and JAX's compile cache, 5 to 50 MB) go to a folder of each model's under ``work``, kept
    for a plan to be applied or profiled again; without ``work``, under a temporary folder removed at
    the end."""
    cwd = cwd or Path.cwd()
    until = time.time() + (time_limit if time_limit is not None else math.inf)
    runs = runs or (QUICK_ROUNDS if quick else ROUNDS)
    ratios = ratios or (QUICK_RATIOS if quick else RATIOS)
    if deterministic_time is None:
        deterministic_time = QUICK_DETERMINISTIC_S if quick else DETERMINISTIC_S
    env = worker_env()
    started, cpu, load = time.time(), _children_cpu(), os.getloadavg()[0]
    workers = Workers()
    probed = _worker({"probe": True, "cwd": str(cwd)}, env, 120, workers, "probe")
    backend, kind = probed.get("backend", "cpu"), probed.get("kind", "")
    bench = Bench(backend, profile_for(backend, kind), kind=kind, ratios=ratios, deterministic_time=deterministic_time,
                  clock="cpu" if backend == "cpu" else "wall", spent=workers.spent, processes=workers.ran)
    bench.planning = ("cpsat on the graph traced with fuse='xla' (nodes as XLA's compiled plain step makes "
                      "them) under --verify xla's closed loop (rematopt.xla.verify, stock policies left out: "
                      "they are rows of their own): the planning budget is bisected until the applied plan's "
                      "compiled peak fits r x the compiled plain peak; of the plans that fit, the one of least "
                      "priced time (its compiled kernels on xla.machine.REFERENCE's rates, fixed so that the choice "
                      "repeats, its predicted page faults at their price; on a GPU the device's data sheet), and "
                      "where it still faults on a temp buffer above glibc's mmap ceiling, up to two more rounds "
                      "aimed under it")
    cores = sorted(os.sched_getaffinity(0))
    slots = min(AT_ONCE if backend == "cpu" else GPU_AT_ONCE, len(cores))
    if backend == "cpu":
        bench.notes.append(f"CPU rows run under XLA_FLAGS={CPU_SCHEDULER} (the memory-minimizing scheduler), "
                           f"each measuring worker pinned to one core (timing: core {cores[0]}, nothing else of "
                           "the bench beside it).")
    if work:
        work.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="rematopt-device-", dir=work))
    try:
        if backend == "cpu":
            got = _worker({"machine": True, "pin": cores[0], "cwd": str(cwd)}, env,
                          min(300, until - time.time()), workers, "micro-benchmarks")
            if "error" in got:
                bench.notes.append(f"the micro-benchmarks failed ({got['error']}): the data sheet's rates are scaled")
            else:
                bench.machine = Machine(**got)
                progress(f"machine: {bench.machine.describe()}")
        lock = threading.RLock()
        tasks = [_model_tasks(bench, MODELS[name], (configs or {}).get(name) or
                              MODELS[name].config_for(backend, quick), runs, ratios, until, quick,
                              env, cwd, out, progress, workers, lock, cores, models, scratch) for name in models]
        run_tasks(_order(tasks, slots, rows_first=backend != "cpu"), slots, stop=workers.stop)
    except KeyboardInterrupt:
        bench.notes.append("interrupted (Ctrl-C): the rows above are the ones that finished.")
        progress("interrupted: keeping the finished rows")
    except OutOfTime:
        bench.notes.append(f"the time limit ({time_limit:g} s) ran out: the rows above are the ones that finished.")
        progress("out of time: keeping the finished rows")
    finally:
        if not work:
            shutil.rmtree(scratch, ignore_errors=True)
    bench.run = {"wall": time.time() - started, "cpu": _children_cpu() - cpu, "load_start": load,
                 "load_end": os.getloadavg()[0], "two_at_once": _overlap(workers.ran)}
    if out:
        write_report(bench, out)
    return bench


def _order(tasks: list[list[Task]], slots: int, rows_first: bool = False) -> list[Task]:
    """The models' tasks (each :func:`_model_tasks`'s: rows, planning (one task, or one a budget), plan
    rows, timing) in the order :func:`run_tasks` starts them. One at a time, model by model. Several: the
    plan rows first (short, and their model's timing waits on them), then every model's planning (the
    long tasks: started last, one would run on alone at the end while the other core idles), then the
    rows, and the timings last, each alone when nothing else is left. ``rows_first`` (a GPU, whose rows
    hold the device one at a time): the rows before the plannings, so that the plannings, more than the
    slots, do not keep the device idle."""
    if slots == 1:
        return [t for model in tasks for t in model]
    rows, plannings = [m[0] for m in tasks], [t for m in tasks for t in m[1:-2]]
    return ([m[-2] for m in tasks] + (rows + plannings if rows_first else plannings + rows)
            + [m[-1] for m in tasks])


def _overlap(ran: list[tuple[str, str, float, float, float]]) -> float:
    """The wall seconds in which more than one of the worker processes ``ran`` (:attr:`Workers.ran`) ran."""
    edges = sorted([(start, 1) for _, _, start, _, _ in ran] + [(end, -1) for _, _, _, end, _ in ran])
    seconds, running, last = 0.0, 0, 0.0
    for t, step in edges:
        if running > 1:
            seconds += t - last
        running, last = running + step, t
    return seconds


def _model_tasks(bench: Bench, model: Model, config: dict, rounds: int, ratios: tuple[float, ...], until: float,
                 quick: bool, env: dict, cwd: Path, out: Path | None, progress: Callable[[str], None],
                 workers: Workers, lock: threading.RLock, cores: list[int], models: tuple[str, ...],
                 scratch: Path) -> list[Task]:
    """One model's tasks (:func:`rematopt.studies.schedule.run_tasks`), each one worker process: its
    rows (the plain step and the policies), its planning (on CPU one process for every budget; on an
    accelerator one a budget, side by side on the host's cores), its plans' rows, its timing. Planning
    needs none of the rows' results (``--verify xla`` compiles the plain step itself), so it may run
    beside them; the plans' rows need the plans and the plain step's gradients; the timing needs every
    row's spec and runs alone (``Task.alone``): on CPU its clock is a pinned process's CPU time, and a
    process on the other core would share the caches and memory bandwidth with it; on a GPU, a wall
    clock. On a GPU the rows hold the device (``Task.holds``): one process at a time measures there, so
    one row's memory is not beside another's. The rows' compiled peaks are the compiled programs', and
    the plans come from CP-SAT's deterministic clock, so neither depends on what runs beside them.
    ``lock`` guards ``bench`` and the report, which the tasks' threads share; the workers' files go to a
    new folder under ``scratch``."""
    from ..importers.costmodel import device
    from ..xla.cost import step_cost
    from ..xla.hlo import read_hlo

    work = Path(tempfile.mkdtemp(prefix=f"{model.label}-", dir=scratch))
    # the timing process's compiles hit the cache the row processes fill
    env = {**env, "JAX_COMPILATION_CACHE_DIR": str(work / "jax-cache"),
           "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0", "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0"}
    base = {"model": model.spec, "label": model.label, "config": config, "grads": str(work / "grads.npz"),
            "device": bench.device, "cwd": str(cwd)}
    order = {name: k for k, name in enumerate(models)}

    def pin(slot: int) -> dict:
        return {"pin": cores[slot]} if bench.clock == "cpu" else {}

    def timeout(most: float = WORKER_WALL_S) -> float:  # what is left of the command's wall clock
        return min(most, until - time.time())

    def add(r: Row) -> None:
        """``r`` after its model's rows (before the next model's): the report reads model by model."""
        bench.rows.insert(sum(order[x.model] <= order[r.model] for x in bench.rows), r)

    specs: dict[str, dict] = {}  # variant: what compiles it, for the timing process
    made: dict[str, Row] = {}
    planned: dict[str, dict] = {}  # str(ratio): plan_step's record of that budget's plan
    # on an accelerator the planning processes only compile, beside a row process on the device: they
    # take its memory as they need it (CUDA's context, autotuning's buffers: under a GB each), not JAX's
    # default 75% of it at their start. The rows and timing keep the default, so that `bytes_limit`, which
    # aims XLA's GPU remat (_slop), means what it meant.
    planning_env = env if bench.backend == "cpu" else {**env, "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    numbers = itertools.count()  # the model's hlo_<n>.txt files

    def measured(rows: list[tuple[Row, dict]], slot: int) -> None:
        """Measure ``rows`` (each a row and what compiles it). On a GPU each in a fresh process, so one
        row's memory does not leak into the next's device peak. On CPU there is none to leak (the peak is
        the compiled program's; the CPU reports no device peak), so a model's rows share one process,
        which imports JAX and the model's library once: each row's line as it finishes."""
        if not rows:
            return
        hlo = {r.variant: work / f"hlo_{next(numbers)}.txt" for r, _ in rows}
        batches = [rows] if bench.backend == "cpu" else [[r] for r in rows]
        for batch in batches:
            started, reached = [time.perf_counter()], set()

            def record(got: dict) -> None:
                reached.add(got["row"])
                r, extra = batch[got["row"]]
                with lock:
                    if "error" in got:
                        r.note = (r.note + " " if r.note else "") + got["error"]
                    else:
                        for k, v in got.items():
                            if hasattr(r, k) and k != "note":
                                setattr(r, k, v)
                        bench.costs[model.label, r.variant] = step_cost(read_hlo(hlo[r.variant]), device(bench.device))
                        specs[r.variant] = extra
                        made[r.variant] = r
                    add(r)
                    progress(f"{model.label:12} {r.variant:42} "
                             + (f"peak {r.compiled_peak / 1e6:9.2f} MB  {r.kernels:5} kernels" if r.compiled_peak
                                else f"-- {r.note}") + f"  ({time.perf_counter() - started[0]:.0f} s)")
                    started[0] = time.perf_counter()
                    if out:
                        write_report(bench, out)

            got = _worker({**base, **pin(slot), "rows": [{**extra, "hlo": str(hlo[r.variant])} for r, extra in batch]},
                          env, timeout(), workers, "rows", each=record)
            for k in range(len(batch)):  # the rows the process did not reach
                if k not in reached:
                    record({"row": k, "error": got.get("error", "not measured")})

    def rows(slot: int) -> None:
        policies = [(Row(model.label, f"{scope}:{policy}", scope), {"remat": policy, "scope": scope})
                    for scope in ("layer", "step") for policy in (QUICK_POLICIES[scope] if quick else POLICIES)]
        if bench.backend == "cpu":  # the plain step first: its gradients are the others' reference
            measured([(Row(model.label, "plain", "plain"), {"first": True})] + policies, slot)
        else:  # the plain step's peak aims XLA's GPU remat
            measured([(Row(model.label, "plain", "plain"), {})], slot)
            if "plain" in made:
                measured(policies + [(Row(model.label, f"xla-gpu@{r} (slop {_slop(made['plain'], r)})", "xla-gpu",
                                          r), {"slop": _slop(made["plain"], r)}) for r in ratios], slot)

    def planning(budgets: tuple[float, ...]) -> Callable[[int], None]:
        def run(slot: int) -> None:
            started = time.perf_counter()
            got = _worker({**base, "plan_dir": str(work), "ratios": list(budgets),
                           "deterministic_time": bench.deterministic_time,
                           "max_rounds": QUICK_PLAN_ROUNDS if quick else PLAN_ROUNDS,
                           "until": min(until, time.time() + len(budgets) * PLAN_WALL_S)},
                          planning_env, timeout(len(budgets) * PLAN_WALL_S + WORKER_WALL_S), workers, "planning")
            with lock:
                for r in budgets:
                    planned[str(r)] = ({"status": f"planning failed: {got['error']}"} if "error" in got
                                       else got["plans"].get(str(r), {}))
                if "error" in got:
                    bench.notes.append(f"{model.label}: planning failed: {got['error']}")
                progress(f"{model.label:12} planning{'' if budgets == ratios else f'@{budgets[0]}'} "
                         + (f"failed: {got['error']}" if "error" in got else "done")
                         + f"  ({time.perf_counter() - started:.0f} s)")
        return run

    def plan_rows(slot: int) -> None:
        if "plain" not in made:  # no plain step: nothing to compare a plan with
            return
        plans = []
        for ratio in ratios:
            p = planned.get(str(ratio), {})
            if "path" not in p:
                missing = Row(model.label, f"rematopt@{ratio}", "rematopt", ratio,
                              note=f"no plan: {p.get('status', 'not run')}")
                with lock:
                    add(missing)
                    progress(f"{model.label:12} rematopt@{ratio}: {missing.note}")
                continue
            plans.append((Row(model.label, f"rematopt@{ratio}", "rematopt", ratio, predicted_peak=p["peak"],
                              predicted_overhead=p["overhead"], stopped_by=p["stopped_by"],
                              deterministic_spent=p["deterministic_spent"], rounds=p.get("rounds"),
                              note=f"{p['status']}, graph of {p['nodes']} nodes"),
                          {"graph": p["graph"], "plan": p["path"], "ordered": p.get("ordered", True),
                           "as_planned": p.get("as_planned", True)}))
        measured(plans, slot)

    def timing(slot: int) -> None:
        if "plain" not in made:
            return
        # the variants' processes start on both cores (nothing else of the bench runs), then all move to one
        start_on = {"start_on": cores[:AT_ONCE]} if bench.clock == "cpu" else {}
        _time(bench, model.label, specs, base, {**pin(slot), **start_on}, rounds, env, timeout(), progress, workers,
              lock)
        with lock:
            _calibrate(bench, model.label)
            if out:
                write_report(bench, out)

    name, device_rows = model.label, "" if bench.backend == "cpu" else "device"
    groups = [ratios] if bench.backend == "cpu" else [(r,) for r in ratios]
    plannings = [Task(f"{name} planning" + ("" if g == ratios else f"@{g[0]}"), planning(g)) for g in groups]
    return [Task(f"{name} rows", rows, holds=device_rows), *plannings,
            Task(f"{name} plan rows", plan_rows, after=(f"{name} rows", *(t.name for t in plannings)),
                 holds=device_rows),
            Task(f"{name} timing", timing, after=(f"{name} rows", f"{name} plan rows"), alone=True)]


def _time(bench: Bench, model: str, specs: dict[str, dict], base: dict, pin: dict, rounds: int, env: dict,
          timeout: float, progress: Callable[[str], None], workers: Workers, lock: threading.RLock) -> None:
    """Every measured variant's step time from :func:`time_steps` (a process each, interleaved rounds), with
    a second compile of the plain step, timed alongside, as the row ``plain (again)``."""
    started = time.perf_counter()
    variants = {**specs, AGAIN: specs["plain"]}
    profile = [v for v in specs if v == "plain" or v.startswith("rematopt@")]
    got = _worker({**base, **pin, "variants": variants, "rounds": rounds, "clock": bench.clock,
                   "profile": profile}, env, timeout, workers, "timing")
    with lock:
        rows = {r.variant: r for r in bench.rows if r.model == model}
        plain = rows["plain"]
        again = Row(model, AGAIN, "plain", note="a second compile of the plain step, timed in the same rounds: "
                    "the noise floor")
        bench.rows.insert(bench.rows.index(plain) + 1, again)
        if "error" in got:
            again.note = f"timing failed: {got['error']}"
            progress(f"{model:12} timing failed: {got['error']}")
            return
        for variant, times in got["times"].items():
            r = rows.get(variant, again)
            r.step_ms = min(times)
            halves = min(times[0::2]), min(times[1::2] or times)
            r.step_ms_spread = abs(halves[0] - halves[1]) / r.step_ms
            r.page_faults = int(statistics.median(got["faults"][variant]))
        for variant, why in got["errors"].items():
            rows.get(variant, again).note += f" timing failed: {why}"
        for variant, seconds in got.get("profiles", {}).items():
            bench.profiles[model, variant] = seconds
        if AGAIN in got["peaks"]:
            again.compiled_peak, again.compiled_peak_is = got["peaks"][AGAIN], plain.compiled_peak_is
            for k in ("predicted_raw_ms", "kernels", "bytes_moved", "predicted_faults"):
                setattr(again, k, getattr(plain, k))
            bench.costs[model, AGAIN] = bench.costs[model, "plain"]
        progress(f"{model:12} {len(got['times'])} variants timed in {got.get('rounds', rounds)} interleaved rounds "
                 f"({bench.clock} clock; plain {plain.step_ms or float('nan'):.2f} ms, again "
                 f"{again.step_ms or float('nan'):.2f} ms)  ({time.perf_counter() - started:.0f} s)")


def _slop(plain: Row, ratio: float) -> int:
    """The slop factor aiming XLA's GPU remat at ``ratio`` x the plain peak: XLA's limit is
    (0.8 x device memory - inputs - outputs) x slop / 100."""
    args_out = (plain.argument_bytes or 0) + (plain.output_bytes or 0)
    room = GPU_LIMIT_SHARE * (plain.device_memory or 0) - args_out
    if room <= 0:
        return 100
    return max(1, min(100, round(100 * (ratio * plain.compiled_peak - args_out) / room)))


def _calibrate(bench: Bench, model: str) -> None:
    """Scale the profile (the machine's measured rates; on a GPU the data sheet's) so that the plain
    step's predicted time is its measured time (:func:`rematopt.xla.cost.calibrate`), and predict every
    other row on it: the second compile of the plain step, the policies, XLA's GPU remat, the plans.
    Where the plain step was profiled, also one scale per kernel class (``predicted_class_ms``). Only the
    plain step's measurements enter: a row's prediction is a function of its compiled program."""
    from ..importers.costmodel import device

    plain = next((r for r in bench.rows if r.model == model and r.variant == "plain"), None)
    if plain is None or not plain.step_ms or (model, "plain") not in bench.costs:
        bench.calibrations[model] = "the plain step was not timed"
        return
    m = bench.machine
    args = dict(step=bench.costs[model, "plain"], measured_s=plain.step_ms / 1e3,
                device=m.device() if m else device(bench.device), faults=plain.predicted_faults or 0,
                launch_s=m.launch_s if m else 0.0, fault_s=m.fault_s if m else 0.0)
    for into, profiled, field_ in ((bench.calibrations, None, "predicted_ms"),
                                   (bench.class_calibrations, bench.profiles.get((model, "plain")),
                                    "predicted_class_ms")):
        if field_ == "predicted_class_ms" and profiled is None:
            into[model] = "the plain step was not profiled"
            continue
        try:
            c = calibrate(**args, profiled=profiled)
        except ValueError as e:
            into[model] = str(e)
            continue
        into[model] = c
        for r in bench.rows:
            if r.model == model and (model, r.variant) in bench.costs:
                setattr(r, field_, 1e3 * c.seconds(bench.costs[model, r.variant], r.predicted_faults or 0))


# ---------------------------------------------------------------- the report

def noise(bench: Bench, model: str) -> float | None:
    """How far two measurements of one step time can differ: the larger of the relative difference
    between the plain step and its second compile, and, over every variant, between the fastest step
    of the even rounds and of the odd rounds."""
    rows = [r for r in bench.rows if r.model == model and r.step_ms]
    plains = [r.step_ms for r in rows if r.kind == "plain"]
    if not plains:
        return None
    return max([(max(plains) - min(plains)) / min(plains)] + [r.step_ms_spread or 0.0 for r in rows])


def verdict(bench: Bench) -> list[dict]:
    """For each model and budget ratio: the fastest baseline whose compiled peak fits r x the plain
    compiled peak, and rematopt's plan, side by side."""
    out = []
    for model in dict.fromkeys(r.model for r in bench.rows):
        rows = [r for r in bench.rows if r.model == model]
        plain = [r for r in rows if r.kind == "plain" and r.compiled_peak]
        if not plain:
            continue
        peak = plain[0].compiled_peak
        tol = noise(bench, model) or 0.0
        for ratio in sorted(set(bench.ratios) | {r.budget_ratio for r in rows if r.budget_ratio}, reverse=True):
            budget = ratio * peak
            fits = [r for r in rows if r.kind != "rematopt" and r.compiled_peak and r.compiled_peak <= budget
                    and r.step_ms]
            best = min(fits, key=lambda r: r.step_ms) if fits else None
            ours = next((r for r in rows if r.kind == "rematopt" and r.budget_ratio == ratio), None)
            entry = {"model": model, "ratio": ratio, "budget": budget, "baseline": best, "plan": ours,
                     "noise": tol}
            entry["plan_fits"] = bool(ours and ours.compiled_peak and ours.compiled_peak <= budget)
            if best and entry["plan_fits"]:
                entry["time_ratio"] = ours.step_ms / best.step_ms
                entry["verdict"] = ("at or below the baseline" if entry["time_ratio"] <= 1
                                    else "slower, within the noise" if entry["time_ratio"] <= 1 + tol
                                    else "slower than the baseline")
            elif entry["plan_fits"]:
                entry["verdict"] = "fits where no baseline does"
            elif ours and ours.compiled_peak:
                entry["verdict"] = "does not fit as compiled"
            else:
                entry["verdict"] = "no plan"
            entry["why"] = cause(bench, entry)
            out.append(entry)
    return out


SUCCESSES = ("at or below the baseline", "slower, within the noise", "fits where no baseline does")


def cause(bench: Bench, entry: dict) -> str:
    """Why a :func:`verdict` entry is not a success, from its rows' data ("" where it is one): for a
    plan that misses, what ended its loop, how far over it compiled and how far the graph's prediction
    of it was; for a plan slower than the baseline, whether rematopt's own price of the compiled plan
    already ranked it slower (the planner's space or search) or the prediction was off, and the page
    faults where they make up the difference."""
    p, b = entry["plan"], entry["baseline"]
    if entry["verdict"] in SUCCESSES:
        return ""
    if entry["verdict"] == "no plan":
        return p.note if p and p.note else "the bench made no plan at this budget"
    if entry["verdict"] == "does not fit as compiled":
        return _why_over(p, b, entry["budget"])
    return _why_slower(bench, p, b)


def _why_over(p: Row, b: Row | None, budget: float) -> str:
    """A plan whose compiled peak is over the budget: the loop's end, the excess, the graph's prediction."""
    rounds = f"{p.rounds} round{'s' * (p.rounds != 1)}" if p.rounds is not None else "its rounds"
    ended = {"max_rounds": f"the loop stopped on its rounds ({rounds}, at most {PLAN_ROUNDS} an order)",
             "deterministic_time": f"the loop spent its deterministic time ({rounds})",
             "time_limit": f"the wall clock cut the loop ({rounds})",
             "bracket": f"the loop's brackets closed ({rounds}): no planning budget's plan compiled within it"}
    out = [ended.get(p.stopped_by or "", f"the loop ended ({rounds})"),
           f"its least compiled plan {100 * (p.compiled_peak / budget - 1):.1f}% over the budget"]
    if p.predicted_peak:
        error = 100 * (p.compiled_peak / p.predicted_peak - 1)
        out.append(f"the applied step on the graph predicted {_mb(p.predicted_peak)} MB for it "
                   f"({error:+.1f}% compiled), "
                   + ("within the budget: the prediction missed" if p.predicted_peak <= budget
                      else "over the budget too"))
    out.append(f"{b.variant} fits at {_mb(b.compiled_peak)} MB" if b else "no baseline fits either")
    return "; ".join(out)


def _why_slower(bench: Bench, p: Row, b: Row) -> str:
    """A plan that fits but runs slower than the fastest fitting baseline: rematopt's price of both
    compiled programs (as overheads over the plain step), what was measured, and the page faults."""
    base = _plain_ms(bench, p.model)
    slower = f"measured {100 * (p.step_ms / b.step_ms - 1):+.1f}% against {b.variant}"
    if base is None or p.predicted_ms is None or b.predicted_ms is None:
        out = [f"{slower}; not priced (the plain step was not calibrated)"]
    else:
        over = lambda ms, plain: f"{100 * (ms / plain - 1):+.1f}%"  # noqa: E731
        pp, bp = over(p.predicted_ms, base[1]), over(b.predicted_ms, base[1])
        pm, bm = over(p.step_ms, base[0]), over(b.step_ms, base[0])
        if p.predicted_ms >= b.predicted_ms:
            out = [f"rematopt's own price of the compiled plan, {pp} against the plain step, against the baseline's "
                   f"{bp}, ranked it slower already: the planner's space or search (it minimized the graph's "
                   f"recompute cost" + ("" if p.predicted_overhead is None
                                        else f", +{100 * p.predicted_overhead:.1f}% on the graph")
                   + "; the loop chose the least priced of the plans it compiled)"]
        else:
            miss = 100 * ((p.predicted_ms / base[1]) - (p.step_ms / base[0]))
            out = [f"predicted faster than the baseline ({pp} against {bp} over the plain step) but measured "
                   f"slower ({pm} against {bm}): the plan's prediction was off by {miss:+.1f} points"]
        if b.step_ms < base[0] * (1 - (noise(bench, p.model) or 0.0)):
            out.append(f"the baseline runs {bm} against the plain step itself, whose program every plan recomputes "
                       "from")
    c = bench.calibrations.get(p.model)
    fault_s = c.fault_s if isinstance(c, Calibration) else bench.machine.fault_s if bench.machine else 0.0
    if p.page_faults is not None and b.page_faults is not None and fault_s:
        extra_ms = 1e3 * fault_s * (p.page_faults - b.page_faults)
        if extra_ms > 0 and extra_ms >= 0.5 * (p.step_ms - b.step_ms):
            out.append(f"page faults: the plan's step faults {p.page_faults:,} times against the baseline's "
                       f"{b.page_faults:,} ({extra_ms:+.2f} ms of the {p.step_ms - b.step_ms:+.2f} ms)")
    return "; ".join(out)


def _mb(x) -> str:
    return "—" if x is None else f"{x / 1e6:,.2f}"


def _ms(x) -> str:
    return "—" if x is None else f"{x:,.2f}"


def markdown(bench: Bench) -> str:
    import jax

    clock = ("the process's CPU time on one pinned core (other load on the machine does not enter it)"
             if bench.clock == "cpu" else "wall-clock time")
    lines = [f"# rematopt bench device: {bench.backend}", "",
             f"jax {jax.__version__}, backend `{bench.backend}`"
             + (f" ({bench.kind})" if bench.kind not in ("", bench.backend) else "") + ", cost profile "
             + (f"`{bench.device}` at the rates micro-benchmarks measured on the core ({bench.machine.describe()}; "
                "rematopt.xla.machine)" if bench.machine else f"`{bench.device}` (its data sheet's rates)")
             + ", scaled per model so that the plain step's predicted time is its measured time. Step time: "
             f"the fastest of interleaved rounds, each running one step of every variant (more rounds for short "
             f"steps), {clock}. "
             + " ".join(bench.notes), "",
             "## Verdict", "",
             "Budget: r x the plain step's compiled peak. Fastest baseline: the quickest of plain, the "
             "per-layer and whole-step policies (and XLA's GPU remat on a GPU) whose compiled peak fits.", "",
             "| model | r | budget MB | fastest fitting baseline | its MB | its ms | rematopt MB | rematopt ms "
             "| plan / baseline time | noise | verdict |",
             "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---|"]
    for v in verdict(bench):
        b, p = v["baseline"], v["plan"]
        ratio = f"{v['time_ratio']:.3f}" if "time_ratio" in v else "—"
        lines.append(f"| {v['model']} | {v['ratio']} | {_mb(v['budget'])} | {b.variant if b else 'none fits'} | "
                     f"{_mb(b.compiled_peak if b else None)} | {_ms(b.step_ms if b else None)} | "
                     f"{_mb(p.compiled_peak if p else None)} | {_ms(p.step_ms if p else None)} | {ratio} | "
                     f"±{100 * v['noise']:.1f}% | {v['verdict']} |")
    why = [f"- {v['model']} {v['ratio']} ({v['verdict']}): {v['why']}." for v in verdict(bench) if v["why"]]
    lines += ["", "Noise: per model, the largest relative difference between two measurements of one step time: "
              "the plain step against its second compile, and each variant's fastest step in the even rounds "
              "against the odd rounds.", ""]
    lines += ["Why, where the plan misses or is slower (from the rows below; `rounds` are the planning rounds of "
              "--verify xla's loop, both orders together):", "", *why, ""] if why else []
    lines += ["## Predicted against measured", "", _prediction_summary(bench), "",
              "## Where the time went, per kernel class", "", _by_class(bench), "",
              "## Where the run's time went", "", _time_spent(bench), "",
              "## Every row", "", f"Planning: {bench.planning}. {_reproducible(bench)}", "",
              "| model | variant | compiled peak MB | device peak MB | step ms | predicted ms | overhead measured "
              "| overhead predicted | graph: plan peak MB | graph: plan overhead | kernels | GB moved "
              "| page faults per step: predicted / measured | max grad error | compile s "
              "| planning stopped by (deterministic s) | note |",
              "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    for r in bench.rows:
        base = _plain_ms(bench, r.model)
        over = lambda x: "—" if x is None or base is None else f"{100 * (x / base[0] - 1):+.1f}%"  # noqa: E731
        pover = "—" if r.predicted_ms is None or base is None else f"{100 * (r.predicted_ms / base[1] - 1):+.1f}%"
        lines.append(f"| {r.model} | {r.variant} | {_mb(r.compiled_peak)} | {_mb(r.device_peak)} | {_ms(r.step_ms)} "
                     f"| {_ms(r.predicted_ms)} | {over(r.step_ms)} | {pover} | {_mb(r.predicted_peak)} | "
                     f"{'—' if r.predicted_overhead is None else f'{100 * r.predicted_overhead:+.1f}%'} | "
                     f"{r.kernels or '—'} | {'—' if r.bytes_moved is None else f'{r.bytes_moved / 1e9:.2f}'} | "
                     f"{'—' if r.predicted_faults is None else f'{r.predicted_faults:,}'} / "
                     f"{'—' if r.page_faults is None else f'{r.page_faults:,}'} | "
                     f"{'—' if r.grad_error is None else f'{r.grad_error:.1e}'} | "
                     f"{'—' if r.compile_s is None else f'{r.compile_s:.1f}'} | {_stopped(r)} | {r.note} |")
    return "\n".join(lines) + "\n"


def _time_spent(bench: Bench) -> str:
    """The run's wall and CPU seconds, and per kind of worker process where its wall seconds went."""
    run = bench.run
    head = (f"The run: {run['wall']:.0f} s of wall clock, {run['cpu']:.0f} s of CPU, two worker processes at once "
            f"for {run.get('two_at_once', 0.0):.0f} s of it (rows and planning; timing alone), load average "
            f"{run['load_start']:.1f} at its start and {run['load_end']:.1f} at its end ({os.cpu_count()} cores)."
            if run else "The run did not finish.")
    out = [head + _critical_path(bench), "", "| process | count | wall s | CPU s | its phases, wall s |",
           "|---|---:|---:|---:|---|"]
    for kind, d in bench.spent.items():
        phases = {k: v for k, v in d.items() if k not in ("processes", "wall", "cpu")}
        phases["other"] = d["wall"] - sum(phases.values())
        out.append(f"| {kind} | {d['processes']:.0f} | {d['wall']:.1f} | {d['cpu']:.1f} | "
                   + ", ".join(f"{k} {v:.1f}" for k, v in phases.items()) + " |")
    return "\n".join(out)


def _critical_path(bench: Bench) -> str:
    """What the run's processes would take on an idle machine, where a pinned process's CPU seconds are its
    wall seconds: the measuring and planning at least half their CPU (two cores) and at least the longest
    model's chain (its rows or its planning, then its plan rows); the timing processes one after another.
    On CPU only: a GPU host's processes share its device, not two cores."""
    ran = bench.processes
    stage = [p for p in ran if p[0] in ("rows", "planning")]
    timing = [p for p in ran if p[0] == "timing"]
    if not stage or not timing or bench.backend != "cpu":  # a run cut before any timing: no figure for the whole
        return ""
    chains = {}
    for model in dict.fromkeys(p[1] for p in stage):
        rows = sorted((p for p in stage if p[1] == model and p[0] == "rows"), key=lambda p: p[2])
        planning = sum(p[4] for p in stage if p[1] == model and p[0] == "planning")
        chains[model] = max(rows[0][4] if rows else 0.0, planning) + sum(p[4] for p in rows[1:])
    longest = max(chains, key=chains.get)
    cpu = sum(p[4] for p in stage)
    span = max(p[3] for p in stage) - min(p[2] for p in stage)
    # the run's own schedule at full speed: its processes ran at cpu / (their wall seconds) of a core each
    scheduled = max(span * cpu / sum(p[3] - p[2] for p in stage), chains[longest])
    before = sum(p[4] for p in ran if p[0] in ("probe", "micro-benchmarks"))
    timed = sum(p[4] for p in timing)
    return (f" Measuring and planning: {len(stage)} processes, {cpu:.0f} s of CPU in {span:.0f} s of wall clock; "
            f"on an idle machine at least {max(cpu / AT_ONCE, chains[longest]):.0f} s (half their CPU, or "
            f"{longest}'s chain, {chains[longest]:.0f} s: its rows or its planning, then its plan rows), about "
            f"{scheduled:.0f} s as this run's schedule had them (its wall clock times the share of a core each "
            f"process had). Timing, each alone: {len(timing)} process{'es' * (len(timing) != 1)}, {timed:.0f} s of "
            f"CPU. With the probe and micro-benchmarks ({before:.0f} s of CPU), about {before + scheduled + timed:.0f} "
            f"s on an idle machine, taking each process's CPU seconds for its wall seconds.")


def _reproducible(bench: Bench) -> str:
    """Whether the plans are the ones ``deterministic_time`` makes on any load, and which are not."""
    if bench.deterministic_time is None:
        return "Planning ran on the wall clock: the plans may differ between runs."
    cut = [f"{r.model} {r.variant}" for r in bench.rows if r.stopped_by == "time_limit"]
    said = (f"Each budget's loop had {bench.deterministic_time:g} seconds of CP-SAT's deterministic time "
            "(--deterministic-time: one worker, seed 0), so the plans are reproducible: the same on any load, "
            "given the same jax, XLA and OR-Tools")
    return said + (f"; except where the wall clock cut planning ({', '.join(cut)}: `time_limit` below)." if cut
                   else ". The column `planning stopped by` says which limit ended each loop.")


def _stopped(r: Row) -> str:
    if r.stopped_by is None:
        return "—"
    spent = "" if r.deterministic_spent is None else f" ({r.deterministic_spent:.2f})"
    return f"{r.stopped_by}{spent}" + (" (the wall clock: not reproducible)" if r.stopped_by == "time_limit" else "")


def _plain_ms(bench: Bench, model: str) -> tuple[float, float] | None:
    """(measured, predicted) plain step time: the medians over the plain rows."""
    plains = [r for r in bench.rows if r.model == model and r.kind == "plain" and r.step_ms and r.predicted_ms]
    if not plains:
        return None
    return statistics.median(r.step_ms for r in plains), statistics.median(r.predicted_ms for r in plains)


def _prediction_summary(bench: Bench) -> str:
    """Per model: the calibration, how far it predicts the second compile of the plain step and the
    baselines, and the plans: their step time, and their overhead over the plain step (both priced by
    the same function, so the overhead is predicted(plan) / predicted(plain) - 1)."""
    out = ["The profile is scaled on the plain step alone; every other row is predicted: the second compile of "
           "the plain step, the policies, rematopt's plans. Page faults, predicted from the compiled program "
           "(xla.cost.step_faults): the pages of the buffers a step allocates anew above glibc's mmap ceiling, and "
           "the scratch of YNNPACK fusions that glibc gives back to the kernel; each at the measured price.", "",
           "| model | scale on the measured rates | plain's page faults | plain (again): predicted vs measured "
           "| baselines within 15% | worst baseline | plans: predicted vs measured time "
           "| plans: predicted overhead - measured (points) | the same, one scale per kernel class |",
           "|---|---:|---:|---:|---:|---|---|---|---|"]
    for model in dict.fromkeys(r.model for r in bench.rows):
        c = bench.calibrations.get(model)
        base = _plain_ms(bench, model)
        if not isinstance(c, Calibration) or base is None:
            out.append(f"| {model} | not calibrated: {c or 'not timed'} | — | — | — | — | — | — | — |")
            continue
        rows = [r for r in bench.rows if r.model == model and r.step_ms and r.predicted_ms]
        plain = next(r for r in rows if r.variant == "plain")
        errs = [(r.predicted_ms / r.step_ms - 1, r.variant) for r in rows if r.kind != "rematopt" and r is not plain]
        again = next((f"{100 * e:+.1f}%" for e, v in errs if v == AGAIN), "—")
        within = sum(abs(e) <= 0.15 for e, _ in errs)
        worst = max(errs, key=lambda e: abs(e[0]), default=None)
        plans = [r for r in rows if r.kind == "rematopt"]
        times = ", ".join(f"{r.variant} {100 * (r.predicted_ms / r.step_ms - 1):+.1f}%" for r in plans)
        overheads = ", ".join(f"{r.variant} {100 * ((r.predicted_ms / base[1]) - (r.step_ms / base[0])):+.1f}"
                              for r in plans)
        per_class = ", ".join(
            f"{r.variant} {100 * (r.predicted_class_ms / plain.predicted_class_ms - r.step_ms / base[0]):+.1f}"
            for r in plans if r.predicted_class_ms and plain.predicted_class_ms)
        share = (plain.predicted_faults or 0) * c.fault_s * 1e3 / plain.step_ms
        out.append(f"| {model} | x{c.scale:.3g} | {plain.predicted_faults or 0:,} ({100 * share:.0f}% of its time) "
                   f"| {again} | {within} of {len(errs)} | {f'{worst[1]} {100 * worst[0]:+.1f}%' if worst else '—'} "
                   f"| {times or '—'} | {overheads or '—'} | {per_class or '—'} |")
    return "\n".join(out)


def _by_class(bench: Bench) -> str:
    """Per model, for the plain step and each plan: each kernel class's predicted seconds (one scale, and
    one scale per class fitted on the plain step's profile) against its profiled seconds (the fastest run
    of each kernel inside the step, wall time, page faults included where they happen)."""
    out = ["Kernel classes (xla.cost.kernel_class): lone dot (Eigen), matrix fusion (YNNPACK), transposing, "
           "loop fusion, other. Profiled: each kernel's fastest of "
           f"{PROFILE_STEPS} steps inside the program (xla.profile.kernel_seconds, wall time). Predicted: the "
           "class's kernels priced and scaled, without page faults. The per-class scales share the plain step's "
           "measured kernel time among the classes as its profile does; the plans' profiles are not fitted on.",
           "", "| model | class | per-class scale | plain: predicted ms (one scale / per class) | plain: profiled ms "
           "| plan | plan: predicted ms (one scale / per class) | plan: profiled ms |",
           "|---|---|---:|---:|---:|---|---:|---:|"]
    for model in dict.fromkeys(r.model for r in bench.rows):
        one, per = bench.calibrations.get(model), bench.class_calibrations.get(model)
        if not isinstance(one, Calibration) or not isinstance(per, Calibration):
            continue
        def split(variant: str) -> tuple[dict, dict, dict]:
            step = bench.costs[model, variant]
            return one.scaled(step), per.scaled(step), profiled_by_class(step, bench.profiles.get((model, variant), {}))

        plain = split("plain")
        scales = dict(per.class_scales)
        for variant in [r.variant for r in bench.rows if r.model == model and r.kind == "rematopt"
                        and (model, r.variant) in bench.costs]:
            plan = split(variant)
            for c in [c for c in KERNEL_CLASSES if c in plain[0] or c in plan[0]]:
                ms = lambda d: f"{1e3 * d[c]:,.2f}" if c in d else "—"  # noqa: E731
                prof = lambda d, v: ms(d) if (model, v) in bench.profiles else "—"  # noqa: E731
                out.append(f"| {model} | {c} | {'x%.3g' % scales[c] if c in scales else f'x{one.scale:.3g} (global)'} "
                           f"| {ms(plain[0])} / {ms(plain[1])} | {prof(plain[2], 'plain')} | {variant} "
                           f"| {ms(plan[0])} / {ms(plan[1])} | {prof(plan[2], variant)} |")
    return "\n".join(out)


def write_report(bench: Bench, folder: Path) -> None:
    """``device.md``, ``device.csv`` and ``device.png`` under ``folder/<backend>/``."""
    import csv

    where = Path(folder) / bench.backend
    where.mkdir(parents=True, exist_ok=True)
    (where / "device.md").write_text(markdown(bench))
    with open(where / "device.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(asdict(Row("", "", "")).keys()))
        writer.writeheader()
        for r in bench.rows:
            writer.writerow(asdict(r))
    if any(r.compiled_peak for r in bench.rows):
        figure(bench, where / "device.png")


def pareto(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The points no other beats on both memory and time, by memory."""
    front, best = [], math.inf
    for m, t in sorted(points):
        if t < best:
            front.append((m, t))
            best = t
    return front


def figure(bench: Bench, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(dict.fromkeys(r.model for r in bench.rows if r.compiled_peak))
    fig, axes = plt.subplots(1, len(models), figsize=(5 * len(models), 4), squeeze=False)
    for ax, model in zip(axes[0], models):
        rows = [r for r in bench.rows if r.model == model and r.compiled_peak and r.step_ms]
        base = [r for r in rows if r.kind != "rematopt"]
        for kind, marker in (("plain", "s"), ("layer", "o"), ("step", "^"), ("xla-gpu", "D")):
            pts = [r for r in base if r.kind == kind]
            if pts:
                ax.scatter([r.compiled_peak / 1e6 for r in pts], [r.step_ms for r in pts], marker=marker,
                           label=kind if kind != "layer" else "per layer", zorder=3)
        front = pareto([(r.compiled_peak / 1e6, r.step_ms) for r in base])
        if front:
            ax.step([m for m, _ in front], [t for _, t in front], where="post", color="grey", lw=1,
                    label="baselines' Pareto front")
        ours = [r for r in rows if r.kind == "rematopt"]
        if ours:
            ax.scatter([r.compiled_peak / 1e6 for r in ours], [r.step_ms for r in ours], marker="*", s=160,
                       color="red", label="rematopt", zorder=4)
            for r in ours:
                ax.annotate(f"{r.budget_ratio}", (r.compiled_peak / 1e6, r.step_ms), fontsize=8)
        ax.set_title(model)
        ax.set_xlabel("compiled peak (MB)")
        ax.set_ylabel("step time (ms)")
        if ax.get_legend_handles_labels()[0]:  # nothing to label before the rows are timed
            ax.legend(fontsize=7)
    fig.suptitle(f"memory against step time ({bench.backend})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str]) -> int:
    """The worker: one JSON spec in, one JSON line out."""
    spec = json.loads(argv[0])
    if "launched" in spec:  # the interpreter's start and this module's imports
        _PHASES["start"] = time.time() - spec["launched"]
    if "pin" in spec:  # before JAX starts, so XLA's CPU thread pool is sized to the one core
        os.sched_setaffinity(0, {spec["pin"]})
    with _phase("import jax"):
        import jax

        from .. import jax as _  # noqa: F401 - rematopt's JAX front end, which every row uses
    if spec.get("serve"):  # one variant of the timing rounds, answering time_steps line by line
        from ..xla.machine import isolate_steps

        isolate_steps()
        serve(spec)
        return 0
    if spec.get("probe"):
        got = {"backend": jax.default_backend(), "kind": jax.devices()[0].device_kind}
    elif "plan_dir" in spec:
        got = plan_step({**spec, "dir": spec["plan_dir"]})
    elif "variants" in spec:
        got = time_steps(spec)
    elif spec.get("machine"):
        from ..xla.machine import steady

        got = asdict(steady())
    else:  # rows, each printed as it is measured; one row's failure is its own
        for k, row in enumerate(spec["rows"]):
            try:
                got = measure({**spec, **row})
            except Exception as e:  # noqa: BLE001 - reported on the row
                got = {"error": _why(e)}
            print(json.dumps({"row": k, **got}), flush=True)
            if "error" in got and row.get("first"):  # the rows after it compare against its gradients
                break
        got = {"error": "not measured: the plain step failed"} if "error" in got and row.get("first") else {}
    print(json.dumps({**got, "phases": _PHASES}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
