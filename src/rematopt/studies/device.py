"""``rematopt bench device``: the remat JAX users write against rematopt's plans, as the device runs them.

For each model, every variant of its training step (``jax.jit(jax.value_and_grad(loss))``) is
compiled and run on the backend present, each in a fresh process (so one row's memory does not
leak into the next, and XLA's process-wide flags are the row's own):

- ``plain``: the step as written (run twice: the spread of the two medians is the noise floor);
- ``layer:<policy>`` / ``step:<policy>``: the factory's ``remat=`` per layer, in the model library's
  idiom, and on the whole loss;
- ``xla-gpu@r`` (GPU only): the plain step under XLA's own GPU rematerialization, its slop factor
  aimed at r x the plain step's compiled peak;
- ``rematopt@r``: a plan for r x the plain step's peak applied with ``rematopt.jax.apply_plan``.

Each row: XLA's compiled peak (``peak_memory_in_bytes`` on GPU / TPU; temp + arguments + outputs -
aliases on CPU, which computes no peak), the device's peak where it reports one, the step time
(median of ``runs`` after a warm-up), the time its kernels price at on the calibrated device
profile (:mod:`rematopt.xla.cost`: the plain step's measured time fixes the profile's scale), and
the largest gradient difference from the plain step. On CPU every row runs under XLA's
memory-minimizing scheduler (``--xla_cpu_enable_concurrency_optimized_scheduler=false``), without
which XLA's CPU schedule undoes rematerialization.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

CPU_SCHEDULER = "--xla_cpu_enable_concurrency_optimized_scheduler=false"
POLICIES = ("nothing_saveable", "dots_saveable", "dots_with_no_batch_dims_saveable")
RATIOS = (0.8, 0.6, 0.5)
# --quick (under 5 minutes on the 2-core machine): fewer rows, each a process of about 10 s there
QUICK_POLICIES = {"layer": ("nothing_saveable", "dots_saveable"), "step": ("dots_saveable",)}
QUICK_RATIOS = (0.8,)
# XLA's GPU memory limit is (0.8 x device memory - inputs - outputs) x slop / 100 (issue 36).
GPU_LIMIT_SHARE = 0.8


@dataclass(frozen=True)
class Model:
    label: str
    spec: str  # MODULE:FACTORY
    config: dict
    quick: dict  # the config under --quick


# Defaults: the GPT decoder at a size where activations dominate (issue 36), a U-Net, one Flax and
# one Keras model. Sizes chosen so a row compiles and runs in seconds on the 2-core machine.
MODELS = {
    "gpt": Model("gpt", "models.gpt:factory", {"layers": 8, "width": 256, "heads": 8, "seq": 256, "batch": 4,
                                               "vocab": 512},
                 {"layers": 4, "width": 64, "heads": 4, "seq": 256, "batch": 8, "vocab": 256}),
    "unet": Model("unet", "models.unet:factory", {"depth": 3, "channels": 16, "image": 64, "batch": 4},
                  {"depth": 2, "channels": 8, "image": 64, "batch": 4}),
    "flax_linen": Model("flax_linen", "models.flax_linen:factory",
                        {"layers": 4, "width": 128, "heads": 4, "seq": 128, "vocab": 256, "batch": 4},
                        {"layers": 2, "width": 32, "heads": 2, "seq": 128, "vocab": 64, "batch": 8}),
    "keras_llama": Model("keras_llama", "models.keras_lm:factory",
                         {"backbone": "llama", "layers": 4, "width": 128, "heads": 4, "kv_heads": 2, "hidden": 256,
                          "seq": 128, "vocab": 256, "batch": 4},
                         {"backbone": "llama", "layers": 2, "width": 32, "heads": 4, "kv_heads": 2, "hidden": 64,
                          "seq": 128, "vocab": 64, "batch": 8}),
}
DEFAULT_MODELS = tuple(MODELS)
# not a default: the smallest step, for checking the bench itself
MODELS["mlp"] = Model("mlp", "models.mlp:factory", {"layers": 8, "width": 512, "batch": 256},
                      {"layers": 3, "width": 32, "in_dim": 16, "batch": 16})


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
    step_ms_min: float | None = None
    step_ms_spread: float | None = None  # (max - min) / median of the timed runs
    predicted_ms: float | None = None  # kernels priced on the calibrated profile
    predicted_raw_ms: float | None = None  # on the data-sheet profile
    predicted_peak: int | None = None  # the plan's peak on the graph (rematopt rows)
    predicted_overhead: float | None = None  # the plan's recompute overhead on the graph
    kernels: int | None = None
    bytes_moved: int | None = None
    grad_error: float | None = None
    compile_s: float | None = None
    argument_bytes: int | None = None
    output_bytes: int | None = None
    device_memory: int | None = None  # what the device reports it can hold (GPU)
    note: str = ""


# ---------------------------------------------------------------- one row, in its own process

def measure(spec: dict) -> dict:
    """Compile and run one variant (``spec`` as :func:`_row_spec` makes it); a dict of :class:`Row`'s fields."""
    import jax
    import numpy as np

    from ..importers.costmodel import device
    from ..jax import load_factory
    from ..xla.cost import step_cost
    from ..xla.memory import xla_reference

    config = dict(spec["config"])
    if spec.get("remat"):
        config.update(remat=spec["remat"], remat_scope=spec["scope"])
    fn, args = load_factory(spec["model"], **config)
    if spec.get("plan"):
        from ..importers import load as load_graph
        from ..jax import apply_plan
        from ..plan import Plan

        fn = apply_plan(fn, load_graph(spec["graph"]), Plan.load(spec["plan"]))
    backend = jax.default_backend()
    start = time.perf_counter()
    compiled = jax.jit(jax.value_and_grad(fn)).lower(*args).compile(**_options(spec))
    compile_s = time.perf_counter() - start
    ref = xla_reference(compiled.memory_analysis(), backend)
    cost = step_cost(compiled.as_text(), device(spec["device"]))
    out = jax.block_until_ready(compiled(*args))  # the warm-up
    grads = [np.asarray(x) for x in jax.tree_util.tree_leaves(out[1])]
    if spec["grads"] and not Path(spec["grads"]).exists():
        np.savez(spec["grads"], *grads)
        error = 0.0
    else:
        with np.load(spec["grads"]) as base:
            error = max((float(np.max(np.abs(g - base[f"arr_{i}"]))) for i, g in enumerate(grads)), default=0.0)
    times = []
    for _ in range(spec["runs"]):
        t = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        times.append(time.perf_counter() - t)
    median = statistics.median(times)
    stats = jax.devices()[0].memory_stats() or {}
    return {"compiled_peak": ref.bytes, "compiled_peak_is": ref.what, "device_peak": stats.get("peak_bytes_in_use"),
            "step_ms": 1e3 * median, "step_ms_min": 1e3 * min(times), "step_ms_spread": (max(times) - min(times)) / median,
            "predicted_raw_ms": 1e3 * cost.seconds, "kernels": len(cost.kernels), "bytes_moved": cost.bytes_moved,
            "grad_error": error, "compile_s": compile_s, "backend": backend,
            "argument_bytes": int(compiled.memory_analysis().argument_size_in_bytes),
            "output_bytes": int(compiled.memory_analysis().output_size_in_bytes),
            "device_memory": stats.get("bytes_limit")}


def _options(spec: dict) -> dict:
    return {"compiler_options": {"xla_gpu_memory_limit_slop_factor": spec["slop"]}} if spec.get("slop") else {}


def plan_step(spec: dict) -> dict:
    """Trace the step on XLA's compiled groups (``fuse="xla"``) and run ``--verify xla``'s closed loop
    (:func:`rematopt.xla.verify.verify`, no stock candidates: the bench measures those itself) at
    each ratio; the graph and each ratio's chosen plan saved under ``spec["dir"]``. Where the loop
    fails, plain cpsat on the per-equation graph at r x its no-remat peak, and the note says why."""
    from ..jax import load_factory, trace_grad
    from ..solve import solve
    from ..xla.verify import verify

    fn, args = load_factory(spec["model"], **spec["config"])
    folder = Path(spec["dir"])
    out: dict = {"plans": {}}
    graph = None
    for ratio in spec["ratios"]:
        path = folder / f"plan_{ratio}.json"
        try:
            if graph is None:
                graph = trace_grad(fn, *args, name=spec["label"], fuse="xla", device=spec["device"])
            v = verify(fn, args, graph, "cpsat", ratio, time_limit=spec["time_limit"], stock={})
        except Exception as e:  # the loop's failure is a finding of the bench, reported on the row
            why = f"--verify xla failed ({type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''})"
            fallback = trace_grad(fn, *args, name=spec["label"], device=spec["device"])
            sol = solve(fallback, "cpsat", budget_ratio=ratio, time_limit=spec["time_limit"] / 2, workers=2,
                        lp_bound=False, check_budget=False)
            if sol.replay is None:
                out["plans"][str(ratio)] = {"status": f"{why}; cpsat: {sol.plan.stats.status}"}
                continue
            fallback.save(folder / f"graph_{ratio}.json")
            sol.plan.save(path)
            out["plans"][str(ratio)] = {"status": f"{why}; cpsat {sol.plan.stats.status} on the per-equation graph "
                                                  f"at r x its peak", "path": str(path),
                                        "graph": str(folder / f"graph_{ratio}.json"), "nodes": fallback.n,
                                        "peak": sol.replay.peak_bytes, "overhead": sol.replay.overhead}
            continue
        c = v.chosen
        if c.plan is None:
            out["plans"][str(ratio)] = {"status": "--verify xla: no plan"}
            continue
        graph.save(folder / "graph.json")
        c.plan.save(path)
        out["plans"][str(ratio)] = {"status": f"--verify xla: cpsat {c.status}, {'fits' if c.fits else 'misses'} "
                                              f"after {v.rounds} round{'s' * (v.rounds != 1)}",
                                    "path": str(path), "graph": str(folder / "graph.json"), "nodes": graph.n,
                                    "peak": c.predicted_peak, "overhead": c.overhead}
    return out


def _worker(spec: dict, env: dict, timeout: float) -> dict:
    """Run ``measure`` or ``plan_step`` in a fresh interpreter; its JSON, or ``{"error": ...}``."""
    run = subprocess.run([sys.executable, "-m", "rematopt.studies.device", json.dumps(spec)], capture_output=True,
                         text=True, env=env, cwd=spec["cwd"], timeout=timeout)
    lines = run.stdout.strip().splitlines()
    if run.returncode != 0 or not lines:
        last = [ln for ln in run.stderr.strip().splitlines()  # the exception's line, not JAX's traceback note
                if ln.strip() and not ln.startswith(("For simplicity, JAX", "-----"))]
        return {"error": (last[-1] if last else f"exit status {run.returncode}")[:300]}
    return json.loads(lines[-1])


# ---------------------------------------------------------------- the bench

@dataclass
class Bench:
    backend: str
    device: str  # the cost profile's name
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    planning: str = ""
    ratios: tuple[float, ...] = RATIOS


def run_bench(models: tuple[str, ...] = DEFAULT_MODELS, quick: bool = False, runs: int | None = None,
              ratios: tuple[float, ...] | None = None, time_limit: float | None = None, out: Path | None = None,
              progress: Callable[[str], None] = print, cwd: Path | None = None,
              configs: dict[str, dict] | None = None) -> Bench:
    """Measure every variant of every model; writes the report after each row (Ctrl-C keeps them)."""
    cwd = cwd or Path.cwd()
    runs = runs or (3 if quick else 7)
    ratios = ratios or (QUICK_RATIOS if quick else RATIOS)
    time_limit = time_limit or (60.0 if quick else 120.0)  # --verify xla: tracing, compiles and rounds
    env = {**os.environ, "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} {CPU_SCHEDULER}".strip(),
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH", "")])}
    backend = _worker({"probe": True, "cwd": str(cwd)}, env, 120).get("backend", "cpu")
    profile = {"cpu": "cpu", "gpu": "h200", "tpu": "tpu-v4"}.get(backend, "cpu")
    bench = Bench(backend, profile, ratios=ratios)
    bench.planning = ("cpsat on the graph traced with fuse='xla' (nodes as XLA's compiled plain step makes "
                      "them) under --verify xla's closed loop (rematopt.xla.verify, stock policies left out: "
                      "they are rows of their own): the planning budget is bisected until the applied plan's "
                      "compiled peak fits r x the compiled plain peak, within the time limit")
    if backend == "cpu":
        bench.notes.append(f"CPU rows run under XLA_FLAGS={CPU_SCHEDULER} (the memory-minimizing scheduler).")
    try:
        for name in models:
            model = MODELS[name]
            config = (configs or {}).get(name) or (model.quick if quick else model.config)
            _bench_model(bench, model, config, runs, ratios, time_limit, quick, env, cwd, out, progress)
    except KeyboardInterrupt:
        bench.notes.append("interrupted (Ctrl-C): the rows above are the ones that finished.")
        progress("interrupted: keeping the finished rows")
    if out:
        write_report(bench, out)
    return bench


def _bench_model(bench: Bench, model: Model, config: dict, runs: int, ratios: tuple[float, ...], time_limit: float,
                 quick: bool, env: dict, cwd: Path, out: Path | None, progress: Callable[[str], None]) -> None:
    work = Path(tempfile.mkdtemp(prefix=f"rematopt-device-{model.label}-"))
    base = {"model": model.spec, "config": config, "runs": runs, "grads": str(work / "grads.npz"),
            "device": bench.device, "cwd": str(cwd)}
    timeout = 900.0

    def row(variant: str, kind: str, ratio: float | None = None, **extra) -> Row | None:
        started = time.perf_counter()
        got = _worker({**base, **extra}, env, timeout)
        r = Row(model.label, variant, kind, ratio)
        if "error" in got:
            r.note = got["error"]
        else:
            for k, v in got.items():
                if hasattr(r, k):
                    setattr(r, k, v)
        bench.rows.append(r)
        _calibrate(bench, model.label)
        progress(f"{model.label:12} {variant:42} " + (f"peak {r.compiled_peak / 1e6:9.2f} MB  step {r.step_ms:8.2f} ms"
                                                      if r.compiled_peak else f"-- {r.note}")
                 + f"  ({time.perf_counter() - started:.0f} s)")
        if out:
            write_report(bench, out)
        return r if "error" not in got else None

    plain = row("plain", "plain")
    if plain is None:
        return
    row("plain (again)", "plain")
    for scope in ("layer", "step"):
        for policy in QUICK_POLICIES[scope] if quick else POLICIES:
            row(f"{scope}:{policy}", scope, remat=policy, scope=scope)
    if bench.backend == "gpu":
        for ratio in ratios:
            slop = _slop(plain, ratio)
            row(f"xla-gpu@{ratio} (slop {slop})", "xla-gpu", ratio, slop=slop)
    planned = _worker({**base, "plan_dir": str(work), "label": model.label, "ratios": list(ratios),
                       "time_limit": time_limit}, env, timeout)
    if "error" in planned:
        bench.notes.append(f"{model.label}: planning failed: {planned['error']}")
        progress(f"{model.label:12} planning failed: {planned['error']}")
        return
    for ratio in ratios:
        p = planned["plans"].get(str(ratio), {})
        if "path" not in p:
            bench.rows.append(Row(model.label, f"rematopt@{ratio}", "rematopt", ratio,
                                  note=f"no plan: {p.get('status', 'not run')}"))
            continue
        r = row(f"rematopt@{ratio}", "rematopt", ratio, graph=p["graph"], plan=p["path"])
        if r is not None:
            r.predicted_peak, r.predicted_overhead = p["peak"], p["overhead"]
            r.note = f"{p['status']}, graph of {p['nodes']} nodes"


def _slop(plain: Row, ratio: float) -> int:
    """The slop factor aiming XLA's GPU remat at ``ratio`` x the plain peak: XLA's limit is
    (0.8 x device memory - inputs - outputs) x slop / 100."""
    args_out = (plain.argument_bytes or 0) + (plain.output_bytes or 0)
    room = GPU_LIMIT_SHARE * (plain.device_memory or 0) - args_out
    if room <= 0:
        return 100
    return max(1, min(100, round(100 * (ratio * plain.compiled_peak - args_out) / room)))


def _calibrate(bench: Bench, model: str) -> None:
    """Every row's predicted time on the profile scaled so the plain step's (median of the plain rows)
    prediction is its measured time (:func:`rematopt.xla.cost.calibrate` with one scale)."""
    plains = [r for r in bench.rows if r.model == model and r.kind == "plain" and r.step_ms and r.predicted_raw_ms]
    if not plains:
        return
    scale = statistics.median(r.step_ms for r in plains) / statistics.median(r.predicted_raw_ms for r in plains)
    for r in bench.rows:
        if r.model == model and r.predicted_raw_ms:
            r.predicted_ms = r.predicted_raw_ms * scale


# ---------------------------------------------------------------- the report

def noise(bench: Bench, model: str) -> float | None:
    """The relative spread of the plain step's repeated measurements: the two fresh-process medians
    and each one's own spread of runs; the larger."""
    plains = [r for r in bench.rows if r.model == model and r.kind == "plain" and r.step_ms]
    if not plains:
        return None
    medians = [r.step_ms for r in plains]
    between = (max(medians) - min(medians)) / statistics.median(medians)
    return max([between] + [r.step_ms_spread or 0.0 for r in plains])


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
            out.append(entry)
    return out


def _mb(x) -> str:
    return "—" if x is None else f"{x / 1e6:,.2f}"


def _ms(x) -> str:
    return "—" if x is None else f"{x:,.2f}"


def markdown(bench: Bench) -> str:
    import jax

    lines = [f"# rematopt bench device: {bench.backend}", "",
             f"jax {jax.__version__}, backend `{bench.backend}`, cost profile `{bench.device}` (scaled per model "
             "so the plain step's kernels price at its measured time). " + " ".join(bench.notes), "",
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
    lines += ["", "Noise: per model, the larger of the spread between two plain-step medians measured in separate "
              "processes and the spread (max - min over median) of one process's timed runs.", "",
              "## Predicted against measured", "", _prediction_summary(bench), "",
              "## Every row", "", f"Planning: {bench.planning}.", "",
              "| model | variant | compiled peak MB | device peak MB | step ms | predicted ms | overhead measured "
              "| overhead predicted | graph: plan peak MB | graph: plan overhead | kernels | GB moved "
              "| max grad error | compile s | note |",
              "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in bench.rows:
        base = _plain_ms(bench, r.model)
        over = lambda x: "—" if x is None or base is None else f"{100 * (x / base[0] - 1):+.1f}%"  # noqa: E731
        pover = "—" if r.predicted_ms is None or base is None else f"{100 * (r.predicted_ms / base[1] - 1):+.1f}%"
        lines.append(f"| {r.model} | {r.variant} | {_mb(r.compiled_peak)} | {_mb(r.device_peak)} | {_ms(r.step_ms)} "
                     f"| {_ms(r.predicted_ms)} | {over(r.step_ms)} | {pover} | {_mb(r.predicted_peak)} | "
                     f"{'—' if r.predicted_overhead is None else f'{100 * r.predicted_overhead:+.1f}%'} | "
                     f"{r.kernels or '—'} | {'—' if r.bytes_moved is None else f'{r.bytes_moved / 1e9:.2f}'} | "
                     f"{'—' if r.grad_error is None else f'{r.grad_error:.1e}'} | "
                     f"{'—' if r.compile_s is None else f'{r.compile_s:.1f}'} | {r.note} |")
    return "\n".join(lines) + "\n"


def _plain_ms(bench: Bench, model: str) -> tuple[float, float] | None:
    """(measured, predicted) plain step time: the medians over the plain rows."""
    plains = [r for r in bench.rows if r.model == model and r.kind == "plain" and r.step_ms and r.predicted_ms]
    if not plains:
        return None
    return statistics.median(r.step_ms for r in plains), statistics.median(r.predicted_ms for r in plains)


def _prediction_summary(bench: Bench) -> str:
    """Per model: how far the calibrated prediction of each variant's step time, and of each plan's
    overhead over the plain step, is from the measurement."""
    out = ["| model | plain: predicted vs measured | variants within 15% | worst variant | plans: predicted "
           "overhead - measured (points) |", "|---|---:|---:|---|---|"]
    for model in dict.fromkeys(r.model for r in bench.rows):
        base = _plain_ms(bench, model)
        if base is None:
            continue
        rows = [r for r in bench.rows if r.model == model and r.step_ms and r.predicted_ms]
        errs = [(r.predicted_ms / r.step_ms - 1, r.variant) for r in rows]
        within = sum(abs(e) <= 0.15 for e, _ in errs)
        worst = max(errs, key=lambda e: abs(e[0]))
        plans = [f"{r.variant} {100 * ((r.predicted_ms / base[1]) - (r.step_ms / base[0])):+.1f}"
                 for r in rows if r.kind == "rematopt"]
        out.append(f"| {model} | {100 * (base[1] / base[0] - 1):+.1f}% (calibrated on it) | {within} of {len(errs)} "
                   f"| {worst[1]} {100 * worst[0]:+.1f}% | {', '.join(plans) or '—'} |")
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
        ax.legend(fontsize=7)
    fig.suptitle(f"memory against step time ({bench.backend})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str]) -> int:
    """The worker: one JSON spec in, one JSON line out."""
    spec = json.loads(argv[0])
    if spec.get("probe"):
        import jax

        print(json.dumps({"backend": jax.default_backend()}))
        return 0
    if "plan_dir" in spec:
        print(json.dumps(plan_step({**spec, "dir": spec["plan_dir"]})))
        return 0
    print(json.dumps(measure(spec)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
