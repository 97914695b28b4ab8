"""What every whole-space bound is asked (:class:`Question`, made by
:func:`question`) and what it answers (:class:`WholeBound`), in the
model's integers: the types that cpsat and every bound share, kept apart
so that no bound imports another to read them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ....graph import Graph
from ..units import Scale, cap_units, int_costs, memory_unit, peak_floor_units, proof_overhead_cap

if TYPE_CHECKING:
    from ..stages import Stages


@dataclass(frozen=True)
class Question:
    """What every bound of one solve is asked about, in the model's
    integers: memory in ``unit`` bytes with persistent bytes aside, as in
    :class:`Formulation`; ``int_cost`` / ``int_transfer`` no higher than the
    model's (floored when the cost scale is inexact, so the optimum stays a
    bound). ``objective`` "overhead" minimises the cost under ``cap_units``;
    "peak" minimises the largest critical memory (at least ``peak_floor``),
    with the cost under ``overhead_cap``."""

    objective: str
    unit: int
    cap_units: int
    int_cost: tuple[int, ...]
    int_transfer: tuple[int, ...]
    offload: bool
    overhead_cap: int | None = None
    max_recomputes: int | None = None
    peak_floor: int = 0


@dataclass
class WholeBound:
    """A bound's verdict on the whole staged space, in model integers (cost x
    scale, or memory units)."""

    status: str  # OPTIMAL, FEASIBLE (bound only), INFEASIBLE, UNKNOWN, SKIPPED (too big to build)
    bound: int | None  # also after UNKNOWN: the search's bound so far
    seconds: float
    interrupted: bool = False  # stopped by Ctrl-C (``interruptible`` only)
    work: float = 0.0  # CP-SAT's deterministic time spent (see :attr:`How.work`)


@dataclass(frozen=True)
class How:
    """How a bound is asked. ``below`` asks only whether a solution of
    objective at most ``below`` exists (the search stops at the first one):
    INFEASIBLE then says that no staged plan does as well. ``interruptible``
    lets Ctrl-C stop the search (main thread only, see
    :func:`~..signals.solver_takes_ctrl_c`). ``ix``: the full staged space's
    :class:`Stages` when at hand. ``work``: CP-SAT's deterministic time
    (``max_deterministic_time``, summed over the bound's solves) the bound
    may spend, so that it reaches the same value on a loaded machine as on
    an idle one, given the time (``time_limit`` still stops it); None: the
    time limit alone."""

    below: int | None = None
    time_limit: float = 5.0
    work: float | None = None
    workers: int = 1
    seed: int = 0
    interruptible: bool = False
    ix: Stages | None = None


def question(graph: Graph, objective: str, scale: Scale, *, per_byte: float, offload: bool,
             cap_bytes: int | None = None, max_overhead: float | None = None,
             max_recomputes: int | None = None) -> Question:
    """The one way a :class:`Question` is made: ``objective`` under
    ``cap_bytes`` (None: 0 units, as a peak question has it), in the integers
    of the model :func:`..model.build` makes at ``scale`` (costs floored
    when the scale is inexact, so the optimum stays a bound on the costs the
    model optimises), the overhead cap (``max_overhead`` x base cost) as a
    proof must read it (:func:`..units.proof_overhead_cap`). Known before
    any model is built, so a bound is there even when none is built in time."""
    unit = memory_unit(graph)[0]
    cost, transfer = int_costs(graph, scale.scale, per_byte, floor=not scale.exact)
    cap = proof_overhead_cap(graph, scale, max_overhead)
    return Question(objective, unit, 0 if cap_bytes is None else cap_units(graph, unit, cap_bytes), cost, transfer,
                    offload, cap, max_recomputes, peak_floor_units(graph, unit, up=False))
