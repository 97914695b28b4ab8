"""The two backends of the one formulation: CP-SAT (the exact model) and
GLOP (its LP relaxation, for ``lp_bound``). Both implement
:class:`rematopt.planners.staged.model.Backend` and keep the formulation's
variable names (``R[s,i]``, ``S[s,i]``...), so an exported model reads
against ``docs/cpsat.md``."""

from __future__ import annotations

import math
import signal
import threading
from contextlib import contextmanager
from typing import Any, Iterator

from ortools.linear_solver import pywraplp
from ortools.sat.python import cp_model

from ..meter import meter

_INT_MAX = 2**62


def _clip(x: float) -> int:
    if x == math.inf:
        return _INT_MAX
    if x == -math.inf:
        return -_INT_MAX
    return int(x)


# Root cut rounds of a solve that is about its bound only (``tune(strong=True)``):
# the chains relaxation of gpt_l2_w64 at 0.8 on 56 stages reaches 3.87% of
# the base cost in 60 s with two LP-heavy workers and these rounds, 3.4% with
# the usual pair; random_layered_n250 at 0.8, all stages: 3,751 in 30 s, 2,792
# with the usual pair. Not for proofs that are quick anyway (n250 at 0.9:
# 5.7 s, the usual pair 1.1 s).
STRONG_CUT_ROUNDS = 100

# CP-SAT's statuses by name, as the stats report them.
STATUS = {cp_model.OPTIMAL: "OPTIMAL", cp_model.FEASIBLE: "FEASIBLE", cp_model.INFEASIBLE: "INFEASIBLE",
          cp_model.UNKNOWN: "UNKNOWN", cp_model.MODEL_INVALID: "MODEL_INVALID"}


def tune(prm: Any, limit: float, workers: int, seed: int = 0, lp_heavy: bool = True, strong: bool = False) -> None:
    """CP-SAT parameters for every solve here (the model and its relaxations).
    ``lp_heavy``: whether a lone worker should be the LP-heavy one, i.e. the
    solve is about a bound (a relaxation, or a model hinted with a plan to
    improve) rather than about finding a first plan or showing there is none.
    ``strong``: only the bound matters: every worker LP-heavy, with
    STRONG_CUT_ROUNDS rounds of cuts at the root. ``limit`` is in seconds
    of the run's meter (:mod:`..meter`: deterministic ones on one worker)."""
    workers = 1 if meter().deterministic else workers
    meter().limit(prm, limit)
    prm.num_workers = workers
    prm.random_seed = seed
    # Probing and symmetry detection cost tens of seconds on the larger
    # benchmark models and found nothing the search needed there.
    prm.cp_model_probing_level = 0
    prm.symmetry_level = 0
    if strong:
        prm.max_cut_rounds_at_level_zero = STRONG_CUT_ROUNDS
        if workers > 1:
            prm.subsolvers.extend(["max_lp"] * workers)
        else:
            prm.linearization_level = 2
        return
    if workers in (2, 3):
        # The LP-heavy worker proves what the default pair cannot: depth-2
        # random_layered_n250 at 0.9 optimal in 15 s (default: 45% gap after
        # 40 s), n100 at 0.8 in 3 s (default: 39 s); the chain relaxation of
        # n250 at 0.9 in 18 s (default: a bound of 229 after 30 s).
        prm.subsolvers.extend(["max_lp", "default_lp"])
    elif workers == 1 and lp_heavy:
        # A lone worker (a batch job's share), 20 s: random_layered_n250's
        # depth-1 optimum at 0.9 proven at 7 s (default: found at 16 s,
        # unproven), its chains proof in 2.7 s (default: none in 15 s);
        # gpt_l2_w64 at 0.6 9% cheaper. Not without a plan: the default
        # worker shows resnet_s2_c16's full model empty at 0.6 in 10 s, the
        # LP-heavy one not in 14 s.
        prm.linearization_level = 2


def stopped_early(solver: cp_model.CpSolver, status: int, limit: float,
                  unproven: tuple[int, ...] = (cp_model.FEASIBLE, cp_model.UNKNOWN)) -> bool:
    """Whether a solve that ended ``unproven`` did so well before ``limit``
    (on the meter's clock) while CP-SAT caught SIGINT, the wall clock
    not run out: that is a Ctrl-C."""
    return (solver.parameters.catch_sigint_signal and status in unproven
            and meter().used(solver) < 0.9 * limit - 0.5 and not meter().past(None))


def sigint_ignored() -> bool:
    """SIGINT is ignored, as in a process started in the background (where
    Python installs no handler of its own): whoever chose that wants no
    Ctrl-C to reach the process, so cpsat leaves SIGINT alone."""
    return signal.getsignal(signal.SIGINT) is signal.SIG_IGN


@contextmanager
def solver_takes_ctrl_c(params: Any, enabled: bool = True) -> Iterator[None]:
    """During one CP-SAT solve, let a Ctrl-C stop the search with its best
    solution (a Python handler would only run once solve() returns), then
    put the caller's SIGINT handler back (CP-SAT leaves the default one,
    which kills the process). Main thread only: CP-SAT's handler lives in
    the thread that installs it, and a SIGINT reaching the main thread while
    a worker thread's solve has it installed aborts the process
    (std::bad_function_call; measured with a cpsat solve in a thread).
    Not where SIGINT is ignored (:func:`sigint_ignored`)."""
    main = threading.current_thread() is threading.main_thread()
    params.catch_sigint_signal = enabled and main and not sigint_ignored()
    if not params.catch_sigint_signal:
        yield
        return
    previous = signal.getsignal(signal.SIGINT)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


class CpSatBackend:
    def __init__(self) -> None:
        self.model = cp_model.CpModel()

    def bool_var(self, name: str) -> cp_model.IntVar:
        return self.model.new_bool_var(name)

    def int_var(self, lb: int, ub: int, name: str) -> cp_model.IntVar:
        return self.model.new_int_var(lb, ub, name)

    def add(self, terms: list[tuple[int, Any]], lb: float, ub: float) -> None:
        expr = cp_model.LinearExpr.weighted_sum([x for _, x in terms], [c for c, _ in terms])
        self.model.add_linear_constraint(expr, _clip(lb), _clip(ub))

    def minimize(self, terms: list[tuple[int, Any]]) -> None:
        self.model.minimize(cp_model.LinearExpr.weighted_sum([x for _, x in terms], [c for c, _ in terms]))

    @property
    def size(self) -> tuple[int, int]:
        proto = self.model.proto
        return len(proto.variables), len(proto.constraints)

    def export(self) -> str:
        """The model as CP-SAT's proto text."""
        return str(self.model.proto)


class LpBackend:
    """0/1 variables relaxed to [0, 1], integers to reals. Objective
    coefficients are divided by ``objective_scale`` (GLOP reports ABNORMAL on
    some models whose costs were scaled up to integers for CP-SAT)."""

    def __init__(self, objective_scale: float = 1.0) -> None:
        self.objective_scale = objective_scale
        self.solver = pywraplp.Solver.CreateSolver("GLOP")
        # GLOP's presolve takes 7 s on the 2,700-variable model of the default
        # graph, the simplex without it 0.6 s.
        self.solver.SetSolverSpecificParametersAsString("use_preprocessing: false")
        self.inf = self.solver.infinity()

    def bool_var(self, name: str) -> Any:
        return self.solver.NumVar(0.0, 1.0, name)

    def int_var(self, lb: int, ub: int, name: str) -> Any:
        return self.solver.NumVar(float(lb), float(ub), name)

    def add(self, terms: list[tuple[int, Any]], lb: float, ub: float) -> None:
        ct = self.solver.Constraint(max(lb, -self.inf), min(ub, self.inf))
        for c, x in terms:
            ct.SetCoefficient(x, ct.GetCoefficient(x) + c)

    def minimize(self, terms: list[tuple[int, Any]]) -> None:
        obj = self.solver.Objective()
        for c, x in terms:
            obj.SetCoefficient(x, obj.GetCoefficient(x) + c / self.objective_scale)
        obj.SetMinimization()

    def export(self) -> str:
        """The LP in free MPS format."""
        return self.solver.ExportModelAsMpsFormat(False, False)

    def solve(self, time_limit_s: float) -> float | None:
        """The LP optimum, or None if GLOP stops without one."""
        self.solver.SetTimeLimit(int(meter().wall_seconds(time_limit_s) * 1000))
        if self.solver.Solve() != pywraplp.Solver.OPTIMAL:
            return None
        return self.solver.Objective().Value()
