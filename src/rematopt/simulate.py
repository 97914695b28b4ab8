"""The simulator: the single judge of a plan's validity, peak and cost.

It replays events exactly as ``shared/spec/FORMATS.md`` specifies: a device set
D (inputs and persistent nodes at the start) and a host set H. Memory is
checked at ``compute`` (bytes(D) + bytes(i), before adding i) and at
``prefetch`` (after adding i); both equal bytes(D) right after the event, so
the per-event timeline records memory after each event and the peak is its
maximum together with the initial memory.

Costs are summed with :func:`math.fsum` (exactly rounded, independent of
order), so a planner that sums the same costs with ``fsum`` reports
bit-identical figures.
"""

from __future__ import annotations

import math
from itertools import chain, repeat
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .graph import Graph
from .plan import COMPUTE, FREE, OFFLOAD, OPS, PREFETCH, Plan


@dataclass
class Replay:
    """What a replay found. When ``valid`` is false, ``error`` is the first
    violated rule, ``error_event`` its index (None for end-of-plan rules), and
    the figures describe the prefix before it."""

    valid: bool
    error: str | None
    error_event: int | None
    peak_bytes: int
    initial_bytes: int
    compute_cost: float
    base_cost: float
    recompute_cost: float
    transfer_bytes: int
    offload_bytes: int
    prefetch_bytes: int
    compute_events: int
    events: int
    timeline: np.ndarray = field(repr=False)  # memory after each event

    @property
    def overhead(self) -> float:
        """(compute cost - base cost) / base cost; 0 for a zero-cost graph."""
        if self.base_cost == 0:
            return 0.0
        return (self.compute_cost - self.base_cost) / self.base_cost

    def summary(self) -> dict[str, Any]:
        """The figures as a JSON-ready dict (no timeline)."""
        return {
            "valid": self.valid,
            "error": self.error,
            "error_event": self.error_event,
            "peak_bytes": self.peak_bytes,
            "initial_bytes": self.initial_bytes,
            "compute_cost": self.compute_cost,
            "base_cost": self.base_cost,
            "recompute_cost": self.recompute_cost,
            "overhead": self.overhead,
            "transfer_bytes": self.transfer_bytes,
            "offload_bytes": self.offload_bytes,
            "prefetch_bytes": self.prefetch_bytes,
            "compute_events": self.compute_events,
            "events": self.events,
        }


def simulate(graph: Graph, plan: Plan) -> Replay:
    """Replay ``plan`` against ``graph`` and judge it.

    Never raises for a bad plan: the first violated rule is reported in the
    result, so callers can show it (``rematopt simulate``) or assert on it.
    """
    n = graph.n
    size = graph.bytes
    preds = graph.preds
    is_input = [v.is_input for v in graph.nodes]
    persistent = [v.persistent for v in graph.nodes]
    recomputable = [v.recomputable for v in graph.nodes]
    offloadable = [v.offloadable for v in graph.nodes]

    on_device = [False] * n
    on_host = [False] * n
    times_computed = [0] * n
    for i in graph.initial_resident:
        on_device[i] = True
    initial = peak = mem = graph.initial_bytes
    ops = plan.ops.tolist()
    nodes = plan.nodes.tolist()
    timeline = np.empty(len(ops), dtype=np.int64)
    offloaded = prefetched = 0
    error: str | None = None
    error_event: int | None = None

    k = -1
    for k, (op, i) in enumerate(zip(ops, nodes)):
        if not 0 <= i < n:
            error = f"{OPS[op]} {i}: no such node"
            break
        if op == COMPUTE:
            if is_input[i]:
                error = f"compute {i}: node {i} is an input and is never computed"
                break
            if on_device[i]:
                error = f"compute {i}: node {i} is already resident"
                break
            if times_computed[i] and not recomputable[i]:
                error = f"compute {i}: node {i} is not recomputable and was computed before"
                break
            missing = next((p for p in preds[i] if not on_device[p]), None)
            if missing is not None:
                error = f"compute {i}: predecessor {missing} is not resident"
                break
            times_computed[i] += 1
            on_device[i] = True
            mem += size[i]
            if mem > peak:
                peak = mem
        elif op == FREE:
            if not on_device[i]:
                error = f"free {i}: node {i} is not resident"
                break
            if persistent[i]:
                error = f"free {i}: node {i} is persistent and is never freed"
                break
            on_device[i] = False
            mem -= size[i]
        elif op == OFFLOAD:
            if not on_device[i]:
                error = f"offload {i}: node {i} is not resident"
                break
            if not offloadable[i]:
                error = f"offload {i}: node {i} is not offloadable"
                break
            on_host[i] = True
            offloaded += size[i]
        elif op == PREFETCH:
            if not on_host[i]:
                error = f"prefetch {i}: node {i} has no host copy"
                break
            if on_device[i]:
                error = f"prefetch {i}: node {i} is already resident"
                break
            on_device[i] = True
            prefetched += size[i]
            mem += size[i]
            if mem > peak:
                peak = mem
        else:
            error = f"event op code {op} is unknown"
            break
        timeline[k] = mem

    if error is not None:
        error_event = k
        timeline = timeline[:k]
    else:
        never = next((i for i in graph.compute_ids if times_computed[i] == 0), None)
        gone = next((v.id for v in graph.nodes if v.output and not on_device[v.id]), None)
        if never is not None:
            error = f"end of plan: compute node {never} ({graph.nodes[never].name}) was never computed"
        elif gone is not None:
            error = f"end of plan: output node {gone} ({graph.nodes[gone].name}) is not resident"

    done = len(timeline)
    compute_nodes = np.asarray(nodes[:done], dtype=np.int64)[np.asarray(ops[:done], dtype=np.int8) == COMPUTE]
    counts = np.bincount(compute_nodes, minlength=n).tolist()
    return Replay(
        valid=error is None,
        error=error,
        error_event=error_event,
        peak_bytes=peak,
        initial_bytes=initial,
        compute_cost=cost_of_counts(graph, counts),
        base_cost=base_cost(graph),
        recompute_cost=cost_of_counts(graph, [max(c - 1, 0) for c in counts]),
        transfer_bytes=offloaded + prefetched,
        offload_bytes=offloaded,
        prefetch_bytes=prefetched,
        compute_events=len(compute_nodes),
        events=len(ops),
        timeline=timeline,
    )


def peak_of(graph: Graph, ops: np.ndarray | list[int], nodes: np.ndarray | list[int]) -> int:
    """The peak of an event sequence as :func:`simulate` counts it, for a
    planner that knows its events are valid and needs only their peak (the
    one sweep every planner's figures come from): memory rises only at a
    compute or a prefetch, where it is checked after the rise, so the peak is
    the initial memory plus the largest running total of the changes."""
    ops = np.asarray(ops, dtype=np.int8)
    nodes = np.asarray(nodes, dtype=np.int64)
    initial = graph.initial_bytes
    if not len(ops):
        return initial
    size = np.asarray(graph.bytes, dtype=np.int64)[nodes]
    delta = np.where((ops == COMPUTE) | (ops == PREFETCH), size, np.where(ops == FREE, -size, 0))
    return max(initial, initial + int(np.cumsum(delta).max()))


def base_cost(graph: Graph) -> float:
    """Sum of ``cost`` over compute nodes: every valid plan pays at least this."""
    return math.fsum(graph.cost[i] for i in graph.compute_ids)


def cost_of_counts(graph: Graph, counts: list[int]) -> float:
    """Exactly rounded sum of ``cost[i]`` taken ``counts[i]`` times: the figure
    the simulator reports for a plan computing node i ``counts[i]`` times."""
    cost = graph.cost
    return math.fsum(chain.from_iterable(repeat(cost[i], c) for i, c in enumerate(counts) if c))
