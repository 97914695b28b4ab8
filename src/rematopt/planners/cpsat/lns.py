"""Large-neighbourhood search over a built model: re-optimise a window of
consecutive stages exactly while the rest of the incumbent stays fixed,
window after window; the incumbent only ever improves.

A window's subproblem is cut from the model's CP-SAT proto, not rebuilt:
a variable stays free when every entry it stands for lies in the window
(``R``, ``P``, ``S``, ``F``, ``U`` by their stage; ``O[i]`` by the stages
where i may be prefetched); every other variable takes its incumbent value, folded into the bounds of
the constraints that touch a free one; constraints with no free variable
hold already (the incumbent satisfies them) and are left out. So a window
costs in proportion to its own size, whatever the model's. The peak
variable of ``--objective peak`` stays free, bounded below by the
incumbent's memory outside the window.

A window's result is taken only if its objective is strictly lower, it
meets the budget and caps (:meth:`Model.admissible`), and its plan replays
in the simulator within the budget.
"""

from __future__ import annotations

import random
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

from ortools.sat import cp_model_pb2
from ortools.sat.python import cp_model

from ...simulate import simulate
from ..meter import meter, now
from ..staged.backends import STATUS, stopped_early, tune
from ..staged.backends import solver_takes_ctrl_c
from ..staged.model import Model
from ..staged.solution import Assignment, events
from .search import Context, Round
from .signals import Interrupt
from .tuning import TUNING, Tuning

# With ``--lns auto``, LNS follows the rounds when the returned round's model
# has at least this many variables, and a round that LNS will follow
# searches for ``lns_share`` of the time left (:mod:`.tuning`), LNS the rest. Measured (120 s, 2
# workers, same start and time), the round's own search beat LNS on every
# instance up to the 48-layer decoder's depth-1 model (117,765 variables;
# at 0.8: 4.09% against 5.49%; random_layered_n1000 at 0.9: 1.05% against
# 1.12% with half the time each), so auto stays off below that size.
AUTO_VARIABLES = 150_000
# The first window holds about this many free variables (random_layered_n500's
# depth-1 windows of about 2,000 variables are solved to optimality in
# well under a second).
START_FREE_VARIABLES = 2000
# A window solved to optimality within ``window_fast_share`` of its limit
# (:mod:`.tuning`) makes the next one GROWTH times wider; one that is not
# shrinks by the same factor.
GROWTH = 1.5
# Consecutive windows overlap by this share of their width.
OVERLAP = 0.5


@dataclass(frozen=True)
class Window:
    """One window tried: stages ``first .. last - 1``, its free variables,
    the search's status, seconds, and the objective (units) before and after."""

    first: int
    last: int
    free: int
    status: str
    seconds: float
    before: float
    after: float
    kind: str = "stages"  # or "cone": a value's cone over its whole life


@dataclass(frozen=True)
class Result:
    """What a search did: its best assignment (never worse than the start),
    the windows tried, and whether a window covering every stage was solved
    to optimality, or none could improve (then ``best`` is the model's
    optimum)."""

    best: Assignment
    before: int  # model integers
    after: int
    windows: tuple[Window, ...]
    exhausted: bool
    seconds: float

    def stats(self, model: Model) -> dict[str, Any]:
        """The ``lns`` entry of a plan's stats."""
        cones = [w for w in self.windows if w.kind == "cone"]
        return {"windows": len(self.windows), "improved": sum(w.after < w.before for w in self.windows),
                "cones": len(cones), "cones_improved": sum(w.after < w.before for w in cones),
                "objective_before": model.to_units(self.before), "objective_after": model.to_units(self.after),
                "seconds": self.seconds, "exhausted": self.exhausted,
                "largest_window": max((w.last - w.first for w in self.windows), default=0)}


class Neighbourhoods:
    """The model's proto read once into plain lists: each linear constraint
    (variables, coefficients, domain), the constraints of each variable,
    and each variable's entries in the formulation and the stages they span."""

    def __init__(self, model: Model):
        form = model.form
        proto = plain_proto(model.backend.model)
        self.model = model
        self.T = form.ix.T
        self.domains = [list(v.domain) for v in proto.variables]
        self.cons: list[tuple[list[int], list[int], list[int]]] = []
        self.var_cons: list[list[int]] = [[] for _ in self.domains]
        var_cons, cons = self.var_cons, self.cons
        for k, c in enumerate(proto.constraints):
            if c.WhichOneof("constraint") != "linear" or c.enforcement_literal:
                raise ValueError("lns: the model has a constraint that is not a plain linear one")
            lin = c.linear
            vs = list(lin.vars)
            for v in vs:  # a variable listed twice lists the constraint twice: submodel skips repeats
                var_cons[v].append(k)
            cons.append((vs, list(lin.coeffs), list(lin.domain)))
        self.objective = list(zip(proto.objective.vars, proto.objective.coeffs))
        self.peak = None if model.peak is None else model.peak.index
        # each variable's entries (table, key) and the stages they span
        self.keys: dict[int, list[tuple[str, Any]]] = {}
        lo: dict[int, int] = {}
        hi: dict[int, int] = {}
        prefetched: dict[int, list[int]] = {}  # O[i] lives where i may be prefetched
        for (s, i) in form.P:
            prefetched.setdefault(i, []).append(s)
        for name in ("S", "R", "P", "F", "U", "O"):
            table = getattr(form, name)
            for k, v in table.items():
                if isinstance(v, int):
                    continue
                x = v.index
                stages = prefetched[k] if name == "O" else (k[0],)
                entry = self.keys.get(x)
                if entry is None:
                    self.keys[x] = [(name, k)]
                    lo[x], hi[x] = min(stages), max(stages)
                else:  # a kept value's one variable over the stages that only carry it
                    entry.append((name, k))
                    lo[x], hi[x] = min(lo[x], *stages), max(hi[x], *stages)
        # each value's own variables (its S, R, P, F and O entries), for cone windows
        self.of_value: dict[int, list[int]] = {}
        for x, keys in self.keys.items():
            name, k = keys[0]
            if name != "U":
                self.of_value.setdefault(k if name == "O" else k[1], []).append(x)
        self.lo = lo
        self.starting: list[list[int]] = [[] for _ in range(self.T + 1)]  # variables by first stage
        for v, s in lo.items():
            self.starting[min(s, self.T)].append(v)
        self.hi = hi
        # the slots' U by stage, for the peak variable's bound outside a window
        self.stage_u: list[list[int]] = [[] for _ in range(self.T)]
        for (s, q), u in form.U.items():
            self.stage_u[s].append(u.index)
        self.u_before = [0]  # U variables in the stages before each
        for us in self.stage_u:
            self.u_before.append(self.u_before[-1] + len(us))
        # per value: its variables' count and the stages they span
        self.span = {i: (len(xs), min(lo[x] for x in xs), max(hi[x] for x in xs)) for i, xs in self.of_value.items()}

    def free_in(self, a: int, b: int) -> list[int]:
        """The variables a window of stages ``a .. b-1`` leaves free: those
        whose every entry lies in it (a kept value's one variable across the
        stages that only carry it is free only if they all do)."""
        free = [v for s in range(a, b) for v in self.starting[s] if self.hi[v] < b]
        if self.peak is not None:
            free.append(self.peak)
        return sorted(free)

    def free_for(self, values: set[int]) -> tuple[list[int], int, int]:
        """A cone window's free variables: every variable of ``values``
        over their whole lives, and the memory of the stages those span (a
        residency changes nothing past a value's last stage); with the
        stages ``a .. b-1`` spanned."""
        own = [x for i in values for x in self.of_value.get(i, ())]
        if not own:
            return [], 0, 0
        a = min(self.lo[x] for x in own)
        b = min(self.T, max(self.hi[x] for x in own) + 1)
        free = set(own)
        for stage in range(a, b):
            free.update(self.stage_u[stage])
        if self.peak is not None:
            free.add(self.peak)
        return sorted(free), a, b

    def values(self, a: Assignment) -> list[int]:
        """Every variable's value under ``a`` (the peak variable: its peak)."""
        out = [0] * len(self.domains)
        ones = {"S": a.S, "R": a.R, "P": a.P, "F": a.F, "O": a.O}
        for v, keys in self.keys.items():
            name, k = keys[0]
            if name != "U":
                out[v] = int(k in ones[name])
        for k, m in a.memory(self.model.form).items():
            out[self.model.form.U[k].index] = m
        if self.peak is not None:
            out[self.peak] = self.model.peak_of(a)
        return out

    def changed(self, a: Assignment, values: list[int], free: list[int], sol: list[int]) -> Assignment:
        """``a`` (whose variables are at ``values``) with the free variables
        at ``sol``: only the window's entries are touched."""
        out = Assignment(set(a.S), set(a.R), set(a.P), set(a.O), set(a.F))
        ones = {"S": out.S, "R": out.R, "P": out.P, "F": out.F, "O": out.O}
        for v, x in zip(free, sol):
            if x != values[v] and v != self.peak:
                for name, k in self.keys[v]:
                    if name != "U":
                        (ones[name].add if x else ones[name].discard)(k)
        return out

    def submodel(self, free: list[int], values: list[int], peak_floor: int) -> cp_model.CpModel:
        """The window's model: ``free`` variables (renumbered in that order),
        every other variable at ``values``, hinted with ``values``."""
        new = {old: k for k, old in enumerate(free)}
        m = cp_model.CpModel()
        p = m.proto
        for old in free:
            dom = self.domains[old]
            if old == self.peak:
                dom = [max(dom[0], peak_floor), max(dom[-1], peak_floor)]
            p.variables.add().domain.extend(dom)
        seen: set[int] = set()
        for old in free:
            if old == self.peak:
                continue  # its constraints with a window's U come with the U
            for c in self.var_cons[old]:
                if c in seen:
                    continue
                seen.add(c)
                vs, cs, dom = self.cons[c]
                keep_v, keep_c, const = [], [], 0
                for v, coef in zip(vs, cs):
                    k = new.get(v)
                    if k is None:
                        const += coef * values[v]
                    else:
                        keep_v.append(k)
                        keep_c.append(coef)
                lin = p.constraints.add().linear
                lin.vars.extend(keep_v)
                lin.coeffs.extend(keep_c)
                lin.domain.extend(_shift(dom, const))
        obj = [(new[v], c) for v, c in self.objective if v in new]
        p.objective.vars.extend(k for k, _ in obj)
        p.objective.coeffs.extend(c for _, c in obj)
        p.solution_hint.vars.extend(range(len(free)))
        p.solution_hint.values.extend(values[v] for v in free)
        return m


def plain_proto(model: cp_model.CpModel) -> cp_model_pb2.CpModelProto:
    """The model as a plain protobuf message: read element by element, the
    solver's own proto wrapper took 1.5 s on a 35,000-constraint model,
    its serialised copy 0.3 s."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "model.pb"
        model.export_to_file(str(path))
        return cp_model_pb2.CpModelProto.FromString(path.read_bytes())


_LIMIT = 2**62  # the backends' infinity


def _shift(dom: list[int], const: int) -> list[int]:
    """The domain of ``expr`` given that of ``expr + const``."""
    return [d if abs(d) >= _LIMIT else d - const for d in dom]


def improve(model: Model, start: Assignment, *, deadline: float, workers: int, seed: int = 0,
            budget: int | None = None, stop: Interrupt | None = None, width: int | None = None,
            on_improve: Callable[[Assignment], None] | None = None, cones: bool = True,
            tuning: Tuning = TUNING) -> Result:
    """LNS from ``start`` (admissible in ``model``) until ``deadline`` (on the
    run's :mod:`..meter`), ``tuning.max_windows`` windows, a window covering every stage is solved
    to optimality, or a Ctrl-C (``stop``). Windows slide by half their
    width, skipping those that cannot improve (overhead: no recompute or
    transfer cost inside; peak: a slot at the peak outside) and those
    already proven at the current incumbent; their width (``width`` stages
    at first, else about START_FREE_VARIABLES free variables) grows when a
    window is proven fast, or when no window of that width is left to try,
    and shrinks when a window is not proven. A result is kept only if it is
    strictly better, admissible, and its plan replays valid within
    ``budget``; ``on_improve`` hears of each one. With ``cones`` (overhead
    only), every other window is a value's cone instead (:func:`cone`):
    values and their whole lives, however far apart their stages."""
    began = now()
    if deadline - began < tuning.min_window_s:  # no window would start: build nothing
        before = model.objective_of(start)
        return Result(start, before, before, (), False, 0.0)
    hood = Neighbourhoods(model)
    T = hood.T
    best, best_obj = start, model.objective_of(start)
    before = best_obj
    if T == 0:
        return Result(best, before, before, (), True, 0.0)
    values = hood.values(best)
    profile = Profile.of(model, hood, best, values)
    per_stage = max(1.0, sum(len(v) for v in hood.starting) / T)
    w = max(1, min(T, width or round(START_FREE_VARIABLES / per_stage)))
    windows: list[Window] = []
    proven: set[tuple[int, int]] = set()  # windows optimal at the current incumbent
    exhausted = False
    cursor, idle = 0, 0  # idle: windows skipped in a row
    rng = random.Random(seed)
    cone_free = START_FREE_VARIABLES
    tried = 0

    def attempt(sub: cp_model.CpModel, free: list[int], limit: float) -> tuple[str, float]:
        """Solve one neighbourhood; its solution becomes the incumbent where
        it costs less, is admissible and replays within the budget."""
        nonlocal best, best_obj, profile
        status, sol, took = _solve(sub, limit, workers, seed, stop)
        if sol is not None and _objective(sub, sol) < _objective(sub, sub.proto.solution_hint.values):
            cand = hood.changed(best, values, free, sol)
            obj = model.objective_of(cand)
            if obj < best_obj and model.admissible(cand) and replays(model, cand, budget):
                best, best_obj = cand, obj
                for v, x in zip(free, sol):
                    values[v] = x
                profile = Profile.of(model, hood, best, values)
                if on_improve is not None:
                    on_improve(best)
        return status, took

    while not (stop is not None and stop.requested):
        left = deadline - now()
        if left < tuning.min_window_s or len(windows) == tuning.max_windows:
            break
        tried += 1
        if cones and model.peak is None and tried % 2 == 0:  # every other window: a value's cone
            group = cone(model, hood, best, rng, cone_free)
            if group:
                free, a, b = hood.free_for(group)
                sub = hood.submodel(free, values, 0)
                limit = min(left, tuning.window_s)
                prev = best_obj
                status, took = attempt(sub, free, limit)
                if best_obj < prev:
                    proven.clear()
                windows.append(Window(a, b, len(free), status, took, model.to_units(prev),
                                      model.to_units(best_obj), "cone"))
                fast = status == "OPTIMAL" and took < tuning.window_fast_share * limit
                cone_free = round(cone_free * GROWTH) if fast else max(200, round(cone_free / GROWTH))
                continue
        a = min(cursor, T - w)
        b = a + w
        step = max(1, round(w * (1 - OVERLAP)))
        cursor = a + step if b < T else 0
        if (a, b) in proven or not profile.may_improve(model, a, b):
            idle += 1
            if idle > T // step + 1:  # a whole sweep with nothing to try at this width
                if w >= T:  # nor over every stage: no cost to save, or the peak at its floor
                    exhausted = True
                    break
                w, idle = min(T, max(w + 1, round(w * GROWTH))), 0
            continue
        idle = 0
        free = hood.free_in(a, b)
        floor = max(profile.high_outside(a, b), model.peak_floor) if hood.peak is not None else 0
        sub = hood.submodel(free, values, floor)
        limit = min(left, tuning.window_s)
        prev = best_obj
        status, took = attempt(sub, free, limit)
        if best_obj < prev:  # a window's subproblem reads the stages next to it, and the peak all of them
            proven = {(c, d) for c, d in proven if hood.peak is None and (d < a - 1 or c > b + 1)}
        windows.append(Window(a, b, len(free), status, took, model.to_units(prev), model.to_units(best_obj)))
        if status == "OPTIMAL":
            proven.add((a, b))
            if w >= T:
                exhausted = True
                break
            if took < tuning.window_fast_share * limit:
                w = min(T, max(w + 1, round(w * GROWTH)))
        else:
            w = max(1, round(w / GROWTH))
    return Result(best, before, best_obj, tuple(windows), exhausted, now() - began)


def cone(model: Model, hood: Neighbourhoods, best: Assignment, rng: random.Random, target: int) -> set[int]:
    """A value the incumbent pays to recompute (drawn by its cost), and the
    values around it in the graph, breadth first through producers and
    consumers, until their variables and the memory of the stages they
    span make about ``target`` free variables: a forward value and its
    late reads, or a value and the producers its recomputes need, are
    decided together, where a window of consecutive stages holds both ends
    only when they are close (the closing note of issue 19)."""
    form = model.form
    paid = [(i, form.int_cost[i]) for (s, i) in best.R if s != form.ix.first[i] and form.int_cost[i]]
    if not paid:
        return set()
    seed = rng.choices([i for i, _ in paid], weights=[c for _, c in paid])[0]
    g = form.graph
    group, frontier = {seed}, [seed]
    own, a, b = hood.span.get(seed, (0, hood.T, 0))
    while frontier:
        nxt = []
        for i in frontier:
            for j in g.preds[i] + g.succs[i]:
                if j in hood.span and j not in group:
                    group.add(j)
                    nxt.append(j)
                    n, lo, hi = hood.span[j]
                    own, a, b = own + n, min(a, lo), max(b, hi)
                    if own + hood.u_before[min(hood.T, b + 1)] - hood.u_before[a] >= target:
                        return group
        rng.shuffle(nxt)
        frontier = nxt
    return group


@dataclass(frozen=True)
class Profile:
    """Where the incumbent pays, per stage, as prefix sums: ``pays[b] -
    pays[a]`` is its recompute and transfer cost in stages ``a .. b-1``
    (overhead), or how many of those stages reach the peak (peak); and the
    highest memory before each stage and from each stage on."""

    pays: list[int]
    high_before: list[int]
    high_from: list[int]

    @classmethod
    def of(cls, model: Model, hood: Neighbourhoods, best: Assignment, values: list[int]) -> "Profile":
        form, T = model.form, hood.T
        high = [max((values[u] for u in hood.stage_u[s]), default=0) for s in range(T)]
        per = [0] * T
        if model.peak is None:
            for (s, i) in best.R:
                if s != form.ix.first[i] and s < T:
                    per[s] += form.int_cost[i]
            for (s, i) in best.P:
                per[s] += form.int_transfer[i]
        elif values[hood.peak] > model.peak_floor:
            per = [int(h >= values[hood.peak]) for h in high]
        pays, before, after = [0], [0], [0] * (T + 1)
        for s in range(T):
            pays.append(pays[-1] + per[s])
            before.append(max(before[-1], high[s]))
        for s in reversed(range(T)):
            after[s] = max(after[s + 1], high[s])
        return cls(pays, before, after)

    def may_improve(self, model: Model, a: int, b: int) -> bool:
        """Whether stages ``a .. b-1`` can lower the objective with the rest
        fixed: overhead, if the incumbent pays inside them; peak, if every
        stage at the peak lies inside them (and the peak is above its floor)."""
        inside = self.pays[b] - self.pays[a]
        return inside > 0 if model.peak is None else inside > 0 and inside == self.pays[-1]

    def high_outside(self, a: int, b: int) -> int:
        """The highest memory at a slot outside stages ``a .. b-1``."""
        return max(self.high_before[a], self.high_from[b])


def replays(model: Model, a: Assignment, budget: int | None) -> bool:
    """Whether ``a``'s plan replays valid in the simulator, within ``budget``."""
    r = simulate(model.form.graph, events(model.form, a))
    return r.valid and (budget is None or r.peak_bytes <= budget)


def _objective(sub: cp_model.CpModel, values: Any) -> int:
    """A window model's objective at ``values`` (its free variables')."""
    obj = sub.proto.objective
    return sum(c * values[v] for v, c in zip(obj.vars, obj.coeffs))


def _solve(sub: cp_model.CpModel, limit: float, workers: int, seed: int, stop: Interrupt | None
           ) -> tuple[str, list[int] | None, float]:
    """One window's search: its status, the free variables' values, seconds."""
    solver = cp_model.CpSolver()
    tune(solver.parameters, max(limit, 0.01), workers, seed, lp_heavy=True)
    began = now()
    with solver_takes_ctrl_c(solver.parameters, stop is not None):
        status = meter().solve(solver, sub)
    if stop is not None and stopped_early(solver, status, limit):
        stop.requested = True
    sol = list(solver.response_proto.solution) if status in (cp_model.OPTIMAL, cp_model.FEASIBLE) else None
    return STATUS.get(status, "UNKNOWN"), sol, now() - began


def wanted(setting: str, model: Model) -> bool:
    """Whether LNS follows a round of ``model`` (``--lns``: auto, on, off)."""
    return setting == "on" or (setting == "auto" and model.variables >= AUTO_VARIABLES)


def round_context(ctx: Context, model: Model) -> Context:
    """The context a round of ``model`` searches in: ``ctx``, its clock
    ending ``lns_share`` of the time left earlier when LNS will follow."""
    if not wanted(ctx.cfg.lns, model):
        return ctx
    return replace(ctx, clock=ctx.clock.until(now() + (1 - ctx.tuning.lns_share) * ctx.left()))


def after_rounds(ctx: Context, done: Round, lower: int | None) -> tuple[Round, dict[str, Any] | None]:
    """LNS from the returned round's best, if it is wanted there and the
    round is neither proven nor at the whole-space bound: the round with
    the better assignment (OPTIMAL, bound and all, when a window covering
    every stage was proven), and the ``lns`` stats (None: not run)."""
    model, best = done.model, done.best
    proven = done.status == cp_model.OPTIMAL or (lower is not None and done.objective <= lower)
    t = ctx.tuning
    deadline = ctx.clock.end - t.lns_margin_s
    if best is None or proven or not wanted(ctx.cfg.lns, model) or now() + t.min_window_s > deadline:
        return done, None
    res = improve(model, best, deadline=deadline, workers=ctx.cfg.workers, seed=ctx.cfg.seed, budget=ctx.cfg.budget,
                  stop=ctx.stop, tuning=t, on_improve=lambda a: ctx.trace.solution(
                      "primary", model.to_units(model.objective_of(a)), None))
    if res.exhausted:
        done = replace(done, status=cp_model.OPTIMAL, searched=cp_model.OPTIMAL, bound=float(res.after))
    return replace(done, best=res.best), res.stats(model)
