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

from ...graph import Graph
from ...plan import Plan
from ...reference import peak_lower_bound
from ...simulate import simulate
from ...stats import Stats
from ..meter import now
from ..staged.bounds import AFTER, PROBES, Question, ask
from ..staged.units import memory_unit
from .clock import Clock
from .search import Context
from .signals import Trace
from .verdict import Bound, Source, reaching, verdict

# "Any plan at all" to a relaxation (as run.ANY_PLAN).
ANY_PLAN = 2**60


@dataclass(frozen=True)
class Probe:
    """One decision: is there a staged plan whose peak is at most ``cap_bytes``?
    ``verdict`` "yes" (a plan of ``peak_bytes``), "no" (proved by ``by``) or
    "unknown"; ``bound_bytes`` is the lower bound the probe proved either way."""

    cap_bytes: int
    verdict: str
    by: str | None  # "no": the Source that proved it; "yes": where the plan was found
    peak_bytes: int | None
    bound_bytes: int | None
    seconds: float
    elapsed_s: float


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


def run(ctx: Context, rounds: Callable[[Context], Plan], admit: Callable[..., Any]) -> Plan:
    """The peak run: ``rounds`` (run._run) for ``peak_rounds_share`` of the
    limit (:mod:`.tuning`), then the bisection for the rest, from the rounds'
    plan and bound. ``admit`` (run.admit) says whether a plan honours every setting."""
    cfg, g, t = ctx.cfg, ctx.graph, ctx.tuning
    first = rounds(replace(ctx, clock=ctx.clock.until(ctx.clock.at(t.peak_rounds_share))))
    if first.stats.get("peak_bytes") is None:
        return first
    u = Units(memory_unit(g)[0], g.persistent_bytes)
    lo_bytes, by = initial_bound(g, first.stats)
    best, hi_bytes = first, first.stats["peak_bytes"]
    asked = after_bounds(ctx, u, hi_bytes, lo_bytes, t.peak_after_share * ctx.left())
    for level, status, seconds, bound in asked:
        if bound is not None and bound > lo_bytes:
            lo_bytes, by = bound, Source(level)
    probes: list[Probe] = []
    q0 = ctx.question("overhead", None)  # the cap set per probe
    lo, top = u.of_bound(lo_bytes), u.of_cap(hi_bytes - 1)
    while lo <= top and ctx.left() > 0.5 and not ctx.stop.requested and u.bytes(lo) < hi_bytes:
        cap = (lo + top) // 2
        limit = min(ctx.left(), max(t.min_probe_s, t.probe_share * ctx.left()))
        probe, found = decide(ctx, q0, u, cap, limit, rounds, admit)
        probes.append(probe)
        if probe.bound_bytes is not None and u.of_bound(probe.bound_bytes) > lo:
            lo = u.of_bound(probe.bound_bytes)
            lo_bytes, by = u.bytes(lo), probe.by
        if found is not None and probe.peak_bytes < hi_bytes:
            best, hi_bytes = found, probe.peak_bytes
        if probe.verdict == "yes":
            top = min(top, u.of_cap(hi_bytes - 1))
        elif probe.verdict == "unknown":
            top = cap - 1
    if best is not first:
        restate(best, first)
    if asked:
        best.stats = Stats.from_dict({**best.stats, "relaxation_proofs": [
            *best.stats.get("relaxation_proofs", []),
            *({"level": lv, "below": None, "status": st, "seconds": sec, "bound": b} for lv, st, sec, b in asked)]})
    if cfg.log_path:
        ctx.trace.write(cfg.log_path)
    return finish(best, lo_bytes, by, probes)


def after_bounds(ctx: Context, u: Units, peak: int, lower: int, limit: float
                 ) -> list[tuple[str, str, float, int | None]]:
    """The bounds asked after the rounds (:data:`bounds.AFTER`), each
    minimising the peak directly within the overhead and clone caps, in
    ``limit`` seconds between them, unless the rounds' ``peak`` already
    meets their ``lower`` bound: (name, status, seconds, bound in bytes).
    random_layered_n100 within 10% overhead: the coarse chains' 27,188 B
    in 30 s, where the bisection's probes reached 26,463 B."""
    if peak <= lower or limit < 0.5:
        return []
    g, cfg = ctx.graph, ctx.cfg
    q = ctx.question("peak", None)
    deadline = now() + limit
    found = []
    for level in AFTER:
        r = ask(g, q, level, workers=cfg.workers, seed=cfg.seed, time_limit=deadline - now(),
                interruptible=True)
        found.append((level, r.status, r.seconds, None if r.bound is None else u.bytes(r.bound)))
        if r.interrupted:
            ctx.stop.requested = True
            break
    return found


def initial_bound(g: Graph, st: dict[str, Any]) -> tuple[int, Source]:
    """The rounds' lower bound (bytes) and what proved it: the working set,
    the gaps relaxation, a chains or slots proof, or the full model."""
    found = [(peak_lower_bound(g), Source.WORKING_SET)]
    relax = st.get("gap_relaxation") or {}
    if relax.get("bound") is not None:
        found.append((relax["bound"], Source.GAPS))
    found += [(p["bound"], Source(p["level"])) for p in st.get("relaxation_proofs", []) if p.get("bound") is not None]
    b, name = max(found, key=lambda x: x[0])
    if st.get("best_bound") is not None and st["best_bound"] > b:
        return math.ceil(st["best_bound"]), Source.MODEL
    return math.ceil(b), name


def decide(ctx: Context, q0: Question, u: Units, cap: int, limit: float, rounds: Callable[[Context], Plan],
           admit: Callable[..., Any]) -> tuple[Probe, Plan | None]:
    """Is there a plan at peak <= ``cap`` units? The relaxations first (an
    infeasible one, or one whose cost bound passes the overhead cap, says no
    for the whole staged space), then the overhead search at that budget
    (``rounds`` with the budget ``cap``, its own warm start, depths and
    proofs): a plan within the caps says yes; its INFEASIBLE, or a
    whole-space cost bound above the overhead cap, says no."""
    began = now()
    deadline = began + limit
    cfg, g, q = ctx.cfg, ctx.graph, replace(q0, cap_units=cap)
    below = q0.overhead_cap if q0.overhead_cap is not None else ANY_PLAN

    def probe(verdict: str, by: str | None, peak: int | None = None, bound: int | None = None) -> Probe:
        return Probe(u.bytes(cap), verdict, by, peak, bound, now() - began, ctx.elapsed())

    for level in PROBES:
        r = ask(g, q, level, below=below, workers=cfg.workers, seed=cfg.seed,
                time_limit=min(deadline - now(), ctx.tuning.probe_level_share[level] * limit),
                interruptible=True)
        if r.interrupted:
            ctx.stop.requested = True
            return probe("unknown", None), None
        if r.status == "INFEASIBLE" or (r.bound is not None and r.bound > below):
            return probe("no", Source(level), bound=u.bytes(cap + 1)), None
        if r.status == "SKIPPED":
            break
    left = deadline - now()
    if left < 0.5:
        return probe("unknown", None), None
    clock = Clock.starting_now(left)
    sub = replace(ctx, clock=clock, trace=Trace(time.perf_counter()),
                  cfg=replace(cfg, objective="overhead", budget=u.bytes(cap), max_overhead=None, lp_bound=False,
                              log_path=None, progress=False, export_model=None))
    found = rounds(sub)
    st = found.stats
    if st.get("peak_bytes") is not None:
        r = simulate(g, found)
        if admit(ctx, found, r, "peak bisection") is not None:
            found.stats = Stats.from_dict({**found.stats, "objective": r.peak_bytes, "objective_kind": "peak"})
            where = f"{st['plan_from']}'s plan" if st.get("plan_from") else st.get("space")
            return probe("yes", where, peak=r.peak_bytes), found
    if st["status"] == "INFEASIBLE":  # the staged space empty at that budget: proved by a relaxation, or the model
        by = Source(st["proved_by"])
        return probe("no", by if by in PROBES else Source.MODEL, bound=u.bytes(cap + 1)), None
    cap_cost = None if cfg.max_overhead is None else cfg.max_overhead * sum(g.cost[i] for i in g.compute_ids)
    if cap_cost is not None and st.get("best_bound") is not None and st["best_bound"] > cap_cost * (1 + 1e-9):
        return probe("no", Source.MODEL, bound=u.bytes(cap + 1)), None
    return probe("unknown", None), None


def restate(p: Plan, first: Plan) -> None:
    """A probe's plan (from an overhead search under a budget) with the
    peak run's stats: the rounds' record, and the plan's own figures."""
    own = {k: p.stats[k] for k in ("peak_bytes", "compute_cost", "transfer_bytes", "compute_events",
                                   "recompute_events", "space", "plan_from") if p.stats.get(k) is not None}
    d = {k: v for k, v in first.stats.items()
         if k not in ("plan_from", "reason", "space_bound", "space_gap", "space_status")}
    d.update(own, objective=own["peak_bytes"], warm_start="peak bisection", lexicographic=False,
             secondary_status=None)
    p.stats = Stats.from_dict(d)


def finish(p: Plan, lo_bytes: int, by: Source, probes: list[Probe]) -> Plan:
    """Status, bound and gap from the bisection's bound (``bound_by`` names
    what proved it: the working set, a relaxation, or the model), and the probes."""
    st = {k: v for k, v in p.stats.items() if k != "proved_by"}
    bound = Bound(lo_bytes, by)
    st.update(verdict(st["peak_bytes"], [bound], reaching(st["peak_bytes"], bound)).stats(),
              peak_probes=[asdict(x) for x in probes])
    p.stats = Stats.from_dict(st)
    return p
