"""The first round of ``--verify xla``, measured: for every model in
``models/`` (at its instance config) and each budget ratio, the plan made at
that share of the graph's no-remat peak (moved up toward it, as the loop
does, while the planner finds none), its own peak, the peak of the step
``apply_plan`` runs (:func:`~rematopt.exporters.jax_applied.applied_peak`,
the loop's prediction), and XLA's figures for the compiled step in the
plan's order and in XLA's (``ordered=False``): how far the prediction is
off before the loop corrects it. A plan that computes a value twice is
also applied, predicted and compiled with each value computed once
(``apply_plan(..., as_planned=False)``; ``*_once``), as the loop's round
compiles it: the round goes on from the smaller of the two. FLOPs count each loop body times its trip
count (:func:`~rematopt.xla.kernels.step_flops`; XLA's ``cost_analysis()``
counts a scanned step's body once). Run from a checkout
(models/ is imported), on CPU under the memory-minimizing scheduler:

    python -m rematopt.studies.first_round OUT.jsonl [planners=greedy,cpsat] [ratios=0.8,0.6,0.5]
        [deterministic_time=D|wall] [time_limit=S] [MODEL ...]

cpsat runs on one worker for D seconds of CP-SAT's deterministic time
(default :data:`CPSAT_DETERMINISTIC_S`), S wall seconds the outer bound, so
its plans, and the table, are the same on any load; ``deterministic_time=wall``
gives it S wall seconds instead (default :data:`CPSAT_SECONDS`), as the
study ran before. Each record says which limit ended the solve (``stopped_by``).
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path
from typing import Any

from ..errors import BudgetError
from ..xla import flags
from .closed_loop import MODELS, RATIOS

CPSAT_SECONDS = 8.0  # per plan on the wall clock: the loop's first round gets about this much on a model of this size
CPSAT_DETERMINISTIC_S = 8.0  # per plan, the default: CP-SAT's deterministic seconds, one worker
CPSAT_WALL_S = 600.0  # the wall clock's bound on a deterministic solve: only a far slower machine reaches it
TRIES = 4            # planning budgets tried, each halfway up to the no-remat peak, before giving up


def cpsat_limits(deterministic_time: float | None = CPSAT_DETERMINISTIC_S,
                 time_limit: float | None = None) -> dict[str, Any]:
    """cpsat's options: ``deterministic_time`` seconds of CP-SAT's deterministic time on one worker,
    ``time_limit`` (default :data:`CPSAT_WALL_S`) the wall clock's bound; ``deterministic_time=None``:
    ``time_limit`` wall seconds alone (default :data:`CPSAT_SECONDS`), which depend on the load."""
    if deterministic_time is None:
        return {"time_limit": time_limit or CPSAT_SECONDS, "workers": 1}
    return {"deterministic_time": deterministic_time, "time_limit": time_limit or CPSAT_WALL_S, "workers": 1}


def first_plan(graph, planner: str, ratio: float, opts: dict[str, Any]):
    """The plan the loop's first round makes: at ``ratio`` of the graph's no-remat peak, the budget
    moved halfway up to it (:data:`TRIES` times) while the planner finds none. Returns the solution
    (None: none found) and the planning budget it was found at."""
    from ..reference import no_remat_peak
    from ..solve import solve

    g0 = no_remat_peak(graph)
    b = int(g0 * ratio)
    for _ in range(TRIES):
        try:
            sol = solve(graph, planner, budget=b, **opts)
        except BudgetError:
            sol = None
        if sol is not None and sol.has_plan:
            return sol, b
        b = (b + g0) // 2
    return None, b


def rows(name: str, planners: tuple[str, ...], ratios: tuple[float, ...],
         limits: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """One record per (planner, ratio) for model ``name``; ``limits``: the options of a planner that
    takes a time limit (:func:`cpsat_limits`)."""
    import jax

    from .. import planners as registry
    from ..exporters.jax_applied import applied_peak, scanned_nodes
    from ..exporters.jax_policy import computes_twice
    from ..jax import apply_plan
    from ..reference import no_remat_peak
    from ..xla.factory import load_step, plan_graphs
    from ..xla.hlo import parse_hlo
    from ..xla.kernels import step_flops
    from ..xla.verify import xla_peak

    step = load_step(*MODELS[name])
    fn, args = step.fn, step.args
    settings = flags.for_backend(jax.default_backend())

    def compile_figures(f) -> tuple[int, int]:
        """XLA's peak for ``value_and_grad(f)``, and its FLOPs with loop bodies times their trip counts."""
        compiled = flags.compile_jitted(jax.jit(jax.value_and_grad(f, step.argnums)), args, settings, read_only=True)
        return xla_peak(compiled)[0], step_flops(parse_hlo(compiled.as_text()))

    plain, plain_flops = compile_figures(fn)
    graphs = [g for g in plan_graphs(step) if g is not None]
    out = []
    for planner in planners:
        opts = (limits or cpsat_limits()) if "time_limit" in registry.options(planner) else {}
        for ratio in ratios:
            rec: dict[str, Any] = {"model": name, "planner": planner, "ratio": ratio, "xla_plain": plain,
                                   "plain_flops": plain_flops}
            for graph in graphs:
                where = "compiled" if graph.meta.get("fuse") == "xla" else "traced"
                g0 = no_remat_peak(graph)
                sol, b = first_plan(graph, planner, ratio, opts)
                if sol is None:
                    rec.update(graph=where, error="no plan")
                    break
                try:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        applied = apply_plan(fn, graph, sol.plan)
                        c, flops = compile_figures(applied)
                        free, free_flops = compile_figures(apply_plan(fn, graph, sol.plan, ordered=False))
                        if computes_twice(graph, sol.plan):  # the loop's round compiles it computed once too
                            once = apply_plan(fn, graph, sol.plan, as_planned=False)
                            rec.update(zip(("xla_once", "flops_once"), compile_figures(once)),
                                       applied_peak_once=applied_peak(graph, sol.plan, scanned_nodes(once.loops),
                                                                      as_planned=False))
                except Exception as e:  # noqa: BLE001 - as the loop does: a plan that does not apply, the traced graph
                    rec["apply_error"] = f"{type(e).__name__}: {e}"[:200]
                    continue
                rec.update({k: sol.plan.stats[k] for k in ("stopped_by", "deterministic_spent")
                            if k in sol.plan.stats})
                rec.update(graph=where, planning_ratio=b / g0, status=sol.status, plan_peak=sol.replay.peak_bytes,
                           applied_peak=applied_peak(graph, sol.plan, scanned_nodes(applied.loops)), xla=c, flops=flops,
                           xla_unordered=free, flops_unordered=free_flops)
                break
            out.append(rec)
    return out


def markdown(records: list[dict[str, Any]]) -> str:
    head = ("| model | planner | ratio | graph | plan peak / XLA, XLA's order | applied peak / XLA, plan's order "
            "| the same, each value computed once (XLA / plain) "
            "| XLA / plain: XLA's order, plan's | FLOPs vs plain, loop bodies x trips: XLA's order, plan's |\n"
            "|---|---|---:|---|---:|---:|---:|---:|---:|\n")
    lines = []
    for r in records:
        if "xla" not in r:
            lines.append(f"| {r['model']} | {r['planner']} | {r['ratio']} | {r.get('graph', '')} | "
                         f"{r.get('error', r.get('apply_error', ''))} | | | | |")
            continue
        near = lambda x: f"**{x:.3f}**" if abs(x - 1) <= 0.05 else f"{x:.3f}"  # noqa: E731
        lines.append(f"| {r['model']} | {r['planner']} | {r['ratio']} | {r['graph']} | "
                     f"{near(r['plan_peak'] / r['xla_unordered'])} | {near(r['applied_peak'] / r['xla'])} | "
                     + (f"{near(r['applied_peak_once'] / r['xla_once'])} ({r['xla_once'] / r['xla_plain']:.3f}) | "
                        if "xla_once" in r else "- | ") +
                     f"{r['xla_unordered'] / r['xla_plain']:.3f}, {r['xla'] / r['xla_plain']:.3f} | "
                     f"{100 * (r['flops_unordered'] / r['plain_flops'] - 1):+.1f}%, "
                     f"{100 * (r['flops'] / r['plain_flops'] - 1):+.1f}% |")
    return head + "\n".join(lines) + "\n"


def arguments(given: list[str]) -> tuple[dict[str, Any], list[str]]:
    """The command line's KEY=VALUE settings (defaults filled in), and the models named after them."""
    chosen: dict[str, Any] = {"planners": ("greedy", "cpsat"), "ratios": RATIOS,
                              "deterministic_time": CPSAT_DETERMINISTIC_S, "time_limit": None}
    given = list(given)
    while given and "=" in given[0]:
        key, value = given.pop(0).split("=")
        if key == "ratios":
            chosen[key] = tuple(float(x) for x in value.split(","))
        elif key in ("deterministic_time", "time_limit"):
            chosen[key] = None if value == "wall" else float(value)
        else:
            chosen[key] = tuple(value.split(","))
    return chosen, given or list(MODELS)


if __name__ == "__main__":
    flags.apply(flags.CPU_VERIFY)  # before the backend starts
    chosen, names = arguments(sys.argv[2:])
    limits = cpsat_limits(chosen["deterministic_time"], chosen["time_limit"])
    records = []
    with Path(sys.argv[1]).open("a") as f:
        for name in names:
            for rec in rows(name, chosen["planners"], chosen["ratios"], limits):
                print(json.dumps(rec), file=sys.stderr, flush=True)
                f.write(json.dumps(rec) + "\n")
                f.flush()
                records.append(rec)
    print(markdown(records))
