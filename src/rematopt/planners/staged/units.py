"""The staged space's integers: memory in a unit (the gcd of the sizes, or
coarser), costs times a power of ten, and the caps and floors in them. The
one place a cost is scaled to an integer or an integer read back."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import reduce

from ...errors import PlannerError
from ...graph import Graph
from ...reference import peak_lower_bound
from .stages import Stages

# The largest objective value (cost x scale) a model may reach: CP-SAT needs
# every linear expression's range within int64, with room to spare.
OBJECTIVE_CEILING = 2**50
# The largest total memory, in units, a model holds (a memory check sums up
# to all of it): nodes of 2^50 bytes (gcd 1) made CP-SAT refuse the model.
MEMORY_CEILING = 2**40


def memory_unit(graph: Graph) -> tuple[int, bool]:
    """The unit memory is counted in: the gcd of the non-persistent sizes
    (exact), unless their total in it would pass MEMORY_CEILING; then the
    smallest unit that keeps it below, with sizes rounded up (a plan within
    the model's budget is within the true one; False: not exact)."""
    sizes = [v.bytes for v in graph.nodes if v.bytes and not v.persistent]
    unit = reduce(math.gcd, sizes, 0) or 1
    total = sum(sizes)
    if total // unit <= MEMORY_CEILING:
        return unit, True
    unit = -(-total // MEMORY_CEILING)
    return unit, False


def integer_scale(values: list[float], reach: float) -> tuple[int, bool]:
    """The cost scale: the smallest power of ten that makes every nonzero
    value an integer of at least 1 (to float precision, relative 1e-9), and
    True; where none does within the ceiling (``reach`` x scale at most
    OBJECTIVE_CEILING, ``reach`` being the largest cost any plan may pay),
    the largest power of ten within it, and False: the model then optimises
    rounded costs, and :func:`cost_resolution` says by how much a reported
    optimum may exceed the true one. (A scale chosen from an absolute
    tolerance took costs below 1e-9 for integers: every cost became 0.)"""
    values = [v for v in values if v]
    if not values:
        return 1, True
    if reach > OBJECTIVE_CEILING:
        raise PlannerError(f"cpsat: the costs a plan may pay add up to {reach:.3g} cost units; at most "
                           f"{OBJECTIVE_CEILING:.3g} are supported (give costs in a larger unit)")
    top = max(1, int(OBJECTIVE_CEILING / max(reach, max(values))))
    scale = 1
    while True:
        scaled = [v * scale for v in values]
        if all(round(x) >= 1 and abs(x - round(x)) <= 1e-9 * x for x in scaled):
            return scale, True
        if scale * 10 > top:
            return scale, False
        scale *= 10


def cost_resolution(per_event: list[float], scale: int, repeats: list[int]) -> float:
    """How far a model optimum over costs rounded at ``scale`` can exceed the
    true optimum: twice the largest rounding error any plan can accumulate,
    ``repeats[i]`` events of cost ``per_event[i]`` each at most (the model's
    optimum is within one plan's error of its model cost, which is at most
    the true optimum's model cost, itself within that optimum's error)."""
    return 2 * sum(k * abs(round(c * scale) - c * scale) for c, k in zip(per_event, repeats)) / scale


def cap_units(graph: Graph, unit: int, cap_bytes: int) -> int:
    """A memory cap in model units: the most ``unit``s that fit in
    ``cap_bytes`` beside the persistent bytes."""
    return max(0, (cap_bytes - graph.persistent_bytes) // unit)


def peak_floor_units(graph: Graph, unit: int, *, up: bool = True) -> int:
    """The peak lower bound in model units: rounded up for a model whose
    sizes are rounded up (no plan's memory in it is lower), down for one
    whose sizes are rounded down (a relaxation: a plan at exactly the
    working-set bound must stay in it when the unit is not exact)."""
    over = peak_lower_bound(graph) - graph.persistent_bytes
    return max(0, -(-over // unit) if up else over // unit)


def overhead_cap_units(int_cost: list[int] | tuple[int, ...], graph: Graph, max_overhead: float) -> int:
    """``--max-overhead`` x base cost in model integers."""
    return math.floor(max_overhead * sum(int_cost[i] for i in graph.compute_ids) + 1e-9)



def int_costs(graph: Graph, scale: int, per_byte: float, floor: bool = False
              ) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Node and transfer costs in model integers: rounded (the model's own),
    or floored (``floor``: a relaxation's, whose optimum then stays a bound
    on the true costs when the scale is inexact)."""
    to_int = math.floor if floor else round
    return (tuple(to_int(c * scale) for c in graph.cost),
            tuple(to_int(b * per_byte * scale) for b in graph.bytes))


@dataclass(frozen=True)
class Scale:
    """The cost scale of a solve, whether it is exact, and what rounding to
    it may cost (``resolution``, cost units: :func:`cost_resolution`)."""

    scale: int
    exact: bool
    resolution: float


def cost_scale(graph: Graph, full: Stages, per_byte: float) -> Scale:
    """The scale fine enough for every cost a plan of the space may pay (a
    value's recomputes, one per stage it lives in at most, and with offload
    (``full.offload``) its prefetches and its one offload)."""
    values = set(full.values)  # a list: membership in it took 37 s on a 100,000-node graph
    lives = [len(full.stages(i)) if i in values else 1 for i in range(graph.n)]
    costs = [graph.cost[i] for i in graph.compute_ids]
    repeats = [lives[i] for i in graph.compute_ids]
    if full.offload:
        costs += [b * per_byte for b in graph.bytes]
        repeats += [k + 1 for k in lives]
    scale, exact = integer_scale(costs, sum(c * k for c, k in zip(costs, repeats)))
    return Scale(scale, exact, 0.0 if exact else cost_resolution(costs, scale, repeats))


def proof_overhead_cap(graph: Graph, scale: Scale, max_overhead: float | None, rounded: bool = False
                       ) -> int | None:
    """``--max-overhead`` x base cost in model integers as a proof must
    read it: no less than any plan within the true cap costs in the
    proof's integers (floored costs, the relaxations': at most the true
    cost x scale; costs ``rounded`` to nearest, the rounded-down model's:
    up to resolution x scale / 2 more), so the cap only widens the
    feasible set. The rounds' cap on the rounded costs' sum
    (:func:`overhead_cap_units`) may cut off a plan within the
    true cap where the scale is not exact."""
    if max_overhead is None:
        return None
    base = math.fsum(graph.cost[i] * scale.scale for i in graph.compute_ids)
    slack = scale.resolution * scale.scale / 2 if rounded else 0.0
    return math.floor(max_overhead * base * (1 + 1e-12) + slack + 1e-9)


def objective_units(graph: Graph, objective: str, scale: Scale, unit: int, value: int | None) -> float | None:
    """A whole-space bound (model integers) in the objective's units: cost
    units less half the rounding resolution, or bytes."""
    if value is None:
        return None
    if objective == "overhead":
        return max(0.0, value / scale.scale - scale.resolution / 2)
    return float(value * unit + graph.persistent_bytes)
