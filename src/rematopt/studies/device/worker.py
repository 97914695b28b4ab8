"""One worker process: a model's rows, its plans, its timing rounds or the micro-benchmarks, as the
JSON spec it is started with says (``python -m rematopt.studies.device.worker SPEC``); one JSON line out."""

from __future__ import annotations

import json
import math
import os
import resource
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Callable, Iterator

from .settings import MAX_ROUNDS, PLAN_WALL_S, PROFILE_STEPS, ROUND_SECONDS, SETTLED


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

    from ...jax import load_factory

    config = dict(spec["config"])
    if spec.get("remat"):
        config.update(remat=spec["remat"], remat_scope=spec["scope"])
    with _phase("build"):  # the model's library imported, its parameters made
        fn, args = load_factory(spec["model"], **config)
    if spec.get("plan"):
        from ...importers import load as load_graph
        from ...jax import apply_plan
        from ...plan import Plan

        fn = apply_plan(fn, load_graph(spec["graph"]), Plan.load(spec["plan"]), ordered=spec.get("ordered", True),
                        as_planned=spec.get("as_planned", True))
    start = time.perf_counter()
    with _phase("compile"):
        compiled = jax.jit(jax.value_and_grad(fn)).lower(*args).compile(**_options(spec))
    return compiled, args, time.perf_counter() - start


def measure(spec: dict) -> dict:
    """Compile and run one variant once (``spec`` as :func:`.bench._model_tasks` makes it): its memory, its
    kernels' price, its gradients against the plain step's; a dict of :class:`.results.Row`'s fields, and
    the page faults each kernel's profiled time will hold (``profiled_faults``, on CPU). The
    compiled module's text goes to ``spec["hlo"]`` for the calibration; step times are
    :func:`time_steps`'s."""
    import jax
    import numpy as np

    from ...importers.costmodel import device
    from ...xla.cost import profiled_faults, step_cost, step_faults
    from ...xla.hlo import parse_hlo
    from ...xla.memory import xla_reference

    compiled, args, compile_s = _compile(spec)
    backend = jax.default_backend()
    analysis = compiled.memory_analysis()
    ref = xla_reference(analysis, backend)
    text = compiled.as_text()
    Path(spec["hlo"]).write_text(text)
    module = parse_hlo(text)
    cost = step_cost(module, device(spec["device"]))
    temp = int(analysis.temp_size_in_bytes)
    faults, in_kernels = (step_faults(module, temp), profiled_faults(module, temp)) if backend == "cpu" else (0, {})
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
            "predicted_faults": faults, "profiled_faults": in_kernels, "grad_error": error, "compile_s": compile_s,
            "backend": backend,
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
    :data:`ROUND_SECONDS` of each variant's steps), and more until the steps settle, up to
    ``spec["settle"]`` rounds in all (:func:`run_rounds`). Per variant, its milliseconds and minor page faults
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
                [sys.executable, "-m", "rematopt.studies.device.worker",
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
        out["rounds"] = run_rounds(labels, lambda label: _ask(servers[label], "step"), rounds,
                                   max(rounds, spec.get("settle") or 0), out["times"], out["faults"])
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


def run_rounds(labels: list[str], step: Callable[[str], dict], rounds: int, most: int, times: dict[str, list[float]],
               faults: dict[str, list[int]]) -> int:
    """Rounds of one step of every variant of ``labels`` (``step(label)``: its ``ms`` and ``faults``; the order
    rotated each round), appended to ``times`` and ``faults``: ``rounds`` of them, then more, up to ``most``
    in all, until the variants' steps have settled (:func:`settled`). How many rounds ran."""
    r = 0
    while r < rounds or (r < most and not settled(times)):
        for label in labels[r % len(labels):] + labels[:r % len(labels)]:
            got = step(label)
            times[label].append(got["ms"])
            faults[label].append(got["faults"])
        r += 1
    return r


def spread(times: list[float]) -> float:
    """How far a variant's fastest step of the even rounds is from its fastest of the odd rounds, over its
    fastest (its row's ``step_ms_spread``, the report's noise per variant: :func:`.report.noise`)."""
    return abs(min(times[0::2]) - min(times[1::2] or times)) / min(times)


def settled(times: dict[str, list[float]], within: float = SETTLED) -> bool:
    """Whether each variant's steps have settled: their :func:`spread` is within ``within``."""
    return all(spread(t) <= within for t in times.values())


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
    as predicted (43,849). With ``spec["keep_pages"]``, the steps run on the main thread, glibc keeping
    the memory they free (:func:`rematopt.xla.machine.keep_pages`): no fault after the warm-up."""
    import jax

    from ...xla.machine import keep_pages, off_main_thread
    from ...xla.memory import xla_reference
    from ...xla.profile import kernel_seconds

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

    if spec.get("keep_pages"):  # the main thread, its pages kept: the step without its page faults
        keep_pages()
        loop()
    else:
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
    bench's profile); the graph, its no-remat plan (``out["no_remat"]``: the bench's row
    :data:`~.settings.NO_REMAT`) and each ratio's chosen plan saved under ``spec["dir"]``. Where the loop
    fails, plain cpsat on the per-equation graph at r x its no-remat peak, and the note says why."""
    from ...jax import load_factory, trace_grad
    from ...reference import no_remat_plan
    from ...solve import solve
    from ...xla.verify import verify

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
                graph.save(folder / "graph.json")
                no_remat_plan(graph).save(folder / "plan_none.json")
                out["no_remat"] = {"path": str(folder / "plan_none.json"), "graph": str(folder / "graph.json")}
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


def main(argv: list[str]) -> int:
    """The worker: one JSON spec in, one JSON line out."""
    spec = json.loads(argv[0])
    if "launched" in spec:  # the interpreter's start and this module's imports
        _PHASES["start"] = time.time() - spec["launched"]
    if "pin" in spec:  # before JAX starts, so XLA's CPU thread pool is sized to the one core
        os.sched_setaffinity(0, {spec["pin"]})
    with _phase("import jax"):
        import jax

        from ... import jax as _  # noqa: F401 - rematopt's JAX front end, which every row uses
    if spec.get("serve"):  # one variant of the timing rounds, answering time_steps line by line
        from ...xla.machine import isolate_steps

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
        from ...xla.machine import steady

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
