"""``cpsat``: the exact planner. Builds the staged model of
:mod:`rematopt.planners.cpsat_model` (formulation: ``docs/cpsat.md``), solves
it with CP-SAT from a warm start, and returns the extracted plan.

Objectives: ``overhead`` (default with a budget) minimises recompute plus
transfer cost with every memory check <= budget; ``peak`` (default without a
budget) minimises the peak with recompute plus transfer cost <= max_overhead x
base cost. Once the primary optimum is proven, the other figure is minimised
without losing it (lexicographic). Reported costs come from the plan
(``cost_of_counts``), objective and bounds in cost units or bytes.
"""

from __future__ import annotations

import math
import numbers
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator

from ortools.sat.python import cp_model

from ..errors import PlannerError
from ..graph import Graph
from ..plan import Plan
from ..reference import no_remat_peak, peak_lower_bound
from ..simulate import Replay, cost_of_counts, simulate
from .cpsat_backends import CpSatBackend, LpBackend, stopped_early, tune
from .cpsat_bound import WholeBound, relaxation_bound
from .cpsat_extract import Assignment, events, from_plan, staged_events
from .cpsat_model import Formulation, Stages, integer_scale
from .cpsat_progress import SolutionCallback, Trace, deferred_sigint, live_progress, solver_takes_ctrl_c

# Largest full staged model (sum over values of the stages they live in)
# solved as is; beyond it, depth 1 then 2 (the full model of
# random_layered_n100, about 5,000 pairs, found no solution in 30 s, its
# depth-1 model is solved to optimality in under 2 s), then the full model
# warm-started from their best if it has at most FULL_ROUND_PAIRS (hinted,
# n100's is proven in 12-15 s, mobilenet_train's 17,000 pairs in 25 s;
# building random_layered_n250's 31,000 takes 11 s and presolving it 40 s).
FULL_MODEL_PAIRS = 2500
FULL_ROUND_PAIRS = 40_000
# The gap relaxation (cpsat_bound) takes well under a second on the
# benchmark graphs; this share of the limit caps it on bigger ones.
GAP_BOUND_SHARE = 0.1
# The stronger relaxations' proof that a round's optimum is the whole
# space's gets at most this share of the time left (random_layered_n250 at
# 0.9: 3 s by chains; random_layered_n100 at 0.9 and 0.8: 0.2 s and 1.6 s by
# slots; where they cannot prove it, slots may take 17 s on mobilenet_train).
PROOF_SHARE = 1 / 3
WARM_START_SHARE = 0.25
# A round with no plan to start from searches this share of the time left
# (at least MIN_ROUND_S) before it looks for any plan within the budget by
# minimising the peak (CpSatRun.fit): presolve shows most empty spaces at
# once (resnet_s2_c16 at 0.8, depths 1-8: 0.4-3 s each), where the peak
# search takes 2-5x longer to prove that no plan fits.
FIT_AFTER_SHARE = 0.25
# The peak search starts only from a plan within this share over the budget:
# it lowers the peak by a few percent in seconds (resnet_s2_c16 at 0.8 from
# dtr's plan, 2% over: 12% in 5 s; random_layered_n100 at 0.7 from the
# no-remat plan, 43% over, the lowest-peak fast plan there: 3% in 8 s).
FIT_MARGIN = 0.1
# ... and it gets this share of what is left then; the overhead
# search resumes for the rest (resnet_s2_c16 at 0.6: the full model proves
# that no plan fits only after most of a 20 s limit).
FIT_SHARE = 0.5
# Building the LP of a bigger model takes longer than its bound is worth
# (about 20 s on the 2,090-node decoder's depth-1 model).
LP_MAX_VARIABLES = 40_000
# A deeper round starts only with twice the time spent so far left (the
# depth-2 proofs took 2-3x the depth-1 ones on the benchmark graphs) and at
# least this much: building and presolving the depth-2 model of
# random_layered_n250 alone takes about 5 s.
MIN_ROUND_S = 5.0

# While restricted rounds hold no plan the depth doubles, up to a space with
# this share of the full space's re-materialisations; then the full space.
DOUBLING_SHARE = 0.5
# "Any plan at all" to a relaxation proof: an objective no plan reaches.
ANY_PLAN = 2**60


@dataclass
class _Round:
    """The round whose plan the run returns: the last one with a plan, unless
    it only matched a smaller space's proven optimum without a proof of its
    own (a full round that ran out of time from the depth-2 optimum): then the
    proven round speaks for the plan (``space``, ``space_status``), the later
    one only in ``rounds``. A round that Ctrl-C stops before its search
    speaks for the hint it was given."""

    form: Formulation
    backend: Any
    peak_var: Any
    overhead_terms: list
    depth: int | None
    variables: int
    constraints: int
    best: Assignment
    objective: int  # model integers
    status: int
    bound: float | None


STATUS = {cp_model.OPTIMAL: "OPTIMAL", cp_model.FEASIBLE: "FEASIBLE",
          cp_model.INFEASIBLE: "INFEASIBLE", cp_model.UNKNOWN: "UNKNOWN"}


# What plan() reads (Settings.parse).
OPTIONS = frozenset({"objective", "max_overhead", "offload", "host_bandwidth", "transfer_cost_per_byte",
                     "max_clone_expansion", "time_limit", "workers", "seed", "hint", "warm_start", "log_path",
                     "progress", "lp_bound", "recompute_depth"})


@dataclass
class Settings:
    """The planner's options, checked once."""

    objective: str
    budget: int | None
    offload: bool
    transfer_cost_per_byte: float
    max_overhead: float | None
    max_clone_expansion: float | None
    time_limit: float
    workers: int
    seed: int
    hint: Plan | None
    warm_start: str
    log_path: str | None
    progress: bool
    lp_bound: bool
    depth: int | str | None  # None: automatic; "full"; or a number of producer hops

    @classmethod
    def parse(cls, budget: int | None, o: dict[str, Any]) -> "Settings":
        objective = o.get("objective") or ("overhead" if budget is not None else "peak")
        if objective not in ("overhead", "peak"):
            raise PlannerError(f"cpsat: objective must be 'overhead' or 'peak', got {objective!r}")
        if objective == "overhead" and budget is None:
            raise PlannerError("cpsat: --objective overhead needs a budget (--budget or --budget-ratio)")
        bw, tcpb = o.get("host_bandwidth"), o.get("transfer_cost_per_byte")
        if bw is not None and tcpb is not None:
            raise PlannerError("cpsat: give --host-bandwidth or --transfer-cost-per-byte, not both")
        if bw is not None and not bw > 0:
            raise PlannerError(f"cpsat: host bandwidth must be > 0, got {bw}")
        per_byte = 1.0 / bw if bw is not None else float(tcpb or 0.0)
        for key in ("max_overhead", "max_clone_expansion", "time_limit", "transfer_cost_per_byte"):
            if o.get(key) is not None and not (o[key] >= 0 and math.isfinite(o[key])):
                raise PlannerError(f"cpsat: {key.replace('_', '-')} must be a finite number >= 0, got {o[key]}")
        workers = o.get("workers")
        if workers is not None and (isinstance(workers, bool) or not isinstance(workers, numbers.Integral)
                                    or workers < 0):
            raise PlannerError(f"cpsat: workers must be an integer >= 0 (0: all cores), got {workers!r}")
        hint = o.get("hint")
        if hint is not None and not isinstance(hint, Plan):
            raise PlannerError("cpsat: hint must be a Plan")
        return cls(objective, budget, bool(o.get("offload", False)), per_byte, o.get("max_overhead"),
                   o.get("max_clone_expansion") or None, float(60.0 if o.get("time_limit") is None else o["time_limit"]),
                   int(o.get("workers") or os.cpu_count() or 1), int(o.get("seed") or 0), hint,
                   o.get("warm_start") or "auto", o.get("log_path"), bool(o.get("progress", False)),
                   bool(o.get("lp_bound", True)), _depth(o.get("recompute_depth")))


def _depth(value: Any) -> int | str | None:
    if value in (None, "auto"):
        return None
    if value == "full":
        return "full"
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise PlannerError(f"cpsat: recompute depth must be 'auto', 'full' or an integer >= 0, got {value!r}")
    return value


def plan(graph: Graph, budget: int | None, options: dict[str, Any]) -> Plan:
    cfg = Settings.parse(budget, options)
    if budget is not None and budget < peak_lower_bound(graph):
        return _no_plan(graph, "INFEASIBLE", reason=f"budget {budget:,} bytes is below the lower bound "
                                                    f"{peak_lower_bound(graph):,} bytes; no model built")
    if not graph.compute_ids:
        p = Plan(graph.name, "cpsat", [], [])
        p.stats.update(status="OPTIMAL", peak_bytes=sum(graph.bytes[i] for i in graph.initial_resident),
                       compute_cost=0.0, transfer_bytes=0)
        return p
    return CpSatRun(graph, cfg).run()


def _no_plan(graph: Graph, status: str, **stats: Any) -> Plan:
    p = Plan(graph.name, "cpsat", [], [])
    p.stats.update(status=status, **stats)
    return p


class CpSatRun:
    """One solve: build, warm-start, solve (primary, then secondary), extract."""

    def __init__(self, graph: Graph, cfg: Settings):
        self.graph, self.cfg = graph, cfg
        self.start = time.perf_counter()
        per_byte = cfg.transfer_cost_per_byte
        self.scale, self.exact = integer_scale(
            [graph.cost[i] for i in graph.compute_ids] + ([b * per_byte for b in graph.bytes] if cfg.offload else []))

    # -- model ---------------------------------------------------------------

    def build(self, depth: int | None) -> tuple[Formulation, int, int]:
        """A round's model on a fresh CP-SAT backend (``self.form``,
        ``self.backend``), its build time added to ``build_s``: the model and
        its variable and constraint counts."""
        began = time.perf_counter()
        self.backend = CpSatBackend()
        self.form = self.formulation(self.backend, depth)
        self.build_s += time.perf_counter() - began
        return (self.form, *self.backend.size)

    def formulation(self, backend: Any, depth: int | None, fit: bool = False) -> Formulation:
        """The model with its primary objective and side constraints; with
        ``fit``, the model of :meth:`fit` (the budget lifted, the peak
        minimised)."""
        cfg, g = self.cfg, self.graph
        top = cfg.budget if cfg.budget is not None else no_remat_peak(g)
        form = Formulation(g, backend, offload=cfg.offload, transfer_cost_per_byte=cfg.transfer_cost_per_byte,
                           cost_scale=self.scale, mem_cap_bytes=None if fit else top, depth=depth,
                           also=self.also if depth is not None else None)
        form.add_all()
        overhead = form.recompute_terms() + form.transfer_terms()
        if self.max_recomputes() is not None:
            backend.add([(1, v) for v in form.recompute_events()], -math.inf, self.max_recomputes())
        if cfg.objective == "overhead" and not fit:
            backend.minimize(overhead)
        else:
            if self.overhead_cap(form) is not None:
                backend.add(overhead, -math.inf, self.overhead_cap(form))
            low = self.peak_floor(form)
            self.peak_var = backend.int_var(low, max(form.mem_cap, low), "peak")
            form.bound_memory(self.peak_var)
            backend.minimize([(1, self.peak_var)])
        self.overhead_terms = overhead
        return form

    def overhead_cap(self, form: Formulation) -> int | None:
        """``--max-overhead`` under the peak objective, in model integers."""
        cfg = self.cfg
        if cfg.objective != "peak" or cfg.max_overhead is None:
            return None
        return math.floor(cfg.max_overhead * sum(form.int_cost[i] for i in self.graph.compute_ids) + 1e-9)

    def max_recomputes(self) -> int | None:
        """``--max-clone-expansion`` as a cap on compute events beyond the first ones."""
        n, x = len(self.graph.compute_ids), self.cfg.max_clone_expansion
        return math.floor(x * n) - n if x else None

    def to_units(self, value: float) -> float:
        """Objective value in cost units (overhead) or bytes (peak)."""
        if self.cfg.objective == "overhead":
            return value / self.scale
        return self.to_bytes(value)

    def to_bytes(self, value: float) -> float:
        """Memory in model units, as bytes."""
        return value * self.form.unit + self.form.persistent_bytes

    def objective_of(self, a: Assignment) -> int:
        """An assignment's primary objective, in model integers."""
        return self.objective_of_peak(a) if self.cfg.objective == "peak" else self.overhead_of(a)

    def overhead_of(self, a: Assignment) -> int:
        """Recompute plus transfer cost, in model integers."""
        f = self.form
        cost = sum(f.int_cost[i] for (s, i) in a.R if s != f.ix.first[i])
        return cost + sum(f.int_transfer[i] for i in a.O) + sum(f.int_transfer[i] for (s, i) in a.P)

    # -- warm start -------------------------------------------------------------

    def warm_start(self, outside: Plan | None, spent: float) -> tuple[Assignment | None, str | None]:
        """The hint: the better of ``outside`` (the user's plan, else the best
        fast planner's: :meth:`outside_plan`, fetched before any model is
        built, in ``spent`` seconds), projected into the model's plan space,
        and staged eviction (slow on big models, so it stops at a deadline).
        Only plans that meet the budget and caps count."""
        from .warm_start import staged_eviction

        cfg = self.cfg
        found: list[tuple[int, str, Assignment]] = []

        def consider(a: Assignment | None, name: str) -> None:
            if a is not None and self.admissible(a):
                found.append((self.objective_of(a), name, a))
                self.trace.solution("primary", self.to_units(found[-1][0]), None)

        # the warm start may use a quarter of the time limit, the search the rest
        deadline = time.perf_counter() + WARM_START_SHARE * cfg.time_limit - spent
        if outside is not None:
            consider(from_plan(self.form, outside), self.outside_name(outside))
        if cfg.hint is not None or cfg.warm_start == "auto":
            consider(staged_eviction(self.form, deadline=deadline), "staged-eviction")
        if not found:
            return None, None
        obj, name, a = min(found, key=lambda x: x[0])
        return a, name

    def outside_plan(self, deadline: float) -> Plan | None:
        """The user's hint, else (``warm_start="auto"``) the best fast
        planner's plan, kept by :meth:`adopt_outside` when it qualifies.
        Whatever the budget, the valid one with the lowest peak among them
        becomes ``self.lowest`` (with its peak), where :meth:`fit` starts."""
        from .warm_start import best_within, fast_plans, lowest_peak

        cfg, plans = self.cfg, []
        if cfg.hint is not None:
            replay = simulate(self.graph, cfg.hint)
            if not replay.valid:  # a plan of another graph, say: refused, not silently dropped
                raise PlannerError(f"cpsat: the hint (a plan for {cfg.hint.graph!r}) does not replay on "
                                   f"{self.graph.name!r}: {replay.error}")
            plans = [(cfg.hint, replay)]
        elif cfg.warm_start == "auto":
            plans = fast_plans(self.graph, cfg.budget, deadline=deadline)
        best = plans[0] if cfg.hint is not None else best_within(plans, cfg.budget)
        low = lowest_peak(plans)
        self.lowest = None if low is None else (low[0], low[1].peak_bytes)
        if best is None:
            return None
        self.adopt_outside(*best)
        return best[0]

    def outside_name(self, plan: Plan) -> str:
        """How a plan from outside the model is named as the warm start."""
        return "hint" if self.cfg.hint is not None else plan.planner

    def widen(self, depth: int | None, hint: Assignment | None) -> bool:
        """Whether to widen the depth-restricted spaces by the
        re-materialisations of the plan from outside the model: only when that
        plan beats every hint the space holds, for a wider space is harder
        (random_layered_n250 at 0.9 with jax-dots-saveable's recomputes: 32%
        space gap after 60 s, without them proven in 2 s). The GPT decoder's
        dtr plan at 0.8 recomputes 35 values beyond depth 1, and no hint lies
        within it: widened, the round is proven optimal from dtr's plan."""
        if depth is None or self.outside is None or self.also:
            return False
        if hint is not None and self.to_units(self.objective_of(hint)) <= self.outside[2]:
            return False
        self.also = self.plan_pairs(self.outside[0])
        return bool(self.also)

    def plan_pairs(self, plan: Plan) -> dict[int, set[int]]:
        """The re-materialisations of ``plan`` per stage."""
        ix = self.ix
        staged = staged_events(ix, plan)
        pairs: dict[int, set[int]] = {}
        for s, i in (staged[0] | staged[1]) if staged else ():
            if s != ix.first[i]:
                pairs.setdefault(s, set()).add(i)
        return pairs

    def space_name(self, depth: int | None) -> str:
        if depth is None:
            return "staged"
        return f"depth {depth}" + (f" + {self.outside[0].planner}'s plan" if self.also and self.outside else "")

    def admissible(self, a: Assignment) -> bool:
        """Whether an assignment meets the budget, caps and clone bound."""
        f = self.form
        mem = max(a.memory(f).values(), default=0)
        if mem > f.mem_cap:
            return False
        limit = self.max_recomputes()
        if limit is not None and len(a.R) - len(self.graph.compute_ids) > limit:
            return False
        cap = self.overhead_cap(f)
        return cap is None or self.overhead_of(a) <= cap

    # -- solve ---------------------------------------------------------------------

    def search(self, depth: int | None, hint: Assignment | None
               ) -> tuple[int, list[int] | None, float, float, Assignment | None]:
        """The round's search, from ``hint``. Without one (overhead under a
        budget), if the lowest-peak plan so far lies in the round's space
        within FIT_MARGIN of the budget, the search first gets FIT_AFTER_SHARE
        of the time left, at least MIN_ROUND_S (presolve shows most empty
        spaces at once); if that ends with neither plan nor proof, :meth:`fit`
        gets FIT_SHARE of the rest to find a plan within the budget from
        there, and the search resumes (from that plan, if any) for the rest.
        Returns the solver's status, values, objective and bound, and the
        plan fit found (or None)."""
        cfg = self.cfg

        def left() -> float:
            return cfg.time_limit - (time.perf_counter() - self.start)

        self.add_hint(hint, peak=cfg.objective == "peak")
        start = (from_plan(self.form, self.lowest[0])
                 if hint is None and cfg.objective == "overhead" and cfg.budget is not None
                 and self.lowest is not None and self.lowest[1] <= (1 + FIT_MARGIN) * cfg.budget else None)
        limit = min(left(), max(MIN_ROUND_S, FIT_AFTER_SHARE * left())) if start is not None else left()
        status, values, obj, bound = self.solve_phase("primary", limit)
        if (start is None or values is not None or status != cp_model.UNKNOWN or self.interrupted
                or left() < 0.05):
            return status, values, obj, bound, None
        fit_status, fitted = self.fit(depth, start, FIT_SHARE * left())
        if self.interrupted or fit_status == cp_model.INFEASIBLE:
            return fit_status if fitted is None else cp_model.UNKNOWN, None, obj, bound, fitted
        self.add_hint(fitted, peak=False)
        status, values, obj, resumed = self.solve_phase("primary", left())
        return status, values, obj, max(bound, resumed), fitted

    def add_hint(self, hint: Assignment | None, peak: bool) -> None:
        """Give the model being solved a solution hint (nothing if None),
        with its peak variable's value when ``peak`` (it minimises the peak)."""
        if hint is None:
            return
        for var, val in hint.values(self.form):
            self.backend.model.add_hint(var, val)
        if peak:
            self.backend.model.add_hint(self.peak_var, self.objective_of_peak(hint))

    @contextmanager
    def aside(self) -> Iterator[None]:
        """Build and solve another model (the LP, the peak search) and come
        back to the round's: its form, backend, peak variable and terms."""
        saved = self.form, self.backend, getattr(self, "peak_var", None), self.overhead_terms
        try:
            yield
        finally:
            self.form, self.backend, self.peak_var, self.overhead_terms = saved

    def solve_phase(self, phase: str, limit: float,
                    stop_at: int | None = None) -> tuple[int, list[int] | None, float, float]:
        cfg = self.cfg
        solver = cp_model.CpSolver()
        prm = solver.parameters
        hinted = len(self.backend.model.proto.solution_hint.vars) > 0  # a plan to improve: the bound matters
        tune(prm, max(limit, 0.01), cfg.workers, cfg.seed, lp_heavy=hinted)
        to_units = {"primary": self.to_units, "fit": self.to_bytes}.get(phase, lambda v: v)
        solver.best_bound_callback = lambda b: self.trace.new_bound(phase, to_units(b))
        with live_progress(self.trace, cfg.progress and phase in ("primary", "fit")), solver_takes_ctrl_c(prm):
            callback = SolutionCallback(self.trace, phase, to_units, stop_at)
            status = solver.solve(self.backend.model, callback)
        self.interrupted = self.interrupted or (stopped_early(solver, status, limit) and not callback.stopped)
        if status == cp_model.MODEL_INVALID:
            raise PlannerError(f"cpsat: model invalid ({self.backend.model.validate()})")
        values = list(solver.response_proto.solution) if status in (cp_model.OPTIMAL, cp_model.FEASIBLE) else None
        return status, values, solver.objective_value, solver.best_objective_bound

    def depths(self) -> Iterator[int | None]:
        """The recompute depths to solve in turn (see ``Stages``): the full
        staged space when it is small, else depth 1 then 2, each model
        warm-started from the previous one's best (the spaces are nested, so
        the hint carries over and the incumbent only improves), then the full
        space (see :meth:`run` for when a round starts). While the rounds hold
        no plan, the depth doubles instead, as long as that adds
        re-materialisations and leaves at most half of the full space's: the
        147-node U-Net at 0.9 has no plan within 1, 2 or 3 hops, its optimum
        within 4 (1.6 s), and none from the full model in 60 s; a space
        nearly as big as the full one is nearly as slow and still incomplete."""
        d = self.cfg.depth
        if d == "full" or (d is None and self.full_pairs <= FULL_MODEL_PAIRS):
            yield None
            return
        if d is not None:
            yield int(d)
            return
        depth = 1
        while True:
            yield depth
            deeper = self.remat_pairs(2 * depth) if not self.found_plan else 0
            if deeper > self.remat_pairs(depth) and deeper <= DOUBLING_SHARE * self.remat_pairs(None):
                depth *= 2
            elif self.found_plan and depth == 1:
                depth = 2
            else:
                break
        yield None

    def remat_pairs(self, depth: int | None) -> int:
        """The (stage, value) pairs where the depth-``depth`` space may
        re-materialise a value (None: the full space)."""
        if depth not in self._remat_pairs:
            ix = self.ix if depth is None else Stages(self.graph, self.cfg.offload, depth)
            self._remat_pairs[depth] = sum(1 for i in ix.values for s in ix.stages(i) if s != ix.first[i]
                                           and (ix.may_compute(s, i) or ix.may_prefetch(s, i)))
        return self._remat_pairs[depth]

    def next_round(self, depth: int | None, status: int, found: bool) -> bool:
        """Whether a deeper round may start after one ended in ``status``: it
        must have been proven (a deeper space may do better), with MIN_ROUND_S
        left and, when there is a plan to keep, twice the time spent so far
        outside relaxation proofs (without one, any attempt beats none:
        resnet_s2_c16 at 0.8 has its depth-8 space shown empty after 10 s of
        a 20 s limit); the full space, when a round found a plan, only if its
        model is at most FULL_ROUND_PAIRS."""
        elapsed = time.perf_counter() - self.start
        if status not in (cp_model.OPTIMAL, cp_model.INFEASIBLE) or self.interrupted:
            return False
        if self.cfg.time_limit - elapsed < max(MIN_ROUND_S, 2 * (elapsed - self.proof_s) if found else 0):
            return False
        return depth is not None or not found or self.full_pairs <= FULL_ROUND_PAIRS

    def relaxation(self, form: Formulation, level: str, limit: float, below: int | None = None) -> WholeBound:
        """Solve a relaxation of the whole staged space (:mod:`cpsat_bound`),
        in model integers (costs floored when the scale is inexact, so it
        stays a bound on the costs the model optimises)."""
        cfg, g = self.cfg, self.graph
        int_cost = form.int_cost if self.exact else [math.floor(c * self.scale) for c in g.cost]
        int_transfer = (form.int_transfer if self.exact else
                        [math.floor(b * cfg.transfer_cost_per_byte * self.scale) for b in g.bytes])
        return relaxation_bound(
            g, level=level, objective=cfg.objective, unit=form.unit, cap_units=form.mem_cap,
            int_cost=int_cost, int_transfer=int_transfer, offload=cfg.offload,
            overhead_cap=self.overhead_cap(form), max_recomputes=self.max_recomputes(),
            peak_floor=self.peak_floor(form), below=below, time_limit=limit, workers=cfg.workers,
            seed=cfg.seed, interruptible=level != "gaps")

    def relaxation_proof(self, best: Assignment | None) -> list[dict[str, Any]]:
        """Ask the stronger relaxations in turn (chains, then slots with what
        chains leaves) whether any staged plan beats ``best``; if none does,
        ``best`` is optimal over the whole space. Without ``best``, whether
        any staged plan meets the budget at all; if none does, ``self.empty``
        (the 108-node MLP at 0.9: chains shows it in 0.02 s, after depth 1;
        the full model took 8 s). Together they get what the
        rounds have taken so far (a proof saves the deeper rounds, which take
        about twice that), at least MIN_ROUND_S, at most a share of the time
        left. Raises ``self.lower`` by what each proves; returns the attempts."""
        obj = self.objective_of(best) if best is not None else ANY_PLAN + 1
        began = time.perf_counter()
        elapsed = began - self.start
        deadline = began + min(PROOF_SHARE * (self.cfg.time_limit - elapsed),
                               max(MIN_ROUND_S, elapsed - self.proof_s))
        attempts = []
        for level in ("chains", "slots"):
            left = deadline - time.perf_counter()
            if self.interrupted or self.proven_whole(best) or self.empty or left < 0.05:
                break
            r = self.relaxation(self.form, level, left, below=obj - 1)
            self.interrupted = self.interrupted or r.interrupted
            if best is None:
                self.empty = r.status == "INFEASIBLE"
                attempts.append({"level": level, "below": None, "status": r.status, "seconds": r.seconds,
                                 "elapsed_s": time.perf_counter() - self.start, "bound": None})
                continue
            lower = obj if r.status == "INFEASIBLE" else r.bound
            if lower is not None:
                self.lower = max(self.lower or 0, min(lower, obj))
            attempts.append({"level": level, "below": self.to_units(obj - 1), "status": r.status,
                             "seconds": r.seconds, "elapsed_s": time.perf_counter() - self.start,
                             "bound": None if lower is None else self.to_units(min(lower, obj))})
        self.proof_s += time.perf_counter() - began
        return attempts

    def run(self) -> Plan:
        """Solve with Ctrl-C deferred: during the search CP-SAT stops itself
        and hands back its best solution; elsewhere (warm start, building a
        round's model) a SIGINT only marks the run interrupted, and the run
        ends at the next checkpoint with the best plan so far."""
        with deferred_sigint(self):
            return self._run()

    def _run(self) -> Plan:
        cfg, g = self.cfg, self.graph
        self.trace = Trace(self.start)
        self.interrupted = False
        self.outside: tuple[Plan, Replay, float] | None = None  # see adopt_outside
        best = hint_obj = hint_source = None
        status, obj, bound = cp_model.UNKNOWN, None, None
        self.build_s, rounds = 0.0, []
        ix = Stages(g, cfg.offload)
        self.full_pairs = sum(len(ix.stages(i)) for i in ix.values)
        whole: WholeBound | None = None  # the gap relaxation's verdict (cpsat_bound)
        self.lower = None  # the whole space's best lower bound, model integers
        self.proof_s = 0.0  # time spent in relaxation proofs
        proofs: list[dict[str, Any]] = []  # the stronger relaxations' attempts (stats)
        proof_at = None  # the objective they were asked about
        done: _Round | None = None  # the round whose plan is returned (see _Round)
        # a valid plan before any model is built (the GPT decoder's takes 9 s)
        outside = self.outside_plan(self.start + WARM_START_SHARE * cfg.time_limit)
        outside_s = time.perf_counter() - self.start
        self.ix, self.also = ix, {}
        self.found_plan = False  # whether the last round's space held a plan (see depths)
        self._remat_pairs: dict[int | None, int] = {}
        self.empty = False  # a relaxation showed that no staged plan meets the budget
        asked_empty = False
        for k, depth in enumerate(self.depths()):
            if (k and best is not None and status == cp_model.OPTIMAL and not self.interrupted
                    and not self.proven_whole(best) and proof_at != self.objective_of(best)):
                # a restricted round's optimum may be the whole space's: ask the relaxations
                proofs += self.relaxation_proof(best)
                proof_at = self.objective_of(best)
            if k and best is None and status == cp_model.INFEASIBLE and not asked_empty and not self.interrupted:
                # a restricted space is empty: the relaxations may show that the whole one is
                proofs += self.relaxation_proof(None)
                asked_empty = True
                if self.empty:
                    solved_depth = None
                    break
            if k and (self.interrupted or self.proven_whole(best)
                      or not self.next_round(depth, status, best is not None)):
                break
            prev = events(self.form, best) if best is not None else None
            solved_depth = depth
            form, n_vars, n_cons = self.build(depth)
            if whole is None:
                whole = self.relaxation(form, "gaps", GAP_BOUND_SHARE * cfg.time_limit)
                self.lower = whole.bound
                if whole.status == "INFEASIBLE":  # no staged plan at all: nothing to search
                    status, solved_depth = cp_model.INFEASIBLE, None
                    break
            if prev is None:
                hint, hint_source = self.warm_start(outside, outside_s)
                if self.widen(depth, hint):  # the same round, in a space that holds the outside plan
                    form, n_vars, n_cons = self.build(depth)
                    widened = from_plan(form, self.outside[0])
                    if widened is not None and self.admissible(widened):
                        hint, hint_source = widened, self.outside_name(self.outside[0])
                hint_obj = self.objective_of(hint) if hint is not None else None
            else:
                hint = from_plan(form, prev)
            if self.interrupted:  # Ctrl-C while building or warm-starting: keep the best so far
                if best is None and hint is not None:
                    best, obj, status = hint, self.objective_of(hint), cp_model.FEASIBLE
                    done = self.this_round(depth, n_vars, n_cons, best, status, bound)
                break
            status, values, obj, bound, fitted = self.search(depth, hint)
            if hint is None and fitted is not None:
                hint, hint_source, hint_obj = fitted, "peak search", self.objective_of(fitted)
            best = Assignment.from_values(form, lambda v: values[v.index]) if values else None
            if depth is None and status != cp_model.INFEASIBLE and math.isfinite(bound):
                # the full model's bound holds for the whole space
                self.lower = max(self.lower or 0, math.ceil(bound - 1e-6))
            if hint is not None and (best is None or self.objective_of(best) > self.objective_of(hint)):
                best, obj = hint, self.objective_of(hint)  # never worse than the hint
                status = cp_model.FEASIBLE if status != cp_model.OPTIMAL else status
                self.trace.solution("primary", self.to_units(obj), self.to_units(bound))
            if best is not None and not (done is not None and done.status == cp_model.OPTIMAL
                                         and status != cp_model.OPTIMAL
                                         and self.objective_of(best) >= done.objective):
                done = self.this_round(depth, n_vars, n_cons, best, status, bound)
            self.found_plan = best is not None
            rounds.append(self.round_row(depth, status, best, bound, n_vars, n_cons))
        if done is not None:
            self.form, self.backend, self.peak_var, self.overhead_terms = (done.form, done.backend, done.peak_var,
                                                                           done.overhead_terms)
            form = self.form
            solved_depth, n_vars, n_cons = done.depth, done.variables, done.constraints
            best, obj, status, bound = done.best, done.objective, done.status, done.bound
        primary_s = time.perf_counter() - self.start
        secondary = None
        if best is not None and status == cp_model.OPTIMAL and not self.interrupted:
            secondary = self.lexicographic(best, int(round(obj)))
            if secondary is not None:
                best = secondary
        stats: dict[str, Any] = {
            "status": STATUS.get(status, "UNKNOWN"), "objective_kind": cfg.objective,
            "objective": None, "best_bound": self.to_units(bound) if best is not None and bound is not None else None,
            "gap": None,
            "time_to_first_s": self.trace.first, "time_to_best_s": self.trace.best,
            "primary_s": primary_s, "variables": n_vars, "constraints": n_cons, "build_s": self.build_s,
            "recompute_depth": "full" if solved_depth is None else solved_depth,
            "cost_scale": self.scale, "cost_scale_exact": self.exact, "memory_unit_bytes": form.unit,
            "offload": cfg.offload, "warm_start": hint_source,
            "hint_objective": self.to_units(hint_obj) if hint_obj is not None else None,
            "interrupted": self.interrupted, "lexicographic": secondary is not None, "rounds": rounds,
        }
        if whole is not None:
            stats["gap_relaxation"] = {"status": whole.status, "seconds": whole.seconds,
                                       "bound": None if whole.bound is None else self.to_units(whole.bound)}
        if proofs:
            stats["relaxation_proofs"] = proofs
        restricted = solved_depth is not None and cfg.depth is None
        if restricted:
            # The default asked about the whole staged space, but only a
            # depth-restricted subspace was solved: its optimum and bound say
            # nothing about the whole space; the relaxations' bound does.
            stats.update(space=self.space_name(solved_depth), space_status=stats["status"],
                         space_bound=stats["best_bound"], best_bound=None)
            if stats["status"] == "OPTIMAL":
                stats["status"] = "OPTIMAL" if self.proven_whole(best) else "FEASIBLE"
        else:
            stats["space"] = self.space_name(solved_depth)
        if best is not None and self.lower is not None and (restricted or solved_depth is None):
            # a whole-space bound (the relaxation's, or the trivial one) under
            # the full model's own, whichever is higher
            own = stats["best_bound"] if stats["best_bound"] is not None else self.trivial_bound()
            stats["best_bound"] = max(own, self.trivial_bound(), self.to_units(self.lower))
            if self.proven_whole(best):
                stats["status"] = "OPTIMAL"
        elif restricted and best is not None:
            stats["best_bound"] = self.trivial_bound()
        if whole is not None and whole.status == "INFEASIBLE":  # no model solved, so no LP of it either
            stats["reason"] = "the gap relaxation of the staged space is infeasible: no staged plan meets the budget"
        elif self.empty:
            stats["reason"] = (f"the {proofs[-1]['level']} relaxation of the staged space is infeasible: "
                               "no staged plan meets the budget")
        elif cfg.lp_bound and n_vars > LP_MAX_VARIABLES:
            stats["lp_bound"] = None
            stats["lp_bound_skipped"] = f"model has {n_vars:,} variables (> {LP_MAX_VARIABLES:,})"
        elif cfg.lp_bound:
            # the LP of the model solved (the whole space's LP takes minutes on n100)
            stats["lp_bound"] = self.lp_bound(max(1.0, cfg.time_limit / 4), solved_depth)
        if cfg.log_path:
            self.trace.write(cfg.log_path)
        if best is None:
            if status == cp_model.INFEASIBLE and solved_depth is not None and whole.status != "INFEASIBLE":
                stats["status"] = "UNKNOWN"  # only a restricted space was shown empty
                stats["reason"] = (f"no plan recomputes within {solved_depth} producer hops of each stage's "
                                   "node; try --recompute-depth full")
            elif status == cp_model.UNKNOWN:
                empty = [r["recompute_depth"] for r in rounds
                         if r["status"] == "INFEASIBLE" and r["recompute_depth"] != "full"]
                why = "stopped by Ctrl-C" if self.interrupted else "the time limit ran out"
                where = f" (none recomputes within {max(empty)} producer hops of each stage's node)" if empty else ""
                stats["reason"] = f"{why} before any plan within the budget was found{where}"
            if self.outside is not None:  # the model's space is empty, the budget is not
                return self.fallback(stats)
            return _no_plan(g, stats["status"], **{k: v for k, v in stats.items() if k != "status"})
        p = events(form, best)
        counts, peak, moved = best.counts(form), best.peak_bytes(form), best.transfer_bytes(form)
        # the objective as the plan realises it, not the model's scaled integers
        recompute = cost_of_counts(g, [max(c - 1, 0) for c in counts])
        objective = recompute + moved * cfg.transfer_cost_per_byte if cfg.objective == "overhead" else peak
        if self.outside is not None and self.outside[2] < objective:
            return self.fallback(stats, f"{self.outside[0].planner}'s plan, outside the model's space, "
                                        f"beats the model's best ({objective:.6g})")
        stats.update(objective=objective, peak_bytes=peak, compute_cost=cost_of_counts(g, counts),
                     transfer_bytes=moved, compute_events=len(best.R),
                     recompute_events=len(best.R) - len(g.compute_ids))
        if restricted and stats["space_bound"] is not None:
            stats["space_bound"] = min(stats["space_bound"], objective)
            stats["space_gap"] = _gap(objective, stats["space_bound"])
        if stats["best_bound"] is not None:
            b = min(stats["best_bound"], objective)
            stats["best_bound"] = b
            stats["gap"] = _gap(objective, b)
        p.stats.update(stats)
        return p

    def fit(self, depth: int | None, start: Assignment, limit: float) -> tuple[int, Assignment | None]:
        """Look for any plan of the round's space within the budget in at most
        ``limit`` seconds: minimise the peak over the same space with the
        budget lifted, from ``start`` (the lowest-peak plan so far,
        ``self.lowest``, in this space: the fast planners', or an earlier
        fit's), and stop at the first plan that fits. Every plan is a
        solution there, so the search moves from its start: on resnet_s2_c16
        at 0.8 the full model had no plan in 60 s of overhead search; from
        dtr's plan (peak 2% over) one fits after 6 s. (A peak variable
        bounded below by the budget, so that the first fit would be optimal,
        left the search stuck above it.) Returns FEASIBLE with that plan as
        the round's hint, INFEASIBLE if the peak's bound shows that no plan
        of the space fits, else UNKNOWN."""
        began = time.perf_counter()
        cap, plan = self.form.mem_cap, None
        with self.aside():
            self.backend = CpSatBackend()
            self.form = self.formulation(self.backend, depth, fit=True)
            self.build_s += time.perf_counter() - began
            self.add_hint(start, peak=True)
            status, values, obj, bound = self.solve_phase("fit", limit, stop_at=cap)
            if values is not None:
                a = Assignment.from_values(self.form, lambda v: values[v.index])
                found = events(self.form, a)
                if self.objective_of_peak(a) <= self.objective_of_peak(start):
                    # the next round's start: the spaces are nested
                    self.lowest = found, int(self.to_bytes(self.objective_of_peak(a)))
                plan = found if obj <= cap else None
        hint = from_plan(self.form, plan) if plan is not None else None
        if hint is not None and self.admissible(hint):
            return cp_model.FEASIBLE, hint
        proven = status == cp_model.INFEASIBLE or bound > cap
        return (cp_model.INFEASIBLE if proven else cp_model.UNKNOWN), None

    def round_row(self, depth: int | None, status: int, best: Assignment | None, bound: float | None,
                  n_vars: int, n_cons: int) -> dict[str, Any]:
        """A round's entry in the ``rounds`` stat."""
        return {"recompute_depth": "full" if depth is None else depth, "status": STATUS.get(status),
                "objective": None if best is None else self.to_units(self.objective_of(best)),
                "best_bound": None if bound is None else self.to_units(bound), "variables": n_vars,
                "constraints": n_cons, "elapsed_s": time.perf_counter() - self.start}

    def this_round(self, depth: int | None, n_vars: int, n_cons: int, best: Assignment, status: int,
                   bound: float | None) -> _Round:
        """The round just solved (``self.form`` and its backend), with its best."""
        return _Round(self.form, self.backend, getattr(self, "peak_var", None), self.overhead_terms, depth,
                      n_vars, n_cons, best, self.objective_of(best), status, bound)

    def proven_whole(self, best: Assignment | None) -> bool:
        """Whether ``best`` reaches the relaxations' bound, so it is optimal
        over the whole staged space whatever the round's space."""
        return best is not None and self.lower is not None and self.objective_of(best) <= self.lower

    def adopt_outside(self, plan: Plan, r: Replay) -> None:
        """Keep a plan from outside the model (the hint, or the best fast
        planner's) with its replay ``r`` and its primary objective, if it is
        valid and within the budget, the clone bound and the overhead cap: it
        stands in when the model's space yields nothing or only worse."""
        cfg, g = self.cfg, self.graph
        overhead = r.recompute_cost + r.transfer_bytes * cfg.transfer_cost_per_byte
        if (r.valid and (cfg.budget is None or r.peak_bytes <= cfg.budget)
                and (not cfg.max_clone_expansion or r.compute_events <= cfg.max_clone_expansion * len(g.compute_ids))
                and (cfg.max_overhead is None or overhead <= cfg.max_overhead * r.base_cost)):
            self.outside = (plan, r, overhead if cfg.objective == "overhead" else float(r.peak_bytes))
            # the run returns nothing worse from here on, even when the plan
            # does not fit the model's space (time_to_first_s counts it)
            self.trace.solution("primary", self.outside[2], None)

    def fallback(self, stats: dict[str, Any],
                 reason: str = "no plan found in the model's space") -> Plan:
        """Hand back the plan kept by :meth:`adopt_outside`: never less than
        the hint. Marked as such; no bound holds for it."""
        plan, r, objective = self.outside
        p = Plan(self.graph.name, "cpsat", plan.ops, plan.nodes)
        stats.update(peak_bytes=r.peak_bytes, compute_cost=r.compute_cost, transfer_bytes=r.transfer_bytes,
                     space_status=stats.get("space_status", stats["status"]), status="FEASIBLE",
                     plan_from=plan.planner, objective=objective, best_bound=None, gap=None, reason=reason)
        p.stats.update(stats)
        return p

    def lexicographic(self, best: Assignment, optimum: int) -> Assignment | None:
        """Fix the primary at its optimum and minimise the other figure
        (peak after overhead, overhead after peak) in the remaining time."""
        cfg, form, backend = self.cfg, self.form, self.backend
        elapsed = time.perf_counter() - self.start
        # the tie-break gets at most as long as the optimum took (>= 1 s)
        left = min(cfg.time_limit - elapsed, max(1.0, elapsed))
        if left < 0.05:
            return None
        if cfg.objective == "overhead":
            backend.add(self.overhead_terms, -math.inf, optimum)
            low = self.peak_floor(form)
            peak = backend.int_var(low, max(form.mem_cap, low), "peak")
            form.bound_memory(peak)
            backend.minimize([(1, peak)])
        else:
            backend.add([(1, self.peak_var)], -math.inf, optimum)
            backend.minimize(self.overhead_terms or [(0, self.peak_var)])
        backend.model.clear_hints()
        for var, val in best.values(form):
            backend.model.add_hint(var, val)
        if cfg.objective == "overhead":
            backend.model.add_hint(peak, self.objective_of_peak(best))
        else:
            backend.model.add_hint(self.peak_var, optimum)
        status, values, _, _ = self.solve_phase("secondary", left)
        if values is None:
            return None
        return Assignment.from_values(form, lambda v: values[v.index])

    def trivial_bound(self) -> float:
        """What every plan pays: no recompute for overhead, the peak lower bound for peak."""
        return 0.0 if self.cfg.objective == "overhead" else float(peak_lower_bound(self.graph))

    def objective_of_peak(self, a: Assignment) -> int:
        return max(max(a.memory(self.form).values(), default=0), self.peak_floor(self.form))

    def peak_floor(self, form: Formulation) -> int:
        """The peak lower bound (working set, resident inputs) in model units:
        the peak variable's floor, so a plan reaching it is proven at once."""
        return max(0, math.ceil((peak_lower_bound(self.graph) - form.persistent_bytes) / form.unit))

    def lp_bound(self, limit: float, depth: int | None) -> float | None:
        """The LP relaxation of the same formulation, in the objective's units."""
        overhead = self.cfg.objective == "overhead"
        lp = LpBackend(self.scale if overhead else 1.0)
        with self.aside():
            self.formulation(lp, depth)
        value = lp.solve(limit)
        if value is None or overhead:
            return value
        return self.to_bytes(value)


def _gap(objective: float, bound: float) -> float:
    return 0.0 if objective == bound else (objective - bound) / abs(objective)
