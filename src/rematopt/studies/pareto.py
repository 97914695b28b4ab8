"""The peak / overhead Pareto curve of one graph, by the peak mode that
proves its answers (``cpsat --objective peak``, :mod:`planners.cpsat.peak`):
the lowest peak at each of N overhead caps, each point proven or with its
gap, beside the heuristics' (peak, overhead) points."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Callable

from ..errors import RematoptError
from ..graph import Graph
from ..reference import no_remat_peak, peak_lower_bound
from ..solve import solve

# Budget-aware heuristics are asked at these fractions of the no-remat peak;
# the others make one plan whatever the budget.
RATIOS = (1.0, 0.9, 0.8, 0.7, 0.6, 0.5)
BUDGETED = ("greedy", "dtr", "chen-greedy")
FIXED = ("no-remat", "chen-sqrt", "jax-nothing-saveable", "jax-dots-saveable")


@dataclass(frozen=True)
class Point:
    """One plan: its peak and overhead; for cpsat, the cap it was asked
    under, the lower bound on the peak there, the gap and what proved it."""

    planner: str
    peak_bytes: int
    overhead: float
    max_overhead: float | None = None
    bound_bytes: float | None = None
    gap: float | None = None
    status: str = ""
    bound_by: str = ""
    optimal_in: str = ""  # "all plans", "staged space", or not proven

    def row(self) -> dict[str, Any]:
        return asdict(self)


def curve(graph: Graph, points: int, *, time_limit: float = 60.0, workers: int = 2,
          log: Callable[[str], None] = lambda s: None) -> list[Point]:
    """cpsat's lowest peak at ``points`` overhead caps, evenly from 0 to the
    overhead of the lowest-peak plan found with no cap (that uncapped point
    is the last)."""
    if points < 2:
        raise RematoptError(f"pareto: --points must be at least 2, got {points}")
    top = _cpsat(graph, None, time_limit, workers)
    log(f"no cap: peak {top.peak_bytes:,} B, overhead {100 * top.overhead:.2f}%, {top.status}")
    out = []
    for j in range(points - 1):
        cap = top.overhead * j / (points - 1)
        p = _cpsat(graph, cap, time_limit, workers)
        log(f"cap {100 * cap:.2f}%: peak {p.peak_bytes:,} B, {p.status}, gap {100 * (p.gap or 0):.1f}%")
        out.append(p)
    return out + [top]


def _cpsat(graph: Graph, cap: float | None, time_limit: float, workers: int) -> Point:
    opts = {} if cap is None else {"max_overhead": cap}
    sol = solve(graph, "cpsat", objective="peak", time_limit=time_limit, workers=workers, lp_bound=False, **opts)
    st = sol.plan.stats
    return Point("cpsat", sol.replay.peak_bytes, sol.replay.overhead, cap, st.get("best_bound"), st.get("gap"),
                 st["status"], st.get("bound_by", ""), st.get("optimal_in") or "")


def heuristic_points(graph: Graph) -> list[Point]:
    """The heuristics' valid plans: the budget-aware ones at each of RATIOS
    (no lower than the working set), the others once."""
    out = []
    top, floor = no_remat_peak(graph), peak_lower_bound(graph)
    budgets = sorted({max(floor, int(r * top)) for r in RATIOS}, reverse=True)
    for planner in BUDGETED + FIXED:
        for budget in (budgets if planner in BUDGETED else [None]):
            sol = solve(graph, planner, budget=budget, check_budget=False)
            if sol.replay is not None and sol.replay.valid:
                out.append(Point(planner, sol.replay.peak_bytes, sol.replay.overhead))
    return out
