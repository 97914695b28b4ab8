"""The closed loop (``--verify xla``): a plan whose compiled step fits.

The budget is a share of the compiled plain step's peak. Each round plans at
a planning budget on the graph, applies the plan (:func:`~rematopt.jax.apply_plan`),
compiles it with the installed XLA and reads XLA's figure for its memory
(:func:`xla_peak`). The graph model misses what XLA does (fusion, its own
schedule), so a plan at the budget may compile over it, or far under it: the
planning budget is bracketed between one whose plan fits and one whose plan
misses, and bisected, for a bounded number of rounds. JAX's stock policies
compile beside the plans, so the answer is never worse than the best of them
that fits. The answer is the fitting candidate of least priced time: its
compiled kernels on the backend's profile (a measured
:class:`~rematopt.xla.machine.Machine` where given; on CPU by default
:data:`~rematopt.xla.machine.REFERENCE`) plus, on CPU, its predicted page
faults (:func:`~rematopt.xla.cost.step_faults`) at the machine's price;
compiled FLOPs break ties, and decide where a candidate cannot be priced
(flax_linen at 0.8: the plan of fewest FLOPs faulted 8,401 pages a step, its
temp buffer above glibc's mmap ceiling, and ran 1.30x the per-layer policy).
Where the answer still faults on such a temp buffer, up to
:data:`FAULT_ROUNDS` more rounds, each with a budget round's share of the
loop's time on top of it (so a deterministic loop may spend more than its
``deterministic_time``, and repeats), aim a plan at the compiled peak that puts the temp buffer under the
ceiling (:func:`fault_free_peak`), bracketed like the others; what they
compile competes on priced time.
On CPU a plan of the compiled graph compiles twice: in its own order (each
backward kernel tied to the one before, the step its predicted peak is of)
and in the order XLA's scheduler picks, which is sometimes lower. A compiled
graph is planned in two orders (:func:`plan_orders`), each in its share of
the time: XLA's schedule of the plain step, and the eager one
(:mod:`rematopt.reorder`), which XLA runs because the plan's order is tied
(resnet at 0.8: every plan in XLA's order misses, the eager order's fits);
each candidate records the order its plan was made in.

Under ``deterministic_time`` (``--deterministic-time D``) the loop reads the
time from a :class:`~rematopt.planners.meter.Meter`: the orders' shares and
each round's share are of D, each round hands its whole share to a planner
that takes a deterministic limit (cpsat), and the rounds stop on the
deterministic time the planners spent, the bracket and :data:`MAX_ROUNDS`:
compiled peaks are XLA's for a given XLA, so the rounds, the planning budgets
and the answer are the same on any load. ``time_limit`` stays the outer
bound on the wall clock; a loop it cut says so (``stopped_by``), and is not
the deterministic one.

A candidate "fits" when XLA's figure is within the budget: a statement about
the compiled program, never about the graph model.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Sequence

import jax

from ..errors import BudgetError, PlannerError
from ..graph import Graph
from ..importers.costmodel import Device, device, profile_for
from ..plan import Plan
from ..planners.meter import Meter, metered
from ..reference import no_remat_peak, peak_lower_bound
from ..sizes import human_bytes
from . import flags
from . import cost
from .cost import Calibration
from .machine import REFERENCE, Machine
from .memory import xla_reference

POLICIES = ("nothing_saveable", "dots_saveable", "dots_with_no_batch_dims_saveable")
MAX_ROUNDS = 8   # planning rounds; the bisection halves the bracket each round
RESOLUTION = 0.01  # stop bisecting when the bracket is narrower than this share of the graph's peak
# Before a plan fits, each round steps the planning budget down by XLA's excess, by at least STEP;
# a round whose plan compiled no smaller than the order's least so far doubles that least step.
# The bench's full sizes, eager order, 4 rounds an order: unet at 0.6 (15 MiB) stepped 15, 14.7, 14.2,
# 13.9 MiB, compiled 15.3, 15.6, 15.3, 15.3 (2% over); doubling, 15, 14.7, 14.1, 13.6 -> 14.3 MiB fits.
# gpt at 0.5 (181 MiB) compiled 186, 188, 182 MiB from 184, 179, 172 and stopped 1.1% over; doubling
# after the 188, 165 MiB's plan compiles to 176 MiB (docs/device.md).
STEP = 0.02
FAULT_ROUNDS = 2  # rounds aimed under glibc's mmap ceiling (fault_free_peak)


@dataclass(frozen=True)
class Compiled:
    """XLA's figures for one compiled step, and its price (:func:`~rematopt.xla.cost.priced_step`)."""

    peak_bytes: int
    flops: float
    bytes_accessed: float
    temp_bytes: int = 0
    faults: int = 0                 # page faults per step predicted from the program (CPU; 0 elsewhere)
    seconds: float | None = None    # its kernels and faults priced (None: not priced)


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
    as_planned: bool = True              # every computation the plan makes (apply_plan's ``as_planned``)

    def record(self) -> dict[str, Any]:
        return {"label": self.label, "kind": self.kind, "fits": self.fits, "xla_peak_bytes": self.compiled.peak_bytes,
                "xla_flops": self.compiled.flops, "xla_bytes_accessed": self.compiled.bytes_accessed,
                "xla_temp_bytes": self.compiled.temp_bytes, "predicted_faults": self.compiled.faults,
                "priced_s": self.compiled.seconds, "planning_budget_bytes": self.planning_budget,
                "predicted_peak_bytes": self.predicted_peak,
                "plan_peak_bytes": self.plan_peak,
                "overhead": self.overhead, "status": self.status, "order": self.order,
                "ordered": self.ordered if self.kind == "plan" else None,
                "as_planned": self.as_planned if self.kind == "plan" else None}


@dataclass(frozen=True)
class Round:
    """One planning round: the order planned in, the planning budget, the
    planner's share of the loop's clock (``limit``: wall seconds, or
    deterministic ones under ``deterministic_time``; None: a planner without
    a time limit) and what it spent of it (deterministic seconds; None on
    the wall clock, whose figures no two runs repeat), the planner's status,
    the least compiled peak of its plan (None: no plan to compile), and what
    it aimed at: the budget, or the compiled peak that puts the step's temp
    buffer under glibc's mmap ceiling (a fault round, :data:`FAULT_ROUNDS`)."""

    order: str
    planning_budget: int
    limit: float | None
    spent: float | None
    status: str
    xla_peak: int | None
    aim: str = "budget"

    def record(self) -> dict[str, Any]:
        return {"order": self.order, "planning_budget_bytes": self.planning_budget, "limit_s": self.limit,
                "deterministic_spent": self.spent, "status": self.status, "xla_peak_bytes": self.xla_peak,
                "aim": self.aim}


@dataclass(frozen=True)
class Verdict:
    """What the loop found: the chosen candidate (the cheapest that fits, by
    ``chosen_by``; else the one of least compiled peak), every candidate tried,
    and what XLA was told."""

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
    planning: tuple[Round, ...] = ()
    time_limit: float | None = None          # the loop's wall seconds
    deterministic_time: float | None = None  # the loop's deterministic seconds (None: the wall clock decides)
    deterministic_spent: float | None = None
    # which limit ended the loop: "time_limit" (the wall clock), "deterministic_time", "max_rounds"
    # (MAX_ROUNDS in some order), or None (every order's bracket closed first)
    stopped_by: str | None = None
    chosen_by: str = "compiled FLOPs"   # or "priced time" (:func:`choose`)
    price: str | None = None           # the profile the candidates were priced on

    @property
    def deterministic(self) -> bool:
        """The run ``deterministic_time`` makes on any load: not cut by the wall clock."""
        return self.deterministic_time is not None and self.stopped_by != "time_limit"

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
            timed = "" if c.compiled.seconds is None else f", priced {c.compiled.seconds * 1e3:.3g} ms"
            return (f"fits: {where} within the {human_bytes(self.budget)} budget, {c.label}, "
                    f"{extra:+.1f}% FLOPs{timed}, chosen by {self.chosen_by}, "
                    f"{self.rounds} planning round{'s' * (self.rounds != 1)}, "
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
                "xla_flops": c.compiled.flops, "xla_plain_flops": self.plain.flops,
                "xla_temp_bytes": c.compiled.temp_bytes, "predicted_faults": c.compiled.faults,
                "priced_s": c.compiled.seconds, "plain_priced_s": self.plain.seconds,
                "chosen_by": self.chosen_by, "price": self.price, "rounds": self.rounds,
                "wall_s": self.wall_s, "time_limit": self.time_limit,
                "deterministic_time": self.deterministic_time, "deterministic_spent": self.deterministic_spent,
                "stopped_by": self.stopped_by, "deterministic": self.deterministic,
                "xla_settings": self.settings, "orders_no_remat_peak_bytes": self.orders,
                "planning_rounds": [r.record() for r in self.planning],
                "candidates": [k.record() for k in self.candidates]}


def xla_peak(compiled: Any) -> tuple[int, str]:
    """XLA's own figure for a compiled step's memory, and which it is
    (:func:`~rematopt.xla.memory.xla_reference`: ``peak_memory_in_bytes`` on
    GPU / TPU; on CPU, which computes none, temp + arguments + outputs - aliases)."""
    ref = xla_reference(compiled.memory_analysis(), jax.default_backend())
    return ref.bytes, ref.what


def compile_figures(loss_fn: Callable, args: Sequence, argnums: tuple[int, ...],
                    settings: flags.XlaSettings, price: Calibration | None = None) -> tuple[Compiled, str]:
    """Compile ``value_and_grad(loss_fn)`` at ``args`` under ``settings``; XLA's figures, and with
    ``price`` its priced time (:func:`~rematopt.xla.cost.priced_step`; page faults on CPU only)."""
    compiled = flags.compile_jitted(jax.jit(jax.value_and_grad(loss_fn, argnums)), args, settings, read_only=True)
    peak, reference = xla_peak(compiled)
    costs = compiled.cost_analysis()
    costs = costs[0] if isinstance(costs, (list, tuple)) else costs
    temp = int(compiled.memory_analysis().temp_size_in_bytes)
    seconds, faults = None, 0
    if price is not None:
        try:
            seconds, faults = cost.priced_step(compiled.as_text(), temp, price, jax.default_backend() == "cpu")
        except Exception:  # noqa: BLE001 - HLO the kernel reader does not know: not priced, FLOPs decide (choose)
            pass
    return Compiled(peak, float(costs.get("flops", 0.0)), float(costs.get("bytes accessed", 0.0)), temp, faults,
                    seconds), reference


def backend_price(backend: str, machine: Machine | Device | None = None, kind: str = "") -> Calibration:
    """What the loop prices a compiled step on: ``machine``'s measured rates (a
    :class:`~rematopt.xla.machine.Machine`, page faults included) or a profile's data sheet (a
    ``Device``, no fault price); by default on CPU :data:`~rematopt.xla.machine.REFERENCE`, elsewhere
    the data sheet of the device XLA names (``kind``; :func:`~rematopt.importers.costmodel.profile_for`),
    where no page faults are predicted."""
    if machine is None:
        if backend == "cpu":
            return REFERENCE.price()
        machine = device(profile_for(backend, kind))
    if isinstance(machine, Machine):
        return machine.price()
    return Calibration(machine, 1.0, 0.0, 0.0, "data sheet")


def choose(candidates: Sequence[Candidate]) -> tuple[Candidate, str]:
    """The answer and what it was chosen by: of the fitting candidates the one of least priced time
    where every one is priced (the compiled step as the device runs it: kernels and page faults),
    compiled FLOPs breaking ties, else the one of fewest compiled FLOPs; where none fits, the one of
    least compiled peak."""
    fitting = [k for k in candidates if k.fits]
    if not fitting:
        return min(candidates, key=lambda k: (k.compiled.peak_bytes, k.compiled.flops)), "compiled peak"
    if all(k.compiled.seconds is not None for k in fitting):
        return min(fitting, key=lambda k: (k.compiled.seconds, k.compiled.flops, k.compiled.peak_bytes)), "priced time"
    return min(fitting, key=lambda k: (k.compiled.flops, k.compiled.bytes_accessed, k.compiled.peak_bytes)), \
        "compiled FLOPs"


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
           known: dict[str, tuple[Compiled, str]] | None = None, fallback: Graph | None = None,
           deterministic_time: float | None = None, max_rounds: int = MAX_ROUNDS,
           machine: Machine | Device | None = None) -> Verdict:
    """The cheapest candidate whose compiled peak is within ``budget_ratio`` x
    the compiled plain step's (module docstring), planning in each of
    :func:`plan_orders`' orders in turn, each in its share of the time left:
    of ``time_limit`` wall seconds, or of ``deterministic_time``
    deterministic ones (``time_limit`` then the outer bound).
    ``stock``: label -> loss
    function of the stock-policy candidates (:func:`stock_policies`);
    ``known``: figures already compiled under these labels (``"plain"`` and
    the stock labels), reused across budgets of one model; ``fallback``: the
    graph to plan on instead when a plan of ``graph`` does not apply (the
    traced graph, for a compiled one); ``max_rounds``: planning rounds per
    order (each round compiles its plan, twice on CPU); ``machine``: what
    the candidates are priced on (:func:`backend_price`). Where the answer's
    compiled step faults on a temp buffer above glibc's mmap ceiling, up to
    :data:`FAULT_ROUNDS` more rounds aim a plan under it (module docstring)."""
    start = time.perf_counter()
    m = Meter() if deterministic_time is None else Meter(deterministic_time, start + time_limit)
    limit = time_limit if deterministic_time is None else deterministic_time
    t0 = start if deterministic_time is None else 0.0  # the loop's clock at its start
    settings = settings or flags.for_backend(jax.default_backend())
    flags.apply(settings)
    price = backend_price(jax.default_backend(), machine, jax.devices()[0].device_kind)
    say = progress or (lambda line: None)
    argnums = tuple(graph.meta.get("argnums", (0,)))
    known = {} if known is None else known

    def figures(label: str, fn: Callable) -> Compiled:
        if label not in known:
            known[label] = compile_figures(fn, args, argnums, settings, price)
        return known[label][0]

    plain = figures("plain", loss_fn)
    reference = known["plain"][1]
    budget = int(math.floor(budget_ratio * plain.peak_bytes))
    say(f"plain step: XLA peak {human_bytes(plain.peak_bytes)} ({reference}); budget {human_bytes(budget)}")
    # the plain step is the answer where nothing else compiles smaller (a ratio of 1, or a loop out of time)
    candidates: list[Candidate] = [Candidate("plain step", "policy", plain, plain.peak_bytes <= budget)]
    ends: list[str | None] = []  # why each part of the loop ended (see _search), "time" for a stock policy skipped
    for label, fn in (stock if stock is not None else stock_policies(loss_fn)).items():
        if label not in known and _compiles_out_of_time(m, t0, limit):  # the limit is the whole loop's
            say(f"{label}: not compiled, the time limit ran out")
            ends.append("time")
            continue
        c = figures(label, fn)
        candidates.append(Candidate(label, "policy", c, c.peak_bytes <= budget))
        say(f"{label}: XLA peak {human_bytes(c.peak_bytes)} ({'fits' if c.peak_bytes <= budget else 'misses'})")

    options = dict(options or {})
    orders = plan_orders(graph)
    peaks = {name: no_remat_peak(g) for name, g in orders.items()}  # the first: the graph's own order
    base_peak = next(iter(peaks.values()))
    planning: list[Round] = []
    with metered(m):  # a planner that reads the time (dtr, rotor) reads the loop's clock
        for k, (name, ordered) in enumerate(orders.items()):
            left = limit - (m.now() - t0)
            deadline = t0 + limit - left * (len(orders) - k - 1) / (len(orders) - k)  # its share of what is left
            found, done, end = _search(loss_fn, args, argnums, ordered, name, planner, budget, plain, options,
                                       settings, say, m, deadline, fallback if k == 0 else None, base_peak,
                                       max_rounds, price)
            candidates += found
            planning += done
            ends.append(end)
        chosen, chosen_by = choose(candidates)
        aim = fault_free_peak(chosen, price)
        # the aim as a planning budget, by the chosen plan's ratio of the two; no round below the graph's
        # lower bound, where no plan exists (gpt at the bench's size: 32 MiB of temp is under it)
        start_b = (None if aim is None or chosen.kind != "plan" or chosen.order not in orders
                   else int(chosen.planning_budget * aim / chosen.compiled.peak_bytes))
        if start_b is not None and start_b >= peak_lower_bound(orders[chosen.order]):
            say(f"{chosen.label}: temp buffer {human_bytes(chosen.compiled.temp_bytes)}, above glibc's mmap "
                f"ceiling, faults {chosen.compiled.faults:,} pages a step; aiming at a compiled peak of "
                f"{human_bytes(aim)}")
            # each fault round gets a budget round's share of the loop's time, beyond it (the budget rounds
            # may have spent it all), the wall clock's limit still the outer bound
            extra = FAULT_ROUNDS * limit / (len(orders) * max_rounds) if max_rounds else 0.0
            deadline = m.now() + extra if m.deterministic else min(m.now() + extra, t0 + limit)
            found, done, end = _search(loss_fn, args, argnums, orders[chosen.order], chosen.order, planner, aim,
                                       plain, options, settings, say, m, deadline, None, base_peak,
                                       FAULT_ROUNDS, price, start=start_b, above=chosen.planning_budget)
            candidates += [replace(k, fits=k.compiled.peak_bytes <= budget) for k in found]
            planning += done
            ends.append("time" if end == "time" else None)
            chosen, chosen_by = choose(candidates)
    if m.wall_ran_out or ("time" in ends and not m.deterministic):
        stopped_by = "time_limit"
    elif "time" in ends:
        stopped_by = "deterministic_time"
    else:
        stopped_by = "max_rounds" if "max_rounds" in ends else None
    return Verdict(budget, budget_ratio, plain, reference, base_peak, chosen, tuple(candidates),
                   len(planning), flags.record(settings), time.perf_counter() - start,
                   peaks, tuple(planning), time_limit,
                   deterministic_time, round(m.spent, 6) if m.deterministic else None, stopped_by,
                   chosen_by, f"{price.device.name} ({price.calibrated_on})")


def fault_free_peak(chosen: Candidate, price: Calibration) -> int | None:
    """The compiled peak below which ``chosen``'s step would allocate its temp buffer under glibc's mmap
    ceiling (its peak less the temp buffer's excess over :data:`~rematopt.xla.cost.MMAP_CEILING`: on CPU
    the peak is temp + arguments + outputs - aliases, and a smaller plan changes only the temp); None
    where no fault round is due: it does not fit, its temp buffer is under the ceiling, or page faults
    are not priced (a profile without a fault price, a backend that does not fault)."""
    c = chosen.compiled
    if not chosen.fits or c.faults == 0 or price.fault_s <= 0 or c.temp_bytes <= cost.MMAP_CEILING:
        return None
    return c.peak_bytes - c.temp_bytes + cost.MMAP_CEILING


def _compiles_out_of_time(m: Meter, t0: float, limit: float) -> bool:
    """Whether the loop's time is up for a compile, which spends no
    deterministic time: ``limit`` wall seconds after ``t0``, or under a
    deterministic meter the wall clock's outer bound alone."""
    t = m.now()
    return m.wall_ran_out if m.deterministic else t - t0 >= limit


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
            say: Callable[[str], None], m: Meter, deadline: float, fallback: Graph | None,
            base_peak: int, max_rounds: int = MAX_ROUNDS, price: Calibration | None = None,
            start: int | None = None, above: int | None = None) -> tuple[list[Candidate], list[Round], str | None]:
    """Plans of ``graph`` (in its ``order``) bracketed and bisected on the
    planning budget until ``deadline`` (on ``m``'s clock) or
    ``max_rounds``: the candidates compiled, the rounds run, and what
    ended them ("time", "max_rounds", or None: the bracket closed, or no
    other plan to try). The first planning budget is the budget's
    share of the plain step scaled by ``base_peak`` (the no-remat peak of the
    graph in XLA's order) over the plain step's figure: the graph model's
    bias, which a reordering does not change. Each round's share of the time
    left is the planner's: half of it on the wall clock (the other half
    applies and compiles), all of it in deterministic time (which a
    compile does not spend), the wall clock left as the outer bound.
    A fault round (:data:`FAULT_ROUNDS`) passes the peak it aims at as
    ``budget``, its first planning budget as ``start`` and the planning
    budget of the plan it would undercut (which misses that aim) as ``above``."""
    from ..exporters.jax_applied import applied_peak, scanned_nodes
    from ..exporters.jax_policy import apply_plan, computes_twice
    from ..solve import solve

    candidates: list[Candidate] = []
    done: list[Round] = []
    takes = _planner_options(planner)
    g0 = no_remat_peak(graph)
    lo: int | None = None   # largest planning budget whose plan fits
    # smallest whose plan misses: in XLA's order the no-remat plan compiles to the plain step; in another
    # order it may fit, so it is tried (b is at most g0) and nothing above it
    hi = above if above is not None else g0 if order in ("xla", "program") else g0 + 1
    aim = "budget" if above is None else "mmap ceiling"
    floor = 0               # largest planning budget the planner found no plan for
    least: int | None = None  # the least compiled peak of this order's plans so far
    step = STEP             # the least step down before a plan fits (STEP)
    b = min(g0, int(base_peak * budget / plain.peak_bytes) if start is None else start)
    # no planning budget below the graph's lower bound, where no plan exists (the round would be spent
    # learning so: keras_llama at 0.5, eager order, stepped from 9.42 MiB to 6.1 below its 8.51)
    bound = peak_lower_bound(graph)
    tried: set[int] = set()
    began: float | None = None  # when the previous round began
    while (b := max(b, bound)) > floor and b not in tried:
        if len(done) >= max_rounds:
            return candidates, done, "max_rounds"
        tried.add(b)
        now = m.now()
        last_round = 0.0 if began is None else now - began
        left = deadline - now
        if left <= last_round:  # a round takes about as long as the one before: it would not end in time
            return candidates, done, "time"
        began = now
        per_round = left / (max_rounds - len(done))
        opts, share = dict(options), None
        if m.deterministic and "deterministic_time" in takes:
            share = per_round
            opts.update(deterministic_time=share, time_limit=m.wall_left())
        elif m.deterministic and "time_limit" in takes:  # dtr, rotor: on the loop's meter they run to their end
            opts["time_limit"] = m.wall_left()
        elif "time_limit" in takes:
            share = max(1.0, per_round / 2)  # the other half: apply and compile
            opts["time_limit"] = share
        before = m.spent
        try:
            sol = solve(graph, planner, budget=b, **opts)
        except BudgetError:
            sol = None
        if sol is not None and m.deterministic and sol.plan.stats.get("deterministic_spent") is not None:
            m.spent += sol.plan.stats["deterministic_spent"]  # cpsat's own meter counted it
            if not sol.plan.stats.get("deterministic", True):
                m.wall_ran_out = True  # the wall clock cut its search
        spent = round(m.spent - before, 6) if m.deterministic else None
        status = "below the bound" if sol is None else sol.status
        rounds = f"{len(done) + 1}" + ("" if above is None else " under the mmap ceiling")
        if sol is None or not sol.has_plan:
            say(f"{order} order, round {rounds}: planning budget {human_bytes(b)}: no plan ({status})")
            done.append(Round(order, b, share, spent, status, None, aim))
            floor = b
            if hi - (floor if lo is None else lo) < RESOLUTION * g0:
                break
            b = (b + hi) // 2 if lo is None else (lo + hi) // 2
            continue
        where = "compiled" if graph.meta.get("fuse") == "xla" else "traced"
        label = f"{planner} plan, {where} graph, {order} order (planning budget {human_bytes(b)})"
        try:
            applied = apply_plan(loss_fn, graph, sol.plan)
            c, _ = compile_figures(applied, args, argnums, settings, price)
            variants = [(label, c, applied_peak(graph, sol.plan, scanned_nodes(applied.loops)), True, True)]
            if computes_twice(graph, sol.plan):  # as planned, or each value computed once (fewer FLOPs)
                once = apply_plan(loss_fn, graph, sol.plan, as_planned=False)
                k, _ = compile_figures(once, args, argnums, settings, price)
                variants.append((f"{label}, each value computed once", k,
                                 applied_peak(graph, sol.plan, scanned_nodes(once.loops), as_planned=False), True, False))
            if where == "compiled" and jax.default_backend() == "cpu":  # the plan's order tied, or XLA's own
                free, _ = compile_figures(apply_plan(loss_fn, graph, sol.plan, ordered=False), args, argnums, settings,
                                          price)
                variants.append((f"{label}, XLA's order", free, None, False, True))  # planned in ``order``, run in XLA's
        except Exception as e:  # noqa: BLE001 - a plan the exporter cannot run: say so, plan elsewhere
            say(f"{order} order, round {rounds}: the plan does not apply ({type(e).__name__}: {e})"
                + ("; planning on the traced graph" if fallback is not None else "; no more planning in it"))
            done.append(Round(order, b, share, spent, status, None, aim))
            if fallback is None:
                break
            graph, fallback, order = fallback, None, "program"
            g0, bound = no_remat_peak(graph), peak_lower_bound(graph)
            lo, hi, floor, least, step = None, g0, 0, None, STEP
            b = int(g0 * budget / plain.peak_bytes)
            tried.clear()
            continue
        for name, k, predicted, ordered, as_planned in variants:
            candidates.append(Candidate(name, "plan", k, k.peak_bytes <= budget, b, predicted, sol.replay.peak_bytes,
                                        sol.replay.overhead, sol.status, sol.plan, order, ordered, as_planned))
        c = min((k for _, k, *_ in variants), key=lambda k: k.peak_bytes)
        done.append(Round(order, b, share, spent, status, c.peak_bytes, aim))
        fits = c.peak_bytes <= budget
        others = [("in XLA's order " if not ordered else "each value computed once ") + human_bytes(k.peak_bytes)
                  for _, k, _, ordered, _ in variants[1:]]  # the variants beside the plan as it was made
        say(f"{order} order, round {rounds}: planning budget {human_bytes(b)}: plan peak "
            f"{human_bytes(sol.replay.peak_bytes)}, applied {human_bytes(variants[0][2])}, "
            f"XLA peak {human_bytes(variants[0][1].peak_bytes)}" + (f" ({', '.join(others)})" if others else "")
            + f" ({'fits' if fits else 'misses'})")
        if sol.status == "OVER_BUDGET" and not fits and lo is None:
            break  # the planner's least plan misses: a lower planning budget gives no other
        if fits:
            lo = b
        else:
            hi = b
        if lo is None:  # no fitting plan yet: step down (step_down)
            b, least, step = step_down(b, budget, c.peak_bytes, least, step)
            if b <= floor:  # the planner found no plan there: halve the gap to it instead
                if hi - floor < RESOLUTION * g0:
                    break
                b = (floor + hi) // 2
        else:
            if hi - lo < RESOLUTION * g0:
                break
            b = (lo + hi) // 2
    return candidates, done, None


def step_down(b: int, budget: int, peak: int, least: int | None, step: float) -> tuple[int, int, float]:
    """The next planning budget after a plan made at ``b`` compiled to ``peak``, over ``budget``, before
    any plan of the order fits: down by XLA's excess, and by at least ``step``, which doubles where
    ``peak`` is no lower than ``least``, the order's least compiled peak before this round (XLA's
    figure did not follow the planning budget down, so a small step would not reach the budget in
    the rounds left: :data:`STEP`). Returns the planning budget, the least peak and the step."""
    if least is not None and peak >= least:
        step *= 2
    least = peak if least is None else min(least, peak)
    return min(int(b * budget / peak), int(b * (1 - step))), least, step


def _planner_options(planner: str) -> set[str]:
    from .. import planners

    try:
        return set(planners.options(planner))
    except PlannerError:
        return set()
