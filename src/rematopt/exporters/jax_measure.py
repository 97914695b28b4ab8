"""What XLA makes of a plan: compile the training step under each remat
strategy and read XLA's own figures.

For every strategy the step ``jax.value_and_grad(loss_fn, argnums)`` is
compiled with ``jax.jit(...).lower(...).compile()``; the row reports
``memory_analysis().temp_size_in_bytes`` (XLA's scratch memory: activations
and temporaries, arguments and outputs excluded), ``cost_analysis()`` FLOPs
and the seconds the compilation took, next to what the graph model predicts
for rematopt's own plans; on a graph of unrolled loops each plan is applied
twice, its alike iterations scanned and all unrolled. The gradients of every
variant are checked against the un-checkpointed step.
"""

from __future__ import annotations

import os
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import jax
import numpy as np

from ..errors import BudgetError, PlannerError
from ..graph import Graph
from ..importers.jaxpr import trace_grad
from ..reference import no_remat_peak, no_remat_plan
from ..simulate import simulate
from .jax_policy import UnrolledLoop, apply_plan, residual_fates

POLICIES = ("nothing_saveable", "dots_saveable", "dots_with_no_batch_dims_saveable")


@dataclass
class Row:
    variant: str
    temp_bytes: int | None = None
    flops: float | None = None
    grad_error: float | None = None      # max |grad - grad without checkpointing|
    graph_peak: int | None = None        # the plan's simulated peak on the graph
    graph_overhead: float | None = None  # the plan's recompute overhead on the graph
    compile_s: float | None = None       # seconds to lower and compile the step
    fates: str = ""                      # kept / offloaded / recomputed forward values
    note: str = ""


@dataclass
class Measurement:
    graph: Graph
    budget: int
    budget_ratio: float
    rows: list[Row] = field(default_factory=list)

    def markdown(self, title: str = "") -> str:
        g = self.graph
        head = [f"# {title or g.name}", "",
                f"Graph: {g.n} nodes ({g.meta.get('equations')} equations), device profile "
                f"`{g.meta.get('device')}`, jax {jax.__version__} on {jax.default_backend()}; "
                f"no-remat peak {no_remat_peak(g):,} B, budget ratio {self.budget_ratio} "
                f"= {self.budget:,} B. XLA_FLAGS=`{os.environ.get('XLA_FLAGS', '')}`.", "",
                "| variant | XLA temp bytes | XLA FLOPs | compile s | max grad error | graph peak | graph overhead "
                "| kept/offloaded/recomputed | note |",
                "|---|---:|---:|---:|---:|---:|---:|---|---|"]
        fmt = lambda x, f: "—" if x is None else f.format(x)  # noqa: E731
        lines = [f"| {r.variant} | {fmt(r.temp_bytes, '{:,}')} | {fmt(r.flops, '{:,.0f}')} | "
                 f"{fmt(r.compile_s, '{:.2f}')} | "
                 f"{fmt(r.grad_error, '{:.1e}')} | {fmt(r.graph_peak, '{:,}')} | "
                 f"{fmt(r.graph_overhead, '{:.1%}')} | {r.fates or '—'} | {r.note} |" for r in self.rows]
        return "\n".join(head + lines) + "\n"


def compile_step(loss_fn: Callable, args: Sequence, argnums: tuple[int, ...]):
    """The compiled ``value_and_grad`` step, its temp bytes, FLOPs, and the
    seconds tracing, lowering and compiling it took."""
    start = time.perf_counter()
    compiled = jax.jit(jax.value_and_grad(loss_fn, argnums)).lower(*args).compile()
    took = time.perf_counter() - start
    temp = int(compiled.memory_analysis().temp_size_in_bytes)
    costs = compiled.cost_analysis()
    costs = costs[0] if isinstance(costs, (list, tuple)) else costs
    return compiled, temp, float(costs.get("flops", float("nan"))), took


def measure(loss_fn: Callable, *args: Any, budget_ratio: float, argnums: int | Sequence[int] = 0,
            graph: Graph | None = None, planners: Sequence[str] = ("greedy", "cpsat"),
            time_limit: float = 20.0, fuse: bool = False, device: str = "a100") -> Measurement:
    """Compile the step without checkpointing, under JAX's policies, and under
    rematopt's plans at ``budget_ratio`` x the graph's no-remat peak.

    A planner that is not importable, or finds no plan, gets a row saying so.
    """
    from .. import solve

    argnums = (argnums,) if isinstance(argnums, int) else tuple(argnums)
    graph = graph or trace_grad(loss_fn, *args, argnums=argnums, fuse=fuse, device=device)
    budget = int(np.floor(budget_ratio * no_remat_peak(graph)))
    out = Measurement(graph, budget, budget_ratio)
    base_compiled, temp, flops, took = compile_step(loss_fn, args, argnums)
    base_grads = base_compiled(*args)
    out.rows.append(Row("no checkpointing", temp, flops, 0.0, compile_s=took))
    for name in POLICIES:
        policy = getattr(jax.checkpoint_policies, name)
        out.rows.append(_row(f"jax.checkpoint({name})", jax.checkpoint(loss_fn, policy=policy), args,
                             argnums, base_grads))
    plans = [("rematopt no-remat (control)", no_remat_plan(graph), "")]
    for planner in planners:
        label = f"rematopt {planner}"
        try:
            start = time.perf_counter()
            sol = solve(graph, planner, budget=budget, time_limit=time_limit, workers=2)
        except (PlannerError, BudgetError) as e:
            plans.append((label, None, f"not available: {e}"))
            continue
        took = f"{time.perf_counter() - start:.1f} s"
        plans.append((label, sol.plan if sol.replay else None, f"{sol.status}, {took}"))
    loops = any("iteration" in v.extra for v in graph.nodes)
    for label, plan, note in plans:
        if plan is None:
            out.rows.append(Row(label, note=note if "available" in note else f"no plan ({note})"))
            continue
        replay = simulate(graph, plan)
        f = residual_fates(graph, plan)
        # a graph of unrolled loops: the plan applied with its alike iterations
        # scanned (the default), and all unrolled for comparison
        for scan in (True, False) if loops else (True,):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UnrolledLoop)
                planned = apply_plan(loss_fn, graph, plan, scan=scan)
                row = _row(label if scan else f"{label} (unrolled)", planned, args, argnums, base_grads)
            row.graph_peak, row.graph_overhead = replay.peak_bytes, replay.overhead
            row.fates = f"{len(f.kept)}/{len(f.offloaded)}/{len(f.recomputed)}"
            looped = "; ".join(n.describe() for n in planned.loops) if scan and loops else ""
            row.note = "; ".join(x for x in (note, row.note, looped) if x)
            out.rows.append(row)
    return out


def _row(label: str, fn: Callable, args: Sequence, argnums: tuple[int, ...], base: Any) -> Row:
    compiled, temp, flops, took = compile_step(fn, args, argnums)
    got = compiled(*args)
    err = max((float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
               for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(base))), default=0.0)
    return Row(label, temp, flops, err, compile_s=took)
