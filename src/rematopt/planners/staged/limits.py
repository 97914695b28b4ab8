"""Which plans a solve may return: the settings every plan must honour,
written once for a replayed plan (bytes, cost units) and for an assignment
of the model (memory units, model integers)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Limits:
    """The budget, the clone bound, the overhead cap and whether host
    transfers are allowed, each None (or True) where unset, in the units of
    whatever is admitted."""

    memory: float | None = None  # the most memory at any point
    recomputes: int | None = None  # compute events beyond one per compute node
    overhead: float | None = None  # recompute plus transfer cost
    offload: bool = True

    def admit(self, peak: float, recomputes: int, overhead: float, transfers: int = 0) -> bool:
        """Whether a plan of that peak, recomputes, overhead and transfers honours every limit."""
        return ((self.memory is None or peak <= self.memory) and (self.offload or not transfers)
                and (self.recomputes is None or recomputes <= self.recomputes)
                and (self.overhead is None or overhead <= self.overhead))
