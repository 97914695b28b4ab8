"""``rotor``: Rotor's dynamic program over the model's chain of layers
(Beaumont et al. 2019), with each layer's options solved once per kind
(Rockmate, Zhao et al. 2023). docs/rotor.md says what it does and measures.

The chain: the repeated blocks :func:`~rematopt.blocks.find_blocks` finds,
with the embedding and its gradient as stage 0 and the head and loss as the
last stage (:func:`.chain.from_table`); without a block table (or where the
blocks do not form a chain), the finest chain the graph's edges allow
(:func:`.chain.from_graph`: a pure chain is one node a stage, and then
``rotor`` is Rotor). A graph that is no chain at all is refused
(NotApplicable).

Each stage's options are backward sequences (:mod:`.options`): Rotor's two
(keep everything the backward reads, or nothing) and, for stages of more than
one forward node, CP-SAT's cheapest backward at several caps on the bytes
kept, solved on one stage of each kind. The DP (:mod:`.dp`) picks a plan made
of pieces whose memory is exact, so the replay gives the figures it claims.
Its plans are staged: cpsat takes them as a warm start.
"""

from __future__ import annotations

import os
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
from ..meter import now
from ..options import option, parse
from . import options as stage_options
from .chain import Chain, from_graph, from_table
from .dp import Pieces, Result, solve

# The stages' CP-SAT options get this share of the time limit, and at most
# this long per node of the graph: a small graph's stages are one or two
# nodes, where Rotor's two options are all there are (and the fuzz runs
# every planner on thousands of them).
OPTIONS_SHARE = 0.6
OPTIONS_S_PER_NODE = 0.01
# Memory slots of the DP: on gpt48's chain 4,000 slots give the same plans
# as 1,000 at 0.8 and 0.6.
SLOTS = 1000
# The DP's work is about L x window^2 x SLOTS: with this much (about 3 s),
# the window is the whole chain up to 50 stages (exact Rotor), 39 at 96, 17
# at 480 (a split's first segment is at most that long).
DP_WORK = 1.5e8


def window_for(stages: int) -> int | None:
    """The longest first segment of a split the DP tries (None: any)."""
    w = int((DP_WORK / (stages * SLOTS)) ** 0.5)
    return None if w > stages else max(4, w)


@dataclass(frozen=True)
class Options:
    time_limit: float = option(30.0, "seconds: the stages' CP-SAT options get 60% of it (10 ms a node at most), "
                               "and past that Rotor's two options only.", minimum=0)
    workers: int = option(0, "CP-SAT threads for the stages' options (default: all cores).", minimum=0)


def chain_of(graph: Graph) -> Chain:
    """The block chain when the graph's blocks form one, else the finest chain."""
    table = find_blocks(graph)
    if table is not None:
        try:
            return from_table(graph, table)
        except NotApplicable:
            pass
    return from_graph(graph)


def stage_options_of(chain: Chain, deadline: float, workers: int, around: float | None = None) -> list[list]:
    """Every stage's options: Rotor's two, plus CP-SAT's for one stage of
    each kind with more than one forward node, carried to the others
    (``around``: the share of its residuals a stage may keep, roughly, at
    the budget: those caps first)."""
    g = chain.graph
    L = chain.length
    out = [stage_options.extremes(g, s) for s in chain.stages[:L]]
    by_kind: dict = {}
    for k, s in enumerate(chain.stages[:L]):
        if len(s.forward) > 1 and s.backward:
            by_kind.setdefault(s.kind if s.kind is not None else ("stage", k), []).append(k)
    # the most repeated kinds first (their options pay the most), each a share of the time left
    # in proportion to its stages
    kinds = sorted(by_kind.values(), key=len, reverse=True)
    for n, ks in enumerate(kinds):
        at = now()
        if at > deadline:
            break
        rep = ks[len(ks) // 2]
        share = len(ks) / sum(len(x) for x in kinds[n:])
        solved = stage_options.solved(chain, rep, at + (deadline - at) * share, workers, around=around)
        for k in ks:
            out[k] = out[k] + stage_options.for_kind(chain, rep, solved, k)
    return out


def kept_share(chain: Chain, budget: int) -> float:
    """About the share of the stages' residuals (forward values their
    backward reads) the budget lets them keep, all dropping alike."""
    g = chain.graph
    residual = sum(g.bytes[v] for s in chain.stages[:chain.length] for v in s.forward
                   if any(c in s.backward for c in g.succs[v]))
    excess = no_remat_peak(g) - budget
    return min(1.0, max(0.0, 1 - excess / residual)) if residual else 1.0


def plan(graph: Graph, budget: int | None, options: dict[str, Any]) -> Plan:
    opts = parse(Options, options, "rotor")
    start = time.perf_counter()
    chain = chain_of(graph)
    cap = no_remat_peak(graph) if budget is None else budget
    opt_deadline = now() + min(OPTIONS_SHARE * opts.time_limit, OPTIONS_S_PER_NODE * graph.n)
    workers = opts.workers or os.cpu_count() or 1
    pieces = Pieces(chain, stage_options_of(chain, opt_deadline, workers, kept_share(chain, cap)))
    window = window_for(chain.length + 1)
    result = solve(pieces, cap, SLOTS, window)
    details = {"stages": chain.length, "kinds": len({s.kind for s in chain.stages if s.kind is not None}),
               "options": sum(len(o) for o in pieces.options), "window": window,
               "seconds": round(time.perf_counter() - start, 3)}
    if result is None:  # no chain plan within the budget: the cheapest one whatever its peak (twice
        # all the bytes, in slots fine enough that rounding up each piece cannot lose it)
        result = solve(pieces, 2 * sum(graph.bytes), SLOTS + 4 * len(chain.stages), window)
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
