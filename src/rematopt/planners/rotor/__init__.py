"""``rotor``: Rotor's dynamic program over the model's chain of layers
(Beaumont et al. 2019), with each layer's options solved once per kind
(Rockmate, Zhao et al. 2023).

The chain: the repeated blocks :func:`~rematopt.blocks.find_blocks` finds,
with the embedding and its gradient as stage 0 and the head and loss as the
turn (:func:`.chain.from_table`); without a block table (or where the blocks
do not form a chain), the finest chain the graph's edges allow
(:func:`.chain.from_graph`: a pure chain is one node a stage). A graph that
is no chain at all is refused (NotApplicable).

Each stage's options are backward sequences (:mod:`.options`): Rotor's two
(keep everything the backward reads, or nothing) and, for stages of more than
one forward node, CP-SAT's cheapest backward at several caps on the bytes
kept, solved on one stage of each kind within ``time_limit``. The DP
(:mod:`.dp`) picks a plan; its peak and cost are exact, and the plan's frees
are :func:`~rematopt.planners.frees.place_frees`'s, so the replay gives the
same figures. Its plans are staged: cpsat takes them as a warm start.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from ...blocks import find_blocks
from ...errors import NotApplicable
from ...graph import Graph
from ...plan import Plan, PlanBuilder
from ...reference import no_remat_peak
from ...simulate import cost_of_counts
from ...stats import Stats
from ..options import option, parse
from . import options as stage_options
from .chain import Chain, from_graph, from_table
from .dp import Pieces, Result, solve

# Memory slots of the DP: gpt48's chain at 0.8 loses 0.3% of its overhead
# to rounding at 1,000 slots, and the table takes about a second.
SLOTS = 1000
# The DP keeps O(L x window) states: exact Rotor up to this many stages,
# segments of at most this many stages beyond (480 stages: seconds).
WINDOW = 64


@dataclass(frozen=True)
class Options:
    time_limit: float = option(30.0, "seconds for the stages' options (CP-SAT) and the DP; past it, Rotor's "
                               "two options only.", minimum=0)
    workers: int = option(1, "CP-SAT threads for the stages' options.", minimum=1)


def chain_of(graph: Graph) -> Chain:
    """The block chain when the graph's blocks form one, else the finest chain."""
    table = find_blocks(graph)
    if table is not None:
        try:
            return from_table(graph, table)
        except NotApplicable:
            pass
    return from_graph(graph)


def stage_options_of(chain: Chain, deadline: float, workers: int) -> list[list]:
    """Every stage's options: Rotor's two, plus CP-SAT's for one stage of
    each kind with more than one forward node, carried to the others."""
    g = chain.graph
    L = chain.length
    out = [stage_options.extremes(g, s) for s in chain.stages[:L]]
    by_kind: dict = {}
    for k, s in enumerate(chain.stages[:L]):
        if len(s.forward) > 1 and s.backward:
            by_kind.setdefault(s.kind if s.kind is not None else ("stage", k), []).append(k)
    # the most repeated kinds first (their options pay the most), each an equal share of the time left
    kinds = sorted(by_kind.values(), key=len, reverse=True)
    for n, ks in enumerate(kinds):
        now = time.perf_counter()
        if now > deadline:
            break
        rep = ks[len(ks) // 2]
        solved = stage_options.solved(chain, rep, now + (deadline - now) / (len(kinds) - n), workers)
        for k in ks:
            out[k] = out[k] + stage_options.for_kind(chain, rep, solved, k)
    return out


def plan(graph: Graph, budget: int | None, options: dict[str, Any]) -> Plan:
    opts = parse(Options, options, "rotor")
    start = time.perf_counter()
    chain = chain_of(graph)
    cap = no_remat_peak(graph) if budget is None else budget
    opt_deadline = start + 0.6 * opts.time_limit
    pieces = Pieces(chain, stage_options_of(chain, opt_deadline, opts.workers))
    window = None if chain.length <= WINDOW else WINDOW
    result = solve(pieces, cap, SLOTS, window)
    details = {"stages": chain.length, "kinds": len({s.kind for s in chain.stages if s.kind is not None}),
               "options": sum(len(o) for o in pieces.options), "window": window,
               "seconds": round(time.perf_counter() - start, 3)}
    if result is None:  # no chain plan within the budget: the cheapest plan whatever its peak
        result = solve(pieces, max(cap, no_remat_peak(graph)), SLOTS, window)
        details["fits"] = False
    return to_plan(graph, chain, result, budget, details)


def to_plan(graph: Graph, chain: Chain, result: Result, budget: int | None, details: dict | None = None) -> Plan:
    """The events of the DP's pieces, claiming the DP's own figures (the
    replay must give them exactly)."""
    b = PlanBuilder()
    for i in sorted(chain.dead):
        b.free(i)
    counts = [0] * graph.n
    for piece in result.pieces:
        piece.emit(graph, b)
        for v in piece.seq:
            counts[v] += 1
    status = "FEASIBLE" if budget is None or result.peak <= budget else "OVER_BUDGET"
    stats = Stats(status=status, peak_bytes=result.peak, compute_cost=cost_of_counts(graph, counts), transfer_bytes=0,
                  details={"recomputes": sum(counts) - len(graph.compute_ids), **(details or {})})
    return b.build(graph.name, "rotor", stats)
