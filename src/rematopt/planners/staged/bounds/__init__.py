"""Lower bounds for the whole staged space: one module per bound, and the
one table (:data:`BOUNDS`) that cpsat's run and peak bisection ask
(``docs/cpsat.md``, "Whole-space bounds"). A bound is asked a
:class:`Question` (memory cap or peak, costs in the model's integers) and
answers a :class:`WholeBound` that holds for every staged plan; the stats'
``bound_by`` is the name of the bound that gave ``best_bound``. The studies
ask one bound alone with :func:`bound`, in the objective's units.

| module | bound |
| --- | --- |
| :mod:`.question` | the types every bound shares: :class:`Question` (and the one way to make one), :class:`How`, :class:`WholeBound` |
| :mod:`.gaps` | the gaps relaxation: runs between a value's uses, rows chained (numpy; any size) |
| :mod:`.chains` | chains and slots: the same with recompute producers, and a recompute's slot memory; coarse chains: chains on spread subsets of the stages, coarse to fine |
| :mod:`.solver` | the CP-SAT solve those relaxations share |
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Callable

from ....graph import Graph
from ....reference import no_remat_peak
from ..stages import Stages
from ..units import cost_scale, objective_units
from .chains import chains_bound, coarse_bound
from .gaps import gaps_bound
from .question import How, Question, WholeBound, question

__all__ = ["AFTER", "BOUNDS", "PROBES", "PROOFS", "UP_FRONT", "Bound", "How", "Question", "SpaceBound", "WholeBound",
           "ask", "bound", "question"]


@dataclass(frozen=True)
class Bound:
    """One whole-space bound: its name (what ``bound_by`` says), how it is
    computed, and when a solve asks it: ``up_front`` before any model (it
    must be cheap at every size), ``proof`` between rounds (does any staged
    plan beat the incumbent? is there any at all?), ``after`` the rounds in
    the time they leave (a bound worth a share of the limit), ``probe`` in
    the peak bisection (is there a plan at peak <= P?)."""

    name: str
    compute: Callable[[Graph, Question, How], WholeBound]
    up_front: bool = False
    proof: bool = False
    after: bool = False
    probe: bool = False


BOUNDS: dict[str, Bound] = {b.name: b for b in (
    Bound("gaps", gaps_bound, up_front=True, probe=True),
    Bound("chains", partial(chains_bound, level="chains"), proof=True, probe=True),
    Bound("slots", partial(chains_bound, level="slots"), proof=True, probe=True),
    Bound("coarse chains", coarse_bound, after=True),
)}
UP_FRONT = tuple(name for name, b in BOUNDS.items() if b.up_front)
PROOFS = tuple(name for name, b in BOUNDS.items() if b.proof)
AFTER = tuple(name for name, b in BOUNDS.items() if b.after)
PROBES = tuple(name for name, b in BOUNDS.items() if b.probe)


def ask(graph: Graph, q: Question, name: str, **how: object) -> WholeBound:
    """The bound ``name`` (a key of BOUNDS) of question ``q``, asked as
    ``how`` says (the fields of :class:`How`)."""
    if name not in BOUNDS:
        raise ValueError(f"bound must be one of {tuple(BOUNDS)}, got {name!r}")
    return BOUNDS[name].compute(graph, q, How(**how))


@dataclass(frozen=True)
class SpaceBound:
    """A bound of the staged space in the objective's units: cost units
    (rounding resolution taken off) or bytes."""

    status: str
    value: float | None
    seconds: float


def bound(graph: Graph, budget: int | None, name: str, *, objective: str = "overhead", offload: bool = False,
          transfer_cost_per_byte: float = 0.0, time_limit: float = 5.0, workers: int = 1, seed: int = 0,
          work: float | None = None) -> SpaceBound:
    """The bound ``name`` of every staged plan of ``graph`` (in its program
    order) under ``budget`` bytes (None: the no-remat peak), asked alone,
    as cpsat would ask it at that budget with those settings: what the
    studies compare a run's plans against. ``work``: see :class:`How`."""
    full = Stages(graph, offload)
    scale = cost_scale(graph, full, transfer_cost_per_byte)
    q = question(graph, objective, scale, per_byte=transfer_cost_per_byte, offload=offload,
                 cap_bytes=budget if budget is not None else no_remat_peak(graph))
    r = ask(graph, q, name, time_limit=time_limit, workers=workers, seed=seed, work=work, ix=full)
    return SpaceBound(r.status, objective_units(graph, objective, scale, q.unit, r.bound), r.seconds)
