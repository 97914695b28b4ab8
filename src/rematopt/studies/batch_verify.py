"""``rematopt batch --verify xla``: every (JAX factory, budget ratio, planner)
job runs the closed loop (:func:`rematopt.xla.verify.verify`, as ``solve
MODULE:FACTORY --verify xla`` does) in a worker process of the batch
(:mod:`rematopt.studies.batch`: hard timeouts, durable rows, ``--resume``).

Why it is built this way:

* The inputs are ``MODULE:FACTORY`` specs, each called with the batch's
  ``--set`` values. A graph file has no step to compile, so a batch is all
  factories (with ``--verify xla``) or all graphs (without).
* What every job of a factory shares is made once, by one worker, before
  its jobs (:func:`prepare`): the graph to plan on (XLA's compiled plain
  step, and the traced graph to fall back on) saved as graph files, and
  XLA's figures for the plain step and for each stock policy, priced as
  the loop prices its candidates (so a job chooses by priced time, as
  ``solve --verify xla`` does). They depend
  only on the factory, its settings and XLA, so the jobs take them as the
  loop's ``known`` figures instead of compiling them again, and each job's
  ``--time-limit`` goes to its planning rounds. They stay in
  ``OUT/factories/``; a resume reuses them.
* Workers put the CPU memory-minimizing scheduler in ``XLA_FLAGS`` before
  JAX starts its backend (:data:`rematopt.xla.flags.CPU_VERIFY`; XLA reads
  it once), as ``solve --verify xla`` does.
* A row has the batch's columns, so ``rematopt report`` reads it, holding
  the compiled step's figures: ``budget`` is ``budget_ratio`` x the
  compiled plain step's peak, ``peak_bytes`` the chosen candidate's
  compiled peak, ``no_remat_peak_bytes`` the plain step's, ``compute_cost``,
  ``base_cost`` and ``overhead`` XLA's FLOPs. ``status`` speaks of the
  compiled program: FEASIBLE when the chosen step fits, OVER_BUDGET when no
  candidate does. What the graph model says of the chosen plan is in
  ``model_status`` (the planner's OPTIMAL is about its planning budget on
  the graph), ``plan_peak_bytes`` (the plan's), ``predicted_peak_bytes`` (the
  step as applied), ``order`` (the graph order the plan was made in) and
  ``model_overhead``; the rest of
  ``solve --verify xla --json`` is there under its own names
  (``stopped_by`` and ``deterministic`` among them; ``xla_settings``,
  ``planning_rounds`` and ``candidates`` as JSON text).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

from .. import planners
from ..errors import ImportFailure, RematoptError
from .batch import (DEFAULT_MEMORY_LIMIT, DEFAULT_TIMEOUT_MARGIN, EXACT, BatchPlan, base_row, check_jobs,
                    failure_status, job_key, limit_memory, previous_rows, slug)

PREPARED = "prepared.json"  # in each factory's directory: what its jobs share


@dataclass(frozen=True)
class FactoryInput:
    """A JAX factory spec with the batch's settings, and its identity: the
    hash of the spec, settings, argnums, the module's source and the JAX
    version (another JAX compiles another program), which keys its jobs."""

    spec: str
    config: dict[str, Any]
    argnums: tuple[int, ...]
    sha256: str
    name: str
    family: str


def is_factory_spec(text: str) -> bool:
    """``MODULE:FACTORY``, not a path: a colon, and no file or directory by that name."""
    return ":" in text and not Path(text).exists()


def load_factories(specs: Iterable[str], config: dict[str, Any], argnums: tuple[int, ...]) -> list[FactoryInput]:
    """Import each spec's module and check that it names a callable
    (:func:`rematopt.jax.import_factory`, which raises ImportFailure naming
    the spec); nothing is called, so JAX's backend does not start here. A
    spec given twice is kept once."""
    import inspect

    import jax

    from ..jax import import_factory

    out: list[FactoryInput] = []
    for spec in dict.fromkeys(specs):
        if not is_factory_spec(spec):
            raise RematoptError(f"{spec}: --verify xla takes JAX MODULE:FACTORY inputs (e.g. models.gpt:factory), "
                                "not graph files: a graph has no step to compile")
        factory = import_factory(spec)
        try:
            source = Path(inspect.getsourcefile(factory) or "").read_bytes()
        except (OSError, TypeError):
            source = b""
        blob = json.dumps([spec, config, list(argnums), hashlib.sha256(source).hexdigest(), jax.__version__, "xla"],
                          sort_keys=True, default=str)
        module = spec.partition(":")[0].rsplit(".", 1)[-1]
        name = " ".join([module, *(f"{k}={v}" for k, v in sorted(config.items()))])
        out.append(FactoryInput(spec, dict(config), tuple(argnums), hashlib.sha256(blob.encode()).hexdigest(),
                                name, module))
    return out


def factory_dir(out: Path, f: FactoryInput) -> Path:
    return out / "factories" / f"{slug(f.name)}-{f.sha256[:8]}"


# -- the jobs ---------------------------------------------------------------------


def plan_verified(factories: list[FactoryInput], planner_names: list[str], ratios: list[float], out: str | Path,
                  options: dict[str, Any] | None = None, resume: bool = False,
                  memory_limit: int | None = DEFAULT_MEMORY_LIMIT, timeout_margin: float = DEFAULT_TIMEOUT_MARGIN,
                  default_workers: int | None = None) -> BatchPlan:
    """The job list, as :func:`~rematopt.studies.batch.plan_batch` makes it
    for graphs: fast planners first, finished jobs left out with ``resume``.
    ``options["time_limit"]`` is each job's whole loop (planning rounds and
    compiles); a worker is killed at it plus ``timeout_margin``.
    ``options["deterministic_time"]`` is each job's loop's too (every
    planner's: the loop's rounds then do not depend on the load). The jobs
    still need their factory's shared figures (:func:`prepare_jobs`)."""
    out = Path(out).resolve()
    options = {k: v for k, v in (options or {}).items() if v is not None}
    check_jobs(planner_names, ratios, options)
    work = options.get("deterministic_time")
    if work is not None and not 0 <= work < math.inf:  # the loop's, whichever planners run it
        raise RematoptError(f"--deterministic-time must be a finite number >= 0, got {work}")
    done, earlier = previous_rows(out, resume)
    timeout = float(options.get("time_limit") or 3600.0) + timeout_margin
    specs, rerun = [], {}
    for planner in sorted(planner_names, key=lambda p: p in EXACT):
        taken = planners.options(planner)
        run_options = {k: v for k, v in options.items()
                       if k in taken and k not in ("time_limit", "deterministic_time")}  # the loop's, not a round's
        if "progress" in taken:
            run_options["progress"] = False
        if default_workers and "workers" in taken:  # cpsat's deterministic time runs one
            run_options.setdefault("workers", 1 if "deterministic_time" in options else default_workers)
        for f in factories:
            for r in ratios:
                key = job_key(f.sha256, r, planner, options)
                if key in done:
                    continue
                if key in earlier:
                    rerun[key] = earlier[key]
                specs.append({
                    "key": key, "graph": f.name, "family": f.family, "graph_file": f.spec, "graph_sha256": f.sha256,
                    "nodes": None, "edges": None, "budget_ratio": r, "budget": None, "planner": planner,
                    "planner_ref": planners.REGISTRY[planner], "options": options, "run_options": run_options,
                    "out": str(out), "plan_path": f"plans/{slug(f.name)}-{f.sha256[:8]}/{slug(planner)}-r{r:g}-"
                                                  f"{key[:8]}.json",
                    "log_path": None, "hint_path": None, "hint_from": None, "memory_limit": memory_limit,
                    "timeout": timeout, "time_limit": options.get("time_limit"),
                    "verify": {"spec": f.spec, "config": f.config, "argnums": list(f.argnums),
                               "dir": str(factory_dir(out, f))},
                })
    return BatchPlan(specs, done, [], rerun)


def prepare_jobs(plan: BatchPlan, factories: list[FactoryInput], say: Callable[[str], None] = lambda line: None,
                 ) -> None:
    """Prepare each factory that has jobs to run (:func:`prepare`), in order,
    and give its jobs the graph's size; a factory whose preparation failed
    has its jobs become failure rows (``plan.skipped``), which a resume runs
    again. ImportFailure (one line naming the spec) when a factory refuses
    its settings: bad input, before any job runs."""
    pending = {s["graph_sha256"] for s in plan.specs}
    for f in factories:
        if f.sha256 not in pending:
            continue
        specs = [s for s in plan.specs if s["graph_sha256"] == f.sha256]
        got = prepare(f, Path(specs[0]["out"]), specs[0]["timeout"], specs[0]["memory_limit"], say)
        if isinstance(got, tuple):
            status, error = got
            for spec in specs:
                plan.specs.remove(spec)
                row = base_row(spec)
                row.update(status=status, error=f"preparing {f.spec}: {error}")
                plan.skipped.append(row)
            say(f"{f.spec}: {status}: {error}")
            continue
        for spec in specs:
            spec.update(nodes=got["nodes"], edges=got["edges"])


def prepare(f: FactoryInput, out: Path, timeout: float, memory_limit: int | None,
            say: Callable[[str], None] = lambda line: None) -> dict[str, Any] | tuple[str, str]:
    """The factory's shared figures (``PREPARED``), made by a worker
    process unless an earlier run left them; ``(status, error)`` when the
    worker failed (a crash, out of memory, ``timeout`` seconds passed).
    ImportFailure when the factory refuses its settings."""
    where = factory_dir(out, f)
    made = where / PREPARED
    if made.exists():
        return json.loads(made.read_text())
    where.mkdir(parents=True, exist_ok=True)
    job = {"spec": f.spec, "config": f.config, "argnums": list(f.argnums), "dir": str(where),
           "memory_limit": memory_limit}
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "rematopt.studies.batch_verify", json.dumps(job)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    stopped = False
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        stopped = True
    except BaseException:  # Ctrl-C: the worker goes with the batch
        proc.kill()
        proc.wait()
        raise
    text = err.decode(errors="replace")
    last = (text.strip().splitlines() or [""])[-1]
    if proc.returncode == 2 and not stopped and last.startswith("rematopt: "):  # the factory refused its settings
        raise ImportFailure(last.removeprefix("rematopt: "))
    if proc.returncode != 0 or stopped or not made.exists():
        return failure_status({"timeout": timeout, "memory_limit": memory_limit}, proc.returncode, text, stopped)
    got = json.loads(made.read_text())
    for note in got["notes"]:
        say(f"{f.spec}: {note}")
    say(f"{f.spec}: plain step and {len(got['known']) - 1} stock policies compiled once for all its jobs "
        f"({time.perf_counter() - start:.1f} s)")
    return got


def _prepare_main(job: dict[str, Any]) -> None:
    """Worker: ``python -m rematopt.studies.batch_verify JOB_JSON`` writes the
    factory's graphs and ``PREPARED`` into ``job["dir"]``; exit 2 with one
    line when the factory refuses its settings."""
    from ..xla import flags

    flags.apply(flags.CPU_VERIFY)  # before the backend starts
    import jax

    from ..xla.factory import load_step, plan_graphs
    from ..xla.verify import backend_price, compile_figures

    signal.signal(signal.SIGINT, signal.default_int_handler)
    limit_memory(job.get("memory_limit"))
    where = Path(job["dir"])
    notes: list[str] = []  # what the batch says of the factory (no per-layer candidates, a traced graph)
    try:
        step = load_step(job["spec"], job["config"], tuple(job["argnums"]), notes.append)
    except ImportFailure as e:
        print(f"rematopt: {e}", file=sys.stderr, flush=True)
        sys.exit(2)
    graph, fallback = plan_graphs(step, notes.append)
    graph.save(where / "graph.json")
    if fallback is not None:
        fallback.save(where / "traced.json")
    settings = flags.for_backend(jax.default_backend())
    # priced as each job's loop prices its own candidates, so a job chooses among them by priced time as
    # solve --verify xla does (unpriced, the stock policies made every job choose by compiled FLOPs)
    price = backend_price(jax.default_backend(), kind=jax.devices()[0].device_kind)
    known = {}
    for label, fn in {"plain": step.fn, **step.stock}.items():
        c, reference = compile_figures(fn, step.args, step.argnums, settings, price)
        known[label] = {**dataclasses.asdict(c), "reference": reference}
    record = {"spec": step.spec, "config": step.config, "graph": "graph.json",
              "fallback": "traced.json" if fallback is not None else None,
              "graph_kind": "compiled" if graph.meta.get("fuse") == "xla" else "traced",
              "nodes": graph.n, "edges": len(graph.edges), "known": known, "notes": notes,
              "xla_settings": flags.record(settings)}
    tmp = where / f".{PREPARED}.tmp"
    tmp.write_text(json.dumps(record, indent=1, default=str))
    os.replace(tmp, where / PREPARED)  # its presence says the preparation is whole


def verified_row(spec: dict[str, Any]) -> dict[str, Any]:
    """A job (the worker side, from :func:`rematopt.studies.batch.run_job`):
    the closed loop at the job's ratio with its planner, starting from its
    factory's shared figures; the chosen plan saved; the row (module doc)."""
    from ..xla import flags

    flags.apply(flags.CPU_VERIFY)  # before the backend starts
    from ..importers import load as load_graph
    from ..xla.factory import load_step
    from ..xla.verify import Compiled, verify

    job = spec["verify"]
    where = Path(job["dir"])
    prepared = json.loads((where / PREPARED).read_text())
    planners.REGISTRY[spec["planner"]] = spec["planner_ref"]
    limit_memory(spec.get("memory_limit"))
    step = load_step(job["spec"], job["config"], tuple(job["argnums"]))
    graph = load_graph(where / prepared["graph"])
    fallback = load_graph(where / prepared["fallback"]) if prepared["fallback"] else None
    known = {label: (Compiled(**{f.name: k[f.name] for f in dataclasses.fields(Compiled) if f.name in k}),
                     k["reference"])
             for label, k in prepared["known"].items()}
    v = verify(step.fn, step.args, graph, spec["planner"], spec["budget_ratio"],
               time_limit=float(spec.get("time_limit") or 3600.0), options=spec["run_options"], stock=step.stock,
               known=known, fallback=fallback, deterministic_time=spec["options"].get("deterministic_time"))
    s = v.summary()
    row = base_row(spec)
    row.update(
        status="FEASIBLE" if v.fits else "OVER_BUDGET", budget=v.budget, peak_bytes=s["xla_peak_bytes"],
        no_remat_peak_bytes=s["xla_plain_peak_bytes"], compute_cost=s["xla_flops"], base_cost=s["xla_plain_flops"],
        overhead=s["xla_flops"] / s["xla_plain_flops"] - 1 if s["xla_plain_flops"] else None,
        transfer_bytes=0, wall_s=s["wall_s"], has_plan=v.chosen.plan is not None, verify="xla",
        config=json.dumps(job["config"], sort_keys=True), graph_kind=prepared["graph_kind"],
        model_status=s["status"] or None, model_overhead=s["overhead"],
        **{k: s[k] for k in ("fits", "budget_bytes", "xla_plain_peak_bytes", "xla_reference",
                             "graph_no_remat_peak_bytes", "chosen", "chosen_by", "kind", "predicted_peak_bytes",
                             "plan_peak_bytes",
                             "xla_peak_bytes",
                             "planning_budget_bytes", "order", "xla_flops", "xla_plain_flops", "rounds",
                             "stopped_by", "deterministic", "deterministic_spent")},
        xla_settings=json.dumps(s["xla_settings"], sort_keys=True, default=str),
        planning_rounds=json.dumps(s["planning_rounds"]),
        candidates=json.dumps(s["candidates"], default=str),
    )
    if v.chosen.plan is not None:
        path = Path(spec["out"]) / spec["plan_path"]
        path.parent.mkdir(parents=True, exist_ok=True)
        v.chosen.plan.save(path)
        row["plan_path"] = spec["plan_path"]
    return row


if __name__ == "__main__":
    _prepare_main(json.loads(sys.argv[1]))
