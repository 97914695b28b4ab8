"""The run: every model's tasks (rows, planning, the plans' rows, timing) scheduled on the machine's
cores, then the calibration that prices each row."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import os
import resource
import shutil
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable

from ...importers.costmodel import profile_for
from ...xla.cost import Calibration, beside, calibrate
from ...xla.machine import Machine
from ..schedule import Task, run_tasks
from .launch import OutOfTime, Workers, busy_cpu, cpu_seconds, run_worker, worker_env
from .report import write_report
from .results import Bench, Row
from .settings import (AGAIN, AT_ONCE, CPU_SCHEDULER, DEFAULT_MODELS, DETERMINISTIC_S, GPU_AT_ONCE, GPU_LIMIT_SHARE,
                       KEPT, Model, MODELS, NO_REMAT, PLAN_ROUNDS, PLAN_WALL_S, POLICIES, QUICK_DETERMINISTIC_S,
                       QUICK_PLAN_ROUNDS, QUICK_POLICIES, QUICK_RATIOS, QUICK_ROUNDS, RATIOS, ROUNDS, SETTLE_ROUNDS,
                       WORKER_WALL_S)
from .worker import spread


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
    started, cpu, load = time.time(), cpu_seconds(resource.RUSAGE_CHILDREN), os.getloadavg()[0]
    workers = Workers()
    probed = run_worker({"probe": True, "cwd": str(cwd)}, env, 120, workers, "probe")
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
            got = run_worker({"machine": True, "pin": cores[0], "cwd": str(cwd)}, env,
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
    bench.run = {"wall": time.time() - started, "cpu": cpu_seconds(resource.RUSAGE_CHILDREN) - cpu, "load_start": load,
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
    from ...importers.costmodel import device
    from ...xla.cost import step_cost
    from ...xla.hlo import read_hlo

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
    hlo_files: dict[str, str] = {}  # variant: its compiled program, for profiles.json
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
                        bench.kernel_faults[model.label, r.variant] = got.get("profiled_faults") or {}
                        specs[r.variant] = extra
                        made[r.variant] = r
                        hlo_files[r.variant] = str(hlo[r.variant])
                    add(r)
                    progress(f"{model.label:12} {r.variant:42} "
                             + (f"peak {r.compiled_peak / 1e6:9.2f} MB  {r.kernels:5} kernels" if r.compiled_peak
                                else f"-- {r.note}") + f"  ({time.perf_counter() - started[0]:.0f} s)")
                    started[0] = time.perf_counter()
                    if out:
                        write_report(bench, out)

            asked = [{**extra, "hlo": str(hlo[r.variant])} for r, extra in batch]
            got = run_worker({**base, **pin(slot), "rows": asked}, env, timeout(), workers, "rows", each=record)
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
            got = run_worker({**base, "plan_dir": str(work), "ratios": list(budgets),
                               "deterministic_time": bench.deterministic_time,
                               "max_rounds": QUICK_PLAN_ROUNDS if quick else PLAN_ROUNDS,
                               "until": min(until, time.time() + len(budgets) * PLAN_WALL_S)},
                             planning_env, timeout(len(budgets) * PLAN_WALL_S + WORKER_WALL_S), workers, "planning")
            with lock:
                for r in budgets:
                    planned[str(r)] = ({"status": f"planning failed: {got['error']}"} if "error" in got
                                       else got["plans"].get(str(r), {}))
                if "no_remat" in got:  # every planning process of the model traces the same graph
                    planned[NO_REMAT] = got["no_remat"]
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
        if NO_REMAT in planned:
            nr = planned[NO_REMAT]
            plans.append((Row(model.label, NO_REMAT, "applied", note="the plan that recomputes nothing, as apply_plan "
                              "writes it: rematopt's plans are predicted from its program"),
                          {"graph": nr["graph"], "plan": nr["path"]}))
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
        _time(bench, model.label, specs, base, {**pin(slot), **start_on}, rounds, 0 if quick else SETTLE_ROUNDS, env,
              timeout(), progress, workers, lock)
        with lock:
            _calibrate(bench, model.label)
            (work / "profiles.json").write_text(json.dumps(
                {"hlo": hlo_files, "profiles": {v: p for (m, v), p in bench.profiles.items() if m == model.label},
                 "step_ms": {r.variant: r.step_ms for r in bench.rows if r.model == model.label},
                 "rounds": {v: t for (m, v), t in bench.rounds.items() if m == model.label},
                 "peaks": {r.variant: r.compiled_peak for r in bench.rows if r.model == model.label},
                 "faults": {r.variant: r.predicted_faults for r in bench.rows if r.model == model.label},
                 "kernel_faults": {v: f for (m, v), f in bench.kernel_faults.items() if m == model.label},
                 "beside": bench.beside.get(model.label),
                 "machine": dataclasses.asdict(bench.machine) if bench.machine else None}))
            if out:
                write_report(bench, out)

    name, device_rows = model.label, "" if bench.backend == "cpu" else "device"
    groups = [ratios] if bench.backend == "cpu" else [(r,) for r in ratios]
    plannings = [Task(f"{name} planning" + ("" if g == ratios else f"@{g[0]}"), planning(g)) for g in groups]
    return [Task(f"{name} rows", rows, holds=device_rows), *plannings,
            Task(f"{name} plan rows", plan_rows, after=(f"{name} rows", *(t.name for t in plannings)),
                 holds=device_rows),
            Task(f"{name} timing", timing, after=(f"{name} rows", f"{name} plan rows"), alone=True)]


def _time(bench: Bench, model: str, specs: dict[str, dict], base: dict, pin: dict, rounds: int, settle: int,
          env: dict, timeout: float, progress: Callable[[str], None], workers: Workers, lock: threading.RLock) -> None:
    """Every measured variant's step time from :func:`.worker.time_steps` (a process each, ``rounds`` interleaved
    rounds or more, up to ``settle`` until the steps settle: :func:`.worker.run_rounds`), with
    a second compile of the plain step, timed alongside, as the row ``plain (again)``; where the plain step
    faults, the plain step with its pages kept (``bench.kept``: what its faults cost it); and what other
    processes ran on the machine meanwhile (``bench.beside``): the bench's timing runs alone, but not
    the machine's other users (docs/device.md, "Beside the timing")."""
    started = time.perf_counter()
    variants = {**specs, AGAIN: specs["plain"]}
    faults = next((r.predicted_faults for r in bench.rows if r.model == model and r.variant == "plain"), 0)
    if bench.clock == "cpu" and faults:
        variants[KEPT] = {**specs["plain"], "keep_pages": True}
    profile = [v for v in specs if v in ("plain", NO_REMAT) or v.startswith("rematopt@")]
    busy, own, wall = busy_cpu(), cpu_seconds(), time.time()
    got = run_worker({**base, **pin, "variants": variants, "rounds": rounds, "settle": settle, "clock": bench.clock,
                       "profile": profile}, env, timeout, workers, "timing")
    if busy is not None:  # less the timing process's (its variants' too) and this one's
        timed = sum(cpu for kind, label, *_, cpu in workers.ran if kind == "timing" and label == model)
        bench.beside[model] = (max(0.0, busy_cpu() - busy - timed - (cpu_seconds() - own)), time.time() - wall)
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
        if KEPT in got["times"]:
            bench.rounds[model, KEPT] = got["times"].pop(KEPT)
            bench.kept[model] = (min(bench.rounds[model, KEPT]), int(statistics.median(got["faults"].pop(KEPT))))
        for variant, times in got["times"].items():
            r = rows.get(variant, again)
            bench.rounds[model, r.variant] = times
            r.step_ms = min(times)
            r.step_ms_spread = spread(times)
            r.page_faults = int(statistics.median(got["faults"][variant]))
        for variant, why in got["errors"].items():
            if variant == KEPT:
                bench.notes.append(f"{model}: the plain step with its pages kept failed ({why}): its page faults "
                                   "at the micro-benchmark's price")
                continue
            rows.get(variant, again).note += f" timing failed: {why}"
        for variant, seconds in got.get("profiles", {}).items():
            bench.profiles[model, variant] = seconds
        if AGAIN in got["peaks"]:
            again.compiled_peak, again.compiled_peak_is = got["peaks"][AGAIN], plain.compiled_peak_is
            for k in ("predicted_raw_ms", "kernels", "bytes_moved", "predicted_faults"):
                setattr(again, k, getattr(plain, k))
            bench.costs[model, AGAIN] = bench.costs[model, "plain"]
            bench.kernel_faults[model, AGAIN] = bench.kernel_faults.get((model, "plain"), {})
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
    """Predict every row of ``model`` from its plain step's measurements alone (a row's prediction is a
    function of its compiled program and its compiled peak): the plain step's kernels at their profiled
    times, a kernel of another row alike to one of them at that time, any other priced on the profile
    (the machine's measured rates; on a GPU the data sheet's) at the profile's scale, and what the plain
    step's measured time holds beyond its kernels priced per byte of a row's compiled peak (the memory a
    step brings back into the caches after the other variants' steps of its round;
    :func:`rematopt.xla.cost.calibrate` with ``per_kernel`` and ``footprint``; ``predicted_ms``); where the
    plain step was not profiled, one scale for all. Beside it, for the report: one scale (``predicted_scale_ms``)
    and one scale per kernel class (``predicted_class_ms``). Over the 48 plans of four full runs on
    2026-12-07 per kernel cut the one scale's mean error on the plans' overheads by a third and its
    worst by two fifths (docs/device.md, "The full run").

    rematopt's rows are predicted the same way on :data:`~.settings.NO_REMAT`'s program first, timed and
    profiled like the plain step, then on the plain step's kernels (:func:`rematopt.xla.cost.beside`): a
    plan is that program and the kernels its recomputation adds or changes, and apply_plan's programs
    run their kernels otherwise than the plain step (gpt at the bench's size: 648 ms against 1,615,
    docs/device.md, "Calibrated on apply_plan's own program").

    The plain step's time is the median over its rows (its two compiles, timed in the same rounds), the
    figure the report measures every overhead against: gpt's two plain compiles measured 1,307 and 1,242 ms
    in one run, and calibrated on the first its plans were predicted 2.8 to 3.4 points under their measured
    overheads, on both 1.3 to 1.9 (docs/device.md, "A kernel's page faults are in its profile")."""
    from ...importers.costmodel import device

    plain = next((r for r in bench.rows if r.model == model and r.variant == "plain"), None)
    if plain is None or not plain.step_ms or (model, "plain") not in bench.costs:
        bench.calibrations[model] = "the plain step was not timed"
        return
    m = bench.machine
    measured_ms = statistics.median(r.step_ms for r in bench.rows if r.model == model and r.kind == "plain"
                                    and r.step_ms)
    fault_s, fault_in_s = _fault_price(bench, plain, measured_ms)
    args = dict(step=bench.costs[model, "plain"], measured_s=measured_ms / 1e3,
                device=m.device() if m else device(bench.device), faults=plain.predicted_faults or 0,
                launch_s=m.launch_s if m else 0.0, fault_s=fault_s, fault_in_s=fault_in_s)
    profiled = bench.profiles.get((model, "plain"))
    rows = [r for r in bench.rows if r.model == model and (model, r.variant) in bench.costs]
    for into, how, field_ in ((bench.scale_calibrations, {}, "predicted_scale_ms"),
                              (bench.class_calibrations, {"profiled": profiled}, "predicted_class_ms"),
                              (bench.calibrations, {"profiled": profiled, "per_kernel": True,
                                                    "footprint": plain.compiled_peak or 0,
                                                    "profiled_faults": bench.kernel_faults.get((model, "plain"))},
                               "predicted_ms")):
        if how and profiled is None:
            into[model] = "the plain step was not profiled"
            continue
        try:
            c = calibrate(**args, **how)
        except ValueError as e:
            into[model] = str(e)
            continue
        into[model] = c
        for r in rows:
            setattr(r, field_, bench.predicted_ms(c, r))
    one = bench.scale_calibrations.get(model)
    if not isinstance(bench.calibrations.get(model), Calibration) and isinstance(one, Calibration):
        bench.calibrations[model] = one
        for r in rows:
            r.predicted_ms = r.predicted_scale_ms
    bench.plan_calibrations[model] = _on_no_remat(bench, model, args)
    if isinstance(bench.plan_calibrations[model], Calibration):
        for r in rows:
            if r.kind in ("rematopt", "applied"):
                r.predicted_ms = bench.predicted_ms(bench.plan_calibrations[model], r)


def _fault_price(bench: Bench, plain: Row, measured_ms: float) -> tuple[float, float]:
    """(seconds a page fault costs a step, of them the fault's own, which the kernel whose write faults
    the page takes): as the plain step paid them, where it was timed with its pages kept (its time,
    ``measured_ms``, less that step's, over its predicted faults; the fault's own share as the
    micro-benchmark split it), else the micro-benchmark's (:func:`rematopt.xla.machine.fault_seconds`).
    Where the step kept its pages but still faulted (over 1% of its faults), the micro-benchmark's too."""
    m = bench.machine
    fault_s, fault_in_s = (m.fault_s, m.fault_in_s) if m else (0.0, 0.0)
    kept, faults = bench.kept.get(plain.model), plain.predicted_faults or 0
    if kept is None or not faults or kept[1] > 0.01 * faults:
        return fault_s, fault_in_s
    paid = max(measured_ms - kept[0], 0.0) / 1e3 / faults
    return paid, paid * (fault_in_s / fault_s if fault_s and fault_in_s else 1.0)


def _on_no_remat(bench: Bench, model: str, args: dict) -> Calibration | str:
    """What rematopt's rows of ``model`` are predicted with (:func:`_calibrate`), or why the plain step's
    calibration predicts them."""
    own = next((r for r in bench.rows if r.model == model and r.variant == NO_REMAT), None)
    plain = bench.calibrations.get(model)
    if own is None or not own.step_ms or (model, NO_REMAT) not in bench.costs:
        return f"{NO_REMAT} was not timed"
    if (model, NO_REMAT) not in bench.profiles or not isinstance(plain, Calibration) or not plain.measured_kernels:
        return f"{NO_REMAT} or the plain step was not profiled"
    try:
        first = calibrate(**{**args, "step": bench.costs[model, NO_REMAT], "measured_s": own.step_ms / 1e3,
                             "faults": own.predicted_faults or 0}, name=NO_REMAT,
                          profiled=bench.profiles[model, NO_REMAT], per_kernel=True, footprint=own.compiled_peak or 0,
                          profiled_faults=bench.kernel_faults.get((model, NO_REMAT)))
    except ValueError as e:
        return str(e)
    return beside(first, plain)
