"""What a cpsat run may claim, decided once: pure functions from typed facts
(a plan's objective, the lower bounds found and what proved each, the bound
every plan obeys) to status, ``best_bound``, ``gap``, ``bound_by`` and
``proved_by`` (``docs/cpsat.md``, "What OPTIMAL means").

Where a bound comes from is a :class:`Source`, never text to parse. Most
sources bound the staged space only (the relaxations, the model): a plan
they prove optimal is optimal *in the staged space*, and plans outside it
exist (a plan cleaned of unread computations costs less on the 14-node fuzz
case), so its status is FEASIBLE with ``optimal_in: "staged space"``. Only a
bound every plan obeys (:attr:`Source.every_plan`) makes a plan OPTIMAL."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Iterable

# What ``optimal_in`` and ``infeasible_in`` name: every valid plan under the
# settings, or only the staged space (of the order ``order_from`` names).
ALL_PLANS, STAGED = "all plans", "staged space"


class Source(StrEnum):
    """What proved a bound (``bound_by``) or a verdict (``proved_by``); the
    value is what the stats say."""

    WORKING_SET = "working set"  # every plan holds some node's working set at once
    PINNED_VALUES = "pinned values"  # ... and the values that cannot be made again and are still read
    TRIVIAL = "trivial"  # no plan costs less than nothing
    ZERO_COST = "zero cost"  # a plan that recomputes and moves nothing
    GAPS = "gaps"
    CHAINS = "chains"
    SLOTS = "slots"
    COARSE_CHAINS = "coarse chains"
    MODEL = "model"  # the full staged model's own bound, or its INFEASIBLE
    ROUNDED_DOWN = "rounded-down model"  # the full model with sizes rounded down to its memory unit

    @property
    def every_plan(self) -> bool:
        """Whether the bound holds for every valid plan, not only the staged ones."""
        return self in (Source.WORKING_SET, Source.PINNED_VALUES, Source.TRIVIAL, Source.ZERO_COST)


@dataclass(frozen=True)
class Bound:
    """A lower bound on the objective (cost units, or bytes) and its source."""

    value: float
    source: Source


@dataclass(frozen=True)
class Verdict:
    """The claims about one plan."""

    status: str  # OPTIMAL or FEASIBLE
    best_bound: float | None
    gap: float | None
    bound_by: Source | None
    proved_by: Source | None

    def stats(self) -> dict[str, Any]:
        """The verdict as stats entries (``proved_by`` only when proven)."""
        out: dict[str, Any] = {"status": self.status, "best_bound": self.best_bound, "gap": self.gap}
        if self.bound_by is not None:
            out["bound_by"] = self.bound_by.value
        if self.proved_by is not None:
            out["proved_by"] = self.proved_by.value
        return out


@dataclass(frozen=True)
class Staged:
    """What the rounds and the proofs showed of the staged space, before a
    plan is read: the status (OPTIMAL, FEASIBLE, INFEASIBLE, UNKNOWN), the
    space it speaks of (``depth``; None: the whole staged space), and why
    there may be no plan."""

    status: str
    depth: int | None
    restricted: bool  # the automatic rounds solved only a depth-restricted space
    space_status: str | None  # then: that space's own status
    restricted_empty: bool  # only a depth-restricted space was shown empty
    unproven_empty: bool  # the model (sizes rounded up) holds no plan; the whole space undecided


def staged(round_status: str, round_depth: int | None, *, gaps_empty: bool, shown_empty: bool,
           memory_exact: bool, automatic: bool, has_plan: bool, proven_whole: bool) -> Staged:
    """The staged claim from the facts: the returned round's status and
    depth, whether the gaps relaxation (``gaps_empty``) or a later proof
    (``shown_empty``) showed the whole staged space empty, whether the model
    counted memory exactly, whether the depth was the automatic one, whether
    a plan was found and a whole-space bound reaches it (``proven_whole``)."""
    status = "INFEASIBLE" if gaps_empty else round_status
    depth = None if gaps_empty or shown_empty else round_depth
    unproven_empty = False
    if not memory_exact:
        # sizes rounded up: the model's optimum and emptiness speak of the
        # plans that fit it, not of all plans; only the relaxations and the
        # rounded-down model (sizes rounded down) bound the whole space
        status = "FEASIBLE" if status == "OPTIMAL" else status
        if status == "INFEASIBLE" and not (gaps_empty or shown_empty):
            status, unproven_empty = "UNKNOWN", True
    restricted = depth is not None and automatic
    space_status = status if restricted else None
    if restricted and status == "OPTIMAL" and not proven_whole:
        # the default asked about the whole staged space, but only a
        # depth-restricted subspace was solved: its optimum says nothing
        # about the whole space; the relaxations' bound does
        status = "FEASIBLE"
    if proven_whole and (restricted or depth is None):
        status = "OPTIMAL"
    restricted_empty = not has_plan and status == "INFEASIBLE" and depth is not None and not gaps_empty
    if restricted_empty:
        status = "UNKNOWN"
    return Staged(status, depth, restricted, space_status, restricted_empty, unproven_empty)


def gap(objective: float, bound: float) -> float:
    """How far ``objective`` may be from the optimum, as a share of it."""
    return 0.0 if objective == bound else (objective - bound) / abs(objective)


def verdict(objective: float, bounds: Iterable[Bound], proved_by: Source | None = None) -> Verdict:
    """A plan of ``objective`` against ``bounds``: ``best_bound`` is the
    highest (ties: the first given), never above the objective, and
    ``bound_by`` its source; OPTIMAL where ``proved_by`` names what proved
    the plan optimal (the caller's facts: a proof, the model's status)."""
    best = max(bounds, key=lambda b: b.value, default=None)  # max keeps the first of equals
    value = None if best is None else min(best.value, objective)
    return Verdict("OPTIMAL" if proved_by is not None else "FEASIBLE", value,
                   None if value is None else gap(objective, value), None if best is None else best.source,
                   proved_by)


def reaching(objective: float, bound: Bound | None, may_prove: bool = True) -> Source | None:
    """The source of ``bound`` when it reaches ``objective`` (and may prove it), else None."""
    return bound.source if bound is not None and may_prove and bound.value >= objective else None


def over_all_plans(stats: dict[str, Any], universal: Bound | None, empty_below: Bound | None) -> dict[str, Any]:
    """A staged verdict (``stats``, status OPTIMAL / INFEASIBLE of the staged
    space) as a claim about every valid plan: OPTIMAL only where
    ``universal``, a bound every plan obeys, reaches the plan; INFEASIBLE
    only where ``empty_below`` says that every plan passes the budget
    (its value: what every plan holds at once, bytes). Otherwise a staged
    OPTIMAL is FEASIBLE and a staged INFEASIBLE is UNKNOWN, and
    ``optimal_in`` / ``infeasible_in`` say where the claim holds."""
    st = dict(stats)
    staged = st["status"]
    if staged in ("OPTIMAL", "INFEASIBLE"):
        st["optimal_in" if staged == "OPTIMAL" else "infeasible_in"] = STAGED
    if st.get("peak_bytes") is not None:
        if universal is not None:
            st.update(status="OPTIMAL", optimal_in=ALL_PLANS, proved_by=universal.source.value,
                      bound_by=universal.source.value, best_bound=universal.value, gap=0.0)
        elif staged == "OPTIMAL":
            st["status"] = "FEASIBLE"
    elif staged == "INFEASIBLE" and empty_below is not None:
        st.update(status="INFEASIBLE", infeasible_in=ALL_PLANS, proved_by=empty_below.source.value,
                  reason=f"no plan meets the budget: every plan holds {int(empty_below.value):,} bytes at "
                         "once (a node's working set, with the values that cannot be made again and are read later)")
    elif staged == "INFEASIBLE":
        st["status"] = "UNKNOWN"
    return st
