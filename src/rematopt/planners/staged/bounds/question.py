"""What every whole-space bound is asked (:class:`Question`) and what it
answers (:class:`WholeBound`), in the model's integers: the types that
run.py, peak.py and every bound share, kept apart so that no bound
imports another to read them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..model import Stages


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


@dataclass(frozen=True)
class How:
    """How a bound is asked. ``below`` asks only whether a solution of
    objective at most ``below`` exists (the search stops at the first one):
    INFEASIBLE then says that no staged plan does as well. ``interruptible``
    lets Ctrl-C stop the search (main thread only, see
    :func:`~..signals.solver_takes_ctrl_c`). ``ix``: the full staged space's
    :class:`Stages` when at hand."""

    below: int | None = None
    time_limit: float = 5.0
    workers: int = 1
    seed: int = 0
    interruptible: bool = False
    ix: Stages | None = None
