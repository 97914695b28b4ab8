"""When a solve, or a part of one, started and must end: one frozen record
passed down, each part given a clock of its own (:meth:`Clock.until`)
rather than a rewritten time limit, so the settings keep the user's."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Clock:
    """``time.perf_counter()`` values: ``start`` and ``end``."""

    start: float
    end: float

    @classmethod
    def starting_now(cls, limit: float) -> "Clock":
        now = time.perf_counter()
        return cls(now, now + limit)

    @property
    def limit(self) -> float:
        """Seconds from start to end: what the shares of the time limit are shares of."""
        return self.end - self.start

    def at(self, share: float) -> float:
        """The moment ``share`` of the limit after the start."""
        return self.start + share * self.limit

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def left(self) -> float:
        return self.end - time.perf_counter()

    def until(self, end: float) -> "Clock":
        """The same start, ending at ``end``."""
        return replace(self, end=end)
