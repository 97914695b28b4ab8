"""Peak mode that proves its answers: after the usual rounds (which minimise
the peak directly and leave the bound at the working set or the gaps
relaxation's), the decision version "is there a staged plan at peak <= P
(within the overhead and clone caps)?" is searched by bisection between the
best lower bound and the incumbent. A probe asks the relaxations at cap P
(gaps, chains, slots: an infeasible one shows that no staged plan fits) and
then the staged model with its peak variable capped at P (a plan lowers the
incumbent; infeasibility, or the search's bound, raises the lower bound).
Every "no" raises the bound, every "yes" lowers the incumbent; an undecided
probe moves the next one down, where "no" is easier to show.
``bound_by`` says which mechanism proved the final bound."""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, replace
from typing import Any, Callable

from ortools.sat.python import cp_model

from ...plan import Plan
from ...reference import peak_lower_bound
from ...simulate import cost_of_counts
from .model import Model, Stages, memory_unit, overhead_cap_units
from .relaxations import LEVELS, Question, relaxation_bound
from .report import gap
from .search import Context, make_model, solve_model
from .settings import max_recomputes
from .solution import Assignment, events, from_plan
from .strategy import FULL_MODEL_PAIRS

# The usual rounds get this share of the limit, the bisection the rest
# (random_layered_n100: the rounds' best peak comes within the first 15 s of 60).
ROUNDS_SHARE = 0.4
# A probe gets this share of the time left, at least MIN_PROBE_S: about
# five probes, the later ones with more time, where the answer is harder.
PROBE_SHARE = 0.3
MIN_PROBE_S = 2.0
# Shares of a probe's time the relaxations may take (each stops at its first
# solution, so a feasible one returns at once); the model gets the rest.
LEVEL_SHARE = {"gaps": 0.1, "chains": 0.2, "slots": 0.2}
# The full staged model is a probe's model up to this many (stage, value)
# pairs (mobilenet_train's 17,000 build in about 3 s); beyond, depth 1,
# which finds plans but proves nothing about the whole space.
PROBE_FULL_PAIRS = 20_000
# "Any plan at all" to a relaxation (as run.ANY_PLAN).
ANY_PLAN = 2**60


@dataclass(frozen=True)
class Probe:
    """One decision: is there a staged plan whose peak is at most ``cap_bytes``?
    ``verdict`` "yes" (a plan of ``peak_bytes``), "no" (proved by ``by``) or
    "unknown"; ``bound_bytes`` is the lower bound the probe proved either way."""

    cap_bytes: int
    verdict: str
    by: str | None
    peak_bytes: int | None
    bound_bytes: int | None
    seconds: float
    elapsed_s: float


@dataclass(frozen=True)
class Space:
    """Where the probes search: the staged model minimising the peak, built
    once (each probe caps the peak variable's domain). ``proves``: its "no"
    holds for the space the run speaks of (the full staged space, or the
    ``--recompute-depth`` one)."""

    model: Model
    proves: bool
    name: str


@dataclass(frozen=True)
class Units:
    """Memory in model units (persistent bytes aside) and back."""

    unit: int
    persistent: int

    def of_cap(self, b: int) -> int:
        """The largest unit count whose bytes are at most ``b``."""
        return (b - self.persistent) // self.unit

    def of_bound(self, b: float) -> int:
        """The smallest unit count whose bytes are at least ``b``."""
        return max(0, math.ceil((b - self.persistent) / self.unit - 1e-9))

    def bytes(self, u: int) -> int:
        return u * self.unit + self.persistent


def run(ctx: Context, rounds: Callable[[Context], Plan]) -> Plan:
    """The peak run: ``rounds`` (run._run) for ROUNDS_SHARE of the limit,
    then the bisection for the rest, from the rounds' plan and bound."""
    cfg, g = ctx.cfg, ctx.graph
    first = rounds(replace(ctx, cfg=replace(cfg, time_limit=ROUNDS_SHARE * cfg.time_limit)))
    st = first.stats
    if first.stats.get("peak_bytes") is None:
        return first
    u = Units(memory_unit(g), sum(v.bytes for v in g.nodes if v.persistent))
    lo_bytes, by = initial_bound(g, st)
    best: tuple[Space, Assignment] | None = None
    hi_bytes = st["peak_bytes"]
    probes: list[Probe] = []
    space: Space | None = None
    q0 = question(ctx, u)
    lo, top = u.of_bound(lo_bytes), u.of_cap(hi_bytes - 1)
    while lo <= top and ctx.left() > 0.5 and not ctx.stop.requested and u.bytes(lo) < hi_bytes:
        if space is None:
            space = probe_space(ctx)
        cap = (lo + top) // 2
        hint = (best[1] if best is not None and best[0] is space else
                from_plan(space.model.form, first) if len(first.ops) else None)
        probe, found = decide(ctx, space, q0, u, cap, min(ctx.left(), max(MIN_PROBE_S, PROBE_SHARE * ctx.left())),
                              hint)
        probes.append(probe)
        if probe.bound_bytes is not None and u.of_bound(probe.bound_bytes) > lo:
            lo = u.of_bound(probe.bound_bytes)
            lo_bytes, by = u.bytes(lo), probe.by
        if found is not None and probe.peak_bytes < hi_bytes:
            best, hi_bytes = (space, found), probe.peak_bytes
        if probe.verdict == "yes":
            top = min(top, u.of_cap(hi_bytes - 1))
        elif probe.verdict == "unknown":
            top = cap - 1
    out = first if best is None else plan_of(ctx, best[0], best[1], first)
    if cfg.log_path:
        ctx.trace.write(cfg.log_path)
    return finish(out, lo_bytes, by, probes)


def initial_bound(g, st: dict[str, Any]) -> tuple[int, str]:
    """The rounds' lower bound (bytes) and what proved it: the working set,
    the gaps relaxation, a chains or slots proof, or the full model."""
    found = [(peak_lower_bound(g), "working set")]
    relax = st.get("gap_relaxation") or {}
    if relax.get("bound") is not None:
        found.append((relax["bound"], "gaps"))
    found += [(p["bound"], p["level"]) for p in st.get("relaxation_proofs", []) if p.get("bound") is not None]
    b, name = max(found, key=lambda x: x[0])
    if st.get("best_bound") is not None and st["best_bound"] > b:
        return math.ceil(st["best_bound"]), "model"
    return math.ceil(b), name


def question(ctx: Context, u: Units) -> Question:
    """What the relaxations are asked at a cap (``cap_units`` set per probe):
    any plan within the overhead and clone caps, in the model's integers
    (costs floored when the scale is inexact, so the relaxation stays one)."""
    g, cfg = ctx.graph, ctx.cfg
    exact = [round(c * ctx.scale) for c in g.cost]
    cost = exact if ctx.exact else [int(c * ctx.scale // 1) for c in g.cost]
    per_byte = cfg.transfer_cost_per_byte * ctx.scale
    transfer = [round(b * per_byte) if ctx.exact else int(b * per_byte // 1) for b in g.bytes]
    cap = None if cfg.max_overhead is None else overhead_cap_units(exact, g, cfg.max_overhead)
    return Question("overhead", u.unit, 0, tuple(cost), tuple(transfer), cfg.offload, cap,
                    max_recomputes(cfg, len(g.compute_ids)), 0)


def probe_space(ctx: Context) -> Space:
    """The full staged model when it is small enough to build and prove in a
    probe's time, else depth 1 (plans only); ``--recompute-depth`` N: depth N."""
    cfg, full = ctx.cfg, ctx.full
    if cfg.depth is not None:
        depth = None if cfg.depth == "full" else cfg.depth
        return Space(make_model(ctx, depth, None), True, "staged" if depth is None else f"depth {depth}")
    pairs = sum(len(full.stages(i)) for i in full.values)
    if pairs <= max(PROBE_FULL_PAIRS, FULL_MODEL_PAIRS):
        return Space(make_model(ctx, None, None), True, "staged")
    return Space(make_model(ctx, 1, None), False, "depth 1")


def decide(ctx: Context, space: Space, q0: Question, u: Units, cap: int, limit: float,
           hint: Assignment | None) -> tuple[Probe, Assignment | None]:
    """Is there a plan at peak <= ``cap`` units? The relaxations first (an
    infeasible one, or one whose cost bound passes the overhead cap, says
    no for the whole staged space), then the space's model with the peak
    variable's domain capped: a plan says yes; infeasibility says no where
    the space ``proves``, and the search's bound b proves min(b, cap + 1)."""
    began = time.perf_counter()
    deadline = began + limit
    cfg, q = ctx.cfg, replace(q0, cap_units=cap)
    below = q0.overhead_cap if q0.overhead_cap is not None else ANY_PLAN

    def probe(verdict: str, by: str | None, peak: int | None = None, bound: int | None = None) -> Probe:
        return Probe(u.bytes(cap), verdict, by, peak, bound, time.perf_counter() - began, ctx.elapsed())

    for level in LEVELS:
        r = relaxation_bound(ctx.graph, q, level=level, below=below, workers=cfg.workers, seed=cfg.seed,
                             time_limit=min(deadline - time.perf_counter(), LEVEL_SHARE[level] * limit),
                             interruptible=True)
        if r.interrupted:
            ctx.stop.requested = True
            return probe("unknown", None), None
        if r.status == "INFEASIBLE" or (r.bound is not None and r.bound > below):
            return probe("no", level, bound=u.bytes(cap + 1)), None
        if r.status == "SKIPPED":
            break
    m = space.model
    left = deadline - time.perf_counter()
    if left < 0.05:
        return probe("unknown", None), None
    proto = m.backend.model.proto
    domain = proto.variables[m.peak.index].domain  # one interval [floor, top], as built
    domain[0], domain[1] = m.peak_floor, max(cap, m.peak_floor)
    m.backend.model.clear_hints()
    if hint is not None:
        m.hint(hint)
    r = solve_model(ctx, m, "fit", left, stop_at=cap)
    if r.values is not None:
        a = Assignment.from_values(m.form, lambda v: r.values[v.index])
        return probe("yes", space.name, peak=a.peak_bytes(m.form)), a
    if not space.proves:
        return probe("unknown", None), None
    if r.status == cp_model.INFEASIBLE:
        return probe("no", "model", bound=u.bytes(cap + 1)), None
    if not math.isfinite(r.bound) or r.bound <= m.peak_floor:
        return probe("unknown", None), None
    return probe("unknown", "model", bound=u.bytes(min(math.ceil(r.bound - 1e-6), cap + 1))), None


def plan_of(ctx: Context, space: Space, a: Assignment, first: Plan) -> Plan:
    """The plan of a probe's assignment, with the rounds' stats brought up to date."""
    g, form = ctx.graph, space.model.form
    p = events(form, a)
    p.stats.update({k: v for k, v in first.stats.items() if k not in ("plan_from", "reason")})
    peak = a.peak_bytes(form)
    p.stats.update(objective=peak, peak_bytes=peak, compute_cost=cost_of_counts(g, a.counts(form)),
                   transfer_bytes=a.transfer_bytes(form), compute_events=len(a.R),
                   recompute_events=len(a.R) - len(g.compute_ids), space=space.name, space_status="FEASIBLE",
                   warm_start="peak bisection", lexicographic=False, secondary_status=None)
    return p


def finish(p: Plan, lo_bytes: int, by: str, probes: list[Probe]) -> Plan:
    """Status, bound and gap from the bisection's bound (``bound_by`` names
    what proved it: the working set, a relaxation, or the model), and the probes."""
    st = p.stats
    peak = st["peak_bytes"]
    bound = min(lo_bytes, peak)
    st.update(best_bound=bound, gap=gap(peak, bound), bound_by=by, peak_probes=[asdict(x) for x in probes],
              status="OPTIMAL" if bound >= peak else "FEASIBLE")
    return p
