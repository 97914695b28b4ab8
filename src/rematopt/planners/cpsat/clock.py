"""When a solve, or a part of one, started and must end: one frozen record
passed down, each part given a clock of its own (:meth:`Clock.until`)
rather than a rewritten time limit, so the settings keep the user's. Its
times are the run's :mod:`..meter`'s: wall seconds, or deterministic ones."""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..meter import now


@dataclass(frozen=True)
class Clock:
    """``start`` and ``end``, on the run's meter (:func:`..meter.now`)."""

    start: float
    end: float

    @classmethod
    def starting_now(cls, limit: float) -> "Clock":
        at = now()
        return cls(at, at + limit)

    @property
    def limit(self) -> float:
        """Seconds from start to end: what the shares of the time limit are shares of."""
        return self.end - self.start

    def at(self, share: float) -> float:
        """The moment ``share`` of the limit after the start."""
        return self.start + share * self.limit

    def elapsed(self) -> float:
        return now() - self.start

    def left(self) -> float:
        return self.end - now()

    def until(self, end: float) -> "Clock":
        """The same start, ending at ``end``."""
        return replace(self, end=end)
