"""Placing the frees, for the classic baselines (``chen``, ``dtr``, ``policies.presets``);
and what "late" means, for every planner.

A baseline decides *what* to compute, offload and prefetch, in which order; it
never has to place a ``free``. :func:`place_frees` does that for every baseline in
one way: each value is freed right after its last read within each of its
residency intervals (an interval runs from a compute, a prefetch or the start
to the value's next compute or prefetch, or the end), and the last interval of
an output or persistent value is never freed. Freeing earlier than that breaks
a read; freeing later only raises memory, so for a given schedule this is the
lowest-memory placement. :func:`place_frees` also takes the plan's peak
(:func:`~rematopt.simulate.peak_of`) and writes the stats every plan must claim.

:func:`keep_schedule` is the checkpointing policy Chen and JAX share: compute
the program in order, keep a chosen set of values, drop every other value
after its last *early* consumer, and recompute (or prefetch) what a *late*
consumer misses from the values still resident, right before that consumer.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

from ..graph import Graph
from ..plan import COMPUTE, OFFLOAD, PREFETCH, Plan, PlanBuilder
from ..simulate import cost_of_counts, peak_of
from ..stats import Stats

Schedule = list[tuple[int, int]]  # (op code, node) without frees


def late_rule(graph: Graph) -> Callable[[int, int], bool]:
    """``late(u, c)``: whether consumer ``c`` reads ``u`` late (from a saved or
    recomputed copy). The one definition of "late" (greedy's clone readers
    are built on it).

    With phases: a backward consumer of a non-backward value (the forward
    residuals of a training step). Without phases, the whole graph counts as
    forward and every consumer after ``u``'s first one (by position) is late:
    ``u`` is used straight away, and each later read would come from a residual.
    """
    if graph.has_phases:
        backward = [v.phase == "backward" for v in graph.nodes]
        return lambda u, c: not backward[u] and backward[c]
    first = [s[0] if s else -1 for s in graph.succs]
    return lambda u, c: c != first[u]


def drop_points(graph: Graph) -> list[int]:
    """Position after which a value that is not saved leaves the device: its
    last early consumer (its own position when it has none)."""
    pos, late = graph.position, late_rule(graph)
    return [max((pos[c] for c in graph.succs[u] if not late(u, c)), default=pos[u])
            for u in range(graph.n)]


def has_late_reads(graph: Graph, drop: list[int]) -> list[bool]:
    """Whether a value is read after its drop point (so dropping it costs a
    recompute or a prefetch)."""
    return [graph.last_use[u] > drop[u] for u in range(graph.n)]


def always_kept(graph: Graph) -> list[bool]:
    """Values no policy may drop: inputs and persistent values (never
    computable), non-recomputable values, and outputs."""
    return [v.is_input or v.persistent or not v.recomputable or v.output for v in graph.nodes]


def keep_schedule(graph: Graph, save: Iterable[int], offload: Iterable[int] = (),
                  retain: bool = False) -> Schedule:
    """The checkpointing schedule: every node once in ``order``; each value in
    ``save`` (and every :func:`always_kept` value) stays until its last read;
    every other value is dropped after its drop point (:func:`drop_points`);
    a value in ``offload`` is offloaded right after it is computed and
    prefetched (once) instead of recomputed.

    Before each node, the missing producers it reads are brought back, with
    whatever missing values they need in turn, in program order. With
    ``retain`` a recomputed value then stays until its last read (Chen: a
    segment is recomputed once for the backward pass); without it the
    recomputed values are dropped right after the consumer that asked for them
    (JAX: recomputation feeds one consumer).
    """
    n = graph.n
    pos, preds = graph.position, graph.preds
    held = always_kept(graph)
    for u in save:
        held[u] = True
    to_host = [False] * n
    for u in offload:
        to_host[u] = not held[u]
    drop_at: list[list[int]] = [[] for _ in range(n)]
    for u, t in enumerate(drop_points(graph)):
        if not held[u]:
            drop_at[t].append(u)

    resident = [False] * n
    for i in graph.initial_resident:
        resident[i] = True
    on_host = [False] * n
    schedule: Schedule = []
    for t, v in enumerate(graph.order):
        if graph.nodes[v].is_input:
            continue
        # The missing values v needs, and the missing values those need, in order.
        missing, stack = set(), [p for p in preds[v] if not resident[p]]
        while stack:
            u = stack.pop()
            if u in missing:
                continue
            missing.add(u)
            if not on_host[u]:
                stack.extend(p for p in preds[u] if not resident[p])
        temporaries = []
        for u in sorted(missing, key=pos.__getitem__):
            if on_host[u]:
                schedule.append((PREFETCH, u))
            else:
                schedule.append((COMPUTE, u))
                temporaries.append(u)
            resident[u] = True
        schedule.append((COMPUTE, v))
        resident[v] = True
        if to_host[v]:
            schedule.append((OFFLOAD, v))
            on_host[v] = True
        if not retain:
            for u in temporaries:
                resident[u] = False
        for u in drop_at[t]:
            resident[u] = False
    return schedule


def place_frees(graph: Graph, schedule: Schedule, planner: str, budget: int | None,
                details: dict[str, Any] | None = None) -> Plan:
    """Insert the frees (see the module docstring), take the peak, and build
    the plan with its claimed ``status``, ``peak_bytes``, ``compute_cost`` and
    ``transfer_bytes``, and ``details`` (:class:`~rematopt.stats.Stats`)."""
    n = graph.n
    size, preds = graph.bytes, graph.preds
    never_freed = [v.output or v.persistent for v in graph.nodes]
    # last_read[u]: index of the last event reading u in its open interval
    # (-1: the start); free_after[k]: values to free right after event k.
    last_read = [None] * n
    for i in graph.initial_resident:
        last_read[i] = -1
    free_after: list[list[int]] = [[] for _ in range(len(schedule) + 1)]  # [-1] = the start

    for k, (op, u) in enumerate(schedule):
        if op == COMPUTE:
            for p in preds[u]:
                last_read[p] = k
        if op == OFFLOAD:
            last_read[u] = k
        elif last_read[u] is not None:  # compute or prefetch of a value already on device
            free_after[last_read[u]].append(u)
            last_read[u] = k
        else:
            last_read[u] = k
    for u, k in enumerate(last_read):
        if k is not None and not never_freed[u]:
            free_after[k].append(u)

    b = PlanBuilder()
    transfer = 0
    counts = [0] * n
    for u in sorted(free_after[-1]):
        b.free(u)
    for k, (op, u) in enumerate(schedule):
        if op == COMPUTE:
            b.compute(u)
            counts[u] += 1
        elif op == PREFETCH:
            b.prefetch(u)
            transfer += size[u]
        else:
            b.offload(u)
            transfer += size[u]
        for w in sorted(free_after[k]):
            b.free(w)
    peak = peak_of(graph, b.ops, b.nodes)

    out = Stats(status="FEASIBLE" if budget is None or peak <= budget else "OVER_BUDGET",
                peak_bytes=peak, compute_cost=cost_of_counts(graph, counts), transfer_bytes=transfer,
                details={"recomputes": sum(counts) - len(graph.compute_ids), **(details or {})})
    return b.build(graph.name, planner, out)
