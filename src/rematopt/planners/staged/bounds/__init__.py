"""Lower bounds for the whole staged space: one module per bound, and the
one table (:data:`BOUNDS`) that run.py, peak.py and max-batch ask
(``docs/cpsat.md``, "Whole-space bounds"). A bound is asked a
:class:`Question` (memory cap or peak, costs in the model's integers) and
answers a :class:`WholeBound` that holds for every staged plan; the stats'
``bound_by`` is the name of the bound that gave ``best_bound``.

| module | bound |
| --- | --- |
| :mod:`.question` | the types every bound shares: :class:`Question`, :class:`How`, :class:`WholeBound` |
| :mod:`.gaps` | the gaps relaxation: runs between a value's uses, rows chained (numpy; any size) |
| :mod:`.chains` | chains and slots: the same with recompute producers, and a recompute's slot memory; coarse chains: chains on spread subsets of the stages, coarse to fine |
| :mod:`.solver` | the CP-SAT solve those relaxations share |
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Callable

from ....graph import Graph
from .chains import chains_bound, coarse_bound
from .gaps import gaps_bound
from .question import How, Question, WholeBound

__all__ = ["AFTER", "BOUNDS", "PROBES", "PROOFS", "UP_FRONT", "Bound", "How", "Question", "WholeBound", "ask"]


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
