"""What a planner says about its plan: one typed record, :class:`Stats`.

The figures every consumer reads (the simulator's checks, ``solve``'s
summary, the batch's columns) are typed fields; what only one planner knows
goes in ``details``. A :class:`Stats` is also a read-only mapping with the
plan file's ``stats`` object as its items (typed fields that are None are
left out, details follow), so ``plan.stats["status"]`` and ``.get`` read
either way and the file's shape is the same as before the type existed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from types import MappingProxyType
from typing import Any, Iterator


@dataclass(frozen=True)
class Stats(Mapping):
    status: str = "UNKNOWN"  # OPTIMAL, FEASIBLE, OVER_BUDGET, INFEASIBLE, UNKNOWN
    peak_bytes: int | None = None  # claimed; solve() holds the planner to it
    compute_cost: float | None = None  # claimed
    transfer_bytes: int | None = None  # claimed
    objective: float | None = None  # an exact planner's objective value
    best_bound: float | None = None  # and its best proven bound on it
    gap: float | None = None  # (objective - bound) / objective
    time_to_first_s: float | None = None  # seconds to the first plan within the budget
    time_to_best_s: float | None = None  # seconds to the returned plan
    reason: str | None = None  # why there is no plan, or why this plan
    plan_from: str | None = None  # the planner whose plan was returned, when another one's
    # Where a proof holds: "all plans" (status OPTIMAL / INFEASIBLE), or a
    # smaller space an exact planner searched ("staged space": FEASIBLE / UNKNOWN)
    optimal_in: str | None = None
    infeasible_in: str | None = None
    budget_bytes: int | None = None  # set by solve()
    wall_s: float | None = None  # set by solve()
    details: Mapping[str, Any] = field(default_factory=dict)  # planner-specific extras

    def __post_init__(self) -> None:
        clash = TYPED & set(self.details)
        if clash:
            raise ValueError(f"stats details may not hold typed fields: {', '.join(sorted(clash))}")
        object.__setattr__(self, "details", MappingProxyType(dict(self.details)))

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Stats":
        """From a plan file's ``stats`` object: known keys to fields, the others to ``details``."""
        known = {k: v for k, v in d.items() if k in TYPED and v is not None}
        return cls(**known, details={k: v for k, v in d.items() if k not in TYPED})

    def with_details(self, **extra: Any) -> "Stats":
        """A copy with ``extra`` added to (or replacing entries of) ``details``."""
        return replace(self, details={**self.details, **extra})

    # -- the mapping: the plan file's ``stats`` object --------------------------

    def __getitem__(self, key: str) -> Any:
        if key in TYPED:
            value = getattr(self, key)
            if value is None:
                raise KeyError(key)
            return value
        return self.details[key]

    def __iter__(self) -> Iterator[str]:
        for name in TYPED_ORDER:
            if getattr(self, name) is not None:
                yield name
        yield from self.details

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def to_dict(self) -> dict[str, Any]:
        """The plan file's ``stats`` object."""
        return dict(self.items())


TYPED_ORDER = tuple(f.name for f in fields(Stats) if f.name != "details")  # as the plan file writes them
TYPED = frozenset(TYPED_ORDER)


def verdict(stats: Mapping[str, Any]) -> str:
    """The status as a table shows it, with a proof that holds only in a
    smaller space than every plan: ``FEASIBLE (optimal in staged space)``,
    ``UNKNOWN (infeasible in staged space)``."""
    status = stats.get("status") or "UNKNOWN"
    for claim, word in (("optimal_in", "optimal"), ("infeasible_in", "infeasible")):
        space = stats.get(claim)
        if space and space != "all plans":
            return f"{status} ({word} in {space})"
    return status
