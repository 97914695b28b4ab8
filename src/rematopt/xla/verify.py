"""The closed loop (``--verify xla``): a plan whose compiled step fits.

The budget is a share of the compiled plain step's peak. Each round plans at
a planning budget on the graph, applies the plan (:func:`~rematopt.jax.apply_plan`),
compiles it with the installed XLA and reads XLA's figure for its memory
(:func:`xla_peak`). The graph model misses what XLA does (fusion, its own
schedule), so a plan at the budget may compile over it, or far under it: the
planning budget is bracketed between one whose plan fits and one whose plan
misses, and bisected, for a bounded number of rounds. JAX's stock policies
compile beside the plans, so the answer is never worse than the best of them
that fits; the answer is the fitting candidate with the fewest compiled FLOPs.
On CPU a plan of the compiled graph compiles twice: in its own order (each
backward kernel tied to the one before, the step its predicted peak is of)
and in the order XLA's scheduler picks, which is sometimes lower. A compiled
graph is planned in two orders (:func:`plan_orders`), each in its share of
the time: XLA's schedule of the plain step, and the eager one
(:mod:`rematopt.reorder`), which XLA runs because the plan's order is tied
(resnet at 0.8: every plan in XLA's order misses, the eager order's fits);
each candidate records the order its plan was made in.

A candidate "fits" when XLA's figure is within the budget: a statement about
the compiled program, never about the graph model.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import jax

from ..errors import BudgetError, PlannerError
from ..graph import Graph
from ..plan import Plan
from ..reference import no_remat_peak
from ..sizes import human_bytes
from . import flags
from .memory import xla_reference

POLICIES = ("nothing_saveable", "dots_saveable", "dots_with_no_batch_dims_saveable")
MAX_ROUNDS = 8   # planning rounds; the bisection halves the bracket each round
RESOLUTION = 0.01  # stop bisecting when the bracket is narrower than this share of the graph's peak


@dataclass(frozen=True)
class Compiled:
    """XLA's figures for one compiled step."""

    peak_bytes: int
    flops: float
    bytes_accessed: float


@dataclass(frozen=True)
class Candidate:
    """One step XLA compiled: a plan at a planning budget, or a stock policy."""

    label: str
    kind: str                            # "plan" or "policy"
    compiled: Compiled
    fits: bool
    planning_budget: int | None = None   # bytes on the graph the planner was given
    predicted_peak: int | None = None    # the applied step's peak on the graph (exporters.jax_applied)
    plan_peak: int | None = None         # the plan's own peak on the graph (the planner's figure)
    overhead: float | None = None        # the plan's recompute overhead on the graph
    status: str = ""                     # the planner's status (OPTIMAL speaks of the graph model)
    plan: Plan | None = field(default=None, compare=False, repr=False)
    order: str | None = None             # the graph order the plan was made in (plan_orders), None for a policy
    ordered: bool = True                 # applied with the plan's order tied (apply_plan's ``ordered``)

    def record(self) -> dict[str, Any]:
        return {"label": self.label, "kind": self.kind, "fits": self.fits, "xla_peak_bytes": self.compiled.peak_bytes,
                "xla_flops": self.compiled.flops, "xla_bytes_accessed": self.compiled.bytes_accessed,
                "planning_budget_bytes": self.planning_budget, "predicted_peak_bytes": self.predicted_peak,
                "plan_peak_bytes": self.plan_peak,
                "overhead": self.overhead, "status": self.status, "order": self.order,
                "ordered": self.ordered if self.kind == "plan" else None}


@dataclass(frozen=True)
class Verdict:
    """What the loop found: the chosen candidate (the cheapest that fits, else
    the one of least compiled peak), every candidate tried, and what XLA was told."""

    budget: int
    budget_ratio: float
    plain: Compiled
    reference: str                    # which XLA figure the peaks are
    graph_peak: int                   # the graph's no-remat peak
    chosen: Candidate
    candidates: tuple[Candidate, ...]
    rounds: int
    settings: dict[str, Any]
    wall_s: float
    orders: dict[str, int] = field(default_factory=dict)  # the orders planned in: their no-remat peaks on the graph

    @property
    def fits(self) -> bool:
        return self.chosen.fits

    def headline(self) -> str:
        c = self.chosen
        extra = 100 * (c.compiled.flops / self.plain.flops - 1) if self.plain.flops else 0.0
        where = (f"compiled peak {human_bytes(c.compiled.peak_bytes)} "
                 f"({c.compiled.peak_bytes / self.plain.peak_bytes:.1%} of the plain step's "
                 f"{human_bytes(self.plain.peak_bytes)})")
        if self.fits:
            return (f"fits: {where} within the {human_bytes(self.budget)} budget, {c.label}, "
                    f"{extra:+.1f}% FLOPs, {self.rounds} planning round{'s' * (self.rounds != 1)}, "
                    f"{self.wall_s:.1f} s")
        return (f"does not fit: no candidate compiles within the {human_bytes(self.budget)} budget; "
                f"the least is {c.label}, {where}, after {self.rounds} planning "
                f"round{'s' * (self.rounds != 1)}")

    def summary(self) -> dict[str, Any]:
        c = self.chosen
        return {"fits": self.fits, "budget_bytes": self.budget, "budget_ratio": self.budget_ratio,
                "xla_plain_peak_bytes": self.plain.peak_bytes, "xla_reference": self.reference,
                "graph_no_remat_peak_bytes": self.graph_peak, "chosen": c.label, "kind": c.kind,
                "predicted_peak_bytes": c.predicted_peak, "plan_peak_bytes": c.plan_peak,
                "xla_peak_bytes": c.compiled.peak_bytes,
                "planning_budget_bytes": c.planning_budget, "status": c.status, "overhead": c.overhead,
                "order": c.order,
                "xla_flops": c.compiled.flops, "xla_plain_flops": self.plain.flops, "rounds": self.rounds,
                "wall_s": self.wall_s, "xla_settings": self.settings, "orders_no_remat_peak_bytes": self.orders,
                "candidates": [k.record() for k in self.candidates]}


def xla_peak(compiled: Any) -> tuple[int, str]:
    """XLA's own figure for a compiled step's memory, and which it is
    (:func:`~rematopt.xla.memory.xla_reference`: ``peak_memory_in_bytes`` on
    GPU / TPU; on CPU, which computes none, temp + arguments + outputs - aliases)."""
    ref = xla_reference(compiled.memory_analysis(), jax.default_backend())
    return ref.bytes, ref.what


def compile_figures(loss_fn: Callable, args: Sequence, argnums: tuple[int, ...],
                    settings: flags.XlaSettings) -> tuple[Compiled, str]:
    """Compile ``value_and_grad(loss_fn)`` at ``args`` under ``settings``; XLA's figures."""
    compiled = flags.compile_jitted(jax.jit(jax.value_and_grad(loss_fn, argnums)), args, settings)
    peak, reference = xla_peak(compiled)
    costs = compiled.cost_analysis()
    costs = costs[0] if isinstance(costs, (list, tuple)) else costs
    return Compiled(peak, float(costs.get("flops", 0.0)), float(costs.get("bytes accessed", 0.0))), reference


def stock_policies(loss_fn: Callable, extra: dict[str, Callable] | None = None) -> dict[str, Callable]:
    """JAX's stock policies over the whole loss, and ``extra`` (per-layer
    variants where the model offers them), as loss functions by label."""
    out = {f"jax.checkpoint({name}, whole step)":
           jax.checkpoint(loss_fn, policy=getattr(jax.checkpoint_policies, name)) for name in POLICIES}
    out.update(extra or {})
    return out


def verify(loss_fn: Callable, args: Sequence, graph: Graph, planner: str, budget_ratio: float,
           time_limit: float = 120.0, options: dict[str, Any] | None = None,
           stock: dict[str, Callable] | None = None, settings: flags.XlaSettings | None = None,
           progress: Callable[[str], None] | None = None,
           known: dict[str, tuple[Compiled, str]] | None = None, fallback: Graph | None = None) -> Verdict:
    """The cheapest candidate whose compiled peak is within ``budget_ratio`` x
    the compiled plain step's (module docstring), planning in each of
    :func:`plan_orders`' orders in turn, each in its share of the time left.
    ``stock``: label -> loss
    function of the stock-policy candidates (:func:`stock_policies`);
    ``known``: figures already compiled under these labels (``"plain"`` and
    the stock labels), reused across budgets of one model; ``fallback``: the
    graph to plan on instead when a plan of ``graph`` does not apply (the
    traced graph, for a compiled one)."""
    start = time.perf_counter()
    settings = settings or flags.for_backend(jax.default_backend())
    flags.apply(settings)
    say = progress or (lambda line: None)
    argnums = tuple(graph.meta.get("argnums", (0,)))
    known = {} if known is None else known

    def figures(label: str, fn: Callable) -> Compiled:
        if label not in known:
            known[label] = compile_figures(fn, args, argnums, settings)
        return known[label][0]

    plain = figures("plain", loss_fn)
    reference = known["plain"][1]
    budget = int(math.floor(budget_ratio * plain.peak_bytes))
    say(f"plain step: XLA peak {human_bytes(plain.peak_bytes)} ({reference}); budget {human_bytes(budget)}")
    # the plain step is the answer where nothing else compiles smaller (a ratio of 1, or a loop out of time)
    candidates: list[Candidate] = [Candidate("plain step", "policy", plain, plain.peak_bytes <= budget)]
    for label, fn in (stock if stock is not None else stock_policies(loss_fn)).items():
        if label not in known and time.perf_counter() - start >= time_limit:  # the limit is the whole loop's
            say(f"{label}: not compiled, the time limit ran out")
            continue
        c = figures(label, fn)
        candidates.append(Candidate(label, "policy", c, c.peak_bytes <= budget))
        say(f"{label}: XLA peak {human_bytes(c.peak_bytes)} ({'fits' if c.peak_bytes <= budget else 'misses'})")

    options = dict(options or {})
    orders = plan_orders(graph)
    rounds = 0
    for k, (name, ordered) in enumerate(orders.items()):
        left = time_limit - (time.perf_counter() - start)
        deadline = start + time_limit - left * (len(orders) - k - 1) / (len(orders) - k)  # its share of what is left
        found, used = _search(loss_fn, args, argnums, ordered, name, planner, budget, plain, options, settings, say,
                              deadline, fallback if k == 0 else None, no_remat_peak(graph))
        candidates += found
        rounds += used
    fitting = [k for k in candidates if k.fits]
    chosen = (min(fitting, key=lambda k: (k.compiled.flops, k.compiled.bytes_accessed, k.compiled.peak_bytes))
              if fitting else min(candidates, key=lambda k: (k.compiled.peak_bytes, k.compiled.flops)))
    return Verdict(budget, budget_ratio, plain, reference, no_remat_peak(graph), chosen, tuple(candidates), rounds,
                   flags.record(settings), time.perf_counter() - start,
                   {name: no_remat_peak(g) for name, g in orders.items()})


def plan_orders(graph: Graph) -> dict[str, Graph]:
    """The orders the loop plans in, by name: the graph's own ("xla": XLA's
    schedule of the plain step, for a compiled graph), and for a compiled
    graph, whose plans ``apply_plan`` ties in the plan's order, the eager one
    (:func:`rematopt.reorder.eager`) where it lowers the no-remat peak."""
    from ..reorder import eager

    own = "xla" if graph.meta.get("fuse") == "xla" else "program"
    if own != "xla":
        return {own: graph}
    moved = eager(graph)
    if no_remat_peak(moved) >= no_remat_peak(graph):
        return {own: graph}
    return {own: graph, "eager": moved}


def _search(loss_fn: Callable, args: Sequence, argnums: tuple[int, ...], graph: Graph, order: str, planner: str,
            budget: int, plain: Compiled, options: dict[str, Any], settings: flags.XlaSettings,
            say: Callable[[str], None], deadline: float, fallback: Graph | None,
            base_peak: int) -> tuple[list[Candidate], int]:
    """Plans of ``graph`` (in its ``order``) bracketed and bisected on the
    planning budget until ``deadline`` or :data:`MAX_ROUNDS`: the candidates
    compiled, and the rounds run. The first planning budget is the budget's
    share of the plain step scaled by ``base_peak`` (the no-remat peak of the
    graph in XLA's order) over the plain step's figure: the graph model's
    bias, which a reordering does not change."""
    from ..exporters.jax_applied import applied_peak
    from ..exporters.jax_policy import apply_plan
    from ..solve import solve

    candidates: list[Candidate] = []
    g0 = no_remat_peak(graph)
    rounds = 0
    lo: int | None = None   # largest planning budget whose plan fits
    # smallest whose plan misses: in XLA's order the no-remat plan compiles to the plain step; in another
    # order it may fit, so it is tried (b is at most g0) and nothing above it
    hi = g0 if order in ("xla", "program") else g0 + 1
    floor = 0               # largest planning budget the planner found no plan for
    b = min(g0, int(base_peak * budget / plain.peak_bytes))
    tried: set[int] = set()
    began: float | None = None  # when the previous round began
    while rounds < MAX_ROUNDS and b > floor and b not in tried:
        tried.add(b)
        now = time.perf_counter()
        last_round = 0.0 if began is None else now - began
        left = deadline - now
        if left <= last_round:  # a round takes about as long as the one before: it would not end in time
            break
        began = now
        per_round = left / (MAX_ROUNDS - rounds)
        opts = dict(options)
        if "time_limit" in _planner_options(planner):
            opts["time_limit"] = max(1.0, per_round / 2)  # the other half: apply and compile
        rounds += 1
        try:
            sol = solve(graph, planner, budget=b, **opts)
        except BudgetError:
            sol = None
        if sol is None or not sol.has_plan:
            say(f"{order} order, round {rounds}: planning budget {human_bytes(b)}: no plan "
                f"({'below the bound' if sol is None else sol.status})")
            floor = b
            b = (b + hi) // 2 if lo is None else (lo + hi) // 2
            if lo is not None and hi - lo < RESOLUTION * g0:
                break
            continue
        where = "compiled" if graph.meta.get("fuse") == "xla" else "traced"
        label = f"{planner} plan, {where} graph, {order} order (planning budget {human_bytes(b)})"
        try:
            c, _ = compile_figures(apply_plan(loss_fn, graph, sol.plan), args, argnums, settings)
            variants = [(label, c, applied_peak(graph, sol.plan), True)]
            if where == "compiled" and jax.default_backend() == "cpu":  # the plan's order tied, or XLA's own
                free, _ = compile_figures(apply_plan(loss_fn, graph, sol.plan, ordered=False), args, argnums, settings)
                variants.append((f"{label}, XLA's order", free, None, False))  # planned in ``order``, run in XLA's
        except Exception as e:  # noqa: BLE001 - a plan the exporter cannot run: say so, plan elsewhere
            say(f"{order} order, round {rounds}: the plan does not apply ({type(e).__name__}: {e})"
                + ("; planning on the traced graph" if fallback is not None else "; no more planning in it"))
            if fallback is None:
                break
            graph, fallback, order = fallback, None, "program"
            g0, lo, hi, floor = no_remat_peak(graph), None, no_remat_peak(graph), 0
            b = int(g0 * budget / plain.peak_bytes)
            tried.clear()
            continue
        for name, k, predicted, ordered in variants:
            candidates.append(Candidate(name, "plan", k, k.peak_bytes <= budget, b, predicted, sol.replay.peak_bytes,
                                        sol.replay.overhead, sol.status, sol.plan, order, ordered))
        c = min((k for _, k, _, _ in variants), key=lambda k: k.peak_bytes)
        fits = c.peak_bytes <= budget
        say(f"{order} order, round {rounds}: planning budget {human_bytes(b)}: plan peak "
            f"{human_bytes(sol.replay.peak_bytes)}, applied {human_bytes(variants[0][2])}, "
            f"XLA peak {human_bytes(variants[0][1].peak_bytes)}"
            + (f" (in XLA's order {human_bytes(variants[1][1].peak_bytes)})" if len(variants) > 1 else "")
            + f" ({'fits' if fits else 'misses'})")
        if sol.status == "OVER_BUDGET" and not fits and lo is None:
            break  # the planner's least plan misses: a lower planning budget gives no other
        if fits:
            lo = b
        else:
            hi = b
        if lo is None:  # no fitting plan yet: step down by XLA's excess, at least 2%
            b = max(floor + 1, min(int(b * budget / c.peak_bytes), int(b * 0.98)))
        else:
            if hi - lo < RESOLUTION * g0:
                break
            b = (lo + hi) // 2
    return candidates, rounds


def _planner_options(planner: str) -> set[str]:
    from .. import planners

    try:
        return set(planners.options(planner))
    except PlannerError:
        return set()
